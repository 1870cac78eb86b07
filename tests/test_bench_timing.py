"""What the benches rest on: bench/timing.py's machine line names the kernels numpy's BLAS
chose (the products' speed on an AVX-512 CPU halves with OpenBLAS's AVX2 kernels, so a
figure must say which ran), and bench/transformer.py's torch decoders decode what the engine
does."""

import os
import pathlib
import subprocess
import sys

import pytest
from threadpoolctl import threadpool_info

from tests import optional

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


@optional.needs_torch
def test_the_static_cache_torch_decoder_decodes_what_the_engine_and_the_growing_cache_do(monkeypatch):
    """bench/transformer.py's torch.compile contender runs a decoder whose caches are
    preallocated and masked past the position: uncompiled, it must pick the tokens of the
    hand-cached decoder (caches grown by concatenation) and of the engine, else the bench
    would time a different decode."""
    import numpy as np
    import torch

    monkeypatch.syspath_prepend(str(BENCH))
    bench = __import__("transformer")
    model = bench.engine_model()
    src = bench.batch(6)[0]
    src[1, 12:] = 0                                      # a padded source
    twin = model.to_torch().eval()
    source = torch.from_numpy(src)
    decode, seconds = bench.torch_static_decoder(twin, source, 7, compile_step=False)
    ours = model.greedy(src, max_len=7)[0]
    assert seconds is None
    np.testing.assert_array_equal(decode().numpy(), bench.torch_greedy_cached(twin, source, 7).numpy())
    np.testing.assert_array_equal(decode().numpy(), ours)
