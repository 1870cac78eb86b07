"""Module and Parameter: containers of learnable tensors, PyTorch-style.

A Module registers every Parameter and sub-Module assigned to it as an attribute, in
assignment order, so ``named_parameters()`` and ``state_dict()`` list them with dotted
paths (``out_proj.weight``) exactly as PyTorch does for the same layout.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..autograd import ShapeError
from ..autograd import state as autograd_state
from ..tensor import Tensor


class Parameter(Tensor):
    """A Tensor a Module learns: a leaf that requires grad (float32 by default).

    Example:
        >>> self.weight = nn.Parameter(np.zeros((4, 3)))
    """

    __slots__ = ()

    def __init__(self, data, requires_grad: bool = True, dtype=None, device: str = "cpu"):
        super().__init__(data, requires_grad=requires_grad, dtype=dtype, device=device)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """Base class of layers and models: subclass it, assign Parameters and Modules in
    ``__init__`` (after ``super().__init__()``) and define ``forward``.

    Example:
        >>> class Affine(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.weight = nn.Parameter(np.ones((2, 2)))
        ...     def forward(self, x):
        ...         return x @ self.weight
        >>> Affine().state_dict()["weight"].shape
        (2, 2)
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value) -> None:
        params = self.__dict__.get("_parameters")
        if params is None:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before assigning "
                                 f"attributes")
        modules = self.__dict__["_modules"]
        params.pop(name, None)
        modules.pop(name, None)
        if isinstance(value, Parameter):
            params[name] = value
            if value.name is None:
                value.name = name
        elif isinstance(value, Module):
            modules[name] = value
            # Parameters carry their path from the outermost module, for graph drawings.  A
            # parameter whose name is not its path inside ``value`` was named through another
            # path first (a shared module) and keeps that name.
            for path, p in value.named_parameters():
                if p.name == path:
                    p.name = f"{name}.{path}"
        object.__setattr__(self, name, value)

    @property
    def training(self) -> bool:
        """Training mode (dropout active): ``train()``/``eval()`` set it.  A ``ta.compile``
        capture that reads it (a forward, or a method that passes it to dropout) replays in
        this mode only."""
        capture = autograd_state.capture
        if capture is not None:
            capture.module_called(self)
        return self.__dict__["_training"]

    @training.setter
    def training(self, mode) -> None:
        self.__dict__["_training"] = bool(mode)
        capture = autograd_state.capture
        if capture is not None:
            capture.mode_set(self)

    def __call__(self, *args, **kwargs):
        forward = getattr(self, "forward", None)
        if forward is None:
            raise TypeError(f"{type(self).__name__} is a container without forward(); call its "
                            f"sub-modules, or define forward() to make it callable")
        capture = autograd_state.capture
        if capture is not None:
            # A compiled plan replays what this forward did in this train/eval mode only.
            capture.module_called(self)
        return forward(*args, **kwargs)

    # ------------------------------------------------------------ traversal

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every sub-module, with dotted paths ("" for this one)."""
        stack = [(prefix, self)]
        seen: set[int] = set()
        while stack:
            path, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield path, module
            children = list(module._modules.items())
            for name, child in reversed(children):   # reversed: children come out in order
                stack.append((f"{path}.{name}" if path else name, child))

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def children(self) -> Iterator[Module]:
        yield from self._modules.values()

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """Every parameter once, with its dotted path, in registration order."""
        seen: set[int] = set()
        for path, module in self.named_modules():
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{path}.{name}" if path else name), p

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def num_parameters(self) -> int:
        return sum(p.size for p in self.parameters())

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameter path -> a copy of its values (numpy), PyTorch's keys and shapes."""
        return {name: p.numpy().copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copy values into the parameters (keeping each parameter's dtype and device).

        ``state`` maps paths to arrays, Tensors, or anything with ``.detach()`` and
        ``__array__`` (a PyTorch state_dict works as it is).  Every key and shape is checked
        before any parameter changes, so a failed load leaves the module as it was.

        Args:
            strict: missing or unexpected keys raise (else they are skipped).
        """
        params = dict(self.named_parameters())
        missing = [k for k in params if k not in state]
        unexpected = [k for k in state if k not in params]
        if strict and (missing or unexpected):
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
        where = f"{type(self).__name__}.load_state_dict"
        # Every entry is converted and checked before any parameter changes: a bad one leaves
        # the module as it was.
        arrays = {}
        for name, value in state.items():
            if name not in params:
                continue
            if hasattr(value, "detach"):
                value = value.detach()
            array = np.asarray(value)
            p = params[name]
            if array.shape != p.shape:
                raise ShapeError(f"{where}: {name!r} has shape {array.shape}, the parameter has shape "
                                 f"{p.shape}")
            arrays[name] = _parameter_values(array, p.dtype, f"{where}: {name!r}")
        for name, array in arrays.items():
            p = params[name]
            p.data = p.backend.asarray(array, p.dtype)

    def astype(self, dtype) -> Module:
        """Convert every parameter to a float ``dtype`` in place; returns self."""
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise TypeError(f"{type(self).__name__}.astype: parameters must stay float, got {dtype}")
        for p in self.parameters():
            p.data = p.backend.astype(p.data, dtype)
            p.grad = None
        return self

    def to(self, device: str) -> Module:
        """Move every parameter to ``device`` in place (each stays the same Parameter object,
        so an optimizer built before still holds it); gradients are dropped.  Returns self.

        Example:
            >>> model = nn.Linear(4, 3).to("cuda")
        """
        for p in self.parameters():
            moved = p.to(device)
            p.data, p.backend, p.grad = moved._data, moved.backend, None
        return self

    def float(self) -> Module:
        return self.astype(np.float32)

    def double(self) -> Module:
        return self.astype(np.float64)

    def train(self, mode: bool = True) -> Module:
        """Training mode (dropout active) for this module and every sub-module."""
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    # ------------------------------------------------------------ display

    def extra_repr(self) -> str:
        """The constructor arguments shown by ``repr`` (override in subclasses)."""
        return ""

    def __repr__(self) -> str:
        head = f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"{head}  # {self.num_parameters():,} parameters"]
        for name, child in self._modules.items():
            text = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {text}")
        return "\n".join(lines)


def _parameter_values(array: np.ndarray, dtype, where: str) -> np.ndarray:
    """``array`` as a new array of the parameter's float ``dtype``, refusing what would change
    its values silently: non-numbers, complex numbers (the imaginary part would be dropped)
    and finite values too large for the dtype (they would become inf)."""
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{where} holds {array.dtype} values; a parameter takes real numbers")
    with np.errstate(over="ignore", invalid="ignore"):
        converted = np.array(array, dtype=dtype, copy=True)
    if array.dtype.kind == "f":
        overflow = np.isinf(converted) & np.isfinite(array)
        if overflow.any():
            biggest = float(np.abs(array[overflow]).max())
            raise ValueError(f"{where} holds {biggest:.3g}, beyond {np.dtype(dtype).name}'s range "
                             f"(+-{float(np.finfo(dtype).max):.3g})")
    return converted


class ModuleList(Module):
    """Modules held in a list, registered as children "0", "1", ... (so their parameters are
    ``layers.0.weight``, as in ``torch.nn.ModuleList``).

    Example:
        >>> blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        >>> for block in blocks:
        ...     x = block(x)
    """

    def __init__(self, modules=()):
        super().__init__()
        for module in modules:
            self.append(module)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList: {type(module).__name__} is not a Module")
        setattr(self, str(len(self._modules)), module)
        return self

    def __getitem__(self, index: int) -> Module:
        modules = list(self._modules.values())
        return modules[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules.values()))
