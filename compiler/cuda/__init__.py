"""numba.cuda kernels for the "cuda" device: every kernel of the numpy reference, on the GPU.

The device's arrays are numba.cuda device arrays (``DeviceNDArray``), always C-contiguous:
every kernel writes a fresh contiguous array and ``reshape`` is a view of one.  ``asarray``
and ``to_numpy`` copy between host and device; no other kernel moves data off the GPU, so
there are no host fallbacks.  Three things do run on the host, on shapes or on small index
data, never on a device array: the flat positions an integer or boolean index picks
(``getitem`` with arrays; numpy works them out from the shape), dropout's mask (drawn by
numpy's generator for reproducibility, then copied over by the op), and the checks ops make
on ids and targets (they copy those to the host to name a bad value).

What runs as a kernel, with its launch configuration (T = THREADS, R = ROW_THREADS, numbers
for a GPU; the simulator's are below):

* elementwise maps and their backwards, comparisons, ``where``, ``astype``/``copy``/``zeros``/
  ``full``, the embedding lookup, ``cross_entropy_back``, ``nll_loss``(+back), the GRU/LSTM
  gates and ``additive_scores``(+back): one thread per output entry (or row), grid-stride
  loops, [min(ceil(n/T), 8192) blocks x T=256 threads].  The elementwise kernels are
  generated from the ops' formulas (``formulas.py``, ``elementwise.build``).  Binary and
  ternary maps broadcast as numpy does: each operand is read
  through its own strides, 0 along broadcast axes, so nothing is expanded in memory.
* movement: ``reshape`` is a view; ``permute``, ``broadcast_to``, ``getitem`` (basic indices:
  one strided copy; integer or boolean arrays: a gather), ``getitem_back`` (strided copy, or
  an atomic scatter-add where an index may repeat), ``cat``, ``split`` and ``stack`` are
  strided copies [as elementwise].  ``embedding_back`` is an atomic scatter-add.
* reductions (``sum``, ``sum_to``, ``max``, the tie counts of ``max_back``): the reduced axes
  are moved last (a strided copy unless they already are), then one block per row reduces
  through shared memory [min(rows, 8192) blocks x R=128 threads].
* ``softmax``, ``log_softmax``, ``masked_softmax``, their backwards and ``cross_entropy``: one
  block per row of the last axis, the row max and sum by shared-memory trees [as reductions];
  another axis is moved last and back by strided copies.
* ``matmul``, ``matmul_nt``, ``matmul_tn``: tiled through shared memory: a block loads
  TILE x TILE tiles of both operands in turn and accumulates one TILE x TILE output tile
  [(ceil(m/TILE), ceil(n/TILE), batch) blocks, each at most 65535 (further tiles are taken
  a grid's stride on), x (TILE, TILE) = (16, 16) threads].  The transposed forms only swap
  the strides the tiles are loaded with; batch axes broadcast through zero strides.
* ``sdpa``: FlashAttention-style.  One thread per query row, a block of B query rows loops
  over tiles of B keys held in shared memory with an online softmax (running max and sum,
  the output rescaled as the max grows), so the (T_q, T_k) weights never exist; causal
  blocks stop at their last query.  ``sdpa_back``: a kernel computes delta = rowsum(do * o),
  one kernel dq (a thread per query row, looping over key tiles) and one dk, dv (a thread per
  key row, looping over query tiles), each rebuilding p = exp(s - lse) [(ceil(T/B), N) blocks
  x B threads, B <= 64 rows chosen so the block's dynamic shared memory fits 48 KiB].

Under ``NUMBA_ENABLE_CUDASIM=1`` (Numba's simulator, which runs every CUDA thread as a Python
thread) the same kernels run with T = R = TILE = B = 4, at most 4 blocks (2 per grid axis of
2-D and 3-D grids), so tests reach partial tiles, several tiles and the grid-stride loops on
tiny shapes.  The package runs on the simulator as it is; the tests make the simulator's
arrays refuse what real device arrays refuse, and its thread polling cheaper
(tests/simulator.py).

One module per kernel family, each with its part of the table (``KERNELS``): memory,
elementwise, reduce, movement (with the embedding), linalg, softmax (with the losses), norm,
attention, rnn; device.py holds the launch configuration and the geometry they share.

No GPU has run these kernels yet: they are checked under the simulator (tests/test_cuda.py,
tests/test_conformance.py) and compiled to PTX for compute capability 9.0 with the argument
types of every conformance case (tests/cuda_ptx.py, which needs the CUDA toolkit's NVVM only).
"""

from __future__ import annotations

from . import additive, attention, elementwise, linalg, memory, movement, norm, optim, reduce, rnn, softmax
from .device import MAX_BLOCKS, ROW_THREADS, SDPA_ROWS, SIMULATOR, THREADS, TILE

__all__ = ["KERNELS", "SIMULATOR", "THREADS", "ROW_THREADS", "TILE", "SDPA_ROWS", "MAX_BLOCKS"]

FAMILIES = (memory, elementwise, reduce, movement, linalg, softmax, norm, additive, attention, rnn, optim)

KERNELS = {name: fn for family in FAMILIES for name, fn in family.KERNELS.items()}
