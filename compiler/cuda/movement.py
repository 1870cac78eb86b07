"""Movement: reshape (a view), permute, broadcast_to, getitem(+back), cat, split, stack
(strided copies), the embedding lookup and its scatter-add, and the in-place write of one
position (a decoding cache's)."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .device import THREADS, broadcast_strides, c_strides, collapse, empty, launch, nblocks, pos_at, ravel
from .memory import zeros


@cuda.jit
def _strided_copy_kernel(dst, dst_offset, dst_strides, src, src_offset, src_strides, shape, n):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        dst[dst_offset + pos_at(i, shape, dst_strides)] = src[src_offset + pos_at(i, shape, src_strides)]


def _copy_strided(dst, dst_offset, dst_strides, src, src_offset, src_strides, shape):
    """dst[dst_offset + idx . dst_strides] = src[src_offset + idx . src_strides] for every
    index idx of ``shape`` (element offsets and strides into the flat arrays)."""
    n = math.prod(shape)
    if n == 0:
        return
    dims, (dst_st, src_st) = collapse(tuple(shape), tuple(dst_strides), tuple(src_strides))
    launch(_strided_copy_kernel, nblocks(n), THREADS, ravel(dst), int(dst_offset), dst_st,
            ravel(src), int(src_offset), src_st, dims, n)


def reshape(x, shape):
    shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape = tuple(x.size // known if n == -1 and known else n for n in shape)
    if math.prod(shape) != x.size:
        raise ValueError(f"cannot reshape array of size {x.size} into shape {shape}")
    if x.size == 0:
        return empty(shape, x.dtype)        # a device array of size 0 has no memory to view
    return x.reshape(shape)


def permute(x, axes):
    axes = tuple(int(a) % x.ndim for a in axes) if x.ndim else ()
    shape = tuple(x.shape[a] for a in axes)
    out = empty(shape, x.dtype)
    own = c_strides(x.shape)
    _copy_strided(out, 0, c_strides(shape), x, 0, tuple(own[a] for a in axes), shape)
    return out


def broadcast_to(x, shape):
    shape = tuple(int(n) for n in shape)
    if tuple(np.broadcast_shapes(tuple(x.shape), shape)) != shape:
        raise ValueError(f"cannot broadcast an array of shape {tuple(x.shape)} to {shape}")
    out = empty(shape, x.dtype)
    _copy_strided(out, 0, c_strides(shape), x, 0, broadcast_strides(x.shape, shape), shape)
    return out


def _is_basic(parts) -> bool:
    return all(part is None or part is Ellipsis or isinstance(part, slice)
               or (isinstance(part, (int, np.integer)) and not isinstance(part, (bool, np.bool_)))
               for part in parts)


def _view_geometry(shape, parts):
    """(offset, shape, strides) in elements of the view x[parts] of a C-contiguous x: numpy
    works them out on a stand-in int8 array (byte strides = element strides) whose memory is
    never read.  A new last axis keeps the result a view even when every axis is indexed."""
    base = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape=tuple(shape), strides=c_strides(shape))
    last = (None,) if any(part is Ellipsis for part in parts) else (Ellipsis, None)
    view = base[tuple(parts) + last]
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return offset, view.shape[:-1], view.strides[:-1]


def _positions(shape, index):
    """The flat positions an advanced index picks, shaped like the result (host int64)."""
    return np.arange(math.prod(shape), dtype=np.int64).reshape(shape)[index]


@cuda.jit
def _gather_kernel(out, x, positions):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = x[positions[i]]


@cuda.jit
def _scatter_add_kernel(dx, positions, dy):
    # Atomic: an integer index array may pick one entry several times.
    for i in range(cuda.grid(1), dy.shape[0], cuda.gridsize(1)):
        cuda.atomic.add(dx, positions[i], dy[i])


def getitem(x, index):
    parts = index if isinstance(index, tuple) else (index,)
    if _is_basic(parts):
        offset, shape, strides = _view_geometry(x.shape, parts)
        out = empty(shape, x.dtype)
        _copy_strided(out, 0, c_strides(shape), x, offset, strides, shape)
        return out
    positions = _positions(x.shape, index)
    out = empty(positions.shape, x.dtype)
    if out.size:
        launch(_gather_kernel, nblocks(out.size), THREADS, ravel(out), ravel(x),
                cuda.to_device(positions.reshape(-1)))
    return out


def getitem_back(shape, index, dy):
    """Scatter-add dy into zeros of ``shape``; repeated integer indices accumulate."""
    dx = zeros(shape, dy.dtype)
    parts = index if isinstance(index, tuple) else (index,)
    if _is_basic(parts):
        # A basic index picks each entry at most once: a plain strided copy.
        offset, view_shape, strides = _view_geometry(shape, parts)
        _copy_strided(dx, offset, strides, dy, 0, c_strides(view_shape), view_shape)
        return dx
    positions = _positions(tuple(shape), index).reshape(-1)
    if positions.size:
        launch(_scatter_add_kernel, nblocks(positions.size), THREADS, ravel(dx), cuda.to_device(positions),
                ravel(dy))
    return dx


def cat(xs, axis):
    ndim = xs[0].ndim
    axis = int(axis) % ndim
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = empty(shape, np.result_type(*(x.dtype for x in xs)))
    out_strides = c_strides(shape)
    start = 0
    for x in xs:
        _copy_strided(out, start * out_strides[axis], out_strides, x, 0, c_strides(x.shape), x.shape)
        start += x.shape[axis]
    return out


def split(x, sizes, axis):
    """Inverse of cat: pieces of ``x`` along ``axis`` with the given sizes (the last piece
    takes whatever remains, as numpy's split)."""
    axis = int(axis) % x.ndim
    own = c_strides(x.shape)
    bounds = [min(int(b), x.shape[axis]) for b in np.cumsum(sizes)[:-1]]
    pieces = []
    for start, stop in zip([0] + bounds, bounds + [x.shape[axis]], strict=True):
        shape = x.shape[:axis] + (max(stop - start, 0),) + x.shape[axis + 1:]
        piece = empty(shape, x.dtype)
        _copy_strided(piece, 0, c_strides(shape), x, start * own[axis], own, shape)
        pieces.append(piece)
    return pieces


def stack(xs, axis):
    axis = int(axis) % (xs[0].ndim + 1)
    return cat([reshape(x, x.shape[:axis] + (1,) + x.shape[axis:]) for x in xs], axis)


# ---------------------------------------------------------------- embedding


@cuda.jit
def _embedding_kernel(out, weight, ids, dim):
    num_rows = weight.shape[0] // dim
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        row = ids[i // dim]
        if row < 0:
            row += num_rows              # numpy's negative indices
        out[i] = weight[row * dim + i % dim]


@cuda.jit
def _embedding_back_kernel(dw, ids, dy, padding_idx, dim):
    num_rows = dw.shape[0] // dim
    for i in range(cuda.grid(1), dy.shape[0], cuda.gridsize(1)):
        row = ids[i // dim]
        if row < 0:
            row += num_rows
        if row != padding_idx:
            # Atomic: two ids may name the same row.
            cuda.atomic.add(dw, row * dim + i % dim, dy[i])


def embedding(weight, ids):
    dim = weight.shape[1]
    out = empty(tuple(ids.shape) + (dim,), weight.dtype)
    if out.size:
        launch(_embedding_kernel, nblocks(out.size), THREADS, ravel(out), ravel(weight), ravel(ids), dim)
    return out


def embedding_back(num_rows, ids, dy, padding_idx):
    """Scatter-add rows of dy into a (num_rows, E) gradient; padding_idx gets none."""
    dim = dy.shape[dy.ndim - 1]
    dw = zeros((num_rows, dim), dy.dtype)
    if dy.size:
        padding = -1 if padding_idx is None else int(padding_idx) % num_rows
        launch(_embedding_back_kernel, nblocks(dy.size), THREADS, ravel(dw), ravel(ids), ravel(dy), padding,
                dim)
    return dw


@cuda.jit
def _write_at_kernel(x, position, values, length, inner, n):
    # The position is read on the device: a replayed plan passes the array, never a number.
    at = position[0]
    if at < 0:
        at += length
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        x[((i // inner) * length + at) * inner + i % inner] = values[i]


def write_at_(x, position, values, axis):
    """x[..., position, ...] = values in place along ``axis`` (values: x's shape with 1
    there; position: a 0-d int device array); returns x."""
    axis = int(axis) % x.ndim
    n = math.prod(values.shape)
    if n:
        inner = math.prod(x.shape[axis + 1:])
        launch(_write_at_kernel, nblocks(n), THREADS, ravel(x), ravel(position), ravel(values),
                int(x.shape[axis]), int(inner), n)
    return x


# ---------------------------------------------------------------- the table

KERNELS = {
    "reshape": reshape, "permute": permute, "broadcast_to": broadcast_to, "getitem": getitem,
    "getitem_back": getitem_back, "cat": cat, "split": split, "stack": stack,
    "embedding": embedding, "embedding_back": embedding_back, "write_at_": write_at_,
}
