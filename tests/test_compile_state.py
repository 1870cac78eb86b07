"""ta.compile and what a function reads besides its arguments: tensors made inside it from
host data or the generator, numpy arrays the caller keeps, optimizer settings, tensors that
share an array or a gradient.  Each case ran the capture's values again on replays before
(a silent difference from eager code); each test compares compiled calls with eager calls
of the same function, call after call."""

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import functional as F
from tinygrad_attn import optim

DEVICES = ["cpu", "numpy"]


def _tensor(values, device="cpu", grad=False):
    return ta.Tensor(np.asarray(values, dtype=np.float64), dtype="float64", device=device,
                     requires_grad=grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("draw", ["randn", "rand"])
def test_random_tensors_made_inside_are_drawn_again_at_every_call(device, draw):
    """As dropout's masks: each replay draws from the generator current then, so compiled
    calls consume the stream eager calls would."""
    def f(x):
        return x + getattr(ta.Tensor, draw)(2, 3, dtype="float64", device=device)

    with ta.no_grad():
        compiled = ta.compile(f)
        ta.manual_seed(5)
        got = [compiled(_tensor(np.zeros((2, 3)), device)).numpy().copy() for _ in range(4)]
        ta.manual_seed(5)
        want = [f(_tensor(np.zeros((2, 3)), device)).numpy().copy() for _ in range(4)]
    assert compiled.stats.replays == 3
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert not np.array_equal(got[0], got[1])
    assert f"random_{'normal' if draw == 'randn' else 'uniform'}(generator," in compiled.source


def test_random_tensors_keep_their_dtype_and_refuse_grad_on_integers():
    ta.manual_seed(0)
    assert ta.Tensor.randn(3).dtype == np.float32 and ta.Tensor.rand(3, dtype="float64").dtype == np.float64
    ta.manual_seed(0)
    expected = np.random.default_rng(0).standard_normal((2, 2)).astype(np.float32)
    np.testing.assert_array_equal(ta.Tensor.randn(2, 2).numpy(), expected)
    with pytest.raises(ta.DTypeError, match="only float tensors can require grad"):
        ta.Tensor.rand(2, dtype="int64", requires_grad=True)


@pytest.mark.parametrize("device", DEVICES)
def test_a_numpy_array_the_caller_changes_is_read_at_every_call(device):
    scale = np.ones(3)

    def f(x):
        return x * scale + x * scale[::-1]             # the array, and a view of it

    with ta.no_grad():
        compiled = ta.compile(f)
        for k in range(4):
            scale[:] = [k + 1, 2 * k, -k]              # in place: the same array object
            x = _tensor([1.0, 2.0, 3.0], device)
            np.testing.assert_array_equal(compiled(x).numpy(), f(x).numpy())
    assert compiled.stats.replays == 3


@pytest.mark.parametrize("device", DEVICES)
def test_constants_made_inside_are_new_arrays_when_returned(device):
    """A tensor made inside from host data is a new one at every eager call: a plan that
    returns it makes it again at every replay (the caller may change what it got)."""
    def f(x):
        h = ta.Tensor.zeros(3, dtype="float64", device=device)
        return h, x + h

    with ta.no_grad():
        compiled = ta.compile(f)
        for k in range(4):
            x = _tensor(np.arange(3.0) + k, device)
            (h, y), (_, y_eager) = compiled(x), f(x)
            np.testing.assert_array_equal(y.numpy(), y_eager.numpy())
            np.testing.assert_array_equal(h.numpy(), np.zeros(3))
            h.data[...] = 100.0                        # the caller's to change
    assert compiled.stats.replays == 3


def test_constants_only_the_plan_holds_are_folded_and_shown():
    def f(x):
        mask = np.triu(np.ones((3, 3)), 1)             # made and dropped inside: a constant
        return x + ta.Tensor(mask, dtype="float64") + ta.Tensor.arange(3, dtype="float64")

    with ta.no_grad():
        compiled = ta.compile(f)
        x = _tensor(np.ones((3, 3)))
        compiled(x)
        np.testing.assert_array_equal(compiled(x).numpy(), f(x).numpy())
    plan = compiled.plans[0]
    assert "from_host" not in [getattr(e, "kernel", None) for e in plan.entries]
    assert len(plan.constants) == 2
    assert "= from_host([0, 1, 2], float64): computed once" in plan.source
    assert "= from_host(<host array (3, 3) float64>, float64)" in plan.source


def test_a_leaf_made_inside_with_requires_grad_replays():
    """A leaf made at each call has no gradient at entry: its plan needs no guard on it and
    replays (it captured again at every call, up to the cap)."""
    def g(x):
        w = ta.Tensor(np.ones(3), requires_grad=True, dtype="float64")
        (w * x).sum().backward()
        return w.grad

    compiled = ta.compile(g)
    for k in range(5):
        x = _tensor(np.arange(3.0) + k)
        np.testing.assert_array_equal(compiled(x).numpy(), g(x).numpy())
    assert compiled.stats.captures == 1 and compiled.stats.replays == 4


class _Lazy(ta.nn.Module):
    """A layer that makes its tensor ``w`` in its first forward: ``make(x)``, then
    ``combine(x, w)`` at every call."""

    def __init__(self, make, combine=lambda x, w: (x * w).sum()):
        super().__init__()
        self.w, self.make, self.combine = None, make, combine

    def forward(self, x):
        if self.w is None:
            self.w = self.make(x)
        return self.combine(x, self.w)


def test_a_parameter_a_layer_makes_on_its_first_call_is_kept():
    """A layer that makes its parameter in its first forward, inside the capture: the next
    call captures again and reads that parameter (its gradient accumulates as eager's)
    instead of making it anew."""
    def ones(x):
        return ta.nn.Parameter(np.ones(x.shape[-1]))

    compiled_model, eager_model = _Lazy(ones), _Lazy(ones)

    def step(model, x):
        loss = model(x)
        loss.backward()
        return loss

    compiled = ta.compile(lambda x: step(compiled_model, x))
    for k in range(4):
        x = ta.Tensor(np.full(3, k + 1.0, dtype=np.float32))
        np.testing.assert_array_equal(compiled(x).numpy(), step(eager_model, x).numpy())
        np.testing.assert_array_equal(compiled_model.w.grad.numpy(), eager_model.w.grad.numpy())
    assert compiled.stats.replays >= 2


def test_sgd_momentum_switched_on_after_the_capture_captures_again():
    w, w_eager = _tensor([1.0, 2.0, 3.0], grad=True), _tensor([1.0, 2.0, 3.0], grad=True)
    opt, opt_eager = optim.SGD([w], lr=0.1), optim.SGD([w_eager], lr=0.1)

    def step(param, optimizer, x):
        optimizer.zero_grad()
        loss = (x * param).sum()
        loss.backward()
        optimizer.step()
        return loss

    compiled = ta.compile(lambda x: step(w, opt, x))
    for k in range(6):
        if k == 2:
            opt.momentum = opt_eager.momentum = 0.9
        if k == 4:
            opt.momentum = opt_eager.momentum = 0.0
        x = _tensor(np.ones(3) * (k + 1))
        compiled(x)
        step(w_eager, opt_eager, x)
        np.testing.assert_array_equal(w.numpy(), w_eager.numpy())
        if k == 2:
            assert "momentum" in compiled.stats.reason
    # .grad None then set, momentum on, momentum off (a buffer now: the first plans are dead)
    assert compiled.stats.captures == 4 and compiled.stats.replays == 2


@pytest.mark.parametrize("device", DEVICES)
def test_an_argument_sharing_a_parameters_array_holds_the_plan_to_it(device):
    """``step(w.detach())``: the capture reads the argument where the function read ``w``; a
    later argument of its own must not stand for ``w`` too."""
    w = _tensor([1.0, 2.0, 3.0], device, grad=True)

    def f(x):
        return x * w

    with ta.no_grad():
        compiled = ta.compile(f)
        others = [_tensor([10.0, 20.0, 30.0], device), _tensor([5.0, 5.0, 5.0], device)]
        for x in [w.detach(), others[0], w.detach(), others[1]]:
            np.testing.assert_array_equal(compiled(x).numpy(), f(x).numpy())
    assert compiled.stats.captures == 2 and compiled.stats.replays == 2


def test_parameters_sharing_one_gradient_tensor_at_the_capture_hold_the_plan_to_it():
    params = [_tensor([1.0, 1.0], grad=True), _tensor([2.0, 2.0], grad=True)]
    twins = [_tensor([1.0, 1.0], grad=True), _tensor([2.0, 2.0], grad=True)]
    opt, opt_eager = optim.SGD(params, lr=1.0), optim.SGD(twins, lr=1.0)
    compiled = ta.compile(lambda: opt.step())
    for k in range(4):
        g, h = _tensor([0.5, 0.5]), _tensor([10.0, 10.0])
        grads = (g, g) if k in (0, 2) else (g, h)
        for p, q, grad in zip(params, twins, grads, strict=True):
            p.grad = q.grad = grad
        compiled()
        opt_eager.step()
        for p, q in zip(params, twins, strict=True):
            np.testing.assert_array_equal(p.numpy(), q.numpy())
    assert compiled.stats.captures == 2 and compiled.stats.replays == 2


class _State:
    """State carried from call to call in a plain attribute: the case plans cannot replay."""


@pytest.mark.parametrize("device", DEVICES)
def test_state_replaced_in_a_plain_attribute_is_not_replayed_stale(device):
    """``state.h = out`` is Python, which a plan does not replay: the tensor the capture made
    outlives the call, its plan dies, and the call runs the function again (warned once),
    giving eager's values at every call instead of reading the first state forever."""
    compiled_state, eager_state = _State(), _State()
    compiled_state.h, eager_state.h = _tensor(np.zeros(3), device), _tensor(np.zeros(3), device)

    def step(state, x):
        out = state.h * 0.5 + x
        state.h = out
        return out

    compiled = ta.compile(lambda x: step(compiled_state, x))
    with ta.no_grad(), pytest.warns(UserWarning, match="state kept in a Python attribute") as caught:
        for k in range(12):
            x = _tensor(np.full(3, k + 1.0), device)
            np.testing.assert_array_equal(compiled(x).numpy(), step(eager_state, x).numpy())
            np.testing.assert_array_equal(compiled_state.h.numpy(), eager_state.h.numpy())
    assert len([w for w in caught if "dropped" in str(w.message)]) == 1
    # the first capture and 7 more, each plan dying at the next call; then eager calls
    assert compiled.stats.replays == 0 and compiled.stats.captures == 8
    assert compiled.stats.eager_calls == 4 and "state kept in Python" in compiled.stats.reason


def test_detached_state_carried_with_training_is_not_replayed_stale():
    """Truncated backpropagation through time: the state is detached and kept; each step's
    gradient must use the state the step before left."""
    w, w_eager = _tensor([0.5, -1.0, 2.0], grad=True), _tensor([0.5, -1.0, 2.0], grad=True)
    compiled_state, eager_state = _State(), _State()
    compiled_state.h, eager_state.h = _tensor(np.ones(3)), _tensor(np.ones(3))

    def step(param, state, x):
        out = (state.h * param + x).tanh()
        loss = (out * out).sum()
        loss.backward()
        state.h = out.detach()
        return loss

    compiled = ta.compile(lambda x: step(w, compiled_state, x))
    with pytest.warns(UserWarning, match="dropped"):
        for k in range(4):
            x = _tensor(np.full(3, 0.1 * k))
            np.testing.assert_array_equal(compiled(x).numpy(), step(w_eager, eager_state, x).numpy())
            np.testing.assert_array_equal(w.grad.numpy(), w_eager.grad.numpy())


def test_a_tensor_variable_the_caller_rebinds_is_read_as_rebound(recwarn):
    """Swapped once, the tensor is read by a new plan (no warning: a warning comes with a
    second swap of one signature, state that changes at every call)."""
    shift = _tensor([1.0, 2.0, 3.0])

    def f(x):
        return x + shift

    compiled = ta.compile(f)
    with ta.no_grad():
        for k in range(4):
            x = _tensor(np.zeros(3))
            np.testing.assert_array_equal(compiled(x).numpy(), f(x).numpy())
            if k == 1:
                shift = _tensor([10.0, 20.0, 30.0])     # noqa: F841 - read by f, a closure
    assert compiled.stats.captures == 2 and compiled.stats.replays == 2
    assert not [w for w in recwarn if "ta.compile" in str(w.message)]


def test_a_tensor_kept_alive_by_its_owner_replays_without_a_warning(recwarn):
    """The weak hold costs nothing where the state stays: a closure's tensor that is not
    rebound."""
    table = _tensor(np.arange(3.0))
    compiled = ta.compile(lambda x: x * table)
    with ta.no_grad():
        for _ in range(4):
            compiled(_tensor(np.ones(3)))
    assert compiled.stats.captures == 1 and compiled.stats.replays == 3
    assert not [w for w in recwarn if "ta.compile" in str(w.message)]


def test_state_made_on_the_first_call_and_returned_is_not_replayed_stale():
    """``h = state.h if state.h is not None else zeros``, then ``state.h = ...`` returned
    too: the returned tensor is a new one, the kept one outlives the call alone."""
    def run(compiled):
        state = _State()
        state.h = None

        def step(x):
            h = state.h if state.h is not None else ta.Tensor.zeros(3, dtype="float64")
            state.h = h * 0.5 + x
            return state.h

        fn = ta.compile(step) if compiled else step
        with ta.no_grad():
            return [fn(_tensor(np.ones(3))).numpy()[0] for _ in range(4)]

    with pytest.warns(UserWarning, match="outlived the call"):
        assert run(True) == run(False) == [1.0, 1.5, 1.75, 1.875]


@pytest.mark.parametrize("kind", ["fixed random", "parameter drawn"])
def test_a_tensor_a_layer_makes_on_its_first_call_is_read_not_made_again(kind, recwarn):
    """A layer's first forward makes its tensor (a fixed random projection, a parameter drawn
    from the generator) inside the capture: the first plan is dropped at the next call and
    the second reads the tensor, so replays neither draw again nor lose its updates."""
    def draw(x):
        drawn = ta.Tensor.randn(3, dtype="float64")
        return drawn if kind == "fixed random" else ta.nn.Parameter(drawn * 0.1, dtype="float64")

    results = {}
    for mode in ("compiled", "eager"):
        ta.manual_seed(0)
        model = _Lazy(draw)
        fn = ta.compile(lambda x, model=model: model(x)) if mode == "compiled" else model
        with ta.no_grad():
            results[mode] = [(fn(_tensor(np.full(3, k + 1.0))).numpy(), ta.Tensor.randn(1).numpy())
                             for k in range(4)]                 # the value, then the stream after
    for (got, stream), (want, stream_eager) in zip(results["compiled"], results["eager"], strict=True):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(stream, stream_eager)
    assert not [w for w in recwarn if "ta.compile" in str(w.message)]


def test_a_lazy_parameter_with_fusion_captures_again_and_replays():
    def ramp(x):
        return ta.nn.Parameter(np.linspace(0, 2, x.shape[-1]), dtype="float64")

    def combine(x, w):
        return ((x * w + x).tanh() * w).sum()

    compiled_model, eager_model = _Lazy(ramp, combine), _Lazy(ramp, combine)

    def step(model, x):
        loss = model(x)
        loss.backward()
        return loss

    compiled = ta.compile(lambda x: step(compiled_model, x), fuse=True)
    for k in range(4):
        x = _tensor(np.linspace(-1, 1, 4096) * (k + 1))
        np.testing.assert_allclose(compiled(x).numpy(), step(eager_model, x).numpy(), rtol=1e-12)
        np.testing.assert_allclose(compiled_model.w.grad.numpy(), eager_model.w.grad.numpy(), rtol=1e-12)
    # the first plan made the parameter: dropped at the second call, which captures again
    assert compiled.stats.captures == 2 and compiled.stats.replays == 2
    assert compiled.plans[-1].chains


def test_a_rebound_weight_whose_gradient_the_plan_writes_is_not_replayed_stale():
    weights = [_tensor([1.0, 2.0, 3.0], grad=True)]

    def f(x):
        loss = (x * weights[-1]).sum()
        loss.backward()
        return loss

    compiled = ta.compile(f)
    for k in range(5):
        if k == 3:
            weights[:] = [_tensor([10.0, 20.0, 30.0], grad=True)]     # the old one dropped
            weights[-1].grad = _tensor(np.zeros(3))
        want = 6.0 if k < 3 else 60.0
        assert compiled(_tensor(np.ones(3))).numpy() == want


def test_an_argument_sharing_an_array_the_optimizer_updates_holds_the_plan_to_it():
    """The optimizer reads its parameter's array directly (no op sees ``w``): the plan is
    held to the sharing all the same."""
    def run(compiled):
        w = _tensor([1.0, 2.0, 3.0], grad=True)
        opt = optim.SGD([w], lr=0.1)

        def f(x):
            opt.step()
            return x * 2.0

        fn = ta.compile(f) if compiled else f
        seen = []
        with ta.no_grad():
            for k in range(3):
                w.grad = _tensor(np.ones(3))
                x = w.detach() if k == 0 else _tensor(np.full(3, 100.0))
                fn(x)
                seen.append((w.numpy().tolist(), x.numpy().tolist()))
        return seen

    assert run(True) == run(False)


def test_a_gradient_the_step_sets_itself_is_not_state(recwarn):
    """``p.grad = p.grad * 0.5 + ...`` inside the step (scaling, a decay): the parameter keeps
    the tensor (and its graph) by design; the plan replays."""
    def run(compiled):
        ta.manual_seed(0)
        linear = ta.nn.Linear(4, 2).double()
        opt = optim.SGD(linear.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad()
            loss = (linear(x) ** 2).mean()
            loss.backward()
            for p in linear.parameters():
                p.grad = p.grad * 0.5 + p * 1e-3
            opt.step()
            return loss

        fn = ta.compile(step) if compiled else step
        losses = [fn(_tensor(np.full((3, 4), 0.1 * k))).numpy() for k in range(6)]
        return losses, linear.weight.numpy(), getattr(fn, "stats", None)

    (got, weight, stats), (want, weight_eager, _) = run(True), run(False)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(weight, weight_eager)
    assert stats.captures == 2 and stats.replays == 4
    assert not [w for w in recwarn if "ta.compile" in str(w.message)]


def test_a_state_passed_detached_by_the_caller_replays(recwarn):
    """Truncated backpropagation's idiom, ``step(x, h.detach())``: the caller's ``h`` holds
    the argument's array but the function never reads it; the plan replays."""
    ta.manual_seed(0)
    cell = ta.nn.GRUCell(4, 6)
    opt = optim.SGD(cell.parameters(), lr=0.1)

    def step(x, h):
        opt.zero_grad()
        h2 = cell(x, h)
        loss = (h2 ** 2).mean()
        loss.backward()
        opt.step()
        return loss, h2.detach()

    compiled = ta.compile(step)
    rng = np.random.default_rng(0)
    h = ta.Tensor(np.zeros((2, 6), dtype=np.float32))
    for _ in range(8):
        _, h = compiled(ta.Tensor(rng.normal(size=(2, 4)).astype(np.float32)), h.detach())
    assert compiled.stats.captures == 2 and compiled.stats.replays == 6
    assert not [w for w in recwarn if "ta.compile" in str(w.message)]


@pytest.mark.parametrize("make", ["comparison", "cast", "op"])
def test_a_mask_cached_on_the_first_call_is_read_afterwards(make):
    """A tensor made on the first call and kept in a dict (a mask, a cast, an op's result):
    the second call captures again and reads the cached one, as eager code does."""
    def function():
        cache = {}

        def f(x):
            if "m" not in cache:
                cache["m"] = {"comparison": lambda: x > 0, "cast": lambda: (x > 0).astype("float64"),
                              "op": lambda: x.relu()}[make]()
            kept = cache["m"]
            return ta.where(kept, x, x * 0.0) if make == "comparison" else x * kept
        return f

    compiled, eager = ta.compile(function()), function()
    rng = np.random.default_rng(1)
    with ta.no_grad():
        for _ in range(5):
            x = _tensor(rng.normal(size=6))
            np.testing.assert_array_equal(compiled(x).numpy(), eager(x).numpy())
    assert compiled.stats.captures == 2 and compiled.stats.replays == 3


def test_a_table_cached_per_shape_is_not_taken_for_state_kept_at_every_call(recwarn):
    cache = {}

    def f(x):
        n = x.shape[1]
        if n not in cache:
            cache[n] = ta.Tensor(np.tril(np.ones((n, n))), dtype="float64")
        return (x @ cache[n]).sum()

    compiled = ta.compile(f)
    rng = np.random.default_rng(2)
    with ta.no_grad():
        for n in (2, 3, 4):
            for _ in range(3):
                x = _tensor(rng.normal(size=(3, n)))
                np.testing.assert_array_equal(compiled(x).numpy(), f(x).numpy())
    assert compiled.stats.captures == 6 and compiled.stats.replays == 3       # two a shape
    assert not [w for w in recwarn if "ta.compile" in str(w.message)]


def test_an_argument_that_is_a_layers_parameter_holds_the_plan_to_it():
    linear = ta.nn.Linear(3, 2).double()

    def f(v, x):
        return linear(x).sum() + (v * v).sum()

    compiled = ta.compile(f)
    x = _tensor(np.ones((1, 3)))
    with ta.no_grad():
        for k in range(4):
            v = linear.weight if k == 0 else _tensor(np.full((2, 3), float(k)), grad=True)
            np.testing.assert_array_equal(compiled(v, x).numpy(), f(v, x).numpy())


def test_an_argument_the_function_keeps_is_not_read_for_good():
    """``state["prev"] = x``, with the caller keeping every batch alive: the kept argument
    is state, so the call captures again (and the signature runs eagerly in the end)."""
    def make():
        state = {"prev": _tensor(np.zeros(3))}

        def f(x):
            out = x - state["prev"]
            state["prev"] = x
            return out
        return f

    batches = [_tensor(np.full(3, float(k))) for k in range(12)]
    compiled, eager = ta.compile(make()), make()
    with ta.no_grad(), pytest.warns(UserWarning, match="outlived the call"):
        for x in batches:
            np.testing.assert_array_equal(compiled(x).numpy(), eager(x).numpy())
    assert compiled.stats.replays == 0


@pytest.mark.parametrize("how", ["using", "generator", "manual_seed"])
def test_a_generator_the_function_makes_or_seeds_runs_it_eagerly(how):
    """Each eager call restarts the stream of a generator made (or seeded) inside; a plan
    would continue it, so such a function runs eagerly, warned once."""
    def f(x):
        if how == "using":
            with ta.random.using(np.random.default_rng(7)):
                return F.dropout(x, 0.5)
        if how == "generator":
            return F.dropout(x, 0.5, generator=np.random.default_rng(7))
        ta.manual_seed(11)
        return x + ta.Tensor.randn(3, 4, dtype="float64")

    compiled = ta.compile(f)
    with ta.no_grad(), pytest.warns(UserWarning, match="seeds or makes a random generator") as caught:
        for k in range(4):
            x = _tensor(np.ones((3, 4)) * (k + 1))
            np.testing.assert_array_equal(compiled(x).numpy(), f(x).numpy())
    assert len([w for w in caught if "random generator" in str(w.message)]) == 1
    assert compiled.stats.replays == 0 and compiled.stats.eager_calls == 3


def test_a_mode_read_outside_a_forward_is_guarded():
    """A method other than forward passes ``self.training`` to dropout: toggling the mode
    must capture again (reading ``training`` reports the module, as its forward does)."""
    class Scorer(ta.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = ta.nn.Parameter(np.ones((3, 3)), dtype="float64")

        def score(self, x):
            return F.dropout(x @ self.w, 0.5, self.training)

    results = {}
    for mode in ("compiled", "eager"):
        ta.manual_seed(0)
        model = Scorer()
        fn = ta.compile(lambda x, model=model: model.score(x)) if mode == "compiled" else model.score
        out = []
        with ta.no_grad():
            for k in range(6):
                model.train(k % 2 == 1)
                out.append(fn(_tensor(np.ones((2, 3)) * (k + 1))).numpy())
        results[mode] = out
    for got, want in zip(results["compiled"], results["eager"], strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_sharer_the_caller_keeps_but_the_function_never_reads_does_not_miss(recwarn):
    """``step(x, h.detach())`` with every old ``h`` kept by the caller: ``h`` held the
    argument's array at the capture but the plan never reads it; a later ``h`` of its own
    must not make the call miss."""
    ta.manual_seed(0)
    cell = ta.nn.GRUCell(4, 6)

    def step(x, h):
        return cell(x, h).detach()

    compiled = ta.compile(step)
    rng = np.random.default_rng(0)
    kept = [ta.Tensor(np.zeros((2, 6), dtype=np.float32))]
    with ta.no_grad():
        for _ in range(6):
            kept.append(compiled(ta.Tensor(rng.normal(size=(2, 4)).astype(np.float32)), kept[-1].detach()))
    assert compiled.stats.captures == 1 and compiled.stats.replays == 5
    assert not [w for w in recwarn if "ta.compile" in str(w.message)]


def test_a_mode_the_step_sets_itself_is_not_guarded(recwarn):
    """A training step that calls ``model.train()`` and an evaluation that calls
    ``model.eval()``, alternating: each sets the mode it runs in, so the mode at entry (the
    other one's) must not make it capture again."""
    class Net(ta.nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden, self.drop, self.out = ta.nn.Linear(4, 4), ta.nn.Dropout(0.5), ta.nn.Linear(4, 1)

        def forward(self, x):
            return self.out(self.drop(self.hidden(x)))

    ta.manual_seed(0)
    model = Net().double()
    opt = optim.SGD(model.parameters(), lr=0.01)

    def train_step(x):
        model.train()
        opt.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    def eval_step(x):
        model.eval()
        return model(x).sum()

    train, evaluate = ta.compile(train_step), ta.compile(eval_step)
    for k in range(8):
        x = _tensor(np.full((2, 4), 0.1 * (k + 1)))
        train(x)
        with ta.no_grad():
            evaluate(x)
    assert train.stats.captures == 2 and train.stats.replays == 6
    assert evaluate.stats.captures == 1 and evaluate.stats.replays == 7
    assert not [w for w in recwarn if "ta.compile" in str(w.message)]


def test_returning_an_arguments_gradient_replays(recwarn):
    x = _tensor([1.0, 2.0, 3.0], grad=True)
    w = _tensor([0.5, 0.5, 0.5], grad=True)

    def f(x):
        loss = (x * w).sum()
        loss.backward()
        return loss, x.grad

    compiled = ta.compile(f)
    for _ in range(6):
        x.grad = None
        loss, grad = compiled(x)
        assert grad is x.grad
        np.testing.assert_array_equal(grad.numpy(), w.numpy())
    assert compiled.stats.replays >= 4
    assert not [w for w in recwarn if "ta.compile" in str(w.message)]


def test_an_optimizer_reset_to_a_state_never_stepped_captures_again():
    """``opt.load_state_dict(fresh)`` with a state taken before any step leaves each
    parameter's state None: the plan's guards on the state arrays miss instead of failing."""
    def run(compiled):
        ta.manual_seed(0)
        linear = ta.nn.Linear(3, 2).double()
        opt = optim.Adam(linear.parameters(), lr=0.1)
        fresh = opt.state_dict()

        def step(x):
            opt.zero_grad()
            loss = (linear(x) ** 2).mean()
            loss.backward()
            opt.step()
            return loss

        fn = ta.compile(step) if compiled else step
        losses = []
        for k in range(5):
            if k == 2:
                opt.load_state_dict(fresh)
            losses.append(fn(_tensor(np.full((2, 3), 0.5 + k))).numpy())
        return losses

    np.testing.assert_array_equal(run(True), run(False))
