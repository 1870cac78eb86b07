"""numba.cuda kernels for the "cuda" device: every kernel of the numpy reference, on the GPU.

The device's arrays are numba.cuda device arrays (``DeviceNDArray``), always C-contiguous:
every kernel writes a fresh contiguous array and ``reshape`` is a view of one.  ``asarray``
and ``to_numpy`` copy between host and device; no other kernel moves data off the GPU, so
there are no host fallbacks.  Three things do run on the host, on shapes or on small index
data, never on a device array: the flat positions an integer or boolean index picks
(``getitem`` with arrays; numpy works them out from the shape), dropout's mask (drawn by
numpy's generator for reproducibility, then copied over by the op), and the checks ops make
on ids and targets (they copy those to the host to name a bad value).

What runs as a kernel, with its launch configuration (T = THREADS, R = ROW_THREADS, numbers
for a GPU; the simulator's are below):

* elementwise maps and their backwards, comparisons, ``where``, ``astype``/``copy``/``zeros``/
  ``full``, the embedding lookup, ``cross_entropy_back``, ``nll_loss``(+back), the GRU/LSTM
  gates and ``additive_scores``(+back): one thread per output entry (or row), grid-stride
  loops, [min(ceil(n/T), 8192) blocks x T=256 threads].  The formulas come from
  ``scalar.py``.  Binary and ternary maps broadcast as numpy does: each operand is read
  through its own strides, 0 along broadcast axes, so nothing is expanded in memory.
* movement: ``reshape`` is a view; ``permute``, ``broadcast_to``, ``getitem`` (basic indices:
  one strided copy; integer or boolean arrays: a gather), ``getitem_back`` (strided copy, or
  an atomic scatter-add where an index may repeat), ``cat``, ``split`` and ``stack`` are
  strided copies [as elementwise].  ``embedding_back`` is an atomic scatter-add.
* reductions (``sum``, ``sum_to``, ``max``, the tie counts of ``max_back``): the reduced axes
  are moved last (a strided copy unless they already are), then one block per row reduces
  through shared memory [min(rows, 8192) blocks x R=128 threads].
* ``softmax``, ``log_softmax``, ``masked_softmax``, their backwards and ``cross_entropy``: one
  block per row of the last axis, the row max and sum by shared-memory trees [as reductions];
  another axis is moved last and back by strided copies.
* ``matmul``, ``matmul_nt``, ``matmul_tn``: tiled through shared memory: a block loads
  TILE x TILE tiles of both operands in turn and accumulates one TILE x TILE output tile
  [(ceil(m/TILE), ceil(n/TILE), batch) blocks, each at most 65535 (further tiles are taken
  a grid's stride on), x (TILE, TILE) = (16, 16) threads].  The transposed forms only swap
  the strides the tiles are loaded with; batch axes broadcast through zero strides.
* ``sdpa``: FlashAttention-style.  One thread per query row, a block of B query rows loops
  over tiles of B keys held in shared memory with an online softmax (running max and sum,
  the output rescaled as the max grows), so the (T_q, T_k) weights never exist; causal
  blocks stop at their last query.  ``sdpa_back``: a kernel computes delta = rowsum(do * o),
  one kernel dq (a thread per query row, looping over key tiles) and one dk, dv (a thread per
  key row, looping over query tiles), each rebuilding p = exp(s - lse) [(ceil(T/B), N) blocks
  x B threads, B <= 64 rows chosen so the block's dynamic shared memory fits 48 KiB].

Under ``NUMBA_ENABLE_CUDASIM=1`` (Numba's simulator, which runs every CUDA thread as a Python
thread) the same kernels run with T = R = TILE = B = 4, at most 4 blocks (2 per grid axis of
2-D and 3-D grids), so tests reach partial tiles, several tiles and the grid-stride loops on
tiny shapes.  Importing this module under the simulator also makes the simulator's arrays
refuse what real device arrays refuse, and its thread polling cheaper (see the end).

No GPU has run these kernels yet: they are checked under the simulator (tests/test_cuda.py,
tests/test_conformance.py) and compiled to PTX for compute capability 9.0 with the argument
types of every conformance case (tests/cuda_ptx.py, which needs the CUDA toolkit's NVVM only).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time

import numba
import numpy as np
from numba import cuda

from . import numpy_backend as reference
from . import scalar

__all__ = ["KERNELS", "SIMULATOR"]

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)

# Numba warns on every launch of fewer than 128 blocks; small tensors make small grids by
# design here (a decoder step of 8 x 32 entries), so that warning would fire on most ops.
# Your own NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS setting wins.
if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in os.environ:
    numba.config.CUDA_LOW_OCCUPANCY_WARNINGS = 0

if SIMULATOR:
    # Each simulated thread is an OS thread, so blocks are tiny; the code paths are the GPU's.
    THREADS, ROW_THREADS, TILE, SDPA_ROWS, MAX_BLOCKS, MAX_GRID_AXIS = 4, 4, 4, 4, 4, 2
else:
    THREADS = 256          # a block of an elementwise (1-D) kernel
    ROW_THREADS = 128      # the threads that reduce one row together (a power of 2)
    TILE = 16              # matmul tiles are TILE x TILE, a thread per entry
    SDPA_ROWS = 64         # the most query (or key) rows of one attention block
    MAX_BLOCKS = 8192      # of a 1-D grid; grid-stride loops take the rest
    MAX_GRID_AXIS = 65535  # the y and z limit of a grid (x too, for matmul's)

# Dynamic shared memory a block may use without opting in to more (every GPU since Kepler).
SHARED_BYTES = 48 * 1024


# ---------------------------------------------------------------- launching and geometry


def _launch(kernel, blocks, threads, *args, shared_bytes=0):
    kernel[blocks, threads, 0, shared_bytes](*args)


def _blocks(n: int, threads: int = THREADS) -> int:
    return max(1, min(MAX_BLOCKS, -(-n // threads)))


def _empty(shape, dtype):
    return cuda.device_array(tuple(int(n) for n in shape), dtype=np.dtype(dtype))


def _flat(x):
    """A 1-D view of a contiguous device array (kernels index flat arrays)."""
    return x.reshape(x.size)


def _strides(shape) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _broadcast_strides(shape, out_shape) -> tuple[int, ...]:
    """Element strides that read an array of ``shape`` as if broadcast to ``out_shape``."""
    own = _strides(shape)
    lead = len(out_shape) - len(shape)
    return tuple(0 if i < lead or shape[i - lead] == 1 else own[i - lead] for i in range(len(out_shape)))


def _collapse(shape, *strides):
    """Merge axes that every operand walks as one (and drop size-1 axes), so the index
    arithmetic of a strided kernel has as few axes as possible; at least one axis stays.
    Returns (shape, [strides per operand])."""
    merged: list[tuple[int, list[int]]] = []
    for axis, n in enumerate(shape):
        if n == 1:
            continue
        inner = [s[axis] for s in strides]
        if merged:
            outer_n, outer = merged[-1]
            if all(o == i * n for o, i in zip(outer, inner, strict=True)):
                merged[-1] = (outer_n * n, inner)
                continue
        merged.append((n, inner))
    if not merged:
        return (1,), [(0,) for _ in strides]
    dims = tuple(n for n, _ in merged)
    return dims, [tuple(st[k] for _, st in merged) for k in range(len(strides))]


@cuda.jit(device=True)
def _at(i, shape, strides):
    """Offset of the i-th entry (C order) of ``shape`` in an array read with ``strides``."""
    offset = 0
    for d in range(len(shape) - 1, -1, -1):
        offset += (i % shape[d]) * strides[d]
        i //= shape[d]
    return offset


@functools.cache
def _result_dtype(name: str, dtypes: tuple) -> np.dtype:
    """The dtype the numpy reference kernel gives for inputs of these dtypes (int / int is
    float64, comparisons are bool, ...): the output dtype of the kernel of the same name."""
    with np.errstate(all="ignore"):
        return getattr(reference, name)(*(np.ones(1, d) for d in dtypes)).dtype


def _per_dtype(build):
    """A kernel factory cached per dtype: ``build(numba_type, numpy_dtype)`` makes kernels
    whose shared arrays and constants have that dtype."""
    cache: dict = {}

    def kernel_for(dtype):
        dtype = np.dtype(dtype)
        if dtype not in cache:
            cache[dtype] = build(numba.from_dtype(dtype), dtype)
        return cache[dtype]

    return kernel_for


@functools.cache
def _no_mask(ndim: int):
    """A stand-in boolean array for kernels called without a mask (never read)."""
    return cuda.to_device(np.ones((1,) * ndim, dtype=np.bool_))


# ---------------------------------------------------------------- memory and dtype


def _on_device(x) -> bool:
    return bool(getattr(x, "__cuda_ndarray__", False))


def asarray(data, dtype):
    if _on_device(data):
        return data if data.dtype == np.dtype(dtype) else astype(data, dtype)
    return cuda.to_device(np.asarray(data, dtype=dtype, order="C"))


def to_numpy(x):
    if x.size == 0:
        return np.empty(x.shape, dtype=x.dtype)
    return x.copy_to_host()


@cuda.jit
def _fill_kernel(out, value):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = value


@cuda.jit
def _cast_kernel(out, x):
    # The store converts to out's dtype as numpy's astype does: toward zero to integers,
    # x != 0 to bool.
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = x[i]


def full(shape, value, dtype):
    out = _empty(shape, dtype)
    if out.size:
        _launch(_fill_kernel, _blocks(out.size), THREADS, _flat(out), np.dtype(dtype).type(value))
    return out


def zeros(shape, dtype):
    return full(shape, 0, dtype)


def astype(x, dtype):
    out = _empty(x.shape, dtype)
    if out.size:
        _launch(_cast_kernel, _blocks(out.size), THREADS, _flat(out), _flat(x))
    return out


def copy(x):
    return astype(x, x.dtype)


# ---------------------------------------------------------------- elementwise, from scalar.py


def _map_kernel(fn):
    f = cuda.jit(device=True)(fn)

    @cuda.jit
    def map_run(out, a):
        for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[i] = f(a[i])

    return map_run


def _map_param_kernel(fn):
    f = cuda.jit(device=True)(fn)

    @cuda.jit
    def map_param_run(out, a, param):
        for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[i] = f(a[i], param)

    return map_param_run


def _zip_kernel(fn):
    f = cuda.jit(device=True)(fn)

    @cuda.jit
    def zip_run(out, a, a_strides, b, b_strides, shape):
        for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[i] = f(a[_at(i, shape, a_strides)], b[_at(i, shape, b_strides)])

    return zip_run


def _zip_param_kernel(fn):
    f = cuda.jit(device=True)(fn)

    @cuda.jit
    def zip_param_run(out, a, a_strides, b, b_strides, shape, param):
        for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[i] = f(a[_at(i, shape, a_strides)], b[_at(i, shape, b_strides)], param)

    return zip_param_run


def _zip3_kernel(fn):
    f = cuda.jit(device=True)(fn)

    @cuda.jit
    def zip3_run(out, a, a_strides, b, b_strides, c, c_strides, shape):
        for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            out[i] = f(a[_at(i, shape, a_strides)], b[_at(i, shape, b_strides)],
                       c[_at(i, shape, c_strides)])

    return zip3_run


def _broadcast_launch(kernel, out_dtype, arrays, params=()):
    """Run a zip kernel over the broadcast shape of ``arrays``; returns the output."""
    shape = tuple(np.broadcast_shapes(*(tuple(a.shape) for a in arrays)))
    out = _empty(shape, out_dtype)
    if out.size:
        dims, strides = _collapse(shape, *(_broadcast_strides(a.shape, shape) for a in arrays))
        operands = [x for a, st in zip(arrays, strides, strict=True) for x in (_flat(a), st)]
        _launch(kernel, _blocks(out.size), THREADS, _flat(out), *operands, dims, *params)
    return out


def _map(name):
    kernel = _map_kernel(scalar.MAPS[name])

    def run(x):
        out = _empty(x.shape, _result_dtype(name, (x.dtype,)))
        if out.size:
            _launch(kernel, _blocks(out.size), THREADS, _flat(out), _flat(x))
        return out

    run.__name__ = name
    return run


def _zip(name):
    kernel = _zip_kernel(scalar.ZIPS[name]) if name in scalar.ZIPS else _zip3_kernel(scalar.ZIPS3[name])

    def run(*arrays):
        return _broadcast_launch(kernel, _result_dtype(name, tuple(a.dtype for a in arrays)), arrays)

    run.__name__ = name
    return run


_add_kernel = _zip_kernel(scalar.add)


def add_(a, b):
    """a += b in place (a contiguous; b broadcasts to a's shape), returning a."""
    if a.size:
        dims, (a_strides, b_strides) = _collapse(a.shape, _strides(a.shape),
                                                 _broadcast_strides(b.shape, a.shape))
        flat = _flat(a)
        _launch(_add_kernel, _blocks(a.size), THREADS, flat, flat, a_strides, _flat(b), b_strides, dims)
    return a


_leaky_relu_kernel = _map_param_kernel(scalar.leaky_relu)
_leaky_relu_back_kernel = _zip_param_kernel(scalar.leaky_relu_back)


def leaky_relu(x, negative_slope):
    out = _empty(x.shape, x.dtype)
    if out.size:
        slope = x.dtype.type(negative_slope)
        _launch(_leaky_relu_kernel, _blocks(out.size), THREADS, _flat(out), _flat(x), slope)
    return out


def leaky_relu_back(x, dy, negative_slope):
    return _broadcast_launch(_leaky_relu_back_kernel, dy.dtype, (x, dy), (dy.dtype.type(negative_slope),))


# ---------------------------------------------------------------- reductions


def _axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return tuple(sorted({int(a) % ndim for a in axes})) if ndim else ()


def _rows_last(x, axes):
    """x as contiguous (rows, reduced) with ``axes`` moved last: a view when they already are."""
    order = tuple(d for d in range(x.ndim) if d not in axes) + tuple(axes)
    moved = x if order == tuple(range(x.ndim)) else permute(x, order)
    return _flat(moved)


@cuda.jit(device=True)
def _block_sum(partial, value):
    """The sum of ``value`` over the block's threads (blockDim a power of 2), to every thread."""
    t = cuda.threadIdx.x
    partial[t] = value
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            partial[t] += partial[t + step]
        cuda.syncthreads()
        step //= 2
    total = partial[0]
    cuda.syncthreads()          # partial is written again by the next reduction
    return total


@cuda.jit(device=True)
def _block_max(partial, value):
    """The max of ``value`` over the block's threads; a NaN wins, as in numpy."""
    t = cuda.threadIdx.x
    partial[t] = value
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            other = partial[t + step]
            if other > partial[t] or other != other:
                partial[t] = other
        cuda.syncthreads()
        step //= 2
    best = partial[0]
    cuda.syncthreads()
    return best


@_per_dtype
def _sum_rows_kernel(nb_type, dtype):
    zero = dtype.type(0)

    @cuda.jit
    def sum_rows(out, x, n_cols):
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        for row in range(cuda.blockIdx.x, out.shape[0], cuda.gridDim.x):
            acc = zero
            for j in range(cuda.threadIdx.x, n_cols, ROW_THREADS):
                acc += x[row * n_cols + j]
            total = _block_sum(partial, acc)
            if cuda.threadIdx.x == 0:
                out[row] = total

    return sum_rows


@_per_dtype
def _max_rows_kernel(nb_type, dtype):
    @cuda.jit
    def max_rows(out, x, n_cols):
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        for row in range(cuda.blockIdx.x, out.shape[0], cuda.gridDim.x):
            acc = x[row * n_cols]        # every thread starts from the row's first entry: max is idempotent
            for j in range(cuda.threadIdx.x, n_cols, ROW_THREADS):
                v = x[row * n_cols + j]
                if v > acc or v != v:
                    acc = v
            best = _block_max(partial, acc)
            if cuda.threadIdx.x == 0:
                out[row] = best

    return max_rows


def _reduce(x, axis, keepdims, kind):
    axes = _axes(axis, x.ndim)
    kept = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    shape = kept if keepdims else tuple(n for d, n in enumerate(x.shape) if d not in axes)
    dtype = np.sum(np.ones(1, x.dtype)).dtype if kind == "sum" else x.dtype
    n_cols = math.prod(x.shape[d] for d in axes)
    n_rows = math.prod(shape)
    if n_rows == 0:
        return _empty(shape, dtype)
    if n_cols == 0:
        if kind == "max":
            raise ValueError("zero-size array to reduction operation maximum which has no identity")
        return zeros(shape, dtype)
    out = _empty(shape, dtype)
    kernel = (_sum_rows_kernel if kind == "sum" else _max_rows_kernel)(dtype)
    _launch(kernel, min(n_rows, MAX_BLOCKS), ROW_THREADS, _flat(out), _rows_last(x, axes), n_cols)
    return out


# The "sum" and "max" kernels are named _sum and _max here so that the builtins stay usable.
def _sum(x, axis, keepdims):
    return _reduce(x, axis, keepdims, "sum")


def _max(x, axis, keepdims):
    return _reduce(x, axis, keepdims, "max")


def sum_to(x, shape):
    """Sum ``x`` down to ``shape``: the backward of broadcasting ``shape`` up to x.shape."""
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, n in enumerate(shape) if n == 1 and x.shape[i + lead] != 1
    )
    return reshape(_sum(x, axes, True), shape)


_max_back_kernel = _zip3_kernel(scalar.max_back)


_equal = _zip("eq")


def max_back(x, y_keep, dy_keep):
    """Gradient of max split evenly between tied maxima (the mean subgradient)."""
    hit = _equal(x, y_keep)
    reduced = tuple(i for i, n in enumerate(y_keep.shape) if n == 1)
    count = _sum(hit, reduced, True)
    return _broadcast_launch(_max_back_kernel, x.dtype, (hit, dy_keep, count))


# ---------------------------------------------------------------- movement


@cuda.jit
def _strided_copy_kernel(dst, dst_offset, dst_strides, src, src_offset, src_strides, shape, n):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        dst[dst_offset + _at(i, shape, dst_strides)] = src[src_offset + _at(i, shape, src_strides)]


def _copy_strided(dst, dst_offset, dst_strides, src, src_offset, src_strides, shape):
    """dst[dst_offset + idx . dst_strides] = src[src_offset + idx . src_strides] for every
    index idx of ``shape`` (element offsets and strides into the flat arrays)."""
    n = math.prod(shape)
    if n == 0:
        return
    dims, (dst_st, src_st) = _collapse(tuple(shape), tuple(dst_strides), tuple(src_strides))
    _launch(_strided_copy_kernel, _blocks(n), THREADS, _flat(dst), int(dst_offset), dst_st,
            _flat(src), int(src_offset), src_st, dims, n)


def reshape(x, shape):
    shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape = tuple(x.size // known if n == -1 and known else n for n in shape)
    if math.prod(shape) != x.size:
        raise ValueError(f"cannot reshape array of size {x.size} into shape {shape}")
    if x.size == 0:
        return _empty(shape, x.dtype)        # a device array of size 0 has no memory to view
    return x.reshape(shape)


def permute(x, axes):
    axes = tuple(int(a) % x.ndim for a in axes) if x.ndim else ()
    shape = tuple(x.shape[a] for a in axes)
    out = _empty(shape, x.dtype)
    own = _strides(x.shape)
    _copy_strided(out, 0, _strides(shape), x, 0, tuple(own[a] for a in axes), shape)
    return out


def broadcast_to(x, shape):
    shape = tuple(int(n) for n in shape)
    if tuple(np.broadcast_shapes(tuple(x.shape), shape)) != shape:
        raise ValueError(f"cannot broadcast an array of shape {tuple(x.shape)} to {shape}")
    out = _empty(shape, x.dtype)
    _copy_strided(out, 0, _strides(shape), x, 0, _broadcast_strides(x.shape, shape), shape)
    return out


def _is_basic(parts) -> bool:
    return all(part is None or part is Ellipsis or isinstance(part, slice)
               or (isinstance(part, (int, np.integer)) and not isinstance(part, (bool, np.bool_)))
               for part in parts)


def _view_geometry(shape, parts):
    """(offset, shape, strides) in elements of the view x[parts] of a C-contiguous x: numpy
    works them out on a stand-in int8 array (byte strides = element strides) whose memory is
    never read.  A new last axis keeps the result a view even when every axis is indexed."""
    base = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape=tuple(shape), strides=_strides(shape))
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
        out = _empty(shape, x.dtype)
        _copy_strided(out, 0, _strides(shape), x, offset, strides, shape)
        return out
    positions = _positions(x.shape, index)
    out = _empty(positions.shape, x.dtype)
    if out.size:
        _launch(_gather_kernel, _blocks(out.size), THREADS, _flat(out), _flat(x),
                cuda.to_device(positions.reshape(-1)))
    return out


def getitem_back(shape, index, dy):
    """Scatter-add dy into zeros of ``shape``; repeated integer indices accumulate."""
    dx = zeros(shape, dy.dtype)
    parts = index if isinstance(index, tuple) else (index,)
    if _is_basic(parts):
        # A basic index picks each entry at most once: a plain strided copy.
        offset, view_shape, strides = _view_geometry(shape, parts)
        _copy_strided(dx, offset, strides, dy, 0, _strides(view_shape), view_shape)
        return dx
    positions = _positions(tuple(shape), index).reshape(-1)
    if positions.size:
        _launch(_scatter_add_kernel, _blocks(positions.size), THREADS, _flat(dx), cuda.to_device(positions),
                _flat(dy))
    return dx


def cat(xs, axis):
    ndim = xs[0].ndim
    axis = int(axis) % ndim
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = _empty(shape, np.result_type(*(x.dtype for x in xs)))
    out_strides = _strides(shape)
    start = 0
    for x in xs:
        _copy_strided(out, start * out_strides[axis], out_strides, x, 0, _strides(x.shape), x.shape)
        start += x.shape[axis]
    return out


def split(x, sizes, axis):
    """Inverse of cat: pieces of ``x`` along ``axis`` with the given sizes (the last piece
    takes whatever remains, as numpy's split)."""
    axis = int(axis) % x.ndim
    own = _strides(x.shape)
    bounds = [min(int(b), x.shape[axis]) for b in np.cumsum(sizes)[:-1]]
    pieces = []
    for start, stop in zip([0] + bounds, bounds + [x.shape[axis]], strict=True):
        shape = x.shape[:axis] + (max(stop - start, 0),) + x.shape[axis + 1:]
        piece = _empty(shape, x.dtype)
        _copy_strided(piece, 0, _strides(shape), x, start * own[axis], own, shape)
        pieces.append(piece)
    return pieces


def stack(xs, axis):
    axis = int(axis) % (xs[0].ndim + 1)
    return cat([reshape(x, x.shape[:axis] + (1,) + x.shape[axis:]) for x in xs], axis)


# ---------------------------------------------------------------- linear algebra


@_per_dtype
def _matmul_kernel(nb_type, dtype):
    zero = dtype.type(0)

    @cuda.jit
    def matmul_tiles(c, a, b, n, m, inner, a_rs, a_cs, b_rs, b_cs, batch_shape, a_batch, b_batch, n_batch):
        """c[z] = A[z] @ B[z] with A(i, k) = a[a_z + i a_rs + k a_cs], B(k, j) likewise.
        A block computes output tiles (blockIdx.y, blockIdx.x, blockIdx.z) and, when the
        grid is smaller than the output, the ones a grid's stride further on."""
        a_tile = cuda.shared.array((TILE, TILE), nb_type)
        b_tile = cuda.shared.array((TILE, TILE), nb_type)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        for z in range(cuda.blockIdx.z, n_batch, cuda.gridDim.z):
            a0 = _at(z, batch_shape, a_batch)
            b0 = _at(z, batch_shape, b_batch)
            for row0 in range(cuda.blockIdx.y * TILE, n, cuda.gridDim.y * TILE):
                for col0 in range(cuda.blockIdx.x * TILE, m, cuda.gridDim.x * TILE):
                    row = row0 + ty
                    col = col0 + tx
                    acc = zero
                    for k0 in range(0, inner, TILE):
                        ka = k0 + tx
                        kb = k0 + ty
                        # Outside the matrices the tiles hold zeros: partial tiles need no other care.
                        a_tile[ty, tx] = a[a0 + row * a_rs + ka * a_cs] if row < n and ka < inner else zero
                        b_tile[ty, tx] = b[b0 + kb * b_rs + col * b_cs] if kb < inner and col < m else zero
                        cuda.syncthreads()
                        for kk in range(TILE):
                            acc += a_tile[ty, kk] * b_tile[kk, tx]
                        cuda.syncthreads()
                    if row < n and col < m:
                        c[(z * n + row) * m + col] = acc

    return matmul_tiles


def _batch_strides(x, batch) -> tuple[int, ...]:
    shape = tuple(x.shape[:-2])
    own = _strides(x.shape)[:-2]
    lead = len(batch) - len(shape)
    return tuple(0 if i < lead or shape[i - lead] == 1 else own[i - lead] for i in range(len(batch)))


def _matmul(a, b, a_transposed, b_transposed):
    """a @ b over the last two axes, reading a (b) transposed when asked; numpy's rules for
    1-D operands and broadcast batch axes."""
    squeeze = []
    if a.ndim == 1:
        a = reshape(a, (1,) + tuple(a.shape))
        squeeze.append(-2)
    if b.ndim == 1:
        b = reshape(b, tuple(b.shape) + (1,))
        squeeze.append(-1)
    n, inner = (a.shape[-1], a.shape[-2]) if a_transposed else (a.shape[-2], a.shape[-1])
    inner_b, m = (b.shape[-1], b.shape[-2]) if b_transposed else (b.shape[-2], b.shape[-1])
    if inner != inner_b:
        raise ValueError(f"matmul: inner dimensions differ ({inner} != {inner_b}) for shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    batch = tuple(np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])))
    dtype = np.result_type(a.dtype, b.dtype)
    n_batch = math.prod(batch)
    if inner == 0:
        out = zeros(batch + (n, m), dtype)
    else:
        out = _empty(batch + (n, m), dtype)
    if out.size and inner:
        a_rs, a_cs = (1, a.shape[-1]) if a_transposed else (a.shape[-1], 1)
        b_rs, b_cs = (1, b.shape[-1]) if b_transposed else (b.shape[-1], 1)
        batch_shape, a_batch, b_batch = (batch, _batch_strides(a, batch), _batch_strides(b, batch)) if batch \
            else ((1,), (0,), (0,))
        grid = tuple(min(count, MAX_GRID_AXIS) for count in (-(-m // TILE), -(-n // TILE), n_batch))
        _launch(_matmul_kernel(dtype), grid, (TILE, TILE), _flat(out), _flat(a), _flat(b), n, m, inner,
                a_rs, a_cs, b_rs, b_cs, batch_shape, a_batch, b_batch, n_batch)
    if squeeze:
        shape = list(out.shape)
        for axis in squeeze:
            del shape[axis]
        out = reshape(out, shape)
    return out


def matmul(a, b):
    return _matmul(a, b, False, False)


def matmul_nt(a, b):
    """a @ b^T over the last two axes; the transpose is only the strides b's tiles are read with."""
    return _matmul(a, b, False, True)


def matmul_tn(a, b):
    """a^T @ b over the last two axes, reading a^T in place (see matmul_nt)."""
    return _matmul(a, b, True, False)


# ---------------------------------------------------------------- softmax family, one block per row


@_per_dtype
def _softmax_rows_kernel(nb_type, dtype):
    zero, one, neg_inf = dtype.type(0), dtype.type(1), dtype.type(-np.inf)

    @cuda.jit
    def softmax_rows(out, x, n_cols, mask, has_mask):
        """Row softmax over the entries where mask (same layout as x) is True, or all of them."""
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        t = cuda.threadIdx.x
        for row in range(cuda.blockIdx.x, x.shape[0] // n_cols, cuda.gridDim.x):
            base = row * n_cols
            m = neg_inf
            for j in range(t, n_cols, ROW_THREADS):
                if (not has_mask or mask[base + j]) and x[base + j] > m:
                    m = x[base + j]
            m = _block_max(partial, m)
            if not math.isfinite(m):
                m = zero                 # nothing finite in the row: exp below gives zeros
            total = zero
            for j in range(t, n_cols, ROW_THREADS):
                e = math.exp(x[base + j] - m) if not has_mask or mask[base + j] else zero
                out[base + j] = e
                total += e
            total = _block_sum(partial, total)
            scale = one / total if total > zero else zero
            for j in range(t, n_cols, ROW_THREADS):
                out[base + j] *= scale

    return softmax_rows


@_per_dtype
def _log_softmax_rows_kernel(nb_type, dtype):
    zero, neg_inf = dtype.type(0), dtype.type(-np.inf)

    @cuda.jit
    def log_softmax_rows(out, x, n_cols):
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        t = cuda.threadIdx.x
        for row in range(cuda.blockIdx.x, x.shape[0] // n_cols, cuda.gridDim.x):
            base = row * n_cols
            m = neg_inf
            for j in range(t, n_cols, ROW_THREADS):
                if x[base + j] > m:
                    m = x[base + j]
            m = _block_max(partial, m)
            if not math.isfinite(m):
                m = zero
            total = zero
            for j in range(t, n_cols, ROW_THREADS):
                total += math.exp(x[base + j] - m)
            total = _block_sum(partial, total)
            # An all -inf row: total = 0 and y = x - m = -inf, the log of softmax's zeros.
            log_total = math.log(total) if total > zero else zero
            for j in range(t, n_cols, ROW_THREADS):
                out[base + j] = (x[base + j] - m) - log_total

    return log_softmax_rows


@_per_dtype
def _softmax_back_rows_kernel(nb_type, dtype):
    zero = dtype.type(0)

    @cuda.jit
    def softmax_back_rows(dx, y, dy, n_cols, log):
        """dx = y (dy - sum(dy y)); with ``log`` (y = log_softmax): dx = dy - exp(y) sum(dy)."""
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        t = cuda.threadIdx.x
        for row in range(cuda.blockIdx.x, y.shape[0] // n_cols, cuda.gridDim.x):
            base = row * n_cols
            acc = zero
            for j in range(t, n_cols, ROW_THREADS):
                acc += dy[base + j] if log else dy[base + j] * y[base + j]
            s = _block_sum(partial, acc)
            for j in range(t, n_cols, ROW_THREADS):
                if log:
                    dx[base + j] = dy[base + j] - math.exp(y[base + j]) * s
                else:
                    dx[base + j] = (dy[base + j] - s) * y[base + j]

    return softmax_back_rows


def _along_last(fn, axis, *arrays):
    """fn(*arrays) over the last axis; another ``axis`` is moved last and back."""
    ndim = arrays[0].ndim
    axis = int(axis) % ndim
    if axis == ndim - 1:
        return fn(*arrays)
    order = tuple(d for d in range(ndim) if d != axis) + (axis,)
    inverse = tuple(int(i) for i in np.argsort(order))
    return permute(fn(*(permute(a, order) for a in arrays)), inverse)


def _row_blocks(x) -> int:
    return min(x.size // x.shape[-1], MAX_BLOCKS)


def _softmax_last(x, mask=None):
    out = _empty(x.shape, x.dtype)
    if out.size:
        has_mask = mask is not None
        _launch(_softmax_rows_kernel(x.dtype), _row_blocks(x), ROW_THREADS, _flat(out), _flat(x), x.shape[-1],
                _flat(mask) if has_mask else _no_mask(1), has_mask)
    return out


def softmax(x, axis):
    """Row softmax; the row max is subtracted before exp, and a row that is entirely -inf
    (every position masked) gives zeros, not NaN."""
    return _along_last(_softmax_last, axis, x)


def masked_softmax(x, mask):
    """Softmax over the last axis of x restricted to where ``mask`` (broadcast to x) is True;
    masked entries get 0 and a row with no True entry is all zeros."""
    return _softmax_last(x, broadcast_to(mask, x.shape))


def _log_softmax_last(x):
    out = _empty(x.shape, x.dtype)
    if out.size:
        _launch(_log_softmax_rows_kernel(x.dtype), _row_blocks(x), ROW_THREADS, _flat(out), _flat(x),
                x.shape[-1])
    return out


def log_softmax(x, axis):
    return _along_last(_log_softmax_last, axis, x)


def _softmax_back_last(y, dy, log):
    dx = _empty(y.shape, y.dtype)
    if dx.size:
        _launch(_softmax_back_rows_kernel(y.dtype), _row_blocks(y), ROW_THREADS, _flat(dx), _flat(y),
                _flat(dy), y.shape[-1], log)
    return dx


def softmax_back(y, dy, axis):
    return _along_last(lambda y_, dy_: _softmax_back_last(y_, dy_, False), axis, y, dy)


def log_softmax_back(y, dy, axis):
    return _along_last(lambda y_, dy_: _softmax_back_last(y_, dy_, True), axis, y, dy)


# ---------------------------------------------------------------- losses


@_per_dtype
def _cross_entropy_kernel(nb_type, dtype):
    zero, neg_inf = dtype.type(0), dtype.type(-np.inf)

    @cuda.jit
    def cross_entropy_rows(loss, lse, logits, target, ignore_index, n_cols):
        partial = cuda.shared.array(ROW_THREADS, nb_type)
        t = cuda.threadIdx.x
        for row in range(cuda.blockIdx.x, loss.shape[0], cuda.gridDim.x):
            base = row * n_cols
            m = neg_inf
            for j in range(t, n_cols, ROW_THREADS):
                if logits[base + j] > m:
                    m = logits[base + j]
            m = _block_max(partial, m)
            total = zero
            for j in range(t, n_cols, ROW_THREADS):
                total += math.exp(logits[base + j] - m)
            total = _block_sum(partial, total)
            if t == 0:
                row_lse = m + math.log(total)
                lse[row] = row_lse
                c = target[row]
                loss[row] = row_lse - logits[base + c] if c != ignore_index else zero

    return cross_entropy_rows


@cuda.jit
def _cross_entropy_back_kernel(dx, logits, lse, target, ignore_index, dloss, n_cols):
    """d loss_r / d logits_r = (softmax(logits_r) - onehot(target_r)) dloss_r, 0 if ignored."""
    for i in range(cuda.grid(1), dx.shape[0], cuda.gridsize(1)):
        row = i // n_cols
        c = target[row]
        if c == ignore_index:
            dx[i] = 0
        else:
            p = math.exp(logits[i] - lse[row])
            dx[i] = (p - 1 if i - row * n_cols == c else p) * dloss[row]


def cross_entropy(logits, target, ignore_index):
    """Per-row loss -log softmax(logits)[target] and the row logsumexp, for (N, C) logits."""
    n, c = logits.shape
    loss = _empty((n,), logits.dtype)
    lse = _empty((n,), logits.dtype)
    if n and c:
        _launch(_cross_entropy_kernel(logits.dtype), min(n, MAX_BLOCKS), ROW_THREADS, loss, lse,
                _flat(logits), target, int(ignore_index), c)
    return loss, lse


def cross_entropy_back(logits, lse, target, ignore_index, dloss):
    dx = _empty(logits.shape, logits.dtype)
    if dx.size:
        _launch(_cross_entropy_back_kernel, _blocks(dx.size), THREADS, _flat(dx), _flat(logits), lse, target,
                int(ignore_index), dloss, logits.shape[1])
    return dx


@cuda.jit
def _nll_loss_kernel(loss, logp, target, ignore_index, n_cols):
    for row in range(cuda.grid(1), loss.shape[0], cuda.gridsize(1)):
        c = target[row]
        loss[row] = -logp[row * n_cols + c] if c != ignore_index else 0


@cuda.jit
def _nll_loss_back_kernel(dx, target, ignore_index, dloss, n_cols):
    for row in range(cuda.grid(1), dloss.shape[0], cuda.gridsize(1)):
        c = target[row]
        if c != ignore_index:
            dx[row * n_cols + c] = -dloss[row]


def nll_loss(logp, target, ignore_index):
    """Per-row loss -logp[target] for (N, C) log-probabilities; ignored rows give 0."""
    loss = _empty((logp.shape[0],), logp.dtype)
    if loss.size:
        _launch(_nll_loss_kernel, _blocks(loss.size), THREADS, loss, _flat(logp), target, int(ignore_index),
                logp.shape[1])
    return loss


def nll_loss_back(shape, target, ignore_index, dloss):
    dx = zeros(shape, dloss.dtype)
    if dloss.size:
        _launch(_nll_loss_back_kernel, _blocks(dloss.size), THREADS, _flat(dx), target, int(ignore_index),
                dloss, shape[1])
    return dx


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
    out = _empty(tuple(ids.shape) + (dim,), weight.dtype)
    if out.size:
        _launch(_embedding_kernel, _blocks(out.size), THREADS, _flat(out), _flat(weight), _flat(ids), dim)
    return out


def embedding_back(num_rows, ids, dy, padding_idx):
    """Scatter-add rows of dy into a (num_rows, E) gradient; padding_idx gets none."""
    dim = dy.shape[-1]
    dw = zeros((num_rows, dim), dy.dtype)
    if dy.size:
        padding = -1 if padding_idx is None else int(padding_idx) % num_rows
        _launch(_embedding_back_kernel, _blocks(dy.size), THREADS, _flat(dw), _flat(ids), _flat(dy), padding,
                dim)
    return dw


# ---------------------------------------------------------------- Bahdanau's additive scores


@_per_dtype
def _additive_scores_kernel(nb_type, dtype):
    zero = dtype.type(0)

    @cuda.jit
    def additive_scores_run(e, q, k, v):
        """e[n, i, j] = sum_a v[a] tanh(q[n, i, a] + k[n, j, a]), a thread per entry."""
        t_q, t_k, size = q.shape[1], k.shape[1], v.shape[0]
        for flat in range(cuda.grid(1), e.shape[0] * t_q * t_k, cuda.gridsize(1)):
            n = flat // (t_q * t_k)
            i = flat // t_k % t_q
            j = flat % t_k
            acc = zero
            for a in range(size):
                acc += v[a] * math.tanh(q[n, i, a] + k[n, j, a])
            e[n, i, j] = acc

    return additive_scores_run


@_per_dtype
def _additive_scores_back_kernel(nb_type, dtype):
    zero, one = dtype.type(0), dtype.type(1)

    @cuda.jit
    def additive_scores_back_run(dx, dv_parts, x, y, v, de, x_is_query):
        """dx[n, r, a] = v[a] sum_s de (1 - tanh^2) over the other side's rows s, where x is q
        (rows of de) or k (columns of de); with q, dv_parts[n, r, a] = sum_s de tanh.
        Each tanh is recomputed rather than stored, as in the reference."""
        t_x, t_y, size = x.shape[1], y.shape[1], v.shape[0]
        for flat in range(cuda.grid(1), x.shape[0] * t_x * size, cuda.gridsize(1)):
            n = flat // (t_x * size)
            r = flat // size % t_x
            a = flat % size
            acc = zero
            acc_v = zero
            for s in range(t_y):
                th = math.tanh(x[n, r, a] + y[n, s, a])
                g = de[n, r, s] if x_is_query else de[n, s, r]
                acc += g * (one - th * th)
                acc_v += g * th
            dx[n, r, a] = acc * v[a]
            if x_is_query:
                dv_parts[n, r, a] = acc_v

    return additive_scores_back_run


def additive_scores(q, k, v):
    """Bahdanau scores e[n, i, j] = v . tanh(q[n, i] + k[n, j]) for q (N, T_q, A),
    k (N, T_k, A), v (A,) -> (N, T_q, T_k); the (N, T_q, T_k, A) pairs are never stored."""
    e = _empty((q.shape[0], q.shape[1], k.shape[1]), q.dtype)
    if e.size:
        _launch(_additive_scores_kernel(q.dtype), _blocks(e.size), THREADS, e, q, k, v)
    return e


def additive_scores_back(q, k, v, de):
    # Every entry is written by the kernels below (a sum over no rows writes 0).
    dq = _empty(q.shape, q.dtype)
    dk = _empty(k.shape, k.dtype)
    dv_parts = _empty(q.shape, q.dtype)                                         # (N, T_q, A)
    kernel = _additive_scores_back_kernel(q.dtype)
    if dq.size:
        _launch(kernel, _blocks(dq.size), THREADS, dq, dv_parts, q, k, v, de, True)
    if dk.size:
        _launch(kernel, _blocks(dk.size), THREADS, dk, dv_parts, k, q, v, de, False)
    dv = _sum(dv_parts, (0, 1), False) if dv_parts.size else zeros(v.shape, v.dtype)
    return dq, dk, dv


# ---------------------------------------------------------------- scaled dot-product attention


def _sdpa_rows(words_per_row, itemsize: int, what: str, shape) -> int:
    """The most rows per block (a power of 2 up to SDPA_ROWS) whose dynamic shared memory,
    ``words_per_row(rows)`` entries per row, fits in SHARED_BYTES."""
    rows = SDPA_ROWS
    while rows >= 1:
        if rows * words_per_row(rows) * itemsize <= SHARED_BYTES:
            return rows
        rows //= 2
    raise ValueError(f"{what}: head sizes {shape} are too large for one block's shared memory "
                     f"({SHARED_BYTES} bytes)")


@cuda.jit(device=True)
def _load_tile(shared, at, src, n, first, scale, zero):
    """Rows first .. first + blockDim of src[n], times scale, into shared[at:] row after row
    (zeros past the last row); the block's threads share the copy entry by entry."""
    rows, length, width = cuda.blockDim.x, src.shape[1], src.shape[2]
    for idx in range(cuda.threadIdx.x, rows * width, rows):
        r = first + idx // width
        shared[at + idx] = src[n, r, idx % width] * scale if r < length else zero


@_per_dtype
def _sdpa_forward_kernel(nb_type, dtype):
    zero, one, neg_inf = dtype.type(0), dtype.type(1), dtype.type(-np.inf)

    @cuda.jit
    def sdpa_forward(o, lse, q, k, v, mask, has_mask, scale, causal):
        """A block of B query rows, a thread per row, over tiles of B keys.  Shared memory:
        the block's scaled queries (B, D+1), the key and value tiles (B, D), (B, D_v), the
        scores (B, B+1) and the output accumulators (B, D_v+1); rows of what one thread reads
        alone are padded by one entry so neighbouring threads hit different banks."""
        shared = cuda.shared.array(0, nb_type)
        rows = cuda.blockDim.x
        t = cuda.threadIdx.x
        t_q, d = q.shape[1], q.shape[2]
        t_k, d_v = k.shape[1], v.shape[2]
        q_pad, s_pad, o_pad = d + 1, rows + 1, d_v + 1
        k_at = rows * q_pad
        v_at = k_at + rows * d
        s_at = v_at + rows * d_v
        o_at = s_at + rows * s_pad
        first = cuda.blockIdx.x * rows
        i = first + t
        live = i < t_q
        # Causal: no query of this block sees a key past its last query.  (No builtin min or
        # max in kernels: Numba 0.68 cannot compile them for CUDA.)
        stop = first + rows if causal and first + rows < t_k else t_k
        for n in range(cuda.blockIdx.y, q.shape[0], cuda.gridDim.y):
            mask_n = n if mask.shape[0] > 1 else 0
            for dd in range(d):
                shared[t * q_pad + dd] = q[n, i, dd] * scale if live else zero
            for dd in range(d_v):
                shared[o_at + t * o_pad + dd] = zero
            m = neg_inf
            total = zero
            for k0 in range(0, stop, rows):
                cuda.syncthreads()                       # every thread is done with the last tile
                _load_tile(shared, k_at, k, n, k0, one, zero)
                _load_tile(shared, v_at, v, n, k0, one, zero)
                cuda.syncthreads()
                if live:
                    tile_max = neg_inf
                    for jj in range(rows):
                        j = k0 + jj
                        s = neg_inf
                        if j < t_k and (not causal or j <= i) and (not has_mask or mask[mask_n, i, j]):
                            s = zero
                            for dd in range(d):
                                s += shared[t * q_pad + dd] * shared[k_at + jj * d + dd]
                        shared[s_at + t * s_pad + jj] = s
                        if s > tile_max:
                            tile_max = s
                    new_m = tile_max if tile_max > m else m
                    if new_m > neg_inf:                  # else nothing attended to yet
                        # Online softmax: rescale what was summed under the old max.
                        alpha = math.exp(m - new_m)
                        tile_total = zero
                        for jj in range(rows):
                            p = math.exp(shared[s_at + t * s_pad + jj] - new_m)
                            shared[s_at + t * s_pad + jj] = p
                            tile_total += p
                        total = total * alpha + tile_total
                        for dd in range(d_v):
                            acc = shared[o_at + t * o_pad + dd] * alpha
                            for jj in range(rows):
                                acc += shared[s_at + t * s_pad + jj] * shared[v_at + jj * d_v + dd]
                            shared[o_at + t * o_pad + dd] = acc
                        m = new_m
            if live:
                if total > zero:
                    inverse = one / total
                    for dd in range(d_v):
                        o[n, i, dd] = shared[o_at + t * o_pad + dd] * inverse
                    lse[n, i] = m + math.log(total)
                else:                                     # nothing to attend to: o = 0, lse = -inf
                    for dd in range(d_v):
                        o[n, i, dd] = zero
                    lse[n, i] = neg_inf
            cuda.syncthreads()                           # shared memory is refilled for the next n

    return sdpa_forward


@cuda.jit
def _sdpa_delta_kernel(delta, do, o):
    """delta[n, i] = sum(do[n, i] * o[n, i]), a thread per row."""
    t_q, d_v = o.shape[1], o.shape[2]
    for flat in range(cuda.grid(1), o.shape[0] * t_q, cuda.gridsize(1)):
        n = flat // t_q
        i = flat % t_q
        acc = do[n, i, 0] * o[n, i, 0]
        for dd in range(1, d_v):
            acc += do[n, i, dd] * o[n, i, dd]
        delta[n, i] = acc


@_per_dtype
def _sdpa_dq_kernel(nb_type, dtype):
    zero, one, neg_inf = dtype.type(0), dtype.type(1), dtype.type(-np.inf)

    @cuda.jit
    def sdpa_dq(dq, q, k, v, lse, delta, do, mask, has_mask, scale, causal):
        """dq_i = scale sum_j ds_ij k_j, ds = p (do_i . v_j - delta_i), p = exp(s_ij - lse_i):
        a thread per query row over tiles of B keys.  Shared: scaled queries (B, D+1), their
        do rows (B, D_v+1), key and value tiles (B, D), (B, D_v), dq accumulators (B, D+1)."""
        shared = cuda.shared.array(0, nb_type)
        rows = cuda.blockDim.x
        t = cuda.threadIdx.x
        t_q, d = q.shape[1], q.shape[2]
        t_k, d_v = k.shape[1], v.shape[2]
        q_pad, do_pad = d + 1, d_v + 1
        do_at = rows * q_pad
        k_at = do_at + rows * do_pad
        v_at = k_at + rows * d
        dq_at = v_at + rows * d_v
        first = cuda.blockIdx.x * rows
        i = first + t
        stop = first + rows if causal and first + rows < t_k else t_k
        for n in range(cuda.blockIdx.y, q.shape[0], cuda.gridDim.y):
            mask_n = n if mask.shape[0] > 1 else 0
            live = i < t_q and lse[n, i] > neg_inf               # a row with no key gets dq = 0
            for dd in range(d):
                shared[t * q_pad + dd] = q[n, i, dd] * scale if live else zero
                shared[dq_at + t * q_pad + dd] = zero
            for dd in range(d_v):
                shared[do_at + t * do_pad + dd] = do[n, i, dd] if live else zero
            row_lse = lse[n, i] if live else zero
            row_delta = delta[n, i] if live else zero
            for k0 in range(0, stop, rows):
                cuda.syncthreads()
                _load_tile(shared, k_at, k, n, k0, one, zero)
                _load_tile(shared, v_at, v, n, k0, one, zero)
                cuda.syncthreads()
                if live:
                    for jj in range(rows):
                        j = k0 + jj
                        if j < t_k and (not causal or j <= i) and (not has_mask or mask[mask_n, i, j]):
                            s = zero
                            for dd in range(d):
                                s += shared[t * q_pad + dd] * shared[k_at + jj * d + dd]
                            p = math.exp(s - row_lse)
                            dp = zero
                            for dd in range(d_v):
                                dp += shared[do_at + t * do_pad + dd] * shared[v_at + jj * d_v + dd]
                            ds = p * (dp - row_delta)
                            for dd in range(d):
                                shared[dq_at + t * q_pad + dd] += ds * shared[k_at + jj * d + dd]
            if i < t_q:
                for dd in range(d):
                    dq[n, i, dd] = shared[dq_at + t * q_pad + dd] * scale
            cuda.syncthreads()

    return sdpa_dq


@_per_dtype
def _sdpa_dkv_kernel(nb_type, dtype):
    zero, one, neg_inf = dtype.type(0), dtype.type(1), dtype.type(-np.inf)

    @cuda.jit
    def sdpa_dkv(dk, dv, q, k, v, lse, delta, do, mask, has_mask, scale, causal):
        """dv_j = sum_i p_ij do_i and dk_j = sum_i ds_ij (scale q_i): a thread per key row over
        tiles of B queries.  Shared: the block's keys and values (B, D+1), (B, D_v+1), query
        and do tiles (B, D), (B, D_v), their lse and delta (B each), accumulators for dk and
        dv (B, D+1), (B, D_v+1)."""
        shared = cuda.shared.array(0, nb_type)
        rows = cuda.blockDim.x
        t = cuda.threadIdx.x
        t_q, d = q.shape[1], q.shape[2]
        t_k, d_v = k.shape[1], v.shape[2]
        k_pad, v_pad = d + 1, d_v + 1
        v_at = rows * k_pad
        q_at = v_at + rows * v_pad
        do_at = q_at + rows * d
        lse_at = do_at + rows * d_v
        delta_at = lse_at + rows
        dk_at = delta_at + rows
        dv_at = dk_at + rows * k_pad
        first = cuda.blockIdx.x * rows
        j = first + t
        live = j < t_k
        # Causal: queries before the block's first key see none of its keys.
        start = first if causal else 0
        for n in range(cuda.blockIdx.y, q.shape[0], cuda.gridDim.y):
            mask_n = n if mask.shape[0] > 1 else 0
            for dd in range(d):
                shared[t * k_pad + dd] = k[n, j, dd] if live else zero
                shared[dk_at + t * k_pad + dd] = zero
            for dd in range(d_v):
                shared[v_at + t * v_pad + dd] = v[n, j, dd] if live else zero
                shared[dv_at + t * v_pad + dd] = zero
            for q0 in range(start, t_q, rows):
                cuda.syncthreads()
                _load_tile(shared, q_at, q, n, q0, scale, zero)
                _load_tile(shared, do_at, do, n, q0, one, zero)
                i = q0 + t
                shared[lse_at + t] = lse[n, i] if i < t_q else neg_inf
                shared[delta_at + t] = delta[n, i] if i < t_q else zero
                cuda.syncthreads()
                if live:
                    for ii in range(rows):
                        i = q0 + ii
                        row_lse = shared[lse_at + ii]
                        # lse is -inf past the last query, so the mask is read only inside it.
                        if row_lse > neg_inf and (not causal or j <= i) and (
                                not has_mask or mask[mask_n, i, j]):
                            s = zero
                            for dd in range(d):
                                s += shared[q_at + ii * d + dd] * shared[t * k_pad + dd]
                            p = math.exp(s - row_lse)
                            dp = zero
                            for dd in range(d_v):
                                g = shared[do_at + ii * d_v + dd]
                                shared[dv_at + t * v_pad + dd] += p * g
                                dp += g * shared[v_at + t * v_pad + dd]
                            ds = p * (dp - shared[delta_at + ii])
                            for dd in range(d):
                                shared[dk_at + t * k_pad + dd] += ds * shared[q_at + ii * d + dd]
            if live:
                for dd in range(d):
                    dk[n, j, dd] = shared[dk_at + t * k_pad + dd]
                for dd in range(d_v):
                    dv[n, j, dd] = shared[dv_at + t * v_pad + dd]
            cuda.syncthreads()

    return sdpa_dkv


def _sdpa_mask(mask):
    return (mask, True) if mask is not None else (_no_mask(3), False)


def sdpa(q, k, v, mask, scale, causal):
    """Scaled dot-product attention without keeping the weights (see numpy_backend.sdpa):
    q (N, T_q, D), k (N, T_k, D), v (N, T_k, D_v), mask None or boolean (N or 1, T_q, T_k),
    True = may attend.  Returns (o (N, T_q, D_v), lse (N, T_q)); a row with nothing to
    attend to gets o = 0 and lse = -inf."""
    n, t_q, d = q.shape
    d_v = v.shape[2]
    o = _empty((n, t_q, d_v), q.dtype)
    lse = _empty((n, t_q), q.dtype)
    if n == 0 or t_q == 0:
        return o, lse

    def words(b):                 # shared entries per row of a block of b rows: see sdpa_forward
        return (d + 1) + d + d_v + (b + 1) + (d_v + 1)

    rows = _sdpa_rows(words, q.dtype.itemsize, "sdpa", q.shape)
    mask_arg, has_mask = _sdpa_mask(mask)
    grid = (-(-t_q // rows), min(n, MAX_GRID_AXIS))
    _launch(_sdpa_forward_kernel(q.dtype), grid, rows, o, lse, q, k, v, mask_arg, has_mask,
            q.dtype.type(scale), bool(causal), shared_bytes=rows * words(rows) * q.dtype.itemsize)
    return o, lse


def sdpa_back(q, k, v, o, lse, do, mask, scale, causal):
    """Gradients (dq, dk, dv) of sdpa, rebuilding the weights from lse: p = exp(s - lse),
    ds = p * (dp - sum(do * o)), with dp = do v^T."""
    n, t_q, d = q.shape
    t_k, d_v = k.shape[1], v.shape[2]
    if n == 0 or t_q == 0 or t_k == 0:
        return zeros(q.shape, q.dtype), zeros(k.shape, k.dtype), zeros(v.shape, v.dtype)
    # Every row of dq, dk and dv is written by one thread of the kernels below.
    dq, dk, dv = _empty(q.shape, q.dtype), _empty(k.shape, k.dtype), _empty(v.shape, v.dtype)
    delta = _empty((n, t_q), q.dtype) if d_v else zeros((n, t_q), q.dtype)
    if d_v:
        _launch(_sdpa_delta_kernel, _blocks(n * t_q), THREADS, delta, do, o)
    mask_arg, has_mask = _sdpa_mask(mask)
    scale = q.dtype.type(scale)
    itemsize = q.dtype.itemsize

    def dq_words(b):
        return 2 * (d + 1) + (d_v + 1) + d + d_v

    def dkv_words(b):
        return 2 * (d + 1) + 2 * (d_v + 1) + d + d_v + 2

    rows = _sdpa_rows(dq_words, itemsize, "sdpa_back", q.shape)
    _launch(_sdpa_dq_kernel(q.dtype), (-(-t_q // rows), min(n, MAX_GRID_AXIS)), rows, dq, q, k, v, lse, delta,
            do, mask_arg, has_mask, scale, bool(causal), shared_bytes=rows * dq_words(rows) * itemsize)
    rows = _sdpa_rows(dkv_words, itemsize, "sdpa_back", q.shape)
    _launch(_sdpa_dkv_kernel(q.dtype), (-(-t_k // rows), min(n, MAX_GRID_AXIS)), rows, dk, dv, q, k, v, lse,
            delta, do, mask_arg, has_mask, scale, bool(causal),
            shared_bytes=rows * dkv_words(rows) * itemsize)
    return dq, dk, dv


# ---------------------------------------------------------------- GRU and LSTM cell gates


_sigmoid = cuda.jit(device=True)(scalar.sigmoid)


@cuda.jit
def _gru_gates_kernel(h, gates, gi, gh, h_prev):
    """One thread per (b, c): r, z, n of PyTorch's GRU and h = n + z (h_prev - n)."""
    hidden = h_prev.shape[1]
    for flat in range(cuda.grid(1), h.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        c = flat % hidden
        # Each gate is read back once stored, so what follows uses exactly the rounded values
        # backward will see (as the reference, which computes in arrays of the input dtype).
        gates[b, c] = _sigmoid(gi[b, c] + gh[b, c])
        gates[b, hidden + c] = _sigmoid(gi[b, hidden + c] + gh[b, hidden + c])
        gates[b, 2 * hidden + c] = math.tanh(gi[b, 2 * hidden + c] + gates[b, c] * gh[b, 2 * hidden + c])
        n = gates[b, 2 * hidden + c]
        h[b, c] = n + gates[b, hidden + c] * (h_prev[b, c] - n)


@cuda.jit
def _gru_gates_back_kernel(dgi, dgh, dh_prev, gates, gh, h_prev, dh):
    hidden = h_prev.shape[1]
    for flat in range(cuda.grid(1), dh.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        c = flat % hidden
        r = gates[b, c]
        z = gates[b, hidden + c]
        n = gates[b, 2 * hidden + c]
        g = dh[b, c]
        dn = g * (1 - z) * (1 - n * n)
        dz = g * (h_prev[b, c] - n) * z * (1 - z)
        dr = dn * gh[b, 2 * hidden + c] * r * (1 - r)
        dgi[b, c] = dr
        dgi[b, hidden + c] = dz
        dgi[b, 2 * hidden + c] = dn
        dgh[b, c] = dr
        dgh[b, hidden + c] = dz
        dgh[b, 2 * hidden + c] = dn * r
        dh_prev[b, c] = g * z


@cuda.jit
def _lstm_cell_state_kernel(c_out, act, gates, c_prev):
    hidden = c_prev.shape[1]
    for flat in range(cuda.grid(1), c_out.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        j = flat % hidden
        act[b, j] = _sigmoid(gates[b, j])
        act[b, hidden + j] = _sigmoid(gates[b, hidden + j])
        act[b, 2 * hidden + j] = math.tanh(gates[b, 2 * hidden + j])
        c_out[b, j] = act[b, hidden + j] * c_prev[b, j] + act[b, j] * act[b, 2 * hidden + j]


@cuda.jit
def _lstm_cell_state_back_kernel(dgates, dc_prev, act, c_prev, dc):
    hidden = c_prev.shape[1]
    for flat in range(cuda.grid(1), dc.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        j = flat % hidden
        i_gate = act[b, j]
        f_gate = act[b, hidden + j]
        g_gate = act[b, 2 * hidden + j]
        g = dc[b, j]
        dgates[b, j] = g * g_gate * i_gate * (1 - i_gate)
        dgates[b, hidden + j] = g * c_prev[b, j] * f_gate * (1 - f_gate)
        dgates[b, 2 * hidden + j] = g * i_gate * (1 - g_gate * g_gate)
        dgates[b, 3 * hidden + j] = 0
        dc_prev[b, j] = g * f_gate


@cuda.jit
def _lstm_hidden_kernel(h, act, gates, c):
    hidden = c.shape[1]
    for flat in range(cuda.grid(1), h.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        j = flat % hidden
        act[b, j] = _sigmoid(gates[b, 3 * hidden + j])
        act[b, hidden + j] = math.tanh(c[b, j])
        h[b, j] = act[b, j] * act[b, hidden + j]


@cuda.jit
def _lstm_hidden_back_kernel(dgates, dc, act, dh):
    hidden = dh.shape[1]
    for flat in range(cuda.grid(1), dh.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        j = flat % hidden
        o_gate = act[b, j]
        tanh_c = act[b, hidden + j]
        g = dh[b, j]
        dgates[b, j] = 0
        dgates[b, hidden + j] = 0
        dgates[b, 2 * hidden + j] = 0
        dgates[b, 3 * hidden + j] = g * tanh_c * o_gate * (1 - o_gate)
        dc[b, j] = g * o_gate * (1 - tanh_c * tanh_c)


def _cell_launch(kernel, batch, hidden, *args):
    if batch * hidden:
        _launch(kernel, _blocks(batch * hidden), THREADS, *args)


def gru_gates(gi, gh, h_prev):
    """GRU cell after its products (see numpy_backend.gru_gates): -> (h (B, H), gates (B, 3H))."""
    batch, hidden = h_prev.shape
    h = _empty((batch, hidden), gi.dtype)
    gates = _empty(gi.shape, gi.dtype)
    _cell_launch(_gru_gates_kernel, batch, hidden, h, gates, gi, gh, h_prev)
    return h, gates


def gru_gates_back(gates, gh, h_prev, dh):
    batch, hidden = h_prev.shape
    dgi = _empty(gates.shape, gates.dtype)
    dgh = _empty(gates.shape, gates.dtype)
    dh_prev = _empty((batch, hidden), gates.dtype)
    _cell_launch(_gru_gates_back_kernel, batch, hidden, dgi, dgh, dh_prev, gates, gh, h_prev, dh)
    return dgi, dgh, dh_prev


def lstm_cell_state(gates, c_prev):
    """LSTM cell state (see numpy_backend.lstm_cell_state): -> (c (B, H), act (B, 3H))."""
    batch, hidden = c_prev.shape
    c = _empty((batch, hidden), gates.dtype)
    act = _empty((batch, 3 * hidden), gates.dtype)
    _cell_launch(_lstm_cell_state_kernel, batch, hidden, c, act, gates, c_prev)
    return c, act


def lstm_cell_state_back(act, c_prev, dc):
    batch, hidden = c_prev.shape
    dgates = _empty((batch, 4 * hidden), act.dtype)
    dc_prev = _empty((batch, hidden), act.dtype)
    _cell_launch(_lstm_cell_state_back_kernel, batch, hidden, dgates, dc_prev, act, c_prev, dc)
    return dgates, dc_prev


def lstm_hidden(gates, c):
    """LSTM hidden state (see numpy_backend.lstm_hidden): -> (h (B, H), act (B, 2H))."""
    batch, hidden = c.shape
    h = _empty((batch, hidden), gates.dtype)
    act = _empty((batch, 2 * hidden), gates.dtype)
    _cell_launch(_lstm_hidden_kernel, batch, hidden, h, act, gates, c)
    return h, act


def lstm_hidden_back(act, dh):
    batch, hidden = dh.shape
    dgates = _empty((batch, 4 * hidden), act.dtype)
    dc = _empty((batch, hidden), act.dtype)
    _cell_launch(_lstm_hidden_back_kernel, batch, hidden, dgates, dc, act, dh)
    return dgates, dc


# ---------------------------------------------------------------- the simulator's arrays


def _simulator_arrays_like_device_arrays() -> None:
    """Make the simulator's device arrays behave as real ones on the host.

    The simulator wraps a numpy array and forwards every attribute and operator to it, and
    its ``shape`` refuses negative indexes (mimicking shapes inside kernels).  Code relying
    on either would pass under the simulator and fail on a GPU (a real DeviceNDArray has a
    plain tuple shape and no arithmetic, comparisons or numpy methods), so both are cut
    back to the real host API here.
    """
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    host_api = {"strides", "dtype", "size", "ndim", "flags", "squeeze"}

    def __getattr__(self, name):
        if name in host_api:
            return getattr(self._ary, name)
        raise AttributeError(f"a CUDA device array has no attribute {name!r} (copy it to the host "
                             f"with to_numpy first)")

    def __array__(self, dtype=None, copy=None):
        return self._ary.copy() if dtype is None else self._ary.astype(dtype)

    FakeCUDAArray.__getattr__ = __getattr__
    FakeCUDAArray.__array__ = __array__
    FakeCUDAArray.shape = property(lambda self: tuple(self._ary.shape))
    for operator in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__sub__",
                     "__mul__", "__floordiv__", "__truediv__", "__mod__", "__pow__"):
        if operator in FakeCUDAArray.__dict__:
            delattr(FakeCUDAArray, operator)
    FakeCUDAArray.__hash__ = object.__hash__


def _simulator_polls_politely() -> None:
    """Let the simulator's block manager give up the GIL while it waits.

    The manager busy-polls its threads (``is_alive``, ``syncthreads_blocked``) holding the
    GIL, so a thread waiting to pass a syncthreads gets to run only at Python's thread
    switch interval (5 ms): ten syncthreads of a 4-thread block took 75 ms, and 3.4 ms with
    a ``sleep(0)`` in each poll.
    """
    from numba.cuda.simulator.kernel import BlockThread

    def is_alive(self):
        time.sleep(0)
        return threading.Thread.is_alive(self)

    BlockThread.is_alive = is_alive


if SIMULATOR:
    _simulator_arrays_like_device_arrays()
    _simulator_polls_politely()


# ---------------------------------------------------------------- the table

KERNELS = {
    "asarray": asarray, "to_numpy": to_numpy, "zeros": zeros, "full": full, "astype": astype, "copy": copy,
    "add_": add_,
    **{name: _map(name) for name in scalar.MAPS},
    **{name: _zip(name) for name in scalar.ZIPS if name != "eq"}, "eq": _equal,
    **{name: _zip(name) for name in scalar.ZIPS3},
    "leaky_relu": leaky_relu, "leaky_relu_back": leaky_relu_back,
    "sum": _sum, "max": _max, "sum_to": sum_to, "max_back": max_back,
    "reshape": reshape, "permute": permute, "broadcast_to": broadcast_to, "getitem": getitem,
    "getitem_back": getitem_back, "cat": cat, "split": split, "stack": stack,
    "matmul": matmul, "matmul_nt": matmul_nt, "matmul_tn": matmul_tn,
    "softmax": softmax, "softmax_back": softmax_back, "log_softmax": log_softmax,
    "log_softmax_back": log_softmax_back, "masked_softmax": masked_softmax,
    "cross_entropy": cross_entropy, "cross_entropy_back": cross_entropy_back,
    "nll_loss": nll_loss, "nll_loss_back": nll_loss_back,
    "embedding": embedding, "embedding_back": embedding_back,
    "additive_scores": additive_scores, "additive_scores_back": additive_scores_back,
    "sdpa": sdpa, "sdpa_back": sdpa_back,
    "gru_gates": gru_gates, "gru_gates_back": gru_gates_back, "lstm_cell_state": lstm_cell_state,
    "lstm_cell_state_back": lstm_cell_state_back, "lstm_hidden": lstm_hidden,
    "lstm_hidden_back": lstm_hidden_back,
}
