"""Initial values for parameters, drawn from the engine's generator (``ta.manual_seed``).

Each returns a float64 numpy array; ``Parameter`` converts it to its dtype.
"""

from __future__ import annotations

import math

import numpy as np

from .. import random as _random

__all__ = ["uniform", "xavier_uniform", "linear_default", "zeros"]


def uniform(shape, bound: float) -> np.ndarray:
    """U(-bound, bound)."""
    return _random.generator().uniform(-bound, bound, size=shape)


def xavier_uniform(shape, fan_in: int | None = None, fan_out: int | None = None) -> np.ndarray:
    """Glorot & Bengio (2010): U(-a, a), a = sqrt(6 / (fan_in + fan_out)).  For an (out, in)
    weight the fans are its shape, as in ``torch.nn.init.xavier_uniform_``."""
    fan_out = shape[0] if fan_out is None else fan_out
    fan_in = shape[-1] if fan_in is None else fan_in
    return uniform(shape, math.sqrt(6.0 / (fan_in + fan_out)))


def linear_default(shape, fan_in: int) -> np.ndarray:
    """PyTorch's nn.Linear initialisation of weight and bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    (what ``kaiming_uniform_(a=sqrt(5))`` works out to)."""
    return uniform(shape, 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0)


def zeros(shape) -> np.ndarray:
    return np.zeros(shape)
