"""Every op against its references: NumPy float64 and PyTorch (CPU) float64 and float32.

``TABLE`` lists the ops once, each with its NumPy form (and hand-written NumPy gradient,
where there is one), its torch form and the inputs hypothesis draws for it; the two tests
after it run every row against every oracle the row has, through ``check_op`` in
tests/reference.py.  Inputs come in any memory layout (transposed, strided, reversed views).
The torch rows skip without PyTorch (and fail under TINYGRAD_ATTN_REQUIRE_EXTRAS=1); the
NumPy rows always run.

What is not one op on drawn inputs (special values, fixed float32 spot checks, expressions
of several ops, the engine's departures from torch) is in test_reference_special.py.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tests import optional
from tests.reference import TF, Case, Example, check_op, torch, unbroadcast
from tests.strategies import (
    arrays,
    broadcastable_shapes,
    broadcastable_to,
    classification,
    indices,
    integer_indices,
    masks,
    nonzero_arrays,
    positive_arrays,
    reduce_axes,
    reshape_targets,
    shaped_arrays,
    shapes,
)

EXAMPLES = 25
BOTH = ("float64", "float32")


def one(min_dims: int = 0, max_dims: int = 4, low: float = -3.0, high: float = 3.0, **params):
    """One drawn array; ``params`` maps argument names to the strategies drawing them."""
    return st.builds(lambda x, p: Example((x,), p),
                     shaped_arrays(min_dims=min_dims, max_dims=max_dims, low=low, high=high),
                     st.fixed_dictionaries(params))


def const(a):
    """A constant torch tensor from an array of any layout (torch rejects negative strides)."""
    return torch.tensor(np.array(a, order="C"))


# ---------------------------------------------------------------- elementwise arithmetic


@st.composite
def _pair(draw, draw_a=arrays, draw_b=arrays):
    shape_a, shape_b = draw(broadcastable_shapes())
    return Example((draw(draw_a(shape_a)), draw(draw_b(shape_b))), {})


def _through_broadcast(partials):
    """The NumPy gradient of a broadcasting elementwise op from ``partials(dy, a, b)``
    (dy times each partial derivative), each summed back to its input's shape."""
    def grad(dy, *xs):
        return tuple(unbroadcast(np.broadcast_to(d, dy.shape), x.shape)
                     for d, x in zip(partials(dy, *xs), xs, strict=True))
    return grad


def _binary(name, op, partials, inputs):
    # Python's operators mean the same on engine tensors, ndarrays and torch tensors.
    return Case(name, engine=op, numpy=op, numpy_grad=_through_broadcast(partials), torch=op,
                inputs=inputs, dtypes=BOTH)


# The reflected and scalar forms, Python ints among the scalars.
SCALAR_FORMS = (
    lambda x, c: x + c, lambda x, c: c + x, lambda x, c: x - c, lambda x, c: c - x,
    lambda x, c: x * c, lambda x, c: c * x, lambda x, c: x / c, lambda x, c: c / x,
    lambda x, c: x**c, lambda x, c: c**x, lambda x, c: x + 1, lambda x, c: 3 - x,
    lambda x, c: x * 3, lambda x, c: x / 4, lambda x, c: x**2, lambda x, c: x**3,
    lambda x, c: 2**x, lambda x, c: -x, lambda x, c: +x, lambda x, c: (-x) ** 2,
)


def _ndarray_operand(x, c, lift=np.asarray):
    # An ndarray on either side is a constant; the other operand keeps its gradient.
    return lift(c) * x + x / lift(c**2 + 1.0) - lift(c)


@st.composite
def _with_ndarray(draw):
    x = draw(shaped_arrays(min_dims=1))
    return Example((x,), {"c": draw(arrays(x.shape[1:]))})


ARITHMETIC = [
    _binary("add", operator.add, lambda g, a, b: (g, g), _pair()),
    _binary("sub", operator.sub, lambda g, a, b: (g, -g), _pair()),
    _binary("mul", operator.mul, lambda g, a, b: (g * b, g * a), _pair()),
    _binary("div", operator.truediv, lambda g, a, b: (g / b, -g * a / b**2),
            _pair(draw_b=nonzero_arrays)),
    _binary("pow", operator.pow, lambda g, x, p: (g * p * x ** (p - 1), g * x**p * np.log(x)),
            _pair(draw_a=positive_arrays)),
    Case("add_self_times_self", engine=lambda t: t + t * t, numpy=lambda x: x + x * x,
         numpy_grad=lambda dy, x: (dy * (1 + 2 * x),), torch=lambda t: t + t * t, inputs=one()),
    Case("scalar_operands",
         engine=lambda t, c: ta.stack([f(t, c) for f in SCALAR_FORMS]),
         numpy=lambda x, c: np.stack([f(x, c) for f in SCALAR_FORMS]),
         torch=lambda t, c: torch.stack([f(t, c) for f in SCALAR_FORMS]),
         inputs=one(low=0.5, high=3.0, c=st.floats(0.5, 2.0))),
    Case("ndarray_operand", engine=_ndarray_operand, numpy=_ndarray_operand,
         numpy_grad=lambda dy, x, c: (dy * (c + 1 / (c**2 + 1.0)),),
         torch=lambda t, c: _ndarray_operand(t, c, lift=const), inputs=_with_ndarray()),
]


# ---------------------------------------------------------------- unary elementwise


def stable_sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


def normal_cdf(x):
    """Phi(x) entry by entry, from the C library's erf (numpy has none)."""
    return 0.5 * (1 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2)))


def _unary(name, method, numpy_fn, derivative, low=-3.0, high=3.0):
    def engine(t):
        return getattr(t, method)()
    return Case(name, engine=engine, numpy=numpy_fn,
                numpy_grad=lambda dy, x: (dy * derivative(x),), torch=engine,
                inputs=one(low=low, high=high))


def _leaky_relu(t, slope):
    return t.leaky_relu() if slope is None else t.leaky_relu(slope)


def _leaky_slope(slope):
    return 0.01 if slope is None else slope      # the documented default, torch's too


UNARY = [
    _unary("exp", "exp", np.exp, np.exp),
    _unary("log", "log", np.log, lambda x: 1 / x, low=0.1),
    _unary("sqrt", "sqrt", np.sqrt, lambda x: 0.5 / np.sqrt(x), low=0.1),
    _unary("tanh", "tanh", np.tanh, lambda x: 1 - np.tanh(x) ** 2),
    _unary("sigmoid", "sigmoid", stable_sigmoid,
           lambda x: stable_sigmoid(x) * (1 - stable_sigmoid(x))),
    _unary("relu", "relu", lambda x: np.maximum(x, 0.0), lambda x: (x > 0) * 1.0),
    _unary("neg", "__neg__", np.negative, lambda x: -np.ones_like(x)),
    Case("gelu", engine=lambda t: ta.functional.gelu(t), numpy=lambda x: x * normal_cdf(x),
         numpy_grad=lambda dy, x: (dy * (normal_cdf(x) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)),),
         torch=lambda t: TF.gelu(t), inputs=one(low=-6.0, high=6.0), dtypes=("float64", "float32")),
    Case("gelu_tanh", engine=lambda t: ta.functional.gelu(t, "tanh"),
         numpy=lambda x: x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))) / 2,
         torch=lambda t: TF.gelu(t, approximate="tanh"), inputs=one(low=-6.0, high=6.0),
         dtypes=("float64", "float32")),
    # slope None is the default argument.
    Case("leaky_relu", engine=_leaky_relu,
         numpy=lambda x, slope: np.where(x > 0, x, _leaky_slope(slope) * x),
         numpy_grad=lambda dy, x, slope: (dy * np.where(x > 0, 1.0, _leaky_slope(slope)),),
         torch=lambda t, slope: TF.leaky_relu(t, _leaky_slope(slope)),
         inputs=one(slope=st.none() | st.floats(0.0, 0.5))),
]


COMPARISON_OPS = (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge)


def _comparisons(stack):
    # All six at once, stacked so each is compared on its own.
    def compare(a, b=1.0):
        return stack([op(a, b) for op in COMPARISON_OPS])
    return compare


@st.composite
def _comparable(draw):
    shape_a, shape_b = draw(broadcastable_shapes())
    # Whole numbers make equal entries common.
    a = draw(arrays(shape_a, step=1.0))
    if draw(st.booleans()):
        return Example((a,), {})                 # against b's default, the scalar 1.0
    return Example((a, draw(arrays(shape_b, step=1.0))), {})


COMPARISONS = Case("comparisons", engine=_comparisons(ta.stack), numpy=_comparisons(np.stack),
                   torch=_comparisons(lambda ts: torch.stack(ts)), inputs=_comparable())


# ---------------------------------------------------------------- where and masked_fill


@st.composite
def _where_inputs(draw):
    shape_c, shape_a, shape_b = draw(broadcastable_shapes(num_shapes=3))
    return Example((draw(arrays(shape_a)), draw(arrays(shape_b))), {"cond": draw(masks(shape_c))})


def _where_grad(dy, a, b, cond):
    full = np.broadcast_to(cond, dy.shape)
    return unbroadcast(np.where(full, dy, 0.0), a.shape), unbroadcast(np.where(full, 0.0, dy), b.shape)


def _where_scalar(t, c, scalar_first, tensor_cond):
    # The condition as an engine comparison, or as a plain boolean ndarray.
    cond = t > 0 if tensor_cond else t.numpy() > 0
    return ta.where(cond, c, t * 2) if scalar_first else ta.where(cond, t * 2, c)


def _where_scalar_numpy(x, c, scalar_first, tensor_cond):
    return np.where(x > 0, c, x * 2) if scalar_first else np.where(x > 0, x * 2, c)


def _where_scalar_grad(dy, x, c, scalar_first, tensor_cond):
    # t * 2 is picked where x > 0, or, with the scalar first, where it is not.
    return (np.where((x > 0) != scalar_first, 2 * dy, 0.0),)


def _where_scalar_torch(t, c, scalar_first, tensor_cond):
    return torch.where(t > 0, c, t * 2) if scalar_first else torch.where(t > 0, t * 2, c)


@st.composite
def _masked_fill_inputs(draw):
    x = draw(shaped_arrays())
    return Example((x,), {
        "mask": draw(masks(draw(broadcastable_to(x.shape)))),
        "value": draw(st.sampled_from([-np.inf, -1e9, 0.0, 2.5])),
        "mask_tensor": draw(st.booleans()),
    })


SELECTION = [
    Case("where", engine=lambda a, b, cond: ta.where(ta.Tensor(cond), a, b),
         numpy=lambda a, b, cond: np.where(cond, a, b), numpy_grad=_where_grad,
         torch=lambda a, b, cond: torch.where(torch.tensor(cond), a, b), inputs=_where_inputs()),
    Case("where_scalar", engine=_where_scalar, numpy=_where_scalar_numpy,
         numpy_grad=_where_scalar_grad, torch=_where_scalar_torch,
         inputs=one(c=st.floats(-2.0, 2.0), scalar_first=st.booleans(),
                    tensor_cond=st.booleans())),
    Case("masked_fill",
         engine=lambda t, mask, value, mask_tensor: t.masked_fill(
             ta.Tensor(mask) if mask_tensor else mask, value) * 2,
         numpy=lambda x, mask, value, mask_tensor: np.where(mask, value, x) * 2,
         numpy_grad=lambda dy, x, mask, value, mask_tensor: (np.where(mask, 0.0, 2 * dy),),
         torch=lambda t, mask, value, mask_tensor: t.masked_fill(torch.tensor(mask), value) * 2,
         inputs=_masked_fill_inputs()),
]


# ---------------------------------------------------------------- reductions


@st.composite
def _reduce_inputs(draw):
    # Multiples of 0.1, so max meets ties now and then.
    x = draw(shaped_arrays(step=0.1))
    return Example((x,), {"axis": draw(reduce_axes(x.ndim)), "keepdims": draw(st.booleans())})


def _reduction_grad(name):
    def grad(dy, x, axis, keepdims):
        dy = dy.reshape(np.sum(x, axis=axis, keepdims=True).shape)
        if name == "sum":
            return (np.broadcast_to(dy, x.shape),)
        if name == "mean":
            return (np.broadcast_to(dy / (x.size // dy.size), x.shape),)
        # Tied maxima share the gradient equally.
        hit = x == np.max(x, axis=axis, keepdims=True)
        return (np.where(hit, dy / np.sum(hit, axis=axis, keepdims=True), 0.0),)
    return grad


def _torch_reduce(name):
    def reduce(t, axis, keepdims):
        if name == "max":
            # amax (like the engine) splits the gradient evenly between tied maxima.
            return torch.amax(t, dim=() if axis is None else axis, keepdim=keepdims)
        return getattr(torch, name)(t, dim=axis, keepdim=keepdims)
    return reduce


def _reduction(name, numpy_fn):
    return Case(name, engine=lambda t, axis, keepdims: getattr(t, name)(axis=axis, keepdims=keepdims),
                numpy=numpy_fn, numpy_grad=_reduction_grad(name), torch=_torch_reduce(name),
                inputs=_reduce_inputs(),
                # torch reads an empty axis tuple as "all axes", NumPy (and the engine) as "none".
                torch_accepts=lambda axis, keepdims: axis != ())


REDUCTIONS = [_reduction("sum", np.sum), _reduction("mean", np.mean), _reduction("max", np.max)]


# ---------------------------------------------------------------- movement


@st.composite
def _reshape_inputs(draw):
    x = draw(shaped_arrays())
    return Example((x,), {"target": draw(reshape_targets(x.shape)), "spread": draw(st.booleans())})


@st.composite
def _axis_pair(draw):
    x = draw(shaped_arrays(min_dims=1))
    axis = st.integers(-x.ndim, x.ndim - 1)
    return Example((x,), {"axis0": draw(axis), "axis1": draw(axis)})


@st.composite
def _permute_inputs(draw):
    x = draw(shaped_arrays())
    axes = draw(st.permutations(range(x.ndim)))
    # Some axes written as negative numbers.
    axes = tuple(a - x.ndim if draw(st.booleans()) else a for a in axes)
    return Example((x,), {"axes": axes, "spread": draw(st.booleans())})


def _unpermute(dy, axes):
    return np.transpose(dy, np.argsort([a % max(dy.ndim, 1) for a in axes]))


@st.composite
def _expand_inputs(draw):
    out_shape = draw(shapes())
    x = draw(arrays(draw(broadcastable_to(out_shape))))
    return Example((x,), {"shape": out_shape, "spread": draw(st.booleans())})


@st.composite
def _new_axis(draw):
    x = draw(shaped_arrays(max_dims=3))
    return Example((x,), {"axis": draw(st.integers(-x.ndim - 1, x.ndim))})


def _reversed_axes(t):
    return t.permute(tuple(reversed(range(t.ndim))))


def _same_shape_grad(dy, x, **params):
    return (dy.reshape(x.shape),)


MOVEMENT = [
    # ``spread``: the shape or axes as separate arguments, not one tuple.
    Case("reshape",
         engine=lambda t, target, spread: t.reshape(*target) if spread else t.reshape(target),
         numpy=lambda x, target, spread: x.reshape(target), numpy_grad=_same_shape_grad,
         torch=lambda t, target, spread: t.reshape(target), inputs=_reshape_inputs()),
    Case("transpose", engine=lambda t, axis0, axis1: t.transpose(axis0, axis1),
         numpy=lambda x, axis0, axis1: np.swapaxes(x, axis0, axis1),
         numpy_grad=lambda dy, x, axis0, axis1: (np.swapaxes(dy, axis0, axis1),),
         torch=lambda t, axis0, axis1: t.transpose(axis0, axis1), inputs=_axis_pair()),
    Case("permute", engine=lambda t, axes, spread: t.permute(*axes) if spread else t.permute(axes),
         numpy=lambda x, axes, spread: np.transpose(x, axes),
         numpy_grad=lambda dy, x, axes, spread: (_unpermute(dy, axes),),
         torch=lambda t, axes, spread: t.permute(axes), inputs=_permute_inputs()),
    Case("T", engine=lambda t: t.T, numpy=lambda x: x.T, numpy_grad=lambda dy, x: (dy.T,),
         torch=_reversed_axes, inputs=one()),
    Case("expand",
         engine=lambda t, shape, spread: t.expand(*shape) if spread else t.expand(shape),
         numpy=lambda x, shape, spread: np.broadcast_to(x, shape),
         numpy_grad=lambda dy, x, shape, spread: (unbroadcast(dy, x.shape),),
         torch=lambda t, shape, spread: t.expand(shape), inputs=_expand_inputs()),
    Case("unsqueeze", engine=lambda t, axis: t.unsqueeze(axis),
         numpy=lambda x, axis: np.expand_dims(x, axis), numpy_grad=_same_shape_grad,
         torch=lambda t, axis: t.unsqueeze(axis), inputs=_new_axis()),
    Case("unsqueeze_squeeze", engine=lambda t, axis: t.unsqueeze(axis).squeeze(axis),
         numpy=lambda x, axis: np.squeeze(np.expand_dims(x, axis), axis),
         numpy_grad=_same_shape_grad, torch=lambda t, axis: t.unsqueeze(axis).squeeze(axis),
         inputs=_new_axis()),
    # squeeze() with no axis drops every size-1 axis.
    Case("squeeze", engine=lambda t: t.squeeze(), numpy=np.squeeze, numpy_grad=_same_shape_grad,
         torch=lambda t: t.squeeze(), inputs=one(max_dims=3)),
]


# ---------------------------------------------------------------- indexing


def _torch_getitem(t, index):
    """``t[index]`` for a NumPy basic index.  torch has no negative-step slices, so those
    axes are flipped and read forwards."""
    parts = index if isinstance(index, tuple) else (index,)
    consumed = sum(p is not None and p is not Ellipsis for p in parts)
    axis, flips, forward = 0, [], []
    for p in parts:
        if p is Ellipsis:
            axis += t.ndim - consumed
        elif p is not None:
            if isinstance(p, slice) and p.step is not None and p.step < 0:
                n = t.shape[axis]
                start, stop, step = p.indices(n)
                count = len(range(start, stop, step))
                first = n - 1 - start                 # entry i sits at n - 1 - i once flipped
                p = slice(first, first - count * step, -step) if count else slice(0, 0)
                flips.append(axis)
            axis += 1
        forward.append(p)
    return (t.flip(flips) if flips else t)[tuple(forward)]


def _written(x, index, dy):
    """The gradient of x[index] for a basic index (each entry picked at most once)."""
    grad = np.zeros_like(x)
    grad[index] = dy
    return (grad,)


def _accumulated(x, index, dy):
    """The gradient of x[index] with integer arrays: repeated entries add up."""
    grad = np.zeros_like(x)
    np.add.at(grad, index, dy)
    return (grad,)


@st.composite
def _basic_index_inputs(draw):
    x = draw(shaped_arrays(min_dims=1))
    return Example((x,), {"index": draw(indices(x.shape))})


@st.composite
def _integer_index_inputs(draw):
    # Along the first or the second axis, as an ndarray or a list.
    x = draw(shaped_arrays(min_dims=1))
    axis = draw(st.integers(0, min(x.ndim, 2) - 1))
    return Example((x,), {"rows": draw(integer_indices(x.shape[axis])), "axis": axis,
                          "as_list": draw(st.booleans())})


def _along(axis, rows):
    return rows if axis == 0 else (slice(None), rows)        # x[rows] or x[:, rows]


@st.composite
def _two_integer_arrays(draw):
    x = draw(shaped_arrays(min_dims=2, max_dims=3))
    n = draw(st.integers(1, 6))
    return Example((x,), {"rows": draw(integer_indices(x.shape[0], min_size=n, max_size=n)),
                          "cols": draw(integer_indices(x.shape[1], min_size=n, max_size=n))})


@st.composite
def _mask_inputs(draw):
    # A mask over the leading axes (all of them, or fewer).
    x = draw(shaped_arrays(min_dims=1))
    mask = draw(masks(x.shape[: draw(st.integers(1, x.ndim))]))
    return Example((x,), {"mask": mask, "mask_tensor": draw(st.booleans())})


INDEXING = [
    Case("getitem_basic", engine=lambda t, index: t[index], numpy=lambda x, index: x[index],
         numpy_grad=lambda dy, x, index: _written(x, index, dy), torch=_torch_getitem,
         inputs=_basic_index_inputs()),
    Case("getitem_integer_array",
         engine=lambda t, rows, axis, as_list: t[_along(axis, rows.tolist() if as_list else rows)],
         numpy=lambda x, rows, axis, as_list: x[_along(axis, rows)],
         numpy_grad=lambda dy, x, rows, axis, as_list: _accumulated(x, _along(axis, rows), dy),
         torch=lambda t, rows, axis, as_list: t[_along(axis, torch.tensor(rows))],
         inputs=_integer_index_inputs()),
    Case("getitem_two_integer_arrays", engine=lambda t, rows, cols: t[ta.Tensor(rows), cols],
         numpy=lambda x, rows, cols: x[rows, cols],
         numpy_grad=lambda dy, x, rows, cols: _accumulated(x, (rows, cols), dy),
         torch=lambda t, rows, cols: t[torch.tensor(rows), torch.tensor(cols)],
         inputs=_two_integer_arrays()),
    Case("getitem_mask",
         engine=lambda t, mask, mask_tensor: t[ta.Tensor(mask) if mask_tensor else mask],
         numpy=lambda x, mask, mask_tensor: x[mask],
         numpy_grad=lambda dy, x, mask, mask_tensor: _written(x, mask, dy),
         torch=lambda t, mask, mask_tensor: t[torch.tensor(mask)], inputs=_mask_inputs()),
]


# ---------------------------------------------------------------- cat, stack, matmul


@st.composite
def _pieces(draw, along: bool):
    """1 to 3 pieces and ``order``, the pieces to join (some maybe twice or not at all).
    ``along``: the pieces differ in size along ``axis`` (cat); else they share one shape
    and ``axis`` may be new (stack)."""
    shape = draw(shapes(min_dims=1 if along else 0, max_dims=4 if along else 3))
    axis = draw(st.integers(-len(shape), len(shape) - 1) if along else
                st.integers(-len(shape) - 1, len(shape)))
    count = draw(st.integers(1, 3))
    pieces = []
    for _ in range(count):
        piece_shape = list(shape)
        if along:
            piece_shape[axis] = draw(st.integers(1, 3))
        pieces.append(draw(arrays(tuple(piece_shape))))
    order = draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=3))
    return Example(tuple(pieces), {"axis": axis, "order": order})


def _cat_grad(dy, *pieces, axis, order):
    bounds = np.cumsum([pieces[k].shape[axis] for k in order])[:-1]
    grads = [np.zeros_like(p) for p in pieces]
    for k, part in zip(order, np.split(dy, bounds, axis=axis), strict=True):
        grads[k] += part
    return tuple(grads)


def _stack_grad(dy, *pieces, axis, order):
    grads = [np.zeros_like(p) for p in pieces]
    for j, k in enumerate(order):
        grads[k] += np.take(dy, j, axis=axis)
    return tuple(grads)


@st.composite
def _matmul_inputs(draw):
    n, k, m = (draw(st.integers(1, 4)) for _ in "nkm")
    batch_a, batch_b = draw(broadcastable_shapes(max_dims=2))
    a = draw(arrays((k,) if draw(st.booleans()) else batch_a + (n, k)))
    b = draw(arrays((k,) if draw(st.booleans()) else batch_b + (k, m)))
    return Example((a, b), {})


def _matmul_grad(dy, a, b):
    # Promote vectors to matrices, take the matrix gradients, and fold the batch back.
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    dy2 = np.asarray(dy).reshape(np.matmul(a2, b2).shape)
    da2 = np.matmul(dy2, np.swapaxes(b2, -1, -2))
    db2 = np.matmul(np.swapaxes(a2, -1, -2), dy2)
    return unbroadcast(da2, a2.shape).reshape(a.shape), unbroadcast(db2, b2.shape).reshape(b.shape)


JOINS = [
    Case("cat", engine=lambda *ts, axis, order: ta.cat([ts[k] for k in order], axis=axis),
         numpy=lambda *xs, axis, order: np.concatenate([xs[k] for k in order], axis=axis),
         numpy_grad=_cat_grad,
         torch=lambda *ts, axis, order: torch.cat([ts[k] for k in order], dim=axis),
         inputs=_pieces(along=True)),
    Case("stack", engine=lambda *ts, axis, order: ta.stack([ts[k] for k in order], axis=axis),
         numpy=lambda *xs, axis, order: np.stack([xs[k] for k in order], axis=axis),
         numpy_grad=_stack_grad,
         torch=lambda *ts, axis, order: torch.stack([ts[k] for k in order], dim=axis),
         inputs=_pieces(along=False)),
    Case("matmul", engine=operator.matmul, numpy=np.matmul, numpy_grad=_matmul_grad,
         torch=lambda a, b: torch.matmul(a, b), inputs=_matmul_inputs()),
]


# ---------------------------------------------------------------- softmax family


def numpy_softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def numpy_log_softmax(x, axis=-1):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _softmax_vjp(dy, x, axis):
    """dy through the softmax Jacobian diag(y) - y y^T, built explicitly per row."""
    y = numpy_softmax(x, axis)
    ym, gm = np.moveaxis(y, axis, -1), np.moveaxis(dy, axis, -1)
    jacobian = ym[..., :, None] * np.eye(ym.shape[-1]) - ym[..., :, None] * ym[..., None, :]
    return (np.moveaxis(np.einsum("...ij,...i->...j", jacobian, gm), -1, axis),)


def _sums_to_one(y, axis):
    np.testing.assert_allclose(y.sum(axis=axis), 1.0, rtol=1e-12)


@st.composite
def _existing_axis(draw):
    x = draw(shaped_arrays(min_dims=1))
    return Example((x,), {"axis": draw(st.integers(-x.ndim, x.ndim - 1))})


SOFTMAX = [
    Case("softmax", engine=lambda t, axis: t.softmax(axis=axis), numpy=numpy_softmax,
         numpy_grad=_softmax_vjp, torch=lambda t, axis: torch.softmax(t, dim=axis),
         inputs=_existing_axis(), invariant=_sums_to_one),
    Case("log_softmax", engine=lambda t, axis: t.log_softmax(axis=axis), numpy=numpy_log_softmax,
         numpy_grad=lambda dy, x, axis: (
             dy - numpy_softmax(x, axis) * np.sum(dy, axis=axis, keepdims=True),),
         torch=lambda t, axis: torch.log_softmax(t, dim=axis),
         inputs=_existing_axis(), invariant=lambda y, axis: _sums_to_one(np.exp(y), axis)),
]


# ---------------------------------------------------------------- losses and embedding
#
# torch wants (N, C) logits; the engine takes classes on the last axis of logits of any
# shape.  So the torch forms flatten the leading axes (a no-op on the (N, C) logits drawn
# here) and reshape a 'none' result back; the (B, T, C) tests in test_reference_special.py
# rely on that.


def _engine_target(target, target_as):
    return {"array": target, "list": target.tolist(), "tensor": ta.Tensor(target)}[target_as]


def _torch_rows(loss, t, target, ignore_index, reduction):
    out = loss(t.reshape(-1, t.shape[-1]), torch.tensor(target.reshape(-1)),
               ignore_index=-100 if ignore_index is None else ignore_index, reduction=reduction)
    return out.reshape(target.shape) if reduction == "none" else out


def _classification_inputs(reduction):
    return st.builds(
        lambda case, target_as: Example((case[0],), {
            "target": case[1], "ignore_index": case[2], "reduction": reduction,
            "target_as": target_as}),
        classification(), st.sampled_from(["array", "list", "tensor"]))


def _cross_entropy(reduction):
    return Case(
        f"cross_entropy[{reduction}]",
        engine=lambda t, target, ignore_index, reduction, target_as: ta.functional.cross_entropy(
            t, _engine_target(target, target_as), ignore_index=ignore_index, reduction=reduction),
        torch=lambda t, target, ignore_index, reduction, target_as: _torch_rows(
            TF.cross_entropy, t, target, ignore_index, reduction),
        inputs=_classification_inputs(reduction))


def _nll_loss(reduction):
    # On log-probabilities, the usual pairing with log_softmax, and on arbitrary scores,
    # which nll_loss does not require to be normalised; stacked so each is compared.
    def engine(t, target, ignore_index, reduction, target_as):
        target = _engine_target(target, target_as)
        return ta.stack([ta.functional.nll_loss(scores, target, ignore_index=ignore_index,
                                                reduction=reduction)
                         for scores in (t.log_softmax(axis=-1), t * 2)])

    def reference(t, target, ignore_index, reduction, target_as):
        return torch.stack([_torch_rows(TF.nll_loss, scores, target, ignore_index, reduction)
                            for scores in (torch.log_softmax(t, dim=-1), t * 2)])

    return Case(f"nll_loss[{reduction}]", engine=engine, torch=reference,
                inputs=_classification_inputs(reduction))


@st.composite
def _regression(draw, reduction):
    shape = draw(shapes())
    x, y = draw(arrays(shape)), draw(arrays(shape))
    return Example((x, y), {"reduction": reduction, "constant": y})


def _mse_loss(reduction):
    # The target as a Tensor, which gets a gradient too, and as an ndarray, a constant.
    def engine(a, b, reduction, constant):
        return ta.stack([ta.functional.mse_loss(a, target, reduction=reduction)
                         for target in (b, constant)])

    def reference(a, b, reduction, constant):
        return torch.stack([TF.mse_loss(a, target, reduction=reduction)
                            for target in (b, const(constant))])

    return Case(f"mse_loss[{reduction}]", engine=engine, torch=reference,
                inputs=_regression(reduction))


VOCAB = 5


@st.composite
def _embedding_inputs(draw, padding_idx):
    weight = draw(arrays((VOCAB, draw(st.integers(1, 4)))))
    ids = draw(arrays(draw(shapes(max_dims=2)), low=0, high=VOCAB - 1, layout="contiguous"))
    return Example((weight,), {"ids": np.round(ids).astype(np.int64), "padding_idx": padding_idx})


def _embedding(padding_idx):
    return Case(f"embedding[padding_idx={padding_idx}]",
                engine=lambda w, ids, padding_idx: ta.functional.embedding(
                    ids, w, padding_idx=padding_idx),
                torch=lambda w, ids, padding_idx: TF.embedding(
                    torch.tensor(ids), w, padding_idx=padding_idx),
                inputs=_embedding_inputs(padding_idx))


REDUCTION_MODES = ("mean", "sum", "none")
LOSSES = [
    *(_cross_entropy(r) for r in REDUCTION_MODES),
    *(_nll_loss(r) for r in REDUCTION_MODES),
    *(_mse_loss(r) for r in REDUCTION_MODES),
    *(_embedding(p) for p in (None, 0, 3)),
]


TABLE = [*ARITHMETIC, *UNARY, COMPARISONS, *SELECTION, *REDUCTIONS, *MOVEMENT, *INDEXING,
         *JOINS, *SOFTMAX, *LOSSES]
CASES = {case.name: case for case in TABLE}
assert len(CASES) == len(TABLE), "two rows share a name"


@pytest.mark.parametrize("case", [c for c in TABLE if c.has("numpy")], ids=lambda c: c.name)
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_matches_numpy(case, data):
    run_row(case, "numpy", "float64", data)


@optional.needs_torch
@pytest.mark.parametrize(("case", "dtype"),
                         [pytest.param(c, d, id=f"{c.name}-{d}")
                          for c in TABLE if c.has("torch") for d in c.dtypes])
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_matches_torch(case, dtype, data):
    run_row(case, "torch", dtype, data)


def run_row(case: Case, oracle: str, dtype: str, data) -> None:
    arrays_in, params = data.draw(case.inputs, label="inputs")
    if oracle == "torch" and case.torch_accepts is not None:
        assume(case.torch_accepts(**params))
    # The cotangent is a random array from a drawn seed: its entries all differ (a drawn
    # array often repeats one value, which hides a gradient sent to the wrong entry), and
    # it costs one draw.
    dy = data.draw(st.integers(0, 2**32 - 1), label="dy seed")
    check_op(case, oracle, arrays_in, params, dtype, dy=dy)
