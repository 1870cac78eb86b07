"""A ``ta.compile`` plan's entry (``compiled.py``): the generated function that checks the
guards, binds the arguments' arrays, runs the plan, writes the gradients and returns what
eager code would (``_Entry``, ``make_entry``), and the description of a function's result it is
generated from (``output_spec``)."""

from __future__ import annotations

import weakref
from collections.abc import Callable

from . import random as _random
from .compile_capture import Capture, Leaf
from .compile_guards import MISS, dereference, path_text
from .compiler.capture import CaptureError
from .compiler.source import compile_source
from .optim import Optimizer
from .tensor import Tensor

__all__ = ["as_returned", "flat_tensors", "make_entry", "output_spec"]


class _Entry:
    """The text of a plan's entry: one generated function that checks the guards, binds the
    arguments' arrays, runs the plan, writes the leaves' gradients and wraps the outputs.
    Generated rather than looped over lists, because it is what a replay of a small step
    pays on top of its kernels: with the key from positional arguments (``_fast_key``) a
    call costs ~1.3 us beyond its kernels, against ~6 us binding the signature and looping."""

    def __init__(self, count: int, strong: set):
        self.params = [f"t{k}" for k in range(count)]
        self.namespace: dict = {"MISS": MISS}
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

    def leaf(self, leaf: Leaf) -> str:
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


def make_entry(plan, name: str, described: list[str], grad_ins: list, generator_slot, bound: list,
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
        local = entry.tensor(dereference(sharer), alive=False)
        if type(sharer) is weakref.ref:
            entry.guards.append(f"({local} is not None and {local}._data is not {entry.params[k]}._data)")
        else:
            entry.guards.append(f"{local}._data is not {entry.params[k]}._data")
    for param, k in pinned:
        entry.guards.append(f"{entry.params[k]} is not {entry.tensor(dereference(param))}")
    for holder, path, array in bound:
        if isinstance(holder, (Tensor, weakref.ref)):
            text = entry.tensor(dereference(holder))
        else:
            text = entry.name("optimizer" if isinstance(holder, Optimizer) else "module", holder)
        entry.guards.append(f"{text}{path_text(path)} is not {entry.name('array', array)}")
    for module, flag in modules:
        entry.guards.append(f"{'not ' if flag else ''}{entry.name('module', module)}.training")
    for owner, flag in requires:
        entry.guards.append(f"{'not ' if flag else ''}{entry.tensor(dereference(owner))}.requires_grad")
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


def _made_leaf(data, backend, grad) -> Tensor:
    """A leaf the function made with requires_grad, as a replay returns it: with its gradient."""
    t = Tensor._make(data, backend, True)
    if grad is not None:
        t._grad = Tensor._make(grad, backend, False)
    return t


def as_returned(value, made: set, copies: dict | None = None):
    """The capture's result as replays return it: each tensor the function made is a new
    tensor over its array, without a graph (a leaf keeps requires_grad and its gradient);
    arguments, parameters and gradients are themselves.  The tensors made stay the
    function's: one it also kept (``state.h = out; return out``) outlives the call alone,
    and ``GuardedPlan.first_enter`` sees it."""
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
        return type(value)(as_returned(v, made, copies) for v in value)
    if type(value) is dict:
        return {k: as_returned(v, made, copies) for k, v in value.items()}
    return value


def flat_tensors(value) -> list:
    if isinstance(value, Tensor):
        return [value]
    if type(value) in (tuple, list):
        return [t for v in value for t in flat_tensors(v)]
    if type(value) is dict:
        return [t for v in value.values() for t in flat_tensors(v)]
    return []


def output_spec(capture: Capture, result):
    """(the structure of ``result`` with Tensors as ("tensor", index, backend), their slots)."""
    slots: list = []
    return _spec_of(result, capture, slots, {}), slots


def _spec_of(value, capture: Capture, slots: list, memo: dict):
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


def _tensor_spec(value: Tensor, capture: Capture, slots: list):
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

