"""Scaled dot-product attention (+back), blocked as the compiled kernels are, so they share
one reference."""

from __future__ import annotations

import numpy as np

from .linalg import matmul_nt, matmul_tn
from .movement import permute, reshape

SDPA_BLOCK = 128  # query rows per block: bounds the scores held at once to (N, 128, T_k)


def _sdpa_allowed(mask, causal, start, stop, t_k):
    """The (N or 1, stop - start, T_k) boolean block of positions a query block may attend to,
    or None when every position is allowed."""
    allowed = None if mask is None else mask[:, start:stop]
    if causal:
        tril = np.arange(t_k)[None, :] <= np.arange(start, stop)[:, None]   # key j <= query i
        allowed = tril[None] if allowed is None else allowed & tril
    return allowed


def heads_first(x, permute=permute, reshape=reshape):
    """(B, T, H, D), the heads in place as a projection's output reshapes to them -> (B H, T, D),
    head n = b H + h; (N, T, D) as it is.  ``permute`` and ``reshape`` are the device's."""
    if len(x.shape) == 3:
        return x
    B, T, H, D = x.shape
    return reshape(permute(x, (0, 2, 1, 3)), (B * H, T, D))


def heads_as(like, x, permute=permute, reshape=reshape):
    """The inverse of heads_first: (B H, T, D) -> ``like``'s layout."""
    if len(like.shape) == 3:
        return x
    B, _, H, _ = like.shape
    return permute(reshape(x, (B, H) + tuple(x.shape[1:])), (0, 2, 1, 3))


def sdpa(q, k, v, mask, scale, causal, with_weights=False):
    """Scaled dot-product attention without keeping the weights.

    q (N, T_q, D), k (N, T_k, D), v (N, T_k, D_v), or each (B, T, H, *) with the heads in
    place (head n = b H + h); mask None or boolean (N or 1, T_q, T_k), True = may attend;
    causal: key j <= query i.  Returns (o (N, T_q, D_v) or (B, T_q, H, D_v), lse (N, T_q)),
    the log-sum-exp of each row's scores, which is all backward needs to rebuild the
    weights.  Queries go one block at a time; each block sees every key, so its softmax is
    exact in one pass (no running rescaling).  A row with nothing to attend to gets o = 0
    and lse = -inf.

    ``with_weights``: also return the weights (N, T_q, T_k), as sdpa_weights gives them,
    written while they exist (for ``ta.attention.record``; backward never needs them).
    """
    out = _sdpa(heads_first(q), heads_first(k), heads_first(v), mask, scale, causal, with_weights)
    return (heads_as(q, out[0]),) + out[1:]


def _sdpa(q, k, v, mask, scale, causal, with_weights):
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
    """Gradients (dq, dk, dv) of sdpa, each in its input's layout, rebuilding each block's
    weights from lse: p = exp(s - lse), ds = p * (dp - sum(do * o)), with dp = do v^T."""
    grads = _sdpa_back(*(heads_first(x) for x in (q, k, v, o)), lse, heads_first(do), mask, scale, causal)
    return tuple(heads_as(x, g) for x, g in zip((q, k, v), grads, strict=True))


def _sdpa_back(q, k, v, o, lse, do, mask, scale, causal):
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
    q, k = heads_first(q), heads_first(k)
    s = matmul_nt(q * q.dtype.type(scale), k)                                     # (N, T_q, T_k)
    allowed = _sdpa_allowed(mask, causal, 0, q.shape[1], k.shape[1])
    lse = lse[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(s - lse)
    keep = np.isfinite(lse) if allowed is None else allowed & np.isfinite(lse)
    return np.where(keep, p, 0).astype(q.dtype, copy=False)


def prefix_length(position, t_k: int, where: str = "sdpa_prefix") -> int:
    """The keys ``sdpa_prefix`` reads: position + 1, ``position`` a 0-d (or (1,)) int array;
    a position outside 0 .. T_k - 1 is an error naming ``where``."""
    at = int(np.asarray(position).reshape(-1)[0])
    if not 0 <= at < t_k:
        raise IndexError(f"{where}: position {at} is outside the {t_k} keys of the cache")
    return at + 1


def sdpa_prefix(q, k, v, position, scale):
    """Attention of q (N, T_q, D) over the keys 0 .. position of k (N, L, D), v (N, L, D_v):
    a decoder's self-attention over its preallocated cache, the keys past the newest token
    never read (neither masked nor computed).  ``position``: a 0-d int64 array, read by the
    kernel, so a replayed plan serves every step.  Returns o (N, T_q, D_v); no lse (decoding
    has no backward).  Equals ``sdpa`` with the keys past ``position`` masked."""
    count = prefix_length(position, k.shape[1])
    return _sdpa(q, k[:, :count], v[:, :count], None, scale, False, False)[0]


KERNELS = {"sdpa": sdpa, "sdpa_back": sdpa_back, "sdpa_weights": sdpa_weights, "sdpa_prefix": sdpa_prefix}
