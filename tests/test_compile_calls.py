"""ta.compile and how a call is keyed, what it returns and what it refuses: keyword
arguments, static values, returned tensors, generators passed to dropout, anomaly mode,
arguments shared with gradients.  Each case once replayed another call's plan, returned
other objects than eager code, or failed where eager code works; each test compares the
compiled calls with eager ones."""

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import functional as F

DEVICES = ["cpu", "numpy"]


def _tensor(values, device="cpu", grad=False):
    return ta.Tensor(np.asarray(values, dtype=np.float64), dtype="float64", device=device,
                     requires_grad=grad)


@pytest.mark.parametrize("device", DEVICES)
def test_a_tensor_bound_to_another_keyword_parameter_gets_its_own_plan(device):
    def f(x, y=None, scale=None):
        out = x * 1.0
        if y is not None:
            out = out + y
        if scale is not None:
            out = out * scale
        return out

    compiled = ta.compile(f)
    with ta.no_grad():
        for k in range(4):
            x, t = _tensor(np.full(3, 2.0), device), _tensor(np.full(3, 10.0 + k), device)
            given = {"y": t} if k % 2 == 0 else {"scale": t}
            np.testing.assert_array_equal(compiled(x, **given).numpy(), f(x, **given).numpy())
    assert compiled.stats.captures == 2 and compiled.stats.replays == 2


def test_static_values_key_by_type_all_the_way_down_and_by_the_sign_of_zero():
    compiled = ta.compile(lambda x, s: 1.0 / (x * s), static=("s",))
    x = _tensor([1.0, 2.0])
    with ta.no_grad(), np.errstate(divide="ignore"):
        for s in (0.0, -0.0, 0.0, -0.0):
            assert np.array_equal(compiled(x, s).numpy(), np.full(2, np.copysign(np.inf, s)))
    assert compiled.stats.captures == 2

    scaled = ta.compile(lambda x, opts: x * opts[0], static=("opts",))
    ids = ta.Tensor(np.array([1, 2]))
    with ta.no_grad():
        np.testing.assert_array_equal(scaled(ids, (2,)).numpy(), [2, 4])
        with pytest.raises(ta.DTypeError):                   # int64 * 2.0, as eager refuses it
            scaled(ids, (2.0,))


def test_static_lists_and_dicts_key_by_their_items_and_unhashable_values_are_named():
    compiled = ta.compile(lambda x, cfg: x * cfg["k"], static=("cfg",))
    x = _tensor([1.0, 2.0])
    with ta.no_grad():
        np.testing.assert_array_equal(compiled(x, {"k": 2.0}).numpy(), [2.0, 4.0])
        np.testing.assert_array_equal(compiled(x, {"k": 3.0}).numpy(), [3.0, 6.0])
        np.testing.assert_array_equal(compiled(x, {"k": 2.0}).numpy(), [2.0, 4.0])
        listed = ta.compile(lambda x, c: x * c[0], static=(1,))
        np.testing.assert_array_equal(listed(x, [5.0]).numpy(), [5.0, 10.0])
        with pytest.raises(TypeError, match="static argument 'c' is a set"):
            listed(x, {5.0})
    assert compiled.stats.captures == 2 and compiled.stats.replays == 1


def test_a_parameter_declared_static_by_position_may_be_passed_by_keyword():
    def f(x, y=None, n=1):
        return x * n if y is None else (x + y) * n

    compiled = ta.compile(f, static=(2,))
    x = _tensor([1.0, 2.0])
    with ta.no_grad():
        np.testing.assert_array_equal(compiled(x, n=3).numpy(), [3.0, 6.0])
        np.testing.assert_array_equal(compiled(x, None, 4).numpy(), [4.0, 8.0])


@pytest.mark.parametrize("device", DEVICES)
def test_returned_leaves_arguments_and_gradients_are_eagers_objects(device):
    linear = ta.nn.Linear(2, 2).double().to(device)

    def f(x):
        loss = (linear(x) ** 2).sum()
        loss.backward()
        return linear.weight, x, linear.weight.grad

    compiled = ta.compile(f)
    for k in range(3):
        linear.weight.grad = None
        x = _tensor(np.ones((1, 2)) * k, device, grad=True)
        weight, same_x, grad = compiled(x)
        assert weight is linear.weight and same_x is x and grad is linear.weight.grad
        assert x.grad is not None and grad is not None
    assert compiled.stats.captures == 2 and compiled.stats.replays == 1      # the bias keeps its .grad


@pytest.mark.parametrize("device", DEVICES)
def test_a_leaf_made_inside_comes_back_with_its_gradient(device):
    def g(x):
        z = ta.Tensor.zeros(3, dtype="float64", device=device, requires_grad=True)
        ((x + z) ** 2).sum().backward()
        return z

    compiled = ta.compile(g)
    for k in range(3):
        x = _tensor(np.arange(3.0) + k, device)
        got, want = compiled(x), g(x)
        assert got.requires_grad and want.requires_grad
        np.testing.assert_array_equal(got.grad.numpy(), want.grad.numpy())
    assert compiled.stats.replays == 2


@pytest.mark.parametrize("device", DEVICES)
def test_a_generator_passed_to_dropout_stays_even_when_it_was_the_current_one(device):
    results = {}
    for mode in ("compiled", "eager"):
        ta.manual_seed(0)
        rng = np.random.default_rng(3)

        def f(x, rng=rng):
            with ta.no_grad():
                return F.dropout(x, 0.5, True, generator=rng)

        fn = ta.compile(f) if mode == "compiled" else f
        x = _tensor(np.ones((2, 8)), device)
        with ta.random.using(rng):                      # the capture: rng is the current one too
            out = [fn(x).numpy().copy()]
        out += [fn(x).numpy().copy() for _ in range(3)]  # outside: eager still draws from rng
        results[mode] = out
    for got, want in zip(results["compiled"], results["eager"], strict=True):
        np.testing.assert_array_equal(got, want)


def test_anomaly_mode_runs_compiled_functions_eagerly():
    w = _tensor(np.ones(3), grad=True)

    def f(x):
        loss = (x * w).sqrt().sum()
        loss.backward()
        return loss

    compiled = ta.compile(f)
    for k in range(3):
        w.grad = None
        compiled(_tensor(np.full(3, k + 1.0)))
    w.grad = None
    with np.errstate(all="ignore"), ta.detect_anomaly(), pytest.raises(RuntimeError, match="Pow"):
        compiled(_tensor([-1.0, 1.0, 1.0]))
    with ta.detect_anomaly():
        compiled(_tensor([1.0, 1.0, 1.0]))              # no capture refusal either
    assert compiled.stats.captures == 1 and compiled.stats.eager_calls == 2      # w.grad None each time


def test_retain_graph_is_refused_before_the_optimizer_steps():
    w = _tensor([1.0, 2.0], grad=True)
    opt = ta.optim.SGD([w], lr=0.5)

    def f(x):
        loss = (x * w).sum()
        loss.backward(retain_graph=True)
        opt.step()
        return loss

    with pytest.raises(ta.CaptureError, match=r"retain_graph=True.*test_compile_calls.py"):
        ta.compile(f)(_tensor([1.0, 1.0]))
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])       # no update made


@pytest.mark.parametrize("device", DEVICES)
def test_an_argument_that_was_a_gradient_at_the_capture_holds_the_plan_to_it(device):
    results = {}
    for mode in ("compiled", "eager"):
        w = _tensor([1.0, 2.0, 3.0], device, grad=True)

        def f(x, w=w):
            loss = (x * w * w).sum()
            loss.backward()
            return w.grad * 1.0

        fn = ta.compile(f) if mode == "compiled" else f
        out = [fn(_tensor(np.ones(3), device)).numpy()]
        out.append(fn(w.grad).numpy())                     # the argument is w's gradient
        out += [fn(_tensor(v, device)).numpy() for v in ([5.0, 6.0, 7.0], [1.0, 1.0, 1.0])]
        results[mode] = out
    for got, want in zip(results["compiled"], results["eager"], strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_one_tensor_passed_as_two_arguments_runs_eagerly(device):
    def f(a, b):
        loss = (a * b * b).sum()
        loss.backward()
        return loss

    compiled = ta.compile(f)
    for k in range(2):                                   # a capture, a replay: distinct tensors
        compiled(_tensor(np.arange(3.0) + k, device, grad=True), _tensor(np.full(3, 2.0), device, grad=True))
    a, a_eager = (_tensor(np.arange(3.0) + 1, device, grad=True) for _ in range(2))
    with pytest.warns(UserWarning, match="arguments share an array") as caught:
        np.testing.assert_array_equal(compiled(a, a).numpy(), f(a_eager, a_eager).numpy())
        np.testing.assert_array_equal(a.grad.numpy(), a_eager.grad.numpy())   # both parts summed
        a.grad = None
        compiled(a, a)                                   # eager again, not warned again
    assert len([w for w in caught if "share an array" in str(w.message)]) == 1
    assert compiled.stats.eager_calls == 2 and compiled.stats.captures == 1


def test_a_parameter_detached_inside_replays():
    """``w.detach()`` made at each call is not state that was replaced: the plan binds the
    parameter it detached and replays (it once captured again at every call)."""
    linear = ta.nn.Linear(3, 3).double()
    compiled = ta.compile(lambda x: x @ linear.weight.detach())
    with ta.no_grad():
        for k in range(5):
            x = _tensor(np.full((2, 3), k + 1.0))
            np.testing.assert_array_equal(compiled(x).numpy(), (x @ linear.weight.detach()).numpy())
        linear.weight.data[...] = 2.0                    # in place: read at the next replay
        x = _tensor(np.ones((2, 3)))
        np.testing.assert_array_equal(compiled(x).numpy(), np.full((2, 3), 6.0))
    assert compiled.stats.captures == 1 and compiled.stats.replays == 5


def test_one_tensor_returned_twice_is_one_tensor():
    compiled = ta.compile(lambda x: [x * 2.0, x + 1.0])
    twice = ta.compile(lambda x: (lambda y: [y, y])(x * 2.0))
    with ta.no_grad():
        for k in range(3):
            first, second = twice(_tensor([1.0, k]))
            assert first is second
            np.testing.assert_array_equal(first.numpy(), [2.0, 2.0 * k])
            a, b = compiled(_tensor([1.0, k]))
            assert a is not b
    assert twice.stats.replays == 2
