"""The "numpy" device: reference kernels in plain numpy, the oracle every other device is
tested against, and the kernels a device falls back to where it overrides none.

Kernels take numpy arrays and Python ints/floats and return new arrays; they never see a
Tensor and never validate shapes (the ops do that, so errors can name the op).
A ``*_back`` kernel is the vector-Jacobian product of its partner.

One module per kernel family, each with its part of the table (``KERNELS``), the same
families as compiler/cpu/ and compiler/cuda/: memory, elementwise, reduce, movement, linalg,
softmax, norm, attention, rnn, optim (the optimizers' updates and gradient clipping).
"""

from __future__ import annotations

from . import additive, attention, elementwise, linalg, memory, movement, norm, optim, reduce, rnn, softmax

__all__ = ["KERNELS", "FAMILIES"]

FAMILIES = (memory, elementwise, reduce, movement, linalg, softmax, norm, additive, attention, rnn, optim)

KERNELS = {name: fn for family in FAMILIES for name, fn in family.KERNELS.items()}

# Every kernel is also an attribute (reference.softmax(x, -1)), as on a Backend.
globals().update(KERNELS)
