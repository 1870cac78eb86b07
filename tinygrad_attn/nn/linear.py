"""The affine layer."""

from __future__ import annotations

from .. import functional as F
from ..autograd import ShapeError
from ..tensor import Tensor
from . import init
from .module import Module, Parameter


class Linear(Module):
    """y = x W^T + b, as ``torch.nn.Linear`` (same parameter names, shapes and initialisation).

    Args:
        in_features: the size of x's last axis.
        out_features: the size of y's last axis.
        bias: learn b (out_features,).

    Example:
        >>> layer = nn.Linear(4, 3)
        >>> layer(Tensor.randn(2, 4)).shape
        (2, 3)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(init.linear_default((out_features, in_features), in_features))
        self.bias = Parameter(init.linear_default((out_features,), in_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ShapeError(f"Linear({self.extra_repr()}): input of shape {x.shape} must end in "
                             f"in_features={self.in_features}")
        return F.linear(x, self.weight, self.bias)                           # (..., out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}"
