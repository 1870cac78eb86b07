"""Elementwise kernels generated from one formula: an op states its math once, as a sympy
expression of one entry, and every device's kernels and their derivatives come from it.

    Formula("tanh", inputs=("x",), build=lambda sp, x: sp.tanh(x))

gives, on first use, the forward kernel ``tanh(x)`` and the backward kernel
``tanh_back(y, dy) = (1 - y^2) dy``: sympy differentiates the formula, and where the
derivative can be written in terms of the forward output ``y`` with fewer transcendental
functions (exp, log, tanh, powers with a variable exponent), proved equal by sympy and with
no new division, the backward kernel reads the output instead of the input (tanh, sigmoid,
exp; the exponent's gradient of a power).  A formula of several inputs gets one backward
kernel per input, ``{name}_back_{input}``.

Each kernel is printed three ways from one common-subexpression-eliminated expression:
for numpy arrays (the "numpy" device), for floats with ``math`` (numba.cuda device
functions) and for floats with the float32-aware exp and tanh of ``numba_support`` (the
"cpu" device's Numba ufuncs).  The devices turn these sources into callables
(``reference/elementwise.py``, ``cpu/elementwise.py``, ``cuda/elementwise.py``).

Deriving takes sympy a fraction of a second per formula, so the result (the sources, not
the callables) is kept on disk, keyed by a hash of the formula's source text and of this
file: importing the package never imports sympy, and a changed formula or generator is
derived afresh.  ``cache_dir()`` says where (TINYGRAD_ATTN_CACHE overrides it).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

__all__ = ["Kernel", "Plan", "plan", "derive", "cache_dir", "SELECTION"]


@dataclass(frozen=True)
class Formula:
    """One elementwise function of ``inputs`` (arrays that broadcast) and ``params`` (scalars
    fixed per call, such as a leaky relu's slope).  ``build(sp, *inputs, **params)`` returns
    the sympy expression of one entry; ``bools`` names inputs that are boolean (a condition);
    ``grads`` is False for functions with no derivative kernels (comparisons, selection);
    ``through_output`` False skips the search for a derivative in terms of the output (a
    fused chain's composed form, where sympy's solve and simplify grow fast)."""

    name: str
    inputs: tuple[str, ...]
    build: Callable
    params: tuple[str, ...] = ()
    bools: tuple[str, ...] = ()
    grads: bool = True
    source: str | None = field(default=None, compare=False)
    through_output: bool = True

    def backward_name(self, index: int) -> str:
        if len(self.inputs) == 1:
            return f"{self.name}_back"
        return f"{self.name}_back_{self.inputs[index]}"

    def kernel_names(self) -> tuple[str, ...]:
        backs = tuple(self.backward_name(i) for i in range(len(self.inputs))) if self.grads else ()
        return (self.name, *backs)

    def key(self) -> str | None:
        """What the derived kernels depend on, hashed; None when the formula's source text
        cannot be read (defined at an interactive prompt), so nothing is cached for it."""
        text = self.source
        if text is None:
            try:
                text = textwrap.dedent(inspect.getsource(self.build))
            except (OSError, TypeError):
                return None
        spec = [_GENERATOR, self.name, self.inputs, self.params, self.bools, self.grads, text,
                self.through_output]
        return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Kernel:
    """A generated kernel: ``name(*args, *params)`` over arrays ``args`` and scalars ``params``.

    ``overflows`` marks one whose intermediate values may overflow to a harmless infinity
    (e^-x of a very negative x in 1/(1 + e^-x) = 0), evaluated without a numpy warning.
    ``identity`` marks a kernel that returns its one argument unchanged (the gradient of a
    sum); ``ufunc`` names the numpy function the kernel is when it is exactly one (so the
    "numpy" device calls it directly); ``operations`` counts arithmetic operations and
    function calls, more than one meaning numpy would make several passes over memory;
    ``expression`` is the sympy expression it computes (``srepr``, over symbols named as
    ``args`` and ``params``), what a fused chain composes (compose.py)."""

    name: str
    args: tuple[str, ...]
    params: tuple[str, ...]
    bools: tuple[str, ...]
    boolean: bool
    identity: bool
    overflows: bool
    ufunc: str | None
    operations: int
    numpy: str
    scalar: str
    numba: str
    expression: str = ""


@dataclass(frozen=True)
class Plan:
    """A formula's kernels: ``forward`` and one ``backward`` kernel per input (its ``args``
    name the formula's inputs, ``"out"`` for the forward output, and ``"dy"``)."""

    forward: Kernel
    backward: tuple[Kernel, ...]


OUTPUT, GRAD = "out", "dy"

# ---------------------------------------------------------------- the formulas of the compiler's own kernels

# Comparisons and selection: no derivatives, but the same three printed forms, so no device
# writes them by hand either.
SELECTION = (
    Formula("eq", ("a", "b"), lambda sp, a, b: sp.Eq(a, b, evaluate=False), grads=False,
            source="Eq(a, b)"),
    Formula("ne", ("a", "b"), lambda sp, a, b: sp.Ne(a, b, evaluate=False), grads=False,
            source="Ne(a, b)"),
    Formula("lt", ("a", "b"), lambda sp, a, b: a < b, grads=False, source="a < b"),
    Formula("le", ("a", "b"), lambda sp, a, b: a <= b, grads=False, source="a <= b"),
    Formula("gt", ("a", "b"), lambda sp, a, b: a > b, grads=False, source="a > b"),
    Formula("ge", ("a", "b"), lambda sp, a, b: a >= b, grads=False, source="a >= b"),
    Formula("where", ("cond", "a", "b"), lambda sp, cond, a, b: sp.Piecewise((a, cond), (b, True)),
            bools=("cond",), grads=False, source="Piecewise((a, cond), (b, True))"),
)

# ---------------------------------------------------------------- plans, cached


def _generator_hash() -> str:
    with open(__file__, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()[:16]


_GENERATOR = _generator_hash()
_PACKAGE = __name__.partition(".")[0]          # the installed package this compiler is part of
_PLANS: dict[Formula, Plan] = {}


def cache_dir() -> str:
    """Where derived kernels are kept: $TINYGRAD_ATTN_CACHE, else the user's cache folder
    ($XDG_CACHE_HOME or ~/.cache)/tinygrad_attn; a temporary folder where neither can be
    written."""
    chosen = os.environ.get("TINYGRAD_ATTN_CACHE")
    if not chosen:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        chosen = os.path.join(base, _PACKAGE)
    try:
        os.makedirs(chosen, exist_ok=True)
        if os.access(chosen, os.W_OK):
            return chosen
    except OSError:
        pass
    fallback = os.path.join(tempfile.gettempdir(), f"{_PACKAGE}-{os.getuid()}")
    os.makedirs(fallback, exist_ok=True)
    return fallback


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: another process
    reading at the same time sees the old file or the new one, never half of one."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def plan(formula: Formula) -> Plan:
    """The formula's kernels: from memory, from the disk cache, or derived with sympy."""
    found = _PLANS.get(formula)
    if found is not None:
        return found
    key = formula.key()
    path = os.path.join(cache_dir(), "formulas", f"{formula.name}-{key}.json") if key else None
    found = _read(path) if path else None
    if found is None:
        found = derive(formula)
        if path:
            write_atomically(path, json.dumps({"forward": asdict(found.forward),
                                               "backward": [asdict(k) for k in found.backward]}))
    _PLANS[formula] = found
    return found


def _read(path: str) -> Plan | None:
    try:
        with open(path) as cached:
            data = json.load(cached)
        return Plan(_kernel_from(data["forward"]), tuple(_kernel_from(k) for k in data["backward"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None                             # absent or unreadable: derive it again


def _kernel_from(data: dict) -> Kernel:
    tuples = {k: tuple(v) for k, v in data.items() if isinstance(v, list)}
    return Kernel(**{**data, **tuples})


# ---------------------------------------------------------------- deriving


def derive(formula: Formula) -> Plan:
    """Differentiate ``formula`` and print every kernel (sympy; no cache)."""
    import sympy as sp

    taken = set(formula.inputs) | set(formula.params)
    if formula.grads and taken & {OUTPUT, GRAD}:
        raise ValueError(f"formula {formula.name!r}: inputs may not be called {OUTPUT!r} or {GRAD!r}")
    xs = [sp.Symbol(n) if n in formula.bools else sp.Symbol(n, real=True) for n in formula.inputs]
    ps = {n: sp.Symbol(n, real=True) for n in formula.params}
    f = sp.sympify(formula.build(sp, *xs, **ps))
    forward = _kernel(sp, formula.name, f, [*xs], formula)
    if not formula.grads:
        return Plan(forward, ())
    out, dy = sp.Symbol(OUTPUT, real=True), sp.Symbol(GRAD, real=True)
    backward = []
    for i, x in enumerate(xs):
        d = _tidy(sp, sp.diff(f, x))
        if formula.through_output:
            d = _through_output(sp, f, d, xs, out)
        expr = sp.piecewise_fold(d * dy)
        operands = [s for s in (*xs, out) if s in expr.free_symbols] + [dy]
        backward.append(_kernel(sp, formula.backward_name(i), expr, operands, formula))
    return Plan(forward, tuple(backward))


def _tidy(sp, d):
    # diff gives p*x**p/x for x**p: powsimp makes it p*x**(p - 1), finite at x = 0.
    return sp.powsimp(d)


def _functions(sp, expr) -> int:
    """Transcendental evaluations in ``expr``: the costly part of an elementwise kernel."""
    count = 0
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Function) and not isinstance(node, sp.Piecewise):
            count += 1
        elif isinstance(node, sp.Pow) and not node.exp.is_Integer:
            count += 1
    return count


def _denominator_symbols(sp, expr) -> set:
    return sp.fraction(sp.together(expr))[1].free_symbols


# What sympy's solve raises for an equation it has no method for: a RuntimeError (its
# "not implemented" error is one) or a ValueError.
_UNSOLVED = (RuntimeError, ValueError)


def _through_output(sp, f, d, xs, out):
    """``d`` rewritten in terms of the output ``out`` = f where that evaluates fewer
    transcendental functions and divides by nothing new, and sympy proves it equal.
    Tried: replacing f where it occurs in d, and, for one input that occurs once in f,
    substituting the inverse of f (1/(1 + e^-x) -> x = log(y / (1 - y)) turns
    e^-x/(1 + e^-x)^2 into y(1 - y))."""
    candidates = [d.subs(f, out)]
    # Only where the input occurs once: then solve peels functions off one by one; on
    # x (1 + tanh(x + x^3)) / 2 it searched for minutes.
    occurs_once = len(xs) == 1 and sum(1 for node in sp.preorder_traversal(f) if node == xs[0]) == 1
    if occurs_once and not f.has(sp.Piecewise) and d.has(xs[0]):
        try:
            inverses = sp.solve(sp.Eq(out, f), xs[0])
        except _UNSOLVED:
            inverses = []                   # no inverse: the derivative keeps the input
        candidates += [sp.simplify(d.subs(xs[0], inverse)) for inverse in inverses]
    best, best_cost = d, (_functions(sp, d), sp.count_ops(d))
    for c in candidates:
        if not c.has(out):
            continue
        cost = (_functions(sp, c), sp.count_ops(c))
        if cost[0] >= best_cost[0]:
            continue
        if _denominator_symbols(sp, c) - _denominator_symbols(sp, d):      # divides by y, or anew
            continue
        if sp.simplify(c.subs(out, f) - d) != 0:
            continue
        best, best_cost = c, cost
    return best


def _kernel(sp, name: str, expr, operands: list, formula: Formula) -> Kernel:
    args = tuple(str(s) for s in operands)
    params = formula.params
    bools = tuple(a for a in args if a in formula.bools)
    boolean = isinstance(expr, (sp.logic.boolalg.Boolean, sp.core.relational.Relational)) \
        and not isinstance(expr, sp.Expr)
    # The float argument a constant takes its type from (float32 stays float32 in Numba).
    floats = [a for a in args if a not in bools]
    like = floats[0] if floats else None
    replacements, (reduced,) = sp.cse([expr], symbols=sp.numbered_symbols("_t"))
    identity = len(args) == 1 and expr == sp.Symbol(args[0], real=True) and not params
    operations = _operations(sp, expr)
    signature = ", ".join([*args, *params])
    if not boolean and like is not None and not expr.free_symbols & {sp.Symbol(a, real=True) for a in args}:
        # A constant (a derivative that is zero everywhere): an array of the operands' shape.
        final = lambda text: f"_full({text}, {', '.join(args)})"  # noqa: E731
    else:
        final = (lambda text: text) if boolean or like is None else (lambda text: f"_as({text}, {like})")
    numpy_body = _body(_NumPyPrinter(), replacements, reduced, final=final)
    return Kernel(
        name=name, args=args, params=params, bools=bools, boolean=boolean, identity=identity,
        overflows=expr.has(sp.exp) or any(not p.exp.is_Integer for p in expr.atoms(sp.Pow)),
        ufunc=_single_ufunc(sp, expr, args, params, bools), operations=operations,
        numpy=f"def {name}({signature}):\n{numpy_body}",
        scalar=f"def {name}({signature}):\n{_body(_ScalarPrinter(), replacements, reduced)}",
        numba=f"def {name}({signature}):\n"
              f"{_body(_ScalarPrinter(fast=True, like=like), replacements, reduced)}",
        expression=sp.srepr(expr),
    )


def _operations(sp, expr) -> int:
    """Arithmetic operations, function calls and comparisons: numpy's passes over memory."""
    comparisons = sum(1 for node in sp.preorder_traversal(expr)
                      if isinstance(node, sp.core.relational.Relational))
    return int(sp.count_ops(expr)) + comparisons


def _body(printer, replacements, reduced, final=lambda text: text) -> str:
    lines = [f"    {symbol} = {printer.doprint(value)}" for symbol, value in replacements]
    lines.append(f"    return {final(printer.doprint(reduced))}")
    return "\n".join(lines) + "\n"


# numpy functions that are one pass over memory, by the sympy node they print.
_UFUNCS = {"exp": "exp", "log": "log", "tanh": "tanh"}


def _single_ufunc(sp, expr, args, params, bools) -> str | None:
    """The numpy function ``expr`` is, applied to ``args`` in order, or None."""
    if params:
        return None
    symbols = [sp.Symbol(a) if a in bools else sp.Symbol(a, real=True) for a in args]
    if len(symbols) == 1:
        (a,) = symbols
        if expr == -a:
            return "negative"
        if isinstance(expr, sp.Function) and expr.args == (a,) and expr.func.__name__ in _UFUNCS:
            return _UFUNCS[expr.func.__name__]
        return None
    if len(symbols) == 3 and expr == sp.Piecewise((symbols[1], symbols[0]), (symbols[2], True)):
        return "where"
    if len(symbols) == 2:
        a, b = symbols
        comparisons = {sp.Eq: "equal", sp.Ne: "not_equal", sp.StrictLessThan: "less",
                       sp.LessThan: "less_equal", sp.StrictGreaterThan: "greater",
                       sp.GreaterThan: "greater_equal"}
        if type(expr) in comparisons and expr.args == (a, b):
            return comparisons[type(expr)]
        forms = {"add": a + b, "subtract": a - b, "multiply": a * b, "divide": a / b, "power": a**b}
        for ufunc, form in forms.items():
            if expr == form:
                return ufunc
    return None


# ---------------------------------------------------------------- printers


def _printers():
    from sympy.printing.numpy import NumPyPrinter
    from sympy.printing.pycode import PythonCodePrinter

    class NumPy(NumPyPrinter):
        """numpy with numpy.where for Piecewise (numpy.select's default would make float64)
        and the reference's own ``_erf``."""

        def _print_Pow(self, expr, rational=False):
            if expr.exp == -1:                     # a division, not a float power
                return f"1/{self.parenthesize(expr.base, 1000)}"
            if expr.exp == 3 and not expr.base.is_number:
                # numpy's power special-cases 2 and 0.5 but computes x**3 as a float pow:
                # 1.3-1.8x the time of two products (float32/64, 64 to 262,144 entries,
                # 2026-11-25); the cpu kernels multiply too.
                b = self.parenthesize(expr.base, 1000)
                return f"({b}*{b}*{b})"
            return super()._print_Pow(expr, rational)

        def _print_erf(self, expr):
            # numpy has no erf (sympy would print math.erf, which takes one number).
            return f"_erf({self._print(expr.args[0])})"

        def _print_Piecewise(self, expr):
            *pieces, (last, _) = expr.args
            text = self._print(last)
            for value, cond in reversed(pieces):
                text = f"numpy.where({self._print(cond)}, {self._print(value)}, {text})"
            return text

    class Scalar(PythonCodePrinter):
        """Floats in plain Python with ``math``; squares and cubes as products.  With
        ``fast``, exp and tanh are numba_support's (vectorising float32 polynomials), and
        every constant takes the type of argument ``like`` (a float64 literal would turn a
        float32 kernel's arithmetic to float64)."""

        def __init__(self, fast=False, like=None):
            super().__init__({"standard": "python3"})
            self.fast, self.like = fast, like

        def _constant(self, text):
            return f"cast_like({self.like}, {text})" if self.fast and self.like else text

        def _print_Integer(self, expr):
            return self._constant(f"{int(expr)}.0")

        def _print_Rational(self, expr):
            return self._constant(repr(float(expr)))

        def _print_Float(self, expr):
            return self._constant(repr(float(expr)))

        def _print_Pow(self, expr, rational=False):  # noqa: ARG002 - the printer's signature
            if expr.is_number:                        # sqrt(2): a constant, not a power per entry
                return self._constant(repr(float(expr)))
            base, exponent = expr.args
            if exponent.is_Integer and 1 <= abs(int(exponent)) <= 3:
                b = self.parenthesize(base, 1000)     # an atom, or in parentheses
                product = "*".join([b] * abs(int(exponent)))
                if exponent > 0:
                    return product if exponent == 1 else f"({product})"
                return f"({self._constant('1.0')}/({product}))"
            return f"{self.parenthesize(base, 1000)}**{self.parenthesize(exponent, 1000)}"

        def _print_Pi(self, expr):
            return self._constant(repr(float(expr)))

        def _print_exp(self, expr):
            return f"{'typed_exp' if self.fast else 'math.exp'}({self._print(expr.args[0])})"

        def _print_tanh(self, expr):
            return f"{'typed_tanh' if self.fast else 'math.tanh'}({self._print(expr.args[0])})"

    return NumPy, Scalar


_PRINTER_CLASSES: tuple | None = None


def _NumPyPrinter():
    return _printer_classes()[0]()


def _ScalarPrinter(**kwargs):
    return _printer_classes()[1](**kwargs)


def _printer_classes():
    global _PRINTER_CLASSES
    if _PRINTER_CLASSES is None:
        _PRINTER_CLASSES = _printers()
    return _PRINTER_CLASSES
