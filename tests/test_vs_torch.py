"""Values and gradients against PyTorch (CPU): float64 with tight tolerance, a few float32.

Each check builds the same expression on engine tensors and on torch tensors made from the
same arrays, compares the outputs, then runs backward with one fixed random cotangent
``dy`` on both sides and compares the gradient of every input.

Where the engine deliberately departs from PyTorch it is stated at the test: classes sit
on the last axis (so (B, T, C) logits are compared with torch on (B*T, C)), and a 'mean'
loss over rows that are all ignored is 0, not NaN.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tests import optional
from tests.strategies import (
    arrays,
    broadcastable_shapes,
    broadcastable_to,
    forward_slices,
    integer_indices,
    masks,
    nonzero_arrays,
    positive_arrays,
    reduce_axes,
    reshape_targets,
    shaped_arrays,
    shapes,
)

torch = optional.module("torch", optional.TORCH_REASON)
TF = torch.nn.functional

EXAMPLES = 25
TOLERANCE = {"float64": {"rtol": 1e-10, "atol": 1e-12}, "float32": {"rtol": 1e-5, "atol": 1e-6}}
TORCH_DTYPE = {"float64": torch.float64, "float32": torch.float32}


def assert_same(actual, expected, dtype: str = "float64") -> None:
    """Engine result (Tensor or array) against a torch result: shape, dtype and values."""
    actual = actual.numpy() if isinstance(actual, ta.Tensor) else np.asarray(actual)
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != torch {expected.shape}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != torch {expected.dtype}"
    if actual.dtype.kind == "f":
        np.testing.assert_allclose(actual, expected, **TOLERANCE[dtype])
    else:
        np.testing.assert_array_equal(actual, expected)


def as_torch(a) -> torch.Tensor:
    """A constant torch tensor from an array of any layout (torch rejects negative strides)."""
    return torch.tensor(np.array(a, order="C"))


def cotangent(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape).astype(dtype)


def leaves(arrays_in, dtype: str):
    """The same values as engine leaves and as torch leaves, all requiring grad.

    The engine gets the arrays as drawn (often non-contiguous views); torch gets C-ordered
    copies, since it rejects negative strides."""
    engine = [ta.Tensor(a, dtype=dtype, requires_grad=True) for a in arrays_in]
    reference = [torch.tensor(np.array(a, order="C"), dtype=TORCH_DTYPE[dtype],
                              requires_grad=True)
                 for a in arrays_in]
    return engine, reference


def assert_grads_same(engine_leaves, torch_leaves, dtype: str) -> None:
    for k, (t, r) in enumerate(zip(engine_leaves, torch_leaves, strict=True)):
        # An input that no output depends on has no gradient on either side: zeros.
        expected = np.zeros(r.shape, dtype) if r.grad is None else r.grad
        actual = np.zeros(t.shape, dtype) if t.grad is None else t.grad
        try:
            assert_same(actual, expected, dtype)
        except AssertionError as err:
            raise AssertionError(f"gradient of input {k}: {err}") from None


def check(engine_fn, torch_fn, *arrays_in, dtype: str = "float64", seed: int = 0) -> None:
    """Compare ``engine_fn(*tensors)`` with ``torch_fn(*tensors)``: the value, and the
    gradient of every input for the cotangent ``dy`` (a fixed random array)."""
    engine, reference = leaves(arrays_in, dtype)
    y = engine_fn(*engine)
    y_ref = torch_fn(*reference)
    assert_same(y, y_ref, dtype)
    dy = cotangent(y.shape, dtype, seed)
    y.backward(dy)
    y_ref.backward(torch.tensor(dy))
    assert_grads_same(engine, reference, dtype)


# ---------------------------------------------------------------- elementwise arithmetic

BINARY = {
    # name: (engine op, torch op, strategy for a, strategy for b)
    "add": (operator.add, operator.add, arrays, arrays),
    "sub": (operator.sub, operator.sub, arrays, arrays),
    "mul": (operator.mul, operator.mul, arrays, arrays),
    "div": (operator.truediv, operator.truediv, arrays, nonzero_arrays),
    "pow": (operator.pow, operator.pow, positive_arrays, arrays),
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", BINARY)
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_binary_matches_torch_with_broadcasting(name, dtype, data):
    engine_op, torch_op, draw_a, draw_b = BINARY[name]
    shape_a, shape_b = data.draw(broadcastable_shapes(), label="shapes")
    a = data.draw(draw_a(shape_a), label="a")
    b = data.draw(draw_b(shape_b), label="b")
    check(engine_op, torch_op, a, b, dtype=dtype)


def _scalar_expression(x):
    # Every reflected and scalar form: + - * / ** on both sides, unary - and +.
    return (2.0 - x) * 3 + 1.5 / x - x**3 + 2.0**x - x / 4 + (x + 1) * 0.5 - (+x) + (-x) ** 2


@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(low=0.5, high=3.0))
def test_scalar_operands_match_torch(x):
    check(_scalar_expression, _scalar_expression, x)


def test_scalar_operands_match_torch_in_float32():
    # Python scalars take the tensor's dtype: nothing is promoted to float64.
    x = np.linspace(0.5, 3.0, 12).reshape(3, 4)
    check(_scalar_expression, _scalar_expression, x, dtype="float32")


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_numpy_array_operand_matches_torch(data):
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    c = data.draw(arrays(x.shape[1:]), label="c")
    # An ndarray on either side becomes a constant; the other operand keeps its gradient.
    check(lambda t: c * t + t / (c**2 + 1.0) - c,
          lambda t: as_torch(c) * t + t / as_torch(c**2 + 1.0) - as_torch(c), x)


UNARY = {
    # name: (engine fn, torch fn, (low, high))
    "neg": (lambda t: -t, lambda t: -t, (-3.0, 3.0)),
    "exp": (lambda t: t.exp(), torch.exp, (-3.0, 3.0)),
    "log": (lambda t: t.log(), torch.log, (0.1, 3.0)),
    "sqrt": (lambda t: t.sqrt(), torch.sqrt, (0.1, 3.0)),
    "tanh": (lambda t: t.tanh(), torch.tanh, (-3.0, 3.0)),
    "sigmoid": (lambda t: t.sigmoid(), torch.sigmoid, (-3.0, 3.0)),
    "relu": (lambda t: t.relu(), torch.relu, (-3.0, 3.0)),
    "leaky_relu": (lambda t: t.leaky_relu(), TF.leaky_relu, (-3.0, 3.0)),
    "leaky_relu_0.2": (lambda t: t.leaky_relu(0.2), lambda t: TF.leaky_relu(t, 0.2),
                       (-3.0, 3.0)),
}


@pytest.mark.parametrize("name", UNARY)
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_unary_matches_torch(name, data):
    engine_fn, torch_fn, (low, high) = UNARY[name]
    x = data.draw(shaped_arrays(low=low, high=high), label="x")
    check(engine_fn, torch_fn, x)


@pytest.mark.parametrize("name", UNARY)
def test_unary_matches_torch_in_float32(name):
    engine_fn, torch_fn, (low, high) = UNARY[name]
    x = np.linspace(low, high, 24).reshape(2, 3, 4)
    check(engine_fn, torch_fn, x, dtype="float32")


@pytest.mark.parametrize("name", ["relu", "leaky_relu_0.2"])
def test_relu_gradient_at_zero_matches_torch(name):
    engine_fn, torch_fn, _ = UNARY[name]
    check(engine_fn, torch_fn, np.array([-1.0, 0.0, -0.0, 1.0]))


def test_sigmoid_extreme_inputs_match_torch():
    x = np.array([-800.0, -50.0, -20.0, 0.0, 20.0, 50.0, 800.0])
    check(lambda t: t.sigmoid(), torch.sigmoid, x)
    check(lambda t: t.sigmoid(), torch.sigmoid, x, dtype="float32")


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_comparisons_match_torch(data):
    shape_a, shape_b = data.draw(broadcastable_shapes(), label="shapes")
    # A coarse grid makes equal entries common.
    a = np.round(data.draw(arrays(shape_a), label="a"))
    b = np.round(data.draw(arrays(shape_b), label="b"))
    ta_a, ta_b = ta.Tensor(a, dtype="float64"), ta.Tensor(b, dtype="float64")
    th_a, th_b = torch.tensor(a), torch.tensor(b)
    for op in (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge):
        assert_same(op(ta_a, ta_b), op(th_a, th_b))
        assert_same(op(ta_a, 1.0), op(th_a, 1.0))


def test_cast_gradient_matches_torch():
    x = np.linspace(-2.0, 2.0, 6).reshape(2, 3)
    check(lambda t: (t.astype("float32") * 3.0).double().tanh(),
          lambda t: (t.float() * 3.0).double().tanh(), x)


# ---------------------------------------------------------------- where and masked_fill


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_where_matches_torch_with_broadcasting(data):
    shape_c, shape_a, shape_b = data.draw(broadcastable_shapes(num_shapes=3), label="shapes")
    cond = data.draw(masks(shape_c), label="cond")
    a = data.draw(arrays(shape_a), label="a")
    b = data.draw(arrays(shape_b), label="b")
    check(lambda x, y: ta.where(ta.Tensor(cond), x, y),
          lambda x, y: torch.where(torch.tensor(cond), x, y), a, b)


@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(), c=st.floats(-2.0, 2.0))
def test_where_with_scalar_matches_torch(x, c):
    check(lambda t: ta.where(t > 0, t * 2, c), lambda t: torch.where(t > 0, t * 2, c), x)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_masked_fill_matches_torch(data):
    x = data.draw(shaped_arrays(), label="x")
    mask = data.draw(masks(data.draw(broadcastable_to(x.shape), label="mask_shape")),
                     label="mask")
    value = data.draw(st.sampled_from([-1e9, 0.0, 2.5]), label="value")
    check(lambda t: t.masked_fill(mask, value) * 2,
          lambda t: t.masked_fill(torch.tensor(mask), value) * 2, x)


# ---------------------------------------------------------------- reductions


def _torch_reduce(name: str, t, axis, keepdims: bool):
    if name == "max":
        # amax (like the engine) splits the gradient evenly between tied maxima.
        return torch.amax(t, dim=() if axis is None else axis, keepdim=keepdims)
    return getattr(torch, name)(t, dim=axis, keepdim=keepdims)


@pytest.mark.parametrize("name", ["sum", "mean", "max"])
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_reduction_matches_torch(name, data):
    x = data.draw(shaped_arrays(), label="x")
    if name == "max":
        x = np.round(x, 1)  # ties now and then
    # torch reads an empty axis tuple as "all axes", numpy (and the engine) as "none".
    axis = data.draw(reduce_axes(x.ndim).filter(lambda a: a != ()), label="axis")
    keepdims = data.draw(st.booleans(), label="keepdims")
    check(lambda t: getattr(t, name)(axis=axis, keepdims=keepdims),
          lambda t: _torch_reduce(name, t, axis, keepdims), x)


@pytest.mark.parametrize("name", ["sum", "mean", "max"])
def test_reduction_matches_torch_in_float32(name):
    x = np.sin(np.arange(60.0)).reshape(3, 4, 5)
    check(lambda t: getattr(t, name)(axis=(0, -1), keepdims=True),
          lambda t: _torch_reduce(name, t, (0, -1), True), x, dtype="float32")


# ---------------------------------------------------------------- movement


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_reshape_matches_torch(data):
    x = data.draw(shaped_arrays(), label="x")
    target = data.draw(reshape_targets(x.shape), label="target")
    check(lambda t: t.reshape(target) * 2, lambda t: t.reshape(target) * 2, x)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_permute_and_transpose_match_torch(data):
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    axes = data.draw(st.permutations(range(x.ndim)), label="axes")
    axis0 = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis0")
    axis1 = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis1")
    reverse = tuple(reversed(range(x.ndim)))
    check(lambda t: t.permute(*axes) * t.permute(axes), lambda t: t.permute(*axes) ** 2, x)
    check(lambda t: t.T, lambda t: t.permute(reverse), x)
    check(lambda t: t.transpose(axis0, axis1), lambda t: t.transpose(axis0, axis1), x)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_expand_matches_torch(data):
    out_shape = data.draw(shapes(), label="out_shape")
    x = data.draw(arrays(data.draw(broadcastable_to(out_shape), label="in_shape")), label="x")
    check(lambda t: t.expand(out_shape) * 1.5, lambda t: t.expand(out_shape) * 1.5, x)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_squeeze_unsqueeze_match_torch(data):
    x = data.draw(shaped_arrays(max_dims=3), label="x")
    axis = data.draw(st.integers(-x.ndim - 1, x.ndim), label="axis")
    check(lambda t: t.unsqueeze(axis).squeeze(axis), lambda t: t.unsqueeze(axis).squeeze(axis), x)
    check(lambda t: t.unsqueeze(axis), lambda t: t.unsqueeze(axis), x)
    # squeeze() with no axis drops every size-1 axis on both sides.
    check(lambda t: t.squeeze(), lambda t: t.squeeze(), x)


@st.composite
def _torch_indices(draw, shape):
    """Ints, positive-step slices, None and Ellipsis: indices torch also accepts.  Parts
    before an Ellipsis index the leading axes, parts after it the trailing ones."""

    def part(side):
        return draw(st.integers(-side, side - 1) | forward_slices(side))

    lead = draw(st.integers(0, len(shape)))
    parts = [part(side) for side in shape[:lead]]
    if draw(st.booleans()):
        trail = draw(st.integers(0, len(shape) - lead))
        parts += [Ellipsis] + [part(side) for side in shape[len(shape) - trail:]]
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), None)
    return tuple(parts)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_getitem_basic_index_matches_torch(data):
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    index = data.draw(_torch_indices(x.shape), label="index")
    check(lambda t: t[index], lambda t: t[index], x)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_getitem_repeated_integer_indices_accumulate_like_torch(data):
    x = data.draw(shaped_arrays(min_dims=2, max_dims=3), label="x")
    rows = data.draw(integer_indices(x.shape[0]), label="rows")
    cols = data.draw(integer_indices(x.shape[1], min_size=len(rows), max_size=len(rows)),
                     label="cols")
    check(lambda t: t[rows], lambda t: t[torch.tensor(rows)], x)
    check(lambda t: t[ta.Tensor(rows), cols], lambda t: t[torch.tensor(rows), torch.tensor(cols)],
          x)
    check(lambda t: t[:, cols.tolist()], lambda t: t[:, torch.tensor(cols)], x)


def test_getitem_repeated_index_gradient_counts_repeats():
    x = np.arange(4.0)
    engine, reference = leaves([x], "float64")
    engine[0][[1, 1, 1, 3]].sum().backward()
    reference[0][torch.tensor([1, 1, 1, 3])].sum().backward()
    assert_same(engine[0].grad, reference[0].grad)
    assert_same(engine[0].grad, np.array([0.0, 3.0, 0.0, 1.0]))


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_getitem_boolean_mask_matches_torch(data):
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    mask = data.draw(masks(x.shape[: data.draw(st.integers(1, x.ndim))]), label="mask")
    check(lambda t: t[mask], lambda t: t[torch.tensor(mask)], x)


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_cat_and_stack_match_torch(data):
    shape = data.draw(shapes(min_dims=1, max_dims=3), label="shape")
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    new_axis = data.draw(st.integers(-len(shape) - 1, len(shape)), label="new_axis")
    wide = list(shape)
    wide[axis] += 2
    a = data.draw(arrays(shape), label="a")
    b = data.draw(arrays(tuple(wide)), label="b")
    c = data.draw(arrays(shape), label="c")
    check(lambda x, y, z: ta.cat([x, y, z], axis=axis),
          lambda x, y, z: torch.cat([x, y, z], dim=axis), a, b, c)
    check(lambda x, z: ta.stack([x, z, x], axis=new_axis),
          lambda x, z: torch.stack([x, z, x], dim=new_axis), a, c)


# ---------------------------------------------------------------- matmul


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_matmul_matches_torch_batched_and_1d(data):
    n, k, m = (data.draw(st.integers(1, 4), label=name) for name in "nkm")
    batch_a, batch_b = data.draw(broadcastable_shapes(max_dims=2), label="batch")
    a_is_vector = data.draw(st.booleans(), label="a_is_vector")
    b_is_vector = data.draw(st.booleans(), label="b_is_vector")
    a = data.draw(arrays((k,) if a_is_vector else batch_a + (n, k)), label="a")
    b = data.draw(arrays((k,) if b_is_vector else batch_b + (k, m)), label="b")
    check(operator.matmul, torch.matmul, a, b)


def test_matmul_matches_torch_in_float32():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 1, 3, 5)), rng.normal(size=(4, 5, 2))
    check(operator.matmul, torch.matmul, a, b, dtype="float32")


# ---------------------------------------------------------------- softmax family


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_softmax_matches_torch_along_each_axis(name, data):
    x = data.draw(shaped_arrays(min_dims=1), label="x")
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    check(lambda t: getattr(t, name)(axis=axis), lambda t: getattr(torch, name)(t, dim=axis), x)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_softmax_large_logits_match_torch(name, dtype):
    x = np.array([[1e4, 0.0, -1e4, 9999.0], [-3.0, 1.0, 2.0, 0.5]])
    check(lambda t: getattr(t, name)(axis=-1), lambda t: getattr(torch, name)(t, dim=-1), x,
          dtype=dtype)


# ---------------------------------------------------------------- losses


@st.composite
def _classification(draw, max_rows: int = 6, max_classes: int = 5):
    """(logits (N, C), target (N,), ignore_index or None) with at least one row kept."""
    rows = draw(st.integers(1, max_rows))
    classes = draw(st.integers(1, max_classes))
    logits = draw(arrays((rows, classes), layout="contiguous"))
    target = np.asarray(draw(st.lists(st.integers(0, classes - 1), min_size=rows,
                                      max_size=rows)), dtype=np.int64)
    ignore_index = draw(st.none() | st.sampled_from(sorted(set(target.tolist()))))
    if ignore_index is not None and np.all(target == ignore_index):
        ignore_index = None  # torch's 'mean' over zero rows is NaN; tested separately
    return logits, target, ignore_index


def _torch_ignore(ignore_index):
    return -100 if ignore_index is None else ignore_index


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@settings(deadline=None, max_examples=EXAMPLES)
@given(case=_classification())
def test_cross_entropy_matches_torch(reduction, case):
    logits, target, ignore_index = case
    check(lambda t: ta.functional.cross_entropy(t, target, ignore_index=ignore_index,
                                                reduction=reduction),
          lambda t: TF.cross_entropy(t, torch.tensor(target),
                                     ignore_index=_torch_ignore(ignore_index),
                                     reduction=reduction),
          logits)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_torch_in_float32(reduction):
    rng = np.random.default_rng(2)
    logits, target = rng.normal(size=(7, 5)) * 3, rng.integers(0, 5, size=7)
    check(lambda t: ta.functional.cross_entropy(t, ta.Tensor(target), ignore_index=2,
                                                reduction=reduction),
          lambda t: TF.cross_entropy(t, torch.tensor(target), ignore_index=2, reduction=reduction),
          logits, dtype="float32")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [None, 0])
def test_cross_entropy_classes_last_matches_torch_on_flattened_rows(reduction, ignore_index):
    # The engine takes (B, T, C) logits with classes last; torch wants (N, C), so torch
    # sees the (B*T, C) reshape (its 'none' result reshaped back to (B, T)).
    B, T, C = 2, 3, 5
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(B, T, C))
    target = np.array([[1, 0, 4], [0, 2, 2]])

    def reference(t):
        loss = TF.cross_entropy(t.reshape(B * T, C), torch.tensor(target.reshape(-1)),
                                ignore_index=_torch_ignore(ignore_index), reduction=reduction)
        return loss.reshape(B, T) if reduction == "none" else loss

    check(lambda t: ta.functional.cross_entropy(t, target.tolist(), ignore_index=ignore_index,
                                                reduction=reduction),
          reference, logits)


def test_cross_entropy_large_logits_match_torch():
    logits = np.array([[1e4, 0.0, -1e4], [0.0, 5e3, 5e3], [-1e4, -1e4, -1e4]])
    target = np.array([1, 2, 0])
    check(lambda t: ta.functional.cross_entropy(t, target),
          lambda t: TF.cross_entropy(t, torch.tensor(target)), logits)


def test_cross_entropy_all_rows_ignored_mean_is_zero_not_nan():
    # A deliberate departure: torch's 'mean' over zero kept rows is NaN, the engine's is 0.
    logits = ta.Tensor(np.ones((3, 4)), dtype="float64", requires_grad=True)
    loss = ta.functional.cross_entropy(logits, [1, 1, 1], ignore_index=1)
    loss.backward()
    assert loss.item() == 0.0
    assert_same(logits.grad, np.zeros((3, 4)))
    reference = TF.cross_entropy(torch.ones(3, 4, dtype=torch.float64), torch.tensor([1, 1, 1]),
                                 ignore_index=1)
    assert torch.isnan(reference)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@settings(deadline=None, max_examples=EXAMPLES)
@given(case=_classification())
def test_nll_loss_matches_torch(reduction, case):
    logits, target, ignore_index = case
    torch_ignore = _torch_ignore(ignore_index)
    # On log-probabilities, the usual pairing with log_softmax...
    check(lambda t: ta.functional.nll_loss(t.log_softmax(axis=-1), target,
                                           ignore_index=ignore_index, reduction=reduction),
          lambda t: TF.nll_loss(torch.log_softmax(t, dim=-1), torch.tensor(target),
                                ignore_index=torch_ignore, reduction=reduction),
          logits)
    # ...and on arbitrary scores, which nll_loss does not require to be normalised.
    check(lambda t: ta.functional.nll_loss(t * 2, target, ignore_index=ignore_index,
                                           reduction=reduction),
          lambda t: TF.nll_loss(t * 2, torch.tensor(target), ignore_index=torch_ignore,
                                reduction=reduction),
          logits)


def test_nll_loss_classes_last_matches_torch_on_flattened_rows():
    rng = np.random.default_rng(4)
    logits, target = rng.normal(size=(2, 3, 4)), rng.integers(0, 4, size=(2, 3))
    check(lambda t: ta.functional.nll_loss(t.log_softmax(), target, ignore_index=3),
          lambda t: TF.nll_loss(torch.log_softmax(t, -1).reshape(6, 4),
                                torch.tensor(target.reshape(-1)), ignore_index=3),
          logits)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_mse_loss_matches_torch(reduction, data):
    shape = data.draw(shapes(), label="shape")
    x = data.draw(arrays(shape), label="input")
    y = data.draw(arrays(shape), label="target")
    # Both the input and a Tensor target get gradients.
    check(lambda a, b: ta.functional.mse_loss(a, b, reduction=reduction),
          lambda a, b: TF.mse_loss(a, b, reduction=reduction), x, y)
    # A numpy target is a constant.
    check(lambda a: ta.functional.mse_loss(a, y, reduction=reduction),
          lambda a: TF.mse_loss(a, as_torch(y), reduction=reduction), x)


# ---------------------------------------------------------------- embedding


@pytest.mark.parametrize("padding_idx", [None, 0, 3])
@settings(deadline=None, max_examples=15)
@given(data=st.data())
def test_embedding_matches_torch(padding_idx, data):
    V, E = 5, data.draw(st.integers(1, 4), label="E")
    weight = data.draw(arrays((V, E)), label="weight")
    ids_shape = data.draw(shapes(max_dims=2), label="ids_shape")
    ids = data.draw(arrays(ids_shape, low=0, high=V - 1, layout="contiguous"), label="ids")
    ids = np.round(ids).astype(np.int64)
    check(lambda w: ta.functional.embedding(ids, w, padding_idx=padding_idx),
          lambda w: TF.embedding(torch.tensor(ids), w, padding_idx=padding_idx), weight)


def test_embedding_padding_row_gets_zero_gradient():
    weight = np.arange(12.0).reshape(4, 3)
    ids = np.array([[0, 2, 0], [1, 0, 3]])
    engine, reference = leaves([weight], "float64")
    (ta.functional.embedding(ta.Tensor(ids), engine[0], padding_idx=0) ** 2).sum().backward()
    (TF.embedding(torch.tensor(ids), reference[0], padding_idx=0) ** 2).sum().backward()
    assert_grads_same(engine, reference, "float64")
    assert_same(engine[0].grad[0], np.zeros(3))
    # The other rows collect one gradient per use: row 2 once, rows 1 and 3 once.
    assert_same(engine[0].grad[2], 2 * weight[2])


# ---------------------------------------------------------------- composite expressions


def _mlp(x, W1, b1, W2, b2, target, cross_entropy):
    hidden = (x @ W1 + b1).tanh()           # (N, H)
    logits = hidden @ W2 + b2               # (N, C)
    return cross_entropy(logits, target)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_mlp_tanh_cross_entropy_matches_torch(dtype):
    N, D, H, C = 6, 4, 5, 3
    rng = np.random.default_rng(5)
    params = [rng.normal(size=(N, D)), rng.normal(size=(D, H)) / 2, rng.normal(size=H),
              rng.normal(size=(H, C)) / 2, rng.normal(size=C)]
    target = rng.integers(0, C, size=N)
    check(lambda *p: _mlp(*p, target, ta.functional.cross_entropy),
          lambda *p: _mlp(*p, torch.tensor(target), TF.cross_entropy),
          *params, dtype=dtype)


def _attention(q, k, v, mask, masked_fill, softmax):
    d = q.shape[-1]
    scores = q @ k.T / math.sqrt(d)                  # (T, S)
    weights = softmax(masked_fill(scores, mask))     # (T, S)
    return weights @ v                               # (T, D)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_attention_with_masked_fill_matches_torch(dtype):
    T, S, D = 4, 5, 3
    rng = np.random.default_rng(6)
    q, k, v = rng.normal(size=(T, D)), rng.normal(size=(S, D)), rng.normal(size=(S, D))
    # Causal-style mask plus a few random holes, leaving every row at least one position.
    mask = (np.arange(S)[None, :] > np.arange(T)[:, None] + 1) | (rng.random((T, S)) < 0.2)
    mask[:, 0] = False
    check(lambda *a: _attention(*a, mask, lambda s, m: s.masked_fill(m, -np.inf),
                                lambda s: s.softmax(axis=-1)),
          lambda *a: _attention(*a, mask, lambda s, m: s.masked_fill(torch.tensor(m), -np.inf),
                                lambda s: torch.softmax(s, dim=-1)),
          q, k, v, dtype=dtype)


def test_batched_attention_with_padding_mask_matches_torch():
    B, H, T, S, D = 2, 2, 3, 4, 5
    rng = np.random.default_rng(7)
    q, k, v = rng.normal(size=(B, H, T, D)), rng.normal(size=(B, H, S, D)), rng.normal(
        size=(B, H, S, D))
    # The last key of batch 1 is padding: masked for every head and query.
    pad = np.zeros((B, 1, 1, S), dtype=bool)
    pad[1, ..., -1] = True

    def engine(q, k, v):
        scores = q @ k.transpose(-1, -2) / math.sqrt(D)            # (B, H, T, S)
        weights = scores.masked_fill(pad, -np.inf).softmax(axis=-1)
        out = weights @ v                                          # (B, H, T, D)
        return out.permute(0, 2, 1, 3).reshape(B, T, H * D)       # (B, T, H*D)

    def reference(q, k, v):
        scores = q @ k.transpose(-1, -2) / math.sqrt(D)
        weights = torch.softmax(scores.masked_fill(torch.tensor(pad), -np.inf), dim=-1)
        out = weights @ v
        return out.permute(0, 2, 1, 3).reshape(B, T, H * D)

    check(engine, reference, q, k, v)


def test_gradient_accumulates_over_two_backward_calls():
    rng = np.random.default_rng(8)
    w, x1, x2 = rng.normal(size=(3, 2)), rng.normal(size=(4, 3)), rng.normal(size=(5, 3))
    engine, reference = leaves([w], "float64")
    for x in (x1, x2):
        (ta.Tensor(x, dtype="float64") @ engine[0]).tanh().sum().backward()
        (torch.tensor(x) @ reference[0]).tanh().sum().backward()
    assert_grads_same(engine, reference, "float64")
    # ...and it equals the gradient of the summed loss in one pass.
    once = ta.Tensor(w, dtype="float64", requires_grad=True)
    loss = (ta.Tensor(x1, dtype="float64") @ once).tanh().sum() + (
        ta.Tensor(x2, dtype="float64") @ once).tanh().sum()
    loss.backward()
    assert_same(engine[0].grad, once.grad.numpy())


def test_retain_graph_backward_twice_doubles_gradient_like_torch():
    x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    engine, reference = leaves([x], "float64")
    y = (engine[0].exp() * engine[0]).softmax(axis=0).log().sum()
    y_ref = torch.log(torch.softmax(torch.exp(reference[0]) * reference[0], dim=0)).sum()
    y.backward(retain_graph=True)
    y.backward()
    y_ref.backward(retain_graph=True)
    y_ref.backward()
    assert_grads_same(engine, reference, "float64")


def test_shared_subexpression_matches_torch():
    # One tensor feeding several branches: the gradients of all its uses add up.
    x = np.linspace(-1.5, 1.5, 12).reshape(3, 4)

    def expression(t, cat, stack):
        h = t.tanh()
        both = cat([h, h * t], 1)                              # (3, 8)
        return stack([both.sum(0), both.mean(0) * h.sum()], 0)  # (2, 8)

    check(lambda t: expression(t, lambda xs, a: ta.cat(xs, axis=a),
                               lambda xs, a: ta.stack(xs, axis=a)),
          lambda t: expression(t, lambda xs, a: torch.cat(xs, dim=a),
                               lambda xs, a: torch.stack(xs, dim=a)),
          x)


# ---------------------------------------------------------------- dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.8])
def test_dropout_zeros_about_p_and_scales_the_rest(p):
    x = ta.Tensor(np.random.default_rng(9).uniform(0.5, 2.0, size=(100, 100)), dtype="float64",
                  requires_grad=True)
    y = ta.functional.dropout(x, p, generator=np.random.default_rng(0))
    kept = y.numpy() != 0
    # 10,000 draws: the dropped fraction is within 4 standard deviations of p.
    assert abs((1 - kept.mean()) - p) < 4 * math.sqrt(p * (1 - p) / kept.size)
    np.testing.assert_allclose(y.numpy()[kept], x.numpy()[kept] / (1 - p), rtol=1e-12)
    dy = cotangent(y.shape, "float64")
    y.backward(dy)
    np.testing.assert_allclose(x.grad.numpy(), np.where(kept, dy / (1 - p), 0.0), rtol=1e-12)


def test_dropout_same_generator_seed_gives_same_mask():
    x = ta.Tensor(np.ones((8, 9)), dtype="float64")
    first = ta.functional.dropout(x, 0.4, generator=np.random.default_rng(0)).numpy()
    second = ta.functional.dropout(x, 0.4, generator=np.random.default_rng(0)).numpy()
    other = ta.functional.dropout(x, 0.4, generator=np.random.default_rng(1)).numpy()
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, other)
    ta.manual_seed(3)
    seeded = ta.functional.dropout(x, 0.4).numpy()
    ta.manual_seed(3)
    np.testing.assert_array_equal(seeded, ta.functional.dropout(x, 0.4).numpy())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_dropout_identity_when_not_training_or_p_zero(dtype):
    x = ta.Tensor(np.linspace(-1.0, 1.0, 10), dtype=dtype, requires_grad=True)
    rng = np.random.default_rng(0)
    assert_same(ta.functional.dropout(x, 0.5, training=False, generator=rng), x.numpy(), dtype)
    assert_same(ta.functional.dropout(x, 0.0, generator=rng), x.numpy(), dtype)
    y = ta.functional.dropout(x, 1.0, generator=rng)
    assert_same(y, np.zeros(10, dtype), dtype)
    # torch agrees on the two deterministic cases.
    reference = torch.tensor(x.numpy())
    assert_same(ta.functional.dropout(x, 0.5, training=False),
                TF.dropout(reference, 0.5, training=False), dtype)
    assert_same(y, TF.dropout(reference, 1.0), dtype)
