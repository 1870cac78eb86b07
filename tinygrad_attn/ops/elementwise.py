"""Elementwise ops.  Binary ops broadcast like numpy; backward sums each gradient back down
to its input's shape (``sum_to``), so a broadcast input gets the total of its copies."""

from __future__ import annotations

import numpy as np

from ..autograd import Example, Op, register
from ._common import (
    broadcast_shape,
    check_bool,
    check_float,
    check_same_dtype,
    distinct,
    elementwise,
    number,
    uniform,
)


def _check_binary(op, a, b) -> None:
    check_same_dtype(op, a, b)
    broadcast_shape(op, a, b)


def _binary_examples(seed: int, low: float = -2.0, high: float = 2.0) -> list[Example]:
    """Same shapes, a broadcast row, and an outer-product-style broadcast."""
    return [
        Example((uniform(seed, 2, 3, low=low, high=high), uniform(seed + 1, 2, 3, low=low, high=high))),
        Example((uniform(seed + 2, 2, 3, low=low, high=high), uniform(seed + 3, 3, low=low, high=high))),
        Example((uniform(seed + 4, 2, 1, low=low, high=high), uniform(seed + 5, 1, 3, low=low, high=high))),
    ]


@register
class Add(Op):
    """y = a + b"""

    kernels = ("add", "sum_to")

    @staticmethod
    def symbolic(sp, a, b):
        return a + b

    def forward(self, a, b):
        _check_binary(self, a, b)
        self.saved = (a.shape, b.shape)
        return self.backend.add(a, b)

    def backward(self, dy):
        a_shape, b_shape = self.saved
        return self.backend.sum_to(dy, a_shape), self.backend.sum_to(dy, b_shape)

    @classmethod
    def examples(cls):
        return _binary_examples(10)


@register
class Sub(Op):
    """y = a - b"""

    kernels = ("neg", "sub", "sum_to")

    @staticmethod
    def symbolic(sp, a, b):
        return a - b

    def forward(self, a, b):
        _check_binary(self, a, b)
        self.saved = (a.shape, b.shape)
        return self.backend.sub(a, b)

    def backward(self, dy):
        a_shape, b_shape = self.saved
        return self.backend.sum_to(dy, a_shape), self.backend.sum_to(self.backend.neg(dy), b_shape)

    @classmethod
    def examples(cls):
        return _binary_examples(20)


@register
class Mul(Op):
    """y = a * b"""

    kernels = ("mul", "sum_to")

    @staticmethod
    def symbolic(sp, a, b):
        return a * b

    def forward(self, a, b):
        _check_binary(self, a, b)
        self.saved = (a, b)
        return self.backend.mul(a, b)

    def backward(self, dy):
        a, b = self.saved
        k = self.backend
        da = k.sum_to(k.mul(dy, b), a.shape) if self.needs_grad[0] else None
        db = k.sum_to(k.mul(dy, a), b.shape) if self.needs_grad[1] else None
        return da, db

    @classmethod
    def examples(cls):
        return _binary_examples(30)


@register
class Div(Op):
    """y = a / b"""

    kernels = ("div", "div_back_b", "sum_to")

    @staticmethod
    def symbolic(sp, a, b):
        return a / b

    def forward(self, a, b):
        _check_binary(self, a, b)
        self.saved = (a, b)
        return self.backend.div(a, b)

    def backward(self, dy):
        a, b = self.saved
        k = self.backend
        da = k.sum_to(k.div(dy, b), a.shape) if self.needs_grad[0] else None
        db = k.sum_to(k.div_back_b(a, b, dy), b.shape) if self.needs_grad[1] else None
        return da, db

    @classmethod
    def examples(cls):
        # Denominators kept away from zero.
        a = uniform(40, 2, 3)
        return [Example((a, uniform(41, 2, 3, low=0.5, high=2.0))),
                Example((a, -uniform(42, 3, low=0.5, high=2.0)))]


@register
class Pow(Op):
    """y = x ** p  (p a tensor, or a constant the Tensor methods wrap)."""

    kernels = ("pow", "pow_back_base", "pow_back_exponent", "sum_to")

    @staticmethod
    def symbolic(sp, x, p):
        return x**p

    def forward(self, x, p):
        _check_binary(self, x, p)
        y = self.backend.pow(x, p)
        self.saved = (x, p, y)
        return y

    def backward(self, dy):
        x, p, y = self.saved
        k = self.backend
        dx = k.sum_to(k.pow_back_base(x, p, dy), x.shape) if self.needs_grad[0] else None
        dp = k.sum_to(k.pow_back_exponent(y, x, dy), p.shape) if self.needs_grad[1] else None
        return dx, dp

    @classmethod
    def examples(cls):
        # Positive bases: x^p log x is only real there.
        x = uniform(50, 2, 3, low=0.5, high=2.0)
        return [Example((x, uniform(51, 2, 3, low=-1.5, high=2.5))),
                Example((x, uniform(52, low=1.5, high=3.0).reshape(())))]


def _unary_examples(seed: int, low: float = -2.0, high: float = 2.0) -> list[Example]:
    return [Example((uniform(seed, 2, 3, low=low, high=high),)),
            Example((uniform(seed + 1, 4, low=low, high=high),))]


@register
class Neg(Op):
    """y = -x"""

    kernels = ("neg",)

    @staticmethod
    def symbolic(sp, x):
        return -x

    def forward(self, x):
        return self.backend.neg(x)

    def backward(self, dy):
        return (self.backend.neg(dy),)

    @classmethod
    def examples(cls):
        return _unary_examples(60)


@register
class Exp(Op):
    """y = exp(x)"""

    kernels = ("exp", "mul")

    @staticmethod
    def symbolic(sp, x):
        return elementwise(sp.exp, x)

    def forward(self, x):
        check_float(self, x)
        y = self.backend.exp(x)
        self.saved = (y,)
        return y

    def backward(self, dy):
        (y,) = self.saved
        # d exp = exp: reuse the output rather than recomputing it.
        return (self.backend.mul(y, dy),)

    @classmethod
    def examples(cls):
        return _unary_examples(70)


@register
class Log(Op):
    """y = log(x)  (natural logarithm)"""

    kernels = ("div", "log")

    @staticmethod
    def symbolic(sp, x):
        return elementwise(sp.log, x)

    def forward(self, x):
        check_float(self, x)
        self.saved = (x,)
        return self.backend.log(x)

    def backward(self, dy):
        (x,) = self.saved
        return (self.backend.div(dy, x),)

    @classmethod
    def examples(cls):
        return _unary_examples(80, low=0.2, high=3.0)


@register
class Tanh(Op):
    """y = tanh(x)"""

    kernels = ("tanh", "tanh_back")

    @staticmethod
    def symbolic(sp, x):
        return elementwise(sp.tanh, x)

    def forward(self, x):
        check_float(self, x)
        y = self.backend.tanh(x)
        self.saved = (y,)
        return y

    def backward(self, dy):
        (y,) = self.saved
        # tanh_back takes the output y: d tanh = 1 - y^2.
        return (self.backend.tanh_back(y, dy),)

    @classmethod
    def examples(cls):
        return _unary_examples(90)


@register
class Sigmoid(Op):
    """y = 1 / (1 + exp(-x))"""

    kernels = ("sigmoid", "sigmoid_back")

    @staticmethod
    def symbolic(sp, x):
        return elementwise(lambda e: 1 / (1 + sp.exp(-e)), x)

    def forward(self, x):
        check_float(self, x)
        y = self.backend.sigmoid(x)
        self.saved = (y,)
        return y

    def backward(self, dy):
        (y,) = self.saved
        return (self.backend.sigmoid_back(y, dy),)

    @classmethod
    def examples(cls):
        return _unary_examples(100, low=-4.0, high=4.0)


@register
class Relu(Op):
    """y = max(x, 0)  (gradient 0 at x = 0, as in PyTorch)"""

    kernels = ("relu", "relu_back")

    @staticmethod
    def symbolic(sp, x):
        return elementwise(lambda e: sp.Piecewise((e, e > 0), (0, True)), x)

    def forward(self, x):
        check_float(self, x)
        self.saved = (x,)
        return self.backend.relu(x)

    def backward(self, dy):
        (x,) = self.saved
        return (self.backend.relu_back(x, dy),)

    @classmethod
    def examples(cls):
        # Entries are at least 0.1 from the kink at 0, where the derivative jumps.
        return [Example((distinct(110, 2, 3),)), Example((distinct(111, 5),))]


@register
class LeakyRelu(Op):
    """y = x if x > 0 else negative_slope * x"""

    kernels = ("leaky_relu", "leaky_relu_back")

    @staticmethod
    def symbolic(sp, x, negative_slope):
        slope = number(sp, negative_slope)
        return elementwise(lambda e: sp.Piecewise((e, e > 0), (slope * e, True)), x)

    def forward(self, x):
        check_float(self, x)
        self.saved = (x,)
        return self.backend.leaky_relu(x, self.negative_slope)

    def backward(self, dy):
        (x,) = self.saved
        return (self.backend.leaky_relu_back(x, dy, self.negative_slope),)

    @classmethod
    def examples(cls):
        return [Example((distinct(120, 2, 3),), {"negative_slope": 0.2}),
                Example((distinct(121, 4),), {"negative_slope": 0.01})]


@register
class Where(Op):
    """y = a where cond else b  (cond boolean, no gradient)"""

    kernels = ("sum_to", "where", "zeros")

    @staticmethod
    def symbolic(sp, cond, a, b):
        return np.where(cond, a, b)

    def forward(self, cond, a, b):
        check_bool(self, cond, "cond")
        _check_binary(self, a, b)
        broadcast_shape(self, cond, a, b)
        self.saved = (cond, a.shape, b.shape)
        return self.backend.where(cond, a, b)

    def backward(self, dy):
        cond, a_shape, b_shape = self.saved
        k = self.backend
        zero = k.zeros((), dy.dtype)
        return (None,
                k.sum_to(k.where(cond, dy, zero), a_shape),
                k.sum_to(k.where(cond, zero, dy), b_shape))

    @classmethod
    def examples(cls):
        cond = np.array([[True, False, True], [False, False, True]])
        return [Example((cond, uniform(130, 2, 3), uniform(131, 2, 3))),
                Example((cond[0], uniform(132, 2, 3), uniform(133, 1)))]


@register
class MaskedFill(Op):
    """y = value where mask else x  (mask boolean, broadcast to x's shape)"""

    kernels = ("full", "where", "zeros")

    @staticmethod
    def symbolic(sp, x, mask, value):
        return np.where(mask, number(sp, value), x)

    def forward(self, x, mask):
        check_bool(self, mask, "mask")
        if broadcast_shape(self, x, mask) != tuple(x.shape):
            self.fail(f"mask of shape {tuple(mask.shape)} would enlarge the input of shape "
                      f"{tuple(x.shape)}; it must broadcast to the input's shape")
        self.saved = (mask,)
        k = self.backend
        return k.where(mask, k.full((), self.value, x.dtype), x)

    def backward(self, dy):
        (mask,) = self.saved
        k = self.backend
        return (k.where(mask, k.zeros((), dy.dtype), dy), None)

    @classmethod
    def examples(cls):
        mask = np.array([[True, False, False], [False, True, False]])
        return [Example((uniform(140, 2, 3), mask), {"value": -3.0}),
                Example((uniform(141, 2, 3), mask[:1]), {"value": 0.5})]


@register
class Cast(Op):
    """y = x converted to the float ``dtype`` (the gradient converts back)"""

    kernels = ("astype",)

    @staticmethod
    def symbolic(sp, x, dtype):
        return x

    def forward(self, x):
        check_float(self, x)
        if np.dtype(self.dtype).kind != "f":
            self.fail(f"only float-to-float casts are differentiable, got {x.dtype} -> {self.dtype}")
        self.saved = (x.dtype,)
        return self.backend.astype(x, np.dtype(self.dtype))

    def backward(self, dy):
        (dtype,) = self.saved
        return (self.backend.astype(dy, dtype),)

    @classmethod
    def examples(cls):
        return [Example((uniform(150, 2, 3),), {"dtype": "float32"})]
