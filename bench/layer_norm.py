"""LayerNorm forward+backward on "cpu", float32: the fused op against the same math composed of
six nodes (mean, centre, square, mean, rsqrt, scale) and against PyTorch, same process,
alternating, medians.

Run:  .venv/bin/python bench/layer_norm.py [--repeats 7] [--number 20]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import timeit

import numpy as np

import tinygrad_attn as ta
from tinygrad_attn import functional as F


def composed(x, w, b, eps=1e-5):
    centred = x - x.mean(axis=-1, keepdims=True)
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred * (var + eps) ** -0.5 * w + b


def contenders(shape):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=shape), rng.normal(size=shape[-1:]), rng.normal(size=shape[-1:])]
    dy = rng.normal(size=shape).astype(np.float32)
    x, w, b = (ta.Tensor(a, requires_grad=True) for a in arrays)
    found = {"fused": lambda: F.layer_norm(x, shape[-1:], w, b).backward(dy),
             "composed": lambda: composed(x, w, b).backward(dy)}
    try:
        import torch
    except ImportError:
        print("note: PyTorch is not installed; `pip install torch==2.13.0` to compare with it")
        return found
    torch.set_num_threads(1)
    tx, tw, tb = (torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in arrays)
    tdy = torch.tensor(dy)
    found["torch"] = lambda: torch.nn.functional.layer_norm(tx, shape[-1:], tw, tb).backward(tdy)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=20)
    args = parser.parse_args()
    print(f"LayerNorm forward+backward, float32, ms (median of {args.repeats}); "
          f"{platform.processor() or platform.machine()}")
    for shape in [(640, 128), (2048, 256)]:
        runs = contenders(shape)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                run()
                times[name].append(timeit.timeit(run, number=args.number) / args.number * 1e3)
        medians = {name: statistics.median(v) for name, v in times.items()}
        text = ", ".join(f"{name} {ms:.3f}" for name, ms in medians.items())
        ratios = f"composed/fused {medians['composed'] / medians['fused']:.2f}x"
        if "torch" in medians:
            ratios += f", fused/torch {medians['fused'] / medians['torch']:.2f}x"
        print(f"{shape}: {text}; {ratios}")


if __name__ == "__main__":
    main()
