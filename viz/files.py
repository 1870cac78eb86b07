"""Writing pictures: one atomic write for graphs and heatmaps."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, write: Callable, what: str) -> None:
    """Call ``write(binary file)`` on a temporary file beside ``path``, then rename it over
    ``path``: a reader (a browser reloading the SVG) never sees half a picture, and a failed
    draw leaves the old file, if any, untouched.  ``what`` names the caller in errors.

    The temporary file is opened with mode 0o666, so the picture gets the permissions (the
    umask) of any file the user writes, not tempfile's private 0o600.
    """
    # Checked first: os.open's own error would name the temporary file, not the user's path.
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{what}: cannot write {str(path)!r}: the folder "
                                f"{str(path.parent)!r} does not exist")
    while True:
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
