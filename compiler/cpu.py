"""Numba kernels for the "cpu" device: softmax-shaped work fused into one pass per row, and
the fused attention kernels (additive scores, scaled dot-product).

These override the numpy reference kernels of the same names (``KERNELS`` below); every
other kernel of the device stays the reference one.  Matrix products stay on numpy's BLAS:
a hand-written Numba GEMM reaches ~60 GFLOP/s here against BLAS's ~190, so the fused
attention kernels call BLAS for their products and Numba for everything between them.

Softmax-shaped work (max, exp, sum, divide; its backward; cross-entropy) costs numpy four
to seven passes over memory and a temporary per pass; a Numba row kernel does it in two
passes without temporaries, rows in parallel.  Of the elementwise maps only those numpy
runs as several passes are compiled (sigmoid, 14x faster; the ``*_back`` products, 1.2-1.5x):
numpy's own tanh, exp and arithmetic already run at SIMD speed.

exp (and tanh, for the additive scores) dominates all of these: they come from
``numba_support``, polynomials that vectorise for float32 and libm for float64.

Every kernel is compiled on first use and cached on disk (``cache=True``); signatures are
kept few by passing C-contiguous 2-D/3-D arrays only.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numba
import numpy as np
from numba import float32, float64, njit, prange, vectorize

from . import numpy_backend as reference
from . import scalar, threads
from .numba_support import FAST, _exp, _like, _sigmoid, _tanh, parallel_min

__all__ = ["KERNELS"]


# ---------------------------------------------------------------- elementwise maps

# numba.vectorize makes numpy ufuncs (broadcasting, any layout) of the scalar formulas in
# compiler/scalar.py; explicit signatures compile them at import, from the disk cache after
# the first time.  Serial: these are memory-bound, and a second thread did not pay here.
_UNARY = [float32(float32), float64(float64)]
_BINARY = [float32(float32, float32), float64(float64, float64)]
_MAP = {"cache": True, "fastmath": FAST}


@vectorize(_UNARY, **_MAP)
def _sigmoid_map(x):
    return _sigmoid(x)      # numba_support's: the vectorising float32 exp inside


_tanh_back_map = vectorize(_BINARY, **_MAP)(scalar.tanh_back)
_sigmoid_back_map = vectorize(_BINARY, **_MAP)(scalar.sigmoid_back)
_relu_back_map = vectorize(_BINARY, **_MAP)(scalar.relu_back)


# ---------------------------------------------------------------- row kernels

# Each row kernel is a function of one row index (``_*_row``) run by a serial or a parallel
# loop.  Waking the second thread costs 9-90 µs (numba_support.launch_us), so small inputs
# (a decoder step's softmax over 20 source positions for a batch of 32) take the serial loop.
PARALLEL_MIN = 12288          # entries from which the parallel loop pays, at a 10 µs launch
_scaled = parallel_min        # ... and at this process's launch cost (tests replace it)


@njit(cache=True, fastmath=FAST)
def _softmax_row(r, x, mask, has_mask, out):
    """Softmax of row r of x (R, N) into out, over the entries where mask (R, N) is True
    when has_mask (else every entry; mask is then a dummy)."""
    row, y = x[r], out[r]
    keep = mask[r if has_mask else 0]
    m = _like(row[0], -np.inf)
    for j in range(row.shape[0]):
        if keep[j] or not has_mask:
            m = max(m, row[j])
    if not math.isfinite(m):
        m = _like(row[0], 0.0)                   # nothing finite: exp gives zeros below
    total = 0.0
    if has_mask:
        for j in range(row.shape[0]):
            e = _exp(row[j] - m) if keep[j] else _like(row[0], 0.0)
            y[j] = e
            total += e
    else:
        for j in range(row.shape[0]):
            e = _exp(row[j] - m)
            y[j] = e
            total += e
    scale = _like(row[0], 1.0 / total if total > 0 else 0.0)
    for j in range(row.shape[0]):
        y[j] *= scale


@njit(cache=True, fastmath=FAST)
def _softmax_back_row(r, y, dy, dx):
    yr, dyr, dxr = y[r], dy[r], dx[r]
    s = 0.0
    for j in range(yr.shape[0]):
        s += yr[j] * dyr[j]
    s = _like(yr[0], s)
    for j in range(yr.shape[0]):
        dxr[j] = yr[j] * (dyr[j] - s)


@njit(cache=True, fastmath=FAST)
def _row_logsumexp(row):
    """log(sum(exp(row))), shifted by the row max so exp never overflows.  A row with
    nothing finite gives 0 (not NaN): x - 0 = -inf is then the log of softmax's zeros."""
    m = _like(row[0], -np.inf)
    for j in range(row.shape[0]):
        m = max(m, row[j])
    if not math.isfinite(m):
        m = _like(row[0], 0.0)
    total = 0.0
    for j in range(row.shape[0]):
        total += _exp(row[j] - m)
    return m + math.log(total) if total > 0 else m


@njit(cache=True, fastmath=FAST)
def _log_softmax_row(r, x, out):
    row, y = x[r], out[r]
    lse = _row_logsumexp(row)
    for j in range(row.shape[0]):
        y[j] = row[j] - lse


@njit(cache=True, fastmath=FAST)
def _log_softmax_back_row(r, y, dy, dx):
    yr, dyr, dxr = y[r], dy[r], dx[r]
    s = 0.0
    for j in range(yr.shape[0]):
        s += dyr[j]
    s = _like(yr[0], s)
    for j in range(yr.shape[0]):
        dxr[j] = dyr[j] - _exp(yr[j]) * s


@njit(cache=True, fastmath=FAST)
def _cross_entropy_row(r, logits, target, ignore_index, loss, lse):
    row = logits[r]
    lse[r] = _row_logsumexp(row)
    loss[r] = lse[r] - row[target[r]] if target[r] != ignore_index else 0.0


@njit(cache=True, fastmath=FAST)
def _cross_entropy_back_row(r, logits, lse, target, ignore_index, dloss, dx):
    row, out = logits[r], dx[r]
    if target[r] == ignore_index:
        for j in range(row.shape[0]):
            out[j] = 0.0
        return
    g = dloss[r]
    for j in range(row.shape[0]):
        out[j] = _exp(row[j] - lse[r]) * g
    out[target[r]] -= g


# The loops.  A prange index is unsigned: rows are passed on as int64.


@njit(cache=True, fastmath=FAST)
def _softmax_serial(x, mask, has_mask, out):
    for r in range(x.shape[0]):
        _softmax_row(r, x, mask, has_mask, out)


@njit(cache=True, fastmath=FAST, parallel=True)
def _softmax_parallel(x, mask, has_mask, out):
    for r in prange(x.shape[0]):
        _softmax_row(np.int64(r), x, mask, has_mask, out)


@njit(cache=True, fastmath=FAST)
def _softmax_back_serial(y, dy, dx):
    for r in range(y.shape[0]):
        _softmax_back_row(r, y, dy, dx)


@njit(cache=True, fastmath=FAST, parallel=True)
def _softmax_back_parallel(y, dy, dx):
    for r in prange(y.shape[0]):
        _softmax_back_row(np.int64(r), y, dy, dx)


@njit(cache=True, fastmath=FAST)
def _log_softmax_serial(x, out):
    for r in range(x.shape[0]):
        _log_softmax_row(r, x, out)


@njit(cache=True, fastmath=FAST, parallel=True)
def _log_softmax_parallel(x, out):
    for r in prange(x.shape[0]):
        _log_softmax_row(np.int64(r), x, out)


@njit(cache=True, fastmath=FAST)
def _log_softmax_back_serial(y, dy, dx):
    for r in range(y.shape[0]):
        _log_softmax_back_row(r, y, dy, dx)


@njit(cache=True, fastmath=FAST, parallel=True)
def _log_softmax_back_parallel(y, dy, dx):
    for r in prange(y.shape[0]):
        _log_softmax_back_row(np.int64(r), y, dy, dx)


@njit(cache=True, fastmath=FAST)
def _cross_entropy_serial(logits, target, ignore_index, loss, lse):
    for r in range(logits.shape[0]):
        _cross_entropy_row(r, logits, target, ignore_index, loss, lse)


@njit(cache=True, fastmath=FAST, parallel=True)
def _cross_entropy_parallel(logits, target, ignore_index, loss, lse):
    for r in prange(logits.shape[0]):
        _cross_entropy_row(np.int64(r), logits, target, ignore_index, loss, lse)


@njit(cache=True, fastmath=FAST)
def _cross_entropy_back_serial(logits, lse, target, ignore_index, dloss, dx):
    for r in range(logits.shape[0]):
        _cross_entropy_back_row(r, logits, lse, target, ignore_index, dloss, dx)


@njit(cache=True, fastmath=FAST, parallel=True)
def _cross_entropy_back_parallel(logits, lse, target, ignore_index, dloss, dx):
    for r in prange(logits.shape[0]):
        _cross_entropy_back_row(np.int64(r), logits, lse, target, ignore_index, dloss, dx)


def _pick(serial, parallel, x):
    return parallel if x.size >= _scaled(PARALLEL_MIN) else serial


# ---------------------------------------------------------------- softmax and log-softmax

_NO_MASK = np.ones((1, 1), dtype=np.bool_)   # a (1, 1) stand-in for kernels told has_mask=False


def _rows(x):
    """x as C-contiguous (rows, last axis)."""
    return np.ascontiguousarray(x).reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def softmax(x, axis):
    """Over the last axis; other axes (rare: attention and losses use the last) and empty
    arrays go to the numpy reference."""
    if x.size == 0 or axis not in (-1, x.ndim - 1):
        return reference.softmax(x, axis)
    out = np.empty(x.shape, dtype=x.dtype)
    _pick(_softmax_serial, _softmax_parallel, x)(_rows(x), _NO_MASK, False, _rows(out))
    return out


def masked_softmax(x, mask):
    if x.size == 0:
        return reference.masked_softmax(x, mask)
    out = np.empty(x.shape, dtype=x.dtype)
    rows_mask = _rows(mask if mask.shape == x.shape else np.broadcast_to(mask, x.shape))
    _pick(_softmax_serial, _softmax_parallel, x)(_rows(x), rows_mask, True, _rows(out))
    return out


def log_softmax(x, axis):
    if x.size == 0 or axis not in (-1, x.ndim - 1):
        return reference.log_softmax(x, axis)
    out = np.empty(x.shape, dtype=x.dtype)
    _pick(_log_softmax_serial, _log_softmax_parallel, x)(_rows(x), _rows(out))
    return out


def _row_back_kernel(serial, parallel, reference_fn):
    def run(y, dy, axis):
        if y.size == 0 or axis not in (-1, y.ndim - 1):
            return reference_fn(y, dy, axis)
        dx = np.empty(y.shape, dtype=y.dtype)
        _pick(serial, parallel, y)(_rows(y), _rows(dy), _rows(dx))
        return dx

    return run


softmax_back = _row_back_kernel(_softmax_back_serial, _softmax_back_parallel, reference.softmax_back)
log_softmax_back = _row_back_kernel(_log_softmax_back_serial, _log_softmax_back_parallel,
                                    reference.log_softmax_back)


# ---------------------------------------------------------------- cross-entropy


def cross_entropy(logits, target, ignore_index):
    n = logits.shape[0]
    loss = np.empty(n, dtype=logits.dtype)
    lse = np.empty(n, dtype=logits.dtype)
    _pick(_cross_entropy_serial, _cross_entropy_parallel, logits)(
        np.ascontiguousarray(logits), np.ascontiguousarray(target, dtype=np.int64),
        np.int64(ignore_index), loss, lse)
    return loss, lse


def cross_entropy_back(logits, lse, target, ignore_index, dloss):
    dx = np.empty(logits.shape, dtype=logits.dtype)
    _pick(_cross_entropy_back_serial, _cross_entropy_back_parallel, logits)(
        np.ascontiguousarray(logits), lse, np.ascontiguousarray(target, dtype=np.int64),
        np.int64(ignore_index), np.ascontiguousarray(dloss, dtype=logits.dtype), dx)
    return dx


# ---------------------------------------------------------------- embedding


@njit(cache=True)
def _scatter_rows(ids, dy, padding_idx, dw):
    # Serial on purpose: two ids may hit the same row, and a parallel add would race.
    for i in range(ids.shape[0]):
        row = ids[i]
        if row != padding_idx:
            for j in range(dy.shape[1]):
                dw[row, j] += dy[i, j]


def embedding_back(num_rows, ids, dy, padding_idx):
    """Scatter-add rows of dy into a (num_rows, E) gradient (np.add.at is ~20x slower)."""
    dim = dy.shape[-1]
    dw = np.zeros((num_rows, dim), dtype=dy.dtype)
    _scatter_rows(np.ascontiguousarray(ids, dtype=np.int64).reshape(-1), _rows(dy).reshape(-1, dim),
                  np.int64(-1 if padding_idx is None else padding_idx), dw)
    return dw


# ---------------------------------------------------------------- additive (Bahdanau) scores

# Below this many tanh evaluations (at a 10 µs launch; scaled by _scaled) a serial kernel
# wins: a core runs ~2000 float32 (q + k) tanh products a microsecond, so a second thread
# saves a 10 µs launch only beyond ~40K.
ADDITIVE_PARALLEL_MIN = 40960


@njit(cache=True, fastmath=FAST, error_model="numpy")
def _additive_row(q_i, k_n, v, e_i):
    """e_i[j] = v . tanh(q_i + k_n[j]) for one query of one batch entry."""
    for j in range(k_n.shape[0]):
        k_j = k_n[j]
        total = _like(q_i[0], 0.0)
        for a in range(q_i.shape[0]):
            total += v[a] * _tanh(q_i[a] + k_j[a])
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
                t = _tanh(q_i[a] + k_j[a])
                dv_n[a] += d * t
                g = d * (_like(t, 1.0) - t * t) * v[a]                # d e / d(q_i + k_j)
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


def _contiguous(*arrays):
    return tuple(np.ascontiguousarray(x) for x in arrays)


def additive_scores(q, k, v):
    """One fused pass: each tanh is computed, weighted by v and summed without a
    (T_q, T_k, A) temporary.  Parallel over (batch, query) pairs when big enough."""
    q, k, v = _contiguous(q, k, v)
    e = np.empty((q.shape[0], q.shape[1], k.shape[1]), dtype=q.dtype)
    if e.size == 0 or q.shape[2] == 0:
        return reference.additive_scores(q, k, v)
    big = q.shape[0] * q.shape[1] * k.shape[1] * q.shape[2] >= _scaled(ADDITIVE_PARALLEL_MIN)
    (_additive_scores_parallel if big else _additive_scores_serial)(q, k, v, e)
    return e


def additive_scores_back(q, k, v, de):
    """Parallel over batch entries, so each writes only its own rows of dq and dk; dv is
    summed from per-entry parts."""
    q, k, v, de = _contiguous(q, k, v, de)
    if de.size == 0 or q.shape[2] == 0:
        return reference.additive_scores_back(q, k, v, de)
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    dv_parts = np.zeros((q.shape[0], v.shape[0]), dtype=v.dtype)
    big = q.shape[0] * q.shape[1] * k.shape[1] * q.shape[2] >= _scaled(ADDITIVE_PARALLEL_MIN)
    kernel = _additive_back_parallel if big and q.shape[0] > 1 else _additive_back_serial
    kernel(q, k, v, de, dq, dk, dv_parts)
    return dq, dk, dv_parts.sum(axis=0)


# ---------------------------------------------------------------- scaled dot-product attention

# Work is split by head: each of up to ``ta.set_num_threads``'s count of Python threads (else
# Numba's) takes a share of the N = batch x heads axis and runs the whole blocked algorithm on it, with BLAS
# pinned to one thread meanwhile.  The kernels below are serial and release the GIL
# (``nogil``), and so does numpy's matmul, so the threads run side by side.  Measured at
# (N, T, D) = (64, 512, 64): ~100 ms forward+backward this way, against 170-240 ms when each
# product was a batched (N, 128, 512) matmul run by two BLAS threads and the softmax by a
# parallel kernel: BLAS's two threads share each 128 x 64 x 512 block poorly, and each
# parallel launch wakes the pool again.  One head at a time also keeps a block's scores
# (256 x 1024 floats, 1 MiB) in the core's cache between the two products.
SDPA_QUERY_BLOCK = 256   # query rows per block
SDPA_KEY_BLOCK = 1024    # keys per block; more keys go through the online softmax


@njit(cache=True, fastmath=FAST, nogil=True)
def _sdpa_online(s, mask, has_mask, causal, q_start, k_start, m, total, alpha):
    """One (query, key) block of one head's online softmax, in place.

    s (b, K): the scores of queries q_start.. against keys k_start.. -> exp(s - m_new), 0
    where not allowed.  mask: the head's whole (T_q, T_k) mask (read only if has_mask).
    m, total (b,): each row's running max and sum of exp(s - m), updated; alpha (b,) gets
    exp(m_old - m_new), the factor that rescales what earlier key blocks accumulated.  A row
    with nothing allowed so far keeps m = -inf."""
    b, t_k = s.shape
    for i in range(b):
        row = s[i]
        keep = mask[q_start + i if has_mask else 0]
        # causal: key k_start + j may be seen by query q_start + i when j <= q_start + i - k_start
        stop = min(max(q_start + i + 1 - k_start, 0), t_k) if causal else t_k
        m_old = m[i]
        m_new = m_old
        if has_mask:
            for j in range(stop):
                if keep[k_start + j]:
                    m_new = max(m_new, row[j])
        else:
            for j in range(stop):
                m_new = max(m_new, row[j])
        if not math.isfinite(m_new):            # nothing to attend to yet
            for j in range(t_k):
                row[j] = 0.0
            alpha[i] = 1.0
            continue
        for j in range(stop, t_k):
            row[j] = 0.0
        block_total = _like(row[0], 0.0)
        if has_mask:
            for j in range(stop):
                e = _exp(row[j] - m_new) if keep[k_start + j] else _like(row[0], 0.0)
                row[j] = e
                block_total += e
        else:
            for j in range(stop):
                e = _exp(row[j] - m_new)
                row[j] = e
                block_total += e
        a = _exp(m_old - m_new)                 # 0 on the first block with m_old = -inf
        alpha[i] = a
        total[i] = total[i] * a + block_total
        m[i] = m_new


@njit(cache=True, fastmath=FAST, nogil=True)
def _sdpa_rescale(acc, alpha):
    for i in range(acc.shape[0]):
        a = alpha[i]
        for j in range(acc.shape[1]):
            acc[i, j] *= a


@njit(cache=True, fastmath=FAST, nogil=True)
def _sdpa_finish(acc, m, total, lse):
    """In place: acc (b, D_v) /= total; lse = m + log(total), -inf (and acc 0) for rows
    that had nothing to attend to."""
    for i in range(acc.shape[0]):
        row = acc[i]
        if total[i] > 0:
            inv = _like(row[0], 1.0) / total[i]
            for j in range(row.shape[0]):
                row[j] *= inv
            lse[i] = m[i] + math.log(total[i])
        else:
            for j in range(row.shape[0]):
                row[j] = 0.0
            lse[i] = -np.inf


@njit(cache=True, fastmath=FAST, nogil=True)
def _sdpa_weights_from_lse(s, mask, has_mask, causal, q_start, k_start, lse):
    """In place: one head's block of scores (b, K) -> the weights exp(s - lse)."""
    b, t_k = s.shape
    for i in range(b):
        row = s[i]
        keep = mask[q_start + i if has_mask else 0]
        stop = min(max(q_start + i + 1 - k_start, 0), t_k) if causal else t_k
        lse_i = lse[i]
        if not math.isfinite(lse_i):
            stop = 0
        for j in range(stop, t_k):
            row[j] = 0.0
        if has_mask:
            for j in range(stop):
                row[j] = _exp(row[j] - lse_i) if keep[k_start + j] else _like(row[0], 0.0)
        else:
            for j in range(stop):
                row[j] = _exp(row[j] - lse_i)


@njit(cache=True, fastmath=FAST, nogil=True)
def _sdpa_dscores(p, dp, do, o):
    """In place: dp (b, K) -> ds = p * (dp - delta), the softmax backward, with each row's
    delta = do . o computed here."""
    for i in range(p.shape[0]):
        d = _like(p[0, 0], 0.0)
        for j in range(do.shape[1]):
            d += do[i, j] * o[i, j]
        pr, dr = p[i], dp[i]
        for j in range(p.shape[1]):
            dr[j] = pr[j] * (dr[j] - d)


def _blocks(t, size):
    return [(start, min(start + size, t)) for start in range(0, t, size)]


def _head_mask(mask, n):
    """The (T_q, T_k) mask of head n, and whether there is one."""
    if mask is None:
        return _NO_MASK, False
    return mask[n if mask.shape[0] > 1 else 0], True


def _visible(causal, q_block, k_block):
    """Whether any query of the block may see any key of the block (causal skips the rest)."""
    return not causal or k_block[0] <= q_block[1] - 1


def _matmul_into(out, a, b, first):
    """out = a @ b on the first block, out += a @ b after it (BLAS writes the first in place)."""
    if first:
        np.matmul(a, b, out=out)
    else:
        out += a @ b


def _sdpa_heads(q, k, v, mask, scale, causal, o, lse, heads):
    for n in heads:
        keep, has_mask = _head_mask(mask, n)
        for q_block in _blocks(q.shape[1], SDPA_QUERY_BLOCK):
            rows = slice(*q_block)
            qb = q[n, rows] * scale                                             # (b, D)
            b = qb.shape[0]
            m = np.full(b, -np.inf, dtype=q.dtype)
            total = np.zeros(b, dtype=q.dtype)
            alpha = np.empty(b, dtype=q.dtype)
            acc = o[n, rows]                                                    # (b, D_v), a view
            acc[:] = 0
            for k_block in _blocks(k.shape[1], SDPA_KEY_BLOCK):
                if not _visible(causal, q_block, k_block):
                    break
                cols = slice(*k_block)
                s = qb @ k[n, cols].T                                           # (b, K)
                _sdpa_online(s, keep, has_mask, causal, q_block[0], k_block[0], m, total, alpha)
                if k_block[0] > 0:
                    _sdpa_rescale(acc, alpha)
                acc += s @ v[n, cols]
            _sdpa_finish(acc, m, total, lse[n, rows])


def _sdpa_back_heads(q, k, v, o, lse, do, mask, scale, causal, dq, dk, dv, heads):
    for n in heads:
        keep, has_mask = _head_mask(mask, n)
        for q_block in _blocks(q.shape[1], SDPA_QUERY_BLOCK):
            rows = slice(*q_block)
            qb = q[n, rows] * scale                                             # (b, D)
            dob = do[n, rows]                                                   # (b, D_v)
            for k_block in _blocks(k.shape[1], SDPA_KEY_BLOCK):
                if not _visible(causal, q_block, k_block):
                    break
                cols = slice(*k_block)
                p = qb @ k[n, cols].T                                           # (b, K)
                _sdpa_weights_from_lse(p, keep, has_mask, causal, q_block[0], k_block[0], lse[n, rows])
                keys_first = q_block[0] == 0 and not causal
                _matmul_into(dv[n, cols], p.T, dob, keys_first)                  # (K, D_v)
                ds = dob @ v[n, cols].T                                         # dp (b, K)
                _sdpa_dscores(p, ds, dob, o[n, rows])
                _matmul_into(dq[n, rows], ds, k[n, cols], k_block[0] == 0)      # (b, D)
                _matmul_into(dk[n, cols], ds.T, qb, keys_first)                 # (K, D)
        dq[n] *= scale


_pool: list[ThreadPoolExecutor] = []
# One split at a time in the process: BLAS's thread count is process-wide, so two callers
# pinning and restoring it in turn would undo each other (and they compete for the cores).
_split_lock = threading.Lock()


def _over_heads(work, n, *args):
    """Run work(*args, heads) over the N axis: in this thread, or split between as many
    threads as ``ta.set_num_threads`` asked for (else this thread's Numba count), with BLAS
    at one thread while they run."""
    workers = min(threads.requested() or numba.get_num_threads(), numba.config.NUMBA_NUM_THREADS, n)
    if workers <= 1:
        work(*args, range(n))
        return
    shares = [range(n * w // workers, n * (w + 1) // workers) for w in range(workers)]
    futures = []
    with _split_lock, threads.one_blas_thread():
        if not _pool:
            _pool.append(ThreadPoolExecutor(numba.config.NUMBA_NUM_THREADS, "sdpa-heads"))
        try:
            for heads in shares[1:]:
                futures.append(_pool[0].submit(work, *args, heads))
            work(*args, shares[0])
        finally:
            wait(futures)               # never leave a thread writing into the outputs
    for future in futures:
        future.result()                 # re-raises a worker's error


# Below this many scores (N * T_q * T_k) the reference's few numpy passes beat the kernels,
# whose launches cost more than the work: (1, 128, 128) took 0.11 ms here against 0.08.
SDPA_KERNEL_MIN = 65536


def sdpa(q, k, v, mask, scale, causal):
    """Flash-attention style, one head at a time: query blocks of SDPA_QUERY_BLOCK rows, key
    blocks of SDPA_KEY_BLOCK, an online softmax across key blocks (running max and sum,
    earlier output rescaled), and only the log-sum-exp kept for backward.  BLAS computes each
    block's two products; Numba the softmax between them, in place."""
    n, t_q, _ = q.shape
    t_k, d_v = k.shape[1], v.shape[2]
    if n * t_q * t_k < SDPA_KERNEL_MIN:
        return reference.sdpa(q, k, v, mask, scale, causal)
    q, k, v = _contiguous(q, k, v)
    o = np.empty((n, t_q, d_v), dtype=q.dtype)
    lse = np.empty((n, t_q), dtype=q.dtype)
    mask = None if mask is None else np.ascontiguousarray(mask)
    _over_heads(_sdpa_heads, n, q, k, v, mask, q.dtype.type(scale), causal, o, lse)
    return o, lse


def sdpa_back(q, k, v, o, lse, do, mask, scale, causal):
    """Gradients head by head, each (query, key) block's weights rebuilt from lse."""
    if q.shape[0] * q.shape[1] * k.shape[1] < SDPA_KERNEL_MIN:
        return reference.sdpa_back(q, k, v, o, lse, do, mask, scale, causal)
    q, k, v, o, lse, do = _contiguous(q, k, v, o, lse, do)
    mask = None if mask is None else np.ascontiguousarray(mask)
    dq = np.empty_like(q)
    # Causal attention may leave keys that no query sees, and reaches some key blocks first
    # from a later query block: there dk and dv start from zeros and every block adds.
    dk = np.zeros_like(k) if causal else np.empty_like(k)
    dv = np.zeros_like(v) if causal else np.empty_like(v)
    _over_heads(_sdpa_back_heads, q.shape[0], q, k, v, o, lse, do, mask, q.dtype.type(scale),
                causal, dq, dk, dv)
    return dq, dk, dv


KERNELS = {
    "sigmoid": _sigmoid_map,
    "tanh_back": _tanh_back_map,
    "sigmoid_back": _sigmoid_back_map,
    "relu_back": _relu_back_map,
    "softmax": softmax,
    "softmax_back": softmax_back,
    "log_softmax": log_softmax,
    "log_softmax_back": log_softmax_back,
    "masked_softmax": masked_softmax,
    "cross_entropy": cross_entropy,
    "cross_entropy_back": cross_entropy_back,
    "embedding_back": embedding_back,
    "additive_scores": additive_scores,
    "additive_scores_back": additive_scores_back,
    "sdpa": sdpa,
    "sdpa_back": sdpa_back,
}
