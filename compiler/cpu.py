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
polynomial (relative error 2e-7, ~0.6 ns, vectorisable); float64 keeps ``math.exp``, so
float64 results stay exact to rounding for the checks.

Every kernel is compiled on first use and cached on disk (``cache=True``); signatures are
kept few by passing C-contiguous 2-D/3-D arrays only.
"""

from __future__ import annotations

import math
import os

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

# Numba's default "omp" layer keeps its threads spinning after each parallel kernel, and they
# compete for the two cores with the BLAS threads of the matrix product that comes next: a
# 128x128 attention went from 0.1 to 8 ms.  "workqueue" threads sleep instead.  (It does not
# allow kernels launched from several Python threads at once.)  Your own setting wins.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"

from . import numpy_backend as reference

__all__ = ["KERNELS"]

_POW2 = np.array([2.0**k for k in range(-127, 128)], dtype=np.float32)   # 2^n for float32 n

# fastmath without 'nnan'/'ninf': masked scores are -inf and the kernels test for it.
# 'reassoc' lets LLVM vectorise the row sums; 'afn' the polynomial.
FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}


@njit(cache=True, fastmath=FAST)
def _exp32(x):
    """exp(x) in float32: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial to
    degree 6 (error r^7/7! < 2e-7), times 2^n from a table.  Below -87 (where float32's
    normal range ends) it returns 0, so masked (-inf) entries come out exactly 0."""
    if x < np.float32(-87.0):
        return np.float32(0.0)
    n = math.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
    # ln2 split in two (Cody-Waite) so that n*ln2 is subtracted without rounding error.
    r = x - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * _POW2[np.int32(n) + 127]


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


@njit(cache=True, fastmath=FAST, parallel=True)
def _sdpa_weights(s, mask, has_mask, causal, start, lse):
    """In place: scores s (N, b, T_k) of queries start..start+b -> their softmax weights;
    lse (N, b) gets each row's log-sum-exp (-inf for a row with nothing to attend to).
    Causal rows only visit keys j <= query; unmasked rows take a branch-free loop."""
    n_batch, b, t_k = s.shape
    for nb in prange(n_batch * b):
        n, i = nb // b, nb % b
        row = s[n, i]
        keep = mask[n if mask.shape[0] > 1 else 0, i]
        stop = min(start + i + 1, t_k) if causal else t_k
        m = _like(row[0], -np.inf)
        for j in range(stop):
            if keep[j] or not has_mask:
                m = max(m, row[j])
        for j in range(stop, t_k):
            row[j] = 0.0
        if not math.isfinite(m):
            for j in range(stop):
                row[j] = 0.0
            lse[n, i] = -np.inf
            continue
        total = _like(row[0], 0.0)
        if has_mask:
            for j in range(stop):
                e = _exp(row[j] - m) if keep[j] else _like(row[0], 0.0)
                row[j] = e
                total += e
        else:
            for j in range(stop):
                e = _exp(row[j] - m)
                row[j] = e
                total += e
        lse[n, i] = m + math.log(total)
        scale = _like(row[0], 1.0) / total
        for j in range(stop):
            row[j] *= scale


@njit(cache=True, fastmath=FAST, parallel=True)
def _sdpa_weights_from_lse(s, mask, has_mask, causal, start, lse):
    """In place: scores (N, b, T_k) -> weights exp(s - lse), rebuilt for backward."""
    n_batch, b, t_k = s.shape
    for nb in prange(n_batch * b):
        n, i = nb // b, nb % b
        row = s[n, i]
        keep = mask[n if mask.shape[0] > 1 else 0, i]
        stop = min(start + i + 1, t_k) if causal else t_k
        lse_i = lse[n, start + i]
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
def _sdpa_dscores(p, dp, delta, start):
    """In place: dp (N, b, T_k) -> ds = p * (dp - delta), the softmax backward."""
    n_batch, b, t_k = p.shape
    for nb in prange(n_batch * b):
        n, i = nb // b, nb % b
        d = delta[n, start + i]
        pr, dr = p[n, i], dp[n, i]
        for j in range(t_k):
            dr[j] = pr[j] * (dr[j] - d)


_NO_MASK = np.ones((1, 1, 1), dtype=np.bool_)


def _mask_block(mask, start, stop):
    if mask is None:
        return _NO_MASK, False
    return np.ascontiguousarray(mask[:, start:stop]), True


def sdpa(q, k, v, mask, scale, causal):
    """The reference's blocked algorithm (see numpy_backend.sdpa), with the softmax of each
    block fused into one Numba pass in place over BLAS's score block."""
    n, t_q, _ = q.shape
    o = np.empty((n, t_q, v.shape[2]), dtype=q.dtype)
    lse = np.empty((n, t_q), dtype=q.dtype)
    block = reference.SDPA_BLOCK
    for start in range(0, t_q, block):
        stop = min(start + block, t_q)
        s = reference.matmul_nt(q[:, start:stop] * q.dtype.type(scale), k)     # (N, b, T_k)
        keep, has_mask = _mask_block(mask, start, stop)
        lse_b = np.empty((n, stop - start), dtype=q.dtype)
        _sdpa_weights(s, keep, has_mask, causal, start, lse_b)
        lse[:, start:stop] = lse_b
        np.matmul(s, v, out=o[:, start:stop])                                  # (N, b, D_v)
    return o, lse


def sdpa_back(q, k, v, o, lse, do, mask, scale, causal):
    dq = np.empty_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    delta = np.ascontiguousarray(np.sum(do * o, axis=-1))                      # (N, T_q)
    lse = np.ascontiguousarray(lse)
    block = reference.SDPA_BLOCK
    for start in range(0, q.shape[1], block):
        stop = min(start + block, q.shape[1])
        qb = q[:, start:stop] * q.dtype.type(scale)
        p = reference.matmul_nt(qb, k)                                         # (N, b, T_k)
        keep, has_mask = _mask_block(mask, start, stop)
        _sdpa_weights_from_lse(p, keep, has_mask, causal, start, lse)
        dob = do[:, start:stop]
        dv += reference.matmul_tn(p, dob)                                      # (N, T_k, D_v)
        ds = reference.matmul_nt(dob, v)                                       # dp (N, b, T_k)
        _sdpa_dscores(p, ds, delta, start)
        dq[:, start:stop] = np.matmul(ds, k)
        dq[:, start:stop] *= q.dtype.type(scale)
        dk += reference.matmul_tn(ds, qb)
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
