"""Gradient verification users call: exact (sympy) and numerical (finite differences).

    >>> r = ta.check.symbolic(lambda x, W: (x @ W).tanh().sum(), x, W)
    >>> r.ok, print(r)                      # derived formula and largest error per input
    >>> ta.check.gradcheck(fn, x, W).ok     # central differences in float64
    >>> print(ta.check.ops())               # every registered op, both checks
    >>> all(r.ok for r in ta.check.fused(step))   # a compiled step's fused kernels

Both checks contract a non-scalar output with a fixed random cotangent c and compare the
gradient of L = sum(c * output) with what ``backward(c)`` accumulates.  ``symbolic`` replays
the recorded graph op by op through each op's ``symbolic`` form on sympy symbols: sympy
differentiates every op exactly, and the chain rule over the graph, evaluated to 30 digits,
gives the reference gradient; it also compares the forward values.  Every float leaf of the
graph is checked: the inputs you pass and any parameters ``fn`` uses.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import autograd
from .autograd import Op
from .ops._common import number
from .tensor import Tensor

__all__ = ["gradcheck", "symbolic", "ops", "fused", "Report", "OpsReport"]


@dataclass
class InputError:
    """The comparison for one checked leaf."""

    name: str
    shape: tuple
    dtype: str
    max_abs_err: float
    max_rel_err: float
    ok: bool
    formula: str = ""


@dataclass
class Report:
    """Result of one check: ``.ok``, per-input errors, and a readable ``str()``."""

    kind: str
    target: str
    inputs: list[InputError] = field(default_factory=list)
    forward_err: float | None = None
    forward_ok: bool = True
    error: str | None = None
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.forward_ok and all(i.ok for i in self.inputs)

    @property
    def max_err(self) -> float:
        errs = [i.max_abs_err for i in self.inputs]
        if self.forward_err is not None:
            errs.append(self.forward_err)
        return max(errs, default=0.0)

    def __str__(self) -> str:
        if self.skipped:
            return f"{self.kind} check of {self.target}: skipped ({self.skipped})"
        lines = [f"{self.kind} check of {self.target}: {'ok' if self.ok else 'FAILED'}"]
        if self.error:
            lines.append(f"  error: {self.error}")
        if self.forward_err is not None:
            state = "matches" if self.forward_ok else "DIFFERS"
            lines.append(f"  forward value {state} the symbolic replay (max abs err {self.forward_err:.2e})")
        for i in self.inputs:
            flag = "" if i.ok else "   <-- wrong gradient"
            lines.append(f"  d/d {i.name} {i.shape} {i.dtype}: max abs err {i.max_abs_err:.2e}, "
                         f"max rel err {i.max_rel_err:.2e}{flag}")
            if i.formula:
                lines.append(f"      {i.formula}")
        return "\n".join(lines)

    __repr__ = __str__


# ---------------------------------------------------------------- shared plumbing


def _input_names(fn, count: int) -> list[str]:
    """Names for the inputs in reports: the function's own parameter names if it has them."""
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[k] if k < len(params) else f"x{k}" for k in range(count)]


def _as_leaves(inputs, names: list[str]) -> list[Tensor]:
    """Float inputs become fresh float64 leaves that require grad; ids and masks stay."""
    leaves = []
    for k, x in enumerate(inputs):
        name = getattr(x, "name", None) or names[k]
        array = np.asarray(x.numpy() if isinstance(x, Tensor) else x)
        if array.dtype.kind == "f":
            leaf = Tensor(array, requires_grad=True, dtype=np.float64, name=name)
        else:
            leaf = Tensor(array, name=name)
        leaves.append(leaf)
    return leaves


def _as_function(fn_or_op, attrs: dict) -> tuple[Callable, str]:
    if isinstance(fn_or_op, type) and issubclass(fn_or_op, Op):
        op = fn_or_op

        def apply_op(*xs):
            return op.apply(*xs, **attrs)

        return apply_op, op.name
    if attrs:
        raise TypeError("check: keyword attributes are only accepted with an Op class")
    return fn_or_op, getattr(fn_or_op, "__name__", "function")


def _cotangent(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.5, 1.5, size=shape) * np.where(
        np.random.default_rng(seed + 1).random(shape) < 0.5, -1.0, 1.0)


def _tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing a backward computed in ``dtype`` with an exact value."""
    return (1e-7, 1e-9) if np.dtype(dtype) == np.float64 else (2e-3, 1e-4)


def _compare(name, leaf: Tensor, expected: np.ndarray, rtol: float, atol: float) -> InputError:
    got = np.zeros(leaf.shape) if leaf.grad is None else leaf.grad.numpy().astype(np.float64)
    diff = np.abs(got - expected)
    rel = diff / np.maximum(np.abs(expected), 1e-12)
    ok = bool(np.all(diff <= atol + rtol * np.abs(expected)))
    return InputError(name, leaf.shape, str(leaf.dtype), float(diff.max(initial=0.0)),
                      float(rel.max(initial=0.0)), ok)


# ---------------------------------------------------------------- finite differences


def gradcheck(fn_or_op, *inputs, eps: float = 1e-6, atol: float = 1e-6, rtol: float = 1e-5,
              seed: int = 0, **attrs) -> Report:
    """Compare ``backward`` with central differences in float64.

    Args:
        fn_or_op: a function of tensors returning a float tensor, or an Op class (then
            ``attrs`` are its attributes).
        inputs: arrays or tensors; float ones are copied to float64 and perturbed, integer
            and boolean ones (ids, masks) pass through unchanged.
        eps: the finite-difference step.

    Leaves that ``fn`` reaches without taking them as inputs (a module's parameters) are
    checked too, after the inputs, perturbed in place; their ``.grad`` is left as it was.
    """
    fn, target = _as_function(fn_or_op, attrs)
    report = Report("gradcheck", target)
    leaves = _as_leaves(inputs, _input_names(fn, len(inputs)))
    try:
        out = fn(*leaves)
        c = _cotangent(out.shape, seed)
        graph_leaves = [t for t in autograd.toposort(out) if t.node is None]
        extra = [t for t in reversed(graph_leaves) if all(t is not leaf for leaf in leaves)]
        kept_grads = [t.grad for t in extra]
        for t in extra:
            t.grad = None
        try:
            out.backward(c.astype(out.dtype))
        except BaseException:
            for t, grad in zip(extra, kept_grads, strict=True):     # as they were
                t.grad = grad
            raise
        if out.dtype != np.float64:
            # A float32 output rounds at ~1e-7: a tiny step would measure only rounding.
            eps, atol, rtol = max(eps, 1e-3), max(atol, 1e-3), max(rtol, 1e-2)
    except Exception as err:  # the report says what broke instead of raising mid-check
        report.error = f"{type(err).__name__}: {err}"
        return report

    def loss() -> float:
        with autograd.no_grad():
            return float(np.sum(np.asarray(fn(*leaves).numpy(), dtype=np.float64) * c))

    try:
        for k, leaf in enumerate(leaves + extra):
            if not leaf.requires_grad:
                continue
            values = leaf.data  # perturbed in place, restored after each element
            numeric = np.zeros(leaf.shape)
            for index in np.ndindex(leaf.shape):
                original = values[index]
                try:
                    values[index] = original + eps
                    upper = loss()
                    values[index] = original - eps
                    lower = loss()
                finally:              # a parameter must never stay perturbed
                    values[index] = original
                numeric[index] = (upper - lower) / (2 * eps)
            report.inputs.append(_compare(leaf.name or f"p{k}", leaf, numeric, rtol, atol))
    finally:
        for t, grad in zip(extra, kept_grads, strict=True):
            t.grad = grad
    return report


# ---------------------------------------------------------------- exact, with sympy

_DIGITS = 30             # significant digits of every replayed value and derivative
_FORMULA_NODES = 1000    # composed expressions larger than this (sympy tree nodes) are not printed


def _symbols(sp, name: str, shape) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    for index in np.ndindex(shape):
        label = name + ("[" + ",".join(map(str, index)) + "]" if shape else "")
        out[index] = sp.Symbol(label, real=True)
    return out


def _constant(sp, array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype.kind != "f":
        return array  # ids and masks are used as indices and conditions, not differentiated
    out = np.empty(array.shape, dtype=object)
    for index in np.ndindex(array.shape):
        out[index] = number(sp, array[index])
    return out


def _exact(sp, expr, what: str):
    """``expr`` evaluated to 30 significant digits (sympy raises the working precision until
    they are right), refusing anything that is not a number."""
    value = sp.sympify(expr).evalf(_DIGITS)
    if not value.is_number or value.has(sp.zoo, sp.nan):
        raise ValueError(f"the exact {what} does not evaluate to a number here: {value}")
    return value


def _tree_size(expr, symbol_sizes: dict) -> int:
    """Nodes in ``expr``'s tree once each symbol is replaced by the tree it stands for."""
    total, stack = 0, [expr]
    while stack:
        node = stack.pop()
        if node.is_Symbol and node in symbol_sizes:
            total += symbol_sizes[node]
        else:
            total += 1
            stack.extend(node.args)
    return total


@dataclass
class _Step:
    """One node replayed on its own.

    ``exprs`` are its output entries as sympy expressions of fresh symbols, one per input
    entry that depends on a checked leaf (``wrt``: symbol -> (input id, index)); input
    entries that do not (constants, masked-out scores) enter as numbers.  ``definitions``
    (symbol, expression) are the subexpressions the entries share, as sympy's ``cse`` finds
    them (a row's mean and variance in a layer norm, a softmax denominator), and ``reduced``
    the entries written with them; ``point`` holds every symbol's 30-digit value.
    """

    exprs: np.ndarray
    wrt: dict
    definitions: list
    reduced: list
    point: dict


@dataclass
class _Replay:
    """The graph of the checked function replayed node by node, inputs first."""

    values: dict = field(default_factory=dict)    # tensor id -> 30-digit value of each entry
    live: dict = field(default_factory=dict)      # tensor id -> which entries depend on a checked leaf
    sizes: dict = field(default_factory=dict)     # tensor id -> tree size of each entry, composed
    steps: dict = field(default_factory=dict)     # tensor id -> the _Step of the node that made it


def _shared_subexpressions(sp, exprs: np.ndarray) -> tuple[list, list]:
    definitions, reduced = sp.cse(list(exprs.flat), symbols=sp.numbered_symbols(cls=sp.Dummy, real=True))
    if any(not isinstance(definition, sp.Expr) for _, definition in definitions):
        # A shared condition (a Piecewise's x <= 0) has no derivative to chain through.
        return [], list(exprs.flat)
    return definitions, reduced


def _replay(sp, order: list[Tensor]) -> _Replay:
    """Each node's ``symbolic`` form on fresh symbols, evaluated at its inputs' values.

    Composing the nodes into one expression per output entry (and differentiating that) is
    exact too but cannot finish on a Transformer layer: softmax and layer norm put every
    input entry into every output entry, so the tree multiplies in size at each of them
    while differentiation and substitution walk the whole tree.  One node at a time, each
    expression holds a single op; ``sizes`` keeps how large the composed trees would be.
    """
    replay = _Replay()
    for t in reversed(order):                        # every input before what is made from it
        if t.node is None:                           # a checked leaf
            replay.values[id(t)] = _constant(sp, t.numpy())
            replay.live[id(t)] = np.ones(t.shape, dtype=bool)
            replay.sizes[id(t)] = np.ones(t.shape, dtype=object)
            continue
        args, wrt, point, symbol_sizes = [], {}, {}, {}
        for x in t.node.inputs:
            if id(x) not in replay.values:           # requires no grad: a constant
                args.append(_constant(sp, x.numpy()))
                continue
            arg = np.empty(x.shape, dtype=object)
            for index in np.ndindex(x.shape):
                if not replay.live[id(x)][index]:
                    arg[index] = replay.values[id(x)][index]
                    continue
                symbol = sp.Dummy(real=True)
                arg[index] = symbol
                wrt[symbol] = (id(x), index)
                point[symbol] = replay.values[id(x)][index]
                symbol_sizes[symbol] = replay.sizes[id(x)][index]
            args.append(arg)
        result = type(t.node.op).symbolic(sp, *args, **t.node.attrs)
        exprs = np.array(result, dtype=object).reshape(t.shape)
        for index in np.ndindex(t.shape):
            exprs[index] = sp.sympify(exprs[index])
        definitions, reduced = _shared_subexpressions(sp, exprs)
        for symbol, definition in definitions:
            point[symbol] = _exact(sp, definition.xreplace(point), "replay")
        values = np.empty(t.shape, dtype=object)
        for k, expr in enumerate(reduced):
            values.flat[k] = _exact(sp, expr.xreplace(point), "replay")
        live = np.zeros(t.shape, dtype=bool)
        sizes = np.ones(t.shape, dtype=object)
        for index in np.ndindex(t.shape):
            if exprs[index].free_symbols:
                live[index] = True
                sizes[index] = _tree_size(exprs[index], symbol_sizes)
        replay.values[id(t)], replay.live[id(t)], replay.sizes[id(t)] = values, live, sizes
        replay.steps[id(t)] = _Step(exprs, wrt, definitions, reduced, point)
    return replay


def _pull_back(sp, order: list[Tensor], replay: _Replay, cotangent: np.ndarray) -> dict[int, np.ndarray]:
    """d sum(cotangent * root) / d every tensor of the graph, by the chain rule: sympy
    differentiates each node's expressions exactly, the partial derivatives are evaluated
    at 30 digits, and the products are summed over every path from the root (inside a node
    too, through its shared subexpressions).  The engine's backward is not used; only the
    recorded graph is shared."""

    def partial(expr, symbol, point):
        return _exact(sp, sp.diff(expr, symbol).xreplace(point), "derivative")

    shapes = {id(t): t.shape for t in order}
    adjoints = {id(order[0]): _constant(sp, cotangent)}
    for t in order:                                  # the root first, every consumer before its inputs
        step, adjoint = replay.steps.get(id(t)), adjoints.get(id(t))
        if step is None or adjoint is None:
            continue
        local: dict = {}                             # symbol -> d sum(adjoint * t) / d symbol
        for weight, expr in zip(adjoint.flat, step.reduced, strict=True):
            if weight != 0:
                for symbol in expr.free_symbols:
                    local[symbol] = local.get(symbol, 0) + weight * partial(expr, symbol, step.point)
        for shared, definition in reversed(step.definitions):
            weight = local.pop(shared, 0)
            if weight != 0:
                for symbol in definition.free_symbols:
                    local[symbol] = local.get(symbol, 0) + weight * partial(definition, symbol, step.point)
        for symbol, weight in local.items():
            source, where = step.wrt[symbol]
            if source not in adjoints:
                adjoints[source] = np.zeros(shapes[source], dtype=object)
            adjoints[source][where] += weight
    return adjoints


def _composed(order: list[Tensor], replay: _Replay, leaf_symbols: dict[int, np.ndarray]) -> np.ndarray:
    """The root's entries as single expressions of the leaf symbols (each step substituted
    into the next): only for the report's formula, and only when ``sizes`` says they are small."""
    composed = dict(leaf_symbols)
    for t in reversed(order):
        step = replay.steps.get(id(t))
        if step is None:
            continue
        out = np.empty(t.shape, dtype=object)
        for index in np.ndindex(t.shape):
            expr = step.exprs[index]
            out[index] = expr.xreplace({symbol: composed[step.wrt[symbol][0]][step.wrt[symbol][1]]
                                        for symbol in expr.free_symbols})
        composed[id(t)] = out
    return composed[id(order[0])]


def _formula(sp, out_exprs: np.ndarray, leaf_symbols: np.ndarray) -> str:
    """One exact partial derivative for the report: the first output entry and leaf entry
    that depend on each other, as sympy derives it (unsimplified, so it reads like the
    textbook rule, e.g. 1 - tanh(x)**2)."""
    outs = out_exprs.reshape(-1)
    for symbol in leaf_symbols.reshape(-1)[:16]:
        for k, expr in enumerate(outs[:16]):
            if symbol in sp.sympify(expr).free_symbols:
                name = f"y[{k}]" if outs.size > 1 else "y"
                text = str(sp.diff(expr, symbol))
                text = text if len(text) <= 160 else text[:157] + "..."
                return f"d {name} / d {symbol} = {text}"
    return ""


def symbolic(fn_or_op, *inputs, seed: int = 0, **attrs) -> Report:
    """Differentiate the recorded graph exactly with sympy and compare with ``backward``.

    Each node's ``symbolic`` form is differentiated exactly and evaluated at 30 digits; the
    chain rule over the recorded graph gives the exact gradient of sum(c * output) for a
    fixed random cotangent c, to 30 digits.

    Args:
        fn_or_op: a function of tensors, or an Op class (then ``attrs`` are its attributes).
        inputs: arrays or tensors at small shapes (each float entry becomes a symbol).

    Returns:
        A Report: per checked leaf the largest error and one derived formula
        (d output[0] / d leaf[0], when the composed expression is small enough to print),
        and the forward values against the replay.
    """
    import sympy as sp

    fn, target = _as_function(fn_or_op, attrs)
    report = Report("symbolic", target)
    leaves = _as_leaves(inputs, _input_names(fn, len(inputs)))
    extra, kept_grads = [], []
    try:
        out = fn(*leaves)
        if not out.requires_grad:
            raise ValueError("the output does not depend on any input that requires grad")
        # Parameters fn reaches: compared on this backward's gradient alone, then left as
        # they were (as gradcheck does), so checking a module twice needs no zero_grad.
        extra = [t for t in autograd.toposort(out) if t.node is None and all(t is not x for x in leaves)]
        kept_grads = [t.grad for t in extra]
        for t in extra:
            t.grad = None
        c = _cotangent(out.shape, seed)
        out.backward(c.astype(out.dtype), retain_graph=True)

        # The inputs in argument order, then any parameters fn used (e.g. a module's weights).
        order = autograd.toposort(out)
        graph_leaves = [t for t in order if t.node is None]
        reached = {id(t) for t in graph_leaves}
        checked = [t for t in leaves if id(t) in reached]
        checked += [t for t in reversed(graph_leaves) if all(t is not c for c in checked)]
        names = {id(t): t.name or f"p{k}" for k, t in enumerate(checked)}
        replay = _replay(sp, order)

        forward = np.array([float(v) for v in replay.values[id(out)].reshape(-1)])
        report.forward_err = float(np.max(np.abs(forward - out.numpy().reshape(-1).astype(np.float64)),
                                          initial=0.0))
        rtol, atol = _tolerance(out.dtype)
        scale = 1.0 + float(np.max(np.abs(forward), initial=0.0))
        report.forward_ok = report.forward_err <= atol * scale + rtol * scale

        adjoints = _pull_back(sp, order, replay, c)
        symbols = {id(t): _symbols(sp, names[id(t)], t.shape) for t in checked}
        largest = max(replay.sizes[id(out)].reshape(-1), default=1)
        out_exprs = _composed(order, replay, symbols) if largest <= _FORMULA_NODES else None
        for t in checked:
            adjoint = adjoints.get(id(t), np.zeros(t.shape, dtype=object))
            exact = np.array([float(v) for v in adjoint.reshape(-1)]).reshape(t.shape)
            rtol, atol = _tolerance(t.dtype)
            result = _compare(names[id(t)], t, exact, rtol, atol)
            if out_exprs is not None:
                result.formula = _formula(sp, out_exprs, symbols[id(t)])
            else:
                result.formula = (f"(no formula printed: an output entry composes to {largest:.1e} "
                                  f"sympy nodes)")
            report.inputs.append(result)
    except Exception as err:  # the report says what broke instead of raising mid-check
        report.error = f"{type(err).__name__}: {err}"
    finally:
        for t, grad in zip(extra, kept_grads, strict=True):
            t.grad = grad
    return report


# ---------------------------------------------------------------- every op


@dataclass
class OpsReport:
    """Both checks for every example of every registered op."""

    rows: list[tuple[str, int, Report | None, Report | None, str | None]]

    @property
    def ok(self) -> bool:
        return all(problem is None and s.ok and g.ok for _, _, s, g, problem in self.rows)

    @property
    def failures(self) -> list[str]:
        bad = []
        for name, k, s, g, problem in self.rows:
            if problem is not None:
                bad.append(f"{name}: {problem}")
            else:
                bad += [f"{name} example {k}:\n{r}" for r in (s, g) if not r.ok]
        return bad

    def __str__(self) -> str:
        ops_seen = sorted({r[0] for r in self.rows})
        width = max(len(n) for n in ops_seen) if ops_seen else 4
        lines = [f"{'op':<{width}}  ex  symbolic max err  gradcheck max err  status",
                 "-" * (width + 50)]
        for name, k, s, g, problem in self.rows:
            if problem is not None:
                lines.append(f"{name:<{width}}   -  {'-':>16}  {'-':>17}  FAILED: {problem}")
                continue
            status = "ok" if s.ok and g.ok else "FAILED"
            numeric = f"{'skipped':>17}" if g.skipped else f"{g.max_err:>17.2e}"
            lines.append(f"{name:<{width}}  {k:>2}  {s.max_err:>16.2e}  {numeric}  {status}")
        passed = sum(1 for n in ops_seen if all(
            p is None and s.ok and g.ok for m, _, s, g, p in self.rows if m == n))
        lines.append(f"{passed} of {len(ops_seen)} ops pass both checks")
        return "\n".join(lines)

    __repr__ = __str__


def ops(names=None) -> OpsReport:
    """Run ``symbolic`` and ``gradcheck`` on every example of every registered op.

    Args:
        names: restrict to these op names (default: the whole registry).
    """
    rows = []
    for name in sorted(names if names is not None else autograd.registry):
        op = autograd.registry[name]
        examples = op.examples()
        if not examples:
            rows.append((name, 0, None, None, "no examples() to check it at"))
            continue
        for k, example in enumerate(examples):
            exact = symbolic(op, *example.inputs, **example.attrs)
            if example.finite_differences:
                numeric = gradcheck(op, *example.inputs, **example.attrs)
            else:
                numeric = Report("gradcheck", op.name,
                                 skipped="stop-gradient by design; the symbolic check covers it")
            rows.append((name, k, exact, numeric, None))
    return OpsReport(rows)




# ---------------------------------------------------------------- fused kernels of compiled plans


def _chains(what) -> list:
    """The chains ``what`` stands for, each (formula, device, parameters, shapes, dtype) once."""
    from .compiler import fuse as fusing

    if isinstance(what, fusing.Chain):
        return [what]
    plans = what.plans if hasattr(what, "plans") else [what]
    if not all(hasattr(p, "chains") for p in plans):
        raise TypeError(f"ta.check.fused: expected a compiled function (ta.compile), a plan or a "
                        f"compiler.fuse.Chain, got {type(what).__name__}")
    found: dict = {}
    for plan in plans:
        for chain in plan.chains:
            found.setdefault(chain.key(), chain)
    return list(found.values())


def _device_kernel(device: str, name: str):
    from .compiler import get_backend

    backend = get_backend(device)
    fn = backend.table()[name]
    fn = fn.install() if hasattr(fn, "install") else fn
    if device == "numpy":
        return fn
    # Host arrays in and out: the device's own arrays in between.
    return lambda *args: backend.to_numpy(fn(*[backend.asarray(a, a.dtype) if isinstance(a, np.ndarray)
                                               else a for a in args]))


def _close(got, want, rtol: float) -> tuple[float, bool]:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want)
    diff = np.abs(np.where(finite, got - want, 0.0))
    scale = np.max(np.abs(want[finite]), initial=1.0)
    return float(diff.max(initial=0.0)), bool(np.all(diff <= rtol * scale))


def _fused_report(chain, seed: int, dtype) -> Report:
    import sympy as sp

    from .compiler import formulas

    formula = chain.formula
    rtol = 1e-12 if np.dtype(dtype) == np.float64 else 1e-5
    report = Report("fused", f"{formula.name} = {' -> '.join(m.kernel_name for m in chain.members)}")
    symbols = [sp.Symbol(n) if n in formula.bools else sp.Symbol(n, real=True) for n in formula.inputs]
    exact = {n: number(sp, v) for n, v in zip(formula.params, chain.params, strict=True)}
    composed = sp.sympify(formula.build(sp, *symbols, **exact))
    grad = sp.Symbol(formulas.GRAD, real=True)
    derivatives = {i: sp.diff(composed, symbols[i]) for i, n in enumerate(formula.inputs)
                   if n not in formula.bools}
    exact_fns = {i: np.frompyfunc(_real(sp.lambdify([*symbols, grad], d * grad, "math")), len(symbols) + 1, 1)
                 for i, d in derivatives.items()}
    rng = np.random.default_rng(seed)
    errors: dict[int, list] = {i: [] for i in derivatives}
    forward = []
    # Positive leaves (the domain of log, powers and division), then signed ones (both sides
    # of relu's kink); entries where the unfused chain is not finite compare nothing.
    for low in (0.5, -2.0):
        forward.append(_fused_point(chain, rng, dtype, low, rtol, exact_fns, errors))
    report.forward_err = max(e for e, _ in forward)
    report.forward_ok = all(ok for _, ok in forward)
    for i, found in errors.items():
        err = max(e for e, _, _ in found)
        report.inputs.append(InputError(formula.inputs[i], tuple(chain.shapes[i]), str(np.dtype(dtype)), err,
                                        max(r for _, r, _ in found), all(ok for _, _, ok in found),
                                        f"d/d{formula.inputs[i]} = {derivatives[i]}"))
    return report


def _real(fn):
    """``fn`` of floats, NaN outside its real domain (math's sqrt of a negative number)."""

    def real(*xs):
        try:
            value = fn(*xs)
        except (ValueError, ZeroDivisionError, OverflowError):
            return float("nan")
        return float("nan") if isinstance(value, complex) else float(value)

    return real


def _fused_point(chain, rng, dtype, low: float, rtol: float, exact_fns: dict, errors: dict):
    from .compiler import formulas

    formula, params = chain.formula, list(chain.params)
    leaves = [rng.random(shape) < 0.5 if name in formula.bools
              else rng.uniform(low, 2.0, size=shape).astype(dtype)
              for name, shape in zip(formula.inputs, chain.shapes, strict=True)]
    # The unfused chain: each member's kernel on the reference device, in order.
    values: list = []
    with np.errstate(all="ignore"):
        for member in chain.members:
            args = [leaves[i] if kind == "leaf" else values[i] if kind == "member" else np.asarray(i, dtype)
                    for kind, i in member.refs]
            kernel = _device_kernel("numpy", member.kernel_name)
            values.append(kernel(*args, *[params[j] for j in member.params]))
        want = np.asarray(values[-1])
        got = _device_kernel(chain.device, formula.name)(*leaves, *params)
    forward = _close(got, want, rtol)
    dy = rng.normal(size=np.shape(want)).astype(dtype)
    pool = dict(zip(formula.inputs, leaves, strict=True)) | {formulas.OUTPUT: want, formulas.GRAD: dy}
    backward = formulas.plan(formula).backward
    for i, exact_fn in exact_fns.items():
        kernel = backward[i]
        with np.errstate(all="ignore"):
            expected = np.asarray(exact_fn(*leaves, dy), np.float64)
            got = _device_kernel(chain.device, kernel.name)(*[pool[a] for a in kernel.args], *params)
        err, ok = _close(np.broadcast_to(got, np.shape(expected)), expected, max(rtol, 1e-10))
        errors[i].append((err, err / max(float(np.max(np.abs(expected), initial=1.0)), 1e-300), ok))
    return forward


def fused(what, *, seed: int = 0, dtype=None) -> list[Report]:
    """Check the fused kernels of a compiled function (``ta.compile``), of one plan, or one
    chain (``compiler.fuse.Chain``; a plan's are ``plan.chains``): its forward on its device
    against the unfused chain of member kernels on the "numpy" device, and each backward
    kernel against sympy's derivative of the composed formula (dy * d f / d x_i), at random
    positive points of the leaves' captured shapes, in the dtype the chain was captured in
    (or ``dtype``).  Tolerance: 1e-12 (float64) or 1e-5 (float32) relative to the largest value.

        >>> reports = ta.check.fused(step)
        >>> all(r.ok for r in reports), print(*reports, sep="\n")
    """
    return [_fused_report(chain, seed, np.dtype(dtype or chain.dtype)) for chain in _chains(what)]
