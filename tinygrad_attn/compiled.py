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

import inspect
import logging
import os
import re
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass

import numpy as np

from . import autograd, tensor
from . import random as _random
from .autograd import is_grad_enabled
from .compile_capture import Capture, Leaf, bind_generator, graph_of, own_generator, tensors_sharing
from .compile_entry import as_returned, flat_tensors, make_entry, output_spec
from .compile_guards import (
    MISS,
    GuardedPlan,
    module_parameters,
    module_paths_of,
    optimizer_paths,
    static_key,
)
from .compiler import get_backend
from .compiler.capture import Recorder, recording_all
from .compiler.plan import build_plan
from .optim import Optimizer
from .tensor import Tensor

__all__ = ["Compiled", "CompileStats"]

_log = logging.getLogger("tinygrad_attn.compile")
# Backends are process-wide: one capture at a time (other threads' eager calls pass through).
_CAPTURE_LOCK = threading.RLock()


@dataclass
class CompileStats:
    """What a compiled function did: plans held, captures made, replays run, eager calls
    (compile switched off or past the cap), and why the last capture happened."""

    plans: int = 0
    captures: int = 0
    replays: int = 0
    eager_calls: int = 0
    reason: str = ""


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
        self._plans: dict[tuple, list[GuardedPlan]] = {}
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
                key.append(static_key(value, self._names[position], self.fn))
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
                key.append(("static", name, static_key(value, name, self.fn)))
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
                if result is not MISS:
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
                if result is not MISS:
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
                if result is not MISS:
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
                          f"already (max_plans); running eagerly from now on for calls no plan "
                          f"replays ({reason}). Pad shapes to fewer sizes, or declare fewer values "
                          f"static",
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
            capture = Capture(recorder, tensors, self.fuse)
            recorder.on_read = capture.on_read
            inputs = []
            taken = {"_"}        # the plan assigns results it never reads to _: not an argument
            for k, (name, t) in enumerate(zip(names, tensors, strict=True)):
                capture.sharers.update((id(other), (other, k)) for other in tensors_sharing(t, tensors))
                inputs.append((_unique(_argument_name(name), taken), recorder.input(t._data)))
                capture.argument_slots[inputs[-1][1].index] = k
            generator, seeded = _random.generator(), _random._generator
            counts = [sys.getrefcount(t) for t in tensors]
            with recording_all(recorder):
                autograd.state.capture = capture
                try:
                    result = self.fn(*call_args, **call_kwargs)
                    spec, outputs = output_spec(capture, result)
                finally:
                    autograd.state.capture = None
            if own_generator(recorder, generator, seeded):
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
            # must not find this call's own tensors alive as if kept (GuardedPlan.first_enter).
            returned = as_returned(result, made)
            del result
            # An argument the function kept (``state["prev"] = x``): more references than it
            # came with, besides those handed back; the plan would read that batch for good.
            capture.leaves.clear()
            del spec                        # its ("grad", leaf) entries hold the leaves too
            handed = [id(t) for t in flat_tensors(returned)]
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

    def _build(self, capture: Capture, key, inputs, spec, outputs, tensors, generator) -> GuardedPlan:
        recorder = capture.recorder
        modules = list(capture.modules.values())
        module_paths = module_paths_of(module for module, _ in modules)
        grad_ins = [leaf for leaf in capture.leaves.values() if leaf.grad_in is not None]
        taken = {name for name, _ in inputs}
        for leaf in grad_ins:
            # Two layers' parameters may share a name ("weight"): every name is made unique.
            name = _unique(_identifier(f"grad_{_leaf_name(leaf, inputs)}"), taken, len(inputs))
            inputs.append((name, leaf.grad_in))
        generator_slot = bind_generator(recorder, generator, capture.explicit)
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
        strong = module_parameters(module for module, _ in modules)
        holders = {index: owner if id(owner) in strong else weakref.ref(owner)
                   for index, owner in capture.owners.items()}
        bound = [(holders[index], (("attr", "_data"),), recorder.arrays[index]) for index in capture.owners]
        unowned = [recorder.arrays[i] for i, kind in enumerate(recorder.kinds)
                   if kind == "external" and i not in capture.owners]
        if unowned:
            bound += optimizer_paths(unowned)
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
        enter, entry_source = make_entry(plan, f"enter_{name}", described, grad_ins, generator_slot, bound,
                                     modules, grad_guards, grad_out, spec, requires, aliases, branches,
                                     strong, pinned)
        shared = bool(aliases) or any(leaf.shares is not None or leaf.shares_argument is not None
                                      for leaf in capture.leaves.values())
        # Gradients the plan writes outlive the call by design (a step may set ``p.grad``
        # to a tensor it computed), and so does the graph that computed them.
        grads = graph_of(leaf.tensor._grad for leaf in capture.leaves.values()
                          if not leaf.made and leaf.tensor._grad is not None)
        made = [ref for ref in capture.made if ref() is not None and id(ref()) not in grads]
        return GuardedPlan(plan, enter, entry_source, bound, modules, requires, shared, branches, made)


def _unique(name: str, taken: set, suffix=None) -> str:
    while name in taken:
        name = f"{name}_{suffix if suffix is not None else len(taken)}"
    taken.add(name)
    return name


def _leaf_name(leaf: Leaf, inputs) -> str:
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

