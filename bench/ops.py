"""Per-op overhead: a tiny ``(a*b + a).sum()`` forward + backward, where dispatch dominates.

Contenders run in the same process, alternating, and the medians are compared as ratios
(absolute times on shared machines drift by 25-40% between runs):

    tinygrad_attn on each device, PyTorch CPU (when installed), and numpy doing the same
    arithmetic by hand (forward and hand-written backward) as the floor.

Run:  .venv/bin/python bench/ops.py [--repeats 7] [--number 2000]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import timeit

import numpy as np

import tinygrad_attn as ta
from tinygrad_attn.compiler import available_devices


def engine_step(device: str):
    a = ta.Tensor(np.random.rand(4), requires_grad=True, device=device)
    b = ta.Tensor(np.random.rand(4), requires_grad=True, device=device)

    def step():
        a.grad = b.grad = None
        (a * b + a).sum().backward()

    return step


def torch_step():
    import torch

    torch.set_num_threads(1)
    a = torch.rand(4, requires_grad=True)
    b = torch.rand(4, requires_grad=True)

    def step():
        a.grad = b.grad = None
        (a * b + a).sum().backward()

    return step


def numpy_step():
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)

    def step():
        y = a * b + a
        y.sum()
        dy = np.ones_like(y)
        return dy * b + dy, dy * a   # d/da, d/db

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()

    contenders = {f"tinygrad_attn[{d}]": engine_step(d) for d in available_devices()}
    contenders["numpy by hand"] = numpy_step()
    try:
        contenders["torch"] = torch_step()
    except ImportError:
        print("note: PyTorch is not installed; `pip install torch==2.13.0` to compare with it")

    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeats):          # alternate contenders within each repeat
        for name, step in contenders.items():
            step()                         # warm
            times[name].append(timeit.timeit(step, number=args.number) / args.number * 1e6)

    print(f"tiny (a*b + a).sum() forward+backward, {args.repeats} repeats x {args.number} calls; "
          f"{platform.processor() or platform.machine()}, numpy {np.__version__}")
    reference = "torch" if "torch" in times else "numpy by hand"
    ref = statistics.median(times[reference])
    print(f"{'contender':<22}{'median us':>10}{'vs ' + reference:>16}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<22}{median:>10.1f}{median / ref:>15.2f}x")


if __name__ == "__main__":
    main()
