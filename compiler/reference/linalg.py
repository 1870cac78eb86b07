"""Matrix products: matmul and the transposed forms the backward needs."""

from __future__ import annotations

import numpy as np


def matmul(a, b):
    if a.ndim >= 2 and b.ndim >= 2 and a.shape[-1] == 1 and b.shape[-2] == 1:
        # Inner size 1 is an outer product, which numpy's batched matmul loops over 3-4x
        # slower than a broadcast multiply (a decoder step's d(keys) = a^T @ d(context)).
        return np.multiply(a, b)
    return np.matmul(a, b)


def matmul_nt(a, b):
    """a @ b^T over the last two axes.  The transpose is a view: BLAS reads it in place
    (a transposed operand is just a flag to GEMM), so no copy of b is made."""
    return matmul(a, b.swapaxes(-1, -2))


def matmul_tn(a, b):
    """a^T @ b over the last two axes, reading a^T in place (see matmul_nt)."""
    return matmul(a.swapaxes(-1, -2), b)


KERNELS = {"matmul": matmul, "matmul_nt": matmul_nt, "matmul_tn": matmul_tn}
