"""Training a Seq2Seq or a Transformer: teacher forcing with Adam, validation, the best
weights kept, early stopping, a learning-rate schedule, gradient clipping, a log, and runs
that resume exactly.

    task = ta.data.load("dates")
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, hidden=128)
    history = ta.models.train(model, task, steps=1500)                 # a quick run
    history = ta.models.train(model, task, steps=20_000, checkpoint="run.ckpt", eval_every=500,
                              patience=10, schedule="cosine", warmup=500)
    # ... interrupted (Ctrl-C writes run.ckpt first); later, with the same task:
    model, info = ta.models.load_checkpoint("run.ckpt")
    history = ta.models.train(model, task, steps=20_000, checkpoint="run.ckpt", resume=True)

A resumed run ends with the same weights, bit for bit, as a run that was never stopped (same
seed and thread count): the checkpoint holds the last step's weights, Adam's moments, the
schedule, the random generator (dropout) and the step, and the batch order is a function of
the seed and the step alone.  Ctrl-C (SIGINT) and SIGTERM (``timeout``, a scheduler, a
container stop) both save such a checkpoint before training ends; a loss that is no longer
finite ends training with FloatingPointError and leaves the last checkpoint as it was.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .. import data, nn, optim
from .. import random as _random
from ..arguments import check_flag, check_int, check_number, check_writable_file
from ..compiled import compile as compile_step
from ..serialize import write_text
from ..tensor import Tensor
from .checkpoint import load_checkpoint, save_checkpoint
from .evaluation import Model, decoding_compiles, evaluate, validation_loss

SCHEDULES = ("constant", "cosine", "plateau")

# What a resumed run takes from its checkpoint, not from the call: they decide the batches,
# the updates and when the run evaluates.
_RUN_SETTINGS = ("batch_size", "lr", "clip", "seed", "schedule", "warmup", "eval_every", "patience", "bucket",
                 "label_smoothing", "average_last")
# The settings a checkpoint written before they existed lacks: what such a run trained with.
_ADDED_SETTINGS = {"label_smoothing": 0.0, "average_last": 0}


class TrainingInterrupted(KeyboardInterrupt):
    """Training ended by a signal (Ctrl-C's SIGINT, or SIGTERM) after the step in progress,
    the run saved first when it has a checkpoint; ``signal`` is the signal's number."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.signal = signal_number


# What ends a run the way Ctrl-C does: SIGTERM is what timeout, schedulers and container stops send.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM") if hasattr(signal, name))


def log_path(checkpoint) -> Path:
    """Where ``train`` writes the evaluations of a run checkpointed at ``checkpoint``: the
    same name with the suffix ``.jsonl`` (``run.ckpt`` -> ``run.jsonl``)."""
    path = Path(checkpoint)
    return path.with_name(path.stem + ".jsonl") if path.suffix else path.with_name(path.name + ".jsonl")


def train(model: Model, task: data.Task, steps: int = 1000, batch_size: int = 64, lr: float = 3e-3,
          clip: float | None = 1.0, seed: int = 0, time_limit: float | None = None,
          callback: Callable[[dict], None] | None = None, optimizer: optim.Optimizer | None = None, *,
          eval_every: int | None = None, patience: int | None = None, schedule: str = "constant",
          warmup: int = 0, checkpoint=None, resume: bool = False, restore_best: bool = True,
          eval_batch_size: int = 256, extras: dict | None = None, bucket: int = 1, compile: bool = False,
          pad_to: int | str | None = None, label_smoothing: float = 0.0, average_last: int = 0) -> list[dict]:
    """Teacher-forced training with Adam on random batches of ``task.train``, validated on
    ``task.valid``.

    Args:
        model: the Seq2Seq or Transformer to train (in place).
        task: a ``ta.data.Task``; its vocabularies must match the model's sizes.
        steps: the run's total optimizer steps (a resumed run continues up to it).
        batch_size: pairs per step.  lr: Adam's (peak) learning rate.
        clip: clip the gradients' global norm to this (None: no clipping).
        seed: seeds the batch order, and dropout through a generator of the run's own
            (``ta.random.using``): a run is reproducible, also while other threads train.
        time_limit: stop after this many seconds of this call even if ``steps`` are not done
            (like Ctrl-C, a stop that ``resume`` continues exactly; the steps since the last
            evaluation are saved but not scored; with ``average_last`` the last step's
            weights close the average).
        callback: called after every step with the step's record (below), e.g. to drive a
            progress bar.
        optimizer: continue with this optimizer, at its own learning rate (default: a new
            Adam at ``lr``).
        eval_every: score the validation pairs every this many steps and at step ``steps``
            (default: ten times a run when ``task.valid`` has pairs; 0: never).
        patience: stop when this many evaluations in a row have not improved the best
            validation exact match (ties: lower validation loss) (None: never stop early).
        schedule: the learning rate: "constant"; "cosine" (``optim.WarmupCosine``: decays to
            0 at ``steps``); "plateau" (``optim.ReduceLROnPlateau`` on the validation exact
            match: halved after 2 evaluations without improvement).
        warmup: steps of linear warm-up from 0 to ``lr`` ("constant" and "cosine").
        checkpoint: a path: after every evaluation, at the end and on Ctrl-C or SIGTERM,
            write a checkpoint there holding the best weights (for ``evaluate``/``translate``)
            and the state to resume from, and append each evaluation to
            ``log_path(checkpoint)`` as one JSON line (strict JSON: no NaN).  A symbolic link
            is written through to its target.
        resume: continue the run saved at ``checkpoint``.  The run's own batch_size, lr,
            clip, seed, schedule, warmup, eval_every, patience, bucket, label_smoothing and
            average_last are read from it (the arguments given for them here are ignored);
            ``steps`` and ``time_limit`` are this call's.
        restore_best: after a validated run, leave the best weights in ``model`` (else the
            last step's); with ``average_last``, the averaged weights (False is refused
            there: the two ask for different weights).
        eval_batch_size: sources decoded at once when validating.
        extras: JSON-like values stored in every checkpoint written (``Checkpoint.extras``),
            e.g. where the data came from.
        bucket: batches whose pairs are sorted by length together, so a batch pads little
            (``ta.data.sample_batches``; 1: random batches).
        compile: run each step (zero_grad, loss, backward, clipping, the optimizer's update)
            as a ``ta.compile`` plan: captured at the first batch of each padded shape, then
            replayed without Python dispatch.  Ids reach the model as Tensors on its device.
            Validation decodes with compiled steps too (``evaluate(compile=True)``: the same
            outputs and scores as eager decoding).
        pad_to: pad every batch's source and target lengths up to a multiple of this int; or
            "auto" (the default with ``compile``, else no padding): to a shape the run already
            met when that adds at most a quarter to each length, or when its extra columns
            have not yet added up to a capture's cost; else to a new shape at most an eighth
            longer (see ``BatchPadding``).  A compiled run so captures few plans and pads little
            (the dates task: one shape, against three at multiples of 8 with 45% more decoder
            steps).  The padding is masked: results equal an unpadded run's to rounding (an
            eager run's with the same ``pad_to``, on batches with padding, bit for bit).
            "auto" pads by the shapes met in this call, so a resumed compiled run equals an
            uninterrupted one to rounding.
        label_smoothing: eps in [0, 1): the training loss spreads eps of each target token's
            probability evenly over the target vocabulary (``F.cross_entropy``'s, PyTorch's
            definition).  The "loss" records and the log's train_loss are this smoothed loss,
            the one optimized (as PyTorch reports it); the validation loss stays the plain
            cross-entropy, so it compares across runs whatever their smoothing.  A Python
            float fixed for the run: a compiled step holds it as a constant of its plans.
        average_last: 0, or N >= 1: the run ends with the mean of the weights at its last N
            evaluations (checkpoint averaging, as fairseq's average_checkpoints; the mean
            taken in float64, then cast to the weights' dtype), instead of the best ones;
            fewer when the run evaluated fewer times.  It replaces ``restore_best``'s best
            weights everywhere they go: in ``model`` at the end and in the checkpoint's
            model after every evaluation (the average so far; the best step is still found,
            logged, and drives ``patience`` and "plateau").  Needs validation (eval_every >
            0).  The snapshots are part of the training state, so a resumed run averages as
            an uninterrupted one does.  A run that ``time_limit`` stops between evaluations
            closes its average with its last step: the mean of the last N - 1 evaluations'
            weights and the last step's (a budget's last steps, at its lowest rate, are not
            thrown away); that step is no snapshot, so the run resumed from its checkpoint
            continues as an unstopped one.  A signal's stop saves the evaluations' average
            (the run is meant to resume).

    Returns:
        One record per step run in this call: {"step", "loss", "tokens" (target tokens in
        the batch), "seconds" (since the run started, resumed runs included), "lr"}; a step
        that evaluated adds "valid_loss", "valid_exact_match", "best_step" and
        "best_exact_match", and with ``average_last`` "averaged_steps": the evaluations'
        steps whose weights the average holds then (the log's lines, and the checkpoint's
        extras, name them too); the last record of a run whose average a time limit closed
        has "averaged_steps" too, the last of them its own step.

    Every argument is checked before the first step (TypeError or ValueError naming it), and
    so is every training and validation pair against a Transformer's position table
    (``model.max_len``).

    Ctrl-C (SIGINT) or SIGTERM ends training after the step in progress; with ``checkpoint``
    the state is saved first, then ``TrainingInterrupted`` (a KeyboardInterrupt whose
    ``signal`` names the signal) is raised.  The handlers are installed for the call only,
    from the main thread only, and the previous ones put back.

    A loss, validation loss or weight that is not finite (NaN, infinity) ends training with
    FloatingPointError naming the step; the checkpoint keeps the last finite state saved.
    """
    _check_arguments(model, task, time_limit, callback, optimizer, checkpoint, resume, restore_best,
                     eval_batch_size, extras)
    check_flag(compile, "compile", "train")
    if isinstance(pad_to, str) and pad_to != "auto":
        raise ValueError(f"train: pad_to must be an int >= 1 or 'auto', got {pad_to!r}")
    if pad_to is not None and pad_to != "auto":
        check_int(pad_to, "pad_to", "train", low=1)
    settings = _settings(task, steps, batch_size, lr, clip, seed, eval_every, patience, schedule, warmup,
                         bucket, label_smoothing, average_last)
    _check_vocab_sizes(model, task)
    check_position_table(task, model.max_src_len, model.max_tgt_len, type(model).__name__)
    run = _Run(model, task, settings, optimizer, checkpoint, extras or {})
    if resume:
        run.restore(steps)
    if run.settings["average_last"] and not restore_best:
        raise ValueError(f"train: average_last={run.settings['average_last']} ends the run with the average "
                         f"of its last evaluations' weights, restore_best=False with the last step's: "
                         f"give one of them")
    if not resume and checkpoint is not None:
        log_path(checkpoint).unlink(missing_ok=True)      # a new run: an old run's log goes
    return run.loop(steps, time_limit, callback, restore_best, eval_batch_size, compile,
                    pad_to if pad_to is not None else ("auto" if compile else 1))


def _check_arguments(model, task, time_limit, callback, optimizer, checkpoint, resume, restore_best,
                     eval_batch_size, extras) -> None:
    """The arguments ``_settings`` does not cover, so a bad one fails before the first step
    rather than at the first evaluation or the first save."""
    if not isinstance(model, Model):
        raise TypeError(f"train: model must be a ta.models.Seq2Seq or Transformer, got "
                        f"{type(model).__name__}")
    if not isinstance(task, data.Task):
        raise TypeError(f"train: task must be a ta.data.Task, got {type(task).__name__}")
    if time_limit is not None:
        check_number(time_limit, "time_limit", "train", low=0.0)
    if callback is not None and not callable(callback):
        raise TypeError(f"train: callback must be callable or None, got {type(callback).__name__}")
    if optimizer is not None and not isinstance(optimizer, optim.Optimizer):
        raise TypeError(f"train: optimizer must be a ta.optim.Optimizer or None, got "
                        f"{type(optimizer).__name__}")
    check_flag(resume, "resume", "train")
    check_flag(restore_best, "restore_best", "train")
    check_int(eval_batch_size, "eval_batch_size", "train", low=1)
    if extras is not None and (not isinstance(extras, dict) or not all(isinstance(k, str) for k in extras)):
        raise TypeError(f"train: extras must be a dict with str keys or None, got {extras!r:.80}")
    if checkpoint is None:
        if resume:
            raise ValueError("train: resume=True needs the checkpoint to resume from")
        return
    path = check_writable_file(checkpoint, "checkpoint", "train")
    if path.exists() and not path.is_file():
        raise ValueError(f"train: checkpoint {str(path)!r} is not a regular file (a FIFO or a device): a run "
                         f"writes its checkpoint many times and reads it back")
    if log_path(path) == path:
        raise ValueError(f"train: checkpoint {str(path)!r} would be its own log (log_path replaces a "
                         f"suffix with .jsonl); give it another suffix, e.g. .ckpt")
    if resume and not path.is_file():
        raise ValueError(f"train: resume=True but the checkpoint {str(path)!r} does not exist")


def check_position_table(task: data.Task, max_src_len: int | None, max_tgt_len: int | None, owner: str,
                         splits: tuple = ("train", "valid"), where: str = "train",
                         fix: str = "build the model with max_len >= {}") -> None:
    """Refuse a pair of ``task``'s ``splits`` longer than a position table of ``max_src_len``
    source and ``max_tgt_len`` target positions (None: no limit; ``owner``: the model's class),
    before a run: it would end the run at the first batch (or evaluation) that holds it, after
    hours perhaps.  The ValueError starts with ``where`` and names the longest such pair, so
    one ``fix`` (formatted with the length that holds it) takes every pair."""
    if max_src_len is None and max_tgt_len is None:
        return
    worst = None                    # (tokens needed, split, index, the source sets them, pair)
    for split in splits:
        for index, (source, target) in enumerate(getattr(task, split)):
            # The decoder reads <start> + target and predicts target + <end>: one more token.
            long_source = max_src_len is not None and len(source) > max_src_len
            long_target = max_tgt_len is not None and len(target) + 1 > max_tgt_len
            needed = max(len(source) if long_source else 0, len(target) + 1 if long_target else 0)
            if needed and (worst is None or needed > worst[0]):
                worst = (needed, split, index, long_source and len(source) == needed, source, target)
    if worst is None:
        return
    needed, split, index, by_source, source, target = worst
    what = (f"a source of {len(source)} tokens" if by_source else
            f"a target of {len(target)} tokens ({len(target) + 1} with <start>)")
    raise ValueError(f"{where}: {split} pair {index} of task {task.name!r} has {what}, longer than the "
                     f"{owner}'s position table (max_len={max_src_len if by_source else max_tgt_len}); "
                     f"{fix.format(needed)}")


def _settings(task, steps, batch_size, lr, clip, seed, eval_every, patience, schedule, warmup,
              bucket, label_smoothing, average_last) -> dict:
    for name, value, low in (("steps", steps, 1), ("batch_size", batch_size, 1), ("seed", seed, 0),
                             ("warmup", warmup, 0), ("bucket", bucket, 1), ("average_last", average_last, 0)):
        check_int(value, name, "train", low=low)
    label_smoothing = check_number(label_smoothing, "label_smoothing", "train", low=0.0, high=1.0,
                                   high_open=True)
    check_number(lr, "lr", "train", low=0.0, low_open=True)
    if clip is not None:
        check_number(clip, "clip", "train", low=0.0, low_open=True)
    if schedule not in SCHEDULES:
        raise ValueError(f"train: schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    if schedule == "plateau" and warmup:
        raise ValueError("train: warmup applies to the 'constant' and 'cosine' schedules, not 'plateau'")
    if eval_every is None:
        eval_every = max(1, steps // 10) if task.valid else 0
    check_int(eval_every, "eval_every", "train", low=0)
    if eval_every and not task.valid:
        raise ValueError(f"train: eval_every={eval_every} but task {task.name!r} has no validation pairs")
    if (patience is not None or schedule == "plateau") and not eval_every:
        raise ValueError("train: patience and the 'plateau' schedule need validation (eval_every > 0 "
                         "and a task with validation pairs)")
    if average_last and not eval_every:
        raise ValueError(f"train: average_last={average_last} averages the weights of evaluations: it "
                         f"needs validation (eval_every > 0 and a task with validation pairs)")
    if patience is not None:
        patience = check_int(patience, "patience", "train", low=1)
    return {"batch_size": int(batch_size), "lr": float(lr), "clip": None if clip is None else float(clip),
            "seed": int(seed), "schedule": schedule, "warmup": int(warmup), "eval_every": int(eval_every),
            "patience": patience, "bucket": int(bucket), "label_smoothing": label_smoothing,
            "average_last": int(average_last)}


class _Run:
    """One training run's state: what a checkpoint must hold to continue it exactly."""

    def __init__(self, model: Model, task: data.Task, settings: dict, optimizer, checkpoint, extras: dict):
        self.model, self.task, self.settings, self.extras = model, task, settings, extras
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.owns_optimizer = optimizer is None
        self.optimizer = optimizer or optim.Adam(model.parameters(), lr=settings["lr"])
        self.step = 0
        self.seconds_before = 0.0           # training time of the run before this call
        self.best = {"step": 0, "exact_match": None, "loss": None, "since": 0}
        self.best_weights: dict | None = None
        # average_last: (step, weights) at the last evaluations, and their mean.
        self.snapshots: list[tuple[int, dict]] = []
        self.averaged_weights: dict | None = None
        self.closing_step: int | None = None          # the step a time limit's stop added to the average
        self.losses_since_eval: list[float] = []
        self.schedule_state: dict | None = None      # a resumed run's, until the schedule exists
        self.saved_step: int | None = None            # the step the checkpoint file holds
        self.checked_step: int | None = None          # the step whose weights were found finite
        # The run's own generator (dropout): other threads' draws cannot change this run.
        self.generator = np.random.default_rng(settings["seed"])

    # ------------------------------------------------------------ schedule

    def make_schedule(self, steps: int):
        s = self.settings
        if self.owns_optimizer and self.schedule_state is None:
            self.optimizer.lr = s["lr"]      # a resumed run keeps its optimizer's rate instead
        if s["schedule"] == "plateau":
            return optim.ReduceLROnPlateau(self.optimizer, mode="max", factor=0.5, patience=2)
        if s["schedule"] == "cosine":
            return optim.WarmupCosine(self.optimizer, s["warmup"], max(steps, s["warmup"], 1))
        if s["warmup"]:
            return optim.WarmupCosine(self.optimizer, s["warmup"], max(steps, s["warmup"]), final_ratio=1.0)
        return None

    # ------------------------------------------------------------ checkpoints

    def state(self, schedule, seconds: float) -> dict:
        return {"settings": self.settings, "step": self.step, "seconds": seconds,
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "schedule": None if schedule is None else schedule.state_dict(),
                "random": self.generator.bit_generator.state, "best": dict(self.best),
                "losses_since_eval": list(self.losses_since_eval),
                "snapshots": [{"step": step, "weights": w} for step, w in self.snapshots]}

    def kept_weights(self) -> dict | None:
        """The weights a validated run ends with and its checkpoint's model holds: the
        average of the last evaluations' (``average_last``), else the best ones."""
        return self.averaged_weights if self.settings["average_last"] else self.best_weights

    def averaged_extras(self) -> dict:
        if not self.settings["average_last"]:
            return {}
        closing = [] if self.closing_step is None else [self.closing_step]
        return {"averaged_steps": [step for step, _ in self.averaged_snapshots()] + closing}

    def averaged_snapshots(self) -> list[tuple[int, dict]]:
        """The evaluations in the average: all N kept, or the last N - 1 beside a closing step."""
        if self.closing_step is None:
            return self.snapshots
        keep = self.settings["average_last"] - 1
        return self.snapshots[-keep:] if keep else []

    def close_average(self) -> None:
        """A run stopped by its time limit between evaluations: its last step's weights join
        the average in place of the oldest evaluation's.  The snapshots (what a resumed run
        averages) stay the evaluations'."""
        if not self.settings["average_last"] or (self.snapshots and self.snapshots[-1][0] == self.step):
            return
        self.check_weights()
        self.closing_step = self.step
        kept = [w for _, w in self.averaged_snapshots()]
        self.averaged_weights = _average([*kept, self.model.state_dict()])

    def save(self, schedule, seconds: float) -> None:
        if self.checkpoint is not None:
            self.check_weights()           # a checkpoint never holds weights that are not finite
            save_checkpoint(self.checkpoint, self.model, self.task, weights=self.kept_weights(),
                            training=self.state(schedule, seconds),
                            **{**self.extras, "step": self.step, "best": dict(self.best),
                               **self.averaged_extras()})
            self.saved_step = self.step

    # ------------------------------------------------------------ a run that diverged

    def diverged(self, what: str) -> FloatingPointError:
        """The error that ends a run whose numbers stopped being finite, saying what the
        checkpoint still holds."""
        if self.checkpoint is None:
            kept = ""
        elif self.saved_step is None:
            kept = f"; nothing was saved to {self.checkpoint}"
        else:
            kept = f"; {self.checkpoint} keeps step {self.saved_step}, the last one saved"
        return FloatingPointError(f"train: {what} (a learning rate or gradient clip too large?){kept}")

    def check_weights(self) -> None:
        # An evaluation and the save after it look at the same weights: reading every
        # parameter to the host once is enough.
        if self.checked_step == self.step:
            return
        for name, parameter in self.model.named_parameters():
            if not np.isfinite(parameter.numpy()).all():
                raise self.diverged(f"the weights are not finite after step {self.step} ({name})")
        self.checked_step = self.step

    def restore(self, steps: int) -> None:
        saved_model, info = load_checkpoint(self.checkpoint)
        state = info.training
        if state is None:
            raise ValueError(f"train: {self.checkpoint} holds a model but no training state to resume "
                             f"(it was not written by ta.models.train)")
        if saved_model.config != self.model.config:
            raise ValueError(f"train: the model differs from the one in {self.checkpoint}: "
                             f"{self.model.config} against {saved_model.config}")
        if (info.src_vocab, info.tgt_vocab) != (self.task.src_vocab, self.task.tgt_vocab):
            raise ValueError(f"train: task {self.task.name!r} has other vocabularies than the run in "
                             f"{self.checkpoint}: resume with the data it was trained on")
        if state["step"] > steps:
            raise ValueError(f"train: the run in {self.checkpoint} is at step {state['step']}, past "
                             f"steps={steps} (steps is the run's total)")
        try:
            self._restore_state(state, saved_model)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"train: the training state in {self.checkpoint} is damaged or from "
                             f"another version ({type(err).__name__}: {err})") from None
        _truncate_log(log_path(self.checkpoint), self.step)

    def _restore_state(self, state: dict, saved_model: Model) -> None:
        saved = {**_ADDED_SETTINGS, **state["settings"]}
        self.settings = {key: saved[key] for key in _RUN_SETTINGS}
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.seconds_before = int(state["step"]), float(state["seconds"])
        self.saved_step = self.step
        self.best = dict(state["best"])
        self.snapshots = [(int(entry["step"]), dict(entry["weights"]))
                          for entry in state.get("snapshots", [])]
        self.averaged_weights = _average([w for _, w in self.snapshots]) if self.snapshots else None
        # With average_last the file's model is the average; the best weights are not kept.
        has_best = self.best["exact_match"] is not None and not self.settings["average_last"]
        self.best_weights = saved_model.state_dict() if has_best else None
        self.losses_since_eval = [float(x) for x in state["losses_since_eval"]]
        self.schedule_state = state["schedule"]
        self.generator.bit_generator.state = state["random"]

    # ------------------------------------------------------------ the loop

    def step_function(self, parameters: list, compiled: bool):
        """One optimizer step on a batch's (src, tgt_in, tgt_out): the loss is checked before
        backward by a guard kernel (``guard_finite``), so a compiled plan stops there too."""
        clip = self.settings["clip"]

        def step(src, tgt_in, tgt_out):
            self.optimizer.zero_grad()
            loss = self.model.loss(src, tgt_in, tgt_out, label_smoothing=self.settings["label_smoothing"])
            loss.backend.guard_finite(loss._data, _loss_not_finite)
            loss.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(parameters, clip)
            self.optimizer.step()
            return loss

        if not compiled:
            return step
        # Each padded shape is a plan; a run meets a few (lengths in multiples of pad_to).
        return compile_step(step, max_plans=COMPILED_PLANS)

    def loop(self, steps: int, time_limit, callback, restore_best: bool, eval_batch_size: int,
             compiled: bool = False, pad_to: int | str = 1) -> list[dict]:
        s = self.settings
        schedule = self.make_schedule(steps)
        if self.schedule_state is not None:
            schedule.load_state_dict(self.schedule_state)
            if isinstance(schedule, optim.WarmupCosine):
                schedule.total = max(steps, schedule.warmup, 1)       # steps is this call's total
                self.optimizer.lr = schedule.rate(schedule.last_step)
        batches = data.sample_batches(self.task.train, self.task.src_vocab, self.task.tgt_vocab,
                                      s["batch_size"], seed=s["seed"], start=self.step, bucket=s["bucket"])
        parameters = list(self.model.parameters())
        step = self.step_function(parameters, compiled)
        device = parameters[0].device if compiled else None
        if compiled and self.step < steps:
            # A plan guards on which gradients were None as its capture began: all of them at
            # the first step only, so that step's capture would serve it alone (a second
            # capture of every shape, ~8 steps' time).  The step drops them (zero_grad) first.
            for p in parameters:
                if p.requires_grad and p.grad is None:
                    p.grad = Tensor.zeros(*p.shape, dtype=p.dtype, device=p.device)
        limits = (self.model.max_src_len, self.model.max_tgt_len)
        padding = BatchPadding(pad_to, limits)
        self.model.train()
        history, start = [], time.perf_counter()

        def seconds() -> float:
            return self.seconds_before + time.perf_counter() - start

        patience = s["patience"]
        stopped_early = patience is not None and self.best["since"] >= patience     # a resumed run
        # Overflow and NaN warnings would only precede the clearer error of diverged().
        with _stop_signals() as received, _random.using(self.generator), \
                np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            while self.step < steps and not stopped_early:
                batch = next(batches)
                lr = self.optimizer.lr
                ids = padding(batch.src, batch.tgt_in, batch.tgt_out)
                if device is not None:
                    ids = [Tensor(array, device=device) for array in ids]
                try:
                    loss_value = float(step(*ids).item())
                except _LossNotFinite as stop:
                    raise self.diverged(f"the loss is {stop.value} at step {self.step + 1}") from None
                self.step += 1
                if isinstance(schedule, optim.WarmupCosine):
                    schedule.step()
                record = {"step": self.step, "loss": loss_value,
                          "tokens": int(np.sum(batch.tgt_out != data.PAD)), "seconds": seconds(), "lr": lr}
                self.losses_since_eval.append(record["loss"])
                stop = False
                if s["eval_every"] and (self.step % s["eval_every"] == 0 or self.step == steps):
                    stop = self.evaluate(record, schedule, eval_batch_size, compiled)
                    self.save(schedule, seconds())
                history.append(record)
                if callback is not None:
                    callback(record)
                if received:
                    self.save(schedule, seconds())
                    where = f"; resumable from {self.checkpoint}" if self.checkpoint else ""
                    what = "interrupted" if received[0] == signal.SIGINT else \
                        f"terminated ({signal.Signals(received[0]).name})"
                    raise TrainingInterrupted(f"train: {what} at step {self.step}{where}", received[0])
                if stop:
                    break
                if time_limit is not None and time.perf_counter() - start >= time_limit:
                    self.close_average()
                    if self.closing_step is not None:
                        record.update(self.averaged_extras())
                    break
            self.save(schedule, seconds())
        if restore_best and self.kept_weights() is not None:
            self.model.load_state_dict(self.kept_weights())
        return history

    def evaluate(self, record: dict, schedule, batch_size: int, compiled: bool = False) -> bool:
        """Score the validation pairs, keep the best weights, log; True: stop early.  A
        compiled run decodes them with compiled steps (bit for bit eager's outputs): its plans
        are kept with the model and replayed at every evaluation."""
        task, model = self.task, self.model
        self.check_weights()
        valid_loss = validation_loss(model, task.valid, task.src_vocab, task.tgt_vocab, batch_size)
        if not math.isfinite(valid_loss):
            raise self.diverged(f"the validation loss is {valid_loss} at step {self.step}")
        scores = evaluate(model, task.valid, task.src_vocab, task.tgt_vocab, batch_size=batch_size,
                          compile=compiled and decoding_compiles(model))
        exact = scores["exact_match"]
        model.train()
        best = self.best
        better = best["exact_match"] is None or (exact, -valid_loss) > (best["exact_match"], -best["loss"])
        averaging = self.settings["average_last"]
        if better:
            best.update(step=self.step, exact_match=exact, loss=valid_loss, since=0)
            if not averaging:
                self.best_weights = model.state_dict()
        else:
            best["since"] += 1
        if averaging:
            self.snapshots = [*self.snapshots, (self.step, model.state_dict())][-averaging:]
            self.averaged_weights = _average([w for _, w in self.snapshots])
        if isinstance(schedule, optim.ReduceLROnPlateau):
            schedule.step(exact)
        record.update(valid_loss=valid_loss, valid_exact_match=exact, best_step=best["step"],
                      best_exact_match=best["exact_match"], **self.averaged_extras())
        if self.checkpoint is not None:
            train_loss = float(np.mean(self.losses_since_eval))
            line = {"step": self.step, "seconds": round(record["seconds"], 3), "lr": record["lr"],
                    "train_loss": train_loss, "valid_loss": valid_loss, "valid_exact_match": exact,
                    "best_step": best["step"], "best_exact_match": best["exact_match"],
                    **self.averaged_extras()}
            with open(log_path(self.checkpoint), "a", encoding="utf-8") as log:
                log.write(json.dumps(line, allow_nan=False) + "\n")
        self.losses_since_eval = []
        patience = self.settings["patience"]
        return patience is not None and best["since"] >= patience


#: Plans a compiled run keeps (one per padded (S, T) shape).
COMPILED_PLANS = 32
#: What a capture costs over a replay, in replayed steps (the demo model; estimated from the
#: 30- and 150-step runs in bench/RESULTS.md, not timed on its own): what
#: "auto" padding pays in extra columns before it captures a shape of its own.
CAPTURE_STEPS = 8.0


class _LossNotFinite(Exception):
    def __init__(self, value: float):
        super().__init__(value)
        self.value = value


def _loss_not_finite(loss: np.ndarray):
    raise _LossNotFinite(float(loss))


class BatchPadding:
    """Pads each batch's ids as ``train`` does: ``pad_to`` an int (multiples of it) or "auto";
    ``limits`` the model's (max_src_len, max_tgt_len), None for no limit.  Called with
    (src, tgt_in, tgt_out) id arrays, returns them padded with ``ta.data.PAD``.  A loop of
    one's own that compiles its step pads with it to capture the plans ``train`` would:

        padding = ta.models.BatchPadding("auto", (model.max_src_len, model.max_tgt_len))
        src, tgt_in, tgt_out = padding(batch.src, batch.tgt_in, batch.tgt_out)

    "auto" weighs what a compiled run pays.  A new shape is a capture: an eager step and the
    recording, estimated at ~8-10 replayed steps on the demo model (``CAPTURE_STEPS``).  A
    padded column is work at every step that pads to it (a decoder column is an attention
    step, a cell and a readout): multiples of 8 padded the dates task's 11 target columns to
    16, 45% more decoder work at every step, for the sake of few plans.  So a batch takes:

    - the shape met so far that pads least, if it adds at most a quarter (at least 2) to
      each length (to any amount once ``COMPILED_PLANS`` shapes are met);
    - else, if a longer shape was met, that one, its extra columns over the batch's (as a
      fraction of the batch's) charged to the batch's own rung shape, until the charges
      reach a capture's cost: then that rung shape is made (a shape met rarely, like the
      dates task's shortest sources, never costs a capture);
    - else a new shape, each length rounded up to a rung of a ladder at most 1/8 apart
      (11 -> 11, 27 -> 28, 40 -> 40, 100 -> 104).

    Lengths never pass the model's ``limits`` (a Transformer's position table).  The choice
    depends on the batches met before in this call only, so an eager run given "auto" pads
    exactly as a compiled one."""

    def __init__(self, pad_to: int | str, limits: tuple = (None, None)):
        if pad_to != "auto":
            check_int(pad_to, "pad_to", "BatchPadding", low=1)
        if not (isinstance(limits, tuple) and len(limits) == 2):
            raise ValueError(f"BatchPadding: limits must be (max_src_len, max_tgt_len), got {limits!r}")
        for limit, name in zip(limits, ("max_src_len", "max_tgt_len"), strict=True):
            if limit is not None:
                check_int(limit, f"limits' {name}", "BatchPadding", low=1)
        self.pad_to, self.limits = pad_to, limits
        self.shapes: list[tuple] = []
        self.charges: dict[tuple, float] = {}

    def __call__(self, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray) -> list[np.ndarray]:
        shapes = [np.shape(ids) for ids in (src, tgt_in, tgt_out)]
        if any(len(shape) != 2 for shape in shapes) or shapes[1] != shapes[2] \
                or shapes[0][0] != shapes[1][0]:
            raise ValueError(f"BatchPadding: src, tgt_in and tgt_out must be (batch, length) ids with one "
                             f"batch size and tgt_in shaped as tgt_out, got shapes {shapes}")
        lengths = (src.shape[1], tgt_in.shape[1])
        if self.pad_to == "auto":
            wanted = self._auto(lengths)
        else:
            wanted = tuple(length + -length % self.pad_to for length in lengths)
        wanted = tuple(want if limit is None else max(min(want, limit), length)
                       for length, want, limit in zip(lengths, wanted, self.limits, strict=True))
        return [_padded(ids, want) for ids, want in zip((src, tgt_in, tgt_out), wanted + wanted[1:],
                                                        strict=True)]

    def _auto(self, lengths: tuple) -> tuple:
        longer = [shape for shape in self.shapes
                  if all(length <= padded for length, padded in zip(lengths, shape, strict=True))]
        # The least padding among the shapes within the bound (the shortest longer shape
        # overall may be far from it while another one fits).
        close = [shape for shape in longer if all(padded <= length + max(2, length // 4)
                                                  for length, padded in zip(lengths, shape, strict=True))]
        if close or (longer and len(self.shapes) >= COMPILED_PLANS):
            return min(close or longer, key=sum)
        rung = tuple(_rung(length) for length in lengths)
        if longer:
            best = min(longer, key=sum)
            charge = self.charges.get(rung, 0.0) + (sum(best) - sum(lengths)) / sum(lengths)
            if charge < CAPTURE_STEPS:
                self.charges[rung] = charge
                return best
            del self.charges[rung]
        self.shapes.append(rung)
        return rung


def _rung(length: int) -> int:
    """``length`` rounded up to a multiple of the power of two at most an eighth of it."""
    step = 1 << max(0, length.bit_length() - 4)
    return length + -length % step


def _padded(ids: np.ndarray, wanted: int) -> np.ndarray:
    """``ids`` (B, L) with padding columns added up to ``wanted`` (>= L) columns."""
    length = ids.shape[1]
    if wanted == length:
        return ids
    return np.pad(ids, ((0, 0), (0, wanted - length)), constant_values=data.PAD)


def _average(states: list[dict]) -> dict:
    """The mean of state_dicts, name by name: summed in float64 in the order given, divided
    by their count, cast back to each weight's dtype."""
    mean = {}
    for name, first in states[0].items():
        total = first.astype(np.float64)
        for state in states[1:]:
            total = total + state[name]
        mean[name] = (total / len(states)).astype(first.dtype)
    return mean


def _truncate_log(path: Path, step: int) -> None:
    """Drop the log lines of evaluations after ``step``: a run stopped between writing its log
    and its checkpoint would otherwise log those evaluations twice when resumed.  A last line
    cut short (the process killed while writing it) is dropped too."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            evaluation = json.loads(line)
            evaluated = int(evaluation["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            if number == len(lines):
                break
            raise ValueError(f"train: {path}:{number} is not an evaluation's JSON line; move the log "
                             f"away to resume") from None
        if evaluated <= step:
            kept.append(line)
    if len(kept) != len(lines):
        write_text(path, "".join(line + "\n" for line in kept), "train")


@contextmanager
def _stop_signals():
    """Turn Ctrl-C (SIGINT) and SIGTERM into a list of the signals received, which the loop
    reads between steps, so a stop never leaves a half-updated model or optimizer.  Only the
    main thread can take signals; elsewhere no handler is installed and the list stays empty."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum, frame):
        if received:                   # a second signal: the user does not want to wait
            raise KeyboardInterrupt
        received.append(signum)
        what, again = ("interrupted", "Ctrl-C again") if signum == signal.SIGINT else \
            (f"terminated ({signal.Signals(signum).name})", "send it again")
        print(f"\n{what}: finishing the step and saving ({again} to quit at once)", file=sys.stderr)

    previous = {}
    try:
        for number in STOP_SIGNALS:
            previous[number] = signal.signal(number, handler)
        yield received
    finally:
        for number, handler_before in previous.items():
            # None: a handler installed outside Python, which Python cannot put back.
            signal.signal(number, signal.SIG_DFL if handler_before is None else handler_before)


def _check_vocab_sizes(model: Model, task: data.Task) -> None:
    sizes = (model.config["src_vocab"], model.config["tgt_vocab"])
    if sizes != (len(task.src_vocab), len(task.tgt_vocab)):
        raise ValueError(f"train: the model's vocabulary sizes {sizes} differ from task "
                         f"{task.name!r}'s ({len(task.src_vocab)}, {len(task.tgt_vocab)})")
