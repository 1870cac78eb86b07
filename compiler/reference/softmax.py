"""The softmax family and the losses built on it: softmax, masked softmax, log-softmax,
their backwards, cross-entropy and NLL."""

from __future__ import annotations

import numpy as np


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
    return np.subtract(shifted, np.log(np.where(s > 0, s, 1)), out=shifted)     # a fresh array


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


def count_ne(x, value):
    """The number of entries of x that differ from ``value``, as a 0-d int64 array: the rows
    a loss keeps (the targets that are not ``ignore_index``).  Counted, not summed in
    floats, so it is exact at any size."""
    return np.asarray(np.count_nonzero(x != value), dtype=np.int64)


def clamp_divisor(count, dtype):
    """max(count, 1) as a 0-d array of ``dtype``: the divisor of a mean over ``count`` kept
    rows, 1 when none is kept (the mean of nothing is 0, not NaN).  Filled as ``full`` fills,
    so the value has the bits a Python int converted to ``dtype`` has."""
    out = np.empty((), dtype=dtype)
    out.fill(max(int(count), 1))
    return out


def masked_softmax(x, mask):
    """Softmax over the last axis of x, restricted to the entries where ``mask`` (boolean,
    broadcast to x) is True.  Masked entries get exactly 0; a row with no True entry is
    all zeros (softmax of an all -inf row), never NaN."""
    return softmax(np.where(mask, x, -np.inf).astype(x.dtype, copy=False), -1)


KERNELS = {
    "softmax": softmax, "softmax_back": softmax_back, "log_softmax": log_softmax,
    "log_softmax_back": log_softmax_back, "cross_entropy": cross_entropy,
    "cross_entropy_back": cross_entropy_back, "nll_loss": nll_loss, "nll_loss_back": nll_loss_back,
    "masked_softmax": masked_softmax, "count_ne": count_ne, "clamp_divisor": clamp_divisor,
}
