"""ta.set_num_threads: BLAS and Numba's pool both follow it (in a child process, so the
setting does not leak into the other tests)."""

import subprocess
import sys

import pytest

import tinygrad_attn as ta

SCRIPT = """
import tinygrad_attn as ta
ta.set_num_threads(1)
import numba
import tinygrad_attn.compiler.cpu          # starts Numba's pool after the call
print(ta.get_num_threads(), numba.get_num_threads())
"""


def test_set_num_threads_reaches_blas_and_numba():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_set_num_threads_rejects_non_positive_ints(bad):
    with pytest.raises(ValueError, match="set_num_threads: n must be a positive int"):
        ta.set_num_threads(bad)


BLAS_LIMIT_SCRIPT = """
from threadpoolctl import threadpool_limits
from tinygrad_attn.compiler import threads
threadpool_limits(2, user_api="blas")
seen = [threads.get_num_threads()]
with threads.one_blas_thread():
    seen.append(threads.get_num_threads())
seen.append(threads.get_num_threads())
try:
    with threads.one_blas_thread():
        raise KeyError
except KeyError:
    pass
seen.append(threads.get_num_threads())
print(*seen)
"""


def test_one_blas_thread_pins_blas_and_restores_it_even_after_an_error():
    out = subprocess.run([sys.executable, "-c", BLAS_LIMIT_SCRIPT], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["2", "1", "2", "2"]
