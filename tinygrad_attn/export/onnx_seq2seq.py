"""A Seq2Seq's encoder and one decoder step as ONNX graphs, traced from the model's own code.

    encoder   src (B, S) int64 -> keys (B, S, K), keys_proj (B, S, A), h0 [c0] ... (B, 1, H)
    decoder   tokens (N,) int64, h0 [c0] ... (N, 1, H), keys, keys_proj, src_mask (N, S) bool
              -> logits (N, V), attention (N, S), h0_next [c0_next] ...

(``keys`` is absent without attention, ``keys_proj`` for dot and general scores, ``c<l>``
for a GRU.)  Batch and source length are dynamic axes.  The encoder's recurrence is an ONNX
``Scan`` per layer and direction, whose body is one engine step (the cell and the padding
``where``) traced the same way, so one file serves every source length; the decoder step has
no recurrence and no size-dependent op.
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .onnx_graph import Graph, make_model, trace_input, value_info
from .onnx_ops import require


def state_names(model) -> list[str]:
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



def encoder_model(model, param_names: dict, metadata: dict):
    """src (B, S) -> keys, keys_proj, the decoder's initial states: ``Seq2Seq.encode`` with
    each recurrent layer and direction as a Scan over the source axis."""
    helper = require().helper
    graph = Graph(param_names=param_names)
    batch, steps = 2, 3                                         # any sizes: the axes are dynamic
    src = trace_input(np.ones((batch, steps), dtype=np.int64))
    (embedded,) = graph.emit([model.src_embed(src)], {id(src): "src"})               # (B, S, E)
    mask = graph.real_tokens()                                                       # (B, S)
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
            leaf = trace_input(np.zeros((batch, 1, model.hidden), dtype=np.float32))
            bindings[id(leaf)] = graph.node("Unsqueeze", [name, graph.ints([1])])   # (B, 1, H)
            parts.append(leaf)
        leaves.append(tuple(parts) if lstm else parts[0])
    states = _flatten_states(model, model._bridge(leaves))
    outputs = {name: tensor for name, tensor in zip(state_names(model), states, strict=True)}
    infos = {name: ("B", 1, model.hidden) for name in outputs}
    if model.attention_kind is not None:
        key_size = model.hidden * encoder.num_directions
        keys = trace_input(np.zeros((batch, steps, key_size), dtype=np.float32))
        bindings[id(keys)] = xs
        outputs["keys"] = keys
        infos["keys"] = ("B", "S", key_size)
        if model.attention_kind in ("additive", "concat"):
            outputs["keys_proj"] = model.attention.keys_projection(keys)
            infos["keys_proj"] = ("B", "S", model.config["attn_dim"])
    names = graph.emit(list(outputs.values()), bindings)
    out_infos = []
    for (name, tensor), made in zip(outputs.items(), names, strict=True):
        graph.output(made, name)
        out_infos.append(value_info(name, tensor.dtype, infos[name]))
    return make_model(graph, "tinygrad_attn_encoder", [value_info("src", np.int64, ("B", "S"))], out_infos,
                  metadata)


def _scan_body(model, graph: Graph, weights, width: int):
    """One encoder step as a Scan body: (state, x_t (B, I), mask_t (B,)) -> (state, output):
    the layer's own ``_step`` and padding ``_masked``, traced."""
    helper = require().helper
    body = Graph(root=graph)
    encoder = model.encoder
    lstm = model.cell == "lstm"
    batch, hidden = 2, model.hidden
    x = trace_input(np.zeros((batch, width), dtype=np.float32))
    h = trace_input(np.zeros((batch, hidden), dtype=np.float32))
    c = trace_input(np.zeros((batch, hidden), dtype=np.float32))
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
        body.output(produced, name)
    inputs = [value_info(n, np.float32, ("B", hidden)) for n in state_names]
    inputs += [value_info("x_t", np.float32, ("B", width)), value_info("mask_t", np.bool_, ("B",))]
    outputs = [value_info(n, np.float32, ("B", hidden)) for n in out_names]
    return helper.make_graph(body.nodes, graph.fresh("encoder_step"), inputs, outputs)


def decoder_model(model, param_names: dict, metadata: dict):
    """One decoder step, ``Seq2Seq.decode_step`` up to the logits."""
    from ..models.seq2seq import Memory

    graph = Graph(param_names=param_names)
    batch, steps, hidden = 2, 3, model.hidden
    tokens = Tensor(np.full((batch, 1), 1, dtype=np.int64))
    flat = [trace_input(np.zeros((batch, 1, hidden), dtype=np.float32)) for _ in state_names(model)]
    states = _group_states(model, flat)
    bindings = {id(tokens): graph.node("Unsqueeze", ["tokens", graph.ints([1])])}  # (N, 1)
    inputs = [value_info("tokens", np.int64, ("N",))]
    for name, leaf in zip(state_names(model), flat, strict=True):
        bindings[id(leaf)] = name
        inputs.append(value_info(name, np.float32, ("N", 1, hidden)))
    keys = keys_proj = key_mask = None
    if model.attention_kind is not None:
        key_size = model.hidden * model.encoder.num_directions
        keys = trace_input(np.zeros((batch, steps, key_size), dtype=np.float32))
        bindings[id(keys)] = "keys"
        inputs.append(value_info("keys", np.float32, ("N", "S", key_size)))
        if model.attention_kind in ("additive", "concat"):
            keys_proj = trace_input(np.zeros((batch, steps, model.config["attn_dim"]), dtype=np.float32))
            bindings[id(keys_proj)] = "keys_proj"
            inputs.append(value_info("keys_proj", np.float32, ("N", "S", model.config["attn_dim"])))
        key_mask = Tensor(np.ones((batch, 1, steps), dtype=bool))
        bindings[id(key_mask)] = graph.node("Unsqueeze", ["src_mask", graph.ints([1])])   # (N, 1, S)
        inputs.append(value_info("src_mask", np.bool_, ("N", "S")))
    memory = Memory(keys, keys_proj, np.ones((batch, steps), dtype=bool), key_mask, states)
    top, context, weights, new_states = model._step(tokens, states, memory)
    feature = top if context is None else model._readout(top, context)
    outputs = {"logits": model.out(feature)}                                        # (N, 1, V)
    if weights is not None:
        outputs["attention"] = weights                                              # (N, 1, S)
    for name, state in zip(state_names(model), _flatten_states(model, new_states), strict=True):
        outputs[f"{name}_next"] = state
    made = graph.emit(list(outputs.values()), bindings)
    out_infos = []
    shapes = {"logits": ("N", model.config["tgt_vocab"]), "attention": ("N", "S")}
    for (name, tensor), produced in zip(outputs.items(), made, strict=True):
        if name in shapes:          # the step axis of one step goes: (N, 1, X) -> (N, X)
            produced = graph.node("Squeeze", [produced, graph.ints([1])])
        graph.output(produced, name)
        out_infos.append(value_info(name, tensor.dtype, shapes.get(name, ("N", 1, hidden))))
    return make_model(graph, "tinygrad_attn_decoder_step", inputs, out_infos, metadata)

