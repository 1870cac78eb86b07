"""What makes Numba's simulator as strict as a GPU, and quicker: tests/conftest.py calls
``apply()`` under NUMBA_ENABLE_CUDASIM=1.

The package itself runs on the plain simulator; these patches only make the tests catch host
code that a real GPU would refuse, and make syncthreads cheaper to simulate.
"""

from __future__ import annotations

import threading
import time


def _simulator_arrays_like_device_arrays() -> None:
    """Make the simulator's device arrays refuse on the host what real ones refuse.

    The simulator wraps a numpy array and forwards every attribute and operator to it: code
    relying on that would pass under the simulator and fail on a GPU (a real DeviceNDArray
    has no arithmetic, comparisons or numpy methods), so it is cut back to the real host API
    here.  The simulator's ``shape`` refuses negative indexes (as shapes inside kernels do)
    and is left so: the package indexes a device array's shape from the front, so that it
    runs on the plain simulator as on a GPU.
    """
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    host_api = {"strides", "dtype", "size", "ndim", "flags", "squeeze"}

    def __getattr__(self, name):
        if name in host_api:
            return getattr(self._ary, name)
        raise AttributeError(f"a CUDA device array has no attribute {name!r} (copy it to the host "
                             f"with to_numpy first)")

    def __array__(self, dtype=None, copy=None):
        return self._ary.copy() if dtype is None else self._ary.astype(dtype)

    FakeCUDAArray.__getattr__ = __getattr__
    FakeCUDAArray.__array__ = __array__
    for operator in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__sub__",
                     "__mul__", "__floordiv__", "__truediv__", "__mod__", "__pow__"):
        if operator in FakeCUDAArray.__dict__:
            delattr(FakeCUDAArray, operator)
    FakeCUDAArray.__hash__ = object.__hash__


def _simulator_polls_politely() -> None:
    """Let the simulator's block manager give up the GIL while it waits.

    The manager busy-polls its threads (``is_alive``, ``syncthreads_blocked``) holding the
    GIL, so a thread waiting to pass a syncthreads gets to run only at Python's thread
    switch interval (5 ms): ten syncthreads of a 4-thread block took 75 ms, and 3.4 ms with
    a ``sleep(0)`` in each poll.
    """
    from numba.cuda.simulator.kernel import BlockThread

    def is_alive(self):
        time.sleep(0)
        return threading.Thread.is_alive(self)

    BlockThread.is_alive = is_alive


def apply() -> None:
    _simulator_arrays_like_device_arrays()
    _simulator_polls_politely()
