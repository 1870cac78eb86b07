"""Decoding with a preallocated key/value cache, eager and compiled (issue 32, item 5).

The layer step (``TransformerDecoderLayer.step``) on a preallocated cache is held against the
layer's own ``forward`` on the whole prefix and against the growing cache; compiled greedy
decoding and sampling against eager decoding of the same model, bit for bit; the cache write
kernel against numpy's assignment; the attention over a cache's filled keys (``sdpa_prefix``)
against the numpy device's masked attention.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tinygrad_attn.compiler import get_backend
from tinygrad_attn.models.decoding import _COMPILED_ENCODERS as _ENCODERS
from tinygrad_attn.models.decoding import _COMPILED_STEPS as _COMPILED


def model(dtype: str = "float32", norm_first: bool = False, positions: str = "sinusoidal",
          layers: int = 2, seed: int = 0):
    ta.manual_seed(seed)
    m = ta.models.Transformer(20, 22, d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=layers,
                              dim_feedforward=32, dropout=0.1, norm_first=norm_first, positions=positions,
                              max_len=40)
    return m.double() if dtype == "float64" else m


def sources(batch: int, width: int, seed: int) -> np.ndarray:
    """Right-padded ids, one row shortened, the last row empty (all padding)."""
    src = np.random.default_rng(seed).integers(3, 20, size=(batch, width))
    src[min(1, batch - 1), width // 2:] = 0
    src[-1] = 0
    return src


# ---------------------------------------------------------------- the kernel


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple), data=st.data())
def test_write_at_writes_one_position_in_place_on_every_host_device(shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    position = data.draw(st.integers(0, shape[axis] - 1))
    rng = np.random.default_rng(len(shape) * 7 + axis)
    x = rng.normal(size=shape)
    rows = rng.normal(size=shape[:axis] + (1,) + shape[axis + 1:])
    want = x.copy()
    np.moveaxis(want, axis, 0)[position] = np.moveaxis(rows, axis, 0)[0]
    for device in ("numpy", "cpu"):
        got = x.copy()
        out = get_backend(device).write_at_(got, np.array(position, dtype=np.int64), rows, axis)
        assert out is got                              # in place: the kernel returns its target
        np.testing.assert_array_equal(got, want)


def _prefix_case(n: int, t_q: int, length: int, d: int, d_v: int, dtype, seed: int):
    rng = np.random.default_rng(seed)
    shapes = ((n, t_q, d), (n, length, d), (n, length, d_v))
    return tuple(rng.normal(size=shape).astype(dtype) for shape in shapes)


def _prefix_reference(q, k, v, position: int, scale: float) -> np.ndarray:
    """The numpy device's masked attention with every key past ``position`` hidden."""
    mask = (np.arange(k.shape[1]) <= position)[None, None, :]
    return get_backend("numpy").sdpa(q, k, v, mask, scale, False)[0]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), t_q=st.integers(1, 2), length=st.integers(1, 9), d=st.integers(1, 5),
       d_v=st.integers(1, 4), dtype=st.sampled_from([np.float32, np.float64]), data=st.data())
def test_sdpa_prefix_reads_only_the_keys_up_to_the_position_on_every_host_device(n, t_q, length, d, d_v,
                                                                                 dtype, data):
    position = data.draw(st.integers(0, length - 1))
    q, k, v = _prefix_case(n, t_q, length, d, d_v, dtype, n * 31 + length)
    want = _prefix_reference(q, k, v, position, 0.7)
    # Garbage past the position must not matter: the kernel never reads it.
    k[:, position + 1:], v[:, position + 1:] = np.nan, np.inf
    for device in ("numpy", "cpu"):
        got = get_backend(device).sdpa_prefix(q, k, v, np.array(position, dtype=np.int64), 0.7)
        assert got.shape == (n, t_q, d_v) and got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


def test_sdpa_prefix_equals_the_masked_kernel_bit_for_bit_on_the_cpu():
    # A decoding step used the masked kernel before: the same sums in the same order.
    cpu = get_backend("cpu")
    q, k, v = _prefix_case(256, 1, 30, 32, 32, np.float32, 5)
    for position in (0, 11, 29):
        mask = (np.arange(30) <= position)[None, None, :]
        np.testing.assert_array_equal(cpu.sdpa_prefix(q, k, v, np.array(position), 0.25),
                                      cpu.sdpa(q, k, v, mask, 0.25, False)[0])


@pytest.mark.parametrize("device", ["numpy", "cpu"])
def test_sdpa_prefix_refuses_a_position_outside_the_cache(device):
    q, k, v = _prefix_case(2, 1, 4, 3, 3, np.float64, 0)
    for position in (-1, 4):
        with pytest.raises(IndexError, match=rf"sdpa_prefix: position {position} is outside the 4 keys"):
            get_backend(device).sdpa_prefix(q, k, v, np.array(position), 1.0)


def test_cuda_sdpa_prefix_equals_the_numpy_reference():
    from tinygrad_attn.compiler import available_devices

    if "cuda" not in available_devices():
        pytest.skip("no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not set")
    from numba import cuda

    gpu = get_backend("cuda")
    for dtype, tol in ((np.float32, 1e-5), (np.float64, 1e-12)):
        q, k, v = _prefix_case(3, 2, 5, 4, 3, dtype, 1)
        for position in (0, 2, 4):
            got = gpu.sdpa_prefix(*(cuda.to_device(x) for x in (q, k, v)),
                                  cuda.to_device(np.array(position, dtype=np.int64)), 0.7).copy_to_host()
            np.testing.assert_allclose(got, _prefix_reference(q, k, v, position, 0.7), rtol=tol, atol=tol)


# ---------------------------------------------------------------- the layer step


@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_step_on_a_preallocated_cache_equals_forward_on_the_prefix_and_the_growing_cache(norm_first):
    layer = ta.nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first).double()
    layer.eval()
    rng = np.random.default_rng(3)
    x = ta.Tensor(rng.normal(size=(3, 6, 16)), dtype="float64")
    memory = ta.Tensor(rng.normal(size=(3, 5, 16)), dtype="float64")
    real = np.ones((3, 5), dtype=bool)
    real[1, 3:] = False
    with ta.no_grad():
        full = layer(x, memory, memory_key_mask=real, causal=True).numpy()               # (3, 6, 16)
        static, growing = layer.start_cache(memory, 8), layer.start_cache(memory)
        mask = ta.Tensor(real[:, None, None, :])
        for t in range(6):
            position = ta.Tensor(np.array(t, dtype=np.int64))
            a, weights = layer.step(x[:, t:t + 1], static, mask, position, need_weights=True)
            b, _ = layer.step(x[:, t:t + 1], growing, mask)
            np.testing.assert_allclose(a.numpy()[:, 0], full[:, t], rtol=1e-12, atol=1e-12)
            np.testing.assert_array_equal(a.numpy(), b.numpy())
            w = weights.numpy()                                                            # (3, H, 1, S)
            np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-12)
            assert not w[1, :, :, 3:].any()                                                # padding: weight 0
        # The buffers hold the six positions written, zeros after; the growing cache the same six.
        np.testing.assert_array_equal(static.keys.numpy()[:, :, :6], growing.keys.numpy())
        assert not static.keys.numpy()[:, :, 6:].any()
    with pytest.raises(ValueError, match="position"):
        layer.step(x[:, :1], static, mask)
    # Outside no_grad the preallocated step would silently give the weights no gradient: refused.
    with pytest.raises(RuntimeError, match="MultiHeadAttention.step: a preallocated cache .* keeps no graph"):
        layer.step(x[:, :1], static, mask, ta.Tensor(np.array(0, dtype=np.int64)))


def test_a_preallocated_cache_is_marked_by_its_length_not_by_a_tensor_the_step_takes():
    """``slots`` is the preallocated length as an int (None: growing); the compiled step's
    inputs are the token, the position, the mask and the caches' keys, values and weights,
    with no per-layer index tensor among them."""
    m = model()
    m.eval()
    src = sources(3, 5, seed=2)
    layer = m.transformer.decoder.layers[0]
    with ta.no_grad():
        memory = m.encode(src)
    static, growing = layer.start_cache(memory, 7), layer.start_cache(memory)
    assert type(static.slots) is int and static.slots == 7 and static.keys.shape[2] == 7
    assert growing.slots is None
    assert len(static.tensors()) == len(ta.nn.DecoderCache.tensor_names())
    assert all(x is None or isinstance(x, ta.Tensor) for x in static.tensors())
    again = ta.nn.DecoderCache.from_tensors(static.tensors(), slots=7)
    assert again.slots == 7 and again.keys is static.keys and again.linear2_weight is static.linear2_weight

    @dataclasses.dataclass
    class Tagged(ta.nn.DecoderCache):          # the field names are read once per class
        tag: ta.Tensor | None = None

    tagged = Tagged.from_tensors((*static.tensors(), static.keys), slots=7)
    assert Tagged.tensor_names()[-1] == "tag" and tagged.tensors()[-1] is static.keys
    assert len(ta.nn.DecoderCache.tensor_names()) == len(Tagged.tensor_names()) - 1
    with pytest.raises(TypeError, match="slots"):
        layer.cache(static.keys, static.values, static.memory_keys, static.memory_values,
                    ta.Tensor.arange(7, dtype="int64"))

    m.greedy(src, max_len=5, compile=True)
    title = _COMPILED[m].source.split("inputs ", 1)[1].split(";")[0]
    # tokens (N, 1) and the position (), nothing else of int64
    assert title.count("int64") == 2, title


# ---------------------------------------------------------------- eager against the uncached decoder


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_greedy_scores_equal_the_uncached_decoder_in_float64(norm_first):
    m = model("float64", norm_first)
    src = sources(5, 7, 1)
    cached = m.greedy(src, max_len=10, hypotheses=True)
    uncached = m.greedy(src, max_len=10, hypotheses=True, use_cache=False)
    for a, b in zip(cached, uncached, strict=True):
        assert a.tokens == b.tokens
        assert a.log_prob == pytest.approx(b.log_prob, abs=1e-12)
        np.testing.assert_allclose(a.attention, b.attention, rtol=1e-12, atol=1e-12)


def test_the_preallocated_length_does_not_change_the_decode():
    m = model("float64")
    src = sources(4, 6, 2)
    m.eval()
    with ta.no_grad():
        short, long = m.decode_start(src, max_steps=9), m.decode_start(src)             # 9 and 40 positions
        assert short.caches[0].keys.shape[2] == 9 and long.caches[0].keys.shape[2] == 40
        tokens = np.full(4, 1, dtype=np.int64)
        for t in range(9):
            a, att_a, short = m.decode_step(short, tokens, t)
            b, att_b, long = m.decode_step(long, tokens, t)
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(att_a, att_b, rtol=1e-12, atol=1e-12)
            tokens = a.argmax(axis=1)


# ---------------------------------------------------------------- compiled against eager


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("norm_first", "positions"), [(False, "sinusoidal"), (True, "learned")])
def test_compiled_greedy_equals_eager_bit_for_bit_with_one_plan(dtype, norm_first, positions):
    m = model(dtype, norm_first, positions)
    for batch, width, seed in [(5, 7, 1), (5, 7, 4), (3, 4, 5)]:
        src = sources(batch, width, seed)
        eager = m.greedy(src, max_len=12, hypotheses=True)
        compiled = m.greedy(src, max_len=12, hypotheses=True, compile=True)
        for a, b in zip(eager, compiled, strict=True):
            assert a.tokens == b.tokens
            assert a.log_prob == b.log_prob
            np.testing.assert_array_equal(a.attention, b.attention)
    stats = _COMPILED[m].stats
    # One plan per batch size and source width: (5, 7) twice, (3, 4) once; every other step replays.
    assert stats.plans == 2 and stats.captures == 2 and stats.eager_calls == 0
    assert stats.replays > 20
    # The encoder replays its own plan, one per batch size and source width too.
    encoder = _ENCODERS[m].stats
    assert encoder.plans == 2 and encoder.captures == 2 and encoder.replays == 1 and encoder.eager_calls == 0


def test_a_replayed_compiled_decode_dispatches_no_op_but_the_query_slices(monkeypatch):
    """Once captured, a compiled decode runs plans: the encoder and every layer's projected
    memory in one, each step in the other.  What is still dispatched eagerly is the slicing
    of each layer's packed projection (``query_projection``: once a decode, whatever its
    length), never an op of the encoder, the projections or a step."""
    m = model()
    src = sources(4, 6, 2)
    for max_len in (6, 12):
        m.greedy(src, max_len=max_len, compile=True)
    apply = ta.autograd.Op.apply.__func__

    def dispatched_by(**options):
        seen = []

        def spy(cls, *inputs, **attrs):
            seen.append(cls.__name__)
            return apply(cls, *inputs, **attrs)

        with monkeypatch.context() as patch:
            patch.setattr(ta.autograd.Op, "apply", classmethod(spy))
            m.greedy(src, **options)
        return seen

    short, long = dispatched_by(max_len=6, compile=True), dispatched_by(max_len=12, compile=True)
    assert short == long and set(short) == {"GetItem"} and len(short) == 6 * len(m.transformer.decoder.layers)
    eager = dispatched_by(max_len=6)                    # the spy sees eager decoding's ops
    assert {"Linear", "LayerNorm"} <= set(eager) and len(eager) > 20 * len(short)


def test_compiled_greedy_options_and_a_changed_model():
    m = model()
    src = sources(4, 6, 7)
    options = dict(max_len=[12, 3, 8, 12], min_length=2, no_repeat_ngram_size=2)
    eager = m.greedy(src, **options)
    compiled = m.greedy(src, **options, compile=True)
    for a, b in zip(eager, compiled, strict=True):
        np.testing.assert_array_equal(a, b)
    # New weights loaded: the plan's guard on the parameters' arrays captures again.
    other = model(seed=5)
    m.load_state_dict(other.state_dict())
    again = m.greedy(src, **options, compile=True)
    fresh = other.greedy(src, **options)
    for a, b in zip(again, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    assert _COMPILED[m].stats.captures == 2


def test_compiled_sampling_equals_eager_with_the_same_seed():
    m = model()
    src = sources(5, 7, 8)
    eager = m.sample(src, max_len=10, top_k=5, seed=3, hypotheses=True)
    compiled = m.sample(src, max_len=10, top_k=5, seed=3, hypotheses=True, compile=True)
    for a, b in zip(eager, compiled, strict=True):
        assert a.tokens == b.tokens and a.log_prob == b.log_prob


def test_compiled_decoding_without_decoder_layers_and_its_refusals():
    m = model(layers=0)
    src = sources(3, 5, 9)
    eager, _ = m.greedy(src, max_len=6)
    compiled, attention = m.greedy(src, max_len=6, compile=True)
    np.testing.assert_array_equal(eager, compiled)
    assert attention is None
    with pytest.raises(ValueError, match="use_cache"):
        m.greedy(src, compile=True, use_cache=False)


def test_cuda_compiled_greedy_equals_eager_on_the_device():
    from tinygrad_attn.compiler import available_devices

    if "cuda" not in available_devices():
        pytest.skip("no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not set")
    ta.manual_seed(0)
    m = ta.models.Transformer(12, 12, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=8, max_len=10)
    src = np.array([[4, 5, 6], [7, 8, 0]])
    host = m.greedy(src, max_len=4, hypotheses=True)
    m.to("cuda")
    eager = m.greedy(src, max_len=4, hypotheses=True)
    compiled = m.greedy(src, max_len=4, hypotheses=True, compile=True)
    for a, b, c in zip(host, eager, compiled, strict=True):
        assert a.tokens == b.tokens == c.tokens
        assert b.log_prob == pytest.approx(a.log_prob, rel=1e-5)          # the device's float32 rounding
        assert c.log_prob == b.log_prob
        np.testing.assert_array_equal(b.attention, c.attention)


# ---------------------------------------------------------------- beam search at a fixed row count


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple),
       picks=st.lists(st.integers(0, 5), min_size=1, max_size=9))
def test_take_rows_is_numpy_fancy_indexing_on_every_host_device(shape, picks):
    from tinygrad_attn.models.decoding import take_rows as _take_rows

    x = np.random.default_rng(len(picks)).normal(size=(6,) + shape)
    rows = np.array(picks, dtype=np.int64)
    for device in ("numpy", "cpu"):
        got = _take_rows(ta.Tensor(x, dtype="float64", device=device), ta.Tensor(rows, device=device))
        np.testing.assert_array_equal(got.numpy(), x[rows])


def test_beam_state_keeps_b_times_beam_rows_at_every_step():
    m = model()
    src = sources(3, 5, 6)
    m.eval()
    with ta.no_grad():
        state = m.decode_start(src, max_steps=6, max_rows=6)
        assert state.caches[0].keys.shape[0] == 6 and state.step_mask.shape[0] == 6
        log_probs, attention, state = m.decode_step(state, np.full(3, 1, dtype=np.int64), 0)
        assert log_probs.shape == (3, 22) and attention.shape == (3, 5)       # the live rows only
        state = m.decode_select(state, np.array([2, 0]))                      # 2 live rows of 6
        assert state.caches[1].memory_keys.shape[0] == 6 and list(state.source[:2]) == [2, 0]
        log_probs, attention, _ = m.decode_step(state, np.array([4, 5]), 1)
        assert log_probs.shape == (2, 22)
        # The device gathers take the rows unchecked: the host index is checked first.
        with pytest.raises(IndexError, match="decode_select: row 6 is outside the state's 6 rows"):
            m.decode_select(state, np.array([0, 6]))
        with pytest.raises(IndexError, match="decode_select: row -1 is outside"):
            m.decode_select(state, np.array([-1]))
        with pytest.raises(ValueError, match="7 rows do not fit the state's capacity of 6"):
            m.decode_select(state, np.zeros(7, dtype=np.int64))


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_beam_search_equals_the_uncached_decoder_in_float64(norm_first):
    """The padded rows change nothing: the n-best of the cached search (B * beam rows a step)
    are the uncached decoder's (the live rows only, the whole prefix re-run)."""
    m = model("float64", norm_first)
    src = sources(4, 6, 3)
    options = dict(beam=3, max_len=9, n_best=3, length_penalty=0.6, coverage_penalty=0.2)
    cached = m.beam_search(src, **options)
    uncached = m.beam_search(src, **options, use_cache=False)
    for a_best, b_best in zip(cached, uncached, strict=True):
        assert len(a_best) == len(b_best)
        for a, b in zip(a_best, b_best, strict=True):
            assert a.tokens == b.tokens
            assert a.score == pytest.approx(b.score, abs=1e-11)
            np.testing.assert_allclose(a.attention, b.attention, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("norm_first", "positions"), [(False, "sinusoidal"), (True, "learned")])
def test_compiled_beam_search_equals_eager_bit_for_bit_with_one_plan(dtype, norm_first, positions):
    m = model(dtype, norm_first, positions)
    for seed, options in [(1, dict(beam=3, max_len=12, n_best=3)),
                          (2, dict(beam=3, max_len=[12, 4, 9, 12, 6], n_best=2, length_penalty=0.0,
                                   coverage_penalty=0.3, min_length=2, no_repeat_ngram_size=2))]:
        src = sources(5, 7, seed)
        eager = m.beam_search(src, **options)
        compiled = m.beam_search(src, **options, compile=True)
        for a_best, b_best in zip(eager, compiled, strict=True):
            assert len(a_best) == len(b_best)
            for a, b in zip(a_best, b_best, strict=True):
                assert a.tokens == b.tokens and a.score == b.score and a.log_prob == b.log_prob
                np.testing.assert_array_equal(a.attention, b.attention)
    ids, attention = m.beam_search(src, beam=2, max_len=8)
    ids_c, attention_c = m.beam_search(src, beam=2, max_len=8, compile=True)
    np.testing.assert_array_equal(ids, ids_c)
    np.testing.assert_array_equal(attention, attention_c)
    stats = _COMPILED[m].stats
    # One plan per row count and source width: 5 x 3 rows twice, 5 x 2 once.
    assert stats.plans == 2 and stats.eager_calls == 0 and stats.replays > 20


def test_compiled_beam_search_every_head_and_without_decoder_layers():
    m = model()
    src = sources(3, 5, 10)
    eager = m.beam_search(src, beam=2, max_len=7, n_best=2, average_weights=False)
    compiled = m.beam_search(src, beam=2, max_len=7, n_best=2, average_weights=False, compile=True)
    for a_best, b_best in zip(eager, compiled, strict=True):
        for a, b in zip(a_best, b_best, strict=True):
            assert a.tokens == b.tokens and a.score == b.score
            assert a.attention.shape == (2, 4, len(a.tokens), 5)
            np.testing.assert_array_equal(a.attention, b.attention)
    flat = model(layers=0)
    ids, attention = flat.beam_search(src, beam=2, max_len=6, compile=True)
    np.testing.assert_array_equal(ids, flat.beam_search(src, beam=2, max_len=6)[0])
    assert attention is None


def test_cuda_compiled_beam_search_equals_eager_on_the_device():
    from tinygrad_attn.compiler import available_devices

    if "cuda" not in available_devices():
        pytest.skip("no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not set")
    def make():
        ta.manual_seed(0)
        return ta.models.Transformer(12, 12, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                     dim_feedforward=8, max_len=10).double()

    m, host = make().to("cuda"), make()
    src = np.array([[4, 5, 6], [7, 8, 0]])
    eager = m.beam_search(src, beam=2, max_len=4, n_best=2)
    compiled = m.beam_search(src, beam=2, max_len=4, n_best=2, compile=True)
    on_host = host.beam_search(src, beam=2, max_len=4, n_best=2)     # the device's own kernels aside
    for a_best, b_best, c_best in zip(eager, compiled, on_host, strict=True):
        for a, b, c in zip(a_best, b_best, c_best, strict=True):
            assert a.tokens == b.tokens == c.tokens and a.score == b.score
            np.testing.assert_array_equal(a.attention, b.attention)
            np.testing.assert_allclose(b.score, c.score, rtol=1e-9)
            np.testing.assert_allclose(b.attention, c.attention, rtol=1e-9, atol=1e-12)


def test_a_model_that_decoded_compiled_is_freed():
    """The per-model compiled step reaches its model weakly: a model dropped after a compiled
    decode is collected (a bound method kept in the weak-keyed table held it forever)."""
    import gc
    import weakref

    model = ta.models.Transformer(10, 10, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                  dim_feedforward=8).eval()
    model.greedy(np.array([[4, 5, 6]]), max_len=3, compile=True)
    seq2seq = ta.models.Seq2Seq(10, 10, embed=4, hidden=6).eval()
    seq2seq.greedy(np.array([[4, 5, 6]]), max_len=3, compile=True)
    refs = [weakref.ref(model), weakref.ref(seq2seq)]
    del model, seq2seq
    gc.collect()
    assert [r() for r in refs] == [None, None]


# ---------------------------------------------------------------- the step's weights


def test_a_decode_multiplies_by_copies_of_the_weights_as_they_are_at_its_start():
    """The cache holds each step weight as a ``rows_layout`` copy (the module's values, laid
    out transposed on the host): made at every decode's start, so after the weights change in
    place (here by a compiled training step, which bumps no version) the next compiled decode
    reads the new values: it equals the eager decode bit for bit and the decode without a
    cache (which reads the modules' weights) to rounding."""
    m = model()
    m.eval()
    src = sources(4, 7, seed=3)
    layer = m.transformer.decoder.layers[0]
    with ta.no_grad():
        memory = m.encode(src)
    cache = layer.start_cache(memory, 5)
    pairs = [(cache.self_in_weight, layer.self_attn.in_proj_weight),
             (cache.self_out_weight, layer.self_attn.out_proj.weight),
             (cache.cross_out_weight, layer.multihead_attn.out_proj.weight),
             (cache.linear1_weight, layer.linear1.weight), (cache.linear2_weight, layer.linear2.weight)]
    for copy, weight in pairs:
        assert copy.shape == weight.shape and not copy.requires_grad
        np.testing.assert_array_equal(copy.numpy(), weight.numpy())
        assert copy._data.flags.f_contiguous and copy._data is not weight._data
    before = m.greedy(src, max_len=6, hypotheses=True, compile=True)

    m.train()
    optimizer = ta.optim.Adam(m.parameters(), lr=0.05)
    tgt = np.random.default_rng(4).integers(3, 22, size=(4, 6))
    tgt_in = np.concatenate([np.ones((4, 1), np.int64), tgt[:, :-1]], axis=1)

    @ta.compile
    def step(src_ids, tgt_in_ids, tgt_ids):
        optimizer.zero_grad()
        loss = m.loss(src_ids, tgt_in_ids, tgt_ids)
        loss.backward()
        optimizer.step()
        return loss

    ids = tuple(ta.Tensor(a) for a in (src, tgt_in, tgt))
    for _ in range(3):
        step(*ids)
    assert step.stats.replays >= 1
    m.eval()
    after = m.greedy(src, max_len=6, hypotheses=True, compile=True)
    eager = m.greedy(src, max_len=6, hypotheses=True)
    assert [h.log_prob for h in after] == [h.log_prob for h in eager]
    assert [h.tokens for h in after] == [h.tokens for h in eager]
    # The decode without a cache reads the modules' weights themselves: a copy kept from an
    # earlier decode would be far off it.
    uncached = m.greedy(src, max_len=6, hypotheses=True, use_cache=False)
    assert [h.tokens for h in after] == [h.tokens for h in uncached]
    np.testing.assert_allclose([h.log_prob for h in after], [h.log_prob for h in uncached], rtol=1e-5)
    assert not np.allclose([h.log_prob for h in after], [h.log_prob for h in before], rtol=1e-3)
