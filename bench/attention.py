"""Attention at realistic sizes: multi-head self-attention and scaled dot-product attention,
forward + backward, tinygrad_attn against PyTorch CPU.

Contenders run in the same process, alternating within each repeat, and the medians are
compared as ratios (absolute times on shared machines drift by 25-40% between runs).

    multi-head attention   B=8, T=256, E=256, H=8, float32, self-attention, forward+backward
        ta.nn.MultiHeadAttention on device "cpu" (need_weights False and True) and "numpy",
        torch.nn.MultiheadAttention(256, 8, batch_first=True) (need_weights False and True),
        with the same weights (torch's state_dict loaded into ours) and the same cotangent.
    scaled dot-product     ta.attention.scaled_dot_product vs F.scaled_dot_product_attention,
        (B, H, T, d) = (1,1,128,64), (8,8,128,64), (8,8,512,64), (4,8,1024,64), float32; "fwd"
        runs without autograd (no_grad on both sides), "fwd+bwd" records the graph and
        backpropagates.  Ours runs twice: need_weights=False (the fused ScaledDotProduct node)
        and need_weights=True (scores, MaskedSoftmax, product: the weights kept).  "numpy" is
        the naive algorithm in plain numpy: the whole score matrix, softmax, product, and the
        hand-written backward.

Before timing, ours and torch are checked to agree (outputs to 1e-4, gradients to 1e-4
relative to their largest entry), so both sides time the same computation.  Thread
settings are left as they are and printed.  Without PyTorch, ours is timed alone.

``--isolated`` times SDPA forward+backward of ours and of torch each in processes of their own
(three fresh processes each, alternating), as someone using only one of them would run it:
in one process the two frameworks' thread pools get in each other's way (PyTorch's OpenMP
threads keep spinning after each of its ops, and the engine then falls back from OpenMP to
Numba's "workqueue" threads; see compiler/numba_support.py).

``--profile`` instead breaks one MHA forward+backward of ours down by op and by kernel
(ranked), then prints a cProfile summary: where the engine spends its time.

Noise to know about on a machine with few cores:
  - anything else running makes the multi-threaded BLAS and OpenMP pools stall at their barriers
    (timings inflate erratically, torch's most of all); the CPU other processes took is printed
    before and after, and ``--threads 1`` pins every pool to one thread;
  - ours allocates ~45 MiB of large temporaries per MHA step.  The engine keeps freed memory in
    the process (compiler/allocator.py); with TINYGRAD_ATTN_KEEP_MEMORY=0 glibc hands the blocks
    back to the OS and every step page-faults them in again (``--profile`` counts the faults):
    ~90 instead of ~60 ms.  MALLOC_* variables in the environment are printed when set.

Run:  .venv/bin/python bench/attention.py [--quick] [--repeats 7] [--threads N] [--profile]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
from profiling import profile_step
from timing import THREAD_ENV, cpu_model, cpu_seconds, others_note, run_alternating, set_threads

import tinygrad_attn as ta
from tinygrad_attn.compiler import available_devices
from tinygrad_attn.nn import Parameter

try:
    if os.environ.get("TA_BENCH_WITHOUT_TORCH"):      # --isolated: ours in a process of its own
        raise ImportError
    import torch
except ImportError:  # time ours alone
    torch = None

B, T, E, H = 8, 256, 256, 8
SDPA_SHAPES = [(1, 1, 128, 64), (8, 8, 128, 64), (8, 8, 512, 64), (4, 8, 1024, 64)]
TOL = 1e-4


NOISY = ("* varied more than 1.5x between repeats: compare with care (other processes, allocator "
         "or thread-pool state; see the module docstring)")


# ---------------------------------------------------------------- machine




def blas_name() -> str:
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        return f"{blas['name']} {blas.get('version', '')}".strip()
    except (AttributeError, KeyError, TypeError):
        return "unknown BLAS"








def print_machine(threads_flag: int | None) -> None:
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores ({platform.machine()}); "
          f"python {platform.python_version()}, numpy {np.__version__} ({blas_name()}), "
          f"torch {torch.__version__ if torch else 'not installed'}")
    env = {k: os.environ[k] for k in THREAD_ENV if k in os.environ}
    how = f"set by --threads {threads_flag}" if threads_flag else "left as found"
    threads = f"torch.get_num_threads() = {torch.get_num_threads()}" if torch else "torch absent"
    print(f"threads ({how}): {threads}; thread env: {env or 'none set (BLAS uses every core)'}")
    keep = os.environ.get("TINYGRAD_ATTN_KEEP_MEMORY", "1") != "0"
    print(f"engine keeps freed memory (compiler/allocator.py): {'yes' if keep else 'no'}")
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    if malloc:
        print(f"glibc malloc tuning from the environment: {malloc}")
    since = cpu_seconds()
    time.sleep(1.0)
    others_note(since, "in the second before timing")




# ---------------------------------------------------------------- timing






def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))


def check(what: str, ours: np.ndarray, ref: np.ndarray, relative: bool = False) -> bool:
    err = rel_err(ours, ref) if relative else float(np.abs(ours - ref).max())
    ok = err <= TOL
    kind = "max rel err" if relative else "max abs err"
    print(f"  {'ok  ' if ok else 'FAIL'} {what:<52}{kind} {err:.2e}")
    return ok


# ---------------------------------------------------------------- multi-head attention


def module_on(module, device: str):
    """Re-create every parameter of ``module`` on ``device`` (Module has no .to(); parameters
    are replaced by new Parameters with the same values and names)."""
    for _, sub in module.named_modules():
        for name, p in list(sub._parameters.items()):
            if p is None:
                continue
            moved = Parameter(p.numpy(), dtype=p.dtype, device=device)
            full_name = p.name
            setattr(sub, name, moved)
            moved.name = full_name
    return module


def mha_inputs():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, E)).astype(np.float32)
    g = rng.standard_normal((B, T, E)).astype(np.float32)
    return x, g


def torch_mha():
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(E, H, batch_first=True)
    with torch.no_grad():          # non-zero biases, so the bias paths are compared too
        tm.in_proj_bias.normal_(0.0, 0.1)
        tm.out_proj.bias.normal_(0.0, 0.1)
    return tm


def ours_mha(state, device: str):
    m = ta.nn.MultiHeadAttention(E, H)
    if state is not None:
        m.load_state_dict(state)
    if device != "cpu":
        module_on(m, device)
    return m


def ours_mha_step(m, x: np.ndarray, g: np.ndarray, device: str, need_weights: bool):
    xt = ta.Tensor(x, requires_grad=True, device=device)
    gt = ta.Tensor(g, device=device)

    def step():
        m.zero_grad()
        xt.grad = None
        out, _ = m(xt, xt, xt, need_weights=need_weights)
        out.backward(gt)

    return step, xt


def torch_mha_step(tm, x: np.ndarray, g: np.ndarray, need_weights: bool):
    xt = torch.tensor(x, requires_grad=True)
    gt = torch.tensor(g)

    def step():
        tm.zero_grad(set_to_none=True)
        xt.grad = None
        out, _ = tm(xt, xt, xt, need_weights=need_weights)
        out.backward(gt)

    return step, xt


def verify_mha(m, tm, x, g) -> bool:
    """Ours and torch agree on outputs, weights and every gradient (one step each)."""
    print("verify (ours cpu vs torch, MHA, float32):")
    ok = True
    for need_weights in (False, True):
        for mod in (m, tm):
            mod.zero_grad()
        xo = ta.Tensor(x, requires_grad=True)
        xt = torch.tensor(x, requires_grad=True)
        oo, wo = m(xo, xo, xo, need_weights=need_weights)
        ot, wt = tm(xt, xt, xt, need_weights=need_weights)
        oo.backward(ta.Tensor(g))
        ot.backward(torch.tensor(g))
        tag = f"need_weights={need_weights}"
        ok &= check(f"output ({tag})", oo.numpy(), ot.detach().numpy())
        if need_weights:
            ok &= check("averaged weights", wo.numpy(), wt.detach().numpy())
        ok &= check(f"d input ({tag})", xo.grad.numpy(), xt.grad.numpy(), relative=True)
        ours_params = dict(m.named_parameters())
        for name, p in tm.named_parameters():
            ok &= check(f"d {name} ({tag})", ours_params[name].grad.numpy(), p.grad.numpy(),
                        relative=True)
    m.zero_grad()
    tm.zero_grad()
    return ok


def bench_mha(repeats: int, budget_s: float) -> None:
    print(f"\n== multi-head attention: self-attention B={B} T={T} E={E} H={H} float32, "
          f"forward+backward ==")
    x, g = mha_inputs()
    tm = torch_mha() if torch else None
    state = tm.state_dict() if tm is not None else None
    contenders = {}
    m_cpu = ours_mha(state, "cpu")
    state = m_cpu.state_dict() if state is None else state     # the numpy copy gets the same weights
    if tm is not None and not verify_mha(m_cpu, tm, x, g):
        sys.exit("ours and torch disagree: not timing different computations")
    contenders["ours[cpu] need_weights=False"] = ours_mha_step(m_cpu, x, g, "cpu", False)[0]
    contenders["ours[cpu] need_weights=True"] = ours_mha_step(m_cpu, x, g, "cpu", True)[0]
    if "numpy" in available_devices():
        m_np = ours_mha(state, "numpy")
        step, _ = ours_mha_step(m_np, x, g, "numpy", False)
        out_np = m_np(*(ta.Tensor(x, device="numpy"),) * 3, need_weights=False)[0].numpy()
        out_cpu = m_cpu(*(ta.Tensor(x),) * 3, need_weights=False)[0].numpy()
        if np.abs(out_np - out_cpu).max() <= TOL:
            contenders["ours[numpy] need_weights=False"] = step
        else:
            print("note: device 'numpy' output differs from 'cpu'; not timing it")
    else:
        print("note: no 'numpy' device registered; not timing it")
    if tm is not None:
        contenders["torch need_weights=False"] = torch_mha_step(tm, x, g, False)[0]
        contenders["torch need_weights=True"] = torch_mha_step(tm, x, g, True)[0]
    else:
        print("note: PyTorch is not installed (`pip install torch==2.13.0`); timing ours only")

    times = run_alternating(contenders, repeats, budget_s)
    medians = {name: statistics.median(v) for name, v in times.items()}
    print(f"{repeats} repeats, medians of ms per forward+backward (min..max over repeats)"
          + ("; ratios are ours/torch" if tm is not None else ""))
    header = f"{'contender':<32}{'median ms':>10}{'min..max':>18}"
    if tm is not None:
        header += f"{'vs torch nw=F':>15}{'vs torch same nw':>18}"
    print(header)
    for name, values in times.items():
        line = f"{name:<32}{medians[name]:>10.1f}{f'{min(values):.1f}..{max(values):.1f}':>18}"
        if tm is not None:
            same = "torch need_weights=" + ("True" if "need_weights=True" in name else "False")
            line += f"{medians[name] / medians['torch need_weights=False']:>14.2f}x"
            line += f"{medians[name] / medians[same]:>17.2f}x"
        print(line + ("  *" if max(values) > 1.5 * min(values) else ""))
    if any(max(v) > 1.5 * min(v) for v in times.values()):
        print(NOISY)


# ---------------------------------------------------------------- scaled dot-product attention


def sdpa_arrays(shape):
    rng = np.random.default_rng(sum(shape))
    q, k, v, g = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    return q, k, v, g


def ours_sdpa(arrays, backward: bool, need_weights: bool = False):
    q, k, v, g = arrays
    ts = [ta.Tensor(a, requires_grad=backward) for a in (q, k, v)]
    gt = ta.Tensor(g)
    if backward:
        def step():
            for t in ts:
                t.grad = None
            out, _ = ta.attention.scaled_dot_product(*ts, need_weights=need_weights)
            out.backward(gt)
    else:
        def step():
            with ta.no_grad():
                ta.attention.scaled_dot_product(*ts, need_weights=need_weights)
    return step, ts


def numpy_sdpa(arrays, backward: bool):
    """The naive algorithm: full (B, H, T, T) scores and weights, backward by hand."""
    q, k, v, g = arrays
    scale = np.float32(1.0 / np.sqrt(q.shape[-1]))

    def forward():
        s = (q * scale) @ np.swapaxes(k, -1, -2)                             # (B, H, T, T)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        return p, p @ v                                                     # (B, H, T, d)

    def forward_backward():
        p, _ = forward()
        dv = np.swapaxes(p, -1, -2) @ g
        dp = g @ np.swapaxes(v, -1, -2)                                     # (B, H, T, T)
        ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
        dq = ds @ k * scale
        dk = np.swapaxes(ds, -1, -2) @ q * scale
        return dq, dk, dv

    return forward_backward if backward else forward


def torch_sdpa(arrays, backward: bool):
    q, k, v, g = arrays
    ts = [torch.tensor(a, requires_grad=backward) for a in (q, k, v)]
    gt = torch.tensor(g)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if backward:
        def step():
            for t in ts:
                t.grad = None
            sdpa(*ts).backward(gt)
    else:
        def step():
            with torch.no_grad():
                sdpa(*ts)
    return step, ts


def verify_sdpa(shape, arrays) -> bool:
    """Ours (both paths) against torch, and the naive numpy gradients against ours."""
    ok = True
    grads = None
    for need_weights in (False, True):
        step_o, ours = ours_sdpa(arrays, True, need_weights)
        out_o = ta.attention.scaled_dot_product(*ours, need_weights=need_weights)[0].numpy()
        step_o()
        grads = [t.grad.numpy() for t in ours]
        if torch is not None:
            step_t, theirs = torch_sdpa(arrays, True)
            with torch.no_grad():
                out_t = torch.nn.functional.scaled_dot_product_attention(*theirs).numpy()
            step_t()
            ok &= check(f"sdpa output {shape} need_weights={need_weights}", out_o, out_t)
            for name, a, b in zip("qkv", ours, theirs, strict=True):
                ok &= check(f"sdpa d{name} {shape} need_weights={need_weights}", a.grad.numpy(),
                            b.grad.numpy(), relative=True)
    for name, naive, mine in zip("qkv", numpy_sdpa(arrays, True)(), grads, strict=True):
        ok &= check(f"naive numpy d{name} {shape}", naive, mine, relative=True)
    return ok


SDPA_CONTENDERS = ("ours", "ours, weights kept", "naive numpy", "torch")


def bench_sdpa(shapes, repeats: int, budget_s: float) -> None:
    print("\n== scaled dot-product attention, float32 (fwd: no autograd; fwd+bwd: backward of a "
          "fixed cotangent) ==")
    print("ours = need_weights=False (the fused node); weights kept = need_weights=True")
    rows = []
    for shape in shapes:
        arrays = sdpa_arrays(shape)
        print(f"verify {shape}:")
        if not verify_sdpa(shape, arrays):
            sys.exit("the contenders disagree: not timing different computations")
        contenders = {}
        for backward, label in ((False, "fwd"), (True, "fwd+bwd")):
            contenders[("ours", label)] = ours_sdpa(arrays, backward)[0]
            contenders[("ours, weights kept", label)] = ours_sdpa(arrays, backward, need_weights=True)[0]
            contenders[("naive numpy", label)] = numpy_sdpa(arrays, backward)
            if torch is not None:
                contenders[("torch", label)] = torch_sdpa(arrays, backward)[0]
        times = run_alternating(contenders, repeats, budget_s)
        for label in ("fwd", "fwd+bwd"):
            medians = {name: statistics.median(times[(name, label)]) for name in SDPA_CONTENDERS
                       if (name, label) in times}
            noisy = any(max(v) > 1.5 * min(v) for key, v in times.items() if key[1] == label)
            rows.append((shape, label, medians, noisy))
    if torch is None:
        print("note: PyTorch is not installed (`pip install torch==2.13.0`); no torch column")
    print(f"{repeats} repeats, medians of ms per call")
    names = [n for n in SDPA_CONTENDERS if n in rows[0][2]]
    header = f"{'(B, H, T, d)':<18}{'pass':<9}" + "".join(f"{n:>20}" for n in names)
    print(header + f"{'numpy/ours':>12}" + (f"{'ours/torch':>12}" if torch is not None else ""))
    for shape, label, medians, noisy in rows:
        line = f"{str(shape):<18}{label:<9}" + "".join(f"{medians[n]:>20.2f}" for n in names)
        line += f"{medians['naive numpy'] / medians['ours']:>11.2f}x"
        if torch is not None:
            line += f"{medians['ours'] / medians['torch']:>11.2f}x"
        print(line + ("  *" if noisy else ""))
    if any(row[-1] for row in rows):
        print(NOISY)


# ---------------------------------------------------------------- profile


def profile_mha(steps: int) -> None:
    """One MHA forward+backward of ours (cpu, need_weights=False), broken down by op and by kernel."""
    x, g = mha_inputs()
    m = ours_mha(torch_mha().state_dict() if torch else None, "cpu")
    step, _ = ours_mha_step(m, x, g, "cpu", False)
    profile_step(step, "ours[cpu] MHA forward+backward, need_weights=False", steps)


# ---------------------------------------------------------------- main


def one_contender(name: str, shape, repeats: int, budget_s: float) -> None:
    """(In a subprocess of --isolated.)  Print the median ms of one SDPA forward+backward."""
    arrays = sdpa_arrays(shape)
    step = ours_sdpa(arrays, True)[0] if name == "ours" else torch_sdpa(arrays, True)[0]
    print(statistics.median(run_alternating({name: step}, repeats, budget_s)[name]))


def bench_isolated(shapes, repeats: int, budget_s: float) -> None:
    import subprocess

    print("\n== scaled dot-product attention forward+backward, float32, each contender in fresh "
          "processes (3 each, alternating) ==")
    print(f"{'(B, H, T, d)':<18}{'ours ms':>10}{'torch ms':>10}{'ours/torch':>12}")
    for shape in shapes:
        medians = {"ours": [], "torch": []}
        for _ in range(3):
            for name in medians:
                env = dict(os.environ)
                if name == "ours":
                    env["TA_BENCH_WITHOUT_TORCH"] = "1"
                done = subprocess.run([sys.executable, __file__, "--one", name, "--shape",
                                       ",".join(map(str, shape)), "--repeats", str(repeats)],
                                      env=env, capture_output=True, text=True, check=True)
                medians[name].append(float(done.stdout.split()[-1]))
        ours, theirs = statistics.median(medians["ours"]), statistics.median(medians["torch"])
        print(f"{str(shape):<18}{ours:>10.2f}{theirs:>10.2f}{ours / theirs:>11.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="3 repeats, shorter measurements, only the smallest SDPA shape")
    parser.add_argument("--repeats", type=int, default=None, help="default 7 (3 with --quick)")
    parser.add_argument("--profile", action="store_true",
                        help="break ours' MHA forward+backward down by op and kernel instead of timing")
    parser.add_argument("--threads", type=int, default=None,
                        help="pin BLAS/OpenMP/torch to this many threads (default: leave as found)")
    parser.add_argument("--isolated", action="store_true",
                        help="SDPA forward+backward, ours and torch each in processes of their own")
    parser.add_argument("--one", choices=["ours", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    budget_s = 0.08 if args.quick else 0.3
    if args.threads:
        set_threads(args.threads, torch)

    if args.one:
        one_contender(args.one, tuple(int(n) for n in args.shape.split(",")), repeats, budget_s)
        return
    print_machine(args.threads)
    since = cpu_seconds()
    if args.isolated:
        if torch is None:
            sys.exit("--isolated compares with PyTorch, which is not installed")
        bench_isolated(SDPA_SHAPES[:1] if args.quick else SDPA_SHAPES, repeats, budget_s)
    elif args.profile:
        profile_mha(steps=5 if args.quick else 20)
    else:
        bench_mha(repeats, budget_s)
        bench_sdpa(SDPA_SHAPES[:1] if args.quick else SDPA_SHAPES, repeats, budget_s)
    others_note(since, "while this ran")


if __name__ == "__main__":
    main()
