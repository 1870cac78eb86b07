"""Tensor: an array on a device, the gradient it accumulates, and the node that made it.

Floats default to float32; float64 is supported throughout (the checks use it); integer
tensors hold ids and boolean tensors hold masks, and neither can require grad.  Operands of
one op must share dtype and device: nothing is converted or broadcast behind your back
except Python scalars, which take the tensor's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from . import autograd
from . import random as _random
from .autograd import DTypeError, Node
from .compiler import get_backend
from .ops import (
    Add,
    Cast,
    Cat,
    Div,
    Exp,
    Expand,
    GetItem,
    LeakyRelu,
    Log,
    LogSoftmax,
    MaskedFill,
    MatMul,
    Max,
    Mean,
    Mul,
    Neg,
    Permute,
    Pow,
    Relu,
    Reshape,
    Sigmoid,
    Softmax,
    Stack,
    Sub,
    Sum,
    Tanh,
    Where,
)

__all__ = ["default_float", "DTYPES"]

default_float = np.dtype(np.float32)
DTYPES = tuple(np.dtype(d) for d in ("float32", "float64", "int32", "int64", "bool"))


def _resolve_dtype(dtype, data: np.ndarray) -> np.dtype:
    if dtype is not None:
        resolved = np.dtype(dtype)
        if resolved not in DTYPES:
            raise DTypeError(f"Tensor: unsupported dtype {resolved}; use one of "
                             f"{', '.join(str(d) for d in DTYPES)}")
        return resolved
    kind = data.dtype.kind
    if kind == "f":
        return default_float
    if kind in "iu":
        return np.dtype(np.int64)
    if kind == "b":
        return np.dtype(np.bool_)
    raise DTypeError(f"Tensor: cannot make a tensor from data of dtype {data.dtype}")


def _check_grad_dtype(requires_grad: bool, dtype: np.dtype, shape) -> None:
    if requires_grad and dtype.kind != "f":
        raise DTypeError(f"Tensor: only float tensors can require grad, got {dtype} of shape {shape}")


class Version:
    """A count of in-place changes, shared by a tensor and the views of its memory.

    ``backward()`` compares it with the count each op recorded when it ran (PyTorch keeps a
    version counter for the same reason).
    """

    # A class default, not __init__: every tensor an op makes gets a Version, and this way
    # making one costs ~85 ns instead of ~145 (the first change gives the instance its own).
    count = 0


class Tensor:
    """An n-dimensional array that records how it was computed, for reverse-mode autodiff.

    Args:
        data: a numpy array, nested list, scalar or Tensor (always copied).
        requires_grad: accumulate d(output)/d(this) into ``.grad`` on ``backward()``.
        dtype: float32 (default for float data), float64, int64 (default for integer
            data), int32 or bool.
        device: "cpu" (default), "numpy" (the reference kernels) or "cuda".
        name: a label for graph drawings (parameters get their module path).

    Example:
        >>> x = Tensor([[1.0, 2.0]], requires_grad=True)
        >>> y = (x * x).sum()
        >>> y.backward()
        >>> x.grad.numpy()
        array([[2., 4.]], dtype=float32)
    """

    # __weakref__: a compiled plan holds the tensors it reads that no module holds weakly.
    __slots__ = ("_data", "_version", "backend", "requires_grad", "_grad", "node", "name",
                 "_retains_grad", "__weakref__")
    # Make numpy defer to Tensor's reflected operators: ndarray * Tensor -> Tensor.__rmul__.
    __array_ufunc__ = None

    def __init__(self, data, requires_grad: bool = False, dtype=None, device: str = "cpu",
                 name: str | None = None):
        if isinstance(data, Tensor):
            data = data.numpy()
        array = np.asarray(data)
        resolved = _resolve_dtype(dtype, array)
        if array.dtype == np.uint64 and resolved.kind == "i" and array.size and \
                array.max() > np.iinfo(np.int64).max:
            # int64 would wrap these round to negative numbers without a word.
            raise DTypeError(f"Tensor: uint64 value {int(array.max())} does not fit in int64")
        _check_grad_dtype(requires_grad, resolved, array.shape)
        self.backend = get_backend(device)
        # A kernel, not a host copy: a compiled function's plan copies the data again at
        # every replay (a numpy array the caller changes is read afresh).
        self._data = self.backend.from_host(array, resolved)
        self._version = Version()
        self.requires_grad = bool(requires_grad)
        self._grad: Tensor | None = None
        self.node: Node | None = None
        self.name = name
        self._retains_grad = False
        if autograd.state.capture is not None:
            autograd.state.capture.made_tensor(self)

    @classmethod
    def _make(cls, data, backend, requires_grad: bool) -> Tensor:
        """Wrap an array an op produced on ``backend`` (no copy, no checks): the hot path."""
        t = object.__new__(cls)
        t._data = data
        t._version = Version()
        t.backend = backend
        t.requires_grad = requires_grad
        t._grad = None
        t.node = None
        t.name = None
        t._retains_grad = False
        return t

    @classmethod
    def _made(cls, data, backend, requires_grad: bool) -> Tensor:
        """``_make`` for a tensor handed to user code outside ``Op.apply`` (a comparison's
        mask, a cast, a norm): reported to a ``ta.compile`` capture in progress, which must
        know the tensors a function makes (one it keeps in Python outlives the call)."""
        t = cls._make(data, backend, requires_grad)
        if autograd.state.capture is not None:
            autograd.state.capture.made_tensor(t)
        return t

    # ------------------------------------------------------------ properties

    @property
    def data(self):
        """The raw array (numpy on the CPU devices, a device array on "cuda"), to change in
        place: ``p.data -= lr * p.grad.data``.

        Handing it out counts as a change of the values (the tensor's ``version`` goes up),
        because nothing can see what is then written into it: a graph that saved this
        tensor before refuses ``backward()`` with an error naming the op, instead of
        computing gradients from the new values.  So change values after backward (as an
        optimizer step does), and read them with ``.numpy()``, which is free of this rule.
        """
        if autograd.state.capture is not None:
            autograd.state.capture.refuse(".data handed out")
        self._version.count += 1
        return self._data

    @data.setter
    def data(self, array) -> None:
        if autograd.state.capture is not None:
            autograd.state.capture.refuse(".data assigned")
        self._version.count += 1
        self._data = array

    @property
    def grad(self) -> Tensor | None:
        """The gradient ``backward()`` accumulated into this leaf (None until then)."""
        if autograd.state.capture is not None:
            autograd.state.capture.grad_read(self)
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if autograd.state.capture is not None:
            autograd.state.capture.grad_set(self)
        self._grad = value

    @property
    def version(self) -> int:
        """How many times this tensor's memory may have been changed in place (``.data``
        handed out or assigned, an optimizer step); views and ``detach()`` share it."""
        return self._version.count

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def device(self) -> str:
        return self.backend.name

    @property
    def ndim(self) -> int:
        return len(self._data.shape)

    @property
    def size(self) -> int:
        return math.prod(self._data.shape)

    @property
    def is_leaf(self) -> bool:
        return self.node is None

    @property
    def T(self) -> Tensor:
        """All axes reversed (a matrix transpose for 2-D tensors)."""
        return self.permute(*reversed(range(self.ndim)))

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # ------------------------------------------------------------ conversion

    def numpy(self) -> np.ndarray:
        """The values as a numpy array.

        On the CPU devices it shares the tensor's memory and is read-only: a graph may have
        saved these values for backward, and a write nobody sees would make its gradients
        silently wrong.  Take ``.numpy().copy()`` for an array of your own, or change the
        tensor through ``.data`` (see there).  On "cuda" it is a copy on the host.
        """
        array = self.backend.to_numpy(self._data)
        if type(array) is not np.ndarray:
            array = np.asarray(array)           # a full reduction's numpy scalar, as 0-d
        elif array is self._data or array.base is not None:
            array = array.view()
        else:
            return array                        # a copy from the device: the caller's
        array.flags.writeable = False
        return array

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def item(self) -> float | int | bool:
        if self.size != 1:
            raise ValueError(f"item(): tensor of shape {self.shape} has {self.size} elements, not 1")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous; "
                             f"use .any() style reductions on .numpy()")
        return bool(self.item())

    def to(self, device: str) -> Tensor:
        """This tensor on ``device``.  A leaf moves as a new leaf (keeping requires_grad),
        as parameters do; a tensor inside a graph cannot move (build the graph on one device)."""
        if device == self.device:
            return self
        if not self.is_leaf and self.requires_grad:
            raise RuntimeError(f"to({device!r}): a tensor made by {self.node.op_name} cannot move "
                               f"devices; move the leaves and parameters before computing")
        target = get_backend(device)
        data = target.asarray(self.backend.to_numpy(self._data), self.dtype)
        if data is self._data:      # between the two host devices nothing was copied yet
            data = target.copy(data)
        out = Tensor._made(data, target, self.requires_grad)
        out.name = self.name
        return out

    def astype(self, dtype) -> Tensor:
        """This tensor as ``dtype``; float-to-float casts are differentiable."""
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return self
        if dtype.kind == "f" and self.dtype.kind == "f":
            return Cast.apply(self, dtype=dtype.name)
        return Tensor._made(self.backend.astype(self._data, dtype), self.backend, False)

    def float(self) -> Tensor:
        return self.astype(np.float32)

    def double(self) -> Tensor:
        return self.astype(np.float64)

    def long(self) -> Tensor:
        return self.astype(np.int64)

    def bool(self) -> Tensor:
        return self.astype(np.bool_)

    # ------------------------------------------------------------ autograd

    def backward(self, grad=None, retain_graph: bool = False) -> None:
        """Accumulate gradients of this tensor into every leaf's ``.grad``.

        Args:
            grad: upstream gradient of this tensor's shape; omit for a one-element tensor.
            retain_graph: keep saved buffers so backward can run through the graph again.
        """
        autograd.backward(self, grad, retain_graph)

    def detach(self) -> Tensor:
        """The same values, cut from the graph (shares memory, and the version count)."""
        out = Tensor._make(self._data, self.backend, False)
        out._version = self._version
        if autograd.state.capture is not None:
            autograd.state.capture.detached(out, self)
        return out

    def retain_grad(self) -> Tensor:
        """Also keep ``.grad`` for this non-leaf tensor on backward (for inspection)."""
        if not self.requires_grad:
            raise RuntimeError("retain_grad(): tensor does not require grad")
        self._retains_grad = True
        return self

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if requires_grad and self.dtype.kind != "f":
            raise DTypeError(f"requires_grad_(): only float tensors can require grad, got {self.dtype}")
        if not self.is_leaf:
            raise RuntimeError("requires_grad_(): only leaf tensors can change requires_grad")
        self.requires_grad = requires_grad
        return self

    def _accumulate_grad(self, g) -> None:
        if autograd.state.capture is not None:
            autograd.state.capture.grad_read(self)
        if self._grad is None:
            # Copy: one gradient array may be shared by several inputs (e.g. both sides of a+b).
            self._grad = Tensor._make(self.backend.copy(g), self.backend, False)
        else:
            self._grad = Tensor._make(self.backend.add(self._grad._data, g), self.backend, False)

    # ------------------------------------------------------------ operand handling

    def _operand(self, other, op_name: str) -> Tensor:
        """Wrap a Python scalar or numpy array as a constant of this tensor's dtype."""
        if isinstance(other, Tensor):
            return other
        if isinstance(other, (bool, int, float, np.number)):
            if self.dtype.kind in "iub" and isinstance(other, (float, np.floating)):
                raise DTypeError(f"{op_name}: cannot combine a {self.dtype} tensor of shape "
                                 f"{self.shape} with the float {other}; convert with .float()")
            return Tensor._make(self.backend.full((), other, self.dtype), self.backend, False)
        if isinstance(other, np.ndarray):
            if other.dtype.kind != self.dtype.kind and not (
                other.dtype.kind in "iu" and self.dtype.kind in "iu"
            ):
                raise DTypeError(f"{op_name}: cannot combine a {self.dtype} tensor of shape "
                                 f"{self.shape} with a {other.dtype} array of shape {other.shape}")
            return Tensor(other, dtype=self.dtype, device=self.device)
        raise TypeError(f"{op_name}: unsupported operand of type {type(other).__name__}")

    # ------------------------------------------------------------ arithmetic

    def __add__(self, other):
        return Add.apply(self, self._operand(other, "Add"))

    def __radd__(self, other):
        return Add.apply(self._operand(other, "Add"), self)

    def __sub__(self, other):
        return Sub.apply(self, self._operand(other, "Sub"))

    def __rsub__(self, other):
        return Sub.apply(self._operand(other, "Sub"), self)

    def __mul__(self, other):
        return Mul.apply(self, self._operand(other, "Mul"))

    def __rmul__(self, other):
        return Mul.apply(self._operand(other, "Mul"), self)

    def __truediv__(self, other):
        return Div.apply(self, self._operand(other, "Div"))

    def __rtruediv__(self, other):
        return Div.apply(self._operand(other, "Div"), self)

    def __pow__(self, exponent):
        return Pow.apply(self, self._operand(exponent, "Pow"))

    def __rpow__(self, base):
        return Pow.apply(self._operand(base, "Pow"), self)

    def __matmul__(self, other):
        return MatMul.apply(self, self._operand(other, "MatMul"))

    def __rmatmul__(self, other):
        return MatMul.apply(self._operand(other, "MatMul"), self)

    def __neg__(self):
        return Neg.apply(self)

    def __pos__(self):
        return self

    # Comparisons give boolean tensors (no gradient), for masks.
    def _compare(self, other, kernel: str) -> Tensor:
        other = self._operand(other, kernel)
        if other.backend is not self.backend:
            raise autograd.DeviceError(f"{kernel}: inputs are on different devices ({self.device} "
                                       f"{self.shape}, {other.device} {other.shape}); move them "
                                       f"with .to(device) first")
        return Tensor._made(getattr(self.backend, kernel)(self._data, other._data), self.backend, False)

    def __eq__(self, other):  # type: ignore[override]
        return self._compare(other, "eq")

    def __ne__(self, other):  # type: ignore[override]
        return self._compare(other, "ne")

    def __lt__(self, other):
        return self._compare(other, "lt")

    def __le__(self, other):
        return self._compare(other, "le")

    def __gt__(self, other):
        return self._compare(other, "gt")

    def __ge__(self, other):
        return self._compare(other, "ge")

    __hash__ = object.__hash__

    # ------------------------------------------------------------ elementwise functions

    def exp(self) -> Tensor:
        return Exp.apply(self)

    def log(self) -> Tensor:
        return Log.apply(self)

    def tanh(self) -> Tensor:
        return Tanh.apply(self)

    def sigmoid(self) -> Tensor:
        return Sigmoid.apply(self)

    def relu(self) -> Tensor:
        return Relu.apply(self)

    def leaky_relu(self, negative_slope: float = 0.01) -> Tensor:
        return LeakyRelu.apply(self, negative_slope=float(negative_slope))

    def sqrt(self) -> Tensor:
        return self**0.5

    def masked_fill(self, mask, value: float) -> Tensor:
        """``value`` where ``mask`` is True, else this tensor (mask broadcasts to its shape)."""
        mask = mask if isinstance(mask, Tensor) else Tensor(mask, dtype=np.bool_, device=self.device)
        return MaskedFill.apply(self, mask, value=float(value))

    # ------------------------------------------------------------ reductions

    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        return Sum.apply(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims: bool = False) -> Tensor:
        return Mean.apply(self, axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims: bool = False) -> Tensor:
        """The maximum values (ties share the gradient equally)."""
        return Max.apply(self, axis=axis, keepdims=keepdims)

    def softmax(self, axis: int = -1) -> Tensor:
        return Softmax.apply(self, axis=axis)

    def log_softmax(self, axis: int = -1) -> Tensor:
        return LogSoftmax.apply(self, axis=axis)

    # ------------------------------------------------------------ movement

    def reshape(self, *shape) -> Tensor:
        """Same data in a new shape; one entry may be -1. ``x.reshape(2, -1)`` or ``((2, -1))``."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return Reshape.apply(self, shape=tuple(shape))

    def permute(self, *axes) -> Tensor:
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return Permute.apply(self, axes=tuple(axes))

    def transpose(self, axis0: int, axis1: int) -> Tensor:
        """Swap two axes, as ``torch.transpose``."""
        axes = list(range(self.ndim))
        try:
            axes[axis0], axes[axis1] = axes[axis1], axes[axis0]
        except IndexError:
            raise autograd.ShapeError(f"transpose: axes ({axis0}, {axis1}) are out of range for "
                                      f"shape {self.shape}") from None
        return self.permute(*axes)

    def expand(self, *shape) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return Expand.apply(self, shape=tuple(shape))

    def unsqueeze(self, axis: int) -> Tensor:
        axis = axis if axis >= 0 else axis + self.ndim + 1
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def squeeze(self, axis: int | None = None) -> Tensor:
        if axis is None:
            return self.reshape(tuple(n for n in self.shape if n != 1))
        if self.shape[axis] != 1:
            raise autograd.ShapeError(f"squeeze: axis {axis} of shape {self.shape} has size "
                                      f"{self.shape[axis]}, not 1")
        shape = list(self.shape)
        del shape[axis]
        return self.reshape(tuple(shape))

    def __getitem__(self, index) -> Tensor:
        return GetItem.apply(self, index=_index_to_numpy(index))

    def __setitem__(self, index, value):
        raise TypeError("Tensor does not support item assignment (it would break the graph); "
                        "build a new tensor with ta.where, masked_fill or ta.cat")

    # ------------------------------------------------------------ factories

    @staticmethod
    def zeros(*shape, dtype=None, requires_grad=False, device="cpu") -> Tensor:
        return Tensor(np.zeros(_shape(shape)), requires_grad, dtype, device)

    @staticmethod
    def ones(*shape, dtype=None, requires_grad=False, device="cpu") -> Tensor:
        return Tensor(np.ones(_shape(shape)), requires_grad, dtype, device)

    @staticmethod
    def full(shape, value, dtype=None, requires_grad=False, device="cpu") -> Tensor:
        return Tensor(np.full(_shape((shape,)), value), requires_grad, dtype, device)

    @staticmethod
    def randn(*shape, dtype=None, requires_grad=False, device="cpu") -> Tensor:
        """Standard normal samples from the engine's generator (see ``ta.manual_seed``); a
        compiled function draws new ones at every call, as dropout does."""
        return Tensor._draw("random_normal", _shape(shape), dtype, requires_grad, device)

    @staticmethod
    def rand(*shape, dtype=None, requires_grad=False, device="cpu") -> Tensor:
        """Uniform samples in [0, 1) from the engine's generator."""
        return Tensor._draw("random_uniform", _shape(shape), dtype, requires_grad, device)

    @staticmethod
    def _draw(kernel: str, shape: tuple, dtype, requires_grad: bool, device: str) -> Tensor:
        # The draw is a kernel reading the generator (float64 samples in ``dtype``), so a
        # captured plan makes it again at every replay instead of keeping one sample.
        resolved = _resolve_dtype(dtype, _FLOAT_SAMPLE)
        _check_grad_dtype(requires_grad, resolved, shape)
        backend = get_backend(device)
        return Tensor._made(getattr(backend, kernel)(_random.generator(), shape, resolved), backend,
                            bool(requires_grad))

    @staticmethod
    def arange(start, stop=None, step=1, dtype=None, device="cpu") -> Tensor:
        return Tensor(np.arange(start, stop, step) if stop is not None else np.arange(start),
                      dtype=dtype, device=device)

    @staticmethod
    def eye(n: int, m: int | None = None, dtype=None, requires_grad=False, device="cpu") -> Tensor:
        return Tensor(np.eye(n, m), requires_grad, dtype, device)

    @staticmethod
    def zeros_like(t: Tensor, requires_grad=False) -> Tensor:
        return Tensor.zeros(*t.shape, dtype=t.dtype, requires_grad=requires_grad, device=t.device)

    @staticmethod
    def ones_like(t: Tensor, requires_grad=False) -> Tensor:
        return Tensor.ones(*t.shape, dtype=t.dtype, requires_grad=requires_grad, device=t.device)

    # ------------------------------------------------------------ display

    # Set by ``tinygrad_attn.viz`` when it loads (the engine never imports viz): a function
    # from a tensor to the SVG text of its graph, or None.
    _graph_svg = None

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """What Jupyter shows: the picture of the recorded graph (once ``ta.viz`` is loaded,
        Graphviz's ``dot`` is installed and ``ta.viz.notebook_display`` is on), else the repr.
        Leaf tensors, which have no graph, always show their repr."""
        bundle = {"text/plain": repr(self)}
        svg_wanted = (include is None or "image/svg+xml" in include) and (
            exclude is None or "image/svg+xml" not in exclude)
        if svg_wanted and self.node is not None and Tensor._graph_svg is not None:
            svg = Tensor._graph_svg(self)
            if svg:
                bundle["image/svg+xml"] = svg
        return bundle

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", precision=4, threshold=20,
                               prefix="Tensor(")
        extras = []
        if self.dtype != default_float:
            extras.append(f"dtype={self.dtype}")
        if self.device != "cpu":
            extras.append(f"device={self.device!r}")
        if self.node is not None:
            extras.append(f"op={self.node.op_name}")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        if self.name:
            extras.append(f"name={self.name!r}")
        return "Tensor(" + ", ".join([body] + extras) + ")"


_FLOAT_SAMPLE = np.empty(0)             # what the samples are drawn as: float64


def _shape(shape) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(n) for n in shape)


def _index_to_numpy(index):
    """Tensor indices become numpy arrays; the op stores a tuple of plain index parts."""
    parts = index if isinstance(index, tuple) else (index,)
    converted = []
    for part in parts:
        if isinstance(part, Tensor):
            part = part.numpy()
        elif isinstance(part, list):
            part = np.asarray(part)
        converted.append(part)
    return tuple(converted)


def _tensors(op_name: str, xs) -> list[Tensor]:
    xs = list(xs)
    if not xs:
        raise ValueError(f"{op_name}: needs at least one tensor")
    for x in xs:
        if not isinstance(x, Tensor):
            raise TypeError(f"{op_name}: expected Tensors, got {type(x).__name__}")
    return xs


autograd.use_tensor_type(Tensor)


def cat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Concatenate tensors along an existing ``axis`` (shapes match elsewhere)."""
    return Cat.apply(*_tensors("Cat", tensors), axis=axis)


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Stack equal-shaped tensors along a new ``axis``."""
    return Stack.apply(*_tensors("Stack", tensors), axis=axis)


def where(cond, a, b) -> Tensor:
    """``a`` where ``cond`` is True, else ``b`` (all three broadcast; a or b may be scalars)."""
    like = a if isinstance(a, Tensor) else b
    if not isinstance(like, Tensor):
        raise TypeError("where: a or b must be a Tensor")
    cond = cond if isinstance(cond, Tensor) else Tensor(cond, dtype=np.bool_, device=like.device)
    a = like._operand(a, "Where")
    b = like._operand(b, "Where")
    return Where.apply(cond, a, b)
