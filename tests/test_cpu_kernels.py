"""Properties of the Numba kernels that the conformance suite's small shapes do not reach:
the float32 exp and tanh across their whole range, the online softmax across several key
blocks, and the float32 error of long sums."""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tinygrad_attn.compiler import cpu, numba_support, reference, threads
from tinygrad_attn.compiler.cpu import additive, attention

TOL = {np.float32: {"rtol": 2e-5, "atol": 1e-6}, np.float64: {"rtol": 1e-10, "atol": 1e-12}}


def test_exp32_relative_error_over_the_float32_range():
    x = np.linspace(-87.0, 88.0, 200_001).astype(np.float32)
    got = np.array([numba_support._exp32(v) for v in x[::50]], dtype=np.float64)
    want = np.exp(x[::50].astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 4e-7   # a few float32 ulps


@pytest.mark.parametrize("x, want", [(-np.inf, 0.0), (-88.0, 0.0), (-1e30, 0.0), (0.0, 1.0),
                                     (89.0, np.inf), (np.inf, np.inf)])
def test_exp32_edges(x, want):
    assert numba_support._exp32(np.float32(x)) == want


def test_exp32_keeps_nan():
    assert np.isnan(numba_support._exp32(np.float32(np.nan)))


def test_tanh32_relative_error_and_edges():
    x = np.linspace(-12.0, 12.0, 4001).astype(np.float32)
    got = np.array([numba_support._tanh32(v) for v in x], dtype=np.float64)
    want = np.tanh(x.astype(np.float64))
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)) < 3e-7
    tiny = np.float32(1e-30)
    assert numba_support._tanh32(tiny) == tiny                     # no cancellation near 0
    assert numba_support._tanh32(np.float32(np.inf)) == 1.0
    assert numba_support._tanh32(np.float32(-np.inf)) == -1.0
    assert np.isnan(numba_support._tanh32(np.float32(np.nan)))


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 queries and 3 keys, so that small inputs take many of each (and the
    kernels, which small inputs otherwise leave to the reference)."""
    monkeypatch.setattr(attention, "SDPA_QUERY_BLOCK", 4)
    monkeypatch.setattr(attention, "SDPA_KEY_BLOCK", 3)
    monkeypatch.setattr(attention, "SDPA_KERNEL_MIN", 0)
    monkeypatch.setattr(attention, "SDPA_HEAD_MIN", 0)


# The patched block sizes hold for every generated input: the fixture need not rerun.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t_q=st.integers(1, 11), t_k=st.integers(1, 11), masked=st.booleans(), causal=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_sdpa_online_softmax_across_key_blocks(small_blocks, t_q, t_k, masked, causal, dtype, seed):
    rng = np.random.default_rng(seed)
    # Later keys get larger scores, so the running max changes from block to block.
    q = rng.normal(size=(2, t_q, 3)).astype(dtype)
    k = (rng.normal(size=(2, t_k, 3)) * np.linspace(0.5, 4.0, t_k)[:, None]).astype(dtype)
    v = rng.normal(size=(2, t_k, 2)).astype(dtype)
    mask = rng.random((2, t_q, t_k)) < 0.5 if masked else None
    o, lse = attention.sdpa(q, k, v, mask, 0.7, causal)
    o_ref, lse_ref = reference.sdpa(q, k, v, mask, 0.7, causal)
    np.testing.assert_allclose(o, o_ref, **TOL[dtype])
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(lse_ref))
    np.testing.assert_allclose(lse[np.isfinite(lse)], lse_ref[np.isfinite(lse_ref)], **TOL[dtype])
    do = rng.normal(size=o.shape).astype(dtype)
    for got, want in zip(attention.sdpa_back(q, k, v, o, lse, do, mask, 0.7, causal),
                         reference.sdpa_back(q, k, v, o_ref, lse_ref, do, mask, 0.7, causal), strict=True):
        np.testing.assert_allclose(got, want, **TOL[dtype])


@settings(deadline=None, max_examples=60)
@given(n=st.integers(1, 4), t_q=st.integers(1, 9), t_k=st.integers(1, 9), d=st.integers(1, 5),
       mask_kind=st.sampled_from(["none", "shared", "per-entry"]), causal=st.booleans(),
       parallel=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**32 - 1))
def test_sdpa_small_heads_equal_the_reference(n, t_q, t_k, d, mask_kind, causal, parallel, dtype, seed):
    """Below SDPA_KERNEL_MIN the one-sweep-per-head kernels run (serial, or heads in
    parallel): outputs, log-sum-exps and all three gradients equal the reference's, with
    rows that see nothing (every key masked) giving 0 and lse -inf.  (The op answers empty
    query or key sets itself, without a kernel.)"""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(n, t, d)).astype(dtype) for t in (t_q, t_k, t_k))
    mask = {"none": None, "shared": rng.random((1, t_q, t_k)) < 0.6,
            "per-entry": rng.random((n, t_q, t_k)) < 0.6}[mask_kind]
    assert n * t_q * t_k < attention.SDPA_KERNEL_MIN
    threshold = 0 if parallel else 2**62
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "SDPA_SMALL_SPLIT_MIN", threshold)
        patch.setattr(threads, "_requested", [2 if parallel else 1])
        o, lse = attention.sdpa(q, k, v, mask, 0.7, causal)
        o_ref, lse_ref, weights_ref = reference.sdpa(q, k, v, mask, 0.7, causal, True)
        np.testing.assert_allclose(o, o_ref, **TOL[dtype])
        *same, weights = attention.sdpa(q, k, v, mask, 0.7, causal, True)
        np.testing.assert_array_equal(same[0], o)
        np.testing.assert_allclose(weights, weights_ref, **TOL[dtype])
        np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(lse_ref))
        np.testing.assert_allclose(lse[np.isfinite(lse)], lse_ref[np.isfinite(lse_ref)], **TOL[dtype])
        do = rng.normal(size=o.shape).astype(dtype)
        expected = reference.sdpa_back(q, k, v, o_ref, lse_ref, do, mask, 0.7, causal)
        # The public kernel hands many queries' backward to the reference: test both.
        q4, k4, v4, o4, do4 = attention._heads_in_place(q, k, v, o, do)
        small = attention._sdpa_small_back(q4, k4, v4, o4, lse, do4, mask, 0.7, causal)
        for grads in (attention.sdpa_back(q, k, v, o, lse, do, mask, 0.7, causal),
                      attention._as_given(q, *small)):
            for got, want in zip(grads, expected, strict=True):
                assert got.dtype == dtype
                np.testing.assert_allclose(got, want, **TOL[dtype])


@pytest.mark.parametrize("n, t_q, t_k, a", [(1, 1, 1, 1), (3, 1, 20, 128), (2, 37, 23, 17), (33, 2, 5, 64)])
def test_additive_scores_float32_within_rounding_of_float64(loop, n, t_q, t_k, a):
    """Large sums, serial and parallel kernels: each float32 result is within a few float32
    roundings of the float64 reference, measured against the sum of its terms' sizes."""
    rng = np.random.default_rng(n * 1000 + t_q)
    q, k = rng.normal(size=(n, t_q, a)), rng.normal(size=(n, t_k, a)) * 2
    v, de = rng.normal(size=a), rng.normal(size=(n, t_q, t_k)) * (rng.random((n, t_q, t_k)) < 0.7)
    f32 = [x.astype(np.float32) for x in (q, k, v, de)]
    e = additive.additive_scores(*f32[:3])
    np.testing.assert_allclose(e, reference.additive_scores(q, k, v), rtol=0, atol=1e-6 * np.abs(v).sum())
    dq, dk, dv = additive.additive_scores_back(*f32)
    dq_ref, dk_ref, dv_ref = reference.additive_scores_back(q, k, v, de)
    size_dq = np.abs(de).sum(axis=2)[..., None] * np.abs(v)          # (N, T_q, A): the terms' sizes
    size_dk = np.abs(de).sum(axis=1)[..., None] * np.abs(v)          # (N, T_k, A)
    assert np.all(np.abs(dq - dq_ref) <= 1e-6 * size_dq + 1e-7)
    assert np.all(np.abs(dk - dk_ref) <= 1e-6 * size_dk + 1e-7)
    assert np.all(np.abs(dv - dv_ref) <= 1e-6 * np.abs(de).sum() + 1e-7)
    assert dq.dtype == dk.dtype == dv.dtype == e.dtype == np.float32


@pytest.fixture(params=["serial", "parallel"])
def loop(request, monkeypatch):
    """Every size-chosen kernel of compiler/cpu/ takes its serial (or its parallel) loop."""
    for family in (cpu.softmax, cpu.additive):
        monkeypatch.setattr(family, "_scaled", lambda entries: 2**62 if request.param == "serial" else 0)
    monkeypatch.setattr(cpu.norm, "PARALLEL_MIN", 2**62 if request.param == "serial" else 0)
    return request.param


@pytest.mark.parametrize("rows", [3, 200])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_kernels_serial_and_parallel_loops(loop, rows, dtype):
    rng = np.random.default_rng(rows)
    x = (rng.normal(size=(rows, 100)) * 10).astype(dtype)
    dy = rng.normal(size=x.shape).astype(dtype)
    mask = rng.random(x.shape) < 0.5
    target = rng.integers(0, 100, size=rows)
    y, logy = reference.softmax(x, -1), reference.log_softmax(x, -1)
    cases = [("softmax", (x, -1)), ("masked_softmax", (x, mask)), ("log_softmax", (x, -1)),
             ("softmax_back", (y, dy, -1)), ("log_softmax_back", (logy, dy, -1)),
             ("cross_entropy", (x, target, -100)),
             ("cross_entropy_back", (x, reference.cross_entropy(x, target, 5)[1], target, 5, dy[:, 0]))]
    weight, bias = rng.normal(size=100).astype(dtype), rng.normal(size=100).astype(dtype)
    _, mean, rstd = reference.layer_norm(x, weight, bias, 1e-5)
    cases += [("layer_norm", (x, weight, bias, 1e-5)), ("layer_norm_back", (dy, x, mean, rstd, weight))]
    _, mean, rstd = reference.layer_norm(x, None, None, 1e-5)       # no weight, no bias
    cases += [("layer_norm", (x, None, None, 1e-5)), ("layer_norm", (x, weight, None, 1e-5)),
              ("layer_norm_back", (dy, x, mean, rstd, None))]
    for name, args in cases:
        got, want = cpu.KERNELS[name](*args), getattr(reference, name)(*args)
        if not isinstance(got, tuple):
            got, want = (got,), (want,)
        for g, w in zip(got, want, strict=True):
            if w is None:                                  # no weight: no weight's gradient
                assert g is None, name
            else:
                np.testing.assert_allclose(g, w, **TOL[dtype], err_msg=name)


@given(lead=st.lists(st.integers(0, 4), max_size=3), n=st.integers(1, 9),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_add_bias_to_rows_equals_numpy_bit_for_bit(lead, n, dtype, seed):
    """The cpu add_'s own loop (b (N,) onto every row of a (..., N)) makes numpy's sums, in
    place, and returns a itself."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(*lead, n)).astype(dtype)
    b = rng.normal(size=n).astype(dtype)
    want = np.add(a, b)
    got = cpu.KERNELS["add_"](a, b)
    assert got is a
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows", [1, 3, 7, 50])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_blocks_of_rows_give_the_same_bits_at_any_count(rows, dtype):
    """The parallel kernels split the rows into blocks, one a thread, as many as asked (more
    than rows included: empty blocks): every output has the same bits at any count, so no
    result depends on the thread count, and equals the serial kernels' to rounding (Numba
    compiles the rows' loops inside the parallel kernel apart: they may sum another way)."""
    norm = cpu.norm
    rng = np.random.default_rng(rows)
    x, dy = (rng.normal(size=(rows, 33)).astype(dtype) for _ in range(2))
    weight, bias = rng.normal(size=33).astype(dtype), rng.normal(size=33).astype(dtype)

    def forward(kernel, *count):
        y, mean, rstd = np.empty_like(x), np.empty(rows, dtype), np.empty(rows, dtype)
        kernel(x, weight, bias, 1e-5, y, mean, rstd, *count)
        return y, mean, rstd

    def serial(*args):
        norm._layer_norm_rows(*args, 0, rows)

    def backward(kernel, *count):
        dx, dweight, dbias = np.empty_like(x), np.zeros(33, dtype), np.zeros(33, dtype)
        kernel(dy, x, serial_out[1], serial_out[2], weight, dx, dweight, dbias, *count)
        return dx, dweight, dbias

    serial_out = forward(serial)
    serial_all = serial_out + backward(norm._layer_norm_back_rows)
    one_block = forward(norm._layer_norm_parallel, 1) + backward(norm._layer_norm_back_parallel, 1)
    for got, expected in zip(one_block, serial_all, strict=True):
        np.testing.assert_allclose(got, expected, **TOL[dtype])
    for count in range(2, 9):
        for got, expected in zip(forward(norm._layer_norm_parallel, count) +
                                 backward(norm._layer_norm_back_parallel, count), one_block, strict=True):
            np.testing.assert_array_equal(got, expected, err_msg=f"{count} blocks")


@example(rows=700, cols=1, keepdims=False, dtype=np.float32, seed=1)       # numpy's pairwise sum
@given(rows=st.integers(0, 700), cols=st.integers(0, 40), keepdims=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_sum_over_rows_equals_numpy_bit_for_bit(rows, cols, keepdims, dtype, seed):
    """The cpu sum over axis 0 of a matrix adds the rows in numpy's order: the same bits."""
    x = (np.random.default_rng(seed).normal(size=(rows, cols)) * 100).astype(dtype)
    for axis in (0, (0,)):
        got, want = cpu.KERNELS["sum"](x, axis, keepdims), x.sum(axis=axis, keepdims=keepdims)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_sum_leaves_other_axes_and_layouts_to_numpy():
    x = np.arange(12.0).reshape(3, 4)
    for args in [(x, 1, False), (x, None, False), (x, (0, 1), True), (x.T, 0, False),
                 (x.astype(int), 0, False), (x[None], 0, False), (x.astype(np.float16), 0, False),
                 (x.astype(">f8"), 0, False)]:
        got, want = cpu.KERNELS["sum"](*args), args[0].sum(axis=args[1], keepdims=args[2])
        assert np.shape(got) == np.shape(want)
        np.testing.assert_array_equal(got, want)


def test_add_bias_leaves_what_it_does_not_handle_to_numpy():
    """Overlapping memory, another layout or dtype (float16, big-endian), a broadcast other
    than along rows, and a read-only array: numpy's results, and numpy's error."""
    add_ = cpu.KERNELS["add_"]
    a = np.arange(12.0).reshape(3, 4)
    want = a + a[0].copy()
    np.testing.assert_array_equal(add_(a, a[0]), want)          # b is a's first row: numpy buffers
    a = np.arange(12.0).reshape(4, 3).T                           # not C-contiguous
    np.testing.assert_array_equal(add_(a.copy(order="F"), np.ones(4)), a + 1)
    a32 = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(add_(a32, np.full(3, 0.5)), np.full((2, 3), 1.5, np.float32))
    np.testing.assert_array_equal(add_(np.ones((2, 3)), np.ones((2, 1))), np.full((2, 3), 2.0))
    for dtype in (np.float16, ">f4"):                 # dtypes the loop is not compiled for
        np.testing.assert_array_equal(add_(np.ones((2, 3), dtype), np.ones(3, dtype)), np.full((2, 3), 2.0))
    frozen = np.ones((2, 3))
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        add_(frozen, np.ones(3))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t_q=st.integers(1, 9), t_k=st.integers(1, 9), masked=st.sampled_from([None, "shared", "per_entry"]),
       causal=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_sdpa_weights_rebuilt_from_lse_are_the_softmax(kernels_at_any_size, t_q, t_k, masked, causal, dtype,
                                                        seed):
    """The kernel's weights, rebuilt from lse or written by the forward (``with_weights``),
    equal the reference's and the textbook masked softmax; a row with nothing to attend to
    is all zeros; the forward's other outputs do not change."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(3, t, 4)).astype(dtype) for t in (t_q, t_k, t_k))
    mask = None if masked is None else rng.random((1 if masked == "shared" else 3, t_q, t_k)) < 0.6
    _, lse = reference.sdpa(q, k, v, mask, 0.7, causal)
    got = attention.sdpa_weights(q, k, lse, mask, 0.7, causal)
    np.testing.assert_allclose(got, reference.sdpa_weights(q, k, lse, mask, 0.7, causal), **TOL[dtype])
    allowed = np.ones((3, t_q, t_k), dtype=bool) if mask is None else np.broadcast_to(mask, (3, t_q, t_k))
    if causal:
        allowed = allowed & np.tril(np.ones((t_q, t_k), dtype=bool))
    s = np.where(allowed, (q.astype(np.float64) * 0.7) @ k.astype(np.float64).transpose(0, 2, 1), -np.inf)
    with np.errstate(invalid="ignore"):
        want = np.exp(s - s.max(axis=-1, keepdims=True))
        want = np.nan_to_num(want / want.sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(got, want, **TOL[dtype])
    o, lse_kernel = attention.sdpa(q, k, v, mask, 0.7, causal)
    *same, written = attention.sdpa(q, k, v, mask, 0.7, causal, True)
    np.testing.assert_allclose(written, want, **TOL[dtype])
    np.testing.assert_array_equal(same[0], o)
    np.testing.assert_array_equal(same[1], lse_kernel)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_kernels_at_their_own_block_sizes(causal, dtype):
    """Above SDPA_KERNEL_MIN, with the shipped block sizes: two query blocks and a partial one."""
    rng = np.random.default_rng(7)
    q, k = rng.normal(size=(2, 300, 8)).astype(dtype), rng.normal(size=(2, 260, 8)).astype(dtype)
    v, do = rng.normal(size=(2, 260, 5)).astype(dtype), rng.normal(size=(2, 300, 5)).astype(dtype)
    mask = rng.random((1, 300, 260)) < 0.7
    assert q.shape[0] * q.shape[1] * k.shape[1] >= attention.SDPA_KERNEL_MIN
    o, lse = attention.sdpa(q, k, v, mask, 0.4, causal)
    o_ref, lse_ref = reference.sdpa(q, k, v, mask, 0.4, causal)
    np.testing.assert_allclose(o, o_ref, **TOL[dtype])
    for got, want in zip(attention.sdpa_back(q, k, v, o, lse, do, mask, 0.4, causal),
                         reference.sdpa_back(q, k, v, o_ref, lse_ref, do, mask, 0.4, causal), strict=True):
        np.testing.assert_allclose(got, want, **TOL[dtype])


def _sdpa_case(dtype, causal, n=3):
    rng = np.random.default_rng(11)
    q, k = rng.normal(size=(n, 90, 8)).astype(dtype), rng.normal(size=(n, 80, 8)).astype(dtype)
    v, do = rng.normal(size=(n, 80, 5)).astype(dtype), rng.normal(size=(n, 90, 5)).astype(dtype)
    mask = rng.random((n, 90, 80)) < 0.7
    mask[1, 4] = False                                    # a row with nothing to attend to
    return q, k, v, do, mask


@pytest.fixture
def kernels_at_any_size(monkeypatch):
    """The kernels (not the reference) for the small inputs of these tests."""
    monkeypatch.setattr(attention, "SDPA_KERNEL_MIN", 0)
    monkeypatch.setattr(attention, "SDPA_HEAD_MIN", 0)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_split_between_threads_equals_one_thread(kernels_at_any_size, monkeypatch, causal):
    """The heads are shared between threads (3 heads: an uneven split); each head's work is
    the same whichever thread runs it, so the results agree exactly with one thread."""
    import numba

    q, k, v, do, mask = _sdpa_case(np.float64, causal)
    results = []
    for count in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
        monkeypatch.setattr(threads, "_requested", [count])       # as ta.set_num_threads(count)
        o, lse = attention.sdpa(q, k, v, mask, 0.5, causal)
        results.append((o, lse, *attention.sdpa_back(q, k, v, o, lse, do, mask, 0.5, causal)))
    for one, split in zip(*results, strict=True):
        np.testing.assert_array_equal(one, split)
    o_ref, lse_ref = reference.sdpa(q, k, v, mask, 0.5, causal)
    np.testing.assert_allclose(results[0][0], o_ref, **TOL[np.float64])
    assert np.all(results[0][0][1, 4] == 0) and results[0][1][1, 4] == -np.inf


def test_sdpa_worker_error_reaches_the_caller(kernels_at_any_size, monkeypatch):
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one CPU: the heads are not split between threads")
    real = attention._sdpa_heads

    def failing(*args):
        if 0 not in args[-1]:
            raise FloatingPointError("worker")
        real(*args)

    monkeypatch.setattr(attention, "_sdpa_heads", failing)
    monkeypatch.setattr(threads, "_requested", [2])
    q, k, v, _, mask = _sdpa_case(np.float32, False)
    with pytest.raises(FloatingPointError, match="worker"):
        attention.sdpa(q, k, v, mask, 0.5, False)


def test_parallel_thresholds_grow_with_the_measured_launch_cost(monkeypatch):
    cost = numba_support.launch_us()
    assert 0 < cost < 1e5 and numba_support.launch_us() == cost          # measured once
    import numba

    pool = numba_support.WORKQUEUE_FACTOR if numba.threading_layer() == "workqueue" else 1
    for cost, want in ((50.0, 61440), (10.0, 12288)):
        monkeypatch.setattr(numba_support, "_LAUNCH_US", [cost])
        monkeypatch.setattr(numba_support, "_PARALLEL_MIN", {})
        assert numba_support.parallel_min(12288) == want * pool


def _heads_first(x):
    """(B, T, H, D) -> (B H, T, D), as the op's default layout holds heads."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(-1, x.shape[1], x.shape[3])


def _heads_in_place_case(seed, B, H, t_q, t_k, dtype):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(B, t_q, H, 8)).astype(dtype), rng.normal(size=(B, t_k, H, 8)).astype(dtype)
    v, do = rng.normal(size=(B, t_k, H, 5)).astype(dtype), rng.normal(size=(B, t_q, H, 5)).astype(dtype)
    mask = rng.random((B * H, t_q, t_k)) < 0.7
    mask[1, 3] = False                                    # a row with nothing to attend to
    return q, k, v, do, mask


@pytest.mark.parametrize("sizes", [(2, 3, 20, 20), (2, 3, 90, 80), (1, 2, 300, 1030)],
                         ids=["small-heads", "blocked", "two-key-blocks"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("split", [1, 2], ids=["one-thread", "split"])
def test_sdpa_reads_heads_in_place_as_the_transposed_copies(monkeypatch, sizes, causal, split):
    """q, k, v (B, T, H, D), as a projection's output reshapes to them: every kernel path
    (one sweep per small head, the blocked forward and backward with one key block and with
    the online softmax across two; one thread or heads split) gives, in that layout, what it
    gives for the (B H, T, D) copies, and so does the reference."""
    monkeypatch.setattr(threads, "_requested", [split])
    monkeypatch.setattr(attention, "SDPA_SMALL_SPLIT_MIN", 0 if split > 1 else 2**62)
    q, k, v, do, mask = _heads_in_place_case(5, *sizes, np.float64)
    first = [_heads_first(x) for x in (q, k, v, do)]
    o3, lse3, w3 = attention.sdpa(*first[:3], mask, 0.6, causal, True)
    o, lse, w = attention.sdpa(q, k, v, mask, 0.6, causal, True)
    assert o.shape == q.shape[:3] + (5,) and o.flags.c_contiguous
    np.testing.assert_allclose(_heads_first(o), o3, **TOL[np.float64])
    np.testing.assert_allclose(lse, lse3, **TOL[np.float64])
    np.testing.assert_allclose(w, w3, **TOL[np.float64])
    np.testing.assert_allclose(attention.sdpa_weights(q, k, lse, mask, 0.6, causal), w3, **TOL[np.float64])
    o_ref, lse_ref = reference.sdpa(q, k, v, mask, 0.6, causal)
    np.testing.assert_allclose(o, o_ref, **TOL[np.float64])
    grads3 = attention.sdpa_back(*first[:3], o3, lse3, first[3], mask, 0.6, causal)
    grads = attention.sdpa_back(q, k, v, o, lse, do, mask, 0.6, causal)
    grads_ref = reference.sdpa_back(q, k, v, o_ref, lse_ref, do, mask, 0.6, causal)
    for got, want3, want, x in zip(grads, grads3, grads_ref, (q, k, v), strict=True):
        assert got.shape == x.shape
        np.testing.assert_allclose(_heads_first(got), want3, **TOL[np.float64])
        np.testing.assert_allclose(got, want, **TOL[np.float64])
    assert np.all(o.transpose(0, 2, 1, 3).reshape(-1, sizes[2], 5)[1, 3] == 0)


def test_sdpa_heads_in_place_float32_at_the_mha_bench_shape():
    """The shape the speed target names, (B, T, H, D) = (8, 256, 8, 32) in float32: the
    heads read in place agree with their copies to float32 rounding."""
    q, k, v, do, _ = _heads_in_place_case(6, 8, 8, 256, 256, np.float32)
    first = [_heads_first(x) for x in (q, k, v, do)]
    o, lse = attention.sdpa(q, k, v, None, 0.2, False)
    o3, lse3 = attention.sdpa(*first[:3], None, 0.2, False)
    np.testing.assert_allclose(_heads_first(o), o3, **TOL[np.float32])
    for got, want in zip(attention.sdpa_back(q, k, v, o, lse, do, None, 0.2, False),
                         attention.sdpa_back(*first[:3], o3, lse3, first[3], None, 0.2, False), strict=True):
        np.testing.assert_allclose(_heads_first(got), want, **TOL[np.float32])


def _batched_case(rng, B, H, t_q, t_k, d, mask_kind, dtype):
    q, k = rng.normal(size=(B, t_q, H, d)).astype(dtype), rng.normal(size=(B, t_k, H, d)).astype(dtype)
    v = rng.normal(size=(B, t_k, H, d + 1)).astype(dtype)
    do = rng.normal(size=(B, t_q, H, d + 1)).astype(dtype)
    mask = {"none": None, "shared": rng.random((1, t_q, t_k)) < 0.6,
            "per-entry": rng.random((B * H, t_q, t_k)) < 0.6,
            # padded keys, as a batch of sentences of different lengths gives them
            "lengths": np.arange(t_k) < rng.integers(1, t_k + 1, size=(B * H, 1, 1))}[mask_kind]
    if mask is not None:
        mask = np.broadcast_to(mask, (mask.shape[0], t_q, t_k)).copy()
        mask[0, t_q // 2] = False                         # a row with nothing to attend to
    return q, k, v, do, mask


EXACT = {np.float32: {"rtol": 1e-5, "atol": 1e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-12}}


@settings(deadline=None, max_examples=60)
@given(B=st.integers(1, 3), H=st.integers(1, 3), t_q=st.integers(5, 12), t_k=st.integers(1, 12),
       d=st.integers(1, 6), mask_kind=st.sampled_from(["none", "shared", "per-entry", "lengths"]),
       causal=st.booleans(), split=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**32 - 1))
def test_sdpa_batched_small_heads_equal_the_reference(B, H, t_q, t_k, d, mask_kind, causal, split, dtype,
                                                      seed):
    """Small heads with more than SDPA_SMALL_QUERIES queries (a Transformer's self- and
    cross-attention over sentences) go through numpy's stacked matmul over the heads read in
    place and Numba's softmax passes: o, lse, the weights and all three gradients equal the
    reference's, rows that see nothing give 0 and lse -inf, one thread or the batch entries
    split between two."""
    rng = np.random.default_rng(seed)
    q, k, v, do, mask = _batched_case(rng, B, H, t_q, t_k, d, mask_kind, dtype)
    assert attention._small_heads(B * H, t_q, t_k) and t_q > attention.SDPA_SMALL_QUERIES
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "SDPA_SMALL_SPLIT_MIN", 0 if split else 2**62)
        patch.setattr(threads, "_requested", [2 if split else 1])
        o, lse = attention.sdpa(q, k, v, mask, 0.7, causal)
        *same, weights = attention.sdpa(q, k, v, mask, 0.7, causal, True)
        grads = attention.sdpa_back(q, k, v, o, lse, do, mask, 0.7, causal)
    o_ref, lse_ref, weights_ref = reference.sdpa(q, k, v, mask, 0.7, causal, True)
    np.testing.assert_array_equal(same[0], o)
    np.testing.assert_array_equal(same[1], lse)
    np.testing.assert_allclose(o, o_ref, **EXACT[dtype])
    np.testing.assert_allclose(weights, weights_ref, **EXACT[dtype])
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(lse_ref))
    np.testing.assert_allclose(lse[np.isfinite(lse)], lse_ref[np.isfinite(lse_ref)], **EXACT[dtype])
    for got, want, x in zip(grads, reference.sdpa_back(q, k, v, o_ref, lse_ref, do, mask, 0.7, causal),
                            (q, k, v), strict=True):
        assert got.dtype == dtype and got.shape == x.shape
        np.testing.assert_allclose(got, want, **EXACT[dtype])
    if mask is not None:
        assert np.all(o.transpose(0, 2, 1, 3)[0, 0, t_q // 2] == 0) and lse[0, t_q // 2] == -np.inf


@pytest.mark.parametrize("mask_kind", ["none", "lengths"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t_k", [20, 23], ids=["self", "cross"])
def test_sdpa_float32_at_the_transformer_step_shape(mask_kind, causal, t_k):
    """(B, T, H, D) = (32, 20, 4, 32) in float32, the Transformer training step's attention:
    within float32 rounding of the reference run in float64."""
    q, k, v, do, mask = _batched_case(np.random.default_rng(3), 32, 4, 20, t_k, 32, mask_kind, np.float32)
    v, do = v[..., :32].copy(), do[..., :32].copy()
    o, lse = attention.sdpa(q, k, v, mask, 32 ** -0.5, causal)
    wide = [x.astype(np.float64) for x in (q, k, v, do)]
    o_ref, lse_ref = reference.sdpa(*wide[:3], mask, 32 ** -0.5, causal)
    np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=2e-6)
    for got, want in zip(attention.sdpa_back(q, k, v, o, lse, do, mask, 32 ** -0.5, causal),
                         reference.sdpa_back(*wide[:3], o_ref, lse_ref, wide[3], mask, 32 ** -0.5, causal),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


def test_sdpa_few_queries_keep_the_one_sweep_kernels(monkeypatch):
    """A decoding step (one query a head) never reaches the batched products, whose fixed cost
    there would exceed the sweep's whole work."""
    def refuse(*args):
        raise AssertionError("batched path")

    monkeypatch.setattr(attention, "sdpa_batched", refuse)
    monkeypatch.setattr(attention, "sdpa_back_batched", refuse)
    q, k, v, do, mask = _batched_case(np.random.default_rng(4), 8, 4, 1, 30, 32, "lengths", np.float64)
    for t_q in range(1, attention.SDPA_SMALL_QUERIES + 1):
        qs, dos = np.repeat(q, t_q, axis=1), np.repeat(do, t_q, axis=1)
        masks = np.repeat(mask, t_q, axis=1)
        o, lse = attention.sdpa(qs, k, v, masks, 0.3, False)
        np.testing.assert_allclose(o, reference.sdpa(qs, k, v, masks, 0.3, False)[0], **EXACT[np.float64])
        attention.sdpa_back(qs, k, v, o, lse, dos, masks, 0.3, False)
