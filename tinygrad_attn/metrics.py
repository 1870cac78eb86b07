"""Corpus-level scores for seq2seq outputs: exact match, token error rate, g2p's WER, BLEU and chrF.

    import tinygrad_attn as ta
    hyps = [["HH", "AH", "L", "OW"], ["W", "ER", "L", "D"]]
    refs = [[["HH", "AH", "L", "OW"], ["HH", "EH", "L", "OW"]],   # two pronunciations
            ["W", "ER", "L", "D"]]                               # one
    ta.metrics.score(hyps, refs)   # {"n": 2, "exact_match": 1.0, "token_error_rate": 0.0, ...}

Every function takes ``hyps``, a sequence of hypotheses, each a list of token strings
(``["HH", "AH", "L", "OW"]`` for phonemes, ``list("hello")`` for characters, ``text.split()`` for
words), and ``refs``, one item per hypothesis.  An item is either ONE reference (a list of token
strings, possibly empty) or SEVERAL (a non-empty list of token lists), told apart by its elements.

The metrics, with ``h_i`` the i-th hypothesis, ``R_i`` its references and ``d`` the Levenshtein
distance (substitution, insertion and deletion each cost 1):

- exact match = (1/N) * #{i : h_i in R_i}.  Sequence accuracy, reported by most seq2seq tasks
  (g2p, transliteration, dates).
- token error rate = sum_i d(h_i, r_i*) / sum_i |r_i*|, where r_i* is the reference of R_i closest
  to h_i.  On phonemes this is the phoneme error rate (PER) of grapheme-to-phoneme papers
  (Bisani & Ney 2008; Yao & Zweig 2015), on characters the character error rate (CER) of OCR and
  speech recognition, and on words (``text.split()``) the word error rate of speech recognition.
  (Not sacrebleu's TER, the translation edit rate of Snover et al. 2006, which also counts shifts.)
- word error rate (g2p) = 1 - exact match: the share of words whose predicted pronunciation
  matches none of their references, as g2p papers report it next to PER.
- BLEU (Papineni et al. 2002): geometric mean of clipped n-gram precisions (n = 1..4) times a
  brevity penalty, the machine translation standard.
- chrF (Popovic 2015): F-beta score (beta = 2) of character n-grams (n = 1..6), common in machine
  translation and transliteration.

All are corpus-level: counts are summed over the corpus before dividing (a long word weighs more in
the token error rate than a short one), which is how the papers above report them, not the mean of
per-item scores.  BLEU and chrF come from sacrebleu (Post 2018), on its 0-100 scale, as a
:class:`Score` that carries sacrebleu's signature so a reported number can be reproduced.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from rapidfuzz.distance import Levenshtein

__all__ = [
    "Score",
    "exact_match",
    "token_error_rate",
    "word_error_rate",
    "bleu",
    "chrf",
    "score",
    "signatures",
]

Tokens = tuple[str, ...]
# One validated corpus item: the hypothesis and its references (at least one).
Item = tuple[Tokens, tuple[Tokens, ...]]

# The sacrebleu settings every function here uses, in one place, so bleu(), chrf() and signatures()
# always describe the same metric.  tokenize="none": the text is already tokens, and sacrebleu's
# default 13a tokenizer would split tokens such as "AH0" or "'s" again.  force=True: tokenized text
# is what we mean to pass, so sacrebleu's "looks tokenized" warning would only be noise.
# effective_order=True: BLEU then averages only the n-gram orders that occur in the corpus; with the
# default, a corpus with no 4-token item (short words' phonemes) scores 0 even when every item is
# right.  It changes nothing for a corpus that has 4-grams.
BLEU_SETTINGS = {"tokenize": "none", "force": True, "effective_order": True}
CHRF_SETTINGS: dict = {}    # sacrebleu's chrF defaults: chrF2, characters 1..6, whitespace ignored

_WHITESPACE = re.compile(r"\s")


class Score(float):
    """A sacrebleu corpus score (0-100) as a plain float that also carries the metric's signature.

    Arithmetic and ``json.dumps`` see an ordinary float; ``.signature`` is sacrebleu's
    reproducibility string, e.g. ``"nrefs:1|case:mixed|eff:yes|tok:none|smooth:exp|version:2.6.0"``.

    Example:
        >>> s = Score(42.5, "nrefs:1|...")
        >>> s + 1, s.signature
        (43.5, 'nrefs:1|...')
    """

    signature: str

    def __new__(cls, value: float, signature: str) -> Score:
        self = super().__new__(cls, value)
        self.signature = signature
        return self

    def __reduce__(self):
        # float's own pickling would call Score(value) and lose the signature.
        return (Score, (float(self), self.signature))

    def __repr__(self) -> str:
        return f"Score({float(self)!r}, signature={self.signature!r})"


def exact_match(hyps: Sequence[Sequence[str]], refs: Sequence) -> float:
    """Share of hypotheses equal to one of their references: (1/N) * #{i : h_i in R_i}.

    Args:
        hyps: N hypotheses, each a list of token strings.
        refs: N items, each one reference (a list of token strings) or several (a list of them).

    Returns:
        A float in [0, 1].

    Example:
        >>> exact_match([["a", "b"], ["c"]], [["a", "b"], [["x"], ["c"]]])
        1.0
    """
    return _exact_match(_items("exact_match", hyps, refs))


def token_error_rate(hyps: Sequence[Sequence[str]], refs: Sequence) -> float:
    """Corpus token error rate: sum_i d(h_i, r_i*) / sum_i |r_i*|, with d the Levenshtein distance.

    r_i* is the reference of item i closest to its hypothesis; on a tie in distance the shorter
    reference wins (the larger error rate, so several references never flatter a system more than
    needed), then the first.  This is PER on phonemes, CER on characters and speech recognition's
    WER on words.  It can exceed 1 when hypotheses are longer than their references.

    If every chosen reference is empty the ratio is 0/0 or e/0: the result is 0.0 when every
    hypothesis is empty too (nothing to get wrong, nothing got wrong), else ``float("inf")``
    (``json.dumps`` writes that as ``Infinity``).

    Args:
        hyps: N hypotheses, each a list of token strings.
        refs: N items, each one reference (a list of token strings) or several (a list of them).

    Returns:
        A float >= 0.

    Example:
        >>> token_error_rate([["a", "b", "c"]], [["a", "x", "c", "d"]])   # 1 substitution, 1 deletion
        0.5
    """
    return _token_error_rate(_items("token_error_rate", hyps, refs))


def word_error_rate(hyps: Sequence[Sequence[str]], refs: Sequence) -> float:
    """Grapheme-to-phoneme word error rate: share of words whose hypothesis matches no reference.

    WER = 1 - exact_match.  This is g2p's WER, where an item is one word and its tokens are
    phonemes; it is NOT speech recognition's WER (word-level edit distance over a sentence), which
    is ``token_error_rate(hyps, refs)`` on word tokens.  With several references (pronunciations)
    a word counts as right if it matches any of them, as Yao & Zweig (2015) and the CMUdict g2p
    literature count.

    Args:
        hyps: N hypotheses (one per word), each a list of phoneme strings.
        refs: N items, each one pronunciation or a list of pronunciations.

    Returns:
        A float in [0, 1].

    Example:
        >>> word_error_rate([["T", "AH0"], ["B"]], [[["T", "AH0"], ["T", "UW1"]], ["P"]])
        0.5
    """
    return 1.0 - _exact_match(_items("word_error_rate", hyps, refs))


def bleu(hyps: Sequence[Sequence[str]], refs: Sequence) -> Score:
    """Corpus BLEU through sacrebleu: BP * exp(sum_n log p_n / N_eff), p_n clipped n-gram precision.

    Each token list is joined with single spaces and scored with ``tokenize="none"``, so BLEU's
    words are exactly the given tokens (sacrebleu's default tokenizer would split "AH0" or "'s"
    again).  A token that itself contains whitespace (a space from ``list("a b")``) has it replaced
    by "\u2581" so it stays one token; an empty-string token vanishes.  ``effective_order=True``
    (see ``BLEU_SETTINGS``): orders with no n-gram in the whole corpus are left out of the mean, so
    a corpus of items shorter than 4 tokens is not scored 0.

    Args:
        hyps: N hypotheses, each a list of token strings.
        refs: N items, each one reference or several; items with fewer references than the most
            are padded with None, which sacrebleu drops per segment.

    Returns:
        A :class:`Score` in [0, 100] with ``.signature``.

    Example:
        >>> round(bleu([list("abcd")], [list("abcd")]), 6)
        100.0
    """
    return _bleu(_items("bleu", hyps, refs))


def chrf(hyps: Sequence[Sequence[str]], refs: Sequence) -> Score:
    """Corpus chrF through sacrebleu: (1 + b^2) P R / (b^2 P + R), b = 2, character n-grams 1..6.

    Tokens are joined with single spaces; sacrebleu's chrF drops all whitespace before taking
    character n-grams, so space-joined characters give the n-grams of the original text without
    its spaces, and space-joined words or phonemes give those of their concatenation ("HH AH L OW"
    is scored as "HHAHLOW": multi-letter tokens count by their letters).  With several references
    sacrebleu scores each item against its best-matching one.

    Args:
        hyps: N hypotheses, each a list of token strings.
        refs: N items, each one reference or several.

    Returns:
        A :class:`Score` in [0, 100] with ``.signature``.

    Example:
        >>> round(chrf([list("hello")], [list("hello")]), 6)
        100.0
    """
    return _chrf(_items("chrf", hyps, refs))


def score(hyps: Sequence[Sequence[str]], refs: Sequence) -> dict[str, float | int]:
    """Every metric at once, as a JSON-ready dict of plain numbers.

    Keys: ``n``, ``exact_match``, ``token_error_rate``, ``bleu``, ``chrf``, and ``wer`` (g2p's, see
    :func:`word_error_rate`) only when some item has several references, where it is the number
    g2p papers report.  The BLEU/chrF signatures are in :func:`signatures`.

    Args:
        hyps: N hypotheses, each a list of token strings.
        refs: N items, each one reference or several.

    Returns:
        A dict of floats (and the int ``n``).

    Example:
        >>> score([["a", "b"]], [["a", "b"]])["exact_match"]
        1.0
    """
    items = _items("score", hyps, refs)
    result: dict[str, float | int] = {
        "n": len(items),
        "exact_match": _exact_match(items),
        "token_error_rate": _token_error_rate(items),
        "bleu": float(_bleu(items)),
        "chrf": float(_chrf(items)),
    }
    if any(len(references) > 1 for _, references in items):
        result["wer"] = 1.0 - result["exact_match"]
    return result


def signatures(refs: Sequence | None = None) -> dict[str, str]:
    """sacrebleu's signatures of the BLEU and chrF settings used here.

    A signature includes the number of references per item ("nrefs:2", or "nrefs:var" when it
    varies), so pass the ``refs`` you score to get the strings :func:`bleu` and :func:`chrf` attach;
    without them the signatures are those for one reference per item.

    Args:
        refs: optional reference items, as for :func:`bleu`.

    Returns:
        ``{"bleu": signature, "chrf": signature}``.

    Example:
        >>> signatures()["bleu"]   # doctest: +ELLIPSIS
        'nrefs:1|case:mixed|eff:yes|tok:none|smooth:exp|version:...'
    """
    if refs is None:
        streams = [[""]]
    else:
        refs = _as_list("signatures", "refs", refs)
        if not refs:
            raise ValueError("signatures: refs is empty; pass one item per hypothesis, or None")
        # Hypotheses play no part in a signature: empty ones satisfy the validation.
        references = _items("signatures", [[]] * len(refs), refs)
        streams = _reference_streams(references, _chrf_line)
    bleu_metric, chrf_metric = _sacrebleu_metrics(streams)
    return {"bleu": str(bleu_metric.get_signature()), "chrf": str(chrf_metric.get_signature())}


# ---- the computations, on validated items ------------------------------------------------------


def _exact_match(items: list[Item]) -> float:
    return sum(hyp in references for hyp, references in items) / len(items)


def _token_error_rate(items: list[Item]) -> float:
    edits = 0
    length = 0
    for hyp, references in items:
        # Closest reference; on a tie in distance the shorter one, which gives the larger rate.
        distance, ref_length = min((Levenshtein.distance(hyp, ref), len(ref)) for ref in references)
        edits += distance
        length += ref_length
    if length == 0:
        return 0.0 if edits == 0 else float("inf")
    return edits / length


def _bleu(items: list[Item]) -> Score:
    hyp_lines = [_bleu_line(hyp) for hyp, _ in items]
    bleu_metric, _ = _sacrebleu_metrics(_reference_streams(items, _bleu_line))
    result = bleu_metric.corpus_score(hyp_lines, None)      # None: the references cached above
    return Score(result.score, str(bleu_metric.get_signature()))


def _chrf(items: list[Item]) -> Score:
    hyp_lines = [_chrf_line(hyp) for hyp, _ in items]
    _, chrf_metric = _sacrebleu_metrics(_reference_streams(items, _chrf_line))
    result = chrf_metric.corpus_score(hyp_lines, None)
    return Score(result.score, str(chrf_metric.get_signature()))


def _sacrebleu_metrics(streams: list[list[str | None]]):
    """Fresh sacrebleu BLEU and CHRF objects with this module's settings and ``streams`` cached.

    Fresh each call because sacrebleu records the reference count on the object (it goes into the
    signature): a shared object would carry one call's count into the next and race across threads.
    """
    # Imported here: sacrebleu pulls in lxml and friends (~0.15 s), and `import tinygrad_attn`
    # should stay light for code that never scores BLEU.
    from sacrebleu.metrics import BLEU, CHRF

    return BLEU(**BLEU_SETTINGS, references=streams), CHRF(**CHRF_SETTINGS, references=streams)


def _reference_streams(items: list[Item], to_line) -> list[list[str | None]]:
    """sacrebleu's layout: stream k holds every item's k-th reference, None where an item has fewer.

    sacrebleu 2.x drops None entries per segment when it caches references
    (``Metric._cache_references``), which is its documented way to give items different numbers
    of references.  Every item has at least one reference, so stream 0 is all strings, as
    sacrebleu's argument check (it looks at ``refs[0][0]``) requires.
    """
    most = max(len(references) for _, references in items)
    streams: list[list[str | None]] = [[] for _ in range(most)]
    for _, references in items:
        for k in range(most):
            streams[k].append(to_line(references[k]) if k < len(references) else None)
    return streams


def _bleu_line(tokens: Tokens) -> str:
    return " ".join(_WHITESPACE.sub("\u2581", token) for token in tokens)


def _chrf_line(tokens: Tokens) -> str:
    return " ".join(tokens)


# ---- input validation ---------------------------------------------------------------------------


def _items(fn: str, hyps: Sequence, refs: Sequence) -> list[Item]:
    """Check ``hyps``/``refs`` and return them as (hypothesis, references) tuples.

    Errors name the calling function and the index of the bad item.
    """
    hyps = _as_list(fn, "hyps", hyps)
    refs = _as_list(fn, "refs", refs)
    if not hyps:
        raise ValueError(f"{fn}: hyps is empty; a corpus score needs at least one item")
    if len(hyps) != len(refs):
        raise ValueError(f"{fn}: {len(hyps)} hypotheses but {len(refs)} reference items; "
                         "refs needs one item (one reference or a list of them) per hypothesis")
    return [(_tokens(fn, f"hypothesis {i}", hyp), _references(fn, i, item))
            for i, (hyp, item) in enumerate(zip(hyps, refs, strict=True))]


def _as_list(fn: str, name: str, corpus: Iterable) -> list:
    if isinstance(corpus, str):
        raise TypeError(f"{fn}: {name} is a str; pass a sequence with one token list per item")
    try:
        return list(corpus)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be a sequence of token lists, "
                        f"got {type(corpus).__name__}") from None


def _tokens(fn: str, what: str, tokens) -> Tokens:
    """One token sequence (a hypothesis or a single reference) as a tuple of str."""
    if isinstance(tokens, str):
        # A str would be iterated as characters without a word said: make the caller choose.
        raise TypeError(f"{fn}: {what} is a str ({tokens[:30]!r}); pass list(text) for characters "
                        "or text.split() for words")
    if not isinstance(tokens, list | tuple):
        raise TypeError(f"{fn}: {what} must be a list or tuple of token strings, "
                        f"got {type(tokens).__name__}")
    for position, token in enumerate(tokens):
        if not isinstance(token, str):
            raise TypeError(f"{fn}: {what} has a {type(token).__name__} at position {position}; "
                            "tokens must be str")
    return tuple(tokens)


def _references(fn: str, index: int, item) -> tuple[Tokens, ...]:
    """One refs item as a tuple of references: a list of str is one, a list of lists is several."""
    what = f"reference item {index}"
    if isinstance(item, str):
        _tokens(fn, what, item)             # raises, suggesting list(text) / text.split()
    if not isinstance(item, list | tuple):
        raise TypeError(f"{fn}: {what} must be a list of token strings (one reference) or a list "
                        f"of token lists (several), got {type(item).__name__}")
    if all(isinstance(element, str) for element in item):     # also the empty item: one empty ref
        return (tuple(item),)
    if all(isinstance(element, list | tuple) for element in item):
        return tuple(_tokens(fn, f"reference {k} of item {index}", ref) for k, ref in enumerate(item))
    if any(isinstance(element, str) for element in item) and any(
            isinstance(element, list | tuple) for element in item):
        raise ValueError(f"{fn}: {what} mixes token strings and token lists; give one reference "
                         "as a list of str or several as a list of lists of str")
    bad = next(element for element in item if not isinstance(element, str | list | tuple))
    raise TypeError(f"{fn}: {what} holds {bad!r} of type {type(bad).__name__}; expected token "
                    "strings (one reference) or token lists (several)")
