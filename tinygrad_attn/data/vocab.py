"""Vocab: a two-way map between tokens (strings) and integer ids.

Ids 0-3 are reserved, in every vocabulary, for ``<pad>``, ``<start>``, ``<end>`` and ``<unk>``,
so a model, a loss (``ignore_index=PAD``) and a decoder (stop at ``END``) can rely on them
without being handed the vocabulary.

The reserved ids are control symbols, never text: no token encodes to them (but an unknown
one to ``UNK``). A token spelled like a reserved name, "<end>" in a file of pairs, is an
ordinary token: otherwise a target holding it would teach the model to stop there and a source
holding "<pad>" would be masked away.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from numbers import Integral

import numpy as np

from ..arguments import check_int

PAD, START, END, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<start>", "<end>", "<unk>")

# How many tokens a repr shows before it elides the rest.
_REPR_TOKENS = 12


def _check_token(token, where: str) -> str:
    if not isinstance(token, str):
        raise TypeError(f"{where}: tokens must be str, got {token!r} ({type(token).__name__})")
    return token


def _check_sequence(tokens, where: str) -> None:
    # A bare string is iterable, so without this check "i love my cat" would be read as 13
    # one-character tokens and silently encode to <unk>s under a word-level vocabulary.
    if isinstance(tokens, str):
        raise TypeError(f"{where}: expected a sequence of token strings, got the str {tokens!r}; "
                        f"split it into tokens first (e.g. task.tokenize(text))")


class Vocab:
    """Tokens <-> ids, with ``<pad>``=0, ``<start>``=1, ``<end>``=2, ``<unk>``=3 reserved.

    The given tokens follow the four reserved ids, in the order given. Every given token is
    ordinary, even one spelled "<end>": it gets an id of its own, encodes to it and decodes
    back to the text "<end>", while the id ``END`` is the control symbol that ends a sequence.
    The reserved ids are reached only by ``encode``'s ``start``/``end`` and, for a token the
    vocabulary lacks, ``UNK``. A vocabulary never changes after it is made.

    Args:
        tokens: the ordinary tokens (strings), without duplicates. A list that starts with the
            four reserved names in order (``vocab.tokens``) is refused: pass ``vocab.tokens[4:]``,
            or use ``from_dict``.

    Example:
        >>> v = Vocab(["cat", "my"])
        >>> v.encode(["my", "cat", "dog"])
        [5, 4, 3]
        >>> v.decode([1, 5, 4, 2, 0])
        ['my', 'cat']
    """

    __slots__ = ("_tokens", "_ids")

    def __init__(self, tokens: Iterable[str] = ()):
        _check_sequence(tokens, "Vocab")
        tokens = list(tokens)
        if tuple(tokens[:len(SPECIALS)]) == SPECIALS:
            # Vocab(v.tokens) once gave v back (reserved names were skipped); now the four would
            # become ordinary tokens and shift every id, so the old idiom fails loudly instead.
            raise ValueError(f"Vocab: the tokens start with the reserved names {list(SPECIALS)}; "
                             f"pass only the ordinary tokens (vocab.tokens[{len(SPECIALS)}:]) or use "
                             f"Vocab.from_dict")
        self._tokens = list(SPECIALS)
        # Only ordinary tokens map to ids: the reserved ids are unreachable from text.
        self._ids = {}
        for token in tokens:
            _check_token(token, "Vocab")
            if token in self._ids:
                raise ValueError(f"Vocab: duplicate token {token!r}")
            self._ids[token] = len(self._tokens)
            self._tokens.append(token)

    @classmethod
    def build(cls, sequences: Iterable[Iterable[str]], min_freq: int = 1) -> Vocab:
        """The vocabulary of every token seen at least ``min_freq`` times, sorted.

        Sorting (rather than first-seen order) makes the ids depend only on the set of
        tokens, not on how the sequences were shuffled. Tokens spelled like a reserved name
        ("<end>") are counted and kept like any other.

        Args:
            sequences: token lists, e.g. the source sides of a task's training pairs.
            min_freq: rarer tokens are left out (they will encode to ``UNK``).

        Returns:
            a Vocab.

        Example:
            >>> Vocab.build([["b", "a"], ["a"]], min_freq=2).tokens
            ['<pad>', '<start>', '<end>', '<unk>', 'a']
        """
        check_int(min_freq, "min_freq", "Vocab.build", 1)
        tokens = []
        for sequence in sequences:
            _check_sequence(sequence, "Vocab.build")
            tokens.extend(sequence)
        try:
            # join checks that every token is a str in C, many times faster than a Python loop
            # over the million tokens of CMUdict; the loop only runs to name the bad one.
            "".join(tokens)
        except TypeError:
            for token in tokens:
                _check_token(token, "Vocab.build")
        counts = Counter(tokens)
        # Sorted, the reserved names can never lead in their id order ("<end>" < "<pad>"), so the
        # constructor's guard against a vocab.tokens list never fires on data.
        return cls(sorted(token for token, count in counts.items() if count >= min_freq))

    @property
    def tokens(self) -> list[str]:
        """Every token, in id order (a copy): the four reserved names first, then the ordinary
        tokens (``tokens[4:]``), which may spell a reserved name again."""
        return list(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def __iter__(self):
        return iter(self._tokens)

    def __contains__(self, token) -> bool:
        """Whether ``token`` is one of the ordinary tokens (a reserved name alone is not)."""
        return token in self._ids

    def id(self, token: str) -> int:
        """The id of the ordinary token ``token``; ``UNK`` for one the vocabulary does not know
        ("<end>" included, unless it is one of the ordinary tokens)."""
        return self._ids.get(_check_token(token, "Vocab.id"), UNK)

    def token(self, id: int) -> str:
        """The token with id ``id``; a reserved id gives its name ("<end>" for ``END``)."""
        return self._tokens[self._check_id(id, "Vocab.token")]

    def encode(self, tokens: Iterable[str], start: bool = False, end: bool = False) -> list[int]:
        """Token list -> id list; unknown tokens become ``UNK``. Only ``start`` and ``end``
        put the reserved ``START`` and ``END`` in: a token "<end>" encodes as an ordinary one.

        Args:
            tokens: a list of token strings (not one string: tokenize it first).
            start: put ``START`` in front.
            end: append ``END``.

        Returns:
            a list of ints.

        Example:
            >>> Vocab(["a", "b"]).encode(["b", "z"], end=True)
            [5, 3, 2]
        """
        _check_sequence(tokens, "Vocab.encode")
        ids = [START] if start else []
        ids.extend(self._ids.get(_check_token(token, "Vocab.encode"), UNK) for token in tokens)
        if end:
            ids.append(END)
        return ids

    def decode(self, ids: Iterable[int], strip: bool = True) -> list[str]:
        """Id list -> token list.

        Args:
            ids: ints (a list or a 1-d array), e.g. one row of a model's greedy output.
            strip: stop at the first ``END`` and drop ``PAD`` and ``START``; with False every
                id is turned into its token, the reserved ones into their names. An ordinary
                token spelled "<end>" is written back as "<end>" and does not stop the output;
                ``UNK`` gives "<unk>" either way.

        Returns:
            a list of token strings.

        Example:
            >>> Vocab(["a", "b"]).decode([1, 4, 5, 2, 4])
            ['a', 'b']
        """
        if isinstance(ids, np.ndarray) and ids.ndim != 1:
            raise ValueError(f"Vocab.decode: expected a 1-d sequence of ids, got an array of shape "
                             f"{ids.shape}; decode one row at a time")
        checked = [self._check_id(i, "Vocab.decode") for i in ids]
        if not strip:
            return [self._tokens[i] for i in checked]
        tokens = []
        for i in checked:
            if i == END:
                break
            if i not in (PAD, START):
                tokens.append(self._tokens[i])
        return tokens

    def to_dict(self) -> dict:
        """A JSON-able description, e.g. to store next to a checkpoint: ``{"tokens": [...]}``,
        every token in id order, the four reserved names first (the format of every version)."""
        return {"tokens": list(self._tokens)}

    @classmethod
    def from_dict(cls, state: Mapping) -> Vocab:
        """The Vocab that ``to_dict`` described: the tokens after the four reserved names are
        the ordinary ones, in id order, so a dict written by any version maps as it did.

        Example:
            >>> Vocab.from_dict(v.to_dict()) == v
            True
        """
        tokens = state.get("tokens") if isinstance(state, Mapping) else None
        if not isinstance(tokens, list | tuple):
            raise ValueError(f"Vocab.from_dict: expected a dict with a 'tokens' list, got {state!r:.80}")
        if tuple(tokens[:len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"Vocab.from_dict: the tokens must start with {list(SPECIALS)}, "
                             f"got {list(tokens[:len(SPECIALS)])}")
        return cls(tokens[len(SPECIALS):])

    def __eq__(self, other) -> bool:
        if not isinstance(other, Vocab):
            return NotImplemented
        return self._tokens == other._tokens

    def __hash__(self) -> int:
        return hash(tuple(self._tokens))

    def __repr__(self) -> str:
        shown = ", ".join(repr(token) for token in self._tokens[:_REPR_TOKENS])
        more = ", ..." if len(self._tokens) > _REPR_TOKENS else ""
        return f"Vocab({len(self._tokens)} tokens: {shown}{more})"

    def _check_id(self, id, where: str) -> int:
        # bool is an Integral, but True as a token id is almost certainly a mask passed by mistake.
        if isinstance(id, bool | np.bool_) or not isinstance(id, Integral):
            raise TypeError(f"{where}: ids must be ints, got {id!r} ({type(id).__name__})")
        if not 0 <= id < len(self._tokens):
            raise IndexError(f"{where}: id {int(id)} is outside [0, {len(self._tokens)}) "
                             f"for this Vocab of {len(self._tokens)} tokens")
        return int(id)
