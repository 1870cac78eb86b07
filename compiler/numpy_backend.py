"""Reference kernels in plain numpy: the oracle every other backend is tested against.

Kernels take numpy arrays and Python ints/floats and return new arrays; they never see a
Tensor and never validate shapes (the ops do that, so errors can name the op).
A ``*_back`` kernel is the vector-Jacobian product of its partner.
"""

from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------- memory and dtype


def asarray(data, dtype):
    # np.asarray(order="C"), not np.ascontiguousarray: the latter turns 0-d arrays into 1-d.
    return np.asarray(data, dtype=dtype, order="C")


def to_numpy(x):
    return x


def zeros(shape, dtype):
    return np.zeros(shape, dtype=dtype)


def full(shape, value, dtype):
    out = np.empty(shape, dtype=dtype)     # np.full's Python wrapper costs ~0.5 us more
    out.fill(value)
    return out


def astype(x, dtype):
    return x.astype(dtype, copy=True)


def copy(x):
    return x.copy()


# ---------------------------------------------------------------- elementwise forward


def add(a, b):
    return np.add(a, b)


def add_(a, b):
    """a += b in place, returning a: backward sums a weight's gradients from every step
    into one buffer instead of allocating a new array per step.  (A sum of 0-d arrays is a
    numpy scalar, which cannot be written into: then a new one.)"""
    if isinstance(a, np.ndarray):
        return np.add(a, b, out=a)
    return np.add(a, b)


def sub(a, b):
    return np.subtract(a, b)


def mul(a, b):
    return np.multiply(a, b)


def div(a, b):
    return np.divide(a, b)


def neg(x):
    return np.negative(x)


def pow(x, p):  # noqa: A001 - the kernel is named after the math
    return np.power(x, p)


def exp(x):
    return np.exp(x)


def log(x):
    return np.log(x)


def tanh(x):
    return np.tanh(x)


def sigmoid(x):
    # exp of a non-positive number only: never overflows for large |x|.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def relu(x):
    return np.maximum(x, 0).astype(x.dtype, copy=False)


def leaky_relu(x, negative_slope):
    return np.where(x > 0, x, x * x.dtype.type(negative_slope))


# ---------------------------------------------------------------- elementwise backward


def div_back_b(a, b, dy):
    """d(a/b)/db * dy = -a / b^2 * dy."""
    return -dy * a / (b * b)


def pow_back_base(x, p, dy):
    return dy * p * np.power(x, p - 1)


def pow_back_exponent(y, x, dy):
    # d(x^p)/dp = x^p log x; only asked for when the exponent requires grad.
    return dy * y * np.log(x)


def tanh_back(y, dy):
    """Uses the output y: d tanh = 1 - y^2."""
    return (1 - y * y) * dy


def sigmoid_back(y, dy):
    """Uses the output y: d sigmoid = y (1 - y)."""
    return y * (1 - y) * dy


def relu_back(x, dy):
    return np.where(x > 0, dy, 0).astype(dy.dtype, copy=False)


def leaky_relu_back(x, dy, negative_slope):
    return np.where(x > 0, dy, dy * dy.dtype.type(negative_slope))


# ---------------------------------------------------------------- comparisons and selection


def eq(a, b):
    return np.equal(a, b)


def ne(a, b):
    return np.not_equal(a, b)


def lt(a, b):
    return np.less(a, b)


def le(a, b):
    return np.less_equal(a, b)


def gt(a, b):
    return np.greater(a, b)


def ge(a, b):
    return np.greater_equal(a, b)


def where(cond, a, b):
    return np.where(cond, a, b)


# ---------------------------------------------------------------- reductions


def sum(x, axis, keepdims):  # noqa: A001
    return x.sum(axis=axis, keepdims=keepdims)


def sum_to(x, shape):
    """Sum ``x`` down to ``shape``: the backward of broadcasting ``shape`` up to x.shape."""
    if x.shape == tuple(shape):
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, n in enumerate(shape) if n == 1 and x.shape[i + lead] != 1
    )
    return np.sum(x, axis=axes, keepdims=True).reshape(shape)


def broadcast_to(x, shape):
    """A C-contiguous array of ``shape``: a read-only view of x when it already is one, else
    a copy.  Assigning into an empty array broadcasts as np.broadcast_to does, without its
    ~2 us Python wrapper (every sum's backward calls this); the axes check keeps assignment's
    one extra leniency, dropping leading 1s, out."""
    x, shape = np.asarray(x), tuple(shape)                 # a numpy scalar from a full sum
    if x.ndim > len(shape):
        raise ValueError(f"cannot broadcast an array of shape {x.shape} to {shape}")
    if x.shape == shape and x.flags.c_contiguous:
        view = x.view()
        view.flags.writeable = False
        return view
    out = np.empty(shape, dtype=x.dtype)
    out[...] = x
    return out


def max(x, axis, keepdims):  # noqa: A001
    return np.max(x, axis=axis, keepdims=keepdims)


def max_back(x, y_keep, dy_keep):
    """Gradient of max split evenly between tied maxima (the mean subgradient).

    y_keep and dy_keep have the reduced axes kept (size 1), so they broadcast against x.
    """
    hit = x == y_keep
    reduced = tuple(i for i, n in enumerate(y_keep.shape) if n == 1)
    count = np.sum(hit, axis=reduced, keepdims=True)
    return np.where(hit, dy_keep / count, 0).astype(x.dtype, copy=False)


# ---------------------------------------------------------------- movement


def reshape(x, shape):
    # The method, not np.reshape: the function's dispatch wrapper costs ~2 us a call, and a
    # training step reshapes hundreds of small arrays.
    return x.reshape(shape)


def permute(x, axes):
    return np.asarray(np.transpose(x, axes), order="C")


def getitem(x, index):
    return np.array(x[index], copy=True)


def getitem_back(shape, index, dy):
    """Scatter-add dy into zeros of ``shape``; repeated integer indices accumulate."""
    dx = np.zeros(shape, dtype=dy.dtype)
    if all(isinstance(part, (int, np.integer, slice)) or part is None or part is Ellipsis
           for part in index):
        dx[index] = dy  # a basic index picks each entry at most once: no scatter needed
    else:
        np.add.at(dx, index, dy)
    return dx


def cat(xs, axis):
    return np.concatenate(xs, axis=axis)


def split(x, sizes, axis):
    """Inverse of cat: pieces of ``x`` along ``axis`` with the given sizes."""
    index = [slice(None)] * x.ndim
    pieces, start = [], 0
    for size in sizes:            # plain slices: np.split's generality costs ~10 us a call
        index[axis] = slice(start, start + size)
        pieces.append(np.ascontiguousarray(x[tuple(index)]))
        start += size
    return pieces


def stack(xs, axis):
    return np.stack(xs, axis=axis)


# ---------------------------------------------------------------- linear algebra


def matmul(a, b):
    if a.ndim >= 2 and b.ndim >= 2 and a.shape[-1] == 1 and b.shape[-2] == 1:
        # Inner size 1 is an outer product, which numpy's batched matmul loops over 3-4x
        # slower than a broadcast multiply (a decoder step's d(keys) = a^T @ d(context)).
        return np.multiply(a, b)
    return np.matmul(a, b)


def matmul_nt(a, b):
    """a @ b^T over the last two axes.  The transpose is a view: BLAS reads it in place
    (a transposed operand is just a flag to GEMM), so no copy of b is made."""
    return matmul(a, b.swapaxes(-1, -2))


def matmul_tn(a, b):
    """a^T @ b over the last two axes, reading a^T in place (see matmul_nt)."""
    return matmul(a.swapaxes(-1, -2), b)


# ---------------------------------------------------------------- softmax family


def softmax(x, axis):
    """Row softmax; subtracts the row max so exp never overflows.

    A row that is entirely -inf (every position masked) gives zeros, not NaN.
    """
    m = np.max(x, axis=axis, keepdims=True)
    m[~np.isfinite(m)] = 0
    # In place from here: one full-size buffer instead of three (these are large arrays).
    e = np.subtract(x, m)
    np.exp(e, out=e)
    s = np.sum(e, axis=axis, keepdims=True)
    s[s == 0] = 1
    e /= s
    return e


def softmax_back(y, dy, axis):
    """dx = y * (dy - sum(dy * y)), in one full-size buffer."""
    dx = np.multiply(dy, y)
    s = np.sum(dx, axis=axis, keepdims=True)
    np.subtract(dy, s, out=dx)
    dx *= y
    return dx


def log_softmax(x, axis):
    """x - logsumexp(x), with the row max subtracted first.

    A row that is entirely -inf gives -inf (the log of softmax's zeros), not NaN.
    """
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    shifted = x - m
    s = np.sum(np.exp(shifted), axis=axis, keepdims=True)
    return shifted - np.log(np.where(s > 0, s, 1))


def log_softmax_back(y, dy, axis):
    return dy - np.exp(y) * np.sum(dy, axis=axis, keepdims=True)


def cross_entropy(logits, target, ignore_index):
    """Per-row loss -log softmax(logits)[target] for 2-D logits (N, C), target (N,).

    Returns (loss (N,), logsumexp (N,)); rows whose target is ignore_index get loss 0.
    The logsumexp is saved for backward so softmax is never stored.
    """
    m = np.max(logits, axis=1)
    lse = m + np.log(np.sum(np.exp(logits - m[:, None]), axis=1))
    keep = target != ignore_index
    safe_target = np.where(keep, target, 0)
    picked = logits[np.arange(logits.shape[0]), safe_target]
    loss = np.where(keep, lse - picked, 0).astype(logits.dtype, copy=False)
    return loss, lse


def cross_entropy_back(logits, lse, target, ignore_index, dloss):
    """d loss_n / d logits_n = softmax(logits_n) - onehot(target_n), scaled by dloss_n."""
    keep = target != ignore_index
    dx = np.exp(logits - lse[:, None])
    rows = np.arange(logits.shape[0])
    dx[rows, np.where(keep, target, 0)] -= 1
    scale = np.where(keep, dloss, 0).astype(logits.dtype, copy=False)
    return dx * scale[:, None]


def nll_loss(logp, target, ignore_index):
    """Per-row loss -logp[target] for (N, C) log-probabilities; ignored rows give 0."""
    keep = target != ignore_index
    picked = logp[np.arange(logp.shape[0]), np.where(keep, target, 0)]
    return np.where(keep, -picked, 0).astype(logp.dtype, copy=False)


def nll_loss_back(shape, target, ignore_index, dloss):
    keep = target != ignore_index
    dx = np.zeros(shape, dtype=dloss.dtype)
    rows = np.arange(shape[0])
    dx[rows, np.where(keep, target, 0)] = np.where(keep, -dloss, 0)
    return dx


# ---------------------------------------------------------------- attention


def masked_softmax(x, mask):
    """Softmax over the last axis of x, restricted to the entries where ``mask`` (boolean,
    broadcast to x) is True.  Masked entries get exactly 0; a row with no True entry is
    all zeros (softmax of an all -inf row), never NaN."""
    return softmax(np.where(mask, x, -np.inf).astype(x.dtype, copy=False), -1)


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


def sdpa(q, k, v, mask, scale, causal):
    """Scaled dot-product attention without keeping the weights.

    q (N, T_q, D), k (N, T_k, D), v (N, T_k, D_v); mask None or boolean (N or 1, T_q, T_k),
    True = may attend; causal: key j <= query i.  Returns (o (N, T_q, D_v), lse (N, T_q)),
    the log-sum-exp of each row's scores, which is all backward needs to rebuild the
    weights.  Queries go one block at a time; each block sees every key, so its softmax is
    exact in one pass (no running rescaling).  A row with nothing to attend to gets o = 0
    and lse = -inf.
    """
    n, t_q, _ = q.shape
    t_k = k.shape[1]
    o = np.empty((n, t_q, v.shape[2]), dtype=q.dtype)
    lse = np.empty((n, t_q), dtype=q.dtype)
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
    return o, lse


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


# ---------------------------------------------------------------- embedding


def embedding(weight, ids):
    return weight[ids]


def embedding_back(num_rows, ids, dy, padding_idx):
    """Scatter-add rows of dy into a (num_rows, E) gradient; padding_idx gets none."""
    dw = np.zeros((num_rows, dy.shape[-1]), dtype=dy.dtype)
    np.add.at(dw, ids.reshape(-1), dy.reshape(-1, dy.shape[-1]))
    if padding_idx is not None:
        dw[padding_idx] = 0
    return dw


# ---------------------------------------------------------------- GRU and LSTM cell gates
#
# The elementwise part of a recurrent cell, after the two matrix products (left to BLAS).
# Gate orders and formulas are PyTorch's: GRU (r, z, n), LSTM (i, f, g, o).  Every array is
# 2-D and C-contiguous, rows are the batch, and H is the hidden size.
#
# Forward returns its output and the gate activations; backward takes those activations
# instead of recomputing them.  Why store rather than recompute: backward then runs no
# exp or tanh at all (the costly part of a cell), it multiplies exactly the values forward
# used, and the extra memory is one
# buffer the size of the gate pre-activations, which the graph keeps alive anyway.


def gru_gates(gi, gh, h_prev):
    """GRU cell after its products: gi = x W_ih^T + b_ih, gh = h_prev W_hh^T + b_hh (B, 3H),
    h_prev (B, H) -> (h (B, H), gates (B, 3H) = [r, z, n]) with
    r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z), n = tanh(gi_n + r * gh_n),
    h = (1 - z) n + z h_prev, computed as n + z (h_prev - n) like PyTorch."""
    hidden = h_prev.shape[1]
    gates = np.empty(gi.shape, dtype=gi.dtype)
    gates[:, : 2 * hidden] = sigmoid(gi[:, : 2 * hidden] + gh[:, : 2 * hidden])       # r, z
    r, z = gates[:, :hidden], gates[:, hidden : 2 * hidden]
    gates[:, 2 * hidden :] = np.tanh(gi[:, 2 * hidden :] + r * gh[:, 2 * hidden :])  # n
    n = gates[:, 2 * hidden :]
    h = n + z * (h_prev - n)
    return h, gates


def gru_gates_back(gates, gh, h_prev, dh):
    """Gradients (dgi, dgh, dh_prev) of gru_gates from its saved gates [r, z, n].

    The r and z blocks of dgi and dgh are equal (gi and gh enter those gates as a sum); the
    n blocks differ by the factor r that multiplies gh_n."""
    hidden = h_prev.shape[1]
    r, z, n = gates[:, :hidden], gates[:, hidden : 2 * hidden], gates[:, 2 * hidden :]
    dn = dh * (1 - z) * (1 - n * n)                               # d h / d(gi_n + r gh_n)
    dz = dh * (h_prev - n) * z * (1 - z)
    dr = dn * gh[:, 2 * hidden :] * r * (1 - r)
    dgi = np.concatenate([dr, dz, dn], axis=1)                    # (B, 3H)
    dgh = np.concatenate([dr, dz, dn * r], axis=1)                # (B, 3H)
    return dgi, dgh, dh * z


def lstm_cell_state(gates, c_prev):
    """LSTM cell state from gates = x W_ih^T + b_ih + h W_hh^T + b_hh (B, 4H) and c_prev (B, H):
    c = sigmoid(f) c_prev + sigmoid(i) tanh(g) -> (c (B, H), act (B, 3H) =
    [sigmoid(i), sigmoid(f), tanh(g)]).  The o block is not read (lstm_hidden uses it)."""
    hidden = c_prev.shape[1]
    act = np.empty((gates.shape[0], 3 * hidden), dtype=gates.dtype)
    act[:, : 2 * hidden] = sigmoid(gates[:, : 2 * hidden])                        # i, f
    act[:, 2 * hidden :] = np.tanh(gates[:, 2 * hidden : 3 * hidden])             # g
    i, f, g = act[:, :hidden], act[:, hidden : 2 * hidden], act[:, 2 * hidden :]
    c = f * c_prev + i * g
    return c, act


def lstm_cell_state_back(act, c_prev, dc):
    """Gradients (dgates (B, 4H), dc_prev) of lstm_cell_state from its saved activations;
    the o block of dgates is zero (c does not depend on o)."""
    hidden = c_prev.shape[1]
    i, f, g = act[:, :hidden], act[:, hidden : 2 * hidden], act[:, 2 * hidden :]
    dgates = np.zeros((act.shape[0], 4 * hidden), dtype=act.dtype)
    dgates[:, :hidden] = dc * g * i * (1 - i)
    dgates[:, hidden : 2 * hidden] = dc * c_prev * f * (1 - f)
    dgates[:, 2 * hidden : 3 * hidden] = dc * i * (1 - g * g)
    return dgates, dc * f


def lstm_hidden(gates, c):
    """LSTM hidden state from the o block of gates (B, 4H) and the cell state c (B, H):
    h = sigmoid(o) tanh(c) -> (h (B, H), act (B, 2H) = [sigmoid(o), tanh(c)])."""
    hidden = c.shape[1]
    act = np.empty((gates.shape[0], 2 * hidden), dtype=gates.dtype)
    act[:, :hidden] = sigmoid(gates[:, 3 * hidden :])
    act[:, hidden:] = np.tanh(c)
    return act[:, :hidden] * act[:, hidden:], act


def lstm_hidden_back(act, dh):
    """Gradients (dgates (B, 4H), dc) of lstm_hidden from its saved activations; only the
    o block of dgates is non-zero."""
    hidden = dh.shape[1]
    o, tanh_c = act[:, :hidden], act[:, hidden:]
    dgates = np.zeros((act.shape[0], 4 * hidden), dtype=act.dtype)
    dgates[:, 3 * hidden :] = dh * tanh_c * o * (1 - o)
    return dgates, dh * o * (1 - tanh_c * tanh_c)


KERNELS = {
    name: fn
    for name, fn in globals().items()
    if callable(fn) and not name.startswith("_") and getattr(fn, "__module__", None) == __name__
}
