"""A sublayer's end as one call (compiler/fuse_norm.py): on the "cpu" device a compiled plan
replays a Linear's bias, the residual addition and the layer norm after them as one
``add_layer_norm``, with the same bits as the three calls (the oracle: eager, and the plan
built without the pass), and leaves every other shape of plan as it was."""

import numpy as np
import pytest

import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn.compiler import cpu, fuse_norm, reference


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_add_layer_norm_kernel_is_the_three_kernels_bit_for_bit(dtype, affine):
    rng = np.random.default_rng(0)
    y = rng.normal(size=(7, 12)).astype(dtype)
    bias = rng.normal(size=12).astype(dtype)
    residual = (rng.normal(size=(7, 1, 12)) * 3).astype(dtype)
    weight, norm_bias = (rng.normal(size=12).astype(dtype) for _ in range(2)) if affine else (None, None)
    x = np.add(residual, cpu.KERNELS["add_"](y.copy(), bias).reshape(7, 1, 12)).reshape(7, 12)
    want = (x, *cpu.KERNELS["layer_norm"](x, weight, norm_bias, 1e-5))
    got = cpu.KERNELS["add_layer_norm"](y, bias, residual, weight, norm_bias, 1e-5)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    for g, w in zip(got, reference.add_layer_norm(y, bias, residual, weight, norm_bias, 1e-5), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


def _sublayer_step(also_return_sum: bool):
    """loss of layer_norm(x + linear(h)) and its gradients: a post-norm sublayer's end."""
    def step(x, h, w, b, g, beta):
        s = x + F.linear(h, w, b)
        out = F.layer_norm(s, (6,), g, beta)
        loss = (out * out).sum()
        loss.backward()
        return (loss, s) if also_return_sum else loss
    return step


def _run(step, arrays, replays=3):
    results = []
    for k in range(replays):
        leaves = [ta.Tensor(a * (1 + k / 3), requires_grad=True) for a in arrays]
        out = step(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        results.append([o.numpy().copy() for o in outs] + [t.grad.numpy().copy() for t in leaves])
    return results


def _arrays(dtype):
    rng = np.random.default_rng(1)
    shapes = [(4, 3, 6), (4, 3, 5), (6, 5), (6,), (6,), (6,)]
    return [rng.normal(size=s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sublayer_end_replays_as_one_call_with_eager_bits(dtype):
    arrays = _arrays(dtype)
    step = ta.compile(_sublayer_step(False))
    got = _run(step, arrays)
    (plan,) = step.plans
    assert plan.source.count("add_layer_norm(") == 1
    want = _run(_sublayer_step(False), arrays)                           # eager
    for g_run, w_run in zip(got, want, strict=True):
        for g, w in zip(g_run, w_run, strict=True):
            np.testing.assert_array_equal(g, w)


def test_the_pass_leaves_a_sum_read_elsewhere_alone(monkeypatch):
    """The sum also returned: it must stay the add's own buffer, so nothing is fused."""
    step = ta.compile(_sublayer_step(True))
    got = _run(step, _arrays(np.float32))
    assert "add_layer_norm" not in step.plans[0].source
    want = _run(_sublayer_step(True), _arrays(np.float32))
    for g_run, w_run in zip(got, want, strict=True):
        for g, w in zip(g_run, w_run, strict=True):
            np.testing.assert_array_equal(g, w)


def test_the_numpy_device_and_a_pre_norm_layer_are_not_fused():
    arrays = _arrays(np.float64)

    step = ta.compile(_sublayer_step(False))
    leaves = [ta.Tensor(a, device="numpy", requires_grad=True) for a in arrays]
    step(*leaves)
    assert "add_layer_norm" not in step.plans[0].source

    def pre_norm(x, h, w, b):                         # x + linear(norm(h)): no norm after the sum
        loss = ((x + F.linear(F.layer_norm(h, (5,)), w, b)) ** 2).sum()
        loss.backward()
        return loss

    step = ta.compile(pre_norm)
    got = _run(step, arrays[:4])
    assert "add_layer_norm" not in step.plans[0].source
    # (its norm has no weight: the plan assigns the missing weight gradient to _)
    for g_run, w_run in zip(got, _run(pre_norm, arrays[:4]), strict=True):
        for g, w in zip(g_run, w_run, strict=True):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_decode_plans_fuse_each_post_norm_sublayer(norm_first):
    ta.manual_seed(0)
    model = ta.models.Transformer(12, 12, d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                  dim_feedforward=32, dropout=0.0, norm_first=norm_first)
    src = np.random.default_rng(0).integers(3, 12, (4, 5))
    want = model.greedy(src, max_len=6)
    got = model.greedy(src, max_len=6, compile=True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    sources = [plan.source for fn in ta.models.decoding.compiled_functions(model) for plan in fn.plans]
    fused = sum(source.count("add_layer_norm(") for source in sources)
    # post-norm: each decoder layer's three sublayers a step, each encoder layer's two; pre-norm:
    # the stacks' final norms alone, each after its last layer's residual addition
    assert fused == (2 if norm_first else 3 * 2 + 2 * 2)


def test_the_plan_without_the_pass_computes_the_same_bits(monkeypatch):
    arrays = _arrays(np.float32)
    fused = _run(ta.compile(_sublayer_step(False)), arrays)
    monkeypatch.setattr(fuse_norm, "fuse_add_norms", lambda recorder, entries, keep, device: entries)
    plain_step = ta.compile(_sublayer_step(False))
    plain = _run(plain_step, arrays)
    assert "add_layer_norm" not in plain_step.plans[0].source
    for g_run, w_run in zip(fused, plain, strict=True):
        for g, w in zip(g_run, w_run, strict=True):
            np.testing.assert_array_equal(g, w)
