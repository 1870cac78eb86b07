"""GRU and LSTM cell gates: the elementwise part of a cell, between its matrix products."""

from __future__ import annotations

import numpy as np


def sigmoid(x):
    """1 / (1 + e^-x) with e raised to non-positive powers only (no overflow warning for a
    large |x|), in x's dtype."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)

#
# The elementwise part of a recurrent cell, after the two matrix products (left to BLAS).
# Gate orders and formulas are PyTorch's: GRU (r, z, n), LSTM (i, f, g, o).  Every array is
# 2-D and C-contiguous, rows are the batch, and H is the hidden size.
#
# Forward returns its output and the gate activations; backward takes those activations
# instead of recomputing them.  Why store rather than recompute: backward then runs no
# exp or tanh at all (the costly part of a cell), it multiplies exactly the values forward
# used, and the extra memory is one
# buffer the size of the gate pre-activations, which the graph keeps alive anyway.


def gru_gates(gi, gh, h_prev, keep=None):
    """GRU cell after its products: gi = x W_ih^T + b_ih, gh = h_prev W_hh^T + b_hh (B, 3H),
    h_prev (B, H) -> (h (B, H), gates (B, 3H) = [r, z, n]) with
    r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z), n = tanh(gi_n + r * gh_n),
    h = (1 - z) n + z h_prev, computed as n + z (h_prev - n) like PyTorch.

    ``keep``: optional boolean (B, 1), False at a padded step of a row: that row's h is
    h_prev itself (what ``where(keep, h, h_prev)`` would give, without the extra pass)."""
    hidden = h_prev.shape[1]
    gates = np.empty(gi.shape, dtype=gi.dtype)
    gates[:, : 2 * hidden] = sigmoid(gi[:, : 2 * hidden] + gh[:, : 2 * hidden])       # r, z
    r, z = gates[:, :hidden], gates[:, hidden : 2 * hidden]
    gates[:, 2 * hidden :] = np.tanh(gi[:, 2 * hidden :] + r * gh[:, 2 * hidden :])  # n
    n = gates[:, 2 * hidden :]
    h = n + z * (h_prev - n)
    if keep is not None:
        h = np.where(keep, h, h_prev)
    return h, gates


def gru_gates_back(gates, gh, h_prev, dh, keep=None):
    """Gradients (dgi, dgh, dh_prev) of gru_gates from its saved gates [r, z, n].

    The r and z blocks of dgi and dgh are equal (gi and gh enter those gates as a sum); the
    n blocks differ by the factor r that multiplies gh_n.  With ``keep``, a kept row's are
    as without it, and a padded row's h was h_prev: dgi = dgh = 0 and dh_prev = dh."""
    hidden = h_prev.shape[1]
    if keep is not None:
        passed = np.where(keep, 0, dh).astype(dh.dtype, copy=False)
        dh = np.where(keep, dh, 0).astype(dh.dtype, copy=False)
    r, z, n = gates[:, :hidden], gates[:, hidden : 2 * hidden], gates[:, 2 * hidden :]
    dn = dh * (1 - z) * (1 - n * n)                               # d h / d(gi_n + r gh_n)
    dz = dh * (h_prev - n) * z * (1 - z)
    dr = dn * gh[:, 2 * hidden :] * r * (1 - r)
    dgi = np.concatenate([dr, dz, dn], axis=1)                    # (B, 3H)
    dgh = np.concatenate([dr, dz, dn * r], axis=1)                # (B, 3H)
    dh_prev = dh * z
    if keep is not None:
        dh_prev = np.where(keep, dh_prev, passed)
    return dgi, dgh, dh_prev


def lstm_cell_state(gates, c_prev):
    """LSTM cell state from gates = x W_ih^T + b_ih + h W_hh^T + b_hh (B, 4H) and c_prev (B, H):
    c = sigmoid(f) c_prev + sigmoid(i) tanh(g) -> (c (B, H), act (B, 3H) =
    [sigmoid(i), sigmoid(f), tanh(g)]).  The o block is not read (lstm_hidden uses it)."""
    hidden = c_prev.shape[1]
    act = np.empty((gates.shape[0], 3 * hidden), dtype=gates.dtype)
    act[:, : 2 * hidden] = sigmoid(gates[:, : 2 * hidden])                        # i, f
    act[:, 2 * hidden :] = np.tanh(gates[:, 2 * hidden : 3 * hidden])             # g
    i, f, g = act[:, :hidden], act[:, hidden : 2 * hidden], act[:, 2 * hidden :]
    c = f * c_prev + i * g
    return c, act


def lstm_cell_state_back(act, c_prev, dc):
    """Gradients (dgates (B, 4H), dc_prev) of lstm_cell_state from its saved activations;
    the o block of dgates is zero (c does not depend on o)."""
    hidden = c_prev.shape[1]
    i, f, g = act[:, :hidden], act[:, hidden : 2 * hidden], act[:, 2 * hidden :]
    dgates = np.zeros((act.shape[0], 4 * hidden), dtype=act.dtype)
    dgates[:, :hidden] = dc * g * i * (1 - i)
    dgates[:, hidden : 2 * hidden] = dc * c_prev * f * (1 - f)
    dgates[:, 2 * hidden : 3 * hidden] = dc * i * (1 - g * g)
    return dgates, dc * f


def lstm_hidden(gates, c):
    """LSTM hidden state from the o block of gates (B, 4H) and the cell state c (B, H):
    h = sigmoid(o) tanh(c) -> (h (B, H), act (B, 2H) = [sigmoid(o), tanh(c)])."""
    hidden = c.shape[1]
    act = np.empty((gates.shape[0], 2 * hidden), dtype=gates.dtype)
    act[:, :hidden] = sigmoid(gates[:, 3 * hidden :])
    act[:, hidden:] = np.tanh(c)
    return act[:, :hidden] * act[:, hidden:], act


def lstm_hidden_back(act, dh):
    """Gradients (dgates (B, 4H), dc) of lstm_hidden from its saved activations; only the
    o block of dgates is non-zero."""
    hidden = dh.shape[1]
    o, tanh_c = act[:, :hidden], act[:, hidden:]
    dgates = np.zeros((act.shape[0], 4 * hidden), dtype=act.dtype)
    dgates[:, 3 * hidden :] = dh * tanh_c * o * (1 - o)
    return dgates, dh * o * (1 - tanh_c * tanh_c)


KERNELS = {
    "gru_gates": gru_gates, "gru_gates_back": gru_gates_back, "lstm_cell_state": lstm_cell_state,
    "lstm_cell_state_back": lstm_cell_state_back, "lstm_hidden": lstm_hidden,
    "lstm_hidden_back": lstm_hidden_back,
}
