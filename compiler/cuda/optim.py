"""The optimizers' updates and gradient clipping on device arrays: no host round trip.

As the reference (compiler/reference/optim.py), the step count (0-d int64) and the
hyperparameters (a float64 vector) are device arrays the kernels read, so nothing that
changes between steps is a launch argument.  Each thread derives the per-step scalars from
them in double, lr / (1 - beta1**t) and (1 - beta2**t) ** 0.5, and casts them to the
parameter's dtype; the entries then take the reference's operations in its order.  The
GPU's pow may round those two scalars an ulp off the host's, so a cuda update agrees with
the host's to rounding, not bit for bit.  The count is incremented by a one-thread launch
after the update: the update's threads must all have read the old count.

Gradient norms: one block per gradient reduces through shared memory in double (the host
takes the float32 norm by BLAS in float32), then one thread combines the norms as the host
does, summing in order rather than by ``math.fsum``.  ``clip_`` derives the coefficient on
the device and scales only when it is below 1 or NaN.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64

from .device import ROW_THREADS, THREADS, empty, launch, nblocks, per_dtype, ravel
from .reduce import block_max, block_sum

__all__ = ["KERNELS"]


@cuda.jit
def _increment(step):
    step[0] += 1


@per_dtype
def _adam_kernel(nb_type, dtype):
    cast = dtype.type

    @cuda.jit
    def adam(param, grad, exp_avg, exp_avg_sq, step, hyper):
        t = float64(step[0] + 1)
        lr, beta1, beta2, eps, weight_decay = hyper[0], hyper[1], hyper[2], hyper[3], hyper[4]
        neg_step_size = cast(-(lr / (1.0 - beta1**t)))
        bias_correction2_sqrt = cast((1.0 - beta2**t) ** 0.5)
        weight = 1.0 - beta1
        small_weight = abs(weight) < 0.5
        wd, w, keep = cast(weight_decay), cast(weight), cast(1.0 - weight)
        b2, one_minus_b2, e = cast(beta2), cast(1.0 - beta2), cast(eps)
        for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
            g = grad[i]
            if wd != 0:
                g = g + param[i] * wd
            m = exp_avg[i]
            if small_weight:
                m = m + (g - m) * w
            else:
                m = g - (g - m) * keep
            exp_avg[i] = m
            v = exp_avg_sq[i] * b2 + (g * one_minus_b2) * g
            exp_avg_sq[i] = v
            param[i] = param[i] + (m * neg_step_size) / (math.sqrt(v) / bias_correction2_sqrt + e)

    return adam


@per_dtype
def _sgd_kernel(nb_type, dtype):
    cast = dtype.type

    @cuda.jit
    def sgd(param, grad, buf, has_buffer, started, hyper):
        lr, momentum, dampening, weight_decay, nesterov = hyper[0], hyper[1], hyper[2], hyper[3], hyper[4]
        use_buffer = has_buffer and momentum != 0.0
        first = started[0] == 0
        wd, mu, damp, neg_lr = cast(weight_decay), cast(momentum), cast(1.0 - dampening), cast(-lr)
        for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
            d = grad[i]
            if weight_decay != 0.0:
                d = d + param[i] * wd
            if use_buffer:
                if first:
                    b = d
                elif dampening != 0.0:
                    b = buf[i] * mu + d * damp
                else:
                    b = buf[i] * mu + d
                buf[i] = b
                d = d + b * mu if nesterov != 0.0 else b
            param[i] = param[i] + d * neg_lr

    return sgd


@cuda.jit
def _mark_started(started, hyper):
    if hyper[1] != 0.0:
        started[0] = 1


@cuda.jit
def _norm_kernel(norms, index, x, kind, p):
    """norms[index] = ||x||_p in double; kind 0: p = 2, 1: p = inf, 2: p = 1, 3: other p."""
    partial = cuda.shared.array(ROW_THREADS, float64)
    acc = 0.0
    for j in range(cuda.threadIdx.x, x.shape[0], ROW_THREADS):
        v = abs(float64(x[j]))
        if kind == 0:
            acc += v * v
        elif kind == 1:
            if v > acc or v != v:
                acc = v
        elif kind == 2:
            acc += v
        else:
            acc += v**p
    total = block_max(partial, acc) if kind == 1 else block_sum(partial, acc)
    if cuda.threadIdx.x == 0:
        if kind == 0:
            total = math.sqrt(total)
        elif kind == 3:
            total = total ** (1.0 / p)
        norms[index] = total


@cuda.jit
def _combine_kernel(out, norms, kind, p):
    total = 0.0
    for i in range(norms.shape[0]):
        n = norms[i]
        if kind == 1:
            if n > total or n != n:
                total = n
        elif kind == 0:
            total += n * n
        else:
            total += n**p
    if kind == 0:
        total = math.sqrt(total)
    elif kind != 1 and norms.shape[0] > 0:
        total = total ** (1.0 / p)
    out[0] = total


@per_dtype
def _clip_kernel(nb_type, dtype):
    cast = dtype.type

    @cuda.jit
    def clip(g, total, max_norm):
        coef = max_norm / (total[0] + 1e-6)
        if coef >= 1.0:                # a NaN coefficient scales: NaN gradients, as the host's
            return
        c = cast(coef)
        for i in range(cuda.grid(1), g.shape[0], cuda.gridsize(1)):
            g[i] = g[i] * c

    return clip


def adam_(param, grad, exp_avg, exp_avg_sq, step, hyper) -> None:
    if param.size:
        launch(_adam_kernel(param.dtype), nblocks(param.size), THREADS, ravel(param), ravel(grad),
                ravel(exp_avg), ravel(exp_avg_sq), ravel(step), hyper)
    launch(_increment, 1, 1, ravel(step))


def sgd_(param, grad, momentum_buffer, step, started, hyper) -> None:
    has_buffer = momentum_buffer is not None
    buf = ravel(momentum_buffer) if has_buffer else ravel(param)        # unread without a buffer
    if param.size:
        launch(_sgd_kernel(param.dtype), nblocks(param.size), THREADS, ravel(param), ravel(grad), buf,
                has_buffer, ravel(started), hyper)
    if has_buffer:
        launch(_mark_started, 1, 1, ravel(started), hyper)
    launch(_increment, 1, 1, ravel(step))


def _kind(norm_type: float) -> int:
    return {2.0: 0, math.inf: 1, 1.0: 2}.get(norm_type, 3)


def grad_norm(grads, norm_type: float):
    kind, p = _kind(norm_type), float(norm_type)
    norms = empty((max(len(grads), 1),), np.float64)
    for index, g in enumerate(grads):
        launch(_norm_kernel, 1, ROW_THREADS, norms, index, ravel(g), kind, p)
    out = empty((), np.float64)
    launch(_combine_kernel, 1, 1, ravel(out), norms[:len(grads)], kind, p)
    return out


def clip_(grads, total, max_norm: float) -> None:
    for g in grads:
        if g.size:
            launch(_clip_kernel(g.dtype), nblocks(g.size), THREADS, ravel(g), ravel(total), float(max_norm))


KERNELS = {"adam_": adam_, "sgd_": sgd_, "grad_norm": grad_norm, "clip_": clip_}
