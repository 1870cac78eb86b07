"""How long a decode may run, and which sources it takes, for both model families: the
default limit is each source's own (a batch decodes every row as that row alone), per-row
limits in greedy decoding, beam search and sampling, the Transformer's position table (decoding
stops at its end; a longer source is refused before any work), and empty sources (decoded as
a row of only padding, everywhere)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.models import decoding
from tinygrad_attn.models.decoding import END, PAD

FAMILIES = ["seq2seq", "transformer"]
LETTERS = list("abcdefg")
VOCAB = ta.data.Vocab(LETTERS)                                     # 4 reserved ids + 7 letters


def make(family: str, end_bias: float = 0.0, seed: int = 0, **options):
    """A tiny float64 model of either family over VOCAB, its <end> logit moved by ``end_bias``
    (very negative: it never ends, so every output runs to its limit)."""
    ta.manual_seed(seed)
    size = len(VOCAB)
    if family == "seq2seq":
        model = ta.models.Seq2Seq(size, size, embed=4, hidden=6, attention="additive", **options)
    else:
        settings = dict(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=2, dim_feedforward=16,
                        dropout=0.0) | options
        model = ta.models.Transformer(size, size, **settings)
    model = model.double()
    with ta.no_grad():
        model.out.bias.data[END] += end_bias
    return model


def token_lists(seed: int = 0) -> list[list[str]]:
    """Sources of very different lengths, the long ones among short ones."""
    rng = np.random.default_rng(seed)
    return [list(rng.choice(LETTERS, size=n)) for n in (2, 9, 1, 5, 12, 3)]


def task_like(family_vocab=VOCAB):
    return SimpleNamespace(tokenize=list, detokenize="".join, src_vocab=family_vocab, tgt_vocab=family_vocab)


# ---------------------------------------------------------------- the default limit is each source's own


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("end_bias", [-30.0, 0.5])
def test_a_batch_decodes_each_source_as_it_decodes_alone_with_the_default_limit(family, end_bias):
    model = make(family, end_bias=end_bias)
    sources = token_lists()
    batched = ta.models.translate_tokens(model, sources, VOCAB, VOCAB)
    batched_beam = ta.models.translate_tokens(model, sources, VOCAB, VOCAB, beam=3, n_best=2)
    for index, source in enumerate(sources):
        [(tokens, attention)] = ta.models.translate_tokens(model, [source], VOCAB, VOCAB)
        assert batched[index][0] == tokens
        np.testing.assert_allclose(batched[index][1], attention, rtol=1e-9, atol=1e-14)
        if end_bias < 0:                   # it never ends: the output runs to the source's own limit
            assert len(tokens) == 2 * len(source) + 10
        [alone] = ta.models.translate_tokens(model, [source], VOCAB, VOCAB, beam=3, n_best=2)
        assert [t for t, _ in batched_beam[index]] == [t for t, _ in alone]
        for (_, mine), (_, theirs) in zip(batched_beam[index], alone, strict=True):
            assert mine.tokens == theirs.tokens
            assert mine.score == pytest.approx(theirs.score, rel=1e-10)
            assert mine.log_prob == pytest.approx(theirs.log_prob, rel=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_evaluate_scores_do_not_depend_on_the_batch_size(family):
    model = make(family, end_bias=-30.0)
    pairs = [(source, source) for source in token_lists(1)]
    one_at_a_time = ta.models.evaluate(model, pairs, VOCAB, VOCAB, batch_size=1)
    assert ta.models.evaluate(model, pairs, VOCAB, VOCAB, batch_size=256) == one_at_a_time


def padded(sources: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    src = ta.data.encode_batch(sources, VOCAB)
    return src, (src != PAD).sum(axis=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_per_row_limits_decode_each_row_as_alone_in_greedy_and_beam_search(family):
    model = make(family, end_bias=-30.0)
    src, lengths = padded(token_lists(2))
    limits = decoding.default_max_len(lengths)
    greedy = model.greedy(src, max_len=limits, hypotheses=True)
    beam = model.beam_search(src, beam=3, max_len=limits, n_best=2)
    for row, (length, limit) in enumerate(zip(lengths, limits, strict=True)):
        alone = src[row : row + 1, :length]
        [mine] = model.greedy(alone, max_len=int(limit), hypotheses=True)
        assert greedy[row].tokens == mine.tokens and len(mine.tokens) == limit
        assert greedy[row].log_prob == pytest.approx(mine.log_prob, rel=1e-10)
        [theirs] = model.beam_search(alone, beam=3, max_len=int(limit), n_best=2)
        assert [h.tokens for h in beam[row]] == [h.tokens for h in theirs]
        assert [h.score for h in beam[row]] == pytest.approx([h.score for h in theirs], rel=1e-10)
    ids, weights = model.greedy(src, max_len=limits)
    assert ids.shape == (len(src), limits.max()) and weights.shape[:2] == ids.shape
    for row, limit in enumerate(limits):
        assert (ids[row, :limit] != PAD).all() and not ids[row, limit:].any()
        assert not weights[row, limit:].any()


@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_stops_every_row_at_its_own_limit(family):
    model = make(family, end_bias=-30.0)
    src, _ = padded(token_lists(3))
    limits = np.array([3, 1, 7, 2, 5, 4])
    found = model.sample(src, max_len=limits, seed=0, hypotheses=True)
    assert [len(h.tokens) for h in found] == limits.tolist()
    ids, _ = model.sample(src, max_len=list(limits), seed=0)
    assert [h.tokens for h in found] == [row[:limit].tolist() for row, limit in zip(ids, limits, strict=True)]


@pytest.mark.parametrize(("max_len", "error", "pattern"), [
    ([3, 4], ValueError, r"greedy: max_len must be an int or one int per row \(6\), got shape \(2,\)"),
    ([3, 4, 0, 1, 1, 1], ValueError, r"greedy: max_len must be >= 1, got 0 \(row 2\)"),
    ([3.0, 4, 1, 1, 1, 1], TypeError, r"greedy: max_len must be an int or one int per row, got float64"),
    (np.ones((6, 1), int), ValueError, r"greedy: max_len must be an int or one int per row \(6\), got shape"),
])
def test_bad_per_row_limits_say_what_is_wrong(max_len, error, pattern):
    model = make("seq2seq")
    src, _ = padded(token_lists())
    with pytest.raises(error, match=pattern):
        model.greedy(src, max_len=max_len)
    with pytest.raises(ValueError, match=r"greedy: min_length must be at most max_len, got min_length=3 > "
                                         r"max_len\[1\]=2"):
        model.greedy(src, max_len=[4, 2, 5, 5, 5, 5], min_length=3)


# ---------------------------------------------------------------- the position table


def test_both_families_say_how_long_a_source_and_an_output_may_be():
    seq2seq, transformer = make("seq2seq"), make("transformer", max_len=12)
    assert seq2seq.max_src_len is None and seq2seq.max_tgt_len is None
    assert transformer.max_src_len == 12 and transformer.max_tgt_len == 12


@pytest.mark.parametrize("use_cache", [True, False])
def test_decoding_stops_at_the_end_of_the_position_table(use_cache):
    model = make("transformer", end_bias=-30.0, max_len=12)
    src, _ = padded(token_lists()[:4])
    ids, _ = model.greedy(src, max_len=50, use_cache=use_cache)
    expected, _ = model.greedy(src, max_len=12, use_cache=use_cache)
    np.testing.assert_array_equal(ids, expected)
    assert ids.shape[1] == 12
    beam = model.beam_search(src, beam=2, max_len=40, n_best=2, use_cache=use_cache)
    expected = model.beam_search(src, beam=2, max_len=12, n_best=2, use_cache=use_cache)
    assert [[h.tokens for h in b] for b in beam] == [[h.tokens for h in b] for b in expected]
    found = model.sample(src, max_len=[30, 5, 20, 12], seed=1, hypotheses=True, use_cache=use_cache)
    assert [len(h.tokens) for h in found] == [12, 5, 12, 12]


def test_evaluate_on_a_short_position_table_stops_there():
    model = make("transformer", end_bias=-30.0, max_len=12)
    pairs = [(source, source) for source in token_lists() if len(source) <= 12]
    scores, rows = ta.models.evaluate(model, pairs, VOCAB, VOCAB, return_outputs=True)
    assert scores["n"] == len(pairs)
    assert all(len(output) == 12 for _, output, _ in rows)           # 2 * |source| + 10, cut to 12



@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "compiled"])
def test_batch_padding_stops_at_the_position_table(compile_):
    """translate_tokens pads a batch's sources to a multiple of 4 columns, never past the
    position table: a 9-token source under a 10-position table decodes (it was padded to 12
    and refused as padding wider than the table)."""
    model = make("transformer", end_bias=-30.0, max_len=10)
    source = list("abcabcabc")                                       # 9 tokens, 9 % 4 != 0
    found = ta.models.translate_tokens(model, [source], VOCAB, VOCAB, max_len=3, compile=compile_)
    ids, _ = model.greedy(ta.data.encode_batch([source], VOCAB), max_len=3)
    assert found[0][0] == VOCAB.decode(ids[0])

def over_long_calls():
    long = list("abcdefgabcdefg")                                     # 14 tokens
    short = list("abc")
    src = ta.data.encode_batch([short, long], VOCAB)
    return [
        ("greedy", lambda m: m.greedy(src)),
        ("beam_search", lambda m: m.beam_search(src, beam=2)),
        ("sample", lambda m: m.sample(src, seed=0)),
        ("translate_tokens",
         lambda m: ta.models.translate_tokens(m, [short, long], VOCAB, VOCAB, batch_size=1)),
        ("decode", lambda m: ta.models.decode(m, [short, long], VOCAB, VOCAB, batch_size=1)),
        ("evaluate", lambda m: ta.models.evaluate(m, [(short, short), (long, long)], VOCAB, VOCAB,
                                                   batch_size=1)),
        ("translate", lambda m: ta.models.translate(m, "".join(long), task_like())),
    ]


@pytest.mark.parametrize(("where", "call"), over_long_calls(), ids=[name for name, _ in over_long_calls()])
def test_a_source_longer_than_the_position_table_is_refused_before_any_work(where, call):
    model = make("transformer", max_len=12)
    started = []
    decode_start = model.decode_start
    model.decode_start = lambda src, **options: started.append(src) or decode_start(src, **options)
    with pytest.raises(ta.ShapeError, match=rf"^{where}: source \d has 14 tokens, longer than the "
                                            rf"Transformer's position table \(max_len=12\)$"):
        call(model)
    assert not started


def test_padding_wider_than_the_position_table_is_named_as_such():
    model = make("transformer", max_len=4)
    src = np.array([[4, 5, 0, 0, 0, 0]])
    with pytest.raises(ta.ShapeError, match=r"greedy: src is 6 tokens wide, wider than the Transformer's "
                                            r"position table \(max_len=4\); its longest source has 2 tokens"):
        model.greedy(src)


# ---------------------------------------------------------------- empty sources


@pytest.mark.parametrize("family", FAMILIES)
def test_an_empty_source_decodes_like_a_row_of_only_padding_everywhere(family):
    model = make(family, end_bias=0.5)
    alone = ta.models.translate_tokens(model, [[]], VOCAB, VOCAB)
    beside = ta.models.translate_tokens(model, [[], list("abc"), []], VOCAB, VOCAB)
    assert beside[0][0] == beside[2][0] == alone[0][0]
    assert alone[0][1].shape[1] == 0                                  # no source column to attend to
    nbest = ta.models.translate_tokens(model, [[]], VOCAB, VOCAB, beam=3, n_best=2)
    nbest_beside = ta.models.translate_tokens(model, [list("ab"), []], VOCAB, VOCAB, beam=3, n_best=2)
    assert [t for t, _ in nbest[0]] == [t for t, _ in nbest_beside[1]]
    for (_, mine), (_, theirs) in zip(nbest[0], nbest_beside[1], strict=True):
        assert mine.score == pytest.approx(theirs.score, rel=1e-10)

    width0, all_padding = np.zeros((2, 0), np.int64), np.array([[PAD, PAD, PAD], [4, 5, 6]])
    ids, weights = model.greedy(width0, max_len=6)
    padded_ids, padded_weights = model.greedy(all_padding, max_len=6)
    np.testing.assert_array_equal(ids[0], padded_ids[0, : ids.shape[1]])
    assert weights.shape == (2, ids.shape[1], 0) and not padded_weights[0].any()
    [h] = model.beam_search(width0[:1], beam=2, max_len=6, n_best=1)[0]
    [g] = model.beam_search(all_padding, beam=2, max_len=6, n_best=1)[0]
    assert h.tokens == g.tokens and h.score == pytest.approx(g.score, rel=1e-10)
    found = model.sample(width0, max_len=4, seed=0, hypotheses=True)
    assert len(found) == 2

    text, source, tokens, attention = ta.models.translate(model, "", task_like())
    assert source == [] and tokens == alone[0][0] and text == "".join(tokens)
    scores = ta.models.evaluate(model, [([], ["a"]), (["a"], ["a"])], VOCAB, VOCAB)
    assert scores["n"] == 2


def test_teacher_forcing_an_empty_source_gives_what_decoding_reports():
    for family in FAMILIES:
        model = make(family)
        [h] = model.greedy(np.zeros((1, 0), np.int64), max_len=4, hypotheses=True)
        tgt_in = np.array([[ta.data.START, *h.tokens[:-1]]])
        with ta.no_grad():
            logits, _ = model(np.zeros((1, 0), np.int64), tgt_in)
        log_probs = decoding.log_softmax(logits.numpy())[0]
        assert log_probs[np.arange(len(h.tokens)), h.tokens].sum() == pytest.approx(h.log_prob, rel=1e-12)
