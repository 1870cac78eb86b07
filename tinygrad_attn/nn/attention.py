"""Attention layers: each mechanism of ``ta.attention`` with its learned weights.

Every layer returns ``(context, weights)``, takes masks with True = may attend, and records
its nodes in the mechanism's scope.  Weights are laid out (out, in) like a Linear weight.
"""

from __future__ import annotations

import math

from .. import attention
from .. import functional as F
from ..arguments import check_int, check_number
from ..autograd import ShapeError, is_grad_enabled
from ..ops.attention import ScaledDotProduct
from ..tensor import Tensor, cat
from . import init
from .linear import Linear
from .module import Module, Parameter


class DotAttention(Module):
    """score(s, h_j) = s . h_j; nothing to learn.  See ``ta.attention.dot``.

    Example:
        >>> context, weights = nn.DotAttention()(s, H)     # s (B, d), H (B, T, d)
    """

    def forward(self, query: Tensor, keys: Tensor, values: Tensor | None = None, mask=None):
        return attention.dot(query, keys, values, mask)


class GeneralAttention(Module):
    """score(s, h_j) = s^T W h_j (Luong "general"), W (query_dim, key_dim).

    W starts as a Linear(key_dim -> query_dim) weight would: U(-1/sqrt(key_dim), 1/sqrt(key_dim)).
    See ``ta.attention.general``.
    """

    def __init__(self, query_dim: int, key_dim: int | None = None):
        super().__init__()
        self.query_dim = query_dim
        self.key_dim = query_dim if key_dim is None else key_dim
        self.W = Parameter(init.linear_default((query_dim, self.key_dim), self.key_dim))

    def forward(self, query: Tensor, keys: Tensor, values: Tensor | None = None, mask=None):
        return attention.general(query, keys, self.W, values, mask)

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}"


class ConcatAttention(Module):
    """score(s, h_j) = v . tanh(W [s; h_j]) (Luong "concat"), W (attn_dim, query_dim + key_dim).

    W and v start as Linear weights would (uniform, 1/sqrt(fan_in)).  See ``ta.attention.concat``.
    """

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.query_dim, self.key_dim, self.attn_dim = query_dim, key_dim, attn_dim
        fan_in = query_dim + key_dim
        self.W = Parameter(init.linear_default((attn_dim, fan_in), fan_in))
        self.v = Parameter(init.linear_default((attn_dim,), attn_dim))

    def forward(self, query: Tensor, keys: Tensor, values: Tensor | None = None, mask=None,
                keys_proj: Tensor | None = None):
        return attention.concat(query, keys, self.W, self.v, values, mask, keys_proj=keys_proj)

    def keys_projection(self, keys: Tensor) -> Tensor:
        """W_h h_j for every key (W's key columns), to pass as ``keys_proj``."""
        return attention.keys_projection(keys, self.W[:, self.query_dim:])

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}, attn_dim={self.attn_dim}"


class AdditiveAttention(Module):
    """score(s, h_j) = v . tanh(W_q s + W_k h_j) (Bahdanau et al. 2015).

    W_q (attn_dim, query_dim), W_k (attn_dim, key_dim) and v (attn_dim,) start as the
    weights of Linear layers would (uniform, 1/sqrt(fan_in)), the usual PyTorch practice.
    (The paper draws W_q, W_k from N(0, 0.001^2) and starts v at zero, which makes every
    first attention distribution uniform.)  See ``ta.attention.additive``.
    """

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.query_dim, self.key_dim, self.attn_dim = query_dim, key_dim, attn_dim
        self.W_q = Parameter(init.linear_default((attn_dim, query_dim), query_dim))
        self.W_k = Parameter(init.linear_default((attn_dim, key_dim), key_dim))
        self.v = Parameter(init.linear_default((attn_dim,), attn_dim))

    def forward(self, query: Tensor, keys: Tensor, values: Tensor | None = None, mask=None,
                keys_proj: Tensor | None = None):
        return attention.additive(query, keys, self.W_q, self.W_k, self.v, values, mask,
                                  keys_proj=keys_proj)

    def keys_projection(self, keys: Tensor) -> Tensor:
        """W_k h_j for every key, to pass as ``keys_proj`` when many queries meet the same keys."""
        return attention.keys_projection(keys, self.W_k)

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}, attn_dim={self.attn_dim}"


class ScaledDotProductAttention(Module):
    """softmax(q k^T / sqrt(d_k)) v (Vaswani et al. 2017); dropout on the weights only in
    training mode.  See ``ta.attention.scaled_dot_product``."""

    def __init__(self, dropout: float = 0.0, scale: float | None = None):
        super().__init__()
        self.dropout = dropout
        self.scale = scale

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask=None, causal: bool = False,
                need_weights: bool = True):
        return attention.scaled_dot_product(q, k, v, mask=mask, causal=causal, scale=self.scale,
                                            dropout=self.dropout if self.training else 0.0,
                                            need_weights=need_weights)

    def extra_repr(self) -> str:
        return f"dropout={self.dropout}, scale={self.scale}"


class MultiHeadAttention(Module):
    """Multi-head attention, batch first, with ``torch.nn.MultiheadAttention``'s parameters.

    Parameters (names, shapes and initialisation as PyTorch's, so its state_dict loads):
        in_proj_weight (3E, E) = [W_q; W_k; W_v], Xavier-uniform   (when kdim = vdim = E)
        q_proj_weight (E, E), k_proj_weight (E, kdim), v_proj_weight (E, vdim)   (otherwise)
        in_proj_bias (3E,) zeros, out_proj.weight (E, E), out_proj.bias (E,) zeros

    Args:
        embed_dim: E.  num_heads: H, must divide E.  dropout: on the weights (training only).
        bias: learn in_proj_bias and out_proj.bias.  kdim, vdim: key/value sizes (default E).

    Example:
        >>> mha = nn.MultiHeadAttention(256, 8)
        >>> out, weights = mha(x, x, x, key_mask=tokens != 0)    # self-attention
        >>> mha.load_state_dict(torch_mha.state_dict())           # PyTorch weights load as they are
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None):
        super().__init__()
        where = "MultiHeadAttention"
        check_int(embed_dim, "embed_dim", where, 1)
        check_int(num_heads, "num_heads", where, 1)
        if embed_dim % num_heads:
            raise ShapeError(f"{where}: num_heads={num_heads} must divide embed_dim={embed_dim}")
        check_number(dropout, "dropout", where, low=0.0, high=1.0)
        for name, size in (("kdim", kdim), ("vdim", vdim)):
            if size is not None:
                check_int(size, name, where, 1)
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        E = embed_dim
        if self.kdim == E and self.vdim == E:
            self.in_proj_weight = Parameter(init.xavier_uniform((3 * E, E)))
        else:
            self.q_proj_weight = Parameter(init.xavier_uniform((E, E)))
            self.k_proj_weight = Parameter(init.xavier_uniform((E, self.kdim)))
            self.v_proj_weight = Parameter(init.xavier_uniform((E, self.vdim)))
        self.in_proj_bias = Parameter(init.zeros((3 * E,))) if bias else None
        out_proj = Linear(E, E, bias=bias)
        if bias:
            out_proj.bias = Parameter(init.zeros((E,)))
        self.out_proj = out_proj

    def _projections(self):
        E = self.embed_dim
        if "in_proj_weight" in self._parameters:
            w = self.in_proj_weight
            weights = (w[:E], w[E:2 * E], w[2 * E:])                          # (E, E) each
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        b = self.in_proj_bias
        biases = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        return weights, biases

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_mask=None, mask=None,
                causal: bool = False, need_weights: bool = True, average_weights: bool = True):
        """(B, T, E), (B, S, kdim), (B, S, vdim) -> (output (B, T, E), weights).

        key_mask (B, S) is True at real tokens (PyTorch's key_padding_mask is the opposite);
        mask broadcasts to (B, H, T, S) with True = may attend.  See ``ta.attention.multi_head``.
        """
        options = dict(key_mask=key_mask, mask=mask, causal=causal, need_weights=need_weights,
                       dropout=self.dropout if self.training else 0.0, average_weights=average_weights)
        if "in_proj_weight" in self._parameters:
            # Packed, as PyTorch projects: one product for self-attention, two for
            # cross-attention, where slices of the weight would each be a copy whose backward
            # zero-fills a (3E, E) gradient.
            return attention.multi_head(
                query, key, value, self.num_heads, None, None, None, self.out_proj.weight,
                b_o=self.out_proj.bias, in_proj_weight=self.in_proj_weight,
                in_proj_bias=self.in_proj_bias, **options)
        (W_q, W_k, W_v), (b_q, b_k, b_v) = self._projections()
        return attention.multi_head(
            query, key, value, self.num_heads, W_q, W_k, W_v, self.out_proj.weight,
            b_q, b_k, b_v, self.out_proj.bias, **options)

    # ------------------------------------------------------------ decoding a token at a time
    #
    # A decode runs without a graph, one token at a time, so a step is a few dozen small ops
    # whose dispatch costs more than their arithmetic: the memory's keys and values are
    # projected once per decode, self-attention projects the new token's query, key and value
    # in one product with the packed in_proj_weight, and one query per row needs no transpose.

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values of ``memory`` (B, S, kdim) split into heads, (B, H, S, D) each:
        what ``attend`` reads at every step of a decode, projected once."""
        (_, W_k, W_v), (_, b_k, b_v) = self._projections()
        return _heads(memory, W_k, b_k, self.num_heads), _heads(memory, W_v, b_v, self.num_heads)

    def query_projection(self) -> tuple[Tensor, Tensor | None]:
        """(W_q (E, E), b_q (E,) or None): the slices a decode takes once, for ``attend``."""
        (W_q, _, _), (b_q, _, _) = self._projections()
        return W_q, b_q

    def attend(self, x: Tensor, W_q: Tensor, b_q: Tensor | None, keys: Tensor, values: Tensor,
               mask=None, need_weights: bool = False, W_o: Tensor | None = None):
        """One query per row against projected keys and values (cross-attention in a decode):
        x (B, 1, E), keys (B, H, S, D) -> (output (B, 1, E), weights (B, H, 1, S) or None).
        ``W_o``: the output projection's weight to use (a decode's ``rows_layout`` copy), by
        default ``out_proj.weight``."""
        return self._attend(_heads(x, W_q, b_q, self.num_heads), keys, values, mask, need_weights, W_o)

    def step(self, x: Tensor, keys: Tensor, values: Tensor, position: Tensor | None = None,
             weights: tuple | None = None):
        """Self-attention of the newest token x (B, 1, E) over every token so far ->
        (output (B, 1, E), keys, values).

        ``weights``: (in_proj_weight, out_proj's weight) to use instead of the module's own
        (a decode's ``rows_layout`` copies: the same values); packed projections only.

        Without ``position`` the cache grows: keys and values (B, H, t, D) of the t earlier
        tokens come back (B, H, t + 1, D), the new token's appended.  With ``position`` (a
        0-d int64 Tensor, t) they are preallocated buffers (B, H, L, D), L the decode's
        length: the new token's row is written at t in place (the ``write_at_`` kernel) and
        the query reads the keys 0 .. t only (the ``sdpa_prefix`` kernel, the position its
        loop bound), so one compiled plan serves every step and no step pays for the slots
        not yet written.  The preallocated form is for decoding: its writes and its attention
        keep no graph (no gradient reaches the keys and values through them)."""
        batch, E, H = x.shape[0], self.embed_dim, self.num_heads
        W_in, W_o = (self.in_proj_weight if "in_proj_weight" in self._parameters else None,
                     self.out_proj.weight) if weights is None else weights
        if "in_proj_weight" in self._parameters:
            qkv = F.linear(x, W_in, self.in_proj_bias).reshape(batch, 3, H, 1, E // H)   # (B, 3, H, 1, D)
            # Each a contiguous copy (B, H, 1, D), as the kernels read them: indexing copies, so
            # no permute first (it cost a second copy of all three, ~6 us a step's layer).
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        else:
            (W_q, W_k, W_v), (b_q, b_k, b_v) = self._projections()
            q, k, v = _heads(x, W_q, b_q, H), _heads(x, W_k, b_k, H), _heads(x, W_v, b_v, H)
        if position is None:
            keys, values = cat([keys, k], axis=2), cat([values, v], axis=2)
            return self._attend(q, keys, values, None, False, W_o)[0], keys, values
        _write_at(keys, position, k)
        _write_at(values, position, v)
        context = _attend_prefix(q, keys, values, position)                                  # (B, H, 1, D)
        heads = context.reshape(batch, 1, E)
        return F.linear(heads, W_o, self.out_proj.bias), keys, values

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask, need_weights: bool, W_o: Tensor | None = None):
        if need_weights:
            # The fused node, its kernel writing the weights as it goes (what record() reads),
            # as scaled_dot_product runs it: the same kernel call, so the same context.
            inputs = (q, k, v) if mask is None else (q, k, v, mask)
            with ScaledDotProduct.keeping() as kept:
                context = ScaledDotProduct.apply(*inputs, scale=1.0 / math.sqrt(k.shape[-1]), causal=False)
            [op] = kept
            weights = Tensor._made(op.weights(), context.backend, False)                    # (B, H, 1, S)
        else:
            context, _ = attention.scaled_dot_product(q, k, v, mask=mask, need_weights=False)
            weights = None
        # (B, H, 1, D) -> (B, 1, H D): with one query, the heads concatenate by a reshape alone.
        heads = context.reshape(q.shape[0], 1, self.embed_dim)
        return F.linear(heads, self.out_proj.weight if W_o is None else W_o, self.out_proj.bias), weights

    def extra_repr(self) -> str:
        text = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, " \
               f"bias={self.in_proj_bias is not None}"
        if (self.kdim, self.vdim) != (self.embed_dim, self.embed_dim):
            text += f", kdim={self.kdim}, vdim={self.vdim}"
        return text


def rows_layout(weight: Tensor) -> Tensor:
    """``weight`` (out, in), the same values, laid out for products with few rows: on the host
    devices a transposed view of a contiguous (in, out) copy, so that ``x W^T`` is one product
    of contiguous operands, which OpenBLAS runs ~25% faster than with W^T read in place at a
    decoding step's 64 rows (64 x 128 by 128 x 384: 66 against 88 us; no faster at a training
    step's 640 rows); elsewhere ``weight`` itself.  A copy made per decode, from the weights
    as they are then: never a parameter, so a plan that reads it reads an input."""
    if weight.device not in ("cpu", "numpy"):
        return weight
    k = weight.backend
    return Tensor._make(k.permute(weight._data, (1, 0)).T, k, False)


def _heads(x: Tensor, W: Tensor, b: Tensor | None, num_heads: int) -> Tensor:
    """x W^T + b split into heads: (B, L, E) -> (B, H, L, E / H)."""
    (batch, length), E = x.shape[:2], W.shape[0]
    y = F.linear(x, W, b)
    if length == 1:             # one token: the heads need no transpose, only a reshape
        return y.reshape(batch, num_heads, 1, E // num_heads)
    return y.reshape(batch, length, num_heads, E // num_heads).transpose(1, 2)


def _attend_prefix(q: Tensor, keys: Tensor, values: Tensor, position: Tensor) -> Tensor:
    """One query per head (B, H, 1, D) over the cache's keys and values (B, H, L, D) at
    positions 0 .. position, by the device's ``sdpa_prefix`` kernel (no graph: decoding)."""
    if is_grad_enabled() and (q.requires_grad or keys.requires_grad or values.requires_grad):
        raise RuntimeError("MultiHeadAttention.step: a preallocated cache (position given) keeps no "
                           "graph, so no gradient would reach the weights; decode under ta.no_grad(), "
                           "or pass position=None to train through the step")
    (batch, heads, _, depth), length = q.shape, keys.shape[2]
    backend = q.backend
    out = backend.sdpa_prefix(backend.reshape(q._data, (batch * heads, 1, depth)),
                              backend.reshape(keys._data, (batch * heads, length, depth)),
                              backend.reshape(values._data, (batch * heads, length, values.shape[3])),
                              position._data, 1.0 / math.sqrt(depth))
    return Tensor._make(backend.reshape(out, (batch, heads, 1, values.shape[3])), backend, False)


def _write_at(cache: Tensor, position: Tensor, rows: Tensor) -> None:
    """cache[:, :, position] = rows[:, :, 0] in place, by the device's kernel."""
    cache.backend.write_at_(cache._data, position._data, rows._data, 2)
    cache._version.count += 1              # a change of values, as any in-place write


class GraphAttention(Module):
    """A GAT layer (Veličković et al. 2018): ``ta.attention.graph`` with its weights.

    Parameters: W (heads * out_features, in_features), a_src and a_dst (heads, out_features),
    all Glorot-uniform as in the paper; bias (heads * out_features if concat else
    out_features), zeros, added after aggregation as PyTorch Geometric's GATConv does.

    Example:
        >>> gat = nn.GraphAttention(16, 8, heads=4)
        >>> h, weights = gat(x, adjacency)          # (N, 16), (N, N) bool -> (N, 32), (4, N, N)
    """

    def __init__(self, in_features: int, out_features: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 bias: bool = True):
        super().__init__()
        self.in_features, self.out_features, self.heads = in_features, out_features, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops = add_self_loops
        self.W = Parameter(init.xavier_uniform((heads * out_features, in_features)))
        # Glorot for a (1, 2F) attention vector per head, as the paper's a is.
        self.a_src = Parameter(init.xavier_uniform((heads, out_features), fan_in=2 * out_features, fan_out=1))
        self.a_dst = Parameter(init.xavier_uniform((heads, out_features), fan_in=2 * out_features, fan_out=1))
        size = heads * out_features if concat else out_features
        self.bias = Parameter(init.zeros((size,))) if bias else None

    def forward(self, x: Tensor, adjacency):
        out, weights = attention.graph(
            x, adjacency, self.W, self.a_src, self.a_dst, heads=self.heads,
            negative_slope=self.negative_slope, concat=self.concat,
            add_self_loops=self.add_self_loops, dropout=self.dropout if self.training else 0.0)
        if self.bias is not None:
            out = out + self.bias
        return out, weights

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"heads={self.heads}, concat={self.concat}, negative_slope={self.negative_slope}"


class LuongAttentionVector(Module):
    """Luong's attentional hidden state a_t = tanh(W_c [c_t; h_t]) (Luong et al. 2015, eq. 5),
    which feeds the output layer: softmax(W_s a_t).

    Args:
        context_dim: size of the context c_t.  hidden_dim: size of the decoder state h_t.
        out_dim: size of a_t (default hidden_dim).  bias: add a bias (the paper has none).
    """

    def __init__(self, context_dim: int, hidden_dim: int, out_dim: int | None = None,
                 bias: bool = False):
        super().__init__()
        self.context_dim, self.hidden_dim = context_dim, hidden_dim
        self.W_c = Linear(context_dim + hidden_dim, hidden_dim if out_dim is None else out_dim,
                          bias=bias)

    def forward(self, context: Tensor, hidden: Tensor) -> Tensor:
        """(..., context_dim), (..., hidden_dim) -> (..., out_dim)."""
        if context.shape[:-1] != hidden.shape[:-1]:
            raise ShapeError(f"LuongAttentionVector: context {context.shape} and hidden "
                             f"{hidden.shape} must agree on every axis but the last")
        if context.shape[-1] != self.context_dim or hidden.shape[-1] != self.hidden_dim:
            raise ShapeError(f"LuongAttentionVector: expected context (..., {self.context_dim}) and "
                             f"hidden (..., {self.hidden_dim}), got {context.shape} and {hidden.shape}")
        return self.W_c(cat([context, hidden], axis=-1)).tanh()             # (..., out_dim)

    def extra_repr(self) -> str:
        return f"context_dim={self.context_dim}, hidden_dim={self.hidden_dim}, " \
               f"out_dim={self.W_c.out_features}"
