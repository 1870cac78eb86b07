"""Training utilities on parameters' gradients: ``nn.utils.clip_grad_norm_``."""

from __future__ import annotations

import math

import numpy as np

from ..autograd import DeviceError
from ..tensor import Tensor

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale all gradients together, in place, so that their total norm is at most max_norm:
    g = g * min(1, max_norm / (total + 1e-6)), total = ||(||g_1||, ||g_2||, ...)||_p.

    As ``torch.nn.utils.clip_grad_norm_``: parameters without a gradient are skipped, and a
    NaN total (a NaN gradient) makes every gradient NaN unless ``error_if_nonfinite``.  The
    norm and the scaling are two kernels on the gradients' device (``grad_norm``, ``clip_``),
    the total staying there as a 0-d array: nothing is read back unless
    ``error_if_nonfinite`` asks for the check.

    Args:
        parameters: an iterable of Parameters (e.g. ``model.parameters()``) or one Tensor.
        max_norm: the largest total norm allowed (>= 0).
        norm_type: p of the p-norm (> 0), or ``math.inf`` / ``"inf"`` for the largest |g|.
        error_if_nonfinite: raise RuntimeError instead of scaling when the total norm is
            NaN or infinite.

    Returns:
        The total norm before clipping, a 0-d float64 Tensor on the gradients' device (as
        torch returns a Tensor; ``float(...)`` gives the number); 0.0 when no parameter has
        a gradient.

    Example:
        >>> loss.backward()
        >>> nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        >>> opt.step()
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    max_norm = float(max_norm)
    norm_type = float(norm_type)
    if not norm_type > 0.0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 or inf, got {norm_type}")
    if not max_norm >= 0.0:
        raise ValueError(f"clip_grad_norm_: max_norm must be >= 0, got {max_norm}")
    grads, device = [], None
    for index, p in enumerate(parameters):
        if not isinstance(p, Tensor):
            raise TypeError(f"clip_grad_norm_: parameters[{index}] is a {type(p).__name__}, "
                            f"not a Parameter or Tensor")
        device = device or p.device
        if p.grad is not None:
            grads.append(p.grad)
    if not grads:
        return Tensor(0.0, dtype=np.float64, device=device or "cpu")
    backend = grads[0].backend
    for g in grads:
        if g.backend is not backend:
            raise DeviceError(f"clip_grad_norm_: the gradients are on different devices "
                              f"({backend.name!r} and {g.backend.name!r}); clip each device's apart")
    arrays = [g._data for g in grads]
    total = backend.grad_norm(arrays, norm_type)
    if error_if_nonfinite:
        value = float(np.asarray(backend.to_numpy(total)))
        if not math.isfinite(value):
            raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                               f"gradients is {value}, so they cannot be clipped; pass "
                               f"error_if_nonfinite=False to scale them by it anyway")
    for g in grads:
        g._version.count += 1                  # scaled in place, as writing ``.data`` counts
    backend.clip_(arrays, total, max_norm)
    return Tensor._made(total, backend, False)
