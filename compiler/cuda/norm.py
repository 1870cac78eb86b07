"""Layer normalisation: one block per row (two block sums for the mean and the variance, two
for the backward's row means), and one thread per column for the weight's and bias's
gradients."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .device import MAX_BLOCKS, ROW_THREADS, THREADS, empty, launch, nblocks, per_dtype, ravel
from .memory import zeros
from .reduce import block_sum


@per_dtype
def _layer_norm_kernel(nb_type, dtype):
    zero, one = dtype.type(0), dtype.type(1)

    @cuda.jit
    def layer_norm_rows(y, mean, rstd, x, n_cols, weight, bias, has_weight, has_bias, eps):
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        t = cuda.threadIdx.x
        for row in range(cuda.blockIdx.x, x.shape[0] // n_cols, cuda.gridDim.x):
            base = row * n_cols
            acc = zero
            for j in range(t, n_cols, ROW_THREADS):
                acc += x[base + j]
            m = block_sum(partial, acc) / n_cols
            acc = zero
            for j in range(t, n_cols, ROW_THREADS):
                c = x[base + j] - m
                acc += c * c
            s = one / math.sqrt(block_sum(partial, acc) / n_cols + eps)
            if t == 0:
                mean[row], rstd[row] = m, s
            for j in range(t, n_cols, ROW_THREADS):
                v = (x[base + j] - m) * s
                if has_weight:
                    v *= weight[j]
                if has_bias:
                    v += bias[j]
                y[base + j] = v

    return layer_norm_rows


@per_dtype
def _layer_norm_back_kernel(nb_type, dtype):
    zero = dtype.type(0)

    @cuda.jit
    def layer_norm_back_rows(dx, dy, x, mean, rstd, n_cols, weight, has_weight):
        """dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy weight."""
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        t = cuda.threadIdx.x
        for row in range(cuda.blockIdx.x, x.shape[0] // n_cols, cuda.gridDim.x):
            base, m, s = row * n_cols, mean[row], rstd[row]
            acc_g, acc_gx = zero, zero
            for j in range(t, n_cols, ROW_THREADS):
                g = dy[base + j] * weight[j] if has_weight else dy[base + j]
                acc_g += g
                acc_gx += g * (x[base + j] - m) * s
            mean_g = block_sum(partial, acc_g) / n_cols
            mean_gx = block_sum(partial, acc_gx) / n_cols
            for j in range(t, n_cols, ROW_THREADS):
                g = dy[base + j] * weight[j] if has_weight else dy[base + j]
                dx[base + j] = s * (g - mean_g - (x[base + j] - m) * s * mean_gx)

    return layer_norm_back_rows


@cuda.jit
def _affine_grads_kernel(dweight, dbias, dy, x, mean, rstd, n_rows, n_cols):
    """Column sums of dy xhat and dy: a thread per column, down the rows."""
    start = cuda.grid(1)
    for j in range(start, n_cols, cuda.gridsize(1)):
        for r in range(n_rows):
            k = r * n_cols + j
            dweight[j] += dy[k] * (x[k] - mean[r]) * rstd[r]
            dbias[j] += dy[k]


def _vector(p, like):
    return p if p is not None else empty((1,), like.dtype)


def layer_norm(x, weight, bias, eps):
    rows, cols = x.shape
    y = empty(x.shape, x.dtype)
    mean, rstd = empty((rows,), x.dtype), empty((rows,), x.dtype)
    if x.size:
        launch(_layer_norm_kernel(x.dtype), min(rows, MAX_BLOCKS), ROW_THREADS, ravel(y), mean, rstd,
                ravel(x), cols, _vector(weight, x), _vector(bias, x), weight is not None, bias is not None,
                x.dtype.type(eps))
    elif rows:
        mean, rstd = (cuda.to_device(np.full(rows, np.nan, x.dtype)) for _ in range(2))
    return y, mean, rstd


def layer_norm_back(dy, x, mean, rstd, weight):
    rows, cols = x.shape
    dx = empty(x.shape, x.dtype)
    dweight, dbias = zeros((cols,), x.dtype), zeros((cols,), x.dtype)
    if x.size:
        launch(_layer_norm_back_kernel(x.dtype), min(rows, MAX_BLOCKS), ROW_THREADS, ravel(dx), ravel(dy),
                ravel(x), mean, rstd, cols, _vector(weight, x), weight is not None)
        launch(_affine_grads_kernel, nblocks(cols), THREADS, dweight, dbias, ravel(dy), ravel(x), mean, rstd,
                rows, cols)
    return dx, (dweight if weight is not None else None), dbias


KERNELS = {"layer_norm": layer_norm, "layer_norm_back": layer_norm_back}
