"""ta.set_num_threads: BLAS and Numba's pool both follow it (in a child process, so the
setting does not leak into the other tests)."""

import os
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


SPLIT_SCRIPT = """
import os
import numpy as np
import tinygrad_attn as ta
from tinygrad_attn.compiler import reference
from tinygrad_attn.compiler.cpu import attention
ta.set_num_threads(2)
tasks = lambda: set(os.listdir("/proc/self/task"))
rng = np.random.default_rng(0)
a = rng.random((512, 512))
seen = []
for shape in [(512, 20, 4, 32), (2, 256, 4, 32)]:      # small heads (batched), then blocked
    q, k, v, do = (rng.standard_normal(shape) for _ in range(4))
    seen.append(attention._small_split(q, k))
    o, lse = attention.sdpa(q, k, v, None, 0.2, True)  # the split's own pool started
    a @ a                                              # OpenBLAS's worker (re)started
    before = tasks()
    o, lse = attention.sdpa(q, k, v, None, 0.2, True)
    got = (o, lse) + attention.sdpa_back(q, k, v, o, lse, do, None, 0.2, True)
    seen.append(len(before - tasks()))                 # threads gone: a stopped worker, restarted
    want = reference.sdpa(q, k, v, None, 0.2, True)
    want = want + reference.sdpa_back(q, k, v, *want, do, None, 0.2, True)
    seen.append(all(np.allclose(x, y, rtol=1e-12, atol=1e-12) for x, y in zip(got, want, strict=True)))
print(*seen)
"""


THREADED_SCRIPT = """
import numpy  # noqa: F401 - loads OpenBLAS
from threadpoolctl import threadpool_info
print(any(p["internal_api"] == "openblas" and p["threading_layer"] == "pthreads" and p["num_threads"] > 1
          for p in threadpool_info()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_short_attention_splits_keep_blas_worker_and_long_ones_stop_it():
    # Stopping OpenBLAS's idle worker at every short split made the next product start a new
    # one, which after a pause cost a Transformer step 3-4x its warm time (bench/idle.py):
    # the batched small-head path leaves the worker alone; the blocked kernel still stops it.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2", NUMBA_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", SPLIT_SCRIPT], capture_output=True, text=True, check=True,
                         env=env)
    threaded = subprocess.run([sys.executable, "-c", THREADED_SCRIPT], capture_output=True, text=True,
                              check=True, env=env).stdout.strip() == "True"
    small_split, small_change, small_close, blocked_split, blocked_change, blocked_close = out.stdout.split()
    assert small_close == blocked_close == "True"          # both paths still match the reference
    assert small_split == "True"                           # the small heads were shared out
    assert int(small_change) == 0                          # OpenBLAS's worker kept
    assert int(blocked_change) == (1 if threaded else 0)   # stopped, started anew
