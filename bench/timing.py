"""What every benchmark script here shares: the machine, thread pinning, and timing
contenders alternately (absolute times on shared machines drift by 25-40% between runs,
so contenders are compared in the same run, as ratios of medians)."""

from __future__ import annotations

import os
import platform
import sys
import time

THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def cpu_model() -> str:
    """The CPU, and the kernels numpy's BLAS runs on it (the matrix products' speed)."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    # Imported here, not at the top: numpy must load after the benches' thread pinning.
    from tinygrad_attn.compiler.threads import blas_kernels

    return f"{name}; {blas_kernels()}"


def cpu_seconds() -> tuple[float, float, float] | None:
    """(machine busy CPU-seconds, this process's CPU-seconds, wall time), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(n) for n in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields) - fields[3] - fields[4]          # all but idle and iowait
    own = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.perf_counter()


def others_note(since, when: str) -> None:
    """How much CPU other processes took: on a machine with few cores they make the
    multi-threaded BLAS/OpenMP pools stall at their barriers, inflating timings erratically."""
    now = cpu_seconds()
    if since is None or now is None:
        return
    wall = now[2] - since[2]
    others = max(0.0, (now[0] - since[0]) - (now[1] - since[1])) / (wall * (os.cpu_count() or 1))
    print(f"other processes used {100 * others:.0f}% of the machine's CPU {when}"
          + ("  <- expect noisy, inflated timings (try --threads 1)" if others > 0.15 else ""))


def set_threads(n: int, torch=None) -> None:
    """Pin OpenBLAS, OpenMP (torch, numba) and MKL to ``n`` threads: the pools read their size
    when they load, so the script re-executes itself with the variables set."""
    wanted = {k: str(n) for k in THREAD_ENV}
    if any(os.environ.get(k) != v for k, v in wanted.items()):
        os.environ.update(wanted)
        os.execv(sys.executable, [sys.executable] + sys.argv)
    if torch is not None:
        torch.set_num_threads(n)


def calibrate(step, budget_s: float) -> int:
    """Calls per measurement so that one measurement takes about ``budget_s``."""
    for _ in range(3):
        step()                             # warm: compile, allocator, BLAS threads, dispatch
    t0 = time.perf_counter()
    step()
    return max(1, round(budget_s / max(time.perf_counter() - t0, 1e-9)))


def run_alternating(contenders: dict, repeats: int, budget_s: float, unit: float = 1e3) -> dict:
    """Time per call of each contender (ms, or ``unit`` per second), one measurement per
    contender per repeat, contenders alternating."""
    numbers = {name: calibrate(step, budget_s) for name, step in contenders.items()}
    times: dict = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, step in contenders.items():
            step()                         # warm after the other contenders ran
            n = numbers[name]
            t0 = time.perf_counter()
            for _ in range(n):
                step()
            times[name].append((time.perf_counter() - t0) / n * unit)
    return times


def training_step(model, optimizer, *batch):
    """One step as both frameworks spell it: zero_grad, loss, backward, update; over ``batch``
    (src, tgt_in, tgt_out) when given, else a function of them (what ``ta.compile`` takes)."""

    def step_of(src, tgt_in, tgt_out):
        optimizer.zero_grad()
        loss = model.loss(src, tgt_in, tgt_out)
        loss.backward()
        optimizer.step()
        return loss

    if not batch:
        return step_of
    return lambda: step_of(*batch)
