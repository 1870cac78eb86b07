"""Decoding many sources in batches, and scoring a model with the field's metrics.

    outputs = ta.models.translate_tokens(model, sources, src_vocab, tgt_vocab)   # [(tokens, attn)]
    ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
    # {'n': 500, 'exact_match': 0.98, 'token_error_rate': 0.004, 'bleu': 99.1, 'chrf': 99.6}
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np

from .. import data, metrics
from ..autograd import no_grad
from ..functional import cross_entropy
from .decoding import check_source_lengths, default_max_len
from .seq2seq import Seq2Seq
from .transformer import Transformer

Model = Seq2Seq | Transformer          # what decodes, evaluates, trains and checkpoints


def translate_tokens(model: Model, sources: Sequence, src_vocab: data.Vocab, tgt_vocab: data.Vocab,
                     max_len: int | None = None, beam: int | None = None, batch_size: int = 256,
                     n_best: int | None = None, length_penalty: float = 1.0,
                     compile: bool = False) -> list:  # noqa: A002
    """Decode token lists: returns one (output tokens, attention (L, S) or None) per source,
    in the order given, the attention cut to the output's tokens (its ``<end>`` included)
    and the source's; with ``n_best``, per source a list of (output tokens, ``Hypothesis``)
    pairs, best first, each hypothesis' attention cut the same way.

    Sources are decoded ``batch_size`` at a time, sorted by length so a batch pads little;
    greedy decoding stops a batch once every row has produced ``<end>`` or reached its limit.
    Every limit is the source's own, so a source decodes the same in any batch.

    A source longer than the model can encode (its ``max_src_len``: the Transformer's
    position table) is refused before any source is decoded.  An empty source decodes like
    any other, as a row of only padding (``ta.models.decoding``): the same output for every
    empty source, with an attention of 0 columns.

    Args:
        sources: token lists.  max_len: tokens to produce at most, ``<end>`` included
            (default: each source's own ``default_max_len``, twice its length plus 10);
            either is capped by the model's ``max_tgt_len`` (the Transformer's position
            table).  beam: beam width (None: greedy).
        n_best: the hypotheses to return per source (needs ``beam`` >= ``n_best``).
        length_penalty: Wu et al.'s alpha for beam search.
        compile: every decoding step replays a ``ta.compile`` plan (the model's ``greedy`` and
            ``beam_search`` with ``compile=True``): the same outputs, bit for bit.
    """
    return _translate(model, sources, src_vocab, tgt_vocab, max_len, beam, batch_size, n_best, length_penalty,
                      "translate_tokens", compile)


def decoding_compiles(model) -> bool:
    """Whether ``model``'s decoders take ``compile=True`` (replay ``ta.compile`` plans): a
    ``greedy`` with a ``compile`` parameter, as the Transformer's and the Seq2Seq's.  What
    ``compile=True`` here, and the command line's ``--compile``, ask of a model."""
    return "compile" in inspect.signature(model.greedy).parameters


def _translate(model, sources, src_vocab, tgt_vocab, max_len, beam, batch_size, n_best, length_penalty,
               where: str, compile: bool = False) -> list:  # noqa: A002
    """``translate_tokens``, its errors naming ``where`` (the public function called)."""
    if batch_size < 1:
        raise ValueError(f"{where}: batch_size must be >= 1, got {batch_size}")
    if n_best is not None and (beam is None or n_best > beam):
        raise ValueError(f"{where}: n_best={n_best} needs a beam of at least {n_best}, got beam={beam}")
    lengths = [len(source) for source in sources]
    check_source_lengths(model, lengths, where)
    if compile and not decoding_compiles(model):
        raise ValueError(f"{where}: compile=True needs a model whose decoding compiles (a Transformer or a "
                         f"Seq2Seq); {type(model).__name__} decodes eagerly")
    compiled = {"compile": True} if compile else {}
    order = sorted(range(len(sources)), key=lambda index: lengths[index])
    widest = getattr(model, "max_src_len", None)          # padding never passes the position table
    results: list = [None] * len(sources)
    for begin in range(0, len(order), batch_size):
        chunk = order[begin : begin + batch_size]
        chunk_sources = [sources[index] for index in chunk]
        src = _padded_columns(data.encode_batch(chunk_sources, src_vocab), widest)  # (B, S)
        # Each row's own limit: a row's output never depends on the others in its batch.
        limit = max_len if max_len is not None else default_max_len(np.array([lengths[i] for i in chunk]))
        if n_best is not None:
            found = model.beam_search(src, beam=beam, max_len=limit, length_penalty=length_penalty,
                                      n_best=n_best, **compiled)
            for index, source, hypotheses in zip(chunk, chunk_sources, found, strict=True):
                for hypothesis in hypotheses:
                    if hypothesis.attention is not None:
                        hypothesis.attention = hypothesis.attention[..., : len(source)]
                results[index] = [(tgt_vocab.decode(h.tokens), h) for h in hypotheses]
            continue
        if beam is None:
            ids, weights = model.greedy(src, max_len=limit, **compiled)
        else:
            ids, weights = model.beam_search(src, beam=beam, max_len=limit, length_penalty=length_penalty,
                                             **compiled)
        for row, (index, source) in enumerate(zip(chunk, chunk_sources, strict=True)):
            tokens = tgt_vocab.decode(ids[row])
            produced = len(tokens) + (1 if data.END in ids[row] else 0)
            attention = None if weights is None else weights[row, :produced, : len(source)]
            results[index] = (tokens, attention)
    return results


def decode(model: Model, sources: Sequence, src_vocab: data.Vocab, tgt_vocab: data.Vocab,
           max_len: int | None = None, beam: int | None = None, batch_size: int = 256,
           length_penalty: float = 1.0, compile: bool = False) -> list[list[str]]:  # noqa: A002
    """The output tokens for each source (``translate_tokens`` without the attention)."""
    return _decode(model, sources, src_vocab, tgt_vocab, max_len, beam, batch_size, length_penalty, "decode",
                   compile)


#: A batch's sources are padded to a multiple of this many columns.  Padding is invisible in
#: the outputs (a source decodes the same in any batch), and it keeps a test set's batch
#: shapes few: CMUdict's 6,298 test words, sorted by length into batches of 256, have 10
#: source widths, 5 once padded, so a compiled decode captures 5 plans of its step where it
#: reached the cap on plans and ran the rest eagerly.  Eager decoding pads the same way, so
#: compiled and eager see the same batches.
SOURCE_COLUMNS = 4


def _padded_columns(src: np.ndarray, widest: int | None) -> np.ndarray:
    """``src`` (B, S) with padding columns up to a multiple of ``SOURCE_COLUMNS``, at most
    ``widest`` columns (a Transformer's position table; None: no bound)."""
    extra = -src.shape[1] % SOURCE_COLUMNS
    if widest is not None:
        extra = max(0, min(extra, widest - src.shape[1]))
    return np.pad(src, ((0, 0), (0, extra)), constant_values=data.PAD) if extra else src


def _decode(model, sources, src_vocab, tgt_vocab, max_len, beam, batch_size, length_penalty, where: str,
            compile: bool = False):  # noqa: A002
    found = _translate(model, sources, src_vocab, tgt_vocab, max_len, beam, batch_size, None, length_penalty,
                       where, compile)
    return [tokens for tokens, _ in found]


def evaluate(model: Model, pairs: Sequence, src_vocab: data.Vocab, tgt_vocab: data.Vocab,
             batch_size: int = 256, max_len: int | None = None, beam: int | None = None,
             return_outputs: bool = False, length_penalty: float = 1.0, compile: bool = False):  # noqa: A002
    """Decode every distinct source of ``pairs`` (greedy, or beam search with ``beam`` and Wu
    et al.'s ``length_penalty`` alpha) and score the outputs against the source's targets with
    ``ta.metrics.score``.

    A source that occurs in several pairs (a word with two pronunciations) is decoded once and
    scored against all its targets: it is right if it matches any of them.  Decoding is
    ``translate_tokens``': each source's own limit (so the scores do not depend on
    ``batch_size``), a source too long for the model refused before any decoding, an empty
    source decoded like any other; ``compile`` replays compiled decoding steps (the same
    outputs and scores).

    Returns:
        ``{"n": distinct sources, "exact_match", "token_error_rate", "bleu", "chrf"}``, plus
        ``"wer"`` when some source has several targets (see ``ta.metrics``); with
        ``return_outputs``, (that dict, [(source tokens, output tokens, references)]).
    """
    if not pairs:
        raise ValueError("evaluate: no pairs to evaluate")
    grouped = _references(pairs)
    sources = [source for source, _ in grouped]
    outputs = _decode(model, sources, src_vocab, tgt_vocab, max_len, beam, batch_size, length_penalty,
                      "evaluate", compile)
    refs = [targets if len(targets) > 1 else targets[0] for _, targets in grouped]
    scores = metrics.score(outputs, refs)
    if not return_outputs:
        return scores
    rows = [(source, output, targets) for (source, targets), output in zip(grouped, outputs, strict=True)]
    return scores, rows


def _references(pairs: Sequence) -> list:
    """``ta.data.references`` (each distinct source once, with its targets), an empty source
    included: a data set refuses one, decoding does not (``translate_tokens``)."""
    empty = {index for index, pair in enumerate(pairs) if _has_empty_source(pair)}
    if not empty:
        return data.references(pairs)
    # data.references checks and groups the other pairs; the empty sources join as one more
    # source, where the first of them occurs (references keeps the order of first occurrence).
    rest = data.references([pair for index, pair in enumerate(pairs) if index not in empty])
    targets: list = []
    for index in sorted(empty):
        target = list(pairs[index][1])
        if target not in targets:
            targets.append(target)
    before = len({tuple(pairs[index][0]) for index in range(min(empty))})
    return [*rest[:before], ([], targets), *rest[before:]]


def _has_empty_source(pair) -> bool:
    return (isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2
            and isinstance(pair[0], Sequence) and not isinstance(pair[0], str) and len(pair[0]) == 0)


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


def translate(model: Model, text: str, task_like, max_len: int | None = None, beam: int | None = None,
              compile: bool = False):  # noqa: A002
    """Translate one string: returns (output text, source tokens, output tokens, attention
    (output tokens + <end>, source tokens) or None).  ``task_like`` gives ``tokenize``,
    ``detokenize`` and the vocabularies (a Task or a Checkpoint).  As ``translate_tokens``: a
    text too long for the model is refused before decoding, and a text with no tokens decodes
    as an empty source.  ``compile``: as ``translate_tokens``'."""
    source = task_like.tokenize(text)
    [(tokens, attention)] = _translate(model, [source], task_like.src_vocab, task_like.tgt_vocab, max_len,
                                       beam, 256, None, 1.0, "translate", compile)
    return task_like.detokenize(tokens), source, tokens, attention
