"""Kernels behind tinygrad_attn, one table of named kernels per device.

A backend is a table: kernel name -> function taking arrays and ints (never a Tensor).
Every backend starts from the numpy reference table and overrides kernels by name,
so a new device can replace one kernel at a time and stays complete meanwhile.

    >>> from tinygrad_attn.compiler import get_backend
    >>> get_backend("numpy").tanh(np.zeros(3))

Devices:
    "numpy"  plain numpy, the reference implementation and the oracle in tests.
    "cpu"    the default device.  Today it runs the numpy reference kernels; compiled
             Numba kernels replace them by name as they land (see README).
"""

from __future__ import annotations

from collections.abc import Callable

from . import numpy_backend

__all__ = ["Backend", "get_backend", "register_backend", "available_devices"]


class Backend:
    """A device: a name and a table of kernels, falling back to a parent table.

    Kernels are looked up as attributes (``backend.softmax(x, axis)``) so an op reads
    like the math; ``register_kernel`` replaces one kernel by name.
    """

    def __init__(self, name: str, kernels: dict[str, Callable], parent: Backend | None = None):
        self.name = name
        self.kernels = dict(kernels)
        self.parent = parent

    def __getattr__(self, kernel_name: str) -> Callable:
        # __getattr__ runs only when normal lookup fails, i.e. for kernel names.
        kernels = self.__dict__.get("kernels", {})
        if kernel_name in kernels:
            return kernels[kernel_name]
        parent = self.__dict__.get("parent")
        if parent is not None:
            return getattr(parent, kernel_name)
        raise AttributeError(f"backend {self.__dict__.get('name')!r} has no kernel {kernel_name!r}")

    def register_kernel(self, kernel_name: str, fn: Callable) -> None:
        """Replace (or add) the kernel called ``kernel_name`` on this device."""
        self.kernels[kernel_name] = fn

    def kernel_names(self) -> list[str]:
        names = set(self.kernels)
        if self.parent is not None:
            names |= set(self.parent.kernel_names())
        return sorted(names)

    def __repr__(self) -> str:
        own = len(self.kernels)
        return f"Backend({self.name!r}, {own} own kernels, parent={getattr(self.parent, 'name', None)!r})"


_REFERENCE = Backend("numpy", numpy_backend.KERNELS)
_BACKENDS: dict[str, Backend] = {
    "numpy": _REFERENCE,
    # The default device; compiled kernels override the reference ones by name.
    "cpu": Backend("cpu", {}, parent=_REFERENCE),
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
