"""Fused attention ops: the masked softmax that turns scores into weights, Bahdanau's
additive score function, and scaled dot-product attention that never keeps its weights.

The rest of every mechanism (dot products, projections, the weighted sum of values) is
matrix products, so ``ta.attention`` builds each mechanism from these ops and MatMul
inside one named scope; only the additive score projects its query inside the op (the
keys' projection is made once per sentence, outside).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import numpy as np

from ..autograd import DeferredGrad, Example, Op, register
from ..shapes import batch_shape, broadcasts_to, dim
from ._common import (
    broadcast_shape,
    check_bool,
    check_float,
    check_same_dtype,
    elementwise,
    number,
    uniform,
)


@register
class MaskedSoftmax(Op):
    """y = exp(x_j) / sum_{k: mask_k} exp(x_k) where mask_j, else 0 (last axis).

    The attention distribution: masked positions (mask False) get weight exactly 0, and a
    row whose every position is masked is all zeros, never NaN, in values and gradients.
    The row maximum is subtracted before exp, so scores of 1e4 do not overflow.
    """

    kernels = ("masked_softmax", "softmax_back", "zeros")

    @staticmethod
    def symbolic(sp, x, mask):
        x = np.asarray(x, dtype=object)
        mask = np.broadcast_to(mask, x.shape)
        y = np.empty(x.shape, dtype=object)
        for row in np.ndindex(x.shape[:-1]):
            e = np.array([sp.exp(s) if keep else sp.Integer(0)
                          for s, keep in zip(x[row], mask[row], strict=True)], dtype=object)
            total = sp.Add(*e)
            y[row] = e / total if total != 0 else e
        return y

    def forward(self, x, mask):
        check_float(self, x, "scores")
        check_bool(self, mask, "mask")
        if x.ndim == 0 or broadcast_shape(self, x, mask) != tuple(x.shape):
            self.fail(f"mask of shape {tuple(mask.shape)} must broadcast to the scores' shape "
                      f"{tuple(x.shape)} without enlarging it")
        # No keys at all: nothing to attend to, an empty row of weights.
        y = self.backend.masked_softmax(x, mask) if x.size else self.backend.zeros(x.shape, x.dtype)
        self.saved = (y,)
        return y

    def backward(self, dy):
        (y,) = self.saved
        # Masked entries have y = 0, so the plain softmax backward already gives them 0.
        return self.backend.softmax_back(y, dy, -1), None

    @classmethod
    def examples(cls):
        mask = np.array([[True, False, True], [False, False, False]])   # second row fully masked
        return [Example((uniform(800, 2, 3), mask)),
                Example((uniform(801, 2, 2, 3), mask[:1])),             # broadcast over rows
                Example((uniform(802, 2, 3), np.ones((2, 3), dtype=bool)))]


@register
class AdditiveScores(Op):
    """e_ij = v . tanh(W_q s_i + k_j): s (..., T_q, d_q), W_q (A, d_q), k (..., T_k, A), v (A,)
    -> (..., T_q, T_k).

    Bahdanau's alignment model e_ij = v_a . tanh(W_a s_{i-1} + U_a h_j) with the keys'
    projection k_j = U_a h_j given already made: it does not depend on i, so a decoder makes
    it once per sentence (Bahdanau et al. 2015, appendix A.1.2), while the query's projection
    happens here, inside the node.  Luong's "concat" score v . tanh(W[s; h]) is the same
    function with W split by columns.  Forward and backward work one query step at a time,
    so the (T_q, T_k, A) tensor of all pairs is never built.
    """

    kernels = ("additive_scores", "additive_scores_back", "broadcast_to", "cat", "matmul",
               "matmul_nt", "matmul_tn", "reshape", "sum_to")

    @staticmethod
    def symbolic(sp, s, W_q, k, v):
        q = np.matmul(np.asarray(s, dtype=object), np.asarray(W_q, dtype=object).T)
        k = np.asarray(k, dtype=object)
        pre = q[..., :, None, :] + k[..., None, :, :]                  # (..., T_q, T_k, A)
        return np.matmul(elementwise(sp.tanh, pre), np.asarray(v, dtype=object))

    def forward(self, s, W_q, k, v):
        check_same_dtype(self, s, W_q, k, v)
        check_float(self, s)
        if (s.ndim < 2 or W_q.ndim != 2 or k.ndim < 2 or v.ndim != 1
                or W_q.shape[1] != dim(s, -1) or not W_q.shape[0] == dim(k, -1) == v.shape[0]):
            self.fail(f"expected s (..., T_q, d_q), W_q (A, d_q), k (..., T_k, A) and v (A,), got "
                      f"{tuple(s.shape)}, {tuple(W_q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}")
        try:
            batch = batch_shape(s.shape[:-2], k.shape[:-2])
        except ValueError:
            self.fail(f"batch axes of s {tuple(s.shape)} and k {tuple(k.shape)} do not broadcast")
        kb = self.backend
        s2 = kb.reshape(s, (math.prod(s.shape[:-1]), dim(s, -1)))     # (M, d_q)
        q_shape = s.shape[:-1] + (W_q.shape[0],)
        q = kb.reshape(kb.matmul_nt(s2, W_q), q_shape)                  # (..., T_q, A)
        if q.ndim == k.ndim == 3 and q.shape[0] == k.shape[0]:
            q3, k3 = q, k                  # already (N, T, A), as a decoder step's are
        else:
            q3 = kb.reshape(kb.broadcast_to(q, batch + q.shape[-2:]), (-1,) + q.shape[-2:])  # (N, T_q, A)
            k3 = kb.reshape(kb.broadcast_to(k, batch + k.shape[-2:]), (-1,) + k.shape[-2:])  # (N, T_k, A)
        self.saved = (s2, W_q, q3, k3, v, s.shape, q_shape, k.shape, batch)
        e = kb.additive_scores(q3, k3, v)                                # (N, T_q, T_k)
        return kb.reshape(e, batch + (dim(s, -2), dim(k, -2)))

    def backward(self, de):
        s2, W_q, q3, k3, v, s_shape, q_shape, k_shape, batch = self.saved
        kb = self.backend
        need = self.needs_grad
        de3 = kb.reshape(de, (-1,) + tuple(de.shape[-2:]))               # (N, T_q, T_k)
        dq3, dk3, dv = kb.additive_scores_back(q3, k3, v, de3)
        dq = kb.sum_to(kb.reshape(dq3, batch + q_shape[-2:]), q_shape)   # (..., T_q, A)
        dq2 = kb.reshape(dq, (s2.shape[0], q_shape[-1]))                 # (M, A)
        ds = kb.reshape(kb.matmul(dq2, W_q), s_shape) if need[0] else None
        dW_q = DeferredGrad(kb, "matmul_tn", W_q.shape, (dq2, s2)) if need[1] else None   # (A, d_q)
        dk = kb.sum_to(kb.reshape(dk3, batch + k_shape[-2:]), k_shape)
        return ds, dW_q, dk, dv

    @classmethod
    def examples(cls):
        return [Example((uniform(810, 2, 2), uniform(819, 3, 2), uniform(811, 4, 3), uniform(812, 3))),
                Example((uniform(813, 2, 1, 3), uniform(829, 2, 3), uniform(814, 3, 2),
                         uniform(815, 2))),                                              # shared keys
                Example((uniform(816, 2, 2, 1), uniform(839, 2, 1), uniform(817, 2, 1, 2),
                         uniform(818, 2)))]


class _Keeping(threading.local):
    """The list this thread's ``ScaledDotProduct`` forwards append themselves to, while a
    ``ta.attention.record()`` of this thread asks for their weights (else None).  Per thread:
    another thread's forwards must neither join the list nor write weights no one reads."""

    def __init__(self):
        self.ops: list | None = None


_keeping = _Keeping()


@register
class ScaledDotProduct(Op):
    """o = softmax(q k^T * scale, masked) v, fused: q (..., T_q, D), k (..., T_k, D),
    v (..., T_k, D_v), optional boolean mask (True = may attend) broadcast to (..., T_q, T_k).

    The weights are never kept: forward saves each row's log-sum-exp and backward rebuilds
    the weights from it, block by block, so memory stays that of q, k, v and o.  ``causal``
    forbids key j > query i.  A row with nothing to attend to gives o = 0 and no gradient.

    ``layout="BTHD"`` takes the heads in place, q (B, T_q, H, D), k (B, T_k, H, D),
    v (B, T_k, H, D_v) -> o (B, T_q, H, D_v), the layout FlashAttention's kernels take: a
    projection's (B, T, H D) output reshapes to it for free, where (B, H, T, D) is a
    transposed copy each way.  The mask still broadcasts to the weights' (B, H, T_q, T_k).
    """

    kernels = ("broadcast_to", "reshape", "sdpa", "sdpa_back", "sdpa_weights", "sum_to", "zeros")
    layout: ClassVar[str] = "BHTD"          # the default; a call may set "BTHD"
    LAYOUTS = ("BHTD", "BTHD")

    @staticmethod
    def symbolic(sp, q, k, v, mask=None, scale=1.0, causal=False, layout="BHTD"):
        q, k, v = (np.asarray(x, dtype=object) for x in (q, k, v))
        if layout == "BTHD":
            q, k, v = (np.swapaxes(x, 1, 2) for x in (q, k, v))
        scores = np.matmul(q * number(sp, scale), np.swapaxes(k, -1, -2))
        allowed = np.ones(scores.shape, dtype=bool) if mask is None else np.broadcast_to(mask, scores.shape)
        if causal:
            allowed = allowed & np.tril(np.ones(scores.shape[-2:], dtype=bool))
        o = np.matmul(MaskedSoftmax.symbolic(sp, scores, allowed), v)
        return np.swapaxes(o, 1, 2) if layout == "BTHD" else o

    @staticmethod
    @contextmanager
    def keeping() -> Iterator[list]:
        """Inside the block, every forward of this op in this thread has the kernel write the
        weights as it goes and appends the op to the list yielded, so ``ta.attention.record``
        can ask it for ``weights()`` (an op run without a graph is reachable no other way)."""
        outer = _keeping.ops
        _keeping.ops = kept = []
        try:
            yield kept
        finally:
            _keeping.ops = outer

    def _heads_in_place(self, q, k, v):
        """Check BTHD inputs; (the weights' batch axes (B, H), T_q, T_k)."""
        if self.layout not in self.LAYOUTS:
            self.fail(f"layout must be one of {self.LAYOUTS}, got {self.layout!r}", ValueError)
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            self.fail(f"layout BTHD takes q (B, T_q, H, D), k (B, T_k, H, D), v (B, T_k, H, D_v), "
                      f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        (B, t_q, H, D), (t_k, D_v) = q.shape, (dim(k, 1), dim(v, 3))
        if tuple(k.shape) != (B, t_k, H, D) or tuple(v.shape) != (B, t_k, H, D_v):
            self.fail(f"layout BTHD: k {tuple(k.shape)} must be (B={B}, T_k, H={H}, D={D}) and v "
                      f"{tuple(v.shape)} (B={B}, T_k, H={H}, D_v), with the same T_k")
        return (B, H), t_q, t_k

    def forward(self, q, k, v, mask=None):
        check_same_dtype(self, q, k, v)
        check_float(self, q)
        if self.layout != "BHTD":
            return self._forward(q, k, v, mask, *self._heads_in_place(q, k, v))
        if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
            self.fail(f"expected q (..., T_q, D), k (..., T_k, D), v (..., T_k, D_v), got "
                      f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        if dim(q, -1) != dim(k, -1) or dim(k, -2) != dim(v, -2):
            self.fail(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share D, k and v "
                      f"{tuple(v.shape)} must share T_k")
        try:
            batch = batch_shape(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        except ValueError:
            self.fail(f"batch axes of q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                      f"do not broadcast")
        return self._forward(q, k, v, mask, batch, dim(q, -2), dim(k, -2))

    def _forward(self, q, k, v, mask, batch, t_q, t_k):
        heads_in_place = self.layout == "BTHD"
        d_v = dim(v, -1)
        kb = self.backend
        mask3 = None
        if mask is not None:
            check_bool(self, mask, "mask")
            full = batch + (t_q, t_k)
            if not broadcasts_to(mask.shape, full):
                self.fail(f"mask of shape {tuple(mask.shape)} must broadcast to the weights' shape {full}")
            # One mask for every batch entry stays (1, T_q, T_k); otherwise one per entry.
            if all(n == 1 for n in mask.shape[:-2]):
                mask = kb.reshape(mask, mask.shape[-2:])
                mask3 = kb.reshape(kb.broadcast_to(mask, (t_q, t_k)), (1, t_q, t_k))
            else:
                mask3 = kb.reshape(kb.broadcast_to(mask, full), (math.prod(batch), t_q, t_k))
        kept = _keeping.ops
        if t_k == 0 or 0 in batch or t_q == 0:
            # Nothing to attend to (or no one asking): a zero context, as a fully masked row gets.
            self.saved = None, (q.shape, k.shape, v.shape), mask is not None, q.dtype
            if kept is not None:
                kept.append(self)
            return kb.zeros((batch[0], t_q, batch[1], d_v) if heads_in_place else batch + (t_q, d_v), q.dtype)
        if heads_in_place:                    # the kernels read (B, T, H, D) as it is
            q3, k3, v3 = q, k, v
        else:
            q3, k3, v3 = (kb.reshape(kb.broadcast_to(x, batch + x.shape[-2:]), (-1,) + x.shape[-2:])
                          for x in (q, k, v))                                # (N, T, D)
        self.kept_weights = None
        if kept is None:
            o3, lse = kb.sdpa(q3, k3, v3, mask3, float(self.scale), bool(self.causal))
        else:         # a record keeps this call: the kernel writes the weights as it goes
            o3, lse, self.kept_weights = kb.sdpa(q3, k3, v3, mask3, float(self.scale), bool(self.causal),
                                                 True)
            kept.append(self)
        self.saved = (q3, k3, v3, o3, lse, mask3, (q.shape, k.shape, v.shape), batch, (t_q, t_k))
        return o3 if heads_in_place else kb.reshape(o3, batch + (t_q, d_v))

    def weights(self):
        """The attention weights of the last forward, (..., T_q, T_k) on its device: those
        the kernel wrote during a forward inside ``ScaledDotProduct.keeping()``, else
        rebuilt from the saved log-sum-exp (one product and one exp; no second softmax)."""
        if self.saved[0] is None:
            _, (q_shape, k_shape, v_shape), _, dtype = self.saved
            if self.layout == "BTHD":
                shape = (q_shape[0], q_shape[2], q_shape[1], k_shape[1])
            else:
                shape = batch_shape(q_shape[:-2], k_shape[:-2], v_shape[:-2]) + (q_shape[-2], k_shape[-2])
            return self.backend.zeros(shape, dtype)
        q3, k3, _, _, lse, mask3, _, batch, sizes = self.saved
        p = self.kept_weights
        if p is None:
            p = self.backend.sdpa_weights(q3, k3, lse, mask3, float(self.scale), bool(self.causal))
        self.kept_weights = None              # handed over once: the op keeps no (T_q, T_k) array
        return self.backend.reshape(p, batch + sizes)

    def backward(self, do):
        if self.saved[0] is None:                 # no keys (or no queries): no gradient flows
            _, shapes, masked, _ = self.saved
            grads = tuple(self.backend.zeros(shape, do.dtype) for shape in shapes)
            return grads + ((None,) if masked else ())
        q3, k3, v3, o3, lse, mask3, shapes, batch, _ = self.saved
        kb = self.backend
        do3 = kb.reshape(do, o3.shape)
        grads = kb.sdpa_back(q3, k3, v3, o3, lse, do3, mask3, float(self.scale), bool(self.causal))
        if self.layout == "BTHD":                 # no broadcasting: each gradient as its input
            out = list(grads)
        else:
            out = [kb.sum_to(kb.reshape(g, batch + shape[-2:]), shape)
                   for g, shape in zip(grads, shapes, strict=True)]
        return tuple(out) + ((None,) if mask3 is not None else ())

    @classmethod
    def examples(cls):
        mask = np.array([[True, False, True], [False, False, False]])        # second query: no key
        return [Example((uniform(820, 2, 2), uniform(821, 3, 2), uniform(822, 3, 1)),
                        {"scale": 0.7, "causal": False}),
                Example((uniform(823, 2, 2, 2), uniform(824, 3, 2), uniform(825, 2, 3, 2), mask),
                        {"scale": 1.0, "causal": False}),
                Example((uniform(826, 3, 1), uniform(827, 3, 1), uniform(828, 3, 2)),
                        {"scale": 0.5, "causal": True}),
                Example((uniform(829, 2, 3, 2, 2), uniform(830, 2, 3, 2, 2), uniform(831, 2, 3, 2, 1),
                         np.array([True, False, True])),                       # key 1 hidden
                        {"scale": 0.6, "causal": True, "layout": "BTHD"})]
