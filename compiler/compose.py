"""One formula from a chain of formula kernels: what a fused kernel computes.

A chain is a list of members in the order they ran, each a kernel generated from a formula
(a forward kernel such as ``mul``, or a backward one such as ``mul_back_a``) whose array
arguments are the chain's leaves or earlier members' results, and whose scalar parameters
are the chain's parameters.  ``compose`` returns a ``Formula`` whose ``build`` substitutes
each member's sympy expression (``Kernel.expression``) into the next:

    mul(x0, x1) -> t;  add(t, x0)        gives   x0*x1 + x0

so the fused kernel is derived, cached on disk and printed for every device exactly as an
op's formula is (formulas.py): one expression, common subexpressions eliminated, and its
derivative per leaf from the composed form (d/dx0 = x1 + 1).  Its ``source`` is a canonical
text of the chain (each member's kernel name and formula key, its references, its
parameters), so the disk cache's key changes when any member's formula or the generator
does, and two captures of the same chain share one kernel.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from . import formulas
from .formulas import Formula, Kernel

__all__ = ["Member", "compose", "member_kernel"]


@dataclass(frozen=True)
class Member:
    """One kernel of a chain: ``formula``'s kernel number ``index`` (0 the forward, i + 1 the
    backward for input i); ``refs`` says for each of its array arguments ``("leaf", i)``,
    ``("member", j)`` or ``("const", value)`` (a 0-d array of a number the plan makes afresh
    at each replay: the value is written into the kernel, which then reads no 0-d operand,
    stride 0, that keeps Numba's loop from vectorizing); ``params`` the chain parameter each
    of its scalar parameters is."""

    formula: Formula
    index: int
    refs: tuple
    params: tuple = ()

    @property
    def kernel_name(self) -> str:
        return self.formula.kernel_names()[self.index]


def member_kernel(member: Member) -> Kernel:
    plan = formulas.plan(member.formula)
    return plan.forward if member.index == 0 else plan.backward[member.index - 1]


# Composed formulas by their canonical text: the same chain captured twice is one kernel.
_COMPOSED: dict[str, Formula] = {}


def _canonical(members: tuple[Member, ...], leaves: int, bools: tuple[int, ...], params: int) -> str:
    parts = [f"leaves {leaves} bools {list(bools)} params {params}"]
    for m in members:
        refs = ",".join(f"{kind[0]}{i!r}" for kind, i in m.refs)
        parts.append(f"{m.kernel_name}@{m.formula.key()}({refs})[{','.join(map(str, m.params))}]")
    return "; ".join(parts)


def compose(members, leaves: int, bools=(), params: int = 0) -> Formula:
    """The formula of ``members`` (in order; the last one's result is the chain's) over
    leaves ``x0 .. x{leaves-1}`` (``bools``: the indices of boolean leaves) and parameters
    ``p0 ..``."""
    members, bools = tuple(members), tuple(sorted(bools))
    for m in members:
        if m.formula.key() is None:
            raise ValueError(f"kernel {m.kernel_name!r}: its formula's source cannot be read, so a chain "
                             f"using it has no stable key")
    text = _canonical(members, leaves, bools, params)
    found = _COMPOSED.get(text)
    if found is not None:
        return found
    inputs = tuple(f"x{i}" for i in range(leaves))
    names = tuple(f"p{i}" for i in range(params))
    kernels = [member_kernel(m) for m in members]
    parsed: list = []

    def build(sp, *xs, **ps):
        if not parsed:
            parsed.extend(sp.sympify(k.expression) for k in kernels)
        values: list = []
        for m, k, expr in zip(members, kernels, parsed, strict=True):
            by_name = {name: xs[i] if kind == "leaf" else values[i] if kind == "member" else sp.Float(i, 17)
                       for name, (kind, i) in zip(k.args, m.refs, strict=True)}
            by_name.update({name: ps[f"p{j}"] for name, j in zip(k.params, m.params, strict=True)})
            values.append(expr.xreplace({s: by_name[s.name] for s in expr.free_symbols}))
        return values[-1]

    name = "fused_" + hashlib.sha256(text.encode()).hexdigest()[:12]
    formula = Formula(name, inputs, build, params=names, bools=tuple(inputs[i] for i in bools),
                      source=text, through_output=False)
    _COMPOSED[text] = formula
    return formula
