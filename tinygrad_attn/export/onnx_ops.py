"""The ONNX lowering of each engine op: one function per recorded op name, writing it as one
ONNX node or a small subgraph (opset 17) through the builder ``onnx_graph.Graph`` hands it.

A lowering is ``(g, op, inputs, tensors, out) -> name``: the graph being written, the recorded
op (its attributes: axes, shapes, scale ...), its inputs' ONNX names and engine tensors (their
traced shapes and dtypes), and the tensor it made.  Traced sizes are written so that batch and
length axes stay dynamic where the op carries them through (``_reshape``, ``_expand``).
"""

from __future__ import annotations

import importlib
import math

import numpy as np

__all__ = ["LOWERINGS", "OPSET", "supported_ops"]

OPSET = 17
INSTALL_HINT = "pip install 'tinygrad_attn[onnx]'"


class UnsupportedOpError(TypeError):
    """A recorded op has no ONNX mapping; the message names it and where it was recorded."""


def require(module: str = "onnx"):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{module} needs the optional extra: {INSTALL_HINT}") from None


# ---------------------------------------------------------------- building a graph


_ONNX_TYPES = {np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.int32): 6,
               np.dtype(np.int64): 7, np.dtype(np.bool_): 9, np.dtype(np.float64): 11}


def onnx_type(dtype) -> int:
    try:
        return _ONNX_TYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"ONNX export: no ONNX element type for dtype {np.dtype(dtype)}") from None


# ---------------------------------------------------------------- one lowering per op

LOWERINGS: dict = {}


def _lowers(*names):
    def decorate(fn):
        for name in names:
            LOWERINGS[name] = fn
        return fn
    return decorate


def supported_ops() -> list[str]:
    """The engine ops the exporter maps to ONNX."""
    return sorted(LOWERINGS)


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
    return g.node("Cast", inputs, to=onnx_type(op.dtype))


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


@_lowers("Split")
def _split(g, op, inputs, tensors, out):
    # One piece per recorded op: a Slice (an ONNX Split would make every piece each time).
    start = sum(int(n) for n in op.sizes[:int(op.index)])
    end = start + int(op.sizes[int(op.index)])
    return g.node("Slice", [inputs[0], g.ints([start]), g.ints([end]), g.ints([int(op.axis)])])


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
    heads_in_place = op.layout == "BTHD"
    if heads_in_place:                  # (B, T, H, D) -> (B, H, T, D), and back at the end
        q, k, v = (g.node("Transpose", [x], perm=[0, 2, 1, 3]) for x in (q, k, v))
    dtype = out.dtype
    rank = tensors[1].ndim
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    k_t = g.node("Transpose", [k], perm=perm)                                       # (..., D, T_k)
    scores = g.node("MatMul", [g.node("Mul", [q, g.const(float(op.scale), dtype)]), k_t])  # (..., T_q, T_k)
    mask = inputs[3] if len(inputs) > 3 else None
    if op.causal:
        # Key j > query i is forbidden: a lower-triangular (T_q, T_k) of the scores' shape.
        size = g.node("Slice", [g.node("Shape", [scores]), g.ints([-2]), g.ints([np.iinfo(np.int64).max])])
        ones = g.node("ConstantOfShape", [size], value=require().helper.make_tensor("one", 7, [1], [1]))
        tril = g.node("Cast", [g.node("Trilu", [ones], upper=0)], to=onnx_type(np.bool_))
        mask = tril if mask is None else g.node("And", [mask, tril])
    if mask is None:
        weights = g.node("Softmax", [scores], axis=-1)
    else:
        weights = _masked_softmax(g, scores, mask, dtype)
    g.root.weights[id(out)] = weights           # an exporter may output them (the engine keeps them too)
    context = g.node("MatMul", [weights, v])                                        # (..., T_q, D_v)
    return g.node("Transpose", [context], perm=[0, 2, 1, 3]) if heads_in_place else context


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
    # A masked cell (GRUCell(masked=True)) takes its keep column (B, 1) last: a padded row
    # keeps its previous state.
    keep = inputs[-1] if op.attrs.get("masked", False) else None
    inputs = inputs[:-1] if keep is not None else inputs
    if op.attrs.get("projected", False):         # gi = x W_ih^T + b_ih given: gi, h_prev, w_hh, b_hh
        gi, h_prev, w_hh, *bias = inputs
        gh = _linear(g, h_prev, w_hh, bias[0] if bias else None)
        h = _gru_gates(g, gi, gh, h_prev, tensors[1].shape[-1], out.dtype)
        return h if keep is None else g.node("Where", [keep, h, h_prev])
    xs = inputs[:parts]
    h_prev, w_ih, w_hh, *biases = inputs[parts:]
    x = xs[0] if parts == 1 else g.node("Concat", xs, axis=-1)                      # (..., I): [y; c]
    gi = _linear(g, x, w_ih, biases[0] if biases else None)                          # (..., 3H)
    gh = _linear(g, h_prev, w_hh, biases[1] if biases else None)                     # (..., 3H)
    h = _gru_gates(g, gi, gh, h_prev, tensors[parts].shape[-1], out.dtype)
    return h if keep is None else g.node("Where", [keep, h, h_prev])


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

