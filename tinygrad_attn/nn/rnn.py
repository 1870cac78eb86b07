"""Recurrent cells and layers: RNN (the seeds' SimpleRNN), LSTM and GRU, as PyTorch's.

Parameter names, shapes, gate orders and initialisation (every weight and bias
U(-1/sqrt(H), 1/sqrt(H))) are PyTorch's, so ``load_state_dict`` takes a PyTorch module's
state_dict as it is, and the other way round.  GRU and LSTM steps run their elementwise part
as one fused node (``ta.ops.GRUGates``, ``LSTMCellState``, ``LSTMHidden``), and a layer
multiplies the inputs of all its steps by W_ih in one product before the first step (see
``unroll``).

One difference: the layers default to ``batch_first=True``, (B, T, features), like the rest
of this engine; pass ``batch_first=False`` for PyTorch's default (T, B, features).
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np

from .. import functional as F
from .. import scopes
from ..autograd import ShapeError, scope
from ..ops.movement import Pieces, Split
from ..tensor import Tensor, cat, stack, where
from . import init
from .module import Module, Parameter

_GATES = {"rnn": 1, "gru": 3, "lstm": 4}


class _CellBase(Module):
    kind = "rnn"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        super().__init__()
        gates = _GATES[self.kind]
        self.input_size, self.hidden_size = input_size, hidden_size
        bound = 1.0 / math.sqrt(hidden_size)
        self.weight_ih = Parameter(init.uniform((gates * hidden_size, input_size), bound))
        self.weight_hh = Parameter(init.uniform((gates * hidden_size, hidden_size), bound))
        self.bias_ih = Parameter(init.uniform((gates * hidden_size,), bound)) if bias else None
        self.bias_hh = Parameter(init.uniform((gates * hidden_size,), bound)) if bias else None

    def _weights(self):
        return self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh

    def _zeros(self, x: Tensor) -> Tensor:
        return Tensor.zeros(*x.shape[:-1], self.hidden_size, dtype=x.dtype, device=x.device)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias_ih is not None}"


class RNNCell(_CellBase):
    """One Elman step h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh) (the seeds' SimpleRNN,
    ``s = tanh(A [x; s] + b)`` with A split by columns into W_ih and W_hh), as ``torch.nn.RNNCell``.

    Args:
        input_size: I, the size of x's last axis.
        hidden_size: H, the state's size.
        bias: learn b_ih and b_hh.
        nonlinearity: "tanh" or "relu".

    Example:
        >>> cell = nn.RNNCell(16, 32)
        >>> h = cell(Tensor.randn(8, 16))             # h0 = zeros: (8, 32)
        >>> h = cell(Tensor.randn(8, 16), h)
    """

    kind = "rnn"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh"):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias)
        self.nonlinearity = nonlinearity

    def forward(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        h = self._zeros(x) if h is None else h
        F.check_cell("RNNCell", 1, x, (("h", h),), *self._weights())
        return F.rnn_step(x, h, *self._weights(), self.nonlinearity)


class GRUCell(_CellBase):
    """One GRU step with PyTorch's gates (r, z, n); see ``ta.functional.gru_cell``.

    ``x`` may be a tuple of parts joined along the last axis, read by the one fused node:

    Example:
        >>> cell = nn.GRUCell(16, 32)
        >>> h = cell(Tensor.randn(8, 16))             # (8, 32)
        >>> h = cell((Tensor.randn(8, 10), Tensor.randn(8, 6)), h)     # x = [y; c]
    """

    kind = "gru"

    def forward(self, x: Tensor | tuple[Tensor, ...], h: Tensor | None = None) -> Tensor:
        return F.gru_cell(x, h, *self._weights())


class LSTMCell(_CellBase):
    """One LSTM step with PyTorch's gates (i, f, g, o); see ``ta.functional.lstm_cell``.

    Returns (h', c').

    Example:
        >>> cell = nn.LSTMCell(16, 32)
        >>> h, c = cell(Tensor.randn(8, 16))          # each (8, 32)
    """

    kind = "lstm"

    def forward(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        return F.lstm_cell(x, hx, *self._weights())


class _RNNBase(Module):
    """Stacked, optionally bidirectional recurrent layers, unrolled one node group per step."""

    kind = "rnn"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = True, dropout: float = 0.0, bidirectional: bool = False):
        super().__init__()
        name = type(self).__name__
        if num_layers < 1 or hidden_size < 1 or input_size < 1:
            raise ValueError(f"{name}: input_size, hidden_size and num_layers must be positive, got "
                             f"{input_size}, {hidden_size}, {num_layers}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{name}: dropout must be in [0, 1], got {dropout}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.batch_first, self.dropout, self.bidirectional = batch_first, float(dropout), bidirectional
        self.bias = bias
        gates = _GATES[self.kind]
        bound = 1.0 / math.sqrt(hidden_size)
        # PyTorch's order: per layer, per direction: weight_ih, weight_hh, bias_ih, bias_hh.
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * self.num_directions
            for suffix in self._suffixes(layer):
                setattr(self, f"weight_ih{suffix}",
                        Parameter(init.uniform((gates * hidden_size, width), bound)))
                setattr(self, f"weight_hh{suffix}",
                        Parameter(init.uniform((gates * hidden_size, hidden_size), bound)))
                if bias:
                    setattr(self, f"bias_ih{suffix}", Parameter(init.uniform((gates * hidden_size,), bound)))
                    setattr(self, f"bias_hh{suffix}", Parameter(init.uniform((gates * hidden_size,), bound)))

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _suffixes(self, layer: int) -> list[str]:
        return [f"_l{layer}", f"_l{layer}_reverse"][: self.num_directions]

    def _weights(self, suffix: str):
        get = self._parameters.get
        return (get(f"weight_ih{suffix}"), get(f"weight_hh{suffix}"), get(f"bias_ih{suffix}"),
                get(f"bias_hh{suffix}"))

    def _step(self, x: Tensor | tuple, state, weights):
        """One cell step; ``state`` is h, or (h, c) for an LSTM; ``x`` may be in parts."""
        if self.kind == "gru":
            return F.gru_step(x, state, *weights)              # reads the parts without a Cat
        if isinstance(x, tuple):
            x = cat(x, axis=-1)
        if self.kind == "lstm":
            return F.lstm_step(x, *state, *weights)
        return F.rnn_step(x, state, *weights, getattr(self, "nonlinearity", "tanh"))

    # ------------------------------------------------------------ the public layer call

    def forward(self, x: Tensor, hx=None, mask=None):
        """Run every layer over the whole sequence.

        Args:
            x: (B, T, I) with batch_first (the default), else (T, B, I).
            hx: initial state (num_layers * num_directions, B, H), or for an LSTM a pair
                (h0, c0); None for zeros.
            mask: optional boolean (B, T), True at real tokens: a padded step leaves the state
                as it was and outputs zeros, so each direction sees only the real tokens
                (what PyTorch's packed sequences do, for right-padded batches).

        Returns:
            (output (B, T, num_directions * H), h_n (num_layers * num_directions, B, H)); for
            an LSTM, (output, (h_n, c_n)).

        Example:
            >>> gru = nn.GRU(16, 32, num_layers=2, bidirectional=True)
            >>> out, h_n = gru(Tensor.randn(8, 10, 16))
            >>> out.shape, h_n.shape
            ((8, 10, 64), (4, 8, 32))
        """
        name = type(self).__name__
        if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != self.input_size:
            layout = "(B, T, I)" if self.batch_first else "(T, B, I)"
            shape = x.shape if isinstance(x, Tensor) else type(x).__name__
            raise ShapeError(f"{name}: input must be {layout} with I = {self.input_size}, got {shape}")
        if x.shape[1 if self.batch_first else 0] == 0:
            raise ShapeError(f"{name}: input has no steps (T = 0): {x.shape}")
        # The steps as (B, 1, ...) rows of one (B, T, I) tensor: unroll reads it whole (a
        # GRU's input product is one GEMM) and hands each step its rows as a Split piece.
        x = x if self.batch_first else x.transpose(0, 1)                         # (B, T, I)
        batch = x.shape[0]
        states = self._initial_states(hx, batch)
        outputs, finals = self.unroll(x, states, mask)                           # T x (B, 1, D*H)
        output = cat(outputs, axis=1)                                            # (B, T, D*H)
        if not self.batch_first:
            output = output.transpose(0, 1)                                      # (T, B, D*H)
        count = len(finals)

        def joined(states: list) -> Tensor:                                      # (L*D, B, H)
            return stack(states).reshape(count, batch, self.hidden_size)

        if self.kind == "lstm":
            return output, (joined([h for h, _ in finals]), joined([c for _, c in finals]))
        return output, joined(finals)

    def _initial_states(self, hx, batch: int) -> list | None:
        """hx as PyTorch lays it out -> one (B, 1, H) state per (layer, direction), or None
        for zeros."""
        if hx is None:
            return None
        count = self.num_layers * self.num_directions
        expected = (count, batch, self.hidden_size)
        pair = hx if self.kind == "lstm" else (hx,)
        if self.kind == "lstm" and (not isinstance(hx, tuple | list) or len(hx) != 2):
            raise TypeError(f"{type(self).__name__}: hx must be a pair (h0, c0)")
        for part in pair:
            if part.shape != expected:
                raise ShapeError(f"{type(self).__name__}: initial state must be {expected} "
                                 f"(num_layers * num_directions, B, H), got {part.shape}")
        per_slot = [[part[k].reshape(batch, 1, self.hidden_size) for k in range(count)] for part in pair]
        return [tuple(parts) if self.kind == "lstm" else parts[0] for parts in zip(*per_slot, strict=True)]

    def unroll(self, xs: list[Tensor] | Tensor, states: list | None = None, mask=None):
        """The layer on per-step inputs, returning per-step outputs: what a model that reads
        each step's state (attention over the encoder's outputs, a decoder's steps) uses.

        Args:
            xs: T tensors (B, I), or (B, 1, I): any leading axes, the same for every step; or
                one tensor (B, T, I) whose steps are (B, 1, I) (axis -2 the steps, any axes
                before it), as an embedding of a whole (B, T) batch gives.
            states: one initial state per (layer, direction), layer-major (h, or (h, c) for an
                LSTM), or None for zeros.
            mask: boolean (B, T), True at real tokens, or None.

        Returns:
            (outputs: T tensors (B, num_directions * H) (shaped like a step's input), finals:
            the last state of every (layer, direction), layer-major).

        Every step's input is multiplied by W_ih at once, one GEMM per layer and direction
        (as PyTorch's and cuDNN's layers do), and each step multiplies only its state; steps
        read their rows of the product through ``Split`` pieces, whose gradients backward
        joins once.

        Each step records its nodes under the scope ``t<step>``; the reverse direction of a
        bidirectional layer under ``t<step>/reverse``.
        """
        name = type(self).__name__
        if isinstance(xs, Tensor):
            if xs.ndim < 2 or xs.shape[-1] != self.input_size:
                raise ShapeError(f"{name}: a joined input must be (B, T, I) with I = {self.input_size}, "
                                 f"got {xs.shape}")
            joined, steps, lead = xs, xs.shape[-2], xs.shape[:-2] + (1,)
        else:
            joined, steps, lead = None, len(xs), xs[0].shape[:-1]
            for t, x_t in enumerate(xs):
                if x_t.shape != xs[0].shape:
                    raise ShapeError(f"{name}: step {t} has shape {x_t.shape}, step 0 has {xs[0].shape}")
        like = xs if joined is not None else xs[0]                  # dtype and device
        if joined is not None and states is not None:
            # A list's first step is checked with the cell's arguments below; a joined input
            # has no step tensor to check, and a state of the wrong shape would broadcast.
            expected = lead + (self.hidden_size,)
            for k, state in enumerate(states):
                for part in (state if self.kind == "lstm" else (state,)):
                    if part is not None and part.shape != expected:
                        raise ShapeError(f"{name}: state {k} must be {expected} (a step's batch axes, "
                                         f"then H), got {part.shape}")
        keep = self._mask_columns(mask, lead, steps, like.dtype, like.device)
        finals = []
        below = None                 # the layer below's outputs, one list of steps per direction
        for layer in range(self.num_layers):
            # Every step's input is known before the first step: one product for all.
            if below is None:
                layer_in = joined if joined is not None else _join_steps(xs, lead)       # (B, T, I)
            else:
                parts = [_join_steps(outs, lead) for outs in below]
                layer_in = parts[0] if len(parts) == 1 else cat(parts, axis=-1)         # (B, T, D*H)
            if layer > 0 and self.dropout > 0.0 and self.training:
                layer_in = F.dropout(layer_in, self.dropout)
            directions = []
            for d, suffix in enumerate(self._suffixes(layer)):
                weights = self._weights(suffix)
                slot = layer * self.num_directions + d
                state = None if states is None else states[slot]
                if state is None:
                    zeros = Tensor.zeros(*lead, self.hidden_size, dtype=like.dtype, device=like.device)
                    state = (zeros, zeros) if self.kind == "lstm" else zeros
                if layer == 0 and d == 0 and joined is None:
                    F.check_cell(name, _GATES[self.kind], xs[0],
                                 (("h", state[0] if self.kind == "lstm" else state),), *weights)
                products = _StepPieces(F.linear(layer_in, weights[0], weights[2]), steps, lead)
                order = range(steps - 1, -1, -1) if d == 1 else range(steps)
                outs: list = [None] * steps
                for t in order:
                    with scope(scopes.step(t)), (scope(scopes.REVERSE) if d == 1 else nullcontext()):
                        outs[t], state = self._projected_step(products.step(t), state, weights, keep[t])
                directions.append(outs)
                finals.append(state)
            below = directions
        return (below[0] if len(below) == 1 else _join_directions(below)), finals

    def _projected_step(self, gi: Tensor, state, weights, keep):
        """(output, state) of one step given gi = x W_ih^T + b_ih; ``keep`` as ``_masked``'s."""
        _, w_hh, _, b_hh = weights
        if self.kind == "gru":
            # The GRU's fused node keeps the state at padded rows itself.
            h = F.gru_projected_step(gi, state, w_hh, b_hh, None if keep is None else keep[0])
            return (h if keep is None else h * keep[1]), h
        if self.kind == "lstm":
            new = F.lstm_projected_step(gi, *state, w_hh, b_hh)
        else:
            new = F.rnn_projected_step(gi, state, w_hh, b_hh, getattr(self, "nonlinearity", "tanh"))
        return self._masked(new, state, keep)

    def step(self, x: Tensor | tuple[Tensor, ...], states: list | None = None):
        """One time step through every layer of a unidirectional stack: what a decoder uses
        when each step's input depends on the step before (attention, feeding back its own
        prediction).

        Args:
            x: (B, I) the step's input (any leading axes, e.g. (B, 1, I)); or a tuple of
                tensors that joined along the last axis make it, such as a Bahdanau
                decoder's (y_{i-1}, c_i).  A GRU reads the parts in its one fused node; the
                other cells join them first.
            states: one state per layer (h, or (h, c) for an LSTM), or None for zeros.

        Returns:
            (the top layer's output h (B, H), the new states, one per layer).

        Example:
            >>> decoder = nn.GRU(16, 32, num_layers=2)
            >>> h, states = decoder.step(Tensor.randn(8, 16))
            >>> h, states = decoder.step((Tensor.randn(8, 10), Tensor.randn(8, 6)), states)
        """
        if self.bidirectional:
            raise ValueError(f"{type(self).__name__}.step: a bidirectional layer needs the whole "
                             f"sequence; call it on (B, T, I) instead")
        name = type(self).__name__
        parts = F.input_parts(f"{name}.step", x)
        width = 0
        for p in parts:              # a loop, not sum(genexpr): a decoder calls this every step
            width += p.shape[-1] if p.ndim else 0
        lead = parts[0].shape[:-1]
        if width != self.input_size or any(p.ndim < 2 or p.shape[:-1] != lead for p in parts):
            shapes = ", ".join(str(p.shape) for p in parts)
            raise ShapeError(f"{name}.step: input must be (B, I) with I = {self.input_size}"
                             f"{' (the parts joined along the last axis)' if len(parts) > 1 else ''}, "
                             f"got {shapes}")
        x = parts if len(parts) > 1 else parts[0]
        like = parts[0]
        if states is None:
            zeros = Tensor.zeros(*lead, self.hidden_size, dtype=like.dtype, device=like.device)
            states = [(zeros, zeros) if self.kind == "lstm" else zeros] * self.num_layers
        expected = lead + (self.hidden_size,)
        bad = len(states) != self.num_layers
        for state in states:
            bad = bad or (state[0] if self.kind == "lstm" else state).shape != expected
        if bad:
            raise ShapeError(f"{name}.step: states must be {self.num_layers} per-layer states of shape "
                             f"{expected}")
        new_states = []
        for layer in range(self.num_layers):
            if layer > 0 and self.dropout > 0.0 and self.training:
                x = F.dropout(x, self.dropout)
            state = self._step(x, states[layer], self._weights(f"_l{layer}"))
            new_states.append(state)
            x = state[0] if self.kind == "lstm" else state
        return x, new_states

    def _mask_columns(self, mask, lead: tuple, steps: int, dtype, device: str) -> list:
        """Per step: a pair of Tensor columns on ``device`` shaped like the step's leading axes
        plus 1, to broadcast over H, the boolean one and the same as 0/1 in ``dtype``; or
        None, where the step needs no masking; every layer and direction reads the same pair.
        A GRU's fused node keeps the state at padded rows itself (``GRUCell(masked=True)``);
        the other cells' state is selected with ``where``.  The output is multiplied by the
        0/1 column (h * 1 is h; h * 0 is 0, -0.0 where h < 0: the same number, and a cell's h
        is finite), one Mul node whose backward is one product, where ``where(keep, h, 0.0)``
        also ran a fill, two selects and a sum for the constant's gradient, at every padded
        step.

        A host mask's columns of real tokens only are None: those steps skip the ``where``
        ops (an eager speed-up on batches with little padding).  A Tensor mask is not read
        (its values may be a compiled step's input, different at every replay), so every
        step masks.  ``where`` with an all-True column selects the new state exactly, so
        the forward values are the same bits; backward too, except that where the last
        step's state, unmasked on the host path, has two or more readers besides the output
        (a Bahdanau decoder's first query and cell), their gradients are added in another
        order: equal to rounding."""
        if mask is None:
            return [None] * steps
        batch = math.prod(lead)
        if not isinstance(mask, Tensor):
            mask = np.asarray(mask)
        if mask.dtype != np.bool_ or mask.shape != (batch, steps):
            raise ShapeError(f"{type(self).__name__}: mask must be boolean (B, T) = {(batch, steps)}, "
                             f"True at real tokens; got {mask.dtype} {mask.shape}")
        if isinstance(mask, Tensor):
            columns = mask.transpose(0, 1).reshape(steps, *lead, 1)              # (T, *lead, 1)
            numbers = columns.astype(dtype)
            return [(columns[t], numbers[t]) for t in range(steps)]
        # A host column becomes device Tensors here, once per call: left as an array, every
        # layer and direction would convert it again (the GRU's keep, where's condition, the
        # output's 0/1 factor).
        columns = [None if column.all() else column.reshape(lead + (1,)) for column in mask.T]
        return [None if column is None else (Tensor(column, dtype=np.bool_, device=device),
                                             Tensor(column.astype(dtype), dtype=dtype, device=device))
                for column in columns]

    def _masked(self, new, old, keep):
        """(output, state) of a step: at padded rows the state stays and the output is 0.

        ``keep``: None, a pair from ``_mask_columns``, or a boolean column alone (the ONNX
        exporter traces a step with one, bound to its Scan's mask input), whose output is
        ``where(keep, h, 0.0)``: the same values."""
        h_new = new[0] if self.kind == "lstm" else new
        if keep is None:
            return h_new, new
        keep, ones = keep if isinstance(keep, tuple) else (keep, None)
        if self.kind == "lstm":
            state = (where(keep, new[0], old[0]), where(keep, new[1], old[1]))
        else:
            state = where(keep, new, old)
        return (where(keep, h_new, 0.0) if ones is None else h_new * ones), state

    def extra_repr(self) -> str:
        extras = [f"{self.input_size}, {self.hidden_size}"]
        if self.num_layers != 1:
            extras.append(f"num_layers={self.num_layers}")
        if self.bidirectional:
            extras.append("bidirectional=True")
        if not self.batch_first:
            extras.append("batch_first=False")
        if self.dropout:
            extras.append(f"dropout={self.dropout}")
        return ", ".join(extras)


class RNN(_RNNBase):
    """Stacked Elman RNN layers (tanh or relu), as ``torch.nn.RNN`` (batch_first by default).
    See ``GRU`` for the arguments and an example."""

    kind = "rnn"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = True,
                 dropout: float = 0.0, bidirectional: bool = False):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)
        self.nonlinearity = nonlinearity


class GRU(_RNNBase):
    """Stacked GRU layers, as ``torch.nn.GRU`` (batch_first by default).

    Args:
        input_size: I, the size of x's last axis.
        hidden_size: H, the state's size.
        num_layers: stacked layers.
        bias: learn biases.
        batch_first: inputs and outputs are (B, T, ...) (default True; PyTorch's is False).
        dropout: on the inputs of every layer but the first, in training mode.
        bidirectional: a second pass from the last step to the first, outputs concatenated.

    Example:
        >>> gru = nn.GRU(16, 32)
        >>> out, h_n = gru(Tensor.randn(8, 10, 16))   # (8, 10, 32), (1, 8, 32)
    """

    kind = "gru"


class LSTM(_RNNBase):
    """Stacked LSTM layers, as ``torch.nn.LSTM`` (batch_first by default); returns
    (output, (h_n, c_n)).  See ``GRU`` for the arguments."""

    kind = "lstm"


def _join_directions(directions: list[list[Tensor]]) -> list[Tensor]:
    """Per step, the directions' outputs side by side: (B, 2H)."""
    return [cat(parts, axis=-1) for parts in zip(*directions, strict=True)]


def _join_steps(steps: list[Tensor], lead: tuple) -> Tensor:
    """T step tensors lead + (F,) -> one tensor with the steps on the axis before F: a
    (B, 1, F) layout joins along its 1 ((B, T, F)), any other stacks on a new axis."""
    if lead and lead[-1] == 1:
        return steps[0] if len(steps) == 1 else cat(steps, axis=-2)          # (B, T, F)
    if len(steps) == 1:
        return steps[0].reshape(*lead, 1, steps[0].shape[-1])
    return stack(steps, axis=len(lead))                                       # lead + (T, F)


class _StepPieces:
    """A joined tensor's steps back out, one ``Split`` piece per step, made when its step
    runs (so it sits in that step's scope in drawings); the pieces share one ``Pieces``, so
    backward joins their gradients with one ``cat`` instead of a zero-filled full-size
    gradient per step."""

    def __init__(self, joined: Tensor, steps: int, lead: tuple):
        self.joined, self.lead, self.sizes = joined, lead, (1,) * steps
        self.pieces = Pieces(steps)

    def step(self, t: int) -> Tensor:
        piece = Split.apply(self.joined, sizes=self.sizes, axis=-2, index=t, pieces=self.pieces)
        return piece if self.lead and self.lead[-1] == 1 else piece.reshape(*self.lead, piece.shape[-1])
