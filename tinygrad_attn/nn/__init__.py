"""Layers as Modules, PyTorch-style: ``from tinygrad_attn import nn``.

Where PyTorch has the same layer, parameter names, shapes and initialisation are PyTorch's,
so ``layer.load_state_dict(torch_layer.state_dict())`` works.
"""

from . import init
from .attention import (
    AdditiveAttention,
    ConcatAttention,
    DotAttention,
    GeneralAttention,
    GraphAttention,
    LuongAttentionVector,
    MultiHeadAttention,
    ScaledDotProductAttention,
)
from .linear import Linear
from .module import Module, Parameter

__all__ = [
    "Module",
    "Parameter",
    "Linear",
    "init",
    "DotAttention",
    "GeneralAttention",
    "ConcatAttention",
    "AdditiveAttention",
    "ScaledDotProductAttention",
    "MultiHeadAttention",
    "GraphAttention",
    "LuongAttentionVector",
]
