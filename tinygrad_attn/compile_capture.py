"""The engine's side of a ``ta.compile`` capture (``compiled.py``): what the ops, backward
and the tensors report while the function runs recorded (``Capture``), a fused chain's
backward as one node (``_ChainGrad``), and what is read from a capture once it is done:
the tensors sharing an argument's array, the graphs of the gradients it wrote, the random
generators it drew from."""

from __future__ import annotations

import gc
import os
import sys
import weakref
from dataclasses import dataclass

import numpy as np

from . import autograd
from . import compiler as _compiler
from . import random as _random
from .autograd import current_scope
from .compiler import get_backend
from .compiler.capture import Call, CaptureError, Const, Recorder, Slot
from .compiler.fold import held_only_by
from .tensor import Tensor

__all__ = ["Capture", "Leaf", "bind_generator", "graph_of", "own_generator", "tensors_sharing"]

# The engine's frames and the compiler's (installed inside the package, at the root here).
_PACKAGE_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (autograd, _compiler))


def _user_line() -> str:
    return autograd._user_frame(_PACKAGE_DIRS)


@dataclass
class Leaf:
    tensor: Tensor
    argument: int | None          # the leaf is argument tensor k (a new object every call)
    expect_none: bool | None      # the guard on .grad at entry; None: never read before set
    grad_in: object = None        # the Slot of the gradient read at entry
    shares: Leaf | None = None   # a leaf whose .grad held this one's .grad array at entry
    shares_argument: int | None = None    # the argument whose array this .grad was at entry
    made: bool = False            # made inside the function: a new tensor at every call


class Capture:
    """The engine's side of one capture: ``autograd.state.capture`` while ``fn`` runs."""

    def __init__(self, recorder: Recorder, arguments: list[Tensor], fuse: bool = False):
        self.recorder = recorder
        self.arguments = {id(t): k for k, t in enumerate(arguments)}
        self.argument_slots: dict[int, int] = {}  # slot index -> argument k
        self.fuse = fuse
        self.ops: list = []
        self.starts: list[int] = []               # per op entered: its first entry
        self.single: dict[int, int] = {}          # id(op) -> its forward's one recorded call
        self.derivatives: dict = {}               # entry index -> (ChainBackward, leaf) of a call
        self.owners: dict[int, Tensor] = {}       # external slot -> the tensor it is the array of
        self.leaves: dict[int, Leaf] = {}
        self.modules: dict[int, tuple] = {}        # id -> (Module, its training flag when called)
        self.sharers: dict[int, tuple] = {}        # id -> (tensor, k): it holds argument k's array
        self.aliases: dict[int, tuple] = {}        # the sharers an op read
        self.sources: dict[int, tuple] = {}        # id -> (a detached tensor, what it detached)
        self.explicit: set[int] = set()            # entries that drew from a generator fn passed
        self.made: list = []                       # weakrefs: the tensors made while recording
        self.modes_set: set[int] = set()            # modules whose mode the function set first
        self.backward_called = False

    def refuse(self, what: str):
        raise CaptureError(f"ta.compile: {what} while capturing, at {_user_line()}: the plan cannot "
                           f"replay what is done with the raw array. Use tensor ops (and kernels) "
                           f"inside a compiled function, or run it eagerly")

    def on_read(self, what: str):
        inside = f" inside {self.ops[-1].name}" if self.ops else ""
        raise CaptureError(f"ta.compile: a value computed from the inputs was read on the host "
                           f"({what}{inside}) while capturing, at {_user_line()}: the plan would freeze "
                           f"it. Return the tensor from the compiled function and read it after the "
                           f"call (or compute on it with tensor ops)")

    # ------------------------------------------------------------ engine hooks

    def enter_op(self, op, inputs) -> None:
        self.recorder.tag = ("forward", op.name, current_scope())
        self.ops.append(op)
        for t in inputs:
            self.see(t)
        self.starts.append(len(self.recorder.entries))

    def leave_op(self) -> None:
        op, start = self.ops.pop(), self.starts.pop()
        if self.fuse and len(self.recorder.entries) == start + 1:
            self.single[id(op)] = start
        self.recorder.tag = ()

    def drew_from_given_generator(self) -> None:
        """The last entry drew from a generator the function passed (not the current one)."""
        self.explicit.add(len(self.recorder.entries) - 1)

    def detached(self, out: Tensor, source: Tensor) -> None:
        self.sources[id(out)] = (out, source)
        self.made_tensor(out)

    def made_tensor(self, t: Tensor) -> None:
        """``t`` was made by the function while it was captured (by an op, from host data, a
        draw): if it outlives the call (kept in a Python attribute, a list, a layer made on
        its first call), the plan would make it anew at every replay (``GuardedPlan.first_enter``)."""
        if not self.recorder.depth:
            self.made.append(weakref.ref(t))

    def see(self, t: Tensor):
        """The slot of ``t``'s array; an unknown one is an external owned by ``t`` (by the
        tensor it detached, for ``w.detach()`` made inside: that one dies with the call)."""
        recorder = self.recorder
        slot = recorder.slot_of(t._data)
        if slot is None:
            while id(t) in self.sources:
                t = self.sources[id(t)][1]
            slot = recorder.external(t._data)
            if recorder.kinds[slot.index] == "external":
                self.owners[slot.index] = t
        elif id(t) in self.sharers:
            self.aliases[id(t)] = self.sharers[id(t)]
        return slot

    def backward_of(self, node, chain=None) -> None:
        self.backward_called = True
        name = node.op.name if chain is None else "fused " + "+".join(
            dict.fromkeys(n.op.name for n in chain.nodes))
        self.recorder.tag = ("backward", name, node.scope)

    def backward_chains(self, order: list) -> dict:
        """With fusion on: node id -> ``_ChainGrad`` for each chain of formula ops in the graph
        behind a backward (``order``, autograd's) whose backward is to be its composed
        derivative (compiler/fuse_backward.py)."""
        if not self.fuse:
            return {}
        from .compiler.fuse_backward import GraphNode, backward_chains
        from .ops.elementwise import Elementwise

        made = [t for t in order if t.node is not None]
        consumers: dict[int, set] = {}
        for k, t in enumerate(made):
            for inp in t.node.inputs:
                consumers.setdefault(id(inp), set()).add(k)
        nodes = []
        for k, t in enumerate(made):
            entry = self.single.get(id(t.node.op))
            if entry is not None and not (isinstance(t.node.op, Elementwise)
                                          and self.recorder.arrays[self.recorder.entries[entry].outs.index]
                                          is t._data):
                entry = None
            nodes.append(GraphNode(entry, self._slot(t), tuple(self._slot(x) for x in t.node.inputs),
                                   frozenset(consumers.get(id(t), ())), k > 0 and not t._retains_grad))
        found = {}
        for chain in backward_chains(self.recorder, get_backend, nodes):
            members = [made[k] for k in chain.members]
            grad = self._chain_grad(chain, members, {nodes[k].out for k in chain.members})
            if grad is not None:
                found[id(members[-1].node)] = grad
        return found

    def _slot(self, t: Tensor) -> int:
        # Every input was seen as its op ran; an output no kernel made (a numpy view) has no
        # slot, and a number no slot has stands for it.
        slot = self.recorder.slot_of(t._data)
        return slot.index if slot is not None else -1 - id(t)

    def _chain_grad(self, chain, members: list, made: set):
        """The chain's backward over its leaf tensors, or None when a leaf buffer is read as two
        tensors (``x`` and ``x.detach()``) or an input needing a gradient is not a leaf."""
        owners: dict[int, dict] = {}
        for t in members:
            for x in t.node.inputs:
                slot = self._slot(x)
                if slot in made:
                    continue
                if slot not in chain.leaves and x.requires_grad:
                    return None                     # a constant the formula holds as a number
                owners.setdefault(slot, {})[id(x)] = x
        if any(len(owners.get(slot, ())) != 1 for slot in chain.leaves):
            return None
        leaves = [next(iter(owners[slot].values())) for slot in chain.leaves]
        return _ChainGrad(chain, [t.node for t in members], leaves, self)

    def backward_done(self, retain_graph: bool) -> None:
        if retain_graph:
            # Refused here, before the gradients are written and whatever follows (an
            # optimizer's step) runs: the call leaves no half-made update behind.
            raise CaptureError(f"ta.compile: backward(retain_graph=True) inside a compiled function is "
                               f"not supported, at {_user_line()}")
        self.recorder.tag = ("gradients",)

    def _leaf(self, t: Tensor, read: bool) -> Leaf:
        leaf = self.leaves.get(id(t))
        if leaf is None:
            if t.node is not None:
                raise CaptureError(f"ta.compile: the gradient of a non-leaf tensor (retain_grad) is "
                                   f"used while capturing, at {_user_line()}; a plan writes only "
                                   f"leaves' gradients")
            made = self.recorder.slot_of(t._data)
            leaf = Leaf(t, self.arguments.get(id(t)), (t._grad is None) if read else None,
                         made=made is not None and self.recorder.kinds[made.index] == "out")
            if read and t._grad is not None:
                known = self.recorder.slot_of(t._grad._data)
                leaf.shares = next((other for other in self.leaves.values()
                                    if known is not None and other.grad_in == known), None)
                leaf.shares_argument = None if known is None else self.argument_slots.get(known.index)
                leaf.grad_in = self.recorder.input(t._grad._data)
            self.leaves[id(t)] = leaf
        return leaf

    def grad_read(self, t: Tensor) -> None:
        self._leaf(t, True)

    def grad_set(self, t: Tensor) -> None:
        self._leaf(t, False)

    def module_called(self, module) -> None:
        """A module's forward ran, or its ``training`` was read: the plan holds for this
        train/eval mode only (unless the function set the mode itself first)."""
        if id(module) not in self.modules and id(module) not in self.modes_set:
            self.modules[id(module)] = (module, bool(module.__dict__["_training"]))

    def mode_set(self, module) -> None:
        """The function set ``module``'s train/eval mode (``model.train()`` inside a step):
        the mode it had at entry does not matter to the plan, and is not guarded."""
        self.modes_set.add(id(module))


class _ChainGrad:
    """A fused chain's backward as if the chain were one node over its leaf tensors
    (``inputs``): per leaf needing a gradient, the composed derivative's kernel on the leaves
    and the root's gradient, summed down to the leaf's shape where it was broadcast.  Each
    kernel call is noted in ``capture.derivatives`` by its place in the recording: two chains
    of one formula (one kernel name) at other shapes or parameters stay apart."""

    def __init__(self, chain, nodes: list, inputs: list, capture):
        self.chain, self.nodes, self.inputs, self.capture = chain, nodes, inputs, capture
        self.backend = nodes[-1].op.backend
        formula = chain.chain.formula
        values = dict(zip(formula.params, chain.chain.params, strict=True))
        self.params = [[values[name] for name in kernel.params] for kernel in chain.kernels]

    def backward(self, grad) -> list:
        arrays = [x._data for x in self.inputs]
        grads = []
        for i, x in enumerate(self.inputs):
            kernel = self.chain.kernels[i]
            if not x.requires_grad:
                grads.append(None)
                continue
            if kernel.identity:
                g = grad
            else:
                g = getattr(self.backend, kernel.name)(*self.chain.operands(i, arrays, grad), *self.params[i])
                self.capture.derivatives[len(self.capture.recorder.entries) - 1] = (self.chain, i)
            grads.append(g if tuple(g.shape) == x.shape else self.backend.sum_to(g, x.shape))
        return grads


def tensors_sharing(t: Tensor, arguments: list) -> list:
    """The tensors other than the arguments that hold ``t``'s very array (``w`` for the
    argument ``w.detach()``): a plan captured so reads the argument where the function read
    them.  Looked for only when the array has holders besides ``t`` (CPython's reference
    count: ``t`` and this call's argument), which a fresh batch never has."""
    if sys.getrefcount(t._data) <= 2:
        return []
    skip = {id(a) for a in arguments}
    return [other for other in gc.get_referrers(t._data)
            if isinstance(other, Tensor) and id(other) not in skip and other._data is t._data]


def graph_of(tensors) -> set[int]:
    """The ids of ``tensors`` and of every tensor their graphs reach."""
    seen, stack = set(), list(tensors)
    while stack:
        t = stack.pop()
        if id(t) not in seen:
            seen.add(id(t))
            if t.node is not None:
                stack += t.node.inputs
    return seen


def own_generator(recorder: Recorder, start, seeded) -> bool:
    """Whether the captured function seeded the engine's generator (``ta.manual_seed``) or
    drew from a generator it made and dropped (``np.random.default_rng(7)`` inside)."""
    if _random._generator is not seeded or _random.generator() is not start:
        return True
    # By index: a name bound to a constant would count as one more holder.
    constants = recorder.constants
    return any(isinstance(constants[i], np.random.Generator) and constants[i] is not start
               and held_only_by(constants, i) for i in range(len(constants)))


def bind_generator(recorder: Recorder, generator, explicit: set = frozenset()) -> object:
    """Make ``generator`` (the one current when the capture began) an input of the plan
    instead of a constant, so each replay draws from the generator current then; returns its
    slot, or None if nothing drew from it.  The entries in ``explicit`` drew from a
    generator the function passed itself (``dropout(..., generator=g)``): they keep it, even
    where it was the current one too."""
    index = next((i for i, c in enumerate(recorder.constants) if c is generator), None)
    if index is None:
        return None
    old, slot = Const(index), Slot(len(recorder.arrays))
    swapped = False
    for number, entry in enumerate(recorder.entries):
        if isinstance(entry, Call) and number not in explicit:
            args = _swap(entry.args, old, slot)
            kwargs = {k: _swap(v, old, slot) for k, v in entry.kwargs.items()}
            swapped = swapped or args != entry.args or kwargs != entry.kwargs
            entry.args, entry.kwargs = args, kwargs
    return recorder.add_slot(generator, "input", True) if swapped else None


def _swap(value, old: Const, new: Slot):
    if type(value) is Const and value == old:
        return new
    if type(value) in (list, tuple):
        return type(value)(_swap(v, old, new) for v in value)
    return value

