"""Models built from the engine's layers: ``ta.models.Seq2Seq``, an RNN encoder-decoder with
attention, and what trains, evaluates and saves it; ``BahdanauStep``, one of its decoder
steps written out (for the symbolic check and the pictures)."""

from .bahdanau_step import BahdanauStep
from .seq2seq import Seq2Seq
from .training import (
    Checkpoint,
    evaluate,
    load_checkpoint,
    save_checkpoint,
    train,
    translate,
    translate_tokens,
)

__all__ = ["Seq2Seq", "BahdanauStep", "train", "evaluate", "translate", "translate_tokens", "save_checkpoint",
           "load_checkpoint", "Checkpoint"]
