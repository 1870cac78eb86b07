"""Training utilities on parameters' gradients: ``nn.utils.clip_grad_norm_``."""

from __future__ import annotations

import math

import numpy as np

from ..tensor import Tensor

__all__ = ["clip_grad_norm_"]


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


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Scale all gradients together, in place, so that their total norm is at most max_norm:
    g = g * min(1, max_norm / (total + 1e-6)), total = ||(||g_1||, ||g_2||, ...)||_p.

    As ``torch.nn.utils.clip_grad_norm_``: parameters without a gradient are skipped, and a
    NaN total (a NaN gradient) makes every gradient NaN unless ``error_if_nonfinite``.
    Gradients on the "cuda" device are copied to the host, scaled there and copied back.

    Args:
        parameters: an iterable of Parameters (e.g. ``model.parameters()``) or one Tensor.
        max_norm: the largest total norm allowed (>= 0).
        norm_type: p of the p-norm (> 0), or ``math.inf`` / ``"inf"`` for the largest |g|.
        error_if_nonfinite: raise RuntimeError instead of scaling when the total norm is
            NaN or infinite.

    Returns:
        The total norm before clipping, as a float (0.0 when no parameter has a gradient).

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
    grads = []
    for index, p in enumerate(parameters):
        if not isinstance(p, Tensor):
            raise TypeError(f"clip_grad_norm_: parameters[{index}] is a {type(p).__name__}, "
                            f"not a Parameter or Tensor")
        if p.grad is not None:
            grads.append(p.grad)
    if not grads:
        return 0.0
    hosts = [g.data if type(g.data) is np.ndarray else g.backend.to_numpy(g.data) for g in grads]
    norms = [_norm(h, norm_type) for h in hosts]
    if norm_type == math.inf:
        # max() would drop a NaN that is not first; a NaN gradient must show in the total.
        total = math.nan if any(n != n for n in norms) else max(norms)
    elif norm_type == 2.0:
        total = math.sqrt(math.fsum(n * n for n in norms))
    else:
        total = math.fsum(n**norm_type for n in norms) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                           f"gradients is {total}, so they cannot be clipped; pass "
                           f"error_if_nonfinite=False to scale them by it anyway")
    coef = max_norm / (total + 1e-6)
    # `not coef < 1` would skip a NaN coefficient; torch's clamp passes NaN on to the grads.
    if coef >= 1.0:
        return total
    for g, host in zip(grads, hosts, strict=True):
        np.multiply(host, coef, out=host)
        if host is not g.data:
            g.data.copy_to_device(host)
    return total
