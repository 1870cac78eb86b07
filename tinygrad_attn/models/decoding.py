"""Decoding any encoder-decoder through one small step protocol: greedy decoding, sampling and
batched beam search are written once, here, and ``Seq2Seq`` and ``Transformer`` plug in.

A model decodes through three methods:

    state = model.decode_start(src, **options)      encode (B, S) ids; the state of B rows
    log_probs, attention, state = model.decode_step(state, tokens, t)
        tokens (N,) the previous output ids (``<start>`` at t = 0) -> the model's own
        log-softmax over the whole vocabulary (N, V) float64, the step's attention over the
        source (N, S) numpy or None, the next state
    state = model.decode_select(state, rows)        the rows ``rows`` of a state (a beam's
                                                    survivors, or one source repeated)

``options`` are the model's own (the Transformer's ``use_cache`` and ``compile``), passed
through; a model whose ``decode_start`` takes ``max_steps`` is told the most steps the decode
takes (the longest row's limit).  The
log-probabilities are exactly what teacher forcing gives, so a hypothesis' ``log_prob`` is the
model's log P(Y | X).  Choosing a token is another matter: ``<pad>`` and ``<start>`` are never
chosen (an output holding them would not decode to its tokens), nor ``<end>`` before
``min_length``, nor a token that repeats an n-gram under ``no_repeat_ngram_size``; those are
set to -inf for the choice only, and nothing is renormalised.  ``<unk>`` may be produced.
Ids follow ``ta.data``: 0 ``<pad>``, 1 ``<start>``, 2 ``<end>``.

How long a decode runs is each row's own business, so a source decodes the same alone and in
any batch: ``max_len`` is an int or one int per row, and a model may cap it with
``max_tgt_len`` (the Transformer's position table; None: no cap), so a row stops after
min(its max_len, max_tgt_len) tokens.  A model's ``max_src_len`` (None: no limit) refuses a
longer source before any work.  An empty source, a row of only padding (or a src of width 0),
decodes like any other: the encoder has nothing to read, attention gives every column weight 0
and a zero context, and the decoder produces what it produces from nothing, the same output for
every empty source.

Beam search scores a finished hypothesis Y of a source X as Wu et al. (2016) do,

    score = log P(Y | X) / ((5 + |Y|) / 6) ** length_penalty
            + coverage_penalty * sum_j log(min(sum_i a_ij, 1))     over the real source tokens j

with |Y| the tokens produced, ``<end>`` included, and a_ij the attention of output i on source
token j.  It stops a source only when no live hypothesis can still beat the worst of that
source's ``n_best`` best finished ones (``_bound`` says why the bound is safe).
"""

from __future__ import annotations

import inspect
import math
import weakref
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .. import data
from .. import random as ta_random
from ..arguments import check_int, check_number
from ..autograd import ShapeError, no_grad
from ..compiler import reference

__all__ = ["Decodable", "greedy", "sample", "beam_search", "log_softmax", "default_max_len",
           "check_source_lengths", "compiled_functions"]

PAD, START, END = data.PAD, data.START, data.END

MaxLen = int | Sequence[int] | np.ndarray      # one limit for every row, or one per row

#: A preallocated key/value cache's length is a multiple of this many steps.
CACHE_STEPS = 16
#: Plans a model's compiled decode step keeps: greedy and beam search share the step, and a
#: test set decoded in batches sorted by length meets a few source widths and batch sizes
#: of each (``ta.compile``'s default of 8 ran CMUdict's beam search eagerly after greedy).
DECODE_PLANS = 16


class Decodable(Protocol):
    """What the decoders need of a model (see the module docstring)."""

    def decode_start(self, src: np.ndarray, **options): ...

    def decode_step(self, state, tokens: np.ndarray, t: int): ...

    def decode_select(self, state, rows: np.ndarray): ...

    # Optional: how long a source and an output may be (None, or absent: no limit).
    #     max_src_len: int | None       max_tgt_len: int | None


@dataclass
class Hypothesis:
    """One output of one source.

    Attributes:
        tokens: the produced ids, ``<end>`` included when the output has one (an output that
            reached its limit has none).
        score: what beam search ranks by, Wu et al.'s length-normalised log-probability plus
            the coverage term (see the module docstring); greedy decoding and sampling do not
            rank, and report ``log_prob``.
        log_prob: log P(tokens | source) under the model: the sum, over the produced tokens,
            of the model's own log-softmax, which ``model(src, tgt_in)`` gives for them.
        attention: (len(tokens), S) numpy, each produced token's attention over the source's
            S columns (the batch's width: padding columns are 0); the Transformer's is its last
            layer's cross-attention averaged over heads, or with ``average_weights=False``
            every layer and head, (layers, H, len(tokens), S).  None for a model without
            attention.
    """

    tokens: list[int]
    score: float
    log_prob: float
    attention: np.ndarray | None = None


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """The log-softmax of the last axis in float64 (the reference kernel's: the row max
    subtracted before exp), so that scores sum without float32 rounding."""
    return reference.log_softmax(np.asarray(logits, dtype=np.float64), -1)


# ---------------------------------------------------------------- greedy and sampling


def greedy(model: Decodable, src, max_len: MaxLen = 50, min_length: int = 0, no_repeat_ngram_size: int = 0,
           hypotheses: bool = False, **options):
    """The most likely allowed token at every step, for every row of ``src`` at once; a batch
    stops once every row has produced ``<end>`` or reached its limit.

    Args:
        max_len: the most tokens a row produces (``<end>`` included): an int, or one int per
            row (B,); capped by the model's ``max_tgt_len`` (the Transformer's position table),
            so a row's limit is min(max_len, max_tgt_len).

    Returns:
        (ids (B, L) int64: each row up to and including ``<end>``, then 0 (a row that
        reached its limit has no ``<end>``); attention (B, L, S) float numpy, zeros after
        ``<end>``, or None for a model without attention); with ``hypotheses``, one
        ``Hypothesis`` per source instead.
    """
    src = _source(model, src, "greedy")
    limits = _limits(model, "greedy", src, max_len, min_length, no_repeat_ngram_size)
    with inference(model):
        return _one_path(model, src, limits, _argmax, min_length, no_repeat_ngram_size, hypotheses, options)


def sample(model: Decodable, src, max_len: MaxLen = 50, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0, seed=None, min_length: int = 0, no_repeat_ngram_size: int = 0,
           hypotheses: bool = False, **options):
    """Draw each output token from the model's distribution, for every row of ``src`` at once.

    Args:
        max_len: as ``greedy``'s (an int or one per row, capped by ``max_tgt_len``).
        temperature: divides the log-probabilities before the draw (< 1 sharpens, > 1 flattens).
        top_k: draw among the k most likely allowed tokens only (0: all).
        top_p: nucleus sampling (Holtzman et al. 2020): draw among the fewest most likely
            tokens whose probabilities sum to at least ``top_p`` (1: all).  Applied after
            ``top_k``, as in PyTorch's and Hugging Face's samplers.
        seed: an int or a numpy Generator makes the draws reproducible; None draws from the
            engine's generator (``ta.manual_seed``).

    Returns:
        as ``greedy``.  A ``Hypothesis``' ``log_prob`` is the model's, not the tempered or
        truncated distribution's the tokens were drawn from.
    """
    src = _source(model, src, "sample")
    limits = _limits(model, "sample", src, max_len, min_length, no_repeat_ngram_size)
    check_number(temperature, "temperature", "sample", low=0.0, low_open=True)
    check_int(top_k, "top_k", "sample", 0)
    check_number(top_p, "top_p", "sample", low=0.0, high=1.0, low_open=True)
    if isinstance(seed, np.random.Generator):
        rng = seed
    elif seed is None:
        rng = ta_random.generator()
    else:
        rng = np.random.default_rng(check_int(seed, "seed", "sample", 0))

    def draw(allowed: np.ndarray) -> np.ndarray:
        return _draw(allowed, temperature, top_k, top_p, rng)

    with inference(model):
        return _one_path(model, src, limits, draw, min_length, no_repeat_ngram_size, hypotheses, options)


def _argmax(allowed: np.ndarray) -> np.ndarray:
    return allowed.argmax(axis=-1)


def _draw(allowed: np.ndarray, temperature: float, top_k: int, top_p: float,
          rng: np.random.Generator) -> np.ndarray:
    """One token per row from softmax(allowed / temperature), cut to top-k, then top-p."""
    logits = allowed / temperature                                                  # (N, V)
    if 0 < top_k < logits.shape[1]:
        kth = np.partition(logits, -top_k, axis=1)[:, -top_k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-probs, axis=1, kind="stable")
        sorted_probs = np.take_along_axis(probs, order, axis=1)
        # Keep a token while the tokens before it hold less than top_p: the first always stays.
        before = np.cumsum(sorted_probs, axis=1) - sorted_probs
        cut = np.zeros_like(probs)
        np.put_along_axis(cut, order, np.where(before < top_p, sorted_probs, 0.0), axis=1)
        probs = cut / cut.sum(axis=1, keepdims=True)
    # Inverse CDF: scaled by the row's total, so rounding can never fall past the last token.
    cumulative = np.cumsum(probs, axis=1)
    u = rng.random(len(probs))[:, None] * cumulative[:, -1:]
    return (cumulative > u).argmax(axis=1)


def _one_path(model, src, limits, choose, min_length, ngram, hypotheses, options):
    """Greedy decoding or sampling: one output per source, ``choose`` picking each token, row
    b producing at most ``limits[b]`` tokens."""
    batch = src.shape[0]
    state = _start(model, src, limits, options)
    y = np.full(batch, START, dtype=np.int64)
    done = np.zeros(batch, dtype=bool)
    log_prob = np.zeros(batch)
    produced = np.zeros((batch, 0), dtype=np.int64)           # read by the n-gram rule only
    rows = np.arange(batch)
    ids, weights = [], []
    for t in range(int(limits.max(initial=1))):
        log_probs, attention, state = model.decode_step(state, y, t)
        allowed = _allowed(log_probs, produced, t, min_length, ngram)
        # A row at its limit, or that min_length and the n-gram rule leave nothing to produce,
        # ends here.
        done |= (t >= limits) | ~np.isfinite(allowed).any(axis=1)
        allowed[done] = 0.0                  # any finite row: what is chosen for it is dropped
        y = np.where(done, PAD, choose(allowed)).astype(np.int64, copy=False)
        log_prob += np.where(done, 0.0, log_probs[rows, y])
        ids.append(y)
        if ngram:
            produced = np.concatenate([produced, y[:, None]], axis=1)
        if attention is not None:
            weights.append(np.where(done[:, None], 0.0, attention))
        done |= y == END
        if (done | (t + 1 >= limits)).all():
            break
    ids = np.stack(ids, axis=1)                                                     # (B, L)
    weights = np.stack(weights, axis=1) if weights else None                        # (B, L, S)
    if not hypotheses:
        return ids, weights
    found = []
    for row in range(batch):
        length = _output_length(ids[row])
        attention = None if weights is None else weights[row, :length]
        found.append(Hypothesis(ids[row, :length].tolist(), float(log_prob[row]), float(log_prob[row]),
                                attention))
    return found


def _start(model, src: np.ndarray, limits: np.ndarray, options: dict, rows: int | None = None):
    """``model.decode_start``, told the most steps the decode will take when it asks
    (``max_steps``: the Transformer preallocates its key/value caches to that length) and, for
    beam search, the most rows a step holds (``max_rows``: B * beam, the Transformer keeps that
    many at every step so that one compiled plan serves them all)."""
    parameters = inspect.signature(model.decode_start).parameters
    if "max_steps" in parameters:
        # Rounded up: slots past a row's position are never read, so a longer cache changes
        # no output, and batches whose longest limits differ a little share one compiled plan.
        steps = int(limits.max(initial=1))
        options = {**options, "max_steps": steps + -steps % CACHE_STEPS}
    if rows is not None and "max_rows" in parameters:
        options = {**options, "max_rows": int(rows)}
    return model.decode_start(src, **options)


def _output_length(row: np.ndarray) -> int:
    """Tokens produced in a row of ids: up to and including ``<end>``, else up to padding."""
    ends = np.flatnonzero(row == END)
    if len(ends):
        return int(ends[0]) + 1
    pads = np.flatnonzero(row == PAD)
    return int(pads[0]) if len(pads) else len(row)


# ---------------------------------------------------------------- beam search


def beam_search(model: Decodable, src, beam: int = 5, max_len: MaxLen = 50, length_penalty: float = 1.0,
                coverage_penalty: float = 0.0, min_length: int = 0, no_repeat_ngram_size: int = 0,
                n_best: int | None = None, **options):
    """Batched beam search: every live hypothesis of every source is a row of one batch per
    step.

    Each step extends every live hypothesis of a source by every allowed token and looks at
    the ``2 * beam`` most likely extensions (by log-probability): one that ends (``<end>``, or
    any token at the source's limit) is set aside as finished if it ranks among the ``beam`` best
    (as fairseq does, so a beam of one is greedy decoding when ``length_penalty`` is 0), the
    others refill the beam.  A hypothesis that ``min_length`` and ``no_repeat_ngram_size``
    leave no token to produce ends as it is.  Finished hypotheses are ranked by Wu et al.'s
    score (the module docstring); a source is done when no live hypothesis can still beat the
    worst of its ``n_best`` best finished ones.

    Args:
        beam: hypotheses kept per source.  max_len: tokens produced at most (``<end>``
            included), an int or one per source, capped by the model's ``max_tgt_len``
            (as ``greedy``'s).  length_penalty: Wu et al.'s alpha (0: rank by log-probability).
        coverage_penalty: Wu et al.'s beta (>= 0), needs a model with attention.
        min_length: the fewest tokens before ``<end>``.
        no_repeat_ngram_size: n > 0 forbids producing any n-gram twice in one output.
        n_best: return, per source, its ``n_best`` best hypotheses (at most ``beam``).

    Returns:
        (ids (B, L) int64, attention (B, L, S) or None) of each source's best hypothesis, laid
        out as ``greedy``'s; with ``n_best``, per source a list of ``Hypothesis``, best first
        (fewer than ``n_best`` only when the search space holds fewer).
    """
    src = _source(model, src, "beam_search")
    check_int(beam, "beam", "beam_search", 1)
    limits = _limits(model, "beam_search", src, max_len, min_length, no_repeat_ngram_size)
    check_number(length_penalty, "length_penalty", "beam_search")
    check_number(coverage_penalty, "coverage_penalty", "beam_search", low=0.0)
    if n_best is not None:
        check_int(n_best, "n_best", "beam_search", 1)
        if n_best > beam:
            raise ValueError(f"beam_search: n_best must be at most beam, got n_best={n_best} > beam={beam}")
    with inference(model):
        if src.shape[0] == 0:             # no sources: the empty result greedy gives
            return [] if n_best is not None else _one_path(model, src, limits, _argmax, 0, 0, False, options)
        found = _Beam(model, src, beam, limits, length_penalty, coverage_penalty, min_length,
                      no_repeat_ngram_size, n_best or 1).run(options)
    if n_best is not None:
        return found
    return _layout([hypotheses[0] for hypotheses in found], src.shape[1])


def length_penalty_of(length, alpha: float):
    """Wu et al. (2016)'s lp(Y) = ((5 + |Y|) / 6) ** alpha."""
    return ((5.0 + np.asarray(length, dtype=np.float64)) / 6.0) ** alpha


def coverage_of(coverage: np.ndarray, real: np.ndarray, beta: float) -> np.ndarray:
    """Wu et al. (2016)'s cp = beta * sum_j log(min(sum_i a_ij, 1)) over the real source tokens
    j, for rows of summed attention ``coverage`` (N, S) and their masks ``real`` (N, S).  A
    token never attended to counts as coverage 1e-12, not 0 (whose log is -inf)."""
    if not beta:
        return np.zeros(coverage.shape[0])
    terms = np.log(np.maximum(np.minimum(coverage, 1.0), 1e-12))
    return beta * np.where(real, terms, 0.0).sum(axis=1)


def _bound(log_prob: np.ndarray, length: int, max_len, alpha: float) -> np.ndarray:
    """The best score any completion of live hypotheses holding ``length`` tokens and
    log-probability ``log_prob`` could reach.

    A completion Y has log P(Y) <= log_prob (every token's log-probability is <= 0) and
    length(Y) in [length + 1, max_len].  As log_prob <= 0, log P(Y) / lp(|Y|) is at most
    log_prob / lp(|Y|), the largest where lp is: lp grows with |Y| for alpha > 0 (a longer
    completion divides by more, so the bound takes max_len, as Hugging Face's
    ``BeamHypotheses.is_done`` does since transformers PR 20901) and shrinks for alpha < 0.
    The coverage term is <= 0 and a completion's coverage sums only grow as it lengthens, so
    its term only rises, towards 0: the bound adds 0, its supremum (a later token can still
    cover every source token).  ``max_len`` may be one limit per hypothesis (its source's).
    """
    lp = np.maximum(length_penalty_of(length + 1, alpha), length_penalty_of(max_len, alpha))
    return log_prob / lp


class _Beam:
    """One batched beam search (``beam_search``'s): live rows are kept grouped by source, in
    source order, so that each source's candidates are one row of a (sources, beam * V)
    table."""

    def __init__(self, model, src, beam, limits, alpha, beta, min_length, ngram, keep):
        self.model, self.src, self.beam, self.limits = model, src, beam, limits       # limits: (B,)
        self.alpha, self.beta, self.min_length, self.ngram, self.keep = alpha, beta, min_length, ngram, keep
        self.real = src != PAD                                                        # (B, S)
        batch = src.shape[0]
        # finished[b]: (score, log_prob, tokens, step, row) in the order found
        self.finished: list[list] = [[] for _ in range(batch)]
        self.worst_kept = np.full(batch, -np.inf)     # the keep-th best finished score so far
        self.attention_steps: list = []               # per step: (N_t, S) or None
        self.parents: list = []                       # per step t >= 1: rows of step t-1 (N_t,)

    def run(self, options: dict) -> list[list[Hypothesis]]:
        model, batch = self.model, self.src.shape[0]
        state = _start(model, self.src, self.limits, options, batch * self.beam)
        owner = np.arange(batch)                                     # (N,) the source of each row
        tokens = np.zeros((batch, 0), dtype=np.int64)                # (N, t)
        log_prob = np.zeros(batch)                                   # (N,)
        coverage = np.zeros(self.src.shape)                          # (N, S) attention summed
        for t in range(int(self.limits.max())):
            last = tokens[:, -1] if t else np.full(len(owner), START, dtype=np.int64)
            log_probs, attention, state = model.decode_step(state, last, t)
            if attention is None and self.beta:
                raise ValueError("beam_search: coverage_penalty needs a model with attention")
            self.attention_steps.append(attention)
            allowed = _allowed(log_probs, tokens, t, self.min_length, self.ngram)
            self._finish_stuck(allowed, owner, tokens, log_prob, coverage, t)
            rows, words, totals, ends = self._candidates(log_prob[:, None] + allowed, owner, t)
            self._finish(rows[ends], words[ends], totals[ends], owner, tokens, coverage, attention, t)
            rows, words, totals = rows[~ends], words[~ends], totals[~ends]
            new_owner = owner[rows]
            # Exact stopping: a source is done once its keep-th best finished hypothesis is at
            # least as good as the best any of its live hypotheses could become.
            best = np.full(batch, -np.inf)
            limit = self.limits[new_owner]
            more = t + 1 < limit                        # may still grow: not at its source's limit
            np.maximum.at(best, new_owner[more], _bound(totals[more], t + 1, limit[more], self.alpha))
            live = best[new_owner] > self.worst_kept[new_owner]
            rows, words, totals, new_owner = rows[live], words[live], totals[live], new_owner[live]
            if not len(rows):
                break
            self.parents.append(rows)
            state = model.decode_select(state, rows)
            tokens = np.concatenate([tokens[rows], words[:, None]], axis=1)
            log_prob, owner = totals, new_owner
            coverage = coverage[rows] + (0.0 if attention is None else attention[rows])
        return [self._best(b) for b in range(batch)]

    def _candidates(self, total: np.ndarray, owner: np.ndarray, t: int):
        """The extensions each source keeps at step t, from ``total`` (N, V), every row's
        log-probability after each token: (rows, words, log-probabilities, ends), flat, grouped
        by source and best first within a source."""
        vocab = total.shape[1]
        sources, first, counts = np.unique(owner, return_index=True, return_counts=True)
        group = np.repeat(np.arange(len(sources)), counts)                           # (N,)
        table = np.full((len(sources), counts.max(), vocab), -np.inf)                # (A, width, V)
        table[group, np.arange(len(owner)) - first[group]] = total
        flat = table.reshape(len(sources), -1)                                       # (A, width * V)
        top = _largest(flat, min(2 * self.beam, flat.shape[1]))                      # (A, k)
        totals = np.take_along_axis(flat, top, axis=1)
        rows, words = first[:, None] + top // vocab, top % vocab
        valid = totals > -np.inf
        ends = valid & ((words == END) | (t >= self.limits[owner[rows]] - 1))
        rank = np.arange(top.shape[1])
        finish = ends & (rank < self.beam)        # an ending outside the beam's best is dropped
        extend = valid & ~ends
        extend &= np.cumsum(extend, axis=1) <= self.beam
        keep = finish | extend
        return rows[keep], words[keep], totals[keep], ends[keep]

    def _finish(self, rows, words, log_probs, owner, tokens, coverage, attention, t):
        """Set aside the hypotheses ending at step t: rows of step t extended by ``words``."""
        if not len(rows):
            return
        summed = coverage[rows] + (0.0 if attention is None else attention[rows])
        sources = owner[rows]
        scores = log_probs / length_penalty_of(t + 1, self.alpha) + coverage_of(summed, self.real[sources],
                                                                                 self.beta)
        for source, score, log_prob, row, word in zip(sources, scores, log_probs, rows, words, strict=True):
            self._add(source, score, log_prob, [*tokens[row].tolist(), int(word)], t, row)

    def _finish_stuck(self, allowed, owner, tokens, log_prob, coverage, t):
        """Hypotheses left no token to produce (by min_length and the n-gram rule) end as they
        are, with the tokens of steps before t."""
        stuck = np.flatnonzero(~np.isfinite(allowed).any(axis=1))
        if not len(stuck):
            return
        sources = owner[stuck]
        scores = log_prob[stuck] / length_penalty_of(t, self.alpha) + coverage_of(
            coverage[stuck], self.real[sources], self.beta)
        for source, score, row in zip(sources, scores, stuck, strict=True):
            self._add(source, score, log_prob[row], tokens[row].tolist(), t - 1, self.parents[t - 1][row])

    def _add(self, source, score, log_prob, tokens, step, row):
        found = self.finished[source]
        found.append((float(score), float(log_prob), tokens, step, int(row)))
        if len(found) >= self.keep:
            self.worst_kept[source] = sorted(entry[0] for entry in found)[-self.keep]

    def _best(self, source: int) -> list[Hypothesis]:
        # sorted() is stable: of equal scores, the one found first stays first.
        ranked = sorted(self.finished[source], key=lambda entry: -entry[0])[: self.keep]
        return [Hypothesis(tokens, score, log_prob, self._attention(step, row))
                for score, log_prob, tokens, step, row in ranked]

    def _attention(self, step: int, row: int) -> np.ndarray | None:
        """The attention rows (step + 1, S) of the hypothesis that was row ``row`` at ``step``,
        followed back through each step's parents."""
        if self.attention_steps[0] is None:
            return None
        rows = []
        for t in range(step, -1, -1):
            rows.append(self.attention_steps[t][row])
            if t:
                row = self.parents[t - 1][row]
        return np.stack(rows[::-1])


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k largest entries of each row, largest first; of equal values,
    the lower index first."""
    columns = values.shape[1]
    if k < columns:
        part = np.sort(np.argpartition(-values, k - 1, axis=1)[:, :k], axis=1)
    else:
        part = np.broadcast_to(np.arange(columns), values.shape)
    order = np.argsort(-np.take_along_axis(values, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def _layout(best: list[Hypothesis], source_len: int):
    """Best hypotheses -> (ids (B, L), attention (B, L, S) or None), as ``greedy`` lays out."""
    length = max(len(h.tokens) for h in best)
    ids = np.zeros((len(best), length), dtype=np.int64)
    with_attention = best[0].attention is not None
    weights = np.zeros((len(best), length, source_len)) if with_attention else None
    for row, hypothesis in enumerate(best):
        ids[row, : len(hypothesis.tokens)] = hypothesis.tokens
        if with_attention:
            weights[row, : len(hypothesis.tokens)] = hypothesis.attention
    return ids, weights


# ---------------------------------------------------------------- what every decoder shares


def _allowed(log_probs: np.ndarray, produced: np.ndarray, t: int, min_length: int, ngram: int) -> np.ndarray:
    """The log-probabilities a choice reads: a copy with every token that may not come next
    at -inf (never renormalised: a hypothesis' log-probability stays the model's)."""
    allowed = log_probs.copy()
    allowed[:, PAD] = allowed[:, START] = -np.inf
    if t < min_length:
        allowed[:, END] = -np.inf
    if ngram and t >= ngram - 1:
        # The last n-1 tokens followed by w would repeat an n-gram seen at position i.
        tail = produced[:, t - ngram + 1 :]                                          # (N, n-1)
        for i in range(t - ngram + 1):
            repeats = np.flatnonzero((produced[:, i : i + ngram - 1] == tail).all(axis=1))
            allowed[repeats, produced[repeats, i + ngram - 1]] = -np.inf
    return allowed


@contextmanager
def inference(model):
    """Eval mode (no dropout) and no graph while decoding; the model's mode is restored after."""
    was_training = getattr(model, "training", None)
    if was_training is not None:
        model.eval()
    try:
        with no_grad():
            yield
    finally:
        if was_training is not None:
            model.train(was_training)


def default_max_len(source_len):
    """How many tokens a decode may produce for a source of ``source_len`` tokens when the
    caller does not say (``translate_tokens``, ``evaluate``): enough for outputs up to twice
    the source's length, plus 10.  An int, or an array of lengths -> one limit per row."""
    return 2 * source_len + 10


def check_source_lengths(model, lengths, where: str) -> None:
    """Refuse, before any work, a source longer than the model can encode (its
    ``max_src_len``, the Transformer's position table; None or absent: no limit): a
    ShapeError naming ``where``, the source (its index in ``lengths``), its length and the
    limit."""
    limit = getattr(model, "max_src_len", None)
    if limit is None or not len(lengths):
        return
    row = int(np.argmax(lengths))
    if lengths[row] > limit:
        raise ShapeError(f"{where}: source {row} has {int(lengths[row])} tokens, longer than the "
                         f"{type(model).__name__}'s position table (max_len={limit})")


def _source(model, src, where: str) -> np.ndarray:
    """``src`` as int64 (B, S), checked against the model's ``max_src_len``.  Width 0 is a
    batch of empty sources."""
    array = src.numpy() if hasattr(src, "numpy") and not isinstance(src, np.ndarray) else np.asarray(src)
    if array.ndim != 2 or array.dtype.kind not in "iu":
        raise ShapeError(f"{where}: src must be an integer array (B, S) of token ids, got {array.dtype} "
                         f"of shape {array.shape}")
    # A row's length runs to its last real token (the columns a model must encode for it).
    real = np.concatenate([np.ones((array.shape[0], 1), dtype=bool), array != PAD], axis=1)
    lengths = array.shape[1] - np.argmax(real[:, ::-1], axis=1)                       # (B,)
    check_source_lengths(model, lengths, where)
    limit = getattr(model, "max_src_len", None)
    if limit is not None and array.shape[1] > limit:
        raise ShapeError(f"{where}: src is {array.shape[1]} tokens wide, wider than the "
                         f"{type(model).__name__}'s position table (max_len={limit}); its longest source "
                         f"has {int(lengths.max(initial=0))} tokens: cut the padding columns")
    return array.astype(np.int64, copy=False)


def _limits(model, where: str, src: np.ndarray, max_len, min_length, ngram) -> np.ndarray:
    """Each row's decode limit (B,): ``max_len`` (an int, or one per row) capped by the
    model's ``max_tgt_len``; the other length options checked on the way."""
    batch = src.shape[0]
    if np.ndim(max_len) == 0:
        asked = np.full(batch, check_int(max_len, "max_len", where, 1), dtype=np.int64)
    else:
        asked = np.asarray(max_len)
        if asked.shape != (batch,):
            raise ValueError(f"{where}: max_len must be an int or one int per row ({batch}), got shape "
                             f"{asked.shape}")
        if asked.dtype.kind not in "iu":
            raise TypeError(f"{where}: max_len must be an int or one int per row, got {asked.dtype}")
        if batch and asked.min() < 1:
            row = int(np.argmin(asked))
            raise ValueError(f"{where}: max_len must be >= 1, got {asked[row]} (row {row})")
        asked = asked.astype(np.int64)
    check_int(min_length, "min_length", where, 0)
    check_int(ngram, "no_repeat_ngram_size", where, 0)
    if batch and min_length > asked.min():
        row = int(np.argmin(asked))
        name = "max_len" if np.ndim(max_len) == 0 else f"max_len[{row}]"
        raise ValueError(f"{where}: min_length must be at most max_len, got min_length={min_length} > "
                         f"{name}={asked[row]}")
    cap = getattr(model, "max_tgt_len", None)
    return asked if cap is None else np.minimum(asked, cap)


# Per model: its compiled decode step, and its compiled encoder, so plans outlive one decode.
_COMPILED_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_COMPILED_ENCODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_step(model, method: str, table: weakref.WeakKeyDictionary = _COMPILED_STEPS):
    """``model.<method>`` (a decode step of tensors alone) under ``ta.compile``, one per model
    in ``table`` (``_COMPILED_ENCODERS`` for a model's decode start: its encoder, and a
    Transformer's projections of the memory).  The compiled function reaches the model
    through a weak reference: a bound method held as the value of this weak-keyed table
    would keep every model that ever decoded alive."""
    step = table.get(model)
    if step is None:
        from ..compiled import compile as ta_compile

        owner, function = weakref.ref(model), getattr(type(model), method)

        def decode_step(*tensors):
            return function(owner(), *tensors)

        role = "decode_step" if table is _COMPILED_STEPS else "encoder"
        decode_step.__name__ = decode_step.__qualname__ = f"{type(model).__name__}_{role}"
        step = table[model] = ta_compile(decode_step, max_plans=DECODE_PLANS)
    return step


def compiled_functions(model) -> list:
    """The ``ta.compile``d functions ``model``'s compiled decoding has made so far (its decode
    step, its start): their ``plans``, ``stats`` and ``source`` show what a decode replays."""
    return [table[model] for table in (_COMPILED_STEPS, _COMPILED_ENCODERS) if model in table]


def row_index(rows, capacity: int | None, size: int | None = None) -> np.ndarray:
    """The int64 index that picks ``rows`` of a decode state, padded with 0s up to
    ``capacity`` (a state of fixed row count: the padding rows copy row 0, finite values
    that are never read).  ``size``: the state's rows, every one of ``rows`` must be below
    it (checked here, on the host, so the device gathers need no check of their own)."""
    rows = np.asarray(rows, dtype=np.int64)
    if size is not None and len(rows) and (rows.min() < 0 or rows.max() >= size):
        bad = int(rows.min()) if rows.min() < 0 else int(rows.max())
        raise IndexError(f"decode_select: row {bad} is outside the state's {size} rows")
    if capacity is None:
        return rows
    if len(rows) > capacity:
        raise ValueError(f"decode_select: {len(rows)} rows do not fit the state's capacity of {capacity}")
    return np.concatenate([rows, np.zeros(capacity - len(rows), np.int64)])


def select_rows(state_capacity: int | None, capacity: int | None, rows, size: int, device):
    """What a ``decode_select`` starts from: (its capacity, the host index of ``rows`` (see
    ``row_index``), the same index as a Tensor on ``device`` for ``take_rows``)."""
    capacity = state_capacity if capacity is None else capacity
    index = row_index(rows, capacity, size)
    from ..tensor import Tensor

    return capacity, index, Tensor(index, device=device)


def take_rows(x, rows):
    """``x[rows]`` along the first axis, ``rows`` (M,) int64 a Tensor on ``x``'s device whose
    values ``row_index`` checked: the device's embedding kernel on ``x`` seen as a (N, rest)
    table, called directly (decoding keeps no graph), so no range check waits on the device
    per gathered tensor, and nothing is copied through the host; inside a compiled step the
    index is an input of the plan."""
    from ..tensor import Tensor

    backend, rest = x.backend, tuple(x.shape[1:])
    table = backend.reshape(x._data, (x.shape[0], math.prod(rest)))
    out = backend.embedding(table, rows._data)
    return Tensor._made(backend.reshape(out, (rows.shape[0],) + rest), backend, False)
