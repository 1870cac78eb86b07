"""Decoding many sources in batches, and scoring a model with the field's metrics.

    outputs = ta.models.translate_tokens(model, sources, src_vocab, tgt_vocab)   # [(tokens, attn)]
    ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
    # {'n': 500, 'exact_match': 0.98, 'token_error_rate': 0.004, 'bleu': 99.1, 'chrf': 99.6}
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import data, metrics
from ..autograd import no_grad
from ..functional import cross_entropy
from .seq2seq import Seq2Seq
from .transformer import Transformer

Model = Seq2Seq | Transformer          # what decodes, evaluates, trains and checkpoints

__all__ = ["evaluate", "decode", "translate", "translate_tokens", "validation_loss"]


def default_max_len(source_len: int) -> int:
    """How many tokens a decode may produce for a source of ``source_len`` tokens, when the
    caller does not say: enough for outputs up to twice the source's length."""
    return 2 * source_len + 10


def translate_tokens(model: Model, sources: Sequence, src_vocab: data.Vocab, tgt_vocab: data.Vocab,
                     max_len: int | None = None, beam: int | None = None, batch_size: int = 256,
                     n_best: int | None = None, length_penalty: float = 1.0) -> list:
    """Decode token lists: returns one (output tokens, attention (L, S) or None) per source,
    in the order given, the attention cut to the output's tokens (its ``<end>`` included)
    and the source's; with ``n_best``, per source a list of (output tokens, ``Hypothesis``)
    pairs, best first, each hypothesis' attention cut the same way.

    Sources are decoded ``batch_size`` at a time, sorted by length so a batch pads little;
    greedy decoding stops a batch once every row has produced ``<end>``.

    Args:
        sources: token lists.  max_len: tokens to produce at most (default: twice the
            longest source in the batch, plus 10).  beam: beam width (None: greedy).
        n_best: the hypotheses to return per source (needs ``beam`` >= ``n_best``).
        length_penalty: Wu et al.'s alpha for beam search.
    """
    if batch_size < 1:
        raise ValueError(f"translate_tokens: batch_size must be >= 1, got {batch_size}")
    if n_best is not None and (beam is None or n_best > beam):
        raise ValueError(f"translate_tokens: n_best={n_best} needs a beam of at least {n_best}, "
                         f"got beam={beam}")
    order = sorted(range(len(sources)), key=lambda index: len(sources[index]))
    results: list = [None] * len(sources)
    for begin in range(0, len(order), batch_size):
        chunk = order[begin : begin + batch_size]
        chunk_sources = [sources[index] for index in chunk]
        src = data.encode_batch(chunk_sources, src_vocab)                            # (B, S)
        limit = max_len if max_len is not None else default_max_len(src.shape[1])
        if n_best is not None:
            found = model.beam_search(src, beam=beam, max_len=limit, length_penalty=length_penalty,
                                      n_best=n_best)
            for index, source, hypotheses in zip(chunk, chunk_sources, found, strict=True):
                for hypothesis in hypotheses:
                    if hypothesis.attention is not None:
                        hypothesis.attention = hypothesis.attention[..., : len(source)]
                results[index] = [(tgt_vocab.decode(h.tokens), h) for h in hypotheses]
            continue
        if beam is None:
            ids, weights = model.greedy(src, max_len=limit)
        else:
            ids, weights = model.beam_search(src, beam=beam, max_len=limit, length_penalty=length_penalty)
        for row, (index, source) in enumerate(zip(chunk, chunk_sources, strict=True)):
            tokens = tgt_vocab.decode(ids[row])
            produced = len(tokens) + (1 if data.END in ids[row] else 0)
            attention = None if weights is None else weights[row, :produced, : len(source)]
            results[index] = (tokens, attention)
    return results


def decode(model: Model, sources: Sequence, src_vocab: data.Vocab, tgt_vocab: data.Vocab,
           max_len: int | None = None, beam: int | None = None, batch_size: int = 256,
           length_penalty: float = 1.0) -> list[list[str]]:
    """The output tokens for each source (``translate_tokens`` without the attention)."""
    return [tokens for tokens, _ in translate_tokens(model, sources, src_vocab, tgt_vocab, max_len=max_len,
                                                     beam=beam, batch_size=batch_size,
                                                     length_penalty=length_penalty)]


def evaluate(model: Model, pairs: Sequence, src_vocab: data.Vocab, tgt_vocab: data.Vocab,
             batch_size: int = 256, max_len: int | None = None, beam: int | None = None,
             return_outputs: bool = False, length_penalty: float = 1.0):
    """Decode every distinct source of ``pairs`` (greedy, or beam search with ``beam`` and Wu
    et al.'s ``length_penalty`` alpha) and score the outputs against the source's targets with
    ``ta.metrics.score``.

    A source that occurs in several pairs (a word with two pronunciations) is decoded once and
    scored against all its targets: it is right if it matches any of them.

    Returns:
        ``{"n": distinct sources, "exact_match", "token_error_rate", "bleu", "chrf"}``, plus
        ``"wer"`` when some source has several targets (see ``ta.metrics``); with
        ``return_outputs``, (that dict, [(source tokens, output tokens, references)]).
    """
    if not pairs:
        raise ValueError("evaluate: no pairs to evaluate")
    grouped = data.references(pairs)
    sources = [source for source, _ in grouped]
    outputs = decode(model, sources, src_vocab, tgt_vocab, max_len=max_len, beam=beam,
                     batch_size=batch_size, length_penalty=length_penalty)
    refs = [targets if len(targets) > 1 else targets[0] for _, targets in grouped]
    scores = metrics.score(outputs, refs)
    if not return_outputs:
        return scores
    rows = [(source, output, targets) for (source, targets), output in zip(grouped, outputs, strict=True)]
    return scores, rows


def validation_loss(model: Model, pairs: Sequence, src_vocab: data.Vocab, tgt_vocab: data.Vocab,
                    batch_size: int = 256) -> float:
    """Teacher-forced cross-entropy per target token (``<end>`` included) over ``pairs``, in
    eval mode (no dropout); the model's mode is restored after."""
    was_training = model.training
    model.eval()
    total = tokens = 0.0
    try:
        with no_grad():
            for batch in data.batches(pairs, src_vocab, tgt_vocab, batch_size, shuffle=False):
                logits, _ = model(batch.src, batch.tgt_in)                                # (B, T, V)
                count = float(np.sum(batch.tgt_out != data.PAD))
                loss = cross_entropy(logits, batch.tgt_out, ignore_index=data.PAD)
                total += float(loss.item()) * count
                tokens += count
    finally:
        model.train(was_training)
    return total / tokens


def translate(model: Model, text: str, task_like, max_len: int | None = None, beam: int | None = None):
    """Translate one string: returns (output text, source tokens, output tokens, attention
    (output tokens + <end>, source tokens) or None).  ``task_like`` gives ``tokenize``,
    ``detokenize`` and the vocabularies (a Task or a Checkpoint)."""
    source = task_like.tokenize(text)
    if not source:
        raise ValueError("translate: the input has no tokens")
    [(tokens, attention)] = translate_tokens(model, [source], task_like.src_vocab, task_like.tgt_vocab,
                                             max_len=max_len, beam=beam)
    return task_like.detokenize(tokens), source, tokens, attention
