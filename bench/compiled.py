"""ta.compile against eager and against PyTorch eager, same weights, float32, same run:

    tiny            ``(a*b + a).sum()`` forward and backward on two (4,) tensors, in us: what a
                    replay costs per call beyond its kernels (the issue's target: compiled
                    <= 0.2x torch eager).
    mlp             a training step of an MLP (64 -> 256 -> 256 -> 10, ReLU, batch 64,
                    cross-entropy, Adam): zero_grad, loss, backward, update, in ms.
    encoder layer   ta.nn.TransformerEncoderLayer(d_model 128, 4 heads, feed-forward 512,
                    dropout 0) on a (32, 20, 128) batch, loss mean(y**2), backward, Adam, in ms;
                    torch.nn.TransformerEncoderLayer(batch_first=True) with the same weights.
    transformer     the training step of bench/transformer.py (ta.models.Transformer d_model 128,
                    4 heads, 2+2 layers, feed-forward 512, batch 32, lengths 20, Adam), in ms;
                    skipped with a note when the capture refuses the model's step.  Also
                    ``fused``: the step under ta.compile(fuse=True), with its same-repeat ratio
                    to the unfused compiled step.
    chains          (only with --only chains) fused against unfused replay of single elementwise
                    chains at 64 to 262,144 elements, float32 and float64: the figures behind
                    compiler/fuse.py's "cpu" rules (MIN_ELEMENTS, transcendental members);
                    with --backward, each chain's sum backpropagated too (fused: the chain's
                    composed derivative, one kernel per leaf).

The training steps also time ``torch.compile`` (Inductor on CPU) of the torch twin's loss, its
backward compiled through AOTAutograd, Adam eager (``inductor``): a contender, not a target.
Its compile (the first call) is reported apart from the per-step time; where Inductor fails,
one line says why and the bench goes on without it (``--no-inductor`` leaves it out).

Each compiled step is first checked against an eager twin (three steps from the same weights:
the parameters must agree bitwise unfused; fused, their largest relative difference is
printed) and its capture is timed.
Contenders alternate within each repeat; ratios are of medians from the same run (absolute
times drift by 25-40% between runs on shared machines).

Run:  .venv/bin/python bench/compiled.py [--repeats 7] [--budget 0.2] [--threads 1|2]
          [--only tiny|mlp|layer|transformer|chains] [--dtypes float32,float64] [--backward]
          [--no-inductor]
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import sys
import time

import numpy as np
from timing import cpu_model, cpu_seconds, others_note, run_alternating, set_threads
from transformer import batch as transformer_batch
from transformer import engine_model as transformer_model

import tinygrad_attn as ta
from tinygrad_attn import functional as F

try:
    import torch
except ImportError:  # time ours alone
    torch = None

CHECK_STEPS = 3


def report(times: dict) -> None:
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, value in med.items():
        spread = f"{min(times[name]):.2f}-{max(times[name]):.2f}"
        line = f"  {name:<10} {value:9.2f}   (repeats {spread})"
        ratios = [f"{med[name] / med[other]:.2f}x {other}" for other in ("eager", "torch")
                  if other in med and other != name and name != "torch"]
        if name == "compiled" and "inductor" in med:
            ratios.append(f"{med[name] / med['inductor']:.2f}x inductor")
        if name == "fused" and "compiled" in med:
            pairs = zip(times["fused"], times["compiled"], strict=True)
            same_run = statistics.median(f / c for f, c in pairs)
            ratios.append(f"{same_run:.2f}x compiled (median of same-repeat ratios)")
        if ratios:
            line += "   takes " + ", ".join(ratios)
        print(line)


def twins(make, count: int = 2):
    """Engine models with the same weights: compiled, eager (and compiled with fusion)."""
    ta.manual_seed(0)
    models = [make() for _ in range(count)]
    for other in models[1:]:
        other.load_state_dict(models[0].state_dict())
    return models


def check_and_capture(compiled_step, eager_step, compiled_params, eager_params, inputs) -> None:
    """Time the capture, then hold the compiled steps to the eager ones, parameter by parameter
    (a step compiled with fusion differs by rounding: its worst relative difference is shown)."""
    t0 = time.perf_counter()
    compiled_step(*inputs)
    capture = time.perf_counter() - t0
    eager_step(*inputs)
    for _ in range(CHECK_STEPS - 1):
        compiled_step(*inputs)
        eager_step(*inputs)
    worst = max(float(np.abs(p.numpy() - q.numpy()).max() / max(np.abs(q.numpy()).max(), 1e-30))
                for p, q in zip(compiled_params, eager_params, strict=True))
    name = "fused" if compiled_step.fuse else "compiled"
    fused = sum(len(plan.chains) for plan in compiled_step.plans[-1:])
    print(f"  {name}: first capture {capture * 1e3:.0f} ms; {compiled_step.stats.captures} captures, "
          f"{compiled_step.plans[-1].calls} kernel calls a replay" + (f" ({fused} fused)" if fused else "")
          + f"; after {CHECK_STEPS} steps its parameters and eager's "
          + ("agree bitwise" if worst == 0.0 else f"differ by up to {worst:.3g} (relative)"))


def bench_tiny(args) -> None:
    print("tiny (a*b+a).sum() forward+backward, us:")
    rng = np.random.default_rng(0)
    an, bn = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    a, b = ta.Tensor(an, requires_grad=True), ta.Tensor(bn, requires_grad=True)

    def f(a, b):
        loss = (a * b + a).sum()
        loss.backward()
        return loss

    step = ta.compile(f)

    def compiled():
        a._grad = b._grad = None
        step(a, b)

    def eager():
        a._grad = b._grad = None
        f(a, b)

    for _ in range(2):                           # capture, then replay
        a._grad = b._grad = None
        loss = step(a, b)
    if not (np.isclose(loss.item(), (an * bn + an).sum(), rtol=1e-6)
            and np.allclose(a.grad.numpy(), bn + 1) and np.allclose(b.grad.numpy(), an)):
        sys.exit("the compiled tiny step disagrees with numpy")
    print(f"  {step.plans[-1].calls} kernel calls a replay")
    contenders = {"eager": eager, "compiled": compiled}
    if torch is not None:
        ta_, tb = (torch.tensor(v, requires_grad=True) for v in (an, bn))

        def torch_step():
            ta_.grad = tb.grad = None
            (ta_ * tb + ta_).sum().backward()

        contenders["torch"] = torch_step
    report(run_alternating(contenders, args.repeats, args.budget, unit=1e6))


class MLP(ta.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = ta.nn.Linear(64, 256), ta.nn.Linear(256, 256), ta.nn.Linear(256, 10)

    def forward(self, x):
        return self.fc3(self.fc2(self.fc1(x).relu()).relu())


def engine_steps(models, loss_of, inputs):
    """(compiled step, eager step) over twin models, each with its own Adam; with four twins,
    (compiled, eager, compiled with fusion): the fourth is the fused step's eager twin."""
    optimizers = [ta.optim.Adam(m.parameters(), lr=1e-3) for m in models]

    def step_of(model, optimizer):
        def step(*args):
            optimizer.zero_grad()
            loss = loss_of(model, *args)
            loss.backward()
            optimizer.step()
            return loss
        return step

    compiled = ta.compile(step_of(models[0], optimizers[0]))
    eager = step_of(models[1], optimizers[1])
    check_and_capture(compiled, eager, models[0].parameters(), models[1].parameters(), inputs)
    if len(models) < 4:
        return compiled, eager
    fused = ta.compile(step_of(models[2], optimizers[2]), fuse=True)
    check_and_capture(fused, step_of(models[3], optimizers[3]), models[2].parameters(),
                      models[3].parameters(), inputs)
    return compiled, eager, fused


def torch_step(model, loss_of, inputs):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad()
        loss = loss_of(model, *inputs)
        loss.backward()
        optimizer.step()

    return step


def _inductor_step(make_twin, loss_of, inputs):
    """torch.compile (Inductor, CPU) of a fresh torch twin's loss: the forward and, through
    AOTAutograd, the backward compiled; zero_grad and Adam's update stay eager, as the
    tutorials train a compiled model.  Returns (step, seconds of the first call: the compile,
    the first step's loss against the eager twin's) or (None, why, None) when it fails here."""
    try:
        twin = make_twin()
        optimizer = torch.optim.Adam(twin.parameters(), lr=1e-3)
        with torch.no_grad():
            want = float(loss_of(twin, *inputs))
        compiled_loss = torch.compile(lambda *xs: loss_of(twin, *xs))

        def step():
            optimizer.zero_grad()
            loss = compiled_loss(*inputs)
            loss.backward()
            optimizer.step()
            return loss

        # Graph breaks are counted and reported in one line, not logged at length.
        torch._logging.set_logs(dynamo=logging.ERROR)
        torch._dynamo.utils.counters["graph_break"].clear()
        t0 = time.perf_counter()
        got = float(step().detach())
        seconds = time.perf_counter() - t0
        step()              # a second call: any recompile (the gradients now exist) is paid here
        return step, seconds, (got, want)
    except Exception as error:  # noqa: BLE001 - any failure of Inductor here is reported, not fatal
        text = str(error).strip().splitlines()
        return None, f"{type(error).__name__}: {text[0] if text else ''}"[:200], None


def _add_inductor(args, contenders: dict, make_twin, loss_of, inputs) -> None:
    if torch is None or args.no_inductor:
        return
    step, seconds, losses = _inductor_step(make_twin, loss_of, inputs)
    if step is None:
        print(f"  torch.compile: failed here, left out ({seconds})")
        return
    got, want = losses
    breaks = torch._dynamo.utils.counters["graph_break"]
    why = f": {next(iter(breaks)).splitlines()[0][:100]}" if breaks else ""
    print(f"  torch.compile (Inductor): first call {seconds:.1f} s (the compile); its first loss "
          f"{got:.6f} against torch eager's {want:.6f}; {sum(breaks.values())} graph breaks{why}")
    contenders["inductor"] = step


def _bench_module(args, title, make, make_torch, loss_of, torch_loss_of, arrays) -> None:
    print(f"{title}:")
    models = twins(make)
    inputs = tuple(ta.Tensor(a) for a in arrays)
    compiled, eager = engine_steps(models, loss_of, inputs)
    contenders = {"eager": lambda: eager(*inputs), "compiled": lambda: compiled(*inputs)}
    if torch is not None:
        twin = make_torch()
        twin.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in models[1].state_dict().items()})
        torch_inputs = tuple(torch.from_numpy(a) for a in arrays)
        contenders["torch"] = torch_step(twin, torch_loss_of, torch_inputs)
        state = {k: torch.from_numpy(v.copy()) for k, v in models[1].state_dict().items()}

        def make_twin():
            other = make_torch()
            other.load_state_dict(state)
            return other

        _add_inductor(args, contenders, make_twin, torch_loss_of, torch_inputs)
    report(run_alternating(contenders, args.repeats, args.budget))


def bench_mlp(args) -> None:
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((64, 64)).astype(np.float32), rng.integers(0, 10, 64)

    def make_torch():
        class TorchMLP(torch.nn.Module):            # the engine's parameter names
            def __init__(self):
                super().__init__()
                linear = torch.nn.Linear
                self.fc1, self.fc2, self.fc3 = linear(64, 256), linear(256, 256), linear(256, 10)

            def forward(self, x):
                return self.fc3(self.fc2(self.fc1(x).relu()).relu())

        return TorchMLP()

    _bench_module(args, "mlp 64-256-256-10 training step (batch 64, Adam), ms", MLP, make_torch,
                  lambda m, x, y: F.cross_entropy(m(x), y),
                  lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), (x, y))


def bench_layer(args) -> None:
    x = np.random.default_rng(2).standard_normal((32, 20, 128)).astype(np.float32)
    _bench_module(
        args, "encoder layer (d_model 128, 4 heads, ff 512; batch 32, length 20) step with Adam, ms",
        lambda: ta.nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, dropout=0.0),
        lambda: torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True),
        lambda m, x: (m(x) ** 2).mean(), lambda m, x: (m(x) ** 2).mean(), (x,))


def bench_transformer(args) -> None:
    print("transformer (d_model 128, 4 heads, 2+2 layers, ff 512; batch 32, lengths 20) step, ms:")
    models = twins(transformer_model, 4)
    arrays = transformer_batch()
    inputs = tuple(ta.Tensor(a) for a in arrays)
    try:
        compiled, eager, fused = engine_steps(models, lambda m, *ids: m.loss(*ids), inputs)
    except ta.CaptureError as error:
        print(f"  skipped: the capture refuses the model's step: {error}")
        return
    contenders = {"eager": lambda: eager(*inputs), "compiled": lambda: compiled(*inputs),
                  "fused": lambda: fused(*inputs)}
    if torch is not None:
        twin = models[1].to_torch()
        torch_inputs = tuple(torch.from_numpy(a) for a in arrays)
        contenders["torch"] = torch_step(twin, lambda m, *ids: m.loss(*ids), torch_inputs)
        _add_inductor(args, contenders, models[1].to_torch, lambda m, *ids: m.loss(*ids), torch_inputs)
    report(run_alternating(contenders, args.repeats, args.budget))


def _gelu_tanh(x):
    inner = (x + x * x * x * 0.044715) * float(np.sqrt(2.0 / np.pi))
    return x * 0.5 * (inner.tanh() + 1.0)


CHAINS = {
    "a*b+a": lambda a, b: a * b + a,
    "(a-b)*(a+b)*a": lambda a, b: (a - b) * (a + b) * a,
    "tanh(a*b)+b": lambda a, b: (a * b).tanh() + b,
    "exp(a-b)*b": lambda a, b: (a - b).exp() * b,
    "a*0.5+b": lambda a, b: a * 0.5 + b,
    "gelu_tanh(a)*b": lambda a, b: _gelu_tanh(a) * b,
}


def _with_backward(fn):
    """``fn``'s output summed and backpropagated: with fusion, the chain's backward is its
    composed derivative (compiler/fuse_backward.py)."""
    def step(a, b):
        loss = fn(a, b).sum()
        loss.backward()
        return loss

    return step


def _chain_call(step, a, b):
    a._grad = b._grad = None
    out = step(a, b)
    return (out,) if a.grad is None else (a.grad, b.grad)


def bench_chains(args) -> None:
    """Fused against unfused replay of one elementwise chain (forward alone, under no_grad;
    with --backward, forward and backward), at sizes from 64 to 262,144 elements: where one
    Numba kernel beats numpy's calls."""
    from tinygrad_attn.compiler import fuse as fusing
    from tinygrad_attn.compiler import fuse_backward

    what = "forward and backward" if args.backward else "forward replay (no grad)"
    print(f"elementwise chains, {what}, us; (x) = median of same-repeat ratios to unfused"
          + ("; separately: forward and recorded backward fused apart" if args.backward else "") + ":")
    # Fuse at every size and every member here: what the cpu rules (fuse.py's two,
    # fuse_backward.py's one) were measured by.
    rules = fusing.MIN_ELEMENTS, fusing.SCALAR_MATH, fuse_backward.RECORDED_IF_TRANSCENDENTAL
    fusing.MIN_ELEMENTS, fusing.SCALAR_MATH, fuse_backward.RECORDED_IF_TRANSCENDENTAL = 0, {}, ()
    try:
        for dtype in args.dtypes.split(","):
            for name, fn in CHAINS.items():
                if args.chain and name not in args.chain:
                    continue
                for n in (64, 256, 1024, 4096, 16384, 65536, 262144):
                    rng = np.random.default_rng(0)
                    a, b = (ta.Tensor(rng.uniform(-2, 2, n), dtype=dtype, requires_grad=args.backward)
                            for _ in range(2))
                    step = _with_backward(fn) if args.backward else fn
                    steps = {"unfused": ta.compile(step), "fused": ta.compile(step, fuse=True)}
                    if args.backward:          # the recorded backward fused on its own, as before
                        steps["separately"] = ta.compile(step, fuse=True)
                    with ta.enable_grad() if args.backward else ta.no_grad():
                        results = {}
                        for k, compiled in steps.items():
                            fuse_backward.COMPOSED = k != "separately"
                            results[k] = [t.numpy() for t in _chain_call(compiled, a, b)]
                        fuse_backward.COMPOSED = True
                        assert "= fused_" in steps["fused"].source, steps["fused"].source
                        tol = 1e-5 if dtype == "float32" else 1e-12
                        equal = all(np.allclose(g, w, rtol=tol, atol=1e-6) for k in results
                                    for w, g in zip(results["unfused"], results[k], strict=True))
                        times = run_alternating({k: functools.partial(_chain_call, s, a, b)
                                                 for k, s in steps.items()},
                                                args.repeats, args.budget / 4, unit=1e6)
                    base = times["unfused"]
                    line = f"  {name:<15} {dtype} n={n:<7d} unfused {statistics.median(base):9.2f}"
                    for k in list(steps)[1:]:
                        ratio = statistics.median(f / u for f, u in zip(times[k], base, strict=True))
                        line += f"  {k} {statistics.median(times[k]):9.2f} ({ratio:.2f}x)"
                    print(line + ("" if equal else "  NOT EQUAL"), flush=True)
    finally:
        fusing.MIN_ELEMENTS, fusing.SCALAR_MATH, fuse_backward.RECORDED_IF_TRANSCENDENTAL = rules


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=None, help="pin every thread pool to N")
    parser.add_argument("--only", choices=["tiny", "mlp", "layer", "transformer", "chains"], default=None)
    parser.add_argument("--dtypes", default="float32,float64", help="the chains' dtypes")
    parser.add_argument("--chain", action="append", choices=list(CHAINS), help="only these chains")
    parser.add_argument("--backward", action="store_true",
                        help="the chains forward and backward (fused: the composed derivative)")
    parser.add_argument("--no-inductor", action="store_true",
                        help="leave out torch.compile (its compile takes seconds to minutes a step)")
    args = parser.parse_args(argv)
    if args.threads:
        set_threads(args.threads, torch)
    threads = args.threads or "default"
    print(f"# ta.compile against eager and torch eager, float32, threads {threads}; {cpu_model()}")
    if torch is None:
        print("# torch is not installed: the engine is timed alone")
    since = cpu_seconds()
    benches = {"tiny": bench_tiny, "mlp": bench_mlp, "layer": bench_layer, "transformer": bench_transformer,
               "chains": bench_chains}
    for name, bench in benches.items():
        if args.only == name or args.only is None and name != "chains":
            bench(args)
    others_note(since, "during the run")


if __name__ == "__main__":
    main()
