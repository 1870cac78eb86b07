"""The plan's peepholes (compiler/plan.py ``peepholes``): a plan without its no-op calls and
its gradient copies computes the same bits as the plan built without them (the oracle:
``peepholes`` switched off), replay after replay, and what it hands back stays the caller's."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tinygrad_attn import compiled as compiled_module
from tinygrad_attn.compiler import plan as plan_module

DEVICES = ["cpu", "numpy"]
REPLAYS = 3


def _no_peepholes(recorder, entries, keep):
    return entries, {}


def _build_plan_without_peepholes(*args, **kwargs):
    original = plan_module.peepholes
    plan_module.peepholes = _no_peepholes
    try:
        return plan_module.build_plan(*args, **kwargs)
    finally:
        plan_module.peepholes = original


def _leaves(arrays, device):
    return [ta.Tensor(a, dtype="float64", device=device, requires_grad=True) for a in arrays]


def _loss_step(fn):
    def step(*xs):
        loss = fn(*xs)
        loss.backward()
        return loss
    return step


def _replays(step, arrays, device, calls=REPLAYS):
    """Each call's (loss, gradients), every call on fresh leaves of new values (a capture,
    then replays); the gradients kept as the arrays the step handed back, and whether each is
    writeable (an optimizer clips and updates them in place)."""
    results = []
    for k in range(calls):
        leaves = _leaves([a * (k + 1) for a in arrays], device)
        loss = step(*leaves)
        writeable = [x.grad._data.flags.writeable for x in leaves]
        results.append((loss.numpy().copy(), [x.grad.numpy() for x in leaves], writeable))
    return results


def _with_and_without(fn, arrays, device, monkeypatch):
    """(the peepholed compiled step, its results, the unpeepholed one's results)."""
    step = ta.compile(_loss_step(fn))
    got = _replays(step, arrays, device)
    monkeypatch.setattr(compiled_module, "build_plan", _build_plan_without_peepholes)
    oracle = ta.compile(_loss_step(fn))
    want = _replays(oracle, arrays, device)
    monkeypatch.undo()
    assert step.stats.replays == oracle.stats.replays == REPLAYS - 1
    return step, oracle, got, want


def _assert_bitwise(got, want):
    for (loss, grads, writeable), (loss_want, grads_want, writeable_want) in zip(got, want, strict=True):
        np.testing.assert_array_equal(loss, loss_want)
        assert writeable == writeable_want
        for g, w in zip(grads, grads_want, strict=True):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("device", DEVICES)
def test_peephole_gradient_copies_handed_over_equal_the_copying_plan(device, monkeypatch):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(5, 3)), rng.normal(size=(3,))]
    step, oracle, got, want = _with_and_without(lambda x, b: (x * b + b).tanh().sum(), arrays,
                                                device, monkeypatch)
    _assert_bitwise(got, want)
    assert "copy(" in oracle.plans[0].source
    assert "copy(" not in step.plans[0].source, step.plans[0].source
    assert step.plans[0].calls < oracle.plans[0].calls


@pytest.mark.parametrize("device", DEVICES)
def test_peephole_handed_over_gradients_are_not_reused_by_the_next_replay(device):
    rng = np.random.default_rng(1)
    arrays = [rng.normal(size=(4, 6)), rng.normal(size=(6,))]
    step = ta.compile(_loss_step(lambda x, b: ((x + b) ** 2).sum()))
    results = _replays(step, arrays, device, calls=REPLAYS + 2)
    for k, (_, (dx, db), _) in enumerate(results):       # held arrays keep their own call's values
        x, b = (a * (k + 1) for a in arrays)
        np.testing.assert_array_equal(dx, 2 * (x + b))
        np.testing.assert_allclose(db, (2 * (x + b)).sum(axis=0), rtol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_peephole_one_gradient_read_by_two_leaves_keeps_a_copy(device, monkeypatch):
    # d(a + b)/da and /db are the same array: one leaf may take it, the other needs its copy.
    rng = np.random.default_rng(2)
    arrays = [rng.normal(size=(3, 4)), rng.normal(size=(3, 4))]
    step, _, got, want = _with_and_without(lambda a, b: (a + b).sum(), arrays, device, monkeypatch)
    _assert_bitwise(got, want)
    assert step.plans[0].source.count("copy(") == 1, step.plans[0].source
    da, db = got[-1][1]
    assert not np.shares_memory(da, db)


def test_peephole_kept_copy_of_a_gradient_also_returned_as_an_output():
    # x.grad is the seed g itself (add's backward passes it on), and g is returned too:
    # handing g to x.grad would make the two one array.
    def f(x, c):
        g = x * 3.0
        (x + c).backward(g)
        return g

    step = ta.compile(f)
    for k in range(REPLAYS):
        x = _leaves([np.arange(3.0) + k], "cpu")[0]
        g = step(x, ta.Tensor(np.ones(3), dtype="float64"))
        assert not np.shares_memory(g.numpy(), x.grad.numpy())
        np.testing.assert_array_equal(x.grad.numpy(), 3.0 * (np.arange(3.0) + k))
    assert step.stats.replays == REPLAYS - 1
    assert "copy(" in step.plans[0].source, step.plans[0].source


@pytest.mark.parametrize("device", DEVICES)
def test_peephole_no_op_sum_to_and_reshape_dropped(device, monkeypatch):
    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))]
    fn = lambda a, b: (a.reshape(2, 3, 4) * b + a).sum()          # noqa: E731
    step, oracle, got, want = _with_and_without(fn, arrays, device, monkeypatch)
    _assert_bitwise(got, want)
    same_name = re.compile(r"(t\d+) = sum_to\(\1,")        # t5 = sum_to(t5, shape): a no-op
    assert same_name.search(oracle.plans[0].source)
    assert not same_name.search(step.plans[0].source), step.plans[0].source
    same_shape = re.compile(r"reshape\(xs_0, \(2, 3, 4\)\)")              # a view of all of it
    assert same_shape.search(oracle.plans[0].source)
    assert not same_shape.search(step.plans[0].source), step.plans[0].source


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(0, 3),
       st.sampled_from(DEVICES))
def test_peephole_broadcast_sum_equals_the_unpeepholed_plan(shape, keep_axes, device):
    # Broadcast gradients sum_to a smaller shape (a real call) or to the same (a no-op).
    rng = np.random.default_rng(len(shape) * 10 + keep_axes)
    small = tuple(shape[len(shape) - keep_axes:]) if keep_axes else ()
    arrays = [rng.normal(size=shape), rng.normal(size=small)]
    fn = lambda x, b: ((x * b).exp() + b).sum()                    # noqa: E731
    with pytest.MonkeyPatch.context() as monkeypatch:
        _, _, got, want = _with_and_without(fn, arrays, device, monkeypatch)
    _assert_bitwise(got, want)


def test_peepholes_leave_device_arrays_and_inputs_alone():
    """A call on an array bound afresh at each replay (an input) whose result depends on its
    layout is kept: the next input may be laid out otherwise."""
    from tinygrad_attn.compiler.capture import Call, Recorder

    recorder = Recorder()
    x = np.zeros((2, 3))
    slot = recorder.input(x)
    kept = [Call("cpu", "asarray", (slot, np.dtype("float64")), {}, slot),
            Call("cpu", "broadcast_to", (slot, (2, 3)), {}, slot)]
    entries, renamed = plan_module.peepholes(recorder, kept, keep=set())
    assert entries == kept and renamed == {}
    dropped = [Call("cpu", "sum_to", (slot, (2, 3)), {}, slot)]
    assert plan_module.peepholes(recorder, dropped, keep=set()) == ([], {})


def test_shape_no_op_is_a_call_that_returned_its_input_decided_by_shapes_alone():
    """plan.shape_no_op, the one rule the peepholes and fusion share (test_fuse.py tests the
    fusion side): a sum_to or to_numpy that returned its argument, on any device, an input
    included; not a call that made a new array, nor one decided by the layout."""
    from tinygrad_attn.compiler.capture import Call, Recorder

    recorder = Recorder()
    x = recorder.input(np.zeros((2, 3)))
    y = recorder.input(np.zeros(3))
    for device in ("cpu", "numpy", "cuda"):
        assert plan_module.shape_no_op(Call(device, "sum_to", (x, (2, 3)), {}, x))
        assert plan_module.shape_no_op(Call(device, "to_numpy", (x,), {}, x))
        assert not plan_module.shape_no_op(Call(device, "sum_to", (x, (3,)), {}, y))
        assert not plan_module.shape_no_op(Call(device, "broadcast_to", (x, (2, 3)), {}, x))
        assert not plan_module.shape_no_op(Call(device, "sum_to", (), {}, x))
