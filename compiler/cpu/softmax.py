"""Softmax-shaped work fused into one pass per row: softmax, masked softmax, log-softmax,
their backwards and cross-entropy.  numpy spends four to seven passes over memory and a
temporary per pass on each; a row kernel does it in two passes without temporaries, rows in
parallel."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .. import reference
from ..numba_support import FAST, cast_like, parallel_min, typed_exp

# Each row kernel is a function of one row index (``_*_row``) run by a serial or a parallel
# loop.  Waking the second thread costs 9-90 µs (numba_support.launch_us), so small inputs
# (a decoder step's softmax over 20 source positions for a batch of 32) take the serial loop.
PARALLEL_MIN = 12288          # entries from which the parallel loop pays, at a 10 µs launch
_scaled = parallel_min        # ... and at this process's launch cost (tests replace it)


@njit(cache=True, fastmath=FAST)
def _softmax_row(r, x, mask, has_mask, out):
    """Softmax of row r of x (R, N) into out, over the entries where mask (R, N) is True
    when has_mask (else every entry; mask is then a dummy)."""
    row, y = x[r], out[r]
    keep = mask[r if has_mask else 0]
    m = cast_like(row[0], -np.inf)
    for j in range(row.shape[0]):
        if keep[j] or not has_mask:
            m = max(m, row[j])
    if not math.isfinite(m):
        m = cast_like(row[0], 0.0)                   # nothing finite: exp gives zeros below
    total = 0.0
    if has_mask:
        for j in range(row.shape[0]):
            e = typed_exp(row[j] - m) if keep[j] else cast_like(row[0], 0.0)
            y[j] = e
            total += e
    else:
        for j in range(row.shape[0]):
            e = typed_exp(row[j] - m)
            y[j] = e
            total += e
    scale = cast_like(row[0], 1.0 / total if total > 0 else 0.0)
    for j in range(row.shape[0]):
        y[j] *= scale


@njit(cache=True, fastmath=FAST)
def _softmax_back_row(r, y, dy, dx):
    yr, dyr, dxr = y[r], dy[r], dx[r]
    s = 0.0
    for j in range(yr.shape[0]):
        s += yr[j] * dyr[j]
    s = cast_like(yr[0], s)
    for j in range(yr.shape[0]):
        dxr[j] = yr[j] * (dyr[j] - s)


@njit(cache=True, fastmath=FAST)
def _row_logsumexp(row):
    """log(sum(exp(row))), shifted by the row max so exp never overflows.  A row with
    nothing finite gives 0 (not NaN): x - 0 = -inf is then the log of softmax's zeros."""
    m = cast_like(row[0], -np.inf)
    for j in range(row.shape[0]):
        m = max(m, row[j])
    if not math.isfinite(m):
        m = cast_like(row[0], 0.0)
    total = 0.0
    for j in range(row.shape[0]):
        total += typed_exp(row[j] - m)
    return m + math.log(total) if total > 0 else m


@njit(cache=True, fastmath=FAST)
def _log_softmax_row(r, x, out):
    row, y = x[r], out[r]
    lse = _row_logsumexp(row)
    for j in range(row.shape[0]):
        y[j] = row[j] - lse


@njit(cache=True, fastmath=FAST)
def _log_softmax_back_row(r, y, dy, dx):
    yr, dyr, dxr = y[r], dy[r], dx[r]
    s = 0.0
    for j in range(yr.shape[0]):
        s += dyr[j]
    s = cast_like(yr[0], s)
    for j in range(yr.shape[0]):
        dxr[j] = dyr[j] - typed_exp(yr[j]) * s


@njit(cache=True, fastmath=FAST)
def _cross_entropy_row(r, logits, target, ignore_index, loss, lse):
    row = logits[r]
    lse[r] = _row_logsumexp(row)
    loss[r] = lse[r] - row[target[r]] if target[r] != ignore_index else 0.0


@njit(cache=True, fastmath=FAST)
def _cross_entropy_back_row(r, logits, lse, target, ignore_index, dloss, dx):
    row, out = logits[r], dx[r]
    if target[r] == ignore_index:
        for j in range(row.shape[0]):
            out[j] = 0.0
        return
    g = dloss[r]
    for j in range(row.shape[0]):
        out[j] = typed_exp(row[j] - lse[r]) * g
    out[target[r]] -= g


# The loops.  A prange index is unsigned: rows are passed on as int64.


@njit(cache=True, fastmath=FAST)
def _softmax_serial(x, mask, has_mask, out):
    for r in range(x.shape[0]):
        _softmax_row(r, x, mask, has_mask, out)


@njit(cache=True, fastmath=FAST, parallel=True)
def _softmax_parallel(x, mask, has_mask, out):
    for r in prange(x.shape[0]):
        _softmax_row(np.int64(r), x, mask, has_mask, out)


@njit(cache=True, fastmath=FAST)
def _softmax_back_serial(y, dy, dx):
    for r in range(y.shape[0]):
        _softmax_back_row(r, y, dy, dx)


@njit(cache=True, fastmath=FAST, parallel=True)
def _softmax_back_parallel(y, dy, dx):
    for r in prange(y.shape[0]):
        _softmax_back_row(np.int64(r), y, dy, dx)


@njit(cache=True, fastmath=FAST)
def _log_softmax_serial(x, out):
    for r in range(x.shape[0]):
        _log_softmax_row(r, x, out)


@njit(cache=True, fastmath=FAST, parallel=True)
def _log_softmax_parallel(x, out):
    for r in prange(x.shape[0]):
        _log_softmax_row(np.int64(r), x, out)


@njit(cache=True, fastmath=FAST)
def _log_softmax_back_serial(y, dy, dx):
    for r in range(y.shape[0]):
        _log_softmax_back_row(r, y, dy, dx)


@njit(cache=True, fastmath=FAST, parallel=True)
def _log_softmax_back_parallel(y, dy, dx):
    for r in prange(y.shape[0]):
        _log_softmax_back_row(np.int64(r), y, dy, dx)


@njit(cache=True, fastmath=FAST)
def _cross_entropy_serial(logits, target, ignore_index, loss, lse):
    for r in range(logits.shape[0]):
        _cross_entropy_row(r, logits, target, ignore_index, loss, lse)


@njit(cache=True, fastmath=FAST, parallel=True)
def _cross_entropy_parallel(logits, target, ignore_index, loss, lse):
    for r in prange(logits.shape[0]):
        _cross_entropy_row(np.int64(r), logits, target, ignore_index, loss, lse)


@njit(cache=True, fastmath=FAST)
def _cross_entropy_back_serial(logits, lse, target, ignore_index, dloss, dx):
    for r in range(logits.shape[0]):
        _cross_entropy_back_row(r, logits, lse, target, ignore_index, dloss, dx)


@njit(cache=True, fastmath=FAST, parallel=True)
def _cross_entropy_back_parallel(logits, lse, target, ignore_index, dloss, dx):
    for r in prange(logits.shape[0]):
        _cross_entropy_back_row(np.int64(r), logits, lse, target, ignore_index, dloss, dx)


def _pick(serial, parallel, x):
    return parallel if x.size >= _scaled(PARALLEL_MIN) else serial


# ---------------------------------------------------------------- softmax and log-softmax

NO_MASK = np.ones((1, 1), dtype=np.bool_)   # a (1, 1) stand-in for kernels told has_mask=False


def _rows(x):
    """x as C-contiguous (rows, last axis)."""
    return np.ascontiguousarray(x).reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def softmax(x, axis):
    """Over the last axis; other axes (rare: attention and losses use the last) and empty
    arrays go to the numpy reference."""
    if x.size == 0 or axis not in (-1, x.ndim - 1):
        return reference.softmax(x, axis)
    out = np.empty(x.shape, dtype=x.dtype)
    _pick(_softmax_serial, _softmax_parallel, x)(_rows(x), NO_MASK, False, _rows(out))
    return out


def masked_softmax(x, mask):
    if x.size == 0:
        return reference.masked_softmax(x, mask)
    out = np.empty(x.shape, dtype=x.dtype)
    rows_mask = _rows(mask if mask.shape == x.shape else np.broadcast_to(mask, x.shape))
    _pick(_softmax_serial, _softmax_parallel, x)(_rows(x), rows_mask, True, _rows(out))
    return out


def log_softmax(x, axis):
    if x.size == 0 or axis not in (-1, x.ndim - 1):
        return reference.log_softmax(x, axis)
    out = np.empty(x.shape, dtype=x.dtype)
    _pick(_log_softmax_serial, _log_softmax_parallel, x)(_rows(x), _rows(out))
    return out


def _row_back_kernel(serial, parallel, reference_fn):
    def run(y, dy, axis):
        if y.size == 0 or axis not in (-1, y.ndim - 1):
            return reference_fn(y, dy, axis)
        dx = np.empty(y.shape, dtype=y.dtype)
        _pick(serial, parallel, y)(_rows(y), _rows(dy), _rows(dx))
        return dx

    return run


softmax_back = _row_back_kernel(_softmax_back_serial, _softmax_back_parallel, reference.softmax_back)
log_softmax_back = _row_back_kernel(_log_softmax_back_serial, _log_softmax_back_parallel,
                                    reference.log_softmax_back)


# ---------------------------------------------------------------- cross-entropy


def cross_entropy(logits, target, ignore_index):
    n = logits.shape[0]
    loss = np.empty(n, dtype=logits.dtype)
    lse = np.empty(n, dtype=logits.dtype)
    _pick(_cross_entropy_serial, _cross_entropy_parallel, logits)(
        np.ascontiguousarray(logits), np.ascontiguousarray(target, dtype=np.int64),
        np.int64(ignore_index), loss, lse)
    return loss, lse


def cross_entropy_back(logits, lse, target, ignore_index, dloss):
    dx = np.empty(logits.shape, dtype=logits.dtype)
    _pick(_cross_entropy_back_serial, _cross_entropy_back_parallel, logits)(
        np.ascontiguousarray(logits), lse, np.ascontiguousarray(target, dtype=np.int64),
        np.int64(ignore_index), np.ascontiguousarray(dloss, dtype=logits.dtype), dx)
    return dx


KERNELS = {
    "softmax": softmax, "softmax_back": softmax_back, "log_softmax": log_softmax,
    "log_softmax_back": log_softmax_back, "masked_softmax": masked_softmax,
    "cross_entropy": cross_entropy, "cross_entropy_back": cross_entropy_back,
}
