"""``ta.attention.record`` is per thread, as autograd's state is: two threads decoding with one
model at once, each with a record open for some decodes and not for others, give the ids,
attention and recorded weights that the same decodes give run one after another."""

import sys
import threading

import numpy as np
import pytest

import tinygrad_attn as ta

THREADS, DECODES, MAX_LEN = 2, 20, 6


def seq2seq():
    ta.manual_seed(0)
    return ta.models.Seq2Seq(20, 22, embed=8, hidden=16, attention="additive").eval()


def transformer():
    ta.manual_seed(0)
    return ta.models.Transformer(20, 22, d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                 dim_feedforward=24, dropout=0.0, max_len=32).eval()


def source(thread: int, decode: int) -> np.ndarray:
    """Right-padded ids (3, 5), different for every decode of every thread."""
    src = np.random.default_rng(100 * thread + decode).integers(4, 20, size=(3, 5))
    src[1, 3:] = 0
    return src


def decode(model, src: np.ndarray, recorded: bool):
    """Greedy ids and attention, then the teacher-forced pass over them; inside a record when
    ``recorded`` (a Transformer's decode records into its own inner record, so its forward
    is what fills the user's)."""
    def run():
        ids, weights = model.greedy(src, max_len=MAX_LEN)
        tgt_in = np.concatenate([np.ones((len(ids), 1), dtype=np.int64), ids[:, :-1]], axis=1)
        logits, _ = model(src, tgt_in)
        return ids, weights, logits.numpy()

    if not recorded:
        return (*run(), None)
    with ta.attention.record() as record:
        found = run()
    return (*found, dict(record))


def jobs(thread: int):
    """A thread's decodes: every other one inside a record, the two threads out of step."""
    return [(source(thread, i), (i + thread) % 2 == 0) for i in range(DECODES)]


@pytest.fixture
def interleaved():
    """Switch between threads every few microseconds, so the decodes overlap step by step."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.parametrize("build", [seq2seq, transformer], ids=["seq2seq", "transformer"])
def test_records_in_two_threads_hold_what_sequential_decodes_record(build, interleaved):
    model = build()
    sequential = [[decode(model, src, recorded) for src, recorded in jobs(k)] for k in range(THREADS)]

    concurrent: list = [None] * THREADS
    errors: list = []
    start = threading.Barrier(THREADS)

    def worker(k):
        try:
            start.wait()
            concurrent[k] = [decode(model, src, recorded) for src, recorded in jobs(k)]
        except BaseException as error:          # re-raised below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]

    for k in range(THREADS):
        for i, (mine, alone) in enumerate(zip(concurrent[k], sequential[k], strict=True)):
            where = f"thread {k}, decode {i}"
            ids, weights, logits, record = mine
            np.testing.assert_array_equal(ids, alone[0], err_msg=where)
            np.testing.assert_array_equal(weights, alone[1], err_msg=where)
            np.testing.assert_array_equal(logits, alone[2], err_msg=where)
            if alone[3] is None:
                assert record is None
                continue
            assert list(record) == list(alone[3]), where
            assert len(record) > 0, where
            for key, value in alone[3].items():
                np.testing.assert_array_equal(record[key], value, err_msg=f"{where}, {key}")


def test_a_record_sees_only_its_own_threads_calls():
    """A record open in one thread while another thread attends stays empty."""
    rng = np.random.default_rng(0)
    q, k = (ta.Tensor(rng.normal(size=(2, 3, 4))) for _ in range(2))
    opened, attended = threading.Event(), threading.Event()
    seen = {}

    def recorder():
        with ta.attention.record() as record:
            opened.set()
            attended.wait(timeout=60)
        seen["record"] = dict(record)

    thread = threading.Thread(target=recorder)
    thread.start()
    opened.wait(timeout=60)
    try:
        ta.attention.dot(q, k)
        ta.attention.scaled_dot_product(q, k, k, need_weights=False)
    finally:
        attended.set()
        thread.join()
    assert seen["record"] == {}
