"""Fusing a captured plan's chains of elementwise formula kernels into one kernel each.

A plan (plan.py) runs ``mul(a, b)`` then ``add(t, a)``: two passes over memory and an
intermediate array.  ``fuse`` finds such chains among a ``Recorder``'s entries and replaces
each by one call of a kernel generated from the composition of the members' formulas
(compose.py), derived, printed and cached on disk as any formula is:

    t3 = fused_3f9a1c0b2d4e(a, b)          # a*b + a, one pass

Members are the calls of kernels generated from formulas, forward or backward (``mul``,
``tanh_back``, ``gelu``), with a float result; a ``broadcast_to`` read only by members, to
the chain's result shape, is absorbed (its input becomes a leaf, broadcast by the fused
kernel itself); a 0-d ``full`` of a number (a Python constant an op made an array of) is
written into the kernel as that number.  The plan (plan.py's ``build_plan``) drops the sum_to
calls that return their input unchanged before fusing: no-ops that would break chains.  A
group grows from its last member (the *root*) backwards, PyTensor-style, under three rules:

* consumer-closed (as MLX's rule): a member's result is read only by the group's members,
  never by another entry, a view or the plan's returns; only the root's result escapes;
* convex (PyTensor's rule): no non-member lies on a path between two members.  With one
  escaping result this follows from the first rule (a path leaving a member other than the
  root reads that member's result), except through memory written in place: no in-place
  kernel between the first member and the root may write memory a leaf shares;
* one device ("cpu" or "cuda": the "numpy" device replays unfused, the reference), one float
  dtype; at most ``max_members`` kernels and ``max_leaves`` operands (sympy's work grows
  fast with the composition).

A chain is fused only where it pays (measured, see MIN_ELEMENTS): on "cpu" not below
``MIN_ELEMENTS`` elements, nor, in float64, through a member calling a transcendental
function (``SCALAR_MATH``); on any device, not when the device declines to build the
composed kernel (``_own_kernel``).

The fused call sits at the root's place, so every leaf is computed by then.  The forward and
the backward of a captured step are fused independently: the recorded backward is itself a
chain of formula kernels (``mul_back_a(b, g)`` then ``add(g, t)``), fused like any other.
A fused call is a ``FusedCall``: it carries its ``Chain`` (members, parameter values, leaf
shapes), so the plan that replays it knows what it replaced (``Plan.chains``), for
``ta.check.fused`` and the plan's picture.  Nothing is kept per process: one kernel (one
composed formula) may serve chains of different parameter values and shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import elementwise_formulas
from .capture import Call, Recorder, Slot, View, slot_indices
from .compose import Member, compose, member_kernel
from .formulas import Formula

__all__ = ["fuse", "define_fused", "Chain", "FusedCall", "FUSING_DEVICES", "Graph", "chain_parts",
           "scalar_math"]

FUSING_DEVICES = ("cpu", "cuda")

# On "cpu", a chain whose result has fewer elements stays unfused.  Measured with
# ``bench/compiled.py --only chains`` (forward replay, same process, alternating, median of
# same-repeat ratios fused/unfused; a 2-core EPYC shared with other jobs: +-10% is noise):
#
#   elements               64    256   1024   4096  16384  65536  262144
#   a*b+a          f32   1.14   1.11   1.13   0.93   0.74   0.60   0.55
#   a*b+a          f64   1.18   1.13   1.08   0.87   0.70   0.59   0.53
#   (a-b)*(a+b)*a  f32   0.85   0.89   0.77   0.65   0.45   0.37   0.28
#   (a-b)*(a+b)*a  f64   0.92   0.88   0.71   0.55   0.36   0.58   0.29
#   exp(a-b)*b     f32   1.58   1.38   1.17   0.95   0.58   0.58   0.38
#
# One Numba ufunc call costs a few microseconds more than a numpy ufunc's, which one pass
# less over memory repays only from a few thousand elements: up to 1024 a two-kernel chain
# loses (up to 18%); from 4096 every chain measured wins (but float64 transcendentals, below).
# On "cuda" every launch saved pays (7-14 us each): no threshold there.
MIN_ELEMENTS = 4096

# Device -> the dtypes in which a member calling a transcendental function (exp, log, tanh,
# erf, a power to a non-integer) is not fused: numpy evaluates those with SIMD, a Numba
# float64 kernel calls the scalar libm (llvmlite here has no SVML).  Same measurements:
#
#   elements               64    256   1024   4096  16384  65536  262144
#   tanh(a*b)+b    f32   1.04   1.02   0.99   0.94   0.92   0.80   0.92
#   tanh(a*b)+b    f64   1.22   1.66   2.67   4.02   4.69   7.75   7.88
#   exp(a-b)*b     f64   1.50   1.62   2.01   2.81   3.20   3.19   3.24
#   gelu_tanh(a)*b f32   0.54   0.55   0.56   0.55   0.62   0.62   0.63   (from primitives)
#   gelu_tanh(a)*b f64   0.64   0.84   1.43   2.43   3.01   4.78   4.88
SCALAR_MATH = {"cpu": ("float64",)}


@dataclass(frozen=True)
class Chain:
    """A fused kernel's chain: its composed ``formula``, the ``members`` it replaced (with
    references to leaves and to each other), the parameter values it was captured with,
    the leaves' shapes and the dtype."""

    formula: Formula
    device: str
    members: tuple[Member, ...]
    params: tuple
    shapes: tuple
    dtype: str

    def key(self) -> tuple:
        """What makes two chains the same check: the composed formula (its name is its
        canonical text's hash), the device, the parameter values, the shapes and the dtype."""
        return (self.formula.name, self.device, self.params, self.shapes, self.dtype)


@dataclass
class FusedCall(Call):
    """The call of a fused kernel: its leaves then its parameters, and the ``chain`` it replaced.
    ``derivative``: None for the chain's forward kernel; for a kernel of its composed
    derivative (fuse_backward.py), the index of the leaf it differentiates by (its arguments
    are then the leaves that derivative reads, the gradient and the parameters)."""

    chain: Chain | None = None
    derivative: int | None = None


def _formula_kernels() -> dict[str, tuple[Formula, int]]:
    found = {}
    for formula in elementwise_formulas():
        if formula.grads:                   # comparisons and selection stay as they are
            for index, name in enumerate(formula.kernel_names()):
                found[name] = (formula, index)
    return found


@functools.cache
def scalar_math(expression: str) -> bool:
    """Whether a kernel's expression calls a transcendental function (see SCALAR_MATH)."""
    import sympy as sp

    expr = sp.sympify(expression)
    functions = [f for f in expr.atoms(sp.Function) if not isinstance(f, sp.Piecewise)]
    powers = [p for p in expr.atoms(sp.Pow) if p.free_symbols and not p.exp.is_Integer]
    return bool(functions or powers)


class Graph:
    """Producers, readers and candidate members of a list of entries."""

    def __init__(self, entries: list, recorder: Recorder, keep: set):
        self.entries, self.recorder, self.keep = entries, recorder, keep
        self.kernels = _formula_kernels()
        self.producer: dict[int, int] = {}
        self.readers: dict[int, set] = {}
        self.members: dict[int, tuple[Member, object]] = {}     # entry -> (member template, kernel)
        for i, entry in enumerate(entries):
            if isinstance(entry, View):
                self.readers.setdefault(entry.source.index, set()).add(i)
                continue
            read = slot_indices(entry.args, []) + slot_indices(entry.kwargs, [])
            for s in read:
                self.readers.setdefault(s, set()).add(i)
            if isinstance(entry.outs, Slot) and entry.outs.index not in read:
                self.producer.setdefault(entry.outs.index, i)
            candidate = self._candidate(entry)
            if candidate is not None:
                self.members[i] = candidate

    def array(self, slot: int):
        return self.recorder.arrays[slot]

    def _candidate(self, entry: Call):
        known = self.kernels.get(entry.kernel)
        if known is None or entry.device not in FUSING_DEVICES or entry.kwargs \
                or not isinstance(entry.outs, Slot):
            return None
        member = Member(*known, refs=())
        kernel = member_kernel(member)
        arrays = entry.args[:len(kernel.args)]
        if kernel.boolean or len(arrays) != len(kernel.args) or not all(isinstance(a, Slot) for a in arrays):
            return None
        dtype = np.dtype(self.array(entry.outs.index).dtype)
        if dtype.kind != "f":
            return None
        if dtype.name in SCALAR_MATH.get(entry.device, ()) and scalar_math(kernel.expression):
            return None
        for name, a in zip(kernel.args, arrays, strict=True):
            want = np.dtype(bool) if name in kernel.bools else dtype
            if np.dtype(self.array(a.index).dtype) != want:
                return None
        return member, kernel

    def broadcast(self, i: int, shape: tuple, device: str) -> bool:
        entry = self.entries[i]
        return (isinstance(entry, Call) and entry.kernel == "broadcast_to" and entry.device == device
                and isinstance(entry.outs, Slot) and len(entry.args) == 2 and isinstance(entry.args[0], Slot)
                and tuple(entry.args[1]) == shape)

    def dtype(self, i: int):
        return np.dtype(self.array(self.entries[i].outs.index).dtype)

    def constant(self, i) -> float | None:
        """The value of entry ``i`` if it is ``full((), number, dtype)`` on the host (a Python
        number an op made a 0-d array of), in that dtype; else None.  Written into the fused
        kernel, not read as a 0-d operand: a*0.5+b fused took 1.14-1.94x the unfused time
        (float32, 64 to 262,144 elements) with the operand, 0.58-0.98x with the number."""
        entry = self.entries[i] if i is not None else None
        if not (isinstance(entry, Call) and entry.kernel == "full" and isinstance(entry.outs, Slot)
                and len(entry.args) == 3 and entry.args[0] == () and type(entry.args[1]) in (int, float)):
            return None
        array = self.array(entry.outs.index)
        return float(array[()]) if isinstance(array, np.ndarray) and array.dtype.kind == "f" else None


def _grow(graph: Graph, root: int, taken: set, max_members: int) -> set:
    entries = graph.entries
    device, dtype = entries[root].device, graph.dtype(root)
    shape = tuple(np.shape(graph.array(entries[root].outs.index)))
    group, kernels, changed = {root}, 1, True
    while changed:
        changed = False
        for m in sorted(group, reverse=True):
            if m not in graph.members:
                continue                               # an absorbed broadcast: its input is a leaf
            for s in slot_indices(entries[m].args, []):
                p = graph.producer.get(s)
                if p is None or p in group or p in taken or s in graph.keep:
                    continue
                if not graph.readers.get(s, set()) <= group:
                    continue                           # read outside: it must stay an array
                if p in graph.members and kernels < max_members and entries[p].device == device \
                        and graph.dtype(p) == dtype:
                    group.add(p)
                    kernels += 1
                    changed = True
                elif graph.broadcast(p, shape, device) or graph.constant(p) is not None:
                    group.add(p)
                    changed = True
    return group


def _written(entry) -> list[int]:
    # In-place kernels are named with a trailing underscore (add_, adam_): any array they
    # are given may be written.
    if isinstance(entry, Call) and entry.kernel.endswith("_"):
        return slot_indices(entry.args, []) + slot_indices(entry.kwargs, [])
    return []


def _hazard(graph: Graph, group: set, leaves: list[int]) -> bool:
    """Whether an in-place write between the first member and the root may change a leaf
    (the members would have read it before the write, the fused kernel after)."""
    for i in range(min(group), max(group)):
        if i in group:
            continue
        for w in _written(graph.entries[i]):
            for leaf in leaves:
                a, b = graph.array(w), graph.array(leaf)
                if w == leaf or not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) \
                        or np.may_share_memory(a, b):
                    return True
    return False


def chain_parts(graph: Graph, group: set):
    """(members, leaf slots, bool leaf indices, parameter values) of a group, in order."""
    entries = graph.entries
    order = sorted(i for i in group if i in graph.members)
    position = {i: k for k, i in enumerate(order)}
    leaves: list[int] = []
    bools: set = set()
    params: list = []
    members = []
    for i in order:
        template, kernel = graph.members[i]
        entry = entries[i]
        refs = []
        for name, a in zip(kernel.args, entry.args, strict=False):
            p = graph.producer.get(a.index)
            if p in position:
                refs.append(("member", position[p]))
                continue
            value = graph.constant(p)
            if value is not None and name not in kernel.bools:
                refs.append(("const", value))      # in the kernel's text: no 0-d operand
                continue
            source = entries[p].args[0].index if p in group else a.index      # a broadcast's input
            if source not in leaves:
                leaves.append(source)
            refs.append(("leaf", leaves.index(source)))
            if name in kernel.bools:
                bools.add(leaves.index(source))
        first = len(params)
        params.extend(entry.args[len(kernel.args):])
        members.append(Member(template.formula, template.index, tuple(refs),
                              tuple(range(first, len(params)))))
    return members, leaves, bools, params


def _tag(entries: list, group: set) -> tuple:
    root = entries[max(group)]
    names = []
    for i in sorted(group):
        name = entries[i].kernel
        if name not in names:
            names.append(name)
    phase = root.tag[0] if root.tag else "fused"
    scope = root.tag[2] if len(root.tag) > 2 else ""
    return (phase, "fused " + "+".join(map(str, names)), scope)


def define_fused(backend, formula: Formula) -> None:
    # A device whose build declines a kernel (one numpy ufunc is already one pass) runs its
    # parent's: the formula goes to the whole line of parents, the root first.
    line = []
    while backend is not None:
        line.append(backend)
        backend = backend.parent
    for b in reversed(line):
        if b.build is not None and formula.name not in b.kernels:
            b.add_formula(formula)


def _own_kernel(backend, name: str) -> bool:
    """Whether ``backend`` builds a kernel of its own for the fused formula ``name`` (built
    now, as the first replay would).  One that declines it runs its parent's: the
    composition is then one numpy call, no better than the members' and maybe worse (x*x*x
    composed to ``x**3``: see the numpy printer's note on cubes in formulas.py)."""
    fn = backend.table()[name]
    install = getattr(fn, "install", None)
    if install is not None:
        install()
    return name in backend.kernels


def fuse(recorder: Recorder, resolve: Callable[[str], object], *, entries=None, keep=(),
         max_members: int = 8, max_leaves: int = 16, min_elements: int | None = None) -> list:
    """``entries`` with each fusable chain replaced by one fused call.

    Args:
        resolve: device name -> its Backend (a fused formula's kernels are added to it).
        entries: the entries to fuse, default ``recorder``'s; ``build_plan`` passes them
            without the calls that change nothing (plan.py's ``shape_no_op``).
        keep: slot indices read after the entries (the plan's returns): never fused away.
        max_members, max_leaves: caps on a chain's kernels and operands.
        min_elements: a chain whose result is smaller stays unfused (default ``MIN_ELEMENTS``).
    """
    smallest = MIN_ELEMENTS if min_elements is None else min_elements
    entries = list(recorder.entries if entries is None else entries)
    graph = Graph(entries, recorder, set(keep))
    taken: set = set()
    replaced: dict[int, Call] = {}
    for root in sorted(graph.members, reverse=True):
        if root in taken or entries[root].device == "cpu" \
                and np.size(graph.array(entries[root].outs.index)) < smallest:
            continue
        group = _grow(graph, root, taken, max_members)
        if sum(1 for i in group if i in graph.members) < 2:
            continue
        members, leaves, bools, params = chain_parts(graph, group)
        if len(leaves) > max_leaves or _hazard(graph, group, leaves) \
                or any(not isinstance(p, (int, float)) for p in params):
            continue
        formula = compose(members, len(leaves), bools, len(params))
        device = entries[root].device
        backend = resolve(device)
        define_fused(backend, formula)
        if not _own_kernel(backend, formula.name):
            continue
        taken |= group
        outs = entries[root].outs
        chain = Chain(formula, device, tuple(members), tuple(params),
                      tuple(tuple(np.shape(graph.array(s))) for s in leaves), str(graph.dtype(root)))
        replaced[root] = FusedCall(device, formula.name, tuple(Slot(s) for s in leaves) + tuple(params), {},
                                   outs, _tag(entries, group), chain)
    return [replaced.get(i, e) for i, e in enumerate(entries) if i not in taken or i in replaced]
