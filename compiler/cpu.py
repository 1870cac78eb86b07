"""Numba kernels for the "cpu" device: row-wise softmax work fused into one pass each.

These override the numpy reference kernels of the same names (``KERNELS`` below); every
other kernel of the device stays the reference one.  Matrix products stay on numpy's BLAS:
a hand-written Numba GEMM reaches ~60 GFLOP/s here against BLAS's ~190, so the fused
attention kernels call BLAS for their products and Numba for everything between them.

Why these and not the elementwise maps: numpy already runs a single map at SIMD speed,
while softmax-shaped work (max, exp, sum, divide; its backward; cross-entropy) costs numpy
four to seven passes over memory and a temporary per pass.  A Numba row kernel does it in
two passes without temporaries, rows in parallel.

exp dominates all of these, and this llvmlite has no SVML, so ``math.exp`` is a scalar
libm call (~2.4 ns).  ``_exp32`` is exp for float32 by range reduction and a degree-6
polynomial (relative error under 4e-7, ~0.2 ns, vectorised); float64 keeps ``math.exp``, so
float64 results stay exact to rounding for the checks.

Every kernel is compiled on first use and cached on disk (``cache=True``); signatures are
kept few by passing C-contiguous 2-D/3-D arrays only.
"""

from __future__ import annotations

import math
import os

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

# Numba's default "omp" layer keeps its threads spinning after each parallel kernel, and they
# compete for the two cores with the BLAS threads of the matrix product that comes next: a
# 128x128 attention went from 0.1 to 8 ms.  "workqueue" threads sleep instead.  (It does not
# allow kernels launched from several Python threads at once.)  Your own setting wins.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"

from . import numpy_backend as reference

__all__ = ["KERNELS"]

# fastmath without 'nnan'/'ninf': masked scores are -inf and the kernels test for it.
# 'reassoc' lets LLVM vectorise the row sums; 'afn' the polynomial.
FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}


@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits`` (a register move)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(cache=True, fastmath=FAST)
def _exp32(x):
    """exp(x) in float32: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial to
    degree 6 (error r^7/7! < 2e-7), times 2^n built from its bits.

    Written without branches or table loads so that LLVM turns a loop of it into AVX-512
    code (0.2 ns an element against 1.0 for the table version and 0.5 for numpy's exp):
    x is clamped to float32's normal range, and the out-of-range cases are selects at the
    end.  Below -87 it returns 0, so masked (-inf) scores come out exactly 0."""
    xc = min(max(x, np.float32(-87.0)), np.float32(88.0))
    # np.floor keeps float32 (math.floor would give an int64 and drag the math to float64).
    n = np.floor(xc * np.float32(1.4426950408889634) + np.float32(0.5))
    # ln2 split in two (Cody-Waite) so that n*ln2 is subtracted without rounding error.
    r = xc - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    y = p * _float32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))   # p * 2^n
    y = np.float32(0.0) if x < np.float32(-87.0) else y
    y = np.float32(np.inf) if x > np.float32(88.72) else y
    return x if x != x else y   # NaN stays NaN


def _exp(x):  # pragma: no cover - replaced inside Numba by the overload below
    return math.exp(x)


@overload(_exp)
def _exp_overload(x):
    # Chosen once per compiled signature: the fast polynomial for float32 only.
    if isinstance(x, types.Float) and x.bitwidth == 32:
        return _exp32_impl
    return _exp64_impl


def _exp32_impl(x):
    return _exp32(x)


def _exp64_impl(x):
    return math.exp(x)


def _like(x, value):  # pragma: no cover - replaced inside Numba by the overload below
    return value


@overload(_like)
def _like_overload(x, value):
    # A constant in x's float type: a float64 literal in float32 arithmetic would promote
    # the whole row to float64 (and to the slow exp).
    if isinstance(x, types.Float) and x.bitwidth == 32:
        return _as_float32
    return _as_float64


def _as_float32(x, value):
    return np.float32(value)


def _as_float64(x, value):
    return np.float64(value)


# ---------------------------------------------------------------- softmax rows


@njit(cache=True, fastmath=FAST, parallel=True)
def _softmax_rows(x, mask, has_mask, out):
    """Row softmax of x (R, N) into out, over the entries where mask (R, N) is True when
    has_mask (else every entry; mask is then a dummy)."""
    for r in prange(x.shape[0]):
        row, y = x[r], out[r]
        keep = mask[np.int64(r) if has_mask else np.int64(0)]   # a prange index is unsigned
        m = _like(row[0], -np.inf)
        for j in range(row.shape[0]):
            if keep[j] or not has_mask:
                m = max(m, row[j])
        if not math.isfinite(m):
            m = _like(row[0], 0.0)                   # nothing finite: exp gives zeros below
        total = 0.0
        if has_mask:
            for j in range(row.shape[0]):
                e = _exp(row[j] - m) if keep[j] else _like(row[0], 0.0)
                y[j] = e
                total += e
        else:
            for j in range(row.shape[0]):
                e = _exp(row[j] - m)
                y[j] = e
                total += e
        scale = _like(row[0], 1.0 / total if total > 0 else 0.0)
        for j in range(row.shape[0]):
            y[j] *= scale


_NO_MASK_ROWS = np.ones((1, 1), dtype=np.bool_)


def _plain_softmax_rows(x, out):
    _softmax_rows(x, _NO_MASK_ROWS, False, out)


@njit(cache=True, fastmath=FAST, parallel=True)
def _softmax_back_rows(y, dy, dx):
    for r in prange(y.shape[0]):
        yr, dyr, dxr = y[r], dy[r], dx[r]
        s = 0.0
        for j in range(yr.shape[0]):
            s += yr[j] * dyr[j]
        s = _like(yr[0], s)
        for j in range(yr.shape[0]):
            dxr[j] = yr[j] * (dyr[j] - s)


@njit(cache=True, fastmath=FAST, parallel=True)
def _log_softmax_rows(x, out):
    for r in prange(x.shape[0]):
        row, y = x[r], out[r]
        m = _like(row[0], -np.inf)
        for j in range(row.shape[0]):
            m = max(m, row[j])
        if not math.isfinite(m):
            m = _like(row[0], 0.0)
        total = 0.0
        for j in range(row.shape[0]):
            total += _exp(row[j] - m)
        # An all -inf row has m = 0 and total = 0: y = x - 0 = -inf, the log of softmax's zeros.
        lse = m + math.log(total) if total > 0 else m
        for j in range(row.shape[0]):
            y[j] = row[j] - lse


@njit(cache=True, fastmath=FAST, parallel=True)
def _log_softmax_back_rows(y, dy, dx):
    for r in prange(y.shape[0]):
        yr, dyr, dxr = y[r], dy[r], dx[r]
        s = 0.0
        for j in range(yr.shape[0]):
            s += dyr[j]
        s = _like(yr[0], s)
        for j in range(yr.shape[0]):
            dxr[j] = dyr[j] - _exp(yr[j]) * s


def _rows(x):
    """x as C-contiguous (rows, last axis)."""
    return np.ascontiguousarray(x).reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def _row_kernel(kernel, reference_fn):
    """A kernel over the last axis; other axes (rare: attention and losses use the last)
    and empty arrays go to the numpy reference."""

    def run(x, axis):
        if x.size == 0 or axis not in (-1, x.ndim - 1):
            return reference_fn(x, axis)
        out = np.empty(x.shape, dtype=x.dtype)
        kernel(_rows(x), out.reshape(-1, x.shape[-1]))
        return out

    return run


def _row_back_kernel(kernel, reference_fn):
    def run(y, dy, axis):
        if y.size == 0 or axis not in (-1, y.ndim - 1):
            return reference_fn(y, dy, axis)
        dx = np.empty(y.shape, dtype=y.dtype)
        kernel(_rows(y), _rows(dy), dx.reshape(-1, y.shape[-1]))
        return dx

    return run


def masked_softmax(x, mask):
    if x.size == 0:
        return reference.masked_softmax(x, mask)
    out = np.empty(x.shape, dtype=x.dtype)
    _softmax_rows(_rows(x), _rows(np.broadcast_to(mask, x.shape)), True, out.reshape(-1, x.shape[-1]))
    return out


# ---------------------------------------------------------------- cross-entropy


@njit(cache=True, fastmath=FAST, parallel=True)
def _cross_entropy_rows(logits, target, ignore_index, loss, lse):
    for r in prange(logits.shape[0]):
        row = logits[r]
        m = _like(row[0], -np.inf)
        for j in range(row.shape[0]):
            m = max(m, row[j])
        total = 0.0
        for j in range(row.shape[0]):
            total += _exp(row[j] - m)
        lse[r] = m + math.log(total)
        loss[r] = lse[r] - row[target[r]] if target[r] != ignore_index else 0.0


@njit(cache=True, fastmath=FAST, parallel=True)
def _cross_entropy_back_rows(logits, lse, target, ignore_index, dloss, dx):
    for r in prange(logits.shape[0]):
        row, out = logits[r], dx[r]
        if target[r] == ignore_index:
            for j in range(row.shape[0]):
                out[j] = 0.0
            continue
        g = dloss[r]
        for j in range(row.shape[0]):
            out[j] = _exp(row[j] - lse[r]) * g
        out[target[r]] -= g


def cross_entropy(logits, target, ignore_index):
    n = logits.shape[0]
    loss = np.empty(n, dtype=logits.dtype)
    lse = np.empty(n, dtype=logits.dtype)
    _cross_entropy_rows(np.ascontiguousarray(logits), np.ascontiguousarray(target, dtype=np.int64),
                        np.int64(ignore_index), loss, lse)
    return loss, lse


def cross_entropy_back(logits, lse, target, ignore_index, dloss):
    dx = np.empty(logits.shape, dtype=logits.dtype)
    _cross_entropy_back_rows(np.ascontiguousarray(logits), lse, np.ascontiguousarray(target, dtype=np.int64),
                             np.int64(ignore_index), np.ascontiguousarray(dloss, dtype=logits.dtype), dx)
    return dx


# ---------------------------------------------------------------- embedding


@njit(cache=True)
def _scatter_rows(ids, dy, padding_idx, dw):
    # Serial on purpose: two ids may hit the same row, and a parallel add would race.
    for i in range(ids.shape[0]):
        row = ids[i]
        if row != padding_idx:
            for j in range(dy.shape[1]):
                dw[row, j] += dy[i, j]


def embedding_back(num_rows, ids, dy, padding_idx):
    """Scatter-add rows of dy into a (num_rows, E) gradient (np.add.at is ~20x slower)."""
    dim = dy.shape[-1]
    dw = np.zeros((num_rows, dim), dtype=dy.dtype)
    _scatter_rows(np.ascontiguousarray(ids, dtype=np.int64).reshape(-1), _rows(dy).reshape(-1, dim),
                  np.int64(-1 if padding_idx is None else padding_idx), dw)
    return dw


# ---------------------------------------------------------------- scaled dot-product attention


SDPA_KEY_BLOCK = 1024  # keys per block: bounds the scores held at once to (N, 128, 1024)


@njit(cache=True, fastmath=FAST, parallel=True)
def _sdpa_online(s, mask, has_mask, causal, q_start, k_start, m, total, alpha):
    """One key block of the online softmax, in place.

    s (N, b, K): the scores of queries q_start.. against keys k_start.. -> exp(s - m_new)
    (0 where not allowed).  m, total (N, b): each row's running max and sum of exp(s - m),
    updated; alpha (N, b) gets exp(m_old - m_new), the factor that rescales what the
    earlier key blocks accumulated.  A row with nothing allowed so far keeps m = -inf."""
    n_batch, b, t_k = s.shape
    for nb in prange(n_batch * b):
        n, i = nb // b, nb % b
        row = s[n, i]
        keep = mask[n if mask.shape[0] > 1 else 0, i]
        # causal: key k_start + j may be seen by query q_start + i when j <= q_start + i - k_start
        stop = min(max(q_start + i + 1 - k_start, 0), t_k) if causal else t_k
        m_old = m[n, i]
        m_new = m_old
        for j in range(stop):
            if keep[j] or not has_mask:
                m_new = max(m_new, row[j])
        if not math.isfinite(m_new):            # nothing to attend to yet
            for j in range(t_k):
                row[j] = 0.0
            alpha[n, i] = 1.0
            continue
        for j in range(stop, t_k):
            row[j] = 0.0
        block_total = _like(row[0], 0.0)
        if has_mask:
            for j in range(stop):
                e = _exp(row[j] - m_new) if keep[j] else _like(row[0], 0.0)
                row[j] = e
                block_total += e
        else:
            for j in range(stop):
                e = _exp(row[j] - m_new)
                row[j] = e
                block_total += e
        a = _exp(m_old - m_new)                 # 0 on the first block with m_old = -inf
        alpha[n, i] = a
        total[n, i] = total[n, i] * a + block_total
        m[n, i] = m_new


@njit(cache=True, fastmath=FAST, parallel=True)
def _sdpa_finish(acc, m, total, lse):
    """In place: acc (N, b, D_v) /= total; lse = m + log(total), -inf (and acc 0) for rows
    that had nothing to attend to."""
    n_batch, b, _ = acc.shape
    for nb in prange(n_batch * b):
        n, i = nb // b, nb % b
        row = acc[n, i]
        if total[n, i] > 0:
            inv = _like(row[0], 1.0) / total[n, i]
            for j in range(row.shape[0]):
                row[j] *= inv
            lse[n, i] = m[n, i] + math.log(total[n, i])
        else:
            for j in range(row.shape[0]):
                row[j] = 0.0
            lse[n, i] = -np.inf


@njit(cache=True, fastmath=FAST, parallel=True)
def _sdpa_rescale(acc, alpha):
    n_batch, b, d_v = acc.shape
    for nb in prange(n_batch * b):
        n, i = nb // b, nb % b
        a = alpha[n, i]
        for j in range(d_v):
            acc[n, i, j] *= a


@njit(cache=True, fastmath=FAST, parallel=True)
def _sdpa_weights_from_lse(s, mask, has_mask, causal, q_start, k_start, lse):
    """In place: scores (N, b, K) -> the weights exp(s - lse) of one (query, key) block."""
    n_batch, b, t_k = s.shape
    for nb in prange(n_batch * b):
        n, i = nb // b, nb % b
        row = s[n, i]
        keep = mask[n if mask.shape[0] > 1 else 0, i]
        stop = min(max(q_start + i + 1 - k_start, 0), t_k) if causal else t_k
        lse_i = lse[n, i]
        if not math.isfinite(lse_i):
            stop = 0
        for j in range(stop, t_k):
            row[j] = 0.0
        if has_mask:
            for j in range(stop):
                row[j] = _exp(row[j] - lse_i) if keep[j] else _like(row[0], 0.0)
        else:
            for j in range(stop):
                row[j] = _exp(row[j] - lse_i)


@njit(cache=True, fastmath=FAST, parallel=True)
def _sdpa_dscores(p, dp, delta):
    """In place: dp (N, b, K) -> ds = p * (dp - delta), the softmax backward."""
    n_batch, b, t_k = p.shape
    for nb in prange(n_batch * b):
        n, i = nb // b, nb % b
        d = delta[n, i]
        pr, dr = p[n, i], dp[n, i]
        for j in range(t_k):
            dr[j] = pr[j] * (dr[j] - d)


_NO_MASK = np.ones((1, 1, 1), dtype=np.bool_)


def _blocks(t, size):
    return [(start, min(start + size, t)) for start in range(0, t, size)]


def _mask_block(mask, q_block, k_block):
    if mask is None:
        return _NO_MASK, False
    return np.ascontiguousarray(mask[:, q_block[0]:q_block[1], k_block[0]:k_block[1]]), True


def _visible(causal, q_block, k_block):
    """Whether any query of the block may see any key of the block (causal skips the rest)."""
    return not causal or k_block[0] <= q_block[1] - 1


def sdpa(q, k, v, mask, scale, causal):
    """Flash-attention style: query blocks of SDPA_BLOCK rows, key blocks of SDPA_KEY_BLOCK,
    an online softmax across key blocks (running max and sum, earlier output rescaled), and
    only the log-sum-exp kept for backward.  BLAS computes each block's two products; Numba
    the softmax between them, in place."""
    n, t_q, _ = q.shape
    t_k, d_v = k.shape[1], v.shape[2]
    o = np.empty((n, t_q, d_v), dtype=q.dtype)
    lse = np.empty((n, t_q), dtype=q.dtype)
    for q_block in _blocks(t_q, reference.SDPA_BLOCK):
        b = q_block[1] - q_block[0]
        qb = q[:, q_block[0]:q_block[1]] * q.dtype.type(scale)                  # (N, b, D)
        m = np.full((n, b), -np.inf, dtype=q.dtype)
        total = np.zeros((n, b), dtype=q.dtype)
        alpha = np.empty((n, b), dtype=q.dtype)
        acc = np.zeros((n, b, d_v), dtype=q.dtype)
        for k_block in _blocks(t_k, SDPA_KEY_BLOCK):
            if not _visible(causal, q_block, k_block):
                break
            s = reference.matmul_nt(qb, k[:, k_block[0]:k_block[1]])            # (N, b, K)
            keep, has_mask = _mask_block(mask, q_block, k_block)
            _sdpa_online(s, keep, has_mask, causal, q_block[0], k_block[0], m, total, alpha)
            if k_block[0] > 0:
                _sdpa_rescale(acc, alpha)
            acc += np.matmul(s, v[:, k_block[0]:k_block[1]])                    # (N, b, D_v)
        _sdpa_finish(acc, m, total, lse_b := np.empty((n, b), dtype=q.dtype))
        o[:, q_block[0]:q_block[1]] = acc
        lse[:, q_block[0]:q_block[1]] = lse_b
    return o, lse


def sdpa_back(q, k, v, o, lse, do, mask, scale, causal):
    """Gradients block by block, each (query, key) block's weights rebuilt from lse."""
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    delta = np.sum(do * o, axis=-1)                                             # (N, T_q)
    for q_block in _blocks(q.shape[1], reference.SDPA_BLOCK):
        rows = slice(*q_block)
        qb = q[:, rows] * q.dtype.type(scale)                                   # (N, b, D)
        dob = do[:, rows]                                                       # (N, b, D_v)
        lse_b = np.ascontiguousarray(lse[:, rows])
        delta_b = np.ascontiguousarray(delta[:, rows])
        for k_block in _blocks(k.shape[1], SDPA_KEY_BLOCK):
            if not _visible(causal, q_block, k_block):
                break
            cols = slice(*k_block)
            p = reference.matmul_nt(qb, k[:, cols])                             # (N, b, K)
            keep, has_mask = _mask_block(mask, q_block, k_block)
            _sdpa_weights_from_lse(p, keep, has_mask, causal, q_block[0], k_block[0], lse_b)
            dv[:, cols] += reference.matmul_tn(p, dob)                          # (N, K, D_v)
            ds = reference.matmul_nt(dob, v[:, cols])                           # dp (N, b, K)
            _sdpa_dscores(p, ds, delta_b)
            dq[:, rows] += np.matmul(ds, k[:, cols])                            # (N, b, D)
            dk[:, cols] += reference.matmul_tn(ds, qb)                          # (N, K, D)
    dq *= q.dtype.type(scale)
    return dq, dk, dv


KERNELS = {
    "softmax": _row_kernel(_plain_softmax_rows, reference.softmax),
    "softmax_back": _row_back_kernel(_softmax_back_rows, reference.softmax_back),
    "log_softmax": _row_kernel(_log_softmax_rows, reference.log_softmax),
    "log_softmax_back": _row_back_kernel(_log_softmax_back_rows, reference.log_softmax_back),
    "masked_softmax": masked_softmax,
    "cross_entropy": cross_entropy,
    "cross_entropy_back": cross_entropy_back,
    "embedding_back": embedding_back,
    "sdpa": sdpa,
    "sdpa_back": sdpa_back,
}
