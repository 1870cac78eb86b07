"""Elementwise maps, their backwards (vector-Jacobian products), comparisons and selection."""

from __future__ import annotations

import numpy as np


def add(a, b):
    return np.add(a, b)


def add_(a, b):
    """a += b in place, returning a: backward sums a weight's gradients from every step
    into one buffer instead of allocating a new array per step.  (A sum of 0-d arrays is a
    numpy scalar, which cannot be written into: then a new one.)"""
    if isinstance(a, np.ndarray):
        return np.add(a, b, out=a)
    return np.add(a, b)


def sub(a, b):
    return np.subtract(a, b)


def mul(a, b):
    return np.multiply(a, b)


def div(a, b):
    return np.divide(a, b)


def neg(x):
    return np.negative(x)


def pow(x, p):  # noqa: A001 - the kernel is named after the math
    return np.power(x, p)


def exp(x):
    return np.exp(x)


def log(x):
    return np.log(x)


def tanh(x):
    return np.tanh(x)


def sigmoid(x):
    # exp of a non-positive number only: never overflows for large |x|.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def relu(x):
    return np.maximum(x, 0).astype(x.dtype, copy=False)


def leaky_relu(x, negative_slope):
    return np.where(x > 0, x, x * x.dtype.type(negative_slope))



def div_back_b(a, b, dy):
    """d(a/b)/db * dy = -a / b^2 * dy."""
    return -dy * a / (b * b)


def pow_back_base(x, p, dy):
    return dy * p * np.power(x, p - 1)


def pow_back_exponent(y, x, dy):
    # d(x^p)/dp = x^p log x; only asked for when the exponent requires grad.
    return dy * y * np.log(x)


def tanh_back(y, dy):
    """Uses the output y: d tanh = 1 - y^2."""
    return (1 - y * y) * dy


def sigmoid_back(y, dy):
    """Uses the output y: d sigmoid = y (1 - y)."""
    return y * (1 - y) * dy


def relu_back(x, dy):
    return np.where(x > 0, dy, 0).astype(dy.dtype, copy=False)


def leaky_relu_back(x, dy, negative_slope):
    return np.where(x > 0, dy, dy * dy.dtype.type(negative_slope))



def eq(a, b):
    return np.equal(a, b)


def ne(a, b):
    return np.not_equal(a, b)


def lt(a, b):
    return np.less(a, b)


def le(a, b):
    return np.less_equal(a, b)


def gt(a, b):
    return np.greater(a, b)


def ge(a, b):
    return np.greater_equal(a, b)


def where(cond, a, b):
    return np.where(cond, a, b)


KERNELS = {
    "add": add, "add_": add_, "sub": sub, "mul": mul, "div": div, "neg": neg, "pow": pow, "exp": exp,
    "log": log, "tanh": tanh, "sigmoid": sigmoid, "relu": relu, "leaky_relu": leaky_relu,
    "div_back_b": div_back_b, "pow_back_base": pow_back_base, "pow_back_exponent": pow_back_exponent,
    "tanh_back": tanh_back, "sigmoid_back": sigmoid_back, "relu_back": relu_back,
    "leaky_relu_back": leaky_relu_back, "eq": eq, "ne": ne, "lt": lt, "le": le, "gt": gt, "ge": ge,
    "where": where,
}
