"""Text <-> tokens, the one tokenizer behind ``read_pairs`` and ``Task.tokenize``.

A file's pairs and a sentence typed in later must split into the same tokens, or a model
trained on the file sees unknown symbols at test time; so both go through ``tokenize`` here.

Levels:
    char    every character is a token ("a cat" -> a, " ", c, a, t)
    word    words without punctuation ("a cat!" -> a, cat)
    space   whatever lies between whitespace, punctuation kept ("AH0 L OW1" -> AH0, L, OW1)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["tokenize", "detokenize", "check_level"]

LEVELS = ("char", "word", "space")

# Words, digits allowed; punctuation and underscores are dropped.
_WORD = re.compile(r"[^\W_]+")


def check_level(level, name: str, where: str) -> str:
    """``level`` if it is one of ``LEVELS``, else a ValueError naming ``where`` and ``name``."""
    if level not in LEVELS:
        raise ValueError(f"{where}: {name} must be one of {LEVELS}, got {level!r}")
    return level


def tokenize(text: str, level: str, lowercase: bool = True, where: str = "tokenize") -> list[str]:
    """Text -> tokens at ``level``.

    With ``lowercase`` the text is lower-cased and every run of whitespace becomes one space
    (how the generated tasks are written); without it only the two ends are stripped, so at
    level "char" the inner characters are kept exactly as written (how files are read).

    Args:
        text: one sentence.
        level: "char", "word" or "space".
        lowercase: lower-case and collapse whitespace first.
        where: the caller's name, for error messages.

    Returns:
        a list of token strings (empty for blank text).

    Example:
        >>> tokenize("  Hello,  World ", "char", lowercase=False)
        ['H', 'e', 'l', 'l', 'o', ',', ' ', ' ', 'W', 'o', 'r', 'l', 'd']
        >>> tokenize("Hello,  World", "word"), tokenize("Hello,  World", "space", lowercase=False)
        (['hello', 'world'], ['Hello,', 'World'])
    """
    if not isinstance(text, str):
        raise TypeError(f"{where}: expected a str, got {text!r:.80} ({type(text).__name__})")
    check_level(level, "level", where)
    if lowercase:
        text = " ".join(text.lower().split())
    else:
        text = text.strip()
    if level == "char":
        return list(text)
    if level == "word":
        return _WORD.findall(text)
    return text.split()


def detokenize(tokens: Sequence[str], level: str, where: str = "detokenize") -> str:
    """Tokens -> text: characters joined as they are, words and "space" tokens by one space.

    Example:
        >>> detokenize(["HH", "AH", "L", "OW"], "space")
        'HH AH L OW'
    """
    # A str is iterable too, but joining its characters would hide a caller's mistake.
    if isinstance(tokens, str) or not isinstance(tokens, Iterable):
        raise TypeError(f"{where}: expected a list of token strings, got {tokens!r:.80}")
    tokens = list(tokens)
    if not all(isinstance(token, str) for token in tokens):
        raise TypeError(f"{where}: expected a list of token strings, got {tokens!r:.80}")
    check_level(level, "level", where)
    return ("" if level == "char" else " ").join(tokens)
