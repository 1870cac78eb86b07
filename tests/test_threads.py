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


STOP_SCRIPT = """
import os, threading
import numpy as np
from threadpoolctl import threadpool_limits
from tinygrad_attn.compiler import threads
threadpool_limits(2, user_api="blas")
a = np.random.default_rng(0).random((512, 512))
expected = a @ a                                      # starts OpenBLAS's worker thread
tasks = lambda: len(os.listdir("/proc/self/task"))
before = tasks()
other = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
other.start()                                         # another Python thread: left alone
threads.stop_spinning_blas_threads("pool")
kept = tasks()
other_name = other.name
threads.stop_spinning_blas_threads(other_name[:3])    # its name marks it as the caller's own
stopped = tasks()
again = a @ a                                         # OpenBLAS starts its threads again
print(before, kept, stopped, bool(np.array_equal(again, expected)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_stopping_idle_blas_threads_spares_other_threads_and_products_still_work():
    out = subprocess.run([sys.executable, "-c", STOP_SCRIPT], capture_output=True, text=True, check=True)
    before, kept, stopped, same = out.stdout.split()
    assert int(kept) == int(before) + 1            # the other thread started; nothing stopped
    if int(before) > 1:                            # a threaded OpenBLAS had a worker to stop
        assert int(stopped) < int(kept)
    assert same == "True"


def test_importing_the_engine_loads_no_numba_and_starts_no_thread_pool():
    # Numba's OpenMP pool starts when compiler.cpu is first used; started at import, a later
    # `import torch` runs torch beside a second OpenMP runtime (its training step 6x slower).
    script = ("import sys, tinygrad_attn as ta; ta.optim.Adam([ta.nn.Parameter([1.0])]); "
              "print(sorted(m for m in sys.modules if m == 'numba' or "
              "m.startswith('tinygrad_attn.compiler.cpu')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
