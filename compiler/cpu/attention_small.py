"""Scaled dot-product attention for many small heads (a Transformer over sentences: 128 heads
of 20 x 20 scores, D = 32; a decoding step's one query a head), with q, k, v as (B, T, H, D)
(head n = b H + h reads q[b, :, h] in place).  compiler/cpu/attention.py decides which of
the two ways below runs and shares the heads (or batch entries) between threads.

Few queries a head: forward, one Numba routine over the rows (``_attend_rows``), which both
``sdpa_small_serial`` and a decoding step's attention over its cache (``sdpa_prefix_serial``)
run; backward, one sweep per head (``sdpa_small_back_serial``).  Many: loops over 20 keys or
32 features are too short for LLVM's vectorised loops (measured ~7 GFMA/s), so ``sdpa_batched`` and
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


U = np.uint64     # the type of every index into the flattened arrays of ``_attend_rows``


@njit(cache=True, fastmath=FAST, error_model="numpy", nogil=True)
def _attend_rows(q, k, v, limit, mask, has_mask, causal, scale, o, lse, with_lse, weights, has_weights,
                 start, stop):
    """Heads start .. stop (n = b H + h) of q (B, T_q, H, D) over the keys 0 .. limit of k, v
    (B, T_k, H, D or D_v), all C-contiguous: o[b, :, h]; with ``with_lse`` lse[n]; with
    ``has_weights`` the weights' rows weights[n].  mask (N or 1, T_q, T_k), read if has_mask.

    The one routine of both decoding kernels, so that they make the same sums in the same
    order.  A row: the scores four keys at a time (four dot products share q's loads) and
    their max, the exps in a loop of their own (vectorised for float32), then the weighted
    sum of values four keys a pass over o's row, the weights' total alongside.  Hidden keys
    after the last visible one are not visited at all (a padded source's end), so a masked
    row and the same keys cut off by ``limit`` give equal sums bit for bit, and the keys and
    values past them are never read.

    Why it reads like this (measured at decoding's shapes, one thread): the arrays are
    flattened and indexed by unsigned offsets, which Numba does not wrap as it wraps negative
    signed indices (with signed offsets the kernel ran 4-5x slower; with 2-D row indices
    ~1.25x).  The row's math is written out here, not in a helper called per row, which cost
    1.7x at one key a head (the call, and reference counts on its array arguments).  Tried and not
    kept (no faster): eight keys a step, two accumulators for the weighted sum, padding the
    exps to whole vectors, a separate pass for the weighted sum without reassociation."""
    t_q, heads, depth = q.shape[1], q.shape[2], U(q.shape[3])
    t_k, depth_v = k.shape[1], U(v.shape[3])
    qf, kf, vf, of, keeps = q.reshape(-1), k.reshape(-1), v.reshape(-1), o.reshape(-1), mask.reshape(-1)
    row = weights.reshape(-1) if has_weights else np.empty(t_k, dtype=q.dtype)
    k_step, v_step = U(heads) * depth, U(heads) * depth_v        # from one key of a head to the next
    zero, hidden = cast_like(scale, 0.0), cast_like(scale, -np.inf)
    for n in range(start, stop):
        b, h = n // heads, n % heads
        k_first, v_first = U(b * t_k * heads + h) * depth, U(b * t_k * heads + h) * depth_v
        for i in range(t_q):
            q_at, o_at = U((b * t_q + i) * heads + h) * depth, U((b * t_q + i) * heads + h) * depth_v
            m_at = U((min(n, mask.shape[0] - 1) * mask.shape[1] + (i if has_mask else 0)) * t_k)
            r = U((n * t_q + i) * t_k) if has_weights else U(0)
            count = U(min(limit, i + 1) if causal else limit)
            if has_mask:
                while count > 0 and not keeps[m_at + count - U(1)]:
                    count -= U(1)
            quads = count - count % U(4)
            m = hidden
            for j in range(U(0), quads, U(4)):
                k0 = k_first + j * k_step
                k1 = k0 + k_step
                k2 = k1 + k_step
                k3 = k2 + k_step
                s0 = s1 = s2 = s3 = zero
                for d in range(depth):
                    x = qf[q_at + d]
                    s0 += x * kf[k0 + d]
                    s1 += x * kf[k1 + d]
                    s2 += x * kf[k2 + d]
                    s3 += x * kf[k3 + d]
                s0, s1, s2, s3 = s0 * scale, s1 * scale, s2 * scale, s3 * scale
                if has_mask:
                    s0 = s0 if keeps[m_at + j] else hidden
                    s1 = s1 if keeps[m_at + j + U(1)] else hidden
                    s2 = s2 if keeps[m_at + j + U(2)] else hidden
                    s3 = s3 if keeps[m_at + j + U(3)] else hidden
                m = max(m, max(max(s0, s1), max(s2, s3)))
                row[r + j], row[r + j + U(1)], row[r + j + U(2)], row[r + j + U(3)] = s0, s1, s2, s3
            for j in range(quads, count):
                kj = k_first + j * k_step
                s0 = zero
                for d in range(depth):
                    s0 += qf[q_at + d] * kf[kj + d]
                s0 = s0 * scale if not has_mask or keeps[m_at + j] else hidden
                m = max(m, s0)
                row[r + j] = s0
            if has_weights:
                for j in range(count, U(t_k)):
                    row[r + j] = zero
            for d in range(depth_v):
                of[o_at + d] = zero
            if not math.isfinite(m):                     # nothing to attend to
                for j in range(count):
                    row[r + j] = zero
                if with_lse:
                    lse[n, i] = -np.inf
                continue
            for j in range(count):
                row[r + j] = typed_exp(row[r + j] - m)    # hidden: exp(-inf) = 0
            total = zero                                 # in the weighted sum's order
            for j in range(U(0), quads, U(4)):
                p0, p1, p2, p3 = row[r + j], row[r + j + U(1)], row[r + j + U(2)], row[r + j + U(3)]
                total += (p0 + p1) + (p2 + p3)
                v0 = v_first + j * v_step
                v1 = v0 + v_step
                v2 = v1 + v_step
                v3 = v2 + v_step
                for d in range(depth_v):
                    of[o_at + d] += (p0 * vf[v0 + d] + p1 * vf[v1 + d]) + (p2 * vf[v2 + d] + p3 * vf[v3 + d])
            for j in range(quads, count):
                p0 = row[r + j]
                total += p0
                vj = v_first + j * v_step
                for d in range(depth_v):
                    of[o_at + d] += p0 * vf[vj + d]
            inv = cast_like(scale, 1.0) / total
            for d in range(depth_v):
                of[o_at + d] *= inv
            if has_weights:
                for j in range(count):
                    row[r + j] *= inv
            if with_lse:
                lse[n, i] = m + math.log(total)


@njit(cache=True, nogil=True)
def sdpa_small_serial(q, k, v, mask, has_mask, causal, scale, o, lse, weights, has_weights, start, stop):
    _attend_rows(q, k, v, k.shape[1], mask, has_mask, causal, scale, o, lse, True, weights, has_weights,
                 start, stop)


@njit(cache=True, nogil=True)
def sdpa_prefix_serial(q, k, v, count, scale, o):
    """o[n, i] = softmax(q[n, i] . k[n, :count] scale) v[n, :count] for every head n and query
    i (q (N, T_q, D), k (N, L, D), v (N, L, D_v), 1 <= count <= L): a decoding step's
    self-attention over the filled part of its cache, by ``_attend_rows`` as
    ``sdpa_small_serial`` takes an unmasked row (the same sums in the same order)."""
    n, t_q, length = q.shape[0], q.shape[1], k.shape[1]
    _attend_rows(q.reshape(n, t_q, 1, q.shape[2]), k.reshape(n, length, 1, k.shape[2]),
                 v.reshape(n, length, 1, v.shape[2]), count, np.ones((1, 1, 1), dtype=np.bool_), False,
                 False, scale, o.reshape(n, t_q, 1, o.shape[2]), np.empty((1, 1), dtype=q.dtype), False,
                 np.empty((1, 1, 1), dtype=q.dtype), False, 0, n)


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
