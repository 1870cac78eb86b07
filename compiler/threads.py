"""How many threads the cpu device uses: numpy's BLAS (matrix products) and Numba's pool.

    >>> ta.set_num_threads(1)     # like torch.set_num_threads

Why it matters here: the products of a small model (a 32 x 128 batch against a 384 x 128
weight) gain nothing from a second BLAS thread, and OpenBLAS threads that wait by spinning
collapse when another process wants the same cores.  With other work running on a 2-core
machine, the forward and backward of a seq2seq step at hidden 128, batch 32 took 2.6 s
with two BLAS threads and 29 ms with one (OPENBLAS_NUM_THREADS=1).  On the idle machine
two threads were faster at hidden 128 (29.5 against 38.0 ms a training step) and equal at
hidden 32 (bench/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import numbers
import sys
import threading

_requested: list[int] = []


def set_num_threads(n: int) -> None:
    """Use ``n`` threads for BLAS and for Numba's parallel kernels (this thread's launches).

    BLAS is switched at once through threadpoolctl; Numba's pool, if not started yet, takes
    the setting when it starts (``n`` is capped at the pool's size, NUMBA_NUM_THREADS).
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"set_num_threads: n must be a positive int, got {n!r}")
    from threadpoolctl import threadpool_limits

    n = int(n)
    threadpool_limits(n, user_api="blas")
    _requested[:] = [n]
    apply_to_numba()


def get_num_threads() -> int:
    """The BLAS thread count now in force (what ``set_num_threads`` last set, by default the
    number of cores)."""
    from threadpoolctl import threadpool_info

    counts = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    return max(counts) if counts else 1


def blas_kernels() -> str:
    """numpy's BLAS and the kernels it chose, e.g. 'OpenBLAS 0.3.31, Haswell kernels
    (OPENBLAS_CORETYPE=Haswell)': OpenBLAS picks its kernels for the CPU when it loads, unless
    that variable names them, and on an AVX-512 CPU its AVX2 (Haswell) kernels run products
    at about half the speed of its SkylakeX ones (bench/RESULTS.md, 2026-11-28 night), so a
    timed figure says which ran."""
    import os

    from threadpoolctl import threadpool_info

    pools = [pool for pool in threadpool_info() if pool.get("user_api") == "blas"]
    if not pools:
        return "numpy's BLAS unknown"
    # numpy's own (a wheel's sits under numpy.libs) before any other, e.g. torch's
    pool = min(pools, key=lambda pool: "numpy" not in pool.get("filepath", ""))
    api = pool["internal_api"]
    kind = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS"}.get(api, api)
    text = f"{kind} {pool.get('version') or ''}".rstrip()
    if pool.get("architecture"):
        text += f", {pool['architecture']} kernels"
    chosen = os.environ.get("OPENBLAS_CORETYPE") if kind == "OpenBLAS" else None
    return text + (f" (OPENBLAS_CORETYPE={chosen})" if chosen else "")


def apply_to_numba() -> None:
    """Give Numba's pool the requested count, once numba_support has started it."""
    if _requested and f"{__package__}.numba_support" in sys.modules:
        import numba

        numba.set_num_threads(min(_requested[0], numba.config.NUMBA_NUM_THREADS))


_blas: list = []
_stops: list = []


def _blas_controllers():
    if not _blas:
        from threadpoolctl import ThreadpoolController

        _blas.append(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _blas[0]


def stop_spinning_blas_threads(pool_name: str) -> None:
    """Stop OpenBLAS's worker threads, which busy-wait for ~0.1 s after each multi-threaded
    product (its THREAD_TIMEOUT, 2^28 cycles): on 2 cores one of them, spinning beside our own
    second thread, left that thread half a core (blocked attention forward at (64, 256, 32):
    12.7 ms with two threads right after a product, 6.5 ms without).  OpenBLAS starts them
    again at its next multi-threaded product (~30 us).

    Only while no Python thread but this one and those named ``pool_name...`` runs: the
    shutdown takes back any job queued for OpenBLAS's threads, so another thread's product in
    flight would never finish."""
    me = threading.current_thread()
    if any(t is not me and not t.name.startswith(pool_name) for t in threading.enumerate()):
        return
    if not _stops:
        _stops.append([lib.dynlib.blas_thread_shutdown_ for lib in _blas_controllers()
                       if lib.internal_api == "openblas" and lib.threading_layer == "pthreads"
                       and hasattr(lib.dynlib, "blas_thread_shutdown_")])
    for stop in _stops[0]:
        stop()


@contextlib.contextmanager
def one_blas_thread(pool_name: str | None = None):
    """BLAS at one thread inside the block, for work that runs its own threads, each calling
    BLAS (two threads of two-threaded BLAS took 186-335 ms where one-threaded BLAS took 100).

    The count is process-wide: callers in several threads must take turns
    (compiler/cpu/attention.py holds a lock around it).  Switching costs ~1 µs: the libraries
    are found once.  This OpenBLAS (0.3.31) ignored the call from a thread other than the
    main one once the main thread had set a count; the block then runs with BLAS's own
    threads, slower, not wrong.

    ``pool_name``: the block's own threads carry this name prefix; OpenBLAS's idle threads are
    then stopped too, so they do not spin beside them (``stop_spinning_blas_threads``)."""
    libs = _blas_controllers()
    before = [lib.num_threads for lib in libs]
    for lib, count in zip(libs, before, strict=True):
        if count > 1:
            lib.set_num_threads(1)
    if pool_name is not None and max(before, default=1) > 1:
        stop_spinning_blas_threads(pool_name)
    try:
        yield
    finally:
        for lib, count in zip(libs, before, strict=True):
            if count > 1:
                lib.set_num_threads(count)


def requested() -> int | None:
    """The count ``set_num_threads`` was last given, in any thread (None before any call)."""
    return _requested[0] if _requested else None
