"""Layer normalisation as one kernel over rows instead of six array-wide numpy passes with a
temporary each: per row, the forward's mean and variance (float64 sums) and the output, the
backward's two row sums and dx, rows in parallel; the weight's and bias's gradients are
column sums, added in the same sweep when the rows run serially and in one more serial sweep
when they run in parallel.  The row sums run in float64 with reassociation allowed, so they
vectorise (a strict left-to-right sum is one dependent add per entry: 2x slower)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..numba_support import FAST

# Rows run in parallel only from this many entries.  Alone, right after a two-thread product,
# the parallel kernels were a little faster at (640, 128) (156 against 173 us forward and
# backward) and no faster from (2048, 256) on; but inside a Transformer training step at two
# threads, where they alternate with products, the serial ones made the step ~1 ms (2%)
# faster (bench/transformer.py's model, same-process A/B, two runs of 15).
PARALLEL_MIN = 1 << 20


def _pick(serial, parallel, x):
    return parallel if x.size >= PARALLEL_MIN else serial


@njit(cache=True, fastmath=FAST)
def _layer_norm_row(r, x, weight, bias, has_weight, has_bias, eps, y, mean, rstd):
    row, out = x[r], y[r]
    n = row.shape[0]
    total = 0.0
    for j in range(n):
        total += row[j]
    m = total / n
    square = 0.0
    for j in range(n):                     # two passes: no cancellation in E[x^2] - m^2
        c = row[j] - m
        square += c * c
    s = 1.0 / math.sqrt(square / n + eps)
    mean[r], rstd[r] = m, s
    for j in range(n):
        v = (row[j] - m) * s
        if has_weight:
            v = v * weight[j]
        if has_bias:
            v = v + bias[j]
        out[j] = v


@njit(cache=True, fastmath=FAST)
def _layer_norm_back_row(r, dy, x, mean, rstd, weight, has_weight, dx, affine, dweight, dbias):
    """dx of row r; with ``affine`` also adds the row's terms of the weight's and bias's
    gradients (the serial sweep: rows run in parallel would race on them)."""
    g_row, x_row, out = dy[r], x[r], dx[r]
    n = x_row.shape[0]
    m, s = np.float64(mean[r]), np.float64(rstd[r])
    sum_g, sum_gx = 0.0, 0.0
    for j in range(n):
        g = g_row[j] * weight[j] if has_weight else g_row[j]
        sum_g += g
        sum_gx += g * (x_row[j] - m) * s
    mean_g, mean_gx = sum_g / n, sum_gx / n
    for j in range(n):
        xhat = (x_row[j] - m) * s
        g = g_row[j] * weight[j] if has_weight else g_row[j]
        out[j] = s * (g - mean_g - xhat * mean_gx)
        if affine:
            dweight[j] += g_row[j] * xhat
            dbias[j] += g_row[j]


@njit(cache=True)
def _layer_norm_serial(x, weight, bias, has_weight, has_bias, eps, y, mean, rstd):
    for r in range(x.shape[0]):
        _layer_norm_row(r, x, weight, bias, has_weight, has_bias, eps, y, mean, rstd)


@njit(cache=True, parallel=True)
def _layer_norm_parallel(x, weight, bias, has_weight, has_bias, eps, y, mean, rstd):
    for r in prange(x.shape[0]):
        _layer_norm_row(np.int64(r), x, weight, bias, has_weight, has_bias, eps, y, mean, rstd)


@njit(cache=True, fastmath=FAST)
def _affine_grads(dy, x, mean, rstd, dweight, dbias):
    """Column sums of dy xhat and dy, row after row (contiguous, so the inner loop vectorises),
    accumulated in the arrays' dtype as numpy's sum is."""
    for r in range(x.shape[0]):
        m, s = mean[r], rstd[r]
        for j in range(x.shape[1]):
            dweight[j] += dy[r, j] * (x[r, j] - m) * s
            dbias[j] += dy[r, j]


@njit(cache=True)
def _layer_norm_back_serial(dy, x, mean, rstd, weight, has_weight, dx, dweight, dbias):
    for r in range(x.shape[0]):
        _layer_norm_back_row(r, dy, x, mean, rstd, weight, has_weight, dx, True, dweight, dbias)


@njit(cache=True, parallel=True)
def _layer_norm_back_parallel(dy, x, mean, rstd, weight, has_weight, dx, dweight, dbias):
    for r in prange(x.shape[0]):
        _layer_norm_back_row(np.int64(r), dy, x, mean, rstd, weight, has_weight, dx, False, dweight, dbias)
    _affine_grads(dy, x, mean, rstd, dweight, dbias)


def _vector(p, like):
    """(N,) contiguous, or an empty stand-in for an absent weight or bias."""
    return np.empty(0, like.dtype) if p is None else np.ascontiguousarray(p)


def layer_norm(x, weight, bias, eps):
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    mean = np.empty(x.shape[0], x.dtype)
    rstd = np.empty(x.shape[0], x.dtype)
    if x.size:
        _pick(_layer_norm_serial, _layer_norm_parallel, x)(
            x, _vector(weight, x), _vector(bias, x), weight is not None, bias is not None, float(eps),
            y, mean, rstd)
    else:
        mean[:], rstd[:] = np.nan, np.nan         # the mean of nothing, as numpy's
    return y, mean, rstd


def layer_norm_back(dy, x, mean, rstd, weight):
    x, dy = np.ascontiguousarray(x), np.ascontiguousarray(dy)
    dx = np.empty_like(x)
    dweight = np.zeros(x.shape[1], x.dtype)
    dbias = np.zeros(x.shape[1], x.dtype)
    if x.size:
        _pick(_layer_norm_back_serial, _layer_norm_back_parallel, x)(
            dy, x, mean, rstd, _vector(weight, x), weight is not None, dx, dweight, dbias)
    return dx, (dweight if weight is not None else None), dbias


KERNELS = {"layer_norm": layer_norm, "layer_norm_back": layer_norm_back}
