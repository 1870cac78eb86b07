"""What asking a Transformer for the attention of every layer and head costs: the model's
forward pass (eval, no graph) with ``need_weights=True`` against without, same run,
alternating, as the ratio of medians.  The weights come from the fused attention node's
saved log-sum-exp (``ta.attention.record``), so the model never falls back to the textbook
graph.  The issue's target: at most 1.15x.

Run:  .venv/bin/python bench/attention_weights.py [--repeats 7] [--budget 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import cpu_model, run_alternating, set_threads  # noqa: E402

import tinygrad_attn as ta  # noqa: E402

# (batch, source length, target length): the training shape, and long sequences.
SHAPES = [(32, 20, 20), (8, 128, 128), (2, 512, 512)]


def contenders(batch: int, src_len: int, tgt_len: int) -> dict:
    ta.manual_seed(0)
    model = ta.models.Transformer(40, 40, d_model=128, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                  dim_feedforward=512, dropout=0.0, max_len=max(src_len, tgt_len) + 1)
    model.eval()
    rng = np.random.default_rng(0)
    src = rng.integers(4, 40, size=(batch, src_len))
    tgt_in = rng.integers(4, 40, size=(batch, tgt_len))

    def run(need_weights):
        def step():
            with ta.no_grad():
                model(src, tgt_in, need_weights=need_weights)
        return step

    return {"plain": run(False), "weights": run(True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_threads(args.threads)
    print(f"Transformer forward (d_model 128, 4 heads, 2+2 layers, ff 512, float32), eval, ms, median of "
          f"{args.repeats}; {cpu_model()}, {args.threads} thread(s)")
    for shape in SHAPES:
        times = run_alternating(contenders(*shape), args.repeats, args.budget)
        medians = {name: statistics.median(v) for name, v in times.items()}
        ratios = sorted(w / p for w, p in zip(times["weights"], times["plain"], strict=True))
        ratio = medians["weights"] / medians["plain"]
        print(f"B={shape[0]}, S={shape[1]}, T={shape[2]}: plain {medians['plain']:.2f}, with every layer's "
              f"and head's weights {medians['weights']:.2f}; ratio {ratio:.3f}x "
              f"(per-repeat ratios {ratios[0]:.3f}-{ratios[-1]:.3f}; target <= 1.15x)")


if __name__ == "__main__":
    main()
