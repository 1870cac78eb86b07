"""Constant folding in plans (compiler/fold.py): calls that read only constants of the plan
run once, when it is built.  Folded plans give the bits of the same plans built without
folding, replay after replay, and a constant that a later call could write into, return or
hand out as a view stays a call."""

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.compiler import fold, get_backend
from tinygrad_attn.compiler import plan as plan_module
from tinygrad_attn.compiler.capture import Call, Recorder

DEVICES = ["cpu", "numpy"]

LOSSES = {
    "tiny": lambda a, b: (a * b + a).sum(),
    "sum of a leaf": lambda a, b: a.sum() + (a * b).sum(),
    "mean": lambda a, b: (a.tanh() * b).mean(),
    "rows": lambda a, b: (a.reshape(2, 3) * b.reshape(2, 3)).sum(axis=1).sum(),
}


def _no_folding(recorder, entries, keep, kernel, held=frozenset()):
    return entries, {}, {}


def _replays(fn, device, calls=3):
    """(loss, gradients, gradients writeable) of each call on new leaves: the capture, then
    replays; and the compiled step."""
    step = ta.compile(lambda a, b: _backward(fn(a, b)))
    rng = np.random.default_rng(1)
    results = []
    for _ in range(calls):
        leaves = [ta.Tensor(rng.standard_normal(6), dtype="float64", device=device, requires_grad=True)
                  for _ in range(2)]
        loss = step(*leaves)
        results.append((loss.numpy().copy(), [x.grad.numpy().copy() for x in leaves],
                        [x.grad._data.flags.writeable for x in leaves]))
        for x in leaves:                       # what an optimizer does to a gradient
            x.grad._data *= 2.0
    return results, step


def _backward(loss):
    loss.backward()
    return loss


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_folded_plans_give_the_unfolded_plans_bits(name, device, monkeypatch):
    folded, step = _replays(LOSSES[name], device)
    (plan,) = step.plans
    # Backward's seed, full((), 1.0) reshaped and broadcast: computed once, read by name.
    assert plan.constants, plan.source
    assert "full" not in [getattr(e, "kernel", None) for e in plan.entries]
    for index in plan.constants:
        assert f"# f{index} = " in plan.source and f"f{index}" in plan.names.values()
    monkeypatch.setattr(plan_module, "fold_constants", _no_folding)
    unfolded, step = _replays(LOSSES[name], device)
    assert not step.plans[0].constants and "full" in [e.kernel for e in step.plans[0].entries]
    for (loss, grads, writeable), (loss0, grads0, writeable0) in zip(folded, unfolded, strict=True):
        assert loss.tobytes() == loss0.tobytes()
        assert [g.tobytes() for g in grads] == [g.tobytes() for g in grads0]
        assert writeable == writeable0


# ---------------------------------------------------------------- what must stay a call


def _recorder(*arrays):
    recorder = Recorder()
    slots = [recorder.add_slot(array, kind, kind != "out") for array, kind in arrays]
    return recorder, slots


def _kernel(device, name):
    return get_backend(device).table()[name]


def _seed(recorder, out, shape=(3,)):
    """full((), 1.0) -> reshape (1,) -> broadcast_to ``shape`` into slots out[0..2]."""
    dtype = recorder.constant(np.dtype("float64"))
    return [Call("cpu", "full", ((), 1.0, dtype), {}, out[0]),
            Call("cpu", "reshape", (out[0], (1,)), {}, out[1]),
            Call("cpu", "broadcast_to", (out[1], shape), {}, out[2])]


def _seed_arrays(shape=(3,)):
    scalar = np.ones(())
    return [(scalar, "out"), (scalar.reshape(1), "out"), (np.broadcast_to(scalar.reshape(1), shape), "out")]


def test_a_constant_read_by_pure_calls_folds_whole():
    recorder, (c0, c1, c2, x, y) = _recorder(*_seed_arrays(), (np.zeros(3), "input"), (np.ones(3), "out"))
    entries = _seed(recorder, (c0, c1, c2)) + [Call("cpu", "add", (x, c2), {}, y)]
    kept, values, calls = fold.fold_constants(recorder, entries, {x.index, y.index}, _kernel)
    assert [e.kernel for e in kept] == ["add"]
    assert set(values) == {c0.index, c1.index, c2.index}
    np.testing.assert_array_equal(values[c2.index], np.ones(3))
    described = fold.describe(c2.index, calls, recorder)
    assert described == "broadcast_to(reshape(full((), 1.0, float64), (1,)), (3,))"


def test_a_constant_written_in_place_stays_a_call():
    # add_ gives its output its first argument's slot: the constant would change every replay.
    scalar = np.zeros(3)
    recorder, (c0, x) = _recorder((scalar, "out"), (np.ones(3), "input"))
    dtype = recorder.constant(np.dtype("float64"))
    entries = [Call("cpu", "full", ((3,), 0.0, dtype), {}, c0), Call("cpu", "add_", (c0, x), {}, c0)]
    kept, values, _ = fold.fold_constants(recorder, entries, {x.index}, _kernel)
    assert kept == entries and not values


def test_a_constant_handed_on_as_a_view_stays_a_call():
    base = np.zeros((2, 3))
    recorder, (c0, row, x, y) = _recorder((base, "out"), (base[0], "out"), (np.ones(3), "input"),
                                          (np.ones(3), "out"))
    dtype = recorder.constant(np.dtype("float64"))
    entries = [Call("cpu", "full", ((2, 3), 0.0, dtype), {}, c0),
               Call("cpu", "getitem", (c0, 0), {}, row),                 # a view of the constant
               Call("cpu", "add_", (row, x), {}, row)]                   # ... written into
    kept, values, _ = fold.fold_constants(recorder, entries, {x.index, y.index}, _kernel)
    assert kept == entries and not values


def test_a_returned_constant_stays_a_call():
    recorder, (c0, c1, c2) = _recorder(*_seed_arrays())
    entries = _seed(recorder, (c0, c1, c2))
    kept, values, _ = fold.fold_constants(recorder, entries, {c2.index}, _kernel)
    # The returned broadcast stays a call (a caller may write into what it gets), and so does
    # what it reads: it is a view of the reshape, a view of full's array, so folding them would
    # hand every replay's caller the same memory.
    assert kept == entries and not values


def test_random_and_input_dependent_calls_never_fold():
    recorder, (x, y) = _recorder((np.ones(3), "input"), (np.ones(3), "out"))
    entries = [Call("cpu", "reshape", (x, (3,)), {}, y)]                   # reads an input
    kept, values, _ = fold.fold_constants(recorder, entries, set(), _kernel)
    assert kept == entries and not values


def test_dropout_draws_its_mask_at_every_replay():
    # The multiplier's call reads no array, only the generator: it must stay a call.
    step = ta.compile(lambda x: ta.functional.dropout(x, 0.5))
    x = ta.Tensor(np.ones(64))
    masks = [step(x).numpy().copy() for _ in range(3)]
    assert "dropout_multiplier" in [getattr(e, "kernel", None) for e in step.plans[0].entries]
    assert not np.array_equal(masks[1], masks[2])


def test_a_constant_beside_a_view_written_in_place_stays_a_call():
    # full -> c0; reshape(c0) -> c1; a row of c0 written by add_; then c1 read: c1 saw the
    # write at the capture, so neither may be a value computed once.
    base = np.zeros((2, 3))
    recorder, (c0, c1, row, x, y) = _recorder((base, "out"), (base.reshape(6), "out"), (base[0], "out"),
                                              (np.ones(3), "input"), (np.ones(6), "out"))
    dtype = recorder.constant(np.dtype("float64"))
    entries = [Call("cpu", "full", ((2, 3), 0.0, dtype), {}, c0),
               Call("cpu", "reshape", (c0, (6,)), {}, c1),
               Call("cpu", "getitem", (c0, 0), {}, row),
               Call("cpu", "add_", (row, x), {}, row),
               Call("cpu", "mul", (c1, c1), {}, y)]
    kept, values, _ = fold.fold_constants(recorder, entries, {x.index, y.index}, _kernel)
    assert kept == entries and not values


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_clipped_in_place_are_never_folded_constants(device, monkeypatch):
    """clip_ and sgd_ write into their arguments and return nothing: a leaf's gradient that is
    backward's seed itself (b.sum()) must stay a buffer of the replay, or clipping would scale
    the shared seed at every step."""
    def train(fold_on: bool):
        if not fold_on:
            monkeypatch.setattr(plan_module, "fold_constants", _no_folding)
        b = ta.Tensor(np.zeros(3), dtype="float64", device=device, requires_grad=True)
        w = ta.Tensor(np.ones(3), dtype="float64", device=device, requires_grad=True)
        opt = ta.optim.SGD([b, w], lr=0.1)

        def step(x):
            loss = b.sum() + (x * w).sum()
            loss.backward()
            ta.nn.utils.clip_grad_norm_([b, w], 1.0)
            opt.step()
            opt.zero_grad()
            return loss

        compiled = ta.compile(step)
        for k in range(5):
            compiled(ta.Tensor(np.full(3, float(k)), dtype="float64", device=device))
        monkeypatch.undo()
        return b.numpy().copy(), w.numpy().copy(), compiled.plans[0]

    b_folded, w_folded, plan = train(True)
    b_plain, w_plain, _ = train(False)
    assert b_folded.tobytes() == b_plain.tobytes() and w_folded.tobytes() == w_plain.tobytes()
    for index in plan.constants:                      # the seed itself, still all ones
        np.testing.assert_array_equal(plan.namespace[f"f{index}"], 1.0)
