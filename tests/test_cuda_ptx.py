"""Every CUDA kernel compiles for a GPU (PTX for compute capability 9.0), checked without one.

The simulator runs kernels as Python and cannot tell; tests/cuda_ptx.py compiles each kernel
with the argument types the conformance cases launch it with.  It needs the CUDA toolkit's
NVVM, not a GPU, and runs in a process of its own (it patches numba.cuda there).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinygrad_attn.compiler import available_devices

pytestmark = pytest.mark.skipif(
    "cuda" not in available_devices(),
    reason="no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not set: make test runs this test in its "
           "CUDA step",
)


def test_every_cuda_kernel_compiles_to_ptx():
    script = Path(__file__).with_name("cuda_ptx.py")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                            cwd=script.parents[1])
    if result.returncode == 3:
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "compiled" in result.stdout
