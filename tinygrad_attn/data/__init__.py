"""Seq2seq data: vocabularies, generated tasks and padded batches (numpy only, nothing downloaded).

    import tinygrad_attn as ta
    task = ta.data.load("dates")                  # or "copy", "reverse", "phrases"
    for batch in ta.data.batches(task.train, task.src_vocab, task.tgt_vocab, batch_size=64):
        batch.src, batch.tgt_in, batch.tgt_out    # int64 (B, S), (B, T), (B, T); 0 = <pad>

Every vocabulary reserves ``<pad>``=0, ``<start>``=1, ``<end>``=2 and ``<unk>``=3.
"""

from .batching import Batch, batches, encode_batch, sample_batches
from .phrases import PHRASES, SEED_PAIRS
from .tasks import DATE_FORMATS, TASKS, Task, copy, dates, format_date, load, phrases, reverse
from .vocab import END, PAD, SPECIALS, START, UNK, Vocab

__all__ = [
    "Vocab",
    "PAD",
    "START",
    "END",
    "UNK",
    "SPECIALS",
    "Task",
    "TASKS",
    "load",
    "dates",
    "copy",
    "reverse",
    "phrases",
    "format_date",
    "DATE_FORMATS",
    "PHRASES",
    "SEED_PAIRS",
    "Batch",
    "batches",
    "sample_batches",
    "encode_batch",
]
