"""Optimizers (SGD, Adam) and nn.utils.clip_grad_norm_: against torch.optim and
torch.nn.utils on the same parameters and gradients, against the formulas written out in
numpy, on a loss built with the engine, and their checkpoints and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tinygrad_attn as ta
from tests.optional import needs_torch, torch
from tinygrad_attn import Tensor, nn, optim
from tinygrad_attn.compiler import available_devices

needs_cuda = pytest.mark.skipif(
    "cuda" not in available_devices(),
    reason="no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not set")

SHAPES = [(6, 4), (4,), (3, 2, 5)]
STEPS = 6
# float32: torch fuses some multiply-adds, so each step may round differently by an ulp.
TOLERANCE = {np.float32: 1e-6, np.float64: 1e-12}


def make_params(dtype=np.float32, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [nn.Parameter(rng.standard_normal(shape), dtype=dtype) for shape in shapes]


def gradients(dtype, seed=1, shapes=SHAPES, steps=STEPS):
    """One list of gradient arrays per step; gradients vary in scale so eps matters."""
    rng = np.random.default_rng(seed)
    return [[(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 2)).astype(dtype)
             for shape in shapes] for _ in range(steps)]


def set_grads(params, grads):
    for p, g in zip(params, grads, strict=True):
        p.grad = None if g is None else Tensor(g, dtype=p.dtype)


def values(params):
    return [p.numpy().copy() for p in params]


# ---------------------------------------------------------------- against torch.optim

SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.05, weight_decay=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=0.05, momentum=0.5, nesterov=True, weight_decay=0.2),
]
ADAM_CONFIGS = [
    dict(),
    dict(lr=0.01, weight_decay=0.1),
    dict(lr=0.02, betas=(0.5, 0.9), eps=1e-6),
    dict(lr=0.02, betas=(0.3, 0.99)),      # beta1 < 0.5: torch's other lerp branch
]


def run_both(ours_cls, torch_cls, config, dtype):
    """Step our optimizer and torch's with the same gradients; the second parameter has
    no gradient at step 2 (skipped by both), and lr changes before the last step."""
    params = make_params(dtype)
    torch_params = [torch.tensor(p.numpy().copy(), requires_grad=True) for p in params]
    ours = ours_cls(params, **config)
    theirs = torch_cls(torch_params, **config)
    for step, grads in enumerate(gradients(dtype)):
        if step == 2:
            grads = [grads[0], None, grads[2]]
        if step == STEPS - 1:
            ours.lr = ours.lr * 0.5
            theirs.param_groups[0]["lr"] *= 0.5
        set_grads(params, grads)
        for tp, g in zip(torch_params, grads, strict=True):
            tp.grad = None if g is None else torch.tensor(g)
        ours.step()
        theirs.step()
        for p, tp in zip(params, torch_params, strict=True):
            tol = TOLERANCE[dtype]
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=tol, atol=tol,
                                       err_msg=f"step {step}")
    return params


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name, config",
                         [("SGD", c) for c in SGD_CONFIGS] + [("Adam", c) for c in ADAM_CONFIGS], ids=str)
def test_optimizer_matches_torch(name, config, dtype):
    params = run_both(getattr(optim, name), getattr(torch.optim, name), config, dtype)
    assert all(p.dtype == dtype for p in params)


@needs_torch
def test_adam_defaults_are_torchs():
    ours = optim.Adam(make_params()).hyperparameters()
    theirs = torch.optim.Adam([torch.zeros(1, requires_grad=True)]).defaults
    for key in ("lr", "eps", "weight_decay"):
        assert ours[key] == theirs[key]
    assert ours["betas"] == tuple(theirs["betas"])
    assert theirs["amsgrad"] is False


# ---------------------------------------------------------------- the formulas in numpy


def test_adam_follows_its_formula_in_float64():
    lr, (beta1, beta2), eps, wd = 0.03, (0.8, 0.95), 1e-7, 0.05
    params = make_params(np.float64)
    opt = optim.Adam(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
    expected = values(params)
    m = [np.zeros_like(p) for p in expected]
    v = [np.zeros_like(p) for p in expected]
    for t, grads in enumerate(gradients(np.float64), start=1):
        set_grads(params, grads)
        opt.step()
        for i, g in enumerate(grads):
            g = g + wd * expected[i]
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            m_hat = m[i] / (1 - beta1**t)
            expected[i] = expected[i] - lr * m_hat / (np.sqrt(v[i]) / np.sqrt(1 - beta2**t) + eps)
            np.testing.assert_allclose(params[i].numpy(), expected[i], rtol=1e-12, atol=1e-12)
    assert opt.state[0]["step"] == STEPS


def ufunc_adam(param, grad, m, v, step, lr, beta1, beta2, eps, wd):
    """Adam as the sequence of numpy ufuncs torch's formulas spell (the update the fused
    kernel replaced), each rounding to the arrays' dtype."""
    if wd:
        grad = grad + param * wd
    weight = 1.0 - beta1
    m[...] = m + (grad - m) * weight if abs(weight) < 0.5 else grad - (grad - m) * (1.0 - weight)
    v[...] = v * beta2 + (grad * (1.0 - beta2)) * grad
    denom = np.sqrt(v) / ((1.0 - beta2**step) ** 0.5) + eps
    param[...] = param + (m * -(lr / (1.0 - beta1**step))) / denom


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("config", ADAM_CONFIGS, ids=str)
def test_adam_fused_update_is_bit_for_bit_the_ufunc_sequence(config, dtype):
    lr, (beta1, beta2) = config.get("lr", 1e-3), config.get("betas", (0.9, 0.999))
    eps, wd = config.get("eps", 1e-8), config.get("weight_decay", 0.0)
    # A Fortran-ordered parameter and a transposed gradient: the update goes through copies.
    params = make_params(dtype) + [nn.Parameter(np.asfortranarray(np.ones((3, 4))), dtype=dtype)]
    shapes = [p.shape for p in params]
    opt = optim.Adam(params, **config)
    expected = values(params)
    m = [np.zeros_like(p) for p in expected]
    v = [np.zeros_like(p) for p in expected]
    for step, grads in enumerate(gradients(dtype, shapes=shapes), start=1):
        grads[-1] = np.ascontiguousarray(grads[-1].T).T
        set_grads(params, grads)
        opt.step()
        for i, g in enumerate(grads):
            ufunc_adam(expected[i], g, m[i], v[i], step, lr, beta1, beta2, eps, wd)
            np.testing.assert_array_equal(params[i].numpy(), expected[i])


def test_adam_first_step_moves_each_weight_by_about_lr():
    # Bias correction makes the first step -lr * sign(g) (up to eps), whatever the scale of g.
    params = make_params(np.float64)
    before = values(params)
    grads = gradients(np.float64)[0]
    set_grads(params, grads)
    optim.Adam(params, lr=0.01, eps=0.0).step()
    for p, b, g in zip(params, before, grads, strict=True):
        np.testing.assert_allclose(p.numpy() - b, -0.01 * np.sign(g), rtol=1e-12)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_follows_its_formula(nesterov):
    lr, mu, wd = 0.1, 0.9, 0.01
    params = make_params(np.float64)
    opt = optim.SGD(params, lr=lr, momentum=mu, weight_decay=wd, nesterov=nesterov)
    expected = values(params)
    buffers = [None] * len(params)
    for grads in gradients(np.float64):
        set_grads(params, grads)
        opt.step()
        for i, g in enumerate(grads):
            g = g + wd * expected[i]
            buffers[i] = g.copy() if buffers[i] is None else mu * buffers[i] + g
            direction = g + mu * buffers[i] if nesterov else buffers[i]
            expected[i] = expected[i] - lr * direction
            np.testing.assert_allclose(params[i].numpy(), expected[i], rtol=1e-12, atol=1e-12)


def test_plain_sgd_step_is_minus_lr_times_grad_and_lr_can_change():
    (p,) = make_params(np.float64, shapes=[(3,)])
    opt = optim.SGD([p], lr=0.5)
    start = p.numpy().copy()
    p.grad = Tensor([1.0, -2.0, 4.0], dtype=np.float64)
    opt.step()
    np.testing.assert_allclose(p.numpy(), start - 0.5 * np.array([1.0, -2.0, 4.0]))
    opt.lr = 0.25
    opt.step()
    np.testing.assert_allclose(p.numpy(), start - 0.75 * np.array([1.0, -2.0, 4.0]))


def test_adam_drives_a_quadratic_loss_down():
    ta.manual_seed(0)
    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((32, 5)))
    true_weight = rng.standard_normal((3, 5))
    y = Tensor(x.numpy() @ true_weight.T + 0.5 + 0.1 * rng.standard_normal((32, 3)))
    layer = nn.Linear(5, 3)
    opt = optim.Adam(layer.parameters(), lr=0.05)

    def loss_value():
        return ((layer(x) - y) ** 2).mean()

    first = loss_value().item()
    for _ in range(150):
        opt.zero_grad()
        loss = loss_value()
        loss.backward()
        opt.step()
    final = loss_value().item()
    # Least squares optimum, for the floor the loss should approach.
    design = np.hstack([x.numpy(), np.ones((32, 1), np.float32)])
    solution, *_ = np.linalg.lstsq(design, y.numpy(), rcond=None)
    best = np.mean((design @ solution - y.numpy()) ** 2)
    assert final < 0.05 * first
    assert final < best + 0.01


def test_step_with_closure_returns_its_loss():
    (p,) = make_params(np.float64, shapes=[(2,)])
    opt = optim.SGD([p], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    start = p.numpy().copy()
    loss = opt.step(closure)
    assert loss.item() == pytest.approx(float(np.sum(start**2)))
    np.testing.assert_allclose(p.numpy(), start * 0.8)


# ---------------------------------------------------------------- in place, dtypes, skipping


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1),
    lambda ps: optim.Adam(ps, weight_decay=0.1),
], ids=["sgd", "adam"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_step_updates_in_place_keeping_dtype_and_building_no_graph(make, dtype):
    params = make_params(dtype)
    arrays = [p.data for p in params]
    before = values(params)
    opt = make(params)
    for grads in gradients(dtype, steps=2):
        set_grads(params, grads)
        opt.step()
    for p, array, b in zip(params, arrays, before, strict=True):
        assert p.data is array                       # the same buffer, updated in place
        assert p.dtype == dtype and p.is_leaf and p.requires_grad
        assert not np.allclose(p.numpy(), b)
    for entry in opt.state:
        for name in opt.state_arrays:
            assert entry[name].dtype == dtype


def test_parameters_without_grad_are_skipped_and_their_state_waits():
    params = make_params()
    before = values(params)
    opt = optim.Adam(params, lr=0.1)
    grads = gradients(np.float32)[0]
    set_grads(params, [grads[0], None, grads[2]])
    opt.step()
    opt.step()
    np.testing.assert_array_equal(params[1].numpy(), before[1])
    assert opt.state[1] is None
    assert opt.state[0]["step"] == 2


def test_state_follows_a_change_of_parameter_dtype():
    layer = nn.Linear(3, 2)
    opt = optim.Adam(layer.parameters())
    x = Tensor(np.ones((4, 3)))
    layer(x).sum().backward()
    opt.step()
    layer.double()
    layer(x.double()).sum().backward()
    opt.step()
    assert layer.weight.dtype == np.float64
    assert opt.state[0]["exp_avg"].dtype == np.float64
    assert opt.state[0]["step"] == 2


def test_zero_grad_drops_or_zeroes_gradients():
    params = make_params()
    opt = optim.SGD(params, lr=0.1)
    set_grads(params, gradients(np.float32)[0])
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in params)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_gradient_of_another_shape_is_reported():
    (p,) = make_params(shapes=[(3, 2)])
    p.grad = Tensor(np.ones(2))
    with pytest.raises(ta.ShapeError, match=r"params\[0\] has shape \(3, 2\).*\(2,\)"):
        optim.SGD([p], lr=0.1).step()


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    lambda ps: optim.SGD(ps, lr=0.1),
    lambda ps: optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), weight_decay=0.01),
], ids=["sgd-nesterov", "sgd", "adam"])
def test_state_dict_round_trip_gives_identical_next_steps(make, tmp_path):
    all_grads = gradients(np.float32)
    params = make_params()
    opt = make(params)
    for grads in all_grads[:3]:
        set_grads(params, grads)
        opt.step()
    ta.save({"params": [p.numpy() for p in params], "optimizer": opt.state_dict()},
            tmp_path / "ckpt")
    checkpoint = ta.load(tmp_path / "ckpt")

    resumed = [nn.Parameter(array) for array in checkpoint["params"]]
    fresh = make(resumed)
    fresh.lr = 123.0                    # restored from the checkpoint
    fresh.load_state_dict(checkpoint["optimizer"])
    assert fresh.hyperparameters() == opt.hyperparameters()
    for grads in all_grads[3:]:
        set_grads(params, grads)
        set_grads(resumed, grads)
        opt.step()
        fresh.step()
        for p, q in zip(params, resumed, strict=True):
            np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_state_dict_is_a_copy():
    params = make_params()
    opt = optim.Adam(params)
    set_grads(params, gradients(np.float32)[0])
    opt.step()
    saved = opt.state_dict()
    snapshot = saved["state"][0]["exp_avg"].copy()
    opt.step()
    np.testing.assert_array_equal(saved["state"][0]["exp_avg"], snapshot)
    assert saved["state"][0]["step"] == 1


def test_load_state_dict_checks_everything_before_changing_anything():
    params = make_params()
    opt = optim.Adam(params, lr=0.01)
    set_grads(params, gradients(np.float32)[0])
    opt.step()
    good = opt.state_dict()

    other = optim.Adam(make_params(shapes=[(6, 4), (5,), (3, 2, 5)]), lr=0.5)
    with pytest.raises(ta.ShapeError, match=r"state\[1\]\['exp_avg'\] has shape \(4,\)"):
        other.load_state_dict(good)
    assert other.lr == 0.5 and other.state == [None, None, None]

    with pytest.raises(ValueError, match="from 'Adam', this optimizer is 'SGD'"):
        optim.SGD(params, lr=0.1).load_state_dict(good)
    with pytest.raises(ValueError, match="has 3 parameters, this optimizer holds 2"):
        optim.Adam(params[:2]).load_state_dict(good)
    bad = dict(good, hyperparameters=dict(good["hyperparameters"], betas=(0.9, 1.5)))
    with pytest.raises(ValueError, match=r"betas\[1\] must be a finite number in \[0.0, 1.0\)"):
        opt.load_state_dict(bad)
    assert opt.betas == (0.9, 0.999) and opt.state[0]["step"] == 1
    with pytest.raises(ValueError, match="expected a dict with keys"):
        opt.load_state_dict({"state": []})


# ---------------------------------------------------------------- errors

ERRORS = [
    (lambda: optim.SGD([], lr=0.1), ValueError, "SGD: got an empty parameter list"),
    (lambda: optim.Adam(iter([])), ValueError, "Adam: got an empty parameter list"),
    (lambda: optim.SGD(make_params(), lr=-0.1), ValueError,
     r"SGD: lr must be a finite number >= 0.0, got -0.1"),
    (lambda: optim.Adam(make_params(), lr=float("nan")), ValueError, "Adam: lr must be a finite number"),
    (lambda: optim.Adam(make_params(), betas=(1.0, 0.999)), ValueError,
     r"Adam: betas\[0\] must be a finite number in \[0.0, 1.0\), got 1.0"),
    (lambda: optim.Adam(make_params(), betas=(0.9, -0.1)), ValueError, r"Adam: betas\[1\] must be"),
    (lambda: optim.Adam(make_params(), betas=0.9), TypeError, "Adam: betas must be a pair"),
    (lambda: optim.Adam(make_params(), eps=-1e-8), ValueError, "Adam: eps must be"),
    (lambda: optim.Adam(make_params(), weight_decay=-1), ValueError, "Adam: weight_decay must be"),
    (lambda: optim.SGD(make_params(), lr=0.1, momentum=-0.5), ValueError, "SGD: momentum must be"),
    (lambda: optim.SGD(make_params(), lr=0.1, nesterov=True), ValueError,
     "SGD: Nesterov momentum needs momentum > 0"),
    (lambda: optim.SGD(make_params(), lr="0.1"), TypeError, "SGD: lr must be a number, got str"),
    (lambda: optim.SGD([np.zeros(3)], lr=0.1), TypeError,
     r"SGD: params\[0\] is a ndarray, not a Parameter or Tensor"),
    (lambda: optim.Adam([*make_params(), "weight"]), TypeError, r"Adam: params\[3\] is a str"),
    (lambda: optim.Adam(make_params()[0]), TypeError, "got a single Tensor of shape"),
    (lambda: optim.Adam(nn.Linear(2, 2)), TypeError, "got the module Linear itself; pass model.parameters()"),
    (lambda: optim.Adam(3), TypeError, "params must be an iterable of Parameters"),
    (lambda: optim.Adam([Tensor([1, 2])]), ta.DTypeError, r"params\[0\] has dtype int64"),
    (lambda: optim.Adam([make_params()[0] * 2]), ValueError, "was made by Mul; only leaf tensors"),
    (lambda: optim.Adam(make_params() * 2), ValueError, r"params\[3\].*appears more than once"),
]


@pytest.mark.parametrize("call, error, message", ERRORS, ids=[row[2][:40] for row in ERRORS])
def test_bad_arguments_give_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_setting_a_negative_lr_between_steps_is_refused():
    opt = optim.Adam(make_params(), lr=0.01)
    with pytest.raises(ValueError, match="Adam: lr must be a finite number >= 0.0, got -1"):
        opt.lr = -1
    assert opt.lr == 0.01


# ---------------------------------------------------------------- the "cuda" device


@needs_cuda
@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: optim.Adam(ps, lr=0.05, weight_decay=0.1),
], ids=["sgd", "adam"])
def test_cuda_parameters_update_in_place_like_cpu(make):
    shapes = [(3, 2), (4,)]
    on_cpu = make_params(shapes=shapes)
    on_gpu = [p.to("cuda") for p in make_params(shapes=shapes)]
    arrays = [p.data for p in on_gpu]
    cpu_opt, gpu_opt = make(on_cpu), make(on_gpu)
    for grads in gradients(np.float32, shapes=shapes, steps=3):
        set_grads(on_cpu, grads)
        for p, g in zip(on_gpu, grads, strict=True):
            p.grad = Tensor(g, device="cuda")
        cpu_opt.step()
        gpu_opt.step()
    for p, q, array in zip(on_cpu, on_gpu, arrays, strict=True):
        assert q.device == "cuda" and q.data is array
        np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=1e-6, atol=1e-6)


@needs_cuda
def test_clip_grad_norm_scales_cuda_gradients():
    p = nn.Parameter(np.zeros(2)).to("cuda")
    p.grad = Tensor([3.0, 4.0], device="cuda")
    assert float(nn.utils.clip_grad_norm_([p], 1.0)) == pytest.approx(5.0)
    assert p.grad.device == "cuda"
    np.testing.assert_allclose(p.grad.numpy(), [0.6, 0.8], rtol=1e-5)


# ---------------------------------------------------------------- clip_grad_norm_


def grads_of(params):
    return [None if p.grad is None else p.grad.numpy().copy() for p in params]


def test_clip_grad_norm_by_hand():
    a, b, c = (nn.Parameter(np.zeros(n), dtype=np.float64) for n in (2, 1, 3))
    a.grad = Tensor([3.0, 4.0], dtype=np.float64)
    b.grad = Tensor([12.0], dtype=np.float64)          # total 2-norm sqrt(9 + 16 + 144) = 13
    total = nn.utils.clip_grad_norm_([a, b, c], max_norm=6.5)
    # A 0-d Tensor, as torch's.
    assert isinstance(total, Tensor) and total.shape == () and total.dtype == np.float64
    assert float(total) == 13.0
    scale = 6.5 / (13.0 + 1e-6)
    np.testing.assert_allclose(a.grad.numpy(), [3.0 * scale, 4.0 * scale], rtol=1e-15)
    np.testing.assert_allclose(b.grad.numpy(), [12.0 * scale], rtol=1e-15)
    assert c.grad is None


def test_clip_grad_norm_leaves_small_gradients_alone():
    a = nn.Parameter(np.zeros(2))
    a.grad = Tensor([0.3, -0.4])
    grad_array = a.grad.data
    assert float(nn.utils.clip_grad_norm_([a], 1.0)) == pytest.approx(0.5)
    np.testing.assert_array_equal(a.grad.numpy(), np.array([0.3, -0.4], np.float32))
    assert a.grad.data is grad_array


def test_clip_grad_norm_inf_norm_and_single_tensor():
    a = nn.Parameter(np.zeros(3), dtype=np.float64)
    a.grad = Tensor([1.0, -8.0, 2.0], dtype=np.float64)
    assert float(nn.utils.clip_grad_norm_(a, 2.0, norm_type="inf")) == 8.0
    np.testing.assert_allclose(a.grad.numpy(), np.array([1.0, -8.0, 2.0]) * 2.0 / (8.0 + 1e-6))


def test_clip_grad_norm_without_gradients_is_zero():
    assert float(nn.utils.clip_grad_norm_(make_params(), 1.0)) == 0.0


def test_clip_grad_norm_nonfinite():
    a, b = make_params(shapes=[(2,), (2,)])
    a.grad = Tensor([np.nan, 1.0])
    b.grad = Tensor([1.0, 1.0])
    with pytest.raises(RuntimeError, match="total norm of order 2.0 of the gradients is nan"):
        nn.utils.clip_grad_norm_([a, b], 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 1.0])
    # As torch: without the check, the NaN total scales every gradient to NaN.
    assert math.isnan(float(nn.utils.clip_grad_norm_([b, a], 1.0, norm_type=math.inf)))
    assert np.isnan(b.grad.numpy()).all()


@pytest.mark.parametrize("call, error, message", [
    (lambda: nn.utils.clip_grad_norm_(make_params(), 1.0, norm_type=0), ValueError, "norm_type must be > 0"),
    (lambda: nn.utils.clip_grad_norm_(make_params(), -1.0), ValueError, "max_norm must be >= 0"),
    (lambda: nn.utils.clip_grad_norm_([np.ones(2)], 1.0), TypeError, r"parameters\[0\] is a ndarray"),
])
def test_clip_grad_norm_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_torch(norm_type, max_norm, dtype):
    params = make_params(dtype)
    grads = gradients(dtype)[0]
    set_grads(params, [grads[0], None, grads[2]])
    torch_params = [torch.tensor(p.numpy().copy(), requires_grad=True) for p in params]
    for tp, p in zip(torch_params, params, strict=True):
        tp.grad = None if p.grad is None else torch.tensor(p.grad.numpy().copy())
    total = nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    torch_total = torch.nn.utils.clip_grad_norm_(torch_params, max_norm, norm_type=norm_type)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    assert float(total) == pytest.approx(torch_total.item(), rel=tol)
    for p, tp in zip(params, torch_params, strict=True):
        if tp.grad is None:
            assert p.grad is None
        else:
            assert p.grad.dtype == dtype
            np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=tol, atol=tol * 1e-3)


def test_an_optimizer_without_an_update_rule_cannot_be_built():
    class NoRule(optim.Optimizer):
        pass

    with pytest.raises(TypeError, match="abstract method"):
        NoRule([nn.Parameter(np.zeros(2))], lr=0.1)
