"""The command line: ``tinygrad-attn demo | train | translate | graph | verify | bench``.

    tinygrad-attn demo                                   # train, translate, verify (~70 s here)
    tinygrad-attn train --task reverse --length 8 --steps 2000
    tinygrad-attn translate checkpoints/dates-gru-additive.ckpt "3 may 1998" --beam 5
    tinygrad-attn graph --attention-edges --out seq2seq.svg          # a tiny model's loss graph
    tinygrad-attn verify                                 # every op, and a Bahdanau step, with sympy
    tinygrad-attn bench --steps 30

``python -m tinygrad_attn ...`` runs the same.  ``main(argv)`` returns the exit status instead
of exiting, so tests call it in-process.  Bad input (a missing or damaged checkpoint, an
unknown task, characters a vocabulary lacks) ends with one line on stderr and status 2.

Nothing in the engine imports this module (nor tqdm): ``import tinygrad_attn`` stays lean.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

import tinygrad_attn as ta

from .serialize import SerializationError

__all__ = ["main", "format_attention", "bahdanau_step_check"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# Hand-written dates for the demo, with the answers (the dates task reads numbers day first
# and knows 1950-2049).
DEMO_DATES = (
    ("3 may 1998", "1998-05-03"),
    ("tuesday, 12 march 2024", "2024-03-12"),
    ("25.12.2019", "2019-12-25"),
    ("july 4th, 1976", "1976-07-04"),
    ("sat jan 1 00", "2000-01-01"),
)


class UsageError(Exception):
    """Bad input from the user: reported as one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block) and which never exits the
    interpreter itself: ``main`` turns its exits into return codes."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------- argument types


def _number(convert, accept, wanted: str):
    """An argparse type: ``convert`` the text, then require ``accept(value)``."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {value}")
        return value

    return parse


_positive_int = _number(int, lambda v: v >= 1, "a positive integer")
_non_negative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _number(float, lambda v: v > 0, "a positive number")
_probability = _number(float, lambda v: 0 <= v < 1, "a number in [0, 1)")


def _collapse(text: str):
    """``--collapse``: "2" -> 2, "attention" -> "attention", "2,attention" -> {2, "attention"}."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a number of steps or scope names, got nothing")
    parsed = []
    for item in items:
        if item.lstrip("-").isdigit():
            parsed.append(_positive_int(item))
        else:
            parsed.append(item)
    return parsed[0] if len(parsed) == 1 else set(parsed)


# ---------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tinygrad-attn",
        description="tinygrad_attn: a small tensor autograd engine built around attention. "
                    "Train an RNN encoder-decoder with attention, translate with it and look at "
                    "its attention, verify gradients exactly with sympy, time training.",
        epilog="Start with 'tinygrad-attn demo'. Each command has its own --help.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {ta.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=_Parser)

    demo = commands.add_parser(
        "demo", help="train a Bahdanau GRU on dates, translate, show attention, verify gradients",
        description="Train a GRU encoder-decoder with Bahdanau (additive) attention to turn "
                    "human-written dates into YYYY-MM-DD, report its exact match on 500 held-out "
                    "dates, translate a few hand-written ones, print one attention matrix, draw "
                    "the graph and heatmaps when the viz package can, and verify the gradients "
                    "of a Bahdanau decoder step exactly with sympy. About 70 s on 2 cores.")
    demo.add_argument("--steps", type=_positive_int, default=None,
                      help="training steps (default 1500; 30 with --quick)")
    demo.add_argument("--time-limit", type=_positive_float, default=None, metavar="SECONDS",
                      help="stop training after this many seconds (default 120)")
    demo.add_argument("--out-dir", default="demo_out",
                      help="where the checkpoint and drawings go (default demo_out/)")
    demo.add_argument("--quick", action="store_true",
                      help="a tiny model and a few steps: checks that everything runs, learns little")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_threads(demo)
    demo.set_defaults(run=_demo)

    train = commands.add_parser(
        "train", help="train a seq2seq model with attention on a task and save a checkpoint",
        description="Train ta.models.Seq2Seq with Adam and teacher forcing, evaluate it on the "
                    "task's held-out test set (exact match and token accuracy, greedy decoding) "
                    "and save a checkpoint for 'tinygrad-attn translate'.")
    train.add_argument("--task", choices=ta.data.TASKS, default="dates", help="the task (default dates)")
    train.add_argument("--length", type=_positive_int, default=None,
                       help="sequence length for copy and reverse (default 10)")
    _add_model_options(train, TRAIN_MODEL)
    train.add_argument("--dropout", type=_probability, default=0.0, help="default 0")
    train.add_argument("--steps", type=_positive_int, default=1500, help="optimizer steps (default 1500)")
    train.add_argument("--batch-size", type=_positive_int, default=64, help="default 64")
    train.add_argument("--lr", type=_positive_float, default=3e-3, help="Adam's learning rate (default 3e-3)")
    train.add_argument("--seed", type=_non_negative_int, default=0,
                       help="seeds the weights and batches (default 0)")
    train.add_argument("--time-limit", type=_positive_float, default=None, metavar="SECONDS",
                       help="stop training after this many seconds")
    train.add_argument("--out", default=None, metavar="PATH",
                       help="the checkpoint (default checkpoints/<task>-<cell>-<attention>.ckpt)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_threads(train)
    train.set_defaults(run=_train)

    translate = commands.add_parser(
        "translate", help="translate text with a checkpoint and print the attention",
        description="Decode each TEXT with the model in CHECKPOINT and print the output and its "
                    "attention matrix: one row per output token (<end> included), one column per "
                    "source token.")
    translate.add_argument("checkpoint", metavar="CHECKPOINT", help="a file written by 'tinygrad-attn train'")
    translate.add_argument("texts", metavar="TEXT", nargs="+", help="what to translate (quote it)")
    translate.add_argument("--beam", type=_positive_int, default=None, metavar="K",
                           help="beam search with K hypotheses (default: greedy)")
    translate.add_argument("--heatmap", default=None, metavar="PATH",
                           help="also draw the attention to PATH (needs ta.viz.heatmap); with "
                                "several texts, PATH-1, PATH-2, ...")
    translate.set_defaults(run=_translate)

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
    _add_model_options(graph, GRAPH_MODEL, when="without CHECKPOINT: ", unset=True)
    graph.add_argument("--src-len", type=_positive_int, default=None, metavar="N",
                       help="without CHECKPOINT: source steps (default 3)")
    graph.add_argument("--tgt-len", type=_positive_int, default=None, metavar="N",
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
    graph.set_defaults(run=_graph)

    verify = commands.add_parser(
        "verify", help="check every op's gradient and a Bahdanau decoder step's exactly with sympy",
        description="Run ta.check.ops() (every registered op: sympy-exact derivative and central "
                    "differences) and ta.check.symbolic on one Bahdanau decoder step built from "
                    "nn modules (additive attention, GRU cell, readout; float64). Exit status 0 "
                    "only when everything passes.")
    verify.set_defaults(run=_verify)

    bench = commands.add_parser(
        "bench", help="time training steps of a Bahdanau GRU on dates",
        description="Time ta.models.train on dates (GRU, additive attention) and print the median "
                    "milliseconds per step and target tokens per second. For the comparison with "
                    "PyTorch on the same model, run bench/seq2seq.py from the repository.")
    bench.add_argument("--steps", type=_positive_int, default=30, help="timed steps (default 30)")
    bench.add_argument("--hidden", type=_positive_int, default=128, help="default 128")
    bench.add_argument("--batch-size", type=_positive_int, default=32, help="default 32")
    _add_threads(bench)
    bench.set_defaults(run=_bench)
    return parser


TRAIN_MODEL = dict(cell="gru", attention="additive", style="bahdanau", embed=64, hidden=128, layers=1)
GRAPH_MODEL = dict(cell="gru", attention="additive", style="bahdanau", embed=4, hidden=4, layers=1)


def _add_model_options(parser: argparse.ArgumentParser, defaults: dict, when: str = "",
                       unset: bool = False) -> None:
    """The Seq2Seq options of ``train`` and ``graph``; ``unset`` leaves them None (``graph``
    fills ``defaults`` in only when it builds its own model)."""
    def default(name):
        return None if unset else defaults[name]

    parser.add_argument("--cell", choices=("rnn", "gru", "lstm"), default=default("cell"),
                        help=f"{when}default {defaults['cell']}")
    parser.add_argument("--attention", choices=("dot", "general", "concat", "additive", "none"),
                        default=default("attention"),
                        help=f"{when}default {defaults['attention']} (Bahdanau's score)")
    parser.add_argument("--style", choices=("bahdanau", "luong"), default=default("style"),
                        help=f"{when}default {defaults['style']}")
    parser.add_argument("--embed", type=_positive_int, default=default("embed"),
                        help=f"{when}embedding size (default {defaults['embed']})")
    parser.add_argument("--hidden", type=_positive_int, default=default("hidden"),
                        help=f"{when}state size (default {defaults['hidden']})")
    parser.add_argument("--layers", type=_positive_int, default=default("layers"),
                        help=f"{when}stacked layers (default {defaults['layers']})")
    parser.add_argument("--bidirectional", action="store_true", default=None if unset else False,
                        help=f"{when}a bidirectional encoder")


def _add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=_positive_int, default=1, metavar="N",
                        help="threads for BLAS and Numba (default 1: a small model's products gain "
                             "nothing from more, and waiting threads collapse on a busy machine)")


def _set_threads(n: int) -> str:
    """Apply ``--threads``; returns what to print about it."""
    ta.set_num_threads(n)
    return f"threads: {n} for BLAS and Numba"


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:         # --help and --version (0), usage errors (2)
        if stop.code is None:
            return EXIT_OK
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    try:
        with _threads_restored(args):
            return args.run(args)
    except UsageError as err:
        print(f"tinygrad-attn {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"tinygrad-attn {args.command}: interrupted", file=sys.stderr)
        return 130


@contextmanager
def _threads_restored(args):
    """``main`` also runs in-process (tests, notebooks): give back the caller's thread count."""
    if getattr(args, "threads", None) is None:
        yield
        return
    before = ta.get_num_threads()
    try:
        yield
    finally:
        if ta.get_num_threads() != before:
            ta.set_num_threads(before)


# ---------------------------------------------------------------- training, shared by train and demo


def _fit(model, task, steps: int, batch_size: int, lr: float, seed: int, time_limit: float | None,
         progress: bool) -> list[dict]:
    """``ta.models.train`` with a tqdm bar: smoothed loss and target tokens/s as its postfix."""
    bar = tqdm(total=steps, desc=f"training on {task.name}", unit="step", disable=not progress,
               dynamic_ncols=True, file=sys.stderr)
    smoothed = {"loss": None, "rate": None, "seconds": 0.0}

    def update(record: dict) -> None:
        step_seconds = max(record["seconds"] - smoothed["seconds"], 1e-9)
        smoothed["seconds"] = record["seconds"]
        rate = record["tokens"] / step_seconds
        # Moving averages: one batch's loss is noisy, and the first step includes compiling.
        smoothed["loss"] = record["loss"] if smoothed["loss"] is None else (
            0.95 * smoothed["loss"] + 0.05 * record["loss"])
        smoothed["rate"] = rate if smoothed["rate"] is None or record["step"] <= 2 else (
            0.9 * smoothed["rate"] + 0.1 * rate)
        bar.set_postfix_str(f"loss {smoothed['loss']:.3g}, {smoothed['rate']:,.0f} tok/s", refresh=False)
        bar.update(1)

    try:
        history = ta.models.train(model, task, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                                  time_limit=time_limit, callback=update)
    finally:
        bar.close()
    return history


def _describe_training(history: list[dict], steps: int, time_limit: float | None) -> str:
    seconds = history[-1]["seconds"]
    tokens = sum(record["tokens"] for record in history)
    tail = history[-min(len(history), 20):]
    loss = sum(record["loss"] for record in tail) / len(tail)
    line = (f"trained {len(history)} steps in {seconds:.1f} s ({tokens / seconds:,.0f} target tokens/s), "
            f"final loss {loss:.3g} (mean of the last {len(tail)} steps)")
    if len(history) < steps:
        line += f"; stopped at the {time_limit:g} s time limit, before step {steps}"
    return line


def _load_task(name: str, length: int | None, **options):
    if length is not None:
        if name not in ("copy", "reverse"):
            raise UsageError(f"--length applies to the copy and reverse tasks, not {name!r}")
        options["length"] = length
    try:
        return ta.data.load(name, **options)
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None


def _writable(path: Path) -> Path:
    """Check the checkpoint can be written before training, not after it."""
    if path.is_dir():
        raise UsageError(f"--out {path} is a directory; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create the directory of --out {path}: {err}") from None
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"cannot write to {path.parent} (for --out {path})")
    return path


def _train(args) -> int:
    task = _load_task(args.task, args.length)
    threads = _set_threads(args.threads)
    attention = None if args.attention == "none" else args.attention
    ta.manual_seed(args.seed)
    try:
        model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=args.embed, hidden=args.hidden,
                                  cell=args.cell, attention=attention, style=args.style,
                                  num_layers=args.layers, dropout=args.dropout,
                                  bidirectional=args.bidirectional)
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = _writable(Path(args.out or f"checkpoints/{task.name}-{args.cell}-{args.attention}.ckpt"))
    print(f"task {task.name}: {task.description}; {len(task.train)} training pairs, "
          f"{len(task.test)} held out")
    print(f"model: {model.extra_repr()}, {model.num_parameters():,} parameters; {threads}")

    history = _fit(model, task, args.steps, args.batch_size, args.lr, args.seed, args.time_limit,
                   progress=not args.no_progress)
    print(_describe_training(history, args.steps, args.time_limit))
    metrics = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
    print(f"held-out test set ({metrics['count']} pairs, greedy): exact match {metrics['exact_match']:.1%}, "
          f"token accuracy {metrics['token_accuracy']:.1%}")

    options = {} if args.length is None else {"length": args.length}
    try:
        ta.models.save_checkpoint(out, model, task, step=len(history), metrics=metrics,
                                  seconds=round(history[-1]["seconds"], 3), task_options=options)
    except OSError as err:
        raise UsageError(f"could not write the checkpoint {out}: {err}") from None
    print(f"saved the checkpoint to {out}")
    print(f"try: tinygrad-attn translate {out} \"{task.detokenize(task.test[0][0])}\"")
    return EXIT_OK


# ---------------------------------------------------------------- translate


def _visible(token: str) -> str:
    """A column label that shows up: a space becomes an open box (or _ where that can't print)."""
    if token != " ":
        return token
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        "\u2423".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return "_"
    return "\u2423"


def format_attention(weights: np.ndarray, src_tokens, out_tokens) -> str:
    """The attention matrix as aligned text: one row per output token (``<end>`` after the
    tokens when the decoder produced it), one column per source token, weights to 2 decimals.

    Example:
        >>> print(format_attention(attention, list("3 may"), list("05-03")))
                 3    ␣    m    a    y
        0     0.01 0.02 0.85 0.10 0.02
        ...
    """
    weights = np.asarray(weights, dtype=np.float64)
    rows = [_visible(t) for t in _row_labels(out_tokens, weights)]
    columns = [_visible(t) for t in src_tokens]
    width = max([4] + [len(c) for c in columns])          # "0.00" is 4 wide
    label = max([0] + [len(r) for r in rows])
    lines = [" " * label + "".join(f" {c:>{width}}" for c in columns)]
    for name, row in zip(rows, weights, strict=True):
        lines.append(f"{name:<{label}}" + "".join(f" {w:>{width}.2f}" for w in row))
    return "\n".join(lines)


def _load_checkpoint(path: str):
    if not Path(path).is_file():
        what = "is a directory" if Path(path).is_dir() else "does not exist"
        raise UsageError(f"the checkpoint {path} {what}")
    try:
        return ta.models.load_checkpoint(path)
    except SerializationError as err:
        raise UsageError(str(err)) from None
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"{path} is not a readable seq2seq checkpoint "
                         f"({type(err).__name__}: {err})") from None


def _check_source(text: str, info) -> None:
    """Fail with the tokens the source vocabulary lacks (they would become <unk>)."""
    tokens = info.tokenize(text)
    if not tokens:
        raise UsageError(f"{text!r} has nothing to translate")
    missing = list(dict.fromkeys(t for t in tokens if t not in info.src_vocab))
    if not missing:
        return
    kind = "characters" if info.level == "char" else "words"
    known = [t for t in info.src_vocab.tokens if not t.startswith("<")]
    shown = "".join(known) if info.level == "char" else f"{len(known)} words"
    raise UsageError(f"{text!r} has {kind} the {info.name} model's source vocabulary lacks: "
                     f"{', '.join(repr(t) for t in missing)} (it knows: {shown})")


def _heatmap_path(path: str, index: int, count: int) -> Path:
    path = Path(path)
    return path if count == 1 else path.with_name(f"{path.stem}-{index}{path.suffix}")


def _translate(args) -> int:
    viz = ta.viz
    model, info = _load_checkpoint(args.checkpoint)
    if args.heatmap is not None and model.attention_kind is None:
        raise UsageError(f"{args.checkpoint} is a model without attention: there is no heatmap to draw")
    for text in args.texts:
        _check_source(text, info)
    for index, text in enumerate(args.texts, start=1):
        output, source, tokens, attention = ta.models.translate(model, text, info, beam=args.beam)
        print(f"{text!r} -> {output!r}")
        if attention is None:
            print("(this model has no attention: its decoder sees only the encoder's final state)")
            continue
        print(format_attention(attention, source, tokens))
        if args.heatmap is not None:
            path = _heatmap_path(args.heatmap, index, len(args.texts))
            try:
                viz.heatmap(attention, source, _row_labels(tokens, attention), path)
            except (ImportError, ValueError, OSError) as err:       # messages start "heatmap:"
                raise UsageError(str(err)) from None
            print(f"wrote the heatmap to {path}")
        if index < len(args.texts):
            print()
    return EXIT_OK


def _row_labels(tokens, attention) -> list[str]:
    """The output tokens, and ``<end>`` when the attention has a row for it."""
    return list(tokens) + ["<end>"] * (attention.shape[0] - len(tokens))


# ---------------------------------------------------------------- graph

# Vocabulary of the untrained model: the 4 reserved ids and 4 tokens for the random ids.
_GRAPH_VOCAB = 8
_CONFIG_FLAGS = ("cell", "attention", "style", "embed", "hidden", "layers", "bidirectional", "src_len")


def _graph(args) -> int:
    out = _graph_output(args.out)
    if args.checkpoint is None:
        loss, what = _untrained_loss(args)
    else:
        loss, what = _checkpoint_loss(args)
    if args.values:
        loss.backward()                 # so the labels can show gradients too
    viz = ta.viz
    try:
        digraph = viz.graph(loss, collapse=args.collapse, backward=args.backward, values=args.values,
                            attention_edges=args.attention_edges, rankdir=args.rankdir)
        path = viz.render(digraph, out)
    except (viz.GraphvizNotFound, ValueError, TypeError, OSError) as err:
        raise UsageError(str(err)) from None
    nodes, edges, boxes = _drawing_size(digraph)
    print(what)
    print(f"wrote the {'gradient ' if args.backward else ''}graph to {path}: {nodes} nodes, "
          f"{edges} edges, {boxes} boxes (scopes)")
    return EXIT_OK


def _graph_output(text: str) -> Path:
    """Check --out's suffix and folder before any model runs."""
    path = Path(text)
    formats = ta.viz.FORMATS
    if path.suffix.lower() not in formats:
        raise UsageError(f"--out {text}: cannot tell the format from the suffix; use one of "
                         f"{', '.join(formats)}")
    return _writable(path)


def _untrained_loss(args):
    """The loss of a tiny untrained Seq2Seq on random ids (seeded: the same drawing every run)."""
    if args.text is not None:
        raise UsageError("--text needs a CHECKPOINT (its vocabulary reads the text); without one, "
                         "an untrained model runs on random ids of --src-len")
    option = {name: getattr(args, name) or value for name, value in GRAPH_MODEL.items()}
    ta.manual_seed(0)
    try:
        model = ta.models.Seq2Seq(_GRAPH_VOCAB, _GRAPH_VOCAB, embed=option["embed"], hidden=option["hidden"],
                                  cell=option["cell"], style=option["style"],
                                  attention=None if option["attention"] == "none" else option["attention"],
                                  num_layers=option["layers"], bidirectional=bool(args.bidirectional))
    except ValueError as err:
        raise UsageError(str(err)) from None
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


def _checkpoint_loss(args):
    """The loss of a checkpoint's model on TEXT, teacher-forced on its own greedy output."""
    given = [f"--{name.replace('_', '-')}" for name in _CONFIG_FLAGS if getattr(args, name) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} describe the untrained model drawn without a CHECKPOINT; "
                         f"{args.checkpoint} brings its own model (use --text for the source)")
    model, info = _load_checkpoint(args.checkpoint)
    text = args.text if args.text is not None else _first_held_out(info, args.checkpoint)
    _check_source(text, info)
    source = info.tokenize(text)
    src = ta.data.encode_batch([source], info.src_vocab)                      # (1, S)
    ids, _ = model.greedy(src, max_len=args.tgt_len or 50)                     # (1, L)
    row = ids[0]
    ends = np.flatnonzero(row == ta.data.END)
    tgt_out = row[: ends[0] + 1] if ends.size else row                         # the output, <end> included
    tgt_in = np.concatenate([[ta.data.START], tgt_out[:-1]])
    loss = model.loss(src, tgt_in[None, :], tgt_out[None, :])
    output = info.detokenize(info.tgt_vocab.decode(tgt_out))
    what = (f"{info.name} model ({model.extra_repr()}): {text!r} -> {output!r}, teacher-forced on its "
            f"greedy output: {len(source)} source steps, {len(tgt_out)} decoder steps, "
            f"loss {loss.item():.3g}")
    return loss, what


def _first_held_out(info, checkpoint: str) -> str:
    """The source of the first held-out pair of the checkpoint's task."""
    try:
        task = ta.data.load(info.name, **info.extras.get("task_options", {}))
    except (ValueError, TypeError) as err:
        raise UsageError(f"cannot rebuild the task of {checkpoint} to take a sample ({err}); "
                         f"give the source with --text") from None
    if not task.test:
        raise UsageError(f"the task of {checkpoint} has no held-out pairs; give the source with --text")
    return task.detokenize(task.test[0][0])


def _drawing_size(digraph) -> tuple[int, int, int]:
    """(nodes, edges, boxes) of a Digraph, counted in its DOT source."""
    source = digraph.source
    nodes = len(re.findall(r"^\s*\w+ \[label=", source, re.M))
    edges = len(re.findall(r"^\s*\w+ -> \w+", source, re.M))
    boxes = len(re.findall(r"^\s*subgraph \"?cluster_", source, re.M))
    return nodes, edges, boxes


# ---------------------------------------------------------------- verify


def bahdanau_step_check():
    """``ta.check.symbolic`` on one Bahdanau decoder step at E = H = S = 2, vocabulary 6,
    batch 1, float64: every input and parameter's gradient against sympy's exact one.

    The output checked is one logit: the whole step's 6 logits take sympy about 3 times
    longer, and a whole 2-step seq2seq minutes (the expressions grow with every step).
    """
    ta.manual_seed(0)
    step = ta.models.BahdanauStep(embed=2, hidden=2, vocab=6).double()
    rng = np.random.default_rng(0)
    y_prev = rng.standard_normal((1, 2))            # (B, E)
    s_prev = rng.standard_normal((1, 2))            # (B, H)
    keys = rng.standard_normal((1, 2, 2))           # (B, S, H)

    def bahdanau_step_logit(y_prev, s_prev, keys):
        return step(y_prev, s_prev, keys)[:, 3]

    return ta.check.symbolic(bahdanau_step_logit, y_prev, s_prev, keys)


def _verify(args) -> int:
    print("1. every registered op: sympy-exact derivative and central differences, float64")
    start = time.perf_counter()
    ops_report = ta.check.ops()
    print(ops_report)
    print(f"({time.perf_counter() - start:.1f} s)\n")
    print("2. one Bahdanau decoder step (additive attention + GRU cell + readout, E = H = S = 2, float64):")
    start = time.perf_counter()
    step_report = bahdanau_step_check()
    print(step_report)
    print(f"({time.perf_counter() - start:.1f} s)\n")
    passed = ops_report.ok and step_report.ok
    print("verify: all gradients match" if passed else "verify: FAILED (see above)")
    return EXIT_OK if passed else EXIT_FAILED


# ---------------------------------------------------------------- bench


def _bench(args) -> int:
    warmup = 3          # the first steps compile kernels (or load them from numba's cache)
    threads = _set_threads(args.threads)
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


# ---------------------------------------------------------------- demo


def _demo(args) -> int:
    quick = args.quick
    steps = args.steps or (30 if quick else 1500)
    time_limit = args.time_limit or (60.0 if quick else 120.0)
    embed, hidden, batch_size, lr = (8, 16, 32, 5e-3) if quick else (32, 128, 64, 5e-3)
    out_dir = Path(args.out_dir)
    threads = _set_threads(args.threads)

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

    history = _fit(model, task, steps, batch_size, lr, seed=0, time_limit=time_limit,
                   progress=not args.no_progress)
    print(_describe_training(history, steps, time_limit))
    metrics = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
    print(f"\nheld-out: {metrics['count']} dates whose calendar day never occurs in training: "
          f"exact match {metrics['exact_match']:.1%}, character accuracy {metrics['token_accuracy']:.1%}")

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
    print(format_attention(attention, source, tokens))

    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = out_dir / "dates.ckpt"
    ta.models.save_checkpoint(checkpoint, model, task, step=len(history), metrics=metrics)
    print(f"\nsaved the model to {checkpoint}; try: tinygrad-attn translate {checkpoint} \"20 july 1969\"")
    _demo_drawings(model, task, shown, out_dir)

    print("\ngradients: one Bahdanau decoder step, every derivative against sympy's exact one")
    report = bahdanau_step_check()
    print(report)

    print("\nsummary:")
    print(f"  - {_describe_training(history, steps, time_limit)}")
    print(f"  - held-out exact match {metrics['exact_match']:.1%} on {metrics['count']} unseen dates; "
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
    viz.heatmap(attention, source, _row_labels(tokens, attention), path)
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
