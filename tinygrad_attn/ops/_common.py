"""Helpers shared by the op modules: validation that names the op, symbolic helpers, and
deterministic example inputs for ``ta.check.ops()``."""

from __future__ import annotations

import numpy as np

from ..autograd import DTypeError
from ..shapes import batch_shape


def check_same_dtype(op, *arrays) -> None:
    first = arrays[0].dtype
    for a in arrays:                 # a loop, not any(genexpr): this runs for most nodes
        if a.dtype != first:
            detail = " and ".join(f"{a.dtype} {tuple(a.shape)}" for a in arrays)
            op.fail(f"dtype mismatch: {detail}; convert one with .float() or .double()", DTypeError)


def check_float(op, x, what: str = "input") -> None:
    if x.dtype.kind != "f":
        op.fail(f"{what} must be a float tensor, got {x.dtype} of shape {tuple(x.shape)}", DTypeError)


def check_integer(op, x, what: str) -> None:
    if x.dtype.kind not in "iu":
        op.fail(f"{what} must be an integer tensor, got {x.dtype} of shape {tuple(x.shape)}", DTypeError)


def check_bool(op, x, what: str) -> None:
    if x.dtype != np.bool_:
        op.fail(f"{what} must be a boolean tensor, got {x.dtype} of shape {tuple(x.shape)}", DTypeError)


def broadcast_shape(op, *arrays) -> tuple[int, ...]:
    try:
        return batch_shape(*(a.shape for a in arrays))
    except ValueError:
        shapes = " and ".join(str(tuple(a.shape)) for a in arrays)
        op.fail(f"shapes {shapes} do not broadcast")


def normalize_axes(op, axis, ndim: int) -> tuple[int, ...] | None:
    """``axis`` (None, int or sequence, negatives allowed) as a sorted tuple of
    non-negative axes, or None for all axes; out-of-range axes name the op."""
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            op.fail(f"axis {a} is out of range for a {ndim}-d input")
        out.append(int(a) % max(ndim, 1))
    if len(set(out)) != len(out):
        op.fail(f"repeated axis in {axis}")
    return tuple(sorted(out))


def normalize_axis(op, axis: int, ndim: int) -> int:
    (a,) = normalize_axes(op, int(axis), ndim)
    return a


def kept_shape(shape, axes) -> tuple[int, ...]:
    """``shape`` with the reduced ``axes`` (None = all) kept as size 1."""
    if axes is None:
        return (1,) * len(shape)
    return tuple(1 if i in axes else n for i, n in enumerate(shape))


# ---------------------------------------------------------------- symbolic helpers


def elementwise(fn, x):
    """Apply a sympy function to every entry of an object array."""
    return np.frompyfunc(fn, 1, 1)(x)


def reduce_rows(x, axes, keepdims: bool, fn):
    """Apply ``fn(*entries)`` (e.g. sympy.Max) over ``axes`` of an object array."""
    x = np.asarray(x, dtype=object)
    axes = tuple(range(x.ndim)) if axes is None else axes
    rest = [i for i in range(x.ndim) if i not in axes]
    moved = np.transpose(x, rest + list(axes))
    rows = moved.reshape(tuple(x.shape[i] for i in rest) + (-1,))
    out = np.empty(rows.shape[:-1], dtype=object)
    for index in np.ndindex(out.shape):
        out[index] = fn(*rows[index])
    if keepdims:
        out = out.reshape(kept_shape(x.shape, axes))
    return out


# ---------------------------------------------------------------- example inputs


def uniform(seed: int, *shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """Deterministic float64 inputs for an op's examples."""
    return np.random.default_rng(seed).uniform(low, high, size=shape)


def distinct(seed: int, *shape: int) -> np.ndarray:
    """Float64 inputs with no ties, entries 0.37 apart and none within 0.09 of zero (for
    max and relu, whose derivatives jump at ties and at 0)."""
    n = int(np.prod(shape))
    values = (np.random.default_rng(seed).permutation(n) - (n - 1) / 2 + 0.25) * 0.37
    return values.reshape(shape)


def number(sp, value: float):
    """A float as the exact sympy number the kernels use: integers stay integers, other
    floats keep their binary value (30 digits), infinities become oo."""
    value = float(value)
    if np.isinf(value):
        return sp.oo if value > 0 else -sp.oo
    return sp.Integer(int(value)) if value.is_integer() else sp.Float(value, 30)


_STOP_GRADIENT = None


def stop_gradient(sp, expr):
    """A sympy expression equal to ``expr`` whose derivative is zero (``detach`` in the
    symbolic world): how an op states that part of its input gets no gradient."""
    global _STOP_GRADIENT
    if _STOP_GRADIENT is None:

        class StopGradient(sp.Function):
            @classmethod
            def eval(cls, x):
                if x.is_number:
                    return x
                return None

            def fdiff(self, argindex=1):
                return sp.Integer(0)

        _STOP_GRADIENT = StopGradient
    return _STOP_GRADIENT(expr)
