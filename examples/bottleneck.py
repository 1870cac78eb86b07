"""The lecture notes' central claim as an experiment: the encoder's final state is a bottleneck,
and attention removes it.

A plain encoder-decoder squeezes the whole source into the encoder's last state s_0, and
the decoder sees nothing else; so "the final state is incapable of remembering a long
sequence" (seed 004).  With attention every decoder step looks at every encoder state h_j,
so nothing has to fit in one vector.

The experiment trains the same GRU seq2seq twice per length, with additive (Bahdanau)
attention and without, on the ``copy`` task ("fbacq" -> "fbacq", 20 letters) at lengths 5,
10, 20, 30 and 40.  Every run gets the same budget: the same hyperparameters, optimizer
steps, batch size, data and seed; only ``attention`` differs.  It reports held-out
accuracy (greedy decoding on test sequences never seen in training):

    token accuracy   the share of target positions predicted right (chance is 1/20 = 0.05)
    exact match      the share of sequences copied without a single mistake

Run:  python examples/bottleneck.py [--lengths 5 10 20 30 40] [--steps 1200] [--hidden 64]
          [--seed 0] [--out bottleneck.md] [--plot bottleneck.png] [--quick]

It prints one line per run, then the table, and writes the table to ``--out`` and, when
matplotlib is installed, a plot of token accuracy against length to ``--plot``.

Measured on this project's 2-core machine, shared with other jobs (load average about 3),
with the defaults: embed 32, hidden 64, Adam lr 5e-3 held for the first half and decayed
linearly to 0 over the second, batch 64, 1200 steps per run, 10,000 training and 500
held-out sequences, seed 0.  The 10 runs took 379 s of wall time (attention runs 10-110 s
each, growing with length; plain runs 6-43 s):

    | length | no attention: token acc | exact match | attention: token acc | exact match |
    |-------:|------------------------:|------------:|---------------------:|------------:|
    |      5 |                   0.996 |       0.988 |                1.000 |       1.000 |
    |     10 |                   0.718 |       0.292 |                1.000 |       1.000 |
    |     20 |                   0.182 |       0.000 |                1.000 |       1.000 |
    |     30 |                   0.086 |       0.000 |                1.000 |       1.000 |
    |     40 |                   0.083 |       0.000 |                1.000 |       1.000 |

Without attention, accuracy falls with length (0.18 at 20) to near chance (0.05) at 30 and
40: everything the decoder learns about the source passes through the 64 numbers of s_0,
and packing 20 or more letters into them and unpacking them in order is out of reach at
this budget.
With attention each step reads the letter it needs from h_j, and every length is copied
exactly.
The plain model is not at its best: more steps or a bigger state would raise its numbers at
length 10, but at an equal budget the gap is the bottleneck's.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    # The matrices here are small (batch 64, hidden 64): BLAS and Numba thread pools cost more
    # in hand-offs than they save, and on a busy 2-core machine their spinning threads fight
    # for the cores (one training step measured 5x slower).  The pools read these once, when
    # numpy and numba load, so they must be set before the imports below.
    for _variable in ("OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import tinygrad_attn as ta  # noqa: E402

VARIANTS = {"no attention": None, "attention": "additive"}

# The full experiment: about 6 minutes on a busy 2-core machine.
FULL = dict(steps=1200, hidden=64, embed=32, batch_size=64, lr=5e-3, n_train=10_000, n_test=500)
# Enough to exercise every code path in seconds; the numbers mean nothing.
QUICK = dict(steps=5, hidden=8, embed=8, batch_size=8, lr=5e-3, n_train=64, n_test=16)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[5, 10, 20, 30, 40],
                        help="copy-task sequence lengths (default: 5 10 20 30 40)")
    parser.add_argument("--steps", type=int, help=f"optimizer steps per run (default {FULL['steps']})")
    parser.add_argument("--hidden", type=int, help=f"GRU state size (default {FULL['hidden']})")
    parser.add_argument("--seed", type=int, default=0, help="data, initialisation and batch order")
    parser.add_argument("--quick", action="store_true", help="a tiny budget, to check the script runs")
    parser.add_argument("--out", default="bottleneck.md", help="the markdown table (default bottleneck.md)")
    parser.add_argument("--plot", default="bottleneck.png",
                        help="accuracy vs length, PNG, written when matplotlib is installed")
    return parser.parse_args(argv)


def settings(args: argparse.Namespace) -> dict:
    config = dict(QUICK if args.quick else FULL)
    if args.steps is not None:
        config["steps"] = args.steps
    if args.hidden is not None:
        config["hidden"] = args.hidden
    return config


def linear_decay(optimizer: ta.optim.Optimizer, lr: float, steps: int):
    """A train() callback: lr held for the first half, then down linearly to 0, so that
    no run is judged on the weights of a late loss spike (both variants get the same)."""
    half = steps / 2

    def callback(record: dict) -> None:
        optimizer.lr = lr * min(1.0, (steps - record["step"]) / half)

    return callback


def run(length: int, attention: str | None, config: dict, seed: int) -> dict:
    """Train one model on copy at ``length`` and evaluate it on the held-out sequences."""
    task = ta.data.load("copy", length=length, n_train=config["n_train"], n_test=config["n_test"],
                        seed=seed)
    ta.manual_seed(seed)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=config["embed"],
                              hidden=config["hidden"], cell="gru", attention=attention,
                              style="bahdanau")
    optimizer = ta.optim.Adam(model.parameters(), lr=config["lr"])
    history = ta.models.train(model, task, steps=config["steps"], batch_size=config["batch_size"],
                              seed=seed, optimizer=optimizer,
                              callback=linear_decay(optimizer, config["lr"], config["steps"]))
    metrics, rows = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab, return_outputs=True)
    metrics["token_accuracy"] = token_accuracy(rows)
    metrics["final_loss"] = history[-1]["loss"]
    return metrics


def token_accuracy(rows) -> float:
    """Positions predicted right over max(len(target), len(output)), summed over the test set:
    an output too short or too long counts its missing or extra positions wrong.  Copy has one
    target per source, so each row's references are one list."""
    correct = total = 0
    for _, output, (target,) in rows:
        correct += sum(a == b for a, b in zip(output, target, strict=False))
        total += max(len(target), len(output))
    return correct / max(total, 1)


def table(results: dict, lengths: list[int]) -> str:
    """A markdown table, one row per length; ``results[(variant, length)]`` holds metrics."""
    header = "| length |" + "".join(f" {variant}: token acc | exact match |" for variant in VARIANTS)
    rule = "|-------:|" + "".join(f"{'-' * (len(variant) + 12)}:|------------:|" for variant in VARIANTS)
    rows = [header, rule]
    for length in lengths:
        cells = [f"| {length:>6} |"]
        for variant in VARIANTS:
            metrics = results[(variant, length)]
            width = len(variant) + 11
            cells.append(f" {metrics['token_accuracy']:>{width}.3f} | {metrics['exact_match']:>11.3f} |")
        rows.append("".join(cells))
    return "\n".join(rows)


def plot(results: dict, lengths: list[int], path: str) -> None:
    """Token accuracy against length, one line per variant."""
    try:
        import matplotlib

        matplotlib.use("Agg")        # no display needed: the figure only goes to a file
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path}")
        return
    figure, axes = plt.subplots(figsize=(5, 3.5))
    for variant in VARIANTS:
        accuracy = [results[(variant, length)]["token_accuracy"] for length in lengths]
        axes.plot(lengths, accuracy, marker="o", label=variant)
    axes.set_xlabel("sequence length (copy task)")
    axes.set_ylabel("held-out token accuracy")
    axes.set_ylim(0, 1.02)
    axes.legend()
    axes.set_title("GRU seq2seq, equal training budget")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    print(f"plot written to {path}")


def main(argv=None) -> dict:
    """Run the experiment; returns ``{(variant, length): metrics}``."""
    args = parse_args(argv)
    config = settings(args)
    print(f"copy task, GRU seq2seq, {config['steps']} steps of batch {config['batch_size']} per run, "
          f"embed {config['embed']}, hidden {config['hidden']}, Adam lr {config['lr']:g}, "
          f"seed {args.seed}")
    results = {}
    start = time.perf_counter()
    for length in args.lengths:
        for variant, attention in VARIANTS.items():
            run_start = time.perf_counter()
            metrics = run(length, attention, config, args.seed)
            results[(variant, length)] = metrics
            print(f"length {length:>3}  {variant:<12}  token acc {metrics['token_accuracy']:.3f}  "
                  f"exact {metrics['exact_match']:.3f}  final loss {metrics['final_loss']:.3f}  "
                  f"({time.perf_counter() - run_start:.1f} s)", flush=True)
    wall = time.perf_counter() - start

    report = table(results, args.lengths)
    print(f"\n{report}\n\n{len(results)} runs in {wall:.0f} s")
    Path(args.out).write_text(
        f"# The bottleneck: copy accuracy vs length, with and without attention\n\n"
        f"GRU seq2seq (embed {config['embed']}, hidden {config['hidden']}), {config['steps']} Adam "
        f"steps of batch {config['batch_size']} per run (lr {config['lr']:g}, linear decay over "
        f"the second half), {config['n_train']} training and {config['n_test']} held-out "
        f"sequences, seed {args.seed}; greedy decoding.  {len(results)} runs in {wall:.0f} s.\n\n"
        f"{report}\n")
    print(f"table written to {args.out}")
    plot(results, args.lengths, args.plot)
    return results


if __name__ == "__main__":
    main()
