"""ta.models.Transformer: teacher forcing, training through ``ta.models.train``, cached greedy
decoding equal to uncached decoding, positions, tied weights and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.models.transformer import sinusoids


def small(dtype="float32", **options):
    ta.manual_seed(0)
    settings = dict(d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32,
                    dropout=0.0)
    model = ta.models.Transformer(20, 23, **{**settings, **options})
    for p in model.parameters():
        p.data = p.numpy().astype(dtype)
    return model


def batch(seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, 20, size=(3, 6))
    src[0, 4:] = 0
    tgt_in = np.concatenate([np.ones((3, 1), np.int64), rng.integers(3, 23, size=(3, 4))], axis=1)
    return src, tgt_in


def test_teacher_forcing_gives_logits_and_a_loss_with_gradients():
    model = small()
    src, tgt_in = batch()
    logits, weights = model(src, tgt_in)
    assert logits.shape == (3, 5, 23) and weights is None
    loss = model.loss(src, tgt_in, tgt_in, label_smoothing=0.1)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_later_source_token_or_padding_changes_nothing_it_should_not():
    # Causal: logits at position t ignore target tokens after t; padding of the source is
    # invisible (a padded row decodes as its unpadded self).
    model = small("float64")
    src, tgt_in = batch()
    logits = model(src, tgt_in)[0].numpy()
    changed = tgt_in.copy()
    changed[:, -1] = 5
    np.testing.assert_allclose(model(src, changed)[0].numpy()[:, :-1], logits[:, :-1], rtol=1e-12)
    alone = model(src[:1, :4], tgt_in[:1])[0].numpy()
    np.testing.assert_allclose(alone, logits[:1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-6), ("float64", 1e-12)])
@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_steps_equal_running_the_whole_prefix(dtype, tol, norm_first):
    model = small(dtype, norm_first=norm_first)
    src, tgt_in = batch()
    model.eval()
    with ta.no_grad():
        memory = model.encode(src)
        full = model.transformer.decoder(model._embed(model.tgt_embed, tgt_in), memory,
                                         memory_key_mask=src != 0, causal=True).numpy()
        length = tgt_in.shape[1]
        caches = [layer.start_cache(memory, length) for layer in model.transformer.decoder.layers]
        mask = ta.Tensor((src != 0)[:, None, None, :])
        steps = [model.decoder_step(ta.Tensor(tgt_in[:, t:t + 1]), caches, mask,
                                    ta.Tensor(np.array(t, dtype=np.int64)))[0].numpy() for t in range(length)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=tol, atol=tol)
    cached, _ = model.greedy(src, max_len=8)
    uncached, _ = model.greedy(src, max_len=8, use_cache=False)
    np.testing.assert_array_equal(cached, uncached)


def test_a_cache_started_from_given_projections_keeps_them():
    """start_cache uses the keys and values it is given as they are (a compiled decode's start
    plan made them), and refuses one without the other."""
    model = small()
    src, _ = batch()
    layer = model.transformer.decoder.layers[0]
    with ta.no_grad():
        memory = model.encode(src)
        keys, values = ta.Tensor.randn(3, 4, 6, 4), ta.Tensor.randn(3, 4, 6, 4)        # (B, H, S, D)
        cache = layer.start_cache(memory, 6, keys, values)
        assert cache.memory_keys is keys and cache.memory_values is values
        assert cache.keys.shape == cache.values.shape == (3, 4, 6, 4)              # 6 slots
        with pytest.raises(ValueError, match="start_cache: give memory_keys and memory_values together"):
            layer.start_cache(memory, 6, keys)


def test_it_learns_the_reverse_task():
    task = ta.data.load("reverse")
    ta.manual_seed(0)
    model = ta.models.Transformer(task.src_vocab, task.tgt_vocab, d_model=32, nhead=4, num_encoder_layers=1,
                                  num_decoder_layers=1, dim_feedforward=64, dropout=0.0)
    history = ta.models.train(model, task, steps=200, batch_size=32, lr=3e-3)
    assert history[-1]["loss"] < 0.2 * history[0]["loss"]
    scores = ta.models.evaluate(model, task.train[:64], task.src_vocab, task.tgt_vocab)
    assert scores["exact_match"] > 0.5


def test_positions_are_the_papers_sinusoids_or_learned():
    table = sinusoids(50, 6)
    pos, i = 7, 2
    assert table[pos, 2 * i] == pytest.approx(math.sin(pos / 10000 ** (2 * i / 6)))
    assert table[pos, 2 * i + 1] == pytest.approx(math.cos(pos / 10000 ** (2 * i / 6)))
    assert sinusoids(3, 5).shape == (3, 5)
    learned = small(positions="learned")
    assert learned.state_dict()["position.weight"].shape == (512, 16)


def test_tied_embeddings_share_one_parameter():
    model = small(tie_embeddings=True)
    assert model.out.weight is model.tgt_embed.weight


def test_bad_input_says_what_is_wrong():
    with pytest.raises(ValueError, match="nhead=3 must divide d_model=16"):
        ta.models.Transformer(20, 20, d_model=16, nhead=3)
    with pytest.raises(ValueError, match="positions must be one of"):
        ta.models.Transformer(20, 20, d_model=16, nhead=4, positions="rotary")
    model = small(max_len=4)
    src, tgt_in = batch()
    with pytest.raises(ta.ShapeError, match=r"longer than the position table \(max_len=4\)"):
        model(src, tgt_in)
    with pytest.raises(ta.ShapeError, match="differ in batch size"):
        small()(src, tgt_in[:2])


def test_every_layer_and_head_weights_from_the_fast_path():
    """need_weights=True leaves the logits as they are and gives each sublayer's per-head
    weights: rows that sum to one over what they may see, zero on padding and the future."""
    model = small("float64")
    src, tgt_in = batch()
    tgt_in[2, 3:] = 0                                     # a padded target row
    model.eval()
    plain, none = model(src, tgt_in)
    logits, weights = model(src, tgt_in, need_weights=True)
    assert none is None
    np.testing.assert_array_equal(logits.numpy(), plain.numpy())
    assert list(weights) == ["encoder/layer0/self_attention", "encoder/layer1/self_attention",
                             "decoder/layer0/self_attention", "decoder/layer0/cross_attention",
                             "decoder/layer1/self_attention", "decoder/layer1/cross_attention"]
    (B, S), T = src.shape, tgt_in.shape[1]
    for name, w in weights.items():
        keys = S if name.startswith("encoder") or name.endswith("cross_attention") else T
        assert w.shape == (B, 4, S if name.startswith("encoder") else T, keys)
        np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-12)
        real = (src if keys == S else tgt_in) != 0
        assert np.all(w[~np.broadcast_to(real[:, None, None, :], w.shape)] == 0)
    assert np.all(np.triu(weights["decoder/layer1/self_attention"], k=1) == 0)


def test_the_weights_are_what_the_slow_path_computes():
    """The encoder's first layer by hand: its multi-head attention with need_weights=True
    (softmax in the graph) gives the weights the fused path's record rebuilt."""
    model = small("float64")
    src, tgt_in = batch()
    model.eval()
    _, weights = model(src, tgt_in, need_weights=True)
    with ta.no_grad():
        x = model._embed(model.src_embed, src)
        attention = model.transformer.encoder.layers[0].self_attn
        _, slow = attention(x, x, x, key_mask=src != 0, average_weights=False)
    np.testing.assert_allclose(weights["encoder/layer0/self_attention"], slow.numpy(), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("use_cache", [True, False])
def test_decoding_attention_is_the_teacher_forced_cross_attention(use_cache):
    """The attention greedy returns is the last layer's cross-attention averaged over heads,
    as teacher forcing the decoded tokens gives it."""
    model = small("float64")
    src, _ = batch()
    ids, attention = model.greedy(src[:1], max_len=6, use_cache=use_cache)
    tgt_in = np.concatenate([[[1]], ids[:, :-1]], axis=1)
    _, weights = model(src[:1], tgt_in, need_weights=True)
    stacked = model.layer_attention(weights)                                # (layers, 1, H, T, S)
    assert stacked.shape[:3] == (2, 1, 4)
    np.testing.assert_array_equal(model.layer_attention(weights, "encoder/self_attention")[0],
                                  weights["encoder/layer0/self_attention"])
    want = stacked[-1].mean(axis=1)
    np.testing.assert_allclose(attention, want, rtol=1e-10, atol=1e-14)


def test_beam_search_of_one_is_greedy_and_the_cache_changes_nothing():
    model = small("float64")
    src, _ = batch()
    greedy_ids, greedy_attention = model.greedy(src, max_len=7)
    beam_ids, beam_attention = model.beam_search(src, beam=1, max_len=7, length_penalty=0.0)
    width = beam_ids.shape[1]
    np.testing.assert_array_equal(beam_ids, greedy_ids[:, :width])
    np.testing.assert_allclose(beam_attention, greedy_attention[:, :width], rtol=1e-12)
    cached = model.beam_search(src, beam=3, max_len=7, coverage_penalty=0.2)
    uncached = model.beam_search(src, beam=3, max_len=7, coverage_penalty=0.2, use_cache=False)
    np.testing.assert_array_equal(cached[0], uncached[0])
    np.testing.assert_allclose(cached[1], uncached[1], rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- constructor arguments


@pytest.mark.parametrize(("change", "error", "pattern"), [
    (dict(d_model=0), ValueError, r"d_model must be >= 1, got 0$"),
    (dict(d_model=16.0), TypeError, r"d_model must be an int, got 16.0"),
    (dict(nhead=0), ValueError, r"nhead must be >= 1, got 0$"),
    (dict(nhead=3), ValueError, r"nhead=3 must divide d_model=16$"),
    (dict(num_encoder_layers=-1), ValueError, r"num_encoder_layers must be >= 0, got -1$"),
    (dict(num_decoder_layers=1.5), TypeError, r"num_decoder_layers must be an int, got 1.5"),
    (dict(dim_feedforward=0), ValueError, r"dim_feedforward must be >= 1, got 0$"),
    (dict(dropout=1.0), ValueError, r"dropout must be a finite number in \[0.0, 1.0\), got 1.0$"),
    (dict(dropout="0.1"), TypeError, r"dropout must be a number, got str$"),
    (dict(activation="swish"), ValueError, r"activation must be 'relu' or 'gelu', got 'swish'$"),
    (dict(norm_first=None), TypeError, r"norm_first must be True or False, got None"),
    (dict(positions="rotary"), ValueError,
     r"positions must be one of \('sinusoidal', 'learned'\), got 'rotary'$"),
    (dict(max_len=-1), ValueError, r"max_len must be >= 1, got -1$"),
    (dict(max_len=0), ValueError, r"max_len must be >= 1, got 0$"),
    (dict(max_len=12.0), TypeError, r"max_len must be an int, got 12.0"),
    (dict(tie_embeddings="yes"), TypeError, r"tie_embeddings must be True or False, got 'yes'"),
    (dict(src_vocab=2), ValueError, r"src_vocab must hold at least the 4 reserved ids"),
    (dict(tgt_vocab=20.0), TypeError, r"tgt_vocab must be an int or a ta.data.Vocab, got 20.0"),
])
def test_every_bad_constructor_argument_is_one_line_naming_the_transformer_and_it(change, error, pattern):
    arguments = dict(src_vocab=20, tgt_vocab=20, d_model=16, nhead=4) | change
    with pytest.raises(error, match=rf"^Transformer: {pattern}") as caught:
        ta.models.Transformer(**arguments)
    assert "\n" not in str(caught.value)


# ---------------------------------------------------------------- zero layers


ZERO_LAYERS = [(0, 2), (2, 0), (0, 0)]


@pytest.mark.parametrize(("encoders", "decoders"), ZERO_LAYERS)
def test_zero_layers_train_and_record_weights(encoders, decoders):
    model = small("float64", num_encoder_layers=encoders, num_decoder_layers=decoders)
    src, tgt_in = batch()
    optimizer = ta.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = model.loss(src, tgt_in, tgt_in)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    logits, weights = model(src, tgt_in, need_weights=True)
    assert logits.shape == (3, 5, 23)
    expected = [f"encoder/layer{i}/self_attention" for i in range(encoders)]
    for i in range(decoders):
        expected += [f"decoder/layer{i}/self_attention", f"decoder/layer{i}/cross_attention"]
    assert sorted(weights) == sorted(expected)
    if decoders:
        assert model.layer_attention(weights).shape == (decoders, 3, 4, 5, 6)
    else:
        assert model.attention_kind is None
        with pytest.raises(ValueError, match=r"layer_attention: the decoder has 0 layers, so no cross_"):
            model.layer_attention(weights)


@pytest.mark.parametrize(("encoders", "decoders"), ZERO_LAYERS)
def test_zero_layers_decode_cached_and_uncached_as_teacher_forcing_scores_them(encoders, decoders):
    model = small("float64", num_encoder_layers=encoders, num_decoder_layers=decoders)
    src, _ = batch()
    cached = model.greedy(src, max_len=6, hypotheses=True)
    uncached = model.greedy(src, max_len=6, hypotheses=True, use_cache=False)
    assert [h.tokens for h in cached] == [h.tokens for h in uncached]
    for row, h in enumerate(cached):
        tgt_in = np.array([[1, *h.tokens[:-1]]])
        with ta.no_grad():
            logits, _ = model(src[row : row + 1], tgt_in)
        log_probs = ta.models.decoding.log_softmax(logits.numpy())[0]
        assert log_probs[np.arange(len(h.tokens)), h.tokens].sum() == pytest.approx(h.log_prob, rel=1e-12)
        assert h.log_prob == pytest.approx(uncached[row].log_prob, rel=1e-12)
        assert (h.attention is None) == (decoders == 0)
    nbest = model.beam_search(src, beam=3, max_len=6, n_best=2, average_weights=False)
    for h in (h for found in nbest for h in found):
        expected = None if not decoders else (decoders, 4, len(h.tokens), 6)
        assert (None if h.attention is None else h.attention.shape) == expected
    ids, attention = model.beam_search(src, beam=3, max_len=6, use_cache=False)
    assert ids.shape[0] == 3 and (attention is None) == (decoders == 0)
    if not decoders:
        with pytest.raises(ValueError, match="coverage_penalty needs a model with attention"):
            model.beam_search(src, coverage_penalty=0.2)
