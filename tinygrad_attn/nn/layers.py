"""Embedding, Dropout and LayerNorm, as their PyTorch namesakes (names, shapes, initialisation)."""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import random as _random
from ..tensor import Tensor
from .module import Module, Parameter


class Embedding(Module):
    """A table of ``num_embeddings`` vectors: y[...] = weight[ids[...]], as ``torch.nn.Embedding``.

    Args:
        num_embeddings: the vocabulary size V.  embedding_dim: the vector size E.
        padding_idx: this row starts at zero and receives no gradient (``<pad>`` = 0 in
            ``ta.data``'s vocabularies).

    The weight starts N(0, 1), as PyTorch's.

    Example:
        >>> emb = nn.Embedding(10, 4, padding_idx=0)
        >>> emb(np.array([[1, 2, 0]])).shape
        (1, 3, 4)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None):
        super().__init__()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} is outside "
                                 f"[-{num_embeddings}, {num_embeddings})")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = padding_idx
        weight = _random.generator().standard_normal((num_embeddings, embedding_dim))
        if padding_idx is not None:
            weight[padding_idx] = 0.0
        self.weight = Parameter(weight)

    def forward(self, ids) -> Tensor:
        """Integer ids (...) -> (..., E)."""
        return F.embedding(ids, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class Dropout(Module):
    """Zero each entry with probability p in training mode and scale the rest by 1/(1-p);
    the identity in eval mode (``model.eval()``), as ``torch.nn.Dropout``.

    Example:
        >>> drop = nn.Dropout(0.1)
        >>> y = drop(x)          # training: masked;  drop.eval(); drop(x) is x
    """

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class GELU(Module):
    """x Phi(x) (``F.gelu``), as ``torch.nn.GELU``: ``approximate`` "none" (the erf form) or
    "tanh".

    Example:
        >>> act = nn.GELU()
        >>> act(Tensor([1.0])).numpy()        # [0.8413]
    """

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class LayerNorm(Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape``
    axes, var being the biased variance (Ba et al. 2016), as ``torch.nn.LayerNorm``: one fused
    node (``F.layer_norm``).

    Args:
        normalized_shape: the trailing shape to normalise over (an int for the last axis).
        eps: added to the variance.  elementwise_affine: learn weight (ones) and bias (zeros).
        bias: with elementwise_affine, learn the bias too (torch's ``bias=False`` keeps only
            the weight).

    Example:
        >>> norm = nn.LayerNorm(8)
        >>> norm(Tensor.randn(2, 5, 8)).shape
        (2, 5, 8)
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, float(eps)
        self.weight = Parameter(np.ones(shape)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(shape)) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"
