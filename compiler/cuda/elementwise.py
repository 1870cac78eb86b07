"""Elementwise maps and their backwards, from compiler/scalar.py's formulas; comparisons,
``where`` and the in-place add."""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import scalar
from .device import (
    THREADS,
    _at,
    _blocks,
    _broadcast_strides,
    _collapse,
    _empty,
    _flat,
    _launch,
    _result_dtype,
    _strides,
)


def _map_kernel(fn):
    f = cuda.jit(device=True)(fn)

    @cuda.jit
    def map_run(out, a):
        for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[i] = f(a[i])

    return map_run


def _map_param_kernel(fn):
    f = cuda.jit(device=True)(fn)

    @cuda.jit
    def map_param_run(out, a, param):
        for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[i] = f(a[i], param)

    return map_param_run


def _zip_kernel(fn):
    f = cuda.jit(device=True)(fn)

    @cuda.jit
    def zip_run(out, a, a_strides, b, b_strides, shape):
        for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[i] = f(a[_at(i, shape, a_strides)], b[_at(i, shape, b_strides)])

    return zip_run


def _zip_param_kernel(fn):
    f = cuda.jit(device=True)(fn)

    @cuda.jit
    def zip_param_run(out, a, a_strides, b, b_strides, shape, param):
        for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[i] = f(a[_at(i, shape, a_strides)], b[_at(i, shape, b_strides)], param)

    return zip_param_run


def _zip3_kernel(fn):
    f = cuda.jit(device=True)(fn)

    @cuda.jit
    def zip3_run(out, a, a_strides, b, b_strides, c, c_strides, shape):
        for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[i] = f(a[_at(i, shape, a_strides)], b[_at(i, shape, b_strides)],
                       c[_at(i, shape, c_strides)])

    return zip3_run


def _broadcast_launch(kernel, out_dtype, arrays, params=()):
    """Run a zip kernel over the broadcast shape of ``arrays``; returns the output."""
    shape = tuple(np.broadcast_shapes(*(tuple(a.shape) for a in arrays)))
    out = _empty(shape, out_dtype)
    if out.size:
        dims, strides = _collapse(shape, *(_broadcast_strides(a.shape, shape) for a in arrays))
        operands = [x for a, st in zip(arrays, strides, strict=True) for x in (_flat(a), st)]
        _launch(kernel, _blocks(out.size), THREADS, _flat(out), *operands, dims, *params)
    return out


def _map(name):
    kernel = _map_kernel(scalar.MAPS[name])

    def run(x):
        out = _empty(x.shape, _result_dtype(name, (x.dtype,)))
        if out.size:
            _launch(kernel, _blocks(out.size), THREADS, _flat(out), _flat(x))
        return out

    run.__name__ = name
    return run


def _zip(name):
    kernel = _zip_kernel(scalar.ZIPS[name]) if name in scalar.ZIPS else _zip3_kernel(scalar.ZIPS3[name])

    def run(*arrays):
        return _broadcast_launch(kernel, _result_dtype(name, tuple(a.dtype for a in arrays)), arrays)

    run.__name__ = name
    return run


_add_kernel = _zip_kernel(scalar.add)


def add_(a, b):
    """a += b in place (a contiguous; b broadcasts to a's shape), returning a."""
    if a.size:
        dims, (a_strides, b_strides) = _collapse(a.shape, _strides(a.shape),
                                                 _broadcast_strides(b.shape, a.shape))
        flat = _flat(a)
        _launch(_add_kernel, _blocks(a.size), THREADS, flat, flat, a_strides, _flat(b), b_strides, dims)
    return a


_leaky_relu_kernel = _map_param_kernel(scalar.leaky_relu)
_leaky_relu_back_kernel = _zip_param_kernel(scalar.leaky_relu_back)


def leaky_relu(x, negative_slope):
    out = _empty(x.shape, x.dtype)
    if out.size:
        slope = x.dtype.type(negative_slope)
        _launch(_leaky_relu_kernel, _blocks(out.size), THREADS, _flat(out), _flat(x), slope)
    return out


def leaky_relu_back(x, dy, negative_slope):
    return _broadcast_launch(_leaky_relu_back_kernel, dy.dtype, (x, dy), (dy.dtype.type(negative_slope),))


# Comparisons give bool; max_back finds the tied maxima with it.
_equal = _zip("eq")


# ---------------------------------------------------------------- the table

KERNELS = {
    "add_": add_,
    **{name: _map(name) for name in scalar.MAPS},
    **{name: _zip(name) for name in scalar.ZIPS if name != "eq"}, "eq": _equal,
    **{name: _zip(name) for name in scalar.ZIPS3},
    "leaky_relu": leaky_relu, "leaky_relu_back": leaky_relu_back,
}
