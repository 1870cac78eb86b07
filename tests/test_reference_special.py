"""What is not one op on drawn inputs, so not a row of the table in test_reference.py.

Fixed float32 spot checks of the table's rows; special values (sigmoid far out, ties in
max, relu at 0, huge logits, fully masked rows); expressions of several ops; the engine's
deliberate departures from PyTorch, stated at their tests: classes sit on the last axis (so
(B, T, C) logits are compared with torch on (B*T, C)), and a 'mean' loss over rows that are
all ignored is 0, not NaN; dropout; and non-contiguous inputs, which must give exactly
what their contiguous copies give.  Comparisons with an oracle go through ``check_op``.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tests import optional
from tests.reference import (
    ORACLES,
    TF,
    TOLERANCE,
    Case,
    assert_grads_same,
    assert_same,
    check_op,
    cotangent,
    engine_leaves,
    grads_of,
    torch,
    torch_leaves,
)
from tests.strategies import (
    broadcastable_shapes,
    non_contiguous_arrays,
    shaped_arrays,
    shapes,
)
from tests.test_reference import (
    CASES,
    EXAMPLES,
    REDUCTION_MODES,
    numpy_log_softmax,
    numpy_softmax,
    stable_sigmoid,
)

NUMPY = TOLERANCE["numpy", "float64"]


# ---------------------------------------------------------------- float32 spot checks
#
# The table compares float32 with torch on drawn inputs for the binary ops; these compare
# the other ops on one fixed input each.

UNARY_SPOTS = [("exp", {}, -3.0), ("log", {}, 0.1), ("sqrt", {}, 0.1), ("tanh", {}, -3.0),
               ("sigmoid", {}, -3.0), ("relu", {}, -3.0), ("neg", {}, -3.0),
               ("leaky_relu", {"slope": None}, -3.0), ("leaky_relu", {"slope": 0.2}, -3.0)]


@optional.needs_torch
@pytest.mark.parametrize(("name", "params", "low"), UNARY_SPOTS,
                         ids=[f"{n}({p['slope']})" if p else n for n, p, _ in UNARY_SPOTS])
def test_unary_matches_torch_in_float32(name, params, low):
    x = np.linspace(low, 3.0, 24).reshape(2, 3, 4)
    check_op(CASES[name], "torch", (x,), params, dtype="float32")


@optional.needs_torch
def test_scalar_operands_match_torch_in_float32():
    # Python scalars take the tensor's dtype: nothing is promoted to float64.
    x = np.linspace(0.5, 3.0, 12).reshape(3, 4)
    check_op(CASES["scalar_operands"], "torch", (x,), {"c": 1.5}, dtype="float32")


@optional.needs_torch
@pytest.mark.parametrize("name", ["sum", "mean", "max"])
def test_reduction_matches_torch_in_float32(name):
    x = np.sin(np.arange(60.0)).reshape(3, 4, 5)
    check_op(CASES[name], "torch", (x,), {"axis": (0, -1), "keepdims": True}, dtype="float32")


@optional.needs_torch
def test_matmul_matches_torch_in_float32():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 1, 3, 5)), rng.normal(size=(4, 5, 2))
    check_op(CASES["matmul"], "torch", (a, b), dtype="float32")


@optional.needs_torch
@pytest.mark.parametrize("reduction", REDUCTION_MODES)
def test_cross_entropy_matches_torch_in_float32(reduction):
    rng = np.random.default_rng(2)
    logits, target = rng.normal(size=(7, 5)) * 3, rng.integers(0, 5, size=7)
    check_op(CASES[f"cross_entropy[{reduction}]"], "torch", (logits,),
             {"target": target, "ignore_index": 2, "reduction": reduction, "target_as": "tensor"},
             dtype="float32")


# ---------------------------------------------------------------- special values


@pytest.fixture(params=ORACLES)
def oracle(request):
    """Each oracle in turn; torch skips without PyTorch (fails where extras are required)."""
    if request.param == "torch" and torch is None:
        optional.missing(optional.TORCH_REASON)
    return request.param


@pytest.mark.parametrize(("name", "params"), [("relu", {}), ("leaky_relu", {"slope": 0.2})],
                         ids=["relu", "leaky_relu"])
def test_relu_gradient_at_zero(name, params, oracle):
    # Both zeros take the slope of the negative side.
    check_op(CASES[name], oracle, (np.array([-1.0, 0.0, -0.0, 1.0]),), params)


def test_leaky_relu_default_slope_is_one_hundredth(oracle):
    check_op(CASES["leaky_relu"], oracle, (np.array([-2.0, -0.5, 0.0, 0.5, 2.0]),),
             {"slope": None})


CAST = Case("cast",
            engine=lambda t: (t.astype("float32") * 3.0).double().tanh(),
            numpy=lambda x: np.tanh((x.astype(np.float32) * np.float32(3.0)).astype(np.float64)),
            torch=lambda t: (t.float() * 3.0).double().tanh())


def test_cast_round_trip(oracle):
    # Through float32 and back: the value rounds there, and the gradient passes both casts.
    check_op(CAST, oracle, (np.linspace(-2.0, 2.0, 6).reshape(2, 3),))


@contextlib.contextmanager
def strict_floats():
    """Overflow, invalid operations, division by zero and any warning raise."""
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise"):
        warnings.simplefilter("error")
        yield


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sigmoid_large_inputs_do_not_overflow(dtype):
    x = np.array([-800.0, -50.0, -20.0, -1.0, 0.0, 1.0, 20.0, 50.0, 800.0])
    t = ta.Tensor(x, dtype=dtype, requires_grad=True)
    with strict_floats():
        y = t.sigmoid()
        y.sum().backward()
    expected = stable_sigmoid(x)
    np.testing.assert_allclose(y.numpy(), expected.astype(dtype), rtol=1e-6, atol=0)
    assert np.all(np.isfinite(t.grad.numpy()))
    # atol: in float32, y(1 - y) rounds to 0 once y rounds to 1 (x > ~17).
    np.testing.assert_allclose(t.grad.numpy(), expected * (1 - expected), rtol=1e-5, atol=1e-7)


@optional.needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sigmoid_extreme_inputs_match_torch(dtype):
    x = np.array([-800.0, -50.0, -20.0, 0.0, 20.0, 50.0, 800.0])
    check_op(CASES["sigmoid"], "torch", (x,), dtype=dtype)


@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(low=-60.0, high=60.0))
def test_sigmoid_wide_range_matches_stable_formula(x):
    # Relative tolerance only: sigmoid(-60) is 9e-27, which any atol would accept as 0.
    t = ta.Tensor(x, dtype="float64", requires_grad=True)
    with strict_floats():
        y = t.sigmoid()
        y.backward(np.ones_like(x))
    expected = stable_sigmoid(x)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(t.grad.numpy(), expected * (1 - expected), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("name", ["sum", "mean", "max"])
@pytest.mark.parametrize("axis", [None, 0, 2, -1, -3, (0, 2), (-1, 0), (1,), ()], ids=repr)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_axis_forms_match_numpy(name, axis, keepdims):
    # Every spelling of ``axis`` at least once, whatever hypothesis draws.
    x = np.sin(np.arange(24.0)).reshape(2, 3, 4)
    check_op(CASES[name], "numpy", (x,), {"axis": axis, "keepdims": keepdims},
             dy=lambda shape: np.cos(np.arange(math.prod(shape), dtype=np.float64)).reshape(shape))


def test_max_ties_share_gradient():
    t = ta.Tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], dtype="float64", requires_grad=True)
    t.max(axis=1).sum().backward()
    assert_same(t.grad, np.array([[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]]), NUMPY)


@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(min_dims=1))
def test_sum_axis_spellings_agree(x):
    # An axis given as int, negative int or 1-tuple is the same reduction.
    last = x.ndim - 1
    for axis in (last, -1, (last,), (-1,)):
        check_op(CASES["sum"], "numpy", (x,), {"axis": axis, "keepdims": False})


def test_getitem_negative_steps_reverse():
    t = ta.Tensor(np.arange(12.0).reshape(3, 4), dtype="float64", requires_grad=True)
    y = t[::-1, ::-2]
    assert_same(y, np.array([[11.0, 9.0], [7.0, 5.0], [3.0, 1.0]]), NUMPY)
    y.backward(np.arange(6.0).reshape(3, 2))
    assert_same(t.grad, np.array([[0.0, 5, 0, 4], [0, 3, 0, 2], [0, 1, 0, 0]]), NUMPY)


def test_getitem_repeated_index_gradient_counts_repeats(oracle):
    leaves = check_op(CASES["getitem_integer_array"], oracle, (np.arange(4.0),),
                      {"rows": np.array([1, 1, 1, 3]), "axis": 0, "as_list": True}, dy=np.ones)
    assert_same(leaves[0].grad, np.array([0.0, 3.0, 0.0, 1.0]), NUMPY)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@settings(deadline=None, max_examples=EXAMPLES)
@given(x=shaped_arrays(min_dims=1))
def test_softmax_large_logits_do_not_overflow(name, x):
    logits = x * (1e4 / 3.0)  # entries up to 1e4
    with np.errstate(over="raise", invalid="raise"):
        y = getattr(ta.Tensor(logits, dtype="float64"), name)(axis=-1).numpy()
    assert np.all(np.isfinite(y))
    reference = numpy_softmax if name == "softmax" else numpy_log_softmax
    assert_same(y, reference(logits, -1), {"rtol": 1e-12, "atol": 1e-9})


@optional.needs_torch
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_softmax_large_logits_match_torch(name, dtype):
    x = np.array([[1e4, 0.0, -1e4, 9999.0], [-3.0, 1.0, 2.0, 0.5]])
    check_op(CASES[name], "torch", (x,), {"axis": -1}, dtype=dtype)


def test_softmax_all_masked_row_gives_zeros():
    x = np.array([[0.5, -1.0, 2.0, 0.0],
                  [-np.inf, -np.inf, -np.inf, -np.inf],
                  [1.0, -np.inf, 3.0, -np.inf]])
    t = ta.Tensor(x, dtype="float64", requires_grad=True)
    with np.errstate(invalid="raise"):
        y = t.softmax(axis=-1)
        y.backward(np.ones_like(x) + np.arange(4.0))
    assert_same(y[1], np.zeros(4), NUMPY)
    assert_same(y[2], np.array([np.exp(-2) / (1 + np.exp(-2)), 0.0, 1 / (1 + np.exp(-2)), 0.0]),
                NUMPY)
    assert not np.isnan(y.numpy()).any()
    assert not np.isnan(t.grad.numpy()).any()
    assert_same(t.grad[1], np.zeros(4), NUMPY)


def test_softmax_masked_fill_neg_inf_gives_zero_weight_and_gradient():
    x = np.array([[0.3, 1.2, -0.7], [2.0, 0.1, -0.4]])
    mask = np.array([[False, True, False], [True, True, True]])
    t = ta.Tensor(x, dtype="float64", requires_grad=True)
    y = t.masked_fill(mask, -np.inf).softmax(axis=-1)
    y.backward(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    assert_same(y, np.stack([numpy_softmax(np.array([0.3, -np.inf, -0.7])), np.zeros(3)]), NUMPY)
    assert_same(t.grad[1], np.zeros(3), NUMPY)
    assert t.grad.numpy()[0, 1] == 0.0


@optional.needs_torch
def test_cross_entropy_large_logits_match_torch():
    logits = np.array([[1e4, 0.0, -1e4], [0.0, 5e3, 5e3], [-1e4, -1e4, -1e4]])
    check_op(CASES["cross_entropy[mean]"], "torch", (logits,),
             {"target": np.array([1, 2, 0]), "ignore_index": None, "reduction": "mean",
              "target_as": "array"})


# ---------------------------------------------------------------- departures from torch


@optional.needs_torch
@pytest.mark.parametrize("reduction", REDUCTION_MODES)
@pytest.mark.parametrize("ignore_index", [None, 0])
def test_cross_entropy_classes_last_matches_torch_on_flattened_rows(reduction, ignore_index):
    # (B, T, C) logits with classes last: torch sees the (B*T, C) reshape (see the losses'
    # section of the table), and its 'none' result reshaped back to (B, T).
    logits = np.random.default_rng(3).normal(size=(2, 3, 5))
    check_op(CASES[f"cross_entropy[{reduction}]"], "torch", (logits,),
             {"target": np.array([[1, 0, 4], [0, 2, 2]]), "ignore_index": ignore_index,
              "reduction": reduction, "target_as": "list"})


@optional.needs_torch
def test_nll_loss_classes_last_matches_torch_on_flattened_rows():
    rng = np.random.default_rng(4)
    logits, target = rng.normal(size=(2, 3, 4)), rng.integers(0, 4, size=(2, 3))
    check_op(CASES["nll_loss[mean]"], "torch", (logits,),
             {"target": target, "ignore_index": 3, "reduction": "mean", "target_as": "array"})


@optional.needs_torch
def test_cross_entropy_all_rows_ignored_mean_is_zero_not_nan():
    # torch's 'mean' over zero kept rows is NaN, the engine's is 0.
    logits = ta.Tensor(np.ones((3, 4)), dtype="float64", requires_grad=True)
    loss = ta.functional.cross_entropy(logits, [1, 1, 1], ignore_index=1)
    loss.backward()
    assert loss.item() == 0.0
    assert_same(logits.grad, np.zeros((3, 4)), NUMPY)
    reference = TF.cross_entropy(torch.ones(3, 4, dtype=torch.float64), torch.tensor([1, 1, 1]),
                                 ignore_index=1)
    assert torch.isnan(reference)


# ---------------------------------------------------------------- expressions of several ops


@optional.needs_torch
def test_embedding_padding_row_gets_zero_gradient():
    weight = np.arange(12.0).reshape(4, 3)
    ids = np.array([[0, 2, 0], [1, 0, 3]])
    squared = Case("embedding squared",
                   engine=lambda w: (ta.functional.embedding(ta.Tensor(ids), w, padding_idx=0) ** 2).sum(),
                   torch=lambda w: (TF.embedding(torch.tensor(ids), w, padding_idx=0) ** 2).sum())
    (w,) = check_op(squared, "torch", (weight,), dy=np.ones)
    assert_same(w.grad[0], np.zeros(3), TOLERANCE["torch", "float64"])
    # The other rows collect one gradient per use: row 2 once, rows 1 and 3 once.
    assert_same(w.grad[2], 2 * weight[2], TOLERANCE["torch", "float64"])


def _mlp(x, W1, b1, W2, b2, target, cross_entropy):
    hidden = (x @ W1 + b1).tanh()           # (N, H)
    logits = hidden @ W2 + b2               # (N, C)
    return cross_entropy(logits, target)


MLP = Case("mlp", engine=lambda *p, target: _mlp(*p, target, ta.functional.cross_entropy),
           torch=lambda *p, target: _mlp(*p, torch.tensor(target), TF.cross_entropy))


@optional.needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_mlp_tanh_cross_entropy_matches_torch(dtype):
    N, D, H, C = 6, 4, 5, 3
    rng = np.random.default_rng(5)
    params = (rng.normal(size=(N, D)), rng.normal(size=(D, H)) / 2, rng.normal(size=H),
              rng.normal(size=(H, C)) / 2, rng.normal(size=C))
    check_op(MLP, "torch", params, {"target": rng.integers(0, C, size=N)}, dtype=dtype)


def _attention(q, k, v, mask, masked_fill, softmax):
    scores = q @ k.T / math.sqrt(q.shape[-1])        # (T, S)
    weights = softmax(masked_fill(scores, mask))     # (T, S)
    return weights @ v                               # (T, D)


ATTENTION = Case(
    "attention",
    engine=lambda q, k, v, mask: _attention(q, k, v, mask, lambda s, m: s.masked_fill(m, -np.inf),
                                            lambda s: s.softmax(axis=-1)),
    torch=lambda q, k, v, mask: _attention(q, k, v, mask,
                                           lambda s, m: s.masked_fill(torch.tensor(m), -np.inf),
                                           lambda s: torch.softmax(s, dim=-1)))


@optional.needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_attention_with_masked_fill_matches_torch(dtype):
    T, S, D = 4, 5, 3
    rng = np.random.default_rng(6)
    q, k, v = rng.normal(size=(T, D)), rng.normal(size=(S, D)), rng.normal(size=(S, D))
    # Causal-style mask plus a few random holes, leaving every row at least one position.
    mask = (np.arange(S)[None, :] > np.arange(T)[:, None] + 1) | (rng.random((T, S)) < 0.2)
    mask[:, 0] = False
    check_op(ATTENTION, "torch", (q, k, v), {"mask": mask}, dtype=dtype)


def _batched_attention(q, k, v, pad, masked_fill, softmax):
    B, H, T, D = q.shape
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)              # (B, H, T, S)
    weights = softmax(masked_fill(scores, pad))
    out = weights @ v                                            # (B, H, T, D)
    return out.permute(0, 2, 1, 3).reshape(B, T, H * D)         # (B, T, H*D)


BATCHED_ATTENTION = Case(
    "batched attention",
    engine=lambda q, k, v, pad: _batched_attention(
        q, k, v, pad, lambda s, m: s.masked_fill(m, -np.inf), lambda s: s.softmax(axis=-1)),
    torch=lambda q, k, v, pad: _batched_attention(
        q, k, v, pad, lambda s, m: s.masked_fill(torch.tensor(m), -np.inf),
        lambda s: torch.softmax(s, dim=-1)))


@optional.needs_torch
def test_batched_attention_with_padding_mask_matches_torch():
    B, H, T, S, D = 2, 2, 3, 4, 5
    rng = np.random.default_rng(7)
    q, k, v = (rng.normal(size=(B, H, n, D)) for n in (T, S, S))
    # The last key of batch 1 is padding: masked for every head and query.
    pad = np.zeros((B, 1, 1, S), dtype=bool)
    pad[1, ..., -1] = True
    check_op(BATCHED_ATTENTION, "torch", (q, k, v), {"pad": pad})


def _shared(t, cat, stack):
    # One tensor feeding several branches: the gradients of all its uses add up.
    h = t.tanh()
    both = cat([h, h * t], 1)                                 # (3, 8)
    return stack([both.sum(0), both.mean(0) * h.sum()], 0)     # (2, 8)


@optional.needs_torch
def test_shared_subexpression_matches_torch():
    shared = Case("shared subexpression",
                  engine=lambda t: _shared(t, lambda xs, a: ta.cat(xs, axis=a),
                                           lambda xs, a: ta.stack(xs, axis=a)),
                  torch=lambda t: _shared(t, lambda xs, a: torch.cat(xs, dim=a),
                                          lambda xs, a: torch.stack(xs, dim=a)))
    check_op(shared, "torch", (np.linspace(-1.5, 1.5, 12).reshape(3, 4),))


@optional.needs_torch
def test_gradient_accumulates_over_two_backward_calls():
    rng = np.random.default_rng(8)
    w, x1, x2 = rng.normal(size=(3, 2)), rng.normal(size=(4, 3)), rng.normal(size=(5, 3))
    engine, reference = engine_leaves([w]), torch_leaves([w])
    for x in (x1, x2):
        (ta.Tensor(x, dtype="float64") @ engine[0]).tanh().sum().backward()
        (torch.tensor(x) @ reference[0]).tanh().sum().backward()
    assert_grads_same(grads_of(engine), grads_of(reference), TOLERANCE["torch", "float64"])
    # ...and it equals the gradient of the summed loss in one pass.
    once = ta.Tensor(w, dtype="float64", requires_grad=True)
    loss = (ta.Tensor(x1, dtype="float64") @ once).tanh().sum() + (
        ta.Tensor(x2, dtype="float64") @ once).tanh().sum()
    loss.backward()
    assert_same(engine[0].grad, once.grad, TOLERANCE["torch", "float64"])


@optional.needs_torch
def test_retain_graph_backward_twice_doubles_gradient_like_torch():
    x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    engine, reference = engine_leaves([x]), torch_leaves([x])
    y = (engine[0].exp() * engine[0]).softmax(axis=0).log().sum()
    y_ref = torch.log(torch.softmax(torch.exp(reference[0]) * reference[0], dim=0)).sum()
    y.backward(retain_graph=True)
    y.backward()
    y_ref.backward(retain_graph=True)
    y_ref.backward()
    assert_grads_same(grads_of(engine), grads_of(reference), TOLERANCE["torch", "float64"])


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
    dy = cotangent(y.shape)
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
    tol = TOLERANCE["torch", dtype]
    assert_same(ta.functional.dropout(x, 0.5, training=False, generator=rng), x.numpy(), tol)
    assert_same(ta.functional.dropout(x, 0.0, generator=rng), x.numpy(), tol)
    assert_same(ta.functional.dropout(x, 1.0, generator=rng), np.zeros(10, dtype), tol)


@optional.needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_dropout_deterministic_cases_match_torch(dtype):
    x = ta.Tensor(np.linspace(-1.0, 1.0, 10), dtype=dtype, requires_grad=True)
    reference = torch.tensor(x.numpy())
    tol = TOLERANCE["torch", dtype]
    assert_same(ta.functional.dropout(x, 0.5, training=False),
                TF.dropout(reference, 0.5, training=False), tol)
    assert_same(ta.functional.dropout(x, 1.0), TF.dropout(reference, 1.0), tol)


# ---------------------------------------------------------------- non-contiguous inputs


def contiguous(x: np.ndarray) -> np.ndarray:
    """A C-ordered copy (np.ascontiguousarray would turn a 0-d array into a 1-d one)."""
    return np.array(x, order="C", copy=True)


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
    from_view = ta.Tensor(view, dtype="float64", requires_grad=True)
    from_copy = ta.Tensor(copy, dtype="float64", requires_grad=True)
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
    y_view = ta.Tensor(a, dtype="float64") @ ta.Tensor(b, dtype="float64")
    y_copy = ta.Tensor(contiguous(a), dtype="float64") @ ta.Tensor(contiguous(b), dtype="float64")
    np.testing.assert_array_equal(y_view.numpy(), y_copy.numpy())
    check_op(CASES["matmul"], "numpy", (a, b))


@settings(deadline=None, max_examples=EXAMPLES)
@given(data=st.data())
def test_add_non_contiguous_broadcast_matches_numpy(data):
    # The table's layouts are drawn; here both operands are always views.
    shape_a, shape_b = data.draw(broadcastable_shapes(min_dims=1), label="shapes")
    a = data.draw(non_contiguous_arrays(shape_a), label="a")
    b = data.draw(non_contiguous_arrays(shape_b), label="b")
    check_op(CASES["add"], "numpy", (a, b), dy=data.draw(st.integers(0, 2**32 - 1), label="dy seed"))
