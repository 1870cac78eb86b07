"""A Transformer's encoder and one cached decoder step as ONNX graphs, traced from the model's
own code (``Transformer.encode``, ``MultiHeadAttention.project_memory`` and
``Transformer.decoder_step`` on growing ``DecoderCache``s):

    encoder   src (B, S) int64 -> memory_key<l>, memory_value<l> (B, H, S, D), per decoder layer
    decoder   tokens (N,) int64, src_mask (N, S) bool, memory_key<l>, memory_value<l>,
              past_key<l>, past_value<l> (N, H, T, D)
              -> logits (N, V), attention (N, S),
                 past_key<l>_next, past_value<l>_next (N, H, T + 1, D)

The encoder writes what the decoder reads from the source: each decoder layer's
cross-attention keys and values of the memory, projected once.  The step's state is every
decoder layer's self-attention cache, T tokens long (T = 0 at the first step, the position of
the new token): the step appends the new token's keys and values and reads its position's
row of the position table (sinusoids, or the learned embedding) at T.  ``attention`` is the
last decoder layer's cross-attention averaged over heads, what the engine's ``decode_step``
returns.  Batch, source length and T are dynamic axes; nothing in either graph depends on the
traced sizes.

A stack of zero layers is its final LayerNorm alone.  Zero encoder layers change nothing
above.  Zero decoder layers leave nothing that reads the source: the encoder outputs its
``memory`` (B, S, d_model) instead, and the step takes no source, outputs no ``attention``,
and keeps as its state the ids fed so far, ``past_tokens`` (N, T) int64, whose length is the
new token's position:

    decoder   tokens (N,) int64, past_tokens (N, T) int64 -> logits (N, V), past_tokens_next
"""

from __future__ import annotations

import numpy as np

from .. import scopes
from ..autograd import scope, toposort
from ..tensor import Tensor
from .onnx_graph import Graph, make_model, trace_input, value_info

BATCH, STEPS, PAST = 2, 3, 4            # traced sizes: any, as long as they differ


PAST_TOKENS = "past_tokens"             # the step's state without decoder layers: no cache to measure


def state_names(model) -> list[str]:
    """The decoder step's state inputs (its outputs add ``_next``)."""
    if not model.transformer.decoder.layers:
        return [PAST_TOKENS]
    return [f"past_{kind}{layer}" for layer in range(len(model.transformer.decoder.layers))
            for kind in ("key", "value")]


def memory_names(model) -> list[str]:
    return [f"memory_{kind}{layer}" for layer in range(len(model.transformer.decoder.layers))
            for kind in ("key", "value")]


def _heads_shape(model, length: str) -> tuple:
    nhead = model.config["nhead"]
    return ("N", nhead, length, model.d_model // nhead)


def _position_rows(graph: Graph, model, start: str, stop: str) -> str:
    """Rows start .. stop - 1 of the position table, (L, d_model): the learned embedding's
    weight, or the sinusoids as a constant."""
    if model.config["positions"] == "learned":
        table = graph.leaf(model.position.weight)
    else:
        table = graph.const(model._sinusoids.astype(np.float32), name="positions")
    return graph.node("Slice", [table, start, stop, graph.ints([0])])


def encoder_model(model, param_names: dict, metadata: dict):
    """src (B, S) -> the memory's keys and values for every decoder layer's cross-attention."""
    graph = Graph(param_names=param_names)
    src = trace_input(np.ones((BATCH, STEPS), dtype=np.int64))
    positions = trace_input(np.zeros((STEPS, model.d_model), dtype=np.float32))
    mask = Tensor(np.ones((BATCH, 1, 1, STEPS), dtype=bool))                        # True: a real token
    length = graph.node("Slice", [graph.node("Shape", ["src"]), graph.ints([1]), graph.ints([2])])
    real = graph.real_tokens()                                                       # (B, S)
    bindings = {id(src): "src", id(positions): _position_rows(graph, model, graph.ints([0]), length),
                id(mask): graph.node("Unsqueeze", [real, graph.ints([1, 2])])}       # (B, 1, 1, S)
    with scope(scopes.ENCODER):
        memory = model.transformer.encoder(model._embed(model.src_embed, src, positions=positions), mask=mask)
    if not model.transformer.decoder.layers:            # nothing projects the memory: it is the output
        (made,) = graph.emit([memory], bindings)
        graph.output(made, "memory")
        out_infos = [value_info("memory", np.float32, ("B", "S", model.d_model))]
        src_info = value_info("src", np.int64, ("B", "S"))
        return make_model(graph, "tinygrad_attn_transformer_encoder", [src_info], out_infos, metadata)
    outputs = []
    for layer in model.transformer.decoder.layers:
        outputs += layer.multihead_attn.project_memory(memory)
    names = graph.emit(outputs, bindings)
    for made, name in zip(names, memory_names(model), strict=True):
        graph.output(made, name)
    out_infos = [value_info(name, np.float32, _heads_shape(model, "S")) for name in memory_names(model)]
    return make_model(graph, "tinygrad_attn_transformer_encoder", [value_info("src", np.int64, ("B", "S"))],
                  out_infos, metadata)


def decoder_model(model, param_names: dict, metadata: dict):
    """One decoder step: ``Transformer.decoder_step`` on caches that are graph inputs."""
    if not model.transformer.decoder.layers:
        return _decoder_without_layers(model, param_names, metadata)
    graph = Graph(param_names=param_names)
    nhead = model.config["nhead"]
    head = (BATCH, nhead, None, model.d_model // nhead)
    tokens = trace_input(np.ones((BATCH, 1), dtype=np.int64))
    positions = trace_input(np.zeros((1, model.d_model), dtype=np.float32))
    mask = Tensor(np.ones((BATCH, 1, 1, STEPS), dtype=bool))

    def leaves(length):
        return [trace_input(np.zeros(head[:2] + (length,) + head[3:], dtype=np.float32)) for _ in range(2)]

    caches = [layer.cache(*leaves(PAST), *leaves(STEPS)) for layer in model.transformer.decoder.layers]
    # The new token's position is the cache's length: T, read from the first cache's shape.
    past = graph.node("Slice", [graph.node("Shape", ["past_key0"]), graph.ints([2]), graph.ints([3])])
    bindings = {id(tokens): graph.node("Unsqueeze", ["tokens", graph.ints([1])]),            # (N, 1)
                id(positions): _position_rows(graph, model, past, graph.node("Add", [past, graph.ints([1])])),
                id(mask): graph.node("Unsqueeze", ["src_mask", graph.ints([1, 2])])}       # (N, 1, 1, S)
    flat_memory, flat_past = [], []
    for cache in caches:
        flat_memory += [cache.memory_keys, cache.memory_values]
        flat_past += [cache.keys, cache.values]
    for name, leaf in zip(memory_names(model) + state_names(model), flat_memory + flat_past, strict=True):
        bindings[id(leaf)] = name
    with scope(scopes.DECODER):
        h, _ = model.decoder_step(tokens, caches, mask, positions=positions)
        logits = model.out(h)                                                       # (N, 1, V)
    attention = _last_cross_attention(model, logits)                                # (N, H, 1, S)
    outputs = [logits, attention] + [x for cache in caches for x in (cache.keys, cache.values)]
    made = graph.emit(outputs, bindings)
    step_axis = graph.ints([1])
    graph.output(graph.node("Squeeze", [made[0], step_axis]), "logits")            # (N, V)
    averaged = graph.node("ReduceMean", [graph.root.weights[id(attention)]], axes=[1], keepdims=0)
    graph.output(graph.node("Squeeze", [averaged, step_axis]), "attention")        # (N, S)
    for produced, name in zip(made[2:], state_names(model), strict=True):
        graph.output(produced, f"{name}_next")
    inputs = [value_info("tokens", np.int64, ("N",)), value_info("src_mask", np.bool_, ("N", "S"))]
    inputs += [value_info(name, np.float32, _heads_shape(model, "S")) for name in memory_names(model)]
    inputs += [value_info(name, np.float32, _heads_shape(model, "T")) for name in state_names(model)]
    outputs = [value_info("logits", np.float32, ("N", model.config["tgt_vocab"])),
               value_info("attention", np.float32, ("N", "S"))]
    outputs += [value_info(f"{name}_next", np.float32, _heads_shape(model, "T_next"))
                for name in state_names(model)]
    return make_model(graph, "tinygrad_attn_transformer_decoder_step", inputs, outputs, metadata)


def _decoder_without_layers(model, param_names: dict, metadata: dict):
    """The step of a decoder of no layers, the final LayerNorm of the new token's embedding:
    its position is the length of ``past_tokens``, which the step extends by the token."""
    graph = Graph(param_names=param_names)
    tokens = trace_input(np.ones((BATCH, 1), dtype=np.int64))
    positions = trace_input(np.zeros((1, model.d_model), dtype=np.float32))
    step_axis = graph.ints([1])
    column = graph.node("Unsqueeze", ["tokens", step_axis])                                # (N, 1)
    past = graph.node("Slice", [graph.node("Shape", [PAST_TOKENS]), graph.ints([1]), graph.ints([2])])
    bindings = {id(tokens): column,
                id(positions): _position_rows(graph, model, past, graph.node("Add", [past, graph.ints([1])]))}
    with scope(scopes.DECODER):
        logits = model.out(model.decoder_step(tokens, [], positions=positions)[0])        # (N, 1, V)
    (made,) = graph.emit([logits], bindings)
    graph.output(graph.node("Squeeze", [made, step_axis]), "logits")                       # (N, V)
    graph.output(graph.node("Concat", [PAST_TOKENS, column], axis=1), f"{PAST_TOKENS}_next")  # (N, T + 1)
    inputs = [value_info("tokens", np.int64, ("N",)), value_info(PAST_TOKENS, np.int64, ("N", "T"))]
    outputs = [value_info("logits", np.float32, ("N", model.config["tgt_vocab"])),
               value_info(f"{PAST_TOKENS}_next", np.int64, ("N", "T_next"))]
    return make_model(graph, "tinygrad_attn_transformer_decoder_step", inputs, outputs, metadata)


def _last_cross_attention(model, logits: Tensor) -> Tensor:
    """The fused attention node of the last decoder layer's cross-attention, found in the
    record by its scope: its weights are what the step outputs as ``attention``."""
    last = scopes.layer(len(model.transformer.decoder.layers) - 1)
    where = "/".join((scopes.DECODER, last, scopes.CROSS_ATTENTION))
    for tensor in toposort([logits], only_grad=False):
        node = tensor.node
        if node is not None and node.op.name == "ScaledDotProduct" and node.scope.startswith(where):
            return tensor
    raise LookupError(f"ONNX export: no attention node recorded under {where!r}")
