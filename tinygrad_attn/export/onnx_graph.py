"""Writing a recorded graph as ONNX: ``Graph`` holds the nodes of one ONNX graph (the main
graph or a Scan body) and ``emit`` walks the engine's record from the bound inputs to the
wanted outputs, lowering each op (``onnx_ops``).  Parameters become initializers named after
the model's ``state_dict``; any other leaf (a constant such as the 0 of a masked ``where``)
becomes an initializer holding its value.

To trace, run the engine's own code on small example inputs made by ``trace_input``: float inputs
require grad, so every op on them records a node.
"""

from __future__ import annotations

import numpy as np

from ..autograd import toposort
from ..data.vocab import PAD
from ..tensor import Tensor
from .onnx_ops import LOWERINGS, OPSET, UnsupportedOpError, onnx_type, require


class Graph:
    """The nodes of one ONNX graph (the main graph or a Scan body).  Initializers always go
    to the main graph (``root``): a body reads them from the outer scope."""

    def __init__(self, root: Graph | None = None, param_names: dict | None = None):
        self.root = root or self
        self.nodes: list = []
        if root is None:
            self.initializers: dict[str, np.ndarray] = {}
            self.param_names = param_names or {}
            self.constant_names: dict[int, str] = {}        # id(leaf Tensor) -> initializer
            self.transposed: dict[str, str] = {}           # weight -> its transpose, made once
            self.weights: dict[int, str] = {}              # id(fused attention's output) -> its weights
            self.counter = 0

    def fresh(self, prefix: str) -> str:
        root = self.root
        root.counter += 1
        return f"{prefix}_{root.counter}"

    def node(self, op_type: str, inputs: list, outputs: int | list = 1, **attrs):
        """Append a node; returns its output name (or names, for several outputs)."""
        helper = require().helper
        names = [self.fresh(op_type.lower()) for _ in range(outputs)] if isinstance(outputs, int) else outputs
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self.fresh(f"n_{op_type}"),
                                           **attrs))
        return names[0] if len(names) == 1 else names

    def output(self, made: str, name: str) -> None:
        """Give the value ``made`` the graph output name ``name``."""
        self.node("Identity", [made], [name])

    def const(self, value, dtype=None, name: str | None = None) -> str:
        """A constant as a main-graph initializer."""
        array = np.asarray(value, dtype=dtype)
        root = self.root
        name = name or root.fresh("const")
        root.initializers[name] = array
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, dtype=np.int64))

    def real_tokens(self, ids: str = "src") -> str:
        """True where the int64 input ``ids`` holds a real token, not padding: (B, S) bool."""
        return self.node("Not", [self.node("Equal", [ids, self.ints(PAD)])])

    def leaf(self, tensor: Tensor) -> str:
        """A leaf of the record: a parameter (its state_dict name) or a constant."""
        root = self.root
        key = id(tensor)
        name = root.param_names.get(key)
        if name is not None:
            if name not in root.initializers:
                root.initializers[name] = tensor.numpy()
            return name
        if key not in root.constant_names:
            root.constant_names[key] = self.const(tensor.numpy())
        return root.constant_names[key]

    def transpose_of(self, weight_name: str) -> str:
        """W^T of a main-graph initializer, computed once in the main graph (a Scan body
        would otherwise transpose its weights on every step)."""
        root = self.root
        if weight_name not in root.transposed:
            root.transposed[weight_name] = root.node("Transpose", [weight_name], perm=[1, 0])
        return root.transposed[weight_name]

    def emit(self, outputs: list[Tensor], bindings: dict[int, str]) -> list[str]:
        """Write the recorded graph that makes ``outputs``; ``bindings`` maps id(tensor) of
        the graph's inputs to their ONNX names.  Returns the outputs' names."""
        names = dict(bindings)
        # Inputs first; nothing behind the bound tensors (the graph's own inputs).
        for tensor in reversed(toposort(outputs, only_grad=False, stop=bindings)):
            if id(tensor) in names:
                continue
            node = tensor.node
            if node is None:
                names[id(tensor)] = self.leaf(tensor)
                continue
            lower = LOWERINGS.get(node.op.name)
            if lower is None:
                where = f" (recorded in scope {node.scope!r})" if node.scope else ""
                hint = "; export a model in eval mode" if node.op.name == "Dropout" else ""
                raise UnsupportedOpError(
                    f"ONNX export: op {node.op.name!r}{where} has no ONNX mapping{hint}; the mapped ops "
                    f"are {', '.join(sorted(LOWERINGS))}")
            inputs = [names[id(t)] for t in node.inputs]
            names[id(tensor)] = lower(self, node.op, inputs, node.inputs, tensor)
        return [names[id(t)] for t in outputs]



def value_info(name: str, dtype, shape):
    return require().helper.make_tensor_value_info(name, onnx_type(dtype), shape)


def make_model(graph: Graph, name: str, inputs: list, outputs: list, metadata: dict | None = None):
    """An onnx.ModelProto of a main graph; inputs and outputs are value infos."""
    onnx = require()
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    initializers = [numpy_helper.from_array(np.ascontiguousarray(array), name)
                    for name, array in graph.initializers.items()]
    proto = helper.make_graph(graph.nodes, name, inputs, outputs, initializers)
    model = helper.make_model(proto, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="tinygrad_attn")
    model.ir_version = min(model.ir_version, 8)      # readable by onnxruntime releases from 1.14 on
    for key, value in (metadata or {}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model, full_check=True)
    return model


def graph_to_onnx(inputs: dict[str, Tensor], outputs: dict[str, Tensor], dynamic: dict | None = None,
                  name: str = "tinygrad_attn", param_names: dict[int, str] | None = None):
    """The recorded graph from ``inputs`` to ``outputs`` as an ``onnx.ModelProto``.

    Args:
        inputs: graph input name -> the leaf Tensor the graph was recorded from (float
            inputs must require grad, or the ops on them record nothing).
        outputs: graph output name -> a Tensor made from the inputs.
        dynamic: graph input or output name -> its shape with names for dynamic axes
            (e.g. ``("B", "S")``); default the traced shapes.
        param_names: id(Tensor) -> initializer name (a model's ``named_parameters``).

    Raises:
        UnsupportedOpError: naming a recorded op the exporter does not map.

    Example:
        >>> x = ta.Tensor(np.ones((2, 3), np.float32), requires_grad=True)
        >>> proto = graph_to_onnx({"x": x}, {"y": (x * 2).tanh()})
    """
    dynamic = dynamic or {}
    graph = Graph(param_names=param_names)
    bindings = {id(t): n for n, t in inputs.items()}
    names = graph.emit(list(outputs.values()), bindings)
    out_infos = []
    for (out_name, tensor), made in zip(outputs.items(), names, strict=True):
        graph.output(made, out_name)
        out_infos.append(value_info(out_name, tensor.dtype, dynamic.get(out_name, tensor.shape)))
    in_infos = [value_info(n, t.dtype, dynamic.get(n, t.shape)) for n, t in inputs.items()]
    return make_model(graph, name, in_infos, out_infos)


def trace_input(array: np.ndarray) -> Tensor:
    """A graph input to trace from: float inputs require grad, so every op on them records."""
    return Tensor(array, requires_grad=array.dtype.kind == "f", dtype=array.dtype)
