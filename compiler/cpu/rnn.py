"""The elementwise part of GRU and LSTM cells.

These override the numpy reference kernels of the same names (``reference.gru_gates``
and partners, which state the formulas and PyTorch's gate orders).  The matrix products of
a cell stay on numpy's BLAS; what is fused here is everything between them: numpy spends
ten to twenty passes over memory and a temporary per pass on a GRU cell's gates, a kernel
spends one.  Forward stores the gate activations and backward reads them (see the
reference for why), so no backward kernel evaluates an exp or a tanh.

sigmoid and tanh come from ``numba_support``: polynomials that vectorise for float32, libm
for float64 (whose results equal the reference's to rounding).

Recurrent cells are often tiny (a seq2seq decoder step at B=8, H=32 is 256 entries, about
2 us of float32 work), and waking Numba's threads costs 9 to 90 us depending on the machine
and the thread pool, so each kernel has a serial driver and a ``prange`` driver over batch
rows, chosen by size, dtype and the measured launch cost (``PARALLEL_MIN_ENTRIES``).

Every kernel is compiled on first use and cached on disk (``cache=True``); inputs are made
C-contiguous 2-D so each kernel has one signature per float dtype.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..numba_support import FAST, cast_like, parallel_min, typed_sigmoid, typed_tanh

__all__ = ["KERNELS", "PARALLEL_MIN_ENTRIES"]

# B * H from which the prange drivers run, by dtype, where a parallel launch costs 10 µs;
# scaled by the launch cost measured in this process (numba_support.parallel_min).  From
# bench/rnn_cells.py --threshold on 2 Zen 4 cores.  float64 pays libm's exp and tanh (~10x
# float32's polynomials), so a second core pays off at smaller sizes.
PARALLEL_MIN_ENTRIES = {"float32": 8192, "float64": 2048}

# error_model="numpy": Python's model puts a zero test in front of every division (here only
# by 1 + e >= 1 and e^{2x} + 1 >= 1), which stops LLVM vectorising the loops: a float32
# sigmoid took 8.4 ns per entry with it and 0.4 ns without.
_JIT = {"cache": True, "fastmath": FAST, "error_model": "numpy"}


# ---------------------------------------------------------------- GRU rows


@njit(**_JIT)
def _gru_gates_row(gi, gh, h_prev, h, gates):
    hidden = h.shape[0]
    gi_r, gi_z, gi_n = gi[:hidden], gi[hidden : 2 * hidden], gi[2 * hidden :]
    gh_r, gh_z, gh_n = gh[:hidden], gh[hidden : 2 * hidden], gh[2 * hidden :]
    r, z, n = gates[:hidden], gates[hidden : 2 * hidden], gates[2 * hidden :]
    for j in range(hidden):
        rj = typed_sigmoid(gi_r[j] + gh_r[j])
        zj = typed_sigmoid(gi_z[j] + gh_z[j])
        nj = typed_tanh(gi_n[j] + rj * gh_n[j])
        r[j] = rj
        z[j] = zj
        n[j] = nj
        h[j] = nj + zj * (h_prev[j] - nj)


@njit(**_JIT)
def _gru_gates_back_row(gates, gh, h_prev, dh, dgi, dgh, dh_prev):
    hidden = dh.shape[0]
    r, z, n = gates[:hidden], gates[hidden : 2 * hidden], gates[2 * hidden :]
    gh_n = gh[2 * hidden :]
    dgi_r, dgi_z, dgi_n = dgi[:hidden], dgi[hidden : 2 * hidden], dgi[2 * hidden :]
    dgh_r, dgh_z, dgh_n = dgh[:hidden], dgh[hidden : 2 * hidden], dgh[2 * hidden :]
    for j in range(hidden):
        rj, zj, nj, dhj = r[j], z[j], n[j], dh[j]
        one = cast_like(rj, 1.0)
        dn = dhj * (one - zj) * (one - nj * nj)
        dz = dhj * (h_prev[j] - nj) * zj * (one - zj)
        dr = dn * gh_n[j] * rj * (one - rj)
        dgi_r[j] = dr
        dgi_z[j] = dz
        dgi_n[j] = dn
        dgh_r[j] = dr
        dgh_z[j] = dz
        dgh_n[j] = dn * rj
        dh_prev[j] = dhj * zj


@njit(**_JIT)
def _gru_gates_serial(gi, gh, h_prev, h, gates):
    for b in range(gi.shape[0]):
        _gru_gates_row(gi[b], gh[b], h_prev[b], h[b], gates[b])


@njit(parallel=True, **_JIT)
def _gru_gates_parallel(gi, gh, h_prev, h, gates):
    for b in prange(gi.shape[0]):
        _gru_gates_row(gi[b], gh[b], h_prev[b], h[b], gates[b])


@njit(**_JIT)
def _gru_gates_back_serial(gates, gh, h_prev, dh, dgi, dgh, dh_prev):
    for b in range(dh.shape[0]):
        _gru_gates_back_row(gates[b], gh[b], h_prev[b], dh[b], dgi[b], dgh[b], dh_prev[b])


@njit(parallel=True, **_JIT)
def _gru_gates_back_parallel(gates, gh, h_prev, dh, dgi, dgh, dh_prev):
    for b in prange(dh.shape[0]):
        _gru_gates_back_row(gates[b], gh[b], h_prev[b], dh[b], dgi[b], dgh[b], dh_prev[b])


# A padded row (keep False, a right-padded sequence past its end) keeps its state: h is
# h_prev, and backward passes dh to h_prev and nothing to the gates.  In the kernel, not as a
# where() after it: that was one more pass forward and two backward, at every padded step.


@njit(**_JIT)
def _gru_gates_masked_serial(gi, gh, h_prev, keep, h, gates):
    for b in range(gi.shape[0]):
        _gru_gates_row(gi[b], gh[b], h_prev[b], h[b], gates[b])
        if not keep[b]:
            h[b, :] = h_prev[b]


@njit(parallel=True, **_JIT)
def _gru_gates_masked_parallel(gi, gh, h_prev, keep, h, gates):
    for b in prange(gi.shape[0]):
        _gru_gates_row(gi[b], gh[b], h_prev[b], h[b], gates[b])
        if not keep[b]:
            h[b, :] = h_prev[b]


@njit(**_JIT)
def _gru_gates_back_masked_row(b, gates, gh, h_prev, dh, keep, dgi, dgh, dh_prev):
    """Row b's gradients; a padded row (keep False) passes dh straight to its old state."""
    if keep[b]:
        _gru_gates_back_row(gates[b], gh[b], h_prev[b], dh[b], dgi[b], dgh[b], dh_prev[b])
    else:
        dgi[b, :] = 0
        dgh[b, :] = 0
        dh_prev[b, :] = dh[b]


@njit(**_JIT)
def _gru_gates_back_masked_serial(gates, gh, h_prev, dh, keep, dgi, dgh, dh_prev):
    for b in range(dh.shape[0]):
        _gru_gates_back_masked_row(b, gates, gh, h_prev, dh, keep, dgi, dgh, dh_prev)


@njit(parallel=True, **_JIT)
def _gru_gates_back_masked_parallel(gates, gh, h_prev, dh, keep, dgi, dgh, dh_prev):
    for b in prange(dh.shape[0]):
        _gru_gates_back_masked_row(b, gates, gh, h_prev, dh, keep, dgi, dgh, dh_prev)


# ---------------------------------------------------------------- LSTM rows


@njit(**_JIT)
def _lstm_cell_state_row(gates, c_prev, c, act):
    hidden = c.shape[0]
    gates_i, gates_f, gates_g = gates[:hidden], gates[hidden : 2 * hidden], gates[2 * hidden : 3 * hidden]
    i, f, g = act[:hidden], act[hidden : 2 * hidden], act[2 * hidden :]
    for j in range(hidden):
        ij = typed_sigmoid(gates_i[j])
        fj = typed_sigmoid(gates_f[j])
        gj = typed_tanh(gates_g[j])
        i[j] = ij
        f[j] = fj
        g[j] = gj
        c[j] = fj * c_prev[j] + ij * gj


@njit(**_JIT)
def _lstm_cell_state_back_row(act, c_prev, dc, dgates, dc_prev):
    hidden = dc.shape[0]
    i, f, g = act[:hidden], act[hidden : 2 * hidden], act[2 * hidden :]
    dgates_i, dgates_f = dgates[:hidden], dgates[hidden : 2 * hidden]
    dgates_g, dgates_o = dgates[2 * hidden : 3 * hidden], dgates[3 * hidden :]
    for j in range(hidden):
        ij, fj, gj, dcj = i[j], f[j], g[j], dc[j]
        one = cast_like(ij, 1.0)
        dgates_i[j] = dcj * gj * ij * (one - ij)
        dgates_f[j] = dcj * c_prev[j] * fj * (one - fj)
        dgates_g[j] = dcj * ij * (one - gj * gj)
        dgates_o[j] = 0.0
        dc_prev[j] = dcj * fj


@njit(**_JIT)
def _lstm_hidden_row(gates, c, h, act):
    hidden = c.shape[0]
    gates_o = gates[3 * hidden :]
    o, tanh_c = act[:hidden], act[hidden:]
    for j in range(hidden):
        oj = typed_sigmoid(gates_o[j])
        tj = typed_tanh(c[j])
        o[j] = oj
        tanh_c[j] = tj
        h[j] = oj * tj


@njit(**_JIT)
def _lstm_hidden_back_row(act, dh, dgates, dc):
    hidden = dh.shape[0]
    o, tanh_c = act[:hidden], act[hidden:]
    dgates_o = dgates[3 * hidden :]
    for j in range(3 * hidden):
        dgates[j] = 0.0
    for j in range(hidden):
        oj, tj, dhj = o[j], tanh_c[j], dh[j]
        one = cast_like(oj, 1.0)
        dgates_o[j] = dhj * tj * oj * (one - oj)
        dc[j] = dhj * oj * (one - tj * tj)


@njit(**_JIT)
def _lstm_cell_state_serial(gates, c_prev, c, act):
    for b in range(c.shape[0]):
        _lstm_cell_state_row(gates[b], c_prev[b], c[b], act[b])


@njit(parallel=True, **_JIT)
def _lstm_cell_state_parallel(gates, c_prev, c, act):
    for b in prange(c.shape[0]):
        _lstm_cell_state_row(gates[b], c_prev[b], c[b], act[b])


@njit(**_JIT)
def _lstm_cell_state_back_serial(act, c_prev, dc, dgates, dc_prev):
    for b in range(dc.shape[0]):
        _lstm_cell_state_back_row(act[b], c_prev[b], dc[b], dgates[b], dc_prev[b])


@njit(parallel=True, **_JIT)
def _lstm_cell_state_back_parallel(act, c_prev, dc, dgates, dc_prev):
    for b in prange(dc.shape[0]):
        _lstm_cell_state_back_row(act[b], c_prev[b], dc[b], dgates[b], dc_prev[b])


@njit(**_JIT)
def _lstm_hidden_serial(gates, c, h, act):
    for b in range(c.shape[0]):
        _lstm_hidden_row(gates[b], c[b], h[b], act[b])


@njit(parallel=True, **_JIT)
def _lstm_hidden_parallel(gates, c, h, act):
    for b in prange(c.shape[0]):
        _lstm_hidden_row(gates[b], c[b], h[b], act[b])


@njit(**_JIT)
def _lstm_hidden_back_serial(act, dh, dgates, dc):
    for b in range(dh.shape[0]):
        _lstm_hidden_back_row(act[b], dh[b], dgates[b], dc[b])


@njit(parallel=True, **_JIT)
def _lstm_hidden_back_parallel(act, dh, dgates, dc):
    for b in prange(dh.shape[0]):
        _lstm_hidden_back_row(act[b], dh[b], dgates[b], dc[b])


# ---------------------------------------------------------------- kernels (the reference's signatures)


def _use_prange(entries: int, dtype) -> bool:
    # itemsize, not dtype.name: the name is rebuilt on every access (~30 us, per gate kernel).
    return entries >= parallel_min(PARALLEL_MIN_ENTRIES["float32" if dtype.itemsize == 4 else "float64"])


def _driver(out, serial, parallel):
    """The prange driver when ``out`` (the kernel's (B, H) output) is large enough."""
    return parallel if _use_prange(out.size, out.dtype) else serial


def _c(x):
    return np.ascontiguousarray(x)


def gru_gates(gi, gh, h_prev, keep=None):
    gi, gh, h_prev = _c(gi), _c(gh), _c(h_prev)
    h = np.empty(h_prev.shape, dtype=gi.dtype)
    gates = np.empty(gi.shape, dtype=gi.dtype)
    if keep is None:
        _driver(h, _gru_gates_serial, _gru_gates_parallel)(gi, gh, h_prev, h, gates)
    else:
        _driver(h, _gru_gates_masked_serial, _gru_gates_masked_parallel)(gi, gh, h_prev, _rows_kept(keep), h,
                                                                          gates)
    return h, gates


def gru_gates_back(gates, gh, h_prev, dh, keep=None):
    gates, gh, h_prev, dh = _c(gates), _c(gh), _c(h_prev), _c(dh)
    dgi = np.empty(gates.shape, dtype=gates.dtype)
    dgh = np.empty(gates.shape, dtype=gates.dtype)
    dh_prev = np.empty(dh.shape, dtype=gates.dtype)
    if keep is None:
        _driver(dh_prev, _gru_gates_back_serial, _gru_gates_back_parallel)(
            gates, gh, h_prev, dh, dgi, dgh, dh_prev)
    else:
        _driver(dh_prev, _gru_gates_back_masked_serial, _gru_gates_back_masked_parallel)(
            gates, gh, h_prev, dh, _rows_kept(keep), dgi, dgh, dh_prev)
    return dgi, dgh, dh_prev


def _rows_kept(keep):
    """The (B, 1) boolean column as (B,), one signature whatever its layout."""
    return np.ascontiguousarray(keep, dtype=np.bool_).reshape(-1)


def lstm_cell_state(gates, c_prev):
    gates, c_prev = _c(gates), _c(c_prev)
    c = np.empty(c_prev.shape, dtype=gates.dtype)
    act = np.empty((c.shape[0], 3 * c.shape[1]), dtype=gates.dtype)
    _driver(c, _lstm_cell_state_serial, _lstm_cell_state_parallel)(gates, c_prev, c, act)
    return c, act


def lstm_cell_state_back(act, c_prev, dc):
    act, c_prev, dc = _c(act), _c(c_prev), _c(dc)
    dgates = np.empty((dc.shape[0], 4 * dc.shape[1]), dtype=act.dtype)
    dc_prev = np.empty(dc.shape, dtype=act.dtype)
    _driver(dc_prev, _lstm_cell_state_back_serial, _lstm_cell_state_back_parallel)(
        act, c_prev, dc, dgates, dc_prev)
    return dgates, dc_prev


def lstm_hidden(gates, c):
    gates, c = _c(gates), _c(c)
    h = np.empty(c.shape, dtype=gates.dtype)
    act = np.empty((c.shape[0], 2 * c.shape[1]), dtype=gates.dtype)
    _driver(h, _lstm_hidden_serial, _lstm_hidden_parallel)(gates, c, h, act)
    return h, act


def lstm_hidden_back(act, dh):
    act, dh = _c(act), _c(dh)
    dgates = np.empty((dh.shape[0], 4 * dh.shape[1]), dtype=act.dtype)
    dc = np.empty(dh.shape, dtype=act.dtype)
    _driver(dc, _lstm_hidden_back_serial, _lstm_hidden_back_parallel)(act, dh, dgates, dc)
    return dgates, dc


KERNELS = {
    "gru_gates": gru_gates,
    "gru_gates_back": gru_gates_back,
    "lstm_cell_state": lstm_cell_state,
    "lstm_cell_state_back": lstm_cell_state_back,
    "lstm_hidden": lstm_hidden,
    "lstm_hidden_back": lstm_hidden_back,
}
