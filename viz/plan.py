"""Compiled plans as Graphviz pictures: one node per kernel call, boxed by the scope it ran in.

``ta.viz.graph(step)`` (a ``ta.compile``d function: its latest plan) or
``ta.viz.graph(step.plans[0])`` draws the plan as ``step.source`` reads: each kernel call
of the generated function is a node, each array it reads an edge from the call that made it
(or from the plan's argument, or from the parameter the plan binds by identity).  A fused
kernel (``ta.compile(fn, fuse=True)``) is one node labelled with the chain it replaced and
its formula, ``x0*x1 + x0``, its edges with the leaf each array is (``x0``); a kernel of the
chain's composed derivative (its backward, fuse_backward.py) is labelled ``d/dx0 of`` the same
chain.

The picture is read from the entries the plan keeps (``Plan.entries``, each fused call with
its chain), the ones its source was written from, so it is the plan that replays, after
fusion and the peepholes.  Each entry's tag (the source's comment above it, ``# forward
Linear encoder/layer0/feed_forward``: what the engine was doing when it recorded the call)
gives the call its phase and scope, so calls sit in the
same encoder/decoder/attention boxes as the ops of the engine's graphs (graph.py), forward
and backward of a scope in one box: white the forward calls, lilac the backward ones, green
what follows backward (the optimizer's updates), orange the fused kernels; a call made
between two ops (a scalar made for the next op) sits under the comment above it, as a
reader of the source would place it.

Node ids: ``k<n>`` for the n-th kernel call (1-based, as the header's count), ``a_<name>``
for the plan's arguments, ``e_<name>`` for the arrays bound by identity and the constants
folded when the plan was built (``f7``), ``return``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from tinygrad_attn.compiled import Compiled
from tinygrad_attn.compiler import formulas as _formulas
from tinygrad_attn.compiler.capture import View, slot_indices
from tinygrad_attn.compiler.plan import Plan

from .graph import (
    CLUSTER_FILL,
    FONT,
    INPUT_FILL,
    PARAM_EDGE,
    PARAM_FILL,
    Cluster,
    Drawing,
    GraphLayout,
    draw_plans_with,
    outermost_match,
    parse_collapse,
    scope_kind,
    wrap_label,
)

__all__ = ["plan_of", "plan_graph"]

_FORWARD_FILL = "white"
_BACKWARD_FILL = "#ece6f5"
_UPDATE_FILL = "#e2f0d9"
_FUSED_FILL = "#ffd9a8"
_FUSED_PEN = "#c77c1e"
# A fused formula longer than this is cut, so one node cannot stretch the picture.
_FORMULA_CHARS = 240


def plan_of(what) -> Plan | None:
    """The plan ``what`` stands for: a compiler Plan itself, a compiled function's latest
    plan (``step.source``'s); None for anything else."""
    if isinstance(what, Plan):
        return what
    if isinstance(what, Compiled):
        plans = what.plans
        if not plans:
            raise ValueError(f"graph(): {what.fn.__qualname__} is compiled but has no plan yet; call it "
                             f"once (the first call captures the plan), then draw it")
        return plans[-1]
    return None


@dataclass
class _Call:
    """One kernel call of the plan."""

    number: int                     # its place among the calls, 1-based
    line: int                       # its line in the source
    text: str
    kernel: str
    phase: str
    op: str
    scope: str
    chain: object = None            # a fused call's chain (compiler/fuse.py)
    derivative: int | None = None   # for a kernel of the chain's derivative: the leaf's index
    reads: list = field(default_factory=list)        # (slot read, leaf index or None)
    targets: list = field(default_factory=list)      # the slots it assigns


def _parse(plan: Plan):
    """(calls, view aliases) read from the entries the plan replays."""
    lines = plan.source.splitlines()
    calls: list[_Call] = []
    aliases: dict[int, int] = {}                 # a view's slot -> the slot it was made from
    tag: tuple = ()
    for position, entry in enumerate(plan.entries):
        # A call recorded between two ops (a scalar for the next op) sits under the comment
        # above it, as a reader of the source would place it.
        tag = tuple(entry.tag) or tag
        if isinstance(entry, View):
            aliases[entry.slot.index] = entry.source.index
            continue
        phase, op, scope = (tuple(str(part) for part in tag) + ("", "", ""))[:3]
        line = plan.lines[position]
        call = _Call(len(calls) + 1, line, lines[line - 1].strip(), plan.kernel_name(entry), phase, op, scope,
                     getattr(entry, "chain", None))
        call.derivative = getattr(entry, "derivative", None)
        if call.chain is not None and call.derivative is None:
            leaves = entry.args[:len(call.chain.formula.inputs)]
            call.reads = [(slot.index, leaf) for leaf, slot in enumerate(leaves)]
        else:
            call.reads = [(s, None) for s in slot_indices(entry.args, []) + slot_indices(entry.kwargs, [])]
        # An external returned as it is (an in-place kernel on a parameter) is not reassigned.
        call.targets = [s for s in slot_indices(entry.outs, []) if s not in plan.externals]
        calls.append(call)
    return calls, aliases


@functools.lru_cache(maxsize=512)
def _formula_text(formula, params: tuple) -> str:
    """A fused kernel's formula over its leaves x0, x1, ..., its parameters replaced by the
    values the call passes: ``x0*x1 + x0``."""
    import sympy as sp

    expression = sp.sympify(_formulas.plan(formula).forward.expression)
    values = {name: value for name, value in zip(formula.params, params, strict=False)
              if type(value) in (int, float)}
    if values:
        # Integral values as integers (2*x0, not 2.0*x0), others to 5 digits: a label, not a check.
        numbers = {name: sp.Integer(int(v)) if float(v).is_integer() else sp.Float(v, 5)
                   for name, v in values.items()}
        expression = expression.xreplace({s: numbers[s.name] for s in expression.free_symbols
                                          if s.name in numbers})
    text = sp.sstr(expression)
    return text if len(text) <= _FORMULA_CHARS else text[:_FORMULA_CHARS - 1] + "…"


def _break(text: str, width: int) -> str:
    """A formula in lines of about ``width`` characters, broken after a top-level operator."""
    lines, line = [], ""
    for part in re.split(r"(?<= [+\-]) ", text):
        if line and len(line) + len(part) > width:
            lines.append(line)
            line = part
        else:
            line += (" " if line and not line.endswith(" ") else "") + part
    lines.append(line)
    return "\\n".join(lines)


class _PlanDrawing:
    """One drawing of a plan: nodes for calls, arguments and bound arrays; boxes by scope."""

    # The scope tree is laid out as the engine's graphs lay theirs (graph.py).
    _place = GraphLayout._place
    _write_cluster = GraphLayout._write_cluster
    _write_nodes = staticmethod(GraphLayout._write_nodes)

    def __init__(self, plan: Plan, patterns: tuple, rankdir: str):
        self.plan, self.rankdir = plan, rankdir
        self.calls, self.aliases = _parse(plan)
        self.rep: dict[str, str] = {f"k{c.number}": f"k{c.number}" for c in self.calls}
        self.boxes: dict[str, tuple[str, list]] = {}          # box node -> (its scope, kernels)
        if patterns:
            boxes: dict[str, str] = {}                       # scope -> its box node
            for call in self.calls:
                scope = outermost_match(call.scope, patterns) if call.scope else None
                if scope is not None:
                    name = boxes.setdefault(scope, f"box{len(boxes)}")
                    self.boxes.setdefault(name, (scope, []))[1].append(call.kernel)
                    self.rep[f"k{call.number}"] = name

    def _source(self, slot: int, producer: dict) -> str | None:
        """The node an array comes from: the call that made it, the argument, the bound array."""
        while slot in self.aliases and slot not in producer:
            slot = self.aliases[slot]
        if slot in producer:
            return producer[slot]
        name = self.plan.names[slot]
        if slot in self.plan.inputs:
            return f"a_{name}"
        if slot in self.plan.externals or slot in self.plan.constants:
            return f"e_{name}"
        return None

    def _call_node(self, call: _Call) -> tuple[str, dict]:
        attrs = {"shape": "box", "style": "rounded,filled", "fontsize": "10",
                 "tooltip": f"{self.plan.filename} line {call.line}: {call.text}"
                            + (f"  ({call.phase} {call.op})" if call.op else "")}
        if call.chain is not None:
            formula = _formula_text(call.chain.formula, tuple(call.chain.params))
            lines = [" → ".join(m.kernel_name for m in call.chain.members), "= " + _break(formula, 36)]
            if call.derivative is not None:
                lines = [f"d/dx{call.derivative} of " + lines[0], "f = " + _break(formula, 36)]
            attrs.update(fillcolor=_FUSED_FILL, color=_FUSED_PEN, penwidth="1.5")
            return "\\n".join(lines), attrs
        fill = {"forward": _FORWARD_FILL, "backward": _BACKWARD_FILL}.get(call.phase, _UPDATE_FILL)
        attrs["fillcolor"] = fill
        return call.kernel, attrs

    def digraph(self) -> Drawing:
        g = Drawing(name=self.plan.name, strict=False)
        g.attr(rankdir=self.rankdir, fontname=FONT, nodesep="0.2", ranksep="0.3", newrank="true",
               nslimit="2", label=f"{self.plan.name}: {self.plan.calls} kernel calls", labelloc="t")
        g.attr("node", fontname=FONT, height="0.3", margin="0.08,0.03")
        g.attr("edge", fontname=FONT, fontsize="8", arrowsize="0.6")
        tree = {"": Cluster()}
        statements: dict[str, tuple[str, dict]] = {}
        producer: dict[str, str] = {}
        edges: dict[tuple[str, str], set] = {}
        first_use: dict[str, str] = {}
        for call in self.calls:
            node = self.rep[f"k{call.number}"]
            for slot, leaf in call.reads:
                source = self._source(slot, producer)
                if source is None or source == node:
                    continue
                first_use.setdefault(source, node)
                edges.setdefault((source, node), set()).add(leaf)
            if node.startswith("k"):
                statements[node] = self._call_node(call)
                self._place(tree, call.scope, node, call.number)
            for slot in call.targets:
                producer[slot] = node
            # An in-place kernel's first argument now holds its result (adam_ on a parameter).
            if call.kernel.endswith("_") and call.reads and not call.targets:
                producer.setdefault(call.reads[0][0], node)
        for name, (scope, kernels) in self.boxes.items():
            counts = {k: kernels.count(k) for k in dict.fromkeys(kernels)}
            listed = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in counts.items())
            label = f"{scope.rsplit('/', 1)[-1]}\\n{len(kernels)} kernel calls: {wrap_label(listed, 28)}"
            statements[name] = (label, {"shape": "box3d", "style": "filled", "margin": "0.12,0.08",
                                        "fontsize": "10", "fillcolor": CLUSTER_FILL[scope_kind(scope)]})
            parent = scope.rsplit("/", 1)[0] if "/" in scope else ""
            first = min(c.number for c in self.calls if self.rep[f"k{c.number}"] == name)
            self._place(tree, parent, name, first)
        for source in dict.fromkeys(s for s, _ in edges):
            if source.startswith("a_"):
                statements[source] = (source[2:], {"shape": "ellipse", "style": "filled",
                                                   "fillcolor": INPUT_FILL, "fontsize": "10"})
            elif source.startswith("e_"):
                statements[source] = self._external_node(source[2:])
            else:
                continue
            tree[""].items.append(source)
        self._write_cluster(g, tree, "", statements)
        for (source, target), leaves in edges.items():
            attrs = {}
            if source.startswith("e_"):
                # Bound arrays feed forward and the update at the end: only the edge to the first
                # use pulls on the layout, as a weight's edges do in the engine's graphs.
                attrs.update(color=PARAM_EDGE, penwidth="0.7",
                             weight="1" if first_use[source] == target else "0")
            marks = sorted(f"x{leaf}" for leaf in leaves if leaf is not None)
            if marks:
                attrs["label"] = ",".join(marks)
            g.edge(source, target, **attrs)
        returned = {self._source(slot, producer) for slot in self.plan.returns} - {None}
        if returned:
            g.node("return", f"return ({len(self.plan.returns)})", shape="plaintext", fontsize="10")
            for source in sorted(returned, key=lambda s: (len(s), s)):
                g.edge(source, "return", style="dashed", color="#888888")
        g.nodes = len(statements) + bool(returned)
        g.edges = sum(" -> " in line for line in g.body)
        g.boxes = sum(line.lstrip().startswith("subgraph ") for line in g.body)
        return g

    def _external_node(self, name: str) -> tuple[str, dict]:
        value = self.plan.namespace.get(name)
        shape = getattr(value, "shape", None)
        label = name.removeprefix("p_") + ("" if shape is None else f"\\n{tuple(shape)}")
        if name.startswith("p_"):           # a parameter, by the name the engine gave it
            return label, {"shape": "box", "style": "filled", "fillcolor": PARAM_FILL, "color": "#4a6fa5",
                           "fontsize": "10"}
        return label, {"shape": "box", "style": "filled", "fillcolor": "#eeeeee", "color": "#bbbbbb",
                       "fontcolor": "#555555", "fontsize": "8", "height": "0.2", "margin": "0.04,0.02"}

    @staticmethod
    def _write_rows(g) -> None:
        """The engine's drawing orders rows of inputs here; a plan's arguments need no order."""


def plan_graph(plan: Plan, collapse=None, rankdir: str = "TB") -> Drawing:
    """The picture of ``plan`` (see the module's docstring); ``collapse``: scope names or
    patterns whose calls are drawn as one box each (as ``graph``'s), ``rankdir`` as there."""
    if rankdir not in ("TB", "LR", "BT", "RL"):
        raise ValueError(f"graph(): rankdir must be 'TB', 'LR', 'BT' or 'RL', got {rankdir!r}")
    keep_steps, patterns = parse_collapse(collapse)
    if keep_steps is not None:
        raise ValueError(f"graph(): a plan has no unrolled steps to keep; collapse a plan by scope names "
                         f"(collapse='attention', '*/*'), got {collapse!r}")
    return _PlanDrawing(plan, patterns, rankdir).digraph()


draw_plans_with(plan_of, plan_graph)
