"""The elementwise formulas, written once: plain-Python functions of floats.

Each compiled backend builds its map kernels from these (``cpu/elementwise.py`` with
``numba.vectorize``, ``cuda/elementwise.py`` with ``cuda.jit(device=True)``), so a formula
and its derivative live in one place.  ``reference/`` states the same formulas
vectorised; it is the reference the compiled kernels are tested against.

A ``*_back`` function is the derivative of its partner times the incoming gradient ``dy``;
it takes the forward output ``y`` where that is cheaper than the input (tanh, sigmoid).
Only ``math`` functions and arithmetic appear here: both compilers accept them.
"""

from __future__ import annotations

import math

# ---------------------------------------------------------------- forward


def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b


def div(a, b):
    return a / b


def pow(x, p):  # noqa: A001 - the kernel is named after the math
    return x**p


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


def pow_back_base(x, p, dy):
    """d(x^p)/dx = p x^(p-1)."""
    return dy * p * x ** (p - 1)


def pow_back_exponent(y, x, dy):
    """d(x^p)/dp = x^p log x, from the output y = x^p."""
    return dy * y * math.log(x)


def max_back(hit, dy, count):
    """The gradient of a max, shared evenly by the ``count`` entries that reach it (``hit``)."""
    return dy / count if hit else 0.0 * dy


# ---------------------------------------------------------------- comparisons and selection


def eq(a, b):
    return a == b


def ne(a, b):
    return a != b


def lt(a, b):
    return a < b


def le(a, b):
    return a <= b


def gt(a, b):
    return a > b


def ge(a, b):
    return a >= b


def where(cond, a, b):
    return a if cond else b


# By kernel name: the unary maps, the two-input maps (arithmetic, comparisons, ``*_back``)
# and the three-input ones.  leaky_relu and leaky_relu_back also take negative_slope.
MAPS = {"neg": neg, "exp": exp, "log": log, "tanh": tanh, "sigmoid": sigmoid, "relu": relu}
ZIPS = {"add": add, "sub": sub, "mul": mul, "div": div, "pow": pow,
        "eq": eq, "ne": ne, "lt": lt, "le": le, "gt": gt, "ge": ge,
        "tanh_back": tanh_back, "sigmoid_back": sigmoid_back, "relu_back": relu_back}
ZIPS3 = {"div_back_b": div_back_b, "pow_back_base": pow_back_base,
         "pow_back_exponent": pow_back_exponent, "where": where}
