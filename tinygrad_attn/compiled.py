"""``ta.compile``: run a function's kernels again without the Python around them.

The first call with a new signature runs ``fn`` eagerly and records every kernel call its
ops, backward and updates make (``compiler/capture.py``); the record becomes straight-line
Python over arrays (``compiler/plan.py``).  Later calls with that signature run only that:
no Tensor, no graph, no version check.

    >>> step = ta.compile(lambda x, y: loss_and_grads(model, x, y))
    >>> loss = step(x, y)          # captures (eager)
    >>> loss = step(x2, y2)        # replays
    >>> print(step.source)

The signature is the parameter each Tensor and array argument is bound to, its shape, dtype,
device and requires_grad, the values of the arguments declared ``static`` (types included, all
the way down), grad mode and the default float.  A plan also guards on what it read that is no
argument: the identity of the parameters' arrays and of the optimizers' state arrays
(``load_state_dict`` or ``to(device)`` replaces them, and the plan is captured again), the
parameters and child modules of every Module whose forward ran, their train/eval mode
(dropout on or off) and the tensors' requires_grad, the optimizers' ``branches()`` (SGD's
momentum on or off), arrays shared at the capture (an argument that was ``w.detach()`` or
``w.grad``, parameters sharing one gradient), and whether each gradient it accumulates into
was None when the capture began.  Dropout draws at every replay from the generator current
then (``ta.random.using``, ``ta.manual_seed``), as eager code would; a generator ``fn`` passes
to dropout itself stays the object the capture drew from.

Nothing is silently frozen: reading a value computed from the inputs on the host while
capturing (``item()``, ``numpy()``, ``float(t)``, ``bool(t)``, ``.data``) raises
``CaptureError`` naming the line, and a Python number argument must be declared static.
Tensors made inside ``fn`` are kernel calls too: random draws (``Tensor.randn``) draw again
at every replay, and host data (``Tensor(array)``, a numpy operand) is copied again, read as
it is then (folded into a constant where only the plan holds the array).  Python itself is
not replayed, but state kept in tensors is noticed where the capture sees them made (ops,
constructors, draws, detach, comparisons, casts): one that outlives the call (``state.h =
out``, a layer or a mask made on its first call; not a gradient the step sets) kills the
plan at the next call, and so does a tensor the plan read, held by no module (weakly), that
was dropped since (a variable rebound): the call captures again, and a signature that keeps
doing so runs eagerly after ``max_plans`` times, warned.
"""

from __future__ import annotations

import gc
import inspect
import logging
import os
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import autograd, tensor
from . import compiler as _compiler
from . import random as _random
from .autograd import current_scope, is_grad_enabled
from .compiler import get_backend
from .compiler.capture import Call, CaptureError, Const, Recorder, Slot, recording_all
from .compiler.fold import held_only_by
from .compiler.plan import build_plan
from .compiler.source import compile_source
from .optim import Optimizer
from .tensor import Tensor

__all__ = ["Compiled", "CompileStats"]

_log = logging.getLogger("tinygrad_attn.compile")
# The engine's frames and the compiler's (installed inside the package, at the root here).
_PACKAGE_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (autograd, _compiler))
# Backends are process-wide: one capture at a time (other threads' eager calls pass through).
_CAPTURE_LOCK = threading.RLock()

def _user_line() -> str:
    return autograd._user_frame(_PACKAGE_DIRS)


@dataclass
class CompileStats:
    """What a compiled function did: plans held, captures made, replays run, eager calls
    (compile switched off or past the cap), and why the last capture happened."""

    plans: int = 0
    captures: int = 0
    replays: int = 0
    eager_calls: int = 0
    reason: str = ""


@dataclass
class _Leaf:
    tensor: Tensor
    argument: int | None          # the leaf is argument tensor k (a new object every call)
    expect_none: bool | None      # the guard on .grad at entry; None: never read before set
    grad_in: object = None        # the Slot of the gradient read at entry
    shares: _Leaf | None = None   # a leaf whose .grad held this one's .grad array at entry
    shares_argument: int | None = None    # the argument whose array this .grad was at entry
    made: bool = False            # made inside the function: a new tensor at every call


class _Capture:
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
        self.leaves: dict[int, _Leaf] = {}
        self.modules: dict[int, tuple] = {}        # id -> (Module, its training flag when called)
        self.sharers: dict[int, tuple] = {}        # id -> (tensor, k): it holds argument k's array
        self.aliases: dict[int, tuple] = {}        # the sharers an op read
        self.sources: dict[int, tuple] = {}        # id -> (a detached tensor, what it detached)
        self.explicit: set[int] = set()            # entries that drew from a generator fn passed
        self.made: list = []                       # weakrefs: the tensors made while recording
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
        its first call), the plan would make it anew at every replay (``_Plan.first_enter``)."""
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

    def _leaf(self, t: Tensor, read: bool) -> _Leaf:
        leaf = self.leaves.get(id(t))
        if leaf is None:
            if t.node is not None:
                raise CaptureError(f"ta.compile: the gradient of a non-leaf tensor (retain_grad) is "
                                   f"used while capturing, at {_user_line()}; a plan writes only "
                                   f"leaves' gradients")
            made = self.recorder.slot_of(t._data)
            leaf = _Leaf(t, self.arguments.get(id(t)), (t._grad is None) if read else None,
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
        train/eval mode only."""
        if id(module) not in self.modules:
            self.modules[id(module)] = (module, bool(module.__dict__["_training"]))


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


# What a plan's entry answers when one of its guards fails (fn may return None).
_MISS = object()


@dataclass
class _Plan:
    plan: object                          # compiler.plan.Plan
    enter: Callable                       # enter(*argument tensors) -> fn's result, or _MISS
    entry_source: str                     # its text: the guards, the binding, the outputs
    bound: list                           # (holder, path, obj): path from holder reads obj (an
                                          # array, or a module's parameter or child module); a
                                          # holder may be a weakref (a tensor no module holds)
    modules: list                         # (Module, training flag)
    requires: list = ()                   # (Tensor or its weakref, requires_grad at the capture)
    shared: bool = False                  # guards on arrays shared at the capture
    branches: list = ()                   # (optimizer, its branches() at the capture)
    made: list = ()                       # weakrefs: tensors the capture made and did not return
    escaped: bool = False                 # one of them outlived the call

    def __post_init__(self):
        self.replay = self.enter
        if self.made:
            self.enter = self.first_enter

    @property
    def source(self) -> str:
        return self.plan.source

    def first_enter(self, *tensors):
        """The first call after the capture: a tensor the capture made that is still alive
        was kept by the function or its caller (state made on the first call, or stored at
        every call); the plan would make it anew at every replay, so it dies and the call
        captures again, now reading it.  Else later calls enter straight."""
        if any(ref() is not None for ref in self.made):
            gc.collect()                  # a graph's reference cycles may hold them a while
            if any(ref() is not None for ref in self.made):
                self.escaped = True
                return _MISS
        self.made = ()
        self.enter = self.replay
        return self.replay(*tensors)

    def alive(self) -> bool:
        """Whether every array the plan binds by identity is still where it was: a parameter
        or an optimizer's state replaced (``load_state_dict``, ``to(device)``) kills it."""
        return not self.escaped and all(_follow(holder, path) is array for holder, path, array in self.bound)

    def gone(self) -> bool:
        """Whether a tensor the plan read, held by no module, has been dropped since."""
        return any(type(holder) is weakref.ref and holder() is None for holder, _, _ in self.bound)

    def why_not(self) -> str:
        if self.escaped:
            return "guard: a tensor the capture made outlived the call (state kept in Python)"
        if self.gone():
            return "guard: a tensor the plan read is gone (state kept in Python, replaced since?)"
        if not self.alive():
            return "guard: an array, parameter or layer the plan reads was replaced"
        if any(bool(m.training) != flag for m, flag in self.modules):
            return "guard: a module's train/eval mode changed"
        if any(bool(_strong(t).requires_grad) != flag for t, flag in self.requires):
            return "guard: a tensor's requires_grad changed"
        if any(opt.branches() != value for opt, value in self.branches):
            return "guard: an optimizer setting that chooses its update's kernels (momentum) changed"
        if self.shared:
            return "guard: a gradient's None-ness at entry, or an array shared at the capture, changed"
        return "guard: a gradient's None-ness at entry changed"


def _strong(holder):
    return holder() if type(holder) is weakref.ref else holder


def _follow(holder, path: tuple):
    holder = _strong(holder)
    if holder is None:
        return _MISS                       # a weakly held tensor, gone: no array is it
    for kind, key in path:
        holder = getattr(holder, key) if kind == "attr" else holder[key]
    return holder


def _path_text(path: tuple) -> str:
    return "".join(f".{key}" if kind == "attr" else f"[{key!r}]" for kind, key in path)


def _walk(value, path: tuple, depth: int, wanted: set):
    """(path, array) for every object of ``wanted`` (ids) in ``value``'s dicts, lists and
    tuples: by identity, whatever the device's array type."""
    if id(value) in wanted:
        yield path, value
        return
    if depth == 0:
        return
    if type(value) is dict:
        items = [(k, v) for k, v in value.items() if type(k) in (str, int)]
    elif type(value) in (list, tuple):
        items = list(enumerate(value))
    else:
        return
    for key, item in items:
        yield from _walk(item, (*path, ("item", key)), depth - 1, wanted)


def _module_paths(modules) -> list:
    """(module, path, object) for each parameter and child module of the modules whose forward
    ran, and of the containers among their children (a ModuleList): a plan holds the tensors
    it captured, so one replaced (``model.head = nn.Linear(...)``, a new Parameter) must make
    the call capture again instead of replaying the old weights."""
    found, seen, stack = [], set(), list(modules)
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        for name, value in (*module._parameters.items(), *module._modules.items()):
            if name.isidentifier():
                found.append((module, (("attr", name),), value))
            elif name.isdigit():                       # a ModuleList's children, by position
                found.append((module, (("item", int(name)),), value))
        stack += [child for child in module._modules.values() if getattr(child, "forward", None) is None]
    return found


def _graph_of(tensors) -> set[int]:
    """The ids of ``tensors`` and of every tensor their graphs reach."""
    seen, stack = set(), list(tensors)
    while stack:
        t = stack.pop()
        if id(t) not in seen:
            seen.add(id(t))
            if t.node is not None:
                stack += t.node.inputs
    return seen


def _module_parameters(modules) -> set[int]:
    """The ids of every parameter of the modules whose forward ran, and of all their
    children: tensors a module keeps alive, which a plan may hold by name."""
    found, seen, stack = set(), set(), list(modules)
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        found.update(id(p) for p in module._parameters.values() if p is not None)
        stack += module._modules.values()
    return found


def _optimizer_paths(arrays: list) -> list:
    """(optimizer, path, array) for each of ``arrays`` that a live optimizer holds (its state,
    its settings): arrays the plan binds by identity that no tensor owns.  The optimizers
    are found once per capture by their type among the live objects: any optimizer whose
    update the plan recorded holds them, however the function reached it.  Their state's
    None entries are held to None the same way (optimizer, path, None): a momentum buffer
    made after the capture (``opt.momentum = 0.9``) takes another update than the one
    recorded without it."""
    wanted = {id(a) for a in arrays}
    types, stack = set(), [Optimizer]
    while stack:
        cls = stack.pop()
        types.add(cls)
        stack.extend(cls.__subclasses__())
    found, seen = [], set()
    for obj in gc.get_objects():
        if type(obj) not in types:
            continue
        count = len(found)
        for name, value in vars(obj).items():
            for path, array in _walk(value, (("attr", name),), 4, wanted):
                if id(array) not in seen:
                    seen.add(id(array))
                    found.append((obj, path, array))
        if len(found) > count:
            for k, entry in enumerate(obj.state):
                items = [((), entry)] if entry is None else [((("item", key),), value)
                                                             for key, value in entry.items()]
                found += [(obj, (("attr", "state"), ("item", k), *path), None)
                          for path, value in items if value is None]
    return found


def _bind_generator(recorder: Recorder, generator, explicit: set = frozenset()) -> object:
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


class _Entry:
    """The text of a plan's entry: one generated function that checks the guards, binds the
    arguments' arrays, runs the plan, writes the leaves' gradients and wraps the outputs.
    Generated rather than looped over lists, because it is what a replay of a small step
    pays on top of its kernels: with the key from positional arguments (``_fast_key``) a
    call costs ~1.3 us beyond its kernels, against ~6 us binding the signature and looping."""

    def __init__(self, count: int, strong: set):
        self.params = [f"t{k}" for k in range(count)]
        self.namespace: dict = {"MISS": _MISS}
        self.strong = strong                  # ids of the tensors held by name (modules' parameters)
        self.prelude: list[str] = []          # o3 = ref3(): each weakly held tensor, read once
        self.alive: list[str] = []            # o3 is None: the first guards
        self.guards: list[str] = []
        self.lines: list[str] = []
        self._locals: dict[int, str] = {}
        self._outputs: dict[int, str] = {}
        self._names: dict[tuple[str, int], str] = {}     # (prefix, id) -> name; namespace keeps it alive
        self._counts: dict[str, int] = {}

    def name(self, prefix: str, value) -> str:
        key = self._names.get((prefix, id(value)))
        if key is None:
            number = self._counts[prefix] = self._counts.get(prefix, -1) + 1
            key = self._names[(prefix, id(value))] = f"{prefix}{number}"
            self.namespace[key] = value
        return key

    def tensor(self, t: Tensor, alive: bool = True) -> str:
        """The name ``t`` goes by in the entry: a global for a parameter a module holds (the
        module keeps it alive anyway), else a local read from a weakref at entry, whose
        death misses (``alive``): a plan must not keep alive, nor read, a tensor its function
        or the caller dropped (state replaced between calls, a variable rebound)."""
        if id(t) in self.strong:
            return self.name("param", t)
        local = self._locals.get(id(t))
        if local is None:
            number = len(self._locals)
            local = self._locals[id(t)] = f"o{number}"
            self.namespace[f"ref{number}"] = weakref.ref(t)
            self.prelude.append(f"    {local} = ref{number}()")
        if alive and f"{local} is None" not in self.alive:
            self.alive.append(f"{local} is None")
        return local

    def leaf(self, leaf: _Leaf) -> str:
        return self.params[leaf.argument] if leaf.argument is not None else self.tensor(leaf.tensor)

    def output(self, spec) -> str:
        if spec is None:
            return "None"
        kind, inner = spec[0], spec[1]
        if kind == "tensor":             # once a result: one tensor returned twice is one
            if inner not in self._outputs:
                self._outputs[inner] = f"r{inner}"
                backend = self.name("backend", spec[2])
                self.lines.append(f"    r{inner} = make(results[{inner}], {backend}, False)")
            return self._outputs[inner]
        if kind == "argument":
            return self.params[inner]
        if kind == "grad":
            return f"{self.leaf(inner)}._grad"
        if kind == "object":
            return self.tensor(inner)
        if kind == "made":
            grad = f"results[{inner + 1}]" if spec[3] else "None"
            return f"made_leaf(results[{inner}], {self.name('backend', spec[2])}, {grad})"
        if kind is dict:
            items = ", ".join(f"{self.name('key', k)}: {self.output(v)}" for k, v in inner.items())
            return "{" + items + "}"
        parts = [self.output(v) for v in inner]
        if kind is list:
            return "[" + ", ".join(parts) + "]"
        return "(" + "".join(p + ", " for p in parts).rstrip(" ") + ")"

    def source(self, name: str, described: list[str]) -> str:
        head = [f"def {name}({', '.join(self.params)}):"]
        head += [f"    # {p}: {d}" for p, d in zip(self.params, described, strict=True)]
        head += self.prelude
        guards = self.alive + self.guards
        if guards:
            head.append("    if (" + "\n            or ".join(guards) + "):")
            head.append("        return MISS")
        return "\n".join(head + self.lines) + "\n"


def _entry(plan, name: str, described: list[str], grad_ins: list, generator_slot, bound: list,
           modules: list, grad_guards: list, grad_out: list, spec, requires: list, aliases: list,
           branches: list, strong: set, pinned: list = ()) -> tuple[Callable, str]:
    entry = _Entry(len(described), strong)
    entry.namespace.update(plan=plan.fn, make=Tensor._make, generator=_random.generator, made_leaf=_made_leaf)
    for leaf, none in grad_guards:
        entry.guards.append(f"{entry.leaf(leaf)}._grad is {'not ' if none else ''}None")
    for leaf in grad_ins:
        # Two parameters whose gradient was one tensor at the capture, or a gradient that was
        # an argument's array (``step(w.grad)``): the plan reads it once.
        if leaf.shares is not None:
            entry.guards.append(f"{entry.leaf(leaf)}._grad._data is not "
                                f"{entry.leaf(leaf.shares)}._grad._data")
        elif leaf.shares_argument is not None:
            entry.guards.append(f"{entry.leaf(leaf)}._grad._data is not "
                                f"{entry.params[leaf.shares_argument]}._data")
    # One tensor passed as two arguments whose gradients the plan writes: eager sums both
    # parts into it, the plan would write one (such a call runs eagerly).
    written = [entry.params[leaf.argument] for leaf, _ in grad_out if leaf.argument is not None]
    entry.guards += [f"{a} is {b}" for i, a in enumerate(written) for b in written[i + 1:]]
    for optimizer, value in branches:
        entry.guards.append(f"{entry.name('optimizer', optimizer)}.branches() != "
                            f"{entry.name('branches', value)}")
    for sharer, k in aliases:
        # A tensor that held an argument's array at the capture (``step(w.detach())``): the
        # plan reads the argument for both.  One since dropped is read by no one: no miss.
        local = entry.tensor(_strong(sharer), alive=False)
        if type(sharer) is weakref.ref:
            entry.guards.append(f"({local} is not None and {local}._data is not {entry.params[k]}._data)")
        else:
            entry.guards.append(f"{local}._data is not {entry.params[k]}._data")
    for param, k in pinned:
        entry.guards.append(f"{entry.params[k]} is not {entry.tensor(_strong(param))}")
    for holder, path, array in bound:
        if isinstance(holder, (Tensor, weakref.ref)):
            text = entry.tensor(_strong(holder))
        else:
            text = entry.name("optimizer" if isinstance(holder, Optimizer) else "module", holder)
        entry.guards.append(f"{text}{_path_text(path)} is not {entry.name('array', array)}")
    for module, flag in modules:
        entry.guards.append(f"{'not ' if flag else ''}{entry.name('module', module)}.training")
    for owner, flag in requires:
        entry.guards.append(f"{'not ' if flag else ''}{entry.tensor(_strong(owner))}.requires_grad")
    arrays = [f"{p}._data" for p in entry.params]
    arrays += [f"{entry.leaf(leaf)}._grad._data" for leaf in grad_ins]
    if generator_slot is not None:
        arrays.append("generator()")
    entry.lines.append(f"    results = plan({', '.join(arrays)})")
    for leaf, index in grad_out:
        target = entry.leaf(leaf)
        value = "None" if index is None else f"make(results[{index}], {target}.backend, False)"
        entry.lines.append(f"    {target}._grad = {value}")
    entry.lines.append(f"    return {entry.output(spec)}")
    source = entry.source(name, described)
    compile_source(source, f"<ta.compile {name}>", entry.namespace)
    return entry.namespace[name], source


class Compiled:
    """A compiled function: call it like ``fn``.  ``stats``, ``plans`` (each with
    ``source``), ``source`` (the latest plan's)."""

    def __init__(self, fn, static=(), max_plans: int = 8, fuse: bool = False):
        self.fn = fn
        self.max_plans = max_plans
        self.fuse = fuse
        self.stats = CompileStats()
        self.enabled = os.environ.get("TINYGRAD_ATTN_COMPILE", "1") != "0"
        self._signature = inspect.signature(fn)
        self._static = frozenset(static)
        parameters = self._signature.parameters
        unknown = {s for s in self._static if isinstance(s, str)} - set(parameters)
        if unknown:
            raise TypeError(f"ta.compile: static names {sorted(unknown)} are not parameters of "
                            f"{fn.__qualname__}{self._signature}")
        self._plans: dict[tuple, list[_Plan]] = {}
        # The fast path: a call with exactly the positional parameters finds its plans by a
        # key made from the arguments alone (no signature binding): key -> (the positions of
        # the tensor arguments, or None when all are, the plans list shared with _plans).
        # A trailing *args takes part too (the Transformer's decode step passes its caches so):
        # the key then holds one entry per argument, so each arity keys its own plans.
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        kinds = [p.kind for p in parameters.values()]
        variadic = bool(kinds) and kinds[-1] is inspect.Parameter.VAR_POSITIONAL
        fixed = len(kinds) - variadic
        simple = all(kind in positional for kind in kinds[:fixed]) and not (
            variadic and (list(parameters)[-1] in self._static or fixed in self._static))
        self._positional = fixed if simple else -1
        self._variadic = variadic and simple
        self._static_positions = frozenset(k for k, name in enumerate(parameters)
                                           if name in self._static or k in self._static)
        self._names = list(parameters)
        self._fast: dict[tuple, tuple] = {}
        self._warned = False
        self._gone: dict[tuple, int] = {}    # key -> its plans that died of state kept in Python
        self._state_warned = False
        self._shared_warned = False
        self.__wrapped__ = fn

    @property
    def plans(self) -> list:
        return [p.plan for plans in self._plans.values() for p in plans]

    @property
    def source(self) -> str:
        plans = self.plans
        return plans[-1].source if plans else ""

    def _fast_key(self, args: tuple):
        """The plans' key from positional arguments, or None where the full binding is
        needed (another arity, arrays to convert into Tensors, errors to raise)."""
        if len(args) != self._positional and not (self._variadic and len(args) > self._positional):
            return None
        key = []
        statics = self._static_positions
        for position, value in enumerate(args):
            if position in statics:
                key.append(_static_key(value, self._names[position], self.fn))
            elif isinstance(value, Tensor):
                data = value._data
                key.append((data.shape, data.dtype, value.backend, value.requires_grad))
            elif value is None:
                key.append(None)
            else:
                return None
        key.append(autograd.state.grad_enabled)
        key.append(tensor.default_float)
        return tuple(key)

    def _arguments(self, args, kwargs):
        """(call args, call kwargs, the tensors in order, their names, the key)."""
        bound = self._signature.bind(*args, **kwargs)
        tensors, names, key = [], [], []

        def argument(name, value):
            if isinstance(value, np.ndarray):
                value = Tensor(value)              # what eager code would make of it
            # Each part of the key names its parameter: f(x, y=t) and f(x, scale=t) bind
            # the same tensors to different parameters.
            if isinstance(value, Tensor):
                tensors.append(value)
                names.append(name)
                key.append((name, value.shape, value.dtype, value.device, value.requires_grad))
            elif value is None:
                key.append((name, None))
            elif isinstance(value, (bool, int, float, complex, np.number)):
                raise TypeError(f"ta.compile({self.fn.__qualname__}): argument {name!r} is the Python "
                                f"number {value!r}; a plan would freeze it. Declare it static "
                                f"(ta.compile(fn, static=({name!r},))) to capture a plan per value, or "
                                f"pass it as a 0-d Tensor")
            else:
                raise TypeError(f"ta.compile({self.fn.__qualname__}): argument {name!r} of type "
                                f"{type(value).__name__} is neither a Tensor nor an array; declare "
                                f"it static (its value then keys the plans)")
            return value

        parameters = self._signature.parameters
        for name, value in bound.arguments.items():
            kind = parameters[name].kind
            if name in self._static or self._names.index(name) in self._static:
                key.append(("static", name, _static_key(value, name, self.fn)))
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[name] = tuple(argument(f"{name}_{k}", v) for k, v in enumerate(value))
            elif kind is inspect.Parameter.VAR_KEYWORD:
                key.append(tuple(value))
                bound.arguments[name] = {k: argument(k, v) for k, v in value.items()}
            else:
                bound.arguments[name] = argument(name, value)
        key += [is_grad_enabled(), tensor.default_float]
        return bound.args, bound.kwargs, tensors, names, tuple(key)

    def __call__(self, *args, **kwargs):
        if not self.enabled or autograd.state.capture is not None or autograd.state.anomaly:
            # Inside another capture this function's kernels are that plan's; under
            # detect_anomaly every op checks its values on the host, which no plan replays.
            if autograd.state.capture is None:
                self.stats.eager_calls += 1
            return self.fn(*args, **kwargs)
        fast_key = None if kwargs else self._fast_key(args)
        found = self._fast.get(fast_key) if fast_key is not None else None
        if found is not None:
            positions, plans = found
            tensors = args if positions is None else [args[k] for k in positions]
            for plan in plans:
                result = plan.enter(*tensors)
                if result is not _MISS:
                    self.stats.replays += 1
                    return result
        return self._call(args, kwargs, fast_key)

    def _call(self, args, kwargs, fast_key):
        """A call the fast path did not replay: bind the signature, find or capture a plan."""
        call_args, call_kwargs, tensors, names, key = self._arguments(args, kwargs)
        if len({id(t._data) for t in tensors}) < len(tensors):
            # Arguments sharing an array (f(a, a)): a plan binds buffers by identity and cannot
            # keep them apart, so this call runs eagerly.
            if not self._shared_warned:
                self._shared_warned = True
                warnings.warn(f"ta.compile({self.fn.__qualname__}): arguments share an array (one "
                              f"tensor passed twice?): such calls run eagerly. Pass a copy to replay",
                              UserWarning, stacklevel=3)
            self.stats.eager_calls += 1
            return self.fn(*call_args, **call_kwargs)
        candidates = self._plans.get(key)
        reason, dead = "new signature", []
        if candidates:
            for plan in candidates:
                result = plan.enter(*tensors)
                if result is not _MISS:
                    self.stats.replays += 1
                    self._remember(fast_key, args, candidates)
                    return result
            # A parameter or an optimizer's state was replaced: those plans are dead.
            dead = [p for p in candidates if not p.alive()]
            reason = (dead or candidates)[-1].why_not()
            escaped = any(p.escaped for p in dead)
            if escaped or any(p.gone() for p in dead):
                # State kept in Python: a plan cannot replay it. Once is a layer or a cache
                # made on the first call, or a tensor swapped once (captured again, it is
                # read); again is state that changes at every call (warned; eager after
                # max_plans).
                misses = self._gone[key] = self._gone.get(key, 0) + 1
                if not self._state_warned and misses > 1:
                    self._state_warned = True
                    warnings.warn(f"ta.compile({self.fn.__qualname__}): a tensor a plan read was dropped "
                                  f"since its capture, or one the capture made outlived the call (state "
                                  f"kept in a Python attribute, list or variable): capturing again, and "
                                  f"after {self.max_plans} times running eagerly. A plan replays kernels, "
                                  f"not Python: pass such state as an argument and return its new value",
                                  UserWarning, stacklevel=3)
        with _CAPTURE_LOCK:
            for plan in dead:
                if plan in candidates:      # not yet dropped by another thread
                    candidates.remove(plan)
                    self.stats.plans -= 1
            # Another thread may have captured this signature while this one waited for the lock.
            for plan in list(self._plans.get(key, ())):
                result = plan.enter(*tensors)
                if result is not _MISS:
                    self.stats.replays += 1
                    self._remember(fast_key, args, self._plans[key])
                    return result
            if self.stats.plans < self.max_plans and self._gone.get(key, 0) < self.max_plans:
                result = self._capture(key, reason, call_args, call_kwargs, tensors, names)
                if key in self._plans:              # not when the capture ran eagerly only
                    self._remember(fast_key, args, self._plans[key])
                return result
        if not self._warned and self._gone.get(key, 0) < self.max_plans:
            self._warned = True
            warnings.warn(f"ta.compile({self.fn.__qualname__}): {self.max_plans} plans captured "
                          f"already (max_plans); running eagerly from now on for new signatures "
                          f"({reason}). Pad shapes to fewer sizes, or declare fewer values static",
                          UserWarning, stacklevel=3)
        self.stats.eager_calls += 1
        return self.fn(*call_args, **call_kwargs)

    def _remember(self, fast_key, args, plans: list) -> None:
        if fast_key is None or fast_key in self._fast:
            return
        positions = tuple(k for k, value in enumerate(args) if isinstance(value, Tensor))
        self._fast[fast_key] = (None if len(positions) == len(args) else positions, plans)

    def _capture(self, key, reason, call_args, call_kwargs, tensors, names):
        with _CAPTURE_LOCK:
            recorder = Recorder()
            capture = _Capture(recorder, tensors, self.fuse)
            recorder.on_read = capture.on_read
            inputs = []
            taken = {"_"}        # the plan assigns results it never reads to _: not an argument
            for k, (name, t) in enumerate(zip(names, tensors, strict=True)):
                capture.sharers.update((id(other), (other, k)) for other in _sharers(t, tensors))
                inputs.append((_unique(_argument_name(name), taken), recorder.input(t._data)))
                capture.argument_slots[inputs[-1][1].index] = k
            generator, seeded = _random.generator(), _random._generator
            counts = [sys.getrefcount(t) for t in tensors]
            with recording_all(recorder):
                autograd.state.capture = capture
                try:
                    result = self.fn(*call_args, **call_kwargs)
                    spec, outputs = _output_spec(capture, result)
                finally:
                    autograd.state.capture = None
            if _own_generator(recorder, generator, seeded):
                # Each eager call would restart its stream; a plan would continue it.
                self._gone[key] = self.max_plans
                warnings.warn(f"ta.compile({self.fn.__qualname__}): the function seeds or makes a random "
                              f"generator itself (ta.manual_seed, np.random.default_rng inside): a plan "
                              f"would continue the stream each call restarts, so it runs eagerly. Seed "
                              f"outside the compiled function, or pass it a generator it keeps",
                              UserWarning, stacklevel=4)
                return result
            plan = self._build(capture, key, inputs, spec, outputs, tensors, generator)
            made = {id(ref()) for ref in plan.made}
            # The plan holds what it guards on; the capture must not keep the rest alive (a
            # tensor held weakly, dropped by the function, has to die for its guard to fail).
            recorder.on_read = None
            capture.owners.clear()
            capture.sharers.clear()
            capture.sources.clear()
            # What the caller gets, before the plan is seen: another thread's first replay
            # must not find this call's own tensors alive as if kept (_Plan.first_enter).
            returned = _returned(result, made)
            del result
            # An argument the function kept (``state["prev"] = x``): more references than it
            # came with, besides those handed back; the plan would read that batch for good.
            capture.leaves.clear()
            handed = [id(t) for t in _flat_tensors(returned)]
            now = [sys.getrefcount(t) for t in tensors]              # counted as before
            plan.made += [weakref.ref(tensors[k]) for k in range(len(tensors))
                          if now[k] - handed.count(id(tensors[k])) > counts[k]]
            if plan.made and plan.enter == plan.replay:
                plan.enter = plan.first_enter
            self._plans.setdefault(key, []).append(plan)
        self.stats.plans += 1
        self.stats.captures += 1
        self.stats.reason = reason
        _log.info("ta.compile(%s): captured plan %d (%s), %d kernel calls", self.fn.__qualname__,
                  self.stats.captures, reason, plan.plan.calls)
        return returned

    def _build(self, capture: _Capture, key, inputs, spec, outputs, tensors, generator) -> _Plan:
        recorder = capture.recorder
        modules = list(capture.modules.values())
        module_paths = _module_paths(module for module, _ in modules)
        grad_ins = [leaf for leaf in capture.leaves.values() if leaf.grad_in is not None]
        taken = {name for name, _ in inputs}
        for leaf in grad_ins:
            # Two layers' parameters may share a name ("weight"): every name is made unique.
            name = _unique(_identifier(f"grad_{_leaf_name(leaf, inputs)}"), taken, len(inputs))
            inputs.append((name, leaf.grad_in))
        generator_slot = _bind_generator(recorder, generator, capture.explicit)
        if generator_slot is not None:
            inputs.append((_unique("generator", taken), generator_slot))
        grad_out, returns = [], list(outputs)
        for leaf in capture.leaves.values():
            if leaf.made:
                continue            # a tensor made inside fn is another one at every call
            final = leaf.tensor._grad
            if final is None:
                grad_out.append((leaf, None))
            else:
                grad_out.append((leaf, len(returns)))
                returns.append(capture.see(final))
        external_names = {}
        for index, owner in capture.owners.items():
            external_names[index] = _unique(_identifier(f"p_{owner.name}" if owner.name else f"e{index}"),
                                            taken, index)
        if capture.derivatives:
            from .compiler.fuse_backward import mark_derivatives

            recorder.entries = mark_derivatives(recorder.entries, capture.derivatives)
        number = self.stats.captures + 1
        device = tensors[0].device if tensors else "cpu"
        pairs = zip(inputs[:len(tensors)], tensors, strict=True)
        described = [f"{name} {t.shape} {t.dtype}" for (name, _), t in pairs]
        title = (f"{self.fn.__qualname__}, plan {number}\ninputs {', '.join(described) or 'none'}; "
                 f"grad {'on' if key[-2] else 'off'}")
        name = _identifier(f"{getattr(self.fn, '__name__', 'fn')}_plan_{number}")
        plan = build_plan(recorder, name=name, title=title, inputs=inputs, returns=returns,
                          external_names=external_names, device=device, resolve=get_backend, fuse=self.fuse)
        # Tensors no module holds are held weakly (_Entry.tensor).
        strong = _module_parameters(module for module, _ in modules)
        holders = {index: owner if id(owner) in strong else weakref.ref(owner)
                   for index, owner in capture.owners.items()}
        bound = [(holders[index], (("attr", "_data"),), recorder.arrays[index]) for index in capture.owners]
        unowned = [recorder.arrays[i] for i, kind in enumerate(recorder.kinds)
                   if kind == "external" and i not in capture.owners]
        if unowned:
            bound += _optimizer_paths(unowned)
        bound += module_paths
        grad_guards = [(leaf, leaf.expect_none) for leaf in capture.leaves.values()
                       if leaf.expect_none is not None and not leaf.made]
        # A tensor the plan reads but takes no gradient for, or the reverse, must stay so.
        requires = [(holders[index], bool(t.requires_grad)) for index, t in capture.owners.items()]
        # The tensors that held an argument's array at the capture and that the plan read: by
        # an op, or as a leaf taking gradients (an optimizer reads its parameters' arrays
        # directly); a tensor held only by the caller (``h`` for ``step(h.detach())``) is not.
        aliases = [(t if id(t) in strong else weakref.ref(t), k) for t, k in capture.sharers.values()
                   if id(t) in capture.aliases or (t.requires_grad and t.node is None)]
        # An argument that is itself a parameter (``f(model.weight, x)``): the plan reads the
        # argument where the layer read its weight, so it holds while they are one tensor.
        optimizers = {id(holder): holder for holder, _, _ in bound if isinstance(holder, Optimizer)}
        persistent = strong | {id(p) for opt in optimizers.values() for p in opt.params}
        pinned = [(t if id(t) in strong else weakref.ref(t), k) for k, t in enumerate(tensors)
                  if id(t) in persistent]
        branches = [(opt, opt.branches()) for opt in optimizers.values() if opt.branches()]
        enter, entry_source = _entry(plan, f"enter_{name}", described, grad_ins, generator_slot, bound,
                                     modules, grad_guards, grad_out, spec, requires, aliases, branches,
                                     strong, pinned)
        shared = bool(aliases) or any(leaf.shares is not None or leaf.shares_argument is not None
                                      for leaf in capture.leaves.values())
        # Gradients the plan writes outlive the call by design (a step may set ``p.grad``
        # to a tensor it computed), and so does the graph that computed them.
        grads = _graph_of(leaf.tensor._grad for leaf in capture.leaves.values()
                          if not leaf.made and leaf.tensor._grad is not None)
        made = [ref for ref in capture.made if ref() is not None and id(ref()) not in grads]
        return _Plan(plan, enter, entry_source, bound, modules, requires, shared, branches, made)


def _sharers(t: Tensor, arguments: list) -> list:
    """The tensors other than the arguments that hold ``t``'s very array (``w`` for the
    argument ``w.detach()``): a plan captured so reads the argument where the function read
    them.  Looked for only when the array has holders besides ``t`` (CPython's reference
    count: ``t`` and this call's argument), which a fresh batch never has."""
    if sys.getrefcount(t._data) <= 2:
        return []
    skip = {id(a) for a in arguments}
    return [other for other in gc.get_referrers(t._data)
            if isinstance(other, Tensor) and id(other) not in skip and other._data is t._data]


def _static_key(value, name: str, fn):
    """A static argument's part of the plans' key: types and values all the way down, so
    values that compare equal but compute differently (1, 1.0 and True; 0.0 and -0.0; (2,)
    and (2.0,)) capture plans of their own; lists and dicts by their items."""
    if type(value) in (tuple, list):
        return (type(value), tuple(_static_key(v, name, fn) for v in value))
    if type(value) is dict:
        return (dict, tuple((_static_key(k, name, fn), _static_key(v, name, fn)) for k, v in value.items()))
    if isinstance(value, (float, np.floating, complex, np.complexfloating)):
        return (type(value), repr(value))
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"ta.compile({getattr(fn, '__qualname__', fn)}): static argument {name!r} is "
                        f"a {type(value).__name__}, which cannot key plans (not hashable); pass a "
                        f"tuple, a dict of such values, or a hashable object") from None
    return (type(value), value)


def _unique(name: str, taken: set, suffix=None) -> str:
    while name in taken:
        name = f"{name}_{suffix if suffix is not None else len(taken)}"
    taken.add(name)
    return name


def _leaf_name(leaf: _Leaf, inputs) -> str:
    if leaf.argument is not None:
        return inputs[leaf.argument][0]
    return leaf.tensor.name or "leaf"


# The names a plan gives its own values (t12 a buffer, c3 a constant, e5 a bound array, f7 a
# folded constant) and its helpers: an argument of such a name would hide them.
_PLAN_NAME = re.compile(r"[tcef]\d+|rebuild_view|(numpy|cpu|cuda)_\w+|fused_\w+")


def _argument_name(name: str) -> str:
    """A plan's parameter for the argument ``name``: its name, unless the plan's own names or
    a kernel's would be hidden by it (``def step(t3, f7)``, ``def step(x, mul)``)."""
    text = _identifier(name)
    if _PLAN_NAME.fullmatch(text) or text in get_backend("numpy").table():
        text += "_arg"
    return text


def _identifier(text: str) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in str(text))
    return name if name and not name[0].isdigit() else f"_{name}"


def _own_generator(recorder: Recorder, start, seeded) -> bool:
    """Whether the captured function seeded the engine's generator (``ta.manual_seed``) or
    drew from a generator it made and dropped (``np.random.default_rng(7)`` inside)."""
    if _random._generator is not seeded or _random.generator() is not start:
        return True
    # By index: a name bound to a constant would count as one more holder.
    constants = recorder.constants
    return any(isinstance(constants[i], np.random.Generator) and constants[i] is not start
               and held_only_by(constants, i) for i in range(len(constants)))


def _flat_tensors(value) -> list:
    if isinstance(value, Tensor):
        return [value]
    if type(value) in (tuple, list):
        return [t for v in value for t in _flat_tensors(v)]
    if type(value) is dict:
        return [t for v in value.values() for t in _flat_tensors(v)]
    return []


def _made_leaf(data, backend, grad) -> Tensor:
    """A leaf the function made with requires_grad, as a replay returns it: with its gradient."""
    t = Tensor._make(data, backend, True)
    if grad is not None:
        t._grad = Tensor._make(grad, backend, False)
    return t


def _returned(value, made: set, copies: dict | None = None):
    """The capture's result as replays return it: each tensor the function made is a new
    tensor over its array, without a graph (a leaf keeps requires_grad and its gradient);
    arguments, parameters and gradients are themselves.  The tensors made stay the
    function's: one it also kept (``state.h = out; return out``) outlives the call alone,
    and ``_Plan.first_enter`` sees it."""
    copies = {} if copies is None else copies        # one tensor returned twice: one copy
    if isinstance(value, Tensor):
        if id(value) not in made:
            return value
        if id(value) not in copies:
            leaf = value.node is None and value.requires_grad
            copies[id(value)] = copy = Tensor._make(value._data, value.backend, leaf)
            copy._grad = value._grad if leaf else None
        return copies[id(value)]
    if type(value) in (tuple, list):
        return type(value)(_returned(v, made, copies) for v in value)
    if type(value) is dict:
        return {k: _returned(v, made, copies) for k, v in value.items()}
    return value


def _output_spec(capture: _Capture, result):
    """(the structure of ``result`` with Tensors as ("tensor", index, backend), their slots)."""
    slots: list = []
    return _spec_of(result, capture, slots, {}), slots


def _spec_of(value, capture: _Capture, slots: list, memo: dict):
    # A function of its own, not a closure calling itself: that cycle would keep the capture,
    # and the tensors it read, alive until a garbage collection.
    if isinstance(value, Tensor):
        if id(value) not in memo:
            memo[id(value)] = _tensor_spec(value, capture, slots)
        return memo[id(value)]
    if value is None:
        return None
    if type(value) in (tuple, list):
        return (type(value), [_spec_of(v, capture, slots, memo) for v in value])
    if type(value) is dict:
        return (dict, {k: _spec_of(v, capture, slots, memo) for k, v in value.items()})
    raise CaptureError(f"ta.compile: the compiled function returned a {type(value).__name__}; "
                       f"return Tensors (in tuples, lists or dicts) or None: other values "
                       f"would be frozen into the plan")


def _tensor_spec(value: Tensor, capture: _Capture, slots: list):
    if value.requires_grad and value.node is not None and not capture.backward_called:
        raise CaptureError("ta.compile: the compiled function returned a tensor that requires "
                           "grad without calling backward; its outputs have no graph. Call "
                           "backward inside the function, or run it under ta.no_grad()")
    # What eager code returns, object for object: an argument, a tensor the function read (a
    # parameter), a leaf's gradient as the leaf holds it after the call, a leaf made inside
    # with its gradient; anything else a new tensor over the result.
    if id(value) in capture.arguments:
        return ("argument", capture.arguments[id(value)])
    leaf = next((leaf for leaf in capture.leaves.values() if leaf.tensor._grad is value), None)
    if leaf is not None and not leaf.made:
        return ("grad", leaf)
    slot = capture.see(value)
    if capture.owners.get(slot.index) is value:
        return ("object", value)
    slots.append(slot)
    if value.node is None and value.requires_grad:
        grad = value._grad
        if grad is not None:
            slots.append(capture.see(grad))
        return ("made", len(slots) - 1 - (grad is not None), value.backend, grad is not None)
    return ("tensor", len(slots) - 1, value.backend)


def compile(fn=None, *, static=(), max_plans: int = 8, fuse: bool = False):  # noqa: A001 - as torch.compile
    """Compile ``fn`` (Tensors and arrays in, Tensors out): the first call with a signature runs
    it eagerly and captures its kernel calls; later calls replay them.

    Args:
        fn: the function; call ``backward`` (and the optimizer's step) inside it, or run it
            under ``ta.no_grad()``: its outputs come back without a graph.
        static: parameter names (or positions) whose values key the plans (Python numbers,
            flags, objects); any other Python number argument is an error.
        max_plans: plans kept per function; beyond it new signatures run eagerly (warned once).
        fuse: replace chains of elementwise kernels by one kernel generated from their composed
            formulas (compiler/fuse.py; "cpu" and "cuda", equal to the unfused plan to float
            rounding, checked by ``ta.check.fused``; each plan keeps its chains,
            ``plan.chains``).  On "cpu" a chain of fewer than ``fuse.MIN_ELEMENTS`` (4096)
            elements, and in float64 a member calling exp/log/tanh/erf, stay unfused: there
            one Numba call costs more than the numpy calls it replaces.  Off by default: the shipped
            models' steps have few chains left to fuse (bench/compiled.py, bench/seq2seq.py).

    Returns:
        A ``Compiled`` callable with ``stats``, ``plans`` and ``source``.

    Example:
        >>> step = ta.compile(lambda a, b: (a * b + a).sum())
        >>> step(ta.Tensor([1.0, 2.0]), ta.Tensor([3.0, 4.0]))
    """
    if fn is None:
        return lambda f: Compiled(f, static, max_plans, fuse)
    return Compiled(fn, static, max_plans, fuse)

