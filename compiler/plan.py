"""A captured function as a plan: straight-line Python over arrays and kernels.

``build_plan`` turns a ``Recorder``'s entries into the source of one function, one line per
kernel call, for example::

    # ta.compile: step, plan 1; inputs x (32, 16) float64; 23 kernel calls
    def step_plan_1(x, y):
        # forward Linear
        t4 = matmul_nt(x, p_0_weight)
        t5 = add_(t4, p_0_bias)
        ...
        return (t9, t31, t32)

Kernels are module globals under their own names (``matmul_nt``), externals (arrays bound by
identity: parameters) under the names the engine gives (``p_0_weight``), other constants
``c3``.  A slot's name is dropped (``del t4``) right after its last use, so an intermediate
buffer is freed as soon as the plan no longer needs it, as eager frees it when its Tensor
dies.  The source is compiled under a readable file name registered with ``linecache``:
tracebacks and ``inspect`` show the plan's lines.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .capture import Call, Const, Recorder, Slot, View
from .source import compile_source

__all__ = ["Plan", "build_plan", "compile_source", "rebuild_view"]


def rebuild_view(source, offset: int, shape: tuple, strides: tuple, dtype):
    """The view of ``source``'s memory root at byte ``offset`` with this geometry: a view the
    captured code made outside the kernels, made again over this replay's buffer."""
    root = source
    while isinstance(root.base, np.ndarray):
        root = root.base
    return np.ndarray(shape, dtype, buffer=root, offset=offset, strides=strides)


@dataclass
class Plan:
    """One captured signature of a function, ready to replay.

    Attributes:
        name: the generated function's name (``step_plan_1``).
        source: its Python text; ``fn`` the compiled function, called with the input arrays
            (arguments, then gradients read at entry) and returning the ``returns`` arrays.
        externals: slot -> array bound by identity (read as it is at each replay).
        calls: how many kernel calls one replay makes.
    """

    name: str
    source: str
    fn: Callable
    filename: str
    externals: dict
    calls: int
    namespace: dict = field(repr=False, default_factory=dict)


def _kernel(device: str, kernel_name: str, resolve: Callable[[str], object]):
    table = resolve(device).table()
    fn = table[kernel_name]
    install = getattr(fn, "install", None)          # a formula kernel still waiting to be built
    return install() if install is not None else fn


class _Names:
    """Readable names for slots, constants and kernels in the generated source."""

    def __init__(self, recorder: Recorder, given: dict, device: str):
        self.recorder, self.given, self.device = recorder, given, device
        self.namespace: dict = {"rebuild_view": rebuild_view}
        self.kernels: dict[tuple[str, str], str] = {}

    def slot(self, slot: Slot) -> str:
        name = self.given.get(slot.index)
        if name is not None:
            return name
        if self.recorder.kinds[slot.index] == "external":
            name = f"e{slot.index}"
            self.given[slot.index] = name
            return name
        return f"t{slot.index}"

    def kernel(self, device: str, kernel_name: str, resolve) -> str:
        key = (device, kernel_name)
        if key not in self.kernels:
            name = kernel_name if device == self.device else f"{device}_{kernel_name}"
            self.kernels[key] = name
            self.namespace[name] = _kernel(device, kernel_name, resolve)
        return self.kernels[key]

    def _external(self, value) -> bool:
        return isinstance(value, Slot) and self.recorder.kinds[value.index] == "external"

    def target(self, outs) -> str | None:
        """What a call's result is assigned to: an external returned as it is (an in-place
        kernel on a parameter, ``asarray`` of a host array) is bound by identity, never
        reassigned, so it becomes ``_``; None when nothing needs assigning."""
        if outs is None or self._external(outs):
            return None
        if type(outs) in (list, tuple):
            parts = ["_" if self._external(o) else self.value(o) for o in outs]
            return f"({', '.join(parts)},)" if len(parts) == 1 else f"({', '.join(parts)})"
        return self.value(outs)

    def value(self, value) -> str:
        if isinstance(value, Slot):
            return self.slot(value)
        if isinstance(value, Const):
            name = f"c{value.index}"
            self.namespace[name] = self.recorder.constants[value.index]
            return name
        if type(value) is list:
            return "[" + ", ".join(self.value(v) for v in value) + "]"
        if type(value) is tuple:
            inner = ", ".join(self.value(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if type(value) is float and not math.isfinite(value):
            return f'float("{value}")'
        if value is Ellipsis:
            return "..."
        return repr(value)


def _slots(value, found: list) -> list:
    if isinstance(value, Slot):
        found.append(value.index)
    elif type(value) in (list, tuple):
        for v in value:
            _slots(v, found)
    elif type(value) is dict:
        for v in value.values():
            _slots(v, found)
    return found


def _last_uses(entries: list, keep: set) -> dict[int, list[int]]:
    """entry index -> the slots whose last use it is (not counting those in ``keep``)."""
    last: dict[int, int] = {}
    for i, entry in enumerate(entries):
        used = _slots(entry.args, []) + _slots(entry.kwargs, []) + _slots(entry.outs, []) \
            if isinstance(entry, Call) else [entry.slot.index, entry.source.index]
        for s in used:
            last[s] = i
    dead: dict[int, list[int]] = {}
    for s, i in last.items():
        if s not in keep:
            dead.setdefault(i, []).append(s)
    return dead


def build_plan(recorder: Recorder, *, name: str, title: str, inputs: list[tuple[str, Slot]],
               returns: list[Slot], external_names: dict[int, str], device: str,
               resolve: Callable[[str], object], fuse: bool = False) -> Plan:
    """The generated replay of ``recorder``'s entries.

    Args:
        name: the function's name (a Python identifier); title: the header comment.
        inputs: (parameter name, slot) bound at each call, in order.
        returns: the slots the function returns, in order (outputs, then gradients).
        external_names: slot index -> name for externals the engine can name (parameters).
        device: the device whose kernels go by their bare names.
        resolve: device name -> its Backend (the unwrapped table is read from it).
        fuse: replace chains of elementwise formula kernels on the "cpu" and "cuda" devices
            by one fused kernel each (fuse.py); the "numpy" device always replays unfused.
    """
    given = {slot.index: arg for arg, slot in inputs}
    given.update(external_names)
    names = _Names(recorder, given, device)
    keep = {s.index for _, s in inputs} | {s.index for s in returns}
    keep |= {i for i, kind in enumerate(recorder.kinds) if kind == "external"}
    entries = recorder.entries
    if fuse:
        from .fuse import fuse as fused_entries

        entries = fused_entries(recorder, resolve, keep={s.index for s in returns})
    dead = _last_uses(entries, keep)

    body: list[str] = []
    tag = None
    calls = 0
    for i, entry in enumerate(entries):
        if entry.tag != tag:
            tag = entry.tag
            if tag:
                body.append("    # " + " ".join(str(part) for part in tag if part))
        if isinstance(entry, View):
            dtype = names.value(Const(_dtype(recorder, entry.dtype)))
            geometry = f"{entry.offset}, {entry.shape!r}, {entry.strides!r}, {dtype}"
            body.append(f"    {names.slot(entry.slot)} = rebuild_view({names.slot(entry.source)}, "
                        f"{geometry})")
        else:
            calls += 1
            kernel = names.kernel(entry.device, entry.kernel, resolve)
            args = [names.value(a) for a in entry.args]
            args += [f"{k}={names.value(v)}" for k, v in entry.kwargs.items()]
            call = f"{kernel}({', '.join(args)})"
            target = names.target(entry.outs)
            body.append(f"    {call}" if target is None else f"    {target} = {call}")
        if i in dead:
            body.append("    del " + ", ".join(names.slot(Slot(s)) for s in sorted(dead[i])))
    body.append("    return (" + "".join(names.slot(s) + ", " for s in returns).rstrip(" ") + ")")

    externals = {index: recorder.arrays[index] for index, kind in enumerate(recorder.kinds)
                 if kind == "external"}
    for index, array in externals.items():
        names.namespace[names.slot(Slot(index))] = array
    header = [f"# ta.compile: {line}" for line in title.splitlines()]
    header.append(f"# {calls} kernel calls")
    params = ", ".join(arg for arg, _ in inputs)
    source = "\n".join([*header, f"def {name}({params}):", *body]) + "\n"
    namespace = names.namespace
    filename = compile_source(source, f"<ta.compile {name}>", namespace)
    return Plan(name, source, namespace[name], filename, externals, calls, namespace)


def _dtype(recorder: Recorder, dtype) -> int:
    return recorder.constant(np.dtype(dtype)).index
