"""Ops that move or select data without arithmetic: reshape, permute, expand, indexing,
concatenation and stacking.  Their backwards route gradients back to where data came from."""

from __future__ import annotations

import math

import numpy as np

from ..autograd import DeferredGrad, Example, Op, register
from ..shapes import broadcasts_to
from ._common import check_same_dtype, normalize_axis, uniform


@register
class Reshape(Op):
    """y = x viewed with a new ``shape`` (one entry may be -1)"""

    kernels = ("reshape",)

    @staticmethod
    def symbolic(sp, x, shape):
        return np.reshape(x, shape)

    def forward(self, x):
        shape = tuple(int(n) for n in self.shape)
        unknown = [i for i, n in enumerate(shape) if n == -1]
        known = math.prod(n for n in shape if n != -1)
        if len(unknown) > 1 or any(n < -1 for n in shape):
            self.fail(f"invalid target shape {shape} for input of shape {tuple(x.shape)}")
        if unknown:
            if known == 0 or x.size % known:
                self.fail(f"cannot reshape {tuple(x.shape)} ({x.size} elements) to {shape}")
            shape = shape[: unknown[0]] + (x.size // known,) + shape[unknown[0] + 1 :]
        if math.prod(shape) != x.size:
            self.fail(f"cannot reshape {tuple(x.shape)} ({x.size} elements) to {shape}")
        self.set_attr("shape", shape)
        self.saved = (x.shape,)
        return self.backend.reshape(x, shape)

    def backward(self, dy):
        (shape,) = self.saved
        return (self.backend.reshape(dy, shape),)

    @classmethod
    def examples(cls):
        return [Example((uniform(300, 2, 3),), {"shape": (3, 2)}),
                Example((uniform(301, 2, 3, 2),), {"shape": (-1, 2)})]


@register
class Permute(Op):
    """y = x with its axes reordered: y.shape[i] = x.shape[axes[i]]"""

    kernels = ("permute",)

    @staticmethod
    def symbolic(sp, x, axes):
        return np.transpose(x, axes)

    def forward(self, x):
        axes = tuple(int(a) + x.ndim if a < 0 else int(a) for a in self.axes)
        if sorted(axes) != list(range(x.ndim)):
            self.fail(f"axes {tuple(self.axes)} are not a permutation of the {x.ndim} axes "
                      f"of shape {tuple(x.shape)}")
        self.set_attr("axes", axes)
        return self.backend.permute(x, axes)

    def backward(self, dy):
        inverse = tuple(int(i) for i in np.argsort(self.axes))
        return (self.backend.permute(dy, inverse),)

    @classmethod
    def examples(cls):
        return [Example((uniform(310, 2, 3),), {"axes": (1, 0)}),
                Example((uniform(311, 2, 3, 2),), {"axes": (2, 0, 1)})]


@register
class Expand(Op):
    """y = x broadcast to ``shape`` (size-1 axes repeat, new axes appear in front)"""

    kernels = ("broadcast_to", "sum_to")

    @staticmethod
    def symbolic(sp, x, shape):
        return np.broadcast_to(x, shape)

    def forward(self, x):
        shape = tuple(int(n) for n in self.shape)
        if not broadcasts_to(x.shape, shape):
            self.fail(f"cannot expand shape {tuple(x.shape)} to {shape}")
        self.set_attr("shape", shape)
        self.saved = (x.shape,)
        return self.backend.broadcast_to(x, shape)

    def backward(self, dy):
        (shape,) = self.saved
        return (self.backend.sum_to(dy, shape),)

    @classmethod
    def examples(cls):
        return [Example((uniform(320, 1, 3),), {"shape": (2, 3)}),
                Example((uniform(321, 3, 1),), {"shape": (2, 3, 4)})]


@register
class GetItem(Op):
    """y = x[index]  (ints, slices, None, Ellipsis, integer and boolean arrays)"""

    kernels = ("getitem", "getitem_back")

    @staticmethod
    def symbolic(sp, x, index):
        return np.asarray(x, dtype=object)[index]

    def forward(self, x):
        try:
            y = self.backend.getitem(x, self.index)
        except IndexError as err:
            self.fail(f"index {_describe(self.index)} is invalid for shape {tuple(x.shape)}: {err}")
        self.saved = (x.shape,)
        return y

    def backward(self, dy):
        (shape,) = self.saved
        # Scatter-add: an entry picked twice by an integer array gets both gradients.
        return (self.backend.getitem_back(shape, self.index, dy),)

    @classmethod
    def examples(cls):
        x = uniform(330, 3, 4)
        return [Example((x,), {"index": (slice(0, 2), 1)}),
                Example((x,), {"index": (np.array([2, 0, 2]),)}),
                Example((x,), {"index": (slice(None), slice(None, None, -2))}),
                Example((x,), {"index": (x > 0,)})]


def _describe(index) -> str:
    parts = index if isinstance(index, tuple) else (index,)
    out = []
    for p in parts:
        if isinstance(p, np.ndarray):
            out.append(f"array(shape={p.shape}, dtype={p.dtype})")
        else:
            out.append(repr(p))
    return "[" + ", ".join(out) + "]"


def _check_pieces(op, xs, axis: int, same_shape: bool) -> None:
    check_same_dtype(op, *xs)
    first = xs[0].shape
    rest = first[:axis] + first[axis + 1:]
    for x in xs[1:]:
        if x.ndim != len(first):
            op.fail(f"inputs have different numbers of axes: {[tuple(x.shape) for x in xs]}")
        if x.shape[:axis] + x.shape[axis + 1:] != rest or (same_shape and first != x.shape):
            where = "" if same_shape else f" except along axis {axis}"
            op.fail(f"input shapes must match{where}: {[tuple(x.shape) for x in xs]}")


@register
class Cat(Op):
    """y = concatenation of the inputs along ``axis``"""

    kernels = ("cat", "split")

    @staticmethod
    def symbolic(sp, *xs, axis):
        return np.concatenate([np.asarray(x, dtype=object) for x in xs], axis=axis)

    def forward(self, *xs):
        axis = normalize_axis(self, self.axis, xs[0].ndim)
        self.set_attr("axis", axis)
        _check_pieces(self, xs, axis, same_shape=False)
        self.saved = ([x.shape[axis] for x in xs],)
        return self.backend.cat(list(xs), axis)

    def backward(self, dy):
        (sizes,) = self.saved
        return tuple(self.backend.split(dy, sizes, self.axis))

    @classmethod
    def examples(cls):
        return [Example((uniform(340, 2, 3), uniform(341, 1, 3)), {"axis": 0}),
                Example((uniform(342, 2, 1), uniform(343, 2, 2), uniform(344, 2, 1)), {"axis": 1})]


@register
class Stack(Op):
    """y = the inputs stacked along a new ``axis``"""

    kernels = ("reshape", "split", "stack")

    @staticmethod
    def symbolic(sp, *xs, axis):
        return np.stack([np.asarray(x, dtype=object) for x in xs], axis=axis)

    def forward(self, *xs):
        axis = normalize_axis(self, self.axis, xs[0].ndim + 1)
        self.set_attr("axis", axis)
        _check_pieces(self, xs, -1, same_shape=True)
        self.saved = (xs[0].shape,)
        return self.backend.stack(list(xs), axis)

    def backward(self, dy):
        (shape,) = self.saved
        pieces = self.backend.split(dy, [1] * dy.shape[self.axis], self.axis)
        return tuple(self.backend.reshape(p, shape) for p in pieces)

    @classmethod
    def examples(cls):
        return [Example((uniform(350, 2, 3), uniform(351, 2, 3)), {"axis": 0}),
                Example((uniform(352, 3), uniform(353, 3), uniform(354, 3)), {"axis": -1})]


class Pieces:
    """What the pieces of one cut share: their gradients, gathered as each piece's backward
    runs, so the cut input's gradient is one ``cat`` of them (zeros for a piece that got
    none), where a slice per piece would make each a zero-filled input-sized gradient and
    backward add them up."""

    __slots__ = ("grads", "backend", "axis", "shapes", "dtype")

    def __init__(self, count: int):
        self.grads: list = [None] * count

    def gathered(self):
        """The input's gradient: the pieces' gradients concatenated, read once per backward."""
        kb, grads = self.backend, self.grads
        self.grads = [None] * len(grads)            # the next backward starts empty
        parts = [kb.zeros(shape, self.dtype) if g is None else g
                 for g, shape in zip(grads, self.shapes, strict=True)]
        return parts[0] if len(parts) == 1 else kb.cat(parts, self.axis)

    def __repr__(self) -> str:
        return f"Pieces({len(self.grads)})"


def _gathered(pieces: Pieces):
    return pieces.gathered()


@register
class Split(Op):
    """y = piece ``index`` of x cut along ``axis`` into pieces of ``sizes``:
    x[..., s : s + sizes[index], ...] with s = sizes[0] + ... + sizes[index - 1].

    ``split`` makes every piece of one cut, sharing a ``Pieces``: the input's gradient is then
    one concatenation of the pieces' gradients (a deferred gradient every piece's backward
    joins), not a zero-filled input-sized array per piece added up, as slicing gives.
    """

    kernels = ("cat", "getitem", "zeros")

    @staticmethod
    def symbolic(sp, x, sizes, axis, index, pieces=None):
        x = np.asarray(x, dtype=object)
        start = sum(sizes[:index])
        return np.take(x, np.arange(start, start + sizes[index]), axis=axis)

    def forward(self, x):
        axis = normalize_axis(self, self.axis, x.ndim)
        sizes = tuple(int(n) for n in self.sizes)
        if any(n < 0 for n in sizes) or sum(sizes) != x.shape[axis]:
            self.fail(f"sizes {sizes} must be >= 0 and add up to axis {axis} of shape {tuple(x.shape)}")
        if not 0 <= int(self.index) < len(sizes):
            self.fail(f"index {self.index} is not one of the {len(sizes)} pieces", IndexError)
        self.set_attr("axis", axis)
        self.set_attr("sizes", sizes)
        pieces = getattr(self, "pieces", None)
        if pieces is None:                          # a lone piece: a cut of its own
            pieces = self.pieces = Pieces(len(sizes))
        pieces.backend, pieces.axis, pieces.dtype = self.backend, axis, x.dtype
        pieces.shapes = [x.shape[:axis] + (n,) + x.shape[axis + 1:] for n in sizes]
        start = sum(sizes[:self.index])
        index = (slice(None),) * axis + (slice(start, start + sizes[self.index]),)
        self.saved = (x.shape,)
        return self.backend.getitem(x, index)

    def backward(self, dy):
        (shape,) = self.saved
        self.pieces.grads[self.index] = dy
        # One deferred gradient per cut: the siblings' join it (same fn, extras, shape), and
        # it is read, one cat, only once every piece's backward has run.
        return (DeferredGrad(self.backend, _gathered, shape, (), (self.pieces,)),)

    @classmethod
    def examples(cls):
        return [Example((uniform(360, 2, 5),), {"sizes": (2, 3), "axis": 1, "index": 1}),
                Example((uniform(361, 3, 2),), {"sizes": (1, 1, 1), "axis": 0, "index": 0}),
                Example((uniform(362, 2, 6),), {"sizes": (2, 2, 2), "axis": -1, "index": 2})]


def split(x, sizes, axis: int = -1) -> list:
    """x cut along ``axis`` into pieces of ``sizes`` (Tensors), whose gradients backward
    concatenates once (see ``Split``)."""
    pieces = Pieces(len(sizes))
    return [Split.apply(x, sizes=tuple(sizes), axis=axis, index=i, pieces=pieces) for i in range(len(sizes))]
