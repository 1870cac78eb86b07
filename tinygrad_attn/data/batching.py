"""Pairs of token lists -> padded int64 batches for teacher-forced seq2seq training.

For a target ``y_1 .. y_n`` the decoder reads ``tgt_in = <start> y_1 .. y_n`` and is trained to
predict ``tgt_out = y_1 .. y_n <end>``: the two are the same sequence shifted by one step.
Every array is padded with ``PAD`` (0), so ``F.cross_entropy(logits, tgt_out, ignore_index=PAD)``
skips the padding.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from ..arguments import check_int
from .vocab import END, PAD, START, Vocab


class Batch(NamedTuple):
    """One padded batch.

    Attributes:
        src: int64 (B, S) source ids, padded with 0 on the right.
        tgt_in: int64 (B, T) ``<start>`` + target ids, the decoder's input.
        tgt_out: int64 (B, T) target ids + ``<end>``, what the decoder should predict.
        src_lengths: the B source lengths (real tokens in each row of ``src``).
        tgt_lengths: the B lengths of the rows of ``tgt_in``/``tgt_out`` without padding
            (each target's length + 1).
    """

    src: np.ndarray
    tgt_in: np.ndarray
    tgt_out: np.ndarray
    src_lengths: list[int]
    tgt_lengths: list[int]

    @property
    def src_mask(self) -> np.ndarray:
        """bool (B, S), True at real source tokens (the engine's mask convention)."""
        return self.src != PAD


def _pad(rows: Sequence[Sequence[int]]) -> np.ndarray:
    width = max((len(row) for row in rows), default=0)
    out = np.full((len(rows), width), PAD, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def _check_vocab(vocab, name: str, where: str) -> None:
    if not isinstance(vocab, Vocab):
        raise TypeError(f"{where}: {name} must be a Vocab, got {type(vocab).__name__}")


def _encode_pairs(pairs, src_vocab: Vocab, tgt_vocab: Vocab, where: str):
    """Every pair as (source ids, target ids), checked once so batching itself cannot fail."""
    _check_vocab(src_vocab, "src_vocab", where)
    _check_vocab(tgt_vocab, "tgt_vocab", where)
    encoded = []
    for index, pair in enumerate(pairs):
        if not isinstance(pair, Sequence) or isinstance(pair, str) or len(pair) != 2:
            raise TypeError(f"{where}: pair {index} must be a (source tokens, target tokens) pair, "
                            f"got {pair!r:.80}")
        source, target = pair
        if len(source) == 0:
            # An empty source leaves the encoder no states to attend to.
            raise ValueError(f"{where}: pair {index} has an empty source")
        encoded.append((src_vocab.encode(source), tgt_vocab.encode(target)))
    if not encoded:
        raise ValueError(f"{where}: pairs is empty")
    return encoded


def _make_batch(encoded, indices) -> Batch:
    sources = [encoded[i][0] for i in indices]
    targets = [encoded[i][1] for i in indices]
    return Batch(
        src=_pad(sources),
        tgt_in=_pad([[START, *target] for target in targets]),
        tgt_out=_pad([[*target, END] for target in targets]),
        src_lengths=[len(source) for source in sources],
        tgt_lengths=[len(target) + 1 for target in targets],
    )


def batches(pairs: Sequence, src_vocab: Vocab, tgt_vocab: Vocab, batch_size: int,
            shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> Iterator[Batch]:
    """One pass (epoch) over ``pairs`` in padded batches.

    Each batch is padded only to its own longest source and target. The pairs are checked
    and encoded when this is called, so bad input fails here rather than mid-epoch.

    Args:
        pairs: (source tokens, target tokens) pairs, e.g. ``task.train``.
        src_vocab: encodes the sources.
        tgt_vocab: encodes the targets.
        batch_size: pairs per batch (the last one may be smaller).
        shuffle: visit the pairs in a random order drawn from ``seed``; else in order.
        seed: the shuffling seed; the same seed gives the same batches.
        drop_last: leave out a last batch smaller than ``batch_size``.

    Returns:
        an iterator of Batch.

    Example:
        >>> for batch in ta.data.batches(task.train, task.src_vocab, task.tgt_vocab, 64, seed=epoch):
        ...     logits, _ = model(batch.src, batch.tgt_in)                     # (B, T, V)
        ...     loss = F.cross_entropy(logits, batch.tgt_out, ignore_index=ta.data.PAD)
    """
    where = "batches"
    batch_size = check_int(batch_size, "batch_size", where, 1)
    encoded = _encode_pairs(pairs, src_vocab, tgt_vocab, where)
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(encoded))
    else:
        order = np.arange(len(encoded))
    stop = len(order) - len(order) % batch_size if drop_last else len(order)

    def generate() -> Iterator[Batch]:
        for begin in range(0, stop, batch_size):
            yield _make_batch(encoded, order[begin:begin + batch_size].tolist())

    return generate()


def sample_batches(pairs: Sequence, src_vocab: Vocab, tgt_vocab: Vocab, batch_size: int,
                   seed: int = 0, start: int = 0, bucket: int = 1) -> Iterator[Batch]:
    """An endless stream of full batches, for training by a budget of steps.

    The pairs are visited epoch after epoch, each in a fresh random order, and a batch may
    span the end of one epoch and the start of the next, so every batch has ``batch_size``
    rows and every pair is seen equally often (up to one epoch). With fewer pairs than
    ``batch_size``, a batch holds some pairs twice.

    With ``bucket=K > 1``, each run of K batches' pairs is sorted by length, cut into K
    batches and those K shuffled: a batch then holds pairs of similar length and pads little
    (on words of 2-20 letters about half the work of random batches is padding), while
    the order of lengths stays random.

    Epoch e's order is drawn from (``seed``, e) alone, so batch k of the stream is a function
    of the seed, ``bucket`` and k: ``start=k`` begins the stream at batch k exactly as the
    stream from 0 would reach it (a resumed run sees the batches it would have seen).

    Args:
        pairs: (source tokens, target tokens) pairs.
        src_vocab: encodes the sources.
        tgt_vocab: encodes the targets.
        batch_size: pairs per batch.
        seed: the same seed gives the same stream.
        start: the index of the first batch to yield.
        bucket: batches whose pairs are sorted by length together (1: no sorting).

    Returns:
        an infinite iterator of Batch.

    Example:
        >>> stream = ta.data.sample_batches(task.train, task.src_vocab, task.tgt_vocab, 64, bucket=50)
        >>> for step, batch in zip(range(2000), stream):
        ...     ...
    """
    where = "sample_batches"
    batch_size = check_int(batch_size, "batch_size", where, 1)
    start, bucket = check_int(start, "start", where, 0), check_int(bucket, "bucket", where, 1)
    encoded = _encode_pairs(pairs, src_vocab, tgt_vocab, where)
    count = len(encoded)

    orders: dict[int, list[int]] = {}

    def order(epoch: int) -> list[int]:
        # Kept while the stream is in the epoch: drawing a permutation of 100k pairs costs
        # milliseconds, too much to repeat for every batch.
        if epoch not in orders:
            orders.clear()
            orders[epoch] = np.random.default_rng((seed, epoch)).permutation(count).tolist()
        return orders[epoch]

    def positions(begin: int, length: int) -> list[int]:
        """The pair indices at stream positions [begin, begin + length)."""
        epoch, offset = divmod(begin, count)
        out: list[int] = []
        while len(out) < length:
            out.extend(order(epoch)[offset : offset + length - len(out)])
            epoch, offset = epoch + 1, 0
        return out

    def pool(index: int) -> list[list[int]]:
        """Pool ``index``: its ``bucket`` batches, as pair indices, in the order yielded."""
        chosen = positions(index * bucket * batch_size, bucket * batch_size)
        if bucket == 1:
            return [chosen]
        chosen.sort(key=lambda i: (len(encoded[i][0]), len(encoded[i][1])))
        cut = [chosen[k * batch_size : (k + 1) * batch_size] for k in range(bucket)]
        order = np.random.default_rng((seed, count, index)).permutation(bucket).tolist()
        return [cut[k] for k in order]

    def generate() -> Iterator[Batch]:
        index, skip = divmod(int(start), bucket)
        while True:
            for rows in pool(index)[skip:]:
                yield _make_batch(encoded, rows)
            index, skip = index + 1, 0

    return generate()


def encode_batch(token_lists: Sequence[Sequence[str]], vocab: Vocab) -> np.ndarray:
    """Source token lists -> one padded int64 (B, S) array, e.g. for ``model.greedy``.

    Args:
        token_lists: a list of token lists (wrap a single sentence in a list).
        vocab: the source Vocab; unknown tokens become ``UNK``.

    Returns:
        int64 (B, S), padded with 0 to the longest sequence.

    Example:
        >>> src = ta.data.encode_batch([task.tokenize("i love my cat")], task.src_vocab)   # (1, 4)
        >>> ids, weights = model.greedy(src, max_len=20)
    """
    where = "encode_batch"
    _check_vocab(vocab, "vocab", where)
    if isinstance(token_lists, str) or not isinstance(token_lists, Sequence):
        raise TypeError(f"{where}: expected a list of token lists, got {token_lists!r:.80}")
    if not token_lists:
        raise ValueError(f"{where}: token_lists is empty")
    if any(isinstance(tokens, str) for tokens in token_lists):
        raise TypeError(f"{where}: expected a list of token lists, got a list of str "
                        f"{list(token_lists)!r:.80}; wrap one sequence in a list: [tokens]")
    return _pad([vocab.encode(tokens) for tokens in token_lists])
