"""Bahdanau's additive scores (+back), a thread per entry; the (N, T_q, T_k, A) pairs are
never stored."""

from __future__ import annotations

import math

from numba import cuda

from .device import THREADS, empty, launch, nblocks, per_dtype
from .memory import zeros
from .reduce import sum_axes


@per_dtype
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


@per_dtype
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
    e = empty((q.shape[0], q.shape[1], k.shape[1]), q.dtype)
    if e.size:
        launch(_additive_scores_kernel(q.dtype), nblocks(e.size), THREADS, e, q, k, v)
    return e


def additive_scores_back(q, k, v, de):
    # Every entry is written by the kernels below (a sum over no rows writes 0).
    dq = empty(q.shape, q.dtype)
    dk = empty(k.shape, k.dtype)
    dv_parts = empty(q.shape, q.dtype)                                         # (N, T_q, A)
    kernel = _additive_scores_back_kernel(q.dtype)
    if dq.size:
        launch(kernel, nblocks(dq.size), THREADS, dq, dv_parts, q, k, v, de, True)
    if dk.size:
        launch(kernel, nblocks(dk.size), THREADS, dk, dv_parts, k, q, v, de, False)
    dv = sum_axes(dv_parts, (0, 1), False) if dv_parts.size else zeros(v.shape, v.dtype)
    return dq, dk, dv


KERNELS = {"additive_scores": additive_scores, "additive_scores_back": additive_scores_back}
