"""Every op of the engine, registered in ``registry``.

Write your own the same way; it gets ``ta.check`` verification and graph records for free
(an elementwise one needs only its formula: see ``Elementwise``):

    @ta.ops.register
    class MyOp(ta.ops.Op):
        ...
    y = MyOp.apply(x, some_attr=1)
"""

from ..autograd import DeferredGrad, Example, Op, register, registry
from . import attention, elementwise, linalg, movement, nn, reduce, rnn
from .attention import AdditiveScores, MaskedSoftmax, ScaledDotProduct
from .elementwise import (
    Add,
    Cast,
    Div,
    Elementwise,
    Exp,
    Gelu,
    GeluTanh,
    LeakyRelu,
    Log,
    MaskedFill,
    Mul,
    Neg,
    Pow,
    Relu,
    Sigmoid,
    Sub,
    Tanh,
    Where,
)
from .linalg import Linear, MatMul
from .movement import Cat, Expand, GetItem, Permute, Reshape, Split, Stack
from .nn import CrossEntropy, Dropout, Embedding, LayerNorm, LogSoftmax, NLLLoss, Softmax
from .reduce import Max, Mean, Sum
from .rnn import GRUCell, GRUGates, LSTMCellState, LSTMHidden

__all__ = [
    "Op", "Elementwise", "Example", "DeferredGrad", "register", "registry",
    "attention", "elementwise", "linalg", "movement", "nn", "reduce", "rnn",
    "Add", "Sub", "Mul", "Div", "Neg", "Pow", "Exp", "Log", "Tanh", "Sigmoid", "Relu",
    "LeakyRelu", "Gelu", "GeluTanh", "Where", "MaskedFill", "Cast", "Linear", "MatMul", "Reshape",
    "Permute", "Expand",
    "GetItem", "Cat", "Split", "Stack", "Sum", "Mean", "Max", "Softmax", "LogSoftmax", "CrossEntropy",
    "NLLLoss", "Embedding", "Dropout", "LayerNorm", "MaskedSoftmax", "AdditiveScores",
    "ScaledDotProduct", "GRUGates", "GRUCell", "LSTMCellState", "LSTMHidden",
]
