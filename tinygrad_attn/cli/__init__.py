"""The command line: ``tinygrad-attn demo | train | evaluate | translate | graph | verify | bench``.

    tinygrad-attn demo                                   # train, translate, verify (~70 s here)
    tinygrad-attn train --task reverse --length 8 --steps 2000
    tinygrad-attn train --data pairs.tsv --src-tokens char --tgt-tokens space --out run.ckpt
    tinygrad-attn train --resume run.ckpt --steps 20000  # continue a run (Ctrl-C saved it)
    tinygrad-attn evaluate run.ckpt --data test.tsv --beam 5 --json
    tinygrad-attn translate run.ckpt "3 may 1998" --beam 5
    tinygrad-attn translate run.ckpt - < words.txt > outputs.txt
    tinygrad-attn graph --attention-edges --out seq2seq.svg          # a tiny model's loss graph
    tinygrad-attn verify                                 # every op, and a Bahdanau step, with sympy
    tinygrad-attn bench --steps 30

``python -m tinygrad_attn ...`` runs the same.  ``main(argv)`` returns the exit status instead
of exiting, so tests call it in-process.  Bad input (a missing or damaged checkpoint or data
file, an unknown task, characters a vocabulary lacks, an output that is one of the inputs, a
source longer than a Transformer's position table, a run whose loss is no longer finite) ends
with one line on stderr and status 2.  Ctrl-C or SIGTERM during training saves a resumable
checkpoint, then ends with status 130 or 143.

One module per command (``add_parser`` and ``run``); ``common`` holds what they share.
Nothing in the engine imports this package (nor tqdm): ``import tinygrad_attn`` stays lean.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings

import tinygrad_attn as ta

from . import bench, demo, evaluate, graph, train, translate, verify
from .common import EXIT_OK, EXIT_USAGE, Parser, UsageError, threads_restored
from .demo import DEMO_DATES

__all__ = ["main", "build_parser", "DEMO_DATES"]

COMMANDS = (demo, train, evaluate, translate, graph, verify, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tinygrad-attn",
        description="tinygrad_attn: a small tensor autograd engine built around attention. "
                    "Train an RNN encoder-decoder with attention, translate with it and look at "
                    "its attention, verify gradients exactly with sympy, time training.",
        epilog="Start with 'tinygrad-attn demo'. Each command has its own --help.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {ta.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=Parser)

    for command in COMMANDS:
        command.add_parser(commands)
    return parser


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
        with threads_restored(args), warnings.catch_warnings():
            warnings.showwarning = _one_line_warning(args.command)
            return args.run(args)
    except UsageError as err:
        print(f"tinygrad-attn {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as stop:
        # 128 + the signal's number, as a shell reports a process the signal ended: 130 for
        # Ctrl-C, 143 for SIGTERM (training saves first and says which signal it was).
        print(f"tinygrad-attn {args.command}: {stop or 'interrupted'}", file=sys.stderr)
        return 128 + getattr(stop, "signal", signal.SIGINT)
    except BrokenPipeError:
        # The reader left (`translate m.ckpt - | head -1`): stop quietly, as other tools do.
        # Standard output goes to /dev/null first, so flushing it at exit raises nothing more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _one_line_warning(command: str):
    """Warnings (unknown symbols in a validation split, pairs filtered as too long) as one
    line each, without the source line Python prints under them."""
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"tinygrad-attn {command}: warning: {message}", file=sys.stderr)

    return show
