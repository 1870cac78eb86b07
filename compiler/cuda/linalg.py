"""Matrix products, tiled through shared memory: ``matmul``, ``matmul_nt``, ``matmul_tn``."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .device import MAX_GRID_AXIS, TILE, c_strides, empty, launch, per_dtype, pos_at, ravel
from .memory import zeros
from .movement import reshape


@per_dtype
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
            a0 = pos_at(z, batch_shape, a_batch)
            b0 = pos_at(z, batch_shape, b_batch)
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
    own = c_strides(x.shape)[:-2]
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
    a_rows, a_cols = a.shape[-2:]
    b_rows, b_cols = b.shape[-2:]
    n, inner = (a_cols, a_rows) if a_transposed else (a_rows, a_cols)
    inner_b, m = (b_cols, b_rows) if b_transposed else (b_rows, b_cols)
    if inner != inner_b:
        raise ValueError(f"matmul: inner dimensions differ ({inner} != {inner_b}) for shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    batch = tuple(np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])))
    dtype = np.result_type(a.dtype, b.dtype)
    n_batch = math.prod(batch)
    if inner == 0:
        out = zeros(batch + (n, m), dtype)
    else:
        out = empty(batch + (n, m), dtype)
    if out.size and inner:
        a_rs, a_cs = (1, a_cols) if a_transposed else (a_cols, 1)
        b_rs, b_cs = (1, b_cols) if b_transposed else (b_cols, 1)
        batch_shape, a_batch, b_batch = (batch, _batch_strides(a, batch), _batch_strides(b, batch)) if batch \
            else ((1,), (0,), (0,))
        grid = tuple(min(count, MAX_GRID_AXIS) for count in (-(-m // TILE), -(-n // TILE), n_batch))
        launch(_matmul_kernel(dtype), grid, (TILE, TILE), ravel(out), ravel(a), ravel(b), n, m, inner,
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


# ---------------------------------------------------------------- the table

KERNELS = {"matmul": matmul, "matmul_nt": matmul_nt, "matmul_tn": matmul_tn}
