"""ta.where's backward computes only the gradients its inputs need: a constant branch
(``ta.where(mask, x, 0.0)``) or a tensor with requires_grad=False gets None and costs no
kernel call, eagerly and in a compiled plan; the gradients it does compute are unchanged
(finite differences on the reference "numpy" device, torch.where's autograd, and the plan
that computes every gradient, bitwise)."""

import numpy as np
import pytest

import tinygrad_attn as ta
from tests import optional
from tinygrad_attn.ops.elementwise import Where

DEVICES = ["numpy", "cpu"]
MASK = np.array([[True, False, True], [False, False, True]])
# Which of (a, b) need a gradient: a constant second branch, a constant first, both.
NEEDS = [(True, False), (False, True), (True, True)]


def _arrays(seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(2, 3)), rng.normal(size=(3,)), rng.normal(size=(2, 3))


def _loss(a, b, mask, weights):
    # tanh: the loss is not linear in the selected values, so a wrong routing of dy shows.
    return (ta.where(mask, a, b).tanh() * weights).sum()


def _leaves(a, b, needs, device):
    return [ta.Tensor(x, dtype="float64", device=device, requires_grad=need)
            for x, need in zip((a, b), needs, strict=True)]


def _finite_difference(a, b, weights, index, eps=1e-6):
    """The gradient of the loss with respect to input ``index`` (0: a, 1: b), by central
    differences in float64 numpy, independent of the engine."""
    def loss(a, b):
        return float((np.tanh(np.where(MASK, a, b)) * weights).sum())

    x = (a, b)[index].copy()
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        args_up = (up, b) if index == 0 else (a, up)
        args_down = (down, b) if index == 0 else (a, down)
        grad[i] = (loss(*args_up) - loss(*args_down)) / (2 * eps)
    return grad


class _Spy:
    """Counts the calls of some of a backend's kernels (the instance attributes ops call) made
    inside Where.backward.  Made after a warm-up run: a kernel's first call builds it and
    resets those attributes."""

    def __init__(self, backend, names, monkeypatch):
        self.counts = dict.fromkeys(names, 0)
        self.inside = False
        for name in names:
            monkeypatch.setattr(backend, name, self._counting(name, getattr(backend, name)))
        backward = Where.backward

        def watched(op, dy):
            self.inside = True
            try:
                return backward(op, dy)
            finally:
                self.inside = False

        monkeypatch.setattr(Where, "backward", watched)

    def _counting(self, name, fn):
        def spy(*args, **kwargs):
            self.counts[name] += self.inside
            return fn(*args, **kwargs)
        return spy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("needs", NEEDS)
def test_eager_backward_computes_only_the_needed_gradients(device, needs, monkeypatch):
    an, bn, weights = _arrays(0)
    mask, w = ta.Tensor(MASK, device=device), ta.Tensor(weights, dtype="float64", device=device)
    _loss(*_leaves(an, bn, (True, True), device), mask, w).backward()          # the warm-up
    a, b = _leaves(an, bn, needs, device)
    loss = _loss(a, b, mask, w)
    spy = _Spy(a.backend, ("where", "sum_to"), monkeypatch)
    loss.backward()
    # One where and one sum_to per needed gradient (tanh and mul call neither).
    assert spy.counts == {"where": sum(needs), "sum_to": sum(needs)}
    for index, (leaf, need) in enumerate(zip((a, b), needs, strict=True)):
        if not need:
            assert leaf.grad is None
            continue
        np.testing.assert_allclose(leaf.grad.numpy(), _finite_difference(an, bn, weights, index),
                                   rtol=1e-7, atol=1e-9)


def test_python_number_branches_have_no_gradient_and_cost_no_kernel(monkeypatch):
    an, _, weights = _arrays(1)
    warm = ta.Tensor(an, dtype="float64", device="numpy", requires_grad=True)
    (ta.where(MASK, warm, warm) * warm).sum().backward()
    for scalar_first in (False, True):
        x = ta.Tensor(an, dtype="float64", device="numpy", requires_grad=True)
        y = ta.where(MASK, 0.5, x) if scalar_first else ta.where(MASK, x, 0.5)
        spy = _Spy(x.backend, ("where", "sum_to"), monkeypatch)
        (y * y).sum().backward()
        assert spy.counts == {"where": 1, "sum_to": 1}
        picked = ~MASK if scalar_first else MASK
        np.testing.assert_array_equal(x.grad.numpy(), np.where(picked, 2 * an, 0.0))


@optional.needs_torch
@pytest.mark.parametrize("needs", NEEDS)
def test_gradients_equal_torch_where(needs):
    torch = optional.torch
    an, bn, weights = _arrays(2)
    a, b = _leaves(an, bn, needs, "cpu")
    _loss(a, b, ta.Tensor(MASK), ta.Tensor(weights, dtype="float64")).backward()
    ta_, tb = (torch.tensor(x, requires_grad=need) for x, need in zip((an, bn), needs, strict=True))
    (torch.where(torch.tensor(MASK), ta_, tb).tanh() * torch.tensor(weights)).sum().backward()
    for ours, theirs in ((a, ta_), (b, tb)):
        if theirs.grad is None:
            assert ours.grad is None
        else:
            np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-12, atol=1e-14)


def _every_gradient(monkeypatch):
    """Where.backward as it was before it read needs_grad: every branch's gradient computed
    (the engine drops those of inputs that need none).  The oracle for the plans below."""
    backward = Where.backward

    def all_needed(self, dy):
        self.needs_grad = (False, True, True)
        return backward(self, dy)

    monkeypatch.setattr(Where, "backward", all_needed)


def _compiled_runs(device, needs, calls=3):
    """A compiled step's (plan, [(loss, a.grad, b.grad) per call]), fresh values each call."""
    def step(a, b, mask, weights):
        loss = _loss(a, b, mask, weights)
        loss.backward()
        return loss

    compiled = ta.compile(step)
    results = []
    for k in range(calls):
        an, bn, weights = _arrays(10 + k)
        a, b = _leaves(an, bn, needs, device)
        mask, w = ta.Tensor(MASK, device=device), ta.Tensor(weights, dtype="float64", device=device)
        loss = compiled(a, b, mask, w)
        grads = [None if x.grad is None else x.grad.numpy().copy() for x in (a, b)]
        results.append((loss.numpy().copy(), grads, (an, bn, weights)))
    assert (compiled.stats.captures, compiled.stats.replays) == (1, calls - 1)
    (plan,) = compiled.plans
    return plan, results


def _backward_where_kernels(plan):
    return [e.kernel for e in plan.entries if e.tag[:2] == ("backward", "Where")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("needs", NEEDS)
def test_compiled_backward_has_fewer_kernel_calls_and_the_same_gradients(device, needs, monkeypatch):
    plan, results = _compiled_runs(device, needs)
    with monkeypatch.context() as patched:
        _every_gradient(patched)
        oracle, expected = _compiled_runs(device, needs)

    # A gradient not needed saves its where, and b's its sum_to to (3,) too (a's, to a's own
    # shape, changes nothing: no plan calls it).
    saved = (not needs[0]) + 2 * (not needs[1])
    assert plan.calls == oracle.calls - saved, plan.source
    assert _backward_where_kernels(plan).count("where") == sum(needs)
    assert _backward_where_kernels(oracle).count("where") == 2
    for (loss, grads, (an, bn, weights)), (want_loss, want_grads, _) in zip(results, expected, strict=True):
        np.testing.assert_array_equal(loss, want_loss)
        for index, (got, want, need) in enumerate(zip(grads, want_grads, needs, strict=True)):
            if not need:
                assert got is None and want is None
                continue
            np.testing.assert_array_equal(got, want)                  # bitwise: same kernels
            np.testing.assert_allclose(got, _finite_difference(an, bn, weights, index), rtol=1e-7, atol=1e-9)
