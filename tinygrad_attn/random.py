"""The engine's random generator: seeds ``Tensor.randn``/``rand``, dropout and initialisers.

    >>> ta.manual_seed(0)      # every later draw is reproducible
"""

from __future__ import annotations

import numpy as np

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> np.random.Generator:
    """Reset the engine's generator to ``seed`` and return it."""
    global _generator
    _generator = np.random.default_rng(seed)
    return _generator


def generator() -> np.random.Generator:
    """The current generator (a numpy Generator)."""
    return _generator
