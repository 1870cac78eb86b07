"""Bahdanau's additive scores (+back) fused: each tanh computed, weighted by v and summed in
one pass, never a (T_q, T_k, A) temporary."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import reference
from ..numba_support import FAST, cast_like, parallel_min, typed_tanh

# Below this many tanh evaluations (at a 10 µs launch; scaled by _scaled) a serial kernel
# wins: a core runs ~2000 float32 (q + k) tanh products a microsecond, so a second thread
# saves a 10 µs launch only beyond ~40K.
ADDITIVE_PARALLEL_MIN = 40960
_scaled = parallel_min        # tests replace it, as softmax.py's


@njit(cache=True, fastmath=FAST, error_model="numpy")
def _additive_row(q_i, k_n, v, e_i):
    """e_i[j] = v . tanh(q_i + k_n[j]) for one query of one batch entry."""
    for j in range(k_n.shape[0]):
        k_j = k_n[j]
        total = cast_like(q_i[0], 0.0)
        for a in range(q_i.shape[0]):
            total += v[a] * typed_tanh(q_i[a] + k_j[a])
        e_i[j] = total


@njit(cache=True, fastmath=FAST, error_model="numpy")
def _additive_scores_serial(q, k, v, e):
    for ni in range(q.shape[0] * q.shape[1]):
        n, i = ni // q.shape[1], ni % q.shape[1]
        _additive_row(q[n, i], k[n], v, e[n, i])


@njit(cache=True, fastmath=FAST, error_model="numpy", parallel=True)
def _additive_scores_parallel(q, k, v, e):
    for ni in prange(q.shape[0] * q.shape[1]):
        n, i = ni // q.shape[1], ni % q.shape[1]
        _additive_row(q[n, i], k[n], v, e[n, i])


@njit(cache=True, fastmath=FAST, error_model="numpy")
def _additive_back_entry(q_n, k_n, v, de_n, dq_n, dk_n, dv_n):
    """Gradients from one batch entry: dq_n, dk_n (owned by this entry) and its share dv_n
    of dv.  tanh is recomputed, not stored; pairs with a zero gradient (masked) are skipped."""
    for i in range(q_n.shape[0]):
        q_i, dq_i = q_n[i], dq_n[i]
        for j in range(k_n.shape[0]):
            d = de_n[i, j]
            if d == 0:
                continue
            k_j, dk_j = k_n[j], dk_n[j]
            for a in range(q_i.shape[0]):
                t = typed_tanh(q_i[a] + k_j[a])
                dv_n[a] += d * t
                g = d * (cast_like(t, 1.0) - t * t) * v[a]                # d e / d(q_i + k_j)
                dq_i[a] += g
                dk_j[a] += g


@njit(cache=True, fastmath=FAST, error_model="numpy")
def _additive_back_serial(q, k, v, de, dq, dk, dv_parts):
    for n in range(q.shape[0]):
        _additive_back_entry(q[n], k[n], v, de[n], dq[n], dk[n], dv_parts[n])


@njit(cache=True, fastmath=FAST, error_model="numpy", parallel=True)
def _additive_back_parallel(q, k, v, de, dq, dk, dv_parts):
    for n in prange(q.shape[0]):
        _additive_back_entry(q[n], k[n], v, de[n], dq[n], dk[n], dv_parts[n])


def additive_scores(q, k, v):
    """One fused pass: each tanh is computed, weighted by v and summed without a
    (T_q, T_k, A) temporary.  Parallel over (batch, query) pairs when big enough."""
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    e = np.empty((q.shape[0], q.shape[1], k.shape[1]), dtype=q.dtype)
    if e.size == 0 or q.shape[2] == 0:
        return reference.additive_scores(q, k, v)
    big = q.shape[0] * q.shape[1] * k.shape[1] * q.shape[2] >= _scaled(ADDITIVE_PARALLEL_MIN)
    (_additive_scores_parallel if big else _additive_scores_serial)(q, k, v, e)
    return e


def additive_scores_back(q, k, v, de):
    """Parallel over batch entries, so each writes only its own rows of dq and dk; dv is
    summed from per-entry parts."""
    q, k, v, de = (np.ascontiguousarray(x) for x in (q, k, v, de))
    if de.size == 0 or q.shape[2] == 0:
        return reference.additive_scores_back(q, k, v, de)
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    dv_parts = np.zeros((q.shape[0], v.shape[0]), dtype=v.dtype)
    big = q.shape[0] * q.shape[1] * k.shape[1] * q.shape[2] >= _scaled(ADDITIVE_PARALLEL_MIN)
    kernel = _additive_back_parallel if big and q.shape[0] > 1 else _additive_back_serial
    kernel(q, k, v, de, dq, dk, dv_parts)
    return dq, dk, dv_parts.sum(axis=0)


KERNELS = {"additive_scores": additive_scores, "additive_scores_back": additive_scores_back}
