"""``tinygrad-attn demo``: train a Bahdanau GRU on dates, translate, show attention, verify."""

from __future__ import annotations

from pathlib import Path

import tinygrad_attn as ta

from .common import (
    EXIT_FAILED,
    EXIT_OK,
    add_threads,
    positive_float,
    positive_int,
    set_threads,
    writable_directory,
)
from .train import describe_training, fit


def add_parser(commands) -> None:
    demo = commands.add_parser(
        "demo", help="train a Bahdanau GRU on dates, translate, show attention, verify gradients",
        description="Train a GRU encoder-decoder with Bahdanau (additive) attention to turn "
                    "human-written dates into YYYY-MM-DD, report its exact match on 500 held-out "
                    "dates, translate a few hand-written ones, print one attention matrix, draw "
                    "the graph and heatmaps when the viz package can, and verify the gradients "
                    "of a Bahdanau decoder step exactly with sympy. About 70 s on 2 cores.")
    demo.add_argument("--steps", type=positive_int, default=None,
                      help="training steps (default 1500; 30 with --quick)")
    demo.add_argument("--time-limit", type=positive_float, default=None, metavar="SECONDS",
                      help="stop training after this many seconds (default 120)")
    demo.add_argument("--out-dir", default="demo_out",
                      help="where the checkpoint and drawings go (default demo_out/)")
    demo.add_argument("--quick", action="store_true",
                      help="a tiny model and a few steps: checks that everything runs, learns little")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_threads(demo)
    demo.set_defaults(run=run)


DEMO_DATES = (
    ("3 may 1998", "1998-05-03"),
    ("tuesday, 12 march 2024", "2024-03-12"),
    ("25.12.2019", "2019-12-25"),
    ("july 4th, 1976", "1976-07-04"),
    ("sat jan 1 00", "2000-01-01"),
)





def run(args) -> int:
    quick = args.quick
    steps = args.steps or (30 if quick else 1500)
    time_limit = args.time_limit or (60.0 if quick else 120.0)
    embed, hidden, batch_size, lr = (8, 16, 32, 5e-3) if quick else (32, 128, 64, 5e-3)
    out_dir = writable_directory(Path(args.out_dir), "--out-dir")        # before training, not after
    threads = set_threads(args.threads)

    print("tinygrad_attn demo: a GRU encoder-decoder with Bahdanau (additive) attention learns to "
          "read dates, character by character")
    task = ta.data.load("dates", n_train=2000 if quick else 20000)
    for source, target in task.train[:3]:
        print(f"  {task.detokenize(source)!r:>28} -> {task.detokenize(target)!r}")
    ta.manual_seed(0)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=embed, hidden=hidden, cell="gru",
                              attention="additive", style="bahdanau")
    print(f"model: {model.extra_repr()}, {model.num_parameters():,} parameters; "
          f"{steps} steps of batch {batch_size} (at most {time_limit:g} s); {threads}"
          + (" -- quick: too few to learn, a check that everything runs" if quick else ""))

    history = fit(model, task, steps, batch_size, lr, seed=0, time_limit=time_limit,
                   progress=not args.no_progress)
    print(describe_training(history, steps, time_limit))
    metrics = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
    print(f"\nheld-out: {metrics['n']} dates whose calendar day never occurs in training: "
          f"exact match {metrics['exact_match']:.1%}, character error rate {metrics['token_error_rate']:.2%}")

    print("\nhand-written dates:")
    right, shown = 0, None
    for text, expected in DEMO_DATES:
        output, source, tokens, attention = ta.models.translate(model, text, task)
        right += output == expected
        verdict = "right" if output == expected else f"wrong, expected {expected}"
        print(f"  {text!r:>26} -> {output!r:<14} {verdict}")
        if shown is None:
            shown = (text, source, tokens, attention)
    text, source, tokens, attention = shown
    print(f"\nattention while translating {text!r} (rows: output characters, columns: input "
          f"characters; each row sums to 1):")
    print(ta.viz.format_attention(attention, source, tokens))

    checkpoint = out_dir / "dates.ckpt"
    ta.models.save_checkpoint(checkpoint, model, task, step=len(history), metrics=metrics)
    print(f"\nsaved the model to {checkpoint}; try: tinygrad-attn translate {checkpoint} \"20 july 1969\"")
    _demo_drawings(model, task, shown, out_dir)

    print("\ngradients: one Bahdanau decoder step, every derivative against sympy's exact one")
    report = ta.models.BahdanauStep.verify()
    print(report)

    print("\nsummary:")
    print(f"  - {describe_training(history, steps, time_limit)}")
    print(f"  - held-out exact match {metrics['exact_match']:.1%} on {metrics['n']} unseen dates; "
          f"{right} of {len(DEMO_DATES)} hand-written dates right")
    if quick:
        print("  - (--quick: too little training to read dates; run without --quick for the real thing)")
    state = (f"all match (largest error {report.max_err:.1e})" if report.ok
             else "a MISMATCH (see the report above)")
    print(f"  - symbolic gradient check of a Bahdanau step: {state}")
    return EXIT_OK if report.ok else EXIT_FAILED


def _demo_drawings(model, task, shown, out_dir: Path) -> None:
    """The attention heatmap (self-contained SVG) and the computation graph (needs dot)."""
    viz = ta.viz
    text, source, tokens, attention = shown
    path = out_dir / "attention.svg"
    viz.heatmap(attention, source, viz.row_labels(tokens, attention), path)
    print(f"wrote the attention heatmap of {text!r} to {path}")
    # The graph of the loss on one short pair, scoped encoder/t*, decoder/t*/attention; the
    # first and last 2 steps of each unroll, so it stays readable.
    source, target = min(task.test, key=lambda pair: len(pair[0]))
    batch = next(ta.data.batches([(source, target)], task.src_vocab, task.tgt_vocab, batch_size=1))
    loss = model.loss(batch.src, batch.tgt_in, batch.tgt_out)
    path = out_dir / "graph.svg"
    try:
        viz.render(loss, path, collapse=2)
    except viz.GraphvizNotFound as err:
        print(f"skipped the computation graph: {err}")
        return
    print(f"wrote the computation graph of the loss on {task.detokenize(source)!r} to {path}")
