"""Reductions: ``sum``, ``sum_to``, ``max`` and ``max_back``, one block per row."""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from .. import formulas
from .device import MAX_BLOCKS, ROW_THREADS, empty, launch, per_dtype, ravel
from .elementwise import build
from .memory import zeros
from .movement import permute, reshape


def _axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return tuple(sorted({int(a) % ndim for a in axes})) if ndim else ()


def _rows_last(x, axes):
    """x as contiguous (rows, reduced) with ``axes`` moved last: a view when they already are."""
    order = tuple(d for d in range(x.ndim) if d not in axes) + tuple(axes)
    moved = x if order == tuple(range(x.ndim)) else permute(x, order)
    return ravel(moved)


@cuda.jit(device=True)
def block_sum(partial, value):
    """The sum of ``value`` over the block's threads (blockDim a power of 2), to every thread."""
    t = cuda.threadIdx.x
    partial[t] = value
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            partial[t] += partial[t + step]
        cuda.syncthreads()
        step //= 2
    total = partial[0]
    cuda.syncthreads()          # partial is written again by the next reduction
    return total


@cuda.jit(device=True)
def block_max(partial, value):
    """The max of ``value`` over the block's threads; a NaN wins, as in numpy."""
    t = cuda.threadIdx.x
    partial[t] = value
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            other = partial[t + step]
            if other > partial[t] or other != other:
                partial[t] = other
        cuda.syncthreads()
        step //= 2
    best = partial[0]
    cuda.syncthreads()
    return best


@per_dtype
def _sum_rows_kernel(nb_type, dtype):
    zero = dtype.type(0)

    @cuda.jit
    def sum_rows(out, x, n_cols):
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        for row in range(cuda.blockIdx.x, out.shape[0], cuda.gridDim.x):
            acc = zero
            for j in range(cuda.threadIdx.x, n_cols, ROW_THREADS):
                acc += x[row * n_cols + j]
            total = block_sum(partial, acc)
            if cuda.threadIdx.x == 0:
                out[row] = total

    return sum_rows


@per_dtype
def _max_rows_kernel(nb_type, dtype):
    @cuda.jit
    def max_rows(out, x, n_cols):
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        for row in range(cuda.blockIdx.x, out.shape[0], cuda.gridDim.x):
            acc = x[row * n_cols]        # every thread starts from the row's first entry: max is idempotent
            for j in range(cuda.threadIdx.x, n_cols, ROW_THREADS):
                v = x[row * n_cols + j]
                if v > acc or v != v:
                    acc = v
            best = block_max(partial, acc)
            if cuda.threadIdx.x == 0:
                out[row] = best

    return max_rows


def _reduce(x, axis, keepdims, kind):
    axes = _axes(axis, x.ndim)
    kept = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    shape = kept if keepdims else tuple(n for d, n in enumerate(x.shape) if d not in axes)
    dtype = np.sum(np.ones(1, x.dtype)).dtype if kind == "sum" else x.dtype
    n_cols = math.prod(x.shape[d] for d in axes)
    n_rows = math.prod(shape)
    if n_rows == 0:
        return empty(shape, dtype)
    if n_cols == 0:
        if kind == "max":
            raise ValueError("zero-size array to reduction operation maximum which has no identity")
        return zeros(shape, dtype)
    out = empty(shape, dtype)
    kernel = (_sum_rows_kernel if kind == "sum" else _max_rows_kernel)(dtype)
    launch(kernel, min(n_rows, MAX_BLOCKS), ROW_THREADS, ravel(out), _rows_last(x, axes), n_cols)
    return out


# The "sum" and "max" kernels are named sum_axes and _max here so that the builtins stay usable.
def sum_axes(x, axis, keepdims):
    return _reduce(x, axis, keepdims, "sum")


def _max(x, axis, keepdims):
    return _reduce(x, axis, keepdims, "max")


def sum_to(x, shape):
    """Sum ``x`` down to ``shape``: the backward of broadcasting ``shape`` up to x.shape."""
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, n in enumerate(shape) if n == 1 and x.shape[i + lead] != 1
    )
    return reshape(sum_axes(x, axes, True), shape)


# The tied maxima share dy evenly: a formula of the compiler's own, generated as the ops' are.
_SHARE = formulas.Formula("max_back_share", ("hit", "dy", "count"),
                          lambda sp, hit, dy, count: sp.Piecewise((dy / count, hit), (0, True)),
                          bools=("hit",), grads=False, source="Piecewise((dy / count, hit), (0, True))")


@functools.cache
def _kernels():
    equal = next(f for f in formulas.SELECTION if f.name == "eq")
    return build(formulas.plan(equal).forward), build(formulas.plan(_SHARE).forward)


def max_back(x, y_keep, dy_keep):
    """Gradient of max split evenly between tied maxima (the mean subgradient)."""
    equal, share = _kernels()
    hit = equal(x, y_keep)
    reduced = tuple(i for i, n in enumerate(y_keep.shape) if n == 1)
    count = sum_axes(hit, reduced, True)
    return share(hit, dy_keep, count)


# ---------------------------------------------------------------- the table

KERNELS = {"sum": sum_axes, "max": _max, "sum_to": sum_to, "max_back": max_back}
