"""Models built from the engine's layers: ``ta.models.Seq2Seq``, an RNN encoder-decoder with
attention, ``ta.models.Transformer``, and what trains, evaluates and saves them;
``Hypothesis``, one output of ``ta.models.decoding``'s decoders (greedy, sampling, beam
search); ``BahdanauStep``, one of Seq2Seq's decoder steps written out (for the symbolic check
and the pictures)."""

from . import decoding
from .bahdanau_step import BahdanauStep
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .decoding import Hypothesis
from .evaluation import decode, evaluate, translate, translate_tokens, validation_loss
from .seq2seq import Seq2Seq
from .training import SCHEDULES, BatchPadding, TrainingInterrupted, log_path, train
from .transformer import Transformer

__all__ = ["Seq2Seq", "Transformer", "Hypothesis", "decoding", "BahdanauStep", "train", "SCHEDULES",
           "BatchPadding", "log_path", "TrainingInterrupted", "evaluate", "decode", "validation_loss",
           "translate", "translate_tokens", "save_checkpoint", "load_checkpoint", "Checkpoint"]
