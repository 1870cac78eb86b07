"""Kernels behind tinygrad_attn, one table of named kernels per device.

A backend is a table: kernel name -> function taking arrays and ints (never a Tensor).
Every backend starts from the numpy reference table and overrides kernels by name,
so a new device can replace one kernel at a time and stays complete meanwhile.

    >>> from tinygrad_attn.compiler import get_backend
    >>> get_backend("numpy").tanh(np.zeros(3))

Devices:
    "numpy"  plain numpy, the reference implementation and the oracle in tests.
    "cpu"    the default device: Numba kernels (compiler/cpu.py) for softmax-shaped work
             and fused attention, BLAS (through numpy) for matrix products, the reference
             kernels for the rest.
"""

from __future__ import annotations

from collections.abc import Callable

from . import numpy_backend
from .allocator import keep_freed_memory

keep_freed_memory()

__all__ = ["Backend", "get_backend", "register_backend", "available_devices", "keep_freed_memory"]


class Backend:
    """A device: a name and a table of kernels, falling back to a parent table.

    Kernels are read as attributes (``backend.softmax(x, axis)``) so an op reads like the
    math; ``register_kernel`` replaces one kernel by name.  The merged table is copied onto
    the instance, so a lookup on the hot path is a plain attribute read.
    """

    def __init__(self, name: str, kernels: dict[str, Callable], parent: Backend | None = None):
        self.name = name
        self.kernels = dict(kernels)
        self.parent = parent
        self.children: list[Backend] = []
        if parent is not None:
            parent.children.append(self)
        self._refresh()

    def _refresh(self) -> None:
        for kernel_name, fn in self.table().items():
            setattr(self, kernel_name, fn)
        for child in self.children:
            child._refresh()

    def table(self) -> dict[str, Callable]:
        """Every kernel this device runs, its own overriding its parent's."""
        merged = self.parent.table() if self.parent is not None else {}
        merged.update(self.kernels)
        return merged

    def __getattr__(self, kernel_name: str) -> Callable:
        # Reached only for names missing from the table.
        raise AttributeError(f"backend {self.__dict__.get('name')!r} has no kernel {kernel_name!r}")

    def register_kernel(self, kernel_name: str, fn: Callable) -> None:
        """Replace (or add) the kernel called ``kernel_name`` on this device."""
        self.kernels[kernel_name] = fn
        self._refresh()

    def kernel_names(self) -> list[str]:
        return sorted(self.table())

    def __repr__(self) -> str:
        parent = getattr(self.parent, "name", None)
        return f"Backend({self.name!r}, {len(self.kernels)} own kernels, parent={parent!r})"


# The kernels compiler/cpu.py overrides.  Listed here so that importing the package does
# not import Numba (~0.2 s): the first call of any of them loads them all.
CPU_KERNELS = ("softmax", "softmax_back", "log_softmax", "log_softmax_back", "masked_softmax",
               "cross_entropy", "cross_entropy_back", "embedding_back", "sdpa", "sdpa_back")


def _load_cpu_kernels(name: str) -> Callable:
    def first_call(*args):
        from . import cpu

        for kernel_name, fn in cpu.KERNELS.items():
            _BACKENDS["cpu"].register_kernel(kernel_name, fn)
        return cpu.KERNELS[name](*args)

    first_call.__name__ = name
    return first_call


_REFERENCE = Backend("numpy", numpy_backend.KERNELS)
_BACKENDS: dict[str, Backend] = {
    "numpy": _REFERENCE,
    # The default device: Numba kernels (compiler/cpu.py) override reference ones by name.
    "cpu": Backend("cpu", {name: _load_cpu_kernels(name) for name in CPU_KERNELS}, parent=_REFERENCE),
}


def register_backend(backend: Backend) -> None:
    """Make ``backend`` available as a device under ``backend.name``."""
    _BACKENDS[backend.name] = backend


def get_backend(name: str) -> Backend:
    """The backend for device ``name``; raises ValueError listing the known devices."""
    try:
        return _BACKENDS[name]
    except KeyError:
        known = ", ".join(repr(n) for n in _BACKENDS)
        raise ValueError(f"unknown device {name!r}; known devices: {known}") from None


def available_devices() -> list[str]:
    return list(_BACKENDS)
