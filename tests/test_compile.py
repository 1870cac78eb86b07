"""ta.compile: a replayed plan equals the eager run (bitwise: nothing is fused), call after call
with new input values (what catches a value frozen at capture), and refuses what it cannot replay."""

import linecache
import traceback

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import functional as F
from tinygrad_attn import nn

DEVICES = ["cpu", "numpy"]
STEPS = 4


def _tensor(array, device, grad=False):
    return ta.Tensor(array, dtype="float64", device=device, requires_grad=grad)


def _grads(params):
    return [None if p.grad is None else p.grad.numpy().copy() for p in params]


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
        else:
            np.testing.assert_array_equal(g, w)


def _twin(make, device):
    """Two modules with the same float64 weights: one for the compiled function, one eager."""
    ta.manual_seed(0)
    compiled = make().astype(np.float64).to(device)
    eager = make().astype(np.float64).to(device)
    eager.load_state_dict(compiled.state_dict())
    return compiled, eager


def _run_twins(make, loss_of, inputs, device, steps=STEPS):
    """Call ``loss_of(model, *inputs(k))`` compiled and eagerly ``steps`` times (gradients
    accumulate in both: a capture with .grad None, then one with .grad set) and compare the
    losses and every gradient bitwise."""
    compiled_model, eager_model = _twin(make, device)

    def step(*args):
        loss = loss_of(compiled_model, *args)
        loss.backward()
        return loss

    compiled = ta.compile(step)
    for k in range(steps):
        args = inputs(k)
        got = compiled(*args)
        want = loss_of(eager_model, *args)
        want.backward()
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        _assert_same(_grads(compiled_model.parameters()), _grads(eager_model.parameters()))
    assert compiled.stats.captures == 2            # .grad None, then .grad accumulating
    assert compiled.stats.replays == steps - 2
    return compiled


@pytest.mark.parametrize("device", DEVICES)
def test_compile_tiny_graph_bitwise_over_replays(device):
    rng = np.random.default_rng(1)

    def f(a, b):
        loss = (a * b + a).sum()
        loss.backward()
        return loss

    step = ta.compile(f)
    for _ in range(STEPS):
        an, bn = rng.standard_normal(5), rng.standard_normal(5)
        a, b = _tensor(an, device, True), _tensor(bn, device, True)
        a2, b2 = _tensor(an, device, True), _tensor(bn, device, True)
        np.testing.assert_array_equal(step(a, b).numpy(), f(a2, b2).numpy())
        _assert_same(_grads([a, b]), _grads([a2, b2]))
    assert (step.stats.plans, step.stats.captures, step.stats.replays) == (1, 1, STEPS - 1)


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(6, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.hidden(x).relu())


@pytest.mark.parametrize("device", DEVICES)
def test_compile_mlp_cross_entropy_equals_eager(device):
    rng = np.random.default_rng(2)
    data = [(rng.standard_normal((8, 6)), rng.integers(0, 4, 8)) for _ in range(STEPS)]

    def inputs(k):
        x, y = data[k]
        return _tensor(x, device), ta.Tensor(y, device=device)

    _run_twins(_MLP, lambda m, x, y: F.cross_entropy(m(x), y), inputs, device)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_scaled_dot_product_equals_eager(device):
    rng = np.random.default_rng(3)
    data = [[rng.standard_normal((2, 3, 5, 4)) for _ in range(3)] for _ in range(STEPS)]

    def f(q, k, v):
        out, _ = ta.attention.scaled_dot_product(q, k, v, need_weights=False)
        loss = (out * out).sum()
        loss.backward()
        return loss

    step = ta.compile(f)
    for arrays in data:
        got_in = [_tensor(a, device, True) for a in arrays]
        want_in = [_tensor(a, device, True) for a in arrays]
        np.testing.assert_array_equal(step(*got_in).numpy(), f(*want_in).numpy())
        _assert_same(_grads(got_in), _grads(want_in))
    assert step.stats.replays == STEPS - 1


@pytest.mark.parametrize("device", DEVICES)
def test_compile_multi_head_attention_equals_eager(device):
    rng = np.random.default_rng(4)
    data = [(rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 7, 8))) for _ in range(STEPS)]

    def loss_of(m, x, memory):
        out, _ = m(x, memory, memory, need_weights=False)
        return (out * out).mean()

    _run_twins(lambda: nn.MultiHeadAttention(8, 2), loss_of,
               lambda k: tuple(_tensor(a, device) for a in data[k]), device)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_transformer_layer_equals_eager(device):
    rng = np.random.default_rng(5)
    data = [rng.standard_normal((2, 6, 8)) for _ in range(STEPS)]

    def make():
        return nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)

    _run_twins(make, lambda m, x: (m(x) ** 2).mean(), lambda k: (_tensor(data[k], device),), device)


def test_compile_new_shape_captures_a_new_plan():
    step = ta.compile(lambda x: (x * 2.0).sum())
    for n in (3, 4, 3, 4):
        x = np.arange(n, dtype=np.float32)
        assert step(ta.Tensor(x)).item() == 2 * x.sum()
    assert (step.stats.plans, step.stats.captures, step.stats.replays) == (2, 2, 2)
    assert len(step.plans) == 2


def test_compile_replaced_parameter_recaptures_and_uses_new_weights():
    model = nn.Linear(3, 2)
    step = ta.compile(ta.no_grad()(lambda x: model(x)))
    x = ta.Tensor(np.ones((1, 3)))
    step(x)
    step(x)
    new = {k: v + 1.0 for k, v in model.state_dict().items()}
    model.load_state_dict(new)                # replaces every parameter's array
    got = step(x).numpy()
    with ta.no_grad():
        np.testing.assert_array_equal(got, model(x).numpy())
    assert step.stats.captures == 2 and step.stats.plans == 1


def test_compile_item_inside_raises_naming_the_line():
    def f(x):
        y = (x * x).sum()
        return y * y.item()                    # the offending line

    with pytest.raises(ta.CaptureError, match=r"test_compile\.py:\d+: return y \* y\.item\(\)"):
        ta.compile(f)(ta.Tensor([1.0, 2.0]))


@pytest.mark.parametrize("read", [lambda t: t.numpy(), float, bool, lambda t: t.tolist(),
                                  lambda t: t.data], ids=["numpy", "float", "bool", "tolist", "data"])
def test_compile_host_reads_raise(read):
    def f(x):
        y = x.sum()
        read(y)
        return y

    with pytest.raises(ta.CaptureError, match="while capturing"):
        ta.compile(f)(ta.Tensor([1.0, 2.0]))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_cross_entropy_ignore_index_counts_each_call(device):
    # The mean divides by the rows kept: a count frozen at capture would show on call 2.
    rng = np.random.default_rng(6)
    data = [(rng.standard_normal((8, 6)), rng.integers(0, 4, 8)) for _ in range(STEPS)]

    def inputs(k):
        x, y = data[k]
        return _tensor(x, device), ta.Tensor(y, device=device)

    _run_twins(_MLP, lambda m, x, y: F.cross_entropy(m(x), y, ignore_index=0), inputs, device)


def train_step(model, optimizer, x, y):
    """zero_grad, cross-entropy, backward, the update: a training step as users write it."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


@pytest.mark.parametrize("device", DEVICES)
def test_compile_training_step_with_adam_equals_eager(device):
    rng = np.random.default_rng(7)
    data = [(rng.standard_normal((8, 6)), rng.integers(0, 4, 8)) for _ in range(10)]
    compiled_model, eager_model = _twin(_MLP, device)
    optimizers = [ta.optim.Adam(m.parameters(), lr=0.01) for m in (compiled_model, eager_model)]

    step = ta.compile(lambda x, y: train_step(compiled_model, optimizers[0], x, y))
    for k, (x, y) in enumerate(data):
        if k == 5:                               # a schedule's change, read by the replay
            for optimizer in optimizers:
                optimizer.lr = 0.003
        got = step(_tensor(x, device), ta.Tensor(y, device=device))
        want = train_step(eager_model, optimizers[1], _tensor(x, device), ta.Tensor(y, device=device))
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        for p, q in zip(compiled_model.parameters(), eager_model.parameters(), strict=True):
            np.testing.assert_array_equal(p.numpy(), q.numpy())
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    assert "adam_" in step.source
    # .grad None on the first call, set on the second: zero_grad reads it, so two plans.
    assert (step.stats.captures, step.stats.replays) == (2, 8)


@pytest.mark.parametrize("make_optimizer", [lambda ps: ta.optim.Adam(ps, lr=0.01),
                                            lambda ps: ta.optim.SGD(ps, lr=0.1, momentum=0.9)],
                         ids=["adam", "sgd-momentum"])
def test_compile_optimizer_state_made_while_capturing_is_kept_not_remade(make_optimizer):
    """The step's first call makes the optimizer's state (zeroed moments, step counts) and the
    same plan replays from then on (the gradients are cleared outside, so every call starts
    alike): the plan must bind that state, not make it afresh at every replay."""
    rng = np.random.default_rng(8)
    data = [(rng.standard_normal((8, 6)), rng.integers(0, 4, 8)) for _ in range(6)]
    compiled_model, eager_model = _twin(_MLP, "cpu")
    optimizers = [make_optimizer(m.parameters()) for m in (compiled_model, eager_model)]

    def train_step(model, optimizer, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    step = ta.compile(lambda x, y: train_step(compiled_model, optimizers[0], x, y))
    for x, y in data:
        for optimizer in optimizers:
            optimizer.zero_grad()
        step(_tensor(x, "cpu"), ta.Tensor(y))
        train_step(eager_model, optimizers[1], _tensor(x, "cpu"), ta.Tensor(y))
        for p, q in zip(compiled_model.parameters(), eager_model.parameters(), strict=True):
            np.testing.assert_array_equal(p.numpy(), q.numpy())
    assert (step.stats.captures, step.stats.replays) == (1, 5)
    assert "zeros" not in step.source                   # the state is bound, not remade
    assert int(optimizers[0].state[0]["step"]) == int(optimizers[1].state[0]["step"]) == 6


def test_compile_python_number_argument_must_be_static():
    def f(x, scale):
        return x * scale

    with pytest.raises(TypeError, match="'scale' is the Python number 2.0.*static"):
        ta.compile(f)(ta.Tensor([1.0]), 2.0)
    step = ta.compile(f, static=("scale",))
    for scale in (2.0, 3.0, 2.0):
        assert step(ta.Tensor([1.0]), scale).item() == scale
    assert (step.stats.captures, step.stats.replays) == (2, 1)


def test_compile_cap_runs_eagerly_with_one_warning():
    step = ta.compile(lambda x: x + 1.0, max_plans=2)
    with pytest.warns(UserWarning, match="max_plans") as caught:
        for n in range(1, 6):
            np.testing.assert_array_equal(step(ta.Tensor(np.zeros(n))).numpy(), np.ones(n))
    assert len(caught) == 1
    assert (step.stats.plans, step.stats.eager_calls) == (2, 3)


def test_compile_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("TINYGRAD_ATTN_COMPILE", "0")
    step = ta.compile(lambda x: x.sum().item())            # a host read: fine eagerly
    assert step(ta.Tensor([1.0, 2.0])) == 3.0
    assert (step.stats.captures, step.stats.eager_calls) == (0, 1)


def test_compile_source_is_python_and_shows_in_tracebacks():
    step = ta.compile(ta.no_grad()(lambda x, w: x @ w))
    step(ta.Tensor(np.ones((2, 3))), ta.Tensor(np.ones((3, 4))))
    plan = step.plans[0]
    compile(plan.source, "<check>", "exec")
    assert "matmul" in plan.source
    lines = linecache.getlines(plan.filename)
    assert "".join(lines) == plan.source
    with pytest.raises(ValueError) as info:                 # shapes the plan was not made for
        plan.fn(np.ones((2, 3), np.float32), np.ones((5, 4), np.float32))
    text = "".join(traceback.format_exception(info.value))
    assert plan.filename in text and "matmul" in text.split(plan.filename)[-1]


def test_compile_other_thread_is_not_recorded():
    import threading

    results = []
    started, release = threading.Event(), threading.Event()

    def other():
        started.set()
        release.wait(5)
        results.append((ta.Tensor([1.0, 2.0]) * 3.0).sum().item())

    thread = threading.Thread(target=other)
    thread.start()
    started.wait(5)

    def f(x):
        release.set()
        thread.join(5)                       # the other thread's ops run during the capture
        return x * 2.0

    step = ta.compile(ta.no_grad()(f))
    step(ta.Tensor([1.0]))
    assert results == [9.0]
    assert "mul" in step.source and "sum" not in step.source


def test_generated_op_and_kernel_code_shows_in_tracebacks_and_getsource():
    """An elementwise op's generated forward/backward and a reference formula kernel are
    registered with linecache under readable names, not run as anonymous <string> code."""
    import inspect

    x = ta.Tensor(np.array([0.5, -1.0]), dtype="float64", requires_grad=True)
    x.sigmoid().sum().backward()
    forward = ta.ops.Sigmoid.forward
    assert forward.__code__.co_filename == "<Sigmoid generated from its formula>"
    assert "def forward" in inspect.getsource(forward)
    kernel = ta.compiler.get_backend("numpy").sigmoid_back
    kernel = getattr(kernel, "install", lambda: kernel)()
    assert kernel.__code__.co_filename.startswith("<kernel sigmoid_back")
    assert inspect.getsource(kernel).lstrip().startswith("def sigmoid_back")


class _DropoutMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(6, 16)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.drop(self.hidden(x).relu()))


def _dropout_twins_step(compiled_model, eager_model):
    def loss_of(model, x, y):
        return F.cross_entropy(model(x), y)

    def step(x, y):
        loss = loss_of(compiled_model, x, y)
        loss.backward()
        return loss

    def eager(x, y):
        loss = loss_of(eager_model, x, y)
        loss.backward()
        return loss

    return ta.compile(step), eager


def _compare_dropout_call(step, eager, models, x, y, rngs):
    for model in models:
        model.zero_grad()
    with ta.random.using(rngs[0]):
        got = step(_tensor(x, "cpu"), ta.Tensor(y))
    with ta.random.using(rngs[1]):
        want = eager(_tensor(x, "cpu"), ta.Tensor(y))
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    _assert_same(_grads(models[0].parameters()), _grads(models[1].parameters()))


def test_compile_train_eval_switch_recaptures():
    """A plan captured in training mode draws dropout masks; after model.eval() the same
    arguments must not replay it (eager skips dropout), and back in training mode the first
    plan serves again."""
    rng = np.random.default_rng(9)
    models = _twin(_DropoutMLP, "cpu")
    step, eager = _dropout_twins_step(*models)
    draws = (np.random.default_rng(0), np.random.default_rng(0))     # one stream per side
    for mode in ("train", "train", "eval", "eval", "train", "eval"):
        for model in models:
            model.train(mode == "train")
        x, y = rng.standard_normal((8, 6)), rng.integers(0, 4, 8)
        _compare_dropout_call(step, eager, models, x, y, draws)
    assert (step.stats.captures, step.stats.replays) == (2, 4)
    assert "dropout_multiplier" in step.plans[0].source
    assert "dropout_multiplier" not in step.plans[1].source


@pytest.mark.parametrize("how", ["using", "manual_seed"])
def test_compile_dropout_draws_from_the_generator_current_at_each_call(how):
    """Each call draws from the generator current then: a fresh ``ta.random.using``
    generator, or the engine's generator made anew by ``ta.manual_seed``; never the object
    the capture drew from."""
    rng = np.random.default_rng(10)
    models = _twin(_DropoutMLP, "cpu")
    step, eager = _dropout_twins_step(*models)
    for k in range(STEPS):
        x, y = rng.standard_normal((8, 6)), rng.integers(0, 4, 8)
        if how == "using":
            draws = (np.random.default_rng(100 + k), np.random.default_rng(100 + k))
            _compare_dropout_call(step, eager, models, x, y, draws)
            continue
        for model in models:
            model.zero_grad()
        ta.manual_seed(100 + k)
        got = step(_tensor(x, "cpu"), ta.Tensor(y))
        ta.manual_seed(100 + k)
        want = eager(_tensor(x, "cpu"), ta.Tensor(y))
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        _assert_same(_grads(models[0].parameters()), _grads(models[1].parameters()))
    assert (step.stats.captures, step.stats.replays) == (1, STEPS - 1)
    assert "dropout_multiplier(generator," in step.source


_NEEDS_CUDA = pytest.mark.skipif("cuda" not in ta.compiler.available_devices(),
                                 reason="no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not set")


@pytest.mark.parametrize("device", [*DEVICES, pytest.param("cuda", marks=_NEEDS_CUDA)])
def test_compile_optimizer_state_loaded_is_read_not_the_old_arrays(device):
    """``opt.load_state_dict`` replaces the optimizer's state arrays, which a plan binds by
    identity: the plans holding the old ones die and the next call captures again."""
    rng = np.random.default_rng(11)
    data = [(rng.standard_normal((8, 6)), rng.integers(0, 4, 8)) for _ in range(8)]
    compiled_model, eager_model = _twin(_MLP, device)
    optimizers = [ta.optim.Adam(m.parameters(), lr=0.01) for m in (compiled_model, eager_model)]

    step = ta.compile(lambda x, y: train_step(compiled_model, optimizers[0], x, y))
    saved = None
    for k, (x, y) in enumerate(data):
        if k == 2:
            saved = optimizers[1].state_dict()
        if k == 5:                                  # back to the state of step 2
            for optimizer in optimizers:
                optimizer.load_state_dict(saved)
        step(_tensor(x, device), ta.Tensor(y, device=device))
        train_step(eager_model, optimizers[1], _tensor(x, device), ta.Tensor(y, device=device))
        for p, q in zip(compiled_model.parameters(), eager_model.parameters(), strict=True):
            np.testing.assert_array_equal(p.numpy(), q.numpy())
    assert step.stats.reason == "guard: an array, parameter or layer the plan reads was replaced"
    assert (step.stats.captures, step.stats.plans) == (3, 1)        # both old plans died


def test_compile_keyword_and_positional_calls_share_plans():
    """The fast path (positional tensors) and the bound path (keywords, arrays) find the
    same plans; an array argument is a new Tensor each call, as eager code makes it."""
    def f(a, b=None):
        return (a * 2.0).sum() if b is None else (a * b).sum()

    step = ta.compile(ta.no_grad()(f))
    x, y = np.arange(3.0), np.ones(3)
    assert step(ta.Tensor(x), None).item() == 6.0                  # fast: captures
    assert step(a=ta.Tensor(x), b=None).item() == 6.0              # bound: replays
    assert step(ta.Tensor(x), ta.Tensor(y)).item() == 3.0          # fast: captures
    assert step(x.astype(np.float32), b=ta.Tensor(2 * y)).item() == 6.0   # bound: replays
    assert step(ta.Tensor(x), None).item() == 6.0                  # fast: replays
    assert (step.stats.captures, step.stats.replays) == (2, 3)


def test_compile_parameters_of_the_same_name_get_distinct_names():
    """Two layers' parameters are both called "weight": the plan's names (parameters bound by
    identity, gradients read at entry) must stay distinct, or one layer would read the other's."""
    ta.manual_seed(0)
    layers = [nn.Linear(3, 3).astype(np.float64) for _ in range(2)]
    params = [p for layer in layers for p in layer.parameters()]

    def step(x):
        loss = layers[1](layers[0](x).tanh()).sum()
        loss.backward()
        return loss

    compiled = ta.compile(step)
    rng = np.random.default_rng(3)
    for _ in range(3):                                  # gradients accumulate: read at entry
        x = _tensor(rng.standard_normal((2, 3)), "cpu")
        compiled(x)
    got = _grads(params)
    for p in params:
        p.grad = None
    rng = np.random.default_rng(3)
    for _ in range(3):
        step(_tensor(rng.standard_normal((2, 3)), "cpu"))
    _assert_same(got, _grads(params))
    assert compiled.stats.replays == 1


def test_compile_trailing_var_positional_takes_the_fast_path(monkeypatch):
    """A function ending in *args (the Transformer's decode step: its caches) replays from the
    arguments alone, without binding the signature; each arity keys its own plans, and a
    different count or shape of the trailing tensors is never served another's plan."""
    def f(a, scale, *rest):
        out = a * scale
        for r in rest:
            out = out if r is None else out + r
        return out.sum()

    step = ta.compile(ta.no_grad()(f))
    binds = []
    original = step._arguments
    monkeypatch.setattr(step, "_arguments", lambda *a: binds.append(1) or original(*a))
    rng = np.random.default_rng(0)
    for arity in (0, 1, 2, 1, 0, 2):
        a, scale = rng.standard_normal(4), rng.standard_normal(1)
        rest = [rng.standard_normal(4) for _ in range(arity)]
        got = step(ta.Tensor(a), ta.Tensor(scale), *map(ta.Tensor, rest)).item()
        want = f(ta.Tensor(a), ta.Tensor(scale), *map(ta.Tensor, rest)).item()
        assert got == want
    assert (step.stats.captures, step.stats.replays) == (3, 3)
    assert len(binds) == 3                               # only the captures bound the signature
    wide = step(ta.Tensor(np.ones(5)), ta.Tensor(np.ones(1)), ta.Tensor(np.ones(5))).item()
    assert wide == 10.0 and step.stats.captures == 4     # another shape among *rest: a new plan
    assert step(ta.Tensor(np.ones(4)), ta.Tensor(np.ones(1)), None).item() == 4.0   # None in *rest


def test_threads_that_meet_a_new_signature_at_once_capture_one_plan():
    """A second thread that waited while the first captured replays its plan."""
    import threading

    barrier = threading.Barrier(4)
    step = ta.compile(lambda x: (x * 2.0 + 1.0).sum())

    def call():
        barrier.wait()
        return float(step(ta.Tensor(np.arange(6.0))).item())

    results = []
    workers = [threading.Thread(target=lambda: results.append(call())) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert results == [36.0] * 4
    assert step.stats.plans == 1 and step.stats.captures == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_kernel_result_of_none_is_assigned_away_in_the_plan(device):
    """A weightless layer norm's backward kernel returns None for the weight's gradient: the
    plan assigns it to ``_`` (it once wrote ``(t28, None, t29) = ...``, which does not compile)
    and replays eager's bits."""
    rng = np.random.default_rng(0)

    def step(h, w):
        loss = (F.linear(F.layer_norm(h, (5,)), w) ** 2).sum()
        loss.backward()
        return loss

    compiled = ta.compile(step)
    for _ in range(3):
        h, w = rng.normal(size=(4, 5)), rng.normal(size=(3, 5))
        got_leaves = [_tensor(a, device, grad=True) for a in (h, w)]
        want_leaves = [_tensor(a, device, grad=True) for a in (h, w)]
        got, want = compiled(*got_leaves), step(*want_leaves)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        _assert_same(_grads(got_leaves), _grads(want_leaves))
    targets = [line.split(" = ")[0] for line in compiled.plans[0].source.splitlines() if " = " in line]
    assert any(", _, " in t for t in targets) and not any("None" in t for t in targets)


def test_a_replaced_layer_or_parameter_captures_again():
    """A plan holds the tensors it captured: a layer replaced (``m.head = nn.Linear(...)``), a
    Parameter replaced, or a ModuleList's entry replaced must not replay the old weights."""

    class Model(ta.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = ta.nn.Linear(3, 2)
            self.blocks = ta.nn.ModuleList([ta.nn.Linear(2, 2)])

        def forward(self, x):
            return self.blocks[0](self.head(x))

    ta.manual_seed(0)
    model = Model()
    compiled = ta.compile(lambda x: model(x))
    x = ta.Tensor(np.ones((1, 3)))

    def check():
        with ta.no_grad():
            np.testing.assert_array_equal(compiled(x).numpy(), model(x).numpy())

    check()
    check()                                                       # a replay
    model.head = ta.nn.Linear(3, 2)
    check()
    model.head.weight = ta.nn.Parameter(np.zeros((2, 3)))
    check()
    setattr(model.blocks, "0", ta.nn.Linear(2, 2))                # a ModuleList entry replaced
    check()
    check()
    assert compiled.stats.captures == 4 and compiled.stats.replays == 2


def test_a_parameter_frozen_or_unfrozen_captures_again():
    """requires_grad_(False) on a parameter the plan reads: no gradient, as eager (the plan
    computed and wrote one); and back."""
    rng = np.random.default_rng(3)
    w, b = (_tensor(rng.normal(size=3), "cpu", grad=True) for _ in range(2))
    w2, b2 = (_tensor(t.numpy(), "cpu", grad=True) for t in (w, b))

    def loss_of(p, q):
        def step(x):
            loss = ((x * p + q) ** 2).sum()
            loss.backward()
            return loss
        return step

    compiled, eager = ta.compile(loss_of(w, b)), loss_of(w2, b2)
    for k in range(6):
        w.grad = b.grad = w2.grad = b2.grad = None
        if k in (2, 4):
            w.requires_grad_(k == 4)
            w2.requires_grad_(k == 4)
        x = _tensor(rng.normal(size=3), "cpu")
        assert compiled(x).numpy() == eager(x).numpy()
        assert (w.grad is None) == (w2.grad is None) == (k in (2, 3))
        for got, want in zip(_grads([w, b]), _grads([w2, b2]), strict=True):
            assert (got is None and want is None) or np.array_equal(got, want)
    assert compiled.stats.captures == 2 and len(compiled.plans) == 2      # frozen, then back to the first


def test_static_values_that_compare_equal_but_differ_in_type_key_apart():
    compiled = ta.compile(lambda x, k: x * k, static=("k",))
    x = ta.Tensor(np.array([1, 2]), dtype="int64")
    with ta.no_grad():
        np.testing.assert_array_equal(compiled(x, 2).numpy(), [2, 4])
        with pytest.raises(ta.DTypeError):             # int64 * 2.0, as eager refuses it
            compiled(x, 2.0)
        np.testing.assert_array_equal(compiled(x, True).numpy(), (x * True).numpy())
    assert len(compiled.plans) == 2                       # 2 and True; 2.0 failed in its capture


@pytest.mark.parametrize("name", ["t3", "f6", "c0", "e2", "mul", "rebuild_view"])
def test_an_argument_named_as_the_plans_own_values_or_kernels_is_renamed(name):
    """A plan names its buffers t3, constants c0, bound arrays e2, folded constants f6, and
    calls its kernels by name: an argument so named would hide them (a replay multiplied by
    itself where it meant the folded seed, or called an array)."""
    namespace: dict = {}
    exec(f"def step(a, {name}):\n    loss = (a * {name}).sum()\n    loss.backward()\n    return loss",
         namespace)
    compiled = ta.compile(namespace["step"])
    for k in range(3):
        got, want = (_tensor(np.arange(3.0) + k, "cpu", grad=True) for _ in range(2))
        b = _tensor(np.full(3, 5.0 + k), "cpu")
        assert compiled(got, b).numpy() == namespace["step"](want, b).numpy()
        np.testing.assert_array_equal(got.grad.numpy(), want.grad.numpy())
    assert f"{name}_arg" in compiled.plans[0].source.splitlines()[3 + len(compiled.plans[0].constants)]


def test_an_argument_named_underscore_keeps_its_own_name_in_the_plan():
    """``_`` is the plan's target for results it never reads (a weightless layer norm's weight
    gradient): an argument of that name is bound under another, and every replay reads it."""
    rng = np.random.default_rng(1)

    def step(_, w):
        loss = (F.linear(F.layer_norm(F.layer_norm(_, (5,)), (5,)), w) ** 2).sum()
        loss.backward()
        return loss

    compiled = ta.compile(step)
    for _k in range(3):
        x, w = rng.normal(size=(4, 5)), rng.normal(size=(3, 5))
        got_leaves = [_tensor(a, "numpy", grad=True) for a in (x, w)]
        want_leaves = [_tensor(a, "numpy", grad=True) for a in (x, w)]
        np.testing.assert_array_equal(compiled(*got_leaves).numpy(), step(*want_leaves).numpy())
        _assert_same(_grads(got_leaves), _grads(want_leaves))
    assert "def step_plan_1(_, " not in compiled.plans[0].source
