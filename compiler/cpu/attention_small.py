"""Scaled dot-product attention for many small heads (a Transformer over sentences: 128 heads
of 20 x 20 scores, D = 32; a decoding step's one query a head), with q, k, v as (B, T, H, D)
(head n = b H + h reads q[b, :, h] in place).  compiler/cpu/attention.py decides which of
the two ways below runs and shares the heads (or batch entries) between threads.

Few queries a head: one Numba sweep per head (``sdpa_small_serial``, ``sdpa_small_back_serial``),
scores, softmax and weighted sums in registers.  Many: its loops over 20 keys or 32 features
are too short for LLVM's vectorised loops (measured ~7 GFMA/s), so ``sdpa_batched`` and
``sdpa_back_batched`` hand every product to numpy's stacked matmul over the (B, H) heads, read
in place as strided views (BLAS, ~50 GFMA/s at this size: ~60 us for 128 heads' q k^T), and
do the softmax and its backward in one Numba pass each over the scores, in place.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..numba_support import FAST, cast_like, typed_exp


@njit(cache=True, fastmath=FAST, nogil=True)
def _dot(a, b):
    total = cast_like(a[0], 0.0)
    for d in range(a.shape[0]):
        total += a[d] * b[d]
    return total


@njit(cache=True, fastmath=FAST, error_model="numpy")
def _sdpa_small_head(n, q, k, v, mask, has_mask, causal, scale, o, lse, scores, weights, has_weights):
    """Head n = b H + h: o[b, :, h], lse[n] from q[b, :, h] (T_q, D), k[b, :, h], v[b, :, h];
    ``scores`` a (T_k,) scratch row, or with ``has_weights`` the weights' own row, which then
    keeps exp(s - m) / total."""
    t_q, t_k = q.shape[1], k.shape[1]
    b, h = n // q.shape[2], n % q.shape[2]
    keep_all = mask[n if mask.shape[0] > 1 else 0]
    for i in range(t_q):
        q_i, o_i = q[b, i, h], o[b, i, h]
        row = weights[n, i] if has_weights else scores
        keep = keep_all[i if has_mask else 0]
        stop = min(i + 1, t_k) if causal else t_k
        m = cast_like(q_i[0], -np.inf)
        for j in range(stop):
            if has_mask and not keep[j]:
                row[j] = -np.inf
                continue
            e = _dot(q_i, k[b, j, h]) * scale
            row[j] = e
            m = max(m, e)
        for j in range(stop, t_k):
            row[j] = -np.inf
        for d in range(o_i.shape[0]):
            o_i[d] = 0.0
        if not math.isfinite(m):                     # nothing to attend to
            lse[n, i] = -np.inf
            for j in range(t_k):
                row[j] = 0.0
            continue
        total = cast_like(m, 0.0)
        for j in range(stop):
            p = typed_exp(row[j] - m)                     # masked: exp(-inf) = 0
            row[j] = p
            total += p
            v_j = v[b, j, h]
            for d in range(o_i.shape[0]):
                o_i[d] += p * v_j[d]
        for j in range(stop, t_k):
            row[j] = 0.0
        inv = cast_like(m, 1.0) / total
        for d in range(o_i.shape[0]):
            o_i[d] *= inv
        if has_weights:
            for j in range(stop):
                row[j] *= inv
        lse[n, i] = m + math.log(total)


@njit(cache=True, nogil=True)
def sdpa_small_serial(q, k, v, mask, has_mask, causal, scale, o, lse, weights, has_weights, start, stop):
    scores = np.empty(k.shape[1], dtype=q.dtype)
    for n in range(start, stop):
        _sdpa_small_head(n, q, k, v, mask, has_mask, causal, scale, o, lse, scores, weights, has_weights)


@njit(cache=True, fastmath=FAST, error_model="numpy", nogil=True)
def sdpa_prefix_serial(q, k, v, count, scale, o):
    """o[n, i] = softmax(q[n, i] . k[n, :count] scale) v[n, :count] for every head n and query
    i (q (N, T_q, D), k (N, L, D), v (N, L, D_v), 1 <= count <= L): a decoding step's
    self-attention over the filled part of its cache, as ``_sdpa_small_head`` computes an
    unmasked row (the same sums in the same order)."""
    scores = np.empty(count, dtype=q.dtype)
    for n in range(q.shape[0]):
        for i in range(q.shape[1]):
            q_i, o_i = q[n, i], o[n, i]
            m = cast_like(q_i[0], -np.inf)
            for j in range(count):
                e = _dot(q_i, k[n, j]) * scale
                scores[j] = e
                m = max(m, e)
            for d in range(o_i.shape[0]):
                o_i[d] = 0.0
            total = cast_like(m, 0.0)
            for j in range(count):
                p = typed_exp(scores[j] - m)
                total += p
                v_j = v[n, j]
                for d in range(o_i.shape[0]):
                    o_i[d] += p * v_j[d]
            inv = cast_like(m, 1.0) / total
            for d in range(o_i.shape[0]):
                o_i[d] *= inv


@njit(cache=True, fastmath=FAST, error_model="numpy")
def _sdpa_small_back_head(n, q, k, v, o, lse, do, mask, has_mask, causal, scale, dq, dk, dv):
    """Head n's gradients, each weight rebuilt from lse: p = exp(q.k scale - lse),
    ds = p (do.v - do.o); dq += ds k scale, dk += ds q scale, dv += p do."""
    t_q, t_k = q.shape[1], k.shape[1]
    b, h = n // q.shape[2], n % q.shape[2]
    keep_all = mask[n if mask.shape[0] > 1 else 0]
    for i in range(t_q):
        q_i, do_i, dq_i = q[b, i, h], do[b, i, h], dq[b, i, h]
        lse_i = lse[n, i]
        if not math.isfinite(lse_i):                 # a row that saw nothing: no gradient
            continue
        keep = keep_all[i if has_mask else 0]
        stop = min(i + 1, t_k) if causal else t_k
        delta = _dot(do_i, o[b, i, h])
        for j in range(stop):
            if has_mask and not keep[j]:
                continue
            k_j, v_j, dk_j, dv_j = k[b, j, h], v[b, j, h], dk[b, j, h], dv[b, j, h]
            p = typed_exp(_dot(q_i, k_j) * scale - lse_i)
            ds = p * (_dot(do_i, v_j) - delta)
            for d in range(dv_j.shape[0]):
                dv_j[d] += p * do_i[d]
            for d in range(q_i.shape[0]):
                dq_i[d] += ds * k_j[d]
                dk_j[d] += ds * q_i[d] * scale
        for d in range(q_i.shape[0]):
            dq_i[d] *= scale


@njit(cache=True, nogil=True)
def sdpa_small_back_serial(q, k, v, o, lse, do, mask, has_mask, causal, scale, dq, dk, dv, start, stop):
    for n in range(start, stop):
        _sdpa_small_back_head(n, q, k, v, o, lse, do, mask, has_mask, causal, scale, dq, dk, dv)


# ---------------------------------------------------------------- many queries: BLAS products


@njit(cache=True, fastmath=FAST, nogil=True)
def _exp_all(flat):
    """In place, one long loop that LLVM vectorises (a row's 20 keys are too few for that:
    the exps, row by row, took ~45 ns a row of 20 against ~5 this way)."""
    for t in range(flat.shape[0]):
        flat[t] = typed_exp(flat[t])


@njit(cache=True, fastmath=FAST, nogil=True, error_model="numpy")
def _shift_scores(s, mask, has_mask, causal, scale, shift, by_max):
    """In place: s (n, T_q, T_k) unscaled scores -> s scale - shift, -inf where a key is
    hidden (masked, or causally after the query).  by_max: shift (n, T_q) gets each row's
    max first (-inf for a row with nothing to see, whose entries all become -inf); else
    shift holds each row's lse, -inf likewise."""
    n, t_q, t_k = s.shape
    last_mask = mask.shape[0] - 1
    hidden = cast_like(scale, -np.inf)
    for a in range(n):
        keep_all = mask[min(a, last_mask)]
        for i in range(t_q):
            row, keep = s[a, i], keep_all[i if has_mask else 0]
            stop = min(i + 1, t_k) if causal else t_k
            for j in range(stop):
                x = row[j] * scale
                row[j] = hidden if has_mask and not keep[j] else x
            for j in range(stop, t_k):
                row[j] = hidden
            if by_max:
                m = hidden
                for j in range(stop):
                    m = max(m, row[j])
                shift[a, i] = m
            m = shift[a, i]
            if math.isfinite(m):
                for j in range(stop):
                    row[j] -= m
            else:
                for j in range(stop):
                    row[j] = hidden


@njit(cache=True, fastmath=FAST, nogil=True, error_model="numpy")
def _softmax_scores(s, mask, has_mask, causal, scale, lse):
    """In place: s (n, T_q, T_k), the heads' unscaled scores q k^T -> the weights
    softmax(s scale) with hidden keys 0; lse (n, T_q) each row's log-sum-exp of s scale,
    -inf (and weights 0) for a row that may see nothing."""
    _shift_scores(s, mask, has_mask, causal, scale, lse, True)
    _exp_all(s.reshape(-1))
    for a in range(s.shape[0]):
        for i in range(s.shape[1]):
            row = s[a, i]
            total = cast_like(scale, 0.0)
            for j in range(row.shape[0]):
                total += row[j]
            if total > 0:
                inv = cast_like(scale, 1.0) / total
                for j in range(row.shape[0]):
                    row[j] *= inv
                lse[a, i] += math.log(total)


@njit(cache=True, fastmath=FAST, nogil=True, error_model="numpy")
def _dscores(s, dp, mask, has_mask, causal, scale, lse, o, do):
    """In place, for the n = b H heads of o, do (b, T_q, H, D_v): s (n, T_q, T_k), the
    unscaled scores -> the weights p = exp(s scale - lse) (0 where hidden or the row saw
    nothing); dp = do v^T -> ds scale = p (dp - do.o) scale, the scores' gradient times
    scale, so that dq = ds k and dk = ds^T q need no further scaling."""
    _shift_scores(s, mask, has_mask, causal, scale, lse, False)
    _exp_all(s.reshape(-1))
    heads = o.shape[2]
    for a in range(s.shape[0]):
        b, h = a // heads, a % heads
        for i in range(s.shape[1]):
            p, ds, o_i, do_i = s[a, i], dp[a, i], o[b, i, h], do[b, i, h]
            delta = cast_like(scale, 0.0)
            for d in range(o_i.shape[0]):
                delta += do_i[d] * o_i[d]
            for j in range(p.shape[0]):
                ds[j] = p[j] * (ds[j] - delta) * scale


def _heads_first(x):
    """(b, T, H, D) -> the (b, H, T, D) view that numpy's stacked matmul reads in place."""
    return x.transpose(0, 2, 1, 3)


def sdpa_batched(q, k, v, mask, scale, causal, o, lse, weights, entries):
    """Batch entries ``entries`` (a range of b): o[b] (T_q, H, D_v), lse and, with
    ``weights`` (N, T_q, T_k), the weights of their heads.  mask: (N or 1, T_q, T_k) bool,
    or None."""
    b0, b1 = entries.start, entries.stop
    heads = q.shape[2]
    rows = slice(b0 * heads, b1 * heads)
    qs, ks, vs = (_heads_first(x[b0:b1]) for x in (q, k, v))
    s = np.matmul(qs, ks.transpose(0, 1, 3, 2), out=None if weights is None else
                  weights[rows].reshape(b1 - b0, heads, q.shape[1], k.shape[1]))
    s3 = s.reshape(-1, q.shape[1], k.shape[1])
    has_mask = mask is not None
    mask = mask[rows] if has_mask and mask.shape[0] > 1 else mask
    _softmax_scores(s3, mask if has_mask else np.ones((1, 1, 1), np.bool_), has_mask, causal,
                    scale, lse[rows])
    np.matmul(s, vs, out=_heads_first(o[b0:b1]))


def sdpa_back_batched(q, k, v, o, lse, do, mask, scale, causal, dq, dk, dv, entries):
    """Batch entries ``entries``' gradients, each written whole: the scores again by BLAS,
    the weights and ds by one Numba pass, then dv = p^T do, dq = ds k, dk = ds^T q."""
    b0, b1 = entries.start, entries.stop
    heads = q.shape[2]
    rows = slice(b0 * heads, b1 * heads)
    qs, ks, vs, dos = (_heads_first(x[b0:b1]) for x in (q, k, v, do))
    s = np.matmul(qs, ks.transpose(0, 1, 3, 2))                             # (b, H, T_q, T_k)
    dp = np.matmul(dos, vs.transpose(0, 1, 3, 2))
    has_mask = mask is not None
    mask = mask[rows] if has_mask and mask.shape[0] > 1 else mask
    shape = (-1, q.shape[1], k.shape[1])
    _dscores(s.reshape(shape), dp.reshape(shape), mask if has_mask else np.ones((1, 1, 1), np.bool_),
             has_mask, causal, scale, lse[rows], o[b0:b1], do[b0:b1])
    np.matmul(s.transpose(0, 1, 3, 2), dos, out=_heads_first(dv[b0:b1]))
    np.matmul(dp, ks, out=_heads_first(dq[b0:b1]))
    np.matmul(dp.transpose(0, 1, 3, 2), qs, out=_heads_first(dk[b0:b1]))
