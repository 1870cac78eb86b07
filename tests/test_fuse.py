"""Fusion of a compiled plan's elementwise chains (compiler/fuse.py, compose.py): the fused
replay equals the eager run (the unfused kernels) within float rounding (the fused kernels
are Numba's with contraction and reassociation), every fused kernel passes
``ta.check.fused`` (forward against the unfused member kernels, derivatives against sympy's
derivative of the composition), a wrong fused kernel fails it, and the disk cache serves a
second process."""

import functools
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tinygrad_attn import functional as F
from tinygrad_attn.autograd import registry
from tinygrad_attn.compiler import available_devices, formulas, fuse_backward, get_backend
from tinygrad_attn.compiler import fuse as fusing
from tinygrad_attn.compiler.capture import Recorder

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


@pytest.fixture
def fusing_compile(monkeypatch):
    """ta.compile with fusion on, at every size and for every member (the "cpu" rules that
    leave small chains and transcendental members unfused, and keep the recorded backward of
    a chain whose derivative is transcendental, are off: these tests are of the fused
    kernels, test_fusion_rules_* of the rules)."""
    monkeypatch.setattr(fusing, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(fusing, "SCALAR_MATH", {})
    monkeypatch.setattr(fuse_backward, "RECORDED_IF_TRANSCENDENTAL", ())
    return functools.partial(ta.compile, fuse=True)


def _close(got, want, dtype):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.max(np.abs(want)))))


def _fused_calls(step) -> list[str]:
    return [line.strip() for line in step.source.splitlines() if "= fused_" in line]


def _run(fusing_compile, fn, arrays, device, dtype, calls=3):
    """fn compiled with fusion and eagerly on fresh leaves, ``calls`` times with new values;
    returns the compiled function.  fn(*leaves) returns a scalar loss it has backpropagated."""
    step = fusing_compile(fn)
    rng = np.random.default_rng(0)
    for k in range(calls):
        values = [a if k == 0 else a + 0.1 * rng.uniform(-1, 1, size=np.shape(a)) for a in arrays]
        fused = [ta.Tensor(v, dtype=dtype, device=device, requires_grad=True) for v in values]
        eager = [ta.Tensor(v, dtype=dtype, device=device, requires_grad=True) for v in values]
        got = step(*fused)
        want = fn(*eager)
        _close(got.numpy(), want.numpy(), dtype)
        for f, e in zip(fused, eager, strict=True):
            assert (f.grad is None) == (e.grad is None)      # a leaf the function never reads
            if e.grad is not None:
                _close(f.grad.numpy(), e.grad.numpy(), dtype)
    return step


def assert_wrong_kernel_rejected(backend, chain, name: str, wrong) -> None:
    """``ta.check.fused(chain)`` fails while kernel ``name`` is replaced by ``wrong(right)``."""
    right = backend.table()[name]
    right = right.install() if hasattr(right, "install") else right
    backend.register_kernel(name, wrong(right))
    try:
        (report,) = ta.check.fused(chain)
    finally:
        backend.register_kernel(name, right)
    assert not report.ok, f"a wrong {name} passed: {report}"


def loss_of(fn):
    """A step that sums ``fn``'s output and runs its backward."""
    def step(*xs):
        loss = fn(*xs).sum()
        loss.backward()
        return loss

    step.__name__ = fn.__name__
    return step


def _checked(step, dtype="float64"):
    reports = ta.check.fused(step, dtype=np.dtype(dtype))
    assert reports, "no fused kernel to check"
    for report in reports:
        assert report.ok, str(report)
    return reports


# ---------------------------------------------------------------- the tiny example


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tiny_forward_and_backward_fuse_and_equal_eager(fusing_compile, dtype):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=16), rng.normal(size=16)
    step = _run(fusing_compile, loss_of(lambda a, b: a * b + a), [a, b], "cpu", dtype)
    fused = _fused_calls(step)
    # The forward a*b + a, and its backward from the composed derivative: da = (b + 1) dy,
    # db = a dy, one kernel each, in place of mul_back_a, mul_back_b and the add of a's two
    # contributions.
    assert len(fused) == 3, step.source
    assert "_back_x0(" in step.source and "_back_x1(" in step.source
    assert "mul(" not in step.source and "= add(" not in step.source and "mul_back" not in step.source
    unfused = ta.compile(loss_of(lambda a, b: a * b + a))
    unfused(*[ta.Tensor(x, dtype=dtype, requires_grad=True) for x in (a, b)])
    assert step.plans[0].calls < unfused.plans[0].calls
    reports = _checked(step)
    assert [r.target.split(" = ")[1] for r in reports] == ["mul -> add"]


def test_numpy_device_replays_unfused(fusing_compile):
    step = _run(fusing_compile, loss_of(lambda a, b: a * b + a), [np.ones(4), np.arange(4.0)], "numpy",
                "float64")
    assert not _fused_calls(step) and "mul(" in step.source


def test_an_escaping_intermediate_is_not_fused_away(fusing_compile):
    def fn(a, b):
        t = a * b
        loss = (t + a).sum() + t.sum()
        loss.backward()
        return loss, t

    step = fusing_compile(fn)
    a = ta.Tensor([1.0, 2.0, 3.0], dtype="float64", requires_grad=True)
    b = ta.Tensor([0.5, -1.0, 2.0], dtype="float64", requires_grad=True)
    loss, t = step(a, b)
    forward = step.source.split("# backward")[0]
    assert "mul(a, b)" in forward and "= fused_" not in forward
    np.testing.assert_array_equal(t.numpy(), [0.5, -2.0, 6.0])
    np.testing.assert_allclose(a.grad.numpy(), 2 * b.numpy() + 1, rtol=1e-15)       # d/da of ab + a + ab


# ---------------------------------------------------------------- models written from primitives


def gelu_tanh(x):
    inner = (x + x * x * x * 0.044715) * float(np.sqrt(2.0 / np.pi))
    return x * 0.5 * (inner.tanh() + 1.0)


def layer_norm(x, w, b):
    mean = x.sum(-1, keepdims=True) / x.shape[-1]
    centred = x - mean
    var = (centred * centred).sum(-1, keepdims=True) / x.shape[-1]
    return centred / (var + 1e-5) ** 0.5 * w + b


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gelu_tanh_from_primitives(fusing_compile, dtype):
    x = np.random.default_rng(2).normal(size=(4, 8)) * 2
    step = _run(fusing_compile, loss_of(gelu_tanh), [x], "cpu", dtype)
    assert len(_fused_calls(step)) >= 2, step.source
    _checked(step)
    # The primitives are GeluTanh's formula: the compiled loss equals the op's.
    got = step(ta.Tensor(x, dtype=dtype, requires_grad=True))
    _close(got.numpy(), ta.ops.GeluTanh.apply(ta.Tensor(x, dtype=dtype)).sum().numpy(), dtype)
    chain = max(step.plans[0].chains, key=lambda c: len(c.members))
    assert len(chain.members) >= 5


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_from_primitives(fusing_compile, dtype):
    rng = np.random.default_rng(3)
    x, w, b = rng.normal(size=(3, 6)), rng.normal(size=6), rng.normal(size=6)
    step = _run(fusing_compile, loss_of(layer_norm), [x, w, b], "cpu", dtype)
    assert _fused_calls(step), step.source
    _checked(step)
    # Against the LayerNorm op (a kernel of its own, not primitives): the same function.
    got = step(*[ta.Tensor(v, dtype=dtype, requires_grad=True) for v in (x, w, b)])
    want = F.layer_norm(ta.Tensor(x, dtype=dtype), (6,), ta.Tensor(w, dtype=dtype), ta.Tensor(b, dtype=dtype))
    _close(got.numpy(), want.sum().numpy(), dtype)


# ---------------------------------------------------------------- random chains


UNARY = ["Exp", "Tanh", "Sigmoid", "Relu", "Gelu", "GeluTanh", "Neg", "LeakyRelu"]
BINARY = ["Add", "Sub", "Mul", "Div"]
SHAPES = [(3, 4), (4,), (1, 4), (3, 1), ()]


@st.composite
def chains(draw):
    count = draw(st.integers(2, 3))
    shapes = [(3, 4)] + [draw(st.sampled_from(SHAPES)) for _ in range(count - 1)]
    program = []
    for _ in range(draw(st.integers(2, 7))):
        if draw(st.booleans()):
            program.append((draw(st.sampled_from(UNARY)), None))
        else:
            program.append((draw(st.sampled_from(BINARY)), draw(st.integers(0, count - 1))))
    return shapes, program


def _program(program):
    def fn(*xs):
        y = xs[0]
        for name, other in program:
            op = registry[name]
            if other is None:
                attrs = {"negative_slope": 0.1} if name == "LeakyRelu" else {}
                y = op.apply(y, **attrs)
                if name == "Exp":
                    y = registry["Tanh"].apply(y)          # keep values of order one
            elif name == "Div":
                y = op.apply(y, registry["Exp"].apply(xs[other]))   # a denominator away from zero
            else:
                y = op.apply(y, xs[other]) if other % 2 else op.apply(xs[other], y)
        return y

    return fn


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chains(), st.sampled_from(["float64", "float32"]))
def test_random_elementwise_chains(fusing_compile, chain, dtype):
    shapes, program = chain
    rng = np.random.default_rng(len(program))
    arrays = [rng.uniform(-1.5, 1.5, size=s) for s in shapes]
    step = _run(fusing_compile, loss_of(_program(program)), arrays, "cpu", dtype, calls=2)
    if _fused_calls(step):
        _checked(step)


# ---------------------------------------------------------------- the fuse rules and the check


def _record(fn, *arrays):
    recorder = Recorder()
    slots = [recorder.input(a) for a in arrays]
    cpu = get_backend("cpu")
    with cpu.recording(recorder):
        out = fn(cpu, *arrays)
    return recorder, slots, recorder.slot_of(out)


def test_an_in_place_write_between_members_stops_the_chain():
    a, b, c = (np.arange(1.0, 5.0) * k for k in (1, 2, 3))

    def written(kb, a, b, c):
        t = kb.mul(a, b)
        kb.add_(a, c)                 # the members would read a before and after this write
        return kb.add(t, a)

    def clean(kb, a, b, c):
        t = kb.mul(a, b)
        kb.add_(c, c)
        return kb.add(t, a)

    for fn, fused in ((written, False), (clean, True)):
        recorder, _, out = _record(fn, a.copy(), b, c.copy())
        entries = fusing.fuse(recorder, get_backend, keep={out.index}, min_elements=0)
        assert any(e.kernel.startswith("fused_") for e in entries) is fused


def test_a_broadcast_read_only_by_members_is_absorbed():
    def fn(kb, a, b):
        return kb.add(kb.mul(a, kb.broadcast_to(b, (3, 4))), a)

    a, b = np.ones((3, 4)), np.arange(4.0)
    recorder, slots, out = _record(fn, a, b)
    (entry,) = fusing.fuse(recorder, get_backend, keep={out.index}, min_elements=0)
    assert entry.kernel.startswith("fused_") and entry.args == tuple(slots)
    np.testing.assert_array_equal(get_backend("cpu").table()[entry.kernel](a, b), a * b + a)


def test_a_same_shape_sum_to_between_members_does_not_stop_the_chain(monkeypatch):
    # A broadcasting op's backward sums its gradient to the input's shape, most often the
    # shape it has: plan.py's shape_no_op (the one rule, the peepholes' too) drops that
    # call before fusing.  Without the rule, the sum_to reads mul's result: no chain.
    from tinygrad_attn.compiler import plan as plan_module

    def fn(kb, a, b):
        return kb.add(kb.sum_to(kb.mul(a, b), (3, 4)), a)

    monkeypatch.setattr(fusing, "MIN_ELEMENTS", 0)
    a, b = np.arange(12.0).reshape(3, 4), np.linspace(-1.0, 1.0, 12).reshape(3, 4)
    recorder, slots, out = _record(fn, a, b)
    inputs = [("a", slots[0]), ("b", slots[1])]

    def plan():
        return plan_module.build_plan(recorder, name="f", title="f", inputs=inputs,
                                      returns=[out], external_names={}, device="cpu", resolve=get_backend,
                                      fuse=True)

    fused = plan()
    assert fused.calls == 1 and "= fused_" in fused.source, fused.source
    np.testing.assert_allclose(fused.fn(a, b)[0], a * b + a, rtol=1e-15)
    monkeypatch.setattr(plan_module, "shape_no_op", lambda entry: False)
    unfused = plan()
    assert unfused.calls == 3 and "= fused_" not in unfused.source, unfused.source
    np.testing.assert_array_equal(unfused.fn(a, b)[0], a * b + a)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_number_is_written_into_the_fused_kernel(fusing_compile, dtype):
    # a * 0.5 + b: the op makes 0.5 a 0-d array (full); fused, the kernel holds the number
    # itself and reads two operands, so no 0-d (stride 0) operand slows its loop.
    step = _run(fusing_compile, loss_of(lambda a, b: a * 0.5 + b), [np.arange(6.0), np.ones(6)], "cpu", dtype)
    (call,) = [line for line in _fused_calls(step) if "(xs_0, xs_1)" in line]          # 0.5 is not an operand
    chain = next(c for c in step.plans[0].chains if [m.kernel_name for m in c.members] == ["mul", "add"])
    assert len(chain.shapes) == 2 and ("const", 0.5) in chain.members[0].refs
    _checked(step, dtype)


def escaping_step(a, b):
    """t = a*b is read outside the chain t + a: the forward stays unfused, and the recorded
    backward's chain (mul_back_a, then the add of a's two contributions) is fused on its own."""
    t = a * b
    loss = (t + a).sum() + t.sum()
    loss.backward()
    return loss


def test_a_wrong_fused_kernel_fails_the_check(fusing_compile):
    cpu = get_backend("cpu")
    step = _run(fusing_compile, loss_of(lambda a, b: a * b + a), [np.ones(4), np.arange(4.0)], "cpu",
                "float64", calls=1)
    (chain,) = step.plans[0].chains
    derivative = formulas.plan(chain.formula).backward[0].name
    step_b = _run(fusing_compile, escaping_step, [np.ones(4), np.arange(4.0)], "cpu", "float64", calls=1)
    (backward,) = step_b.plans[0].chains
    assert [m.kernel_name for m in backward.members] == ["mul_back_a", "add"]
    cases = [(chain, chain.formula.name, lambda fn: lambda x0, x1: fn(x0, x1) + 1e-6),   # the forward
             (chain, derivative, lambda fn: lambda *a: -fn(*a)),                          # d/dx0 sign flipped
             (backward, backward.formula.name, lambda fn: lambda x0, x1, x2: fn(x0, x1, x2) - x1)]
    for checked, name, wrong in cases:
        assert_wrong_kernel_rejected(cpu, checked, name, wrong)
        (report,) = ta.check.fused(checked)
        assert report.ok


def test_a_fused_chains_backward_is_its_composed_derivative(fusing_compile):
    """The plan computes the chain's gradients with the composed derivative's kernels (one per
    leaf needing a gradient, summed down where a leaf was broadcast), and with them alone: a
    wrong derivative kernel put in the plan gives a wrong gradient, a leaf without grad gets
    no kernel."""
    def fn(a, b, c, x):
        loss = ((a * b + a) * x + c).tanh().sum()
        loss.backward()
        return loss

    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=(4, 5)), rng.normal(size=(4, 5)), rng.normal(size=5), rng.normal(size=(4, 5))]
    step = fusing_compile(fn)
    leaves = [ta.Tensor(v, dtype="float64", requires_grad=k < 3) for k, v in enumerate(arrays)]
    step(*leaves)
    eager = [ta.Tensor(v, dtype="float64", requires_grad=k < 3) for k, v in enumerate(arrays)]
    fn(*eager)
    for f, e in zip(leaves[:3], eager[:3], strict=True):
        _close(f.grad.numpy(), e.grad.numpy(), "float64")
    plan = step.plans[0]
    (chain,) = plan.chains
    names = [k.name for k in formulas.plan(chain.formula).backward]
    (forward,) = [line for line in plan.source.splitlines() if f"= {chain.formula.name}(" in line]
    order = forward.split("(")[1].rstrip(")").split(", ")                 # the leaves x0, x1, ...
    assert sorted(order) == ["a", "b", "c", "x"], plan.source
    calls = [line.split("= ")[1].split("(")[0] for line in plan.source.splitlines() if "_back_x" in line]
    assert calls == [name for name, leaf in zip(names, order, strict=True) if leaf != "x"], plan.source
    assert "sum_to(" in plan.source.split("# backward", 1)[1]                            # c is (5,)
    assert not any(k in plan.source for k in ("mul_back", "add_back", "tanh_back"))
    db = names[order.index("b")]
    right = plan.fn.__globals__[db]
    plan.fn.__globals__[db] = lambda *args: 2.0 * right(*args)
    try:
        for t in leaves[:3]:
            t.grad = None
        step(*leaves)
    finally:
        plan.fn.__globals__[db] = right
    np.testing.assert_allclose(leaves[1].grad.numpy(), 2.0 * eager[1].grad.numpy(), rtol=1e-12)
    _close(leaves[0].grad.numpy(), eager[0].grad.numpy(), "float64")


def leaky_step(a, b, slope):
    loss = (registry["LeakyRelu"].apply(a * b, negative_slope=slope) + a).sum()
    loss.backward()
    return loss


def test_each_plan_keeps_its_own_chains(fusing_compile):
    # Two plans share one fused kernel (a composed formula takes the slope as a parameter) with
    # different slopes: each plan keeps its chain, and both are checked, each at its slope.
    step = fusing_compile(leaky_step, static=("slope",))
    for slope in (0.1, 0.3):
        a = ta.Tensor(np.linspace(-1, 1, 6), requires_grad=True)
        b = ta.Tensor(np.linspace(-2, 1, 6), requires_grad=True)
        step(a, b, slope)
        assert np.allclose(a.grad.numpy(), np.where(a.numpy() * b.numpy() > 0, 1, slope) * b.numpy() + 1)
    # a*b -> leaky_relu -> + a, its backward the composed derivative's kernels of the same chain
    forward = [plan.chains for plan in step.plans]
    assert [[m.kernel_name for m in c.members] for (c,) in forward] == [["mul", "leaky_relu", "add"]] * 2
    forward = [c for (c,) in forward]
    assert forward[0].formula.name == forward[1].formula.name
    assert [c.params for c in forward] == [(0.1,), (0.3,)]
    reports = _checked(step)
    assert len(reports) == 2                            # one chain per plan, checked at its slope
    with pytest.raises(TypeError, match="ta.check.fused"):
        ta.check.fused(forward[0].formula.name)


def test_derivative_calls_carry_their_own_chain(fusing_compile):
    # Two chains of one composed formula (a*b + a) at two shapes share their derivative
    # kernels; each derivative call carries the chain it differentiates, so each is labelled
    # and checked at its own shapes.
    def fn(a, b, c, d):
        loss = (a * b + a).sum() + (c * d + c).sum()
        loss.backward()
        return loss

    rng = np.random.default_rng(5)
    leaves = [ta.Tensor(rng.normal(size=shape), requires_grad=True) for shape in ((4, 5), (4, 5), (3,), (3,))]
    step = fusing_compile(fn)
    step(*leaves)
    derivative_calls = [e for e in step.plans[0].entries if getattr(e, "derivative", None) is not None]
    assert len(derivative_calls) == 4                                          # da, db, dc, dd
    assert len({e.kernel for e in derivative_calls}) == 2                      # the kernels are shared
    shape_of_input = {0: (4, 5), 1: (4, 5), 2: (3,), 3: (3,)}                 # the plan's slots of a, b, c, d
    for e in derivative_calls:
        read = {shape_of_input[arg.index] for arg in e.args if getattr(arg, "index", None) in shape_of_input}
        assert read == {e.chain.shapes[0]}, (e.kernel, e.args, e.chain.shapes)
    assert sorted(c.shapes[0] for c in step.plans[0].chains) == [(3,), (4, 5)]
    assert all(r.ok for r in _checked(step))


def test_a_derivative_noted_at_the_wrong_call_is_refused():
    # The engine notes each derivative call by its place; a place holding another kernel's
    # call (a recording out of step with the notes) is an error, not a silently wrong label.
    from tinygrad_attn.compiler.capture import Call

    chain = types.SimpleNamespace(kernels=[types.SimpleNamespace(name="fused_x_back_x0")], chain=object())
    entries = [Call("cpu", "sum", (), {}, None), Call("cpu", "fused_x_back_x0", (), {}, None)]
    marked = fuse_backward.mark_derivatives(entries, {1: (chain, 0)})
    assert type(marked[0]) is Call and marked[1].derivative == 0 and marked[1].chain is chain.chain
    with pytest.raises(RuntimeError, match="entry 0 \\(sum\\) was noted as the call of fused_x_back_x0"):
        fuse_backward.mark_derivatives(entries, {0: (chain, 0)})


def _fused_kernels(fn, n, dtype="float64"):
    """The member kernels of each fused chain of ``fn``'s plan (forward, no grad) on two (n,)
    tensors, after checking that its result equals eager's."""
    rng = np.random.default_rng(n)
    a, b = (ta.Tensor(rng.uniform(0.5, 2, n), dtype=dtype) for _ in range(2))
    step = ta.compile(fn, fuse=True)
    with ta.no_grad():
        _close(step(a, b).numpy(), fn(a, b).numpy(), dtype)
    assert len(step.plans[0].chains) == len(_fused_calls(step))
    return [[m.kernel_name for m in chain.members] for chain in step.plans[0].chains]


def test_fusion_rules_leave_small_chains_unfused_on_cpu():
    chain = lambda a, b: (a - b) * (a + b) * a                        # noqa: E731
    assert not _fused_kernels(chain, fusing.MIN_ELEMENTS - 1)
    assert _fused_kernels(chain, fusing.MIN_ELEMENTS) == [["sub", "add", "mul", "mul"]]


def test_fusion_rules_leave_transcendental_members_unfused_in_float64_on_cpu():
    # tanh runs on its own (numpy's SIMD tanh); the arithmetic around it still fuses.  In
    # float32 the Numba kernel is the faster: the whole chain fuses.
    n = fusing.MIN_ELEMENTS
    chain = lambda a, b: (a * b + a).tanh() * b                        # noqa: E731
    assert _fused_kernels(chain, n) == [["mul", "add"]]
    assert not _fused_kernels(lambda a, b: (a * b).tanh().exp(), n)
    assert _fused_kernels(chain, n, "float32") == [["mul", "add", "tanh", "mul"]]
    cube_root = "Pow(Symbol('x'), Rational(1, 3))"
    assert {fusing.scalar_math(e) for e in ("exp(Symbol('x'))", cube_root)} == {True}
    assert {fusing.scalar_math(e) for e in ("Mul(Symbol('a'), Pow(Symbol('b'), Integer(-1)))",
                                              "Piecewise(ExprCondPair(Integer(0), LessThan(Symbol('x'), "
                                              "Integer(0))), ExprCondPair(Symbol('x'), true))")} == {False}


def test_fusion_rules_keep_the_recorded_backward_of_a_transcendental_chain_on_cpu(monkeypatch):
    # Each leaf's derivative kernel would evaluate tanh again: the chain's backward stays the
    # members' (tanh_back reads the saved output), fused on its own; the part of the chain
    # below tanh, polynomial, still gets its composed derivative.
    monkeypatch.setattr(fusing, "MIN_ELEMENTS", 0)
    rng = np.random.default_rng(5)
    step = _run(functools.partial(ta.compile, fuse=True), loss_of(lambda a, b: (a * b + a).tanh() * b),
                [rng.normal(size=64), rng.normal(size=64)], "cpu", "float32")
    derived = {e.chain.formula.name: [m.kernel_name for m in e.chain.members]
               for e in step.plans[0].entries if getattr(e, "derivative", None) is not None}
    assert list(derived.values()) == [["mul", "add"]], step.source
    assert "tanh_back" in step.source or any("tanh_back" in [m.kernel_name for m in c.members]
                                             for c in step.plans[0].chains), step.source
    _checked(step, "float32")


def test_fusion_rules_leave_a_chain_that_composes_to_one_numpy_call_unfused():
    # x*x*x composes to x**3, which the cpu device leaves to numpy's pow (no better than two
    # multiplies, far worse here): the multiplies stay; with + y after them, the chain fuses.
    n = fusing.MIN_ELEMENTS
    assert not _fused_kernels(lambda a, b: a * a * a, n)
    assert _fused_kernels(lambda a, b: a * a * a + b, n) == [["mul", "mul", "add"]]


def test_the_disk_cache_serves_a_second_process(tmp_path):
    script = textwrap.dedent("""
        import numpy as np
        import tinygrad_attn as ta
        from tinygrad_attn.compiler import formulas, fuse, fuse_backward

        fuse.MIN_ELEMENTS, fuse.SCALAR_MATH, fuse_backward.RECORDED_IF_TRANSCENDENTAL = 0, {}, ()
        derived = []
        original = formulas.derive
        formulas.derive = lambda f: derived.append(f.name) or original(f)

        def step(a, b):
            loss = ((a * b + a).tanh() * b).sum()
            loss.backward()
            return loss

        a = ta.Tensor(np.linspace(-1, 1, 5), requires_grad=True)
        b = ta.Tensor(np.linspace(0, 2, 5), requires_grad=True)
        f = ta.compile(step, fuse=True)
        f(a, b)
        calls = [line for line in f.source.splitlines() if "= fused_" in line]
        formulas_used = {line.split("= fused_")[1][:12] for line in calls}
        print(sum(1 for name in derived if name.startswith("fused_")), len(formulas_used),
              f.source.count("= fused_"))
    """)
    env = {**os.environ, "TINYGRAD_ATTN_CACHE": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(2)]
    (first_derived, composed, calls), (second_derived, composed_again, calls_again) = runs
    # One chain: its forward kernel and its derivative's, all from one composed formula.
    assert int(calls) >= 2 and (composed_again, calls_again) == (composed, calls)
    assert int(first_derived) == int(composed) >= 1 and int(second_derived) == 0
    assert os.listdir(tmp_path / "numba")


@pytest.mark.skipif("cuda" not in available_devices(), reason="no GPU and no simulator")
def test_cuda_fused_kernel_equals_the_unfused_chain():
    # Capture on the cuda device is S7's; the fused kernels themselves are every device's:
    # the chain tanh(a*b + a) and its backward chain, built for cuda and checked there.
    from tinygrad_attn.compiler.compose import Member, compose

    forms = {f.name: f for f in (registry[n].formula for n in ("Mul", "Add", "Tanh"))}
    chains = [
        [Member(forms["mul"], 0, (("leaf", 0), ("leaf", 1))),
         Member(forms["add"], 0, (("member", 0), ("leaf", 0))), Member(forms["tanh"], 0, (("member", 1),))],
        [Member(forms["tanh"], 1, (("leaf", 0), ("leaf", 1))),
         Member(forms["mul"], 1, (("leaf", 2), ("member", 0))),
         Member(forms["add"], 0, (("member", 0), ("member", 1)))],
    ]
    cuda = get_backend("cuda")
    for members, shapes in zip(chains, [((2, 3), (3,)), ((2, 3), (2, 3), (3,))], strict=True):
        formula = compose(members, len(shapes))
        fusing.define_fused(cuda, formula)
        chain = fusing.Chain(formula, "cuda", tuple(members), (), shapes, "float64")
        (report,) = ta.check.fused(chain)
        assert report.ok, str(report)


@pytest.mark.skipif("cuda" not in available_devices(), reason="no GPU and no simulator")
def test_cuda_compiled_chain_backward_equals_eager(fusing_compile):
    """On "cuda" a captured chain's forward and its composed derivative run as fused device
    kernels, and the replay equals eager."""
    rng = np.random.default_rng(4)
    step = _run(fusing_compile, loss_of(lambda a, b: (a * b + a).tanh() * b), [rng.normal(size=(2, 3)),
                rng.normal(size=(2, 3))], "cuda", "float64")
    assert "_back_x0(" in step.source and "_back_x1(" in step.source and "tanh_back" not in step.source
    _checked(step)
