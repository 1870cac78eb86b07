"""An RNN encoder-decoder with attention, trained with teacher forcing, decoded greedily or
with beam search.

The picture of the lecture notes (seed 004), one decoder step i:

    encoder   h_1 .. h_S = RNN(embed(x_1 .. x_S))              the keys and values
    scores    e_ij = score(query, h_j)                         dot | general | concat | additive
    weights   a_ij = softmax_j(e_ij)   (padding masked out)    returned for inspection
    context   c_i  = sum_j a_ij h_j

and two ways to wire it, ``style``:

- ``"bahdanau"`` (Bahdanau et al. 2015): the query is the *previous* decoder state s_{i-1};
  the context enters the cell with the input, s_i = cell([embed(y_{i-1}); c_i], s_{i-1}), and
  the output layer reads [s_i; c_i].  (The paper's output layer is a maxout over s_{i-1},
  y_{i-1} and c_i; a linear readout of [s_i; c_i] is the common simplification.)
- ``"luong"`` (Luong et al. 2015, global attention): the query is the *current* state h_i
  of a decoder that never sees the context; the attentional vector a_i = tanh(W_c [c_i; h_i])
  feeds the output layer.  This is the paper's base model, without its "input feeding"
  (a_{i-1} as extra input): so with teacher forcing every step's state is known before any
  attention, and one attention call scores all T steps at once.

With ``attention=None`` the decoder sees only the encoder's final state: the fixed-size
bottleneck that attention removes (``examples/bottleneck.py`` measures it).

Node scopes follow the notes' diagram: ``encoder/t3`` (``encoder/t3/reverse`` for the second
direction), ``decoder/t2``, ``decoder/t2/attention`` (Luong training: ``decoder/attention``,
one call for every step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import nn, scopes
from ..arguments import check_flag, check_int, check_number
from ..autograd import ShapeError, scope
from ..functional import cross_entropy
from ..tensor import Tensor, cat
from . import decoding
from .twin import TorchTwin

__all__ = ["Memory", "ATTENTIONS", "CELLS", "STYLES"]

PAD, START, END = 0, 1, 2

CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}
ATTENTIONS = ("dot", "general", "concat", "additive", None)
STYLES = ("bahdanau", "luong")


@dataclass
class Memory:
    """What the decoder reads from the encoder, computed once per source batch
    (``Seq2Seq.encode`` returns it)."""

    keys: Tensor | None          # (B, S, K) encoder outputs h_j (also the values)
    keys_proj: Tensor | None     # (B, S, d_a) W_k h_j for additive and concat scores
    mask: np.ndarray | Tensor    # (B, S) True at real tokens (a Tensor for Tensor ids)
    key_mask: Tensor             # (B, 1, S) the same, as the attention calls take it
    states: list                 # the decoder's initial state (B, 1, H), one per layer


class Seq2Seq(TorchTwin, nn.Module):
    """Embedding, RNN encoder, RNN decoder, optional attention and an output layer.

    Args:
        src_vocab: the source vocabulary's size (an int, or a ``ta.data.Vocab``); id 0 is
            ``<pad>``, 1 ``<start>``, 2 ``<end>``, as in ``ta.data``.
        tgt_vocab: the target vocabulary's size, likewise.
        embed: embedding size E.
        hidden: state size H of encoder and decoder.
        cell: "rnn" | "gru" | "lstm".
        attention: "dot" | "general" | "concat" | "additive" | None.
        style: "bahdanau" or "luong" (see the module docstring).
        num_layers: stacked layers in encoder and decoder.
        dropout: on embeddings, between layers and before the output layer, in training.
        bidirectional: a bidirectional encoder (outputs 2H); its final states are joined by a
            learned bridge s_0 = tanh(W [h_fwd; h_bwd] + b) (Bahdanau et al. initialise from
            the backward state alone).
        attn_dim: size of the additive/concat scoring layer (default H).

    Example:
        >>> model = ta.models.Seq2Seq(40, 40, embed=32, hidden=64, attention="additive")
        >>> logits, weights = model(src, tgt_in)          # (B, T, 40), (B, T, S)
        >>> ids, weights = model.greedy(src, max_len=12)
    """

    def __init__(self, src_vocab, tgt_vocab, embed: int = 64, hidden: int = 128, cell: str = "gru",
                 attention: str | None = "additive", style: str = "bahdanau", num_layers: int = 1,
                 dropout: float = 0.0, bidirectional: bool = False, attn_dim: int | None = None):
        super().__init__()
        where = "Seq2Seq"
        src_size = vocab_size(src_vocab, "src_vocab", where)
        tgt_size = vocab_size(tgt_vocab, "tgt_vocab", where)
        check_int(embed, "embed", where, 1)
        check_int(hidden, "hidden", where, 1)
        check_int(num_layers, "num_layers", where, 1)
        check_number(dropout, "dropout", where, low=0.0, high=1.0, high_open=True)
        check_flag(bidirectional, "bidirectional", where)
        if attn_dim is not None:
            check_int(attn_dim, "attn_dim", where, 1)
        if not isinstance(cell, str) or cell not in CELLS:
            raise ValueError(f"Seq2Seq: cell must be one of {sorted(CELLS)}, got {cell!r}")
        if attention is not None and (not isinstance(attention, str) or attention not in ATTENTIONS):
            raise ValueError(f"Seq2Seq: attention must be one of {list(ATTENTIONS)}, got {attention!r}")
        if not isinstance(style, str) or style not in STYLES:
            raise ValueError(f"Seq2Seq: style must be one of {list(STYLES)}, got {style!r}")
        key_size = hidden * (2 if bidirectional else 1)
        if attention == "dot" and key_size != hidden:
            raise ValueError(f"Seq2Seq: attention='dot' needs decoder states and encoder outputs "
                             f"of one size, but a bidirectional encoder gives {key_size} against "
                             f"{hidden}; use 'general', or bidirectional=False")
        attn_dim = hidden if attn_dim is None else attn_dim
        self.config = dict(src_vocab=src_size, tgt_vocab=tgt_size, embed=embed, hidden=hidden,
                           cell=cell, attention=attention, style=style, num_layers=num_layers,
                           dropout=float(dropout), bidirectional=bidirectional, attn_dim=attn_dim)
        self.cell, self.attention_kind, self.style = cell, attention, style
        self.hidden, self.num_layers = hidden, num_layers

        self.src_embed = nn.Embedding(src_size, embed, padding_idx=PAD)
        self.tgt_embed = nn.Embedding(tgt_size, embed, padding_idx=PAD)
        self.drop = nn.Dropout(dropout)
        rnn = CELLS[cell]
        self.encoder = rnn(embed, hidden, num_layers=num_layers, dropout=dropout,
                           bidirectional=bidirectional)
        if bidirectional:
            self.bridge = nn.Linear(2 * hidden, hidden)
            if cell == "lstm":
                self.bridge_c = nn.Linear(2 * hidden, hidden)
        feeds_context = attention is not None and style == "bahdanau"
        self.decoder = rnn(embed + (key_size if feeds_context else 0), hidden, num_layers=num_layers,
                           dropout=dropout)
        if attention == "dot":
            self.attention = nn.DotAttention()
        elif attention == "general":
            self.attention = nn.GeneralAttention(hidden, key_size)
        elif attention == "concat":
            self.attention = nn.ConcatAttention(hidden, key_size, attn_dim)
        elif attention == "additive":
            self.attention = nn.AdditiveAttention(hidden, key_size, attn_dim)
        if attention is not None and style == "luong":
            self.attention_vector = nn.LuongAttentionVector(key_size, hidden)
            readout = hidden
        elif feeds_context:
            readout = hidden + key_size
        else:
            readout = hidden
        self.out = nn.Linear(readout, tgt_size)

    # An RNN reads a source of any length, and decodes as long as asked (``ta.models.decoding``).
    max_src_len = None
    max_tgt_len = None

    def extra_repr(self) -> str:
        c = self.config
        return (f"cell={c['cell']!r}, attention={c['attention']!r}, style={c['style']!r}, "
                f"embed={c['embed']}, hidden={c['hidden']}")

    # ------------------------------------------------------------ training

    def forward(self, src, tgt_in):
        """Teacher forcing: decode ``tgt_in`` (``<start>`` then the target, padded with 0).

        Args:
            src: int array (B, S), padded with 0.
            tgt_in: int array (B, T).

        Returns:
            (logits (B, T, V), weights (B, T, S) or None without attention), Tensors.
        """
        src = batch_ids(src, "src", "Seq2Seq", self.out.weight.device, empty=True)
        tgt_in = batch_ids(tgt_in, "tgt_in", "Seq2Seq", self.out.weight.device)
        if tgt_in.shape[0] != src.shape[0]:
            raise ShapeError(f"Seq2Seq: src {src.shape} and tgt_in {tgt_in.shape} differ in batch size")
        memory = self.encode(src)
        if self.attention_kind is not None and self.style == "luong":
            return self._luong_teacher_forced(tgt_in, memory)
        states, tops, contexts, weights = memory.states, [], [], []
        for t in range(tgt_in.shape[1]):
            with scope(scopes.DECODER), scope(scopes.step(t)):
                top, context, weight, states = self._step(tgt_in[:, t : t + 1], states, memory)
            tops.append(top)
            contexts.append(context)
            weights.append(weight)
        with scope(scopes.DECODER):
            # The output layer runs once on every step's features, not once per step.
            tops = cat(tops, axis=1)                                             # (B, T, H)
            if self.attention_kind is None:
                return self.out(self.drop(tops)), None                           # (B, T, V)
            features = self._readout(tops, cat(contexts, axis=1))                # (B, T, H + K)
            return self.out(self.drop(features)), cat(weights, axis=1)           # (B, T, V), (B, T, S)

    def loss(self, src, tgt_in, tgt_out, label_smoothing: float = 0.0) -> Tensor:
        """Mean cross-entropy of the teacher-forced logits against ``tgt_out`` (the target
        then ``<end>``), ignoring padding; ``label_smoothing`` eps spreads eps of each target's
        probability evenly over the vocabulary (``F.cross_entropy``'s, torch's definition)."""
        logits, _ = self(src, tgt_in)
        target = batch_ids(tgt_out, "tgt_out", "Seq2Seq", self.out.weight.device)
        return cross_entropy(logits, target, ignore_index=PAD, label_smoothing=label_smoothing)

    def _luong_teacher_forced(self, tgt_in: np.ndarray | Tensor, memory: Memory):
        with scope(scopes.DECODER):
            inputs = self.drop(self.tgt_embed(tgt_in))                           # (B, T, E)
            outputs, _ = self.decoder.unroll(inputs, memory.states)              # T x (B, 1, H)
            tops = cat(outputs, axis=1)                                          # (B, T, H)
            with scope(scopes.ATTENTION):
                context, weights = self._attend(tops, memory)                    # (B, T, K), (B, T, S)
                features = self._readout(tops, context)                          # (B, T, H)
            logits = self.out(self.drop(features))                               # (B, T, V)
        return logits, weights

    # ------------------------------------------------------------ the pieces

    def encode(self, src) -> Memory:
        """Run the encoder over ``src`` (B, S) and prepare what every decoder step reads.

        Every step works on (B, 1, features): one query per row in the layout of many
        queries, so attention needs no reshapes and the steps join with one ``cat``.  A
        source of width 0 is a batch of empty sources: what a row of only padding gives (the
        initial states), with keys of width 0.
        """
        src = batch_ids(src, "src", "Seq2Seq", self.out.weight.device, empty=True)
        if src.shape[1] == 0:
            # The RNN needs a step to run: one padding column leaves every state where it began.
            memory = self.encode(np.zeros((src.shape[0], 1), dtype=np.int64))
            keys, keys_proj = (None if x is None else x[:, :0] for x in (memory.keys, memory.keys_proj))
            return Memory(keys, keys_proj, memory.mask[:, :0], memory.key_mask[:, :, :0], memory.states)
        mask = src != PAD
        with scope(scopes.ENCODER):
            inputs = self.drop(self.src_embed(src))                              # (B, S, E)
            outputs, finals = self.encoder.unroll(inputs, mask=mask)             # S x (B, 1, K)
            keys = cat(outputs, axis=1) if self.attention_kind is not None else None   # (B, S, K)
            states = self._bridge(finals)
            keys_proj = None
            if self.attention_kind in ("additive", "concat"):
                keys_proj = self.attention.keys_projection(keys)                 # (B, S, d_a)
        if isinstance(mask, Tensor):
            key_mask = mask.reshape(mask.shape[0], 1, mask.shape[1])             # (B, 1, S)
        else:
            key_mask = Tensor(mask[:, None, :], device=self.out.weight.device)   # (B, 1, S)
        return Memory(keys, keys_proj, mask, key_mask, states)

    def _bridge(self, finals: list) -> list:
        """The encoder's final states (layer-major, directions inner) -> the decoder's."""
        if not self.encoder.bidirectional:
            return finals
        states = []
        for layer in range(self.num_layers):
            forward, backward = finals[2 * layer], finals[2 * layer + 1]
            if self.cell == "lstm":
                h = self.bridge(cat([forward[0], backward[0]], axis=-1)).tanh()
                c = self.bridge_c(cat([forward[1], backward[1]], axis=-1))
                states.append((h, c))
            else:
                states.append(self.bridge(cat([forward, backward], axis=-1)).tanh())   # (B, 1, H)
        return states

    def _attend(self, query: Tensor, memory: Memory):
        """Queries (B, T_q, H) -> (context (B, T_q, K), weights (B, T_q, S))."""
        if memory.keys_proj is not None:
            return self.attention(query, memory.keys, mask=memory.key_mask, keys_proj=memory.keys_proj)
        return self.attention(query, memory.keys, mask=memory.key_mask)

    def _readout(self, top: Tensor, context: Tensor) -> Tensor:
        """What the output layer reads: [s_i; c_i] (Bahdanau) or tanh(W_c [c_i; h_i]) (Luong)."""
        if self.style == "luong":
            return self.attention_vector(context, top)                           # (..., H)
        return cat([top, context], axis=-1)                                      # (..., H + K)

    def _top(self, states: list) -> Tensor:
        top = states[-1]
        return top[0] if self.cell == "lstm" else top

    def _step(self, y_prev: np.ndarray | Tensor, states: list, memory: Memory):
        """One decoder step from the previous token ids (B, 1): returns (the top state s_i
        (B, 1, H), the context c_i (B, 1, K) and weights (B, 1, S), or None without
        attention, and the new states)."""
        y = self.drop(self.tgt_embed(y_prev))                                     # (B, 1, E)
        if self.attention_kind is None:
            top, states = self.decoder.step(y, states)
            return top, None, None, states
        if self.style == "bahdanau":
            with scope(scopes.ATTENTION):
                context, weights = self._attend(self._top(states), memory)        # s_{i-1} scores
            top, states = self.decoder.step((y, context), states)   # [y; c] in, (B, 1, H) out
            return top, context, weights, states
        top, states = self.decoder.step(y, states)                               # (B, 1, H)
        with scope(scopes.ATTENTION):
            context, weights = self._attend(top, memory)                          # s_i scores
        return top, context, weights, states

    def _decode_tensors(self, tokens: Tensor, keys: Tensor | None, keys_proj: Tensor | None,
                        key_mask: Tensor, *flat: Tensor):
        """One decoding step as a function of tensors alone (what ``compile`` captures): the
        previous ids (N, 1), the memory's keys (N, S, K) and projected keys (N, S, d_a) (None
        where the model has none), its mask (N, 1, S), and the decoder's states flattened
        (``_flat``) -> (logits (N, 1, V), weights (N, 1, S) or None, *the new states
        flattened).  The output layer reads s_i (no attention), [s_i; c_i] (Bahdanau) or
        tanh(W_c [c_i; h_i]) (Luong)."""
        memory = Memory(keys, keys_proj, None, key_mask, [])
        top, context, weights, states = self._step(tokens, self._unflat(flat), memory)
        feature = top if context is None else self._readout(top, context)
        return (self.out(feature), weights, *_flat(states))

    def _unflat(self, flat) -> list:
        """``_flat``'s inverse: one state per layer, (h, c) pairs for an LSTM."""
        if self.cell == "lstm":
            return [(flat[k], flat[k + 1]) for k in range(0, len(flat), 2)]
        return list(flat)

    # ------------------------------------------------------------ decoding

    def decode_start(self, src: np.ndarray, compile: bool = False,  # noqa: A002
                     max_rows: int | None = None) -> _Decoding:
        """The decoding state of ``src`` (B, S): the memory and the decoder's states
        (``ta.models.decoding``'s protocol).

        ``compile``: each step replays one ``ta.compile`` plan of ``_decode_tensors`` (the
        embedding, attention, the cells and the output layer), captured once per row count and
        source width; its results are the eager step's, bit for bit.  ``max_rows`` (beam
        search: B * beam): the state keeps that many rows at every step, whatever
        ``decode_select`` keeps (rows past the live ones are padding, copies of row 0, whose
        outputs are dropped), so every step has one shape."""
        memory = self.encode(src)
        batch = src.shape[0]
        step = decoding.compiled_step(self, "_decode_tensors") if compile else self._decode_tensors
        state = _Decoding(memory, memory.states, np.arange(batch), step)
        if max_rows is not None:
            state = self.decode_select(state, np.arange(batch), capacity=max(int(max_rows), batch))
        return state

    def decode_step(self, state: _Decoding, tokens: np.ndarray, t: int):
        """One decoder step from the previous ids (N,): (the model's log-probabilities (N, V)
        float64, attention (N, S) or None, the next state)."""
        memory, count = state.memory, len(tokens)
        if state.capacity is not None and state.capacity > count:          # the padding rows' token
            tokens = np.concatenate([tokens, np.full(state.capacity - count, PAD, dtype=np.int64)])
        with scope(scopes.DECODER), scope(scopes.step(t)):
            ids = Tensor(tokens[:, None], device=self.out.weight.device)
            logits, weights, *flat = state.step(ids, memory.keys, memory.keys_proj, memory.key_mask,
                                                *_flat(state.states))
        log_probs = decoding.log_softmax(logits.numpy()[:count, 0])                   # (N, V)
        attention = None if weights is None else weights.numpy()[:count, 0]           # (N, S)
        return log_probs, attention, _Decoding(memory, self._unflat(flat), state.source, state.step,
                                               state.capacity)

    def decode_select(self, state: _Decoding, rows: np.ndarray, capacity: int | None = None) -> _Decoding:
        """The rows ``rows`` of a state, gathered on the device (``decoding.take_rows``).  A state of
        fixed capacity (``decode_start``'s ``max_rows``) stays that many rows: the index is
        ``rows`` followed by 0s, so the padding rows copy row 0 (finite values, never read)."""
        capacity, index, picks = decoding.select_rows(state.capacity, capacity, rows, len(state.source),
                                                      self.out.weight.device)
        source = state.source[index]
        # A beam's survivors mostly keep their sources' rows: the memory is copied only when
        # the rows' sources change (the first step's fan-out, a finished source leaving).
        same = np.array_equal(source, state.source)
        memory = state.memory if same else _memory_rows(state.memory, index, picks)
        states = self._unflat([decoding.take_rows(x, picks) for x in _flat(state.states)])
        return _Decoding(memory, states, source, state.step, capacity)

    def greedy(self, src, max_len: decoding.MaxLen = 50, min_length: int = 0, no_repeat_ngram_size: int = 0,
               hypotheses: bool = False, compile: bool = False):  # noqa: A002
        """Decode by taking the most likely token at every step.

        Args:
            src: int array (B, S).  max_len: the most tokens to produce (``<end>`` included).
            min_length: the fewest tokens before ``<end>``.  no_repeat_ngram_size: n > 0
                forbids producing any n-gram twice.  hypotheses: return one
                ``ta.models.Hypothesis`` per source (tokens, log_prob, attention) instead.
            compile: every step replays one ``ta.compile`` plan of the decoder step (captured
                once per batch size and source width): the same ids, attention and
                log-probabilities as without, bit for bit.

        Returns:
            (ids (B, L) int64: each row the tokens up to and including ``<end>``, then 0 (a
            row that reached ``max_len`` has no ``<end>``); weights (B, L, S) float numpy, the
            attention of each produced token, zeros after ``<end>``, or None without
            attention).  ``<pad>`` and ``<start>`` are never produced.

        ``max_len`` may be one int per row: each row stops at its own limit, so a source
        decodes the same alone and in any batch.

        A row of ``src`` that is all padding (or a ``src`` of width 0) is an empty source: the
        encoder leaves its state at zero, attention gives every position weight 0 and a zero
        context (as for any fully masked row), and the decoder produces what it would with
        nothing to read, the same output for every such row.
        """
        return decoding.greedy(self, ids_array(src, "src", "Seq2Seq", empty=True), max_len, min_length,
                               no_repeat_ngram_size, hypotheses, compile=compile)

    def sample(self, src, max_len: decoding.MaxLen = 50, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, seed=None, min_length: int = 0, no_repeat_ngram_size: int = 0,
               hypotheses: bool = False, compile: bool = False):  # noqa: A002
        """Draw every output token from the model's distribution (``ta.models.decoding.sample``:
        temperature, top-k, top-p, a seed); ``max_len``, sources and ``compile`` as ``greedy``'s;
        returns what ``greedy`` returns."""
        src = ids_array(src, "src", "Seq2Seq", empty=True)
        return decoding.sample(self, src, max_len, temperature, top_k, top_p, seed, min_length,
                               no_repeat_ngram_size, hypotheses, compile=compile)

    def beam_search(self, src, beam: int = 5, max_len: decoding.MaxLen = 50, length_penalty: float = 1.0,
                    coverage_penalty: float = 0.0, min_length: int = 0, no_repeat_ngram_size: int = 0,
                    n_best: int | None = None, compile: bool = False):  # noqa: A002
        """Batched beam search (``ta.models.decoding.beam_search``): Wu et al. (2016)'s length
        and coverage penalties, exact stopping; a beam of one is greedy decoding (with
        ``length_penalty=0``).  ``coverage_penalty`` needs attention.  ``max_len`` and sources
        as ``greedy``'s.

        The decode keeps B * beam rows at every step, whatever the number of live hypotheses
        (a finished one's row is carried as padding, its output dropped), and picks the
        survivors with a row gather on the device, the rows an index Tensor; so with
        ``compile`` one plan serves the search, and ids, scores, n-best and attention are
        eager's, bit for bit.

        Returns:
            (ids (B, L) int64, weights (B, L, S) or None) of each source's best hypothesis,
            laid out as ``greedy``'s; with ``n_best=k``, per source its k best
            ``ta.models.Hypothesis`` (tokens, score, log_prob, attention), best first.
        """
        if coverage_penalty and self.attention_kind is None:
            raise ValueError("beam_search: coverage_penalty needs a model with attention")
        src = ids_array(src, "src", "Seq2Seq", empty=True)
        return decoding.beam_search(self, src, beam, max_len, length_penalty, coverage_penalty, min_length,
                                    no_repeat_ngram_size, n_best, compile=compile)


@dataclass
class _Decoding:
    """A decode of N rows: the memory of each row's source (N rows), the decoder's states,
    which source each row decodes (N,), and the step function (``_decode_tensors``, or its
    compiled plan)."""

    memory: Memory
    states: list
    source: np.ndarray
    step: object = None
    capacity: int | None = None  # rows the device tensors keep (None: exactly the live rows)


# ---------------------------------------------------------------- helpers


def vocab_size(vocab, what: str, where: str) -> int:
    """A vocabulary's size: an int, or anything with a length (a ``ta.data.Vocab``)."""
    if isinstance(vocab, bool) or not (isinstance(vocab, int | np.integer) or hasattr(vocab, "__len__")):
        raise TypeError(f"{where}: {what} must be an int or a ta.data.Vocab, got {vocab!r:.40} "
                        f"({type(vocab).__name__})")
    size = vocab if isinstance(vocab, int | np.integer) else len(vocab)
    if size < 4:
        raise ValueError(f"{where}: {what} must hold at least the 4 reserved ids (<pad>, <start>, "
                         f"<end>, <unk>), got size {size}")
    return int(size)


def ids_array(x, what: str, where: str = "Seq2Seq", empty: bool = False) -> np.ndarray:
    """An integer (B, L) array from a numpy array, nested lists or a Tensor; L = 0 only where
    ``empty`` allows it (a source: a batch of empty sources)."""
    array = x.numpy() if isinstance(x, Tensor) else np.asarray(x)
    if array.ndim != 2 or array.dtype.kind not in "iu" or (array.shape[1] == 0 and not empty):
        kind = "an integer array" if empty else "a non-empty integer array"
        raise ShapeError(f"{where}: {what} must be {kind} (B, L) of token ids, got {array.dtype} of shape "
                         f"{array.shape}")
    return array.astype(np.int64, copy=False)


def batch_ids(x, what: str, where: str, device: str, empty: bool = False) -> np.ndarray | Tensor:
    """``ids_array`` for teacher forcing, where a Tensor of ids on the model's ``device`` stays a
    Tensor: only its shape and dtype are checked, its values never read on the host, so the
    masks and per-step columns computed from it are kernels (a compiled training step
    computes them from each batch).  Host ids, and ids on another device, take the host path
    as before.  The two paths give the same values (the RNN's masking: ``nn.RNN``)."""
    if not isinstance(x, Tensor) or x.device != device:
        return ids_array(x, what, where, empty)
    if x.ndim != 2 or x.dtype.kind not in "iu" or (x.shape[1] == 0 and not empty):
        kind = "an integer array" if empty else "a non-empty integer array"
        raise ShapeError(f"{where}: {what} must be {kind} (B, L) of token ids, got {x.dtype} of shape "
                         f"{x.shape}")
    return x.astype(np.int64)


def _memory_rows(memory: Memory, index: np.ndarray, picks: Tensor) -> Memory:
    """Rows ``index`` of a decoding memory, gathered on the device (``picks``: the same index
    as a Tensor); the mask is taken on the host and the attention's (N, 1, S) copy made from it.
    The initial states are left out: a decode reads them once, at its start."""
    mask = memory.mask[index]

    def take(x):
        return None if x is None else decoding.take_rows(x, picks)

    key_mask = Tensor(mask[:, None, :], device=memory.key_mask.device)
    return Memory(take(memory.keys), take(memory.keys_proj), mask, key_mask, [])


def _flat(states: list) -> list:
    """The decoder's per-layer states as one list of Tensors: h per layer, or h, c per layer
    for an LSTM (``Seq2Seq._unflat`` inverts it)."""
    flat = []
    for state in states:
        flat.extend(state if isinstance(state, tuple) else (state,))
    return flat


