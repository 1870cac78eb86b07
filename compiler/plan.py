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
tracebacks and ``inspect`` show the plan's lines.  Before the source is written, ``peepholes``
drops the calls that provably change nothing (a same-shape ``sum_to`` or ``reshape``) and
hands a dying buffer to the gradient that would have copied it, and ``fold.py`` computes the
calls that read only constants once (backward's seed ``full((), 1.0)``), named ``f7``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from .capture import Call, Const, Recorder, Slot, View, slot_indices
from .fold import describe, fold_constants, held_by_plan_only
from .source import compile_source

__all__ = ["Plan", "build_plan", "peepholes", "rebuild_view", "shape_no_op"]


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
        entries: the Calls and Views the source replays, in order (after fusion and the
            peepholes); a fused call is a ``fuse.FusedCall`` carrying its chain.
        lines: entry position -> its line in ``source`` (1-based).
        names: slot -> its name in ``source`` (arguments, bound arrays, intermediates).
        inputs, returns: the argument slots and the returned slots, in order.
        device: the device whose kernels go by their bare names; another device's kernel
            ``k`` is ``{device}_k`` in the source.
        constants: the slots folded into arrays computed once (fold.py), which the source
            reads as ``f<slot>`` and its header describes.
    """

    name: str
    source: str
    fn: Callable
    filename: str
    externals: dict
    calls: int
    namespace: dict = field(repr=False, default_factory=dict)
    entries: tuple = field(repr=False, default=())
    lines: tuple = field(repr=False, default=())
    names: dict = field(repr=False, default_factory=dict)
    inputs: tuple = ()
    returns: tuple = ()
    device: str = "cpu"
    constants: tuple = ()

    @property
    def chains(self) -> list:
        """The chains of the plan's fused calls, each once, in the order they first run (a
        chain whose backward is its composed derivative appears at its forward call, or at
        its first derivative call where the forward stayed unfused)."""
        found: dict = {}
        for e in self.entries:
            chain = getattr(e, "chain", None)
            if chain is not None:
                found.setdefault(chain.key(), chain)
        return list(found.values())

    def kernel_name(self, entry) -> str:
        """A call's kernel as the source names it."""
        return entry.kernel if entry.device == self.device else f"{entry.device}_{entry.kernel}"


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
        reassigned, so it becomes ``_``, as does a None among a kernel's results (a layer
        norm's weight gradient when it has no weight); None when nothing needs assigning."""
        if outs is None or self._external(outs):
            return None
        if type(outs) in (list, tuple):
            parts = ["_" if o is None or self._external(o) else self.value(o) for o in outs]
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


def _last_uses(entries: list, keep: set) -> dict[int, list[int]]:
    """entry index -> the slots whose last use it is (not counting those in ``keep``)."""
    last: dict[int, int] = {}
    for i, entry in enumerate(entries):
        for s in _used(entry):
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

        # Calls that change nothing go first: left in, they would read a member's result
        # from outside its chain and stop the chain there.
        entries = fused_entries(recorder, resolve, entries=[e for e in entries if not shape_no_op(e)],
                                keep={s.index for s in returns})
    entries, renamed = peepholes(recorder, entries, keep)
    returns = [renamed.get(s.index, s) for s in returns]
    keep |= {s.index for s in returns}             # a buffer handed over lives to the return
    entries, values, folded = fold_constants(recorder, entries, keep,
                                             lambda device, kernel: _kernel(device, kernel, resolve),
                                             held_by_plan_only(recorder))
    read = {s for entry in entries for s in _used(entry)}
    constants = {index: value for index, value in values.items() if index in read}
    for index, value in constants.items():         # globals of the plan, never deleted
        names.given[index] = f"f{index}"
        names.namespace[f"f{index}"] = value
    dead = _last_uses(entries, keep | constants.keys())

    body: list[str] = []
    lines: list[int] = []                       # entry -> its line in body (0-based)
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
            lines.append(len(body))
            body.append(f"    {names.slot(entry.slot)} = rebuild_view({names.slot(entry.source)}, "
                        f"{geometry})")
        else:
            calls += 1
            kernel = names.kernel(entry.device, entry.kernel, resolve)
            args = [names.value(a) for a in entry.args]
            args += [f"{k}={names.value(v)}" for k, v in entry.kwargs.items()]
            call = f"{kernel}({', '.join(args)})"
            target = names.target(entry.outs)
            lines.append(len(body))
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
    header += [f"# f{index} = {describe(index, folded, recorder)}: computed once, when the plan was built"
               for index in sorted(constants)]
    params = ", ".join(arg for arg, _ in inputs)
    source = "\n".join([*header, f"def {name}({params}):", *body]) + "\n"
    namespace = names.namespace
    filename = compile_source(source, f"<ta.compile {name}>", namespace)
    used = {s for entry in entries for s in _used(entry)} | {s.index for s in returns}
    used |= {s.index for _, s in inputs}
    first = len(header) + 2                     # body line 0 is the source's line first
    return Plan(name, source, namespace[name], filename, externals, calls, namespace, tuple(entries),
                tuple(first + n for n in lines), {s: names.slot(Slot(s)) for s in sorted(used)},
                tuple(s.index for _, s in inputs), tuple(s.index for s in returns), device,
                tuple(sorted(constants)))


# ---------------------------------------------------------------- peepholes

# Kernels that never write into their arguments and return their first argument itself when
# there is nothing to do: ``sum_to`` to the same shape, ``to_numpy`` on the host (decided by
# shapes alone, which a replay shares with its capture); ``asarray`` of an array already of
# the dtype and C-contiguous, ``broadcast_to`` of a C-contiguous array to its own shape
# (decided by the layout too, which an argument bound afresh may not share).
SHAPE_IDENTITY_KERNELS = frozenset({"sum_to", "to_numpy"})
LAYOUT_IDENTITY_KERNELS = frozenset({"asarray", "broadcast_to"})


def shape_no_op(entry) -> bool:
    """Whether ``entry`` is a call of SHAPE_IDENTITY_KERNELS that returned its first argument
    itself (a ``sum_to`` to the shape the array already has): every replay shares the
    capture's shapes, so it is a no-op at every replay, on any device.  The one statement of
    this rule: ``peepholes`` drops these calls, and ``build_plan`` drops them before fusing."""
    return (isinstance(entry, Call) and entry.kernel in SHAPE_IDENTITY_KERNELS and len(entry.args) > 0
            and isinstance(entry.args[0], Slot) and entry.outs == entry.args[0])


def _root_of(array):
    while isinstance(array, np.ndarray) and isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _same_geometry(a, b) -> bool:
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
            and a.strides == b.strides and a.dtype == b.dtype
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def peepholes(recorder: Recorder, entries: list, keep: set) -> tuple[list, dict]:
    """``entries`` without the calls that are no-ops at every replay, and the slots renamed
    (slot index -> the Slot standing for it).  The plan computes the same bits:

    - a kernel of SHAPE_IDENTITY_KERNELS that returned its first argument, or one of
      LAYOUT_IDENTITY_KERNELS that did so on an array that is not an argument: dropped;
    - ``reshape`` to the same shape (a view of the whole array, same strides): the view is
      its source, read under the source's name;
    - ``copy(x)`` (a leaf's gradient from backward's sum) where x is a kernel's own
      C-contiguous result and no slot on x's memory is read after the copy, or returned:
      x is handed over, y = x, as no one else holds it any more.

    Returned slots are never renamed away.  Host arrays only: a device array's geometry is
    not inspected, so its calls stay as recorded.
    """
    arrays, kinds = recorder.arrays, recorder.kinds
    last: dict[int, int] = {}
    for i, entry in enumerate(entries):
        for s in _used(entry):
            last[s] = i
    # id(memory root) -> the slots on that memory; a buffer handed over joins its reader's.
    sharing: dict[int, list[int]] = {}
    for s in last:
        if isinstance(arrays[s], np.ndarray):
            sharing.setdefault(id(_root_of(arrays[s])), []).append(s)

    def group(slot: int) -> list[int]:
        return sharing.get(id(_root_of(arrays[slot])), [slot])

    def held_after(slot: int, i: int) -> bool:
        return any(other in keep or last[other] > i for other in group(slot))

    renamed: dict[int, Slot] = {}
    kept: list = []
    for i, entry in enumerate(entries):
        if renamed:
            entry = _renamed(entry, renamed)
        if not isinstance(entry, Call) or not entry.args or not isinstance(entry.args[0], Slot):
            kept.append(entry)
            continue
        source, outs, kernel = entry.args[0], entry.outs, entry.kernel
        if shape_no_op(entry) or (outs == source and kernel in LAYOUT_IDENTITY_KERNELS
                                  and kinds[source.index] != "input"):
            continue
        if type(outs) is not Slot or kinds[outs.index] != "out":
            kept.append(entry)
            continue
        if kernel == "reshape" and outs.index not in keep \
                and _same_geometry(arrays[outs.index], arrays[source.index]):
            renamed[outs.index] = source
            continue
        if (kernel == "copy" and len(entry.args) == 1 and not entry.kwargs
                and kinds[source.index] == "out" and _handed_over(arrays[source.index], arrays[outs.index])
                and not held_after(source.index, i)):
            renamed[outs.index] = source
            merged = group(source.index)
            for other in group(outs.index):
                if other not in merged:
                    merged.append(other)
                sharing[id(_root_of(arrays[other]))] = merged
            continue
        kept.append(entry)
    return kept, renamed


def _used(entry) -> list:
    if isinstance(entry, Call):
        return slot_indices(entry.args, []) + slot_indices(entry.kwargs, []) + slot_indices(entry.outs, [])
    return [entry.slot.index, entry.source.index]


def _handed_over(source, copy) -> bool:
    """Whether ``source`` may stand for its ``copy``: a host array owning its memory, laid
    out as the copy is (C order) and as writeable (a gradient is updated in place), so every
    reader sees the same values and strides."""
    return (isinstance(source, np.ndarray) and isinstance(copy, np.ndarray) and source.base is None
            and source.flags.c_contiguous and copy.flags.c_contiguous and source.shape == copy.shape
            and source.dtype == copy.dtype and source.flags.writeable >= copy.flags.writeable)


def _renamed(entry, renamed: dict):
    def swap(value):
        if isinstance(value, Slot):
            return renamed.get(value.index, value)
        if type(value) in (list, tuple):
            return type(value)(swap(v) for v in value)
        if type(value) is dict:
            return {k: swap(v) for k, v in value.items()}
        return value

    if isinstance(entry, View):
        return replace(entry, source=swap(entry.source))
    return replace(entry, args=swap(entry.args), kwargs=swap(entry.kwargs), outs=swap(entry.outs))


def _dtype(recorder: Recorder, dtype) -> int:
    return recorder.constant(np.dtype(dtype)).index
