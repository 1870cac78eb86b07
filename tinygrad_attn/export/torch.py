"""PyTorch twins of ``ta.models.Seq2Seq`` and ``ta.models.Transformer``: the same network built
from torch's own layers, with the engine's parameter names, so a model that outgrows one
machine continues training in torch's distributed engine (``examples/ddp.py``).

    twin = model.to_torch()                       # float32 by default; the engine's weights
    logits = twin(src, tgt_in)                    # LongTensors (B, S), (B, T) -> (B, T, V)
    model = ta.models.Seq2Seq.from_torch(twin)    # the engine model again

What each twin is made of (``tests/test_export_torch.py`` checks logits and every gradient in
float64 over the configurations):

    Seq2Seq      nn.Embedding; an nn.GRU/LSTM/RNN encoder over packed sequences (a padded step
                 neither moves the state nor outputs anything, as the engine's mask); the
                 bidirectional bridge s_0 = tanh(W [h_fwd; h_bwd] + b) per layer (an LSTM's
                 cell bridged without tanh); an nn.GRU/LSTM/RNN decoder, run over the whole
                 target, or (Bahdanau attention, whose context enters each step) stepped
                 through its own weights with torch's cell kernels (what nn.GRUCell runs);
                 the four scores and Luong's tanh(W_c [c; h]) written out as the engine's.
    Transformer  nn.Transformer(batch_first=True); embeddings x sqrt(d_model) plus the
                 engine's sinusoids (a buffer, cast from the float64 table at every dtype
                 change) or learned positions, then dropout; the output layer tied to the
                 target embedding when the engine's is.  A stack of zero layers is its final
                 LayerNorm alone, as the engine's (torch's own stacks index their first layer).

Dropout sits where the engine's does, at the same rates: training mode agrees in
distribution (the draws differ).  Sources must be right-padded (padding only after the last
real token), as ``ta.data`` pads them: the engine skips a padding token anywhere, packed
sequences only at the end, so a source with padding inside raises ValueError rather than
compute something else.  A Transformer source that is all padding gives NaN in torch
(zeros in the engine).

This module imports no model (it knows the engine's classes by name, and is given the class to
build back): the models' ``to_torch``/``from_torch`` import it, so imports flow one way.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

try:
    import torch
except ImportError as error:  # pragma: no cover - torch is an optional extra
    raise ImportError("tinygrad_attn.export.torch needs PyTorch: "
                      "pip install 'tinygrad_attn[torch]'") from error

from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..data.vocab import END, PAD, START

__all__ = ["TorchSeq2Seq", "TorchTransformer", "to_torch", "from_torch", "engine_state",
           "cross_entropy", "greedy"]

_RNNS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}
# The kernels nn.RNNCell / nn.GRUCell / nn.LSTMCell run, called with an nn.RNN's layer weights.
_CELL_KERNELS = {"rnn": torch.rnn_tanh_cell, "gru": torch.gru_cell, "lstm": torch.lstm_cell}


# ---------------------------------------------------------------- attention


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the positions where ``mask`` is True; a row with none is all zeros, as the
    engine's (filling with -inf would give NaN there).  The fill is the dtype's most negative
    number, whose exp underflows to exactly 0 next to any real score."""
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1) * mask


class _Score(nn.Module):
    """A score function of ``ta.nn``, with its parameter names: queries (B, T, H) attend over
    keys (B, S, K) -> (context (B, T, K), weights (B, T, S))."""

    def keys_projection(self, keys: torch.Tensor):
        return None

    def forward(self, query, keys, keys_proj, mask):
        scores = self.scores(query, keys, keys_proj)                             # (B, T, S)
        weights = masked_softmax(scores, mask[:, None, :])                       # (B, T, S)
        return weights @ keys, weights                                           # (B, T, K)


class DotScore(_Score):
    """score(s, h_j) = s . h_j."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()

    def scores(self, query, keys, keys_proj):
        return query @ keys.transpose(1, 2)                                      # (B, T, S)


class GeneralScore(_Score):
    """score(s, h_j) = s^T W h_j, W (H, K)."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(query_dim, key_dim))

    def scores(self, query, keys, keys_proj):
        return (query @ self.W) @ keys.transpose(1, 2)                           # (B, T, S)


class AdditiveScore(_Score):
    """score(s, h_j) = v . tanh(W_q s + W_k h_j)."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.W_q = nn.Parameter(torch.zeros(attn_dim, query_dim))
        self.W_k = nn.Parameter(torch.zeros(attn_dim, key_dim))
        self.v = nn.Parameter(torch.zeros(attn_dim))

    def keys_projection(self, keys):
        return keys @ self.W_k.T                                                 # (B, S, d_a)

    def scores(self, query, keys, keys_proj):
        hidden = (query @ self.W_q.T)[:, :, None] + keys_proj[:, None]           # (B, T, S, d_a)
        return torch.tanh(hidden) @ self.v                                       # (B, T, S)


class ConcatScore(_Score):
    """score(s, h_j) = v . tanh(W [s; h_j]), W = [W_s | W_h] split by columns."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.query_dim = query_dim
        self.W = nn.Parameter(torch.zeros(attn_dim, query_dim + key_dim))
        self.v = nn.Parameter(torch.zeros(attn_dim))

    def keys_projection(self, keys):
        return keys @ self.W[:, self.query_dim:].T                               # (B, S, d_a)

    def scores(self, query, keys, keys_proj):
        hidden = (query @ self.W[:, : self.query_dim].T)[:, :, None] + keys_proj[:, None]   # (B, T, S, d_a)
        return torch.tanh(hidden) @ self.v                                       # (B, T, S)


_SCORES = {"dot": DotScore, "general": GeneralScore, "additive": AdditiveScore, "concat": ConcatScore}


class LuongAttentionVector(nn.Module):
    """a_i = tanh(W_c [c_i; h_i]), no bias (``ta.nn.LuongAttentionVector``)."""

    def __init__(self, context_dim: int, hidden_dim: int):
        super().__init__()
        self.W_c = nn.Linear(context_dim + hidden_dim, hidden_dim, bias=False)

    def forward(self, context, hidden):
        return torch.tanh(self.W_c(torch.cat([context, hidden], dim=-1)))


# ---------------------------------------------------------------- Seq2Seq


class Memory(NamedTuple):
    """What the decoder reads: encoder outputs (B, S, K) or None without attention, their
    projection for additive/concat scores, the source mask (B, S), and the decoder's initial
    state per layer ((B, H), or (h, c) for an LSTM)."""

    keys: torch.Tensor | None
    keys_proj: torch.Tensor | None
    mask: torch.Tensor
    states: list


class TorchSeq2Seq(nn.Module):
    """``ta.models.Seq2Seq`` in torch: built from the engine model's ``config``, with its
    parameter names (``to_torch`` copies the weights).

    ``forward(src, tgt_in)`` returns the teacher-forced logits (B, T, V) alone (not the
    engine's (logits, weights) pair), which is what DistributedDataParallel wraps.
    """

    engine_class = "Seq2Seq"

    def __init__(self, config: dict):
        super().__init__()
        self.config = dict(config)
        c = self.config
        cell, hidden, layers, dropout = c["cell"], c["hidden"], c["num_layers"], c["dropout"]
        self.cell, self.attention_kind, self.style = cell, c["attention"], c["style"]
        key_size = hidden * (2 if c["bidirectional"] else 1)
        self.src_embed = nn.Embedding(c["src_vocab"], c["embed"], padding_idx=PAD)
        self.tgt_embed = nn.Embedding(c["tgt_vocab"], c["embed"], padding_idx=PAD)
        self.drop = nn.Dropout(dropout)
        # Dropout between layers means nothing with one layer (and torch warns about it).
        between = dropout if layers > 1 else 0.0
        rnn = _RNNS[cell]
        self.encoder = rnn(c["embed"], hidden, layers, batch_first=True, dropout=between,
                           bidirectional=c["bidirectional"])
        if c["bidirectional"]:
            self.bridge = nn.Linear(2 * hidden, hidden)
            if cell == "lstm":
                self.bridge_c = nn.Linear(2 * hidden, hidden)
        self.feeds_context = self.attention_kind is not None and self.style == "bahdanau"
        self.decoder = rnn(c["embed"] + (key_size if self.feeds_context else 0), hidden, layers,
                           batch_first=True, dropout=between)
        if self.attention_kind is not None:
            self.attention = _SCORES[self.attention_kind](hidden, key_size, c["attn_dim"])
        if self.attention_kind is not None and self.style == "luong":
            self.attention_vector = LuongAttentionVector(key_size, hidden)
            readout = hidden
        elif self.feeds_context:
            readout = hidden + key_size
        else:
            readout = hidden
        self.out = nn.Linear(readout, c["tgt_vocab"])

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: src (B, S), tgt_in (B, T) int64, padded with 0 -> logits (B, T, V)."""
        memory = self.encode(src)
        embedded = self.drop(self.tgt_embed(tgt_in))                             # (B, T, E)
        if not self.feeds_context:
            tops, _ = self.decoder(embedded, _stacked(memory.states, self.cell))   # (B, T, H)
            if self.attention_kind is None:
                return self.out(self.drop(tops))                                 # (B, T, V)
            context, _ = self.attention(tops, memory.keys, memory.keys_proj, memory.mask)   # (B, T, K)
            return self.out(self.drop(self.attention_vector(context, tops)))     # (B, T, V)
        # Bahdanau: step i scores s_{i-1} and feeds [y_{i-1}; c_i] to the cell.
        states, tops, contexts = memory.states, [], []
        for t in range(tgt_in.shape[1]):
            context = self._attend(self._top(states), memory)                     # (B, K)
            top, states = self._step(torch.cat([embedded[:, t], context], dim=-1), states)   # (B, H)
            tops.append(top)
            contexts.append(context)
        features = torch.cat([torch.stack(tops, 1), torch.stack(contexts, 1)], dim=-1)   # (B, T, H + K)
        return self.out(self.drop(features))                                     # (B, T, V)

    def loss(self, src, tgt_in, tgt_out) -> torch.Tensor:
        """Mean cross-entropy against ``tgt_out``, padding ignored (the engine's ``loss``)."""
        return cross_entropy(self(src, tgt_in), tgt_out)

    def encode(self, src: torch.Tensor) -> Memory:
        mask = src != PAD                                                        # (B, S)
        lengths = mask.sum(1)                                                    # (B,)
        if not torch.equal(mask, torch.arange(src.shape[1], device=src.device) < lengths[:, None]):
            raise ValueError("TorchSeq2Seq: sources must be right-padded (padding only after the last real "
                             "token): torch's packed sequences skip no padding inside a row, the engine does")
        embedded = self.drop(self.src_embed(src))                                # (B, S, E)
        # An all-padding row runs one step here (packing needs a length >= 1), undone below.
        packed = pack_padded_sequence(embedded, lengths.clamp(min=1).cpu(), batch_first=True,
                                      enforce_sorted=False)
        outputs, finals = self.encoder(packed)
        keys, _ = pad_packed_sequence(outputs, batch_first=True, total_length=src.shape[1])   # (B, S, K)
        finals = finals if self.cell == "lstm" else (finals,)                     # each (L * D, B, H)
        empty = lengths == 0
        if bool(empty.any()):
            keys = keys * mask[..., None]
            finals = tuple(f * ~empty[None, :, None] for f in finals)
        states = self._bridge(finals)
        if self.attention_kind is None:
            return Memory(None, None, mask, states)
        return Memory(keys, self.attention.keys_projection(keys), mask, states)

    def _bridge(self, finals: tuple) -> list:
        """The encoder's final states (layer-major, directions inner) -> one per decoder layer."""
        layers = self.config["num_layers"]
        if not self.config["bidirectional"]:
            parts = [tuple(f[layer] for f in finals) for layer in range(layers)]
            return [p if self.cell == "lstm" else p[0] for p in parts]
        states = []
        for layer in range(layers):
            joined = [torch.cat([f[2 * layer], f[2 * layer + 1]], dim=-1) for f in finals]   # (B, 2H)
            h = torch.tanh(self.bridge(joined[0]))                               # (B, H)
            states.append((h, self.bridge_c(joined[1])) if self.cell == "lstm" else h)
        return states

    def _top(self, states: list) -> torch.Tensor:
        return states[-1][0] if self.cell == "lstm" else states[-1]

    def _attend(self, query: torch.Tensor, memory: Memory) -> torch.Tensor:
        """One query per row (B, H) -> its context (B, K)."""
        context, _ = self.attention(query[:, None], memory.keys, memory.keys_proj, memory.mask)
        return context[:, 0]

    def _step(self, x: torch.Tensor, states: list):
        """One step through every decoder layer, x (B, I) -> (top output (B, H), new states):
        torch's cell kernels on the nn.RNN's own layer weights."""
        kernel, new = _CELL_KERNELS[self.cell], []
        for layer, state in enumerate(states):
            if layer > 0:
                x = F.dropout(x, self.config["dropout"], self.training)
            weights = [getattr(self.decoder, f"{name}_l{layer}")
                       for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            state = kernel(x, state, *weights)
            new.append(state)
            x = state[0] if self.cell == "lstm" else state
        return x, new

    def decode_step(self, y_prev: torch.Tensor, states: list, memory: Memory):
        """One decoder step from the previous ids (B,) -> (logits (B, V), new states)."""
        embedded = self.drop(self.tgt_embed(y_prev))                             # (B, E)
        if self.attention_kind is None:
            top, states = self._step(embedded, states)
            return self.out(self.drop(top)), states
        if self.feeds_context:
            context = self._attend(self._top(states), memory)                     # (B, K)
            top, states = self._step(torch.cat([embedded, context], dim=-1), states)
            return self.out(self.drop(torch.cat([top, context], dim=-1))), states
        top, states = self._step(embedded, states)                               # (B, H)
        context = self._attend(top, memory)                                      # (B, K)
        return self.out(self.drop(self.attention_vector(context, top))), states


def _stacked(states: list, cell: str):
    """Per-layer states -> the (L, B, H) layout (a pair for an LSTM) nn.RNN takes."""
    if cell == "lstm":
        return torch.stack([h for h, _ in states]), torch.stack([c for _, c in states])
    return torch.stack(states)


# ---------------------------------------------------------------- Transformer


class TorchTransformer(nn.Module):
    """``ta.models.Transformer`` in torch: built from the engine model's ``config``, with its
    parameter names; ``forward(src, tgt_in)`` returns the logits (B, T, V).

    ``sinusoids``: the engine model's position table (max_len, d_model), for
    ``positions="sinusoidal"`` (``to_torch`` passes it).  The module keeps it in float64 and
    its ``sinusoids`` buffer is cast from that at every dtype change (``.double()``, ``.to``),
    so a float32 twin made float64 adds the engine's float64 sinusoids, not float32 ones widened.
    """

    engine_class = "Transformer"

    def __init__(self, config: dict, sinusoids: np.ndarray | None = None):
        super().__init__()
        self.config = dict(config)
        c = self.config
        self.d_model, self.max_len = c["d_model"], c["max_len"]
        options = dict(dim_feedforward=c["dim_feedforward"], dropout=c["dropout"], activation=c["activation"],
                       batch_first=True, norm_first=c["norm_first"])
        # Built here so the encoder keeps padded positions (no nested tensors in inference).
        encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(c["d_model"], c["nhead"], **options),
                                        c["num_encoder_layers"], nn.LayerNorm(c["d_model"]),
                                        enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(c["d_model"], c["nhead"], **options),
                                        c["num_decoder_layers"], nn.LayerNorm(c["d_model"]))
        self.transformer = nn.Transformer(c["d_model"], c["nhead"], custom_encoder=encoder,
                                          custom_decoder=decoder, batch_first=True)
        self.src_embed = nn.Embedding(c["src_vocab"], c["d_model"], padding_idx=PAD)
        self.tgt_embed = nn.Embedding(c["tgt_vocab"], c["d_model"], padding_idx=PAD)
        self._sinusoids64 = None
        if c["positions"] == "learned":
            self.position = nn.Embedding(c["max_len"], c["d_model"])
        else:
            if sinusoids is None or np.shape(sinusoids) != (c["max_len"], c["d_model"]):
                raise ValueError(f"TorchTransformer: sinusoidal positions need the engine model's table "
                                 f"({c['max_len']}, {c['d_model']}) (to_torch passes it)")
            # Not a buffer, so no dtype change rounds it: _apply casts the buffer from it.
            self._sinusoids64 = torch.from_numpy(np.array(sinusoids, dtype=np.float64))
            self.register_buffer("sinusoids", self._sinusoids64.clone(), persistent=False)
        self.drop = nn.Dropout(c["dropout"])
        self.out = nn.Linear(c["d_model"], c["tgt_vocab"])
        if c["tie_embeddings"]:
            self.out.weight = self.tgt_embed.weight

    def _apply(self, fn, *args, **kwargs):
        """Every dtype and device change (``.to``, ``.double()``, ``.cuda()`` ...) goes through
        here.  When it changes the sinusoids buffer's dtype, the buffer's values are cast again
        from the float64 table, once: cast from float32 they would keep float32's rounding
        (~1e-8) in a float64 twin."""
        before = None if self._sinusoids64 is None else self.sinusoids.dtype
        module = super()._apply(fn, *args, **kwargs)
        if before is not None and self.sinusoids.dtype != before:
            with torch.no_grad():
                self.sinusoids.copy_(self._sinusoids64)       # in place: the buffer torch made
        return module

    def embed(self, table: nn.Embedding, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """embed(ids) sqrt(d_model) + the positions start .. start + L - 1, dropped out."""
        length = ids.shape[1]
        if start + length > self.max_len:
            raise ValueError(f"TorchTransformer: a sequence of {start + length} tokens is longer than the "
                             f"position table (max_len={self.max_len})")
        x = table(ids) * math.sqrt(self.d_model)                                 # (B, L, d_model)
        if self.config["positions"] == "learned":
            x = x + self.position(torch.arange(start, start + length, device=ids.device))[None]
        else:
            x = x + self.sinusoids[start:start + length]
        return self.drop(x)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        x = self.embed(self.src_embed, src)                                      # (B, S, d_model)
        encoder = self.transformer.encoder
        if not len(encoder.layers):          # torch's forward reads layers[0]: the norm alone
            return encoder.norm(x)
        return encoder(x, src_key_padding_mask=src == PAD)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """The decoder's output (B, T, d_model): causal, target padding and source padding masked
        (torch's masks: True = may NOT attend)."""
        x = self.embed(self.tgt_embed, tgt_in)                                   # (B, T, d_model)
        decoder = self.transformer.decoder
        if not len(decoder.layers):          # no layer reads the memory: the norm alone
            return decoder.norm(x)
        length = tgt_in.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=tgt_in.device).triu(1)   # (T, T)
        return decoder(x, memory, tgt_mask=causal, tgt_key_padding_mask=tgt_in == PAD,
                       memory_key_padding_mask=src == PAD)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: src (B, S), tgt_in (B, T) int64, padded with 0 -> logits (B, T, V)."""
        return self.out(self.decode(tgt_in, self.encode(src), src))

    def loss(self, src, tgt_in, tgt_out) -> torch.Tensor:
        """Mean cross-entropy against ``tgt_out``, padding ignored (the engine's ``loss``)."""
        return cross_entropy(self(src, tgt_in), tgt_out)


# ---------------------------------------------------------------- conversion


_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def to_torch(model, dtype: torch.dtype | None = None) -> nn.Module:
    """The torch twin of an engine model, its weights copied, in the model's train/eval mode.

    Args:
        model: a ``ta.models.Seq2Seq`` or ``ta.models.Transformer``.
        dtype: the twin's floating type, a torch dtype; default the model's (a float64 model
            gives a float64 twin, equal to the engine to rounding).

    Returns:
        a ``TorchSeq2Seq`` or ``TorchTransformer`` (CPU; ``.to("cuda")`` as any module).
    """
    twin_class = _twin_class(model)
    if dtype is None:
        dtype = _TORCH_DTYPES[np.dtype(next(iter(model.parameters())).dtype)]
    elif not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"to_torch: dtype must be a torch floating dtype such as torch.float64, got "
                        f"{dtype!r}")
    if twin_class is TorchTransformer:
        twin = TorchTransformer(model.config, getattr(model, "_sinusoids", None))
    else:
        twin = twin_class(model.config)
    twin.to(dtype)
    state = {name: torch.from_numpy(np.ascontiguousarray(value))
             for name, value in model.state_dict().items()}
    if twin.config.get("tie_embeddings"):
        state["out.weight"] = state["tgt_embed.weight"]     # one tensor, both names in torch's state_dict
    expected = set(twin.state_dict())
    if set(state) != expected:
        raise ValueError(f"to_torch: the {type(model).__name__}'s parameters are not the ones its config "
                         f"builds (was a layer replaced?): missing {sorted(expected - set(state))}, "
                         f"unexpected {sorted(set(state) - expected)}")
    twin.load_state_dict(state)
    return twin.train(model.training)


def _twin_class(model) -> type:
    """The twin of the engine class ``model`` is (or derives from), by the class's name."""
    twins = {twin.engine_class: twin for twin in (TorchSeq2Seq, TorchTransformer)}
    for klass in type(model).__mro__:
        if klass.__module__.startswith("tinygrad_attn.models") and klass.__name__ in twins:
            return twins[klass.__name__]
    raise TypeError(f"to_torch: exports a ta.models.Seq2Seq or ta.models.Transformer, not a "
                    f"{type(model).__name__}")


def engine_state(module: nn.Module) -> dict[str, np.ndarray]:
    """A twin's parameters as the engine's state_dict: names -> numpy arrays (a tied output
    weight once, under ``tgt_embed.weight``, as the engine keeps it)."""
    return {name: p.detach().cpu().numpy().copy() for name, p in _unwrapped(module).named_parameters()}


def from_torch(module: nn.Module, cls: type):
    """The engine model of a twin (or of a DistributedDataParallel around one): a ``cls``
    built from the twin's config, with its weights, dtype (float32 or float64) and train/eval
    mode.  ``Seq2Seq.from_torch(module)`` and ``Transformer.from_torch(module)`` call it.
    """
    module = _unwrapped(module)
    if not isinstance(module, TorchSeq2Seq | TorchTransformer):
        raise TypeError(f"{cls.__name__}.from_torch: takes a module made by to_torch (TorchSeq2Seq or "
                        f"TorchTransformer), not a {type(module).__name__}; for another torch module, build "
                        f"the engine model with the same config and load_state_dict its state_dict")
    if module.engine_class != cls.__name__:
        raise TypeError(f"{cls.__name__}.from_torch: the module is the twin of a {module.engine_class}")
    dtype = next(module.parameters()).dtype
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{cls.__name__}.from_torch: the engine keeps float32 or float64 parameters, the "
                        f"module's are {dtype}")
    model = cls(**module.config)
    model.astype(np.float64 if dtype == torch.float64 else np.float32)
    model.load_state_dict(engine_state(module))
    return model.train(module.training)


def _unwrapped(module: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel (or DataParallel)."""
    wrapped = isinstance(module, nn.parallel.DistributedDataParallel | nn.DataParallel)
    return module.module if wrapped else module


# ---------------------------------------------------------------- training and decoding


def cross_entropy(logits: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits (B, T, V) against ``tgt_out`` (B, T), ``<pad>`` ignored."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=PAD)


@torch.no_grad()
def greedy(module: nn.Module, src, max_len: int = 50) -> np.ndarray:
    """Greedy decoding with a twin, laid out as the engine's ``greedy`` ids: (B, L) int64, each
    row up to and including ``<end>``, then 0; ``<pad>`` and ``<start>`` never produced.

    A Seq2Seq steps its decoder (the states carried); a Transformer re-runs the decoder on the
    whole prefix every step (no cache: this is for checking, not speed).
    """
    module = _unwrapped(module)
    src = torch.as_tensor(np.asarray(src) if not isinstance(src, torch.Tensor) else src, dtype=torch.long)
    src = src.to(next(module.parameters()).device)
    was_training = module.training
    module.eval()
    try:
        memory = module.encode(src)
        if isinstance(module, TorchSeq2Seq):
            states = memory.states

            def next_logits(y):
                nonlocal states
                logits, states = module.decode_step(y, states, memory)
                return logits                                                    # (B, V)
        else:
            prefix = src.new_empty((src.shape[0], 0))

            def next_logits(y):
                nonlocal prefix
                prefix = torch.cat([prefix, y[:, None]], dim=1)                  # (B, t + 1)
                return module.out(module.decode(prefix, memory, src)[:, -1])      # (B, V)

        y = torch.full((src.shape[0],), START, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        ids = []
        for _ in range(max_len):
            logits = next_logits(y)
            logits[:, [PAD, START]] = -math.inf
            y = torch.where(done, torch.full_like(y, PAD), logits.argmax(-1))
            ids.append(y)
            done |= y == END
            if bool(done.all()):
                break
        return torch.stack(ids, 1).cpu().numpy()
    finally:
        module.train(was_training)
