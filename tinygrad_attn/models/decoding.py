"""Decoding any encoder-decoder through one small step protocol: greedy decoding and beam
search are written once, here, and ``Seq2Seq`` and ``Transformer`` plug in.

A model decodes through three methods:

    state = model.decode_start(src, **options)      encode (B, S) ids; the state of B rows
    log_probs, attention, state = model.decode_step(state, tokens, t)
        tokens (N,) the previous output ids (``<start>`` at t = 0) -> log-probabilities (N, V)
        float64, the step's attention over the source (N, S) numpy or None, the next state
    state = model.decode_select(state, rows)        the rows ``rows`` of a state (a beam's
                                                    survivors, or one source repeated)

``options`` are the model's own (the Transformer's ``use_cache``), passed through by
``greedy`` and ``beam_search``.  ``decode_step`` gives ``<pad>`` and ``<start>``
probability 0 (-inf): an output holding them would not decode to its tokens.  Ids follow
``ta.data``: 0 ``<pad>``, 1 ``<start>``, 2 ``<end>``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .. import data

__all__ = ["Decodable", "greedy", "beam_search"]

PAD, START, END = data.PAD, data.START, data.END


class Decodable(Protocol):
    """What ``greedy`` and ``beam_search`` need of a model (see the module docstring)."""

    def decode_start(self, src: np.ndarray, **options): ...

    def decode_step(self, state, tokens: np.ndarray, t: int): ...

    def decode_select(self, state, rows: np.ndarray): ...


def greedy(model: Decodable, src: np.ndarray, max_len: int, **options):
    """The most likely token at every step, for every row of ``src`` at once; a batch stops
    once every row has produced ``<end>``.

    Returns:
        (ids (B, L) int64: each row up to and including ``<end>``, then 0 (a row that
        reached ``max_len`` has no ``<end>``); attention (B, L, S) float numpy, zeros after
        ``<end>``, or None for a model without attention).
    """
    state = model.decode_start(src, **options)
    batch = src.shape[0]
    y = np.full(batch, START, dtype=np.int64)
    done = np.zeros(batch, dtype=bool)
    ids, weights = [], []
    for t in range(max_len):
        log_probs, attention, state = model.decode_step(state, y, t)
        y = np.where(done, PAD, log_probs.argmax(axis=-1)).astype(np.int64)
        ids.append(y)
        if attention is not None:
            weights.append(np.where(done[:, None], 0.0, attention))
        done |= y == END
        if done.all():
            break
    return np.stack(ids, axis=1), (np.stack(weights, axis=1) if weights else None)


def beam_search(model: Decodable, src: np.ndarray, beam: int, max_len: int, length_penalty: float = 1.0,
                coverage_penalty: float = 0.0, **options):
    """Decode each source with a beam of ``beam`` hypotheses and keep the best finished one.

    A hypothesis Y of source X is ranked, once it ends, by Wu et al. (2016)'s
    ``log P(Y|X) / lp(Y) + cp(X; Y)`` with ``lp(Y) = ((5 + |Y|) / 6) ** length_penalty`` and
    ``cp = coverage_penalty * sum_j log(min(sum_i a_ij, 1))`` over the real source tokens j
    (a_ij the attention of output i on source j).

    Each step extends every live hypothesis by every token and keeps the ``beam`` best of
    them; a candidate that ends (``<end>``, or any token at ``max_len``) is set aside as
    finished only if it ranks among those ``beam`` best (as fairseq does), so a beam of one
    is greedy decoding.  The search stops once ``beam`` hypotheses have finished.

    Returns:
        (ids (B, L) int64, attention (B, L, S) or None), laid out as ``greedy``'s.
    """
    if src.shape[0] == 0:             # no sources: the empty result greedy gives
        return greedy(model, src, max_len=1, **options)
    found = [_beam_one(model, src[b : b + 1], beam, max_len, length_penalty, coverage_penalty, options)
             for b in range(src.shape[0])]
    length = max(len(tokens) for tokens, _ in found)
    ids = np.zeros((src.shape[0], length), dtype=np.int64)
    with_attention = found[0][1] is not None
    weights = np.zeros((src.shape[0], length, src.shape[1])) if with_attention else None
    for b, (tokens, attention) in enumerate(found):
        ids[b, : len(tokens)] = tokens
        if with_attention:
            weights[b, : len(tokens)] = attention
    return ids, weights


def _beam_one(model: Decodable, src: np.ndarray, beam: int, max_len: int, alpha: float, beta: float,
              options: dict):
    """Beam search for one source (1, S): returns (tokens, attention rows or None)."""
    start = model.decode_start(src, **options)
    real = src[0] != PAD
    source_len = src.shape[1]
    # Live hypotheses: token lists, summed log-probabilities, attention rows (i, S).
    tokens = [[]]
    logp = np.zeros(1)
    attention = [np.zeros((0, source_len))]
    state = start
    has_attention = True
    finished = []                                     # (score, tokens, attention)
    for t in range(max_len):
        live = len(tokens)
        y = np.array([hyp[-1] if hyp else START for hyp in tokens], dtype=np.int64)
        log_probs, weight, new_state = model.decode_step(state, y, t)               # (live, V)
        if weight is None:
            if beta:
                raise ValueError("beam_search: coverage_penalty needs a model with attention")
            has_attention = False
            weight = np.zeros((live, source_len))
        total = logp[:, None] + log_probs                                           # (live, V)
        # 2 * beam candidates: enough to refill the beam even if half of them end here.
        order = np.argsort(-total, axis=None, kind="stable")[: 2 * beam]
        rows, words = np.unravel_index(order, total.shape)
        keep_rows, keep_words = [], []
        for rank, (row, word) in enumerate(zip(rows, words, strict=True)):
            if total[row, word] == -np.inf:               # <pad>, <start>: never produced
                break
            if word == END or t == max_len - 1:
                if rank < beam:       # an ending outside the beam's best would not be kept
                    hyp = tokens[row] + [int(word)]
                    rows_attn = np.vstack([attention[row], weight[row]])
                    score = _ranked(total[row, word], len(hyp), rows_attn, real, alpha, beta)
                    finished.append((score, hyp, rows_attn))
            elif len(keep_rows) < beam:
                keep_rows.append(row)
                keep_words.append(word)
        if len(finished) >= beam or not keep_rows:
            break
        index = np.array(keep_rows)
        tokens = [tokens[r] + [int(w)] for r, w in zip(keep_rows, keep_words, strict=True)]
        logp = total[index, np.array(keep_words)]
        attention = [np.vstack([attention[r], weight[r]]) for r in keep_rows]
        state = model.decode_select(new_state, index)
    if not finished:              # every candidate left was <pad> or <start>: end here
        finished = [(0.0, tokens[0], attention[0])]
    best = max(finished, key=lambda item: item[0])
    return best[1], (best[2] if has_attention else None)


def _ranked(logp: float, length: int, attention: np.ndarray, real: np.ndarray, alpha: float,
            beta: float) -> float:
    """Wu et al. (2016): log P / lp + cp."""
    score = logp / ((5.0 + length) / 6.0) ** alpha
    if beta:
        coverage = np.minimum(attention[:, real].sum(axis=0), 1.0)
        score += beta * float(np.log(np.maximum(coverage, 1e-12)).sum())
    return float(score)
