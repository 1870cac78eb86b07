"""Elementwise ops.  Binary ops broadcast like numpy; backward sums each gradient back down
to its input's shape (``sum_to``), so a broadcast input gets the total of its copies.

The arithmetic and activation ops are ``Elementwise`` ops: each states its math once, as the
sympy formula of one entry (``symbolic``), and the compiler generates every device's forward
and backward kernels from it (compiler/formulas.py).
"""

from __future__ import annotations

import inspect
import re
from typing import ClassVar

import numpy as np

from ..autograd import Example, Op, register
from ..compiler import Formula, define_elementwise, formulas
from ..compiler.source import compile_source
from ._common import (
    broadcast_shape,
    check_bool,
    check_float,
    check_same_dtype,
    distinct,
    number,
    uniform,
)


class Elementwise(Op):
    """An op given by one formula: subclass, write ``symbolic(sp, x, ...)`` for a single
    entry (scalar sympy symbols in, a sympy expression out) and ``examples``, and the op has
    forward, backward (sympy's derivative) and kernels on every device.

        >>> @ta.ops.register
        ... class Softplus(ta.ops.Elementwise):
        ...     '''y = log(1 + exp(x))'''
        ...     @staticmethod
        ...     def symbolic(sp, x):
        ...         return sp.log(1 + sp.exp(x))
        >>> y = Softplus.apply(ta.Tensor([0.5, -1.0], requires_grad=True))

    Positional arguments after ``sp`` are tensors (they broadcast against each other);
    keyword-only ones are scalar attributes (``LeakyRelu``'s ``negative_slope``).  The
    kernels are named after the op in snake case: ``softplus`` and ``softplus_back``, or
    ``{name}_back_{input}`` per input of a formula of several.  ``ta.check`` calls
    ``symbolic`` on object arrays: the class applies the formula entry by entry.
    Inputs must be float tensors unless ``floats_only`` is False (the arithmetic ops).
    On first use the class writes its forward and backward from the kernels sympy derived,
    as straight-line code (``Softplus.source``), and uses them from then on.
    """

    formula: ClassVar[Formula]
    floats_only: ClassVar[bool] = True
    # The forward and backward generated from the formula's kernels on first use, as text
    # (``print(ta.ops.Tanh.source)``): the op as one would write it by hand.
    source: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "symbolic" not in cls.__dict__:
            return
        build = inspect.unwrap(cls.__dict__["symbolic"].__func__)
        parameters = list(inspect.signature(build).parameters.values())[1:]
        inputs = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)
        params = tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)
        taken = sorted(set(inputs + params) & _GENERATED_NAMES)
        if taken:
            raise ValueError(f"{cls.name}: the formula's argument names {taken} are names the generated "
                             f"forward and backward use; rename them")
        kernel = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.name).lower()
        cls.formula = Formula(kernel, inputs, build, params=params)
        cls.symbolic = staticmethod(_entrywise(build, len(inputs)))
        cls.kernels = cls.formula.kernel_names() + (("sum_to",) if len(inputs) > 1 else ())
        cls.source = None
        cls.forward, cls.backward = Elementwise.forward, Elementwise.backward
        define_elementwise(cls.formula)

    # Until the formula's kernels are known (its derivative is read from the disk cache, or
    # derived by sympy, on first use), forward and backward are these stand-ins.

    def forward(self, *xs):
        _generate(type(self))
        return self.forward(*xs)

    def backward(self, dy):
        _generate(type(self))
        return self.backward(dy)


# Names the generated forward and backward use besides the formula's arguments.
_GENERATED_NAMES = frozenset({"self", "kb", "y", "dy", "needs", "check_float", "check_same_dtype",
                              "broadcast_shape"})


def _generate(cls) -> None:
    """Write ``cls``'s forward and backward from its formula's kernels, as straight-line
    code (no loop over inputs or kernels: an elementwise op on a small tensor costs a few
    microseconds, mostly this Python), and install them on the class."""
    formula, plan = cls.formula, formulas.plan(cls.formula)
    inputs, params = formula.inputs, formula.params
    several = len(inputs) > 1
    arguments = ", ".join(inputs + params)

    # What backward reads: some inputs, the output, and (to sum broadcast gradients back
    # down) the shape of every input of a formula of several.
    read = {a for k in plan.backward if not k.identity for a in k.args[:-1]}
    saved = [x for x in inputs if x in read]
    saved += [f"{x}_shape" for x in inputs if several and x not in read]
    saved += ["y"] if formulas.OUTPUT in read else []
    saved += list(params)

    forward = [f"def forward(self, {', '.join(inputs)}):"]
    forward += [f"    {p} = self.attrs[{p!r}]" for p in params]
    if len(inputs) == 2:
        a, b = inputs
        forward += [f"    if {a}.dtype != {b}.dtype:", f"        check_same_dtype(self, {a}, {b})",
                    f"    if {a}.shape != {b}.shape:", f"        broadcast_shape(self, {a}, {b})"]
    elif several:
        forward += [f"    check_same_dtype(self, {', '.join(inputs)})",
                    f"    broadcast_shape(self, {', '.join(inputs)})"]
    if cls.floats_only:
        forward += [f"    if {x}.dtype.kind != 'f':\n        check_float(self, {x})" for x in inputs]
    forward += [f"    y = self.backend.{plan.forward.name}({arguments})"]
    forward += [f"    {x}_shape = {x}.shape" for x in inputs if f"{x}_shape" in saved]
    forward += [f"    self.saved = ({', '.join(saved)},)" if saved else "    self.saved = ()", "    return y"]

    backward = ["def backward(self, dy):"]
    backward += [f"    {', '.join(saved)}, = self.saved" if saved else ""]
    backward += ["    kb = self.backend"] + (["    needs = self.needs_grad"] if several else [])
    grads = []
    for i, (x, k) in enumerate(zip(inputs, plan.backward, strict=True)):
        operands = ["y" if a == formulas.OUTPUT else a for a in k.args[:-1]] + ["dy", *k.params]
        operands = ", ".join(operands)
        g = "dy" if k.identity else f"kb.{k.name}({operands})"
        shape = f"{x}.shape" if x in saved else f"{x}_shape"
        grads.append(f"kb.sum_to({g}, {shape}) if needs[{i}] else None" if several else g)
    backward += ["    return (" + ",\n            ".join(grads) + ",)"]

    source = "\n".join(line for line in forward + [""] + backward if line) + "\n"
    namespace = {"check_float": check_float, "check_same_dtype": check_same_dtype,
                 "broadcast_shape": broadcast_shape}
    compile_source(source, f"<{cls.name} generated from its formula>", namespace)
    cls.forward, cls.backward, cls.source = namespace["forward"], namespace["backward"], source


def _entrywise(build, count: int):
    """``build`` (a formula of one entry) applied entry by entry to object arrays that
    broadcast, attribute values as exact sympy numbers: the op's ``symbolic``."""

    def symbolic(sp, *inputs, **attrs):
        exact = {key: number(sp, value) if isinstance(value, (int, float)) else value
                 for key, value in attrs.items()}
        return np.frompyfunc(lambda *entries: build(sp, *entries, **exact), count, 1)(*inputs)

    symbolic.__doc__ = build.__doc__
    return symbolic


def _binary_examples(seed: int, low: float = -2.0, high: float = 2.0) -> list[Example]:
    """Same shapes, a broadcast row, and an outer-product-style broadcast."""
    return [
        Example((uniform(seed, 2, 3, low=low, high=high), uniform(seed + 1, 2, 3, low=low, high=high))),
        Example((uniform(seed + 2, 2, 3, low=low, high=high), uniform(seed + 3, 3, low=low, high=high))),
        Example((uniform(seed + 4, 2, 1, low=low, high=high), uniform(seed + 5, 1, 3, low=low, high=high))),
    ]


def _unary_examples(seed: int, low: float = -2.0, high: float = 2.0) -> list[Example]:
    return [Example((uniform(seed, 2, 3, low=low, high=high),)),
            Example((uniform(seed + 1, 4, low=low, high=high),))]


@register
class Add(Elementwise):
    """y = a + b"""

    floats_only = False

    @staticmethod
    def symbolic(sp, a, b):
        return a + b

    @classmethod
    def examples(cls):
        return _binary_examples(10)


@register
class Sub(Elementwise):
    """y = a - b"""

    floats_only = False

    @staticmethod
    def symbolic(sp, a, b):
        return a - b

    @classmethod
    def examples(cls):
        return _binary_examples(20)


@register
class Mul(Elementwise):
    """y = a * b"""

    floats_only = False

    @staticmethod
    def symbolic(sp, a, b):
        return a * b

    @classmethod
    def examples(cls):
        return _binary_examples(30)


@register
class Div(Elementwise):
    """y = a / b"""

    floats_only = False

    @staticmethod
    def symbolic(sp, a, b):
        return a / b

    @classmethod
    def examples(cls):
        # Denominators kept away from zero.
        a = uniform(40, 2, 3)
        return [Example((a, uniform(41, 2, 3, low=0.5, high=2.0))),
                Example((a, -uniform(42, 3, low=0.5, high=2.0)))]


@register
class Pow(Elementwise):
    """y = base ** exponent  (the exponent a tensor, or a constant the Tensor methods wrap;
    its gradient reads y: d/dp x^p = x^p log x)"""

    floats_only = False

    @staticmethod
    def symbolic(sp, base, exponent):
        return base**exponent

    @classmethod
    def examples(cls):
        # Positive bases: x^p log x is only real there.
        x = uniform(50, 2, 3, low=0.5, high=2.0)
        return [Example((x, uniform(51, 2, 3, low=-1.5, high=2.5))),
                Example((x, uniform(52, low=1.5, high=3.0).reshape(())))]


@register
class Neg(Elementwise):
    """y = -x"""

    floats_only = False

    @staticmethod
    def symbolic(sp, x):
        return -x

    @classmethod
    def examples(cls):
        return _unary_examples(60)


@register
class Exp(Elementwise):
    """y = exp(x)  (backward reads y: d exp = exp)"""

    @staticmethod
    def symbolic(sp, x):
        return sp.exp(x)

    @classmethod
    def examples(cls):
        return _unary_examples(70)


@register
class Log(Elementwise):
    """y = log(x)  (natural logarithm)"""

    @staticmethod
    def symbolic(sp, x):
        return sp.log(x)

    @classmethod
    def examples(cls):
        return _unary_examples(80, low=0.2, high=3.0)


@register
class Tanh(Elementwise):
    """y = tanh(x)  (backward reads y: d tanh = 1 - y^2)"""

    @staticmethod
    def symbolic(sp, x):
        return sp.tanh(x)

    @classmethod
    def examples(cls):
        return _unary_examples(90)


@register
class Sigmoid(Elementwise):
    """y = 1 / (1 + exp(-x))  (backward reads y: d sigmoid = y (1 - y))"""

    @staticmethod
    def symbolic(sp, x):
        return 1 / (1 + sp.exp(-x))

    @classmethod
    def examples(cls):
        return _unary_examples(100, low=-4.0, high=4.0)


@register
class Relu(Elementwise):
    """y = max(x, 0)  (gradient 0 at x = 0, as in PyTorch; NaN stays NaN)"""

    @staticmethod
    def symbolic(sp, x):
        # "0 where x <= 0": a NaN fails the test and passes through, as in PyTorch.
        return sp.Piecewise((0, x <= 0), (x, True))

    @classmethod
    def examples(cls):
        # Entries are at least 0.1 from the kink at 0, where the derivative jumps.
        return [Example((distinct(110, 2, 3),)), Example((distinct(111, 5),))]


@register
class LeakyRelu(Elementwise):
    """y = x if x > 0 else negative_slope * x"""

    @staticmethod
    def symbolic(sp, x, *, negative_slope):
        return sp.Piecewise((negative_slope * x, x <= 0), (x, True))

    @classmethod
    def examples(cls):
        return [Example((distinct(120, 2, 3),), {"negative_slope": 0.2}),
                Example((distinct(121, 4),), {"negative_slope": 0.01})]


@register
class Gelu(Elementwise):
    """y = x Phi(x) = x (1 + erf(x / sqrt(2))) / 2, Phi the standard normal CDF (Hendrycks and
    Gimpel 2016; torch's ``gelu``, the Transformer feed-forward's activation option)."""

    @staticmethod
    def symbolic(sp, x):
        return x * (1 + sp.erf(x / sp.sqrt(2))) / 2

    @classmethod
    def examples(cls):
        return _unary_examples(130, low=-3.0, high=3.0)


@register
class GeluTanh(Elementwise):
    """y = x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2: GELU's tanh approximation
    (torch's ``gelu(x, approximate="tanh")``)."""

    @staticmethod
    def symbolic(sp, x):
        return x * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (x + sp.Rational(44715, 1000000) * x**3))) / 2

    @classmethod
    def examples(cls):
        return _unary_examples(140, low=-3.0, high=3.0)


@register
class Where(Op):
    """y = a where cond else b  (cond boolean, no gradient)"""

    kernels = ("sum_to", "where", "zeros")

    @staticmethod
    def symbolic(sp, cond, a, b):
        return np.where(cond, a, b)

    def forward(self, cond, a, b):
        check_bool(self, cond, "cond")
        check_same_dtype(self, a, b)
        broadcast_shape(self, cond, a, b)
        self.saved = (cond, a.shape, b.shape)
        return self.backend.where(cond, a, b)

    def backward(self, dy):
        cond, a_shape, b_shape = self.saved
        k = self.backend
        _, need_a, need_b = self.needs_grad
        # A constant branch (ta.where(mask, x, 0.0)) needs no gradient: skipping it saves a
        # where and a sum_to per step, in eager mode and in a captured plan alike.
        zero = k.zeros((), dy.dtype)
        return (None,
                k.sum_to(k.where(cond, dy, zero), a_shape) if need_a else None,
                k.sum_to(k.where(cond, zero, dy), b_shape) if need_b else None)

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
