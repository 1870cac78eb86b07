"""Checks of the plain arguments that public functions take (counts, rates, penalties), in one
wording for the whole package:

    check_int(8, "beam", "beam_search", low=1)           an int, not a bool, >= low
    check_number(0.9, "betas[0]", "Adam", low=0.0, high=1.0, high_open=True)

A wrong type raises TypeError, a value out of range (or not finite) ValueError, each naming
the function and the argument.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

__all__ = ["check_int", "check_number"]


def check_int(value, name: str, where: str, low: int) -> int:
    """``value`` as an int >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{where}: {name} must be an int, got {value!r} ({type(value).__name__})")
    if value < low:
        raise ValueError(f"{where}: {name} must be >= {low}, got {value}")
    return int(value)


def check_number(value, name: str, where: str, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a finite float between ``low`` and ``high`` (either may be absent; each
    bound included unless ``*_open``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{where}: {name} must be a number, got {type(value).__name__}")
    number = float(value)
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and (number >= high if high_open else number > high)
    if not math.isfinite(number) or too_low or too_high:
        if low is not None and high is not None:
            span = f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        elif low is not None:
            span = f" {'>' if low_open else '>='} {low}"
        elif high is not None:
            span = f" {'<' if high_open else '<='} {high}"
        else:
            span = ""
        raise ValueError(f"{where}: {name} must be a finite number{span}, got {value!r}")
    return number
