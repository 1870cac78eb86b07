"""The reference harness: one op checked against an oracle, NumPy or PyTorch.

An op is a ``Case``: how to build it on engine tensors, on NumPy arrays (with, where NumPy
can state it independently, its gradient) and on torch tensors, and which inputs to draw.
``check_op`` builds the expression on engine leaves and on the oracle from the same arrays,
compares the outputs, runs backward with one cotangent on both sides and compares the
gradient of every input.

The two oracles see different things.  NumPy works in float64 and its gradients are written
by hand, independently of the engine (broadcast inputs are summed back by binning, not by
the engine's sum_to); where no NumPy gradient is written, NumPy checks the forward only.
PyTorch runs its own autograd, in float64 and, where a case asks, float32.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st

import tinygrad_attn as ta
from tests import optional

torch = optional.torch                 # None without PyTorch: only the torch oracle needs it
TF = torch.nn.functional if torch is not None else None

ORACLES = ("numpy", "torch")
TOLERANCE = {
    ("numpy", "float64"): {"rtol": 1e-12, "atol": 1e-12},
    ("torch", "float64"): {"rtol": 1e-10, "atol": 1e-12},
    ("torch", "float32"): {"rtol": 1e-5, "atol": 1e-6},
}


class Example(NamedTuple):
    """One drawn input: the arrays that become leaves, and the op's other arguments."""

    arrays: tuple[np.ndarray, ...]
    params: dict[str, Any]


@dataclass(frozen=True)
class Case:
    """One op (or expression) and its oracles.

    ``engine``, ``numpy`` and ``torch`` take the leaves positionally and ``params`` by
    keyword.  ``numpy_grad(dy, *arrays, **params)`` gives one gradient per array.
    ``inputs`` draws an ``Example``; ``dtypes`` are those torch is compared in (NumPy is
    float64 only).  ``torch_accepts(**params)`` is False for arguments torch reads
    differently (hypothesis then draws again).  ``invariant(y, **params)`` is a property of
    the engine's output checked alongside the NumPy comparison.
    """

    name: str
    engine: Callable[..., Any]
    numpy: Callable[..., Any] | None = None
    numpy_grad: Callable[..., tuple] | None = None
    torch: Callable[..., Any] | None = None
    inputs: st.SearchStrategy[Example] | None = None
    dtypes: tuple[str, ...] = ("float64",)
    torch_accepts: Callable[..., bool] | None = None
    invariant: Callable[..., None] | None = None

    def has(self, oracle: str) -> bool:
        return getattr(self, oracle) is not None


def as_array(x) -> np.ndarray:
    if isinstance(x, ta.Tensor):
        return x.numpy()
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x)


def assert_same(actual, expected, tol: dict[str, float], what: str = "output") -> None:
    """Same shape, same dtype, close values; assert_allclose also requires NaN and inf
    in the same places.  Booleans and integers must be equal."""
    actual, expected = as_array(actual), as_array(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.kind == "f":
        # np.allclose is the same test, several times cheaper; assert_allclose then says
        # what differs.
        if not np.allclose(actual, expected, equal_nan=True, **tol):
            np.testing.assert_allclose(actual, expected, err_msg=what, **tol)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The gradient of an input of ``shape`` broadcast up to ``g.shape``: each input entry
    collects the sum of ``g`` over every output position it was copied to.  Computed by
    broadcasting entry ids and binning, independently of the engine's sum_to."""
    size = math.prod(shape)
    ids = np.broadcast_to(np.arange(size).reshape(shape), g.shape)
    return np.bincount(ids.ravel(), weights=g.ravel(), minlength=size).reshape(shape)


def cotangent(shape: tuple[int, ...], dtype: str = "float64", seed: int = 0) -> np.ndarray:
    """A fixed random cotangent, so gradients are not just sums of ones."""
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape).astype(dtype)


def engine_leaves(arrays_in, dtype: str = "float64") -> list[ta.Tensor]:
    """The arrays as drawn (often non-contiguous views) as engine leaves."""
    return [ta.Tensor(a, dtype=dtype, requires_grad=True) for a in arrays_in]


def torch_leaves(arrays_in, dtype: str = "float64") -> list:
    """The same values as torch leaves: C-ordered copies, since torch rejects negative
    strides."""
    return [torch.tensor(np.array(a, order="C"), dtype=getattr(torch, dtype), requires_grad=True)
            for a in arrays_in]


def grads_of(leaves) -> list[np.ndarray]:
    """Each leaf's gradient; a leaf no output depends on has none, on either side: zeros."""
    return [np.zeros(leaf.shape, as_array(leaf).dtype) if leaf.grad is None else as_array(leaf.grad)
            for leaf in leaves]


def assert_grads_same(actual, expected, tol: dict[str, float]) -> None:
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert_same(a, e, tol, what=f"gradient of input {k}")


@contextlib.contextmanager
def one_torch_thread():
    """torch on one thread while it computes a reference: the tensors are tiny, and waking
    a second thread costs more than the work (milliseconds a call on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_op(case: Case, oracle: str, arrays_in, params: dict | None = None,
             dtype: str = "float64", dy: int | Callable[[tuple[int, ...]], np.ndarray] = 0):
    """Check ``case`` on ``arrays_in`` against ``oracle``: the output, then the gradient of
    every input for one cotangent ``dy``, the seed of a random one or a function of the
    output's shape.  Returns the engine's leaves for further checks."""
    params = params or {}
    tol = TOLERANCE[oracle, dtype]
    leaves = engine_leaves(arrays_in, dtype)
    y = case.engine(*leaves, **params)
    if oracle == "numpy":
        expected = np.asarray(case.numpy(*arrays_in, **params))
        if case.invariant is not None:
            case.invariant(y.numpy(), **params)
    else:
        reference = torch_leaves(arrays_in, dtype)
        with one_torch_thread():
            expected = y_ref = case.torch(*reference, **params)
    assert_same(y, expected, tol)
    if y.dtype == np.bool_ or (oracle == "numpy" and case.numpy_grad is None):
        return leaves
    g = (dy(y.shape) if callable(dy) else cotangent(y.shape, dtype, dy)).astype(dtype)
    y.backward(g)
    if oracle == "numpy":
        expected_grads = case.numpy_grad(g, *arrays_in, **params)
    else:
        with one_torch_thread():
            y_ref.backward(torch.tensor(g))
        expected_grads = grads_of(reference)
    assert_grads_same(grads_of(leaves), expected_grads, tol)
    return leaves
