"""Numba kernels for the "cpu" device: softmax-shaped work fused into one pass per row, and
the fused attention kernels (additive scores, scaled dot-product).

These override the numpy reference kernels of the same names; every other kernel of the
device stays the reference one.  One module per kernel family, each with its part of the
table (``KERNELS``): elementwise (with a bias added to rows), reduce (a matrix's rows
summed), softmax (with cross-entropy), norm (layer normalisation), movement (the embedding's
scatter), additive (Bahdanau's scores), attention (scaled dot-product), rnn (the GRU and
LSTM gates), optim (Adam's update).  Matrix products stay on numpy's BLAS: a hand-written
Numba GEMM reaches ~60 GFLOP/s here against BLAS's ~190, so the fused attention kernels call
BLAS for their products and Numba for everything between them.

Softmax-shaped work (max, exp, sum, divide; its backward; cross-entropy) costs numpy four
to seven passes over memory and a temporary per pass; a Numba row kernel does it in two
passes without temporaries, rows in parallel.  Of the elementwise maps only those numpy
runs as several passes are compiled, from the ops' formulas (float32, 1M entries: sigmoid
4.3x the numpy form's speed, tanh_back 3.5x, sigmoid_back 2.8x): numpy's own tanh, exp and
arithmetic already run at SIMD speed.

exp (and tanh, for the additive scores) dominates all of these: they come from
``numba_support``, polynomials that vectorise for float32 and libm for float64.

Every kernel is compiled on first use and cached on disk (``cache=True``); signatures are
kept few by passing C-contiguous arrays, save one head's (T, D) rows of a (B, T, H, D)
array, which the blocked attention reads strided rather than copy.
"""

from __future__ import annotations

from . import additive, attention, elementwise, movement, norm, optim, reduce, rnn, softmax

__all__ = ["KERNELS", "FAMILIES"]

FAMILIES = (elementwise, reduce, softmax, norm, movement, additive, attention, rnn, optim)

KERNELS = {name: fn for family in FAMILIES for name, fn in family.KERNELS.items()}
