"""Kernels behind tinygrad_attn, one table of named kernels per device.

A backend is a table: kernel name -> function taking arrays and ints (never a Tensor).
Every backend starts from the numpy reference table and overrides kernels by name,
so a new device can replace one kernel at a time and stays complete meanwhile.

    >>> from tinygrad_attn.compiler import get_backend
    >>> get_backend("numpy").tanh(np.zeros(3))

Elementwise kernels are not written per device: each comes from one sympy formula
(``define_elementwise``, ``formulas.py``), which every device turns into its own kernel on
first call through its ``build`` (reference/, cpu/ and cuda/ ``elementwise.build``).

Devices:
    "numpy"  plain numpy, the reference implementation and the oracle in tests.
    "cpu"    the default device: Numba kernels (compiler/cpu/) for softmax-shaped work
             and fused attention, BLAS (through numpy) for matrix products, the reference
             kernels for the rest.
    "cuda"   numba.cuda kernels for every kernel (compiler/cuda/, a module per kernel
             family), on device arrays.  Loaded on first use (importing numba.cuda takes
             ~0.5 s), and only where it can run: on a CUDA GPU, or under Numba's simulator
             (NUMBA_ENABLE_CUDASIM=1 set before numba is imported; slow, for tiny shapes and
             tests).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable

from . import formulas, reference
from .allocator import keep_freed_memory
from .formulas import Formula, Kernel

keep_freed_memory()

__all__ = ["Backend", "get_backend", "register_backend", "available_devices", "keep_freed_memory",
           "DeviceUnavailableError", "cuda_problem", "define_elementwise", "elementwise_formulas",
           "Formula"]


class DeviceUnavailableError(RuntimeError):
    """A known device that cannot run on this machine (e.g. "cuda" without a GPU)."""


class Backend:
    """A device: a name and a table of kernels, falling back to a parent table.

    Kernels are read as attributes (``backend.softmax(x, axis)``) so an op reads like the
    math; ``register_kernel`` replaces one kernel by name.  The merged table is copied onto
    the instance, so a lookup on the hot path is a plain attribute read.
    """

    def __init__(self, name: str, kernels: dict[str, Callable], parent: Backend | None = None,
                 build: Callable[[Kernel], Callable] | None = None):
        self.name = name
        # Turns a kernel generated from a formula into this device's callable.
        self.build = build
        self.kernels = dict(kernels)
        self.parent = parent
        self.children: list[Backend] = []
        if parent is not None:
            parent.children.append(self)
        self._refresh()

    # The capture (compiler/capture.py) in progress on this device, if any.
    _recorder = None

    # A device is one per process: a copied or unpickled tensor (copy.deepcopy(model), a
    # pickled Tensor) stays on the registry's device, not on a copy no other tensor is on.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return get_backend, (self.name,)

    def _refresh(self) -> None:
        # While recording, every kernel is the recorder's wrapper, also those a first call
        # (re)builds during the capture: they register through here.
        recorder = self._recorder
        for kernel_name, fn in self.table().items():
            setattr(self, kernel_name, fn if recorder is None else recorder.wrap(self.name, kernel_name, fn))
        for child in self.children:
            child._refresh()

    @contextlib.contextmanager
    def recording(self, recorder):
        """Within the block, this device's kernel calls from ``recorder``'s thread are
        recorded (``recorder.wrap``); other threads' calls pass through."""
        if self._recorder is not None:
            raise RuntimeError(f"device {self.name!r} is already recording a capture")
        self._recorder = recorder
        self._refresh()
        try:
            yield recorder
        finally:
            self._recorder = None
            self._refresh()

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

    def add_formula(self, formula: Formula) -> None:
        """Give this device ``formula``'s kernels, each built on its first call."""
        for index, kernel_name in enumerate(formula.kernel_names()):
            self.kernels[kernel_name] = _first_call(self, formula, index)
        self._refresh()

    def build_all(self) -> None:
        """Build every generated kernel still waiting for its first call: a warm-up before
        timing, and what makes ``table()`` say which kernels this device runs itself."""
        for fn in list(self.table().values()):
            install = getattr(fn, "install", None)
            if install is not None:
                install()

    def kernel_names(self) -> list[str]:
        return sorted(self.table())

    def __repr__(self) -> str:
        parent = getattr(self.parent, "name", None)
        return f"Backend({self.name!r}, {len(self.kernels)} own kernels, parent={parent!r})"


def _first_call(backend: Backend, formula: Formula, index: int) -> Callable:
    """A stand-in for a formula's kernel: derives it (or reads it from the cache), builds the
    device's callable, puts that in the table and runs it."""
    kernel_name = formula.kernel_names()[index]
    built: list[Callable] = []             # a caller may hold on to this stand-in: build once

    def install() -> Callable:
        if built:
            return built[0]
        built.append(_build())
        return built[0]

    def _build() -> Callable:
        plan = formulas.plan(formula)
        fn = backend.build(plan.forward if index == 0 else plan.backward[index - 1])
        if fn is None:                 # the device runs its parent's kernel
            backend.kernels.pop(kernel_name, None)
            backend._refresh()
            inherited = getattr(backend.parent, kernel_name)
            return inherited.install() if hasattr(inherited, "install") else inherited
        backend.register_kernel(kernel_name, fn)
        return fn

    def first_call(*args):
        return install()(*args)

    first_call.__name__ = kernel_name
    first_call.install = install
    return first_call


_FORMULAS: dict[str, Formula] = {}


def elementwise_formulas() -> list[Formula]:
    """Every formula the devices generate kernels from: the ops' and the compiler's own."""
    return list(_FORMULAS.values())


def define_elementwise(formula: Formula) -> None:
    """Give every device the kernels of ``formula`` (forward and one backward per input),
    generated from it on first call.  Defining a formula of the same name again replaces
    it; a name another kernel has is refused."""
    for kernel_name in formula.kernel_names():
        if kernel_name in _REFERENCE.kernels and not any(
                kernel_name in known.kernel_names() for known in _FORMULAS.values()):
            raise ValueError(f"elementwise formula {formula.name!r}: the kernel name {kernel_name!r} "
                             f"is taken by another kernel; name the op differently")
    _FORMULAS[formula.name] = formula
    for backend in _BACKENDS.values():
        if backend.build is not None:
            backend.add_formula(formula)


def _build_cpu(kernel: Kernel) -> Callable | None:
    # A formula that is one numpy call (tanh, a product) is one SIMD pass already: the
    # reference's (None).  Numba pays where numpy would make several passes (float32, 1M
    # entries: sigmoid 4.3x, tanh_back 3.5x, sigmoid_back 2.8x; bench/RESULTS.md).
    if kernel.identity or kernel.ufunc is not None or kernel.operations <= 1:
        return None
    from .cpu import elementwise

    return elementwise.build(kernel)


# The kernels compiler/cpu/ overrides.  Listed here so that importing
# the package does not import Numba (~0.2 s): the first call of any of them loads them all.
CPU_KERNELS = ("softmax", "softmax_back", "log_softmax", "log_softmax_back", "masked_softmax",
               "cross_entropy", "cross_entropy_back", "embedding_back", "additive_scores",
               "additive_scores_back", "sdpa", "sdpa_back", "sdpa_weights", "sdpa_prefix", "layer_norm",
               "layer_norm_back",
               "gru_gates", "gru_gates_back", "lstm_cell_state", "lstm_cell_state_back",
               "lstm_hidden", "lstm_hidden_back", "adam_", "add_", "sum")


def _load_cpu_kernels(name: str) -> Callable:
    def first_call(*args):
        from . import cpu

        kernels = cpu.KERNELS
        for kernel_name, fn in kernels.items():
            _BACKENDS["cpu"].register_kernel(kernel_name, fn)
        return kernels[name](*args)

    first_call.__name__ = name
    return first_call


_REFERENCE = Backend("numpy", reference.KERNELS, build=reference.elementwise.build)
_BACKENDS: dict[str, Backend] = {
    "numpy": _REFERENCE,
    # The default device: Numba kernels (compiler/cpu/) override reference ones by name.
    "cpu": Backend("cpu", {name: _load_cpu_kernels(name) for name in CPU_KERNELS}, parent=_REFERENCE,
                   build=_build_cpu),
}
for _selection in formulas.SELECTION:
    define_elementwise(_selection)


def register_backend(backend: Backend) -> None:
    """Make ``backend`` available as a device under ``backend.name``."""
    _BACKENDS[backend.name] = backend


def get_backend(name: str) -> Backend:
    """The backend for device ``name``; raises ValueError listing the known devices, and
    DeviceUnavailableError for "cuda" where it cannot run (saying why)."""
    try:
        return _BACKENDS[name]
    except KeyError:
        if name == "cuda":
            return _load_cuda()
        known = ", ".join(repr(n) for n in dict.fromkeys([*_BACKENDS, "cuda"]))
        raise ValueError(f"unknown device {name!r}; known devices: {known}") from None


def loaded_backends() -> list[Backend]:
    """The backends loaded now ("cuda" once something used it)."""
    return list(_BACKENDS.values())


def available_devices() -> list[str]:
    """The devices that can run here: "cuda" only with a GPU or Numba's simulator."""
    devices = list(_BACKENDS)
    if "cuda" not in devices and cuda_problem() is None:
        devices.append("cuda")
    return devices


# ---------------------------------------------------------------- the "cuda" device, loaded on first use

_SIMULATOR_HINT = ("To run the CUDA kernels without a GPU, use Numba's CUDA simulator: set "
                   "NUMBA_ENABLE_CUDASIM=1 in the environment before Python starts (e.g. "
                   "NUMBA_ENABLE_CUDASIM=1 python train.py); it runs every GPU thread in Python, "
                   "so keep shapes tiny.")


def _flag(value: str | None) -> bool:
    try:
        return int(value or "0") != 0          # how numba reads NUMBA_ENABLE_CUDASIM
    except ValueError:
        return False


@functools.cache
def cuda_problem() -> str | None:
    """Why the "cuda" device cannot run here, or None when it can (a GPU, or the simulator).

    Cheap when there is plainly no GPU: without a CUDA driver library numba is not imported.
    """
    wanted = _flag(os.environ.get("NUMBA_ENABLE_CUDASIM"))
    if "numba" in sys.modules:
        import numba

        if numba.config.ENABLE_CUDASIM:
            return None
        if wanted:
            return ("NUMBA_ENABLE_CUDASIM=1 was set after numba had been imported, so the simulator "
                    "is off; set it before Python starts.")
    elif wanted:
        return None
    import ctypes.util

    driver = (os.environ.get("NUMBA_CUDA_DRIVER") or ctypes.util.find_library("cuda")
              or os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidiactl"))
    if not driver:
        return f"no CUDA GPU was found (there is no CUDA driver library, libcuda). {_SIMULATOR_HINT}"
    from numba import cuda

    if not cuda.is_available():
        return (f"no usable CUDA GPU was found (numba.cuda.is_available() is False; "
                f"numba.cuda.detect() tells more). {_SIMULATOR_HINT}")
    return None


def _load_cuda() -> Backend:
    problem = cuda_problem()
    if problem is not None:
        raise DeviceUnavailableError(f"device 'cuda' is not available: {problem}")
    from . import cuda

    backend = Backend("cuda", cuda.KERNELS, build=cuda.elementwise.build)
    for formula in _FORMULAS.values():
        backend.add_formula(formula)
    _BACKENDS["cuda"] = backend
    return backend
