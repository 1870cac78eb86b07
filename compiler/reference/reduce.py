"""Reductions: sum, sum_to (a gradient summed back to an input's shape), max and its
backward."""

from __future__ import annotations

import numpy as np


def sum(x, axis, keepdims):  # noqa: A001
    return x.sum(axis=axis, keepdims=keepdims)


def sum_to(x, shape):
    """Sum ``x`` down to ``shape``: the backward of broadcasting ``shape`` up to x.shape."""
    if x.shape == tuple(shape):
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, n in enumerate(shape) if n == 1 and x.shape[i + lead] != 1
    )
    return np.sum(x, axis=axes, keepdims=True).reshape(shape)


def max(x, axis, keepdims):  # noqa: A001
    return np.max(x, axis=axis, keepdims=keepdims)


def max_back(x, y_keep, dy_keep):
    """Gradient of max split evenly between tied maxima (the mean subgradient).

    y_keep and dy_keep have the reduced axes kept (size 1), so they broadcast against x.
    """
    hit = x == y_keep
    reduced = tuple(i for i, n in enumerate(y_keep.shape) if n == 1)
    count = np.sum(hit, axis=reduced, keepdims=True)
    return np.where(hit, dy_keep / count, 0).astype(x.dtype, copy=False)


KERNELS = {"sum": sum, "sum_to": sum_to, "max": max, "max_back": max_back}
