"""Every attention mechanism of the lecture notes, as differentiable functions.

All of them compute the same three steps (seed notes: scores, softmax, weighted sum)

    scores   e_j   = score(s, h_j)                 one per key h_j
    weights  a_j   = exp(e_j) / sum_k exp(e_k)     the attention distribution
    context  c     = sum_j a_j v_j                 v_j defaults to h_j

and differ only in the score function.  Each returns ``(context, weights)`` and records its
nodes inside one scope named after the mechanism (``additive_attention``, ...), so a graph
drawing shows one box per call that opens into its parts.

Shapes (``...`` are batch axes, which broadcast):

    keys     (..., T_k, d_k)     the encoder states h_1 .. h_T
    values   (..., T_k, d_v)     default: keys
    query    (..., T_q, d_q)     many queries (every decoder step; self-attention)
          or (..., d_q)          one query per row (one decoder state s_t): then the
                                 T_q axis is absent from context and weights
    weights  (..., T_q, T_k)     rows sum to 1 (0 for a row with nothing to attend to)
    context  (..., T_q, d_v)

Weight matrices are laid out like a PyTorch Linear weight, (out, in).

Masks are boolean, **True = may attend** (as in PyTorch's scaled_dot_product_attention),
and broadcast to the weights' shape with numpy's rules, aligned from the right.  A key
padding mask (B, T_k) therefore suits one query per row directly; with many queries pass
``mask[:, None, :]``.  A row whose every key is masked gets zero weights and a zero context,
never NaN, and passes no gradient.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping

import numpy as np

from . import functional
from .arguments import check_int, check_number
from .autograd import DTypeError, ShapeError, current_scope, scope
from .ops import AdditiveScores, MaskedSoftmax, ScaledDotProduct
from .ops.movement import split
from .shapes import batch_shape, broadcasts_to
from .tensor import Tensor, where

__all__ = [
    "dot",
    "general",
    "concat",
    "additive",
    "keys_projection",
    "scaled_dot_product",
    "multi_head",
    "graph",
    "masked_softmax",
    "record",
    "Record",
    "SCOPES",
    "HEADS_IN_PLACE_MAX_SCORES",
]

#: The scope each function records its nodes under (what graph drawings group into a box).
SCOPES = {
    "dot": "dot_attention",
    "general": "general_attention",
    "concat": "concat_attention",
    "additive": "additive_attention",
    "scaled_dot_product": "scaled_dot_product_attention",
    "multi_head": "multi_head_attention",
    "graph": "graph_attention",
}
_MECHANISM_SCOPES = frozenset(SCOPES.values())


class Record(Mapping):
    """The attention weights of every call made inside a ``record()`` block, as numpy arrays
    keyed by the scope of the call (the mechanism's own scopes left off), in call order:

        "decoder/t2/attention"                (B, S)        a Seq2Seq decoder step
        "encoder/layer0/self_attention"       (B, H, S, S)  a Transformer sublayer, per head
        "decoder/layer1/cross_attention"      (B, H, T, S)

    A second call in the same scope is keyed ``"<scope>#2"``, a third ``"#3"``, ...
    The arrays are copies, with no graph: recording never changes what a model computes.
    """

    def __init__(self, only=None):
        self._only = None if only is None else frozenset(only)
        self._weights: dict[str, np.ndarray] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self._weights[key]
        except KeyError:
            raise KeyError(f"no attention was recorded in scope {key!r}; recorded: "
                           f"{', '.join(self._weights) or 'nothing'}") from None

    def __iter__(self):
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)

    def __repr__(self) -> str:
        shown = ", ".join(f"{key!r}: {value.shape}" for key, value in self._weights.items())
        return f"Record({{{shown}}})"

    def _wants(self, key: str) -> bool:
        return self._only is None or key in self._only

    def _add(self, key: str, array: np.ndarray) -> None:
        if key in self._weights:
            count = 2
            while f"{key}#{count}" in self._weights:
                count += 1
            key = f"{key}#{count}"
        self._weights[key] = array


class _Recording(threading.local):
    """This thread's open ``record()`` blocks, innermost last.  Per thread, as autograd's
    scopes and ``no_grad`` are: a record keeps the calls of the thread that opened it only,
    so two threads decoding at once each see their own weights."""

    def __init__(self):
        self.records: list[Record] = []


_recording = _Recording()


class record:
    """Keep the attention weights of every call made in the block, for inspection:

        >>> with ta.attention.record() as weights:
        ...     logits, _ = model(src, tgt_in)
        >>> weights["decoder/layer1/cross_attention"].shape        # (B, H, T, S)

    ``only``: the keys to keep (e.g. ``["decoder/layer1/cross_attention"]``); other calls
    are not recorded, and the fused ones among them rebuild nothing.

    Calls that build the weights anyway (``need_weights=True``) hand them over.  Calls on
    the fused path (``scaled_dot_product(..., need_weights=False)``, which ``multi_head`` and
    the Transformer layers take) still never build them in the graph: the fused node keeps
    each row's log-sum-exp for backward, and the record rebuilds the weights from it with one
    product and one exp, exp(q k^T * scale - lse), after the node's forward.  Gradients and
    outputs are those of the unrecorded call.  See ``Record`` for the keys.
    """

    def __init__(self, only=None):
        self._only = only

    def __enter__(self) -> Record:
        self._record = Record(self._only)
        self._open = _recording.records              # this thread's, wherever the block ends
        self._open.append(self._record)
        return self._record

    def __exit__(self, *exc) -> None:
        self._open.remove(self._record)


def _wanted() -> tuple[Record | None, str]:
    """This thread's innermost open record and the current call's key, if that record keeps it."""
    records = _recording.records          # every attention call reads this: one read, no record open
    if not records:
        return None, ""
    key = "/".join(part for part in current_scope().split("/") if part not in _MECHANISM_SCOPES)
    return (records[-1], key) if records[-1]._wants(key) else (None, "")


def _recorded(weights: Tensor) -> None:
    """Hand a copy of a call's weights to the innermost open record, if it keeps them (a
    copy: the graph's buffers may change later)."""
    target, key = _wanted()
    if target is not None:
        target._add(key, np.array(weights.numpy()))


def _fused_sdpa(inputs, scale: float, causal: bool, single: bool, **layout) -> Tensor:
    """The fused node; inside a record() block that keeps this call, its weights are rebuilt
    and recorded (without the T_q axis for ``single`` query rows, as the unfused call
    returns them).  ``layout``: the node's, when not its default."""
    target, key = _wanted()
    if target is None:
        return ScaledDotProduct.apply(*inputs, scale=scale, causal=causal, **layout)
    with ScaledDotProduct.keeping() as kept:
        context = ScaledDotProduct.apply(*inputs, scale=scale, causal=causal, **layout)
    [op] = kept
    weights = context.backend.to_numpy(op.weights())          # a new array, on the host
    target._add(key, weights[..., 0, :] if single else weights)
    return context


def masked_softmax(scores: Tensor, mask=None) -> Tensor:
    """Softmax over the last axis, restricted to positions where ``mask`` is True.

    Masked positions get weight 0; a row with no True position is all zeros.  Without a
    mask this is ``scores.softmax(-1)``.
    """
    if mask is None:
        return scores.softmax(-1)
    return MaskedSoftmax.apply(scores, _as_mask(mask, scores))


# ---------------------------------------------------------------- shared steps


def _fail(fname: str, message: str):
    raise ShapeError(f"attention.{fname}: {message}")


def _check_tensor(fname: str, x, what: str, min_ndim: int) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"attention.{fname}: {what} must be a Tensor, got {type(x).__name__}")
    if x.ndim < min_ndim:
        _fail(fname, f"{what} needs at least {min_ndim} axes, got shape {x.shape}")
    return x


def _mask_and(a, b, like: Tensor):
    """a AND b, boolean masks that broadcast together.  Two host arrays (masks an eager caller
    built) combine in numpy; otherwise with the ``where`` kernel (a where b else False), so a
    mask computed from a step's ids is never read back to the host and a compiled step
    computes it afresh from each batch.  Either way the same booleans."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return np.logical_and(a, b)
    a = a if isinstance(a, Tensor) else Tensor(a, device=like.device)
    b = b if isinstance(b, Tensor) else Tensor(b, device=like.device)
    return where(a, b, False)


def _as_mask(mask, like: Tensor) -> Tensor:
    if isinstance(mask, Tensor):
        return mask
    array = np.asarray(mask)
    if array.dtype != np.bool_:
        raise TypeError(f"mask must be boolean (True = may attend), got {array.dtype} of shape "
                        f"{array.shape}; additive float masks are not supported")
    return Tensor(array, device=like.device)


def _check_weight(fname: str, w, what: str, shape: tuple) -> Tensor:
    """``w`` must be a Tensor of exactly ``shape`` (None entries: any size)."""
    w = _check_tensor(fname, w, what, 0)
    ok = w.ndim == len(shape) and all(want is None or got == want
                                      for got, want in zip(w.shape, shape, strict=True))
    if not ok:
        expected = "(" + ", ".join("*" if n is None else str(n) for n in shape) + ")"
        _fail(fname, f"{what} must have shape {expected}, got {w.shape}")
    return w


class _Layout:
    """The query, keys, values and mask of one call, checked and brought to the
    many-queries layout (..., T_q, d); ``finish`` restores a single query's layout."""

    def __init__(self, fname: str, query, keys, values, mask, d_q: int | None = None,
                 d_k: int | None = None):
        keys = _check_tensor(fname, keys, "keys", 2)
        query = _check_tensor(fname, query, "query", 1)
        values = keys if values is None else _check_tensor(fname, values, "values", 2)
        if query.ndim not in (keys.ndim - 1, keys.ndim):
            _fail(fname, f"query {query.shape} must have the axes of keys {keys.shape} (many "
                         f"queries) or one fewer (one query per row)")
        if values.shape[-2] != keys.shape[-2]:
            _fail(fname, f"values {values.shape} and keys {keys.shape} differ in length T_k")
        if d_q is not None and query.shape[-1] != d_q:
            _fail(fname, f"query feature size {query.shape[-1]} does not match the weights "
                         f"(expected {d_q}): query {query.shape}")
        if d_k is not None and keys.shape[-1] != d_k:
            _fail(fname, f"keys feature size {keys.shape[-1]} does not match the weights "
                         f"(expected {d_k}): keys {keys.shape}")
        self.fname = fname
        self.single = query.ndim == keys.ndim - 1
        self.query = query.unsqueeze(-2) if self.single else query          # (..., T_q, d_q)
        self.keys = keys
        self.values = values
        try:
            batch = batch_shape(self.query.shape[:-2], keys.shape[:-2], values.shape[:-2])
        except ValueError:
            _fail(fname, f"batch axes do not broadcast: query {query.shape}, keys {keys.shape}, "
                         f"values {values.shape}")
        self.weights_shape = tuple(batch) + (self.query.shape[-2], keys.shape[-2])
        self.mask = None if mask is None else self._mask(mask, query)

    def _mask(self, mask, query: Tensor) -> Tensor:
        mask = _as_mask(mask, query)
        if mask.dtype != np.bool_:
            raise TypeError(f"attention.{self.fname}: mask must be boolean (True = may attend), "
                            f"got {mask.dtype} of shape {mask.shape}")
        # What the caller sees: for one query per row the weights have no T_q axis.
        visible = self.weights_shape[:-2] + self.weights_shape[-1:] if self.single else self.weights_shape
        if not broadcasts_to(mask.shape, visible):
            _fail(self.fname, f"mask of shape {mask.shape} does not broadcast to the weights' shape "
                              f"{visible} (True = may attend; with many queries a key padding "
                              f"mask (B, T_k) must be passed as mask[:, None, :])")
        if self.single and mask.ndim >= 1:
            mask = mask.unsqueeze(-2)                                       # (..., 1, T_k)
        return mask

    def add_mask(self, extra: np.ndarray) -> None:
        """AND a constant boolean mask (e.g. the causal one) into this call's mask."""
        if self.mask is None:
            self.mask = Tensor(extra, device=self.query.device)
        else:
            self.mask = _mask_and(self.mask, extra, self.query)

    def finish(self, scores: Tensor, dropout: float = 0.0, need_weights: bool = True):
        """Scores (..., T_q, T_k) -> (context, weights), back in the caller's layout."""
        weights = masked_softmax(scores, self.mask)                          # (..., T_q, T_k)
        attended = functional.dropout(weights, dropout) if dropout > 0.0 else weights
        context = attended @ self.values                                     # (..., T_q, d_v)
        if self.single:
            context = context.squeeze(-2)                                    # (..., d_v)
            weights = weights.squeeze(-2)                                    # (..., T_k)
        _recorded(weights)
        return context, (weights if need_weights else None)


def _keys_t(keys: Tensor) -> Tensor:
    return keys.transpose(-2, -1)                                            # (..., d_k, T_k)


# ---------------------------------------------------------------- score functions


def dot(query: Tensor, keys: Tensor, values: Tensor | None = None, mask=None):
    """Basic dot-product attention: ``score(s, h_j) = s . h_j`` (seed notes; Luong "dot").

    Nothing is learned; query and keys must have the same size d.

    Args:
        query: (..., d) one decoder state per row, or (..., T_q, d).
        keys: (..., T_k, d) encoder states.
        values: (..., T_k, d_v), default ``keys``.
        mask: boolean, True = may attend, broadcast to the weights.

    Returns:
        (context (..., [T_q,] d_v), weights (..., [T_q,] T_k))

    Example:
        >>> context, weights = ta.attention.dot(s, H)     # s (B, d), H (B, T, d)
    """
    fname = "dot"
    with scope(SCOPES[fname]):
        call = _Layout(fname, query, keys, values, mask)
        if call.query.shape[-1] != keys.shape[-1]:
            _fail(fname, f"query {query.shape} and keys {keys.shape} must have the same feature "
                         f"size (use general() or additive() for different sizes)")
        scores = call.query @ _keys_t(keys)                                  # (..., T_q, T_k)
        return call.finish(scores)


def general(query: Tensor, keys: Tensor, W: Tensor, values: Tensor | None = None, mask=None):
    """Multiplicative attention: ``score(s, h_j) = s^T W h_j`` (Luong et al. 2015, "general").

    Args:
        query: (..., d_q) or (..., T_q, d_q).
        keys: (..., T_k, d_k).
        W: (d_q, d_k), learned.
        values: as in ``dot``.
        mask: as in ``dot``.

    Returns:
        (context, weights), shaped as in ``dot``.
    """
    fname = "general"
    with scope(SCOPES[fname]):
        W = _check_weight(fname, W, "W", (None, None))
        call = _Layout(fname, query, keys, values, mask, d_q=W.shape[0], d_k=W.shape[1])
        scores = (call.query @ W) @ _keys_t(keys)                            # (..., T_q, T_k)
        return call.finish(scores)


def concat(query: Tensor, keys: Tensor, W: Tensor, v: Tensor, values: Tensor | None = None,
           mask=None, *, keys_proj: Tensor | None = None):
    """Luong's concat attention: ``score(s, h_j) = v . tanh(W [s; h_j])`` (Luong et al. 2015).

    ``W [s; h] = W_s s + W_h h`` with ``W = [W_s | W_h]`` split by columns, so it runs as the
    additive score without building the concatenation for every (s, h_j) pair.  (The
    lecture notes add a bias b inside the tanh; Luong et al. have none, and neither has this.)

    Args:
        query: (..., d_q) or (..., T_q, d_q).
        keys: (..., T_k, d_k).
        W: (d_a, d_q + d_k), learned.
        v: (d_a,), learned.
        values: as in ``dot``.
        mask: as in ``dot``.
        keys_proj: ``W_h h_j`` for every key (..., T_k, d_a), computed once by the caller
            (``keys_projection``); as in ``additive``.
    """
    fname = "concat"
    with scope(SCOPES[fname]):
        W = _check_weight(fname, W, "W", (None, None))
        v = _check_weight(fname, v, "v", (W.shape[0],))
        call = _Layout(fname, query, keys, values, mask)
        d_q, d_k = call.query.shape[-1], keys.shape[-1]
        if W.shape[1] != d_q + d_k:
            _fail(fname, f"W {W.shape} must have d_q + d_k = {d_q} + {d_k} = {d_q + d_k} columns "
                         f"for query {query.shape} and keys {keys.shape}")
        if keys_proj is None:
            keys_proj = functional.linear(keys, W[:, d_q:])                  # (..., T_k, d_a)
        _check_keys_proj(fname, keys_proj, keys, W.shape[0])
        scores = AdditiveScores.apply(call.query, W[:, :d_q], keys_proj, v)  # (..., T_q, T_k)
        return call.finish(scores)


def additive(query: Tensor, keys: Tensor, W_q: Tensor, W_k: Tensor, v: Tensor,
             values: Tensor | None = None, mask=None, *, keys_proj: Tensor | None = None):
    """Bahdanau's additive attention: ``score(s, h_j) = v . tanh(W_q s + W_k h_j)``.

    Bahdanau et al. 2015 score the *previous* decoder state s_{i-1}; which state to pass is
    the caller's choice (``ta.models.Seq2Seq(style=...)``).  The paper's alignment model
    has no bias inside the tanh (the lecture notes write one); this follows the paper.

    Args:
        query: (..., d_q) or (..., T_q, d_q).
        keys: (..., T_k, d_k).
        W_q: (d_a, d_q), learned.
        W_k: (d_a, d_k), learned.
        v: (d_a,), learned.
        values: as in ``dot``.
        mask: as in ``dot``.
        keys_proj: ``W_k h_j`` for every key (..., T_k, d_a), computed once by the caller
            (``keys_projection``): a decoder that scores each of its steps against the same
            encoder states passes it so they are projected once per sequence, not per step.

    Example:
        >>> context, weights = ta.attention.additive(s_prev, H, W_q, W_k, v, mask=src != 0)
    """
    fname = "additive"
    with scope(SCOPES[fname]):
        W_q = _check_weight(fname, W_q, "W_q", (None, None))
        W_k = _check_weight(fname, W_k, "W_k", (W_q.shape[0], None))
        v = _check_weight(fname, v, "v", (W_q.shape[0],))
        call = _Layout(fname, query, keys, values, mask, d_q=W_q.shape[1], d_k=W_k.shape[1])
        if keys_proj is None:
            keys_proj = functional.linear(keys, W_k)                         # (..., T_k, d_a)
        _check_keys_proj(fname, keys_proj, keys, W_q.shape[0])
        scores = AdditiveScores.apply(call.query, W_q, keys_proj, v)         # (..., T_q, T_k)
        return call.finish(scores)


def keys_projection(keys: Tensor, W_k: Tensor) -> Tensor:
    """``W_k h_j`` for every key h_j: (..., T_k, d_k) -> (..., T_k, d_a), the part of an
    additive or concat score that does not depend on the query.  Pass it as ``keys_proj``
    (for ``concat`` with ``W_k = W[:, d_q:]``).

    Example:
        >>> keys_proj = ta.attention.keys_projection(H, W_k)       # once per source sentence
        >>> for s in decoder_states:
        ...     context, weights = ta.attention.additive(s, H, W_q, W_k, v, keys_proj=keys_proj)
    """
    return functional.linear(keys, W_k)                                      # (..., T_k, d_a)


def _check_keys_proj(fname: str, keys_proj: Tensor, keys: Tensor, d_a: int) -> None:
    expected = keys.shape[:-1] + (d_a,)
    if not isinstance(keys_proj, Tensor) or keys_proj.shape != expected:
        shape = keys_proj.shape if isinstance(keys_proj, Tensor) else type(keys_proj).__name__
        _fail(fname, f"keys_proj must be the keys' projection {expected} (keys {keys.shape}, "
                     f"d_a = {d_a}), got {shape}")


def scaled_dot_product(q: Tensor, k: Tensor, v: Tensor, mask=None, causal: bool = False,
                       scale: float | None = None, dropout: float = 0.0, need_weights: bool = True):
    """Scaled dot-product attention: ``softmax(q k^T / sqrt(d_k)) v`` (Vaswani et al. 2017).

    Self-attention is this with q, k and v all computed from the same sequence.

    Args:
        q: (..., T_q, d_k) or (..., d_k).
        k: (..., T_k, d_k).
        v: (..., T_k, d_v).
        mask: boolean, True = may attend, broadcast to (..., T_q, T_k).
        causal: also forbid query i to attend to keys j > i (top-left aligned, as PyTorch's
            ``is_causal``); needs many queries.
        scale: multiplies the scores; default 1/sqrt(d_k).
        dropout: probability of dropping each weight when computing the context (always
            applied when > 0, as in PyTorch's function; modules pass 0 in eval mode).  The
            returned weights are the distribution before dropout.
        need_weights: return the weights (else None).  With ``need_weights=False`` and no
            dropout the weights are never built: the call runs as one fused node,
            ``ta.ops.ScaledDotProduct`` (flash-attention style: blocks, an online softmax,
            only each row's log-sum-exp kept for backward), so memory stays that of q, k, v.
            On the cpu device its forward is faster than the textbook graph, but forward and
            backward together measured 1.1-1.2x slower at T = 512 and 1024, since backward
            rebuilds the weights (bench/RESULTS.md).  Otherwise the graph is the textbook
            one: scores, ``MaskedSoftmax``, product.

    Returns:
        (context (..., [T_q,] d_v), weights (..., [T_q,] T_k) or None)
    """
    fname = "scaled_dot_product"
    with scope(SCOPES[fname]):
        v = _check_tensor(fname, v, "v", 2)
        call = _Layout(fname, q, k, v, mask)
        if call.query.shape[-1] != k.shape[-1]:
            _fail(fname, f"q {q.shape} and k {k.shape} must have the same feature size d_k")
        if causal and call.single:
            _fail(fname, f"causal=True needs many queries (..., T_q, d_k); got one query per "
                         f"row, q {q.shape}")
        dropout = check_number(dropout, "dropout", f"attention.{fname}", low=0.0, high=1.0, high_open=True)
        scale = 1.0 / math.sqrt(k.shape[-1]) if scale is None else float(scale)
        if not need_weights and dropout == 0.0:
            inputs = (call.query, k, v) if call.mask is None else (call.query, k, v, call.mask)
            context = _fused_sdpa(inputs, scale, bool(causal), call.single)      # (..., T_q, d_v)
            return (context.squeeze(-2) if call.single else context), None
        if causal:
            call.add_mask(np.tril(np.ones(call.weights_shape[-2:], dtype=bool)))
        # Scaling q before the product touches T_q*d entries instead of T_q*T_k.
        scores = (call.query * scale) @ _keys_t(k)                           # (..., T_q, T_k)
        return call.finish(scores, dropout, need_weights)


# Heads of fewer scores than this are read where the projections leave them, (B, T, H, D);
# bigger ones are copied to (B, H, T, D) first.  Reading a head in place means rows H D
# apart: a transposed copy costs more than that for a Transformer's short sentences (two
# threads, (32, 20, 4, 32): a training step 42 ms against 45), but less than the strided
# reads of long ones, whose power-of-two row steps crowd a few cache sets ((8, 256, 8, 32):
# backward 14.6 ms in place against 12.0 on copies that cost ~0.8).
HEADS_IN_PLACE_MAX_SCORES = 4096


def multi_head(query: Tensor, key: Tensor, value: Tensor, num_heads: int, W_q: Tensor,
               W_k: Tensor, W_v: Tensor, W_o: Tensor, b_q: Tensor | None = None,
               b_k: Tensor | None = None, b_v: Tensor | None = None, b_o: Tensor | None = None, *,
               key_mask=None, mask=None, causal: bool = False, dropout: float = 0.0,
               need_weights: bool = True, average_weights: bool = True,
               in_proj_weight: Tensor | None = None, in_proj_bias: Tensor | None = None):
    """Multi-head attention (Vaswani et al. 2017), batch first:

        head_i = attention(query W_q_i^T, key W_k_i^T, value W_v_i^T)
        output = concat(head_1, ..., head_H) W_o^T + b_o

    Self-attention passes the same tensor as query, key and value; cross-attention passes
    the decoder states as query and the encoder states as key and value.

    With ``need_weights=False`` and no dropout the heads go through the fused node
    (``ta.ops.ScaledDotProduct``); when each head has fewer than HEADS_IN_PLACE_MAX_SCORES
    scores it reads them as the projections leave them, (B, T, H, D), and writes the context
    as (B, T, H, D) = (B, T, E), so the graph has no transposes.  Inside
    ``ta.attention.record()`` the weights are still kept per head, (B, H, T, S).

    Args:
        query: (B, T, E) or unbatched (T, E).
        key: (B, S, kdim); value: (B, S, vdim).
        num_heads: H; must divide E.
        W_q: (E, E), W_k: (E, kdim), W_v: (E, vdim), W_o: (E, E); biases (E,) or None.
        in_proj_weight: (3E, E) = [W_q; W_k; W_v] packed, as PyTorch keeps them (then W_q, W_k,
            W_v and their biases are None, and in_proj_bias (3E,) or None packs the biases).
            Self-attention (query is key is value) then projects with one product and
            cross-attention (key is value) with two, q and the packed (k, v); the products
            are cut into heads by ``ops.movement.split``, whose backward is one concatenation.
        key_mask: (B, S) boolean, True = a real token (False = padding, never attended).
        mask: boolean, True = may attend, broadcast to (B, H, T, S): e.g. (T, S).
        causal: forbid attending to later positions.
        dropout: on the attention weights (pass 0 outside training).
        need_weights: return the weights (else None).
        average_weights: weights averaged over heads (B, T, S), else per head (B, H, T, S).

    Returns:
        (output (B, T, E), weights)
    """
    fname = "multi_head"
    with scope(SCOPES[fname]):
        for what, x in (("query", query), ("key", key), ("value", value)):
            _check_tensor(fname, x, what, 2)
        unbatched = query.ndim == 2
        shared = (query is key and key is value, key is value)   # before unsqueeze makes new tensors
        if unbatched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
        if not query.ndim == key.ndim == value.ndim == 3:
            _fail(fname, f"query, key and value must all be (B, T, E) or all (T, E); got "
                         f"{query.shape}, {key.shape}, {value.shape}")
        B, T, E = query.shape
        S = key.shape[1]
        if key.shape[0] != B or value.shape[:2] != (B, S):
            _fail(fname, f"key {key.shape} and value {value.shape} must be (B={B}, S, *) with "
                         f"the same S")
        num_heads = check_int(num_heads, "num_heads", f"attention.{fname}", 1)
        if E % num_heads:
            _fail(fname, f"num_heads={num_heads} must divide the embedding size E={E}")
        D = E // num_heads
        packed = in_proj_weight is not None
        if packed:
            if any(w is not None for w in (W_q, W_k, W_v, b_q, b_k, b_v)):
                _fail(fname, "in_proj_weight replaces W_q, W_k, W_v and their biases: pass those as None")
            if key.shape[-1] != E or value.shape[-1] != E:
                _fail(fname, f"in_proj_weight needs key and value of size E={E}, got {key.shape} and "
                             f"{value.shape}")
            _check_weight(fname, in_proj_weight, "in_proj_weight", (3 * E, E))
            if in_proj_bias is not None:
                _check_weight(fname, in_proj_bias, "in_proj_bias", (3 * E,))
        else:
            _check_weight(fname, W_q, "W_q", (E, E))
            _check_weight(fname, W_k, "W_k", (E, key.shape[-1]))
            _check_weight(fname, W_v, "W_v", (E, value.shape[-1]))
        _check_weight(fname, W_o, "W_o", (E, E))
        for what, b in (("b_q", b_q), ("b_k", b_k), ("b_v", b_v), ("b_o", b_o)):
            if b is not None:
                _check_weight(fname, b, what, (E,))
        full_mask = _head_mask(fname, key_mask, mask, B, num_heads, T, S, query, unbatched)
        if packed:
            q, k, v = _packed_projections(query, key, value, in_proj_weight, in_proj_bias, E, *shared)
        else:
            q, k, v = (functional.linear(query, W_q, b_q), functional.linear(key, W_k, b_k),
                       functional.linear(value, W_v, b_v))
        q = q.reshape(B, T, num_heads, D)                                    # (B, T, H, D)
        k = k.reshape(B, S, num_heads, D)
        v = v.reshape(B, S, num_heads, D)
        if not need_weights and dropout == 0.0 and T * S < HEADS_IN_PLACE_MAX_SCORES:
            # The fused node reads the heads where the projections left them and writes the
            # context as (B, T, H, D), which is (B, T, H*D) already: no transposed copies.
            inputs = (q, k, v) if full_mask is None else (q, k, v, full_mask)
            with scope(SCOPES["scaled_dot_product"]):     # where scaled_dot_product puts it
                context = _fused_sdpa(inputs, 1.0 / math.sqrt(D), bool(causal), False, layout="BTHD")
            weights = None
        else:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)   # (B, H, L, D)
            context, weights = scaled_dot_product(q, k, v, mask=full_mask, causal=causal,
                                                  dropout=dropout, need_weights=need_weights)
            context = context.transpose(1, 2)                                # (B, T, H, D)
        out = functional.linear(context.reshape(B, T, E), W_o, b_o)          # (B, T, E)
        if weights is not None and average_weights:
            weights = weights.mean(axis=1)                                   # (B, T, S)
        if unbatched:
            out = out.squeeze(0)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights


def _packed_projections(query: Tensor, key: Tensor, value: Tensor, W: Tensor, b: Tensor | None, E: int,
                        self_attention: bool, key_is_value: bool):
    """query W_q^T + b_q, key W_k^T + b_k, value W_v^T + b_v from the packed W = [W_q; W_k; W_v]
    (3E, E), as PyTorch's in_projection_packed: one product for self-attention, two (q, and
    the packed (k, v)) for cross-attention.  The cuts are ``split`` pieces: backward gathers
    each cut's gradients into one concatenation."""
    if self_attention:
        return tuple(split(functional.linear(query, W, b), (E, E, E), -1))        # (B, T, E) each
    if key_is_value:
        W_q, W_kv = split(W, (E, 2 * E), 0)
        b_q, b_kv = (None, None) if b is None else split(b, (E, 2 * E), 0)
        k, v = split(functional.linear(key, W_kv, b_kv), (E, E), -1)
        return functional.linear(query, W_q, b_q), k, v
    Ws = split(W, (E, E, E), 0)
    bs = (None, None, None) if b is None else split(b, (E, E, E), 0)
    return tuple(functional.linear(x, w, bias)
                 for x, w, bias in zip((query, key, value), Ws, bs, strict=True))


def _head_mask(fname, key_mask, mask, B, H, T, S, like, unbatched):
    """key_mask (B, S) and mask (broadcast to (B, H, T, S)) as one boolean mask.  A Tensor
    key mask (e.g. ``src != 0`` of Tensor ids) stays on the device: only its shape is read."""
    combined = None
    if key_mask is not None:
        km = key_mask if isinstance(key_mask, Tensor) else np.asarray(key_mask)
        if unbatched and km.ndim == 1:
            km = km.reshape(1, km.shape[0])
        if km.dtype != np.bool_:
            raise DTypeError(f"attention.{fname}: key_mask must be boolean (True = real token), got "
                             f"{km.dtype}; compare ids with the padding id, e.g. src != 0")
        if km.shape != (B, S):
            _fail(fname, f"key_mask must be boolean (B, S) = ({B}, {S}) with True = real token, "
                         f"got {km.dtype} of shape {km.shape}")
        combined = km.reshape(B, 1, 1, S)                                    # (B, 1, 1, S)
    if mask is not None:
        m = mask if isinstance(mask, Tensor) else np.asarray(mask)
        if m.dtype != np.bool_ or not broadcasts_to(m.shape, (B, H, T, S)):
            _fail(fname, f"mask must be boolean and broadcast to (B, H, T, S) = ({B}, {H}, {T}, {S}), "
                         f"got {m.dtype} of shape {m.shape}")
        if combined is None and isinstance(m, Tensor):
            return m                # as given, so a traced export sees the caller's own tensor
        combined = m if combined is None else _mask_and(combined, m, like)
    if combined is None or isinstance(combined, Tensor):
        return combined
    return Tensor(combined, device=like.device)


def graph(x: Tensor, adjacency, W: Tensor, a_src: Tensor, a_dst: Tensor, heads: int = 1,
          negative_slope: float = 0.2, concat: bool = True, add_self_loops: bool = True,
          dropout: float = 0.0):
    """Graph attention, GAT (Veličković et al. 2018): each node attends to its neighbours,

        e_ij     = LeakyReLU(a^T [W h_i || W h_j])  = LeakyReLU(a_dst . W h_i + a_src . W h_j)
        alpha_ij = softmax over j in N(i) of e_ij
        h'_i     = sum_j alpha_ij W h_j             per head; heads concatenated or averaged

    The paper's attention vector a (2F) is split into a_dst (the half that meets the attending
    node i) and a_src (the half that meets the neighbour j), as in PyTorch Geometric.  The
    paper applies a nonlinearity to h'_i afterwards; that is left to the caller.

    Args:
        x: (..., N, F_in) node features.
        adjacency: (..., N, N) boolean, True at [i, j] = node i attends to node j.
        W: (heads * F_out, F_in); a_src, a_dst: (heads, F_out), learned.
        heads: number of attention heads.
        negative_slope: of the LeakyReLU (0.2 in the paper).
        concat: concatenate heads -> (..., N, heads * F_out), else average -> (..., N, F_out).
        add_self_loops: let every node attend to itself as well (the paper does).
        dropout: on the attention coefficients (the paper uses 0.6 while training).

    Returns:
        (h' , weights (..., heads, N, N))
    """
    fname = "graph"
    with scope(SCOPES[fname]):
        x = _check_tensor(fname, x, "x", 2)
        N, F_in = x.shape[-2:]
        if heads < 1:
            _fail(fname, f"heads must be at least 1, got {heads}")
        W = _check_weight(fname, W, "W", (None, F_in))
        if W.shape[0] % heads:
            _fail(fname, f"W {W.shape} must have heads * F_out rows (heads={heads})")
        F_out = W.shape[0] // heads
        a_src = _check_weight(fname, a_src, "a_src", (heads, F_out))
        a_dst = _check_weight(fname, a_dst, "a_dst", (heads, F_out))
        adj = np.asarray(adjacency.numpy() if isinstance(adjacency, Tensor) else adjacency)
        if adj.dtype != np.bool_ or adj.ndim < 2 or adj.shape[-2:] != (N, N):
            _fail(fname, f"adjacency must be boolean (..., N, N) = (..., {N}, {N}) for x {x.shape}, "
                         f"got {adj.dtype} of shape {adj.shape}")
        if add_self_loops:
            adj = adj | np.eye(N, dtype=bool)
        batch = x.shape[:-2]
        if not broadcasts_to(adj.shape[:-2], batch):
            _fail(fname, f"batch axes of adjacency {adj.shape} do not broadcast to those of x {x.shape}")
        Wh = (x @ W.T).reshape(batch + (N, heads, F_out))                   # (..., N, H, F)
        Wh = Wh.transpose(-3, -2)                                            # (..., H, N, F)
        s_dst = Wh @ a_dst.unsqueeze(-1)                                     # (..., H, N, 1)
        s_src = (Wh @ a_src.unsqueeze(-1)).transpose(-2, -1)                 # (..., H, 1, N)
        scores = (s_dst + s_src).leaky_relu(negative_slope)                  # (..., H, N, N)
        edges = Tensor(adj[..., None, :, :], device=x.device)                # (..., 1, N, N)
        weights = MaskedSoftmax.apply(scores, edges)                         # (..., H, N, N)
        _recorded(weights)
        attended = functional.dropout(weights, dropout) if dropout > 0.0 else weights
        out = attended @ Wh                                                  # (..., H, N, F)
        if concat:
            out = out.transpose(-3, -2).reshape(batch + (N, heads * F_out))  # (..., N, H*F)
        else:
            out = out.mean(axis=-3)                                          # (..., N, F)
        return out, weights
