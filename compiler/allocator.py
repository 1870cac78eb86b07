"""Keep freed memory in the process, so large temporaries are not page-faulted in anew.

An attention step allocates and frees tens of MiB of temporaries (scores, weights and their
gradients).  glibc's malloc serves blocks that large with mmap and returns them to the
operating system on free, so the next step page-faults every page in again: measured here,
~11,000 faults and ~25 ms of a ~90 ms multi-head attention step.  Raising the mmap and trim
thresholds keeps freed blocks in the heap for reuse, as PyTorch's caching allocators do for
their own memory.  The process's footprint then stays near its peak instead of shrinking.

Set ``TINYGRAD_ATTN_KEEP_MEMORY=0`` to leave malloc as it is; any ``MALLOC_*_`` setting of
your own also takes precedence.  Nothing happens outside glibc (macOS, musl, Windows).
"""

from __future__ import annotations

import ctypes
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_SETTINGS = (
    # (mallopt parameter, value, the environment variable that would set it)
    (_M_MMAP_THRESHOLD, 32 << 20, "MALLOC_MMAP_THRESHOLD_"),   # glibc's largest allowed value
    (_M_TRIM_THRESHOLD, 1 << 30, "MALLOC_TRIM_THRESHOLD_"),
    (_M_TOP_PAD, 64 << 20, "MALLOC_TOP_PAD_"),
)


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as described above; True when it was changed."""
    if os.environ.get("TINYGRAD_ATTN_KEEP_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    changed = False
    for param, value, env in _SETTINGS:
        if env not in os.environ:
            changed = bool(mallopt(param, value)) or changed
    return changed
