"""The CPU attention kernels a cached decoding step calls (compiler/cpu/attention_small.py):
``sdpa_small_serial`` (few queries a head: the cross-attention, one query over a padded
source) and ``sdpa_prefix_serial`` (the self-attention over a cache's filled keys).

Both run one routine, ``_attend_rows``; held here against the numpy reference device at
decoding's own shapes and at awkward ones (key counts not a multiple of the four keys a step
the routine takes, head sizes not a multiple of the vector width, float64), with keys hidden
at the end and in the middle of a row, and against each other bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from tinygrad_attn.compiler import get_backend, reference
from tinygrad_attn.compiler.cpu import attention

TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-12, atol=1e-13)}


def _qkv(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    return tuple((rng.normal(size=shape) * 1.5).astype(dtype) for shape in shapes)


def _padding_mask(n: int, t_q: int, t_k: int, seed: int) -> np.ndarray:
    """(n, t_q, t_k): each head sees a prefix of its own length (a padded source), a few
    also lose keys in the middle, and one head sees nothing."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t_k + 1, size=n)
    mask = np.arange(t_k)[None, None, :] < lengths[:, None, None]
    mask = np.broadcast_to(mask, (n, t_q, t_k)).copy()
    holes = rng.random((n, t_q, t_k)) < 0.15
    mask[: n // 2] &= ~holes[: n // 2]
    mask[-1] = False
    return mask


def _check_sdpa(q, k, v, mask, causal, dtype):
    o, lse, weights = attention.sdpa(q, k, v, mask, 0.3, causal, True)
    o_ref, lse_ref, weights_ref = reference.sdpa(q, k, v, mask, 0.3, causal, True)
    assert o.dtype == lse.dtype == weights.dtype == dtype
    np.testing.assert_allclose(o, o_ref, **TOL[dtype])
    np.testing.assert_allclose(weights, weights_ref, **TOL[dtype])
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(lse_ref))
    np.testing.assert_allclose(lse[np.isfinite(lse)], lse_ref[np.isfinite(lse_ref)], **TOL[dtype])
    np.testing.assert_array_equal(attention.sdpa(q, k, v, mask, 0.3, causal)[0], o)   # without weights
    return o, lse


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_attention_at_decoding_shape_equals_the_reference(dtype):
    # 64 sentences x 4 heads, one query each, over a padded source of 20 keys, D = 32.
    n, t_k, d = 256, 20, 32
    q, k, v = _qkv([(n, 1, d), (n, t_k, d), (n, t_k, d)], dtype, 1)
    mask = _padding_mask(n, 1, t_k, 2)
    o, lse = _check_sdpa(q, k, v, mask, False, dtype)
    assert np.all(o[-1] == 0) and np.all(lse[-1] == -np.inf)            # the head that saw nothing


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("t_q, t_k, heads, d, d_v", [(1, 1, 1, 1, 1), (1, 7, 3, 5, 2), (2, 13, 2, 17, 40),
                                                    (4, 9, 4, 32, 32), (3, 33, 1, 48, 7)])
def test_few_queries_heads_in_place_equal_the_reference(t_q, t_k, heads, d, d_v, dtype):
    # (B, T, H, D) read in place: key j of head (b, h) is H rows further on, not the next row.
    b = 3
    q, k, v = _qkv([(b, t_q, heads, d), (b, t_k, heads, d), (b, t_k, heads, d_v)], dtype, t_k * d)
    for mask in (None, _padding_mask(b * heads, t_q, t_k, 5)):
        for causal in (False, True):
            _check_sdpa(q, k, v, mask, causal, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 6, 32, 40])
def test_prefix_equals_the_masked_kernel_bit_for_bit_at_every_count(d, dtype):
    """A decoding step's prefix attention and the masked kernel with the keys after the
    position hidden make the same sums in the same order, at every count (the four keys a
    step leave 0 to 3 over), and garbage past the count is never read by either."""
    cpu, numpy_device = get_backend("cpu"), get_backend("numpy")
    length = 11
    q, k, v = _qkv([(6, 2, d), (6, length, d), (6, length, d + 3)], dtype, d)
    for position in range(length):
        mask = np.broadcast_to(np.arange(length) <= position, (1, 2, length)).copy()   # (1, T_q, T_k)
        masked = cpu.sdpa(q, k, v, mask, 0.4, False)[0]
        np.testing.assert_allclose(masked, numpy_device.sdpa(q, k, v, mask, 0.4, False)[0], **TOL[dtype])
        k_junk, v_junk = k.copy(), v.copy()
        k_junk[:, position + 1:], v_junk[:, position + 1:] = np.nan, np.inf
        np.testing.assert_array_equal(cpu.sdpa_prefix(q, k_junk, v_junk, np.array(position), 0.4), masked)
        np.testing.assert_array_equal(cpu.sdpa(q, k_junk, v_junk, mask, 0.4, False)[0], masked)


def test_prefix_at_decoding_shape_equals_the_reference():
    # 256 heads, one query, a cache of 30 slots filled up to the position.
    cpu, numpy_device = get_backend("cpu"), get_backend("numpy")
    q, k, v = _qkv([(256, 1, 32), (256, 30, 32), (256, 30, 32)], np.float32, 9)
    for position in (0, 3, 4, 17, 29):
        want = numpy_device.sdpa(q, k, v, (np.arange(30) <= position)[None, None, :], 0.18, False)[0]
        got = cpu.sdpa_prefix(q, k, v, np.array(position), 0.18)
        np.testing.assert_allclose(got, want, **TOL[np.float32])


def test_large_scores_do_not_overflow():
    # Scores far beyond exp's range: the softmax works from the row's max.
    q, k, v = _qkv([(4, 1, 8), (4, 10, 8), (4, 10, 8)], np.float32, 3)
    q *= 300.0
    _check_sdpa(q, k, v, None, False, np.float32)
