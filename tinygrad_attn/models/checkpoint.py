"""Checkpoints of ``Seq2Seq`` and ``Transformer`` models: the model, its vocabularies and
tokenization, and (for a run that can be resumed) the training state.

    ta.models.save_checkpoint("run.ckpt", model, task, step=1200)
    model, info = ta.models.load_checkpoint("run.ckpt")      # model in eval mode
    info.tokenize("hello"), info.detokenize(tokens), info.training   # None if not resumable

A file is one ``ta.save`` archive (atomic write, no pickle).  ``"model"`` holds the weights
that ``evaluate`` and ``translate`` use (the best ones on the validation set when the run was
validated); ``"training"`` (optional) holds what ``ta.models.train(..., resume=True)`` needs to
continue bit for bit: the last step's weights, the optimizer and schedule state, the random
generator's state and the step.
"""

from __future__ import annotations

import numpy as np

from .. import data
from ..serialize import SerializationError, load, save
from .seq2seq import Seq2Seq
from .transformer import Transformer

__all__ = ["CHECKPOINT_KIND", "ARCHITECTURES"]

CHECKPOINT_KIND = "tinygrad_attn.seq2seq"
#: The model classes a checkpoint can hold, by the name its "arch" field gives (files written
#: before the Transformer have no such field: they hold a Seq2Seq).
ARCHITECTURES = {"seq2seq": Seq2Seq, "transformer": Transformer}


class Checkpoint:
    """What ``load_checkpoint`` returns besides the model: the task's name, vocabularies and
    tokenization, the saved extras (step, metrics, ...) and the training state (or None).

    It tokenizes and detokenizes as the task it was trained on did, so text can be
    translated with nothing but the file.
    """

    def __init__(self, name: str, src_vocab: data.Vocab, tgt_vocab: data.Vocab, tokenization: dict,
                 extras: dict, training: dict | None = None):
        self.name, self.src_vocab, self.tgt_vocab = name, src_vocab, tgt_vocab
        self.extras, self.training = extras, training
        self.task = data.Task.empty(name, src_vocab, tgt_vocab, tokenization)

    @property
    def tokenization(self) -> dict:
        """``{"src": level, "tgt": level, "lowercase": bool}`` as the task had it."""
        return self.task.tokenization

    @property
    def level(self) -> str:
        """The source side's tokenization level ("char", "word" or "space")."""
        return self.task.level

    def tokenize(self, text: str) -> list[str]:
        return self.task.tokenize(text)

    def tokenize_target(self, text: str) -> list[str]:
        return self.task.tokenize_target(text)

    def detokenize(self, tokens) -> str:
        return self.task.detokenize(tokens)

    def detokenize_source(self, tokens) -> str:
        return self.task.detokenize_source(tokens)


def save_checkpoint(path, model: Seq2Seq | Transformer, task: data.Task, weights: dict | None = None,
                    training: dict | None = None, **extras) -> None:
    """Write the model's config and weights and the task's vocabularies and tokenization to
    ``path`` (atomically, with ``ta.save``).

    Args:
        path: the file.  model: its config is saved, and its weights unless ``weights``.
        task: gives the name, vocabularies and tokenization.
        weights: a state_dict to save instead of the model's current one (the best weights of
            a validated run).
        training: the resumable state ``ta.models.train`` keeps (internal layout).
        **extras: JSON-like values (step, metrics, ...), returned as ``Checkpoint.extras``.
    """
    arch = next((name for name, cls in ARCHITECTURES.items() if type(model) is cls), None)
    if arch is None:
        raise TypeError(f"save_checkpoint: a checkpoint holds one of {', '.join(ARCHITECTURES)}, "
                        f"not a {type(model).__name__}")
    state = {"kind": CHECKPOINT_KIND, "arch": arch, "config": model.config,
             "model": model.state_dict() if weights is None else weights,
             "task": task.name, "tokenization": task.tokenization,
             "src_vocab": task.src_vocab.to_dict(), "tgt_vocab": task.tgt_vocab.to_dict(),
             "extras": extras}
    if training is not None:
        state["training"] = training
    save(state, path)


def load_checkpoint(path) -> tuple[Seq2Seq | Transformer, Checkpoint]:
    """Rebuild the model saved by ``save_checkpoint``; returns (model in eval mode, Checkpoint).

    Raises:
        SerializationError: the file is unreadable or not a seq2seq checkpoint.
    """
    state = load(path)
    if not isinstance(state, dict) or state.get("kind") != CHECKPOINT_KIND:
        raise SerializationError(f"load_checkpoint: {path} is a tinygrad_attn file but not a seq2seq "
                                 f"checkpoint (written by ta.models.save_checkpoint)")
    arch = state.get("arch", "seq2seq")
    if arch not in ARCHITECTURES:
        raise SerializationError(f"load_checkpoint: {path} holds a model of architecture {arch!r}, which "
                                 f"this version does not know (it knows {', '.join(ARCHITECTURES)})")
    try:
        model = ARCHITECTURES[arch](**state["config"])
        # The weights' float dtype, not the default float: a float64 run resumes in float64.
        floats = {d for d in (np.asarray(v).dtype for v in state["model"].values()) if d.kind == "f"}
        if len(floats) == 1:
            model.astype(floats.pop())
        model.load_state_dict(state["model"])
        # Files from 0.5 and earlier name one level for both sides and always lower-case.
        tokenization = state.get("tokenization") or {"src": state["level"], "tgt": state["level"],
                                                     "lowercase": True}
        info = Checkpoint(state["task"], data.Vocab.from_dict(state["src_vocab"]),
                          data.Vocab.from_dict(state["tgt_vocab"]), tokenization, state["extras"],
                          state.get("training"))
    except (KeyError, TypeError, ValueError) as err:
        raise SerializationError(f"load_checkpoint: {path} is a seq2seq checkpoint with missing or "
                                 f"damaged fields ({type(err).__name__}: {err})") from None
    except MemoryError:
        raise SerializationError(f"load_checkpoint: the model {path} describes ({state['config']!r:.200}) "
                                 f"does not fit in memory") from None
    model.eval()
    return model, info
