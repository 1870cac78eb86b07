"""Attention: Bahdanau's additive scores (+back) and scaled dot-product attention (+back),
blocked with an online softmax as the compiled kernels are, so they share one reference."""

from __future__ import annotations

import numpy as np

from .linalg import matmul_nt, matmul_tn


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


SDPA_BLOCK = 128  # query rows per block: bounds the scores held at once to (N, 128, T_k)


def _sdpa_allowed(mask, causal, start, stop, t_k):
    """The (N or 1, stop - start, T_k) boolean block of positions a query block may attend to,
    or None when every position is allowed."""
    allowed = None if mask is None else mask[:, start:stop]
    if causal:
        tril = np.arange(t_k)[None, :] <= np.arange(start, stop)[:, None]   # key j <= query i
        allowed = tril[None] if allowed is None else allowed & tril
    return allowed


def sdpa(q, k, v, mask, scale, causal, with_weights=False):
    """Scaled dot-product attention without keeping the weights.

    q (N, T_q, D), k (N, T_k, D), v (N, T_k, D_v); mask None or boolean (N or 1, T_q, T_k),
    True = may attend; causal: key j <= query i.  Returns (o (N, T_q, D_v), lse (N, T_q)),
    the log-sum-exp of each row's scores, which is all backward needs to rebuild the
    weights.  Queries go one block at a time; each block sees every key, so its softmax is
    exact in one pass (no running rescaling).  A row with nothing to attend to gets o = 0
    and lse = -inf.

    ``with_weights``: also return the weights (N, T_q, T_k), as sdpa_weights gives them,
    written while they exist (for ``ta.attention.record``; backward never needs them).
    """
    n, t_q, _ = q.shape
    t_k = k.shape[1]
    o = np.empty((n, t_q, v.shape[2]), dtype=q.dtype)
    lse = np.empty((n, t_q), dtype=q.dtype)
    weights = np.empty((n, t_q, t_k), dtype=q.dtype) if with_weights else None
    for start in range(0, t_q, SDPA_BLOCK):
        stop = min(start + SDPA_BLOCK, t_q)
        s = matmul_nt(q[:, start:stop] * q.dtype.type(scale), k)                # (N, b, T_k)
        allowed = _sdpa_allowed(mask, causal, start, stop, t_k)
        if allowed is not None:
            s = np.where(allowed, s, -np.inf).astype(q.dtype, copy=False)
        m = np.max(s, axis=-1, keepdims=True)
        m[~np.isfinite(m)] = 0
        p = np.exp(s - m)
        total = np.sum(p, axis=-1, keepdims=True)
        with np.errstate(divide="ignore"):
            lse[:, start:stop] = (m + np.log(total))[..., 0]
        total[total == 0] = 1
        o[:, start:stop] = np.matmul(p, v) / total                               # (N, b, D_v)
        if with_weights:
            weights[:, start:stop] = p / total
    return (o, lse, weights) if with_weights else (o, lse)


def sdpa_back(q, k, v, o, lse, do, mask, scale, causal):
    """Gradients (dq, dk, dv) of sdpa, rebuilding each block's weights from lse:
    p = exp(s - lse), ds = p * (dp - sum(do * o)), with dp = do v^T."""
    t_k = k.shape[1]
    dq = np.empty_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    delta = np.sum(do * o, axis=-1)                                              # (N, T_q)
    for start in range(0, q.shape[1], SDPA_BLOCK):
        stop = min(start + SDPA_BLOCK, q.shape[1])
        qb = q[:, start:stop] * q.dtype.type(scale)
        s = matmul_nt(qb, k)                                                     # (N, b, T_k)
        lse_b = lse[:, start:stop, None]
        allowed = _sdpa_allowed(mask, causal, start, stop, t_k)
        if allowed is not None:
            s = np.where(allowed, s, -np.inf).astype(q.dtype, copy=False)
        with np.errstate(invalid="ignore"):
            p = np.exp(s - lse_b)                                                # -inf - -inf: NaN
        p[~np.isfinite(lse_b[..., 0])] = 0                                       # rows with no key
        dob = do[:, start:stop]
        dv += matmul_tn(p, dob)                                                  # (N, T_k, D_v)
        ds = p * (matmul_nt(dob, v) - delta[:, start:stop, None])                # (N, b, T_k)
        dq[:, start:stop] = np.matmul(ds, k) * q.dtype.type(scale)
        dk += matmul_tn(ds, qb)
    return dq, dk, dv


def sdpa_weights(q, k, lse, mask, scale, causal):
    """The weights sdpa never kept, rebuilt from its lse: p = exp(q k^T scale - lse), 0 where
    masked (or causally hidden) and on rows with nothing to attend to; (N, T_q, T_k).  One
    product and one exp: no max or sum over the row, which sdpa already took."""
    s = matmul_nt(q * q.dtype.type(scale), k)                                     # (N, T_q, T_k)
    allowed = _sdpa_allowed(mask, causal, 0, q.shape[1], k.shape[1])
    lse = lse[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(s - lse)
    keep = np.isfinite(lse) if allowed is None else allowed & np.isfinite(lse)
    return np.where(keep, p, 0).astype(q.dtype, copy=False)


KERNELS = {
    "additive_scores": additive_scores, "additive_scores_back": additive_scores_back, "sdpa": sdpa,
    "sdpa_back": sdpa_back, "sdpa_weights": sdpa_weights,
}
