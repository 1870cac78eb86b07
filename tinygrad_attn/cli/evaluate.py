"""``tinygrad-attn evaluate``: score a checkpoint on a file of pairs (or its task's test split)
with the field's metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tinygrad_attn as ta

from ..serialize import write_text
from .common import (
    EXIT_OK,
    UsageError,
    add_beam,
    add_compile,
    add_threads,
    beam_options,
    check_length,
    compile_options,
    inputs_of,
    load_checkpoint,
    model_errors,
    positive_int,
    refuse_inputs,
    set_threads,
    source_files,
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
    add_compile(evaluate)
    evaluate.add_argument("--max-len", type=positive_int, default=None, metavar="N",
                          help="tokens to produce at most (default: twice the source's length + 10)")
    evaluate.add_argument("--batch-size", type=positive_int, default=256, help="sources decoded at once")
    evaluate.add_argument("--output", default=None, metavar="PATH",
                          help="write one hypothesis per pair of the data, in its order (blank lines "
                               "have none), detokenized as the data was written; '-': to standard "
                               "output, the report going to standard error")
    evaluate.add_argument("--json", action="store_true",
                          help="print exactly one JSON object: n, exact_match, token_error_rate, bleu, "
                               "chrf (and wer)")
    add_threads(evaluate)
    evaluate.set_defaults(run=run)


def run(args) -> int:
    to_stdout = args.output == "-"
    output = None if args.output is None or to_stdout else writable(Path(args.output), flag="--output")
    model, info = load_checkpoint(args.checkpoint)
    pairs, where = _pairs(args, info)
    if output is not None:
        inputs = inputs_of({"CHECKPOINT": args.checkpoint, "--data": args.data})
        refuse_inputs(output, f"--output {output}",
                      inputs if args.data is not None else inputs + source_files(info.extras.get("source")))
    for number, (source, _) in enumerate(pairs, start=1):
        check_length(source, model, f"the source of pair {number} of {where}")
    set_threads(args.threads)
    decoding = beam_options(args) | compile_options(args, model)
    with model_errors():
        metrics, rows = ta.models.evaluate(model, pairs, info.src_vocab, info.tgt_vocab,
                                           batch_size=args.batch_size, max_len=args.max_len, **decoding,
                                           return_outputs=True)
    if output is not None or to_stdout:
        hypotheses = {tuple(source): info.detokenize(tokens) for source, tokens, _ in rows}
        text = "".join(hypotheses[tuple(source)] + "\n" for source, _ in pairs)
        if to_stdout:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            try:
                write_text(output, text, "evaluate")
            except OSError as err:
                raise UsageError(f"could not write --output {output}: {err}") from None
    # With the hypotheses on standard output, what would be printed goes to standard error.
    report = sys.stderr if to_stdout else sys.stdout
    if args.json:
        print(json.dumps(metrics), file=report)
        return EXIT_OK
    search = "greedy" if args.beam is None else \
        f"beam {args.beam}, length penalty {decoding['length_penalty']:g}"
    print(f"{args.checkpoint} on {where}, {search}: {format_metrics(metrics)}", file=report)
    refs = [targets if len(targets) > 1 else targets[0] for _, _, targets in rows]
    for name, signature in ta.metrics.signatures(refs).items():
        print(f"  {name} signature: {signature}", file=report)
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

