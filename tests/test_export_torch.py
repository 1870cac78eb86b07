"""The torch twins of ta.models (``tinygrad_attn.export.torch``) against the engine, float64:
teacher-forced logits to 1e-8 relative and every parameter's gradient, under a random
cotangent on every logit, for each configuration the models support, with padding in the
batch; the round trip engine -> torch -> engine; and clear errors for what a twin cannot do.

Required in CI (``TINYGRAD_ATTN_REQUIRE_EXTRAS=1``): skipped only where PyTorch is missing.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinygrad_attn as ta
from tests import optional
from tinygrad_attn import Tensor

torch = optional.module("torch", optional.TORCH_REASON)
export_torch = optional.module("tinygrad_attn.export.torch", optional.TORCH_REASON)

RTOL = 1e-8
SRC_VOCAB, TGT_VOCAB = 11, 9


def padded_batch(seed: int = 0):
    """src (3, 5) and tgt_in / tgt_out (3, 4), right-padded, rows of different lengths."""
    rng = np.random.default_rng(seed)
    src = rng.integers(3, SRC_VOCAB, (3, 5))
    src[1, 3:] = 0
    src[2, 2:] = 0
    tgt = rng.integers(3, TGT_VOCAB, (3, 4))
    tgt[1, 2:] = 0
    tgt[2, 3:] = 0
    tgt_in = np.concatenate([np.ones((3, 1), dtype=np.int64), tgt[:, :-1]], axis=1)
    return src, tgt_in, tgt


def assert_twins_agree(model, src, tgt_in, seed: int = 1) -> None:
    """The float64 engine model and its float64 twin: equal logits, equal gradients."""
    model.double()
    twin = model.to_torch(torch.float64)
    logits, _ = model(src, tgt_in)
    theirs = twin(torch.from_numpy(src), torch.from_numpy(tgt_in))
    np.testing.assert_allclose(theirs.detach().numpy(), logits.numpy(), rtol=RTOL, atol=1e-12)
    cotangent = np.random.default_rng(seed).standard_normal(logits.shape)
    (logits * Tensor(cotangent, dtype=np.float64)).sum().backward()
    (theirs * torch.from_numpy(cotangent)).sum().backward()
    grads = {name: p.grad for name, p in twin.named_parameters()}
    ours = dict(model.named_parameters())
    assert sorted(grads) == sorted(ours)
    for name, p in ours.items():
        if grads[name] is None:          # a parameter the logits do not read (a decoder of no layers)
            assert p.grad is None or not np.any(p.grad.numpy()), name
            continue
        expected = grads[name].numpy()
        np.testing.assert_allclose(p.grad.numpy(), expected, rtol=RTOL, atol=1e-10 * np.abs(expected).max(),
                                   err_msg=name)


def seq2seq_configurations():
    """Every cell x score x style; layers and the encoder's directions alternate so each
    score meets 1 and 2 layers, uni- and bidirectional ('dot' needs one direction)."""
    for i, (cell, attention, style) in enumerate(itertools.product(
            ("gru", "lstm", "rnn"), ("additive", "general", "concat", "dot", None), ("bahdanau", "luong"))):
        layers, bidirectional = 1 + i % 2, (i // 2) % 2 == 1 and attention != "dot"
        yield pytest.param(dict(cell=cell, attention=attention, style=style, num_layers=layers,
                                bidirectional=bidirectional),
                           id=f"{cell}-{attention}-{style}-l{layers}{'-bi' if bidirectional else ''}")


@pytest.mark.parametrize("config", list(seq2seq_configurations()))
def test_seq2seq_twin_logits_and_gradients_equal_the_engines(config):
    ta.manual_seed(0)
    model = ta.models.Seq2Seq(SRC_VOCAB, TGT_VOCAB, embed=6, hidden=5, attn_dim=4, **config)
    src, tgt_in, _ = padded_batch()
    assert_twins_agree(model, src, tgt_in)


def test_seq2seq_twin_gives_an_all_padding_source_the_engines_zeros():
    """A source with no token: the engine leaves its state at zero and attends to nothing;
    packing (which needs a length >= 1) must not leak the one step it runs."""
    ta.manual_seed(1)
    model = ta.models.Seq2Seq(SRC_VOCAB, TGT_VOCAB, embed=6, hidden=5, cell="lstm", attention="additive",
                              bidirectional=True, num_layers=2)
    src, tgt_in, _ = padded_batch()
    src[2] = 0
    assert_twins_agree(model, src, tgt_in)


TRANSFORMER_CONFIGURATIONS = [
    pytest.param(dict(norm_first=norm_first, activation=activation, positions=positions, tie_embeddings=tie),
                 id=f"{'pre' if norm_first else 'post'}-{activation}-{positions}{'-tied' if tie else ''}")
    for norm_first, activation, positions, tie in itertools.product(
        (False, True), ("relu", "gelu"), ("sinusoidal", "learned"), (False, True))]


@pytest.mark.parametrize("config", TRANSFORMER_CONFIGURATIONS)
def test_transformer_twin_logits_and_gradients_equal_the_engines(config):
    ta.manual_seed(0)
    model = ta.models.Transformer(SRC_VOCAB, TGT_VOCAB, d_model=8, nhead=2, num_encoder_layers=1,
                                  num_decoder_layers=2, dim_feedforward=12, dropout=0.0, max_len=16, **config)
    src, tgt_in, _ = padded_batch()
    assert_twins_agree(model, src, tgt_in)


@pytest.mark.parametrize("layers", [(0, 2), (2, 0), (0, 0)], ids=["no-encoder", "no-decoder", "neither"])
def test_transformer_twin_of_zero_layers_equals_the_engine(layers):
    """A stack of zero layers is its final LayerNorm alone, in the engine and in the twin."""
    ta.manual_seed(0)
    model = ta.models.Transformer(SRC_VOCAB, TGT_VOCAB, d_model=8, nhead=2, num_encoder_layers=layers[0],
                                  num_decoder_layers=layers[1], dim_feedforward=12, dropout=0.0, max_len=16)
    src, tgt_in, _ = padded_batch()
    assert_twins_agree(model, src, tgt_in)
    back = ta.models.Transformer.from_torch(model.to_torch())
    assert back.config == model.config
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[name], value, err_msg=name)


def transformer_model(positions: str = "sinusoidal") -> ta.models.Transformer:
    return ta.models.Transformer(SRC_VOCAB, TGT_VOCAB, d_model=8, nhead=2, num_encoder_layers=1,
                                 num_decoder_layers=2, dim_feedforward=12, dropout=0.0, max_len=16,
                                 positions=positions)


@pytest.mark.parametrize("build", [
    lambda: ta.models.Seq2Seq(SRC_VOCAB, TGT_VOCAB, embed=6, hidden=5, attention="additive"),
    transformer_model,
], ids=["seq2seq", "transformer"])
def test_twin_dtype_follows_the_models_and_float64_logits_agree_to_1e12(build):
    ta.manual_seed(7)
    model = build()
    assert {p.dtype for p in model.to_torch().parameters()} == {torch.float32}
    model.astype(np.float64)
    twin = model.to_torch()
    assert {p.dtype for p in twin.parameters()} == {torch.float64}
    src, tgt_in, _ = padded_batch()
    logits, _ = model(src, tgt_in)
    theirs = twin(torch.from_numpy(src), torch.from_numpy(tgt_in)).detach().numpy()
    np.testing.assert_allclose(theirs, logits.numpy(), rtol=1e-12, atol=1e-12)
    assert {p.dtype for p in model.to_torch(torch.float32).parameters()} == {torch.float32}
    with pytest.raises(TypeError, match="to_torch: dtype must be a torch floating dtype"):
        model.to_torch(np.float64)


def test_a_float32_twin_made_float64_adds_the_engines_float64_sinusoids():
    """``.double()`` (or ``.to(torch.float64)``) casts the table from float64, not from the
    float32 buffer: the twin then gives the float64 engine's logits to 1e-12."""
    ta.manual_seed(8)
    model = transformer_model().astype(np.float64)
    exact = torch.from_numpy(model._sinusoids)
    for widen in (lambda twin: twin.double(), lambda twin: twin.to(torch.float64)):
        twin = widen(model.to_torch(torch.float32))
        assert twin.sinusoids.dtype == torch.float64 and torch.equal(twin.sinusoids, exact)
        twin.load_state_dict(model.to_torch().state_dict())               # the float64 weights
        src, tgt_in, _ = padded_batch()
        logits, _ = model(src, tgt_in)
        theirs = twin(torch.from_numpy(src), torch.from_numpy(tgt_in)).detach().numpy()
        np.testing.assert_allclose(theirs, logits.numpy(), rtol=1e-12, atol=1e-12)
    back = model.to_torch().float()
    assert torch.equal(back.sinusoids, exact.float())


def test_twins_compute_the_engines_loss_and_keep_its_mode():
    """``loss`` is the engine's (padding ignored); float32 is the default; eval mode carries."""
    ta.manual_seed(2)
    model = ta.models.Seq2Seq(SRC_VOCAB, TGT_VOCAB, embed=6, hidden=5, dropout=0.3).eval()
    twin = model.to_torch()
    assert not twin.training and next(twin.parameters()).dtype == torch.float32
    src, tgt_in, tgt_out = padded_batch()
    mine = model.loss(src, tgt_in, tgt_out).item()
    theirs = twin.loss(*(torch.from_numpy(a) for a in (src, tgt_in, tgt_out))).item()
    assert abs(mine - theirs) <= 1e-5 * abs(mine)


@pytest.mark.parametrize("build", [
    lambda: ta.models.Seq2Seq(SRC_VOCAB, TGT_VOCAB, embed=6, hidden=5, cell="lstm", bidirectional=True,
                              num_layers=2, attention="concat", style="luong"),
    lambda: ta.models.Transformer(SRC_VOCAB, TGT_VOCAB, d_model=8, nhead=2, num_encoder_layers=1,
                                  num_decoder_layers=1, dim_feedforward=12, positions="learned",
                                  tie_embeddings=True, max_len=16),
], ids=["seq2seq", "transformer"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_round_trip_engine_torch_engine_keeps_the_state_dict(build, dtype):
    ta.manual_seed(3)
    model = build().astype(dtype)
    back = type(model).from_torch(model.to_torch(getattr(torch, dtype)))
    assert type(back) is type(model) and back.config == model.config
    mine, theirs = model.state_dict(), back.state_dict()
    assert list(theirs) == list(mine)
    for name, value in mine.items():
        assert theirs[name].dtype == value.dtype and np.array_equal(theirs[name], value), name


def test_a_trained_twin_loads_back_and_decodes_as_torch_does():
    """A few torch optimizer steps, then the engine model from the twin: its state_dict loads
    from the twin's (untied) state_dict too, and both decode greedily to the same ids."""
    ta.manual_seed(4)
    model = ta.models.Seq2Seq(SRC_VOCAB, TGT_VOCAB, embed=6, hidden=8, attention="general", style="luong")
    twin = model.to_torch()
    optimizer = torch.optim.Adam(twin.parameters(), lr=0.05)
    src, tgt_in, tgt_out = padded_batch()
    for _ in range(3):
        optimizer.zero_grad()
        twin.loss(*(torch.from_numpy(a) for a in (src, tgt_in, tgt_out))).backward()
        optimizer.step()
    back = ta.models.Seq2Seq.from_torch(twin)
    loaded = ta.models.Seq2Seq(**model.config)
    loaded.load_state_dict(twin.state_dict())
    np.testing.assert_array_equal(loaded.out.weight.numpy(), back.out.weight.numpy())
    ids, _ = back.greedy(src, max_len=6)
    np.testing.assert_array_equal(export_torch.greedy(twin, src, max_len=6), ids)


def test_transformer_twin_decodes_greedily_as_the_engine():
    ta.manual_seed(5)
    model = ta.models.Transformer(SRC_VOCAB, TGT_VOCAB, d_model=8, nhead=2, num_encoder_layers=1,
                                  num_decoder_layers=1, dim_feedforward=12, max_len=16).eval()
    src, _, _ = padded_batch()
    ids, _ = model.greedy(src, max_len=6)
    np.testing.assert_array_equal(export_torch.greedy(model.to_torch(), src, max_len=6), ids)


def test_what_a_twin_cannot_do_raises_a_clear_error():
    ta.manual_seed(6)
    model = ta.models.Seq2Seq(SRC_VOCAB, TGT_VOCAB, embed=6, hidden=5)
    twin = model.to_torch()
    src, tgt_in, _ = padded_batch()
    src[0, 1] = 0                                         # padding inside a source
    with pytest.raises(ValueError, match="right-padded"):
        twin(torch.from_numpy(src), torch.from_numpy(tgt_in))
    with pytest.raises(TypeError, match="to_torch"):
        ta.models.Seq2Seq.from_torch(torch.nn.GRU(4, 4))
    transformer = ta.models.Transformer(SRC_VOCAB, TGT_VOCAB, d_model=8, nhead=2, num_encoder_layers=1,
                                        num_decoder_layers=1, dim_feedforward=12, max_len=4)
    with pytest.raises(TypeError, match="twin of a Transformer"):
        ta.models.Seq2Seq.from_torch(transformer.to_torch())
    with pytest.raises(ValueError, match="max_len=4"):
        transformer.to_torch()(torch.ones(1, 5, dtype=torch.long), torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="Seq2Seq or ta.models.Transformer"):
        export_torch.to_torch(ta.nn.Linear(3, 3))
    model.decoder = ta.nn.GRU(6, 5, num_layers=2)         # no longer what the config builds
    with pytest.raises(ValueError, match="not the ones its config builds"):
        model.to_torch()


def test_ddp_example_continues_an_engine_run_and_loads_back(tmp_path):
    """examples/ddp.py --quick: an engine checkpoint, a few DistributedDataParallel steps (gloo,
    a group of one), the loss falling from where the engine stopped, and the result back in
    the engine decoding as the twin does."""
    example = Path(__file__).resolve().parents[1] / "examples" / "ddp.py"
    done = subprocess.run([sys.executable, str(example), "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "ddp_results.json").read_text())
    assert result["world_size"] == 1 and result["decodes_same"]
    assert abs(result["start_held_out_loss"] - result["engine_held_out_loss"]) < 1e-4
    assert result["end_held_out_loss"] < result["start_held_out_loss"]
    model, _ = ta.models.load_checkpoint(tmp_path / "ddp.ckpt")
    assert isinstance(model, ta.models.Seq2Seq)
