"""A fused chain's backward from its composed derivative, chosen while a step is captured.

fuse.py fuses the forward and the backward of a captured step independently: the recorded
backward of ``y = (a*b + a) * c`` is the members' own backward kernels (``mul_back_b`` reads
the intermediate t = a*b + a for dc, ``mul_back_a`` and ``mul_back_b`` again for a and b,
an ``add`` sums a's two contributions), fused as far as they allow; and since the backward
reads t, the forward chain cannot hide it.  Yet the chain is one formula
f(a, b, c) = (a*b + a) * c, and sympy derives each partial derivative directly:

    da = dy * c * (b + 1),  db = dy * c * a,  dc = dy * (a*b + a)     one kernel per leaf

This module finds such chains in the forward part of a capture *before* backward runs, so
the engine (``ta.compile(fuse=True)``) can run the composed derivative at the chain's root
in place of every member's backward: the recorded backward then holds one call per leaf that
needs a gradient (plus a ``sum_to`` where a leaf was broadcast), and no member's result is
read by the backward any more, so the forward chain fuses too.

The engine describes the autograd graph (``GraphNode``: a node's one recorded forward call,
the slots it read and made, which nodes consume its result); the rules here are fuse.py's,
on tensors rather than buffers:

* members are nodes of formula ops (``ta.ops.Elementwise``) whose forward was exactly one
  recorded call of a fusable formula kernel (fuse.py's ``Graph`` decides what is fusable),
  on one device and dtype; at most ``max_members`` of them and ``max_leaves`` leaves;
* consumer-closed: a member other than the root is consumed only by members (in the graph
  and by every forward call recorded so far), is not the backward's root and keeps no
  gradient of its own (``retain_grad``); so no gradient reaches it except through the root;
* a leaf is one buffer read by the members; the engine checks that it is one tensor;
* on "cpu", no member calls a transcendental function (``RECORDED_IF_TRANSCENDENTAL``).

Why this is exact: the members' gradients compose by the chain rule into the derivative of
the composition, which sympy computes from the same formulas (``ta.check.fused`` checks each
kernel against it).  Why it is safe: the composed kernels read only leaves, whose versions
the engine checks as it would each member's inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import formulas, fuse
from .capture import Call, Recorder
from .compose import compose, member_kernel
from .formulas import Kernel
from .fuse import Chain, FusedCall, Graph, chain_parts, define_fused, scalar_math

__all__ = ["GraphNode", "ChainBackward", "backward_chains", "mark_derivatives"]

# False: every chain's recorded backward stays, fused on its own as fuse.py finds it (what
# bench/compiled.py --only chains --backward compares the composed derivative with).
COMPOSED = True

# Devices on which a chain with a member calling a transcendental function (exp, log, tanh,
# erf, a non-integer power; its derivative then calls it too) keeps its recorded backward:
# each leaf's derivative kernel evaluates the function again (tanh(a*b) + b: the forward's
# tanh, then one in each of da and db), where the members' backward reads the forward's
# saved output.  Forward and backward replay against unfused, one thread, 4,096 to 262,144
# elements (bench/compiled.py --only chains --backward, bench/RESULTS.md, 2026-11-28):
#
#                        composed derivative   recorded backward fused apart
#   (a-b)*(a+b)*a  f32       0.73-0.43x              1.02-0.93x
#   (a-b)*(a+b)*a  f64       0.63-0.38x              1.01-0.94x
#   tanh(a*b)+b    f32       1.17-1.43x              0.95-1.06x
#   exp(a-b)*b     f32       1.15-0.70x              0.99-0.64x
#
# A polynomial chain gains most (no intermediate is kept for the backward, so the forward
# fuses whole); through tanh or exp the extra evaluations cost more than the passes saved.
# On "cuda" recomputing costs less than a launch.
RECORDED_IF_TRANSCENDENTAL = ("cpu",)


@dataclass(frozen=True)
class GraphNode:
    """One node of the graph behind a backward, as the engine sees it.

    ``entry``: the index of the node's one recorded forward call, or None (not a formula op,
    or an op that made several calls); ``out``: the slot of its result; ``inputs``: the slots
    of its input tensors; ``consumers``: the positions (in the list handed to
    ``backward_chains``) of the nodes that read its result; ``internal``: whether its result
    may be hidden inside a chain (not the backward's root, no retained gradient)."""

    entry: int | None
    out: int
    inputs: tuple[int, ...]
    consumers: frozenset
    internal: bool


@dataclass(frozen=True)
class ChainBackward:
    """A chain whose backward is its composed derivative: ``members`` (positions of its nodes,
    the root last), ``leaves`` (slots, in the formula's order x0, x1, ...), the ``chain``
    (as fuse.py's, for ``ta.check.fused``) and the derivative ``kernels``, one per leaf."""

    members: tuple[int, ...]
    leaves: tuple[int, ...]
    chain: Chain
    kernels: tuple[Kernel, ...]

    def operands(self, leaf: int, arrays: list, grad) -> list:
        """The arrays leaf ``leaf``'s derivative kernel reads: leaves by name, then ``grad``."""
        pool = dict(zip(self.chain.formula.inputs, arrays, strict=True)) | {formulas.GRAD: grad}
        return [pool[name] for name in self.kernels[leaf].args]


def backward_chains(recorder: Recorder, resolve: Callable[[str], object], nodes: list[GraphNode], *,
                    max_members: int = 8, max_leaves: int = 16, min_elements: int | None = None) -> list:
    """The chains among ``nodes`` (consumers before producers: a backward's order) whose
    backward should be their composed derivative, each a ``ChainBackward``; their kernels are
    added to the devices (``resolve``: device name -> Backend)."""
    if not COMPOSED:
        return []
    smallest = fuse.MIN_ELEMENTS if min_elements is None else min_elements
    graph = Graph(list(recorder.entries), recorder, set())
    producer = {node.out: k for k, node in enumerate(nodes) if node.entry in graph.members}
    taken: set = set()
    found = []
    for root, node in enumerate(nodes):
        if root in taken or node.entry not in graph.members:
            continue
        entry = graph.entries[node.entry]
        if entry.device == "cpu" and np.size(graph.array(node.out)) < smallest:
            continue
        group = _grow(graph, nodes, producer, root, taken, max_members)
        if len(group) < 2:
            continue
        members, leaves, bools, params = chain_parts(graph, {nodes[k].entry for k in group})
        if len(leaves) > max_leaves or any(type(p) not in (int, float) for p in params):
            continue
        if entry.device in RECORDED_IF_TRANSCENDENTAL and any(
                scalar_math(member_kernel(m).expression) for m in members):
            continue                  # then its derivative is too: checked before deriving it
        formula = compose(members, len(leaves), bools, len(params))
        derivatives = formulas.plan(formula).backward
        define_fused(resolve(entry.device), formula)
        taken |= group
        chain = Chain(formula, entry.device, tuple(members), tuple(params),
                      tuple(tuple(np.shape(graph.array(s))) for s in leaves), str(graph.dtype(node.entry)))
        order = tuple(sorted(group, key=lambda k: nodes[k].entry))
        found.append(ChainBackward(order, tuple(leaves), chain, derivatives))
    return found


def _grow(graph: Graph, nodes: list[GraphNode], producer: dict, root: int, taken: set,
          max_members: int) -> set:
    entries = graph.entries
    device, dtype = entries[nodes[root].entry].device, graph.dtype(nodes[root].entry)
    group, calls, changed = {root}, {nodes[root].entry}, True       # calls: the group's entries
    while changed:
        changed = False
        for m in sorted(group):
            for slot in nodes[m].inputs:
                p = producer.get(slot)
                if p is None or p in group or p in taken or len(group) >= max_members:
                    continue
                candidate = nodes[p]
                if not (candidate.internal and candidate.consumers <= group
                        and graph.readers.get(slot, set()) <= calls):
                    continue
                if entries[candidate.entry].device == device and graph.dtype(candidate.entry) == dtype:
                    group.add(p)
                    calls.add(candidate.entry)
                    changed = True
    return group


def mark_derivatives(entries: list, derivatives: dict) -> list:
    """``entries`` with each call of a chain's derivative kernel a ``FusedCall`` carrying the
    chain and the leaf it differentiates by: what ``Plan.chains`` lists, ``ta.check.fused``
    checks and the plan's picture labels.  ``derivatives``: entry index -> (ChainBackward,
    leaf), as the engine noted each call: by place, not by kernel name, since chains of one
    composed formula at other shapes or parameter values share the kernel."""
    marked = list(entries)
    for index, (chain, leaf) in derivatives.items():
        e = entries[index]
        if type(e) is not Call or e.kernel != chain.kernels[leaf].name:
            raise RuntimeError(f"fuse_backward: entry {index} ({e.kernel}) was noted as the call of "
                               f"{chain.kernels[leaf].name} but is not that kernel's plain call")
        marked[index] = FusedCall(e.device, e.kernel, e.args, e.kwargs, e.outs, e.tag, chain.chain, leaf)
    return marked
