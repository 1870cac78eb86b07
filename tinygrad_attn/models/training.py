"""Training and evaluation of a Seq2Seq on a ``ta.data`` task, and its checkpoints.

    task = ta.data.load("dates")
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, hidden=128)
    history = ta.models.train(model, task, steps=1500)
    print(ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab))
    ta.models.save_checkpoint("dates.ckpt", model, task)
    model, vocabs = ta.models.load_checkpoint("dates.ckpt")
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from .. import data, nn, optim
from ..random import manual_seed
from ..serialize import SerializationError, load, save
from .seq2seq import Seq2Seq

__all__ = ["train", "evaluate", "translate", "translate_tokens", "save_checkpoint", "load_checkpoint",
           "Checkpoint"]

CHECKPOINT_KIND = "tinygrad_attn.seq2seq"


def train(model: Seq2Seq, task: data.Task, steps: int = 1000, batch_size: int = 64, lr: float = 3e-3,
          clip: float | None = 1.0, seed: int = 0, time_limit: float | None = None,
          callback: Callable[[dict], None] | None = None, optimizer: optim.Optimizer | None = None):
    """Teacher-forced training with Adam on random batches of ``task.train``.

    Args:
        model: the Seq2Seq to train (in place).
        task: a ``ta.data.Task``; its vocabularies must match the model's sizes.
        steps: optimizer steps.  batch_size: pairs per step.  lr: Adam's learning rate.
        clip: clip the gradients' global norm to this (None: no clipping).
        seed: seeds the batch order, and dropout through the engine's generator
            (``ta.manual_seed(seed)`` is called: a run is reproducible, and continuing with
            ``optimizer=`` and the same seed replays the same batches).
        time_limit: stop after this many seconds even if ``steps`` are not done.
        callback: called after every step with the step's record (below), e.g. to drive a
            progress bar.
        optimizer: continue with this optimizer (default: a new Adam).

    Returns:
        One record per step: {"step", "loss", "tokens" (target tokens in the batch),
        "seconds" (since the start)}.
    """
    _check_vocab_sizes(model, task)
    manual_seed(seed)
    optimizer = optimizer or optim.Adam(model.parameters(), lr=lr)
    batches = data.sample_batches(task.train, task.src_vocab, task.tgt_vocab, batch_size, seed=seed)
    model.train()
    history, start = [], time.perf_counter()
    for step in range(1, steps + 1):
        batch = next(batches)
        optimizer.zero_grad()
        loss = model.loss(batch.src, batch.tgt_in, batch.tgt_out)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        record = {"step": step, "loss": float(loss.item()), "tokens": int(np.sum(batch.tgt_out != 0)),
                  "seconds": time.perf_counter() - start}
        history.append(record)
        if callback is not None:
            callback(record)
        if time_limit is not None and record["seconds"] >= time_limit:
            break
    return history


def evaluate(model: Seq2Seq, pairs: Sequence, src_vocab: data.Vocab, tgt_vocab: data.Vocab,
             batch_size: int = 256, max_len: int | None = None, beam: int | None = None) -> dict:
    """Decode every source of ``pairs`` (greedy, or beam search with ``beam``) and compare
    with its target.

    Returns:
        {"exact_match": fraction of outputs equal to their target, "token_accuracy":
        positions predicted right over max(len(target), len(output)) summed over pairs (an
        output too short or too long counts its missing or extra positions wrong), "count":
        number of pairs}.
    """
    if not pairs:
        raise ValueError("evaluate: no pairs to evaluate")
    exact = correct = total = 0
    for begin in range(0, len(pairs), batch_size):
        chunk = pairs[begin : begin + batch_size]
        outputs = translate_tokens(model, [src for src, _ in chunk], src_vocab, tgt_vocab,
                                   max_len=max_len or 2 + max(len(tgt) for _, tgt in chunk), beam=beam)
        for (_, target), (output, _) in zip(chunk, outputs, strict=True):
            exact += output == list(target)
            correct += sum(a == b for a, b in zip(output, target, strict=False))
            total += max(len(target), len(output))
    return {"exact_match": exact / len(pairs), "token_accuracy": correct / max(total, 1),
            "count": len(pairs)}


def translate_tokens(model: Seq2Seq, sources: Sequence, src_vocab: data.Vocab, tgt_vocab: data.Vocab,
                     max_len: int = 50, beam: int | None = None) -> list:
    """Decode token lists: returns one (output tokens, attention (L, S) or None) per source,
    the attention cut to the output's tokens (its ``<end>`` included) and the source's."""
    src = data.encode_batch(sources, src_vocab)
    if beam is None:
        ids, weights = model.greedy(src, max_len=max_len)
    else:
        ids, weights = model.beam_search(src, beam=beam, max_len=max_len)
    results = []
    for row, source in enumerate(sources):
        tokens = tgt_vocab.decode(ids[row])
        produced = len(tokens) + (1 if data.END in ids[row] else 0)
        attention = None if weights is None else weights[row, :produced, : len(source)]
        results.append((tokens, attention))
    return results



def translate(model: Seq2Seq, text: str, task_like, max_len: int = 50, beam: int | None = None):
    """Translate one string: returns (output text, source tokens, output tokens, attention
    (output tokens + <end>, source tokens) or None).  ``task_like`` gives ``tokenize``,
    ``detokenize`` and the vocabularies (a Task or a Checkpoint)."""
    source = task_like.tokenize(text)
    if not source:
        raise ValueError("translate: the input has no tokens")
    [(tokens, attention)] = translate_tokens(model, [source], task_like.src_vocab, task_like.tgt_vocab,
                                             max_len=max_len, beam=beam)
    return task_like.detokenize(tokens), source, tokens, attention


class Checkpoint:
    """What ``load_checkpoint`` returns besides the model: the task's name, vocabularies,
    tokenisation level and the saved extras (step, metrics)."""

    def __init__(self, task: str, src_vocab: data.Vocab, tgt_vocab: data.Vocab, level: str,
                 extras: dict):
        self.name, self.src_vocab, self.tgt_vocab, self.level = task, src_vocab, tgt_vocab, level
        self.extras = extras
        # Tokenisation is the task's: borrow it through a Task with no pairs.
        self._task = data.Task(task, [], [], src_vocab, tgt_vocab, level)

    def tokenize(self, text: str) -> list[str]:
        return self._task.tokenize(text)

    def detokenize(self, tokens) -> str:
        return self._task.detokenize(tokens)


def save_checkpoint(path, model: Seq2Seq, task: data.Task, **extras) -> None:
    """Write the model's config and weights and the task's vocabularies to ``path``
    (atomically, with ``ta.save``); ``extras`` (step, metrics) must be JSON-like."""
    save({"kind": CHECKPOINT_KIND, "config": model.config, "model": model.state_dict(),
          "task": task.name, "level": task.level, "src_vocab": task.src_vocab.to_dict(),
          "tgt_vocab": task.tgt_vocab.to_dict(), "extras": extras}, path)


def load_checkpoint(path) -> tuple[Seq2Seq, Checkpoint]:
    """Rebuild the model saved by ``save_checkpoint``; returns (model in eval mode, Checkpoint)."""
    state = load(path)
    if not isinstance(state, dict) or state.get("kind") != CHECKPOINT_KIND:
        raise SerializationError(f"load_checkpoint: {path} is a tinygrad_attn file but not a seq2seq "
                                 f"checkpoint (written by ta.models.save_checkpoint)")
    model = Seq2Seq(**state["config"])
    model.load_state_dict(state["model"])
    model.eval()
    info = Checkpoint(state["task"], data.Vocab.from_dict(state["src_vocab"]),
                      data.Vocab.from_dict(state["tgt_vocab"]), state["level"], state["extras"])
    return model, info


def _check_vocab_sizes(model: Seq2Seq, task: data.Task) -> None:
    sizes = (model.config["src_vocab"], model.config["tgt_vocab"])
    if sizes != (len(task.src_vocab), len(task.tgt_vocab)):
        raise ValueError(f"train: the model's vocabulary sizes {sizes} differ from task "
                         f"{task.name!r}'s ({len(task.src_vocab)}, {len(task.tgt_vocab)})")
