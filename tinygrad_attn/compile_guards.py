"""What a ``ta.compile`` plan checks before it replays (``compiled.py``): the plan with its
guards (``GuardedPlan``: identities it bound, modes, optimizers' branches, tensors held weakly,
tensors its capture made that must not outlive the call), how the guards find what they
hold (modules' parameters and children, optimizers' state), and a static argument's part
of the plans' key."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .optim import Optimizer

__all__ = ["MISS", "GuardedPlan", "dereference", "module_parameters", "module_paths_of", "optimizer_paths",
           "path_text", "static_key"]

# What a plan's entry answers when one of its guards fails (fn may return None).
MISS = object()


@dataclass
class GuardedPlan:
    """A captured plan and its entry, with what its guards hold: ``enter`` replays it or
    answers ``MISS``; ``alive``, ``gone`` and ``why_not`` say why a miss happened."""

    plan: object                          # compiler.plan.Plan
    enter: Callable                       # enter(*argument tensors) -> fn's result, or MISS
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
                return MISS
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
        if any(bool(dereference(t).requires_grad) != flag for t, flag in self.requires):
            return "guard: a tensor's requires_grad changed"
        if any(opt.branches() != value for opt, value in self.branches):
            return "guard: an optimizer setting that chooses its update's kernels (momentum) changed"
        if self.shared:
            return "guard: a gradient's None-ness at entry, or an array shared at the capture, changed"
        return "guard: a gradient's None-ness at entry changed"


def dereference(holder):
    return holder() if type(holder) is weakref.ref else holder


def _follow(holder, path: tuple):
    holder = dereference(holder)
    if holder is None:
        return MISS                       # a weakly held tensor, gone: no array is it
    for kind, key in path:
        holder = getattr(holder, key) if kind == "attr" else holder[key]
    return holder


def path_text(path: tuple) -> str:
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


def module_paths_of(modules) -> list:
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


def module_parameters(modules) -> set[int]:
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


def optimizer_paths(arrays: list) -> list:
    """(optimizer, path, array) for each of ``arrays`` that a live optimizer holds (its state,
    its settings): arrays the plan binds by identity that no tensor owns.  The optimizers
    are found once per capture by their type among the live objects: any optimizer whose
    update the plan recorded holds them, however the function reached it.  Their state's
    None entries are held to None the same way (optimizer, path, None): a momentum buffer
    made after the capture (``opt.momentum = 0.9``) takes another update than the one
    recorded without it.  The containers on the way are held by identity first (a state
    ``load_state_dict`` replaced, or left None, misses before its arrays are looked up)."""
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
    containers, held = [], set()
    for obj, path, _ in found:
        for end in range(2, len(path)):
            prefix = path[:end]
            if (id(obj), prefix) not in held:
                held.add((id(obj), prefix))
                containers.append((obj, prefix, _follow(obj, prefix)))
    return containers + found


def static_key(value, name: str, fn):
    """A static argument's part of the plans' key: types and values all the way down, so
    values that compare equal but compute differently (1, 1.0 and True; 0.0 and -0.0; (2,)
    and (2.0,)) capture plans of their own; lists and dicts by their items."""
    if type(value) in (tuple, list):
        return (type(value), tuple(static_key(v, name, fn) for v in value))
    if type(value) is dict:
        return (dict, tuple((static_key(k, name, fn), static_key(v, name, fn)) for k, v in value.items()))
    if isinstance(value, (float, np.floating, complex, np.complexfloating)):
        return (type(value), repr(value))
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"ta.compile({getattr(fn, '__qualname__', fn)}): static argument {name!r} is "
                        f"a {type(value).__name__}, which cannot key plans (not hashable); pass a "
                        f"tuple, a dict of such values, or a hashable object") from None
    return (type(value), value)

