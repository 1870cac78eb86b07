"""Constant folding: calls of a plan whose every array argument is itself a constant of the
plan run once, when the plan is built, and the plan reads their result by name.

A training step's backward starts from ``full((), 1.0)`` reshaped and broadcast to the
loss's shape; a Transformer's embedding is scaled by ``full((), sqrt(d_model))``: calls that
read no argument, parameter or random state, the same at every replay.  Replayed, they cost
a kernel call each (~0.3 us: a third of a tiny step's replay); folded, they cost nothing.

Tensors made inside the function from host data (``Tensor(np.triu(...))``, ``zeros``, a
causal mask) are ``from_host`` calls on an external host array; when nothing but the plan
holds that array (``held``: made inside the function and dropped), no one can change it and
the copy folds too.  A host array someone else holds (a numpy operand the caller keeps and
may change in place) stays a call: each replay copies its values then.

Only FOLDABLE kernels fold (deterministic, no state), and only on host arrays.  A constant
is one array shared by every replay, so a value folds only where nothing can change it or
hand it out: it is no result of the plan (a gradient returned would be accumulated into in
place); no later call that may write into its arguments reads it (the in-place kernels,
named with a trailing underscore: ``add_`` returns its argument, ``clip_`` and ``adam_``
return nothing); no later call returns it or a result sharing its memory (a view that could
be written or returned).  What shares memory with a constant kept as a call stays a call
too.  Anything in doubt stays a call, as recorded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from .capture import Call, Const, Recorder, Slot, View, slot_indices

__all__ = ["FOLDABLE", "describe", "fold_constants", "held_by_plan_only", "held_only_by"]

FOLDABLE = frozenset({"full", "reshape", "broadcast_to", "from_host"})
HOST_DEVICES = frozenset({"cpu", "numpy"})           # whose arrays are numpy's


def held_by_plan_only(recorder: Recorder) -> set[int]:
    """The external host arrays nothing but ``recorder`` holds, nor the arrays they view:
    made inside the captured function and dropped there, they cannot change later.  Read
    from CPython's reference counts, each taken of a list item (a new reference on every
    version; a local name may be a borrowed one), against the count of an array only a list
    holds (``_ALONE``); arrays hold no reference cycles."""
    held = set()
    for index, kind in enumerate(recorder.kinds):
        if kind != "external" or type(recorder.arrays[index]) is not np.ndarray:
            continue
        link = [recorder.arrays[index]]
        if _count(link) > _ALONE + 1:                  # the recorder's list and this one
            continue
        while isinstance(link[0].base, np.ndarray):
            link[0] = link[0].base
            if _count(link) > _ALONE + 1:              # its view's .base and this list
                break
        else:
            if link[0].base is None:
                held.add(index)
    return held


def _count(items: list, index: int = 0) -> int:
    return sys.getrefcount(items[index])


def held_only_by(items: list, index: int) -> bool:
    """Whether nothing but the list ``items`` holds ``items[index]`` (CPython's count)."""
    return _count(items, index) <= _ALONE


_ALONE = _count([np.empty(0)])


def fold_constants(recorder: Recorder, entries: list, keep: set, kernel: Callable[[str, str], Callable],
                   held: set = frozenset()) -> tuple[list, dict, dict]:
    """(``entries`` without the folded calls, slot index -> the constant array it holds,
    slot index -> the call that made it).

    ``keep``: slots the plan binds or returns (never folded); ``kernel(device, name)``: the
    kernel itself, unrecorded, which computes each constant once; ``held``: external host
    arrays only the plan holds (``held_by_plan_only``), constants where ``from_host`` alone
    reads them."""
    readers: dict[int, set] = {}
    for entry in entries:
        if isinstance(entry, Call):
            for s in slot_indices(entry.args, []) + slot_indices(entry.kwargs, []):
                readers.setdefault(s, set()).add(entry.kernel)
        else:
            readers.setdefault(entry.source.index, set()).add("view")
    sources = {s for s in held if readers.get(s, set()) <= {"from_host"}}
    values: dict[int, np.ndarray] = {}
    producer: dict[int, int] = {}
    for i, entry in enumerate(entries):
        if not (isinstance(entry, Call) and entry.kernel in FOLDABLE and type(entry.outs) is Slot
                and entry.device in HOST_DEVICES):
            continue
        out = entry.outs.index
        reads = slot_indices(entry.args, []) + slot_indices(entry.kwargs, [])
        if out in keep or recorder.kinds[out] != "out" or any(
                s not in values and not (s in sources and entry.kernel == "from_host") for s in reads):
            continue
        args = _bound(entry.args, values, recorder)
        kwargs = {k: _bound(v, values, recorder) for k, v in entry.kwargs.items()}
        value = kernel(entry.device, entry.kernel)(*args, **kwargs)
        if isinstance(value, np.ndarray):
            values[out] = value
            producer[out] = i
    while True:                 # a constant kept as a call makes its readers' checks again
        unsafe = _unsafe(recorder, entries, values, producer)
        if not unsafe:
            break
        shared = {s for s in values for u in unsafe if _shares(recorder.arrays[s], recorder.arrays[u])}
        for s in unsafe | shared:
            del values[s], producer[s]
    folded = set(producer.values())
    return ([e for i, e in enumerate(entries) if i not in folded], values,
            {s: entries[i] for s, i in producer.items()})


def describe(slot: int, calls: dict, recorder: Recorder) -> str:
    """A folded constant as the calls that made it, for the plan's header:
    ``broadcast_to(reshape(full((), 1.0, float64), (1,)), (3,))``."""
    def text(value) -> str:
        if type(value) is Slot and value.index not in calls:      # a host array made in the function
            array = recorder.arrays[value.index]
            if array.size <= 8:
                return " ".join(np.array2string(array, separator=", ").split())
            return f"<host array {array.shape} {array.dtype}>"
        if type(value) is Slot:
            return describe(value.index, calls, recorder)
        if type(value) is Const:                    # one line: the plan's header holds it
            return " ".join(str(recorder.constants[value.index]).split())
        if type(value) in (list, tuple):
            inner = ", ".join(text(v) for v in value)
            return f"({inner},)" if type(value) is tuple and len(value) == 1 else (
                f"({inner})" if type(value) is tuple else f"[{inner}]")
        return repr(value)

    call = calls[slot]
    args = [text(a) for a in call.args] + [f"{k}={text(v)}" for k, v in call.kwargs.items()]
    return f"{call.kernel}({', '.join(args)})"


def _unsafe(recorder: Recorder, entries: list, values: dict, producer: dict) -> set:
    """The constants some call left in the plan could change or hand out."""
    if not values:
        return set()
    folded = set(producer.values())
    unsafe: set = set()
    for i, entry in enumerate(entries):
        if i in folded:
            continue
        if isinstance(entry, View):
            if entry.source.index in values:
                unsafe.add(entry.source.index)
            continue
        reads = set(slot_indices(entry.args, []) + slot_indices(entry.kwargs, []))
        outs = slot_indices(entry.outs, [])
        for s in reads & values.keys():
            constant = recorder.arrays[s]
            if entry.kernel.endswith("_") or any(o == s or _shares(recorder.arrays[o], constant)
                                                 for o in outs):
                unsafe.add(s)
    return unsafe


def _shares(array, constant) -> bool:
    return isinstance(array, np.ndarray) and np.may_share_memory(array, constant)


def _bound(value, values: dict, recorder: Recorder):
    if type(value) is Slot:
        return values[value.index] if value.index in values else recorder.arrays[value.index]
    if type(value) is Const:
        return recorder.constants[value.index]
    if type(value) in (list, tuple):
        return type(value)(_bound(v, values, recorder) for v in value)
    return value
