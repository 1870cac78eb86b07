"""The elementwise formulas, written once: plain-Python functions of floats.

Each compiled backend builds its map kernels from these (``cpu.py`` with ``numba.njit``,
``cuda.py`` with ``cuda.jit(device=True)``), so a formula and its derivative live in one
place.  ``numpy_backend.py`` states the same formulas vectorised; it is the reference the
compiled kernels are tested against.

A ``*_back`` function is the derivative of its partner times the incoming gradient ``dy``;
it takes the forward output ``y`` where that is cheaper than the input (tanh, sigmoid).
Only ``math`` functions and arithmetic appear here: both compilers accept them.
"""

from __future__ import annotations

import math

# ---------------------------------------------------------------- forward


def neg(x):
    return -x


def exp(x):
    return math.exp(x)


def log(x):
    return math.log(x)


def tanh(x):
    return math.tanh(x)


def sigmoid(x):
    # exp of a non-positive number only: no overflow for large |x|.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def relu(x):
    return x if x > 0 else 0.0 * x


def leaky_relu(x, negative_slope):
    return x if x > 0 else x * negative_slope


# ---------------------------------------------------------------- backward


def tanh_back(y, dy):
    """d tanh = 1 - y^2, from the output y."""
    return (1.0 - y * y) * dy


def sigmoid_back(y, dy):
    """d sigmoid = y (1 - y), from the output y."""
    return y * (1.0 - y) * dy


def relu_back(x, dy):
    return dy if x > 0 else 0.0 * dy


def leaky_relu_back(x, dy, negative_slope):
    return dy if x > 0 else dy * negative_slope


def div_back_b(a, b, dy):
    """d(a/b)/db = -a / b^2."""
    return -dy * a / (b * b)


# The unary maps and the two-input maps (``*_back`` and div_back_b), by kernel name.
MAPS = {"neg": neg, "exp": exp, "log": log, "tanh": tanh, "sigmoid": sigmoid, "relu": relu}
ZIPS = {"tanh_back": tanh_back, "sigmoid_back": sigmoid_back, "relu_back": relu_back}
