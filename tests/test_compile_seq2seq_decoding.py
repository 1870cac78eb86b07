"""The Seq2Seq's decoder step compiled (issue 32, item 5).

Eager decoding is held against the decoding protocol as this model had it before the step
became a function of tensors (kept here as the oracle: numpy ids, host copies of the chosen
rows, the live rows only); compiled greedy decoding, sampling and beam search against eager
decoding of the same model, bit for bit, over cells, attentions, styles, depths and dtypes.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta
from tests.test_compile_decoding import sources
from tinygrad_attn.models import decoding
from tinygrad_attn.models.decoding import _COMPILED_STEPS as _COMPILED
from tinygrad_attn.models.seq2seq import Memory

# (cell, attention, style, num_layers, bidirectional): every cell, attention and style at
# least once, stacked layers, a bidirectional encoder (its bridge), no attention.
CONFIGS = [
    ("gru", "additive", "bahdanau", 1, True),
    ("lstm", "general", "luong", 2, False),
    ("rnn", "concat", "bahdanau", 2, False),
    ("gru", "dot", "luong", 1, False),
    ("lstm", None, "bahdanau", 2, True),
]


def model(config=CONFIGS[0], dtype: str = "float32", seed: int = 0):
    cell, attention, style, layers, bidirectional = config
    ta.manual_seed(seed)
    m = ta.models.Seq2Seq(20, 22, embed=8, hidden=12, cell=cell, attention=attention, style=style,
                          num_layers=layers, dropout=0.1, bidirectional=bidirectional)
    return m.double() if dtype == "float64" else m


class PreviousDecoding:
    """``ta.models.decoding``'s protocol as ``Seq2Seq`` implemented it before its step was
    compiled: numpy ids into ``_step``, the output layer on the step's features, and the
    survivors' rows copied on the host, the live rows only."""

    max_src_len = max_tgt_len = None

    def __init__(self, model):
        self.model = model

    def decode_start(self, src):
        memory = self.model.encode(src)
        return memory, memory.states

    def decode_step(self, state, tokens, t):
        memory, states = state
        m = self.model
        top, context, weight, states = m._step(tokens[:, None], states, memory)
        feature = top if context is None else m._readout(top, context)
        log_probs = decoding.log_softmax(m.out(feature)[:, 0].numpy())
        return log_probs, None if weight is None else weight.numpy()[:, 0], (memory, states)

    def decode_select(self, state, rows):
        memory, states = state

        def take(x):
            if isinstance(x, tuple):
                return tuple(take(part) for part in x)
            return None if x is None else ta.Tensor(x.numpy()[rows], dtype=x.dtype, device=x.device)

        memory = Memory(take(memory.keys), take(memory.keys_proj), memory.mask[rows], take(memory.key_mask),
                        [])
        return memory, [take(s) for s in states]


def same_hypotheses(a_best, b_best, exact: bool = True):
    assert len(a_best) == len(b_best)
    for a, b in zip(a_best, b_best, strict=True):
        assert a.tokens == b.tokens
        if exact:
            assert a.score == b.score and a.log_prob == b.log_prob
            np.testing.assert_array_equal(a.attention, b.attention)
        else:
            assert a.score == pytest.approx(b.score, rel=1e-12, abs=1e-12)
            np.testing.assert_allclose(a.attention, b.attention, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- eager against the previous decoding


@pytest.mark.parametrize("config", CONFIGS)
def test_eager_greedy_is_the_previous_decoding_bit_for_bit(config):
    m = model(config)
    src = sources(5, 7, 1)
    options = dict(max_len=[10, 3, 8, 10, 6], min_length=2, no_repeat_ngram_size=2, hypotheses=True)
    eager = m.greedy(src, **options)
    m.eval()
    previous = decoding.greedy(PreviousDecoding(m), src, **options)
    for a, b in zip(eager, previous, strict=True):
        assert a.tokens == b.tokens and a.log_prob == b.log_prob
        if a.attention is not None:
            np.testing.assert_array_equal(a.attention, b.attention)


@pytest.mark.parametrize("config", CONFIGS[:3])
def test_eager_beam_search_at_b_times_beam_rows_is_the_previous_search_in_float64(config):
    """The padding rows change nothing: the n-best of the search at B * beam rows a step are the
    previous search's (the live rows only), to the rounding of products over other row counts."""
    m = model(config, "float64")
    src = sources(4, 6, 3)
    options = dict(beam=3, max_len=[9, 4, 9, 7], n_best=3, length_penalty=0.6,
                   coverage_penalty=0.2 if config[1] else 0.0)
    eager = m.beam_search(src, **options)
    m.eval()
    previous = decoding.beam_search(PreviousDecoding(m), src, **options)
    for a_best, b_best in zip(eager, previous, strict=True):
        same_hypotheses(a_best, b_best, exact=False)


# ---------------------------------------------------------------- compiled against eager


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("config", CONFIGS)
def test_compiled_greedy_equals_eager_bit_for_bit_with_one_plan(config, dtype):
    m = model(config, dtype)
    for batch, width, seed, max_len in [(5, 7, 1, 10), (5, 7, 4, [10, 2, 7, 10, 5]), (3, 4, 5, 8)]:
        src = sources(batch, width, seed)
        eager = m.greedy(src, max_len=max_len, hypotheses=True)
        compiled = m.greedy(src, max_len=max_len, hypotheses=True, compile=True)
        for a, b in zip(eager, compiled, strict=True):
            assert a.tokens == b.tokens and a.log_prob == b.log_prob
            if config[1] is None:
                assert a.attention is None and b.attention is None
            else:
                np.testing.assert_array_equal(a.attention, b.attention)
    stats = _COMPILED[m].stats
    # One plan per batch size and source width: (5, 7) twice, (3, 4) once; every other step replays.
    assert stats.plans == 2 and stats.captures == 2 and stats.eager_calls == 0
    assert stats.replays > 10


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("config", CONFIGS[:2] + CONFIGS[4:])
def test_compiled_beam_search_equals_eager_bit_for_bit_with_one_plan(config, dtype):
    m = model(config, dtype)
    coverage = 0.3 if config[1] else 0.0
    for seed, options in [(1, dict(beam=3, max_len=10, n_best=3)),
                          (2, dict(beam=3, max_len=[10, 4, 8, 10, 6], n_best=2, length_penalty=0.0,
                                   coverage_penalty=coverage, min_length=2, no_repeat_ngram_size=2))]:
        src = sources(5, 7, seed)
        eager = m.beam_search(src, **options)
        compiled = m.beam_search(src, **options, compile=True)
        for a_best, b_best in zip(eager, compiled, strict=True):
            if config[1] is None:
                assert all(h.attention is None for h in a_best + b_best)
                assert [(h.tokens, h.score, h.log_prob) for h in a_best] == \
                    [(h.tokens, h.score, h.log_prob) for h in b_best]
            else:
                same_hypotheses(a_best, b_best)
    ids, attention = m.beam_search(src, beam=2, max_len=8)
    ids_c, attention_c = m.beam_search(src, beam=2, max_len=8, compile=True)
    np.testing.assert_array_equal(ids, ids_c)
    if config[1] is not None:
        np.testing.assert_array_equal(attention, attention_c)
    stats = _COMPILED[m].stats
    # One plan per row count and source width: 5 x 3 rows twice, 5 x 2 once.
    assert stats.plans == 2 and stats.eager_calls == 0 and stats.replays > 10


def test_compiled_sampling_equals_eager_with_the_same_seed():
    m = model(CONFIGS[1])
    src = sources(5, 7, 8)
    eager = m.sample(src, max_len=10, top_k=5, seed=3, hypotheses=True)
    compiled = m.sample(src, max_len=10, top_k=5, seed=3, hypotheses=True, compile=True)
    for a, b in zip(eager, compiled, strict=True):
        assert a.tokens == b.tokens and a.log_prob == b.log_prob
        np.testing.assert_array_equal(a.attention, b.attention)


def test_compiled_decoding_of_a_changed_model_and_of_empty_sources():
    m = model(CONFIGS[2])
    src = sources(4, 6, 7)
    m.greedy(src, max_len=8, compile=True)
    # New weights loaded: the plan's guard on the parameters' arrays captures again.
    other = model(CONFIGS[2], seed=5)
    m.load_state_dict(other.state_dict())
    for a, b in zip(m.greedy(src, max_len=8, compile=True), other.greedy(src, max_len=8), strict=True):
        np.testing.assert_array_equal(a, b)
    assert _COMPILED[m].stats.captures == 2
    # A source of width 0: keys of width 0, a plan all the same.
    empty = np.zeros((3, 0), dtype=np.int64)
    ids, attention = m.greedy(empty, max_len=5, compile=True)
    want_ids, want_attention = m.greedy(empty, max_len=5)
    np.testing.assert_array_equal(ids, want_ids)
    assert attention.shape == want_attention.shape == (3, ids.shape[1], 0)
    found = m.beam_search(empty, beam=2, max_len=5, n_best=2, compile=True)
    want = m.beam_search(empty, beam=2, max_len=5, n_best=2)
    assert [[(h.tokens, h.score) for h in best] for best in found] == \
        [[(h.tokens, h.score) for h in best] for best in want]


def test_beam_state_keeps_b_times_beam_rows_at_every_step():
    m = model(CONFIGS[1])
    src = sources(3, 5, 6)
    m.eval()
    with ta.no_grad():
        state = m.decode_start(src, max_rows=6)
        assert state.states[0][0].shape[0] == 6 and state.memory.key_mask.shape[0] == 6
        log_probs, attention, state = m.decode_step(state, np.full(3, 1, dtype=np.int64), 0)
        assert log_probs.shape == (3, 22) and attention.shape == (3, 5)       # the live rows only
        state = m.decode_select(state, np.array([2, 0]))                      # 2 live rows of 6
        assert state.memory.keys.shape[0] == 6 and list(state.source[:2]) == [2, 0]
        np.testing.assert_array_equal(state.memory.mask[:2], src[[2, 0]] != 0)
        log_probs, attention, _ = m.decode_step(state, np.array([4, 5]), 1)
        assert log_probs.shape == (2, 22)


def test_cuda_compiled_decoding_equals_eager_on_the_device():
    from tinygrad_attn.compiler import available_devices

    if "cuda" not in available_devices():
        pytest.skip("no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not set")
    def make():
        ta.manual_seed(0)
        return ta.models.Seq2Seq(12, 12, embed=4, hidden=6, cell="gru", attention="additive").double()

    m, host = make().to("cuda"), make()
    src = np.array([[4, 5, 6], [7, 8, 0]])
    eager = m.greedy(src, max_len=4, hypotheses=True)
    compiled = m.greedy(src, max_len=4, hypotheses=True, compile=True)
    on_host = host.greedy(src, max_len=4, hypotheses=True)       # the device's own kernels aside
    for a, b, c in zip(eager, compiled, on_host, strict=True):
        assert a.tokens == b.tokens == c.tokens and a.log_prob == b.log_prob
        np.testing.assert_array_equal(a.attention, b.attention)
        np.testing.assert_allclose(b.log_prob, c.log_prob, rtol=1e-9)
    eager = m.beam_search(src, beam=2, max_len=4, n_best=2)
    compiled = m.beam_search(src, beam=2, max_len=4, n_best=2, compile=True)
    for a_best, b_best in zip(eager, compiled, strict=True):
        same_hypotheses(a_best, b_best)
