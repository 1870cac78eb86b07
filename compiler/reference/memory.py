"""Memory and dtype: arrays from data, fills, casts and copies."""

from __future__ import annotations

import numpy as np


def asarray(data, dtype):
    # np.asarray(order="C"), not np.ascontiguousarray: the latter turns 0-d arrays into 1-d.
    return np.asarray(data, dtype=dtype, order="C")


def from_host(data, dtype):
    """A new array holding ``data``'s values (a host array) in ``dtype``: always a copy.

    Every Tensor made from host data (``Tensor(array)``, ``zeros``, ``arange``, a numpy
    operand) comes through here, so a captured plan copies the host array again at every
    replay, reading its values then, as eager code would; a source only the plan holds is
    folded into a constant instead (compiler/fold.py)."""
    return np.array(data, dtype=dtype, copy=True, order="C")


def random_normal(generator, shape, dtype):
    """Standard normal samples, ``generator.standard_normal(shape)`` in ``dtype``.  Impure:
    it advances ``generator`` (a captured plan draws again at every replay)."""
    return np.asarray(generator.standard_normal(shape), dtype=dtype, order="C")


def random_uniform(generator, shape, dtype):
    """Uniform samples in [0, 1), ``generator.random(shape)`` in ``dtype``.  Impure, as
    ``random_normal``."""
    return np.asarray(generator.random(shape), dtype=dtype, order="C")


def to_numpy(x):
    return x


def zeros(shape, dtype):
    return np.zeros(shape, dtype=dtype)


def full(shape, value, dtype):
    out = np.empty(shape, dtype=dtype)     # np.full's Python wrapper costs ~0.5 us more
    out.fill(value)
    return out


def astype(x, dtype):
    return x.astype(dtype, copy=True)


def copy(x):
    return x.copy()


def dropout_multiplier(generator, shape, p, dtype):
    """m = (u >= p) / (1 - p) entry by entry, u = ``generator.random(shape)`` uniform in
    [0, 1), in ``dtype`` (m = 0 everywhere when p >= 1): inverted dropout's multiplier, each
    entry kept with probability 1 - p and scaled so its expected value is 1.

    Impure: it advances ``generator`` by one ``random(shape)`` draw, the stream dropout has
    always drawn, so a seed gives the same masks on every device.  A captured plan must run
    it again at every replay and never keep its result."""
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    keep = generator.random(shape) >= p
    return np.asarray(keep * scale, dtype=dtype, order="C")


_UNSIGNED = {np.dtype(f"i{n}"): np.dtype(f"u{n}") for n in (4, 8)}


def guard_ids(ids, rows, ignore, fail):
    """A check, not a value: when an id other than ``ignore`` (None: none is exempt) lies
    outside [0, rows), call ``fail(ids)`` with the ids as a host array; ``fail`` raises the
    caller's error, naming the op and the bad id.  Returns None.

    The ops' range checks on ids and targets go through this kernel only, so a captured plan
    can tell them from reads of values: it runs the guard again at every replay (an id out of
    range would read outside the table) and nothing it returns flows into a result."""
    if not ids.size:
        return None
    unsigned = _UNSIGNED.get(ids.dtype)
    if unsigned is None or rows > np.iinfo(ids.dtype).max:
        bad = (ids < 0) | (ids >= rows)
    elif ignore is None:
        # One reduction finds any id outside [0, rows) in 32- and 64-bit ids: read as
        # unsigned, a negative is at least 2^31, more rows than the table has.
        if np.maximum.reduce(ids.view(unsigned), axis=None) < rows:
            return None
        bad = None
    else:
        bad = ids.view(unsigned) >= rows
    if bad is not None:
        if ignore is not None:
            bad &= ids != ignore
        if not bad.any():
            return None
    fail(ids)
    return None


def guard_finite(x, fail):
    """A check, not a value: when an entry of ``x`` is NaN or infinite, call ``fail(x)`` with
    ``x`` as a host array; ``fail`` raises the caller's error.  Returns None.  Training checks
    its loss with it before backward, so a captured step stops before an update, as eager."""
    if not np.isfinite(x).all():
        fail(np.asarray(x))
    return None


KERNELS = {
    "asarray": asarray, "from_host": from_host, "random_normal": random_normal,
    "random_uniform": random_uniform, "to_numpy": to_numpy, "zeros": zeros, "full": full, "astype": astype,
    "copy": copy, "dropout_multiplier": dropout_multiplier, "guard_ids": guard_ids,
    "guard_finite": guard_finite,
}
