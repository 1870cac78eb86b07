"""``tinygrad-attn graph``: draw the computation graph of a seq2seq loss."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import tinygrad_attn as ta

from .common import (
    EXIT_OK,
    UsageError,
    add_model_options,
    build_model,
    check_source,
    load_checkpoint,
    model_errors,
    positive_int,
    refuse_inputs,
    source_files,
    writable,
)
from .train import task_from_source

GRAPH_MODEL = dict(cell="gru", attention="additive", style="bahdanau", embed=4, hidden=4, layers=1)


def add_parser(commands) -> None:
    graph = commands.add_parser(
        "graph", help="draw the computation graph of a seq2seq loss as SVG, PNG, PDF or DOT",
        description="Draw the graph the engine records for a seq2seq model's loss: every op, boxed "
                    "by scope (encoder/t0, decoder/t1/attention, ...), with the parameters and "
                    "inputs. With CHECKPOINT, the model encodes TEXT and is teacher-forced on its "
                    "own greedy output; without, a tiny untrained model built from the options "
                    "below runs on random ids. The format follows the suffix of --out (.dot needs "
                    "no Graphviz).")
    graph.add_argument("checkpoint", metavar="CHECKPOINT", nargs="?", default=None,
                       help="a file written by 'tinygrad-attn train' (default: a tiny untrained model)")
    graph.add_argument("--text", default=None,
                       help="with CHECKPOINT: the source to encode (default: the task's first held-out one)")
    # Defaults None: given next to a CHECKPOINT, a model option is an error (_checkpoint_loss).
    add_model_options(graph, GRAPH_MODEL, when="without CHECKPOINT: ", unset=True)
    graph.add_argument("--src-len", type=positive_int, default=None, metavar="N",
                       help="without CHECKPOINT: source steps (default 3)")
    graph.add_argument("--tgt-len", type=positive_int, default=None, metavar="N",
                       help="decoder steps (default 2; with CHECKPOINT: the greedy output's, "
                            "<end> included, cut to N)")
    graph.add_argument("--collapse", type=_collapse, default=None, metavar="K|SCOPES",
                       help="K: draw the first and last K steps of each unroll and the steps between "
                            "as one node; scope names (comma-separated, shell patterns, 'steps' for "
                            "every time step): draw each as one box; both: '2,attention'")
    graph.add_argument("--backward", action="store_true",
                       help="draw the gradient graph: each op's edges go to the inputs it sends "
                            "gradients to, labelled with the gradient's shape")
    graph.add_argument("--values", action="store_true",
                       help="print the values, and after a backward pass the gradients, of tensors "
                            "with at most 12 entries")
    graph.add_argument("--attention-edges", action="store_true",
                       help="a dashed red edge from each encoder state h_j to each decoder step's "
                            "attention weights, as thick as the weight")
    graph.add_argument("--rankdir", choices=("TB", "LR", "BT", "RL"), default="TB",
                       help="layout direction: TB top to bottom (default), LR left to right")
    graph.add_argument("--out", required=True, metavar="PATH",
                       help="the file to write: .svg, .png or .pdf (drawn by Graphviz's dot), "
                            ".dot or .gv (the DOT source)")
    graph.set_defaults(run=run)


def _collapse(text: str):
    """``--collapse``: "2" -> 2, "attention" -> "attention", "2,attention" -> {2, "attention"}."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a number of steps or scope names, got nothing")
    parsed = []
    for item in items:
        if item.lstrip("-").isdigit():
            parsed.append(positive_int(item))
        else:
            parsed.append(item)
    return parsed[0] if len(parsed) == 1 else set(parsed)




# Vocabulary of the untrained model: the 4 reserved ids and 4 tokens for the random ids.
_GRAPH_VOCAB = 8
_CONFIG_FLAGS = ("cell", "attention", "style", "embed", "hidden", "layers", "bidirectional", "src_len")


def run(args) -> int:
    out = _graph_output(args.out)
    if args.checkpoint is None:
        loss, what = _untrained_loss(args)
    else:
        loss, what = _checkpoint_loss(args, out)
    if args.values:
        loss.backward()                 # so the labels can show gradients too
    viz = ta.viz
    try:
        digraph = viz.graph(loss, collapse=args.collapse, backward=args.backward, values=args.values,
                            attention_edges=args.attention_edges, rankdir=args.rankdir)
        path = viz.render(digraph, out)
    except (viz.GraphvizNotFound, ValueError, TypeError, OSError) as err:
        raise UsageError(str(err)) from None
    print(what)
    print(f"wrote the {'gradient ' if args.backward else ''}graph to {path}: {digraph.nodes} nodes, "
          f"{digraph.edges} edges, {digraph.boxes} boxes (scopes)")
    return EXIT_OK


def _graph_output(text: str) -> Path:
    """Check --out's suffix and folder before any model runs."""
    path = Path(text)
    formats = ta.viz.FORMATS
    if path.suffix.lower() not in formats:
        raise UsageError(f"--out {text}: cannot tell the format from the suffix; use one of "
                         f"{', '.join(formats)}")
    return writable(path)


def _untrained_loss(args):
    """The loss of a tiny untrained Seq2Seq on random ids (seeded: the same drawing every run)."""
    if args.text is not None:
        raise UsageError("--text needs a CHECKPOINT (its vocabulary reads the text); without one, "
                         "an untrained model runs on random ids of --src-len")
    option = {name: getattr(args, name) or value for name, value in GRAPH_MODEL.items()}
    ta.manual_seed(0)
    model = build_model(_GRAPH_VOCAB, _GRAPH_VOCAB, embed=option["embed"], hidden=option["hidden"],
                        cell=option["cell"], style=option["style"],
                        attention=None if option["attention"] == "none" else option["attention"],
                        num_layers=option["layers"], bidirectional=bool(args.bidirectional))
    model.eval()
    rng = np.random.default_rng(0)
    src_len, tgt_len = args.src_len or 3, args.tgt_len or 2
    first = ta.data.UNK + 1                                    # ids below are reserved
    src = rng.integers(first, _GRAPH_VOCAB, size=(1, src_len))
    tgt_out = rng.integers(first, _GRAPH_VOCAB, size=(1, tgt_len))
    tgt_in = np.concatenate([[[ta.data.START]], tgt_out[:, :-1]], axis=1)
    loss = model.loss(src, tgt_in, tgt_out)
    what = (f"untrained model: {model.extra_repr()}, {src_len} source steps, {tgt_len} decoder steps "
            f"on random ids, loss {loss.item():.3g}")
    return loss, what


def _checkpoint_loss(args, out: Path):
    """The loss of a checkpoint's model on TEXT, teacher-forced on its own greedy output."""
    given = [f"--{name.replace('_', '-')}" for name in _CONFIG_FLAGS if getattr(args, name) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} describe the untrained model drawn without a CHECKPOINT; "
                         f"{args.checkpoint} brings its own model (use --text for the source)")
    inputs = [(f"CHECKPOINT {args.checkpoint}", args.checkpoint)]
    refuse_inputs(out, f"--out {out}", inputs)
    model, info = load_checkpoint(args.checkpoint)
    if args.text is None:            # the task's files are read for a sample
        refuse_inputs(out, f"--out {out}", source_files(info.extras.get("source")))
    text = args.text if args.text is not None else _first_held_out(info, args.checkpoint)
    check_source(text, info, model)
    source = info.tokenize(text)
    src = ta.data.encode_batch([source], info.src_vocab)                      # (1, S)
    with model_errors():
        ids, _ = model.greedy(src, max_len=args.tgt_len or 50)                 # (1, L)
    row = ids[0]
    ends = np.flatnonzero(row == ta.data.END)
    tgt_out = row[: ends[0] + 1] if ends.size else row                         # the output, <end> included
    tgt_in = np.concatenate([[ta.data.START], tgt_out[:-1]])
    with model_errors():
        loss = model.loss(src, tgt_in[None, :], tgt_out[None, :])
    output = info.detokenize(info.tgt_vocab.decode(tgt_out))
    what = (f"{info.name} model ({model.extra_repr()}): {text!r} -> {output!r}, teacher-forced on its "
            f"greedy output: {len(source)} source steps, {len(tgt_out)} decoder steps, "
            f"loss {loss.item():.3g}")
    return loss, what


def _first_held_out(info, checkpoint: str) -> str:
    """The source of the first held-out pair of the checkpoint's task."""
    # Checkpoints from 0.5 and earlier name their task's options as "task_options".
    source = info.extras.get("source") or {"task": info.name, "options": info.extras.get("task_options", {})}
    try:
        task = task_from_source(source)
    except UsageError as err:
        raise UsageError(f"cannot rebuild the task of {checkpoint} to take a sample ({err}); "
                         f"give the source with --text") from None
    if not task.test:
        raise UsageError(f"the task of {checkpoint} has no held-out pairs; give the source with --text")
    return task.detokenize_source(task.test[0][0])
