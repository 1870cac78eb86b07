"""Fused recurrent-cell ops: the elementwise part of a GRU or LSTM cell, after its two
matrix products (which stay MatMul, on BLAS).

Gate orders and formulas are PyTorch's, so ``nn.GRUCell`` / ``nn.LSTMCell`` built on these
ops load a PyTorch state_dict as it is: GRU gates (r, z, n) with the reset gate applied to
the hidden product *after* its bias, LSTM gates (i, f, g, o).

An op has one output, so an LSTM cell is two ops: ``LSTMCellState`` makes c from the
(i, f, g) blocks of the gates and ``LSTMHidden`` makes h from the o block and that c.  Each
backward returns a full (B, 4H) gate gradient, zero outside its own blocks, and autograd
adds the two.

Every op takes inputs with any leading (batch) axes, identical across its inputs, and runs
its kernels on them as rows (B, width).  Forward saves the gate activations, so backward
evaluates no exp or tanh (see compiler/reference/rnn.py).
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd import DeferredGrad, Example, Op, register
from ..shapes import dim
from ._common import check_bool, check_float, check_same_dtype, uniform
from .elementwise import Sigmoid, Tanh

# The gates' symbolic forms use the elementwise ops' own formulas.
_sigmoid, _tanh = Sigmoid.symbolic, Tanh.symbolic


def _blocks(x, hidden: int, count: int) -> list:
    """The ``count`` blocks of width ``hidden`` along the last axis of an object array."""
    x = np.asarray(x, dtype=object)
    return [x[..., k * hidden : (k + 1) * hidden] for k in range(count)]


def _check_cell(op, *spec) -> None:
    """``spec``: (name, array, blocks) with the state (blocks 1) last.  Same float dtype,
    the same leading axes, and last axes of ``blocks`` times H, H being the state's."""
    arrays = [a for _, a, _ in spec]
    check_same_dtype(op, *arrays)
    check_float(op, arrays[0], spec[0][0])

    def shapes() -> str:             # built only for a message: this runs on every step
        return ", ".join(f"{name} {tuple(a.shape)}" for name, a, _ in spec)

    if any(a.ndim == 0 for a in arrays):
        layout = ", ".join(f"{name} (..., {'' if k == 1 else k}H)" for name, _, k in spec)
        op.fail(f"expected {layout}; got {shapes()}")
    state_name, state, _ = spec[-1]
    hidden = dim(state, -1)
    for name, a, blocks in spec[:-1]:
        if dim(a, -1) != blocks * hidden:
            op.fail(f"{name} must end in {blocks}H = {blocks * hidden} for H = {hidden} (the last "
                    f"axis of {state_name}); got {shapes()}")
    if any(a.shape[:-1] != state.shape[:-1] for a in arrays):
        op.fail(f"batch axes differ: {shapes()}")


def _gru_cell_fits(xs, h_prev, w_ih, w_hh, biases) -> bool:
    """Whether GRUCell's inputs have PyTorch's layout: x parts (..., I_k) with h_prev's
    leading axes, w_ih (3H, sum I_k), w_hh (3H, H) and both biases (3H,) or neither."""
    if h_prev.ndim == 0 or w_ih.ndim != 2 or w_hh.ndim != 2 or len(biases) not in (0, 2):
        return False
    hidden, lead = dim(h_prev, -1), h_prev.shape[:-1]
    width = 0
    for x in xs:                     # loops, not any(genexpr): this runs on every step
        if x.ndim == 0 or x.shape[:-1] != lead:
            return False
        width += dim(x, -1)
    for b in biases:
        if b.shape != (3 * hidden,):
            return False
    return w_ih.shape == (3 * hidden, width) and w_hh.shape == (3 * hidden, hidden)


def _rows(kb, x):
    if x.ndim == 2:
        return x                     # the usual case: skip the reshape call (~1 us, per input)
    # math.prod, not -1: a reshape to (-1, 0) is ambiguous when H = 0.
    return kb.reshape(x, (math.prod(x.shape[:-1]), dim(x, -1)))      # (B, width)


def _unrows(kb, x, shape):
    return x if x.shape == shape else kb.reshape(x, shape)            # (..., width)


@register
class GRUGates(Op):
    """h = (1 - z) n + z h_prev, r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z), n = tanh(gi_n + r gh_n).

    gi = x W_ih^T + b_ih and gh = h_prev W_hh^T + b_hh are (..., 3H) in PyTorch's gate order
    (r, z, n); h_prev and h are (..., H).
    """

    kernels = ("gru_gates", "gru_gates_back", "reshape")

    @staticmethod
    def symbolic(sp, gi, gh, h_prev):
        h_prev = np.asarray(h_prev, dtype=object)
        hidden = dim(h_prev, -1)
        gi_r, gi_z, gi_n = _blocks(gi, hidden, 3)
        gh_r, gh_z, gh_n = _blocks(gh, hidden, 3)
        r = _sigmoid(sp, gi_r + gh_r)
        z = _sigmoid(sp, gi_z + gh_z)
        n = _tanh(sp, gi_n + r * gh_n)
        return (1 - z) * n + z * h_prev

    def forward(self, gi, gh, h_prev):
        _check_cell(self, ("gi", gi, 3), ("gh", gh, 3), ("h_prev", h_prev, 1))
        kb = self.backend
        gh2, h_prev2 = _rows(kb, gh), _rows(kb, h_prev)                 # (B, 3H), (B, H)
        h, gates = kb.gru_gates(_rows(kb, gi), gh2, h_prev2)            # (B, H), (B, 3H)
        self.saved = (gates, gh2, h_prev2, gi.shape, h_prev.shape)
        return _unrows(kb, h, h_prev.shape)

    def backward(self, dh):
        gates, gh2, h_prev2, gates_shape, state_shape = self.saved
        kb = self.backend
        dgi, dgh, dh_prev = kb.gru_gates_back(gates, gh2, h_prev2, _rows(kb, dh))
        return (_unrows(kb, dgi, gates_shape), _unrows(kb, dgh, gates_shape),
                _unrows(kb, dh_prev, state_shape))

    @classmethod
    def examples(cls):
        return [Example((uniform(900, 2, 6), uniform(901, 2, 6), uniform(902, 2, 2))),
                Example((uniform(903, 3), uniform(904, 3), uniform(905, 1))),            # unbatched
                Example((uniform(906, 2, 1, 3), uniform(907, 2, 1, 3), uniform(908, 2, 1, 1)))]


@register
class GRUCell(Op):
    """h = GRUGates(x W_ih^T + b_ih, h_prev W_hh^T + b_hh, h_prev): a whole GRU step in one node.

    The two products run on BLAS and the gates as one kernel, as in ``GRUGates``; one node
    instead of three (two Linear and the gates) is what an unrolled sequence pays per step
    in graph bookkeeping.  Weights are PyTorch's: w_ih (3H, I), w_hh (3H, H), and the biases
    (3H,) are given both or neither.

    Inputs: ``parts`` tensors that joined along their last axis make x (..., I), then h_prev,
    w_ih, w_hh and the biases.  A Bahdanau decoder's input is [y_{i-1}; c_i] (Bahdanau et
    al. 2015, s_i = f(s_{i-1}, y_{i-1}, c_i)): with ``parts=2`` the cell reads y and c
    themselves, and the join costs no node of its own.

    With ``masked=True`` a last input ``keep``, boolean (..., 1), False at a row's padded
    step: there h = h_prev (``where(keep, h, h_prev)``, inside the gates kernel rather than
    a node and two backward passes of its own at every step of a masked sequence).

    With ``projected=True`` the first input is gi = x W_ih^T + b_ih itself (..., 3H), and
    the inputs are gi, h_prev, w_hh and b_hh (or no bias): a layer that knows every step's
    input before the first step (``nn.GRU.unroll``) computes the input products of all steps
    as one GEMM, as PyTorch's and cuDNN's GRU layers do, and each step multiplies only its
    state.  The result is the same cell; only the input product's rounding differs.
    """

    kernels = ("add_", "cat", "gru_gates", "gru_gates_back", "matmul", "matmul_nt", "matmul_tn",
               "reshape", "split", "sum")

    @staticmethod
    def symbolic(sp, *inputs, parts=1, masked=False, projected=False):
        if masked:
            *inputs, keep = inputs
        if projected:
            gi, h_prev, w_hh, *bias = (np.asarray(a, dtype=object) for a in inputs)
            gh = np.matmul(h_prev, w_hh.T)
            h = GRUGates.symbolic(sp, gi, gh + bias[0] if bias else gh, h_prev)
            return np.where(keep, h, h_prev) if masked else h
        x = np.concatenate([np.asarray(p, dtype=object) for p in inputs[:parts]], axis=-1)
        h_prev, w_ih, w_hh, *biases = (np.asarray(a, dtype=object) for a in inputs[parts:])
        gi = np.matmul(x, w_ih.T)
        gh = np.matmul(h_prev, w_hh.T)
        if biases:
            gi, gh = gi + biases[0], gh + biases[1]
        h = GRUGates.symbolic(sp, gi, gh, h_prev)
        return np.where(keep, h, h_prev) if masked else h

    def forward(self, *inputs):
        parts = self.attrs.get("parts", 1)
        keep = None
        if self.attrs.get("masked", False):
            *inputs, keep = inputs
        if self.attrs.get("projected", False):
            return self._forward_projected(inputs, keep)
        if not 1 <= parts <= len(inputs) - 3:
            self.fail(f"parts={parts} needs 1 to {len(inputs) - 3} input parts before h_prev, "
                      f"w_ih and w_hh; got {len(inputs)} inputs")
        xs = inputs[:parts]
        h_prev, w_ih, w_hh, *biases = inputs[parts:]
        check_same_dtype(self, *inputs)
        check_float(self, h_prev)
        if not _gru_cell_fits(xs, h_prev, w_ih, w_hh, biases):
            names = [f"x{k + 1}" if parts > 1 else "x" for k in range(parts)]
            names += ["h_prev", "w_ih", "w_hh", "b_ih", "b_hh"]
            shapes = ", ".join(f"{name} {tuple(a.shape)}" for name, a in zip(names, inputs, strict=False))
            joined = " joined along the last axis" if parts > 1 else ""
            self.fail(f"expected x (..., I){joined}, h_prev (..., H), w_ih (3H, I), w_hh (3H, H) "
                      f"and biases (3H,) both or neither; got {shapes}")
        kb = self.backend
        if keep is not None:
            keep = self._check_keep(keep, h_prev)
        h_prev2 = _rows(kb, h_prev)                                     # (B, H)
        if parts == 1:
            x2 = _rows(kb, xs[0])                                       # (B, I)
        else:
            x2 = kb.cat([_rows(kb, x) for x in xs], 1)                  # (B, I): [y; c]
        gi = kb.matmul_nt(x2, w_ih)                                     # (B, 3H)
        gh = kb.matmul_nt(h_prev2, w_hh)                                # (B, 3H)
        if biases:
            # Into the products' own new arrays: no second (B, 3H) array per step.
            gi, gh = kb.add_(gi, biases[0]), kb.add_(gh, biases[1])
        if keep is None:                 # no keep argument at all: the kernels' common signature
            h, gates = kb.gru_gates(gi, gh, h_prev2)                    # (B, H), (B, 3H)
        else:
            h, gates = kb.gru_gates(gi, gh, h_prev2, keep)
        self.saved = (x2, h_prev2, w_ih, w_hh, gates, gh, [tuple(x.shape) for x in xs], h_prev.shape, keep)
        return _unrows(kb, h, h_prev.shape)

    def _check_keep(self, keep, h_prev):
        check_bool(self, keep, "keep")
        if keep.shape != h_prev.shape[:-1] + (1,):
            self.fail(f"keep must be {h_prev.shape[:-1] + (1,)} (h_prev's batch axes, then 1); "
                      f"got {tuple(keep.shape)}")
        return _rows(self.backend, keep)                               # (B, 1)

    def _forward_projected(self, inputs, keep):
        if self.attrs.get("parts", 1) != 1:
            self.fail("projected=True takes gi, the input's product, whole: parts must be 1")
        check_same_dtype(self, *inputs)
        gi, h_prev, w_hh, *bias = inputs
        check_float(self, h_prev)
        hidden = dim(h_prev, -1) if h_prev.ndim else -1
        if (h_prev.ndim == 0 or gi.shape != h_prev.shape[:-1] + (3 * hidden,) or len(bias) > 1
                or w_hh.shape != (3 * hidden, hidden) or any(b.shape != (3 * hidden,) for b in bias)):
            names = ("gi", "h_prev", "w_hh", "b_hh")
            shapes = ", ".join(f"{name} {tuple(a.shape)}" for name, a in zip(names, inputs, strict=False))
            self.fail(f"projected=True expects gi (..., 3H), h_prev (..., H), w_hh (3H, H) and "
                      f"optionally b_hh (3H,); got {shapes}")
        kb = self.backend
        if keep is not None:
            keep = self._check_keep(keep, h_prev)
        h_prev2 = _rows(kb, h_prev)                                     # (B, H)
        gh = kb.matmul_nt(h_prev2, w_hh)                                # (B, 3H)
        if bias:
            gh = kb.add_(gh, bias[0])                                   # into the product
        if keep is None:
            h, gates = kb.gru_gates(_rows(kb, gi), gh, h_prev2)         # (B, H), (B, 3H)
        else:
            h, gates = kb.gru_gates(_rows(kb, gi), gh, h_prev2, keep)
        self.saved = (h_prev2, w_hh, gates, gh, gi.shape, h_prev.shape, keep)
        return _unrows(kb, h, h_prev.shape)

    def backward(self, dh):
        if self.attrs.get("projected", False):
            return self._backward_projected(dh)
        x2, h_prev2, w_ih, w_hh, gates, gh, x_shapes, state_shape, keep = self.saved
        kb = self.backend
        parts = len(x_shapes)
        need = self.needs_grad
        if keep is None:
            dgi, dgh, dh_prev = kb.gru_gates_back(gates, gh, h_prev2, _rows(kb, dh))   # (B, 3H) x2, (B, H)
        else:
            dgi, dgh, dh_prev = kb.gru_gates_back(gates, gh, h_prev2, _rows(kb, dh), keep)
        grads = [None] * len(need)
        if True in need[:parts]:
            dx2 = kb.matmul(dgi, w_ih)                                              # (B, I)
            if parts == 1:
                grads[0] = _unrows(kb, dx2, x_shapes[0])
            else:
                pieces = kb.split(dx2, [shape[-1] for shape in x_shapes], 1)
                for k in range(parts):
                    if need[k]:
                        grads[k] = _unrows(kb, pieces[k], x_shapes[k])
        if need[parts]:
            grads[parts] = _unrows(kb, kb.add_(kb.matmul(dgh, w_hh), dh_prev), state_shape)
        # Weights and biases: one GEMM (one sum) over every step's rows, when read; each
        # step's dG stacked once for the weight and the bias (``stacks``).
        stacks: dict = {}
        if need[parts + 1]:
            grads[parts + 1] = DeferredGrad(kb, "matmul_tn", w_ih.shape, (dgi, x2), (), stacks)   # (3H, I)
        if need[parts + 2]:
            grads[parts + 2] = DeferredGrad(kb, "matmul_tn", w_hh.shape, (dgh, h_prev2), (), stacks)
        if len(need) - (keep is not None) == parts + 5:          # biases (keep, if any, is last)
            if need[parts + 3]:
                grads[parts + 3] = DeferredGrad(kb, "sum", dgi.shape[1:], (dgi,), (0, False), stacks)
            if need[parts + 4]:
                grads[parts + 4] = DeferredGrad(kb, "sum", dgh.shape[1:], (dgh,), (0, False), stacks)
        return tuple(grads)

    def _backward_projected(self, dh):
        h_prev2, w_hh, gates, gh, gi_shape, state_shape, keep = self.saved
        kb = self.backend
        need = self.needs_grad
        dgi, dgh, dh_prev = kb.gru_gates_back(gates, gh, h_prev2, _rows(kb, dh),
                                              *(() if keep is None else (keep,)))
        grads = [None] * len(need)
        if need[0]:
            grads[0] = _unrows(kb, dgi, gi_shape)
        if need[1]:
            grads[1] = _unrows(kb, kb.add_(kb.matmul(dgh, w_hh), dh_prev), state_shape)
        stacks: dict = {}                     # each step's dG stacked once for both
        if need[2]:
            grads[2] = DeferredGrad(kb, "matmul_tn", w_hh.shape, (dgh, h_prev2), (), stacks)   # (3H, H)
        if len(need) - (keep is not None) == 4 and need[3]:
            grads[3] = DeferredGrad(kb, "sum", dgh.shape[1:], (dgh,), (0, False), stacks)
        return tuple(grads)

    @classmethod
    def examples(cls):
        return [Example((uniform(940, 2, 3), uniform(941, 2, 2), uniform(942, 6, 3), uniform(943, 6, 2),
                         uniform(944, 6), uniform(945, 6))),
                Example((uniform(946, 2, 1, 2), uniform(947, 2, 1, 1), uniform(948, 3, 2),
                         uniform(949, 3, 1))),                                       # no biases
                Example((uniform(950, 3), uniform(951, 1), uniform(952, 3, 3), uniform(953, 3, 1),
                         uniform(954, 3), uniform(955, 3))),                         # unbatched
                Example((uniform(956, 2, 1, 2), uniform(957, 2, 1, 1), uniform(958, 2, 1, 2),
                         uniform(959, 6, 3), uniform(960, 6, 2), uniform(961, 6), uniform(962, 6)),
                        {"parts": 2}),                                               # x = [y; c]
                Example((uniform(963, 3, 2), uniform(964, 3, 2), uniform(965, 6, 2), uniform(966, 6, 2),
                         uniform(967, 6), uniform(968, 6), np.array([[True], [False], [True]])),
                        {"masked": True}),                                           # a padded row
                Example((uniform(969, 2, 1, 2), uniform(970, 2, 1, 1), uniform(971, 2, 1, 2),
                         uniform(972, 6, 3), uniform(973, 6, 2), np.array([[[False]], [[True]]])),
                        {"parts": 2, "masked": True}),                               # no biases
                Example((uniform(974, 2, 6), uniform(975, 2, 2), uniform(976, 6, 2), uniform(977, 6)),
                        {"projected": True}),                                        # gi = x W_ih^T + b_ih
                Example((uniform(978, 3, 1, 3), uniform(979, 3, 1, 1), uniform(980, 3, 1),
                         np.array([[[True]], [[False]], [[True]]])),
                        {"projected": True, "masked": True})]                        # no bias, a padded row


@register
class LSTMCellState(Op):
    """c = sigmoid(f) c_prev + sigmoid(i) tanh(g), gates (..., 4H) in PyTorch's order (i, f, g, o).

    gates = x W_ih^T + b_ih + h W_hh^T + b_hh; c_prev and c are (..., H).  The o block is not
    used (``LSTMHidden`` reads it), so its gradient is zero.
    """

    kernels = ("lstm_cell_state", "lstm_cell_state_back", "reshape")

    @staticmethod
    def symbolic(sp, gates, c_prev):
        c_prev = np.asarray(c_prev, dtype=object)
        gates_i, gates_f, gates_g, _ = _blocks(gates, dim(c_prev, -1), 4)
        return _sigmoid(sp, gates_f) * c_prev + _sigmoid(sp, gates_i) * _tanh(sp, gates_g)

    def forward(self, gates, c_prev):
        _check_cell(self, ("gates", gates, 4), ("c_prev", c_prev, 1))
        kb = self.backend
        c_prev2 = _rows(kb, c_prev)                                     # (B, H)
        c, act = kb.lstm_cell_state(_rows(kb, gates), c_prev2)          # (B, H), (B, 3H)
        self.saved = (act, c_prev2, gates.shape, c_prev.shape)
        return _unrows(kb, c, c_prev.shape)

    def backward(self, dc):
        act, c_prev2, gates_shape, state_shape = self.saved
        kb = self.backend
        dgates, dc_prev = kb.lstm_cell_state_back(act, c_prev2, _rows(kb, dc))   # (B, 4H), (B, H)
        return _unrows(kb, dgates, gates_shape), _unrows(kb, dc_prev, state_shape)

    @classmethod
    def examples(cls):
        return [Example((uniform(910, 2, 8), uniform(911, 2, 2))),
                Example((uniform(912, 4), uniform(913, 1))),                             # unbatched
                Example((uniform(914, 2, 1, 4), uniform(915, 2, 1, 1)))]


@register
class LSTMHidden(Op):
    """h = sigmoid(o) tanh(c), o the last block of gates (..., 4H) in PyTorch's order (i, f, g, o).

    c is this step's cell state (..., H), the output of ``LSTMCellState``; the (i, f, g)
    blocks are not used, so their gradient is zero.
    """

    kernels = ("lstm_hidden", "lstm_hidden_back", "reshape")

    @staticmethod
    def symbolic(sp, gates, c):
        c = np.asarray(c, dtype=object)
        *_, gates_o = _blocks(gates, dim(c, -1), 4)
        return _sigmoid(sp, gates_o) * _tanh(sp, c)

    def forward(self, gates, c):
        _check_cell(self, ("gates", gates, 4), ("c", c, 1))
        kb = self.backend
        h, act = kb.lstm_hidden(_rows(kb, gates), _rows(kb, c))         # (B, H), (B, 2H)
        self.saved = (act, gates.shape, c.shape)
        return _unrows(kb, h, c.shape)

    def backward(self, dh):
        act, gates_shape, state_shape = self.saved
        kb = self.backend
        dgates, dc = kb.lstm_hidden_back(act, _rows(kb, dh))            # (B, 4H), (B, H)
        return _unrows(kb, dgates, gates_shape), _unrows(kb, dc, state_shape)

    @classmethod
    def examples(cls):
        return [Example((uniform(920, 2, 8), uniform(921, 2, 2))),
                Example((uniform(922, 4), uniform(923, 1))),                             # unbatched
                Example((uniform(924, 2, 1, 4), uniform(925, 2, 1, 1)))]
