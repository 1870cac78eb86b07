"""bench/timing.py's machine line names the kernels numpy's BLAS chose: the products' speed
on an AVX-512 CPU halves with OpenBLAS's AVX2 kernels, so a figure must say which ran."""

import os
import pathlib
import subprocess
import sys

import pytest
from threadpoolctl import threadpool_info

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"
SCRIPT = "import numpy, timing; print(timing.cpu_model())"
OPENBLAS = any(pool["internal_api"] == "openblas" for pool in threadpool_info())


def machine_line(**env_changes) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"} | env_changes
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=BENCH, env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


@pytest.mark.skipif(not OPENBLAS, reason="numpy's BLAS is not OpenBLAS here")
def test_machine_line_names_the_kernels_openblas_was_told_to_use():
    line = machine_line(OPENBLAS_CORETYPE="Sandybridge")
    assert line.endswith(", Sandybridge kernels (OPENBLAS_CORETYPE=Sandybridge)"), line
    assert "; OpenBLAS 0." in line, line


@pytest.mark.skipif(not OPENBLAS, reason="numpy's BLAS is not OpenBLAS here")
def test_machine_line_names_the_kernels_openblas_chose_itself():
    line = machine_line()
    assert "OPENBLAS_CORETYPE" not in line and line.endswith(" kernels"), line
