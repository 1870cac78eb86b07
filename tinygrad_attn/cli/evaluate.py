"""``tinygrad-attn evaluate``: score a checkpoint on a file of pairs (or its task's test split)
with the field's metrics."""

from __future__ import annotations

import json
from pathlib import Path

import tinygrad_attn as ta

from ..serialize import write_text
from .common import (
    EXIT_OK,
    UsageError,
    add_beam,
    add_threads,
    beam_options,
    load_checkpoint,
    positive_int,
    set_threads,
    writable,
)
from .train import format_metrics, task_from_source


def add_parser(commands) -> None:
    evaluate = commands.add_parser(
        "evaluate", help="score a checkpoint: exact match, token error rate, BLEU, chrF (WER)",
        description="Decode every source of --data (or of the checkpoint's own test split) with the "
                    "model in CHECKPOINT and score the outputs against the targets: exact match, "
                    "token error rate (PER for phonemes, CER for characters), corpus BLEU and chrF "
                    "(sacrebleu), and, where a source has several targets, WER (the share of "
                    "sources whose output matches none). The file is tokenized as the checkpoint "
                    "was trained.")
    evaluate.add_argument("checkpoint", metavar="CHECKPOINT", help="a file written by 'tinygrad-attn train'")
    evaluate.add_argument("--data", default=None, metavar="TSV",
                          help="source<TAB>target pairs (default: the test split of the run's own data)")
    add_beam(evaluate)
    evaluate.add_argument("--max-len", type=positive_int, default=None, metavar="N",
                          help="tokens to produce at most (default: twice the source's length + 10)")
    evaluate.add_argument("--batch-size", type=positive_int, default=256, help="sources decoded at once")
    evaluate.add_argument("--output", default=None, metavar="PATH",
                          help="write one hypothesis per pair of the data, in its order (blank lines "
                               "have none), detokenized as the data was written")
    evaluate.add_argument("--json", action="store_true",
                          help="print exactly one JSON object: n, exact_match, token_error_rate, bleu, "
                               "chrf (and wer)")
    add_threads(evaluate)
    evaluate.set_defaults(run=run)


def run(args) -> int:
    output = None if args.output is None else writable(Path(args.output), flag="--output")
    model, info = load_checkpoint(args.checkpoint)
    pairs, where = _pairs(args, info)
    set_threads(args.threads)
    decoding = beam_options(args)
    metrics, rows = ta.models.evaluate(model, pairs, info.src_vocab, info.tgt_vocab,
                                       batch_size=args.batch_size, max_len=args.max_len, **decoding,
                                       return_outputs=True)
    if output is not None:
        hypotheses = {tuple(source): info.detokenize(tokens) for source, tokens, _ in rows}
        lines = [hypotheses[tuple(source)] for source, _ in pairs]
        try:
            write_text(output, "".join(line + "\n" for line in lines), "evaluate")
        except OSError as err:
            raise UsageError(f"could not write --output {output}: {err}") from None
    if args.json:
        print(json.dumps(metrics))
        return EXIT_OK
    search = "greedy" if args.beam is None else \
        f"beam {args.beam}, length penalty {decoding['length_penalty']:g}"
    print(f"{args.checkpoint} on {where}, {search}: {format_metrics(metrics)}")
    refs = [targets if len(targets) > 1 else targets[0] for _, _, targets in rows]
    for name, signature in ta.metrics.signatures(refs).items():
        print(f"  {name} signature: {signature}")
    if output is not None:
        print(f"wrote {len(pairs)} hypotheses to {output}")
    return EXIT_OK


def _pairs(args, info):
    """The pairs to score, read with the checkpoint's tokenization, and what to call them."""
    if args.data is not None:
        tokens = info.tokenization
        try:
            return ta.data.read_pairs(args.data, tokens["src"], tokens["tgt"]), args.data
        except ValueError as err:                      # DataError: names the file and line
            raise UsageError(str(err)) from None
    source = info.extras.get("source")
    if source is None:
        raise UsageError(f"{args.checkpoint} does not record its data: give the pairs with --data")
    task = task_from_source(source)
    if not task.test:
        raise UsageError(f"the run in {args.checkpoint} has no test split: give the pairs with --data")
    return task.test, f"the test split of {source.get('task') or source.get('data')}"

