"""What every Numba kernel module of the compiler shares: the threading layer, the fastmath
flags, and float32-aware scalar math (exp, tanh, sigmoid) that LLVM can vectorise.

This llvmlite has no SVML, so ``math.exp`` and ``math.tanh`` inside a Numba loop are scalar
libm calls (~2.4 ns an element) and keep the loop from vectorising.  For float32 the
functions here are polynomials written without branches or table loads, which LLVM turns
into AVX-512 code (~0.2 ns an element for exp); for float64 they are libm's, so float64
results stay exact to rounding for the checks.  Each is an ``@overload`` that picks its
implementation once per compiled signature.

Numba's disk cache checks only the time stamp of the file that holds a kernel, not of the
helpers it inlines from here: after editing this module, touch the modules that use it (or
delete their ``__pycache__/*.nbi`` files), or their kernels keep the old code.
"""

from __future__ import annotations

import math
import os
import statistics
import time

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload
from numba.np.ufunc.parallel import _launch_threads

from . import threads


def _other_openmp_loaded() -> bool:
    """Whether an OpenMP runtime is already mapped into this process (Linux only)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libgomp" in line or "libiomp" in line for line in maps)
    except OSError:
        return False


def _start_threads() -> None:
    """Start Numba's thread pool: OpenMP whose idle threads sleep, else "workqueue".

    A parallel kernel launch costs 9-50 µs on OpenMP with passive waiting (by machine; see
    ``launch_us``), 55-90 µs on "workqueue" and, with OpenMP's default active waiting, 1.4 µs,
    but then idle threads keep spinning and compete for the two cores with the BLAS threads
    of the next matrix product (a 128x128 attention step went from 0.15 to 10 ms).  GNU
    OpenMP reads OMP_WAIT_POLICY once, when it loads, so the variable is set only while Numba
    loads it and then removed again: other OpenMP users in the process (PyTorch's own copy,
    say) load with their defaults.
    Your own NUMBA_THREADING_LAYER or OMP_WAIT_POLICY wins.  Like every OpenMP program the
    pool must not be used in a child process forked after it started.  If another OpenMP
    runtime is already loaded (PyTorch imported first), "workqueue" it is (see below)."""
    if "NUMBA_THREADING_LAYER" in os.environ:
        return
    if _other_openmp_loaded():
        # Another OpenMP runtime (PyTorch's, when torch was imported first) already runs
        # in the process with busy-waiting threads; Numba's OpenMP pool beside it made a
        # small attention take 16 ms instead of 0.09.  "workqueue" threads stay out of its way.
        numba.config.THREADING_LAYER = "workqueue"
        return
    numba.config.THREADING_LAYER_PRIORITY = ["omp", "workqueue", "tbb"]
    ours = "OMP_WAIT_POLICY" not in os.environ
    if ours:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        _launch_threads()
    finally:
        if ours:
            del os.environ["OMP_WAIT_POLICY"]


_start_threads()
threads.apply_to_numba()                 # a count set with ta.set_num_threads before now

# The dtypes a kernel's fast path compiles for: float32 and float64 in native byte order (a
# dtype such as '>f4' compares unequal to these and goes to numpy).
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# fastmath without 'nnan'/'ninf': masked scores are -inf and the kernels test for it.
# 'reassoc' lets LLVM vectorise the row sums; 'afn' the polynomial.
FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}


@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits`` (a register move)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(cache=True, fastmath=FAST)
def _exp32(x):
    """exp(x) in float32: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial to
    degree 6 (error r^7/7! < 2e-7), times 2^n built from its bits.

    Written without branches or table loads so that LLVM turns a loop of it into AVX-512
    code (0.2 ns an element against 1.0 for the table version and 0.5 for numpy's exp):
    x is clamped to float32's normal range, and the out-of-range cases are selects at the
    end.  Below -87 it returns 0, so masked (-inf) scores come out exactly 0."""
    xc = min(max(x, np.float32(-87.0)), np.float32(88.0))
    # np.floor keeps float32 (math.floor would give an int64 and drag the math to float64).
    n = np.floor(xc * np.float32(1.4426950408889634) + np.float32(0.5))
    # ln2 split in two (Cody-Waite) so that n*ln2 is subtracted without rounding error.
    r = xc - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    y = p * _float32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))   # p * 2^n
    y = np.float32(0.0) if x < np.float32(-87.0) else y
    y = np.float32(np.inf) if x > np.float32(88.72) else y
    return x if x != x else y   # NaN stays NaN


def _by_float_width(generic, impl32, impl64) -> None:
    """Make ``generic(x)``, inside Numba, run ``impl32`` for a float32 x and ``impl64``
    otherwise: chosen once per compiled signature, so it costs nothing at run time."""

    def choose(x):
        return impl32 if isinstance(x, types.Float) and x.bitwidth == 32 else impl64

    overload(generic)(choose)


def typed_exp(x):  # pragma: no cover - replaced inside Numba (_by_float_width)
    return math.exp(x)


def _exp32_impl(x):
    return _exp32(x)


def _exp64_impl(x):
    return math.exp(x)


_by_float_width(typed_exp, _exp32_impl, _exp64_impl)


def cast_like(x, value):  # pragma: no cover - replaced inside Numba by the overload below
    return value


@overload(cast_like)
def _like_overload(x, value):
    # A constant in x's float type: a float64 literal in float32 arithmetic would promote
    # the whole row to float64 (and to the slow exp).
    if isinstance(x, types.Float) and x.bitwidth == 32:
        return _as_float32
    return _as_float64


def _as_float32(x, value):
    return np.float32(value)


def _as_float64(x, value):
    return np.float64(value)


@njit(cache=True, fastmath=FAST, error_model="numpy")
def _tanh32(x):
    """tanh in float32.  For |x| < 0.625 an odd polynomial (Cephes tanhf, relative error
    ~1e-7), since 1 - 2/(e^{2x} + 1) cancels there; beyond, that form with |x| capped at 10,
    where tanh already rounds to 1 in float32 (and e^{2x} cannot overflow).  Both are
    computed and one selected, so a loop of it vectorises."""
    a = min(abs(x), np.float32(10.0))
    z = x * x
    p = np.float32(-5.70498872745e-3)
    p = p * z + np.float32(2.06390887954e-2)
    p = p * z + np.float32(-5.37397155531e-2)
    p = p * z + np.float32(1.33314422036e-1)
    p = p * z + np.float32(-3.33332819422e-1)
    small = x + x * z * p
    t = np.float32(1.0) - np.float32(2.0) / (_exp32(a + a) + np.float32(1.0))
    large = t if x >= 0 else -t
    return small if a < np.float32(0.625) else large


def typed_tanh(x):  # pragma: no cover - replaced inside Numba (_by_float_width)
    return math.tanh(x)


def _tanh32_impl(x):
    return _tanh32(x)


def _tanh64_impl(x):
    return math.tanh(x)


_by_float_width(typed_tanh, _tanh32_impl, _tanh64_impl)


@njit(cache=True, fastmath=FAST, error_model="numpy")
def typed_sigmoid(x):
    """1 / (1 + e^{-x}) with exp of a non-positive number only (no overflow), in x's type."""
    e = typed_exp(-abs(x))
    one = cast_like(x, 1.0)
    s = one / (one + e)
    return s if x >= 0 else e * s


# ---------------------------------------------------------------- serial or parallel


@njit(cache=True, parallel=True)
def _empty_parallel(x):
    for i in prange(x.shape[0]):
        x[i] += 1.0


_LAUNCH_US: list[float] = []

# "workqueue" runs a prange loop less efficiently than OpenMP beyond its launch: with it the
# serial GRU gates still won at 262K float32 entries (589 against 675 µs, bench/rnn_cells.py
# --threshold), about 5x past where its empty-kernel launch cost alone puts the break-even.
WORKQUEUE_FACTOR = 5


def launch_us() -> float:
    """Microseconds to start one parallel kernel on every thread of Numba's pool, measured
    once per process: the median of 15 launches of a kernel with nothing to do (about a
    millisecond in all).

    Measured, not assumed, because it differs by machine and pool: ~9 µs on one machine of
    this project's kind and ~50 µs on another (OpenMP with sleeping threads, which the
    kernel must wake), 55-90 µs with "workqueue", 1.4 µs with spinning threads."""
    if not _LAUNCH_US:
        x = np.zeros(2)
        before = numba.get_num_threads()
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)   # whatever this thread asked
        try:
            _empty_parallel(x)              # compiled or loaded, and the pool started
            samples = []
            for _ in range(15):
                start = time.perf_counter()
                _empty_parallel(x)
                samples.append(time.perf_counter() - start)
        finally:
            numba.set_num_threads(before)
        _LAUNCH_US.append(statistics.median(samples) * 1e6)
    return _LAUNCH_US[0]


_PARALLEL_MIN: dict[int, int] = {}


def parallel_min(entries_at_10us: int) -> int:
    """How many entries a prange kernel needs to beat its serial loop here, given how many
    it needed where a launch cost 10 µs on OpenMP.  Two threads save half the serial time,
    which grows with the entries, and pay one launch: the break-even size grows with the
    launch cost.  (Measured on one machine at a 50 µs launch: softmax rows broke even at
    ~64K entries, against ~12K at 10 µs.)"""
    if entries_at_10us not in _PARALLEL_MIN:                 # computed once: a hot path asks
        cost = max(launch_us(), 1.0)                # starts the pool, so the layer is known
        factor = WORKQUEUE_FACTOR if numba.threading_layer() == "workqueue" else 1
        _PARALLEL_MIN[entries_at_10us] = int(entries_at_10us * factor * cost / 10.0)
    return _PARALLEL_MIN[entries_at_10us]
