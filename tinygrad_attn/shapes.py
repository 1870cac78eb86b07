"""Shape helpers the ops and the attention functions share: broadcasting as numpy does it,
without numpy's Python overhead on the hot path, and the size of an axis of any device's
array."""

from __future__ import annotations

import numpy as np

__all__ = ["batch_shape", "broadcasts_to", "dim"]


def batch_shape(*shapes) -> tuple[int, ...]:
    """np.broadcast_shapes, without its ~1.5 us when the shapes are equal (the usual case:
    a decoder step calls this a few times).  Raises ValueError like it."""
    first = tuple(shapes[0])
    if all(tuple(s) == first for s in shapes[1:]):
        return first
    return tuple(np.broadcast_shapes(*shapes))


def broadcasts_to(shape, target) -> bool:
    """Whether ``shape`` broadcasts to ``target`` without enlarging it (masks, expand)."""
    if tuple(shape) == tuple(target):
        return True
    try:
        return tuple(np.broadcast_shapes(tuple(shape), tuple(target))) == tuple(target)
    except ValueError:
        return False


def dim(x, axis: int) -> int:
    """The size of ``x`` along ``axis``, counted from the end when negative (torch's
    ``x.size(axis)``), for an array of any device.

    Ops call this instead of ``x.shape[-1]``: a device array's shape may refuse negative
    indexes (Numba's CUDA simulator's does, as shapes inside CUDA kernels do)."""
    return x.shape[axis + x.ndim if axis < 0 else axis]
