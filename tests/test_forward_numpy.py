"""The engine's forward pass (and the backward of broadcasting ops) against NumPy float64.

Most tests draw shapes and values with hypothesis.  Inputs come in any memory layout
(transposed, strided, reversed views), and the last section checks that a non-contiguous
input gives exactly what its contiguous copy gives.
"""

from __future__ import annotations

import math
import operator
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tests.strategies import (
    arrays,
    basic_indices,
    broadcastable_shapes,
    broadcastable_to,
    integer_indices,
    masks,
    non_contiguous_arrays,
    nonzero_arrays,
    positive_arrays,
    reduce_axes,
    reshape_targets,
    shaped_arrays,
    shapes,
)

EXAMPLES = 25
RTOL = 1e-12
ATOL = 1e-12


def tensor(x, requires_grad: bool = False) -> ta.Tensor:
    return ta.Tensor(x, dtype="float64", requires_grad=requires_grad)


def assert_matches(actual, expected, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Same shape, float64, and close values (NaN and inf must sit in the same places)."""
    actual = actual.numpy() if isinstance(actual, ta.Tensor) else np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != expected {expected.shape}"
    assert actual.dtype == np.float64, f"dtype {actual.dtype}, expected float64"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The gradient of an input of ``shape`` broadcast up to ``g.shape``: each input entry
    collects the sum of ``g`` over every output position it was copied to.  Computed by
    broadcasting entry ids and binning, independently of the engine's sum_to."""
    size = math.prod(shape)
    ids = np.broadcast_to(np.arange(size).reshape(shape), g.shape)
    return np.bincount(ids.ravel(), weights=g.ravel(), minlength=size).reshape(shape)


def contiguous(x: np.ndarray) -> np.ndarray:
    """A C-ordered copy (np.ascontiguousarray would turn a 0-d array into a 1-d one)."""
    return np.array(x, order="C", copy=True)


def upstream(data, shape: tuple[int, ...]) -> np.ndarray:
    """A drawn cotangent for backward, so gradients are not just sums of ones."""
    return data.draw(arrays(shape, layout="contiguous"), label="dy")


# ---------------------------------------------------------------- binary elementwise

BINARY = {
    "add": (operator.add, np.add),
    "sub": (operator.sub, np.subtract),
    "mul": (operator.mul, np.multiply),
}


@pytest.mark.parametrize("name", BINARY)
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_binary_matches_numpy_with_broadcasting(name, data):
    engine_op, numpy_op = BINARY[name]
    shape_a, shape_b = data.draw(broadcastable_shapes(), label="shapes")
    a = data.draw(arrays(shape_a), label="a")
    b = data.draw(arrays(shape_b), label="b")
    assert_matches(engine_op(tensor(a), tensor(b)), numpy_op(a, b))


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_div_matches_numpy_with_broadcasting(data):
    shape_a, shape_b = data.draw(broadcastable_shapes(), label="shapes")
    a = data.draw(arrays(shape_a), label="a")
    b = data.draw(nonzero_arrays(shape_b), label="b")
    assert_matches(tensor(a) / tensor(b), a / b)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_pow_matches_numpy_with_broadcasting(data):
    shape_x, shape_p = data.draw(broadcastable_shapes(), label="shapes")
    x = data.draw(positive_arrays(shape_x), label="x")
    p = data.draw(arrays(shape_p, low=-2.0, high=2.0), label="p")
    assert_matches(tensor(x) ** tensor(p), x**p)


@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(low=0.5, high=3.0), c=st.floats(0.5, 2.0))
def test_scalar_operands_match_numpy(x, c):
    t = tensor(x)
    assert_matches(t + c, x + c)
    assert_matches(c + t, c + x)
    assert_matches(t - c, x - c)
    assert_matches(c - t, c - x)
    assert_matches(t * c, x * c)
    assert_matches(c * t, c * x)
    assert_matches(t / c, x / c)
    assert_matches(c / t, c / x)
    assert_matches(t**c, x**c)
    assert_matches(c**t, c**x)
    assert_matches(t**2, x**2)
    assert_matches(-t, -x)
    # A numpy array on the left defers to the Tensor (``__array_ufunc__ = None``).
    assert_matches(np.full_like(x, c) * t, c * x)


BACKWARD = {
    # name: (engine op, input strategies, numpy (da, db) from a, b and dy)
    "add": (operator.add, (arrays, arrays), lambda a, b, g: (g, g)),
    "sub": (operator.sub, (arrays, arrays), lambda a, b, g: (g, -g)),
    "mul": (operator.mul, (arrays, arrays), lambda a, b, g: (g * b, g * a)),
    "div": (operator.truediv, (arrays, nonzero_arrays), lambda a, b, g: (g / b, -g * a / b**2)),
    "pow": (
        operator.pow,
        (positive_arrays, arrays),
        lambda x, p, g: (g * p * x ** (p - 1), g * x**p * np.log(x)),
    ),
}


@pytest.mark.parametrize("name", BACKWARD)
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_binary_backward_unbroadcasts(name, data):
    engine_op, (draw_a, draw_b), derivatives = BACKWARD[name]
    shape_a, shape_b = data.draw(broadcastable_shapes(), label="shapes")
    a = data.draw(draw_a(shape_a), label="a")
    b = data.draw(draw_b(shape_b), label="b")
    ta_a, ta_b = tensor(a, requires_grad=True), tensor(b, requires_grad=True)
    y = engine_op(ta_a, ta_b)
    dy = upstream(data, y.shape)
    y.backward(dy)
    full_da, full_db = (np.broadcast_to(d, y.shape) for d in derivatives(a, b, dy))
    assert ta_a.grad.shape == shape_a
    assert ta_b.grad.shape == shape_b
    assert_matches(ta_a.grad, unbroadcast(full_da, shape_a), rtol=1e-10)
    assert_matches(ta_b.grad, unbroadcast(full_db, shape_b), rtol=1e-10)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_add_same_tensor_twice_doubles_gradient(data):
    x = data.draw(shaped_arrays(), label="x")
    t = tensor(x, requires_grad=True)
    y = t + t * t
    dy = upstream(data, y.shape)
    y.backward(dy)
    assert_matches(t.grad, dy * (1 + 2 * x))


# ---------------------------------------------------------------- unary elementwise


def _stable_sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


UNARY = {
    # name: (engine fn, numpy fn, numpy derivative, (low, high))
    "exp": (lambda t: t.exp(), np.exp, np.exp, (-3.0, 3.0)),
    "log": (lambda t: t.log(), np.log, lambda x: 1 / x, (0.1, 3.0)),
    "tanh": (lambda t: t.tanh(), np.tanh, lambda x: 1 - np.tanh(x) ** 2, (-3.0, 3.0)),
    "sigmoid": (
        lambda t: t.sigmoid(),
        _stable_sigmoid,
        lambda x: _stable_sigmoid(x) * (1 - _stable_sigmoid(x)),
        (-3.0, 3.0),
    ),
    "relu": (lambda t: t.relu(), lambda x: np.maximum(x, 0.0), lambda x: (x > 0) * 1.0,
             (-3.0, 3.0)),
    "neg": (lambda t: -t, np.negative, lambda x: -np.ones_like(x), (-3.0, 3.0)),
    "sqrt": (lambda t: t.sqrt(), np.sqrt, lambda x: 0.5 / np.sqrt(x), (0.1, 3.0)),
}


@pytest.mark.parametrize("name", UNARY)
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_unary_matches_numpy(name, data):
    engine_fn, numpy_fn, derivative, (low, high) = UNARY[name]
    x = data.draw(shaped_arrays(low=low, high=high), label="x")
    t = tensor(x, requires_grad=True)
    y = engine_fn(t)
    assert_matches(y, numpy_fn(x))
    dy = upstream(data, y.shape)
    y.backward(dy)
    assert_matches(t.grad, dy * derivative(x))


@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(), slope=st.floats(0.0, 0.5))
def test_leaky_relu_matches_numpy(x, slope):
    t = tensor(x, requires_grad=True)
    y = t.leaky_relu(slope)
    assert_matches(y, np.where(x > 0, x, slope * x))
    y.backward(np.ones_like(x))
    assert_matches(t.grad, np.where(x > 0, 1.0, slope))


def test_leaky_relu_default_slope_is_one_hundredth():
    x = np.array([-2.0, -0.5, 0.0, 0.5, 2.0])
    assert_matches(tensor(x).leaky_relu(), np.where(x > 0, x, 0.01 * x))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sigmoid_large_inputs_do_not_overflow(dtype):
    x = np.array([-800.0, -50.0, -20.0, -1.0, 0.0, 1.0, 20.0, 50.0, 800.0])
    t = ta.Tensor(x, dtype=dtype, requires_grad=True)
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise"):
        warnings.simplefilter("error")
        y = t.sigmoid()
        y.sum().backward()
    expected = _stable_sigmoid(x)
    np.testing.assert_allclose(y.numpy(), expected.astype(dtype), rtol=1e-6, atol=0)
    assert np.all(np.isfinite(t.grad.numpy()))
    # atol: in float32, y(1 - y) rounds to 0 once y rounds to 1 (x > ~17).
    np.testing.assert_allclose(t.grad.numpy(), expected * (1 - expected), rtol=1e-5, atol=1e-7)


@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(low=-60.0, high=60.0))
def test_sigmoid_wide_range_matches_stable_formula(x):
    t = tensor(x, requires_grad=True)
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise"):
        warnings.simplefilter("error")
        y = t.sigmoid()
        y.backward(np.ones_like(x))
    expected = _stable_sigmoid(x)
    assert_matches(y, expected, atol=0)
    assert_matches(t.grad, expected * (1 - expected), rtol=1e-9, atol=1e-15)


# ---------------------------------------------------------------- reductions

REDUCTIONS = {"sum": np.sum, "mean": np.mean, "max": np.max}


def _reduction_grad(name: str, x: np.ndarray, axis, dy_keep: np.ndarray) -> np.ndarray:
    """d(reduction)/dx * dy, where dy_keep has the reduced axes kept as size 1."""
    if name == "sum":
        return np.broadcast_to(dy_keep, x.shape)
    if name == "mean":
        count = x.size // dy_keep.size
        return np.broadcast_to(dy_keep / count, x.shape)
    # Tied maxima share the gradient equally.
    hit = x == np.max(x, axis=axis, keepdims=True)
    count = np.sum(hit, axis=axis, keepdims=True)
    return np.where(hit, dy_keep / count, 0.0)


@pytest.mark.parametrize("name", REDUCTIONS)
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_reduction_matches_numpy(name, data):
    # Round to a coarse grid so max meets ties now and then.
    x = np.round(data.draw(shaped_arrays(), label="x"), 1)
    axis = data.draw(reduce_axes(x.ndim), label="axis")
    keepdims = data.draw(st.booleans(), label="keepdims")
    t = tensor(x, requires_grad=True)
    y = getattr(t, name)(axis=axis, keepdims=keepdims)
    expected = REDUCTIONS[name](x, axis=axis, keepdims=keepdims)
    assert_matches(y, expected)
    dy = upstream(data, y.shape)
    y.backward(dy)
    dy_keep = dy.reshape(np.sum(x, axis=axis, keepdims=True).shape)
    assert_matches(t.grad, _reduction_grad(name, x, axis, dy_keep))


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("axis", [None, 0, 2, -1, -3, (0, 2), (-1, 0), (1,), ()], ids=repr)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_axis_forms_match_numpy(name, axis, keepdims):
    # Every spelling of ``axis`` at least once, whatever hypothesis draws.
    x = np.sin(np.arange(24.0)).reshape(2, 3, 4)
    t = tensor(x, requires_grad=True)
    y = getattr(t, name)(axis=axis, keepdims=keepdims)
    assert_matches(y, REDUCTIONS[name](x, axis=axis, keepdims=keepdims))
    dy = np.cos(np.arange(y.size, dtype=np.float64)).reshape(y.shape)
    y.backward(dy)
    dy_keep = dy.reshape(np.sum(x, axis=axis, keepdims=True).shape)
    assert_matches(t.grad, _reduction_grad(name, x, axis, dy_keep))


def test_max_ties_share_gradient():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    t = tensor(x, requires_grad=True)
    t.max(axis=1).sum().backward()
    assert_matches(t.grad, [[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])


@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(min_dims=1))
def test_sum_axis_spellings_agree(x):
    # An axis given as int, negative int or 1-tuple is the same reduction.
    t = tensor(x)
    last = x.ndim - 1
    expected = np.sum(x, axis=last)
    for axis in (last, -1, (last,), (-1,)):
        assert_matches(t.sum(axis=axis), expected)


# ---------------------------------------------------------------- movement


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_reshape_matches_numpy(data):
    x = data.draw(shaped_arrays(), label="x")
    target = data.draw(reshape_targets(x.shape), label="target")
    t = tensor(x, requires_grad=True)
    y = t.reshape(target)
    assert_matches(y, x.reshape(target))
    assert_matches(t.reshape(*target), x.reshape(target))
    dy = upstream(data, y.shape)
    y.backward(dy)
    assert_matches(t.grad, dy.reshape(x.shape))


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_transpose_matches_numpy(data):
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    axis0 = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis0")
    axis1 = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis1")
    t = tensor(x, requires_grad=True)
    y = t.transpose(axis0, axis1)
    assert_matches(y, np.swapaxes(x, axis0, axis1))
    dy = upstream(data, y.shape)
    y.backward(dy)
    assert_matches(t.grad, np.swapaxes(dy, axis0, axis1))


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_permute_matches_numpy(data):
    x = data.draw(shaped_arrays(), label="x")
    axes = data.draw(st.permutations(range(x.ndim)), label="axes")
    # Some axes written as negative numbers.
    axes = tuple(a - x.ndim if data.draw(st.booleans()) else a for a in axes)
    t = tensor(x, requires_grad=True)
    y = t.permute(*axes)
    assert_matches(y, np.transpose(x, axes))
    assert_matches(t.permute(axes), np.transpose(x, axes))
    dy = upstream(data, y.shape)
    y.backward(dy)
    assert_matches(t.grad, np.transpose(dy, np.argsort([a % max(x.ndim, 1) for a in axes])))


@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays())
def test_T_reverses_all_axes(x):
    assert_matches(tensor(x).T, x.T)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_expand_matches_numpy(data):
    out_shape = data.draw(shapes(), label="out_shape")
    in_shape = data.draw(broadcastable_to(out_shape), label="in_shape")
    x = data.draw(arrays(in_shape), label="x")
    t = tensor(x, requires_grad=True)
    y = t.expand(out_shape)
    assert_matches(y, np.broadcast_to(x, out_shape))
    assert_matches(t.expand(*out_shape), np.broadcast_to(x, out_shape))
    dy = upstream(data, y.shape)
    y.backward(dy)
    assert t.grad.shape == in_shape
    assert_matches(t.grad, unbroadcast(dy, in_shape))


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_squeeze_unsqueeze_match_numpy(data):
    x = data.draw(shaped_arrays(max_dims=3), label="x")
    axis = data.draw(st.integers(-x.ndim - 1, x.ndim), label="axis")
    t = tensor(x)
    assert_matches(t.unsqueeze(axis), np.expand_dims(x, axis))
    assert_matches(t.squeeze(), np.squeeze(x))


# ---------------------------------------------------------------- indexing


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_getitem_basic_index_matches_numpy(data):
    # Ints, slices (negative steps too), None and Ellipsis.
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    index = data.draw(basic_indices(x.shape), label="index")
    t = tensor(x, requires_grad=True)
    y = t[index]
    assert_matches(y, x[index])
    dy = upstream(data, y.shape)
    y.backward(dy)
    # A basic index picks each entry at most once: the gradient is dy written in place.
    expected = np.zeros_like(x)
    expected[index] = dy
    assert_matches(t.grad, expected)


def test_getitem_negative_steps_reverse():
    x = np.arange(12.0).reshape(3, 4)
    t = tensor(x, requires_grad=True)
    y = t[::-1, ::-2]
    assert_matches(y, [[11.0, 9.0], [7.0, 5.0], [3.0, 1.0]])
    y.backward(np.arange(6.0).reshape(3, 2))
    assert_matches(t.grad, [[0, 5, 0, 4], [0, 3, 0, 2], [0, 1, 0, 0]])


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_getitem_integer_array_repeats_accumulate(data):
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    rows = data.draw(integer_indices(x.shape[0]), label="rows")
    as_list = data.draw(st.booleans(), label="as_list")
    t = tensor(x, requires_grad=True)
    y = t[rows.tolist()] if as_list else t[rows]
    assert_matches(y, x[rows])
    dy = upstream(data, y.shape)
    y.backward(dy)
    expected = np.zeros_like(x)
    for k, row in enumerate(rows):
        expected[row] += dy[k]
    assert_matches(t.grad, expected)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_getitem_two_integer_arrays_accumulate(data):
    x = data.draw(shaped_arrays(min_dims=2, max_dims=3), label="x")
    n = data.draw(st.integers(1, 6), label="n")
    rows = data.draw(integer_indices(x.shape[0], min_size=n, max_size=n), label="rows")
    cols = data.draw(integer_indices(x.shape[1], min_size=n, max_size=n), label="cols")
    t = tensor(x, requires_grad=True)
    y = t[ta.Tensor(rows), cols]
    assert_matches(y, x[rows, cols])
    dy = upstream(data, y.shape)
    y.backward(dy)
    expected = np.zeros_like(x)
    for k in range(n):
        expected[rows[k], cols[k]] += dy[k]
    assert_matches(t.grad, expected)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_getitem_boolean_mask_matches_numpy(data):
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    # A mask over the leading axes (all of them, or fewer).
    axes = data.draw(st.integers(1, x.ndim), label="mask_axes")
    mask = data.draw(masks(x.shape[:axes]), label="mask")
    as_tensor = data.draw(st.booleans(), label="as_tensor")
    t = tensor(x, requires_grad=True)
    y = t[ta.Tensor(mask)] if as_tensor else t[mask]
    assert_matches(y, x[mask])
    dy = upstream(data, y.shape)
    y.backward(dy)
    expected = np.zeros_like(x)
    expected[mask] = dy
    assert_matches(t.grad, expected)


# ---------------------------------------------------------------- cat, stack, where, masked_fill


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_cat_matches_numpy(data):
    shape = data.draw(shapes(min_dims=1), label="shape")
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3), label="sizes")
    pieces = []
    for size in sizes:
        piece_shape = list(shape)
        piece_shape[axis] = size
        pieces.append(data.draw(arrays(tuple(piece_shape)), label="piece"))
    ts = [tensor(p, requires_grad=True) for p in pieces]
    y = ta.cat(ts, axis=axis)
    assert_matches(y, np.concatenate(pieces, axis=axis))
    dy = upstream(data, y.shape)
    y.backward(dy)
    bounds = np.cumsum(sizes)[:-1]
    for t, expected in zip(ts, np.split(dy, bounds, axis=axis), strict=True):
        assert_matches(t.grad, expected)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_stack_matches_numpy(data):
    shape = data.draw(shapes(max_dims=3), label="shape")
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)), label="axis")
    count = data.draw(st.integers(1, 3), label="count")
    pieces = [data.draw(arrays(shape), label="piece") for _ in range(count)]
    ts = [tensor(p, requires_grad=True) for p in pieces]
    y = ta.stack(ts, axis=axis)
    assert_matches(y, np.stack(pieces, axis=axis))
    dy = upstream(data, y.shape)
    y.backward(dy)
    for k, t in enumerate(ts):
        assert_matches(t.grad, np.take(dy, k, axis=axis))


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_where_matches_numpy_with_broadcasting(data):
    shape_c, shape_a, shape_b = data.draw(broadcastable_shapes(num_shapes=3), label="shapes")
    cond = data.draw(masks(shape_c), label="cond")
    a = data.draw(arrays(shape_a), label="a")
    b = data.draw(arrays(shape_b), label="b")
    ta_a, ta_b = tensor(a, requires_grad=True), tensor(b, requires_grad=True)
    y = ta.where(ta.Tensor(cond), ta_a, ta_b)
    assert_matches(y, np.where(cond, a, b))
    dy = upstream(data, y.shape)
    y.backward(dy)
    full_cond = np.broadcast_to(cond, y.shape)
    assert_matches(ta_a.grad, unbroadcast(np.where(full_cond, dy, 0.0), shape_a))
    assert_matches(ta_b.grad, unbroadcast(np.where(full_cond, 0.0, dy), shape_b))


@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(), c=st.floats(-2.0, 2.0))
def test_where_accepts_scalars_and_tensor_conditions(x, c):
    t = tensor(x)
    assert_matches(ta.where(t > 0, t, c), np.where(x > 0, x, c))
    assert_matches(ta.where(x > 0, c, t), np.where(x > 0, c, x))


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_masked_fill_matches_numpy(data):
    x = data.draw(shaped_arrays(), label="x")
    mask = data.draw(masks(data.draw(broadcastable_to(x.shape), label="mask_shape")),
                     label="mask")
    value = data.draw(st.sampled_from([-np.inf, -1e9, 0.0, 2.5]), label="value")
    t = tensor(x, requires_grad=True)
    y = t.masked_fill(mask, value)
    assert_matches(y, np.where(mask, value, x))
    assert_matches(t.masked_fill(ta.Tensor(mask), value), np.where(mask, value, x))
    dy = upstream(data, y.shape)
    y.backward(dy)
    assert_matches(t.grad, np.where(mask, 0.0, dy))


# ---------------------------------------------------------------- softmax family


def _numpy_softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _numpy_log_softmax(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _softmax_vjp(y, dy, axis):
    """dy through the softmax Jacobian diag(y) - y y^T, built explicitly per row."""
    ym, gm = np.moveaxis(y, axis, -1), np.moveaxis(dy, axis, -1)
    jacobian = ym[..., :, None] * np.eye(ym.shape[-1]) - ym[..., :, None] * ym[..., None, :]
    return np.moveaxis(np.einsum("...ij,...i->...j", jacobian, gm), -1, axis)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_softmax_matches_numpy_along_each_axis(data):
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    dy = upstream(data, x.shape)
    for axis in range(-x.ndim, x.ndim):
        t = tensor(x, requires_grad=True)
        y = t.softmax(axis=axis)
        expected = _numpy_softmax(x, axis)
        assert_matches(y, expected)
        np.testing.assert_allclose(y.numpy().sum(axis=axis), 1.0, rtol=1e-12)
        y.backward(dy)
        assert_matches(t.grad, _softmax_vjp(expected, dy, axis))


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_log_softmax_matches_numpy_along_each_axis(data):
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    dy = upstream(data, x.shape)
    for axis in range(-x.ndim, x.ndim):
        t = tensor(x, requires_grad=True)
        y = t.log_softmax(axis=axis)
        assert_matches(y, _numpy_log_softmax(x, axis))
        np.testing.assert_allclose(np.exp(y.numpy()).sum(axis=axis), 1.0, rtol=1e-12)
        y.backward(dy)
        expected = dy - _numpy_softmax(x, axis) * np.sum(dy, axis=axis, keepdims=True)
        assert_matches(t.grad, expected)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(min_dims=1))
def test_softmax_large_logits_do_not_overflow(name, x):
    logits = x * (1e4 / 3.0)  # entries up to 1e4
    with np.errstate(over="raise", invalid="raise"):
        y = getattr(tensor(logits), name)(axis=-1).numpy()
    reference = _numpy_softmax if name == "softmax" else _numpy_log_softmax
    assert np.all(np.isfinite(y))
    assert_matches(y, reference(logits, -1), rtol=1e-12, atol=1e-9)


def test_softmax_all_masked_row_gives_zeros():
    x = np.array([[0.5, -1.0, 2.0, 0.0],
                  [-np.inf, -np.inf, -np.inf, -np.inf],
                  [1.0, -np.inf, 3.0, -np.inf]])
    t = tensor(x, requires_grad=True)
    with np.errstate(invalid="raise"):
        y = t.softmax(axis=-1)
        y.backward(np.ones_like(x) + np.arange(4.0))
    assert_matches(y[1], np.zeros(4))
    assert_matches(y[2], [np.exp(-2) / (1 + np.exp(-2)), 0.0, 1 / (1 + np.exp(-2)), 0.0])
    assert not np.isnan(y.numpy()).any()
    assert not np.isnan(t.grad.numpy()).any()
    assert_matches(t.grad[1], np.zeros(4))


def test_softmax_masked_fill_neg_inf_gives_zero_weight_and_gradient():
    x = np.array([[0.3, 1.2, -0.7], [2.0, 0.1, -0.4]])
    mask = np.array([[False, True, False], [True, True, True]])
    t = tensor(x, requires_grad=True)
    y = t.masked_fill(mask, -np.inf).softmax(axis=-1)
    y.backward(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    assert_matches(y, [list(_numpy_softmax(np.array([0.3, -np.inf, -0.7]), -1)), [0, 0, 0]])
    assert_matches(t.grad[1], np.zeros(3))
    assert t.grad.numpy()[0, 1] == 0.0


# ---------------------------------------------------------------- matmul


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_matmul_matches_numpy_with_1d_and_batched_operands(data):
    n, k, m = (data.draw(st.integers(1, 4), label=name) for name in "nkm")
    batch_a, batch_b = data.draw(broadcastable_shapes(max_dims=2), label="batch")
    a_is_vector = data.draw(st.booleans(), label="a_is_vector")
    b_is_vector = data.draw(st.booleans(), label="b_is_vector")
    shape_a = (k,) if a_is_vector else batch_a + (n, k)
    shape_b = (k,) if b_is_vector else batch_b + (k, m)
    a = data.draw(arrays(shape_a), label="a")
    b = data.draw(arrays(shape_b), label="b")
    ta_a, ta_b = tensor(a, requires_grad=True), tensor(b, requires_grad=True)
    y = ta_a @ ta_b
    expected = a @ b
    assert_matches(y, expected)
    dy = upstream(data, y.shape)
    y.backward(dy)
    # Promote vectors to matrices, take the matrix gradients, and fold the batch back.
    a2 = a[None, :] if a_is_vector else a
    b2 = b[:, None] if b_is_vector else b
    dy2 = np.asarray(dy).reshape(np.matmul(a2, b2).shape)
    da2 = np.matmul(dy2, np.swapaxes(b2, -1, -2))
    db2 = np.matmul(np.swapaxes(a2, -1, -2), dy2)
    assert_matches(ta_a.grad, unbroadcast(da2, a2.shape).reshape(shape_a))
    assert_matches(ta_b.grad, unbroadcast(db2, b2.shape).reshape(shape_b))


# ---------------------------------------------------------------- non-contiguous inputs

ONE_INPUT = {
    "exp": lambda t: t.exp(),
    "tanh": lambda t: t.tanh(),
    "relu": lambda t: t.relu(),
    "mul_self": lambda t: t * t,
    "sum_first_axis": lambda t: t.sum(axis=0),
    "mean_all": lambda t: t.mean(),
    "max_last_axis": lambda t: t.max(axis=-1, keepdims=True),
    "softmax_last_axis": lambda t: t.softmax(axis=-1),
    "log_softmax_first_axis": lambda t: t.log_softmax(axis=0),
    "reshape_flat": lambda t: t.reshape(-1),
    "permute_reverse": lambda t: t.T,
    "getitem_reverse": lambda t: t[::-1],
    "getitem_repeat": lambda t: t[[0, 0, -1]],
    "expand_front": lambda t: t.expand((2,) + t.shape),
    "cat_with_self": lambda t: ta.cat([t, t], axis=-1),
}


@pytest.mark.parametrize("name", ONE_INPUT)
@settings(deadline=None, max_examples=15)
@given(data=st.data())
def test_non_contiguous_input_matches_contiguous_copy(name, data):
    fn = ONE_INPUT[name]
    view = data.draw(non_contiguous_arrays(data.draw(shapes(min_dims=1), label="shape")),
                     label="view")
    before = view.copy()
    copy = contiguous(view)
    from_view, from_copy = tensor(view, requires_grad=True), tensor(copy, requires_grad=True)
    y_view, y_copy = fn(from_view), fn(from_copy)
    np.testing.assert_array_equal(y_view.numpy(), y_copy.numpy())
    # The upstream gradient is itself a non-contiguous view.
    dy = data.draw(non_contiguous_arrays(y_copy.shape), label="dy")
    y_view.backward(dy)
    y_copy.backward(contiguous(dy))
    np.testing.assert_array_equal(from_view.grad.numpy(), from_copy.grad.numpy())
    np.testing.assert_array_equal(view, before)  # the input was not written to


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_matmul_non_contiguous_operands_match_contiguous_copies(data):
    n, k, m = (data.draw(st.integers(1, 4), label=name) for name in "nkm")
    a = data.draw(non_contiguous_arrays((2, n, k)), label="a")
    b = data.draw(non_contiguous_arrays((k, m)), label="b")
    y_view = tensor(a) @ tensor(b)
    y_copy = tensor(contiguous(a)) @ tensor(contiguous(b))
    np.testing.assert_array_equal(y_view.numpy(), y_copy.numpy())
    assert_matches(y_view, a @ b)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_add_non_contiguous_broadcast_matches_numpy(data):
    shape_a, shape_b = data.draw(broadcastable_shapes(min_dims=1), label="shapes")
    a = data.draw(non_contiguous_arrays(shape_a), label="a")
    b = data.draw(non_contiguous_arrays(shape_b), label="b")
    ta_a, ta_b = tensor(a, requires_grad=True), tensor(b, requires_grad=True)
    y = ta_a + ta_b
    assert_matches(y, a + b)
    dy = upstream(data, y.shape)
    y.backward(dy)
    assert_matches(ta_a.grad, unbroadcast(dy, shape_a))
    assert_matches(ta_b.grad, unbroadcast(dy, shape_b))
