"""What every command shares: exit codes, the one-line usage error, argument types, the
model and thread options, checkpoints and sources read from the user."""

from __future__ import annotations

import argparse
import math
import os
import stat
from contextlib import contextmanager
from pathlib import Path

import tinygrad_attn as ta

from ..arguments import check_writable_file
from ..autograd import ShapeError
from ..models.decoding import check_source_lengths
from ..models.evaluation import decoding_compiles
from ..serialize import SerializationError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the user: reported as one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block) and which never exits the
    interpreter itself: ``main`` turns its exits into return codes."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------- argument types


def number_type(convert, accept, wanted: str):
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


positive_int = number_type(int, lambda v: v >= 1, "a positive integer")
non_negative_int = number_type(int, lambda v: v >= 0, "an integer >= 0")
positive_float = number_type(float, lambda v: 0 < v < math.inf, "a positive finite number")
probability = number_type(float, lambda v: 0 <= v < 1, "a number in [0, 1)")


TRAIN_MODEL = dict(cell="gru", attention="additive", style="bahdanau", embed=64, hidden=128, layers=1)
# The Transformer's (--arch transformer): --layers counts encoder and decoder layers each;
# --max-len sizes the position table (the longest source or target with <start> it takes).
TRANSFORMER_MODEL = dict(d_model=128, heads=4, ff=512, layers=2, max_len=512)
ARCHS = ("seq2seq", "transformer")
# Which model options belong to which architecture (given with the other, they are an error).
SEQ2SEQ_FLAGS = ("cell", "attention", "style", "embed", "hidden", "bidirectional")
TRANSFORMER_FLAGS = ("d_model", "heads", "ff", "max_len")


def add_model_options(parser: argparse.ArgumentParser, defaults: dict, when: str = "",
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
    parser.add_argument("--embed", type=positive_int, default=default("embed"),
                        help=f"{when}embedding size (default {defaults['embed']})")
    parser.add_argument("--hidden", type=positive_int, default=default("hidden"),
                        help=f"{when}state size (default {defaults['hidden']})")
    parser.add_argument("--layers", type=positive_int, default=default("layers"),
                        help=f"{when}stacked layers (default {defaults['layers']})")
    parser.add_argument("--bidirectional", action="store_true", default=None if unset else False,
                        help=f"{when}a bidirectional encoder")


non_negative_float = number_type(float, lambda v: 0 <= v < math.inf, "a finite number >= 0")


def add_beam(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--beam", type=positive_int, default=None, metavar="K",
                        help="beam search with K hypotheses (default: greedy)")
    parser.add_argument("--length-penalty", type=non_negative_float, default=None, metavar="ALPHA",
                        help="with --beam: score a hypothesis by log P / ((5 + |Y|) / 6)^ALPHA (Wu et "
                             "al. 2016; default 1; 0 ranks by log P alone)")


def beam_options(args) -> dict:
    """``--beam`` and ``--length-penalty`` as keyword arguments of the decoders."""
    if args.length_penalty is not None and args.beam is None:
        raise UsageError("--length-penalty scores beam search hypotheses: it needs --beam K")
    return dict(beam=args.beam, length_penalty=1.0 if args.length_penalty is None else args.length_penalty)


def add_compile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile", action="store_true",
                        help="replay every decoding step as a compiled plan (ta.compile): the same "
                             "outputs; each batch shape is captured first (an eager step and its "
                             "recording), so it pays only where many batches share few shapes")


def compile_options(args, model) -> dict:
    """``--compile`` as a keyword argument of the decoders, refused for a model whose decoding
    does not compile (a usage error, before any work): the decoders' own test,
    ``decoding_compiles`` (the Transformer and the Seq2Seq pass it)."""
    if not args.compile:
        return {}
    if not decoding_compiles(model):
        raise UsageError(f"--compile decodes a checkpoint whose decoding compiles; this one holds a "
                         f"{type(model).__name__}, which decodes eagerly (leave --compile out)")
    return {"compile": True}


# More threads than cores only makes them wait for each other.
MAX_THREADS = os.cpu_count() or 1
thread_count = number_type(int, lambda v: 1 <= v <= MAX_THREADS,
                           f"an integer from 1 to {MAX_THREADS} (the cores here)")


def add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=thread_count, default=1, metavar="N",
                        help="threads for BLAS and Numba, at most the number of cores (default 1: a "
                             "small model's products gain nothing from more, and waiting threads "
                             "collapse on a busy machine)")


def set_threads(n: int) -> str:
    """Apply ``--threads``; returns what to print about it."""
    ta.set_num_threads(n)
    return f"threads: {n} for BLAS and Numba"



@contextmanager
def threads_restored(args):
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


def writable_directory(path: Path, flag: str) -> Path:
    """Check an output folder can be made and written before the work, not after it."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create {flag} {path}: {err.strerror or err}") from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"cannot write to {flag} {path}")
    return path


def add_transformer_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``--arch transformer`` (None when not given)."""
    parser.add_argument("--d-model", type=positive_int, default=None,
                        help=f"transformer: model size (default {TRANSFORMER_MODEL['d_model']})")
    parser.add_argument("--heads", type=positive_int, default=None,
                        help=f"transformer: attention heads, dividing --d-model "
                             f"(default {TRANSFORMER_MODEL['heads']})")
    parser.add_argument("--ff", type=positive_int, default=None,
                        help=f"transformer: feed-forward size (default {TRANSFORMER_MODEL['ff']})")
    parser.add_argument("--max-len", type=positive_int, default=None, metavar="N",
                        help=f"transformer: the position table's size, the longest source (and target "
                             f"with <start>) the model can read, now and when it translates "
                             f"(default {TRANSFORMER_MODEL['max_len']}; longer data is refused)")


def check_arch_flags(args, arch: str) -> None:
    """Refuse the options of the other architecture, naming them."""
    foreign = TRANSFORMER_FLAGS if arch == "seq2seq" else SEQ2SEQ_FLAGS
    given = [f"--{name.replace('_', '-')}" for name in foreign if getattr(args, name, None) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} not an option of "
                         f"--arch {arch}")


def build_model(src_vocab, tgt_vocab, arch: str = "seq2seq", **config):
    """``ta.models.Seq2Seq`` or (``arch="transformer"``) ``ta.models.Transformer`` from
    command-line settings, its errors as one line."""
    try:
        if arch == "transformer":
            return ta.models.Transformer(src_vocab, tgt_vocab, **config)
        return ta.models.Seq2Seq(src_vocab, tgt_vocab, **config)
    except ValueError as err:
        raise UsageError(str(err)) from None
    except MemoryError:
        sizes = ", ".join(f"{key} {value}" for key, value in config.items() if isinstance(value, int))
        raise UsageError(f"a model of {sizes} does not fit in memory; choose smaller sizes") from None


def writable(path: Path, flag: str = "--out") -> Path:
    """Check an output file can be written before the work, not after it: the library's check
    (``ta.arguments.check_writable_file``, the way ``atomic_file`` writes), after making the
    folder the file goes in, as a command line user expects of an output path."""
    if not path.is_dir() and not path.exists():
        try:
            Path(os.path.realpath(path)).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UsageError(f"cannot create the directory of {flag} {path}: {err}") from None
    try:
        return check_writable_file(path, flag, "tinygrad-attn")
    except ValueError as err:
        raise UsageError(str(err).removeprefix("tinygrad-attn: ")) from None


def regular_output(path: Path, flag: str, why: str) -> Path:
    """``writable``, and a regular file (or a link to one, or nothing yet): for outputs the
    command reads back or writes more than once."""
    writable(path, flag)
    if path.exists() and not stat.S_ISREG(os.stat(path).st_mode):
        raise UsageError(f"{flag} {path} is not a regular file ({why})")
    return path


def same_file(a, b) -> bool:
    """Whether two paths name one file, links resolved (also when neither exists yet)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def refuse_inputs(output, described: str, inputs) -> None:
    """Refuse an output that is one of the run's inputs (links resolved): writing it would
    destroy what the run reads.  ``described``: the output as the message names it ("--out
    run.ckpt"); ``inputs``: (what, path) pairs, e.g. ("--data pairs.tsv", "pairs.tsv")."""
    for what, path in inputs:
        if path is not None and same_file(output, path):
            raise UsageError(f"{described} is the same file as {what}, an input of this run: writing "
                             f"it would destroy it; choose another path")


def source_files(source: dict | None) -> list[tuple[str, str]]:
    """The files of pairs a run recorded in its checkpoint, as (what, path) pairs."""
    source = source or {}
    return [(f"the run's {name} file {source[name]}", source[name]) for name in ("data", "valid", "test")
            if source.get(name)]


def inputs_of(flags: dict) -> list[tuple[str, str]]:
    """{flag: path} -> (what, path) pairs for ``refuse_inputs``."""
    return [(f"{flag} {path}", path) for flag, path in flags.items() if path is not None]


def check_length(tokens, model, what: str) -> None:
    """Refuse a source longer than ``model``'s position table (None: no model yet), before any
    work: the decoders' own rule (``check_source_lengths``), worded for a command line, with
    the source as the user gave it and the ``--max-len`` of a model that reads it."""
    try:
        check_source_lengths(model, [len(tokens)], what)
    except ShapeError:
        raise UsageError(f"{what} has {len(tokens)} tokens, longer than the {type(model).__name__}'s "
                         f"position table (max_len={model.max_src_len}); shorten it, or train a model with "
                         f"--max-len {len(tokens)} or more") from None


@contextmanager
def model_errors():
    """An input the checks above did not foresee, which the model refuses (ShapeError and
    other ValueErrors name the op and the shapes), as one line rather than a traceback."""
    try:
        yield
    except ValueError as err:
        raise UsageError(str(err)) from None


# ---------------------------------------------------------------- checkpoints and sources


def load_checkpoint(path: str):
    if not Path(path).is_file():
        what = "is a directory" if Path(path).is_dir() else "does not exist"
        raise UsageError(f"the checkpoint {path} {what}")
    try:
        return ta.models.load_checkpoint(path)
    except SerializationError as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(f"cannot read the checkpoint {path}: {err.strerror or err}") from None
    except MemoryError:
        raise UsageError(f"the model in {path} does not fit in memory") from None
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"{path} is not a readable model checkpoint "
                         f"({type(err).__name__}: {err})") from None


def check_source(text: str, info, model=None) -> None:
    """Fail with the tokens the source vocabulary lacks (they would become <unk>), or when
    ``model``'s position table is too short for the text."""
    tokens = info.tokenize(text)
    if not tokens:
        raise UsageError(f"{text!r} has nothing to translate")
    shown = text if len(text) <= 40 else text[:37] + "..."
    check_length(tokens, model, f"{shown!r}")
    missing = list(dict.fromkeys(t for t in tokens if t not in info.src_vocab))
    if not missing:
        return
    kind = "characters" if info.level == "char" else "words"
    known = info.src_vocab.tokens[len(ta.data.SPECIALS):]
    shown = "".join(known) if info.level == "char" else f"{len(known)} words"
    raise UsageError(f"{text!r} has {kind} the {info.name} model's source vocabulary lacks: "
                     f"{', '.join(repr(t) for t in missing)} (it knows: {shown})")
