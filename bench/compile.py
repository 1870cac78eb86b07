"""Start-up cost of the Numba kernels: cold compile, cached start, and import-to-first-step.

Each measurement runs in a fresh Python process, with Numba's disk cache pointed at a new
empty folder (cold) or at the folder the cold run filled (cached):

    import        ``import tinygrad_attn`` alone (Numba is not imported yet).
    all kernels   every registered op's examples forward and backward on the cpu device in
                  float32 and float64, plus the fused attention and gate kernels at a size
                  that takes their parallel variants: every cpu kernel signature compiled
                  (cold) or loaded (cached).
    first step    from before ``import tinygrad_attn`` to the end of the first training step
                  of a small model (embedding, GRU cell, additive attention, multi-head
                  self-attention, output layer, cross-entropy, backward, SGD update).

PyTorch's import and first step are timed the same way for comparison when installed.

Run:  .venv/bin/python bench/compile.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

IMPORT = """
import time; t0 = time.perf_counter()
import tinygrad_attn
print(time.perf_counter() - t0)
"""

ALL_KERNELS = """
import time; t0 = time.perf_counter()
import numpy as np
import tinygrad_attn as ta
from tinygrad_attn.autograd import registry
from tinygrad_attn.compiler import get_backend

for dtype in (np.float32, np.float64):
    for name in sorted(registry):
        op = registry[name]
        for example in op.examples():
            attrs = dict(example.attrs)
            if name == "Cast":
                attrs["dtype"] = np.dtype(dtype).name
            leaves = [ta.Tensor(x, requires_grad=np.asarray(x).dtype.kind == "f",
                                dtype=dtype if np.asarray(x).dtype.kind == "f" else None)
                      for x in example.inputs]
            out = op.apply(*leaves, **attrs)
            out.backward(np.ones(out.shape, dtype=out.dtype))
    # Sizes past the kernels' serial/parallel thresholds.
    cpu = get_backend("cpu")
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(4, 8, 64)).astype(dtype), rng.normal(size=(4, 64, 64)).astype(dtype)
    cpu.additive_scores_back(q, k, q[0, 0], cpu.additive_scores(q, k, q[0, 0]))
    cpu.sdpa_back(q, k, k, *cpu.sdpa(q, k, k, None, 0.1, True), q, None, 0.1, True)
    gi = rng.normal(size=(64, 3 * 256)).astype(dtype)
    h = rng.normal(size=(64, 256)).astype(dtype)
    _, saved = cpu.gru_gates(gi, gi, h)
    cpu.gru_gates_back(saved, gi, h, h)
    lstm_gates = rng.normal(size=(64, 4 * 256)).astype(dtype)
    c, act = cpu.lstm_cell_state(lstm_gates, h)
    cpu.lstm_cell_state_back(act, h, h)
    _, act = cpu.lstm_hidden(lstm_gates, c)
    cpu.lstm_hidden_back(act, h)
print(time.perf_counter() - t0)
"""

FIRST_STEP = """
import time; t0 = time.perf_counter()
import numpy as np
import tinygrad_attn as ta
from tinygrad_attn import nn
import tinygrad_attn.functional as F

rng = np.random.default_rng(0)
B, S, E, H, V = 8, 12, 32, 32, 40
embed = ta.Tensor(rng.normal(size=(V, E)) * 0.1, requires_grad=True)
w_ih = ta.Tensor(rng.normal(size=(3 * H, E)) * 0.1, requires_grad=True)
w_hh = ta.Tensor(rng.normal(size=(3 * H, H)) * 0.1, requires_grad=True)
attention = nn.AdditiveAttention(H, H, H)
self_attention = nn.MultiHeadAttention(H, 4)
out = nn.Linear(2 * H, V)
params = [embed, w_ih, w_hh, *attention.parameters(), *self_attention.parameters(), *out.parameters()]

ids = rng.integers(0, V, size=(B, S))
x = F.embedding(ta.Tensor(ids), embed)                               # (B, S, E)
h, states = None, []
for t in range(S):
    h = F.gru_cell(x[:, t], h, w_ih, w_hh)                           # (B, H)
    states.append(h)
keys = ta.stack(states, axis=1)                                      # (B, S, H)
keys, _ = self_attention(keys, keys, keys, need_weights=False)       # (B, S, H)
context, _ = attention(h, keys)                                      # (B, H)
logits = out(ta.cat([context, h], axis=-1))                          # (B, V)
loss = F.cross_entropy(logits, ta.Tensor(ids[:, 0]))
loss.backward()
with ta.no_grad():
    for p in params:
        p.data -= 0.1 * p.grad.numpy()
print(time.perf_counter() - t0)
"""

TORCH_FIRST_STEP = """
import time; t0 = time.perf_counter()
import torch
B, S, E, H, V = 8, 12, 32, 32, 40
embed, cell = torch.nn.Embedding(V, E), torch.nn.GRUCell(E, H)
self_attention, out = torch.nn.MultiheadAttention(H, 4, batch_first=True), torch.nn.Linear(2 * H, V)
w_q, w_k = torch.nn.Linear(H, H, bias=False), torch.nn.Linear(H, H, bias=False)
v = torch.nn.Linear(H, 1, bias=False)
modules = (embed, cell, self_attention, out, w_q, w_k, v)
opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.1)
ids = torch.randint(0, V, (B, S))
x, h, states = embed(ids), torch.zeros(B, H), []
for t in range(S):
    h = cell(x[:, t], h)
    states.append(h)
keys = torch.stack(states, 1)
keys, _ = self_attention(keys, keys, keys, need_weights=False)
weights = torch.softmax(v(torch.tanh(w_q(h)[:, None] + w_k(keys))).squeeze(-1), -1)
context = (weights[:, :, None] * keys).sum(1)
loss = torch.nn.functional.cross_entropy(out(torch.cat([context, h], -1)), ids[:, 0])
loss.backward()
opt.step()
print(time.perf_counter() - t0)
"""


def run(code: str, cache_dir: str) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the measured script failed:\n{done.stderr}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the medians to this file")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"Python {platform.python_version()}")
    rows: dict[str, list[float]] = {"import": [], "all kernels, cold": [], "all kernels, cached": [],
                                    "first step, cold": [], "first step, cached": []}
    if have_torch:
        rows["torch: first step"] = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cold, tempfile.TemporaryDirectory() as cold_step:
            rows["import"].append(run(IMPORT, cold))
            rows["all kernels, cold"].append(run(ALL_KERNELS, cold))
            rows["all kernels, cached"].append(run(ALL_KERNELS, cold))
            rows["first step, cold"].append(run(FIRST_STEP, cold_step))
            rows["first step, cached"].append(run(FIRST_STEP, cold_step))
        if have_torch:
            rows["torch: first step"].append(run(TORCH_FIRST_STEP, tempfile.gettempdir()))
    print(f"{args.repeats} fresh processes each, median seconds (min-max)")
    medians = {}
    for name, values in rows.items():
        medians[name] = statistics.median(values)
        print(f"  {name:<22}{medians[name]:>8.2f} s   ({min(values):.2f}-{max(values):.2f})")
    if not have_torch:
        print("note: PyTorch is not installed (`pip install torch==2.13.0`): no torch comparison")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(medians, f, indent=1)


if __name__ == "__main__":
    main()
