"""Checks of the plain arguments that public functions take (counts, rates, penalties), in one
wording for the whole package:

    check_int(8, "beam", "beam_search", low=1)           an int, not a bool, >= low (optional: or None)
    check_number(0.9, "betas[0]", "Adam", low=0.0, high=1.0, high_open=True)
    check_flag(True, "bidirectional", "Seq2Seq")         True or False (numpy's too)
    check_writable_file("run.ckpt", "checkpoint", "train")   a path ta.save can write

A wrong type raises TypeError, a value out of range (or not finite) ValueError, each naming
the function and the argument.
"""

from __future__ import annotations

import math
import os
import stat
from numbers import Integral, Real
from pathlib import Path

import numpy as np

__all__ = ["check_int", "check_number", "check_flag", "check_writable_file"]


def check_int(value, name: str, where: str, low: int, optional: bool = False) -> int | None:
    """``value`` as an int >= ``low`` (or None, when ``optional``)."""
    if optional and value is None:
        return None
    kind = "None or an int" if optional else "an int"
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{where}: {name} must be {kind}, got {value!r} ({type(value).__name__})")
    if value < low:
        raise ValueError(f"{where}: {name} must be {kind} >= {low}, got {value}" if optional
                         else f"{where}: {name} must be >= {low}, got {value}")
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


def check_flag(value, name: str, where: str) -> bool:
    """``value`` as a bool (True/False or numpy's), else a TypeError naming ``where`` and ``name``."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{where}: {name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_writable_file(value, name: str, where: str) -> Path:
    """``value`` as a Path where a file can be written the way ``ta.save`` writes one: not a
    directory; for a regular file (or nothing yet), the folder of the file a link leads to
    exists and is writable, and a file already there is writable.  A FIFO or a device is
    written in place, so only its type is checked."""
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{where}: {name} must be a path (str or os.PathLike), got {type(value).__name__}")
    path = Path(value)
    if not os.fspath(value) or path.is_dir():
        raise ValueError(f"{where}: {name} {os.fspath(value)!r} is a directory; give a file path")
    try:
        status = os.stat(path)
    except OSError:
        status = None                      # not there yet (or a dangling link): it will be created
    if status is not None and not stat.S_ISREG(status.st_mode):
        return path
    folder = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{where}: {name} {str(path)!r}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{where}: {name} {str(path)!r}: the folder {folder!r} is not writable")
    if status is not None and (not os.access(path, os.W_OK) or not status.st_mode & 0o222):
        raise ValueError(f"{where}: {name} {str(path)!r} is read-only")
    return path
