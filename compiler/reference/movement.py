"""Movement: reshape, permute, broadcast_to, getitem(+back), cat, split, stack, the
embedding lookup and its scatter-add, and the in-place write of one position (a decoding
cache's)."""

from __future__ import annotations

import numpy as np


def reshape(x, shape):
    # The method, not np.reshape: the function's dispatch wrapper costs ~2 us a call, and a
    # training step reshapes hundreds of small arrays.
    return x.reshape(shape)


def permute(x, axes):
    return np.asarray(np.transpose(x, axes), order="C")


def getitem(x, index):
    return np.array(x[index], copy=True)


def getitem_back(shape, index, dy):
    """Scatter-add dy into zeros of ``shape``; repeated integer indices accumulate."""
    dx = np.zeros(shape, dtype=dy.dtype)
    if all(isinstance(part, (int, np.integer, slice)) or part is None or part is Ellipsis
           for part in index):
        dx[index] = dy  # a basic index picks each entry at most once: no scatter needed
    else:
        np.add.at(dx, index, dy)
    return dx


def cat(xs, axis):
    return np.concatenate(xs, axis=axis)


def split(x, sizes, axis):
    """Inverse of cat: pieces of ``x`` along ``axis`` with the given sizes."""
    index = [slice(None)] * x.ndim
    pieces, start = [], 0
    for size in sizes:            # plain slices: np.split's generality costs ~10 us a call
        index[axis] = slice(start, start + size)
        pieces.append(np.ascontiguousarray(x[tuple(index)]))
        start += size
    return pieces


def stack(xs, axis):
    return np.stack(xs, axis=axis)



def embedding(weight, ids):
    return weight[ids]


def embedding_back(num_rows, ids, dy, padding_idx):
    """Scatter-add rows of dy into a (num_rows, E) gradient; padding_idx gets none."""
    dw = np.zeros((num_rows, dy.shape[-1]), dtype=dy.dtype)
    np.add.at(dw, ids.reshape(-1), dy.reshape(-1, dy.shape[-1]))
    if padding_idx is not None:
        dw[padding_idx] = 0
    return dw


def write_at_(x, position, values, axis):
    """x[..., position, ...] = values in place (``values`` has x's shape with 1 on ``axis``;
    ``position`` a 0-d int array, so a plan replays one call for every position); returns x.

    A decoding cache preallocated to the decode length takes each step's keys and values so."""
    index = (slice(None),) * axis + (int(position),)
    x[index] = values.reshape(values.shape[:axis] + values.shape[axis + 1:])
    return x


def broadcast_to(x, shape):
    """A C-contiguous array of ``shape``: a read-only view of x when it already is one, else
    a copy.  Assigning into an empty array broadcasts as np.broadcast_to does, without its
    ~2 us Python wrapper (every sum's backward calls this); the axes check keeps assignment's
    one extra leniency, dropping leading 1s, out."""
    x, shape = np.asarray(x), tuple(shape)                 # a numpy scalar from a full sum
    if x.ndim > len(shape):
        raise ValueError(f"cannot broadcast an array of shape {x.shape} to {shape}")
    if x.shape == shape and x.flags.c_contiguous:
        view = x.view()
        view.flags.writeable = False
        return view
    out = np.empty(shape, dtype=x.dtype)
    out[...] = x
    return out


KERNELS = {
    "reshape": reshape, "permute": permute, "getitem": getitem, "getitem_back": getitem_back, "cat": cat,
    "split": split, "stack": stack, "embedding": embedding, "embedding_back": embedding_back,
    "broadcast_to": broadcast_to, "write_at_": write_at_,
}
