"""PyTorch as an optional reference: ``torch`` (None when it is not installed) and the
``needs_torch`` mark, for test modules whose other tests run without it."""

import pytest

try:
    import torch
except ImportError:  # the tests that need it skip; the rest run
    torch = None

needs_torch = pytest.mark.skipif(
    torch is None, reason="PyTorch not installed: the reference tests need `pip install torch==2.13.0`")
