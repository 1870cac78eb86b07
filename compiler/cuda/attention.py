"""FlashAttention-style scaled dot-product attention (+back)."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from ..reference.attention import heads_as, heads_first
from .device import (
    MAX_GRID_AXIS,
    SDPA_ROWS,
    SHARED_BYTES,
    THREADS,
    empty,
    launch,
    nblocks,
    no_mask,
    per_dtype,
    ravel,
)
from .memory import zeros
from .movement import permute, reshape

# ---------------------------------------------------------------- scaled dot-product attention


def _sdpa_rows(words_per_row, itemsize: int, what: str, shape) -> int:
    """The most rows per block (a power of 2 up to SDPA_ROWS) whose dynamic shared memory,
    ``words_per_row(rows)`` entries per row, fits in SHARED_BYTES."""
    rows = SDPA_ROWS
    while rows >= 1:
        if rows * words_per_row(rows) * itemsize <= SHARED_BYTES:
            return rows
        rows //= 2
    raise ValueError(f"{what}: head sizes {shape} are too large for one block's shared memory "
                     f"({SHARED_BYTES} bytes)")


@cuda.jit(device=True)
def _load_tile(shared, at, src, n, first, scale, zero):
    """Rows first .. first + blockDim of src[n], times scale, into shared[at:] row after row
    (zeros past the last row); the block's threads share the copy entry by entry."""
    rows, length, width = cuda.blockDim.x, src.shape[1], src.shape[2]
    for idx in range(cuda.threadIdx.x, rows * width, rows):
        r = first + idx // width
        shared[at + idx] = src[n, r, idx % width] * scale if r < length else zero


@per_dtype
def _sdpa_forward_kernel(nb_type, dtype):
    zero, one, neg_inf = dtype.type(0), dtype.type(1), dtype.type(-np.inf)

    @cuda.jit
    def sdpa_forward(o, lse, q, k, v, mask, has_mask, scale, causal):
        """A block of B query rows, a thread per row, over tiles of B keys.  Shared memory:
        the block's scaled queries (B, D+1), the key and value tiles (B, D), (B, D_v), the
        scores (B, B+1) and the output accumulators (B, D_v+1); rows of what one thread reads
        alone are padded by one entry so neighbouring threads hit different banks."""
        shared = cuda.shared.array(0, nb_type)
        rows = cuda.blockDim.x
        t = cuda.threadIdx.x
        t_q, d = q.shape[1], q.shape[2]
        t_k, d_v = k.shape[1], v.shape[2]
        q_pad, s_pad, o_pad = d + 1, rows + 1, d_v + 1
        k_at = rows * q_pad
        v_at = k_at + rows * d
        s_at = v_at + rows * d_v
        o_at = s_at + rows * s_pad
        first = cuda.blockIdx.x * rows
        i = first + t
        live = i < t_q
        # Causal: no query of this block sees a key past its last query.  (No builtin min or
        # max in kernels: Numba 0.68 cannot compile them for CUDA.)
        stop = first + rows if causal and first + rows < t_k else t_k
        for n in range(cuda.blockIdx.y, q.shape[0], cuda.gridDim.y):
            mask_n = n if mask.shape[0] > 1 else 0
            for dd in range(d):
                shared[t * q_pad + dd] = q[n, i, dd] * scale if live else zero
            for dd in range(d_v):
                shared[o_at + t * o_pad + dd] = zero
            m = neg_inf
            total = zero
            for k0 in range(0, stop, rows):
                cuda.syncthreads()                       # every thread is done with the last tile
                _load_tile(shared, k_at, k, n, k0, one, zero)
                _load_tile(shared, v_at, v, n, k0, one, zero)
                cuda.syncthreads()
                if live:
                    tile_max = neg_inf
                    for jj in range(rows):
                        j = k0 + jj
                        s = neg_inf
                        if j < t_k and (not causal or j <= i) and (not has_mask or mask[mask_n, i, j]):
                            s = zero
                            for dd in range(d):
                                s += shared[t * q_pad + dd] * shared[k_at + jj * d + dd]
                        shared[s_at + t * s_pad + jj] = s
                        if s > tile_max:
                            tile_max = s
                    new_m = tile_max if tile_max > m else m
                    if new_m > neg_inf:                  # else nothing attended to yet
                        # Online softmax: rescale what was summed under the old max.
                        alpha = math.exp(m - new_m)
                        tile_total = zero
                        for jj in range(rows):
                            p = math.exp(shared[s_at + t * s_pad + jj] - new_m)
                            shared[s_at + t * s_pad + jj] = p
                            tile_total += p
                        total = total * alpha + tile_total
                        for dd in range(d_v):
                            acc = shared[o_at + t * o_pad + dd] * alpha
                            for jj in range(rows):
                                acc += shared[s_at + t * s_pad + jj] * shared[v_at + jj * d_v + dd]
                            shared[o_at + t * o_pad + dd] = acc
                        m = new_m
            if live:
                if total > zero:
                    inverse = one / total
                    for dd in range(d_v):
                        o[n, i, dd] = shared[o_at + t * o_pad + dd] * inverse
                    lse[n, i] = m + math.log(total)
                else:                                     # nothing to attend to: o = 0, lse = -inf
                    for dd in range(d_v):
                        o[n, i, dd] = zero
                    lse[n, i] = neg_inf
            cuda.syncthreads()                           # shared memory is refilled for the next n

    return sdpa_forward


@cuda.jit
def _sdpa_delta_kernel(delta, do, o):
    """delta[n, i] = sum(do[n, i] * o[n, i]), a thread per row."""
    t_q, d_v = o.shape[1], o.shape[2]
    for flat in range(cuda.grid(1), o.shape[0] * t_q, cuda.gridsize(1)):
        n = flat // t_q
        i = flat % t_q
        acc = do[n, i, 0] * o[n, i, 0]
        for dd in range(1, d_v):
            acc += do[n, i, dd] * o[n, i, dd]
        delta[n, i] = acc


@per_dtype
def _sdpa_dq_kernel(nb_type, dtype):
    zero, one, neg_inf = dtype.type(0), dtype.type(1), dtype.type(-np.inf)

    @cuda.jit
    def sdpa_dq(dq, q, k, v, lse, delta, do, mask, has_mask, scale, causal):
        """dq_i = scale sum_j ds_ij k_j, ds = p (do_i . v_j - delta_i), p = exp(s_ij - lse_i):
        a thread per query row over tiles of B keys.  Shared: scaled queries (B, D+1), their
        do rows (B, D_v+1), key and value tiles (B, D), (B, D_v), dq accumulators (B, D+1)."""
        shared = cuda.shared.array(0, nb_type)
        rows = cuda.blockDim.x
        t = cuda.threadIdx.x
        t_q, d = q.shape[1], q.shape[2]
        t_k, d_v = k.shape[1], v.shape[2]
        q_pad, do_pad = d + 1, d_v + 1
        do_at = rows * q_pad
        k_at = do_at + rows * do_pad
        v_at = k_at + rows * d
        dq_at = v_at + rows * d_v
        first = cuda.blockIdx.x * rows
        i = first + t
        stop = first + rows if causal and first + rows < t_k else t_k
        for n in range(cuda.blockIdx.y, q.shape[0], cuda.gridDim.y):
            mask_n = n if mask.shape[0] > 1 else 0
            live = i < t_q and lse[n, i] > neg_inf               # a row with no key gets dq = 0
            for dd in range(d):
                shared[t * q_pad + dd] = q[n, i, dd] * scale if live else zero
                shared[dq_at + t * q_pad + dd] = zero
            for dd in range(d_v):
                shared[do_at + t * do_pad + dd] = do[n, i, dd] if live else zero
            row_lse = lse[n, i] if live else zero
            row_delta = delta[n, i] if live else zero
            for k0 in range(0, stop, rows):
                cuda.syncthreads()
                _load_tile(shared, k_at, k, n, k0, one, zero)
                _load_tile(shared, v_at, v, n, k0, one, zero)
                cuda.syncthreads()
                if live:
                    for jj in range(rows):
                        j = k0 + jj
                        if j < t_k and (not causal or j <= i) and (not has_mask or mask[mask_n, i, j]):
                            s = zero
                            for dd in range(d):
                                s += shared[t * q_pad + dd] * shared[k_at + jj * d + dd]
                            p = math.exp(s - row_lse)
                            dp = zero
                            for dd in range(d_v):
                                dp += shared[do_at + t * do_pad + dd] * shared[v_at + jj * d_v + dd]
                            ds = p * (dp - row_delta)
                            for dd in range(d):
                                shared[dq_at + t * q_pad + dd] += ds * shared[k_at + jj * d + dd]
            if i < t_q:
                for dd in range(d):
                    dq[n, i, dd] = shared[dq_at + t * q_pad + dd] * scale
            cuda.syncthreads()

    return sdpa_dq


@per_dtype
def _sdpa_dkv_kernel(nb_type, dtype):
    zero, one, neg_inf = dtype.type(0), dtype.type(1), dtype.type(-np.inf)

    @cuda.jit
    def sdpa_dkv(dk, dv, q, k, v, lse, delta, do, mask, has_mask, scale, causal):
        """dv_j = sum_i p_ij do_i and dk_j = sum_i ds_ij (scale q_i): a thread per key row over
        tiles of B queries.  Shared: the block's keys and values (B, D+1), (B, D_v+1), query
        and do tiles (B, D), (B, D_v), their lse and delta (B each), accumulators for dk and
        dv (B, D+1), (B, D_v+1)."""
        shared = cuda.shared.array(0, nb_type)
        rows = cuda.blockDim.x
        t = cuda.threadIdx.x
        t_q, d = q.shape[1], q.shape[2]
        t_k, d_v = k.shape[1], v.shape[2]
        k_pad, v_pad = d + 1, d_v + 1
        v_at = rows * k_pad
        q_at = v_at + rows * v_pad
        do_at = q_at + rows * d
        lse_at = do_at + rows * d_v
        delta_at = lse_at + rows
        dk_at = delta_at + rows
        dv_at = dk_at + rows * k_pad
        first = cuda.blockIdx.x * rows
        j = first + t
        live = j < t_k
        # Causal: queries before the block's first key see none of its keys.
        start = first if causal else 0
        for n in range(cuda.blockIdx.y, q.shape[0], cuda.gridDim.y):
            mask_n = n if mask.shape[0] > 1 else 0
            for dd in range(d):
                shared[t * k_pad + dd] = k[n, j, dd] if live else zero
                shared[dk_at + t * k_pad + dd] = zero
            for dd in range(d_v):
                shared[v_at + t * v_pad + dd] = v[n, j, dd] if live else zero
                shared[dv_at + t * v_pad + dd] = zero
            for q0 in range(start, t_q, rows):
                cuda.syncthreads()
                _load_tile(shared, q_at, q, n, q0, scale, zero)
                _load_tile(shared, do_at, do, n, q0, one, zero)
                i = q0 + t
                shared[lse_at + t] = lse[n, i] if i < t_q else neg_inf
                shared[delta_at + t] = delta[n, i] if i < t_q else zero
                cuda.syncthreads()
                if live:
                    for ii in range(rows):
                        i = q0 + ii
                        row_lse = shared[lse_at + ii]
                        # lse is -inf past the last query, so the mask is read only inside it.
                        if row_lse > neg_inf and (not causal or j <= i) and (
                                not has_mask or mask[mask_n, i, j]):
                            s = zero
                            for dd in range(d):
                                s += shared[q_at + ii * d + dd] * shared[t * k_pad + dd]
                            p = math.exp(s - row_lse)
                            dp = zero
                            for dd in range(d_v):
                                g = shared[do_at + ii * d_v + dd]
                                shared[dv_at + t * v_pad + dd] += p * g
                                dp += g * shared[v_at + t * v_pad + dd]
                            ds = p * (dp - shared[delta_at + ii])
                            for dd in range(d):
                                shared[dk_at + t * k_pad + dd] += ds * shared[q_at + ii * d + dd]
            if live:
                for dd in range(d):
                    dk[n, j, dd] = shared[dk_at + t * k_pad + dd]
                for dd in range(d_v):
                    dv[n, j, dd] = shared[dv_at + t * v_pad + dd]
            cuda.syncthreads()

    return sdpa_dkv


def _sdpa_mask(mask):
    return (mask, True) if mask is not None else (no_mask(3), False)


def _heads_first(x):
    return heads_first(x, permute, reshape)


def _heads_as(like, x):
    return heads_as(like, x, permute, reshape)


def sdpa(q, k, v, mask, scale, causal, with_weights=False):
    """Scaled dot-product attention without keeping the weights (see reference.sdpa):
    q (N, T_q, D), k (N, T_k, D), v (N, T_k, D_v), mask None or boolean (N or 1, T_q, T_k),
    True = may attend.  Returns (o (N, T_q, D_v), lse (N, T_q)); a row with nothing to
    attend to gets o = 0 and lse = -inf.  ``with_weights``: the weights too, rebuilt from
    lse after the forward (sdpa_weights): the forward kernel keeps each block's scores in
    shared memory only.  Heads in place, (B, T, H, D), are copied to (B H, T, D) and the
    output back: the kernels below index one head's rows contiguously."""
    if len(q.shape) == 4:
        out = sdpa(_heads_first(q), _heads_first(k), _heads_first(v), mask, scale, causal, with_weights)
        return (_heads_as(q, out[0]),) + out[1:]
    if with_weights:
        o, lse = sdpa(q, k, v, mask, scale, causal)
        return o, lse, sdpa_weights(q, k, lse, mask, scale, causal)
    n, t_q, d = q.shape
    d_v = v.shape[2]
    o = empty((n, t_q, d_v), q.dtype)
    lse = empty((n, t_q), q.dtype)
    if n == 0 or t_q == 0:
        return o, lse

    def words(b):                 # shared entries per row of a block of b rows: see sdpa_forward
        return (d + 1) + d + d_v + (b + 1) + (d_v + 1)

    rows = _sdpa_rows(words, q.dtype.itemsize, "sdpa", q.shape)
    mask_arg, has_mask = _sdpa_mask(mask)
    grid = (-(-t_q // rows), min(n, MAX_GRID_AXIS))
    launch(_sdpa_forward_kernel(q.dtype), grid, rows, o, lse, q, k, v, mask_arg, has_mask,
            q.dtype.type(scale), bool(causal), shared_bytes=rows * words(rows) * q.dtype.itemsize)
    return o, lse


def sdpa_back(q, k, v, o, lse, do, mask, scale, causal):
    """Gradients (dq, dk, dv) of sdpa, rebuilding the weights from lse: p = exp(s - lse),
    ds = p * (dp - sum(do * o)), with dp = do v^T."""
    if len(q.shape) == 4:
        q3, k3, v3, o3, do3 = (_heads_first(x) for x in (q, k, v, o, do))
        grads = sdpa_back(q3, k3, v3, o3, lse, do3, mask, scale, causal)
        return tuple(_heads_as(x, g) for x, g in zip((q, k, v), grads, strict=True))
    n, t_q, d = q.shape
    t_k, d_v = k.shape[1], v.shape[2]
    if n == 0 or t_q == 0 or t_k == 0:
        return zeros(q.shape, q.dtype), zeros(k.shape, k.dtype), zeros(v.shape, v.dtype)
    # Every row of dq, dk and dv is written by one thread of the kernels below.
    dq, dk, dv = empty(q.shape, q.dtype), empty(k.shape, k.dtype), empty(v.shape, v.dtype)
    delta = empty((n, t_q), q.dtype) if d_v else zeros((n, t_q), q.dtype)
    if d_v:
        launch(_sdpa_delta_kernel, nblocks(n * t_q), THREADS, delta, do, o)
    mask_arg, has_mask = _sdpa_mask(mask)
    scale = q.dtype.type(scale)
    itemsize = q.dtype.itemsize

    def dq_words(b):
        return 2 * (d + 1) + (d_v + 1) + d + d_v

    def dkv_words(b):
        return 2 * (d + 1) + 2 * (d_v + 1) + d + d_v + 2

    rows = _sdpa_rows(dq_words, itemsize, "sdpa_back", q.shape)
    launch(_sdpa_dq_kernel(q.dtype), (-(-t_q // rows), min(n, MAX_GRID_AXIS)), rows, dq, q, k, v, lse, delta,
            do, mask_arg, has_mask, scale, bool(causal), shared_bytes=rows * dq_words(rows) * itemsize)
    rows = _sdpa_rows(dkv_words, itemsize, "sdpa_back", q.shape)
    launch(_sdpa_dkv_kernel(q.dtype), (-(-t_k // rows), min(n, MAX_GRID_AXIS)), rows, dk, dv, q, k, v, lse,
            delta, do, mask_arg, has_mask, scale, bool(causal),
            shared_bytes=rows * dkv_words(rows) * itemsize)
    return dq, dk, dv


@per_dtype
def _sdpa_weights_kernel(nb_type, dtype):
    zero = dtype.type(0)

    @cuda.jit
    def sdpa_weights_run(p, q, k, lse, mask, has_mask, scale, causal):
        """p[n, i, j] = exp(scale q[n, i] . k[n, j] - lse[n, i]), a thread per entry."""
        t_q, t_k, d = q.shape[1], k.shape[1], q.shape[2]
        for flat in range(cuda.grid(1), p.shape[0] * t_q * t_k, cuda.gridsize(1)):
            n = flat // (t_q * t_k)
            i = (flat // t_k) % t_q
            j = flat % t_k
            hidden = (causal and j > i) or not math.isfinite(lse[n, i])
            if has_mask:
                hidden = hidden or not mask[n if mask.shape[0] > 1 else 0, i, j]
            if hidden:
                p[n, i, j] = zero
                continue
            acc = zero
            for dd in range(d):
                acc += q[n, i, dd] * k[n, j, dd]
            p[n, i, j] = math.exp(acc * scale - lse[n, i])

    return sdpa_weights_run


def sdpa_weights(q, k, lse, mask, scale, causal):
    """The weights sdpa did not keep, rebuilt from its lse (see reference.sdpa_weights)."""
    q, k = _heads_first(q), _heads_first(k)
    n, t_q, _ = q.shape
    t_k = k.shape[1]
    p = empty((n, t_q, t_k), q.dtype)
    if p.size:
        mask_arg, has_mask = _sdpa_mask(mask)
        launch(_sdpa_weights_kernel(q.dtype), nblocks(p.size), THREADS, p, q, k, lse, mask_arg, has_mask,
                q.dtype.type(scale), bool(causal))
    return p


@per_dtype
def _sdpa_prefix_kernel(nb_type, dtype):
    zero, one, lowest = dtype.type(0), dtype.type(1), dtype.type(-np.inf)

    @cuda.jit
    def sdpa_prefix_run(o, q, k, v, position, scale):
        """o[n, i, e] over the keys 0 .. position, a thread per entry: each recomputes its
        row's scores (a decoding step's rows are few and short).  The position is read
        here, on the device, and clamped to the keys there are."""
        t_q, d, d_v = q.shape[1], q.shape[2], v.shape[2]
        # Comparisons, not min/max: the builtins fail to compile for the GPU here (the
        # simulator runs them; tests/cuda_ptx.py found it).
        count = position[0] + 1
        if count < 1:
            count = 1
        if count > k.shape[1]:
            count = k.shape[1]
        for flat in range(cuda.grid(1), o.shape[0] * t_q * d_v, cuda.gridsize(1)):
            n = flat // (t_q * d_v)
            i = (flat // d_v) % t_q
            e = flat % d_v
            m = lowest
            for j in range(count):
                s = zero
                for dd in range(d):
                    s += q[n, i, dd] * k[n, j, dd]
                if s * scale > m:
                    m = s * scale
            total, acc = zero, zero
            for j in range(count):
                s = zero
                for dd in range(d):
                    s += q[n, i, dd] * k[n, j, dd]
                p = math.exp(s * scale - m)
                total += p
                acc += p * v[n, j, e]
            o[n, i, e] = acc * (one / total)

    return sdpa_prefix_run


def sdpa_prefix(q, k, v, position, scale):
    """reference.sdpa_prefix: q (N, T_q, D) over the keys 0 .. position of k (N, L, D),
    v (N, L, D_v); ``position`` a 0-d int device array, never read on the host."""
    o = empty(tuple(q.shape[:2]) + (v.shape[2],), q.dtype)
    if o.size and k.shape[1]:
        launch(_sdpa_prefix_kernel(q.dtype), nblocks(o.size), THREADS, o, q, k, v, ravel(position),
                q.dtype.type(scale))
    return o


# ---------------------------------------------------------------- the table

KERNELS = {"sdpa": sdpa, "sdpa_back": sdpa_back, "sdpa_weights": sdpa_weights, "sdpa_prefix": sdpa_prefix}
