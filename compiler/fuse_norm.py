"""A sublayer's end as one kernel call: a Linear's bias, the residual connection and the layer
norm after it.

A post-norm Transformer layer ends each sublayer with ``norm(x + f(x))``, f's last op a
Linear: the plan replays ``y = add_(y, bias)``, a reshape, ``s = add(x, y)``, a reshape and
``layer_norm(s, ...)``, five calls over one small matrix (a decoding step: 64 x 128), each
paying its dispatch.  ``fuse_add_norms`` replaces them by one call of the device's
``add_layer_norm(y, bias, residual, weight, norm_bias, eps)``, which makes the same two
additions in the same order (the same bits) and returns the sum beside the norm's outputs,
so a backward that reads the sum still finds it.  Only where the five calls follow one
another in the plan and nothing else reads the intermediate buffers; other plans are left
as they are.
"""

from __future__ import annotations

import numpy as np

from .capture import Call, Slot, slot_indices

__all__ = ["fuse_add_norms"]

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _used(entry) -> list[int]:
    if isinstance(entry, Call):
        return slot_indices(entry.args, []) + slot_indices(entry.kwargs, []) + slot_indices(entry.outs, [])
    return [entry.slot.index, entry.source.index]


def _is_call(entry, kernel: str, device: str) -> bool:
    return isinstance(entry, Call) and entry.kernel == kernel and entry.device == device and not entry.kwargs


def _match(entries: list, end: int, device: str, arrays: list, uses: dict, keep: set):
    """The block ``add_``, reshapes, ``add``, reshapes ending at the layer_norm
    ``entries[end]``, as (its first position, the ``add_layer_norm`` Call standing for it),
    or None when the entries before the norm are not that block."""
    norm = entries[end]
    x = norm.args[0]
    if not isinstance(x, Slot):
        return None

    def only_here(slot) -> bool:
        # written by one entry of the block and read by the next one alone
        return isinstance(slot, Slot) and slot.index not in keep and len(uses.get(slot.index, ())) == 2

    def reshapes_back(position: int, slot: Slot, last: Slot | None):
        """Over the reshapes ending at ``entries[position]`` that lead to ``slot`` (each
        output but ``last`` read once): (the position before them, what they reshape)."""
        while (position >= 0 and _is_call(entries[position], "reshape", device)
               and entries[position].outs == slot):
            if slot != last and not only_here(slot):
                return position, None
            slot = entries[position].args[0]
            position -= 1
        return position, slot

    position, total = reshapes_back(end - 1, x, x)
    if total is None or position < 0:
        return None
    add = entries[position]
    if not (_is_call(add, "add", device) and add.outs == total and len(add.args) == 2
            and (total == x or only_here(total))):
        return None
    for operand, residual in (add.args, add.args[::-1]):
        if not isinstance(operand, Slot) or not isinstance(residual, Slot) or operand == residual:
            continue
        before, product = reshapes_back(position - 1, operand, None)
        biased = entries[before] if before >= 0 and product is not None else None
        if (biased is not None and _is_call(biased, "add_", device) and len(biased.args) == 2
                and biased.args[0] == product and biased.outs == product and isinstance(biased.args[1], Slot)
                # the product: made, biased and read on by the block, nothing else
                and product.index not in keep and len(uses[product.index]) == 3):
            bias = biased.args[1]
            break
    else:
        return None
    y, b, r, out = (arrays[slot.index] for slot in (product, bias, residual, x))
    if not all(isinstance(a, np.ndarray) for a in (y, b, r, out)):
        return None
    if (y.ndim != 2 or out.shape != y.shape or b.shape != (y.shape[1],) or r.size != y.size
            or arrays[add.args[0].index].shape != arrays[add.args[1].index].shape
            or len({a.dtype for a in (y, b, r, out)}) != 1 or y.dtype not in FLOATS):
        return None
    outs = tuple(norm.outs) if type(norm.outs) in (tuple, list) else (norm.outs,)
    return before, Call(device, "add_layer_norm", (product, bias, residual, *norm.args[1:]), {}, (x, *outs),
                        norm.tag)


def fuse_add_norms(recorder, entries: list, keep: set, device: str) -> list:
    """``entries`` with each bias + residual + layer norm block replaced by one
    ``add_layer_norm`` call (see the module's docstring); ``keep``: the slots the plan
    returns, which stay written as they were."""
    uses: dict[int, list[int]] = {}
    for i, entry in enumerate(entries):
        for s in set(_used(entry)):
            uses.setdefault(s, []).append(i)
    blocks: dict[int, tuple[int, Call]] = {}           # first position -> (last position, call)
    for end, entry in enumerate(entries):
        if _is_call(entry, "layer_norm", device) and len(entry.args) == 4:
            found = _match(entries, end, device, recorder.arrays, uses, keep)
            if found is not None:
                blocks[found[0]] = (end, found[1])
    fused, i = [], 0
    while i < len(entries):
        if i in blocks:
            end, call = blocks[i]
            fused.append(call)
            i = end + 1
        else:
            fused.append(entries[i])
            i += 1
    return fused
