"""Where the engine spends a step's time: by op, by kernel, and by Python function.

Used by the benches' ``--profile`` options (bench/attention.py, bench/transformer.py).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections import defaultdict

import tinygrad_attn as ta
from tinygrad_attn.compiler import get_backend


def describe(arrays) -> str:
    return " ".join("x".join(map(str, a.shape)) or "()" for a in arrays if hasattr(a, "shape"))


def _minor_faults() -> int | None:
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def profile_step(step, title: str, steps: int) -> None:
    """``step()`` of ours on the cpu device, broken down by op and by kernel: each Op's
    forward/backward and each backend kernel is wrapped with a timer; then cProfile."""
    for _ in range(3):
        step()
    faults = _minor_faults()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    plain_ms = (time.perf_counter() - t0) / steps * 1e3
    faults = (_minor_faults() - faults) / steps if faults is not None else None

    op_time: dict[tuple, float] = defaultdict(float)
    op_calls: dict[tuple, int] = defaultdict(int)
    kernel_time: dict[tuple, float] = defaultdict(float)
    kernel_calls: dict[tuple, int] = defaultdict(int)
    current: list[tuple] = []

    def wrap_op(cls):
        forward, backward = cls.forward, cls.backward

        def timed_forward(self, *inputs):
            key = (cls.name, describe(inputs), self.attrs_text()[:40])
            self.__dict__["_bench_key"] = key
            current.append(("fwd",) + key)
            t = time.perf_counter()
            try:
                return forward(self, *inputs)
            finally:
                op_time[current[-1]] += time.perf_counter() - t
                op_calls[current[-1]] += 1
                current.pop()

        def timed_backward(self, dy):
            current.append(("bwd",) + self.__dict__.get("_bench_key", (cls.name, "?", "")))
            t = time.perf_counter()
            try:
                return backward(self, dy)
            finally:
                op_time[current[-1]] += time.perf_counter() - t
                op_calls[current[-1]] += 1
                current.pop()

        cls.forward, cls.backward = timed_forward, timed_backward
        return forward, backward

    def wrap_kernel(kname, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                where = current[-1] if current else ("-", "outside ops", "", "")
                kernel_time[(where, kname)] += time.perf_counter() - t
                kernel_calls[(where, kname)] += 1
        return timed

    backend = get_backend("cpu")
    originals_ops = {cls: wrap_op(cls) for cls in ta.ops.registry.values()}
    originals_kernels = {}
    for kname in backend.kernel_names():
        originals_kernels[kname] = getattr(backend, kname)
        setattr(backend, kname, wrap_kernel(kname, originals_kernels[kname]))
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wrapped_ms = (time.perf_counter() - t0) / steps * 1e3
    finally:
        for cls, (forward, backward) in originals_ops.items():
            cls.forward, cls.backward = forward, backward
        for kname, fn in originals_kernels.items():
            setattr(backend, kname, fn)

    print(f"\n== profile: {title}, {steps} steps ==")
    print(f"step: {plain_ms:.1f} ms plain, {wrapped_ms:.1f} ms with timers")
    if faults is not None:
        print(f"minor page faults per step: {faults:.0f} (~{faults * 4 / 1024:.0f} MiB of fresh pages "
              f"the allocator took from the OS; each one is paid inside the op that allocated)")
    in_ops = sum(op_time.values()) / steps * 1e3
    print(f"\nby op (an op's time includes its kernels), ms per step; "
          f"outside any op (autograd walk, grad accumulation, Python): {wrapped_ms - in_ops:.1f} ms")
    print(f"{'phase':<6}{'op':<14}{'input shapes':<38}{'attrs':<26}{'calls':>6}{'ms':>8}{'%':>6}")
    for key, secs in sorted(op_time.items(), key=lambda kv: -kv[1]):
        phase, name, shapes, attrs = key
        ms = secs / steps * 1e3
        if ms < 0.05:
            continue
        print(f"{phase:<6}{name:<14}{shapes[:37]:<38}{attrs[:25]:<26}{op_calls[key] // steps:>6}"
              f"{ms:>8.2f}{100 * ms / wrapped_ms:>6.1f}")

    print("\nby kernel, summed over calling ops, ms per step")
    per_kernel: dict[str, float] = defaultdict(float)
    per_kernel_calls: dict[str, int] = defaultdict(int)
    for (_, kname), secs in kernel_time.items():
        per_kernel[kname] += secs
        per_kernel_calls[kname] += kernel_calls[(_, kname)]
    print(f"{'kernel':<18}{'calls':>6}{'ms':>8}{'%':>6}")
    for kname, secs in sorted(per_kernel.items(), key=lambda kv: -kv[1]):
        ms = secs / steps * 1e3
        if ms >= 0.05:
            print(f"{kname:<18}{per_kernel_calls[kname] // steps:>6}{ms:>8.2f}"
                  f"{100 * ms / wrapped_ms:>6.1f}")

    print("\nby (op, kernel), top 20, ms per step")
    print(f"{'phase':<6}{'op':<14}{'input shapes':<38}{'kernel':<16}{'calls':>6}{'ms':>8}")
    ranked = sorted(kernel_time.items(), key=lambda kv: -kv[1])[:20]
    for ((phase, name, shapes, _), kname), secs in ranked:
        print(f"{phase:<6}{name:<14}{shapes[:37]:<38}{kname:<16}"
              f"{kernel_calls[((phase, name, shapes, _), kname)] // steps:>6}{secs / steps * 1e3:>8.2f}")

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
    print(f"\ncProfile, {steps} steps, top 15 by own time:")
    lines = text.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    print("\n".join(line for line in lines[start:] if line.strip()))


# Kernels that call BLAS for the whole of their work: the products a step cannot avoid.
BLAS_KERNELS = ("matmul", "matmul_nt", "matmul_tn")


def profile_plans(compiled: list, call, title: str, steps: int) -> None:
    """``call()`` replaying ``compiled`` (``ta.compile``d functions), by kernel: every kernel
    their plans' generated code calls is wrapped with a timer (the plans' globals, swapped
    back after), then ``call()`` runs ``steps`` times.  The BLAS kernels' share is the floor
    below which no dispatch or fusion work can take a step; the rest is what the plan's own
    kernels and Python cost."""
    for _ in range(3):
        call()
    t0 = time.perf_counter()
    for _ in range(steps):
        call()
    plain_ms = (time.perf_counter() - t0) / steps * 1e3
    kernel_time: dict[str, float] = defaultdict(float)
    kernel_calls: dict[str, int] = defaultdict(int)

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                kernel_time[name] += time.perf_counter() - t
                kernel_calls[name] += 1
        return wrapper

    swapped = []
    for plan in (plan for function in compiled for plan in function.plans):
        namespace = plan.fn.__globals__
        for name, value in list(namespace.items()):
            if callable(value) and not name.startswith("__") and not isinstance(value, type):
                swapped.append((namespace, name, value))
                namespace[name] = timed(name, value)
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            call()
        wrapped_ms = (time.perf_counter() - t0) / steps * 1e3
    finally:
        for namespace, name, value in swapped:
            namespace[name] = value
    total = sum(kernel_time.values()) / steps * 1e3
    blas = sum(t for name, t in kernel_time.items() if name in BLAS_KERNELS) / steps * 1e3
    print(f"\n== profile of the plans: {title}, {steps} calls ==")
    print(f"call: {plain_ms:.2f} ms plain, {wrapped_ms:.2f} ms with timers; inside kernels {total:.2f} ms "
          f"(BLAS products {blas:.2f} ms, the rest {total - blas:.2f} ms), "
          f"outside them {wrapped_ms - total:.2f} ms")
    print(f"{'kernel':<22}{'calls':>7}{'ms':>8}{'%':>6}{'us/call':>9}")
    for name, secs in sorted(kernel_time.items(), key=lambda kv: -kv[1]):
        ms = secs / steps * 1e3
        calls = kernel_calls[name] // steps
        print(f"{name:<22}{calls:>7}{ms:>8.2f}{100 * ms / wrapped_ms:>6.1f}{1e3 * ms / max(calls, 1):>9.1f}")
