"""Scaled dot-product attention (+back) fused: blocked, BLAS for the products and Numba for
everything between them, or one sweep per head for small heads."""

from __future__ import annotations

import contextlib
import math
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numba
import numpy as np
from numba import njit

from .. import reference, threads
from ..numba_support import FAST, cast_like, typed_exp
from .attention_small import (
    sdpa_back_batched,
    sdpa_batched,
    sdpa_prefix_serial,
    sdpa_small_back_serial,
    sdpa_small_serial,
)
from .softmax import NO_MASK

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
        block_total = cast_like(row[0], 0.0)
        if has_mask:
            for j in range(stop):
                e = typed_exp(row[j] - m_new) if keep[k_start + j] else cast_like(row[0], 0.0)
                row[j] = e
                block_total += e
        else:
            for j in range(stop):
                e = typed_exp(row[j] - m_new)
                row[j] = e
                block_total += e
        a = typed_exp(m_old - m_new)                 # 0 on the first block with m_old = -inf
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
            inv = cast_like(row[0], 1.0) / total[i]
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
                row[j] = typed_exp(row[j] - lse_i) if keep[k_start + j] else cast_like(row[0], 0.0)
        else:
            for j in range(stop):
                row[j] = typed_exp(row[j] - lse_i)


@njit(cache=True, fastmath=FAST, nogil=True)
def _sdpa_dscores(p, dp, do, o):
    """In place: dp (b, K) -> ds = p * (dp - delta), the softmax backward, with each row's
    delta = do . o computed here."""
    for i in range(p.shape[0]):
        d = cast_like(p[0, 0], 0.0)
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
        return NO_MASK, False
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


def _head(n, *arrays):
    """Head n = b H + h's (T, D) rows of (B, T, H, D) arrays: views, strided when H > 1, which
    BLAS and the kernels read where they are.  Correct at any size, but long heads read this
    way cost more than their transposed copies do ((8, 256, 8, 32), two threads: backward
    14.6 ms against 12.0 + ~0.8 for the copies; rows 1 KiB apart share few cache sets), so
    multi-head attention hands only short heads over in place."""
    b, h = divmod(n, arrays[0].shape[2])
    return tuple(x[b, :, h] for x in arrays)


def _sdpa_heads(q, k, v, mask, scale, causal, o, lse, weights, heads):
    """The blocked forward over ``heads``; with ``weights`` (N, T_q, T_k) and one key block,
    each block's scores are computed into the weights' own rows, so the softmax the forward
    takes anyway leaves them there (scaled by 1 / total at the end)."""
    # Python's share of a head holds the GIL, which split threads share: kept small.
    q_blocks, k_blocks = _blocks(q.shape[1], SDPA_QUERY_BLOCK), _blocks(k.shape[1], SDPA_KEY_BLOCK)
    for n in heads:
        keep, has_mask = _head_mask(mask, n)
        q_n, k_n, v_n, o_n = _head(n, q, k, v, o)
        for q_block in q_blocks:
            rows = slice(*q_block)
            qb = q_n[rows] * scale                                              # (b, D)
            b = qb.shape[0]
            m = np.full(b, -np.inf, dtype=q.dtype)
            total = np.zeros(b, dtype=q.dtype)
            alpha = np.empty(b, dtype=q.dtype)
            acc = o_n[rows]                                                     # (b, D_v), a view
            if not k_blocks:
                acc[:] = 0
            for k_block in k_blocks:
                if not _visible(causal, q_block, k_block):
                    break
                cols = slice(*k_block)
                if weights is None:
                    s = qb @ k_n[cols].T                                        # (b, K)
                else:                                 # one key block: the whole rows
                    s = np.matmul(qb, k_n[cols].T, out=weights[n, rows])
                _sdpa_online(s, keep, has_mask, causal, q_block[0], k_block[0], m, total, alpha)
                if k_block[0] > 0:
                    _sdpa_rescale(acc, alpha)
                _matmul_into(acc, s, v_n[cols], k_block[0] == 0)
            _sdpa_finish(acc, m, total, lse[n, rows])
            if weights is not None:
                with np.errstate(divide="ignore"):
                    inverse = np.where(total > 0, 1 / total, 0).astype(q.dtype)
                weights[n, rows] *= inverse[:, None]


def _sdpa_back_heads(q, k, v, o, lse, do, mask, scale, causal, dq, dk, dv, heads):
    q_blocks, k_blocks = _blocks(q.shape[1], SDPA_QUERY_BLOCK), _blocks(k.shape[1], SDPA_KEY_BLOCK)
    for n in heads:
        keep, has_mask = _head_mask(mask, n)
        q_n, k_n, v_n, o_n, do_n, dq_n, dk_n, dv_n = _head(n, q, k, v, o, do, dq, dk, dv)
        for q_block in q_blocks:
            rows = slice(*q_block)
            qb = q_n[rows] * scale                                              # (b, D)
            dob = do_n[rows]                                                    # (b, D_v)
            for k_block in k_blocks:
                if not _visible(causal, q_block, k_block):
                    break
                cols = slice(*k_block)
                p = qb @ k_n[cols].T                                            # (b, K)
                _sdpa_weights_from_lse(p, keep, has_mask, causal, q_block[0], k_block[0], lse[n, rows])
                keys_first = q_block[0] == 0 and not causal
                _matmul_into(dv_n[cols], p.T, dob, keys_first)                  # (K, D_v)
                ds = dob @ v_n[cols].T                                          # dp (b, K)
                _sdpa_dscores(p, ds, dob, o_n[rows])
                _matmul_into(dq_n[rows], ds, k_n[cols], k_block[0] == 0)        # (b, D)
                _matmul_into(dk_n[cols], ds.T, qb, keys_first)                  # (K, D)
        dq_n *= scale


_pool: list[ThreadPoolExecutor] = []
_POOL_NAME = "sdpa-heads"
# One split at a time in the process: BLAS's thread count is process-wide, so two callers
# pinning and restoring it in turn would undo each other (and they compete for the cores).
_split_lock = threading.Lock()


def _over_heads(work, n, *args, blas=True, quiet_blas=False):
    """Run work(*args, heads) over the N axis: in this thread, or split between as many
    threads as ``ta.set_num_threads`` asked for (else this thread's Numba count), with BLAS
    at one thread while they run (``blas``: work calls BLAS).

    ``quiet_blas``: stop OpenBLAS's idle, spinning worker first, for the blocked kernel's long
    splits only (at (64, 256, 32), two threads, forward+backward after a product: 20 ms, 36
    without).  Each stop makes the next threaded product start the worker anew, and after a
    pause (the scheduler then places the new thread beside ours, it seems) a Transformer
    training step whose twelve short attention splits each stopped it took 105-160 ms
    against 33 warm; without the stops 33-34 either way, and no slower warm."""
    workers = min(threads.requested() or numba.get_num_threads(), numba.config.NUMBA_NUM_THREADS, n)
    if workers <= 1:
        work(*args, range(n))
        return
    shares = [range(n * w // workers, n * (w + 1) // workers) for w in range(workers)]
    futures = []
    pinned = threads.one_blas_thread(pool_name=_POOL_NAME if quiet_blas else None)
    with _split_lock, (pinned if blas else contextlib.nullcontext()):
        if not _pool:
            _pool.append(ThreadPoolExecutor(numba.config.NUMBA_NUM_THREADS, _POOL_NAME))
        try:
            for heads in shares[1:]:
                futures.append(_pool[0].submit(work, *args, heads))
            work(*args, shares[0])
        finally:
            wait(futures)               # never leave a thread writing into the outputs
    for future in futures:
        future.result()                 # re-raises a worker's error


# ---------------------------------------------------------------- small heads

# Below this many scores (N * T_q * T_k) every head is small enough that the blocked kernel's
# per-head work costs more than the arithmetic: a Transformer over 20-token sentences has
# N = 128 heads of 20 x 20 scores, and a decoding step one query per head.  Up to
# SDPA_SMALL_QUERIES queries the one-sweep kernels of attention_small.py do a head's scores,
# softmax and weighted sums in registers (decoding: 6x the reference's numpy passes).  With
# more, their loops over 20 keys or 32 features are too short for LLVM to vectorise (~7
# GFMA/s), and ``sdpa_batched``/``sdpa_back_batched`` win: numpy's stacked matmul over all
# heads for each product, read in place, and one Numba pass for the softmax (or its backward)
# between.  One thread, float32, (B, T, H, D) = (32, 20, 4, 32): forward 460 -> ~190 us,
# backward 610-720 (the reference's passes; the sweep was slower still) -> ~340 us.
# Many small heads take this path rather than the blocked kernel, whose per-head Python loop
# costs ~40 us a head, which 256 heads of 16 x 16 scores (a Transformer at batch 64) pay 256
# times for little arithmetic.  Forward+backward, one thread, (N, T, D): (256, 16, 16) 9.7 ms
# blocked against 1.5 ms; (256, 48, 16) 14.0 against 9.1; (256, 64, 16) 16.7 against 15.4;
# (256, 96, 16) 23.7 against 33.1: so heads of fewer than 64 x 64 scores stay off the blocked
# kernel.  (Those were measured with the one-sweep kernels.)
SDPA_KERNEL_MIN = 65536
SDPA_HEAD_MIN = 4096
SDPA_SMALL_QUERIES = 4
# From this many scores x head size the heads (the batched path: the batch entries) are shared
# between our threads (``_over_heads``; the kernels and numpy's matmul release the GIL), not a
# prange loop: with PyTorch imported first Numba runs
# "workqueue" threads, and a prange forward at (128, 20, 20, 32) took 622 us against 567
# serially (our threads: 328).  A split costs ~50 us, the forward's sweep ~0.35 ns a unit.
# Alone a split halves such a call; inside a step it did not pay (two threads, same-process
# A/B, 2026-11-25): the Transformer training step at (128 heads, 20 x 20, D 32) took 31.2
# against 32.3-32.7 ms split, equal at 256 heads of 40 x 40 (184 ms); and a compiled 64 x 30
# decode, whose encoder attention (256 heads of 20 x 20) split once per decode, fell into a
# state where every decode took ~1.55x as long (~960 against ~1,530 sentences/s, in two of
# three processes, for as long as it ran), never seen without the split.  Hence the bound
# well above those shapes.
SDPA_SMALL_SPLIT_MIN = 1 << 24


def _small_heads(n, t_q, t_k) -> bool:
    return n * t_q * t_k < SDPA_KERNEL_MIN or t_q * t_k < SDPA_HEAD_MIN


def _small_split(q, k) -> bool:
    """Whether the heads are worth sharing between threads (see SDPA_SMALL_SPLIT_MIN)."""
    heads = q.shape[0] * q.shape[2]
    if heads * q.shape[1] * k.shape[1] * q.shape[3] < SDPA_SMALL_SPLIT_MIN or heads < 2:
        return False                    # (a decoding step's many small calls stop here)
    return min(threads.requested() or numba.get_num_threads(), numba.config.NUMBA_NUM_THREADS) > 1


def _on_heads(kernel):
    """A serial kernel taking (..., start, stop) as ``_over_heads`` work, which gets a range."""
    def work(*args):
        *args, heads = args
        kernel(*args, heads.start, heads.stop)
    return work


_small_heads_work = _on_heads(sdpa_small_serial)
_small_back_heads_work = _on_heads(sdpa_small_back_serial)


def _small_mask(mask):
    return (NO_MASK[None], False) if mask is None else (np.ascontiguousarray(mask), True)


def _over_entries(work, q, k, *args):
    """work(*args, entries) over the batch entries: split between threads, or in this one."""
    if _small_split(q, k):
        _over_heads(work, q.shape[0], *args)
    else:
        work(*args, range(q.shape[0]))


def _sdpa_small(q, k, v, mask, scale, causal, with_weights=False):
    n, t_q, t_k = q.shape[0] * q.shape[2], q.shape[1], k.shape[1]
    o = np.empty(q.shape[:3] + v.shape[3:], dtype=q.dtype)
    lse = np.empty((n, t_q), dtype=q.dtype)
    weights = np.zeros((n, t_q, t_k) if with_weights else (1, 1, 1), dtype=q.dtype)
    scale = q.dtype.type(scale)
    if n and t_q > SDPA_SMALL_QUERIES:
        _over_entries(sdpa_batched, q, k, q, k, v, mask, scale, causal, o, lse,
                      weights if with_weights else None)
    elif n and t_q:
        mask, has_mask = _small_mask(mask)
        args = (q, k, v, mask, has_mask, causal, scale, o, lse, weights, with_weights)
        if _small_split(q, k):
            _over_heads(_small_heads_work, n, *args, blas=False)
        else:
            sdpa_small_serial(*args, 0, n)
    return (o, lse, weights) if with_weights else (o, lse)


def _sdpa_small_back(q, k, v, o, lse, do, mask, scale, causal):
    n, scale = q.shape[0] * q.shape[2], q.dtype.type(scale)
    if n and q.shape[1] > SDPA_SMALL_QUERIES and k.shape[1]:
        dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)         # written whole
        _over_entries(sdpa_back_batched, q, k, q, k, v, o, lse, do, mask, scale, causal, dq, dk, dv)
        return dq, dk, dv
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    if n and q.shape[1] and k.shape[1]:
        mask, has_mask = _small_mask(mask)
        args = (q, k, v, o, lse, do, mask, has_mask, causal, scale, dq, dk, dv)
        if _small_split(q, k):
            _over_heads(_small_back_heads_work, n, *args, blas=False)
        else:
            sdpa_small_back_serial(*args, 0, n)
    return dq, dk, dv


# ---------------------------------------------------------------- entry points

# Every kernel takes q, k, v either as (N, T, D) or with the heads in place, (B, T, H, D), as
# a projection's output reshapes to them: head n = b H + h reads q[b, :, h], so multi-head
# attention needs no transposed copies of its inputs and gradients (four a layer, each way).
# Inside, (N, T, D) is (N, T, 1, D); outputs come back in the layout given.  lse is (N, T_q)
# and the weights (N, T_q, T_k) either way.


def _heads_in_place(*arrays):
    return tuple(np.ascontiguousarray(x if x.ndim == 4 else x[:, :, None]) for x in arrays)


def _as_given(like, *arrays):
    return arrays if like.ndim == 4 else tuple(x[:, :, 0] for x in arrays)


def sdpa(q, k, v, mask, scale, causal, with_weights=False):
    """Flash-attention style, one head at a time: query blocks of SDPA_QUERY_BLOCK rows, key
    blocks of SDPA_KEY_BLOCK, an online softmax across key blocks (running max and sum,
    earlier output rescaled), and only the log-sum-exp kept for backward.  BLAS computes each
    block's two products; Numba the softmax between them, in place.  ``with_weights``: the
    weights too, written by the forward when one key block holds every key (else rebuilt
    from lse after it)."""
    given = q
    q, k, v = _heads_in_place(q, k, v)
    n, t_q, t_k = q.shape[0] * q.shape[2], q.shape[1], k.shape[1]
    mask = None if mask is None else np.ascontiguousarray(mask)
    if _small_heads(n, t_q, t_k):
        o, *rest = _sdpa_small(q, k, v, mask, scale, causal, with_weights)
    elif with_weights and t_k > SDPA_KEY_BLOCK:
        o, lse = sdpa(q, k, v, mask, scale, causal)
        rest = [lse, sdpa_weights(q, k, lse, mask, scale, causal)]
    else:
        o = np.empty(q.shape[:3] + v.shape[3:], dtype=q.dtype)
        lse = np.empty((n, t_q), dtype=q.dtype)
        weights = np.empty((n, t_q, t_k), dtype=q.dtype) if with_weights else None
        _over_heads(_sdpa_heads, n, q, k, v, mask, q.dtype.type(scale), causal, o, lse, weights,
                    quiet_blas=True)
        rest = [lse, weights] if with_weights else [lse]
    return _as_given(given, o) + tuple(rest)


def sdpa_back(q, k, v, o, lse, do, mask, scale, causal):
    """Gradients head by head, each (query, key) block's weights rebuilt from lse."""
    given = q
    q, k, v, o, do = _heads_in_place(q, k, v, o, do)
    lse = np.ascontiguousarray(lse)
    mask = None if mask is None else np.ascontiguousarray(mask)
    n = q.shape[0] * q.shape[2]
    if _small_heads(n, q.shape[1], k.shape[1]):
        return _as_given(given, *_sdpa_small_back(q, k, v, o, lse, do, mask, scale, causal))
    dq = np.empty_like(q)
    # Causal attention may leave keys that no query sees, and reaches some key blocks first
    # from a later query block: there dk and dv start from zeros and every block adds.
    dk = np.zeros_like(k) if causal else np.empty_like(k)
    dv = np.zeros_like(v) if causal else np.empty_like(v)
    _over_heads(_sdpa_back_heads, n, q, k, v, o, lse, do, mask, q.dtype.type(scale),
                causal, dq, dk, dv, quiet_blas=True)
    return _as_given(given, dq, dk, dv)


@njit(cache=True, fastmath=FAST, nogil=True)
def _sdpa_weights_rows(s, mask, has_mask, causal, lse):
    last = mask.shape[0] - 1                  # one mask for every entry, or one each
    for n in range(s.shape[0]):
        _sdpa_weights_from_lse(s[n], mask[min(n, last)], has_mask, causal, 0, 0, lse[n])


def sdpa_weights(q, k, lse, mask, scale, causal):
    """The weights sdpa did not keep, from its lse: BLAS for the scores, then one Numba pass
    for exp(s - lse) and the mask, in place."""
    q, k = _heads_in_place(q, k)
    if _small_heads(q.shape[0] * q.shape[2], q.shape[1], k.shape[1]):
        return reference.sdpa_weights(q, k, lse, mask, scale, causal)
    lse = np.ascontiguousarray(lse)
    # (B, H, T_q, D) @ (B, H, D, T_k): BLAS reads the heads where they are.
    s = np.matmul(q.transpose(0, 2, 1, 3) * q.dtype.type(scale), k.transpose(0, 2, 3, 1))
    s = s.reshape(-1, q.shape[1], k.shape[1])                                    # (N, T_q, T_k)
    has_mask = mask is not None
    mask = np.ascontiguousarray(mask) if has_mask else NO_MASK[None]
    _sdpa_weights_rows(s, mask, has_mask, causal, lse)
    return s


def sdpa_prefix(q, k, v, position, scale):
    """reference.sdpa_prefix: q (N, T_q, D) over the keys 0 .. position of k (N, L, D),
    v (N, L, D_v), one Numba sweep (a decoding step's few heads run serially, see
    ``_small_split``)."""
    count = reference.attention.prefix_length(position, k.shape[1])
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    o = np.empty(q.shape[:2] + v.shape[2:], dtype=q.dtype)
    if o.size:
        sdpa_prefix_serial(q, k, v, count, q.dtype.type(scale), o)
    return o


KERNELS = {"sdpa": sdpa, "sdpa_back": sdpa_back, "sdpa_weights": sdpa_weights, "sdpa_prefix": sdpa_prefix}
