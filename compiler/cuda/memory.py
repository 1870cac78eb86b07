"""Memory and dtype: device arrays from host data and back, fills, casts and copies."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ..reference.memory import dropout_multiplier as _host_multiplier
from ..reference.memory import guard_ids as _host_guard
from ..reference.memory import random_normal as _host_normal
from ..reference.memory import random_uniform as _host_uniform
from .device import THREADS, empty, launch, nblocks, ravel


def _on_device(x) -> bool:
    return bool(getattr(x, "__cuda_ndarray__", False))


def asarray(data, dtype):
    if _on_device(data):
        return data if data.dtype == np.dtype(dtype) else astype(data, dtype)
    return cuda.to_device(np.asarray(data, dtype=dtype, order="C"))


def from_host(data, dtype):
    # to_device copies: the host array needs no copy of its own (np.asarray keeps 0-d 0-d).
    return cuda.to_device(np.asarray(data, dtype=dtype, order="C"))


def random_normal(generator, shape, dtype):
    """The reference's draws (numpy's ``generator`` on the host) copied over, so a seed gives
    the same samples on every device.  Impure, as the reference's."""
    return cuda.to_device(_host_normal(generator, shape, dtype))


def random_uniform(generator, shape, dtype):
    return cuda.to_device(_host_uniform(generator, shape, dtype))


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
    out = empty(shape, dtype)
    if out.size:
        launch(_fill_kernel, nblocks(out.size), THREADS, ravel(out), np.dtype(dtype).type(value))
    return out


def zeros(shape, dtype):
    return full(shape, 0, dtype)


def astype(x, dtype):
    out = empty(x.shape, dtype)
    if out.size:
        launch(_cast_kernel, nblocks(out.size), THREADS, ravel(out), ravel(x))
    return out


def copy(x):
    return astype(x, x.dtype)


def dropout_multiplier(generator, shape, p, dtype):
    """Inverted dropout's multiplier (u >= p) / (1 - p), drawn on the host by numpy's
    ``generator`` and copied over: the reference's stream, so a seed gives the same masks
    here as on the host devices.  Impure: it advances ``generator`` (a captured plan runs it
    again at every replay)."""
    return cuda.to_device(_host_multiplier(generator, shape, p, dtype))


@cuda.jit
def _ids_outside_kernel(flag, ids, rows, ignore, has_ignore):
    # Any thread that finds a bad id stores 1: the stores race, but all store the same value.
    for i in range(cuda.grid(1), ids.shape[0], cuda.gridsize(1)):
        v = ids[i]
        if (v < 0 or v >= rows) and not (has_ignore and v == ignore):
            flag[0] = 1


def guard_ids(ids, rows, ignore, fail):
    """A check, not a value (the reference's): one kernel sets a flag when an id other than
    ``ignore`` lies outside [0, rows); only then are the ids copied to the host for
    ``fail(ids)``, which raises naming the bad one.  Returns None."""
    if not ids.size:
        return None
    if ids.dtype.kind == "u":
        # A kernel would compare unsigned ids with the signed bounds in floats: on the host.
        return _host_guard(to_numpy(ids), rows, ignore, fail)
    flag = zeros((1,), np.int8)
    launch(_ids_outside_kernel, nblocks(ids.size), THREADS, flag, ravel(ids), int(rows),
            0 if ignore is None else int(ignore), ignore is not None)
    if to_numpy(flag)[0]:                      # the one host read a check needs
        fail(to_numpy(ids))
    return None


def guard_finite(x, fail):
    """A check, not a value (the reference's), made on the host: it is meant for a loss, a
    0-d array, whose copy costs less than a launch."""
    host = to_numpy(x)
    if not np.isfinite(host).all():
        fail(host)
    return None


# ---------------------------------------------------------------- the table

KERNELS = {"asarray": asarray, "from_host": from_host, "random_normal": random_normal,
           "random_uniform": random_uniform, "to_numpy": to_numpy, "zeros": zeros, "full": full,
           "astype": astype, "copy": copy, "dropout_multiplier": dropout_multiplier, "guard_ids": guard_ids,
           "guard_finite": guard_finite}
