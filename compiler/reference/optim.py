"""The optimizers' updates and gradient clipping, in place, as the numpy ufunc sequences.

Everything that changes from one step to the next reaches a kernel in an array, never as a
Python number: the step count (a 0-d int64 array the update increments) and the
hyperparameters (a float64 vector the optimizer owns and writes in place when ``lr`` or
another setting changes).  A recorded call replayed later therefore reads the current
values.  The per-step scalars are derived here exactly as Python derives them, in double:

    step_size = lr / (1 - beta1**t),   bias_correction2_sqrt = (1 - beta2**t) ** 0.5

then every scalar is cast to the parameter's dtype and each ufunc rounds to it, which is
what torch's formulas give (``ta.optim.Adam``).

The kernels' layouts of the hyperparameter vector are the optimizers' own
(``ta.optim.Adam.hyper_names``, ``ta.optim.SGD.hyper_names``, nesterov as 0.0/1.0).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["KERNELS", "adam_scalars"]


def adam_scalars(step: int, hyper) -> tuple[float, ...]:
    """(step_size, bias_correction2_sqrt, beta1, beta2, eps, weight_decay) for update number
    ``step``, in Python floats: lr / (1 - beta1**step), (1 - beta2**step) ** 0.5.  The cpu
    kernel derives the same inside Numba (compiler/cpu/optim.py ``_adam_step``, held to these
    bits by tests/test_optim_kernels.py): a change here is a change there."""
    lr, beta1, beta2, eps, weight_decay = (float(v) for v in hyper)
    return lr / (1.0 - beta1**step), (1.0 - beta2**step) ** 0.5, beta1, beta2, eps, weight_decay


def adam_(param, grad, exp_avg, exp_avg_sq, step, hyper) -> None:
    """One Adam update, in place (``step`` += 1 first; t its new value):
    g = grad + wd*p;  m = lerp(m, g, 1 - beta1) (torch's two-branch lerp);
    v = v*beta2 + ((1 - beta2)*g)*g;  p = p + ((-step_size)*m) / (sqrt(v)/bc2 + eps)."""
    np.add(step, 1, out=step)
    step_size, bc2, beta1, beta2, eps, weight_decay = adam_scalars(int(step), hyper)
    t = param.dtype.type
    g = grad
    if t(weight_decay) != 0:
        g = grad + param * t(weight_decay)
    weight = 1.0 - beta1
    if abs(weight) < 0.5:
        exp_avg[...] = exp_avg + (g - exp_avg) * t(weight)
    else:
        exp_avg[...] = g - (g - exp_avg) * t(1.0 - weight)
    exp_avg_sq[...] = exp_avg_sq * t(beta2) + (g * t(1.0 - beta2)) * g
    param[...] = param + (exp_avg * t(-step_size)) / (np.sqrt(exp_avg_sq) / t(bc2) + t(eps))


def sgd_(param, grad, momentum_buffer, step, started, hyper) -> None:
    """One SGD update, in place, as torch.optim.SGD: g = grad + wd*p;
    b = g on the buffer's first use (``started`` 0, then set to 1), else
    b = mu*b + (1 - dampening)*g;  g = g + mu*b if nesterov else b;  p = p - lr*g.
    ``momentum_buffer`` is None without momentum; ``step`` counts the updates."""
    np.add(step, 1, out=step)
    lr, momentum, dampening, weight_decay, nesterov = (float(v) for v in hyper)
    t = param.dtype.type
    d_p = grad
    if weight_decay != 0.0:
        d_p = grad + param * t(weight_decay)
    if momentum != 0.0 and momentum_buffer is not None:
        buf = momentum_buffer
        if not int(started):
            buf[...] = d_p
            started[...] = 1
        else:
            np.multiply(buf, t(momentum), out=buf)
            if dampening != 0.0:
                np.add(buf, d_p * t(1.0 - dampening), out=buf)
            else:
                np.add(buf, d_p, out=buf)
        d_p = d_p + buf * t(momentum) if nesterov else buf
    np.add(param, d_p * t(-lr), out=param)


def _norm(g: np.ndarray, norm_type: float) -> float:
    if norm_type == 2.0:
        flat = g.reshape(-1)
        # One BLAS dot in the gradient's dtype, as torch's float32 norm; no temporary.
        return math.sqrt(float(np.dot(flat, flat)))
    if g.size == 0:
        return 0.0
    if norm_type == math.inf:
        return float(np.max(np.abs(g)))
    if norm_type == 1.0:
        return float(np.sum(np.abs(g), dtype=np.float64))
    return float(np.sum(np.abs(g, dtype=np.float64) ** norm_type)) ** (1.0 / norm_type)


def grad_norm(grads, norm_type: float):
    """The p-norm of the gradients' norms, a 0-d float64 array: ||(||g_1||_p, ...)||_p,
    each ||g_i|| in the gradient's dtype for p = 2 (a BLAS dot), double otherwise; the
    outer norm by ``math.fsum``.  A NaN anywhere makes the infinity norm NaN."""
    norms = [_norm(g, norm_type) for g in grads]
    if not norms:
        total = 0.0
    elif norm_type == math.inf:
        # max() would drop a NaN that is not first; a NaN gradient must show in the total.
        total = math.nan if any(n != n for n in norms) else max(norms)
    elif norm_type == 2.0:
        total = math.sqrt(math.fsum(n * n for n in norms))
    else:
        total = math.fsum(n**norm_type for n in norms) ** (1.0 / norm_type)
    return np.array(total, dtype=np.float64)


def clip_(grads, total, max_norm: float) -> None:
    """Scale every gradient in place by coef = max_norm / (total + 1e-6) when coef < 1 or
    NaN (a NaN total makes every gradient NaN, as torch's clamp does)."""
    coef = max_norm / (float(total) + 1e-6)
    if coef >= 1.0:
        return
    for g in grads:
        np.multiply(g, coef, out=g)


KERNELS = {"adam_": adam_, "sgd_": sgd_, "grad_norm": grad_norm, "clip_": clip_}

