"""Elementwise kernels on numpy arrays: built from the formulas (``formulas.py``), plus the
in-place add backward accumulates with."""

from __future__ import annotations

import math

import numpy as np

from ..formulas import Kernel
from ..source import compile_source


def add_(a, b):
    """a += b in place, returning a: backward sums a weight's gradients from every step
    into one buffer instead of allocating a new array per step.  (A sum of 0-d arrays is a
    numpy scalar, which cannot be written into: then a new one.)"""
    if isinstance(a, np.ndarray):
        return np.add(a, b, out=a)
    return np.add(a, b)


def _as(out, like):
    """``out`` in ``like``'s float dtype: a literal of a formula (the 0 of relu) must not
    widen float32 where numpy would promote it."""
    if like.dtype.kind != "f" or out.dtype == like.dtype:
        return out
    return out.astype(like.dtype)


def _full(value, *operands):
    """``value`` at every entry of the operands' broadcast shape, in the first float one's
    dtype: a kernel whose formula is a constant (a derivative zero everywhere)."""
    floats = [a.dtype for a in operands if np.asarray(a).dtype.kind == "f"]
    shape = np.broadcast_shapes(*(np.shape(a) for a in operands))
    return np.full(shape, value, floats[0] if floats else np.float64)


def _identity(dy):
    return dy


_math_erf = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    """The error function entry by entry, in ``x``'s float dtype.  numpy has none; the C
    library's, one Python call an entry, is exact to an ulp and slow, as fits the reference
    (the cpu and cuda devices compile ``math.erf`` into their kernels)."""
    x = np.asarray(x)
    return _math_erf(x).astype(x.dtype if x.dtype.kind == "f" else np.float64)


def build(kernel: Kernel):
    """A numpy function computing ``kernel``: numpy's own ufunc where the formula is exactly
    one (``a * b`` is ``np.multiply``), else the printed expression, one numpy call per
    operation."""
    if kernel.identity:
        return _identity
    if kernel.ufunc is not None:
        return getattr(np, kernel.ufunc)
    namespace = {"numpy": np, "_as": _as, "_erf": _erf, "_full": _full}
    compile_source(kernel.numpy, f"<kernel {kernel.name}>", namespace)
    return quiet_overflow(namespace[kernel.name]) if kernel.overflows else namespace[kernel.name]


def quiet_overflow(fn):
    """``fn`` with numpy's overflow warning off: inside a fused formula an infinity is an
    intermediate value (1/(1 + e^800) = 0), as in PyTorch's kernels; invalid results (NaN)
    and division by zero still warn."""

    def run(*args):
        with np.errstate(over="ignore"):
            return fn(*args)

    run.__name__ = fn.__name__
    return run


KERNELS = {"add_": add_}
