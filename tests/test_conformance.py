"""Every device agrees with the numpy reference: every registered op (forward and backward,
float32 and float64) and, with hypothesis shapes, every kernel a device overrides."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_attn import Tensor
from tinygrad_attn.autograd import registry
from tinygrad_attn.compiler import available_devices, get_backend

DEVICES = [d for d in available_devices() if d != "numpy"]
REFERENCE = get_backend("numpy")
DTYPES = [np.float32, np.float64]


def tolerance(dtype):
    # float32 kernels may use a polynomial exp (relative error 2e-7) and other summation orders.
    return {"rtol": 2e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}


def run_op(op, inputs, attrs, device, dtype, seed=0):
    """Forward and the gradient of every float input for a fixed cotangent, on ``device``."""
    leaves = []
    for x in inputs:
        x = np.asarray(x)
        if x.dtype.kind == "f":
            leaves.append(Tensor(x, requires_grad=True, dtype=dtype, device=device))
        else:
            leaves.append(Tensor(x, device=device))
    out = op.apply(*leaves, **attrs)
    cotangent = np.random.default_rng(seed).uniform(-1, 1, size=out.shape)
    out.backward(cotangent.astype(out.dtype))
    grads = [leaf.grad.numpy() for leaf in leaves if leaf.requires_grad]
    return out.numpy(), grads


CASES = [(name, k) for name in sorted(registry) for k in range(len(registry[name].examples()))]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, k", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_every_op_matches_the_reference_on_every_device(name, k, device, dtype):
    op = registry[name]
    example = op.examples()[k]
    attrs = dict(example.attrs)
    if name == "Cast":
        attrs["dtype"] = np.dtype(dtype).name
    expected = run_op(op, example.inputs, attrs, "numpy", dtype)
    actual = run_op(op, example.inputs, attrs, device, dtype)
    np.testing.assert_allclose(actual[0], expected[0], **tolerance(dtype), err_msg="forward")
    for got, want in zip(actual[1], expected[1], strict=True):
        np.testing.assert_allclose(got, want, **tolerance(dtype), err_msg="backward")


# ---------------------------------------------------------------- overridden kernels, hypothesis shapes


def scores(rng, shape, dtype, masked_rows=True):
    """Scores with large and -inf entries (and some rows entirely -inf)."""
    x = rng.normal(size=shape) * rng.choice([1.0, 30.0])
    x[rng.random(shape) < 0.2] = -np.inf
    if masked_rows and len(shape) >= 1 and x.size:
        x.reshape(-1, shape[-1])[rng.random(x.size // shape[-1]) < 0.2] = -np.inf
    return x.astype(dtype)


def softmax_family(rng, dtype, shape):
    x = scores(rng, shape, dtype)
    y = REFERENCE.softmax(x, -1)
    logy = REFERENCE.log_softmax(x, -1)
    dy = rng.normal(size=shape).astype(dtype)
    return [("softmax", (x, -1)), ("softmax_back", (y, dy, -1)),
            ("log_softmax", (x, -1)), ("log_softmax_back", (np.where(np.isfinite(logy), logy, -80), dy, -1)),
            ("masked_softmax", (np.where(np.isfinite(x), x, 1.0).astype(dtype),
                                rng.random(shape[-1:] if rng.random() < 0.5 else shape) < 0.6))]


def losses(rng, dtype, shape):
    n, c = int(np.prod(shape[:-1])), shape[-1]
    logits = (rng.normal(size=(n, c)) * 10).astype(dtype)
    target = rng.integers(0, c, size=n)
    target[rng.random(n) < 0.3] = 1
    _, lse = REFERENCE.cross_entropy(logits, target, 1)
    dloss = rng.normal(size=n).astype(dtype)
    ids = rng.integers(0, 5, size=shape[:-1])
    dy = rng.normal(size=shape[:-1] + (3,)).astype(dtype)
    return [("cross_entropy", (logits, target, 1)), ("cross_entropy_back", (logits, lse, target, 1, dloss)),
            ("cross_entropy", (logits, np.where(target == 1, 0, target), -(2**63))),
            ("embedding_back", (5, ids, dy, None)), ("embedding_back", (5, ids, dy, 2))]


def attention(rng, dtype, shape):
    n = shape[0]
    t_q, t_k, d, d_v = rng.integers(1, 300), rng.integers(1, 40), rng.integers(1, 5), rng.integers(1, 4)
    if rng.random() < 0.5:   # keep most cases small; some cross the 128-query block boundary
        t_q = rng.integers(1, 6)
    q, k, v = (rng.normal(size=(n, t, e)).astype(dtype) for t, e in ((t_q, d), (t_k, d), (t_k, d_v)))
    mask = None if rng.random() < 0.3 else rng.random((rng.choice([1, n]), t_q, t_k)) < 0.6
    causal = bool(rng.random() < 0.4)
    o, lse = REFERENCE.sdpa(q, k, v, mask, 0.6, causal)
    do = rng.normal(size=o.shape).astype(dtype)
    return [("sdpa", (q, k, v, mask, 0.6, causal)), ("sdpa_back", (q, k, v, o, lse, do, mask, 0.6, causal))]


GENERATORS = [softmax_family, losses, attention]


def test_every_overridden_kernel_has_a_conformance_generator():
    rng = np.random.default_rng(0)
    covered = {name for gen in GENERATORS for dtype in DTYPES for name, _ in gen(rng, dtype, (2, 3))}
    for device in DEVICES:
        own = set(get_backend(device).kernels)
        assert own <= covered, f"{device} overrides {sorted(own - covered)} without a conformance test"


def compare(got, want, dtype, what):
    if isinstance(want, tuple):
        for g, w in zip(got, want, strict=True):
            compare(g, w, dtype, what)
        return
    assert got.dtype == want.dtype and got.shape == want.shape, what
    np.testing.assert_allclose(got, want, **tolerance(dtype), err_msg=what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("generator", GENERATORS, ids=lambda g: g.__name__)
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=3).map(tuple),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1))
def test_overridden_kernels_match_the_reference(device, generator, shape, dtype, seed):
    backend = get_backend(device)
    for name, args in generator(np.random.default_rng(seed), dtype, shape):
        with np.errstate(all="ignore"):
            want = getattr(REFERENCE, name)(*args)
        got = getattr(backend, name)(*args)
        compare(got, want, dtype, f"{name} on {device}, shape {shape}, {np.dtype(dtype).name}")
