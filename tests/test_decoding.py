"""ta.models.decoding for both model families: beam search of one is greedy, a padded batch
decodes as each source alone, log-probabilities are teacher forcing's, n-best lists equal
exhaustive search and are sorted and distinct, the exact stopping bound, min_length, n-gram
blocking, sampling, cached against uncached decoding, and bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.models import decoding
from tinygrad_attn.models.decoding import END, PAD, START, Hypothesis

UNK = ta.data.UNK
FAMILIES = ["seq2seq", "transformer"]


def make(family: str, vocab: int = 9, seed: int = 0, end_bias: float = 0.0, **options):
    """A tiny float64 model of either family, its <end> logit raised by ``end_bias``."""
    ta.manual_seed(seed)
    if family == "seq2seq":
        settings = dict(embed=4, hidden=6, attention="additive") | options
        model = ta.models.Seq2Seq(vocab, vocab, **settings).double()
    else:
        settings = dict(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=2, dim_feedforward=16,
                        dropout=0.0) | options
        model = ta.models.Transformer(vocab, vocab, **settings).double()
    with ta.no_grad():
        model.out.bias.data[END] += end_bias
    return model


def sources(seed: int = 0, vocab: int = 9) -> np.ndarray:
    """Three sources of 5, 3 and 4 tokens, padded to 5."""
    rng = np.random.default_rng(seed)
    src = rng.integers(3, vocab, (3, 5))
    src[1, 3:] = PAD
    src[2, 4:] = PAD
    return src


def teacher_forced(model, src_row: np.ndarray, outputs: list) -> tuple[np.ndarray, list]:
    """log P(output | source) of each output, and its attention rows, by ``model(src, tgt_in)``
    (one batch of every output): what decoding must report."""
    length = max(len(tokens) for tokens in outputs)
    tgt_in = np.zeros((len(outputs), length), dtype=np.int64)
    tgt_in[:, 0] = START
    for row, tokens in enumerate(outputs):
        tgt_in[row, 1 : len(tokens)] = tokens[:-1]
    src = np.repeat(src_row[None], len(outputs), axis=0)
    with ta.no_grad():
        if isinstance(model, ta.models.Transformer):
            logits, weights = model(src, tgt_in, need_weights=True)
            attention = model.layer_attention(weights)[-1].mean(axis=1)           # (N, T, S)
        else:
            logits, weights = model(src, tgt_in)
            attention = None if weights is None else weights.numpy()
    log_probs = decoding.log_softmax(logits.numpy())                              # (N, T, V)
    totals, rows = [], []
    for row, tokens in enumerate(outputs):
        totals.append(log_probs[row, np.arange(len(tokens)), tokens].sum())
        rows.append(None if attention is None else attention[row, : len(tokens)])
    return np.array(totals), rows


def wu_score(log_prob: float, attention, real: np.ndarray, alpha: float, beta: float) -> float:
    length = len(attention)
    score = log_prob / ((5 + length) / 6) ** alpha
    if beta:
        coverage = np.minimum(attention[:, real].sum(axis=0), 1.0)
        score += beta * np.log(np.maximum(coverage, 1e-12)).sum()
    return score


# ---------------------------------------------------------------- the guarantees


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("end_bias", "rules"), [
    (0.0, {}), (0.6, {}), (0.6, dict(min_length=3)), (0.0, dict(no_repeat_ngram_size=1)),
    (0.0, dict(no_repeat_ngram_size=2, min_length=2))])
def test_beam_of_one_is_greedy(family, end_bias, rules):
    # end_bias makes <end> a close runner-up: an ending outside the beam must not be kept.
    model = make(family, seed=4, end_bias=end_bias)
    src = sources(4)
    greedy_ids, greedy_weights = model.greedy(src, max_len=7, **rules)
    beam_ids, beam_weights = model.beam_search(src, beam=1, max_len=7, length_penalty=0.0, **rules)
    np.testing.assert_array_equal(beam_ids, greedy_ids)
    np.testing.assert_allclose(beam_weights, greedy_weights, rtol=1e-12, atol=1e-15)
    greedy = model.greedy(src, max_len=7, hypotheses=True, **rules)
    beam = model.beam_search(src, beam=1, max_len=7, length_penalty=0.0, n_best=1, **rules)
    for mine, theirs in zip(beam, greedy, strict=True):
        assert mine[0].tokens == theirs.tokens
        assert mine[0].log_prob == pytest.approx(theirs.log_prob, rel=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_padded_batch_decodes_exactly_as_each_source_alone(family):
    model = make(family, seed=1, end_bias=0.3)
    src = sources(1)
    batch = model.beam_search(src, beam=4, max_len=8, length_penalty=1.0, coverage_penalty=0.3, n_best=3)
    greedy_ids, _ = model.greedy(src, max_len=8)
    for row in range(len(src)):
        length = int((src[row] != PAD).sum())
        alone = model.beam_search(src[row : row + 1, :length], beam=4, max_len=8, length_penalty=1.0,
                                  coverage_penalty=0.3, n_best=3)[0]
        assert [h.tokens for h in batch[row]] == [h.tokens for h in alone]
        for mine, theirs in zip(batch[row], alone, strict=True):
            assert mine.score == pytest.approx(theirs.score, rel=1e-10)
            assert mine.log_prob == pytest.approx(theirs.log_prob, rel=1e-10)
            np.testing.assert_allclose(mine.attention[:, :length], theirs.attention, rtol=1e-9, atol=1e-14)
            assert not mine.attention[:, length:].any()                  # padding gets no attention
        ids, _ = model.greedy(src[row : row + 1, :length], max_len=8)
        np.testing.assert_array_equal(greedy_ids[row, : ids.shape[1]], ids[0])


@pytest.mark.parametrize("family", FAMILIES)
def test_reported_log_prob_is_teacher_forcings(family):
    model = make(family, seed=2, end_bias=0.4)
    src = sources(2)
    alpha, beta = 0.7, 0.2
    found = {
        "greedy": [[h] for h in model.greedy(src, max_len=6, hypotheses=True)],
        "sample": [[h] for h in model.sample(src, max_len=6, seed=0, temperature=1.5, hypotheses=True)],
        "beam": model.beam_search(src, beam=5, max_len=6, length_penalty=alpha, coverage_penalty=beta,
                                  min_length=1, n_best=5),
    }
    for how, nbest in found.items():
        for row, hypotheses in enumerate(nbest):
            log_probs, attention = teacher_forced(model, src[row], [h.tokens for h in hypotheses])
            for h, log_prob, rows in zip(hypotheses, log_probs, attention, strict=True):
                assert h.log_prob == pytest.approx(log_prob, rel=1e-6, abs=0), (how, h)
                np.testing.assert_allclose(h.attention, rows, rtol=1e-9, atol=1e-14)
                if how == "beam":
                    want = wu_score(log_prob, rows, src[row] != PAD, alpha, beta)
                    assert h.score == pytest.approx(want, rel=1e-9)
                else:
                    assert h.score == h.log_prob


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_step_gives_the_models_own_distribution(family):
    # <pad> and <start> are excluded from the choice, not from the distribution: it still
    # sums to one over the whole vocabulary (no renormalisation).
    model = make(family, seed=3)
    with ta.no_grad():
        model.out.bias.data[[PAD, START]] += 2.0
        model.eval()
        state = model.decode_start(sources(3))
        log_probs, _, _ = model.decode_step(state, np.full(3, START), 0)
    assert log_probs.dtype == np.float64
    np.testing.assert_allclose(np.exp(log_probs).sum(axis=1), 1.0, rtol=1e-12)
    assert (np.exp(log_probs[:, [PAD, START]]) > 0.05).all()


def exhaustive(model, src_row, max_len, alpha, beta, producible):
    """Every output of up to max_len tokens over ``producible`` ids, best first, with its
    score: what a beam wide enough to keep every candidate must find."""
    words = [w for w in producible if w != END]
    outputs = [[*prefix, END] for n in range(max_len) for prefix in itertools.product(words, repeat=n)]
    outputs += [list(seq) for seq in itertools.product(producible, repeat=max_len) if END not in seq[:-1]
                if seq[-1] != END]
    log_probs, attention = teacher_forced(model, src_row, outputs)
    real = src_row != PAD
    scores = [wu_score(lp, rows if rows is not None else np.zeros((len(out), 0)), real, alpha, beta)
              for lp, rows, out in zip(log_probs, attention, outputs, strict=True)]
    order = np.argsort(-np.array(scores), kind="stable")
    return [(outputs[i], scores[i]) for i in order]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("vocab", "max_len", "alpha", "beta", "end_bias", "n_best"), [
    (6, 4, 0.0, 0.0, 0.5, 6), (6, 4, 1.0, 0.0, 0.5, 6), (6, 4, 2.0, 0.0, 0.5, 6), (6, 4, 1.0, 1.0, 0.5, 6),
    (5, 6, 2.0, 0.0, 0.5, 6), (6, 4, 0.0, 2.0, 1.5, 1), (5, 6, 1.0, 1.0, 1.5, 1)])
def test_a_beam_wide_enough_for_every_candidate_finds_the_exhaustive_n_best(family, vocab, max_len, alpha,
                                                                              beta, end_bias, n_best):
    # 4 producible tokens (<end>, <unk>, 4, 5) and max_len 4, or 3 and max_len 6: a beam as
    # wide as the most candidates a step (108, 96) prunes nothing, and the n-best list must be
    # the exhaustive one.  A favourite word (4) makes outputs of every length rank among the
    # best, so a search that stopped once n_best had finished would miss one; with a
    # coverage penalty, one whose bound left out the coverage a longer output still gains
    # misses one (the last two cases).
    producible = [END, UNK, 4, 5][: vocab - 2]
    beam = (len(producible) - 1) ** (max_len - 1) * len(producible)
    model = make(family, vocab=vocab, seed=7, end_bias=end_bias)
    with ta.no_grad():
        model.out.bias.data[4] += 2.0 if end_bias < 1 else 1.0
    src = np.array([[4, 3, 3, 0]])
    want = exhaustive(model, src[0], max_len, alpha, beta, producible)[:n_best]
    found = model.beam_search(src, beam=beam, max_len=max_len, length_penalty=alpha, coverage_penalty=beta,
                              n_best=n_best)[0]
    assert [h.tokens for h in found] == [tokens for tokens, _ in want]
    np.testing.assert_allclose([h.score for h in found], [score for _, score in want], rtol=1e-9)


class Bigram:
    """A decoder whose next token depends on the previous one only, from a table of
    probabilities (previous id, next id): the step protocol with nothing else in the way."""

    def __init__(self, table: np.ndarray):
        self.log_table = np.log(np.maximum(table, 1e-300))

    def decode_start(self, src):
        return None

    def decode_step(self, state, tokens, t):
        return self.log_table[tokens], None, None

    def decode_select(self, state, rows):
        return None


def test_the_search_waits_for_a_long_hypothesis_that_can_still_win_with_a_length_penalty():
    # After <start>: <end> 0.52, word 4 0.40; after 4: 4 again, 0.99.  [<end>] scores
    # log 0.52 = -0.65 at once; [4, 4, 4, 4, 4, 4] scores (log 0.4 + 5 log 0.99) / (11/6)^2
    # = -0.29 with alpha 2, and wins.  A bound that divided [4]'s log 0.4 by lp(2) (its next
    # length) instead of lp(max_len) would stop after the first step with [<end>].
    vocab = 6
    table = np.full((vocab, vocab), 1e-3)
    table[START, [END, 4]] = [0.52, 0.40]
    table[4, 4] = 0.99
    table /= table.sum(axis=1, keepdims=True)
    [[best]] = decoding.beam_search(Bigram(table), np.array([[5]]), beam=3, max_len=6, length_penalty=2.0,
                                    n_best=1)
    assert best.tokens == [4] * 6
    want = (np.log(table[START, 4]) + 5 * np.log(table[4, 4])) / (11 / 6) ** 2
    assert best.score == pytest.approx(want, rel=1e-12) and best.attention is None
    [[short]] = decoding.beam_search(Bigram(table), np.array([[5]]), beam=3, max_len=6, length_penalty=0.0,
                                     n_best=1)
    assert short.tokens == [END]


@pytest.mark.parametrize("family", FAMILIES)
def test_n_best_lists_are_sorted_distinct_and_well_formed(family):
    model = make(family, seed=5, end_bias=0.8)
    src = sources(5)
    for nbest in model.beam_search(src, beam=6, max_len=6, length_penalty=1.0, n_best=6):
        assert len(nbest) == 6 and all(isinstance(h, Hypothesis) for h in nbest)
        scores = [h.score for h in nbest]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in nbest}) == len(nbest)
        for h in nbest:
            assert not {PAD, START} & set(h.tokens) and END not in h.tokens[:-1]
            assert h.tokens[-1] == END or len(h.tokens) == 6
            assert h.attention.shape == (len(h.tokens), src.shape[1])
    best_ids, _ = model.beam_search(src, beam=6, max_len=6, length_penalty=1.0)
    first = [nbest[0].tokens for nbest in model.beam_search(src, beam=6, max_len=6, n_best=2)]
    assert [list(row[: len(tokens)]) for row, tokens in zip(best_ids, first, strict=True)] == first


def test_cached_and_uncached_transformer_decoding_agree():
    model = make("transformer", seed=6, end_bias=0.5)
    src = sources(6)
    options = dict(beam=4, max_len=7, coverage_penalty=0.2, no_repeat_ngram_size=2, n_best=4)
    cached = model.beam_search(src, **options)
    uncached = model.beam_search(src, **options, use_cache=False)
    for mine, theirs in zip(cached, uncached, strict=True):
        assert [h.tokens for h in mine] == [h.tokens for h in theirs]
        np.testing.assert_allclose([h.score for h in mine], [h.score for h in theirs], rtol=1e-10)
        for a, b in zip(mine, theirs, strict=True):
            np.testing.assert_allclose(a.attention, b.attention, rtol=1e-9, atol=1e-14)
    greedy = model.greedy(src, max_len=7, hypotheses=True)
    again = model.greedy(src, max_len=7, hypotheses=True, use_cache=False)
    assert [h.tokens for h in greedy] == [h.tokens for h in again]


def test_the_transformer_gives_every_layer_and_head_on_request():
    model = make("transformer", seed=6, end_bias=0.5)
    src = sources(6)
    averaged = model.beam_search(src, beam=3, max_len=6, n_best=2)
    every = model.beam_search(src, beam=3, max_len=6, n_best=2, average_weights=False)
    for mine, theirs in zip(every, averaged, strict=True):
        for h, a in zip(mine, theirs, strict=True):
            assert h.tokens == a.tokens
            assert h.attention.shape == (2, 2, len(h.tokens), src.shape[1])      # (layers, H, |Y|, S)
            np.testing.assert_allclose(h.attention[-1].mean(axis=0), a.attention, rtol=1e-9, atol=1e-14)
    with pytest.raises(ValueError, match="beam_search: average_weights=False .* needs n_best"):
        model.beam_search(src, beam=3, average_weights=False)


# ---------------------------------------------------------------- stopping


@pytest.mark.parametrize("alpha", [-0.5, 0.0, 0.6, 1.0, 2.0])
def test_the_stopping_bound_is_never_beaten_by_a_completion(alpha):
    # A live hypothesis of n tokens and log-probability L ends with m in [n + 1, max_len]
    # tokens and log-probability L' <= L; its score L' / lp(m) must not exceed the bound.
    rng = np.random.default_rng(0)
    max_len = 12
    for n in range(1, max_len):
        log_prob = -rng.exponential(3.0, size=50)
        bound = decoding._bound(log_prob, n, max_len, alpha)
        for m in range(n + 1, max_len + 1):
            for extra in (0.0, 0.01, 1.0):
                score = (log_prob - extra) / decoding.length_penalty_of(m, alpha)
                assert (score <= bound + 1e-15).all(), (n, m, extra)
    # With a length penalty the bound reads max_len, not the current length: a bound of
    # L / lp(n + 1) would be beaten by a longer completion of the same log-probability.
    assert decoding._bound(np.array([-2.0]), 1, 10, 1.0)[0] > -2.0 / decoding.length_penalty_of(2, 1.0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_the_search_stops_once_no_live_hypothesis_can_win(family, alpha):
    # <end> is all but certain at the first step: every live hypothesis is already far
    # behind, so the search must stop after one step instead of running to max_len.
    model = make(family, seed=8, end_bias=25.0)
    steps = []
    step = model.decode_step
    model.decode_step = lambda state, tokens, t: steps.append(t) or step(state, tokens, t)
    [[best]] = model.beam_search(sources(8)[:1], beam=4, max_len=30, length_penalty=alpha, n_best=1)
    assert best.tokens == [END] and steps == [0]
    steps.clear()
    nbest = model.beam_search(sources(8)[:1], beam=4, max_len=30, length_penalty=alpha, n_best=3)[0]
    assert len(nbest) == 3 and 1 < len(steps) < 30


# ---------------------------------------------------------------- rules on the choice


@pytest.mark.parametrize("family", FAMILIES)
def test_min_length_holds_back_end_without_renormalising(family):
    model = make(family, seed=9, end_bias=3.0)                   # would end at once
    src = sources(9)
    outputs = {
        "greedy": [[h] for h in model.greedy(src, max_len=6, min_length=3, hypotheses=True)],
        "sample": [[h] for h in model.sample(src, max_len=6, min_length=3, seed=1, hypotheses=True)],
        "beam": model.beam_search(src, beam=3, max_len=6, min_length=3, n_best=3),
    }
    for how, nbest in outputs.items():
        for row, hypotheses in enumerate(nbest):
            log_probs, _ = teacher_forced(model, src[row], [h.tokens for h in hypotheses])
            for h, log_prob in zip(hypotheses, log_probs, strict=True):
                assert len(h.tokens) >= 4 and END not in h.tokens[:3], (how, h.tokens)
                assert h.log_prob == pytest.approx(log_prob, rel=1e-9)
    ids, _ = model.greedy(src, max_len=3, min_length=3)          # min_length = max_len: no <end> at all
    assert ids.shape == (3, 3) and not (ids == END).any() and not (ids == PAD).any()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("size", [1, 2, 3])
def test_no_repeat_ngram_size_forbids_repeated_ngrams(family, size):
    model = make(family, seed=10, end_bias=-4.0)
    with ta.no_grad():
        model.out.bias.data[5] += 3.0                       # a model that loves one token
    src = sources(10)
    rule = dict(max_len=9, no_repeat_ngram_size=size)
    outputs = [h.tokens for h in model.greedy(src, **rule, hypotheses=True)]
    outputs += [h.tokens for h in model.sample(src, **rule, seed=2, hypotheses=True)]
    outputs += [h.tokens for nbest in model.beam_search(src, beam=3, **rule, n_best=3) for h in nbest]
    for tokens in outputs:
        grams = [tuple(tokens[i : i + size]) for i in range(len(tokens) - size + 1)]
        assert len(grams) == len(set(grams)), (size, tokens)
    plain = model.greedy(src, max_len=9)[0]
    assert any(len(set(row.tolist())) < len(row) for row in plain)       # without the rule it repeats


def test_unk_may_be_produced():
    model = make("seq2seq", seed=11)
    with ta.no_grad():
        model.out.bias.data[UNK] += 20.0
    ids, _ = model.greedy(sources(11), max_len=3)
    assert (ids == UNK).all()


def test_a_hypothesis_left_no_token_ends_as_it_is():
    # Vocabulary of the reserved ids and one word: with no n-gram repeated and <end> held
    # back, after one word nothing may follow.
    model = make("seq2seq", vocab=5, seed=12)
    src = np.array([[3, 4, 4]])
    [greedy] = model.greedy(src, max_len=5, min_length=3, no_repeat_ngram_size=1, hypotheses=True)
    [[beam]] = model.beam_search(src, beam=1, max_len=5, min_length=3, no_repeat_ngram_size=1,
                                 length_penalty=0.0, n_best=1)
    assert len(greedy.tokens) == 2 and greedy.tokens == beam.tokens and END not in beam.tokens
    assert beam.log_prob == pytest.approx(teacher_forced(model, src[0], [beam.tokens])[0][0], rel=1e-12)


# ---------------------------------------------------------------- sampling


@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_is_seeded_and_its_limits_are_greedy(family):
    model = make(family, seed=13, end_bias=0.5)
    src = sources(13)
    first, _ = model.sample(src, max_len=6, seed=3)
    again, _ = ta.models.decoding.sample(model, src, max_len=6, seed=3)
    np.testing.assert_array_equal(first, again)
    greedy, _ = model.greedy(src, max_len=6)
    for limit in (dict(top_k=1), dict(top_p=1e-9), dict(temperature=1e-4)):
        ids, _ = model.sample(src, max_len=6, seed=4, **limit)
        np.testing.assert_array_equal(ids, greedy, err_msg=str(limit))
    ta.manual_seed(5)
    drawn, _ = model.sample(src, max_len=6)
    ta.manual_seed(5)
    np.testing.assert_array_equal(model.sample(src, max_len=6)[0], drawn)


def test_sampling_draws_from_the_allowed_distribution_cut_by_top_k_and_top_p():
    model = make("seq2seq", seed=14, end_bias=1.0)
    src = np.repeat(sources(14)[:1], 20000, axis=0)
    with ta.no_grad():
        model.eval()
        log_probs, _, _ = model.decode_step(model.decode_start(src[:1]), np.array([START]), 0)
    probs = np.exp(log_probs[0])
    probs[[PAD, START]] = 0.0
    probs /= probs.sum()                                  # what the choice may draw from
    ids, _ = model.sample(src, max_len=1, seed=6)
    counts = np.bincount(ids[:, 0], minlength=len(probs)) / len(src)
    np.testing.assert_allclose(counts, probs, atol=0.015)
    top2 = set(np.argsort(-probs)[:2].tolist())
    assert set(model.sample(src[:2000], max_len=1, seed=7, top_k=2)[0][:, 0].tolist()) == top2
    order = np.argsort(-probs)
    nucleus = order[: int(np.searchsorted(np.cumsum(probs[order]), 0.6)) + 1]
    drawn = set(model.sample(src[:2000], max_len=1, seed=8, top_p=0.6)[0][:, 0].tolist())
    assert drawn == set(nucleus.tolist())


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(("call", "error", "pattern"), [
    (lambda m, s: m.beam_search(s, beam=0), ValueError, r"beam_search: beam must be >= 1, got 0"),
    (lambda m, s: m.beam_search(s, beam=2, n_best=3), ValueError,
     r"beam_search: n_best must be at most beam, got n_best=3 > beam=2"),
    (lambda m, s: m.beam_search(s, beam=2, n_best=0), ValueError,
     r"beam_search: n_best must be >= 1, got 0"),
    (lambda m, s: m.beam_search(s, max_len=3, min_length=4), ValueError,
     r"beam_search: min_length must be at most max_len, got min_length=4 > max_len=3"),
    (lambda m, s: m.greedy(s, max_len=3, min_length=5), ValueError,
     r"greedy: min_length must be at most max_len"),
    (lambda m, s: m.beam_search(s, coverage_penalty=-0.1), ValueError,
     r"beam_search: coverage_penalty must be a finite number >= 0.0, got -0.1"),
    (lambda m, s: m.beam_search(s, length_penalty=float("nan")), ValueError,
     r"beam_search: length_penalty must be a finite number, got nan"),
    (lambda m, s: m.beam_search(s, beam=2.0), TypeError, r"beam_search: beam must be an int, got 2.0"),
    (lambda m, s: m.greedy(s, no_repeat_ngram_size=-1), ValueError,
     r"greedy: no_repeat_ngram_size must be >= 0, got -1"),
    (lambda m, s: m.sample(s, temperature=0), ValueError,
     r"sample: temperature must be a finite number > 0.0, got 0"),
    (lambda m, s: m.sample(s, top_p=1.5), ValueError,
     r"sample: top_p must be a finite number in \(0.0, 1.0\], got 1.5"),
    (lambda m, s: m.sample(s, top_k=-2), ValueError, r"sample: top_k must be >= 0, got -2"),
    (lambda m, s: decoding.greedy(m, np.array([3, 4])), ta.ShapeError,
     r"greedy: src must be an integer array"),
])
@pytest.mark.parametrize("family", FAMILIES)
def test_bad_options_name_the_function_and_the_values(family, call, error, pattern):
    model = make(family)
    with pytest.raises(error, match=pattern):
        call(model, sources())


def test_decoding_restores_the_training_mode():
    model = make("transformer", dropout=0.3)
    assert model.training
    model.beam_search(sources(), beam=2, max_len=3, n_best=2, average_weights=False)
    model.sample(sources(), max_len=3)
    assert model.training
