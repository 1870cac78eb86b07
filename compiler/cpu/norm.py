"""Layer normalisation as one kernel over rows instead of six array-wide numpy passes with a
temporary each: per row, the forward's mean and variance and the output; the backward's two
row sums and dx, then the weight's and bias's gradients (column sums) in one serial sweep.

The row sums run in float64 with reassociation allowed, so they vectorise (a strict
left-to-right sum is one dependent add per entry: 2x slower); the elementwise passes run in
the array's dtype from the mean and rstd as stored, as the reference's numpy passes do and
the backward reads them (2x faster than the same pass in float64).  A row's loops are written
out inside the loop over the rows: in a helper called once a row, as they were, the same
loops took 1.9-3.5x as long ((640, 128) float32, one thread; Numba inlining the helper did
not help).  An absent weight or bias is passed as ones or zeros (v * 1 + 0 is v), so the
loops have no branches.  Large inputs split their rows into one block a thread and the
column sums take one serial sweep after them: every output has the same bits at any thread
count (the serial kernel's to rounding: Numba compiles the rows' loops inside the parallel
kernel apart, and in some processes they summed another way)."""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from ..numba_support import FAST, cast_like

# Rows run in parallel only from this many entries.  Measured with the kernels before their
# loops moved inline (2026-11-29), which took ~3x as long: alone, right after a two-thread
# product, the parallel kernels were a little faster at (640, 128) (156 against 173 us forward
# and backward) and no faster from (2048, 256) on; but inside a Transformer training step at
# two threads, where they alternate with products, the serial ones made the step ~1 ms (2%)
# faster (bench/transformer.py's model, same-process A/B, two runs of 15).  At (8192, 256),
# now, two threads take 0.32 against 0.36 ms forward, 0.69 against 0.79 backward.
PARALLEL_MIN = 1 << 20


@njit(cache=True, fastmath=FAST, nogil=True)
def _layer_norm_rows(x, weight, bias, eps, y, mean, rstd, start, stop):
    n = x.shape[1]
    for r in range(start, stop):
        row, out = x[r], y[r]
        total = 0.0
        for j in range(n):
            total += row[j]
        m = total / n
        square = 0.0
        for j in range(n):                 # two passes: no cancellation in E[x^2] - m^2
            c = row[j] - m
            square += c * c
        mean[r], rstd[r] = m, 1.0 / math.sqrt(square / n + eps)
        m_x, s_x = mean[r], rstd[r]
        for j in range(n):
            out[j] = (row[j] - m_x) * s_x * weight[j] + bias[j]


@njit(cache=True, fastmath=FAST, nogil=True)
def _layer_norm_dx(dy, x, mean, rstd, weight, dx, start, stop):
    """dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy weight, rows start .. stop."""
    n = x.shape[1]
    for r in range(start, stop):
        g_row, x_row, out = dy[r], x[r], dx[r]
        m, s = mean[r], rstd[r]
        sum_g, sum_gx = 0.0, 0.0
        for j in range(n):
            g = g_row[j] * weight[j]
            sum_g += g
            sum_gx += g * ((x_row[j] - m) * s)
        mean_g, mean_gx = cast_like(m, sum_g / n), cast_like(m, sum_gx / n)
        for j in range(n):
            out[j] = s * (g_row[j] * weight[j] - mean_g - (x_row[j] - m) * s * mean_gx)


@njit(cache=True, fastmath=FAST, nogil=True)
def _affine_grads(dy, x, mean, rstd, dweight, dbias):
    """The column sums dweight += dy xhat, dbias += dy, row after row (contiguous, so the inner
    loop vectorises), in the arrays' dtype as numpy's sum is: one serial sweep whether dx's
    rows ran serially or in parallel, so the sums do not depend on the thread count."""
    for r in range(x.shape[0]):
        m, s = mean[r], rstd[r]
        for j in range(x.shape[1]):
            dweight[j] += dy[r, j] * ((x[r, j] - m) * s)
            dbias[j] += dy[r, j]


@njit(cache=True, nogil=True)
def _layer_norm_back_rows(dy, x, mean, rstd, weight, dx, dweight, dbias):
    _layer_norm_dx(dy, x, mean, rstd, weight, dx, 0, x.shape[0])
    _affine_grads(dy, x, mean, rstd, dweight, dbias)


@njit(cache=True, parallel=True)
def _layer_norm_parallel(x, weight, bias, eps, y, mean, rstd, count):
    """``count`` blocks of rows, as even as they divide, one a thread; each block runs the
    serial kernel's rows on the whole arrays, so a row's bits do not depend on the block it
    falls in."""
    rows = x.shape[0]
    for b in prange(count):
        _layer_norm_rows(x, weight, bias, eps, y, mean, rstd, b * rows // count, (b + 1) * rows // count)


@njit(cache=True, parallel=True)
def _layer_norm_back_parallel(dy, x, mean, rstd, weight, dx, dweight, dbias, count):
    rows = x.shape[0]
    for b in prange(count):
        _layer_norm_dx(dy, x, mean, rstd, weight, dx, b * rows // count, (b + 1) * rows // count)
    _affine_grads(dy, x, mean, rstd, dweight, dbias)


def _blocks(x) -> int:
    """Blocks of rows for the parallel kernels: one a thread of Numba's pool."""
    return max(1, min(numba.get_num_threads(), x.shape[0]))


def _vector(p, like, fill):
    """(N,) contiguous, or ``fill`` (1 or 0) in each entry for an absent weight or bias."""
    return np.full(like.shape[1], fill, like.dtype) if p is None else np.ascontiguousarray(p)


def layer_norm(x, weight, bias, eps):
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    mean = np.empty(x.shape[0], x.dtype)
    rstd = np.empty(x.shape[0], x.dtype)
    if x.size:
        args = (x, _vector(weight, x, 1), _vector(bias, x, 0), float(eps), y, mean, rstd)
        if x.size >= PARALLEL_MIN:
            _layer_norm_parallel(*args, _blocks(x))
        else:
            _layer_norm_rows(*args, 0, x.shape[0])
    else:
        mean[:], rstd[:] = np.nan, np.nan         # the mean of nothing, as numpy's
    return y, mean, rstd


def layer_norm_back(dy, x, mean, rstd, weight):
    x, dy = np.ascontiguousarray(x), np.ascontiguousarray(dy)
    dx = np.empty_like(x)
    dweight = np.zeros(x.shape[1], x.dtype)
    dbias = np.zeros(x.shape[1], x.dtype)
    if x.size:
        args = (dy, x, mean, rstd, _vector(weight, x, 1), dx, dweight, dbias)
        if x.size >= PARALLEL_MIN:
            _layer_norm_back_parallel(*args, _blocks(x))
        else:
            _layer_norm_back_rows(*args)
    return dx, (dweight if weight is not None else None), dbias


KERNELS = {"layer_norm": layer_norm, "layer_norm_back": layer_norm_back}
