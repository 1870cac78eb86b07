"""Exact (sympy) replays of a tiny Transformer encoder layer and decoder layer in float64.

``ta.check.symbolic`` replays the recorded graph through each op's sympy form, differentiates
exactly and compares with ``backward`` for the input(s) and every parameter the graph reaches.
Each sublayer is replayed on its own first, through the layer's own ``_sublayer`` wiring and
submodules (the attention calls repeat the ones in the layers' ``forward``), so a failure names
the block; then whole layers through ``forward`` itself, which covers the wiring between blocks.
Together: encoder self-attention with padding and an attention mask, the feed-forward block
with relu and gelu, the decoder's causal self-attention (with a query that may attend to
nothing), cross-attention with a memory key mask, all three LayerNorms, both ``norm_first``
settings; and a deliberately wrong backward inside a layer, which must fail.

d_model 4 with two heads, so heads are split and merged; every padded case keeps at least two
keys visible to most queries (with one visible key a softmax is constant and passes no gradient
to the queries and keys, so a wrong one would go unseen).  Parameters are random, not their
initial values, because LayerNorm's weight 1 and the zero biases would hide a gradient that
drops a factor of the weight or a bias term.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.ops.nn import LayerNorm as LayerNormOp

D_MODEL, NHEAD, FEEDFORWARD = 4, 2, 3
SOURCE_LEN, TARGET_LEN = 3, 3

SELF_ATTENTION = ("self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                  "self_attn.out_proj.bias")
CROSS_ATTENTION = tuple(name.replace("self_attn", "multihead_attn") for name in SELF_ATTENTION)
FEED_FORWARD = ("linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias")


def norm_parameters(i: int) -> tuple[str, str]:
    return (f"norm{i}.weight", f"norm{i}.bias")


def make_layer(kind, activation="relu", norm_first=False, seed=0):
    """A float64 layer without dropout whose parameters are all drawn at random."""
    layer = kind(D_MODEL, NHEAD, dim_feedforward=FEEDFORWARD, dropout=0.0, activation=activation,
                 norm_first=norm_first).double()
    rng = np.random.default_rng(seed)
    layer.load_state_dict({name: rng.normal(size=p.shape) for name, p in layer.named_parameters()})
    return layer


def sequence(length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(1, length, D_MODEL))          # (B, T, E)


def assert_exact(fn, layer, inputs: dict, parameters) -> None:
    """``fn(*inputs)`` replays exactly, and the report covers exactly the given inputs and
    parameters (so a block that silently skipped one would fail too)."""
    report = ta.check.symbolic(fn, *inputs.values())
    assert report.ok, str(report)
    assert {i.name for i in report.inputs} == set(inputs) | set(parameters), str(report)
    assert all(p.grad is None for p in layer.parameters())      # symbolic leaves .grad as it was


# ---------------------------------------------------------------- one sublayer at a time


def self_attention_block(layer, key_mask=None, mask=None, causal=False):
    """The first sublayer of either layer, as its forward wires it: norm1 and dropout1 around
    self-attention."""
    def attend(h):
        return layer.self_attn(h, h, h, key_mask=key_mask, mask=mask, causal=causal, need_weights=False)[0]

    def block(x):
        return layer._sublayer(x, layer.norm1, layer.dropout1, attend)

    return block


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_encoder_self_attention_block_with_padding_replays_exactly(norm_first):
    """Encoder self-attention plus residual and norm1, with a padded last key and an
    attention mask that hides key 0 from query 1: gradients of x, the in/out projections
    and norm1."""
    layer = make_layer(ta.nn.TransformerEncoderLayer, norm_first=norm_first, seed=1)
    key_mask = np.array([[True, True, False]])
    mask = np.array([[True, True, True], [False, True, True], [True, True, True]])
    block = self_attention_block(layer, key_mask=key_mask, mask=mask)
    assert_exact(block, layer, {"x": sequence(SOURCE_LEN, 2)}, SELF_ATTENTION + norm_parameters(1))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_feed_forward_block_replays_exactly(activation, norm_first):
    """linear1, the activation (relu's two pieces, gelu's erf), linear2, residual and norm2."""
    layer = make_layer(ta.nn.TransformerEncoderLayer, activation, norm_first, seed=3)

    def block(x):
        return layer._sublayer(x, layer.norm2, layer.dropout2, layer._feed_forward)

    assert_exact(block, layer, {"x": sequence(SOURCE_LEN, 4)}, FEED_FORWARD + norm_parameters(2))


@pytest.mark.parametrize("key_mask", [None, [[True, True, False]], [[False, True, True]]],
                         ids=["no_padding", "padded_last", "first_query_sees_nothing"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_decoder_causal_self_attention_block_replays_exactly(norm_first, key_mask):
    """Causal self-attention plus residual and norm1.  With the first target token padded,
    query 0 may attend to nothing: its context is zero (not NaN) and so are its gradients."""
    layer = make_layer(ta.nn.TransformerDecoderLayer, norm_first=norm_first, seed=5)
    mask = None if key_mask is None else np.array(key_mask)
    block = self_attention_block(layer, key_mask=mask, causal=True)
    assert_exact(block, layer, {"x": sequence(TARGET_LEN, 6)}, SELF_ATTENTION + norm_parameters(1))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_cross_attention_block_with_memory_key_mask_replays_exactly(norm_first):
    """Attention from the target over a memory whose last entry is padding, plus residual
    and norm2: gradients of the target, the memory, multihead_attn and norm2."""
    layer = make_layer(ta.nn.TransformerDecoderLayer, norm_first=norm_first, seed=7)
    memory_key_mask = np.array([[True, True, False]])

    def attend(h, memory):
        return layer.multihead_attn(h, memory, memory, key_mask=memory_key_mask, need_weights=False)[0]

    def block(x, memory):
        return layer._sublayer(x, layer.norm2, layer.dropout2, lambda h: attend(h, memory))

    inputs = {"x": sequence(TARGET_LEN, 8), "memory": sequence(SOURCE_LEN, 9)}
    assert_exact(block, layer, inputs, CROSS_ATTENTION + norm_parameters(2))


# ---------------------------------------------------------------- whole layers


@pytest.mark.parametrize("activation,norm_first,masks", [
    ("relu", False, {}),
    ("gelu", False, {"key_mask": [[True, True, False]]}),
    ("relu", True, {"key_mask": [[False, True, True]], "mask": [[True, True, True], [True, False, True],
                                                             [True, True, True]]}),
    ("gelu", True, {"causal": True}),
], ids=["relu_post_norm", "gelu_post_norm_padded", "relu_pre_norm_masked", "gelu_pre_norm_causal"])
def test_encoder_layer_replays_exactly(activation, norm_first, masks):
    """The whole encoder layer (self-attention, feed-forward, norm1 and norm2) through its
    own forward, for each norm_first setting and activation and each kind of mask."""
    layer = make_layer(ta.nn.TransformerEncoderLayer, activation, norm_first, seed=10)
    options = {key: np.array(value) if isinstance(value, list) else value for key, value in masks.items()}
    parameters = [name for name, _ in layer.named_parameters()]
    assert_exact(lambda x: layer(x, **options), layer, {"x": sequence(SOURCE_LEN, 11)}, parameters)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_decoder_layer_replays_exactly(activation, norm_first):
    """The whole decoder layer (causal self-attention, cross-attention, feed-forward, norm1 to
    norm3) through its own forward, with a padded target token and a padded memory entry:
    gradients of the target, the memory and every parameter."""
    layer = make_layer(ta.nn.TransformerDecoderLayer, activation, norm_first, seed=12)
    key_mask, memory_key_mask = np.array([[True, True, False]]), np.array([[True, False, True]])

    def decode(x, memory):
        return layer(x, memory, key_mask=key_mask, memory_key_mask=memory_key_mask)

    parameters = [name for name, _ in layer.named_parameters()]
    inputs = {"x": sequence(TARGET_LEN, 13), "memory": sequence(SOURCE_LEN, 14)}
    assert_exact(decode, layer, inputs, parameters)


def test_the_replay_catches_a_wrong_layer_norm_gradient_inside_a_layer(monkeypatch):
    """A LayerNorm backward whose weight gradient is off by one part in a million fails the
    replay of a whole encoder layer, naming both norms' weights and nothing else: the checks
    above can fail."""
    backward = LayerNormOp.backward

    def slightly_wrong(self, dy):
        grads = backward(self, dy)
        return grads[:1] + (grads[1] * (1 + 1e-6),) + grads[2:]

    monkeypatch.setattr(LayerNormOp, "backward", slightly_wrong)
    layer = make_layer(ta.nn.TransformerEncoderLayer, seed=15)
    report = ta.check.symbolic(lambda x: layer(x), sequence(SOURCE_LEN, 16))
    assert not report.ok and report.error is None and report.forward_ok
    assert {i.name for i in report.inputs if not i.ok} == {"norm1.weight", "norm2.weight"}, str(report)
