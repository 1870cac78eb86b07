"""Recording a function's kernel calls once, as a plan over buffers (``ta.compile``'s capture).

While a ``Recorder`` is installed (``Backend.recording``), every kernel attribute of the
device is a wrapper that runs the kernel and appends one ``Call`` to ``recorder.entries``,
its arguments turned into a template whose arrays are ``Slot``s:

* an array seen before (an input, an earlier kernel's output) is its slot, by identity;
  the recorder keeps every array alive until the plan is built, so no id is reused;
* an array that no recorded kernel produced but whose memory is a known slot's (a numpy
  view made outside the kernels) is rebuilt from that slot by geometry (``View``);
* any other array is an *external*, bound by identity: the plan holds the array object and
  reads it as it is at each replay (a parameter updated in place, a 0-d step count);
* Python numbers, tuples, dtypes, strings and other objects are constants of the plan.

A kernel whose output *is* an argument (``add_``, ``sum_to`` of equal shapes, ``to_numpy`` on
the host) gives it the argument's slot.  A call made by a kernel (a kernel calling another
through the device) runs unrecorded, inside its caller's entry.  Calls from other threads
pass straight through.

Provenance: a slot is *dynamic* when it derives from an input or an external.  Reading a
dynamic slot on the host (``to_numpy``) while recording would freeze its value into the
plan, so the recorder asks ``on_read`` (the engine), which raises or allows a pure check.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Recorder", "Slot", "Const", "View", "Call", "HOST_READS", "recording_all", "slot_indices"]

# Kernels that copy a device value to the host, where Python can read (and freeze) it.
HOST_READS = frozenset({"to_numpy"})


class CaptureError(RuntimeError):
    """Something a compiled function did while it was captured cannot be replayed: a value
    read on the host (it would be frozen into the plan), ``.data`` handed out, an argument
    the plan cannot key on.  The message names the line of user code."""


@dataclass(frozen=True)
class Slot:
    """A buffer of the plan, by number."""

    index: int


@dataclass(frozen=True)
class Const:
    """A constant of the plan that is not a literal (a dtype, a numpy scalar, an object)."""

    index: int


@dataclass
class Call:
    """One kernel call: ``outs = kernel(*args, **kwargs)`` on ``device``.

    ``args``/``kwargs`` hold Slots, Consts, literals and lists/tuples of them; ``outs`` is a
    Slot, a tuple or list of Slots, or None.  ``tag`` is what the engine was doing (e.g.
    ``("forward", "Linear", "encoder/0")``), for the generated source's comments.
    """

    device: str
    kernel: str
    args: tuple
    kwargs: dict
    outs: Any
    tag: tuple = ()


@dataclass
class View:
    """``slot`` is a numpy view of ``source``'s memory made outside the kernels."""

    slot: Slot
    source: Slot
    offset: int
    shape: tuple
    strides: tuple
    dtype: np.dtype
    tag: tuple = ()


def slot_indices(value, found: list) -> list:
    """``found`` extended by the indices of every Slot in ``value`` (a template: Slots inside
    lists, tuples and dicts)."""
    if isinstance(value, Slot):
        found.append(value.index)
    elif type(value) in (list, tuple):
        for v in value:
            slot_indices(v, found)
    elif type(value) is dict:
        for v in value.values():
            slot_indices(v, found)
    return found


def _is_array(x) -> bool:
    # numba.cuda's device arrays, and the simulator's (which lack the CUDA array interface),
    # all copy to the host: a buffer, never a constant of the plan.
    return isinstance(x, np.ndarray) or hasattr(x, "__cuda_array_interface__") or hasattr(x, "copy_to_host")


def _root(array):
    while isinstance(array, np.ndarray) and isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _address(array) -> int:
    return array.__array_interface__["data"][0]


@dataclass
class Recorder:
    """The slots, constants and entries of one capture (one thread).

    ``on_read(kernel_name)`` is called before a host read of a dynamic slot and may raise;
    ``tag`` is set by the engine and copied into each entry.
    """

    on_read: Any = None
    thread: int = field(default_factory=threading.get_ident)
    arrays: list = field(default_factory=list)          # slot -> the array seen (kept alive)
    dynamic: list = field(default_factory=list)         # slot -> derives from an input/external
    kinds: list = field(default_factory=list)           # slot -> "input" | "external" | "out" | "view"
    constants: list = field(default_factory=list)
    entries: list = field(default_factory=list)
    tag: tuple = ()
    depth: int = 0
    _ids: dict = field(default_factory=dict)            # id(array) -> Slot
    _roots: dict = field(default_factory=dict)          # id(memory root) -> Slot whose root it is

    @contextlib.contextmanager
    def paused(self):
        """Kernel calls inside the block run unrecorded: one-time work a step does on its first
        call (an optimizer's state made lazily), whose results the plan then binds by
        identity as externals instead of remaking them at every replay."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    # ------------------------------------------------------------ slots

    def slot_of(self, array) -> Slot | None:
        return self._ids.get(id(array))

    def add_slot(self, array, kind: str, dynamic: bool) -> Slot:
        slot = Slot(len(self.arrays))
        self.arrays.append(array)
        self.dynamic.append(dynamic)
        self.kinds.append(kind)
        self._ids[id(array)] = slot
        if isinstance(array, np.ndarray):
            self._roots.setdefault(id(_root(array)), slot)
        return slot

    def input(self, array) -> Slot:
        """Register an argument's array (bound afresh at every replay)."""
        known = self.slot_of(array)
        return known if known is not None else self.add_slot(array, "input", True)

    def external(self, array) -> Slot:
        """The slot of ``array``, an external bound by identity unless it is known."""
        known = self.slot_of(array)
        if known is not None:
            return known
        view = self._view(array)
        return view if view is not None else self.add_slot(array, "external", True)

    def _view(self, array) -> Slot | None:
        if not isinstance(array, np.ndarray):
            return None
        source = self._roots.get(id(_root(array)))
        if source is None or _root(array) is array:
            return None
        base = _root(self.arrays[source.index])
        slot = self.add_slot(array, "view", self.dynamic[source.index])
        self.entries.append(View(slot, source, _address(array) - _address(base), tuple(array.shape),
                                 tuple(array.strides), array.dtype, self.tag))
        return slot

    # ------------------------------------------------------------ calls

    def template(self, value) -> tuple[Any, bool]:
        """(the value with arrays as Slots, whether any of them is dynamic)."""
        if _is_array(value):
            slot = self.external(value)
            return slot, self.dynamic[slot.index]
        if isinstance(value, np.generic):
            known = self.slot_of(value)                # a full reduction's numpy scalar
            if known is not None:
                return known, self.dynamic[known.index]
            return self.constant(value), False
        if type(value) in (list, tuple):
            parts = [self.template(v) for v in value]
            return type(value)(p for p, _ in parts), any(d for _, d in parts)
        if value is None or type(value) in (int, float, bool, str, slice) or value is Ellipsis:
            return value, False
        return self.constant(value), False

    def constant(self, value) -> Const:
        for index, known in enumerate(self.constants):
            if known is value:
                return Const(index)
        self.constants.append(value)
        return Const(len(self.constants) - 1)

    def outputs(self, out, args: tuple, dynamic: bool):
        """The slots of a kernel's result: an argument returned keeps its slot."""
        if out is None:
            return None
        if _is_array(out) or isinstance(out, np.generic):
            known = self.slot_of(out)
            if known is not None:
                return known
            return self.add_slot(out, "out", dynamic)
        if type(out) in (list, tuple):
            return type(out)(self.outputs(o, args, dynamic) for o in out)
        # A Python number computed from arrays: a value on the host.
        if dynamic and self.on_read is not None:
            self.on_read("a kernel returning a Python value")
        return self.constant(out)

    def wrap(self, device: str, kernel_name: str, fn):
        """``fn`` recorded: the kernel attribute a recording device exposes."""
        host_read = kernel_name in HOST_READS

        def recorded(*args, **kwargs):
            if self.depth or threading.get_ident() != self.thread:
                return fn(*args, **kwargs)
            template, dynamic = self.template(args)
            kw_template, kw_dynamic = self.template(tuple(kwargs.values()))
            dynamic = dynamic or kw_dynamic
            if host_read and dynamic and self.on_read is not None:
                self.on_read(kernel_name)
            self.depth += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                self.depth -= 1
            outs = self.outputs(out, args, dynamic)
            named = dict(zip(kwargs, kw_template, strict=True))
            self.entries.append(Call(device, kernel_name, template, named, outs, self.tag))
            return out

        recorded.__name__ = kernel_name
        recorded.__wrapped__ = fn
        return recorded


@contextlib.contextmanager
def recording_all(recorder: Recorder):
    """Record on every device loaded now (the engine's ops may use any of them)."""
    from . import loaded_backends

    with contextlib.ExitStack() as stack:
        for backend in loaded_backends():
            stack.enter_context(backend.recording(recorder))
        yield recorder
