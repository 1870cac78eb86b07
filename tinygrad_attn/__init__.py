"""tinygrad_attn: a small tensor autograd engine built around attention.

    import tinygrad_attn as ta
    x = ta.Tensor([[1.0, 2.0]], requires_grad=True)
    y = (x @ x.T).tanh().sum()
    y.backward()
    ta.check.symbolic(lambda x: (x @ x.T).tanh().sum(), x)   # exact, with sympy
"""

from . import attention, check, data, export, functional, metrics, models, nn, ops, optim, random, shapes
from .autograd import (
    DeviceError,
    DTypeError,
    ShapeError,
    detect_anomaly,
    enable_grad,
    is_grad_enabled,
    no_grad,
    scope,
)
from .compiled import compile
from .compiler.capture import CaptureError
from .compiler.threads import get_num_threads, set_num_threads
from .random import manual_seed
from .serialize import SerializationError, load, save
from .tensor import Tensor, cat, stack, where

__version__ = "0.6.0"

__all__ = [
    "Tensor",
    "cat",
    "stack",
    "where",
    "no_grad",
    "enable_grad",
    "is_grad_enabled",
    "scope",
    "detect_anomaly",
    "manual_seed",
    "set_num_threads",
    "get_num_threads",
    "ops",
    "attention",
    "nn",
    "models",
    "data",
    "functional",
    "check",
    "metrics",
    "export",
    "random",
    "shapes",
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "optim",
    "save",
    "load",
    "SerializationError",
    "compile",
    "CaptureError",
]


def __getattr__(name: str):
    # ta.viz loads on first use: the engine itself never imports viz (imports flow one way).
    if name == "viz":
        import importlib

        return importlib.import_module(".viz", __name__)
    raise AttributeError(f"module 'tinygrad_attn' has no attribute {name!r}")
