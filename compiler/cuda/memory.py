"""Memory and dtype: device arrays from host data and back, fills, casts and copies."""

from __future__ import annotations

import numpy as np
from numba import cuda

from .device import THREADS, _blocks, _empty, _flat, _launch


def _on_device(x) -> bool:
    return bool(getattr(x, "__cuda_ndarray__", False))


def asarray(data, dtype):
    if _on_device(data):
        return data if data.dtype == np.dtype(dtype) else astype(data, dtype)
    return cuda.to_device(np.asarray(data, dtype=dtype, order="C"))


def to_numpy(x):
    if x.size == 0:
        return np.empty(x.shape, dtype=x.dtype)
    return x.copy_to_host()


@cuda.jit
def _fill_kernel(out, value):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = value


@cuda.jit
def _cast_kernel(out, x):
    # The store converts to out's dtype as numpy's astype does: toward zero to integers,
    # x != 0 to bool.
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = x[i]


def full(shape, value, dtype):
    out = _empty(shape, dtype)
    if out.size:
        _launch(_fill_kernel, _blocks(out.size), THREADS, _flat(out), np.dtype(dtype).type(value))
    return out


def zeros(shape, dtype):
    return full(shape, 0, dtype)


def astype(x, dtype):
    out = _empty(x.shape, dtype)
    if out.size:
        _launch(_cast_kernel, _blocks(out.size), THREADS, _flat(out), _flat(x))
    return out


def copy(x):
    return astype(x, x.dtype)


# ---------------------------------------------------------------- the table

KERNELS = {"asarray": asarray, "to_numpy": to_numpy, "zeros": zeros, "full": full, "astype": astype,
           "copy": copy}
