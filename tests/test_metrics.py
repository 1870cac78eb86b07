"""ta.metrics: hand-computed cases, sacrebleu called directly as the BLEU/chrF oracle, and a
textbook edit-distance DP (here only, as an oracle) for the token error rate."""

import json
import math
import pickle

import pytest
import sacrebleu
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_attn import metrics
from tinygrad_attn.metrics import (
    Score,
    bleu,
    chrf,
    exact_match,
    score,
    signatures,
    token_error_rate,
    word_error_rate,
)


def levenshtein_oracle(a, b):
    """Wagner-Fischer edit distance, unit costs: the oracle rapidfuzz must agree with."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def as_references(item):
    """The references of one refs item, by the module's rule (a list of str is one reference)."""
    if all(isinstance(element, str) for element in item):
        return [list(item)]
    return [list(ref) for ref in item]


# ---- token error rate ----------------------------------------------------------------------------


def test_token_error_rate_one_substitution_one_deletion():
    # a=a, b->x (substitution), c=c, d deleted: 2 edits over 4 reference tokens.
    assert token_error_rate([["a", "b", "c"]], [["a", "x", "c", "d"]]) == 2 / 4


def test_token_error_rate_pools_counts_over_the_corpus():
    # Item 1: 1 edit / 1 token; item 2: 0 edits / 4 tokens.  Corpus: (1 + 0) / (1 + 4) = 0.2,
    # not the mean of per-item rates (1.0 + 0.0) / 2 = 0.5.
    hyps = [["a"], ["a", "b", "c", "d"]]
    refs = [["b"], ["a", "b", "c", "d"]]
    assert token_error_rate(hyps, refs) == pytest.approx(0.2)


def test_token_error_rate_picks_the_closest_reference():
    # d(ab, xyz) = 3, d(ab, ac) = 1: the second is chosen, so 1 / 2.
    # (The first would give 3 / 3, pooling both 4 / 5.)
    assert token_error_rate([["a", "b"]], [[["x", "y", "z"], ["a", "c"]]]) == 1 / 2


def test_token_error_rate_tie_goes_to_the_shorter_reference():
    # d(ab, abc) = 1 = d(ab, a): tie, the shorter ["a"] is chosen, so 1 / 1 (not 1 / 3).
    assert token_error_rate([["a", "b"]], [[["a", "b", "c"], ["a"]]]) == 1.0


def test_token_error_rate_phonemes_with_two_pronunciations():
    # HH AH L OW matches its second pronunciation (0 edits / 4); W ER L D vs W AO L D: 1 / 4.
    hyps = [["HH", "AH", "L", "OW"], ["W", "ER", "L", "D"]]
    refs = [[["HH", "EH", "L", "OW"], ["HH", "AH", "L", "OW"]], ["W", "AO", "L", "D"]]
    assert token_error_rate(hyps, refs) == 1 / 8


def test_token_error_rate_empty_hypothesis_deletes_every_reference_token():
    # Nothing predicted against a b c: 3 deletions / 3 tokens.
    assert token_error_rate([[]], [["a", "b", "c"]]) == 1.0


def test_token_error_rate_empty_references():
    assert token_error_rate([[]], [[]]) == 0.0                          # 0 edits / 0 tokens
    assert token_error_rate([["a"]], [[]]) == math.inf                  # 1 insertion / 0 tokens
    assert token_error_rate([[], ["a"]], [[], ["a"]]) == 0.0            # 0 / 1
    assert token_error_rate([["a"], ["a"]], [[], ["b"]]) == 2.0         # (1 + 1) / (0 + 1)


def test_token_error_rate_on_characters_is_cer():
    # kitten -> sitting: k->s, e->i, insert g = 3 edits over the 7 characters of "sitting".
    assert token_error_rate([list("kitten")], [list("sitting")]) == 3 / 7


# ---- exact match and g2p's WER -------------------------------------------------------------------


def test_exact_match_counts_a_match_with_any_reference():
    # Item 1 matches its second pronunciation, item 2 misses, item 3 matches: 2 / 3.
    hyps = [["T", "AH0"], ["B"], ["K"]]
    refs = [[["T", "UW1"], ["T", "AH0"]], ["P"], ["K"]]
    assert exact_match(hyps, refs) == pytest.approx(2 / 3)
    assert word_error_rate(hyps, refs) == pytest.approx(1 / 3)


def test_exact_match_treats_tuples_like_lists():
    assert exact_match([("a", "b")], [["a", "b"]]) == 1.0
    assert exact_match([["a", "b"]], [(("x",), ("a", "b"))]) == 1.0


def test_exact_match_empty_hypothesis_matches_empty_reference():
    assert exact_match([[], ["a"]], [[], [[], ["b"]]]) == 0.5


# ---- BLEU and chrF -------------------------------------------------------------------------------

SENTENCES = [
    "the cat sat on the mat".split(),
    "a quick brown fox jumps over the dog".split(),
    "HH AH L OW W ER L D".split(),
]
REFERENCES = [
    "the cat is on the mat".split(),
    "the quick brown fox jumped over the lazy dog".split(),
    "HH EH L OW W ER L D".split(),
]


def test_bleu_identical_corpus_is_100_and_disjoint_is_0():
    assert bleu(SENTENCES, SENTENCES) == pytest.approx(100.0)
    assert bleu([["a", "b", "c", "d"]], [["w", "x", "y", "z"]]) == 0.0


def test_bleu_of_short_items_is_100_when_identical():
    # No item has 4 tokens, so there are no 4-grams anywhere: effective_order averages orders 1..3
    # instead of scoring the missing order as 0.
    corpus = [["HH", "AY"], ["B", "IY", "Z"]]
    assert bleu(corpus, corpus) == pytest.approx(100.0)


def test_bleu_matches_sacrebleu_on_joined_strings():
    hyp_lines = [" ".join(tokens) for tokens in SENTENCES]
    ref_lines = [" ".join(tokens) for tokens in REFERENCES]
    expected = sacrebleu.corpus_bleu(hyp_lines, [ref_lines], tokenize="none")
    assert 0.0 < expected.score < 100.0
    assert bleu(SENTENCES, REFERENCES) == pytest.approx(expected.score, abs=1e-9)


def test_bleu_keeps_a_whitespace_token_as_one_token():
    # Joined naively "a   b" would split to [a, b] and equal the reference; the space token
    # stays a token, so the hypothesis has an extra one and cannot score 100.
    assert bleu([["a", " ", "b"]], [["a", "b"]]) < 100.0


def test_chrf_identical_is_100_and_disjoint_is_0():
    assert chrf(SENTENCES, SENTENCES) == pytest.approx(100.0)
    assert chrf([list("abc")], [list("xyz")]) == 0.0


def test_chrf_on_characters_equals_chrf_on_the_text():
    # chrF drops whitespace, so space-joined characters give the text's own character n-grams.
    hyp, ref = "the cat sat", "the cats sat down"
    expected = sacrebleu.corpus_chrf([hyp], [[ref]])
    assert 0.0 < expected.score < 100.0
    assert chrf([list(hyp)], [list(ref)]) == pytest.approx(expected.score, abs=1e-9)


def test_variable_reference_counts_match_sacrebleu_with_none_padding():
    # Item 0 has two references, items 1 and 2 one each: stream 2 is padded with None.
    refs = [[REFERENCES[0], SENTENCES[0]], REFERENCES[1], REFERENCES[2]]
    hyp_lines = [" ".join(tokens) for tokens in SENTENCES]
    streams = [[" ".join(r) for r in (REFERENCES[0], REFERENCES[1], REFERENCES[2])],
               [" ".join(SENTENCES[0]), None, None]]
    expected_bleu = sacrebleu.corpus_bleu(hyp_lines, streams, tokenize="none")
    expected_chrf = sacrebleu.corpus_chrf(hyp_lines, streams)
    assert bleu(SENTENCES, refs) == pytest.approx(expected_bleu.score, abs=1e-9)
    assert chrf(SENTENCES, refs) == pytest.approx(expected_chrf.score, abs=1e-9)
    assert "nrefs:var" in bleu(SENTENCES, refs).signature


def test_variable_reference_counts_equal_duplicated_references():
    # Repeating a reference changes neither BLEU's clipped counts and closest length nor chrF's
    # best match, so padding the short items with a copy must give the same scores as None.
    varied = [[REFERENCES[0], SENTENCES[0]], REFERENCES[1], [REFERENCES[2]]]
    padded = [[REFERENCES[0], SENTENCES[0]], [REFERENCES[1], REFERENCES[1]],
              [REFERENCES[2], REFERENCES[2]]]
    assert bleu(SENTENCES, varied) == pytest.approx(bleu(SENTENCES, padded), abs=1e-9)
    assert chrf(SENTENCES, varied) == pytest.approx(chrf(SENTENCES, padded), abs=1e-9)


def test_score_is_a_float_with_a_signature():
    result = bleu(SENTENCES, REFERENCES)
    assert isinstance(result, float) and isinstance(result, Score)
    assert "tok:none" in result.signature and "nrefs:1" in result.signature
    assert json.loads(json.dumps(result)) == pytest.approx(float(result))
    restored = pickle.loads(pickle.dumps(result))
    assert restored == result and restored.signature == result.signature


@pytest.mark.parametrize("refs", [
    REFERENCES,
    [[r, r] for r in REFERENCES],
    [[REFERENCES[0], SENTENCES[0]], REFERENCES[1], REFERENCES[2]],
], ids=["one", "two", "variable"])
def test_signatures_match_the_scores(refs):
    expected = {"bleu": bleu(SENTENCES, refs).signature, "chrf": chrf(SENTENCES, refs).signature}
    assert signatures(refs) == expected


def test_signatures_default_to_one_reference():
    defaults = signatures()
    assert defaults == signatures(REFERENCES)
    assert "nrefs:1" in defaults["bleu"] and "eff:yes" in defaults["bleu"]


# ---- score() -------------------------------------------------------------------------------------


def test_score_one_reference_each_has_no_wer():
    result = score(SENTENCES, REFERENCES)
    assert set(result) == {"n", "exact_match", "token_error_rate", "bleu", "chrf"}
    assert result["n"] == 3
    assert all(type(result[key]) is float for key in result if key != "n")
    json.dumps(result)


def test_score_several_references_adds_wer():
    hyps = [["T", "AH0"], ["B"]]
    refs = [[["T", "UW1"], ["T", "AH0"]], ["P"]]
    result = score(hyps, refs)
    assert result["wer"] == 0.5 and result["exact_match"] == 0.5
    # Item 1: 0 / 2 (second pronunciation); item 2: 1 / 1 -> 1 / 3.
    assert result["token_error_rate"] == pytest.approx(1 / 3)


# ---- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("call, error, message", [
    (lambda: token_error_rate(["hi"], [["h", "i"]]), TypeError, r"token_error_rate: hypothesis 0 is a str"),
    (lambda: exact_match(["hi"], [["h", "i"]]), TypeError, r"list\(text\) for characters or text.split\(\)"),
    (lambda: exact_match([["a"], "b"], [["a"], ["b"]]), TypeError, r"exact_match: hypothesis 1 is a str"),
    (lambda: bleu("hello", ["hello"]), TypeError, r"bleu: hyps is a str"),
    (lambda: chrf([["a"]], ["a b"]), TypeError, r"chrf: reference item 0 is a str"),
    (lambda: exact_match([["a"]], [["a"], ["b"]]), ValueError, r"exact_match: 1 hypotheses but 2 reference"),
    (lambda: word_error_rate([], []), ValueError, r"word_error_rate: hyps is empty"),
    (lambda: score([["a"], ["b"]], [["a"], ["b", ["c"]]]), ValueError, r"score: reference item 1 mixes"),
    (lambda: token_error_rate([["a", 1]], [["a"]]), TypeError, r"hypothesis 0 has a int at position 1"),
    (lambda: token_error_rate([["a"]], [[["a"], ["b", 2]]]), TypeError, r"reference 1 of item 0 has a int"),
    (lambda: exact_match([["a"]], [[3]]), TypeError, r"reference item 0 holds 3"),
    (lambda: exact_match([["a"]], [None]), TypeError, r"reference item 0 must be a list"),
    (lambda: exact_match(None, [["a"]]), TypeError, r"exact_match: hyps must be a sequence"),
    (lambda: signatures([]), ValueError, r"signatures: refs is empty"),
])
def test_metrics_reject_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ---- properties ----------------------------------------------------------------------------------

tokens = st.lists(st.sampled_from("abc"), max_size=5)
several = st.lists(tokens, min_size=1, max_size=3)


@st.composite
def corpora(draw):
    """A corpus of 1..4 items; each refs item is one reference or a list of 1..3."""
    size = draw(st.integers(1, 4))
    hyps = draw(st.lists(tokens, min_size=size, max_size=size))
    refs = draw(st.lists(st.one_of(tokens, several), min_size=size, max_size=size))
    return hyps, refs


@settings(deadline=None)
@given(corpora())
def test_token_error_rate_matches_edit_distance_oracle(corpus):
    hyps, refs = corpus
    edits = 0
    length = 0
    for hyp, item in zip(hyps, refs, strict=True):
        distance, ref_length = min((levenshtein_oracle(hyp, ref), len(ref)) for ref in as_references(item))
        edits += distance
        length += ref_length
    expected = edits / length if length else (0.0 if edits == 0 else math.inf)
    assert token_error_rate(hyps, refs) == pytest.approx(expected)


@settings(deadline=None)
@given(corpora())
def test_token_error_rate_is_zero_iff_every_hypothesis_matches(corpus):
    hyps, refs = corpus
    every_match = all(hyp in as_references(item) for hyp, item in zip(hyps, refs, strict=True))
    assert (token_error_rate(hyps, refs) == 0.0) == every_match
    assert (exact_match(hyps, refs) == 1.0) == every_match


@settings(deadline=None)
@given(corpora())
def test_exact_match_is_a_share_and_wer_its_complement(corpus):
    hyps, refs = corpus
    matches = sum(hyp in as_references(item) for hyp, item in zip(hyps, refs, strict=True))
    assert exact_match(hyps, refs) == matches / len(hyps)
    assert 0.0 <= exact_match(hyps, refs) <= 1.0
    assert word_error_rate(hyps, refs) == pytest.approx(1.0 - exact_match(hyps, refs))


@settings(deadline=None)
@given(corpora())
def test_score_agrees_with_each_metric(corpus):
    hyps, refs = corpus
    result = score(hyps, refs)
    assert result["exact_match"] == exact_match(hyps, refs)
    assert result["token_error_rate"] == token_error_rate(hyps, refs)
    assert result["bleu"] == float(bleu(hyps, refs))
    assert 0.0 <= result["bleu"] <= 100.0 + 1e-9 and 0.0 <= result["chrf"] <= 100.0 + 1e-9
    assert ("wer" in result) == any(len(as_references(item)) > 1 for item in refs)


def test_module_exports():
    assert set(metrics.__all__) == {"Score", "exact_match", "token_error_rate", "word_error_rate",
                                    "bleu", "chrf", "score", "signatures"}
