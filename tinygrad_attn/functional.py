"""Losses and layers as functions, PyTorch-style: ``import tinygrad_attn.functional as F``.

Classes live on the **last** axis everywhere (logits (..., C), target (...)), the layout of
a decoder's (B, T, V) output.  PyTorch's cross_entropy puts classes on axis 1 instead; for
2-D inputs (N, C) the two agree.
"""

from __future__ import annotations

import numpy as np

from . import random as _random
from .ops import CrossEntropy, Dropout, Embedding, NLLLoss
from .tensor import Tensor

__all__ = ["cross_entropy", "nll_loss", "mse_loss", "dropout", "embedding"]


def _ids(x, like: Tensor, what: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    array = np.asarray(x)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integers, got {array.dtype}")
    return Tensor(array, dtype=np.int64, device=like.device)


def cross_entropy(logits: Tensor, target, ignore_index: int | None = None,
                  reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy, fused: ``-log softmax(logits)[target]``.

    Args:
        logits: float (..., C) unnormalised scores.
        target: int (...) class ids (a Tensor, array or list).
        ignore_index: a target id whose rows are skipped (e.g. the ``<pad>`` id 0).
        reduction: "mean" (over rows not ignored; 0 if all are), "sum" or "none".

    Example:
        >>> loss = F.cross_entropy(logits, tgt_out, ignore_index=0)   # (B, T, V), (B, T)
    """
    target = _ids(target, logits, "cross_entropy: target")
    return CrossEntropy.apply(logits, target, ignore_index=ignore_index, reduction=reduction)


def nll_loss(log_probs: Tensor, target, ignore_index: int | None = None,
             reduction: str = "mean") -> Tensor:
    """Negative log-likelihood ``-log_probs[target]`` of (..., C) log-probabilities."""
    target = _ids(target, log_probs, "nll_loss: target")
    return NLLLoss.apply(log_probs, target, ignore_index=ignore_index, reduction=reduction)


def mse_loss(input: Tensor, target, reduction: str = "mean") -> Tensor:
    """Mean squared error.  ``input`` and ``target`` must have the same shape: a broadcast
    here is almost always a bug (PyTorch only warns), so it raises."""
    target = target if isinstance(target, Tensor) else input._operand(np.asarray(target), "mse_loss")
    if input.shape != target.shape:
        raise ValueError(f"mse_loss: input shape {input.shape} differs from target shape "
                         f"{target.shape}")
    squared = (input - target) ** 2
    if reduction == "mean":
        return squared.mean()
    if reduction == "sum":
        return squared.sum()
    if reduction == "none":
        return squared
    raise ValueError(f"mse_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def dropout(x: Tensor, p: float = 0.5, training: bool = True,
            generator: np.random.Generator | None = None) -> Tensor:
    """Zero each entry with probability ``p`` and scale the rest by 1/(1-p) (inverted
    dropout).  The identity when ``training`` is False or p is 0.

    The mask comes from ``generator`` or the engine's generator, so ``ta.manual_seed``
    makes it reproducible.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    rng = generator if generator is not None else _random.generator()
    mask = rng.random(x.shape) >= p
    return Dropout.apply(x, mask=mask, p=float(p))


def embedding(ids, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of ``weight`` (V, E) picked by integer ``ids`` (...) -> (..., E).

    The row ``padding_idx`` receives no gradient, as in PyTorch.
    """
    ids = _ids(ids, weight, "embedding: ids")
    return Embedding.apply(weight, ids, padding_idx=padding_idx)
