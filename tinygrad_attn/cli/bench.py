"""``tinygrad-attn bench``: time training steps of a Bahdanau GRU on dates."""

from __future__ import annotations

import statistics

import numpy as np

import tinygrad_attn as ta

from .common import EXIT_OK, add_threads, positive_int, set_threads


def add_parser(commands) -> None:
    bench = commands.add_parser(
        "bench", help="time training steps of a Bahdanau GRU on dates",
        description="Time ta.models.train on dates (GRU, additive attention) and print the median "
                    "milliseconds per step and target tokens per second. For the comparison with "
                    "PyTorch on the same model, run bench/seq2seq.py from the repository.")
    bench.add_argument("--steps", type=positive_int, default=30, help="timed steps (default 30)")
    bench.add_argument("--hidden", type=positive_int, default=128, help="default 128")
    bench.add_argument("--batch-size", type=positive_int, default=32, help="default 32")
    add_threads(bench)
    bench.set_defaults(run=run)


def run(args) -> int:
    warmup = 3          # the first steps compile kernels (or load them from numba's cache)
    threads = set_threads(args.threads)
    task = ta.data.load("dates", n_train=5000, n_test=1)
    ta.manual_seed(0)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=64, hidden=args.hidden)
    history = ta.models.train(model, task, steps=args.steps + warmup, batch_size=args.batch_size)
    seconds = np.diff([0.0] + [record["seconds"] for record in history])[warmup:]
    tokens = sum(record["tokens"] for record in history[warmup:])
    print(f"dates, GRU encoder-decoder with additive attention, embed 64, hidden {args.hidden}, "
          f"batch {args.batch_size}, float32, device cpu; {threads}")
    print(f"one training step (forward, backward, clipping, Adam): "
          f"{statistics.median(seconds) * 1e3:.1f} ms median of {len(seconds)} steps "
          f"(after {warmup} warm-up steps), {tokens / seconds.sum():,.0f} target tokens/s")
    print("for the same step against PyTorch in one run, see bench/seq2seq.py in the repository")
    return EXIT_OK
