"""One GRU and one LSTM cell step, forward + backward, float32: the fused cell ops against
the same cell built from primitive ops, the numpy reference device, and PyTorch eager.

    ta fused [cpu]       F.gru_cell / F.lstm_cell on the default device: two MatMuls (BLAS),
                         bias Adds, then one fused node (GRUGates; LSTMCellState + LSTMHidden)
                         whose forward and backward are Numba kernels (compiler/cpu/rnn.py)
    ta composed [cpu]    the same cell from primitive ops (slices, sigmoid, tanh, * and +)
    ta fused [numpy]     F.gru_cell / F.lstm_cell on the reference device (numpy kernels)
    torch                torch.nn.GRUCell / LSTMCell, eager, the same weights

Every input and parameter requires grad (as inside a training step) and backward starts
from the new h with a fixed cotangent.  Before timing, each contender is checked against
torch (values and gradients to 1e-4 relative to their largest entry), so all time the same
computation.  Contenders alternate within each repeat and the medians are compared as
ratios to torch from the same run (absolute times drift by 25-40% between runs on shared
machines; the CPU other processes took is printed).

``--threshold`` instead times the serial and the prange driver of every cpu_rnn kernel over
a range of sizes B*H, for cpu_rnn.PARALLEL_MIN_ENTRIES.

Thread pools are left as found unless ``--threads N`` pins BLAS, OpenMP (torch, Numba) and MKL
to N threads; on a shared two-core machine ``--threads 1`` gives steadier numbers.

Run:  .venv/bin/python bench/rnn_cells.py [--repeats 7] [--budget 0.2] [--threads N] [--threshold]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
from timing import THREAD_ENV, calibrate, cpu_model, cpu_seconds, others_note, run_alternating, set_threads

import tinygrad_attn.functional as F
from tinygrad_attn import Tensor

try:
    import torch
except ImportError:  # time ours alone
    torch = None

SIZES = [(32, 128), (8, 32)]          # (B, H); the input size I equals H
THRESHOLD_SIZES = [(8, 32), (16, 64), (32, 64), (32, 128), (64, 128), (64, 256), (128, 512), (256, 1024)]
TOL = 1e-4
NOISY = "* varied more than 1.5x between repeats: compare with care (other processes on the machine)"


# ---------------------------------------------------------------- machine












def print_machine() -> None:
    import numba

    threads = f"torch threads {torch.get_num_threads()}" if torch else "torch not installed"
    env = {k: os.environ[k] for k in THREAD_ENV if k in os.environ}
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; python {platform.python_version()}, "
          f"numpy {np.__version__}, numba {numba.__version__}, "
          f"torch {torch.__version__ if torch else '-'} ({threads}); thread env: {env or 'none set'}")


# ---------------------------------------------------------------- the contenders


def cell_arrays(kind: str, batch: int, hidden: int) -> dict:
    gates = 3 if kind == "gru" else 4
    rng = np.random.default_rng(batch * hidden)
    bound = 1.0 / np.sqrt(hidden)                                    # torch's initialisation
    arrays = {"x": rng.standard_normal((batch, hidden)), "h": rng.standard_normal((batch, hidden)),
              "weight_ih": rng.uniform(-bound, bound, (gates * hidden, hidden)),
              "weight_hh": rng.uniform(-bound, bound, (gates * hidden, hidden)),
              "bias_ih": rng.uniform(-bound, bound, gates * hidden),
              "bias_hh": rng.uniform(-bound, bound, gates * hidden),
              "dh": rng.standard_normal((batch, hidden))}
    if kind == "lstm":
        arrays["c"] = rng.standard_normal((batch, hidden))
    return {k: v.astype(np.float32) for k, v in arrays.items()}


def gru_composed(x, h, w_ih, w_hh, b_ih, b_hh):
    hidden = h.shape[-1]
    gi = x @ w_ih.T + b_ih                                           # (B, 3H)
    gh = h @ w_hh.T + b_hh                                           # (B, 3H)
    r = (gi[:, :hidden] + gh[:, :hidden]).sigmoid()
    z = (gi[:, hidden : 2 * hidden] + gh[:, hidden : 2 * hidden]).sigmoid()
    n = (gi[:, 2 * hidden :] + r * gh[:, 2 * hidden :]).tanh()
    return (1 - z) * n + z * h


def lstm_composed(x, hx, w_ih, w_hh, b_ih, b_hh):
    h, c = hx
    hidden = h.shape[-1]
    gates = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh                   # (B, 4H)
    i, f = gates[:, :hidden].sigmoid(), gates[:, hidden : 2 * hidden].sigmoid()
    g, o = gates[:, 2 * hidden : 3 * hidden].tanh(), gates[:, 3 * hidden :].sigmoid()
    c_next = f * c + i * g
    return o * c_next.tanh(), c_next


def ours(kind: str, arrays: dict, device: str, fused: bool):
    """A step function and its leaves (name -> Tensor, with torch's names)."""
    names = ["x", "h", "c", "weight_ih", "weight_hh", "bias_ih", "bias_hh"]
    leaves = {k: Tensor(arrays[k], requires_grad=True, device=device) for k in names if k in arrays}
    dh = Tensor(arrays["dh"], device=device)
    weights = [leaves[k] for k in names[3:]]
    if kind == "gru":
        cell = F.gru_cell if fused else gru_composed

        def forward():
            return cell(leaves["x"], leaves["h"], *weights)
    else:
        cell = F.lstm_cell if fused else lstm_composed

        def forward():
            return cell(leaves["x"], (leaves["h"], leaves["c"]), *weights)[0]

    def step():
        for t in leaves.values():
            t.grad = None
        forward().backward(dh)

    return step, leaves


def theirs(kind: str, arrays: dict):
    hidden = arrays["h"].shape[1]
    cell = (torch.nn.GRUCell if kind == "gru" else torch.nn.LSTMCell)(hidden, hidden)
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    cell.load_state_dict({k: torch.from_numpy(arrays[k]) for k in names})
    leaves = {k: torch.tensor(arrays[k], requires_grad=True) for k in ("x", "h", "c") if k in arrays}
    leaves.update(cell.named_parameters())
    dh = torch.from_numpy(arrays["dh"])

    def step():
        for t in leaves.values():
            t.grad = None
        if kind == "gru":
            cell(leaves["x"], leaves["h"]).backward(dh)
        else:
            cell(leaves["x"], (leaves["h"], leaves["c"]))[0].backward(dh)

    return step, leaves


def agrees(name: str, ours_leaves: dict, torch_leaves: dict) -> bool:
    """After one step of each: every gradient within TOL of torch's, relative to its largest entry."""
    worst = 0.0
    for k, t in torch_leaves.items():
        ref = t.grad.numpy()
        got = ours_leaves[k].grad.numpy()
        worst = max(worst, float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)))
    ok = worst <= TOL
    print(f"  {'ok  ' if ok else 'FAIL'} {name:<20} gradients vs torch, max rel err {worst:.1e}")
    return ok


# ---------------------------------------------------------------- timing






def bench_cells(repeats: int, budget_s: float) -> None:
    rows = []
    for kind in ("gru", "lstm"):
        for batch, hidden in SIZES:
            arrays = cell_arrays(kind, batch, hidden)
            contenders, leaves = {}, {}
            for name, device, fused in (("ta fused [cpu]", "cpu", True), ("ta composed [cpu]", "cpu", False),
                                        ("ta fused [numpy]", "numpy", True)):
                contenders[name], leaves[name] = ours(kind, arrays, device, fused)
            if torch is not None:
                contenders["torch"], torch_leaves = theirs(kind, arrays)
                print(f"verify {kind} B={batch} H={hidden}:")
                contenders["torch"]()
                for name in leaves:
                    contenders[name]()
                    if not agrees(name, leaves[name], torch_leaves):
                        sys.exit("ours and torch disagree: not timing different computations")
            times = run_alternating(contenders, repeats, budget_s, unit=1e6)
            rows.append((kind, batch, hidden, times))

    print(f"\n{repeats} repeats, medians of us per forward+backward step (float32)"
          + ("; ratios are to torch in the same run" if torch is not None else ""))
    print(f"{'cell':<6}{'B':>4}{'H':>5}  {'contender':<20}{'median us':>11}{'min..max':>16}"
          + (f"{'vs torch':>10}" if torch is not None else ""))
    noisy_any = False
    for kind, batch, hidden, times in rows:
        ref = statistics.median(times["torch"]) if torch is not None else None
        for name, values in times.items():
            median = statistics.median(values)
            noisy = max(values) > 1.5 * min(values)
            noisy_any |= noisy
            line = (f"{kind:<6}{batch:>4}{hidden:>5}  {name:<20}{median:>11.1f}"
                    f"{f'{min(values):.1f}..{max(values):.1f}':>16}")
            if ref is not None:
                line += f"{median / ref:>9.2f}x"
            print(line + ("  *" if noisy else ""))
    if noisy_any:
        print(NOISY)


# ---------------------------------------------------------------- serial vs prange drivers


def bench_threshold(repeats: int) -> None:
    import numba

    from tinygrad_attn.compiler import reference
    from tinygrad_attn.compiler.cpu import rnn as cpu_rnn

    # Minima, not medians: other processes slow the prange driver (which waits for every
    # thread) far more than the serial one, and the quietest repeat is the fairest.
    print(f"serial / prange driver, us per call (minima of {repeats}); "
          f"PARALLEL_MIN_ENTRIES = {cpu_rnn.PARALLEL_MIN_ENTRIES}")
    print(f"{'dtype':<9}{'B x H':>12}{'entries':>9}  " + "".join(f"{k:>24}" for k in cpu_rnn.KERNELS))
    for dtype in (np.float32, np.float64):
        for batch, hidden in THRESHOLD_SIZES:
            rng = np.random.default_rng(0)
            gi, gh, gates = (rng.standard_normal((batch, k * hidden)).astype(dtype) for k in (3, 3, 4))
            h_prev, dh = (rng.standard_normal((batch, hidden)).astype(dtype) for _ in range(2))
            _, gru_saved = reference.gru_gates(gi, gh, h_prev)
            c, state_saved = reference.lstm_cell_state(gates, h_prev)
            _, hidden_saved = reference.lstm_hidden(gates, c)
            calls = {"gru_gates": (gi, gh, h_prev), "gru_gates_back": (gru_saved, gh, h_prev, dh),
                     "lstm_cell_state": (gates, h_prev), "lstm_cell_state_back": (state_saved, h_prev, dh),
                     "lstm_hidden": (gates, c), "lstm_hidden_back": (hidden_saved, dh)}
            cells = []
            for name, args in calls.items():
                minima = []
                for parallel in (False, True):
                    cpu_rnn._use_prange = lambda entries, dtype, parallel=parallel: parallel
                    fn = cpu_rnn.KERNELS[name]
                    number = calibrate(lambda fn=fn, args=args: fn(*args), 0.02)
                    samples = []
                    for _ in range(repeats):
                        t0 = time.perf_counter()
                        for _ in range(number):
                            fn(*args)
                        samples.append((time.perf_counter() - t0) / number * 1e6)
                    minima.append(min(samples))
                cells.append(f"{minima[0]:>10.1f} / {minima[1]:>9.1f}")
            print(f"{np.dtype(dtype).name:<9}{f'{batch} x {hidden}':>12}{batch * hidden:>9}  " + "".join(
                f"{cell:>24}" for cell in cells))
    # Only now: the pool starts with the first parallel kernel.
    print(f"thread pool: {numba.threading_layer()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per measurement")
    parser.add_argument("--threshold", action="store_true", help="time serial vs prange kernels instead")
    parser.add_argument("--threads", type=int, help="pin every thread pool to this many threads")
    args = parser.parse_args()
    if args.threads:
        set_threads(args.threads, torch)
    print_machine()
    since = cpu_seconds()
    if torch is None:
        print("note: PyTorch is not installed (`pip install torch==2.13.0`); timing ours only")
    if args.threshold:
        bench_threshold(args.repeats)
    else:
        bench_cells(args.repeats, args.budget)
    others_note(since, "while timing")


if __name__ == "__main__":
    main()
