"""The first call after a pause against a warm call, same run, alternating, float32:

    eager           the Transformer training step of bench/transformer.py (d_model 128, 4 heads,
                    2+2 layers, feed-forward 512, batch 32, lengths 20, Adam), in ms
    compiled        the same step under ta.compile, built as bench/compiled.py builds it
    translate       one line: greedy decoding of one source of length 20 (max 20 steps) by the
                    same model's shape, keys and values cached; ``translate compiled`` with
                    compile=True
    torch           torch eager's training step of the same model (model.to_torch()), for reference

For each pause in ``--idle`` and each repeat, every contender runs ``WARM_CALLS`` calls back to
back (the last one timed: the warm call), then sleeps for the pause and times one call (the call
after idle).  Contenders alternate within each repeat; the report gives medians and the ratio
after/warm.  With ``--kernels`` the compiled step's kernels are each timed, warm and after the
longest pause, and the ones that slow down most are listed.

Run:  .venv/bin/python bench/idle.py [--threads 1|2] [--idle 0 0.12 1.0] [--repeats 7]
          [--only eager compiled translate ...] [--kernels]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from compiled import engine_steps, torch_step, twins
from timing import cpu_model, cpu_seconds, others_note, set_threads
from transformer import LENGTH
from transformer import batch as transformer_batch
from transformer import engine_model as transformer_model

import tinygrad_attn as ta

try:
    import torch
except ImportError:  # time ours alone
    torch = None

WARM_CALLS = 3


def contenders(only) -> tuple[dict, object]:
    """name -> a call with no arguments, and (the compiled step, a call of it) for --kernels."""
    models = twins(transformer_model)
    arrays = transformer_batch()
    inputs = tuple(ta.Tensor(a) for a in arrays)
    compiled, eager = engine_steps(models, lambda m, *ids: m.loss(*ids), inputs)
    found = {"eager": lambda: eager(*inputs), "compiled": lambda: compiled(*inputs)}
    compiled_call = found["compiled"]
    line = arrays[0][:1]
    decoder = transformer_model()
    found["translate"] = lambda: decoder.greedy(line, max_len=LENGTH)
    found["translate compiled"] = lambda: decoder.greedy(line, max_len=LENGTH, compile=True)
    if torch is not None:
        twin = models[1].to_torch()
        torch_inputs = tuple(torch.from_numpy(a) for a in arrays)
        found["torch"] = torch_step(twin, lambda m, *ids: m.loss(*ids), torch_inputs)
    if only:
        found = {name: fn for name, fn in found.items() if name in only}
    return found, (compiled, compiled_call)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(found: dict, idle: float, repeats: int) -> dict:
    """name -> (warm times, times after ``idle`` seconds), in ms."""
    times = {name: ([], []) for name in found}
    for _ in range(repeats):
        for name, fn in found.items():
            for _ in range(WARM_CALLS - 1):
                fn()
            times[name][0].append(_timed(fn) * 1e3)
            time.sleep(idle)
            times[name][1].append(_timed(fn) * 1e3)
    return times


def report(idle: float, times: dict) -> None:
    print(f"idle {idle:g} s:")
    for name, (warm, after) in times.items():
        w, a = statistics.median(warm), statistics.median(after)
        print(f"  {name:<19} warm {w:8.2f}   after idle {a:8.2f}   ({min(after):.2f}-{max(after):.2f})"
              f"   {a / w:5.2f}x warm")


def kernel_times(compiled, call, idle: float, repeats: int) -> None:
    """Each kernel of the compiled step's plan, timed by a wrapper in the plan's namespace:
    summed per kernel name over a warm call and over a call after ``idle`` seconds."""
    plan = compiled.plans[-1]
    namespace = plan.namespace
    spent: dict = defaultdict(float)
    originals = {}

    def wrap(name, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
        return timed

    for name, value in list(namespace.items()):
        if callable(value) and name != plan.name and not isinstance(value, type):
            originals[name] = value
            namespace[name] = wrap(name, value)
    warm: dict = defaultdict(list)
    after: dict = defaultdict(list)
    try:
        for _ in range(repeats):
            for _ in range(WARM_CALLS):
                spent.clear()
                call()
            for name in originals:
                warm[name].append(spent[name] * 1e3)
            time.sleep(idle)
            spent.clear()
            call()
            for name in originals:
                after[name].append(spent[name] * 1e3)
    finally:
        namespace.update(originals)
    rows = sorted(originals, key=lambda n: statistics.median(after[n]) - statistics.median(warm[n]),
                  reverse=True)
    total_w = sum(statistics.median(warm[n]) for n in originals)
    total_a = sum(statistics.median(after[n]) for n in originals)
    print(f"compiled step's kernels after {idle:g} s idle (medians of sums per call, ms): "
          f"all kernels {total_w:.2f} warm, {total_a:.2f} after idle")
    for name in rows[:10]:
        w, a = statistics.median(warm[name]), statistics.median(after[name])
        print(f"  {name:<24} warm {w:7.2f}   after idle {a:7.2f}   (+{a - w:.2f})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--idle", type=float, nargs="+", default=[0.0, 0.12, 1.0], help="pauses, seconds")
    parser.add_argument("--threads", type=int, default=None, help="pin every thread pool to N")
    parser.add_argument("--only", nargs="+", default=None,
                        choices=["eager", "compiled", "translate", "translate compiled", "torch"])
    parser.add_argument("--kernels", action="store_true", help="time the compiled step's kernels too")
    args = parser.parse_args(argv)
    if args.threads:
        set_threads(args.threads, torch)
    print(f"# a call after idle against a warm call, float32, threads {args.threads or 'default'}; "
          f"{cpu_model()}")
    since = cpu_seconds()
    found, compiled = contenders(args.only)
    for fn in found.values():
        fn()                                     # captures and first compiles out of the way
    for idle in args.idle:
        report(idle, measure(found, idle, args.repeats))
    if args.kernels:
        kernel_times(*compiled, max(args.idle), args.repeats)
    others_note(since, "during the run")


if __name__ == "__main__":
    main()
