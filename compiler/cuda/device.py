"""Launch configuration and grid geometry: what every kernel family uses."""

from __future__ import annotations

import functools
import os

import numba
import numpy as np
from numba import cuda

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


def launch(kernel, blocks, threads, *args, shared_bytes=0):
    kernel[blocks, threads, 0, shared_bytes](*args)


def nblocks(n: int, threads: int = THREADS) -> int:
    return max(1, min(MAX_BLOCKS, -(-n // threads)))


def empty(shape, dtype):
    return cuda.device_array(tuple(int(n) for n in shape), dtype=np.dtype(dtype))


def ravel(x):
    """A 1-D view of a contiguous device array (kernels index flat arrays)."""
    return x.reshape(x.size)


def c_strides(shape) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def broadcast_strides(shape, out_shape) -> tuple[int, ...]:
    """Element strides that read an array of ``shape`` as if broadcast to ``out_shape``."""
    own = c_strides(shape)
    lead = len(out_shape) - len(shape)
    return tuple(0 if i < lead or shape[i - lead] == 1 else own[i - lead] for i in range(len(out_shape)))


def collapse(shape, *strides):
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
def pos_at(i, shape, strides):
    """Offset of the i-th entry (C order) of ``shape`` in an array read with ``strides``."""
    offset = 0
    for d in range(len(shape) - 1, -1, -1):
        offset += (i % shape[d]) * strides[d]
        i //= shape[d]
    return offset


def per_dtype(build):
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
def no_mask(ndim: int):
    """A stand-in boolean array for kernels called without a mask (never read)."""
    return cuda.to_device(np.ones((1,) * ndim, dtype=np.bool_))
