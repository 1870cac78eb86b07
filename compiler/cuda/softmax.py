"""The softmax family (one block per row) and the losses built on it: cross-entropy and
NLL."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .device import MAX_BLOCKS, ROW_THREADS, THREADS, empty, launch, nblocks, no_mask, per_dtype, ravel
from .memory import zeros
from .movement import broadcast_to, permute
from .reduce import block_max, block_sum


@per_dtype
def _softmax_rows_kernel(nb_type, dtype):
    zero, one, neg_inf = dtype.type(0), dtype.type(1), dtype.type(-np.inf)

    @cuda.jit
    def softmax_rows(out, x, n_cols, mask, has_mask):
        """Row softmax over the entries where mask (same layout as x) is True, or all of them."""
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        t = cuda.threadIdx.x
        for row in range(cuda.blockIdx.x, x.shape[0] // n_cols, cuda.gridDim.x):
            base = row * n_cols
            m = neg_inf
            for j in range(t, n_cols, ROW_THREADS):
                if (not has_mask or mask[base + j]) and x[base + j] > m:
                    m = x[base + j]
            m = block_max(partial, m)
            if not math.isfinite(m):
                m = zero                 # nothing finite in the row: exp below gives zeros
            total = zero
            for j in range(t, n_cols, ROW_THREADS):
                e = math.exp(x[base + j] - m) if not has_mask or mask[base + j] else zero
                out[base + j] = e
                total += e
            total = block_sum(partial, total)
            scale = one / total if total > zero else zero
            for j in range(t, n_cols, ROW_THREADS):
                out[base + j] *= scale

    return softmax_rows


@per_dtype
def _log_softmax_rows_kernel(nb_type, dtype):
    zero, neg_inf = dtype.type(0), dtype.type(-np.inf)

    @cuda.jit
    def log_softmax_rows(out, x, n_cols):
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        t = cuda.threadIdx.x
        for row in range(cuda.blockIdx.x, x.shape[0] // n_cols, cuda.gridDim.x):
            base = row * n_cols
            m = neg_inf
            for j in range(t, n_cols, ROW_THREADS):
                if x[base + j] > m:
                    m = x[base + j]
            m = block_max(partial, m)
            if not math.isfinite(m):
                m = zero
            total = zero
            for j in range(t, n_cols, ROW_THREADS):
                total += math.exp(x[base + j] - m)
            total = block_sum(partial, total)
            # An all -inf row: total = 0 and y = x - m = -inf, the log of softmax's zeros.
            log_total = math.log(total) if total > zero else zero
            for j in range(t, n_cols, ROW_THREADS):
                out[base + j] = (x[base + j] - m) - log_total

    return log_softmax_rows


@per_dtype
def _softmax_back_rows_kernel(nb_type, dtype):
    zero = dtype.type(0)

    @cuda.jit
    def softmax_back_rows(dx, y, dy, n_cols, log):
        """dx = y (dy - sum(dy y)); with ``log`` (y = log_softmax): dx = dy - exp(y) sum(dy)."""
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        t = cuda.threadIdx.x
        for row in range(cuda.blockIdx.x, y.shape[0] // n_cols, cuda.gridDim.x):
            base = row * n_cols
            acc = zero
            for j in range(t, n_cols, ROW_THREADS):
                acc += dy[base + j] if log else dy[base + j] * y[base + j]
            s = block_sum(partial, acc)
            for j in range(t, n_cols, ROW_THREADS):
                if log:
                    dx[base + j] = dy[base + j] - math.exp(y[base + j]) * s
                else:
                    dx[base + j] = (dy[base + j] - s) * y[base + j]

    return softmax_back_rows


def _along_last(fn, axis, *arrays):
    """fn(*arrays) over the last axis; another ``axis`` is moved last and back."""
    ndim = arrays[0].ndim
    axis = int(axis) % ndim
    if axis == ndim - 1:
        return fn(*arrays)
    order = tuple(d for d in range(ndim) if d != axis) + (axis,)
    inverse = tuple(int(i) for i in np.argsort(order))
    return permute(fn(*(permute(a, order) for a in arrays)), inverse)


def _width(x) -> int:
    """The row length (the last axis); a device array's shape may refuse index -1 (the
    simulator's does)."""
    return x.shape[x.ndim - 1]


def _row_blocks(x) -> int:
    return min(x.size // _width(x), MAX_BLOCKS)


def _softmax_last(x, mask=None):
    out = empty(x.shape, x.dtype)
    if out.size:
        has_mask = mask is not None
        launch(_softmax_rows_kernel(x.dtype), _row_blocks(x), ROW_THREADS, ravel(out), ravel(x), _width(x),
                ravel(mask) if has_mask else no_mask(1), has_mask)
    return out


def softmax(x, axis):
    """Row softmax; the row max is subtracted before exp, and a row that is entirely -inf
    (every position masked) gives zeros, not NaN."""
    return _along_last(_softmax_last, axis, x)


def masked_softmax(x, mask):
    """Softmax over the last axis of x restricted to where ``mask`` (broadcast to x) is True;
    masked entries get 0 and a row with no True entry is all zeros."""
    return _softmax_last(x, broadcast_to(mask, x.shape))


def _log_softmax_last(x):
    out = empty(x.shape, x.dtype)
    if out.size:
        launch(_log_softmax_rows_kernel(x.dtype), _row_blocks(x), ROW_THREADS, ravel(out), ravel(x),
                _width(x))
    return out


def log_softmax(x, axis):
    return _along_last(_log_softmax_last, axis, x)


def _softmax_back_last(y, dy, log):
    dx = empty(y.shape, y.dtype)
    if dx.size:
        launch(_softmax_back_rows_kernel(y.dtype), _row_blocks(y), ROW_THREADS, ravel(dx), ravel(y),
                ravel(dy), _width(y), log)
    return dx


def softmax_back(y, dy, axis):
    return _along_last(lambda y_, dy_: _softmax_back_last(y_, dy_, False), axis, y, dy)


def log_softmax_back(y, dy, axis):
    return _along_last(lambda y_, dy_: _softmax_back_last(y_, dy_, True), axis, y, dy)


# ---------------------------------------------------------------- losses


@per_dtype
def _cross_entropy_kernel(nb_type, dtype):
    zero, neg_inf = dtype.type(0), dtype.type(-np.inf)

    @cuda.jit
    def cross_entropy_rows(loss, lse, logits, target, ignore_index, n_cols):
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        t = cuda.threadIdx.x
        for row in range(cuda.blockIdx.x, loss.shape[0], cuda.gridDim.x):
            base = row * n_cols
            m = neg_inf
            for j in range(t, n_cols, ROW_THREADS):
                if logits[base + j] > m:
                    m = logits[base + j]
            m = block_max(partial, m)
            total = zero
            for j in range(t, n_cols, ROW_THREADS):
                total += math.exp(logits[base + j] - m)
            total = block_sum(partial, total)
            if t == 0:
                row_lse = m + math.log(total)
                lse[row] = row_lse
                c = target[row]
                loss[row] = row_lse - logits[base + c] if c != ignore_index else zero

    return cross_entropy_rows


@cuda.jit
def _cross_entropy_back_kernel(dx, logits, lse, target, ignore_index, dloss, n_cols):
    """d loss_r / d logits_r = (softmax(logits_r) - onehot(target_r)) dloss_r, 0 if ignored."""
    for i in range(cuda.grid(1), dx.shape[0], cuda.gridsize(1)):
        row = i // n_cols
        c = target[row]
        if c == ignore_index:
            dx[i] = 0
        else:
            p = math.exp(logits[i] - lse[row])
            dx[i] = (p - 1 if i - row * n_cols == c else p) * dloss[row]


def cross_entropy(logits, target, ignore_index):
    """Per-row loss -log softmax(logits)[target] and the row logsumexp, for (N, C) logits."""
    n, c = logits.shape
    loss = empty((n,), logits.dtype)
    lse = empty((n,), logits.dtype)
    if n and c:
        launch(_cross_entropy_kernel(logits.dtype), min(n, MAX_BLOCKS), ROW_THREADS, loss, lse,
                ravel(logits), target, int(ignore_index), c)
    return loss, lse


def cross_entropy_back(logits, lse, target, ignore_index, dloss):
    dx = empty(logits.shape, logits.dtype)
    if dx.size:
        launch(_cross_entropy_back_kernel, nblocks(dx.size), THREADS, ravel(dx), ravel(logits), lse, target,
                int(ignore_index), dloss, logits.shape[1])
    return dx


@cuda.jit
def _nll_loss_kernel(loss, logp, target, ignore_index, n_cols):
    for row in range(cuda.grid(1), loss.shape[0], cuda.gridsize(1)):
        c = target[row]
        loss[row] = -logp[row * n_cols + c] if c != ignore_index else 0


@cuda.jit
def _nll_loss_back_kernel(dx, target, ignore_index, dloss, n_cols):
    for row in range(cuda.grid(1), dloss.shape[0], cuda.gridsize(1)):
        c = target[row]
        if c != ignore_index:
            dx[row * n_cols + c] = -dloss[row]


def nll_loss(logp, target, ignore_index):
    """Per-row loss -logp[target] for (N, C) log-probabilities; ignored rows give 0."""
    loss = empty((logp.shape[0],), logp.dtype)
    if loss.size:
        launch(_nll_loss_kernel, nblocks(loss.size), THREADS, loss, ravel(logp), target, int(ignore_index),
                logp.shape[1])
    return loss


def nll_loss_back(shape, target, ignore_index, dloss):
    dx = zeros(shape, dloss.dtype)
    if dloss.size:
        launch(_nll_loss_back_kernel, nblocks(dloss.size), THREADS, ravel(dx), target, int(ignore_index),
                dloss, shape[1])
    return dx


@cuda.jit
def _count_ne_kernel(count, x, value):
    own = 0
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        if x[i] != value:
            own += 1
    if own:
        cuda.atomic.add(count, 0, own)         # integers: the total is exact in any order


def count_ne(x, value):
    """The number of entries of x that differ from ``value``, as a 0-d int64 array."""
    count = zeros((1,), np.int64)
    if x.size:
        launch(_count_ne_kernel, nblocks(x.size), THREADS, count, ravel(x), int(value))
    return count.reshape(())


@cuda.jit
def _clamp_divisor_kernel(out, count):
    # Not max(count[0], 1): Numba 0.68 fails to compile that call for a GPU.
    if cuda.grid(1) == 0:
        n = count[0]
        out[0] = n if n > 1 else 1             # the store rounds to out's dtype, as a cast does


def clamp_divisor(count, dtype):
    """max(count, 1) as a 0-d array of ``dtype``: the divisor of a mean over kept rows."""
    out = empty((1,), dtype)
    launch(_clamp_divisor_kernel, 1, 1, out, count.reshape((1,)))
    return out.reshape(())


# ---------------------------------------------------------------- the table

KERNELS = {
    "softmax": softmax, "softmax_back": softmax_back, "log_softmax": log_softmax,
    "log_softmax_back": log_softmax_back, "masked_softmax": masked_softmax,
    "cross_entropy": cross_entropy, "cross_entropy_back": cross_entropy_back,
    "nll_loss": nll_loss, "nll_loss_back": nll_loss_back, "count_ne": count_ne,
    "clamp_divisor": clamp_divisor,
}
