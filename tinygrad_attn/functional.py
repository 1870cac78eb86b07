"""Losses and layers as functions, PyTorch-style: ``import tinygrad_attn.functional as F``.

Classes live on the **last** axis everywhere (logits (..., C), target (...)), the layout of
a decoder's (B, T, V) output.  PyTorch's cross_entropy puts classes on axis 1 instead; for
2-D inputs (N, C) the two agree.
"""

from __future__ import annotations

import math

import numpy as np

from . import autograd
from . import random as _random
from .autograd import ShapeError
from .ops import (
    CrossEntropy,
    Dropout,
    Embedding,
    Gelu,
    GeluTanh,
    GRUCell,
    GRUGates,
    LayerNorm,
    Linear,
    LSTMCellState,
    LSTMHidden,
    NLLLoss,
)
from .tensor import Tensor, cat, where

__all__ = ["linear", "gelu", "layer_norm", "cross_entropy", "nll_loss", "mse_loss", "dropout", "embedding",
           "gru_cell", "lstm_cell"]


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x Phi(x), Phi the standard normal CDF, as ``torch.nn.functional.gelu``: the exact erf
    form (``ta.ops.Gelu``) or, with ``approximate="tanh"``, the tanh approximation
    (``ta.ops.GeluTanh``).  One node each, its derivative derived from the formula.

    Example:
        >>> F.gelu(Tensor([-1.0, 0.0, 1.0])).numpy()      # [-0.1587, 0, 0.8413]
    """
    if approximate == "none":
        return Gelu.apply(x)
    if approximate == "tanh":
        return GeluTanh.apply(x)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape`` axes
    (biased variance), as ``torch.nn.functional.layer_norm``: one node (``ta.ops.LayerNorm``).

    Example:
        >>> y = F.layer_norm(x, (64,), gamma, beta)        # x (B, T, 64)
    """
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if weight is None and bias is not None:              # the op takes a bias after a weight
        weight = Tensor.ones(*shape, dtype=bias.dtype, device=bias.device)
    params = tuple(p for p in (weight, bias) if p is not None)
    return LayerNorm.apply(x, *params, normalized_shape=shape, epsilon=float(eps))


def _ids(x, like: Tensor, what: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    array = np.asarray(x)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integers, got {array.dtype}")
    # What Tensor(array, dtype=np.int64) makes (astype copies: the op keeps the ids for its
    # backward, and the caller may reuse its array), without its generality: a decoder
    # looks up one column of ids per step.
    return Tensor._make(like.backend.asarray(array.astype(np.int64), np.int64), like.backend, False)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x W^T + b`` as one fused node (``ta.ops.Linear``), as ``torch.nn.functional.linear``.

    Args:
        x: (..., in).
        weight: (out, in), PyTorch's layout.
        bias: (out,) or None.

    Returns:
        (..., out)

    Example:
        >>> y = F.linear(x, W, b)          # x (B, T, 64), W (128, 64), b (128,) -> (B, T, 128)
    """
    return Linear.apply(x, weight) if bias is None else Linear.apply(x, weight, bias)


def cross_entropy(logits: Tensor, target, ignore_index: int | None = None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy, fused: ``-log softmax(logits)[target]``.

    Args:
        logits: float (..., C) unnormalised scores.
        target: int (...) class ids (a Tensor, array or list).
        ignore_index: a target id whose rows are skipped (e.g. the ``<pad>`` id 0).
        reduction: "mean" (over rows not ignored; 0 if all are), "sum" or "none".
        label_smoothing: eps in [0, 1]: the target distribution is (1 - eps) on the target
            class plus eps / C on every class (Szegedy et al. 2016; torch's definition), so a
            row's loss is (1 - eps) (-log p_target) + eps mean_c(-log p_c).  Ignored rows
            still contribute nothing.

    Example:
        >>> loss = F.cross_entropy(logits, tgt_out, ignore_index=0)   # (B, T, V), (B, T)
        >>> loss = F.cross_entropy(logits, tgt_out, ignore_index=0, label_smoothing=0.1)
    """
    target = _ids(target, logits, "cross_entropy: target")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if not label_smoothing:
        return CrossEntropy.apply(logits, target, ignore_index=ignore_index, reduction=reduction)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    eps = float(label_smoothing)
    nll = CrossEntropy.apply(logits, target, ignore_index=ignore_index, reduction="none")   # (...)
    spread = -logits.log_softmax(-1).mean(axis=-1)                                         # (...)
    if ignore_index is None:
        # Every row kept: spread * 1 is spread, so the rows skip the product with ones.
        rows = nll * (1.0 - eps) + spread * eps
        divisor = max(math.prod(target.shape), 1)
    else:
        # The kept rows and their count come from kernels, never read on the host: a
        # captured step counts each batch's padding afresh.
        ids = target.astype(np.int64)        # an ignore_index outside a narrower dtype still compares
        keep = (ids != ignore_index).astype(logits.dtype)                                  # (...)
        rows = nll * (1.0 - eps) + spread * keep * eps
        k = logits.backend
        divisor = Tensor._make(k.clamp_divisor(k.count_ne(ids._data, ignore_index), logits.dtype), k, False)
    if reduction == "none":
        return rows
    total = rows.sum()
    return total if reduction == "sum" else total / divisor


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
    # A kernel draws the multiplier (on "cuda" too, numpy's generator on the host, copied
    # over): the same stream on every device, and a captured step draws again each replay.
    multiplier = x.backend.dropout_multiplier(rng, x.shape, float(p), x.dtype)
    if generator is not None and autograd.state.capture is not None:
        autograd.state.capture.drew_from_given_generator()
    return Dropout.apply(x, Tensor._make(multiplier, x.backend, False))


def embedding(ids, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of ``weight`` (V, E) picked by integer ``ids`` (...) -> (..., E).

    The row ``padding_idx`` receives no gradient, as in PyTorch.
    """
    ids = _ids(ids, weight, "embedding: ids")
    return Embedding.apply(weight, ids, padding_idx=padding_idx)


# ---------------------------------------------------------------- recurrent cells


def input_parts(what: str, x) -> tuple[Tensor, ...]:
    """A cell's input as a tuple of the tensors that, joined along the last axis, make it:
    ``(x,)`` for a Tensor, the tensors themselves for a tuple or list of them."""
    parts = tuple(x) if isinstance(x, tuple | list) else (x,)
    for p in parts:                  # a loop, not all(genexpr): a decoder calls this every step
        if not isinstance(p, Tensor):
            raise TypeError(f"{what}: x must be a Tensor or a non-empty tuple of Tensors, got "
                            f"{type(p).__name__}")
    if not parts:
        raise TypeError(f"{what}: x must be a Tensor or a non-empty tuple of Tensors, got ()")
    return parts


def check_cell(what: str, gates: int, x: Tensor | tuple, states: tuple, w_ih: Tensor, w_hh: Tensor,
                 b_ih: Tensor | None, b_hh: Tensor | None) -> None:
    """Check a cell's arguments against PyTorch's layout, naming the function in errors.
    ``x`` is a Tensor or a tuple of parts joined along the last axis."""
    parts = input_parts(what, x)
    inputs = [(f"x{k + 1}" if len(parts) > 1 else "x", p) for k, p in enumerate(parts)]

    def shapes() -> str:
        named = [*inputs, *states, ("w_ih", w_ih), ("w_hh", w_hh), ("b_ih", b_ih), ("b_hh", b_hh)]
        return ", ".join(f"{name} {t.shape}" for name, t in named if t is not None)

    if w_hh.ndim != 2 or w_ih.ndim != 2 or w_hh.shape[0] != gates * w_hh.shape[1]:
        raise ShapeError(f"{what}: expected w_ih ({gates}H, I) and w_hh ({gates}H, H); got {shapes()}")
    hidden = w_hh.shape[1]
    if w_ih.shape[0] != gates * hidden:
        raise ShapeError(f"{what}: w_ih must have {gates}H = {gates * hidden} rows for H = {hidden}; "
                         f"got {shapes()}")
    if any(p.ndim == 0 for p in parts):
        raise ShapeError(f"{what}: x must have at least one axis (I); got {shapes()}")
    if any(p.shape[:-1] != parts[0].shape[:-1] for p in parts):
        raise ShapeError(f"{what}: the parts of x must agree on every axis but the last; got {shapes()}")
    width = sum(p.shape[-1] for p in parts)
    if width != w_ih.shape[1]:
        joined = " (the parts' sizes added)" if len(parts) > 1 else ""
        raise ShapeError(f"{what}: x must end in I = {w_ih.shape[1]} (w_ih's columns){joined}; "
                         f"got {shapes()}")
    x = parts[0]
    for name, b in (("b_ih", b_ih), ("b_hh", b_hh)):
        if b is not None and b.shape != (gates * hidden,):
            raise ShapeError(f"{what}: {name} must be ({gates * hidden},); got {shapes()}")
    for _, state in states:
        if state.shape != x.shape[:-1] + (hidden,):
            raise ShapeError(f"{what}: states must be {x.shape[:-1] + (hidden,)} (x's batch axes, "
                             f"then H); got {shapes()}")


def _affine(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return linear(x, w, b)                                           # (..., G*H)


def gru_cell(x: Tensor, h: Tensor | None, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None,
             b_hh: Tensor | None = None) -> Tensor:
    """One GRU step, as ``torch.nn.GRUCell`` (and ``torch.gru_cell``): PyTorch's gate order
    (r, z, n), weight layout and formulas, so a GRUCell's parameters plug straight in.

        r = sigmoid(x W_ir^T + b_ir + h W_hr^T + b_hr)
        z = sigmoid(x W_iz^T + b_iz + h W_hz^T + b_hz)
        n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn))
        h' = (1 - z) * n + z * h

    One fused ``GRUCell`` node: the two products on BLAS, the gates in one kernel.

    Args:
        x: input (B, I), or (I,) for one unbatched sample (any leading axes work); or a tuple
            of tensors that joined along the last axis make it, such as a Bahdanau decoder's
            (y_{i-1}, c_i), which the node reads as they are (no Cat node).
        h: hidden state (B, H), or None for zeros.
        w_ih: (3H, I), the rows of W_ir, W_iz, W_in stacked (GRUCell.weight_ih).
        w_hh: (3H, H), likewise (GRUCell.weight_hh).
        b_ih: (3H,) bias, or None (GRUCell(bias=False)).
        b_hh: (3H,) bias, or None.

    Returns:
        The next hidden state h' (B, H).

    Example:
        >>> x, h = Tensor.randn(8, 16), Tensor.randn(8, 32)
        >>> w_ih, w_hh = Tensor.randn(96, 16), Tensor.randn(96, 32)       # (3H, I), (3H, H)
        >>> b_ih, b_hh = Tensor.randn(96), Tensor.randn(96)
        >>> F.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh).shape
        (8, 32)
    """
    parts = input_parts("gru_cell", x)
    if h is None:
        like = parts[0]
        h = Tensor.zeros(*like.shape[:-1], w_hh.shape[-1], dtype=like.dtype, device=like.device)
    check_cell("gru_cell", 3, parts, (("h", h),), w_ih, w_hh, b_ih, b_hh)
    return gru_step(parts, h, w_ih, w_hh, b_ih, b_hh)


def gru_step(x: Tensor | tuple[Tensor, ...], h: Tensor, w_ih: Tensor, w_hh: Tensor,
             b_ih: Tensor | None, b_hh: Tensor | None, keep=None) -> Tensor:
    """``gru_cell`` without its argument checks, for layers that check once per sequence.

    ``x`` may be a tuple of tensors that joined along the last axis make the input (a
    Bahdanau decoder's [y; c]): the fused node reads them as they are, with no Cat node.
    ``keep``: optional boolean (..., 1), False where a row's step is padding: there the
    result is ``h`` itself (``where(keep, h', h)``, done inside the fused node)."""
    parts = x if isinstance(x, tuple) else (x,)
    if (b_ih is None) != (b_hh is None):             # the fused node takes both biases or neither
        joined = parts[0] if len(parts) == 1 else cat(parts, axis=-1)
        gi = _affine(joined, w_ih, b_ih)                             # (..., 3H)
        gh = _affine(h, w_hh, b_hh)                                  # (..., 3H)
        h_next = GRUGates.apply(gi, gh, h)
        return h_next if keep is None else where(keep, h_next, h)
    biases = () if b_ih is None else (b_ih, b_hh)
    masked = () if keep is None else (keep,)
    attrs = {} if keep is None else {"masked": True}
    if len(parts) > 1:
        attrs["parts"] = len(parts)
    return GRUCell.apply(*parts, h, w_ih, w_hh, *biases, *masked, **attrs)


def gru_projected_step(gi: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None, keep=None) -> Tensor:
    """``gru_step`` given gi = x W_ih^T + b_ih (..., 3H) in place of x: for a layer that
    multiplies every step's input at once (``nn.GRU.unroll``); one ``GRUCell`` node with
    ``projected=True``, no argument checks.  ``keep`` as in ``gru_step``."""
    bias = () if b_hh is None else (b_hh,)
    if keep is None:
        return GRUCell.apply(gi, h, w_hh, *bias, projected=True)
    return GRUCell.apply(gi, h, w_hh, *bias, keep, projected=True, masked=True)


def lstm_cell(x: Tensor, hx: tuple[Tensor, Tensor] | None, w_ih: Tensor, w_hh: Tensor,
              b_ih: Tensor | None = None, b_hh: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One LSTM step, as ``torch.nn.LSTMCell`` (and ``torch.lstm_cell``): PyTorch's gate order
    (i, f, g, o), weight layout and formulas, so an LSTMCell's parameters plug straight in.

        [i, f, g, o] = x W_ih^T + b_ih + h W_hh^T + b_hh
        c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
        h' = sigmoid(o) * tanh(c')

    The two products are MatMul nodes (BLAS); c' and h' are one fused node each
    (``LSTMCellState``, ``LSTMHidden``).

    Args:
        x: input (B, I), or (I,) for one unbatched sample (any leading axes work).
        hx: the states (h, c), each (B, H), or None for zeros.
        w_ih: (4H, I), the rows of W_ii, W_if, W_ig, W_io stacked (LSTMCell.weight_ih).
        w_hh: (4H, H), likewise (LSTMCell.weight_hh).
        b_ih: (4H,) bias, or None (LSTMCell(bias=False)).
        b_hh: (4H,) bias, or None.

    Returns:
        (h', c'), each (B, H).

    Example:
        >>> x, h, c = Tensor.randn(8, 16), Tensor.randn(8, 32), Tensor.randn(8, 32)
        >>> w_ih, w_hh = Tensor.randn(128, 16), Tensor.randn(128, 32)
        >>> h, c = F.lstm_cell(x, (h, c), w_ih, w_hh)
        >>> h.shape, c.shape
        ((8, 32), (8, 32))
    """
    if hx is None:
        zeros = Tensor.zeros(*x.shape[:-1], w_hh.shape[-1], dtype=x.dtype, device=x.device)
        hx = (zeros, zeros)
    h, c = hx
    check_cell("lstm_cell", 4, x, (("h", h), ("c", c)), w_ih, w_hh, b_ih, b_hh)
    return lstm_step(x, h, c, w_ih, w_hh, b_ih, b_hh)


def lstm_step(x: Tensor, h: Tensor, c: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
              b_hh: Tensor | None) -> tuple[Tensor, Tensor]:
    """``lstm_cell`` without its argument checks, for layers that check once per sequence."""
    return lstm_projected_step(_affine(x, w_ih, b_ih), h, c, w_hh, b_hh)


def lstm_projected_step(gi: Tensor, h: Tensor, c: Tensor, w_hh: Tensor,
                        b_hh: Tensor | None) -> tuple[Tensor, Tensor]:
    """``lstm_step`` given gi = x W_ih^T + b_ih (..., 4H) in place of x (see
    ``gru_projected_step``)."""
    gates = gi + _affine(h, w_hh, b_hh)                              # (..., 4H)
    c_next = LSTMCellState.apply(gates, c)                           # (..., H)
    return LSTMHidden.apply(gates, c_next), c_next


def rnn_step(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
             b_hh: Tensor | None, nonlinearity: str = "tanh") -> Tensor:
    """One Elman RNN step, as ``torch.nn.RNNCell``: h' = f(x W_ih^T + b_ih + h W_hh^T + b_hh),
    f = tanh or relu (the seeds' SimpleRNN is the tanh one).  No argument checks."""
    return rnn_projected_step(_affine(x, w_ih, b_ih), h, w_hh, b_hh, nonlinearity)


def rnn_projected_step(gi: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None,
                       nonlinearity: str = "tanh") -> Tensor:
    """``rnn_step`` given gi = x W_ih^T + b_ih (..., H) in place of x (see
    ``gru_projected_step``)."""
    pre = gi + _affine(h, w_hh, b_hh)                                # (..., H)
    return pre.tanh() if nonlinearity == "tanh" else pre.relu()
