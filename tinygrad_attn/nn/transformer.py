"""The Transformer's layers (Vaswani et al. 2017), with ``torch.nn.Transformer``'s constructor
arguments, parameter names and shapes (``batch_first=True``), so a torch state_dict loads.

Masks keep the engine's one convention: True = a real token / may attend (torch's boolean
``*_key_padding_mask`` and ``*_mask`` are the opposite: pass ``~mask``).  ``causal=True`` lets
position i attend to positions <= i, as torch's ``is_causal`` with a square subsequent mask;
every mask given to one attention applies together (a position attends only where all allow).

A stack of zero layers is allowed, as in torch: it is then its final LayerNorm alone.

    encoder layer:  x = norm1(x + self_attention(x));  x = norm2(x + feed_forward(x))
    decoder layer:  x = norm1(x + self_attention(x));  x = norm2(x + cross_attention(x, memory))
                    x = norm3(x + feed_forward(x))

With ``norm_first`` (pre-norm, the layout most later models use) each sublayer reads the
normalised x and adds to the un-normalised one: ``x = x + sublayer(norm(x))``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

from .. import functional as F
from .. import scopes
from ..arguments import check_flag, check_int, check_number
from ..autograd import scope
from ..tensor import Tensor
from . import init
from .attention import MultiHeadAttention
from .attention import rows_layout as attention_rows_layout
from .layers import Dropout, LayerNorm
from .linear import Linear
from .module import Module, ModuleList

_ACTIVATIONS = ("relu", "gelu")


def check_layer_arguments(where: str, d_model, nhead, dim_feedforward, dropout, activation,
                          layer_norm_eps=1e-5, batch_first=True, norm_first=False, bias=True) -> None:
    """The checks of a Transformer layer's constructor arguments, one line naming ``where`` and
    the argument (``ta.models.Transformer`` runs them too, before building anything)."""
    check_int(d_model, "d_model", where, 1)
    check_int(nhead, "nhead", where, 1)
    if d_model % nhead:
        raise ValueError(f"{where}: nhead={nhead} must divide d_model={d_model}")
    check_int(dim_feedforward, "dim_feedforward", where, 1)
    # 1 would drop every sublayer's output and every attention weight: nothing would train.
    check_number(dropout, "dropout", where, low=0.0, high=1.0, high_open=True)
    if not isinstance(activation, str) or activation not in _ACTIVATIONS:
        raise ValueError(f"{where}: activation must be 'relu' or 'gelu', got {activation!r}")
    check_number(layer_norm_eps, "layer_norm_eps", where, low=0.0, low_open=True)
    if not check_flag(batch_first, "batch_first", where):
        raise ValueError(f"{where}: the engine is batch first (B, T, E); batch_first=False is not supported")
    check_flag(norm_first, "norm_first", where)
    check_flag(bias, "bias", where)


class _Layer(Module):
    """What both layers share: their parameters (in torch's order), the feed-forward block
    and the residual wiring."""

    def __init__(self, name: str, cross_attention: bool, d_model: int, nhead: int, dim_feedforward: int,
                 dropout: float, activation: str, layer_norm_eps: float, batch_first: bool, norm_first: bool,
                 bias: bool):
        super().__init__()
        check_layer_arguments(name, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                              batch_first, norm_first, bias)
        self.config = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                           activation=activation, layer_norm_eps=layer_norm_eps, norm_first=norm_first,
                           bias=bias)
        self.d_model, self.activation, self.norm_first = d_model, activation, norm_first
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout=dropout, bias=bias)
        if cross_attention:
            self.multihead_attn = MultiHeadAttention(d_model, nhead, dropout=dropout, bias=bias)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.dropout = Dropout(dropout)
        for i in range(1, 4 if cross_attention else 3):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
            setattr(self, f"dropout{i}", Dropout(dropout))

    def _feed_forward(self, x: Tensor, weights: tuple | None = None) -> Tensor:
        """``weights``: linear1's and linear2's weights to use (a decode's ``rows_layout``
        copies), by default the modules' own."""
        W_1, W_2 = (self.linear1.weight, self.linear2.weight) if weights is None else weights
        with scope(scopes.FEED_FORWARD):
            h = F.linear(x, W_1, self.linear1.bias)
            h = h.relu() if self.activation == "relu" else F.gelu(h)
            return F.linear(self.dropout(h), W_2, self.linear2.bias)

    def _sublayer(self, x: Tensor, norm: LayerNorm, dropout: Dropout, block) -> Tensor:
        if self.norm_first:
            return x + dropout(block(norm(x)))
        return norm(x + dropout(block(x)))


class TransformerEncoderLayer(_Layer):
    """Self-attention and a feed-forward block, each with a residual connection and layer
    normalisation, as ``torch.nn.TransformerEncoderLayer(..., batch_first=True)``.

    Parameters: self_attn (a ``MultiHeadAttention``), linear1 (dim_feedforward, d_model),
    linear2 (d_model, dim_feedforward), norm1, norm2.

    Example:
        >>> layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128)
        >>> y = layer(x, key_mask=src != 0)            # x (B, S, 64) -> (B, S, 64)
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = True,
                 norm_first: bool = False, bias: bool = True):
        super().__init__("TransformerEncoderLayer", False, d_model, nhead, dim_feedforward, dropout,
                         activation, layer_norm_eps, batch_first, norm_first, bias)

    def forward(self, x: Tensor, key_mask=None, mask=None, causal: bool = False) -> Tensor:
        """x (B, S, d_model) -> (B, S, d_model).  key_mask (B, S): True at real tokens;
        mask: True = may attend, broadcast to (B, nhead, S, S)."""
        def attend(h):
            with scope(scopes.SELF_ATTENTION):
                return self.self_attn(h, h, h, key_mask=key_mask, mask=mask, causal=causal,
                                      need_weights=False)[0]

        x = self._sublayer(x, self.norm1, self.dropout1, attend)
        return self._sublayer(x, self.norm2, self.dropout2, self._feed_forward)


class TransformerDecoderLayer(_Layer):
    """Causal self-attention, attention over the encoder's output (``memory``) and a
    feed-forward block, as ``torch.nn.TransformerDecoderLayer(..., batch_first=True)``.

    Parameters: self_attn, multihead_attn (the cross-attention), linear1, linear2, norm1,
    norm2, norm3.

    Example:
        >>> layer = nn.TransformerDecoderLayer(d_model=64, nhead=4, dim_feedforward=128)
        >>> y = layer(t, memory, key_mask=tgt != 0, memory_key_mask=src != 0)
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = True,
                 norm_first: bool = False, bias: bool = True):
        super().__init__("TransformerDecoderLayer", True, d_model, nhead, dim_feedforward, dropout,
                         activation, layer_norm_eps, batch_first, norm_first, bias)

    def forward(self, x: Tensor, memory: Tensor, key_mask=None, memory_key_mask=None,
                causal: bool = True, mask=None, memory_mask=None) -> Tensor:
        """x (B, T, d_model), memory (B, S, d_model) -> (B, T, d_model).  key_mask (B, T) and
        memory_key_mask (B, S): True at real tokens.  mask (torch's ``tgt_mask``) broadcasts to
        (B, nhead, T, T) and memory_mask (torch's ``memory_mask``) to (B, nhead, T, S), True =
        may attend."""
        def attend_self(h):
            with scope(scopes.SELF_ATTENTION):
                return self.self_attn(h, h, h, key_mask=key_mask, mask=mask, causal=causal,
                                      need_weights=False)[0]

        def attend_memory(h):
            with scope(scopes.CROSS_ATTENTION):
                return self.multihead_attn(h, memory, memory, key_mask=memory_key_mask, mask=memory_mask,
                                           need_weights=False)[0]

        x = self._sublayer(x, self.norm1, self.dropout1, attend_self)
        x = self._sublayer(x, self.norm2, self.dropout2, attend_memory)
        return self._sublayer(x, self.norm3, self.dropout3, self._feed_forward)


    # ------------------------------------------------------------ decoding a token at a time

    def cache(self, keys: Tensor, values: Tensor, memory_keys: Tensor, memory_values: Tensor,
              slots: int | None = None, rows_layout: bool = False) -> DecoderCache:
        """A ``DecoderCache`` of these keys and values (``start_cache`` makes them from the
        memory); ``slots``: the positions L of preallocated self-attention buffers (keys and
        values (B, H, L, D)), or None for growing ones.
        ``rows_layout``: the cache also holds the step's weights as ``rows_layout`` copies
        (what a decode's steps multiply by, a few rows at a time)."""
        slots = check_int(slots, "slots", "TransformerDecoderLayer.cache", 0, optional=True)
        W_q, b_q = self.multihead_attn.query_projection()
        if not rows_layout:
            return DecoderCache(keys, values, memory_keys, memory_values, W_q, b_q, slots)
        layout = [attention_rows_layout(w) for w in (
            W_q, self.self_attn.in_proj_weight, self.self_attn.out_proj.weight,
            self.multihead_attn.out_proj.weight, self.linear1.weight, self.linear2.weight)]
        return DecoderCache(keys, values, memory_keys, memory_values, layout[0], b_q, slots, *layout[1:])

    def start_cache(self, memory: Tensor, length: int | None = None, memory_keys: Tensor | None = None,
                    memory_values: Tensor | None = None) -> DecoderCache:
        """The cache a decode of ``memory`` (B, S, d_model) starts from: the cross-attention's
        keys and values of the memory, projected once (or given: ``memory_keys`` and
        ``memory_values``, ``multihead_attn.project_memory(memory)`` made by the caller); the
        self-attention's keys and values preallocated to ``length`` positions (zeros, each
        written by its step), or, with ``length`` None, empty and growing by one position per
        step."""
        if (memory_keys is None) != (memory_values is None):
            raise ValueError("TransformerDecoderLayer.start_cache: give memory_keys and memory_values "
                             "together, or neither")
        if memory_keys is None:
            memory_keys, memory_values = self.multihead_attn.project_memory(memory)
        batch, heads, _, depth = memory_keys.shape
        size = (batch, heads, 0 if length is None else length, depth)
        keys, values = (Tensor.zeros(*size, dtype=memory.dtype, device=memory.device) for _ in range(2))
        packed = "in_proj_weight" in self.self_attn._parameters
        return self.cache(keys, values, memory_keys, memory_values, length, rows_layout=packed)

    def step(self, x: Tensor, cache: DecoderCache, memory_mask=None, position: Tensor | None = None,
             need_weights: bool = False):
        """The layer on the newest position only: x (B, 1, d_model) -> (B, 1, d_model), and the
        cross-attention's weights (B, H, 1, S) with ``need_weights`` (else None).

        Self-attention reads the cache's keys and values of the earlier positions and adds the
        new token's: with ``position`` (a 0-d int64 Tensor, required by a preallocated cache)
        written in place at that position, else appended (the cache's tensors replaced).
        ``memory_mask`` broadcasts to (B, H, 1, S), True at the source tokens to attend.
        Equals ``forward`` on the whole prefix, at its last position, to rounding."""
        if (cache.slots is None) != (position is None):
            raise ValueError("TransformerDecoderLayer.step: a preallocated cache (slots) needs the "
                             "position, and a growing one takes none")
        found = {}

        def attend_self(h):
            with scope(scopes.SELF_ATTENTION):
                weights = None if cache.self_in_weight is None else (cache.self_in_weight,
                                                                        cache.self_out_weight)
                out, cache.keys, cache.values = self.self_attn.step(h, cache.keys, cache.values, position,
                                                                    weights)
                return out

        def attend_memory(h):
            with scope(scopes.CROSS_ATTENTION):
                out, found["weights"] = self.multihead_attn.attend(
                    h, cache.query_weight, cache.query_bias, cache.memory_keys, cache.memory_values,
                    memory_mask, need_weights, cache.cross_out_weight)
                return out

        def feed_forward(h):
            return self._feed_forward(h, None if cache.linear1_weight is None else
                                      (cache.linear1_weight, cache.linear2_weight))

        x = self._sublayer(x, self.norm1, self.dropout1, attend_self)
        x = self._sublayer(x, self.norm2, self.dropout2, attend_memory)
        return self._sublayer(x, self.norm3, self.dropout3, feed_forward), found["weights"]


@dataclass
class DecoderCache:
    """What one ``TransformerDecoderLayer`` keeps across the steps of a decode.

    keys, values: the self-attention's, (B, H, L, D): preallocated to the decode's length L
        when ``slots`` is set (rows past the current position are not yet written), else the
        t positions so far.
    memory_keys, memory_values: the cross-attention's, of the memory, (B, H, S, D).
    query_weight, query_bias: the cross-attention's query projection (E, E), (E,) or None,
        sliced once per decode.
    slots: the length L of a preallocated cache, or None for a growing one: it marks the
        cache as preallocated (the step then needs the position).  A plain int beside the
        tensors, not one of them: the attention reads the keys up to the position
        (``sdpa_prefix``), so no kernel needs it, and a compiled step takes only ``tensors()``.
    self_in_weight, self_out_weight, cross_out_weight, linear1_weight, linear2_weight: the
        step's other weights as ``rows_layout`` copies made once per decode (as is
        query_weight then), or None: the step reads the modules' own.
    """

    keys: Tensor
    values: Tensor
    memory_keys: Tensor
    memory_values: Tensor
    query_weight: Tensor
    query_bias: Tensor | None
    slots: int | None = None
    self_in_weight: Tensor | None = None
    self_out_weight: Tensor | None = None
    cross_out_weight: Tensor | None = None
    linear1_weight: Tensor | None = None
    linear2_weight: Tensor | None = None

    def tensors(self) -> tuple:
        """Its tensors (or None) in field order, ``slots`` left out: the arguments of a compiled
        step (``from_tensors`` inverts)."""
        return tuple(getattr(self, name) for name in _tensor_fields(type(self)))

    @classmethod
    def tensor_names(cls) -> tuple[str, ...]:
        """The fields ``tensors`` gives, in its order."""
        return _tensor_fields(cls)

    @classmethod
    def from_tensors(cls, tensors, slots: int | None = None) -> DecoderCache:
        return cls(**dict(zip(cls.tensor_names(), tensors, strict=True)), slots=slots)


@functools.cache
def _tensor_fields(cls: type) -> tuple[str, ...]:
    # Read once a class: a decoding step lists every layer's tensors, and ``fields`` took
    # ~12 us a cache.
    return tuple(f.name for f in fields(cls) if f.name != "slots")


def _clones(layer: Module, num_layers: int) -> ModuleList:
    """``num_layers`` copies of ``layer`` with its weights (torch deep-copies the layer)."""
    copies = ModuleList()
    for _ in range(num_layers):
        copy = type(layer)(**layer.config)
        copy.to(layer.linear1.weight.device)
        copy.load_state_dict(layer.state_dict())
        copies.append(copy)
    return copies


class _Stack(Module):
    """``num_layers`` copies of a layer, then ``norm`` if given (parameters
    ``layers.0.self_attn...``, ``norm.weight``)."""

    def __init__(self, layer: _Layer, num_layers: int, norm: LayerNorm | None = None):
        super().__init__()
        check_int(num_layers, "num_layers", type(self).__name__, 0)
        self.layers = _clones(layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm


class TransformerEncoder(_Stack):
    """``num_layers`` copies of ``encoder_layer`` in sequence (0: none), then ``norm`` if given,
    as ``torch.nn.TransformerEncoder``."""

    def forward(self, x: Tensor, key_mask=None, mask=None, causal: bool = False) -> Tensor:
        for i, layer in enumerate(self.layers):
            with scope(scopes.layer(i)):
                x = layer(x, key_mask=key_mask, mask=mask, causal=causal)
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(_Stack):
    """``num_layers`` copies of ``decoder_layer`` (0: none), then ``norm`` if given, as
    ``torch.nn.TransformerDecoder``."""

    def forward(self, x: Tensor, memory: Tensor, key_mask=None, memory_key_mask=None,
                causal: bool = True, mask=None, memory_mask=None) -> Tensor:
        for i, layer in enumerate(self.layers):
            with scope(scopes.layer(i)):
                x = layer(x, memory, key_mask=key_mask, memory_key_mask=memory_key_mask, causal=causal,
                          mask=mask, memory_mask=memory_mask)
        return x if self.norm is None else self.norm(x)


class Transformer(Module):
    """An encoder and a decoder of Transformer layers, each ending in a layer norm, as
    ``torch.nn.Transformer(..., batch_first=True)``: the same arguments and defaults, the
    same parameter names (``encoder.layers.0.self_attn.in_proj_weight``, ``encoder.norm.weight``,
    ``decoder.layers.1.multihead_attn.out_proj.bias``, ...) and, like torch's, every weight
    matrix re-drawn Xavier-uniform after construction.  Embeddings and the output projection
    are the model's (``ta.models.Transformer``).  Either stack may have 0 layers (its final
    LayerNorm alone; with no decoder layer the output does not read ``src``).

    Example:
        >>> tr = nn.Transformer(d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
        ...                     dim_feedforward=128, dropout=0.0)
        >>> y = tr(src_embedded, tgt_embedded, src_key_mask=src != 0, tgt_key_mask=tgt != 0)
        >>> tr.load_state_dict(torch_transformer.state_dict())
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = True,
                 norm_first: bool = False, bias: bool = True):
        super().__init__()
        check_layer_arguments("Transformer", d_model, nhead, dim_feedforward, dropout, activation,
                              layer_norm_eps, batch_first, norm_first, bias)
        check_int(num_encoder_layers, "num_encoder_layers", "Transformer", 0)
        check_int(num_decoder_layers, "num_decoder_layers", "Transformer", 0)
        options = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                       layer_norm_eps=layer_norm_eps, batch_first=batch_first, norm_first=norm_first,
                       bias=bias)
        def final_norm():
            return LayerNorm(d_model, eps=layer_norm_eps, bias=bias)

        self.encoder = TransformerEncoder(TransformerEncoderLayer(d_model, nhead, **options),
                                          num_encoder_layers, final_norm())
        self.decoder = TransformerDecoder(TransformerDecoderLayer(d_model, nhead, **options),
                                          num_decoder_layers, final_norm())
        self.d_model, self.nhead = d_model, nhead
        for p in self.parameters():
            if p.ndim > 1:
                p.data = init.xavier_uniform(p.shape).astype(p.dtype)

    def forward(self, src: Tensor, tgt: Tensor, src_key_mask=None, tgt_key_mask=None,
                causal: bool = True, src_mask=None, tgt_mask=None, memory_mask=None,
                memory_key_mask=None) -> Tensor:
        """src (B, S, d_model), tgt (B, T, d_model) -> (B, T, d_model).

        Every mask is True = may attend (torch's boolean masks are the opposite: pass ``~m``;
        torch's 3-D masks (B * nhead, ., .) reshape to (B, nhead, ., .)); masks given to one
        attention apply together.

        Args:
            src_key_mask (B, S): True at real source tokens; masks the encoder's self-attention
                and, unless ``memory_key_mask`` is given, the decoder's cross-attention (torch's
                ``src_key_padding_mask``, and ``memory_key_padding_mask``).
            tgt_key_mask (B, T): True at real target tokens (torch's ``tgt_key_padding_mask``).
            causal: the decoder's self-attention sees no later position (torch's ``tgt_mask``
                of ``generate_square_subsequent_mask`` with ``tgt_is_causal``).
            src_mask: the encoder's self-attention, broadcast to (B, nhead, S, S) (torch's
                ``src_mask``).
            tgt_mask: the decoder's self-attention, broadcast to (B, nhead, T, T), applied
                with ``causal`` (torch's ``tgt_mask``).
            memory_mask: the decoder's cross-attention, broadcast to (B, nhead, T, S) (torch's
                ``memory_mask``).
            memory_key_mask (B, S): the cross-attention's real source tokens, when they differ
                from ``src_key_mask`` (torch's ``memory_key_padding_mask``).
        """
        with scope(scopes.ENCODER):
            memory = self.encoder(src, key_mask=src_key_mask, mask=src_mask)
        with scope(scopes.DECODER):
            return self.decoder(tgt, memory, key_mask=tgt_key_mask,
                                memory_key_mask=src_key_mask if memory_key_mask is None else memory_key_mask,
                                causal=causal, mask=tgt_mask, memory_mask=memory_mask)

