"""``ta.compile``: run a function's kernels again without the Python around them.

The first call with a new signature runs ``fn`` eagerly and records every kernel call its
ops, backward and updates make (``compiler/capture.py``); the record becomes straight-line
Python over arrays (``compiler/plan.py``).  Later calls with that signature run only that:
no Tensor, no graph, no version check.

    >>> step = ta.compile(lambda x, y: loss_and_grads(model, x, y))
    >>> loss = step(x, y)          # captures (eager)
    >>> loss = step(x2, y2)        # replays
    >>> print(step.source)

The signature is the shapes, dtypes, devices and requires_grad of the Tensor and array
arguments, the values of the arguments declared ``static``, grad mode and the default float.
A plan also guards on the identity of the arrays it reads that are no argument (the
parameters: ``load_state_dict`` or ``to(device)`` replaces them, and the plan is captured
again) and on whether each gradient it accumulates into was None when the capture began.

Nothing is silently frozen: reading a value computed from the inputs on the host while
capturing (``item()``, ``numpy()``, ``float(t)``, ``bool(t)``, ``.data``) raises
``CaptureError`` naming the line, and a Python number argument must be declared static.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import traceback
import warnings
from dataclasses import dataclass, field

import numpy as np

from . import autograd, tensor
from . import compiler as _compiler
from .autograd import current_scope, is_grad_enabled
from .compiler import get_backend
from .compiler.capture import CaptureError, Recorder, recording_all
from .compiler.plan import build_plan
from .tensor import Tensor

__all__ = ["compile", "Compiled", "CompileStats", "CaptureError"]

_log = logging.getLogger("tinygrad_attn.compile")
# The engine's frames and the compiler's (installed inside the package, at the root here).
_PACKAGE_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (autograd, _compiler))
# Backends are process-wide: one capture at a time (other threads' eager calls pass through).
_CAPTURE_LOCK = threading.RLock()

# Ops whose host reads of their inputs only check them (and raise) until they are kernels:
# op name -> whether this op's reads are pure checks.  A cross-entropy without ignore_index
# also counts its rows on the host, but the count is the shape's.
_CHECK_READS = {
    "Embedding": lambda op: True,
    "CrossEntropy": lambda op: op.ignore_index is None,
    "NLLLoss": lambda op: op.ignore_index is None,
}


def _user_line() -> str:
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIRS):
            return f"{frame.filename}:{frame.lineno}: {frame.line}"
    return "unknown"


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


class _Capture:
    """The engine's side of one capture: ``autograd._state.capture`` while ``fn`` runs."""

    def __init__(self, recorder: Recorder, arguments: list[Tensor]):
        self.recorder = recorder
        self.arguments = {id(t): k for k, t in enumerate(arguments)}
        self.ops: list = []
        self.owners: dict[int, Tensor] = {}       # external slot -> the tensor it is the array of
        self.leaves: dict[int, _Leaf] = {}
        self.backward_called = False
        self.retained = False

    def refuse(self, what: str):
        raise CaptureError(f"ta.compile: {what} while capturing, at {_user_line()}: the plan cannot "
                           f"replay what is done with the raw array. Use tensor ops (and kernels) "
                           f"inside a compiled function, or run it eagerly")

    def on_read(self, what: str):
        if self.ops and (check := _CHECK_READS.get(self.ops[-1].name)) is not None and check(self.ops[-1]):
            return
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

    def leave_op(self) -> None:
        self.ops.pop()
        self.recorder.tag = ()

    def see(self, t: Tensor):
        """The slot of ``t``'s array; an unknown one is an external owned by ``t``."""
        recorder = self.recorder
        slot = recorder.slot_of(t._data)
        if slot is None:
            slot = recorder.external(t._data)
            if recorder.kinds[slot.index] == "external":
                self.owners[slot.index] = t
        return slot

    def backward_of(self, node) -> None:
        self.backward_called = True
        self.recorder.tag = ("backward", node.op.name, node.scope)

    def backward_done(self, retain_graph: bool) -> None:
        self.retained = self.retained or retain_graph
        self.recorder.tag = ("gradients",)

    def _leaf(self, t: Tensor, read: bool) -> _Leaf:
        leaf = self.leaves.get(id(t))
        if leaf is None:
            if t.node is not None:
                raise CaptureError(f"ta.compile: the gradient of a non-leaf tensor (retain_grad) is "
                                   f"used while capturing, at {_user_line()}; a plan writes only "
                                   f"leaves' gradients")
            leaf = _Leaf(t, self.arguments.get(id(t)), (t._grad is None) if read else None)
            if read and t._grad is not None:
                leaf.grad_in = self.recorder.input(t._grad._data)
            self.leaves[id(t)] = leaf
        return leaf

    def grad_read(self, t: Tensor) -> None:
        self._leaf(t, True)

    def grad_set(self, t: Tensor) -> None:
        self._leaf(t, False)


@dataclass
class _Plan:
    plan: object                          # compiler.plan.Plan
    arguments: int                        # how many argument arrays come first
    grad_ins: list                        # _Leaf whose gradient at entry is an input
    guards: list                          # (tensor, array): the tensor still holds that array
    grad_guards: list                     # (_Leaf, expect None)
    grad_out: list                        # (_Leaf, index into the results or None)
    output: object                        # the structure of fn's result
    devices: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        return self.plan.source


def _leaf_tensor(leaf: _Leaf, tensors: list[Tensor]) -> Tensor:
    return leaf.tensor if leaf.argument is None else tensors[leaf.argument]


class Compiled:
    """A compiled function: call it like ``fn``.  ``stats``, ``plans`` (each with
    ``source``), ``source`` (the latest plan's)."""

    def __init__(self, fn, static=(), max_plans: int = 8):
        self.fn = fn
        self.max_plans = max_plans
        self.stats = CompileStats()
        self.enabled = os.environ.get("TINYGRAD_ATTN_COMPILE", "1") != "0"
        self._signature = inspect.signature(fn)
        self._static = frozenset(static)
        unknown = {s for s in self._static if isinstance(s, str)} - set(self._signature.parameters)
        if unknown:
            raise TypeError(f"ta.compile: static names {sorted(unknown)} are not parameters of "
                            f"{fn.__qualname__}{self._signature}")
        self._plans: dict[tuple, list[_Plan]] = {}
        self._warned = False
        self.__wrapped__ = fn

    @property
    def plans(self) -> list:
        return [p.plan for plans in self._plans.values() for p in plans]

    @property
    def source(self) -> str:
        plans = self.plans
        return plans[-1].source if plans else ""

    def _arguments(self, args, kwargs):
        """(call args, call kwargs, the tensors in order, their names, the key)."""
        bound = self._signature.bind(*args, **kwargs)
        tensors, names, key = [], [], []

        def argument(name, value):
            if isinstance(value, np.ndarray):
                value = Tensor(value)              # what eager code would make of it
            if isinstance(value, Tensor):
                tensors.append(value)
                names.append(name)
                key.append((value.shape, value.dtype, value.device, value.requires_grad))
            elif value is None:
                key.append(None)
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
        for position, (name, value) in enumerate(bound.arguments.items()):
            kind = parameters[name].kind
            if name in self._static or position in self._static:
                key.append(("static", name, value))
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
        if not self.enabled or autograd._state.capture is not None:
            # Inside another capture this function's kernels are that plan's.
            if not self.enabled:
                self.stats.eager_calls += 1
            return self.fn(*args, **kwargs)
        call_args, call_kwargs, tensors, names, key = self._arguments(args, kwargs)
        candidates = self._plans.get(key)
        reason = "new signature"
        if candidates:
            for plan in candidates:
                if all(t._data is array for t, array in plan.guards) and all(
                        (_leaf_tensor(leaf, tensors)._grad is None) == none
                        for leaf, none in plan.grad_guards):
                    self.stats.replays += 1
                    return _replay(plan, tensors)
            replaced = [p for p in candidates if not all(t._data is a for t, a in p.guards)]
            if replaced:
                # A parameter was replaced (load_state_dict, to(device)): that plan is dead.
                candidates.remove(replaced[0])
                self.stats.plans -= 1
                reason = "guard: an array the plan reads was replaced"
            else:
                reason = "guard: a gradient's None-ness at entry changed"
        if self.stats.plans >= self.max_plans:
            if not self._warned:
                self._warned = True
                warnings.warn(f"ta.compile({self.fn.__qualname__}): {self.max_plans} plans captured "
                              f"already (max_plans); running eagerly from now on for new signatures "
                              f"({reason}). Pad shapes to fewer sizes, or declare fewer values static",
                              UserWarning, stacklevel=2)
            self.stats.eager_calls += 1
            return self.fn(*call_args, **call_kwargs)
        return self._capture(key, reason, call_args, call_kwargs, tensors, names)

    def _capture(self, key, reason, call_args, call_kwargs, tensors, names):
        with _CAPTURE_LOCK:
            recorder = Recorder()
            capture = _Capture(recorder, tensors)
            recorder.on_read = capture.on_read
            inputs = []
            for name, t in zip(names, tensors, strict=True):
                if recorder.slot_of(t._data) is not None:
                    raise CaptureError(f"ta.compile({self.fn.__qualname__}): argument {name!r} shares "
                                       f"its array with another argument; pass distinct tensors")
                inputs.append((_identifier(name), recorder.input(t._data)))
            with recording_all(recorder):
                autograd._state.capture = capture
                try:
                    result = self.fn(*call_args, **call_kwargs)
                    spec, outputs = _output_spec(capture, result)
                finally:
                    autograd._state.capture = None
            plan = self._build(capture, key, inputs, spec, outputs, tensors)
        self._plans.setdefault(key, []).append(plan)
        self.stats.plans += 1
        self.stats.captures += 1
        self.stats.reason = reason
        _log.info("ta.compile(%s): captured plan %d (%s), %d kernel calls", self.fn.__qualname__,
                  self.stats.captures, reason, plan.plan.calls)
        return result

    def _build(self, capture: _Capture, key, inputs, spec, outputs, tensors) -> _Plan:
        recorder = capture.recorder
        if capture.retained:
            raise CaptureError(f"ta.compile({self.fn.__qualname__}): backward(retain_graph=True) "
                               f"inside a compiled function is not supported")
        grad_ins = [leaf for leaf in capture.leaves.values() if leaf.grad_in is not None]
        for leaf in grad_ins:
            inputs.append((_identifier(f"grad_{_leaf_name(leaf, inputs)}"), leaf.grad_in))
        grad_out, returns = [], list(outputs)
        for leaf in capture.leaves.values():
            final = leaf.tensor._grad
            if final is None:
                grad_out.append((leaf, None))
            else:
                grad_out.append((leaf, len(returns)))
                returns.append(capture.see(final))
        external_names = {}
        taken = {name for name, _ in inputs}
        for index, owner in capture.owners.items():
            name = _identifier(f"p_{owner.name}" if owner.name else f"e{index}")
            while name in taken:
                name = f"{name}_{index}"
            taken.add(name)
            external_names[index] = name
        number = self.stats.captures + 1
        device = tensors[0].device if tensors else "cpu"
        pairs = zip(inputs[:len(tensors)], tensors, strict=True)
        described = ", ".join(f"{name} {t.shape} {t.dtype}" for (name, _), t in pairs)
        title = (f"{self.fn.__qualname__}, plan {number}\ninputs {described or 'none'}; grad "
                 f"{'on' if key[-2] else 'off'}")
        plan = build_plan(recorder, name=_identifier(f"{getattr(self.fn, '__name__', 'fn')}_plan_{number}"),
                          title=title, inputs=inputs, returns=returns, external_names=external_names,
                          device=device, resolve=get_backend)
        guards = [(owner, recorder.arrays[index]) for index, owner in capture.owners.items()]
        grad_guards = [(leaf, leaf.expect_none) for leaf in capture.leaves.values()
                       if leaf.expect_none is not None]
        return _Plan(plan, len(tensors), grad_ins, guards, grad_guards, grad_out, spec)


def _leaf_name(leaf: _Leaf, inputs) -> str:
    if leaf.argument is not None:
        return inputs[leaf.argument][0]
    return leaf.tensor.name or "leaf"


def _identifier(text: str) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in str(text))
    return name if name and not name[0].isdigit() else f"_{name}"


def _output_spec(capture: _Capture, result):
    """(the structure of ``result`` with Tensors as ("tensor", index, backend), their slots)."""
    slots: list = []

    def walk(value):
        if isinstance(value, Tensor):
            if value.requires_grad and value.node is not None and not capture.backward_called:
                raise CaptureError("ta.compile: the compiled function returned a tensor that requires "
                                   "grad without calling backward; its outputs have no graph. Call "
                                   "backward inside the function, or run it under ta.no_grad()")
            slots.append(capture.see(value))
            return ("tensor", len(slots) - 1, value.backend)
        if value is None:
            return None
        if type(value) in (tuple, list):
            return (type(value), [walk(v) for v in value])
        if type(value) is dict:
            return (dict, {k: walk(v) for k, v in value.items()})
        raise CaptureError(f"ta.compile: the compiled function returned a {type(value).__name__}; "
                           f"return Tensors (in tuples, lists or dicts) or None: other values "
                           f"would be frozen into the plan")

    return walk(result), slots


def _rebuild(spec, arrays):
    if spec is None:
        return None
    kind, inner = spec[0], spec[1]
    if kind == "tensor":
        return Tensor._make(arrays[inner], spec[2], False)
    if kind is dict:
        return {k: _rebuild(v, arrays) for k, v in inner.items()}
    return kind(_rebuild(v, arrays) for v in inner)


def _replay(plan: _Plan, tensors: list[Tensor]):
    arrays = [t._data for t in tensors]
    for leaf in plan.grad_ins:
        arrays.append(_leaf_tensor(leaf, tensors)._grad._data)
    results = plan.plan.fn(*arrays)
    for leaf, index in plan.grad_out:
        target = _leaf_tensor(leaf, tensors)
        target._grad = None if index is None else Tensor._make(results[index], target.backend, False)
    return _rebuild(plan.output, results)


def compile(fn=None, *, static=(), max_plans: int = 8):  # noqa: A001 - ta.compile, as torch.compile
    """Compile ``fn`` (Tensors and arrays in, Tensors out): the first call with a signature runs
    it eagerly and captures its kernel calls; later calls replay them.

    Args:
        fn: the function; call ``backward`` (and the optimizer's step) inside it, or run it
            under ``ta.no_grad()``: its outputs come back without a graph.
        static: parameter names (or positions) whose values key the plans (Python numbers,
            flags, objects); any other Python number argument is an error.
        max_plans: plans kept per function; beyond it new signatures run eagerly (warned once).

    Returns:
        A ``Compiled`` callable with ``stats``, ``plans`` and ``source``.

    Example:
        >>> step = ta.compile(lambda a, b: (a * b + a).sum())
        >>> step(ta.Tensor([1.0, 2.0]), ta.Tensor([3.0, 4.0]))
    """
    if fn is None:
        return lambda f: Compiled(f, static, max_plans)
    return Compiled(fn, static, max_plans)

