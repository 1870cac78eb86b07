"""Compile every CUDA kernel, with the argument types it is launched with, to PTX: no GPU needed.

The simulator runs the kernels as Python, so it cannot tell whether Numba can compile them
for a GPU (typing, lowering, NVVM).  This script can, given a CUDA toolkit (NVVM and
libdevice) but no GPU and no driver: it calls every kernel of compiler/cuda/ on the
arguments of the conformance generators (tests/test_conformance.py), with numpy arrays
standing in for device arrays and every launch recorded instead of run, then compiles each
recorded (kernel, argument types) with ``numba.cuda.compile_ptx``.

    .venv/bin/python tests/cuda_ptx.py [--cc 9.0]

Exit status: 0 all compiled, 1 some kernel failed, 3 no CUDA toolkit (NVVM) to compile with.

It patches numba.cuda in its own process (allocation, and the current device's compute
capability that device functions are compiled for), so it runs as a script, not in pytest.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import types
from pathlib import Path

import numba
import numpy as np
from numba import cuda


def _stand_in_device(cc):
    """Device arrays become numpy arrays, and device functions compile for ``cc``."""
    cuda.device_array = lambda shape, dtype=np.float64: np.empty(shape, dtype=dtype)
    cuda.to_device = lambda array: np.array(array, order="C")
    numba.cuda.dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)


def _conformance_generators():
    path = Path(__file__).with_name("test_conformance.py")
    # It imports its neighbours as the package ``tests``, as pytest does from the repository root.
    root = str(path.parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location("conformance", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GENERATORS


def record_launches(kernels):
    """Every (kernel, argument types) the conformance cases launch, without running them."""
    launched = {}

    def record(kernel, blocks, threads, *args, shared_bytes=0):
        signature = tuple(numba.typeof(a) for a in args)
        launched[(id(kernel), signature)] = (kernel, signature)

    # Every kernel family launches through its own name for device.launch.
    for family in (kernels.device, *kernels.FAMILIES):
        if hasattr(family, "launch"):
            family.launch = record

    def contiguous(a):
        if isinstance(a, np.ndarray):
            return np.array(a, order="C")
        if isinstance(a, list) and a and isinstance(a[0], np.ndarray):
            return [np.array(x, order="C") for x in a]
        return a

    generators = _conformance_generators()        # imports the package: the ops' formulas
    from tinygrad_attn.compiler import elementwise_formulas, formulas

    # The device's table as it will be on a GPU: its own kernels, and every formula's.
    table = dict(kernels.KERNELS)
    for formula in elementwise_formulas():
        plan = formulas.plan(formula)
        table.update({k.name: kernels.elementwise.build(k) for k in (plan.forward, *plan.backward)})
    for generator in generators:
        for dtype in (np.float32, np.float64):
            for shape in ((2, 3), (3, 2, 4)):
                for name, args in generator(np.random.default_rng(0), dtype, shape):
                    with np.errstate(all="ignore"):
                        try:
                            table[name](*(contiguous(a) for a in args))
                        except AssertionError:
                            # A guard read back a flag no launch wrote (launches are only
                            # recorded here) and called the case's fail: its launch is recorded.
                            if not name.startswith("guard_"):
                                raise
    return list(launched.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", default="9.0", help="compute capability to compile for (default 9.0)")
    cc = tuple(int(p) for p in parser.parse_args().cc.split("."))
    if numba.config.ENABLE_CUDASIM:
        print("unset NUMBA_ENABLE_CUDASIM: the simulator does not compile", file=sys.stderr)
        return 2
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception as error:  # noqa: BLE001 - any failure to load NVVM means: no toolkit here
        print(f"no CUDA toolkit to compile with: {error}", file=sys.stderr)
        return 3
    _stand_in_device(cc)
    from tinygrad_attn.compiler import cuda as kernels
    kernels.memory.to_numpy = np.asarray        # a guard reads a flag back: stand-ins are host arrays

    start = time.perf_counter()
    launches = record_launches(kernels)
    failures = []
    for kernel, signature in launches:
        try:
            cuda.compile_ptx(kernel.py_func, signature, cc=cc)
        except Exception as error:  # noqa: BLE001 - every failure is reported, then the status says it
            failures.append(f"{kernel.py_func.__qualname__}{signature}: {type(error).__name__}: {error}")
    kinds = len({id(k) for k, _ in launches})
    print(f"compiled {len(launches) - len(failures)} of {len(launches)} launch signatures of {kinds} kernels "
          f"for compute capability {cc[0]}.{cc[1]} in {time.perf_counter() - start:.1f} s")
    for failure in failures:
        print("FAILED", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
