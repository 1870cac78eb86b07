"""The "cpu" device's Adam update, fused: one pass over a parameter instead of a dozen numpy
ufuncs (the reference's ``adam_``, compiler/reference/optim.py).

Every scalar arrives in the parameter's dtype and every operation is the one the numpy form
takes, in its order, without ``fastmath``: the results are bit for bit those of the ufunc
sequence (and so torch's, to its rounding).  The step count and the hyperparameters come in
arrays and the per-step scalars are derived from them in Python, exactly as the reference
derives them, so a replayed call sees the current step and learning rate.

``error_model="numpy"`` (a division by zero gives inf, as numpy's, instead of raising) is
what lets the loop vectorise: one thread, a (262144,) float32 parameter, 131 us against 979
with Python's error model; the Transformer bench's 68 parameters (0.94M weights) 1.1 ms
against 2.6 ms for the ufuncs.  One thread on purpose: waking a second for each parameter
cost more than it saved (2.7 ms for the 68).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..reference.optim import adam_scalars

__all__ = ["KERNELS", "adam_"]


@njit(cache=True, error_model="numpy")
def _adam(param, grad, exp_avg, exp_avg_sq, weight_decay, weight, keep, small_weight, beta2, one_minus_beta2,
          neg_step_size, bias_correction2_sqrt, eps):
    for i in range(param.size):
        g = grad[i]
        if weight_decay != 0:
            g = g + param[i] * weight_decay
        m = exp_avg[i]
        if small_weight:            # torch's lerp, both branches (see ta.optim.Adam)
            m = m + (g - m) * weight
        else:
            m = g - (g - m) * keep
        exp_avg[i] = m
        v = exp_avg_sq[i] * beta2 + (g * one_minus_beta2) * g
        exp_avg_sq[i] = v
        param[i] = param[i] + (m * neg_step_size) / (np.sqrt(v) / bias_correction2_sqrt + eps)


def adam_(param, grad, exp_avg, exp_avg_sq, step, hyper) -> None:
    """The reference's ``adam_`` (same arguments, same bits) in one pass; ``exp_avg`` and
    ``exp_avg_sq`` are C-contiguous, other layouts of ``param`` and ``grad`` go through copies."""
    np.add(step, 1, out=step)
    step_size, bias_correction2_sqrt, beta1, beta2, eps, weight_decay = adam_scalars(int(step), hyper)
    t = param.dtype.type
    weight = 1.0 - beta1
    target = param if param.flags.c_contiguous else np.ascontiguousarray(param)
    _adam(target.reshape(-1), np.ascontiguousarray(grad).reshape(-1), exp_avg.reshape(-1),
          exp_avg_sq.reshape(-1), t(weight_decay), t(weight), t(1.0 - weight), abs(weight) < 0.5, t(beta2),
          t(1.0 - beta2), t(-step_size), t(bias_correction2_sqrt), t(eps))
    if target is not param:
        param[...] = target


KERNELS = {"adam_": adam_}
