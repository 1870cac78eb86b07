"""The optimizers' and clipping's kernels (compiler/*/optim.py): every device against the
numpy reference, and the optimizers against the code path they replaced (Python-float bias
corrections and lr, the ufunc sequence, host-side clipping), kept here as the oracle.

The update reads its step count and hyperparameters from arrays, so a kernel call recorded
once and replayed with the same arrays follows a changing learning rate: tested directly.
CUDA cases run on a GPU or under NUMBA_ENABLE_CUDASIM=1 (``-k cuda``).
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tinygrad_attn import Tensor, nn, optim
from tinygrad_attn.compiler import available_devices, get_backend

needs_cuda = pytest.mark.skipif("cuda" not in available_devices(),
                                reason="no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not set")
REFERENCE = get_backend("numpy")
HOST_DEVICES = ["numpy", "cpu"]
DTYPES = [np.float32, np.float64]
ADAM_CONFIGS = [dict(), dict(weight_decay=0.1), dict(betas=(0.5, 0.9), eps=1e-6), dict(betas=(0.3, 0.99))]
SGD_CONFIGS = [dict(), dict(weight_decay=0.1), dict(momentum=0.9),
               dict(momentum=0.9, dampening=0.3, weight_decay=0.01),
               dict(momentum=0.5, nesterov=True, weight_decay=0.2)]
SHAPES = [(6, 4), (4,), (3, 2, 5), (0, 3)]


# ---------------------------------------------------------------- the replaced code path (the oracle)


def old_adam(param, grad, m, v, step, lr, betas, eps, wd):
    """The update before the kernels: bias corrections in Python floats from a Python int
    step, then the ufunc sequence torch's formulas spell (which the fused Numba pass matched
    bit for bit), every scalar rounded to the arrays' dtype."""
    beta1, beta2 = betas
    t = param.dtype.type
    step_size, bc2 = lr / (1.0 - beta1**step), (1.0 - beta2**step) ** 0.5
    if t(wd) != 0:
        grad = grad + param * t(wd)
    weight = 1.0 - beta1
    m[...] = m + (grad - m) * t(weight) if abs(weight) < 0.5 else grad - (grad - m) * t(1.0 - weight)
    v[...] = v * t(beta2) + (grad * t(1.0 - beta2)) * grad
    param[...] = param + (m * t(-step_size)) / (np.sqrt(v) / t(bc2) + t(eps))


def old_sgd(param, grad, state, lr, momentum, dampening, wd, nesterov):
    """SGD before the kernels: numpy ufuncs with Python-float scalars into work buffers."""
    work, extra = np.empty_like(param), np.empty_like(param)
    d_p = grad
    if wd != 0.0:
        np.multiply(param, wd, out=work)
        np.add(grad, work, out=work)
        d_p = work
    if momentum != 0.0:
        buf = state.get("buf")
        if buf is None:
            buf = state["buf"] = d_p.copy()
        else:
            np.multiply(buf, momentum, out=buf)
            if dampening != 0.0:
                np.multiply(d_p, 1.0 - dampening, out=extra)
                np.add(buf, extra, out=buf)
            else:
                np.add(buf, d_p, out=buf)
        if nesterov:
            np.multiply(buf, momentum, out=extra)
            np.add(d_p, extra, out=extra)
            d_p = extra
        else:
            d_p = buf
    np.multiply(d_p, -lr, out=work)
    np.add(param, work, out=param)


def old_norm(g, norm_type):
    if norm_type == 2.0:
        flat = g.reshape(-1)
        return math.sqrt(float(np.dot(flat, flat)))
    if g.size == 0:
        return 0.0
    if norm_type == math.inf:
        return float(np.max(np.abs(g)))
    if norm_type == 1.0:
        return float(np.sum(np.abs(g), dtype=np.float64))
    return float(np.sum(np.abs(g, dtype=np.float64) ** norm_type)) ** (1.0 / norm_type)


def old_clip(hosts, max_norm, norm_type):
    """clip_grad_norm_ before the kernels, on host arrays in place; returns the float total."""
    norms = [old_norm(h, norm_type) for h in hosts]
    if norm_type == math.inf:
        total = math.nan if any(n != n for n in norms) else max(norms)
    elif norm_type == 2.0:
        total = math.sqrt(math.fsum(n * n for n in norms))
    else:
        total = math.fsum(n**norm_type for n in norms) ** (1.0 / norm_type)
    coef = max_norm / (total + 1e-6)
    if not coef >= 1.0:
        for h in hosts:
            np.multiply(h, coef, out=h)
    return total


def make(dtype, device, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [nn.Parameter(rng.standard_normal(s), dtype=dtype).to(device) if device != "cpu" else
            nn.Parameter(rng.standard_normal(s), dtype=dtype) for s in shapes]


def grads_for(rng, dtype, shapes=SHAPES):
    return [(rng.standard_normal(s) * 10.0 ** rng.integers(-3, 2)).astype(dtype) for s in shapes]


# ---------------------------------------------------------------- optimizers against the old path


@pytest.mark.parametrize("device", HOST_DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("config", ADAM_CONFIGS, ids=str)
def test_adam_with_a_schedule_is_bit_for_bit_the_old_path(config, dtype, device):
    params = make(dtype, device)
    opt = optim.Adam(params, lr=0.02, **config)
    schedule = optim.WarmupCosine(opt, warmup=5, total=25, final_ratio=0.1)
    betas, eps, wd = opt.betas, opt.eps, opt.weight_decay
    expected = [p.numpy().copy() for p in params]
    m = [np.zeros_like(e) for e in expected]
    v = [np.zeros_like(e) for e in expected]
    steps = [0] * len(params)
    rng = np.random.default_rng(1)
    for step in range(30):                            # past total: the final rate too
        grads = grads_for(rng, dtype)
        skipped = step % 7 == 3                       # a parameter without a gradient waits
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            p.grad = None if skipped and i == 1 else Tensor(g, dtype=dtype, device=device)
        lr = opt.lr
        opt.step()
        schedule.step()
        for i, g in enumerate(grads):
            if skipped and i == 1:
                continue
            steps[i] += 1
            old_adam(expected[i], g, m[i], v[i], steps[i], lr, betas, eps, wd)
            np.testing.assert_array_equal(params[i].numpy(), expected[i], err_msg=f"step {step}")
    assert [int(s["step"]) for s in opt.state] == steps


@pytest.mark.parametrize("device", HOST_DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("config", SGD_CONFIGS, ids=str)
def test_sgd_with_a_changing_lr_is_bit_for_bit_the_old_path(config, dtype, device):
    params = make(dtype, device)
    opt = optim.SGD(params, lr=0.1, **config)
    expected = [p.numpy().copy() for p in params]
    states = [{} for _ in params]
    rng = np.random.default_rng(2)
    for step in range(12):
        opt.lr = 0.1 / (1 + step)
        grads = grads_for(rng, dtype)
        for p, g in zip(params, grads, strict=True):
            p.grad = Tensor(g, dtype=dtype, device=device)
        opt.step()
        for i, g in enumerate(grads):
            old_sgd(expected[i], g, states[i], opt.lr, opt.momentum, opt.dampening, opt.weight_decay,
                    opt.nesterov)
            np.testing.assert_array_equal(params[i].numpy(), expected[i], err_msg=f"step {step}")


def test_sgd_momentum_switched_on_later_starts_a_fresh_buffer_as_torch():
    (p,) = make(np.float64, "cpu", shapes=[(5,)])
    opt = optim.SGD([p], lr=0.1)
    expected, state = p.numpy().copy(), {}
    rng = np.random.default_rng(3)
    for step in range(6):
        if step == 3:
            opt.momentum = 0.9
        g = rng.standard_normal(5)
        p.grad = Tensor(g, dtype=np.float64)
        opt.step()
        old_sgd(expected, g, state, 0.1, opt.momentum, 0.0, 0.0, False)
        np.testing.assert_array_equal(p.numpy(), expected)


# ---------------------------------------------------------------- a recorded call replayed


@pytest.mark.parametrize("device", HOST_DEVICES)
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_a_recorded_update_replayed_follows_lr_and_step(kind, device, monkeypatch):
    """Record each kernel call of one step, then replay the calls with the same array
    objects while a schedule changes lr: the result equals an optimizer stepping eagerly,
    so no step count or rate was frozen into the call."""
    dtype = np.float32
    build = ((lambda ps: optim.Adam(ps, lr=0.05, weight_decay=0.01)) if kind == "adam" else
             (lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01)))
    replayed, eager = make(dtype, device), make(dtype, device)
    for a, b in zip(replayed, eager, strict=True):
        a.grad, b.grad = Tensor(np.zeros(a.shape, dtype), device=device), Tensor(np.zeros(a.shape, dtype),
                                                                                 device=device)
    opt_r, opt_e = build(replayed), build(eager)
    sched_r = optim.WarmupCosine(opt_r, warmup=3, total=10)
    sched_e = optim.WarmupCosine(opt_e, warmup=3, total=10)
    backend = get_backend(device)
    name = f"{kind}_"
    kernel, calls = getattr(backend, name), []
    rng = np.random.default_rng(4)
    for step in range(12):
        grads = grads_for(rng, dtype)
        for a, b, g in zip(replayed, eager, grads, strict=True):
            a.grad._data[...] = g                     # the recorded calls hold these arrays
            b.grad._data[...] = g
        if step == 0:
            monkeypatch.setattr(backend, name, lambda *args: (calls.append(args), kernel(*args))[1])
            opt_r.step()
            monkeypatch.setattr(backend, name, kernel)
            assert len(calls) == len(replayed)
        else:
            for args in calls:
                kernel(*args)
        opt_e.step()
        sched_r.step()
        sched_e.step()
        for a, b in zip(replayed, eager, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"step {step}")
    assert opt_r.lr == opt_e.lr
    assert [int(s["step"]) for s in opt_r.state] == [12] * len(replayed)


def test_lr_and_settings_are_written_in_place_in_the_array_the_kernel_reads():
    opt = optim.Adam(make(np.float32, "cpu"), lr=0.01)
    hyper = opt._hyper_on(get_backend("cpu"))
    opt.lr = 0.5
    opt.betas = (0.8, 0.95)
    opt.eps = 1e-5
    assert opt._hyper_on(get_backend("cpu")) is hyper
    np.testing.assert_array_equal(hyper, [0.5, 0.8, 0.95, 1e-5, 0.0])
    assert isinstance(opt.lr, float) and opt.lr == 0.5 and opt.betas == (0.8, 0.95)
    sgd = optim.SGD(make(np.float32, "cpu"), lr=0.1, momentum=0.9, nesterov=True)
    assert sgd.nesterov is True and sgd.hyperparameters()["momentum"] == 0.9


# ---------------------------------------------------------------- kernels: every host device, any layout


@pytest.mark.parametrize("device", ["cpu"])
@settings(max_examples=60, deadline=None)
# Steps where sqrt and libm's pow of 1 - beta2**t differ in the last bit: the kernel must take pow.
@example(shape=(1000,), dtype=np.float64, fortran=False, beta1=0.9, wd=0.0, step=1269, beta2=0.999, lr=0.01,
         seed=0)
@example(shape=(1000,), dtype=np.float64, fortran=False, beta1=0.9, wd=0.0, step=3614, beta2=0.99, lr=0.01,
         seed=1)
@example(shape=(1000,), dtype=np.float64, fortran=False, beta1=0.9, wd=0.0, step=1063, beta2=0.9999, lr=0.01,
         seed=2)
@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=3).map(tuple), dtype=st.sampled_from(DTYPES),
       fortran=st.booleans(), beta1=st.sampled_from([0.0, 0.3, 0.9]), wd=st.sampled_from([0.0, 0.05]),
       step=st.integers(0, 50) | st.integers(50, 10**7), beta2=st.sampled_from([0.99, 0.999, 0.9999]),
       lr=st.floats(1e-6, 1.0), seed=st.integers(0, 2**32 - 1))
def test_adam_kernel_matches_the_reference_bit_for_bit(device, shape, dtype, fortran, beta1, wd, step, beta2,
                                                       lr, seed):
    """Bias corrections from steps far apart and odd learning rates included: the cpu kernel
    derives its scalars inside Numba, the reference in Python."""
    rng = np.random.default_rng(seed)
    param = rng.standard_normal(shape).astype(dtype)
    param = np.asfortranarray(param) if fortran else param
    grad = rng.standard_normal(shape).astype(dtype).T.copy().T           # another layout
    m, v = rng.standard_normal(shape).astype(dtype), rng.random(shape).astype(dtype)
    hyper = np.array([lr, beta1, beta2, 1e-8, wd])
    args = [param, grad, m, v, np.array(step, np.int64), hyper]
    want = [a.copy() for a in args]
    REFERENCE.adam_(*want)
    get_backend(device).adam_(*args)
    for got, expected in zip(args, want, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert int(args[4]) == step + 1


def test_adam_on_the_numpy_device_loads_no_numba():
    script = ("import numpy as np, sys, tinygrad_attn as ta\n"
              "p = ta.nn.Parameter(np.ones(3)).to('numpy'); p.grad = ta.Tensor(np.ones(3), device='numpy')\n"
              "ta.optim.Adam([p]).step(); ta.nn.utils.clip_grad_norm_([p], 0.1)\n"
              "print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


# ---------------------------------------------------------------- versions, zero_grad


def test_a_step_counts_as_a_change_so_an_old_graph_refuses_backward():
    (p,) = make(np.float64, "cpu", shapes=[(3,)])
    opt = optim.Adam([p])
    p.grad = Tensor(np.ones(3), dtype=np.float64)
    loss = (p * p).sum()
    before = p.version
    opt.step()
    assert p.version == before + 1
    with pytest.raises(RuntimeError, match="changed in place"):
        loss.backward()


def test_zero_grad_without_none_gives_fresh_zeros_and_counts_a_change():
    (p,) = make(np.float32, "cpu", shapes=[(2, 2)])
    p.grad = Tensor(np.ones((2, 2), np.float32))
    old, version = p.grad._data, p.grad.version
    optim.SGD([p], lr=0.1).zero_grad(set_to_none=False)
    assert p.grad._data is not old and old.all() and not p.grad.numpy().any()
    assert p.grad.version == version + 1 and p.grad.dtype == np.float32


# ---------------------------------------------------------------- checkpoints both ways


def test_saved_step_is_an_int_and_old_and_array_steps_load():
    params = make(np.float32, "cpu")
    opt = optim.Adam(params, lr=0.01)
    rng = np.random.default_rng(5)
    for _ in range(3):
        for p, g in zip(params, grads_for(rng, np.float32), strict=True):
            p.grad = Tensor(g)
        opt.step()
    saved = opt.state_dict()
    assert all(type(entry["step"]) is int and entry["step"] == 3 for entry in saved["state"])
    old_style = dict(saved, state=[dict(e, step=np.int64(e["step"])) for e in saved["state"]])
    array_style = dict(saved, state=[dict(e, step=np.array(e["step"])) for e in saved["state"]])
    grads = grads_for(rng, np.float32)
    results = []
    for checkpoint in (saved, old_style, array_style):
        fresh = [nn.Parameter(p.numpy()) for p in params]
        other = optim.Adam(fresh)
        other.load_state_dict(checkpoint)
        for p, g in zip(fresh, grads, strict=True):
            p.grad = Tensor(g)
        other.step()
        assert int(other.state[0]["step"]) == 4
        results.append([p.numpy() for p in fresh])
    for p, g in zip(params, grads, strict=True):
        p.grad = Tensor(g)
    opt.step()
    for result in results:
        for got, p in zip(result, params, strict=True):
            np.testing.assert_array_equal(got, p.numpy())


# ---------------------------------------------------------------- clipping against the old path


@pytest.mark.parametrize("device", HOST_DEVICES)
@settings(max_examples=30, deadline=None)
@given(shapes=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple), min_size=1,
                       max_size=4),
       dtype=st.sampled_from(DTYPES), norm_type=st.sampled_from([2.0, 1.0, 3.0, 0.5, math.inf]),
       max_norm=st.sampled_from([0.0, 0.3, 1e6]), nan=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_clip_grad_norm_is_bit_for_bit_the_old_path(device, shapes, dtype, norm_type, max_norm, nan, seed):
    rng = np.random.default_rng(seed)
    hosts = [(rng.standard_normal(s) * 10.0 ** rng.integers(-2, 2)).astype(dtype) for s in shapes]
    if nan and hosts[-1].size:
        hosts[-1].flat[0] = np.nan
    params = [nn.Parameter(np.zeros(s), dtype=dtype) for s in shapes]
    params = [p.to(device) if device != "cpu" else p for p in params]
    for p, h in zip(params, hosts, strict=True):
        p.grad = Tensor(h, dtype=dtype, device=device)
    total = nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    want = old_clip(hosts, max_norm, norm_type)
    assert total.device == device and total.dtype == np.float64 and total.shape == ()
    np.testing.assert_array_equal(float(total), want)
    for p, h in zip(params, hosts, strict=True):
        np.testing.assert_array_equal(p.grad.numpy(), h)


def test_clip_grad_norm_refuses_gradients_on_two_devices():
    a, b = nn.Parameter(np.zeros(2)), nn.Parameter(np.zeros(2)).to("numpy")
    a.grad, b.grad = Tensor(np.ones(2)), Tensor(np.ones(2), device="numpy")
    with pytest.raises(ta.DeviceError, match="different devices"):
        nn.utils.clip_grad_norm_([a, b], 1.0)


# ---------------------------------------------------------------- the cuda kernels against the reference


def _cuda_against_reference(name, args, rtol):
    cuda = get_backend("cuda")
    want = [a.copy() if isinstance(a, np.ndarray) else [x.copy() for x in a] if isinstance(a, list) else a
            for a in args]
    want_out = getattr(REFERENCE, name)(*want)
    moved = [cuda.asarray(a, a.dtype) if isinstance(a, np.ndarray) else
             [cuda.asarray(x, x.dtype) for x in a] if isinstance(a, list) else a for a in args]
    got_out = getattr(cuda, name)(*moved)
    for got, expected in zip(moved, want, strict=True):
        if isinstance(expected, np.ndarray):
            np.testing.assert_allclose(cuda.to_numpy(got), expected, rtol=rtol, atol=rtol)
        elif isinstance(expected, list):
            for g, e in zip(got, expected, strict=True):
                np.testing.assert_allclose(cuda.to_numpy(g), e, rtol=rtol, atol=rtol)
    if want_out is not None:
        np.testing.assert_allclose(cuda.to_numpy(got_out), want_out, rtol=rtol)


TOL = {np.float32: 2e-6, np.float64: 1e-13}


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("beta1, wd", [(0.9, 0.0), (0.3, 0.1)])
def test_cuda_adam_kernel_matches_the_reference(dtype, beta1, wd):
    rng = np.random.default_rng(6)
    shape = (3, 7)
    args = [rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype),
            rng.standard_normal(shape).astype(dtype), rng.random(shape).astype(dtype), np.array(4, np.int64),
            np.array([0.01, beta1, 0.99, 1e-8, wd])]
    _cuda_against_reference("adam_", args, TOL[dtype])


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("started", [0, 1])
@pytest.mark.parametrize("config", [(0.9, 0.0, 0.1, 0.0), (0.9, 0.3, 0.0, 0.0), (0.5, 0.0, 0.0, 1.0),
                                    (0.0, 0.0, 0.1, 0.0)])
def test_cuda_sgd_kernel_matches_the_reference(dtype, started, config):
    rng = np.random.default_rng(7)
    shape = (11,)
    momentum = config[0]
    buf = rng.standard_normal(shape).astype(dtype) if momentum else None
    args = [rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype), buf,
            np.array(2, np.int64), np.array(started, np.int64), np.array([0.05, *config])]
    _cuda_against_reference("sgd_", args, TOL[dtype])


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_cuda_grad_norm_and_clip_match_the_reference(dtype, norm_type, max_norm):
    rng = np.random.default_rng(8)
    grads = [rng.standard_normal(s).astype(dtype) for s in [(3, 5), (0,), (9,)]]
    _cuda_against_reference("grad_norm", [grads, norm_type], TOL[dtype])
    total = REFERENCE.grad_norm(grads, norm_type)
    _cuda_against_reference("clip_", [grads, total, max_norm], TOL[dtype])


@needs_cuda
def test_cuda_clip_of_a_nan_norm_makes_every_gradient_nan():
    cuda = get_backend("cuda")
    grads = [cuda.asarray(np.array([np.nan, 1.0], np.float32), np.float32),
             cuda.asarray(np.ones(3, np.float32), np.float32)]
    total = cuda.grad_norm(grads, math.inf)
    assert math.isnan(float(cuda.to_numpy(total)))
    cuda.clip_(grads, total, 1.0)
    assert all(np.isnan(cuda.to_numpy(g)).all() for g in grads)


@needs_cuda
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_cuda_optimizer_state_stays_on_the_device_and_checkpoints(kind):
    build = ((lambda ps: optim.Adam(ps, lr=0.05)) if kind == "adam" else
             (lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9)))
    shapes = [(3, 2), (4,)]
    on_cpu, on_gpu = make(np.float32, "cpu", shapes=shapes), make(np.float32, "cuda", shapes=shapes)
    cpu_opt, gpu_opt = build(on_cpu), build(on_gpu)
    rng = np.random.default_rng(9)
    for _ in range(3):
        grads = grads_for(rng, np.float32, shapes)
        for a, b, g in zip(on_cpu, on_gpu, grads, strict=True):
            a.grad, b.grad = Tensor(g), Tensor(g, device="cuda")
        cpu_opt.step()
        gpu_opt.step()
    for a, b in zip(on_cpu, on_gpu, strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-6)
    assert not isinstance(gpu_opt.state[0]["step"], np.ndarray)
    saved, want = gpu_opt.state_dict(), cpu_opt.state_dict()
    for s, w in zip(saved["state"], want["state"], strict=True):
        assert type(s["step"]) is int and s["step"] == w["step"] == 3
        for name in gpu_opt.state_arrays:
            np.testing.assert_allclose(s[name], w[name], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- for tests/test_conformance.py


def optimizer_kernels(rng, dtype, shape):
    """Cases of the optimizer kernels for the conformance table: grad_norm returns its
    result; the in-place ones (adam_, sgd_, clip_) are compared on what they write above."""
    grads = [rng.normal(size=shape).astype(dtype), rng.normal(size=shape[-1:]).astype(dtype)]
    hyper = np.array([0.01, 0.9, 0.999, 1e-8, 0.0])
    return [("grad_norm", (grads, 2.0)), ("grad_norm", (grads, math.inf)),
            ("adam_", (grads[0].copy(), grads[0], np.zeros(shape, dtype), np.zeros(shape, dtype),
                       np.array(0, np.int64), hyper)),
            ("sgd_", (grads[0].copy(), grads[0], None, np.array(0, np.int64), np.array(0, np.int64),
                      np.array([0.1, 0.0, 0.0, 0.0, 0.0]))),
            ("clip_", (grads, np.array(100.0), 1.0))]


def test_float64_sgd_with_momentum_steps_after_load_state_dict():
    """load_state_dict marks the extras for remaking with dtype None, which numpy's dtype
    comparison takes for float64: the next step must remake them, not unpack nothing."""
    def make():
        param = ta.Tensor(np.array([1.0, -2.0]), dtype="float64", requires_grad=True)
        return param, ta.optim.SGD([param], lr=0.1, momentum=0.9)

    param, opt = make()
    for _ in range(2):
        param.grad = ta.Tensor(np.array([0.5, 0.25]), dtype="float64")
        opt.step()
    again, restored = make()
    again.data[...] = param.numpy()
    restored.load_state_dict(opt.state_dict())
    for p, o in ((param, opt), (again, restored)):
        p.grad = ta.Tensor(np.array([0.5, 0.25]), dtype="float64")
        o.step()
    np.testing.assert_array_equal(again.numpy(), param.numpy())
