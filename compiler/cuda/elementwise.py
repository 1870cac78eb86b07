"""Elementwise kernels built from the formulas (``formulas.py``), and the in-place add.

A formula's printed scalar function becomes a device function; a kernel around it runs one
thread per output entry in a grid-stride loop.  Operands broadcast as numpy's do: each is
read through its own strides, 0 along broadcast axes, so nothing is expanded in memory.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from .. import reference
from ..formulas import Kernel
from ..source import compile_source
from .device import THREADS, broadcast_strides, c_strides, collapse, empty, launch, nblocks, pos_at, ravel


def _launcher_source(arrays: int, params: int, same_shape: bool) -> str:
    """The kernel around device function ``f``: every operand flat, broadcast ones read
    through their strides (``same_shape``: one operand the output's shape, read directly)."""
    names = [f"a{i}" for i in range(arrays)]
    scalars = [f"p{i}" for i in range(params)]
    if same_shape:
        signature = ["out", *names, *scalars]
        reads = [f"{n}[i]" for n in names]
    else:
        signature = ["out", *(x for n in names for x in (n, f"{n}c_strides")), "shape", *scalars]
        reads = [f"{n}[pos_at(i, shape, {n}c_strides)]" for n in names]
    return (f"def run({', '.join(signature)}):\n"
            f"    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):\n"
            f"        out[i] = f({', '.join([*reads, *scalars])})\n")


def _compile(kernel: Kernel, same_shape: bool):
    namespace = {"math": math}
    compile_source(kernel.scalar, f"<kernel {kernel.name}>", namespace)
    scope = {"cuda": cuda, "pos_at": pos_at, "f": cuda.jit(device=True)(namespace[kernel.name])}
    compile_source(_launcher_source(len(kernel.args), len(kernel.params), same_shape),
                   f"<kernel {kernel.name} launcher>", scope)
    return cuda.jit(scope["run"])


def _broadcast_launch(kernel, out_dtype, arrays, params=()):
    """Run a broadcasting kernel over the broadcast shape of ``arrays``; returns the output."""
    shape = tuple(np.broadcast_shapes(*(tuple(a.shape) for a in arrays)))
    out = empty(shape, out_dtype)
    if out.size:
        dims, strides = collapse(shape, *(broadcast_strides(a.shape, shape) for a in arrays))
        operands = [x for a, st in zip(arrays, strides, strict=True) for x in (ravel(a), st)]
        launch(kernel, nblocks(out.size), THREADS, ravel(out), *operands, dims, *params)
    return out


def build(kernel: Kernel):
    """A function of device arrays (and scalar parameters) computing ``kernel``."""
    if kernel.identity:
        return reference.elementwise.build(kernel)       # dy itself: nothing to launch
    on_host = reference.elementwise.build(kernel)
    count = len(kernel.args)

    @functools.cache
    def out_dtype(dtypes):
        # What numpy gives for these dtypes (int / int is float64, comparisons bool).
        with np.errstate(all="ignore"):
            ones = [np.ones(1, d) for d in dtypes]
            return np.asarray(on_host(*ones, *[1.0] * len(kernel.params))).dtype

    mapped = _compile(kernel, same_shape=True) if count == 1 else None
    broadcast = _compile(kernel, same_shape=False) if count > 1 else None

    def run(*operands):
        arrays, params = operands[:count], operands[count:]
        dtype = out_dtype(tuple(a.dtype for a in arrays))
        if params:      # in the arrays' float type, as the host kernels compute them
            params = tuple(dtype.type(p) for p in params) if dtype.kind == "f" else params
        if mapped is not None:
            (x,) = arrays
            out = empty(x.shape, dtype)
            if out.size:
                launch(mapped, nblocks(out.size), THREADS, ravel(out), ravel(x), *params)
            return out
        return _broadcast_launch(broadcast, dtype, arrays, params)

    run.__name__ = kernel.name
    return run


@cuda.jit
def _add_into(out, out_strides, b, b_strides, shape):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[pos_at(i, shape, out_strides)] += b[pos_at(i, shape, b_strides)]


def add_(a, b):
    """a += b in place (a contiguous; b broadcasts to a's shape), returning a."""
    if a.size:
        dims, (a_strides, b_strides) = collapse(a.shape, c_strides(a.shape),
                                                 broadcast_strides(b.shape, a.shape))
        launch(_add_into, nblocks(a.size), THREADS, ravel(a), a_strides, ravel(b), b_strides, dims)
    return a


KERNELS = {"add_": add_}
