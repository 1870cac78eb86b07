"""GRU and LSTM cell gates, one thread per entry."""

from __future__ import annotations

import math

from numba import cuda

from .device import THREADS, empty, launch, nblocks


@cuda.jit(device=True)
def typed_sigmoid(x):
    """1 / (1 + e^-x), raising e to non-positive powers only (no overflow for a large |x|)."""
    e = math.exp(-abs(x))
    s = 1.0 / (1.0 + e)
    return s if x >= 0 else e * s


@cuda.jit(device=True)
def _gru_entry(h, gates, gi, gh, h_prev, b, c):
    """Entry (b, c): r, z, n of PyTorch's GRU and h = n + z (h_prev - n)."""
    hidden = h_prev.shape[1]
    # Each gate is read back once stored, so what follows uses exactly the rounded values
    # backward will see (as the reference, which computes in arrays of the input dtype).
    gates[b, c] = typed_sigmoid(gi[b, c] + gh[b, c])
    gates[b, hidden + c] = typed_sigmoid(gi[b, hidden + c] + gh[b, hidden + c])
    gates[b, 2 * hidden + c] = math.tanh(gi[b, 2 * hidden + c] + gates[b, c] * gh[b, 2 * hidden + c])
    n = gates[b, 2 * hidden + c]
    h[b, c] = n + gates[b, hidden + c] * (h_prev[b, c] - n)


@cuda.jit(device=True)
def _gru_back_entry(dgi, dgh, dh_prev, gates, gh, h_prev, dh, b, c):
    hidden = h_prev.shape[1]
    r = gates[b, c]
    z = gates[b, hidden + c]
    n = gates[b, 2 * hidden + c]
    g = dh[b, c]
    dn = g * (1 - z) * (1 - n * n)
    dz = g * (h_prev[b, c] - n) * z * (1 - z)
    dr = dn * gh[b, 2 * hidden + c] * r * (1 - r)
    dgi[b, c] = dr
    dgi[b, hidden + c] = dz
    dgi[b, 2 * hidden + c] = dn
    dgh[b, c] = dr
    dgh[b, hidden + c] = dz
    dgh[b, 2 * hidden + c] = dn * r
    dh_prev[b, c] = g * z


@cuda.jit
def _gru_gates_kernel(h, gates, gi, gh, h_prev):
    """One thread per (b, c)."""
    hidden = h_prev.shape[1]
    for flat in range(cuda.grid(1), h.shape[0] * hidden, cuda.gridsize(1)):
        _gru_entry(h, gates, gi, gh, h_prev, flat // hidden, flat % hidden)


@cuda.jit
def _gru_gates_masked_kernel(h, gates, gi, gh, h_prev, keep):
    """As _gru_gates_kernel; a row whose keep is False keeps h_prev (a padded step)."""
    hidden = h_prev.shape[1]
    for flat in range(cuda.grid(1), h.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        c = flat % hidden
        _gru_entry(h, gates, gi, gh, h_prev, b, c)
        if not keep[b, 0]:
            h[b, c] = h_prev[b, c]


@cuda.jit
def _gru_gates_back_kernel(dgi, dgh, dh_prev, gates, gh, h_prev, dh):
    hidden = h_prev.shape[1]
    for flat in range(cuda.grid(1), dh.shape[0] * hidden, cuda.gridsize(1)):
        _gru_back_entry(dgi, dgh, dh_prev, gates, gh, h_prev, dh, flat // hidden, flat % hidden)


@cuda.jit
def _gru_gates_back_masked_kernel(dgi, dgh, dh_prev, gates, gh, h_prev, dh, keep):
    """As _gru_gates_back_kernel; a padded row passes dh to h_prev and nothing to the gates."""
    hidden = h_prev.shape[1]
    for flat in range(cuda.grid(1), dh.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        c = flat % hidden
        if keep[b, 0]:
            _gru_back_entry(dgi, dgh, dh_prev, gates, gh, h_prev, dh, b, c)
        else:
            dgi[b, c] = 0
            dgi[b, hidden + c] = 0
            dgi[b, 2 * hidden + c] = 0
            dgh[b, c] = 0
            dgh[b, hidden + c] = 0
            dgh[b, 2 * hidden + c] = 0
            dh_prev[b, c] = dh[b, c]


@cuda.jit
def _lstm_cell_state_kernel(c_out, act, gates, c_prev):
    hidden = c_prev.shape[1]
    for flat in range(cuda.grid(1), c_out.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        j = flat % hidden
        act[b, j] = typed_sigmoid(gates[b, j])
        act[b, hidden + j] = typed_sigmoid(gates[b, hidden + j])
        act[b, 2 * hidden + j] = math.tanh(gates[b, 2 * hidden + j])
        c_out[b, j] = act[b, hidden + j] * c_prev[b, j] + act[b, j] * act[b, 2 * hidden + j]


@cuda.jit
def _lstm_cell_state_back_kernel(dgates, dc_prev, act, c_prev, dc):
    hidden = c_prev.shape[1]
    for flat in range(cuda.grid(1), dc.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        j = flat % hidden
        i_gate = act[b, j]
        f_gate = act[b, hidden + j]
        g_gate = act[b, 2 * hidden + j]
        g = dc[b, j]
        dgates[b, j] = g * g_gate * i_gate * (1 - i_gate)
        dgates[b, hidden + j] = g * c_prev[b, j] * f_gate * (1 - f_gate)
        dgates[b, 2 * hidden + j] = g * i_gate * (1 - g_gate * g_gate)
        dgates[b, 3 * hidden + j] = 0
        dc_prev[b, j] = g * f_gate


@cuda.jit
def _lstm_hidden_kernel(h, act, gates, c):
    hidden = c.shape[1]
    for flat in range(cuda.grid(1), h.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        j = flat % hidden
        act[b, j] = typed_sigmoid(gates[b, 3 * hidden + j])
        act[b, hidden + j] = math.tanh(c[b, j])
        h[b, j] = act[b, j] * act[b, hidden + j]


@cuda.jit
def _lstm_hidden_back_kernel(dgates, dc, act, dh):
    hidden = dh.shape[1]
    for flat in range(cuda.grid(1), dh.shape[0] * hidden, cuda.gridsize(1)):
        b = flat // hidden
        j = flat % hidden
        o_gate = act[b, j]
        tanh_c = act[b, hidden + j]
        g = dh[b, j]
        dgates[b, j] = 0
        dgates[b, hidden + j] = 0
        dgates[b, 2 * hidden + j] = 0
        dgates[b, 3 * hidden + j] = g * tanh_c * o_gate * (1 - o_gate)
        dc[b, j] = g * o_gate * (1 - tanh_c * tanh_c)


def _cell_launch(kernel, batch, hidden, *args):
    if batch * hidden:
        launch(kernel, nblocks(batch * hidden), THREADS, *args)


def gru_gates(gi, gh, h_prev, keep=None):
    """GRU cell after its products (see reference.gru_gates): -> (h (B, H), gates (B, 3H));
    ``keep`` an optional boolean (B, 1), False where a row keeps h_prev."""
    batch, hidden = h_prev.shape
    h = empty((batch, hidden), gi.dtype)
    gates = empty(gi.shape, gi.dtype)
    if keep is None:
        _cell_launch(_gru_gates_kernel, batch, hidden, h, gates, gi, gh, h_prev)
    else:
        _cell_launch(_gru_gates_masked_kernel, batch, hidden, h, gates, gi, gh, h_prev, keep)
    return h, gates


def gru_gates_back(gates, gh, h_prev, dh, keep=None):
    batch, hidden = h_prev.shape
    dgi = empty(gates.shape, gates.dtype)
    dgh = empty(gates.shape, gates.dtype)
    dh_prev = empty((batch, hidden), gates.dtype)
    if keep is None:
        _cell_launch(_gru_gates_back_kernel, batch, hidden, dgi, dgh, dh_prev, gates, gh, h_prev, dh)
    else:
        _cell_launch(_gru_gates_back_masked_kernel, batch, hidden, dgi, dgh, dh_prev, gates, gh, h_prev, dh,
                     keep)
    return dgi, dgh, dh_prev


def lstm_cell_state(gates, c_prev):
    """LSTM cell state (see reference.lstm_cell_state): -> (c (B, H), act (B, 3H))."""
    batch, hidden = c_prev.shape
    c = empty((batch, hidden), gates.dtype)
    act = empty((batch, 3 * hidden), gates.dtype)
    _cell_launch(_lstm_cell_state_kernel, batch, hidden, c, act, gates, c_prev)
    return c, act


def lstm_cell_state_back(act, c_prev, dc):
    batch, hidden = c_prev.shape
    dgates = empty((batch, 4 * hidden), act.dtype)
    dc_prev = empty((batch, hidden), act.dtype)
    _cell_launch(_lstm_cell_state_back_kernel, batch, hidden, dgates, dc_prev, act, c_prev, dc)
    return dgates, dc_prev


def lstm_hidden(gates, c):
    """LSTM hidden state (see reference.lstm_hidden): -> (h (B, H), act (B, 2H))."""
    batch, hidden = c.shape
    h = empty((batch, hidden), gates.dtype)
    act = empty((batch, 2 * hidden), gates.dtype)
    _cell_launch(_lstm_hidden_kernel, batch, hidden, h, act, gates, c)
    return h, act


def lstm_hidden_back(act, dh):
    batch, hidden = dh.shape
    dgates = empty((batch, 4 * hidden), act.dtype)
    dc = empty((batch, hidden), act.dtype)
    _cell_launch(_lstm_hidden_back_kernel, batch, hidden, dgates, dc, act, dh)
    return dgates, dc


# ---------------------------------------------------------------- the table

KERNELS = {
    "gru_gates": gru_gates, "gru_gates_back": gru_gates_back, "lstm_cell_state": lstm_cell_state,
    "lstm_cell_state_back": lstm_cell_state_back, "lstm_hidden": lstm_hidden,
    "lstm_hidden_back": lstm_hidden_back,
}
