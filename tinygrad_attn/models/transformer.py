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
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from .. import functional as F
from .. import nn, scopes
from ..arguments import check_flag, check_int
from ..attention import record as attention_record
from ..autograd import ShapeError, no_grad, outside_capture, scope
from ..nn.transformer import DecoderCache, check_layer_arguments
from ..tensor import Tensor
from . import decoding
from .seq2seq import PAD, START, batch_ids, ids_array, vocab_size
from .twin import TorchTwin

__all__ = ["sinusoids"]

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


class Transformer(TorchTwin, nn.Module):
    """Embeddings with positions, ``nn.Transformer`` and an output layer.

    Args:
        src_vocab: the source vocabulary's size (an int or a ``ta.data.Vocab``).
        tgt_vocab: the target vocabulary's size (an int or a ``ta.data.Vocab``).
        d_model: as ``nn.Transformer``.
        nhead: as ``nn.Transformer``.
        num_encoder_layers: as ``nn.Transformer``; 0 leaves the encoder's final LayerNorm alone.
        num_decoder_layers: as ``nn.Transformer``; with 0 the output does not read the source,
            and the model has no attention to report (``attention_kind`` None, decoding's
            attention None).
        dim_feedforward: as ``nn.Transformer``.
        dropout: as ``nn.Transformer``.
        activation: as ``nn.Transformer``.
        norm_first: as ``nn.Transformer``.
        positions: "sinusoidal" (fixed) or "learned" (an embedding per position).
        max_len: the longest sequence the position table covers: a source of at most
            ``max_len`` tokens (``max_src_len``), a target of at most ``max_len`` positions
            (``max_tgt_len``: teacher forcing's ``tgt_in``, and every decode stops after
            min(its max_len, this) tokens).
        tie_embeddings: the output layer's weight is the target embedding (Press and Wolf
            2017; the paper shares it too).

    Every argument is checked before anything is built (a one-line error naming it).

    Example:
        >>> model = ta.models.Transformer(40, 40, d_model=64, nhead=4, num_encoder_layers=2,
        ...                               num_decoder_layers=2, dim_feedforward=128)
        >>> logits, _ = model(src, tgt_in)                 # (B, T, 40)
        >>> ids, _ = model.greedy(src, max_len=12)         # cached keys and values
    """

    # What code that handles any model reads to know it has attention (Seq2Seq: its score).
    attention_kind = "multi_head"

    def __init__(self, src_vocab, tgt_vocab, d_model: int = 128, nhead: int = 4, num_encoder_layers: int = 2,
                 num_decoder_layers: int = 2, dim_feedforward: int = 512, dropout: float = 0.1,
                 activation: str = "relu", norm_first: bool = False, positions: str = "sinusoidal",
                 max_len: int = 512, tie_embeddings: bool = False):
        super().__init__()
        where = "Transformer"
        src_size = vocab_size(src_vocab, "src_vocab", where)
        tgt_size = vocab_size(tgt_vocab, "tgt_vocab", where)
        check_layer_arguments(where, d_model, nhead, dim_feedforward, dropout, activation,
                              norm_first=norm_first)
        check_int(num_encoder_layers, "num_encoder_layers", where, 0)
        check_int(num_decoder_layers, "num_decoder_layers", where, 0)
        if not isinstance(positions, str) or positions not in POSITIONS:
            raise ValueError(f"{where}: positions must be one of {POSITIONS}, got {positions!r}")
        check_int(max_len, "max_len", where, 1)
        check_flag(tie_embeddings, "tie_embeddings", where)
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
        if not num_decoder_layers:
            self.attention_kind = None          # no cross-attention: nothing attends to the source

    @property
    def max_src_len(self) -> int:
        """The longest source, in tokens, the model encodes: its position table's length
        (``max_len``); decoding refuses a longer source before any work (Seq2Seq: None)."""
        return self.max_len

    @property
    def max_tgt_len(self) -> int:
        """The most target positions the decoder reads: ``tgt_in``'s longest, and the most
        tokens a decode produces (``<end>`` included), whatever its ``max_len`` asks."""
        return self.max_len

    def extra_repr(self) -> str:
        c = self.config
        return (f"d_model={c['d_model']}, nhead={c['nhead']}, layers={c['num_encoder_layers']}+"
                f"{c['num_decoder_layers']}, positions={c['positions']!r}")

    # ------------------------------------------------------------ pieces

    def _embed(self, table: nn.Embedding, ids: np.ndarray | Tensor, start: int = 0,
               positions: Tensor | None = None) -> Tensor:
        """embed(ids) sqrt(d_model) + the positions start .. start + L - 1, dropped out.
        ``positions`` replaces the table's rows (the ONNX export passes rows it reads itself)."""
        length = ids.shape[1]
        if positions is None and start + length > self.max_len:
            raise ShapeError(f"Transformer: a sequence of {start + length} tokens is longer than the "
                             f"position table (max_len={self.max_len}); build the model with a larger "
                             f"max_len")
        x = table(ids) * math.sqrt(self.d_model)
        if positions is not None:
            x = x + positions
        elif self.config["positions"] == "learned":
            x = x + self.position(np.arange(start, start + length)[None, :])
        else:
            x = x + self._table(x)[start:start + length]
        return self.drop(x)

    def encode(self, src: np.ndarray | Tensor) -> Tensor:
        with scope(scopes.ENCODER):
            return self.transformer.encoder(self._embed(self.src_embed, src), key_mask=src != PAD)

    # ------------------------------------------------------------ training

    def forward(self, src, tgt_in, need_weights: bool = False):
        """Teacher forcing: ``src`` (B, S) and ``tgt_in`` (B, T) int arrays padded with 0 ->
        (logits (B, T, V), None), or with ``need_weights`` (logits, the attention of every
        layer and head).

        The weights come from the fast path: every sublayer still runs the fused attention
        node, which never builds the weights in the graph; ``ta.attention.record`` rebuilds
        them from the node's saved log-sum-exp (one product and one exp per call).  They are
        a ``ta.attention.Record`` of numpy arrays, (B, H, T_q, T_k) per head:

            weights["encoder/layer0/self_attention"]     (B, H, S, S)
            weights["decoder/layer1/self_attention"]     (B, H, T, T)   causal
            weights["decoder/layer1/cross_attention"]    (B, H, T, S)
        """
        src = batch_ids(src, "src", "Transformer", self.out.weight.device, empty=True)
        tgt_in = batch_ids(tgt_in, "tgt_in", "Transformer", self.out.weight.device)
        if tgt_in.shape[0] != src.shape[0]:
            raise ShapeError(f"Transformer: src {src.shape} and tgt_in {tgt_in.shape} differ in batch size")
        with attention_record() if need_weights else nullcontext() as weights:
            memory = self.encode(src)
            with scope(scopes.DECODER):
                h = self.transformer.decoder(self._embed(self.tgt_embed, tgt_in), memory,
                                             key_mask=tgt_in != PAD, memory_key_mask=src != PAD, causal=True)
                logits = self.out(h)
        return logits, weights

    def layer_attention(self, weights, sublayer: str = scopes.CROSS_ATTENTION) -> np.ndarray:
        """One sublayer's weights from every layer, stacked: (layers, B, H, T_q, T_k), from
        what ``forward(..., need_weights=True)`` returned.  ``sublayer``: "cross_attention",
        "self_attention" (the decoder's) or "encoder/self_attention"."""
        side, _, name = sublayer.rpartition("/")
        side = side or scopes.DECODER
        stack = self.transformer.encoder if side == scopes.ENCODER else self.transformer.decoder
        if not len(stack.layers):
            raise ValueError(f"Transformer.layer_attention: the {side} has 0 layers, so no {sublayer} "
                             f"weights")
        return np.stack([weights[_key(side, scopes.layer(i), name)] for i in range(len(stack.layers))])

    def loss(self, src, tgt_in, tgt_out, label_smoothing: float = 0.0) -> Tensor:
        """Mean cross-entropy of the teacher-forced logits against ``tgt_out``, padding ignored."""
        logits, _ = self(src, tgt_in)
        target = batch_ids(tgt_out, "tgt_out", "Transformer", self.out.weight.device)
        return F.cross_entropy(logits, target, ignore_index=PAD, label_smoothing=label_smoothing)

    # ------------------------------------------------------------ decoding

    def greedy(self, src, max_len: decoding.MaxLen = 50, min_length: int = 0, no_repeat_ngram_size: int = 0,
               hypotheses: bool = False, use_cache: bool = True, compile: bool = False):  # noqa: A002
        """The most likely token at every step (``Seq2Seq.greedy``'s options and returns).

        ``max_len`` (an int, or one per row) is capped by the position table: a row stops
        after min(max_len, ``self.max_len``) tokens.  A source longer than the table is
        refused (ShapeError) before any work; an empty source decodes as a row of padding.

        With ``use_cache`` each decoder layer keeps the keys and values of the tokens so far
        (and of the memory, computed once), so a step costs one token's work; without, every
        step re-runs the decoder on the whole prefix.  The two agree to rounding.  With
        ``compile`` (and the cache) every step replays one ``ta.compile`` plan, the position
        an input, captured once per batch size and source width: the same ids, attention and
        scores as without, bit for bit.

        Returns:
            (ids (B, L) int64, each row up to and including ``<end>`` then 0; attention
            (B, L, S): the last decoder layer's cross-attention, averaged over heads, zeros
            after ``<end>``; None with 0 decoder layers).  For every layer and head, run
            ``model(src, tgt_in, need_weights=True)`` on the output, or ``beam_search(...,
            n_best=k, average_weights=False)``.
        """
        return decoding.greedy(self, ids_array(src, "src", "Transformer", empty=True), max_len, min_length,
                               no_repeat_ngram_size, hypotheses, use_cache=use_cache, compile=compile)

    def sample(self, src, max_len: decoding.MaxLen = 50, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, seed=None, min_length: int = 0, no_repeat_ngram_size: int = 0,
               hypotheses: bool = False, use_cache: bool = True, compile: bool = False):  # noqa: A002
        """Draw every output token from the model's distribution (``ta.models.decoding.sample``);
        ``max_len``, sources and ``compile`` as ``greedy``'s; returns what ``greedy`` returns."""
        src = ids_array(src, "src", "Transformer", empty=True)
        return decoding.sample(self, src, max_len, temperature, top_k,
                               top_p, seed, min_length, no_repeat_ngram_size, hypotheses, use_cache=use_cache,
                               compile=compile)

    def beam_search(self, src, beam: int = 5, max_len: decoding.MaxLen = 50, length_penalty: float = 1.0,
                    coverage_penalty: float = 0.0, min_length: int = 0, no_repeat_ngram_size: int = 0,
                    n_best: int | None = None, use_cache: bool = True, average_weights: bool = True,
                    compile: bool = False):  # noqa: A002
        """Batched beam search as ``Seq2Seq.beam_search`` (``ta.models.decoding.beam_search``);
        the coverage penalty reads the attention ``greedy`` returns.

        With the cache the decode keeps B * beam rows at every step, whatever the number of
        live hypotheses (a finished one's row is carried as padding, its output dropped), and
        picks the survivors with a row gather on the device, the rows an index Tensor; so with
        ``compile`` one plan serves every step, and ids, scores, n-best and attention are
        eager's, bit for bit.

        With ``n_best`` and ``average_weights=False``, each hypothesis' attention is every
        decoder layer's cross-attention, every head: (layers, H, len(tokens), S), what
        ``layer_attention`` gives for the hypothesis teacher-forced (computed so, once, for
        the returned hypotheses only: the search itself reads the averaged last layer).
        ``max_len`` and sources as ``greedy``'s.  With 0 decoder layers there is no attention
        (None), and ``coverage_penalty`` is refused.

        Returns:
            (ids (B, L) int64, attention (B, L, S)), laid out as ``greedy``'s; with ``n_best``,
            per source a list of ``ta.models.Hypothesis``, best first.
        """
        src = ids_array(src, "src", "Transformer", empty=True)
        if coverage_penalty and self.attention_kind is None:
            raise ValueError("beam_search: coverage_penalty needs a model with attention; this Transformer "
                             "has 0 decoder layers")
        if not average_weights and n_best is None:
            raise ValueError("beam_search: average_weights=False gives each hypothesis every layer and "
                             "head, so it needs n_best")
        found = decoding.beam_search(self, src, beam, max_len, length_penalty, coverage_penalty, min_length,
                                     no_repeat_ngram_size, n_best, use_cache=use_cache, compile=compile)
        if not average_weights and self.attention_kind is not None:
            self._every_head(src, found)
        return found

    def _every_head(self, src: np.ndarray, found: list) -> None:
        """Replace each hypothesis' attention by every layer's and head's cross-attention, from
        one teacher-forced pass over all of them."""
        hypotheses = [(b, h) for b, nbest in enumerate(found) for h in nbest]
        if not hypotheses:
            return
        length = max(len(h.tokens) for _, h in hypotheses)
        tgt_in = np.zeros((len(hypotheses), length), dtype=np.int64)                # (N, T)
        tgt_in[:, 0] = START
        for row, (_, h) in enumerate(hypotheses):
            tgt_in[row, 1 : len(h.tokens)] = h.tokens[:-1]
        sources = src[[b for b, _ in hypotheses]]                                  # (N, S)
        with decoding.inference(self):
            _, weights = self(sources, tgt_in, need_weights=True)
        grid = self.layer_attention(weights)                                        # (layers, N, H, T, S)
        for row, (_, h) in enumerate(hypotheses):
            h.attention = grid[:, row, :, : len(h.tokens)]                         # (layers, H, |Y|, S)

    def decode_start(self, src: np.ndarray, use_cache: bool = True, compile: bool = False,  # noqa: A002
                     max_steps: int | None = None, max_rows: int | None = None) -> _State:
        """``ta.models.decoding``'s protocol: the state of a decode of ``src`` (B, S).

        With ``use_cache`` every decoder layer keeps a ``nn.transformer.DecoderCache``: the
        memory's keys and values, projected once, and its self-attention's keys and values
        preallocated to ``max_steps`` positions (default and at most the position table's
        length), each step writing its token's at its position; without, every step re-runs
        the decoder on the prefix.  ``compile``: each step replays one ``ta.compile`` plan (the
        embedding of the token and its position, the layers' steps and the output layer),
        the position an input, so the same plan serves every step of every decode of the same
        batch size and source width; its results are the eager step's, bit for bit.  The
        encoder replays a plan of its own (one per batch size and source width), also bit
        for bit the eager encoder's.

        ``max_rows`` (beam search: B * beam): with the cache, the state keeps that many rows
        from the start, whatever ``decode_select`` keeps (rows past the live ones are padding,
        copies of row 0, whose outputs are dropped), so every step has one shape."""
        if compile and not use_cache:
            raise ValueError("Transformer.decode_start: compile=True decodes with the cache (use_cache=True)")
        mask = src != PAD
        layers = self.transformer.decoder.layers
        if compile:         # the start replays its own plan: one per batch size and source width
            start = decoding.compiled_step(self, "_decode_memory", decoding._COMPILED_ENCODERS)
            memory, *projected = start(Tensor(src, device=self.out.weight.device))
        elif use_cache:
            memory, *projected = self._decode_memory(src)
        else:
            memory = self.encode(src)
        length = self.max_len if max_steps is None else max(1, min(int(max_steps), self.max_len))
        caches = [layer.start_cache(memory, length, *projected[2 * i: 2 * i + 2])
                  for i, layer in enumerate(layers)] if use_cache else []
        step = decoding.compiled_step(self, "_step") if compile else self._step
        batch = src.shape[0]
        state = _State(memory, mask, self._step_mask(mask, memory.device), caches,
                       np.full((batch, 0), START, dtype=np.int64), use_cache, np.arange(batch), step)
        if use_cache and max_rows is not None and int(max_rows) > batch:
            state = self.decode_select(state, np.arange(batch), capacity=int(max_rows))
        return state

    def _decode_memory(self, src) -> tuple:
        """What a cached decode computes once from ``src`` (B, S): the encoder's memory, then
        each decoder layer's cross-attention keys and values of it, (B, H, S, D) each:
        (memory, keys_0, values_0, keys_1, ...).  Compiled, the whole start is one plan (run
        eagerly, the projections were 24 dispatched ops a decode at two layers)."""
        memory = self.encode(src)
        projected = [x for layer in self.transformer.decoder.layers
                     for x in layer.multihead_attn.project_memory(memory)]
        return (memory, *projected)

    def decode_step(self, state: _State, tokens: np.ndarray, t: int):
        """One step from the previous ids (N,): (the model's log-probabilities (N, V) float64,
        the last decoder layer's cross-attention averaged over heads (N, S), the next state)."""
        device = state.memory.device
        count = len(tokens)
        if state.use_cache:
            flat = [x for cache in state.caches for x in cache.tensors()]
            position = Tensor(np.array(t, dtype=np.int64), device=device)
            if state.capacity is not None and state.capacity > count:      # the padding rows' token
                tokens = np.concatenate([tokens, np.full(state.capacity - count, PAD, dtype=np.int64)])
            # The preallocated caches keep no graph; what comes back is arrays: no graph to keep.
            with scope(scopes.DECODER), no_grad():
                ids = Tensor(tokens[:, None], device=device)
                logits, weights = state.step(ids, position, state.step_mask, *flat)
        else:
            prefix = np.concatenate([state.prefix, tokens[:, None]], axis=1)          # (N, t + 1)
            state = replace(state, prefix=prefix)
            # Only the last layer's cross-attention: the other calls rebuild no weights.  With no
            # decoder layer nothing attends to the source, and nothing is recorded.
            last = len(self.transformer.decoder.layers) - 1
            key = _key(scopes.DECODER, scopes.step(t), scopes.layer(last), scopes.CROSS_ATTENTION)
            recording = attention_record(only=[key]) if last >= 0 else nullcontext()
            with scope(scopes.DECODER), scope(scopes.step(t)), recording as record:
                h = self.transformer.decoder(self._embed(self.tgt_embed, state.prefix), state.memory,
                                             memory_key_mask=state.memory_mask, causal=True)[:, -1:]
                logits = self.out(h)
            weights = None if record is None else record[key]
        log_probs = decoding.log_softmax(logits.numpy()[:count, 0])                     # (N, V)
        if weights is not None and not isinstance(weights, np.ndarray):
            weights = weights.numpy()
        attention = None
        if weights is not None:        # the heads' mean: np.mean's sum and division, its bits in float32/64
            attention = np.add.reduce(weights[:count, :, -1], axis=1) / weights.shape[1]      # (N, S)
        return log_probs, attention, state

    def decode_select(self, state: _State, rows: np.ndarray, capacity: int | None = None) -> _State:
        """The rows ``rows`` of a state, gathered on the device (``decoding.take_rows``).  A state of
        fixed capacity (``decode_start``'s ``max_rows``) stays that many rows: the index is
        ``rows`` followed by 0s, so the padding rows copy row 0 (finite values, never read)."""
        device = state.memory.device
        capacity, index, picks = decoding.select_rows(state.capacity, capacity, rows, len(state.source),
                                                      device)

        def take(x):
            return None if x is None else decoding.take_rows(x, picks)

        source = state.source[index]
        # The memory and its projected keys and values depend on the source only: copied only
        # when the rows' sources change (the first step's fan-out, a finished source leaving).
        same = np.array_equal(source, state.source)
        caches = [replace(cache, keys=take(cache.keys), values=take(cache.values),
                          **({} if same else {"memory_keys": take(cache.memory_keys),
                                              "memory_values": take(cache.memory_values)}))
                  for cache in state.caches]
        if same:
            memory, mask, step_mask = state.memory, state.memory_mask, state.step_mask
        else:
            # The mask lives on the host too: the device copy is made from it, not gathered.
            mask = state.memory_mask[index]
            memory, step_mask = take(state.memory), self._step_mask(mask, device)
        return _State(memory, mask, step_mask, caches, state.prefix[rows], state.use_cache, source,
                      state.step, capacity)

    def _step_mask(self, mask: np.ndarray, device) -> Tensor:
        """The source mask (N, S) as every cross-attention of a cached step reads it, laid out
        (N, H, 1, S) once per decode: the attention kernel takes it as it is, where a
        (N, 1, 1, S) mask would be broadcast into a copy by every layer at every step."""
        layers = self.transformer.decoder.layers
        heads = layers[0].multihead_attn.num_heads if len(layers) else 1
        shape = (mask.shape[0], heads, 1, mask.shape[1])
        return Tensor(np.ascontiguousarray(np.broadcast_to(mask[:, None, None, :], shape)), device=device)

    def decoder_step(self, tokens, caches: list, memory_mask=None, position: Tensor | None = None,
                     positions: Tensor | None = None, need_weights: bool = False):
        """The decoder at one position from its input token alone, reading and extending
        every layer's ``DecoderCache`` (``TransformerDecoderLayer.step``): tokens (N, 1) ->
        (the decoder's output (N, 1, d_model), the last layer's cross-attention weights
        (N, H, 1, S) with ``need_weights``, else None).

        ``position``: the token's position, a 0-d int64 Tensor (preallocated caches); or, for
        growing caches, ``positions`` (1, d_model), the position table's row (the ONNX export
        passes the row it reads itself).  ``memory_mask`` (N, 1, 1, S): True at real source
        tokens."""
        x = self.tgt_embed(tokens) * math.sqrt(self.d_model)
        x = self.drop(x + (self._position_row(position, x) if positions is None else positions))
        decoder, weights = self.transformer.decoder, None
        last = len(decoder.layers) - 1
        for i, (layer, cache) in enumerate(zip(decoder.layers, caches, strict=True)):
            with scope(scopes.layer(i)):
                x, weights = layer.step(x, cache, memory_mask, position, need_weights and i == last)
        return (x if decoder.norm is None else decoder.norm(x)), weights

    def _step(self, tokens: Tensor, position: Tensor, memory_mask: Tensor, *flat: Tensor):
        """A cached decode's step as a function of tensors alone (what ``compile`` captures):
        (logits (N, 1, V), the last layer's cross-attention (N, H, 1, S) or None)."""
        size = len(DecoderCache.tensor_names())
        # The caches are preallocated (the step has a position): their length is the keys'.
        caches = [DecoderCache.from_tensors(flat[k:k + size], slots=flat[k].shape[2])
                  for k in range(0, len(flat), size)]
        h, weights = self.decoder_step(tokens, caches, memory_mask, position, need_weights=True)
        return self.out(h), weights

    def _position_row(self, position: Tensor, like: Tensor) -> Tensor:
        """The position table's row at ``position`` (0-d int64 Tensor), (1, 1, d_model): a
        gather with the position as its index, so no host slice freezes it into a plan."""
        index = position.reshape(1, 1)
        if self.config["positions"] == "learned":
            return self.position(index)
        # The row read by the device's gather directly: ``decode_start`` keeps the position
        # within the table, so no per-step range check waits on the device.
        return decoding.take_rows(self._table(like), index.reshape(1)).reshape(1, 1, self.d_model)

    def _table(self, like: Tensor) -> Tensor:
        """The sinusoid table as a Tensor of ``like``'s dtype and device, made once."""
        tables = _TABLES.setdefault(self, {})
        key = (like.dtype, like.device)
        if key not in tables:
            # Made unrecorded: a capture binds the table kept here, where a recorded copy
            # would be made again at every replay.
            with outside_capture():
                tables[key] = Tensor(self._sinusoids, dtype=like.dtype, device=like.device)
        return tables[key]

# Per model: the sinusoid table as a Tensor, per (dtype, device) (a constant a plan reads).
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _key(*scope_names: str) -> str:
    """The key ``ta.attention.record`` files a call under: its scope path."""
    return "/".join(scope_names)


@dataclass
class _State:
    """A decode of N rows before step t: the memory (N, S, E) and its mask, each decoder
    layer's ``DecoderCache``, the ids fed so far (N, t), ``<start>`` first (without the cache
    only: the cached step reads its caches, (N, 0) here), and the step function (the model's,
    or its compiled plan)."""

    memory: Tensor
    memory_mask: np.ndarray
    step_mask: Tensor           # memory_mask as the cached step reads it, (N, H, 1, S) on the device
    caches: list
    prefix: np.ndarray
    use_cache: bool
    source: np.ndarray          # (N,) which source each row decodes
    step: object = None
    capacity: int | None = None  # rows the device tensors keep (None: exactly the live rows)
