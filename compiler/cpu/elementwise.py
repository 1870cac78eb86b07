"""Numba ufuncs built from the formulas (``formulas.py``): the elementwise kernels numpy
would run as several passes over memory (sigmoid, the ``*_back`` products, relu), fused into
one.  A formula that is one numpy call (tanh, exp, a product) stays numpy's, already SIMD.
And ``add_`` where it adds a bias to every row (below).

The printed scalar function goes into a small module in the kernel cache folder, named by a
hash of its source and of ``numba_support`` (whose exp and tanh it inlines), so Numba's disk
cache (``cache=True``) serves it from the second process on; ``numba.vectorize`` with
explicit float32 and float64 signatures makes it a numpy ufunc (broadcasting, any layout).
Serial: these are memory-bound, and a second thread did not pay here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys

import numpy as np
from numba import njit

from .. import formulas, numba_support
from ..formulas import Kernel
from ..reference import elementwise as reference
from ..reference.elementwise import quiet_overflow

_HEADER = f'''"""Generated from a formula (compiler/formulas.py); never edited."""

import math

from numba import boolean, float32, float64, vectorize

from {numba_support.__name__} import FAST, typed_exp, cast_like, typed_tanh
'''


def _support_hash() -> str:
    with open(numba_support.__file__, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()


_SUPPORT = _support_hash()


def _signature(kernel: Kernel, width: int) -> str:
    real = f"float{width}"
    args = ["boolean" if a in kernel.bools else real for a in kernel.args] + [real] * len(kernel.params)
    return f"{'boolean' if kernel.boolean else real}({', '.join(args)})"


def module_source(kernel: Kernel) -> str:
    signatures = f"[{_signature(kernel, 32)}, {_signature(kernel, 64)}]"
    return (f"{_HEADER}\n\n@vectorize({signatures}, cache=True, fastmath=FAST)\n{kernel.numba}")


def build(kernel: Kernel):
    """The Numba ufunc of ``kernel``, from its module in the cache folder."""
    source = module_source(kernel)
    digest = hashlib.sha256((source + _SUPPORT).encode()).hexdigest()[:20]
    module_name = f"{kernel.name}_{digest}"
    path = os.path.join(formulas.cache_dir(), "numba", f"{module_name}.py")
    if not os.path.exists(path):
        formulas.write_atomically(path, source)
    spec = importlib.util.spec_from_file_location(f"{__name__}.generated.{module_name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    ufunc = getattr(module, kernel.name)
    return quiet_overflow(ufunc) if kernel.overflows else ufunc


@njit(cache=True, nogil=True)
def _add_rows(a, b):
    for r in range(a.shape[0]):
        row = a[r]
        for j in range(b.shape[0]):
            row[j] += b[j]


def add_(a, b):
    """The reference's ``add_`` (a += b in place, returning a), the same sums.  A Linear's
    bias, b (N,) added to every row of a C-contiguous (..., N) array of b's float dtype, is
    one Numba loop: numpy's add broadcasting b took 1.2-2.1x as long a call, one thread,
    float32 ((64, 128): 1.7 against 1.4 us; (64, 384): 3.1 against 2.0; (640, 384): 26.8
    against 12.7), and a decoding step adds a bias after each of its 13 products.  Anything
    else, memory shared between a and b included, goes to numpy."""
    if (type(a) is np.ndarray and type(b) is np.ndarray and b.ndim == 1 and a.ndim >= 1 and a.size
            and a.dtype == b.dtype and a.dtype in numba_support.FLOATS and a.shape[-1] == b.shape[0]
            and a.flags.c_contiguous and a.flags.writeable and b.flags.c_contiguous
            and not np.may_share_memory(a, b)):
        _add_rows(a.reshape(-1, b.shape[0]), b)
        return a
    return reference.add_(a, b)


KERNELS: dict = {"add_": add_}
