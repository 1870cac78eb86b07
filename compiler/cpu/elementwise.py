"""The elementwise maps numpy runs as several passes, compiled from compiler/scalar.py's
formulas: sigmoid (14x faster) and the ``*_back`` products (1.2-1.5x); numpy's own tanh,
exp and arithmetic already run at SIMD speed."""

from __future__ import annotations

from numba import float32, float64, vectorize

from .. import scalar
from ..numba_support import FAST, _sigmoid

# numba.vectorize makes numpy ufuncs (broadcasting, any layout) of the scalar formulas in
# compiler/scalar.py; explicit signatures compile them at import, from the disk cache after
# the first time.  Serial: these are memory-bound, and a second thread did not pay here.
_UNARY = [float32(float32), float64(float64)]
_BINARY = [float32(float32, float32), float64(float64, float64)]
_MAP = {"cache": True, "fastmath": FAST}


@vectorize(_UNARY, **_MAP)
def _sigmoid_map(x):
    return _sigmoid(x)      # numba_support's: the vectorising float32 exp inside


_tanh_back_map = vectorize(_BINARY, **_MAP)(scalar.tanh_back)
_sigmoid_back_map = vectorize(_BINARY, **_MAP)(scalar.sigmoid_back)
_relu_back_map = vectorize(_BINARY, **_MAP)(scalar.relu_back)


KERNELS = {"sigmoid": _sigmoid_map, "tanh_back": _tanh_back_map, "sigmoid_back": _sigmoid_back_map,
           "relu_back": _relu_back_map}
