"""The "cuda" device: tensors move to it and back, its kernels agree with the numpy
reference, and attention and a training step on it agree with "cpu".

Runs on a GPU, or under Numba's simulator: ``make test`` runs this file a second time with
NUMBA_ENABLE_CUDASIM=1 (set before numba is imported), where shapes stay tiny because every
GPU thread runs in Python.  tests/test_conformance.py covers every op and kernel on "cuda".
"""

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import Tensor, nn
from tinygrad_attn.compiler import available_devices, get_backend, reference
from tinygrad_attn.shapes import dim

pytestmark = pytest.mark.skipif(
    "cuda" not in available_devices(),
    reason="no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not set: make test runs these tests in "
           "its CUDA step, under the simulator",
)

REFERENCE = get_backend("numpy")


@pytest.fixture(scope="module")
def cuda():
    return get_backend("cuda")


@pytest.fixture(scope="module")
def kernels():
    from tinygrad_attn.compiler import cuda as kernels

    return kernels


def on_device(cuda, *arrays):
    return [None if a is None else cuda.asarray(a, a.dtype) for a in arrays]


# ---------------------------------------------------------------- tensors and devices


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "bool"])
def test_to_cuda_and_back_keeps_values_dtype_and_requires_grad(dtype):
    values = np.arange(-3, 3).reshape(2, 3).astype(dtype)
    floats = np.dtype(dtype).kind == "f"
    x = Tensor(values, dtype=dtype, requires_grad=floats, name="x")
    on_gpu = x.to("cuda")
    assert (on_gpu.device, on_gpu.dtype, on_gpu.shape) == ("cuda", np.dtype(dtype), (2, 3))
    assert on_gpu.requires_grad == floats and on_gpu.is_leaf and on_gpu.name == "x"
    back = on_gpu.to("cpu")
    assert back.device == "cpu" and back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back.numpy(), values)
    np.testing.assert_array_equal(Tensor(values, dtype=dtype, device="cuda").numpy(), values)


def test_gradients_stay_on_the_device():
    x = Tensor([[1.0, -2.0, 3.0]], requires_grad=True, device="cuda")
    (x * x).sum().backward()
    assert x.grad.device == "cuda"
    np.testing.assert_allclose(x.grad.numpy(), [[2.0, -4.0, 6.0]])


def test_mixing_devices_in_one_op_names_the_op_and_both_devices():
    a = Tensor([1.0, 2.0])
    b = Tensor([3.0, 4.0], device="cuda")
    with pytest.raises(ta.DeviceError, match=r"Add: inputs are on different devices \(cpu \(2,\), "
                                             r"cuda \(2,\)\); move them with .to\(device\)"):
        _ = a + b
    with pytest.raises(ta.DeviceError, match=r"lt: inputs are on different devices \(cuda \(2,\), cpu"):
        _ = b < a


def test_device_arrays_refuse_host_numpy_operations():
    # A real DeviceNDArray has no arithmetic, comparisons or numpy methods; under the
    # simulator, tests/simulator.py makes its arrays refuse them too, so engine code that
    # passes here also runs on a GPU.  The simulator's shapes refuse negative indexes, which
    # the engine reads through shapes.dim.
    data = Tensor([1.0, -2.0], device="cuda").data
    with pytest.raises(TypeError):
        _ = data < 0
    with pytest.raises(AttributeError):
        data.min()
    assert dim(data, -1) == dim(data, 0) == 2


def test_every_reference_kernel_is_a_cuda_kernel(cuda):
    assert cuda.parent is None                     # no silent fallback to numpy on device arrays
    assert set(reference.KERNELS) <= set(cuda.kernel_names())


# ---------------------------------------------------------------- kernels


def test_tiled_matmul_at_sizes_off_the_tile(cuda, kernels):
    tile = kernels.TILE
    rng = np.random.default_rng(0)
    for n, k, m in [(tile - 1, tile + 1, 2 * tile + 1), (1, 2 * tile + 3, 1), (tile + 2, 1, tile)]:
        a = rng.normal(size=(2, n, k))
        b = rng.normal(size=(1, k, m))                 # batch axis broadcast
        for dtype, rtol in ((np.float64, 1e-12), (np.float32, 1e-5)):
            a_, b_ = a.astype(dtype), b.astype(dtype)
            got = cuda.to_numpy(cuda.matmul(*on_device(cuda, a_, b_)))
            assert got.dtype == dtype and got.shape == (2, n, m)
            np.testing.assert_allclose(got, a_ @ b_, rtol=rtol, atol=rtol)
            got_nt = cuda.to_numpy(cuda.matmul_nt(*on_device(cuda, a_, np.swapaxes(b_, -1, -2).copy())))
            np.testing.assert_allclose(got_nt, a_ @ b_, rtol=rtol, atol=rtol)
            got_tn = cuda.to_numpy(cuda.matmul_tn(*on_device(cuda, np.swapaxes(a_, -1, -2).copy(), b_)))
            np.testing.assert_allclose(got_tn, a_ @ b_, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shared_mask", [False, True], ids=["mask-per-row", "mask-shared"])
def test_sdpa_matches_the_reference_with_masks_and_fully_masked_rows(cuda, kernels, causal, shared_mask):
    rng = np.random.default_rng(1)
    n, t_q, t_k, d, d_v = 2, kernels.SDPA_ROWS + 3, 2 * kernels.SDPA_ROWS + 1, 3, 2
    q, k, v = rng.normal(size=(n, t_q, d)), rng.normal(size=(n, t_k, d)), rng.normal(size=(n, t_k, d_v))
    mask = rng.random((1 if shared_mask else n, t_q, t_k)) < 0.6
    mask[:, 1] = False                                 # query 1 may attend to nothing
    o, lse = REFERENCE.sdpa(q, k, v, mask, 0.4, causal)
    got_o, got_lse = (cuda.to_numpy(x) for x in cuda.sdpa(*on_device(cuda, q, k, v, mask), 0.4, causal))
    np.testing.assert_allclose(got_o, o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_lse, lse, rtol=1e-12)
    assert np.all(got_o[:, 1] == 0) and np.all(got_lse[:, 1] == -np.inf)
    do = rng.normal(size=o.shape)
    want = REFERENCE.sdpa_back(q, k, v, o, lse, do, mask, 0.4, causal)
    got = cuda.sdpa_back(*on_device(cuda, q, k, v, o, lse, do, mask), 0.4, causal)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(cuda.to_numpy(g), w, rtol=1e-12, atol=1e-12)
    assert np.all(cuda.to_numpy(got[0])[:, 1] == 0)   # the fully masked query gets no gradient


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_reads_heads_in_place_as_the_reference_does(cuda, causal):
    """q, k, v (B, T, H, D), the layout multi-head attention hands over for short sentences:
    outputs and gradients come back in it, equal to the reference's."""
    rng = np.random.default_rng(3)
    B, H, t_q, t_k = 2, 2, 3, 4
    q, k = rng.normal(size=(B, t_q, H, 3)), rng.normal(size=(B, t_k, H, 3))
    v = rng.normal(size=(B, t_k, H, 2))
    mask = rng.random((B * H, t_q, t_k)) < 0.6
    mask[:, :, 0] = True
    o, lse = REFERENCE.sdpa(q, k, v, mask, 0.4, causal)
    got_o, got_lse = (cuda.to_numpy(x) for x in cuda.sdpa(*on_device(cuda, q, k, v, mask), 0.4, causal))
    assert got_o.shape == (B, t_q, H, 2)
    np.testing.assert_allclose(got_o, o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_lse, lse, rtol=1e-12)
    do = rng.normal(size=o.shape)
    want = REFERENCE.sdpa_back(q, k, v, o, lse, do, mask, 0.4, causal)
    got = cuda.sdpa_back(*on_device(cuda, q, k, v, o, lse, do, mask), 0.4, causal)
    for g, w, x in zip(got, want, (q, k, v), strict=True):
        assert tuple(g.shape) == x.shape
        np.testing.assert_allclose(cuda.to_numpy(g), w, rtol=1e-12, atol=1e-12)
    weights = cuda.to_numpy(cuda.sdpa_weights(*on_device(cuda, q, k, lse, mask), 0.4, causal))
    np.testing.assert_allclose(weights, REFERENCE.sdpa_weights(q, k, lse, mask, 0.4, causal), rtol=1e-12)


def test_fused_attention_op_without_a_mask_matches_cpu():
    rng = np.random.default_rng(2)
    inputs = [rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 6, 3)), rng.normal(size=(2, 6, 2))]
    results = {}
    for device in ("cpu", "cuda"):
        leaves = [Tensor(x, requires_grad=True, device=device) for x in inputs]
        out = ta.ops.ScaledDotProduct.apply(*leaves, scale=0.5, causal=True)
        out.backward(np.ones(out.shape, dtype=np.float32))
        results[device] = [out.numpy()] + [leaf.grad.numpy() for leaf in leaves]
    for got, want in zip(results["cuda"], results["cpu"], strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


# ---------------------------------------------------------------- end to end, equal to "cpu"


def test_multi_head_attention_forward_and_backward_match_cpu():
    rng = np.random.default_rng(3)
    B, T, S, E, H = 2, 3, 4, 4, 2
    arrays = {"query": rng.normal(size=(B, T, E)), "key": rng.normal(size=(B, S, E)),
              "value": rng.normal(size=(B, S, E))}
    arrays |= {name: rng.normal(size=(E, E)) * 0.5 for name in ("W_q", "W_k", "W_v", "W_o")}
    arrays |= {name: rng.normal(size=E) * 0.1 for name in ("b_q", "b_k", "b_v", "b_o")}
    key_mask = np.array([[True, True, True, False], [True, False, False, False]])
    cotangent = rng.normal(size=(B, T, E)).astype(np.float32)
    results = {}
    for device in ("cpu", "cuda"):
        leaves = {name: Tensor(x, requires_grad=True, device=device) for name, x in arrays.items()}
        out, weights = ta.attention.multi_head(num_heads=H, key_mask=key_mask, **leaves)
        out.backward(cotangent)
        results[device] = [out.numpy(), weights.numpy()] + [leaves[name].grad.numpy() for name in arrays]
    for got, want, what in zip(results["cuda"], results["cpu"], ["out", "weights", *arrays], strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6, err_msg=what)


class TinyClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        return self.out(self.hidden(x).relu())


def train_step(device, x, target, lr=0.1):
    """One SGD step of a fresh TinyClassifier on ``device``: (loss before, loss after, grads)."""
    ta.manual_seed(0)
    model = TinyClassifier().to(device)
    inputs = Tensor(x, device=device)
    loss = ta.functional.cross_entropy(model(inputs), target, ignore_index=2)
    loss.backward()
    grads = {name: p.grad.numpy() for name, p in model.named_parameters()}
    with ta.no_grad():
        for p in model.parameters():
            p.data = (p - p.grad * lr).data
    after = ta.functional.cross_entropy(model(inputs), target, ignore_index=2)
    return loss.item(), after.item(), grads


def test_a_training_step_on_cuda_matches_cpu():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(5, 4))
    target = np.array([0, 1, 2, 1, 0])                 # the 2 is ignored
    loss, after, grads = train_step("cuda", x, target)
    want_loss, want_after, want_grads = train_step("cpu", x, target)
    np.testing.assert_allclose([loss, after], [want_loss, want_after], rtol=2e-5)
    assert after < loss
    for name, g in grads.items():
        np.testing.assert_allclose(g, want_grads[name], rtol=2e-5, atol=1e-6, err_msg=name)


def test_a_bahdanau_seq2seq_step_on_cuda_matches_cpu():
    """The decoder's fused paths on the device: GRUCell reading [y; c] in parts,
    AdditiveScores projecting the query, and weight gradients stacked over the steps."""
    rng = np.random.default_rng(5)
    src = rng.integers(3, 9, (2, 3))
    src[1, 2] = 0                                      # padding, masked out of attention
    tgt_in, tgt_out = rng.integers(1, 9, (2, 2)), rng.integers(2, 9, (2, 2))
    grads = {}
    for device in ("cpu", "cuda"):
        ta.manual_seed(0)
        model = ta.models.Seq2Seq(9, 9, embed=3, hidden=4, attention="additive").to(device)
        model.loss(src, tgt_in, tgt_out).backward()
        grads[device] = {name: p.grad.numpy() for name, p in model.named_parameters()}
    for name, g in grads["cuda"].items():
        np.testing.assert_allclose(g, grads["cpu"][name], rtol=2e-5, atol=1e-6, err_msg=name)
