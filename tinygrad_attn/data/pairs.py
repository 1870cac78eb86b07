"""Tasks from your own data: files of ``source<TAB>target`` lines -> a Task.

    pairs = ta.data.read_pairs("g2p.tsv", src_tokens="char", tgt_tokens="space")
    task = ta.data.from_pairs(pairs, name="g2p", src_tokens="char", tgt_tokens="space")
    task.train, task.valid, task.test            # split by a hash of each source

Text read from a file is kept exactly as written (no lower-casing); ``task.tokenize`` later
splits new text with the same function, so typed input matches the file's tokens.

A file is read one line at a time, never holding more than ``MAX_LINE_BYTES`` of a line, so a
file without newlines (``/dev/zero``, a binary file given by mistake) fails at its first line
instead of filling memory. A pipe, FIFO or device (``<(zcat pairs.tsv.gz)``, ``/dev/stdin``)
is read like a file up to ``MAX_STREAM_BYTES``: its length is not known in advance and may be
endless. A regular file is read whole: its size is the one its owner chose.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import stat
import warnings
from collections.abc import Sequence

from ..arguments import check_int, check_number
from .tasks import Pair, Task
from .tokens import check_level, tokenize
from .vocab import Vocab

#: The longest line ``read_pairs`` reads, in bytes of UTF-8 without its "\n" or "\r\n": 1 MiB,
#: at least 262,144 characters. Real pairs are far shorter (CMUdict's longest entry has 109
#: bytes, a long sentence a few hundred), and a side of even 10,000 tokens is past what a model
#: here trains on (attention's scores grow with S x T); so a longer line means a file that is
#: not one of pairs, and the bound is what one line may cost in memory while it is read.
MAX_LINE_BYTES = 1 << 20

#: The most ``read_pairs`` reads from a pipe, FIFO or device (not a regular file), which may
#: never end (``yes 'a<TAB>b' |``): 16 MiB, four times CMUdict's 135,000 entries, some 150,000
#: pairs of sentences. Pairs hold 10-13 bytes of memory per byte read for sentence-length lines
#: and up to 92 for one-character sides (measured), so an endless stream stops before 1.6 GB.
#: A larger data set is read from a regular file, which is not bounded: its owner chose its size.
MAX_STREAM_BYTES = 16 << 20

# How many unknown symbols a warning quotes, and how much of a bad line an error shows.
_EXAMPLES = 5
_SHOWN_CHARS = 40


class DataError(ValueError):
    """Data that cannot be used as it is: a malformed file of pairs, or no training pairs.

    The message is one line; for a file it starts with ``path:lineno: `` (or ``path: `` when
    the whole file is at fault), like a compiler's, so an editor can jump to it.
    """


# ---------------------------------------------------------------------------------------------
# reading


def _open(path, name: str):
    """The file opened for reading bytes, or a DataError saying why it cannot be."""
    if os.path.isdir(path):
        raise DataError(f"{name}: is a directory, not a file of pairs")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{name}: no such file") from None
    except OSError as error:
        raise DataError(f"{name}: cannot read it: {error.strerror or error}") from None


def _lines(file, name: str):
    """(line number, text) for each line of ``file``, decoded from UTF-8 without a leading
    byte-order mark and without its "\\n"; reads at most ``MAX_LINE_BYTES`` + 2 bytes at a time."""
    line_limit, stream_limit = MAX_LINE_BYTES, MAX_STREAM_BYTES
    bounded = not stat.S_ISREG(os.fstat(file.fileno()).st_mode)
    total = 0
    lineno = 0
    while True:
        try:
            raw = file.readline(line_limit + 2)           # room for a "\r\n" after a full line
        except OSError as error:
            raise DataError(f"{name}: cannot read it: {error.strerror or error}") from None
        total += len(raw)
        if bounded and total > stream_limit:
            raise DataError(f"{name}: more than {stream_limit} bytes from a pipe or device "
                            f"(ta.data.MAX_STREAM_BYTES); save the pairs to a file to read more")
        if not raw:
            return
        lineno += 1
        ended = raw.endswith(b"\n")
        if len(raw) - ended - raw.endswith(b"\r\n") > line_limit:
            raise DataError(f"{name}:{lineno}: the line is longer than {line_limit} bytes "
                            f"(ta.data.MAX_LINE_BYTES); expected lines of 'source<TAB>target'")
        if ended:
            raw = raw[:-1]
        if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
            # Windows editors often write one; it is not part of the first source.
            raw = raw[len(codecs.BOM_UTF8):]
            if not raw and not ended:
                return                  # the mark alone: an empty file
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(f"{name}:{lineno}: invalid UTF-8 (byte 0x{raw[error.start]:02x} at byte column "
                            f"{error.start + 1}); save the file as UTF-8") from None
        yield lineno, text


def _side(text: str, level: str, side: str, name: str, lineno: int) -> list[str]:
    tokens = tokenize(text, level, lowercase=False, where="read_pairs")
    if tokens:
        return tokens
    if not text.strip():
        raise DataError(f"{name}:{lineno}: empty {side}; expected 'source<TAB>target'")
    raise DataError(f"{name}:{lineno}: the {side} {text.strip()!r:.{_SHOWN_CHARS}} has no tokens "
                    f"at level {level!r}")


def read_pairs(path: str | os.PathLike, src_tokens: str = "char", tgt_tokens: str = "char") -> list[Pair]:
    """Read a file of ``source<TAB>target`` lines into (source tokens, target tokens) pairs.

    The file is UTF-8 (a leading byte-order mark is dropped), one pair per line, Unix or
    Windows (CRLF) line endings; lines holding only whitespace are skipped. Each side has its
    ends stripped and is otherwise kept exactly as written (no lower-casing), then split at
    its level with the same tokenizer as ``Task.tokenize``. Only "\\n" ends a line, so other
    Unicode separators (U+2028, U+0085, ...) are ordinary characters of a side.

    A line may hold up to ``MAX_LINE_BYTES`` (1 MiB) of UTF-8; a pipe, FIFO or device (not a
    regular file) may give up to ``MAX_STREAM_BYTES`` (16 MiB) in all. No more than one line is
    held in memory as bytes, so ``/dev/zero`` fails at its first line.

    Args:
        path: the file: a regular file, or a pipe such as ``/dev/stdin``.
        src_tokens: how to split sources: "char" (every character), "space" (on whitespace,
            punctuation kept) or "word" (words without punctuation).
        tgt_tokens: how to split targets, the same choices.

    Returns:
        a list of (source tokens, target tokens) pairs, in file order.

    Raises:
        DataError: a missing file, a directory, invalid UTF-8, a line without exactly one tab,
            an empty side, a line past ``MAX_LINE_BYTES``, a stream past ``MAX_STREAM_BYTES``,
            or a file with no pairs; the message starts with ``path:lineno: `` (or ``path: ``).

    Example:
        >>> Path("g2p.tsv").write_text("hello\\tHH AH L OW\\nhello\\tHH EH L OW\\n")
        >>> ta.data.read_pairs("g2p.tsv", tgt_tokens="space")[0]
        (['h', 'e', 'l', 'l', 'o'], ['HH', 'AH', 'L', 'OW'])
    """
    where = "read_pairs"
    check_level(src_tokens, "src_tokens", where)
    check_level(tgt_tokens, "tgt_tokens", where)
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{where}: path must be a str or a path, got {path!r:.80} ({type(path).__name__})")
    name = str(path)
    pairs = []
    lineno = 0                          # after the loop: the number of lines
    with _open(path, name) as file:
        for lineno, line in _lines(file, name):
            pair = _pair(line, src_tokens, tgt_tokens, name, lineno)
            if pair is not None:
                pairs.append(pair)
    if lineno == 0:
        raise DataError(f"{name}: the file is empty; expected lines of 'source<TAB>target'")
    if not pairs:
        raise DataError(f"{name}: no pairs: all {lineno} lines are blank")
    return pairs


def _pair(line: str, src_tokens: str, tgt_tokens: str, name: str, lineno: int) -> Pair | None:
    """One line's (source tokens, target tokens), or None for a blank line."""
    if line.endswith("\r"):
        line = line[:-1]
    if not line.strip():
        return None
    tabs = line.count("\t")
    if tabs != 1:
        found = "no tab" if tabs == 0 else f"{tabs} tabs"
        raise DataError(f"{name}:{lineno}: expected one tab between source and target, found {found} "
                        f"in {line!r:.{_SHOWN_CHARS}}")
    source, target = line.split("\t")
    return (_side(source, src_tokens, "source", name, lineno),
            _side(target, tgt_tokens, "target", name, lineno))


# ---------------------------------------------------------------------------------------------
# splitting


def split_point(source: Sequence[str]) -> float:
    """A number in [0, 1) that depends only on the source tokens: where the source falls in
    the split.

    It is the first 8 bytes of the BLAKE2b hash of the tokens joined by U+001F (the unit
    separator, so ["ab"] and ["a", "b"] differ), read as a big-endian integer and divided
    by 2**64: the same on every machine, in every run, whatever the order of the pairs.

    Example:
        >>> 0 <= split_point(list("hello")) < 1
        True
    """
    key = "\x1f".join(source).encode("utf-8", errors="surrogatepass")
    digest = hashlib.blake2b(key).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _is_sequence(value) -> bool:
    """A list, tuple or other Sequence, but not a str; lists and tuples are checked first
    because the Sequence check is slow over CMUdict's quarter-million token lists."""
    if type(value) is list or type(value) is tuple:
        return True
    return isinstance(value, Sequence) and not isinstance(value, str)


def _is_token_list(tokens) -> bool:
    if not _is_sequence(tokens):
        return False
    try:
        # join checks every item is a str in C: CMUdict has 2 million tokens to check.
        "".join(tokens)
    except TypeError:
        return False
    return True


def _check_pairs(pairs, what: str, where: str) -> list[Pair]:
    """``pairs`` as a new list of (list, list) tuples, each checked, so a mistake is reported
    here rather than halfway through training. Token lists that are lists already are used
    as they are, not copied (CMUdict has a quarter of a million of them)."""
    if not _is_sequence(pairs):
        raise TypeError(f"{where}: {what} must be a list of (source tokens, target tokens) pairs, "
                        f"got {pairs!r:.80}")
    checked = []
    for index, pair in enumerate(pairs):
        if not _is_sequence(pair) or len(pair) != 2:
            raise TypeError(f"{where}: {what}[{index}] must be a (source tokens, target tokens) pair, "
                            f"got {pair!r:.80}")
        for side, tokens in zip(("source", "target"), pair, strict=True):
            if not _is_token_list(tokens):
                raise TypeError(f"{where}: the {side} of {what}[{index}] must be a list of token strings, "
                                f"got {tokens!r:.80}")
        source, target = pair
        if not source:
            # An empty source leaves the encoder no states to attend to.
            raise ValueError(f"{where}: {what}[{index}] has an empty source")
        if type(pair) is not tuple or type(source) is not list or type(target) is not list:
            pair = (list(source), list(target))
        checked.append(pair)
    return checked


def _unknown_warning(splits: dict[str, list[Pair]], src_vocab: Vocab, tgt_vocab: Vocab) -> str | None:
    """One sentence on the held-out tokens the training vocabularies lack, or None."""
    parts, examples = [], {}
    for split, pairs in splits.items():
        tokens = affected = 0
        for source, target in pairs:
            missing = [("source", t) for t in source if t not in src_vocab]
            missing += [("target", t) for t in target if t not in tgt_vocab]
            if missing:
                tokens += len(missing)
                affected += 1
                for side, token in missing:
                    if len(examples) < _EXAMPLES:
                        examples.setdefault((side, token), None)
        if tokens:
            parts.append(f"{tokens} tokens in {affected} of the {len(pairs)} {split} pairs")
    if not parts:
        return None
    shown = ", ".join(f"{side} {token!r}" for side, token in examples)
    return (f"from_pairs: {' and '.join(parts)} are not in the training vocabularies and will "
            f"encode to <unk> (e.g. {shown})")


def from_pairs(pairs: Sequence[Pair], name: str = "pairs", src_tokens: str = "char",
               tgt_tokens: str = "char", valid: Sequence[Pair] | None = None,
               test: Sequence[Pair] | None = None, valid_fraction: float = 0.05,
               test_fraction: float = 0.05, max_src_len: int | None = None,
               max_tgt_len: int | None = None, min_freq: int = 1) -> Task:
    """A Task from (source tokens, target tokens) pairs, e.g. those ``read_pairs`` returns.

    The splits not given (``valid``, ``test``) are carved out of ``pairs`` by the hash of each
    source (``split_point``): below ``test_fraction`` -> test, below ``test_fraction +
    valid_fraction`` -> valid, else train. So the split is the same on every machine and for
    any order of the lines, and a source with several targets (a word with two pronunciations)
    has all of them in one split. Pairs of ``pairs`` whose source is in a split that was given
    are left out (with a warning), so no source is both learnt and tested.

    The vocabularies are built from the training pairs only, as they would be for real unseen
    data; held-out symbols they lack encode to ``<unk>`` and are reported in one warning.

    Args:
        pairs: the pairs to split (or, when both ``valid`` and ``test`` are given, to train on);
            token lists are shared with the Task, not copied.
        name: the Task's name.
        src_tokens: how the sources were tokenized ("char", "space" or "word"); the Task's
            ``level``, used by ``tokenize`` on new text.
        tgt_tokens: how the targets were tokenized; the Task's ``tgt_level``.
        valid: validation pairs; None carves them out of ``pairs``.
        test: test pairs; None carves them out of ``pairs``.
        valid_fraction: the share of ``pairs`` (by source hash) for ``valid`` when carved.
        test_fraction: the share for ``test`` when carved.
        max_src_len: leave out pairs (of every split) whose source has more tokens; None keeps all.
        max_tgt_len: the same for targets.
        min_freq: training tokens seen fewer times are left out of the vocabularies.

    Returns:
        a Task with ``lowercase=False`` (text is kept as written).

    Raises:
        DataError: no training pairs are left.

    Example:
        >>> pairs = ta.data.read_pairs("g2p.tsv", tgt_tokens="space")
        >>> task = ta.data.from_pairs(pairs, name="g2p", tgt_tokens="space")
        >>> task.tokenize("hello"), task.tokenize_target("HH AH L OW")
        (['h', 'e', 'l', 'l', 'o'], ['HH', 'AH', 'L', 'OW'])
    """
    where = "from_pairs"
    if not isinstance(name, str) or not name:
        raise TypeError(f"{where}: name must be a non-empty str, got {name!r}")
    check_level(src_tokens, "src_tokens", where)
    check_level(tgt_tokens, "tgt_tokens", where)
    pairs = _check_pairs(pairs, "pairs", where)
    given = {}
    if valid is not None:
        given["valid"] = _check_pairs(valid, "valid", where)
    if test is not None:
        given["test"] = _check_pairs(test, "test", where)
    def share(value, name: str) -> float:
        return check_number(value, name, where, low=0.0, high=1.0, high_open=True)

    valid_share = 0.0 if "valid" in given else share(valid_fraction, "valid_fraction")
    test_share = 0.0 if "test" in given else share(test_fraction, "test_fraction")
    if valid_share + test_share >= 1:
        raise ValueError(f"{where}: valid_fraction + test_fraction must be below 1, "
                         f"got {valid_share} + {test_share}")
    max_src_len = check_int(max_src_len, "max_src_len", where, 1, optional=True)
    max_tgt_len = check_int(max_tgt_len, "max_tgt_len", where, 1, optional=True)

    given_sources = {split: {tuple(source) for source, _ in split_pairs}
                     for split, split_pairs in given.items()}
    splits: dict[str, list[Pair]] = {"train": [], "valid": [], "test": []}
    overlapping = 0
    overlapped = set()
    for source, target in pairs:
        shared = [split for split, sources in given_sources.items() if tuple(source) in sources]
        if shared:
            overlapping += 1
            overlapped.update(shared)
            continue
        point = split_point(source)
        if point < test_share:
            splits["test"].append((source, target))
        elif point < test_share + valid_share:
            splits["valid"].append((source, target))
        else:
            splits["train"].append((source, target))
    splits.update(given)
    if overlapping:
        warnings.warn(f"{where}: left out {overlapping} of the {len(pairs)} pairs whose source is also in "
                      f"the given {' or '.join(sorted(overlapped, reverse=True))} pairs", stacklevel=2)

    if max_src_len is not None or max_tgt_len is not None:
        src_limit = max_src_len if max_src_len is not None else float("inf")
        tgt_limit = max_tgt_len if max_tgt_len is not None else float("inf")
        dropped = {}
        for split, split_pairs in splits.items():
            kept = [(s, t) for s, t in split_pairs if len(s) <= src_limit and len(t) <= tgt_limit]
            dropped[split] = len(split_pairs) - len(kept)
            splits[split] = kept
        if sum(dropped.values()):
            counts = ", ".join(f"{count} {split}" for split, count in dropped.items())
            warnings.warn(f"{where}: left out {sum(dropped.values())} pairs longer than "
                          f"max_src_len={max_src_len} source or max_tgt_len={max_tgt_len} target tokens "
                          f"({counts})", stacklevel=2)

    if not splits["train"]:
        raise DataError(f"{where}: no training pairs left out of {len(pairs)} pairs (after the "
                        f"valid/test split and the length limits); give more pairs or lower the fractions")
    src_vocab = Vocab.build((source for source, _ in splits["train"]), min_freq=min_freq)
    tgt_vocab = Vocab.build((target for _, target in splits["train"]), min_freq=min_freq)
    message = _unknown_warning({"valid": splits["valid"], "test": splits["test"]}, src_vocab, tgt_vocab)
    if message:
        warnings.warn(message, stacklevel=2)
    return Task(name, splits["train"], splits["test"], src_vocab, tgt_vocab, src_tokens,
                f"{src_tokens} tokens -> {tgt_tokens} tokens, {len(pairs)} pairs given",
                valid=splits["valid"], tgt_level=tgt_tokens, lowercase=False)


def references(pairs: Sequence[Pair]) -> list[tuple[list[str], list[list[str]]]]:
    """Group pairs by source: each distinct source once, with all of its targets.

    Sources come in the order they first occur, and each source's targets in the order they
    occur, without repeats. An evaluator scores an output against all references of its
    source (a word is pronounced right if it matches any of its pronunciations).

    Args:
        pairs: (source tokens, target tokens) pairs, e.g. ``task.test``.

    Returns:
        a list of (source tokens, [target tokens, ...]).

    Example:
        >>> ta.data.references([(["a"], ["x"]), (["b"], ["y"]), (["a"], ["z"]), (["a"], ["x"])])
        [(['a'], [['x'], ['z']]), (['b'], [['y']])]
    """
    groups: dict[tuple[str, ...], list[list[str]]] = {}
    for source, target in _check_pairs(pairs, "pairs", "references"):
        targets = groups.setdefault(tuple(source), [])
        if target not in targets:
            targets.append(target)
    return [(list(source), targets) for source, targets in groups.items()]
