"""The Transformer's layers against ``torch.nn.Transformer`` (batch first, float64): the same
state_dict keys and shapes, and with torch's weights loaded, equal outputs and gradients of
every input and parameter, for both norm_first settings, both activations, with and without
biases and padding.  Then the parts torch defines that the layers use (LayerNorm, label
smoothing; GELU is a row of tests/test_reference.py), and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tests import optional
from tinygrad_attn import functional as F

torch = optional.module("torch", optional.TORCH_REASON)

RTOL = 1e-8      # the bar: float64 outputs and gradients equal to 1e-8 relative


def relative_error(ours, theirs) -> float:
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
    ours = ours.numpy() if isinstance(ours, ta.Tensor) else np.asarray(ours)
    assert ours.shape == theirs.shape
    # Relative to the largest entry, and to at least 1e-6: a gradient that is 0 in exact
    # arithmetic (a LayerNorm over one entry) is rounding noise on both sides.
    return float(np.abs(ours - theirs).max(initial=0.0) / max(np.abs(theirs).max(initial=0.0), 1e-6))


def assert_same_as_torch(values, torch_values, ours, theirs):
    """Outputs and input gradients, then every parameter's gradient, equal to torch's."""
    for value, expected in zip(values, torch_values, strict=True):
        assert relative_error(value, expected) < RTOL
    torch_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert relative_error(p.grad, torch_params[name].grad) < RTOL, name


def twins(d_model, nhead, layers, ff, activation, norm_first, bias):
    """torch's model (train mode, no dropout: its eval-mode fast path skips padded rows) and
    ours with its weights, both float64."""
    theirs = torch.nn.Transformer(d_model, nhead, layers, layers, ff, dropout=0.0, activation=activation,
                                  batch_first=True, norm_first=norm_first, bias=bias).double()
    ours = ta.nn.Transformer(d_model, nhead, layers, layers, ff, dropout=0.0, activation=activation,
                             norm_first=norm_first, bias=bias)
    for p in ours.parameters():
        p.data = p.numpy().astype(np.float64)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def padding(rng, batch, length):
    """True = real token; each row keeps at least its first token (an all-padding row gives
    NaN in torch and zeros here)."""
    keep = rng.random((batch, length)) < 0.7
    keep[:, 0] = True
    return keep


@settings(deadline=None, max_examples=12)
@given(heads=st.integers(1, 3), head_dim=st.integers(2, 3), layers=st.integers(1, 2),
       ff=st.integers(1, 6), src_len=st.integers(1, 5), tgt_len=st.integers(1, 5), batch=st.integers(1, 3),
       activation=st.sampled_from(["relu", "gelu"]), norm_first=st.booleans(), bias=st.booleans(),
       padded=st.booleans(), seed=st.integers(0, 2**16))
def test_the_transformer_matches_torch_in_values_and_every_gradient(heads, head_dim, layers, ff, src_len,
                                                                    tgt_len, batch, activation, norm_first,
                                                                    bias, padded, seed):
    # d_model >= 2: a LayerNorm over one entry outputs its bias, and the gradients are
    # rounding noise on both sides.
    d_model = heads * head_dim
    torch.manual_seed(seed)
    ours, theirs = twins(d_model, heads, layers, ff, activation, norm_first, bias)
    rng = np.random.default_rng(seed)
    src, tgt = rng.normal(size=(batch, src_len, d_model)), rng.normal(size=(batch, tgt_len, d_model))
    src_keep = padding(rng, batch, src_len) if padded else np.ones((batch, src_len), bool)
    tgt_keep = padding(rng, batch, tgt_len) if padded else np.ones((batch, tgt_len), bool)

    a, b = ta.Tensor(src, requires_grad=True, dtype=np.float64), ta.Tensor(tgt, requires_grad=True,
                                                                           dtype=np.float64)
    y = ours(a, b, src_key_mask=src_keep, tgt_key_mask=tgt_keep)
    dy = rng.normal(size=y.shape)
    y.backward(dy)

    ta_, tb = torch.tensor(src, requires_grad=True), torch.tensor(tgt, requires_grad=True)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(tgt_len, dtype=torch.float64)
    ty = theirs(ta_, tb, tgt_mask=causal, tgt_is_causal=True,
                src_key_padding_mask=torch.tensor(~src_keep), tgt_key_padding_mask=torch.tensor(~tgt_keep),
                memory_key_padding_mask=torch.tensor(~src_keep))
    ty.backward(torch.tensor(dy))

    assert_same_as_torch((y, a.grad, b.grad), (ty, ta_.grad, tb.grad), ours, theirs)


def test_state_dict_keys_and_shapes_are_torchs():
    ours = ta.nn.Transformer(8, 2, 2, 1, 16, dropout=0.0)
    theirs = torch.nn.Transformer(8, 2, 2, 1, 16, dropout=0.0, batch_first=True)
    expected = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert {k: v.shape for k, v in ours.state_dict().items()} == expected
    assert "encoder.norm.weight" in expected and "decoder.layers.0.multihead_attn.in_proj_weight" in expected


def test_encoder_layer_alone_matches_torch_with_a_causal_mask():
    torch.manual_seed(0)
    theirs = torch.nn.TransformerEncoderLayer(6, 2, 10, dropout=0.0, batch_first=True).double()
    ours = ta.nn.TransformerEncoderLayer(6, 2, 10, dropout=0.0)
    for p in ours.parameters():
        p.data = p.numpy().astype(np.float64)
    ours.load_state_dict(theirs.state_dict())
    x = np.random.default_rng(0).normal(size=(2, 4, 6))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    expected = theirs(torch.tensor(x), src_mask=mask, is_causal=True)
    assert relative_error(ours(ta.Tensor(x, dtype=np.float64), causal=True), expected) < RTOL


def test_layers_start_as_copies_and_the_model_redraws_every_matrix():
    ta.manual_seed(0)
    layer = ta.nn.TransformerEncoderLayer(4, 2, 8)
    stack = ta.nn.TransformerEncoder(layer, 2)
    first, second = (dict(block.named_parameters()) for block in stack.layers)
    for name, p in first.items():
        np.testing.assert_array_equal(p.numpy(), second[name].numpy())     # torch deep-copies
        assert p is not second[name]
    model = ta.nn.Transformer(4, 2, 2, 2, 8)
    w0 = model.encoder.layers[0].linear1.weight.numpy()
    w1 = model.encoder.layers[1].linear1.weight.numpy()
    assert not np.array_equal(w0, w1)
    bound = np.sqrt(6.0 / (4 + 8))                                         # Xavier-uniform (8, 4)
    assert np.abs(w0).max() <= bound


def test_bad_configurations_and_masks_say_what_is_wrong():
    with pytest.raises(ValueError, match="nhead=3 must divide d_model=8"):
        ta.nn.Transformer(8, 3, 1, 1, 16)
    with pytest.raises(ValueError, match="activation must be 'relu' or 'gelu'"):
        ta.nn.TransformerEncoderLayer(8, 2, activation="tanh")
    with pytest.raises(ValueError, match="batch_first=False is not supported"):
        ta.nn.TransformerDecoderLayer(8, 2, batch_first=False)
    model = ta.nn.Transformer(4, 2, 1, 1, 8, dropout=0.0)
    x = ta.Tensor(np.zeros((2, 3, 4)))
    with pytest.raises(ta.ShapeError, match=r"key_mask must be boolean \(B, S\) = \(2, 3\)"):
        model(x, x, src_key_mask=np.ones((2, 4), bool))
    with pytest.raises(ta.ShapeError, match="must divide the embedding size E=5"):
        model(ta.Tensor(np.zeros((2, 3, 5))), x)
    with pytest.raises(ta.ShapeError, match=r"shape \(2, 3, 5\) must end in normalized_shape \(4,\)"):
        ta.nn.LayerNorm(4)(ta.Tensor(np.zeros((2, 3, 5))))


def attention_mask(rng, batch, nhead, rows, cols, per_head):
    """A random mask in the engine's convention (True = may attend), (B, H, rows, cols) or
    (rows, cols); every row keeps one position (a row with none is NaN in torch, zeros here)."""
    shape = (batch, nhead, rows, cols) if per_head else (rows, cols)
    allow = rng.random(shape) < 0.6
    allow[..., np.arange(rows), np.arange(rows) % cols] = True
    return allow


def torch_mask(allow):
    """torch's boolean attention mask (True = may NOT attend), 2-D or (B * nhead, ., .)."""
    return torch.tensor(~allow.reshape(-1, *allow.shape[-2:]) if allow.ndim == 4 else ~allow)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_src_tgt_and_memory_masks_match_torch_in_values_and_every_gradient(per_head, norm_first):
    batch, nhead, d_model, src_len, tgt_len = 2, 2, 6, 5, 4
    torch.manual_seed(1)
    ours, theirs = twins(d_model, nhead, 2, 7, "relu", norm_first, True)
    rng = np.random.default_rng(int(per_head) + 2 * int(norm_first))
    src, tgt = rng.normal(size=(batch, src_len, d_model)), rng.normal(size=(batch, tgt_len, d_model))
    src_mask = attention_mask(rng, batch, nhead, src_len, src_len, per_head)
    tgt_mask = attention_mask(rng, batch, nhead, tgt_len, tgt_len, per_head)
    memory_mask = attention_mask(rng, batch, nhead, tgt_len, src_len, per_head)
    src_keep, memory_keep = padding(rng, batch, src_len), padding(rng, batch, src_len)

    a, b = (ta.Tensor(x, requires_grad=True, dtype=np.float64) for x in (src, tgt))
    y = ours(a, b, src_key_mask=src_keep, causal=False, src_mask=src_mask, tgt_mask=tgt_mask,
             memory_mask=memory_mask, memory_key_mask=memory_keep)
    dy = rng.normal(size=y.shape)
    y.backward(dy)

    ta_, tb = torch.tensor(src, requires_grad=True), torch.tensor(tgt, requires_grad=True)
    ty = theirs(ta_, tb, src_mask=torch_mask(src_mask), tgt_mask=torch_mask(tgt_mask),
                memory_mask=torch_mask(memory_mask), src_key_padding_mask=torch.tensor(~src_keep),
                memory_key_padding_mask=torch.tensor(~memory_keep))
    ty.backward(torch.tensor(dy))

    assert_same_as_torch((y, a.grad, b.grad), (ty, ta_.grad, tb.grad), ours, theirs)


def test_a_target_mask_applies_together_with_causal():
    torch.manual_seed(2)
    ours, theirs = twins(4, 2, 1, 5, "relu", False, True)
    rng = np.random.default_rng(2)
    src, tgt = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 4, 4))
    allow = attention_mask(rng, 2, 2, 4, 4, False)
    y = ours(ta.Tensor(src, dtype=np.float64), ta.Tensor(tgt, dtype=np.float64), tgt_mask=allow, causal=True)
    both = ~allow | np.triu(np.ones((4, 4), bool), 1)                  # torch: True = not allowed
    ty = theirs(torch.tensor(src), torch.tensor(tgt), tgt_mask=torch.tensor(both))
    assert relative_error(y, ty) < RTOL


@pytest.mark.parametrize(("encoders", "decoders"), [(0, 2), (2, 0), (0, 0)])
def test_zero_layers_are_the_final_layer_norm_alone_in_values_and_gradients(encoders, decoders):
    # torch builds stacks of 0 layers but its forward reads layers[0]: the reference runs the
    # final LayerNorm by hand where a stack is empty, and torch's own stack where it is not.
    torch.manual_seed(3)
    theirs = torch.nn.Transformer(6, 2, encoders, decoders, 7, dropout=0.0, batch_first=True).double()
    ours = ta.nn.Transformer(6, 2, encoders, decoders, 7, dropout=0.0)
    for p in ours.parameters():
        p.data = p.numpy().astype(np.float64)
    ours.load_state_dict(theirs.state_dict())
    rng = np.random.default_rng(encoders + 3 * decoders)
    src, tgt = rng.normal(size=(2, 5, 6)), rng.normal(size=(2, 4, 6))
    src_keep, tgt_keep = padding(rng, 2, 5), padding(rng, 2, 4)

    a, b = (ta.Tensor(x, requires_grad=True, dtype=np.float64) for x in (src, tgt))
    y = ours(a, b, src_key_mask=src_keep, tgt_key_mask=tgt_keep)
    dy = rng.normal(size=y.shape)
    y.backward(dy)

    ta_, tb = torch.tensor(src, requires_grad=True), torch.tensor(tgt, requires_grad=True)
    if encoders:
        memory = theirs.encoder(ta_, src_key_padding_mask=torch.tensor(~src_keep))
    else:
        memory = theirs.encoder.norm(ta_)
    if decoders:
        causal = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
        ty = theirs.decoder(tb, memory, tgt_mask=causal, tgt_is_causal=True,
                            tgt_key_padding_mask=torch.tensor(~tgt_keep),
                            memory_key_padding_mask=torch.tensor(~src_keep))
    else:
        ty = theirs.decoder.norm(tb)
    ty.backward(torch.tensor(dy))

    assert relative_error(y, ty) < RTOL
    assert relative_error(b.grad, tb.grad) < RTOL
    if decoders:
        assert relative_error(a.grad, ta_.grad) < RTOL
    else:
        assert a.grad is None or not np.asarray(a.grad).any()        # the output does not read src
    torch_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        theirs_grad = torch_params[name].grad
        if theirs_grad is None:
            assert p.grad is None or not np.asarray(p.grad).any(), name
        else:
            assert relative_error(p.grad, theirs_grad) < RTOL, name


@pytest.mark.parametrize(("build", "error", "pattern"), [
    (lambda: ta.nn.Transformer(0, 1), ValueError, r"^Transformer: d_model must be >= 1, got 0$"),
    (lambda: ta.nn.Transformer(8.0, 2), TypeError, r"^Transformer: d_model must be an int, got 8.0"),
    (lambda: ta.nn.Transformer(8, 0), ValueError, r"^Transformer: nhead must be >= 1, got 0$"),
    (lambda: ta.nn.Transformer(8, 2, -1), ValueError,
     r"^Transformer: num_encoder_layers must be >= 0, got -1$"),
    (lambda: ta.nn.Transformer(8, 2, 1, True), TypeError, r"^Transformer: num_decoder_layers must be an int"),
    (lambda: ta.nn.Transformer(8, 2, dim_feedforward=0), ValueError,
     r"^Transformer: dim_feedforward must be >= 1, got 0$"),
    (lambda: ta.nn.Transformer(8, 2, dropout=1.0), ValueError,
     r"^Transformer: dropout must be a finite number in \[0.0, 1.0\), got 1.0$"),
    (lambda: ta.nn.Transformer(8, 2, dropout=-0.1), ValueError, r"^Transformer: dropout must be a finite"),
    (lambda: ta.nn.Transformer(8, 2, activation="tanh"), ValueError,
     r"^Transformer: activation must be 'relu' or 'gelu', got 'tanh'$"),
    (lambda: ta.nn.Transformer(8, 2, layer_norm_eps=0.0), ValueError,
     r"^Transformer: layer_norm_eps must be a finite number > 0.0, got 0.0$"),
    (lambda: ta.nn.Transformer(8, 2, norm_first="yes"), TypeError,
     r"^Transformer: norm_first must be True or False, got 'yes'"),
    (lambda: ta.nn.Transformer(8, 2, bias=1), TypeError, r"^Transformer: bias must be True or False, got 1"),
    (lambda: ta.nn.TransformerEncoderLayer(8, 2, dim_feedforward=-3), ValueError,
     r"^TransformerEncoderLayer: dim_feedforward must be >= 1, got -3$"),
    (lambda: ta.nn.TransformerDecoderLayer(8, 3), ValueError,
     r"^TransformerDecoderLayer: nhead=3 must divide d_model=8$"),
    (lambda: ta.nn.TransformerEncoder(ta.nn.TransformerEncoderLayer(8, 2), -1), ValueError,
     r"^TransformerEncoder: num_layers must be >= 0, got -1$"),
    (lambda: ta.nn.MultiHeadAttention(0, 1), ValueError,
     r"^MultiHeadAttention: embed_dim must be >= 1, got 0$"),
    (lambda: ta.nn.MultiHeadAttention(8, 2, kdim=0), ValueError, r"^MultiHeadAttention: kdim must be >= 1"),
])
def test_bad_constructor_arguments_name_the_class_and_the_argument(build, error, pattern):
    with pytest.raises(error, match=pattern):
        build()


# ---------------------------------------------------------------- the parts torch defines


def test_gelu_module_and_bad_approximation():
    # Values and gradients against numpy and torch: the gelu rows of tests/test_reference.py.
    x = ta.Tensor(np.linspace(-3.0, 3.0, 7))
    for approximate in ("none", "tanh"):
        assert ta.nn.GELU(approximate)(x).numpy().tolist() == F.gelu(x, approximate).numpy().tolist()
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        F.gelu(x, "erf")
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        ta.nn.GELU("erf")


@settings(deadline=None, max_examples=20)
@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2), normalized=st.lists(st.integers(2, 4),
       min_size=1, max_size=2), affine=st.sampled_from(["none", "weight", "both"]),
       offset=st.floats(-50, 50), seed=st.integers(0, 2**16))
def test_layer_norm_matches_torch(lead, normalized, affine, offset, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(normalized)
    x = rng.normal(size=tuple(lead) + shape) + offset
    params = [rng.normal(size=shape) for _ in range({"none": 0, "weight": 1, "both": 2}[affine])]
    ours = [ta.Tensor(a, dtype=np.float64, requires_grad=True) for a in [x, *params]]
    theirs = [torch.tensor(a, requires_grad=True) for a in [x, *params]]
    y = F.layer_norm(ours[0], shape, *ours[1:], eps=1e-5)
    ty = torch.nn.functional.layer_norm(theirs[0], shape, *theirs[1:], eps=1e-5)
    dy = rng.normal(size=x.shape)
    y.backward(dy)
    ty.backward(torch.tensor(dy))
    assert relative_error(y, ty) < 1e-10
    for o, t in zip(ours, theirs, strict=True):
        assert relative_error(o.grad, t.grad) < 1e-10


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [None, 0])
@pytest.mark.parametrize("smoothing", [0.1, 1.0])
def test_label_smoothing_is_torchs(reduction, ignore_index, smoothing):
    rng = np.random.default_rng(3)
    logits, target = rng.normal(size=(3, 4, 5)) * 3, rng.integers(0, 5, size=(3, 4))
    target[0, :2] = 0
    ours = ta.Tensor(logits, dtype=np.float64, requires_grad=True)
    loss = F.cross_entropy(ours, target, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=smoothing)
    theirs = torch.tensor(logits, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(
        theirs.reshape(-1, 5), torch.tensor(target).reshape(-1), reduction=reduction,
        ignore_index=-100 if ignore_index is None else ignore_index, label_smoothing=smoothing)
    expected = expected.reshape(3, 4) if reduction == "none" else expected
    dy = rng.normal(size=loss.shape)
    loss.backward(dy)
    expected.backward(torch.tensor(dy))
    assert relative_error(loss, expected) < 1e-12
    assert relative_error(ours.grad, theirs.grad) < 1e-12
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\]"):
        F.cross_entropy(ours, target, label_smoothing=1.5)
