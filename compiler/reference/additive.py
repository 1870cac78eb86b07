"""Bahdanau's additive scores (+back), one query step at a time."""

from __future__ import annotations

import numpy as np


def additive_scores(q, k, v):
    """Bahdanau scores e[n, i, j] = v . tanh(q[n, i] + k[n, j]) for q (N, T_q, A),
    k (N, T_k, A), v (A,) -> (N, T_q, T_k).

    One (N, T_k, A) block per query step: the (N, T_q, T_k, A) tensor of every pair is never
    built, so memory stays that of the inputs however many queries there are.
    """
    e = np.empty((q.shape[0], q.shape[1], k.shape[1]), dtype=q.dtype)
    for i in range(q.shape[1]):
        e[:, i] = np.tanh(q[:, i, None, :] + k) @ v               # (N, T_k, A) @ (A,) -> (N, T_k)
    return e


def additive_scores_back(q, k, v, de):
    """Gradients (dq, dk, dv) of additive_scores; each tanh block is recomputed rather
    than stored, so backward needs no more memory than forward."""
    dq = np.empty_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    for i in range(q.shape[1]):
        t = np.tanh(q[:, i, None, :] + k)                           # (N, T_k, A)
        de_i = de[:, i, :, None]                                    # (N, T_k, 1)
        dv += np.sum(de_i * t, axis=(0, 1))                         # (A,)
        dpre = de_i * (1 - t * t) * v                               # (N, T_k, A): d e / d(q + k)
        dq[:, i] = np.sum(dpre, axis=1)                             # (N, A)
        dk += dpre
    return dq, dk, dv


KERNELS = {"additive_scores": additive_scores, "additive_scores_back": additive_scores_back}
