"""A Transformer encoder-decoder (Vaswani et al. 2017) on the engine's own layers, with the
interface of ``Seq2Seq``: teacher-forced ``forward`` and ``loss``, and ``greedy`` decoding
that keeps every layer's keys and values (a cache) instead of re-running the prefix.

    embed(x) * sqrt(d_model) + PE(position)     PE: sinusoids (section 3.5), or learned
    memory = encoder(src embedded)              self-attention over the real source tokens
    logits = out(decoder(tgt_in embedded, memory))   causal self-attention, cross-attention

Ids follow ``ta.data``: 0 ``<pad>``, 1 ``<start>``, 2 ``<end>``.
"""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from .. import nn, scopes
from ..attention import scaled_dot_product
from ..autograd import ShapeError, scope
from ..tensor import Tensor, cat
from .seq2seq import END, PAD, START, _check_positive, _ids, _inference, _size

__all__ = ["Transformer", "sinusoids"]

POSITIONS = ("sinusoidal", "learned")


def sinusoids(length: int, d_model: int) -> np.ndarray:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d))
    (Vaswani et al. 2017, section 3.5), (length, d_model) float64."""
    position = np.arange(length)[:, None]
    rates = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2) / d_model)          # (ceil(d/2),)
    table = np.zeros((length, d_model))
    table[:, 0::2] = np.sin(position * rates)
    table[:, 1::2] = np.cos(position * rates[: d_model // 2])
    return table


class Transformer(nn.Module):
    """Embeddings with positions, ``nn.Transformer`` and an output layer.

    Args:
        src_vocab, tgt_vocab: vocabulary sizes (ints or ``ta.data.Vocab``).
        d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout,
            activation, norm_first: as ``nn.Transformer``.
        positions: "sinusoidal" (fixed) or "learned" (an embedding per position).
        max_len: the longest sequence the position table covers.
        tie_embeddings: the output layer's weight is the target embedding (Press and Wolf
            2017; the paper shares it too).

    Example:
        >>> model = ta.models.Transformer(40, 40, d_model=64, nhead=4, num_encoder_layers=2,
        ...                               num_decoder_layers=2, dim_feedforward=128)
        >>> logits, _ = model(src, tgt_in)                 # (B, T, 40)
        >>> ids, _ = model.greedy(src, max_len=12)         # cached keys and values
    """

    def __init__(self, src_vocab, tgt_vocab, d_model: int = 128, nhead: int = 4, num_encoder_layers: int = 2,
                 num_decoder_layers: int = 2, dim_feedforward: int = 512, dropout: float = 0.1,
                 activation: str = "relu", norm_first: bool = False, positions: str = "sinusoidal",
                 max_len: int = 512, tie_embeddings: bool = False):
        super().__init__()
        src_size, tgt_size = _size(src_vocab, "src_vocab"), _size(tgt_vocab, "tgt_vocab")
        if positions not in POSITIONS:
            raise ValueError(f"Transformer: positions must be one of {POSITIONS}, got {positions!r}")
        self.config = dict(src_vocab=src_size, tgt_vocab=tgt_size, d_model=d_model, nhead=nhead,
                           num_encoder_layers=num_encoder_layers, num_decoder_layers=num_decoder_layers,
                           dim_feedforward=dim_feedforward, dropout=float(dropout), activation=activation,
                           norm_first=norm_first, positions=positions, max_len=max_len,
                           tie_embeddings=tie_embeddings)
        self.d_model, self.max_len = d_model, max_len
        self.transformer = nn.Transformer(d_model, nhead, num_encoder_layers, num_decoder_layers,
                                          dim_feedforward, dropout, activation, norm_first=norm_first)
        self.src_embed = nn.Embedding(src_size, d_model, padding_idx=PAD)
        self.tgt_embed = nn.Embedding(tgt_size, d_model, padding_idx=PAD)
        for table in (self.src_embed, self.tgt_embed):       # N(0, 1/d): x sqrt(d) gives unit scale
            table.weight.data = table.weight.numpy() / math.sqrt(d_model)
        if positions == "learned":
            self.position = nn.Embedding(max_len, d_model)
        else:
            self._sinusoids = sinusoids(max_len, d_model)         # fixed: not a parameter
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, tgt_size)
        if tie_embeddings:
            self.out.weight = self.tgt_embed.weight

    def extra_repr(self) -> str:
        c = self.config
        return (f"d_model={c['d_model']}, nhead={c['nhead']}, layers={c['num_encoder_layers']}+"
                f"{c['num_decoder_layers']}, positions={c['positions']!r}")

    # ------------------------------------------------------------ pieces

    def _embed(self, table: nn.Embedding, ids: np.ndarray, start: int = 0) -> Tensor:
        """embed(ids) sqrt(d_model) + the positions start .. start + L - 1, dropped out."""
        length = ids.shape[1]
        if start + length > self.max_len:
            raise ShapeError(f"Transformer: a sequence of {start + length} tokens is longer than the "
                             f"position table (max_len={self.max_len}); build the model with a larger "
                             f"max_len")
        x = table(ids) * math.sqrt(self.d_model)
        if self.config["positions"] == "learned":
            x = x + self.position(np.arange(start, start + length)[None, :])
        else:
            x = x + Tensor(self._sinusoids[start:start + length], dtype=x.dtype, device=x.device)
        return self.drop(x)

    def encode(self, src: np.ndarray) -> Tensor:
        with scope(scopes.ENCODER):
            return self.transformer.encoder(self._embed(self.src_embed, src), key_mask=src != PAD)

    # ------------------------------------------------------------ training

    def forward(self, src, tgt_in):
        """Teacher forcing: ``src`` (B, S) and ``tgt_in`` (B, T) int arrays padded with 0 ->
        (logits (B, T, V), None)."""
        src, tgt_in = _ids(src, "src"), _ids(tgt_in, "tgt_in")
        if tgt_in.shape[0] != src.shape[0]:
            raise ShapeError(f"Transformer: src {src.shape} and tgt_in {tgt_in.shape} differ in batch size")
        memory = self.encode(src)
        with scope(scopes.DECODER):
            h = self.transformer.decoder(self._embed(self.tgt_embed, tgt_in), memory,
                                         key_mask=tgt_in != PAD, memory_key_mask=src != PAD, causal=True)
            return self.out(h), None

    def loss(self, src, tgt_in, tgt_out, label_smoothing: float = 0.0) -> Tensor:
        """Mean cross-entropy of the teacher-forced logits against ``tgt_out``, padding ignored."""
        logits, _ = self(src, tgt_in)
        return F.cross_entropy(logits, _ids(tgt_out, "tgt_out"), ignore_index=PAD,
                               label_smoothing=label_smoothing)

    # ------------------------------------------------------------ decoding

    def greedy(self, src, max_len: int = 50, use_cache: bool = True):
        """The most likely token at every step.

        With ``use_cache`` each decoder layer keeps the keys and values of the tokens so far
        (and of the memory, computed once), so a step costs one token's work; without, every
        step re-runs the decoder on the whole prefix.  The two agree to rounding.

        Returns:
            (ids (B, L) int64, each row up to and including ``<end>`` then 0; None).
        """
        src = _ids(src, "src")
        _check_positive(max_len, "max_len", "greedy")
        with _inference(self):
            memory = self.encode(src)
            batch = src.shape[0]
            prefix = np.full((batch, 1), START, dtype=np.int64)
            done = np.zeros(batch, dtype=bool)
            caches = [{} for _ in self.transformer.decoder.layers]
            ids = []
            for t in range(max_len):
                with scope(scopes.DECODER), scope(scopes.step(t)):
                    if use_cache:
                        h = self._cached_step(prefix[:, -1:], t, memory, src != PAD, caches)
                    else:
                        h = self.transformer.decoder(self._embed(self.tgt_embed, prefix), memory,
                                                     memory_key_mask=src != PAD, causal=True)[:, -1:]
                    log_probs = np.array(self.out(h).log_softmax(-1).numpy()[:, 0])   # (B, V)
                log_probs[:, [PAD, START]] = -np.inf
                y = np.where(done, PAD, log_probs.argmax(axis=-1)).astype(np.int64)
                ids.append(y)
                prefix = np.concatenate([prefix, y[:, None]], axis=1)
                done |= y == END
                if done.all():
                    break
        return np.stack(ids, axis=1), None

    def _cached_step(self, token: np.ndarray, t: int, memory: Tensor, memory_mask: np.ndarray,
                     caches: list[dict]) -> Tensor:
        """The decoder's output at position t from its input token alone (B, 1, d_model)."""
        x = self._embed(self.tgt_embed, token, start=t)
        decoder = self.transformer.decoder
        for i, (layer, cache) in enumerate(zip(decoder.layers, caches, strict=True)):
            with scope(scopes.layer(i)):
                x = _layer_step(layer, x, memory, memory_mask, cache)
        return x if decoder.norm is None else decoder.norm(x)


def _layer_step(layer: nn.TransformerDecoderLayer, x: Tensor, memory: Tensor, memory_mask: np.ndarray,
                cache: dict) -> Tensor:
    """One decoder layer on the newest position only, its self-attention reading the cached
    keys and values of the earlier positions (which it extends), its cross-attention the
    memory's (projected once)."""
    def attend_self(h):
        with scope(scopes.SELF_ATTENTION):
            return _cached_attention(layer.self_attn, h, h, cache, "self", extend=True)

    def attend_memory(h):
        with scope(scopes.CROSS_ATTENTION):
            return _cached_attention(layer.multihead_attn, h, memory, cache, "memory", extend=False,
                                     key_mask=memory_mask)

    x = layer._sublayer(x, layer.norm1, layer.dropout1, attend_self)
    x = layer._sublayer(x, layer.norm2, layer.dropout2, attend_memory)
    return layer._sublayer(x, layer.norm3, layer.dropout3, layer._feed_forward)


def _cached_attention(mha: nn.MultiHeadAttention, query: Tensor, source: Tensor, cache: dict, key: str,
                      extend: bool, key_mask: np.ndarray | None = None) -> Tensor:
    """Multi-head attention of ``query`` (B, 1, E) over cached keys and values: with ``extend``
    the source's projections are appended to the cache (self-attention), else they are
    computed once (cross-attention)."""
    batch, E, H = query.shape[0], mha.embed_dim, mha.num_heads
    (W_q, W_k, W_v), (b_q, b_k, b_v) = mha._projections()

    def heads(x, W, b):
        return F.linear(x, W, b).reshape(batch, x.shape[1], H, E // H).transpose(1, 2)   # (B, H, L, D)

    if extend or key not in cache:
        k, v = heads(source, W_k, b_k), heads(source, W_v, b_v)
        if extend and key in cache:
            k, v = cat([cache[key][0], k], axis=2), cat([cache[key][1], v], axis=2)
        cache[key] = (k, v)
    k, v = cache[key]
    mask = None if key_mask is None else Tensor(key_mask[:, None, None, :], device=query.device)
    context, _ = scaled_dot_product(heads(query, W_q, b_q), k, v, mask=mask, need_weights=False)
    return F.linear(context.transpose(1, 2).reshape(batch, 1, E), mha.out_proj.weight, mha.out_proj.bias)
