"""ta.data against hostile data: reserved spellings in the text, endless and oversized files."""

import json
import os
import re
import subprocess
import sys
import threading
import tracemalloc
import warnings

import numpy as np
import pytest

import tinygrad_attn as ta
import tinygrad_attn.data as data
import tinygrad_attn.data.pairs as pairs_module
from tinygrad_attn.data import END, PAD, SPECIALS, START, UNK, DataError, Vocab
from tinygrad_attn.data.tokens import tokenize

# Every reserved name, as a user's data may spell it, on both sides.
HOSTILE_LINES = [
    ("a <pad> b", "x <end> y"),
    ("<start> c", "<end>"),
    ("<unk> a", "y <pad> <start> <unk>"),
    ("c <end>", "x y"),
]


def write(tmp_path, content, name="pairs.tsv"):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def hostile_task(tmp_path):
    path = write(tmp_path, "".join(f"{source}\t{target}\n" for source, target in HOSTILE_LINES))
    pairs = data.read_pairs(path, src_tokens="space", tgt_tokens="space")
    return pairs, data.from_pairs(pairs, src_tokens="space", tgt_tokens="space", valid=[], test=[])


# ---------------------------------------------------------------------------------------------
# reserved spellings are ordinary symbols


def test_reserved_spellings_in_a_file_get_ordinary_ids(tmp_path):
    pairs, task = hostile_task(tmp_path)
    assert pairs == [(tokenize(s, "space", lowercase=False), tokenize(t, "space", lowercase=False))
                     for s, t in HOSTILE_LINES]
    for name in SPECIALS:
        assert name in task.src_vocab or name in task.tgt_vocab
    for source, target in pairs:
        assert min(task.src_vocab.encode(source)) >= len(SPECIALS)
        assert min(task.tgt_vocab.encode(target)) >= len(SPECIALS)
        assert task.src_vocab.decode(task.src_vocab.encode(source)) == source
        assert task.tgt_vocab.decode(task.tgt_vocab.encode(target, start=True, end=True)) == target


def test_reserved_spellings_in_a_batch_are_neither_padding_nor_control(tmp_path):
    pairs, task = hostile_task(tmp_path)
    batch = next(data.batches(pairs, task.src_vocab, task.tgt_vocab, batch_size=len(pairs), shuffle=False))
    for row, (source, target) in enumerate(pairs):
        # Only the padding is PAD, only the last real step of tgt_out is END.
        assert batch.src_mask[row].sum() == len(source) == batch.src_lengths[row]
        assert list(batch.tgt_out[row]).index(END) == len(target)
        assert START not in batch.tgt_in[row, 1:]
        assert UNK not in batch.src[row] and UNK not in batch.tgt_out[row]
        assert task.detokenize(task.tgt_vocab.decode(batch.tgt_out[row])) == " ".join(target)


def test_reserved_spellings_a_vocabulary_lacks_encode_to_unk():
    vocab = Vocab(["a", "b"])
    assert vocab.encode(list(SPECIALS)) == [UNK] * len(SPECIALS)
    assert [vocab.id(name) for name in SPECIALS] == [UNK] * len(SPECIALS)
    assert not any(name in vocab for name in SPECIALS)
    # The ids keep their names when shown.
    assert [vocab.token(i) for i in (PAD, START, END, UNK)] == list(SPECIALS)


def test_from_pairs_warns_about_held_out_reserved_spellings():
    train = [(["a"], ["x"])]
    with pytest.warns(UserWarning, match=r"1 tokens in 1 of the 1 test pairs .* target '<end>'"):
        task = data.from_pairs(train, valid=[], test=[(["a", "a"], ["x", "<end>"])])
    assert task.tgt_vocab.encode(["x", "<end>"]) == [task.tgt_vocab.id("x"), UNK]


def test_typed_text_with_reserved_spellings_encodes_as_the_file_did(tmp_path):
    _, task = hostile_task(tmp_path)
    tokens = task.tokenize("a <pad> <end> b")
    assert task.src_vocab.encode(tokens) == [task.src_vocab.id(t) for t in tokens]
    assert task.src_vocab.decode(task.src_vocab.encode(tokens)) == tokens


def test_vocab_build_keeps_reserved_spellings_as_ordinary_sorted_tokens():
    sequences = [["<end>", "b"], ["a", "<pad>", "<end>"]]
    vocab = Vocab.build(sequences)
    assert vocab.tokens[len(SPECIALS):] == sorted({t for s in sequences for t in s})
    assert len(vocab) == len(SPECIALS) + 4
    assert Vocab.build(sequences, min_freq=2).tokens[len(SPECIALS):] == ["<end>"]


def test_vocab_refuses_a_token_list_that_starts_with_the_reserved_names():
    # Vocab(v.tokens) used to give v back; now it would add four ordinary tokens, so it is refused.
    with pytest.raises(ValueError, match=r"Vocab: the tokens start with the reserved names"):
        Vocab(Vocab(["a"]).tokens)
    assert Vocab(["<pad>", "a"]).tokens == [*SPECIALS, "<pad>", "a"]


def test_vocab_with_reserved_spellings_survives_json_and_a_checkpoint(tmp_path):
    _, task = hostile_task(tmp_path)
    for vocab in (task.src_vocab, task.tgt_vocab):
        restored = Vocab.from_dict(json.loads(json.dumps(vocab.to_dict())))
        assert restored == vocab and restored.tokens == vocab.tokens
        assert {t: restored.id(t) for t in vocab.tokens} == {t: vocab.id(t) for t in vocab.tokens}
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=4, hidden=4)
    path = tmp_path / "run.ckpt"
    ta.models.save_checkpoint(path, model, task)
    _, info = ta.models.load_checkpoint(path)
    assert info.src_vocab == task.src_vocab and info.tgt_vocab == task.tgt_vocab
    assert "<pad>" in info.src_vocab and info.tgt_vocab.id("<end>") not in (PAD, START, END, UNK)
    for source, target in task.train:
        assert info.src_vocab.encode(source) == task.src_vocab.encode(source)
        assert info.tgt_vocab.encode(target) == task.tgt_vocab.encode(target)


def test_vocab_in_the_earlier_format_loads_and_maps_the_same(tmp_path):
    ordinary = ["a", "b", "c"]
    # What every earlier version wrote: the four reserved names, then the ordinary tokens.
    earlier = {"tokens": [*SPECIALS, *ordinary]}
    assert Vocab(ordinary).to_dict() == earlier
    restored = Vocab.from_dict(earlier)
    assert restored == Vocab(ordinary)
    assert restored.encode(ordinary, start=True, end=True) == [START, 4, 5, 6, END]
    assert restored.decode([START, 6, 4, END, 5]) == ["c", "a"]
    # The same through a checkpoint file (ta.save), as earlier versions stored it.
    task = data.Task("t", [], [], Vocab(ordinary), Vocab(ordinary))
    path = tmp_path / "old.ckpt"
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=4, hidden=4)
    ta.models.save_checkpoint(path, model, task)
    state = ta.load(path)
    assert state["src_vocab"] == state["tgt_vocab"] == earlier
    _, info = ta.models.load_checkpoint(path)
    assert info.tgt_vocab == restored


class _FixedOutput:
    """A model whose greedy decode is given: rows of ids, for the decoding path to turn into text."""

    def __init__(self, ids):
        self.ids = np.asarray(ids, dtype=np.int64)

    def greedy(self, src, *args, **options):
        return self.ids[: len(src)], None


def test_decoded_text_writes_reserved_spellings_back_and_stops_at_the_real_end(tmp_path):
    _, task = hostile_task(tmp_path)
    vocab = task.tgt_vocab
    ordinary_end, x = vocab.id("<end>"), vocab.id("x")
    assert ordinary_end not in (PAD, START, END, UNK)
    model = _FixedOutput([[ordinary_end, x, vocab.id("<pad>"), END, x]])
    outputs = ta.models.decode(model, [["a"]], task.src_vocab, vocab)
    assert outputs == [["<end>", "x", "<pad>"]]
    assert task.detokenize(outputs[0]) == "<end> x <pad>"


# ---------------------------------------------------------------------------------------------
# long lines, endless files


def test_read_pairs_line_limit_is_documented_and_generous():
    assert data.MAX_LINE_BYTES == pairs_module.MAX_LINE_BYTES >= 1 << 20
    assert data.MAX_STREAM_BYTES == pairs_module.MAX_STREAM_BYTES >= 16 * data.MAX_LINE_BYTES


def test_read_pairs_accepts_a_line_at_the_limit_and_refuses_one_past_it(tmp_path, monkeypatch):
    monkeypatch.setattr(pairs_module, "MAX_LINE_BYTES", 1000)
    at_limit = "a" * 499 + "\t" + "b" * 500
    for ending in ("\n", "\r\n", ""):                       # the line ending is not counted
        path = write(tmp_path, f"x\ty\n{at_limit}{ending}")
        assert data.read_pairs(path)[1] == (list("a" * 499), list("b" * 500))
    path = write(tmp_path, f"x\ty\n{at_limit}b\nz\tw\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: the line is longer than 1000 bytes"):
        data.read_pairs(path)
    path = write(tmp_path, f"x\ty\n{at_limit}b")              # the last line, without a newline
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: the line is longer than 1000 bytes"):
        data.read_pairs(path)


def test_read_pairs_refuses_a_real_line_past_the_default_limit(tmp_path):
    path = write(tmp_path, "a\tb\n" + "c" * data.MAX_LINE_BYTES + "\td\n")
    message = rf"^{re.escape(str(path))}:2: the line is longer than {data.MAX_LINE_BYTES} bytes"
    with pytest.raises(DataError, match=message) as caught:
        data.read_pairs(path)
    assert "\n" not in str(caught.value)


def _peak_bytes(function):
    tracemalloc.start()
    try:
        function()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def test_read_pairs_of_dev_zero_stops_at_the_first_line_with_bounded_memory():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero on this system")

    def read():
        with pytest.raises(DataError, match=rf"^/dev/zero:1: the line is longer than {data.MAX_LINE_BYTES}"):
            data.read_pairs("/dev/zero")

    assert _peak_bytes(read) < 3 * data.MAX_LINE_BYTES


def _pipe_path(chunks, repeat=1):
    """A path reading a pipe that a thread fills with ``chunks`` ``repeat`` times, then closes."""
    read_end, write_end = os.pipe()

    def fill():
        try:
            with os.fdopen(write_end, "wb") as stream:
                for _ in range(repeat):
                    for chunk in chunks:
                        stream.write(chunk)
        except BrokenPipeError:                 # the reader stopped early, as it should
            pass

    thread = threading.Thread(target=fill, daemon=True)
    thread.start()
    return f"/dev/fd/{read_end}", read_end, thread


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd (Linux, macOS)")
def test_read_pairs_bounds_a_line_from_a_pipe_without_newlines():
    # 8 lines' worth of bytes without a newline: reading it whole is what must not happen.
    path, read_end, thread = _pipe_path([b"\0" * data.MAX_LINE_BYTES], repeat=8)

    def read():
        with pytest.raises(DataError, match=rf"^{path}:1: the line is longer than {data.MAX_LINE_BYTES}"):
            data.read_pairs(path)

    try:
        peak = _peak_bytes(read)
    finally:
        os.close(read_end)
        thread.join()
    assert peak < 3 * data.MAX_LINE_BYTES


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd (Linux, macOS)")
def test_read_pairs_reads_a_pipe_of_finite_data_as_a_file(tmp_path):
    content = "".join(f"{s}\t{t}\n" for s, t in HOSTILE_LINES).encode("utf-8")
    expected = data.read_pairs(write(tmp_path, content), "space", "char")
    path, read_end, thread = _pipe_path([content[:7], content[7:]])
    try:
        assert data.read_pairs(path, "space", "char") == expected
    finally:
        os.close(read_end)
        thread.join()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_read_pairs_reads_a_fifo(tmp_path):
    content = b"ab\tcd\nef\tgh\n"
    fifo = tmp_path / "pairs.fifo"
    os.mkfifo(fifo)
    thread = threading.Thread(target=fifo.write_bytes, args=(content,), daemon=True)
    thread.start()
    assert data.read_pairs(fifo) == data.read_pairs(write(tmp_path, content))
    thread.join()


def test_read_pairs_reads_standard_input_through_dev_stdin(tmp_path):
    if not os.path.exists("/dev/stdin"):
        pytest.skip("no /dev/stdin on this system")
    content = "ab\tcd\n<end>\tx\n"
    script = "import sys, tinygrad_attn as ta; print(ta.data.read_pairs('/dev/stdin', 'space'))"
    result = subprocess.run([sys.executable, "-c", script], input=content, capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == repr(data.read_pairs(write(tmp_path, content), "space"))


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd (Linux, macOS)")
def test_read_pairs_bounds_a_stream_of_short_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(pairs_module, "MAX_STREAM_BYTES", 4096)
    line = b"ab\tcd\n"
    # Twice the bound, then the pipe closes: reading the whole of it would pass the bound.
    path, read_end, thread = _pipe_path([line], repeat=2 * 4096 // len(line))
    try:
        with pytest.raises(DataError, match=rf"^{path}: more than 4096 bytes from a pipe or device "
                                            r"\(ta.data.MAX_STREAM_BYTES\)"):
            data.read_pairs(path)
    finally:
        os.close(read_end)
        thread.join()
    # A regular file is read whole, whatever its size.
    big = write(tmp_path, line * (2 * 4096 // len(line)))
    assert len(data.read_pairs(big)) == 2 * 4096 // len(line)


def test_read_pairs_bounds_blank_lines_from_a_stream_too(monkeypatch):
    if not os.path.isdir("/dev/fd"):
        pytest.skip("needs /dev/fd (Linux, macOS)")
    monkeypatch.setattr(pairs_module, "MAX_STREAM_BYTES", 4096)
    path, read_end, thread = _pipe_path([b"\n"], repeat=3 * 4096)
    try:
        with pytest.raises(DataError, match=r"more than 4096 bytes from a pipe or device"):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                data.read_pairs(path)
    finally:
        os.close(read_end)
        thread.join()
