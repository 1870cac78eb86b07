"""Layers as Modules, PyTorch-style: ``from tinygrad_attn import nn``.

Where PyTorch has the same layer, parameter names, shapes and initialisation are PyTorch's,
so ``layer.load_state_dict(torch_layer.state_dict())`` works.
"""

from . import init, utils
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
from .layers import GELU, Dropout, Embedding, LayerNorm
from .linear import Linear
from .module import Module, ModuleList, Parameter
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from .transformer import (
    DecoderCache,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "Module",
    "ModuleList",
    "Parameter",
    "Linear",
    "Embedding",
    "Dropout",
    "LayerNorm",
    "GELU",
    "RNNCell",
    "GRUCell",
    "LSTMCell",
    "RNN",
    "GRU",
    "LSTM",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "Transformer",
    "DecoderCache",
    "init",
    "utils",
    "DotAttention",
    "GeneralAttention",
    "ConcatAttention",
    "AdditiveAttention",
    "ScaledDotProductAttention",
    "MultiHeadAttention",
    "GraphAttention",
    "LuongAttentionVector",
]
