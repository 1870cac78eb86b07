"""The "cuda" device: fused scaled dot-product attention and the tiled matmul, against PyTorch CUDA.

    sdpa      ta.ops.ScaledDotProduct (the fused sdpa / sdpa_back kernels of compiler/cuda/attention.py)
              at (B, H, T, d) = (1,1,128,64), (8,8,128,64), (8,8,512,64), (4,8,1024,64),
              float32, scale 1/sqrt(d), no mask; "fwd" under no_grad, "fwd+bwd" records the
              node and backpropagates a cotangent that is already on the device;
              torch.nn.functional.scaled_dot_product_attention on the same values.
    matmul    1024 x 1024 @ 1024 x 1024 float32, ``a @ b`` on the device (the shared-memory
              tiled kernel) against torch.matmul (cuBLAS, TF32 off).

Medians over the repeats, each repeat timed from launch to ``synchronize()``; a warm-up call
first compiles the kernels.  Before timing, ours is checked against the numpy reference (and
against torch when it runs).  Without PyTorch built with CUDA, ours is timed alone.

It needs a CUDA GPU.  ``--tiny`` runs tiny shapes instead, which also work under Numba's
simulator (no GPU; the timings then mean nothing, only that the path works):

    .venv/bin/python bench/cuda.py [--repeats 10]
    NUMBA_ENABLE_CUDASIM=1 .venv/bin/python bench/cuda.py --tiny
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np

import tinygrad_attn as ta
from tinygrad_attn.compiler import available_devices, cuda_problem, get_backend

SDPA_SHAPES = [(1, 1, 128, 64), (8, 8, 128, 64), (8, 8, 512, 64), (4, 8, 1024, 64)]
MATMUL_SIZE = 1024
TINY_SDPA_SHAPES = [(1, 1, 8, 4), (2, 2, 9, 4)]
TINY_MATMUL_SIZE = 10


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} has no CUDA device here"
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch, ""


def synchronize():
    from numba import cuda

    cuda.synchronize()


def median_ms(fn, repeats: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def device_name() -> str:
    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        return "Numba's CUDA simulator (no GPU: timings are meaningless)"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def bench_sdpa(shape, repeats: int, torch) -> list[str]:
    b, h, t, d = shape
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=shape).astype(np.float32) for _ in range(3))
    cotangent = rng.normal(size=shape).astype(np.float32)
    scale = 1.0 / math.sqrt(d)
    leaves = [ta.Tensor(x, requires_grad=True, device="cuda") for x in (q, k, v)]
    grad_out = ta.Tensor(cotangent, device="cuda")

    def forward():
        with ta.no_grad():
            return ta.ops.ScaledDotProduct.apply(*leaves, scale=scale, causal=False)

    def forward_backward():
        for leaf in leaves:
            leaf.grad = None
        ta.ops.ScaledDotProduct.apply(*leaves, scale=scale, causal=False).backward(grad_out)

    o, _ = get_backend("numpy").sdpa(*(x.reshape(b * h, t, d) for x in (q, k, v)), None, scale, False)
    np.testing.assert_allclose(forward().numpy(), o.reshape(shape), rtol=1e-4, atol=1e-5)
    ours = (median_ms(forward, repeats, synchronize), median_ms(forward_backward, repeats, synchronize))
    line = f"  sdpa {str(shape):18} fwd {ours[0]:9.3f} ms   fwd+bwd {ours[1]:9.3f} ms"
    if torch is None:
        return [line]
    F = torch.nn.functional
    tq, tk, tv = (torch.tensor(x, device="cuda", requires_grad=True) for x in (q, k, v))
    tgrad = torch.tensor(cotangent, device="cuda")

    def torch_forward():
        with torch.no_grad():
            return F.scaled_dot_product_attention(tq, tk, tv, scale=scale)

    def torch_forward_backward():
        for x in (tq, tk, tv):
            x.grad = None
        F.scaled_dot_product_attention(tq, tk, tv, scale=scale).backward(tgrad)

    np.testing.assert_allclose(forward().numpy(), torch_forward().cpu().numpy(), rtol=1e-3, atol=1e-4)
    theirs = (median_ms(torch_forward, repeats, torch.cuda.synchronize),
              median_ms(torch_forward_backward, repeats, torch.cuda.synchronize))
    return [line + f"   | torch {theirs[0]:8.3f} / {theirs[1]:8.3f} ms   | ours/torch "
                   f"{ours[0] / theirs[0]:6.1f}x / {ours[1] / theirs[1]:6.1f}x"]


def bench_matmul(size: int, repeats: int, torch) -> list[str]:
    rng = np.random.default_rng(1)
    a, b = (rng.normal(size=(size, size)).astype(np.float32) for _ in range(2))
    ta_a, ta_b = ta.Tensor(a, device="cuda"), ta.Tensor(b, device="cuda")

    def ours_matmul():
        with ta.no_grad():
            return ta_a @ ta_b

    np.testing.assert_allclose(ours_matmul().numpy(), a @ b, rtol=1e-3, atol=1e-3)
    ms = median_ms(ours_matmul, repeats, synchronize)
    tflops = 2 * size**3 / (ms * 1e-3) / 1e12
    line = f"  matmul {size}^3 float32       {ms:9.3f} ms   {tflops:6.2f} TFLOP/s"
    if torch is None:
        return [line]
    ta_, tb_ = torch.tensor(a, device="cuda"), torch.tensor(b, device="cuda")
    theirs = median_ms(lambda: torch.matmul(ta_, tb_), repeats, torch.cuda.synchronize)
    return [line + f"   | torch {theirs:8.3f} ms   | ours/torch {ms / theirs:6.1f}x"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (what the simulator can run)")
    args = parser.parse_args()
    if "cuda" not in available_devices():
        print(f"bench/cuda.py needs the cuda device: {cuda_problem()}", file=sys.stderr)
        return 1
    torch, why_not = torch_cuda()
    sdpa_shapes, size = (TINY_SDPA_SHAPES, TINY_MATMUL_SIZE) if args.tiny else (SDPA_SHAPES, MATMUL_SIZE)
    repeats = 2 if args.tiny and args.repeats == parser.get_default("repeats") else args.repeats
    print(f"device: {device_name()}; medians of {repeats} repeats")
    if torch is None:
        print(f"note: {why_not}, so ours is timed alone")
    lines = []
    for shape in sdpa_shapes:
        lines += bench_sdpa(shape, repeats, torch)
    lines += bench_matmul(size, repeats, torch)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
