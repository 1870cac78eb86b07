"""Layer normalisation over the rows of a (M, N) array: the forward keeps each row's mean and
reciprocal standard deviation for the backward (as torch's native kernel does)."""

from __future__ import annotations

import numpy as np


def layer_norm(x, weight, bias, eps):
    """y = (x - mean) * rstd [* weight] [+ bias] per row of x (M, N), rstd = 1 / sqrt(var + eps)
    with the biased variance.  weight and bias are (N,) or None.  Returns y, mean (M,),
    rstd (M,)."""
    mean = x.mean(axis=1)
    centred = x - mean[:, None]
    var = (centred * centred).mean(axis=1)
    rstd = (1 / np.sqrt(var + eps)).astype(x.dtype)
    y = centred * rstd[:, None]
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mean, rstd


def layer_norm_back(dy, x, mean, rstd, weight):
    """The gradients of layer_norm: dx (M, N), and the column sums dweight = sum(dy xhat) and
    dbias = sum(dy) (N,) (dweight None without a weight).  With xhat = (x - mean) rstd and
    g = dy weight: dx = rstd (g - mean(g) - xhat mean(g xhat)), row means."""
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy if weight is None else dy * weight
    dx = rstd[:, None] * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    dweight = None if weight is None else (dy * xhat).sum(axis=0)
    return dx, dweight, dy.sum(axis=0)


KERNELS = {"layer_norm": layer_norm, "layer_norm_back": layer_norm_back}
