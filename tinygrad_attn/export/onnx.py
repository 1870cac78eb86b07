"""ONNX export from the engine's own graph record: a Seq2Seq model's encoder and one decoder
step as standard ONNX operators (opset 17), which onnxruntime runs and decodes with.

How it works: the exporter runs the model's own code on small example inputs with graph
recording on (the step's inputs are leaves that require grad, so every op records a node),
walks the recorded graph in topological order and writes each node as one ONNX node or a
small subgraph (``_LOWERINGS``, one function per engine op).  Parameters become initializers
named after the model's ``state_dict``; a leaf that is not a parameter (a constant such as the
0 of a masked ``where``) becomes an initializer holding its value.

    encoder   src (B, S) int64 -> keys (B, S, K), keys_proj (B, S, A), h0 [c0] ... (B, 1, H)
    decoder   tokens (N,) int64, h0 [c0] ... (N, 1, H), keys, keys_proj, src_mask (N, S) bool
              -> logits (N, V), attention (N, S), h0_next [c0_next] ...

(``keys`` is absent without attention, ``keys_proj`` for dot and general scores, ``c<l>``
for a GRU.)  Batch and source length are dynamic axes.  The encoder's recurrence is an ONNX
``Scan`` per layer and direction, whose body is one engine step (the cell and the padding
``where``) traced the same way, so one file serves every source length; the decoder step has
no recurrence and no size-dependent op.

The logits are what the engine's ``decode_step`` takes a float64 log-softmax of; ``OnnxSeq2Seq``
does the same, and plugs the two onnxruntime sessions into ``ta.models.decoding``'s protocol,
so greedy decoding, sampling and beam search run unchanged on them.

Needs the optional extra: ``pip install 'tinygrad_attn[onnx]'`` (onnx, and onnxruntime to run).
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..autograd import enable_grad, toposort
from ..tensor import Tensor

__all__ = ["export_onnx", "onnx", "graph_to_onnx", "OnnxSeq2Seq", "OnnxExport", "UnsupportedOpError",
           "OPSET", "supported_ops"]

OPSET = 17
INSTALL_HINT = "pip install 'tinygrad_attn[onnx]'"


class UnsupportedOpError(TypeError):
    """A recorded op has no ONNX mapping; the message names it and where it was recorded."""


def _require(module: str = "onnx"):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{module} needs the optional extra: {INSTALL_HINT}") from None


# ---------------------------------------------------------------- building a graph


_ONNX_TYPES = {np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.int32): 6,
               np.dtype(np.int64): 7, np.dtype(np.bool_): 9, np.dtype(np.float64): 11}


def _onnx_type(dtype) -> int:
    try:
        return _ONNX_TYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"ONNX export: no ONNX element type for dtype {np.dtype(dtype)}") from None


class _Graph:
    """The nodes of one ONNX graph (the main graph or a Scan body).  Initializers always go
    to the main graph (``root``): a body reads them from the outer scope."""

    def __init__(self, root: _Graph | None = None, param_names: dict | None = None):
        self.root = root or self
        self.nodes: list = []
        if root is None:
            self.initializers: dict[str, np.ndarray] = {}
            self.param_names = param_names or {}
            self.constant_names: dict[int, str] = {}        # id(leaf Tensor) -> initializer
            self.transposed: dict[str, str] = {}           # weight -> its transpose, made once
            self.counter = 0

    def fresh(self, prefix: str) -> str:
        root = self.root
        root.counter += 1
        return f"{prefix}_{root.counter}"

    def node(self, op_type: str, inputs: list, outputs: int | list = 1, **attrs):
        """Append a node; returns its output name (or names, for several outputs)."""
        helper = _require().helper
        names = [self.fresh(op_type.lower()) for _ in range(outputs)] if isinstance(outputs, int) else outputs
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self.fresh(f"n_{op_type}"),
                                           **attrs))
        return names[0] if len(names) == 1 else names

    def const(self, value, dtype=None, name: str | None = None) -> str:
        """A constant as a main-graph initializer."""
        array = np.asarray(value, dtype=dtype)
        root = self.root
        name = name or root.fresh("const")
        root.initializers[name] = array
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, dtype=np.int64))

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
            lower = _LOWERINGS.get(node.op.name)
            if lower is None:
                where = f" (recorded in scope {node.scope!r})" if node.scope else ""
                hint = "; export a model in eval mode" if node.op.name == "Dropout" else ""
                raise UnsupportedOpError(
                    f"ONNX export: op {node.op.name!r}{where} has no ONNX mapping{hint}; the mapped ops "
                    f"are {', '.join(sorted(_LOWERINGS))}")
            inputs = [names[id(t)] for t in node.inputs]
            names[id(tensor)] = lower(self, node.op, inputs, node.inputs, tensor)
        return [names[id(t)] for t in outputs]


# ---------------------------------------------------------------- one lowering per op

_LOWERINGS: dict = {}


def _lowers(*names):
    def decorate(fn):
        for name in names:
            _LOWERINGS[name] = fn
        return fn
    return decorate


def supported_ops() -> list[str]:
    """The engine ops the exporter maps to ONNX."""
    return sorted(_LOWERINGS)


_SAME_NAME = {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div", "Pow": "Pow", "Neg": "Neg",
              "Exp": "Exp", "Log": "Log", "Tanh": "Tanh", "Sigmoid": "Sigmoid", "Relu": "Relu",
              "MatMul": "MatMul", "Where": "Where"}


@_lowers(*_SAME_NAME)
def _same_name(g, op, inputs, tensors, out):
    return g.node(_SAME_NAME[op.name], inputs)


@_lowers("LeakyRelu")
def _leaky_relu(g, op, inputs, tensors, out):
    return g.node("LeakyRelu", inputs, alpha=float(op.negative_slope))


@_lowers("Gelu")
def _gelu(g, op, inputs, tensors, out):
    # x (1 + erf(x / sqrt 2)) / 2: ONNX's own Gelu arrives only in opset 20.
    (x,) = inputs
    dtype = out.dtype
    erf = g.node("Erf", [g.node("Mul", [x, g.const(1 / math.sqrt(2.0), dtype)])])
    return g.node("Mul", [g.node("Mul", [x, g.const(0.5, dtype)]), g.node("Add", [erf, g.const(1.0, dtype)])])


@_lowers("GeluTanh")
def _gelu_tanh(g, op, inputs, tensors, out):
    (x,) = inputs
    dtype = out.dtype
    cube = g.node("Mul", [g.node("Mul", [x, x]), x])
    inner = g.node("Add", [x, g.node("Mul", [cube, g.const(0.044715, dtype)])])
    tanh = g.node("Tanh", [g.node("Mul", [inner, g.const(math.sqrt(2 / math.pi), dtype)])])
    half = g.node("Mul", [x, g.const(0.5, dtype)])
    return g.node("Mul", [half, g.node("Add", [tanh, g.const(1.0, dtype)])])


@_lowers("MaskedFill")
def _masked_fill(g, op, inputs, tensors, out):
    x, mask = inputs
    return g.node("Where", [mask, g.const(op.value, out.dtype), x])


@_lowers("Cast")
def _cast(g, op, inputs, tensors, out):
    return g.node("Cast", inputs, to=_onnx_type(op.dtype))


def _linear(g, x: str, weight: str, bias: str | None) -> str:
    y = g.node("MatMul", [x, g.transpose_of(weight) if weight in g.root.initializers
                          else g.node("Transpose", [weight], perm=[1, 0])])         # (..., out)
    return y if bias is None else g.node("Add", [y, bias])


@_lowers("Linear")
def _linear_op(g, op, inputs, tensors, out):
    return _linear(g, inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None)


@_lowers("Embedding")
def _embedding(g, op, inputs, tensors, out):
    weight, ids = inputs
    return g.node("Gather", [weight, ids], axis=0)                                  # (..., E)


@_lowers("Cat")
def _cat(g, op, inputs, tensors, out):
    return inputs[0] if len(inputs) == 1 else g.node("Concat", inputs, axis=int(op.axis))


@_lowers("Stack")
def _stack(g, op, inputs, tensors, out):
    axes = g.ints([int(op.axis)])
    return g.node("Concat", [g.node("Unsqueeze", [x, axes]) for x in inputs], axis=int(op.axis))


@_lowers("Permute")
def _permute(g, op, inputs, tensors, out):
    return g.node("Transpose", inputs, perm=[int(a) for a in op.axes])


@_lowers("Reshape")
def _reshape(g, op, inputs, tensors, out):
    # The record holds the traced sizes.  An axis that keeps its input's size at the same
    # position is written 0 (copy it), so batch and length axes carried through stay dynamic,
    # and one remaining axis -1; a reshape merging two dynamic axes is outside this rule.
    source, target = tensors[0].shape, tuple(op.shape)
    shape = [0 if i < len(source) and n == source[i] and n != 0 else n for i, n in enumerate(target)]
    rest = [i for i, n in enumerate(shape) if n != 0]
    if len(rest) > 1 or (rest and len(target) != len(source)):
        biggest = max(rest, key=lambda i: shape[i])
        shape[biggest] = -1
    return g.node("Reshape", [inputs[0], g.ints(shape)])


@_lowers("Expand")
def _expand(g, op, inputs, tensors, out):
    # Axes the input already has at full size are written 1 (ONNX broadcasts both ways), so
    # they stay dynamic; axes that grow take the traced size.
    source, target = tensors[0].shape, tuple(op.shape)
    offset = len(target) - len(source)
    shape = [1 if i >= offset and source[i - offset] == n else n for i, n in enumerate(target)]
    return g.node("Expand", [inputs[0], g.ints(shape)])


@_lowers("GetItem")
def _getitem(g, op, inputs, tensors, out):
    index = op.index if isinstance(op.index, tuple) else (op.index,)
    ndim = tensors[0].ndim
    if any(isinstance(p, np.ndarray | list) for p in index):
        raise UnsupportedOpError(f"ONNX export: op 'GetItem' with an array index ({op!r}) has no ONNX "
                                 f"mapping; only ints, slices, None and ... are mapped")
    if Ellipsis in index:
        at = index.index(Ellipsis)
        used = sum(1 for p in index if p is not None and p is not Ellipsis)
        index = index[:at] + (slice(None),) * (ndim - used) + index[at + 1:]
    x = inputs[0]
    starts, ends, axes, steps, squeeze, unsqueeze = [], [], [], [], [], []
    axis = 0           # the axis of x an index entry reads
    position = 0       # the axis of the result (after ints are dropped) it makes
    for part in index:
        if part is None:
            unsqueeze.append(position)
            position += 1
        elif isinstance(part, slice):
            step = 1 if part.step is None else int(part.step)
            big = np.iinfo(np.int64).max
            start = (0 if step > 0 else -1) if part.start is None else int(part.start)
            end = (big if step > 0 else -big) if part.stop is None else int(part.stop)
            if (start, end, step) != (0, big, 1):
                starts.append(start)
                ends.append(end)
                axes.append(axis)
                steps.append(step)
            axis += 1
            position += 1
        else:
            value = int(part)
            starts.append(value)
            ends.append(value + 1 if value != -1 else np.iinfo(np.int64).max)
            axes.append(axis)
            steps.append(1)
            squeeze.append(axis)
            axis += 1
    if axes:
        x = g.node("Slice", [x, g.ints(starts), g.ints(ends), g.ints(axes), g.ints(steps)])
    if squeeze:
        x = g.node("Squeeze", [x, g.ints(squeeze)])
    if unsqueeze:
        x = g.node("Unsqueeze", [x, g.ints(unsqueeze)])
    return x if x != inputs[0] else g.node("Identity", [x])


def _axes(op, ndim: int) -> list[int]:
    return list(range(ndim)) if op.axis is None else [int(a) for a in op.axis]


@_lowers("Sum")
def _sum(g, op, inputs, tensors, out):
    axes = g.ints(_axes(op, tensors[0].ndim))
    return g.node("ReduceSum", [inputs[0], axes], keepdims=int(bool(op.keepdims)))


@_lowers("Mean", "Max")
def _mean_max(g, op, inputs, tensors, out):
    kind = "ReduceMean" if op.name == "Mean" else "ReduceMax"    # axes an attribute in opset 17
    return g.node(kind, inputs, axes=_axes(op, tensors[0].ndim), keepdims=int(bool(op.keepdims)))


@_lowers("Softmax", "LogSoftmax")
def _softmax(g, op, inputs, tensors, out):
    return g.node(op.name, inputs, axis=int(op.axis))


def _masked_softmax(g, scores: str, mask: str, dtype) -> str:
    """Softmax over the last axis where mask, 0 elsewhere and on fully masked rows (whose
    softmax of all -inf is NaN before the last Where)."""
    masked = g.node("Where", [mask, scores, g.const(-np.inf, dtype)])
    weights = g.node("Softmax", [masked], axis=-1)
    return g.node("Where", [mask, weights, g.const(0.0, dtype)])


@_lowers("MaskedSoftmax")
def _masked_softmax_op(g, op, inputs, tensors, out):
    return _masked_softmax(g, inputs[0], inputs[1], out.dtype)


@_lowers("AdditiveScores")
def _additive_scores(g, op, inputs, tensors, out):
    s, W_q, k, v = inputs
    q = _linear(g, s, W_q, None)                                                    # (..., T_q, A)
    pre = g.node("Add", [g.node("Unsqueeze", [q, g.ints([-2])]),                    # (..., T_q, 1, A)
                         g.node("Unsqueeze", [k, g.ints([-3])])])                   # (..., 1, T_k, A)
    return g.node("MatMul", [g.node("Tanh", [pre]), v])                             # (..., T_q, T_k)


@_lowers("ScaledDotProduct")
def _scaled_dot_product(g, op, inputs, tensors, out):
    q, k, v = inputs[:3]
    dtype = out.dtype
    rank = tensors[1].ndim
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    k_t = g.node("Transpose", [k], perm=perm)                                       # (..., D, T_k)
    scores = g.node("MatMul", [g.node("Mul", [q, g.const(float(op.scale), dtype)]), k_t])  # (..., T_q, T_k)
    mask = inputs[3] if len(inputs) > 3 else None
    if op.causal:
        # Key j > query i is forbidden: a lower-triangular (T_q, T_k) of the scores' shape.
        size = g.node("Slice", [g.node("Shape", [scores]), g.ints([-2]), g.ints([np.iinfo(np.int64).max])])
        ones = g.node("ConstantOfShape", [size], value=_require().helper.make_tensor("one", 7, [1], [1]))
        tril = g.node("Cast", [g.node("Trilu", [ones], upper=0)], to=_onnx_type(np.bool_))
        mask = tril if mask is None else g.node("And", [mask, tril])
    if mask is None:
        weights = g.node("Softmax", [scores], axis=-1)
    else:
        weights = _masked_softmax(g, scores, mask, dtype)
    return g.node("MatMul", [weights, v])                                           # (..., T_q, D_v)


@_lowers("LayerNorm")
def _layer_norm(g, op, inputs, tensors, out):
    shape = tuple(op.normalized_shape)
    x, *params = inputs
    weight = params[0] if params else g.const(np.ones(shape, dtype=out.dtype))
    bias = params[1] if len(params) > 1 else g.const(np.zeros(shape, dtype=out.dtype))
    return g.node("LayerNormalization", [x, weight, bias], axis=-len(shape), epsilon=float(op.epsilon))


def _split_gates(g, gates: str, hidden: int, count: int) -> list[str]:
    return g.node("Split", [gates, g.ints([hidden] * count)], outputs=count, axis=-1)


def _gru_gates(g, gi: str, gh: str, h_prev: str, hidden: int, dtype) -> str:
    """PyTorch's GRU gates (r, z, n), the reset gate applied to the hidden product after its bias."""
    gi_r, gi_z, gi_n = _split_gates(g, gi, hidden, 3)
    gh_r, gh_z, gh_n = _split_gates(g, gh, hidden, 3)
    r = g.node("Sigmoid", [g.node("Add", [gi_r, gh_r])])
    z = g.node("Sigmoid", [g.node("Add", [gi_z, gh_z])])
    n = g.node("Tanh", [g.node("Add", [gi_n, g.node("Mul", [r, gh_n])])])
    # (1 - z) n + z h_prev, written n + z (h_prev - n): one product fewer.
    return g.node("Add", [n, g.node("Mul", [z, g.node("Sub", [h_prev, n])])])


@_lowers("GRUGates")
def _gru_gates_op(g, op, inputs, tensors, out):
    return _gru_gates(g, *inputs, tensors[2].shape[-1], out.dtype)


@_lowers("GRUCell")
def _gru_cell(g, op, inputs, tensors, out):
    parts = op.attrs.get("parts", 1)
    xs = inputs[:parts]
    h_prev, w_ih, w_hh, *biases = inputs[parts:]
    x = xs[0] if parts == 1 else g.node("Concat", xs, axis=-1)                      # (..., I): [y; c]
    gi = _linear(g, x, w_ih, biases[0] if biases else None)                          # (..., 3H)
    gh = _linear(g, h_prev, w_hh, biases[1] if biases else None)                     # (..., 3H)
    return _gru_gates(g, gi, gh, h_prev, tensors[parts].shape[-1], out.dtype)


@_lowers("LSTMCellState")
def _lstm_cell_state(g, op, inputs, tensors, out):
    gates, c_prev = inputs
    i, f, cell, _ = _split_gates(g, gates, tensors[1].shape[-1], 4)
    kept = g.node("Mul", [g.node("Sigmoid", [f]), c_prev])
    return g.node("Add", [kept, g.node("Mul", [g.node("Sigmoid", [i]), g.node("Tanh", [cell])])])


@_lowers("LSTMHidden")
def _lstm_hidden(g, op, inputs, tensors, out):
    gates, c = inputs
    *_, o = _split_gates(g, gates, tensors[1].shape[-1], 4)
    return g.node("Mul", [g.node("Sigmoid", [o]), g.node("Tanh", [c])])


# ---------------------------------------------------------------- whole graphs


def _value_info(name: str, dtype, shape):
    return _require().helper.make_tensor_value_info(name, _onnx_type(dtype), shape)


def _model(graph: _Graph, name: str, inputs: list, outputs: list, metadata: dict | None = None):
    """An onnx.ModelProto of a main graph; inputs and outputs are value infos."""
    onnx = _require()
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
    graph = _Graph(param_names=param_names)
    bindings = {id(t): n for n, t in inputs.items()}
    names = graph.emit(list(outputs.values()), bindings)
    out_infos = []
    for (out_name, tensor), made in zip(outputs.items(), names, strict=True):
        identity = _require().helper.make_node("Identity", [made], [out_name], name=f"out_{out_name}")
        graph.nodes.append(identity)
        out_infos.append(_value_info(out_name, tensor.dtype, dynamic.get(out_name, tensor.shape)))
    in_infos = [_value_info(n, t.dtype, dynamic.get(n, t.shape)) for n, t in inputs.items()]
    return _model(graph, name, in_infos, out_infos)


# ---------------------------------------------------------------- Seq2Seq


@dataclass
class OnnxExport:
    """What ``export_onnx`` wrote: the two files and the names their graphs use."""

    encoder_path: Path
    decoder_path: Path
    state_names: list[str]          # "h0", then "c0" for an LSTM, per layer
    has_keys: bool                  # attention: the step reads keys and src_mask
    has_keys_proj: bool             # additive and concat scores: it reads keys_proj


def _paths(path) -> tuple[Path, Path]:
    path = Path(path)
    stem = path.name[: -len(".onnx")] if path.name.endswith(".onnx") else path.name
    return path.with_name(f"{stem}.encoder.onnx"), path.with_name(f"{stem}.decoder.onnx")


def _leaf(array: np.ndarray) -> Tensor:
    """A graph input to trace from: float inputs require grad, so every op on them records."""
    return Tensor(array, requires_grad=array.dtype.kind == "f", dtype=array.dtype)


def _state_names(model) -> list[str]:
    suffixes = ("h", "c") if model.cell == "lstm" else ("h",)
    return [f"{s}{layer}" for layer in range(model.num_layers) for s in suffixes]


def _flatten_states(model, states: list) -> list[Tensor]:
    if model.cell == "lstm":
        return [part for state in states for part in state]
    return list(states)


def _group_states(model, flat: list) -> list:
    if model.cell == "lstm":
        return [(flat[2 * k], flat[2 * k + 1]) for k in range(model.num_layers)]
    return list(flat)


def export_onnx(model, path, opset: int = OPSET) -> OnnxExport:
    """Write ``model``'s encoder and one decoder step as two ONNX files (opset 17), checked
    by ``onnx.checker``: ``<stem>.encoder.onnx`` and ``<stem>.decoder.onnx`` next to ``path``
    (``"dates.onnx"`` -> ``dates.encoder.onnx``, ``dates.decoder.onnx``).

    Args:
        model: a ``ta.models.Seq2Seq`` (any cell, attention and style; the Transformer is
            not exported yet).  path: where the files go, as above.

    Returns:
        an ``OnnxExport`` (the paths and the graphs' state names); ``OnnxSeq2Seq(export)``
        decodes with onnxruntime.

    Raises:
        UnsupportedOpError: naming an op of the model with no ONNX mapping.
        ImportError: onnx is not installed (``pip install 'tinygrad_attn[onnx]'``).

    Example:
        >>> files = ta.export.onnx(model, "dates.onnx")
        >>> ids, weights = OnnxSeq2Seq(files).greedy(src, max_len=12)
    """
    from ..models.seq2seq import Seq2Seq

    onnx = _require()
    if opset != OPSET:
        raise ValueError(f"export_onnx: only opset {OPSET} is written, got {opset}")
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"export_onnx: exports a ta.models.Seq2Seq; got {type(model).__name__} (the "
                        f"Transformer's export is not written yet)")
    encoder_path, decoder_path = _paths(path)
    param_names = {id(p): name for name, p in model.named_parameters()}
    metadata = {"tinygrad_attn.config": json.dumps(model.config),
                "tinygrad_attn.special_ids": json.dumps({"pad": 0, "start": 1, "end": 2, "unk": 3})}
    was_training = model.training
    model.eval()
    try:
        with enable_grad():
            encoder = _encoder_model(model, param_names, metadata)
            decoder = _decoder_model(model, param_names, metadata)
    finally:
        model.train(was_training)
    encoder_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(encoder, str(encoder_path))
    onnx.save(decoder, str(decoder_path))
    return OnnxExport(encoder_path, decoder_path, _state_names(model),
                      model.attention_kind is not None, model.attention_kind in ("additive", "concat"))


onnx = export_onnx


def _encoder_model(model, param_names: dict, metadata: dict):
    """src (B, S) -> keys, keys_proj, the decoder's initial states: ``Seq2Seq.encode`` with
    each recurrent layer and direction as a Scan over the source axis."""
    helper = _require().helper
    graph = _Graph(param_names=param_names)
    batch, steps = 2, 3                                         # any sizes: the axes are dynamic
    src = _leaf(np.ones((batch, steps), dtype=np.int64))
    (embedded,) = graph.emit([model.src_embed(src)], {id(src): "src"})               # (B, S, E)
    mask = graph.node("Not", [graph.node("Equal", ["src", graph.ints(0)])])          # (B, S)
    # The initial state: zeros (B, H), B read from src.
    rows = graph.node("Slice", [graph.node("Shape", ["src"]), graph.ints([0]), graph.ints([1])])
    zeros = graph.node("ConstantOfShape", [graph.node("Concat", [rows, graph.ints([model.hidden])], axis=0)],
                       value=helper.make_tensor("zero", 1, [1], [0.0]))
    encoder = model.encoder
    lstm = model.cell == "lstm"
    xs, finals = embedded, []
    for layer in range(model.num_layers):
        outputs = []
        for direction, suffix in enumerate(encoder._suffixes(layer)):
            width = model.config["embed"] if layer == 0 else model.hidden * encoder.num_directions
            body = _scan_body(model, graph, encoder._weights(suffix), width)
            n_states = 2 if lstm else 1
            # Scan inputs: the states, then x (B, S, I) and the mask (B, S) sliced along S;
            # direction 1 runs from the last step to the first.
            made = graph.node("Scan", [zeros] * n_states + [xs, mask], outputs=n_states + 1, body=body,
                              num_scan_inputs=2, scan_input_axes=[1, 1],
                              scan_input_directions=[direction] * 2, scan_output_axes=[1],
                              scan_output_directions=[direction])
            finals.append(made[:n_states])
            outputs.append(made[-1])                                                # (B, S, H)
        xs = outputs[0] if len(outputs) == 1 else graph.node("Concat", outputs, axis=-1)   # (B, S, D*H)
    # The bridge (or none): traced on (B, 1, H) leaves, as Seq2Seq._bridge reads them.
    leaves, bindings = [], {}
    for state in finals:
        parts = []
        for name in state:
            leaf = _leaf(np.zeros((batch, 1, model.hidden), dtype=np.float32))
            bindings[id(leaf)] = graph.node("Unsqueeze", [name, graph.ints([1])])   # (B, 1, H)
            parts.append(leaf)
        leaves.append(tuple(parts) if lstm else parts[0])
    states = _flatten_states(model, model._bridge(leaves))
    outputs = {name: tensor for name, tensor in zip(_state_names(model), states, strict=True)}
    infos = {name: ("B", 1, model.hidden) for name in outputs}
    if model.attention_kind is not None:
        key_size = model.hidden * encoder.num_directions
        keys = _leaf(np.zeros((batch, steps, key_size), dtype=np.float32))
        bindings[id(keys)] = xs
        outputs["keys"] = keys
        infos["keys"] = ("B", "S", key_size)
        if model.attention_kind in ("additive", "concat"):
            outputs["keys_proj"] = model.attention.keys_projection(keys)
            infos["keys_proj"] = ("B", "S", model.config["attn_dim"])
    names = graph.emit(list(outputs.values()), bindings)
    out_infos = []
    for (name, tensor), made in zip(outputs.items(), names, strict=True):
        graph.nodes.append(helper.make_node("Identity", [made], [name], name=f"out_{name}"))
        out_infos.append(_value_info(name, tensor.dtype, infos[name]))
    return _model(graph, "tinygrad_attn_encoder", [_value_info("src", np.int64, ("B", "S"))], out_infos,
                  metadata)


def _scan_body(model, graph: _Graph, weights, width: int):
    """One encoder step as a Scan body: (state, x_t (B, I), mask_t (B,)) -> (state, output):
    the layer's own ``_step`` and padding ``_masked``, traced."""
    helper = _require().helper
    body = _Graph(root=graph)
    encoder = model.encoder
    lstm = model.cell == "lstm"
    batch, hidden = 2, model.hidden
    x = _leaf(np.zeros((batch, width), dtype=np.float32))
    h = _leaf(np.zeros((batch, hidden), dtype=np.float32))
    c = _leaf(np.zeros((batch, hidden), dtype=np.float32))
    keep = Tensor(np.ones((batch, 1), dtype=bool))
    state = (h, c) if lstm else h
    new = encoder._step(x, state, weights)
    output, state = encoder._masked(new, state, keep)
    bindings = {id(x): "x_t", id(h): "h_prev", id(c): "c_prev",
                id(keep): body.node("Unsqueeze", ["mask_t", body.ints([1])])}         # (B, 1)
    state_names = ["h_prev", "c_prev"] if lstm else ["h_prev"]
    flat = list(state) if lstm else [state]
    made = body.emit(flat + [output], bindings)
    out_names = [f"{n}_next" for n in state_names] + ["output_t"]
    for produced, name in zip(made, out_names, strict=True):
        body.nodes.append(helper.make_node("Identity", [produced], [name], name=body.fresh("out")))
    inputs = [_value_info(n, np.float32, ("B", hidden)) for n in state_names]
    inputs += [_value_info("x_t", np.float32, ("B", width)), _value_info("mask_t", np.bool_, ("B",))]
    outputs = [_value_info(n, np.float32, ("B", hidden)) for n in out_names]
    return helper.make_graph(body.nodes, graph.fresh("encoder_step"), inputs, outputs)


def _decoder_model(model, param_names: dict, metadata: dict):
    """One decoder step, ``Seq2Seq.decode_step`` up to the logits."""
    from ..models.seq2seq import Memory

    helper = _require().helper
    graph = _Graph(param_names=param_names)
    batch, steps, hidden = 2, 3, model.hidden
    tokens = Tensor(np.full((batch, 1), 1, dtype=np.int64))
    flat = [_leaf(np.zeros((batch, 1, hidden), dtype=np.float32)) for _ in _state_names(model)]
    states = _group_states(model, flat)
    bindings = {id(tokens): graph.node("Unsqueeze", ["tokens", graph.ints([1])])}  # (N, 1)
    inputs = [_value_info("tokens", np.int64, ("N",))]
    for name, leaf in zip(_state_names(model), flat, strict=True):
        bindings[id(leaf)] = name
        inputs.append(_value_info(name, np.float32, ("N", 1, hidden)))
    keys = keys_proj = key_mask = None
    if model.attention_kind is not None:
        key_size = model.hidden * model.encoder.num_directions
        keys = _leaf(np.zeros((batch, steps, key_size), dtype=np.float32))
        bindings[id(keys)] = "keys"
        inputs.append(_value_info("keys", np.float32, ("N", "S", key_size)))
        if model.attention_kind in ("additive", "concat"):
            keys_proj = _leaf(np.zeros((batch, steps, model.config["attn_dim"]), dtype=np.float32))
            bindings[id(keys_proj)] = "keys_proj"
            inputs.append(_value_info("keys_proj", np.float32, ("N", "S", model.config["attn_dim"])))
        key_mask = Tensor(np.ones((batch, 1, steps), dtype=bool))
        bindings[id(key_mask)] = graph.node("Unsqueeze", ["src_mask", graph.ints([1])])   # (N, 1, S)
        inputs.append(_value_info("src_mask", np.bool_, ("N", "S")))
    memory = Memory(keys, keys_proj, np.ones((batch, steps), dtype=bool), key_mask, states)
    top, context, weights, new_states = model._step(tokens, states, memory)
    feature = top if context is None else model._readout(top, context)
    outputs = {"logits": model.out(feature)}                                        # (N, 1, V)
    if weights is not None:
        outputs["attention"] = weights                                              # (N, 1, S)
    for name, state in zip(_state_names(model), _flatten_states(model, new_states), strict=True):
        outputs[f"{name}_next"] = state
    made = graph.emit(list(outputs.values()), bindings)
    out_infos = []
    shapes = {"logits": ("N", model.config["tgt_vocab"]), "attention": ("N", "S")}
    for (name, tensor), produced in zip(outputs.items(), made, strict=True):
        if name in shapes:          # the step axis of one step goes: (N, 1, X) -> (N, X)
            produced = graph.node("Squeeze", [produced, graph.ints([1])])
        graph.nodes.append(helper.make_node("Identity", [produced], [name], name=f"out_{name}"))
        out_infos.append(_value_info(name, tensor.dtype, shapes.get(name, ("N", 1, hidden))))
    return _model(graph, "tinygrad_attn_decoder_step", inputs, out_infos, metadata)


# ---------------------------------------------------------------- decoding with onnxruntime


@dataclass
class _OrtDecoding:
    """A decode of N rows on onnxruntime: the memory (keys, keys_proj, src_mask), the
    decoder's states by name, and which source each row decodes."""

    memory: dict
    states: dict
    source: np.ndarray


class OnnxSeq2Seq:
    """The exported encoder and decoder step as two onnxruntime sessions, decoding through
    ``ta.models.decoding``'s protocol (decode_start / decode_step / decode_select): greedy,
    sampling and beam search are the engine's own code, run on onnxruntime's numbers.

    Args:
        exported: what ``export_onnx`` returned, or the ``path`` given to it.
        threads: onnxruntime's intra-op threads (0: its default).
        providers: onnxruntime execution providers (default CPU).

    Example:
        >>> ort_model = OnnxSeq2Seq(ta.export.onnx(model, "dates.onnx"))
        >>> ids, weights = ort_model.greedy(src, max_len=12)
        >>> ids, weights = ort_model.beam_search(src, beam=5, max_len=12)
    """

    def __init__(self, exported, threads: int = 0, providers=None):
        ort = _require("onnxruntime")
        if isinstance(exported, OnnxExport):
            encoder_path, decoder_path = exported.encoder_path, exported.decoder_path
        else:
            encoder_path, decoder_path = _paths(exported)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        providers = providers or ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(encoder_path), options, providers=providers)
        self.decoder = ort.InferenceSession(str(decoder_path), options, providers=providers)
        self.decoder_inputs = [i.name for i in self.decoder.get_inputs()]
        self.state_names = [n for n in self.decoder_inputs if n[0] in "hc" and n[1:].isdigit()]
        self.encoder_outputs = [o.name for o in self.encoder.get_outputs()]
        self.has_attention = "keys" in self.decoder_inputs
        meta = self.decoder.get_modelmeta().custom_metadata_map
        self.config = json.loads(meta.get("tinygrad_attn.config", "{}"))

    def decode_start(self, src: np.ndarray) -> _OrtDecoding:
        src = np.asarray(src, dtype=np.int64)
        found = dict(zip(self.encoder_outputs, self.encoder.run(None, {"src": src}), strict=True))
        memory = {name: found[name] for name in ("keys", "keys_proj") if name in self.decoder_inputs}
        if self.has_attention:
            memory["src_mask"] = src != 0
        states = {name: found[name] for name in self.state_names}
        return _OrtDecoding(memory, states, np.arange(src.shape[0]))

    def decode_step(self, state: _OrtDecoding, tokens: np.ndarray, t: int):
        from ..models import decoding

        feed = {"tokens": np.asarray(tokens, dtype=np.int64), **state.memory, **state.states}
        found = dict(zip([o.name for o in self.decoder.get_outputs()], self.decoder.run(None, feed),
                         strict=True))
        log_probs = decoding.log_softmax(found["logits"])                          # (N, V) float64
        states = {name: found[f"{name}_next"] for name in self.state_names}
        return log_probs, found.get("attention"), _OrtDecoding(state.memory, states, state.source)

    def decode_select(self, state: _OrtDecoding, rows: np.ndarray) -> _OrtDecoding:
        source = state.source[rows]
        same = np.array_equal(source, state.source)
        memory = state.memory if same else {name: array[rows] for name, array in state.memory.items()}
        return _OrtDecoding(memory, {name: array[rows] for name, array in state.states.items()}, source)

    def encode(self, src) -> dict:
        """The encoder's outputs by name (keys, keys_proj, h0 ...)."""
        src = np.asarray(src, dtype=np.int64)
        return dict(zip(self.encoder_outputs, self.encoder.run(None, {"src": src}), strict=True))

    def greedy(self, src, max_len: int = 50, **options):
        """``ta.models.decoding.greedy`` on the sessions; returns what ``Seq2Seq.greedy`` does."""
        from ..models import decoding

        return decoding.greedy(self, src, max_len, **options)

    def beam_search(self, src, beam: int = 5, max_len: int = 50, **options):
        """``ta.models.decoding.beam_search`` on the sessions; as ``Seq2Seq.beam_search``."""
        from ..models import decoding

        return decoding.beam_search(self, src, beam, max_len, **options)
