"""The engine's models in other frameworks, weights included, each framework an optional extra
that importing the engine does not load.

``ta.export.onnx(model, path)`` (needs ``pip install 'tinygrad_attn[onnx]'``) writes a Seq2Seq
or a Transformer as two standard ONNX files, its encoder and one decoder step, traced from the
engine's own graph record; ``OnnxModel(files)`` decodes them with onnxruntime through the
engine's own decoders.  ``tinygrad_attn.export.torch`` (needs PyTorch): ``to_torch(model)`` gives an
equivalent ``torch.nn.Module`` built from torch's own layers, with the engine's parameter
names, and ``from_torch(module)`` the engine model again (``Seq2Seq.to_torch()``,
``Seq2Seq.from_torch``, the same on ``Transformer``): a model that outgrows one machine
continues training in torch's distributed engine.  The torch module is not imported here (it
imports torch); ``import tinygrad_attn.export.torch``.
"""

from .onnx_export import OnnxExport, OnnxModel, onnx
from .onnx_graph import graph_to_onnx
from .onnx_ops import UnsupportedOpError

__all__ = ["onnx", "OnnxModel", "OnnxExport", "graph_to_onnx", "UnsupportedOpError"]
