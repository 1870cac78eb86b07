"""The engine's random generator: seeds ``Tensor.randn``/``rand``, dropout and initialisers.

    >>> ta.manual_seed(0)      # every later draw is reproducible
    >>> with ta.random.using(np.random.default_rng(7)):
    ...     y = model(x)       # this thread's dropout draws from its own generator

``ta.models.train`` runs with a generator of its own (seeded by its ``seed``), so a run gives
the same result whatever other threads draw meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

__all__ = ["generator", "using"]           # manual_seed is ta.manual_seed, as torch.manual_seed

_generator = np.random.default_rng(0)
_local = threading.local()          # a thread's own generator, while ``using`` one


def manual_seed(seed: int) -> np.random.Generator:
    """Reset the engine's generator to ``seed`` and return it."""
    global _generator
    _generator = np.random.default_rng(seed)
    return _generator


def generator() -> np.random.Generator:
    """The generator draws come from: this thread's (inside ``using``), else the engine's."""
    return getattr(_local, "generator", None) or _generator


@contextmanager
def using(rng: np.random.Generator) -> Iterator[np.random.Generator]:
    """Draw from ``rng`` in this thread (and only this one) inside the block."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"using: expected a numpy Generator, got {type(rng).__name__}")
    previous = getattr(_local, "generator", None)
    _local.generator = rng
    try:
        yield rng
    finally:
        _local.generator = previous
