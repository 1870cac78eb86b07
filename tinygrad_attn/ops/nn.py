"""Neural-network ops: the softmax family, fused losses, embedding lookup, dropout and layer
normalisation.

Softmax-type ops subtract the row maximum before exp, so logits of 1e4 never overflow.
A row that is entirely -inf (every position masked) gives zeros from softmax and -inf from
log_softmax (the log of those zeros), never NaN, and finite gradients.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..autograd import DeferredGrad, Example, Op, ShapeError, register
from ..compiler import reference
from ..shapes import dim
from ._common import (
    check_float,
    check_integer,
    check_same_dtype,
    elementwise,
    normalize_axis,
    number,
    stop_gradient,
    uniform,
)
from .elementwise import Elementwise

_NO_IGNORE = np.iinfo(np.int64).min  # ignore_index=None: a class id no target can have


def _symbolic_log_softmax(sp, x, axis):
    x = np.asarray(x, dtype=object)
    total = np.sum(elementwise(sp.exp, x), axis=axis, keepdims=True)
    return x - elementwise(sp.log, total)


@register
class Softmax(Op):
    """y_i = exp(x_i) / sum_j exp(x_j) along ``axis``"""

    kernels = ("softmax", "softmax_back", "zeros")

    @staticmethod
    def symbolic(sp, x, axis):
        e = elementwise(sp.exp, np.asarray(x, dtype=object))
        return e / np.sum(e, axis=axis, keepdims=True)

    def forward(self, x):
        check_float(self, x)
        self.set_attr("axis", normalize_axis(self, self.axis, x.ndim))
        # The softmax over an empty axis is empty (the kernels' max has no identity).
        y = self.backend.softmax(x, self.axis) if x.size else self.backend.zeros(x.shape, x.dtype)
        self.saved = (y,)
        return y

    def backward(self, dy):
        (y,) = self.saved
        return (self.backend.softmax_back(y, dy, self.axis),)

    @classmethod
    def examples(cls):
        return [Example((uniform(500, 2, 3),), {"axis": 1}),
                Example((uniform(501, 3, 2),), {"axis": 0})]


@register
class LogSoftmax(Op):
    """y_i = x_i - log sum_j exp(x_j) along ``axis``"""

    kernels = ("log_softmax", "log_softmax_back", "zeros")

    @staticmethod
    def symbolic(sp, x, axis):
        return _symbolic_log_softmax(sp, x, axis)

    def forward(self, x):
        check_float(self, x)
        self.set_attr("axis", normalize_axis(self, self.axis, x.ndim))
        y = self.backend.log_softmax(x, self.axis) if x.size else self.backend.zeros(x.shape, x.dtype)
        self.saved = (y,)
        return y

    def backward(self, dy):
        (y,) = self.saved
        return (self.backend.log_softmax_back(y, dy, self.axis),)

    @classmethod
    def examples(cls):
        return [Example((uniform(510, 2, 3),), {"axis": 1}),
                Example((uniform(511, 3, 2),), {"axis": 0})]


# ---------------------------------------------------------------- losses


def _check_targets(op, scores, target, ignore_index) -> None:
    """Targets (...) index classes on the last axis of scores (..., C)."""
    check_float(op, scores, "scores")
    check_integer(op, target, "target")
    if scores.ndim == 0 or tuple(target.shape) != tuple(scores.shape[:-1]):
        op.fail(f"target shape {tuple(target.shape)} must equal the scores shape without its "
                f"class axis: scores {tuple(scores.shape)} -> target {tuple(scores.shape[:-1])}")
    classes = dim(scores, -1)
    # A guard kernel, not a host read: the capture runs it again at every replay.
    op.backend.guard_ids(target, classes, ignore_index,
                         functools.partial(_bad_target, op.name, classes, tuple(scores.shape), ignore_index))


def _bad_target(where: str, classes: int, scores_shape: tuple, ignore_index: int, target) -> None:
    """Raise ShapeError naming the first target (a host array) outside [0, classes)."""
    bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
    value = int(target[bad][0])
    raise ShapeError(f"{where}: target value {value} is outside [0, {classes}) for scores of shape "
                     f"{scores_shape}")


def _flatten(op, scores, target):
    """Validate, then flatten scores (..., C) -> (N, C) and targets (...) -> (N,).

    Returns (scores2, target1, ignore, count): the sentinel standing for ignore_index and,
    for 'mean', the number of rows not ignored (a 0-d int64 array a kernel counted; None for
    the other reductions)."""
    _check_reduction(op)
    ignore = _NO_IGNORE if op.ignore_index is None else op.ignore_index
    _check_targets(op, scores, target, ignore)
    k = op.backend
    scores2 = k.reshape(scores, (-1, dim(scores, -1)))        # (N, C)
    target1 = k.reshape(target, (-1,))                          # (N,)
    count = k.count_ne(target1, ignore) if op.reduction == "mean" else None
    return scores2, target1, ignore, count


def _reduce(k, rows, divisor, reduction: str, shape):
    """Per-row losses (N,) -> the requested reduction.  'mean' divides by ``divisor``,
    max(rows not ignored, 1) as a 0-d array: with every row ignored the mean is 0, not NaN."""
    if reduction == "none":
        return k.reshape(rows, shape)
    total = k.sum(rows, None, False)
    if reduction == "sum":
        return total
    return k.div(total, divisor)


def _row_grads(k, dy, count, divisor, reduction: str, n: int):
    if reduction == "none":
        return k.reshape(dy, (n,))
    if reduction == "mean":
        # The forward's divisor, unless the gradient arrives in another dtype.
        dy = k.div(dy, divisor if divisor.dtype == dy.dtype else k.clamp_divisor(count, dy.dtype))
    return k.broadcast_to(k.reshape(dy, (1,)), (n,))


def _divisor(k, count, dtype):
    return None if count is None else k.clamp_divisor(count, dtype)


def _symbolic_nll(sp, logp, target, ignore_index, reduction):
    """-logp[target] per row of (..., C) log-probabilities, ignored rows 0, then reduced."""
    logp = np.asarray(logp, dtype=object)
    flat, t = logp.reshape(-1, dim(logp, -1)), np.asarray(target).reshape(-1)
    keep = t != (_NO_IGNORE if ignore_index is None else ignore_index)
    rows = [-flat[i, t[i]] if keep[i] else sp.Integer(0) for i in range(len(t))]
    if reduction == "none":
        return np.asarray(rows, dtype=object).reshape(np.shape(target))
    total = sp.Add(*rows)
    return total if reduction == "sum" else total / max(int(np.sum(keep)), 1)


def _check_reduction(op) -> None:
    if op.reduction not in ("mean", "sum", "none"):
        op.fail(f"reduction must be 'mean', 'sum' or 'none', got {op.reduction!r}")


def _loss_examples(seed: int, scores_fn) -> list[Example]:
    target = np.array([[2, 0, 1], [1, 1, 3]])
    return [
        Example((scores_fn(seed, 2, 3, 4), target), {"ignore_index": None, "reduction": "mean"}),
        Example((scores_fn(seed + 1, 2, 3, 4), target), {"ignore_index": 1, "reduction": "mean"}),
        Example((scores_fn(seed + 2, 3, 4), target[0]), {"ignore_index": None, "reduction": "sum"}),
        Example((scores_fn(seed + 3, 2, 3, 4), target), {"ignore_index": 0, "reduction": "none"}),
    ]


@register
class CrossEntropy(Op):
    """loss = -log softmax(logits)[target], classes on the last axis, fused in one kernel.

    Rows whose target equals ``ignore_index`` contribute nothing; 'mean' averages over the
    rows that are not ignored.
    """

    kernels = ("broadcast_to", "clamp_divisor", "count_ne", "cross_entropy", "cross_entropy_back", "div",
               "guard_ids", "reshape", "sum")

    @staticmethod
    def symbolic(sp, logits, target, ignore_index, reduction):
        return _symbolic_nll(sp, _symbolic_log_softmax(sp, logits, -1), target, ignore_index,
                             reduction)

    def forward(self, logits, target):
        logits2, target1, ignore, count = _flatten(self, logits, target)
        k = self.backend
        rows, lse = k.cross_entropy(logits2, target1, ignore)
        divisor = _divisor(k, count, rows.dtype)
        self.saved = (logits2, lse, target1, ignore, count, divisor, logits.shape)
        return _reduce(k, rows, divisor, self.reduction, target.shape)

    def backward(self, dy):
        logits2, lse, target1, ignore, count, divisor, shape = self.saved
        k = self.backend
        drows = _row_grads(k, dy, count, divisor, self.reduction, logits2.shape[0])
        return k.reshape(k.cross_entropy_back(logits2, lse, target1, ignore, drows), shape), None

    @classmethod
    def examples(cls):
        return _loss_examples(600, uniform)


@register
class NLLLoss(Op):
    """loss = -logp[target] for log-probabilities ``logp``, classes on the last axis."""

    kernels = ("broadcast_to", "clamp_divisor", "count_ne", "div", "guard_ids", "nll_loss", "nll_loss_back",
               "reshape", "sum")

    @staticmethod
    def symbolic(sp, logp, target, ignore_index, reduction):
        return _symbolic_nll(sp, logp, target, ignore_index, reduction)

    def forward(self, logp, target):
        logp2, target1, ignore, count = _flatten(self, logp, target)
        k = self.backend
        rows = k.nll_loss(logp2, target1, ignore)
        divisor = _divisor(k, count, rows.dtype)
        self.saved = (logp2.shape, target1, ignore, count, divisor, logp.shape)
        return _reduce(k, rows, divisor, self.reduction, target.shape)

    def backward(self, dy):
        shape2, target1, ignore, count, divisor, shape = self.saved
        k = self.backend
        drows = _row_grads(k, dy, count, divisor, self.reduction, shape2[0])
        return k.reshape(k.nll_loss_back(shape2, target1, ignore, drows), shape), None

    @classmethod
    def examples(cls):
        return _loss_examples(610, lambda seed, *shape: uniform(seed, *shape, low=-3.0, high=-0.1))


# ---------------------------------------------------------------- embedding and dropout


def _embedding_grad(ids, dy, kb, rows: int, padding_idx):
    return kb.embedding_back(rows, ids, dy, padding_idx)                # (rows, E)


def check_ids(where: str, ids: np.ndarray, table_shape: tuple[int, ...]) -> None:
    """Raise ShapeError, naming ``where``, if a host array of ids holds one outside
    [0, rows) for a table of ``table_shape``: the test every lookup makes (the Embedding op,
    and an exported model before onnxruntime's Gather would wrap a negative id)."""
    reference.guard_ids(ids, table_shape[0], None, functools.partial(_bad_id, where, table_shape))


def _bad_id(where: str, table_shape: tuple[int, ...], ids) -> None:
    """Raise ShapeError naming the smallest id (a host array) if it is negative, else the
    largest."""
    low, high = ids.min(), ids.max()
    bad = int(low) if low < 0 else int(high)
    raise ShapeError(f"{where}: id {bad} is outside [0, {table_shape[0]}) for weight of shape {table_shape}")


@register
class Embedding(Op):
    """y[...] = weight[ids[...]]: a row lookup; the row ``padding_idx`` gets no gradient."""

    kernels = ("cat", "embedding", "embedding_back", "guard_ids", "reshape")

    @staticmethod
    def symbolic(sp, weight, ids, padding_idx):
        weight = np.asarray(weight, dtype=object).copy()
        if padding_idx is not None:
            weight[padding_idx] = [stop_gradient(sp, w) for w in weight[padding_idx]]
        return weight[np.asarray(ids)]

    def forward(self, weight, ids):
        check_float(self, weight, "weight")
        check_integer(self, ids, "ids")
        if weight.ndim != 2:
            self.fail(f"weight must be 2-D (num_embeddings, dim), got shape {tuple(weight.shape)}")
        rows = weight.shape[0]
        if self.padding_idx is not None and not 0 <= self.padding_idx < rows:
            self.fail(f"padding_idx {self.padding_idx} is outside [0, {rows})")
        # A guard kernel, not a host read: the capture runs it again at every replay.
        self.backend.guard_ids(ids, rows, None, functools.partial(_bad_id, self.name, tuple(weight.shape)))
        self.saved = (rows, ids)
        return self.backend.embedding(weight, ids)

    def backward(self, dy):
        rows, ids = self.saved
        kb = self.backend
        # Rows scattered into the table: one scatter over every step's ids, when read.
        width = dim(dy, -1)
        flat_ids, flat_dy = kb.reshape(ids, (-1,)), kb.reshape(dy, (-1, width))
        return DeferredGrad(kb, _embedding_grad, (rows, width), (flat_ids, flat_dy),
                            (kb, rows, self.padding_idx)), None

    @classmethod
    def examples(cls):
        ids = np.array([[1, 3], [3, 0]])
        return [Example((uniform(700, 5, 3), ids), {"padding_idx": None}),
                # The padding row is a stop-gradient: finite differences see its true slope.
                Example((uniform(701, 5, 3), ids), {"padding_idx": 3}, finite_differences=False)]


@register
class Dropout(Elementwise):
    """y = x * m: inverted dropout, ``m`` the multiplier (u >= p) / (1 - p) that
    ``functional.dropout`` draws with the kernel ``dropout_multiplier`` (0 for a dropped
    entry, 1/(1 - p) for a kept one).  The multiplier is an input, not an attribute, so a
    captured step draws a fresh one at every replay; and the op is a formula, so a chain of
    elementwise ops around it can be fused."""

    @staticmethod
    def symbolic(sp, x, multiplier):
        return x * multiplier

    @classmethod
    def examples(cls):
        multiplier = np.array([[4.0, 0.0, 4.0], [4.0, 4.0, 0.0]]) / 3.0        # p = 0.25
        return [Example((uniform(710, 2, 3), multiplier))]


@register
class LayerNorm(Op):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape``
    axes of x, var the biased variance (Ba et al. 2016; ``torch.nn.functional.layer_norm``).
    weight and bias (``normalized_shape``) are optional inputs: x alone, x and weight, or all
    three.  Attributes: ``normalized_shape`` and ``epsilon`` (torch's ``eps``; ``ta.check``
    takes ``eps`` for its finite-difference step).

    One node instead of six (mean, centre, square, mean, rsqrt, scale): the kernel keeps each
    row's mean and 1/std, and backward is dx = rstd (g - mean(g) - xhat mean(g xhat)) with
    g = dy weight and xhat the normalised x, plus the column sums of dy xhat and dy.
    """

    kernels = ("layer_norm", "layer_norm_back", "reshape")

    @staticmethod
    def symbolic(sp, x, weight=None, bias=None, *, normalized_shape, epsilon):
        x = np.asarray(x, dtype=object)
        axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
        n = int(np.prod(normalized_shape))
        mean = np.sum(x, axis=axes, keepdims=True) / n
        centred = x - mean
        var = np.sum(centred * centred, axis=axes, keepdims=True) / n
        y = centred * elementwise(lambda v: 1 / sp.sqrt(v + number(sp, epsilon)), var)
        if weight is not None:
            y = y * np.asarray(weight, dtype=object)
        if bias is not None:
            y = y + np.asarray(bias, dtype=object)
        return y

    def forward(self, x, weight=None, bias=None):
        shape = tuple(self.normalized_shape)
        params = tuple(p for p in (weight, bias) if p is not None)
        check_same_dtype(self, x, *params)
        check_float(self, x)
        if x.ndim < len(shape) or tuple(x.shape[x.ndim - len(shape):]) != shape:
            self.fail(f"input of shape {tuple(x.shape)} must end in normalized_shape {shape}")
        for name, p in (("weight", weight), ("bias", bias)):
            if p is not None and tuple(p.shape) != shape:
                self.fail(f"{name} must have the normalized_shape {shape}, got {tuple(p.shape)}")
        k = self.backend
        n = math.prod(shape)
        x2 = k.reshape(x, (-1, n))                                      # (M, N)
        flat = [None if p is None else k.reshape(p, (n,)) for p in (weight, bias)]
        y2, mean, rstd = k.layer_norm(x2, flat[0], flat[1], float(self.epsilon))
        self.saved = (x2, mean, rstd, flat[0], x.shape)
        return k.reshape(y2, x.shape)

    def backward(self, dy):
        x2, mean, rstd, weight, x_shape = self.saved
        k = self.backend
        shape = tuple(self.normalized_shape)
        dx2, dweight, dbias = k.layer_norm_back(k.reshape(dy, x2.shape), x2, mean, rstd, weight)
        grads = (k.reshape(dx2, x_shape) if self.needs_grad[0] else None,)
        if len(self.needs_grad) > 1:
            grads += (k.reshape(dweight, shape) if self.needs_grad[1] else None,)
        if len(self.needs_grad) > 2:
            grads += (k.reshape(dbias, shape) if self.needs_grad[2] else None,)
        return grads

    @classmethod
    def examples(cls):
        return [
            Example((uniform(600, 2, 4), uniform(601, 4), uniform(602, 4)),
                    {"normalized_shape": (4,), "epsilon": 1e-5}),
            Example((uniform(603, 2, 2, 3),), {"normalized_shape": (2, 3), "epsilon": 0.1}),
            Example((uniform(604, 3, 3), uniform(605, 3)), {"normalized_shape": (3,), "epsilon": 1e-5}),
        ]
