"""Reductions over axes: sum, mean, max (with ``keepdims`` as in numpy)."""

from __future__ import annotations

import math

import numpy as np

from ..autograd import Example, Op, register
from ._common import distinct, kept_shape, normalize_axes, reduce_rows, uniform


def _examples(seed: int, values=uniform) -> list[Example]:
    return [
        Example((values(seed, 2, 3),), {"axis": None, "keepdims": False}),
        Example((values(seed + 1, 2, 3),), {"axis": (1,), "keepdims": False}),
        Example((values(seed + 2, 2, 3, 2),), {"axis": (0, 2), "keepdims": True}),
    ]


def _symbolic_sum(x, axis, keepdims):
    return np.sum(np.asarray(x, dtype=object), axis=axis, keepdims=keepdims)


@register
class Sum(Op):
    """y = sum of x over ``axis`` (all axes when None)"""

    kernels = ("broadcast_to", "reshape", "sum")

    @staticmethod
    def symbolic(sp, x, axis, keepdims):
        return _symbolic_sum(x, axis, keepdims)

    def forward(self, x):
        axes = normalize_axes(self, self.axis, x.ndim)
        self.set_attr("axis", axes)
        self.saved = (x.shape, axes)
        return self.backend.sum(x, axes, self.keepdims)

    def backward(self, dy):
        shape, axes = self.saved
        k = self.backend
        return (k.broadcast_to(k.reshape(dy, kept_shape(shape, axes)), shape),)

    @classmethod
    def examples(cls):
        return _examples(200)


@register
class Mean(Op):
    """y = mean of x over ``axis`` (all axes when None)"""

    kernels = ("broadcast_to", "div", "full", "reshape", "sum")

    @staticmethod
    def symbolic(sp, x, axis, keepdims):
        count = x.size if axis is None else math.prod(x.shape[a] for a in axis)
        return _symbolic_sum(x, axis, keepdims) / sp.Integer(count)

    def forward(self, x):
        axes = normalize_axes(self, self.axis, x.ndim)
        self.set_attr("axis", axes)
        count = x.size if axes is None else math.prod(x.shape[a] for a in axes)
        if count == 0:
            self.fail(f"mean over an empty axis of shape {tuple(x.shape)}")
        self.saved = (x.shape, axes, count)
        total = self.backend.sum(x, axes, self.keepdims)
        return self.backend.div(total, self.backend.full((), count, x.dtype))

    def backward(self, dy):
        shape, axes, count = self.saved
        k = self.backend
        dy = k.div(dy, k.full((), count, dy.dtype))
        return (k.broadcast_to(k.reshape(dy, kept_shape(shape, axes)), shape),)

    @classmethod
    def examples(cls):
        return _examples(210)


@register
class Max(Op):
    """y = max of x over ``axis``; tied maxima share the gradient equally."""

    kernels = ("max", "max_back", "reshape")

    @staticmethod
    def symbolic(sp, x, axis, keepdims):
        return reduce_rows(x, axis, keepdims, sp.Max)

    def forward(self, x):
        axes = normalize_axes(self, self.axis, x.ndim)
        self.set_attr("axis", axes)
        if x.size == 0:
            self.fail(f"max of an empty tensor of shape {tuple(x.shape)}")
        y = self.backend.max(x, axes, self.keepdims)
        self.saved = (x, self.backend.reshape(y, kept_shape(x.shape, axes)), axes)
        return y

    def backward(self, dy):
        x, y_keep, axes = self.saved
        k = self.backend
        return (k.max_back(x, y_keep, k.reshape(dy, kept_shape(x.shape, axes))),)

    @classmethod
    def examples(cls):
        # No ties: the derivative of max is only defined where the maximum is unique.
        return _examples(220, values=distinct)
