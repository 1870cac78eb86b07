"""ta.models.Seq2Seq: every configuration runs and trains, padding changes nothing, the
Bahdanau and Luong wirings equal the same models written in PyTorch, greedy and beam search
agree with teacher forcing and with exhaustive search, and a small model learns to copy."""

import itertools

import numpy as np
import pytest

import tinygrad_attn as ta
from tests import optional
from tinygrad_attn import nn
from tinygrad_attn.functional import cross_entropy
from tinygrad_attn.models.seq2seq import END, PAD, START

V = 9


def _batch(rng, batch=3, src_len=5, tgt_len=4):
    src = rng.integers(3, V, (batch, src_len))
    src[0, 3:] = PAD                                       # one padded row
    tgt_in = np.concatenate([np.full((batch, 1), START), rng.integers(3, V, (batch, tgt_len - 1))], 1)
    return src, tgt_in


CONFIGS = [
    dict(cell=cell, attention=attention, style=style)
    for cell, attention, style in itertools.product(
        ["rnn", "gru", "lstm"], ["dot", "general", "concat", "additive", None], ["bahdanau", "luong"])
    if not (attention is None and style == "luong")
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_every_configuration_gives_shapes_masked_weights_and_gradients(config):
    ta.manual_seed(0)
    model = ta.models.Seq2Seq(V, V + 2, embed=4, hidden=6, **config)
    src, tgt_in = _batch(np.random.default_rng(0))
    logits, weights = model(src, tgt_in)
    assert logits.shape == (3, 4, V + 2)
    if config["attention"] is None:
        assert weights is None
    else:
        w = weights.numpy()
        assert w.shape == (3, 4, 5)
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
        assert np.all(w[0, :, 3:] == 0)                   # padding gets no attention
    cross_entropy(logits, np.roll(tgt_in, -1, axis=1), ignore_index=PAD).backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert missing == []


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_a_source_changes_nothing(cell, bidirectional):
    ta.manual_seed(1)
    model = ta.models.Seq2Seq(V, V, embed=4, hidden=6, cell=cell, attention="general",
                              bidirectional=bidirectional, num_layers=2).double()
    rng = np.random.default_rng(1)
    src, tgt_in = _batch(rng, batch=2, src_len=4)
    src[0, 3:] = rng.integers(3, V)                       # no padding in this batch
    padded = np.concatenate([src, np.zeros((2, 3), np.int64)], axis=1)
    logits, weights = model(src, tgt_in)
    logits_p, weights_p = model(padded, tgt_in)
    np.testing.assert_allclose(logits_p.numpy(), logits.numpy(), atol=1e-12)
    np.testing.assert_allclose(weights_p.numpy()[..., :4], weights.numpy(), atol=1e-12)


def test_greedy_agrees_with_teacher_forcing_on_its_own_output():
    ta.manual_seed(2)
    model = ta.models.Seq2Seq(V, V, embed=5, hidden=7, attention="additive").double()
    src, _ = _batch(np.random.default_rng(2))
    ids, weights = model.greedy(src, max_len=6)
    tgt_in = np.concatenate([np.full((3, 1), START), ids[:, :-1]], axis=1)
    logits, tf_weights = model(src, tgt_in)
    allowed = logits.numpy().copy()
    allowed[..., [PAD, START]] = -np.inf                 # decoding never produces these
    for row in range(3):
        length = list(ids[row]).index(END) + 1 if END in ids[row] else ids.shape[1]
        np.testing.assert_array_equal(allowed[row, :length].argmax(-1), ids[row, :length])
        np.testing.assert_allclose(weights[row, :length], tf_weights.numpy()[row, :length], atol=1e-12)
        assert np.all(ids[row, length:] == PAD) and np.all(weights[row, length:] == 0)


def _sequence_logp(model, src_row, tokens) -> float:
    """log P(tokens | src): the model's own log-softmax, teacher-forced, at each token."""
    tgt_in = np.array([[START] + list(tokens[:-1])])
    logits, _ = model(src_row, tgt_in)
    log_probs = ta.models.decoding.log_softmax(logits.numpy()[0])
    return float(sum(log_probs[i, t] for i, t in enumerate(tokens)))


@pytest.mark.parametrize("style", ["bahdanau", "luong"])
def test_beam_search_as_wide_as_the_space_finds_the_most_likely_output(style):
    vocab, max_len = 6, 3
    ta.manual_seed(3)
    model = ta.models.Seq2Seq(vocab, vocab, embed=3, hidden=4, attention="dot", style=style).double()
    with ta.no_grad():
        model.out.bias.data[END] += 1.0                  # make ending early a real contender
    src = np.array([[3, 4, 3]])
    tokens = [t for t in range(vocab) if t not in (PAD, START)]
    candidates = [seq for n in range(1, max_len + 1) for seq in itertools.product(tokens, repeat=n)
                  if (seq[-1] == END or n == max_len) and END not in seq[:-1]]
    with ta.no_grad():
        best = max(candidates, key=lambda seq: _sequence_logp(model, src, seq))
    ids, _ = model.beam_search(src, beam=len(candidates), max_len=max_len, length_penalty=0.0)
    assert tuple(ids[0][: len(best)]) == best


@pytest.mark.parametrize("seed,cell,attention,end_bias", [
    (4, "lstm", "concat", 0.0), (1, "gru", "additive", 0.0), (0, "gru", "additive", 0.5),
    (2, "gru", "additive", 0.4)])
def test_beam_of_one_without_penalties_is_greedy(seed, cell, attention, end_bias):
    # end_bias makes <end> a close runner-up: an ending outside the beam must not be kept.
    ta.manual_seed(seed)
    model = ta.models.Seq2Seq(V, V, embed=5, hidden=7, cell=cell, attention=attention).double()
    with ta.no_grad():
        model.out.bias.data[END] += end_bias
    src = np.random.default_rng(seed).integers(3, V, (2, 5))
    greedy_ids, greedy_w = model.greedy(src, max_len=6)
    beam_ids, beam_w = model.beam_search(src, beam=1, max_len=6, length_penalty=0.0)
    np.testing.assert_array_equal(beam_ids, greedy_ids)
    np.testing.assert_allclose(beam_w, greedy_w, atol=1e-12)


def test_wu_et_al_scores_by_hand():
    from tinygrad_attn.models.decoding import coverage_of, length_penalty_of

    attention = np.array([[0.5, 0.5, 0.0], [0.7, 0.1, 0.2]])                 # 2 outputs, 3 sources
    real = np.array([[True, True, False]])
    assert -2.0 / length_penalty_of(3, 1.0) == pytest.approx(-2.0 / (8 / 6))
    assert length_penalty_of(3, 0.0) == 1.0
    # coverage of source 0: min(1.2, 1) -> log 1 = 0; of source 1: 0.6 -> log 0.6; source 2 is padding
    summed = attention.sum(axis=0, keepdims=True)
    assert coverage_of(summed, real, 0.5)[0] == pytest.approx(0.5 * np.log(0.6))
    assert coverage_of(summed, real, 0.0)[0] == 0.0


def test_decoding_never_produces_pad_or_start():
    ta.manual_seed(5)
    model = ta.models.Seq2Seq(V, V, embed=4, hidden=6, attention="dot")
    with ta.no_grad():
        model.out.bias.data[[PAD, START]] += 50.0       # the model would pick them everywhere
    src = np.array([[3, 4, 5]])
    for ids in (model.greedy(src, max_len=4)[0], model.beam_search(src, beam=2, max_len=4)[0]):
        row = list(ids[0])
        produced = row[: row.index(END) + 1] if END in row else row
        assert len(produced) >= 1 and not set(produced) & {PAD, START}


def test_coverage_penalty_needs_attention():
    model = ta.models.Seq2Seq(V, V, embed=4, hidden=6, attention=None)
    with pytest.raises(ValueError, match="coverage_penalty needs a model with attention"):
        model.beam_search(np.array([[3, 4]]), coverage_penalty=0.5)


def test_decoding_restores_training_mode_and_records_no_graph():
    model = ta.models.Seq2Seq(V, V, embed=4, hidden=6, dropout=0.1)
    recorded = []
    original = model._step

    def spy(*args):
        result = original(*args)
        recorded.append(result[0].node)                 # the top state's graph record
        return result

    model._step = spy
    model.greedy(np.array([[3, 4]]), max_len=3)
    assert model.training
    assert recorded and all(node is None for node in recorded)
    with pytest.raises(ValueError, match="greedy: max_len must be >= 1"):
        model.greedy(np.array([[3, 4]]), max_len=0)


# ---------------------------------------------------------------- against PyTorch


def _torch_reference(model, src, tgt_in, torch):
    """The model's math written directly in PyTorch, reading the engine's weights."""
    p = {name: torch.tensor(value) for name, value in model.state_dict().items()}
    F = torch.nn.functional
    style, kind = model.style, model.attention_kind
    src_t, tgt_t = torch.tensor(src), torch.tensor(tgt_in)
    mask = src_t != PAD
    gru = torch.nn.GRU(4, 6, batch_first=True).double()
    gru.load_state_dict({k[len("encoder."):]: v for k, v in p.items() if k.startswith("encoder.")})
    packed = torch.nn.utils.rnn.pack_padded_sequence(F.embedding(src_t, p["src_embed.weight"]),
                                                     mask.sum(1), batch_first=True, enforce_sorted=False)
    keys, h_n = gru(packed)
    keys, _ = torch.nn.utils.rnn.pad_packed_sequence(keys, batch_first=True, total_length=src.shape[1])
    s = h_n[0]

    def cell(x, h):
        return torch.gru_cell(x, h, p["decoder.weight_ih_l0"], p["decoder.weight_hh_l0"],
                              p["decoder.bias_ih_l0"], p["decoder.bias_hh_l0"])

    def attend(query):
        if kind == "additive":
            projected = (query @ p["attention.W_q"].T)[:, None] + keys @ p["attention.W_k"].T
            scores = torch.tanh(projected) @ p["attention.v"]
        else:                                              # general: s^T W h
            scores = ((query @ p["attention.W"])[:, None] * keys).sum(-1)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
        return (weights[:, :, None] * keys).sum(1), weights

    logits, all_weights = [], []
    for t in range(tgt_in.shape[1]):
        y = F.embedding(tgt_t[:, t], p["tgt_embed.weight"])
        if style == "bahdanau":
            context, weights = attend(s)                   # the previous state scores
            s = cell(torch.cat([y, context], -1), s)
            feature = torch.cat([s, context], -1)
        else:
            s = cell(y, s)
            context, weights = attend(s)                   # the current state scores
            feature = torch.tanh(torch.cat([context, s], -1) @ p["attention_vector.W_c.weight"].T)
        logits.append(feature @ p["out.weight"].T + p["out.bias"])
        all_weights.append(weights)
    return torch.stack(logits, 1), torch.stack(all_weights, 1)


@pytest.mark.parametrize("style,attention", [("bahdanau", "additive"), ("luong", "general")])
def test_model_equals_the_papers_wiring_written_in_torch(style, attention):
    torch = optional.module("torch", optional.TORCH_REASON)
    ta.manual_seed(5)
    model = ta.models.Seq2Seq(V, V, embed=4, hidden=6, attention=attention, style=style).double()
    src, tgt_in = _batch(np.random.default_rng(5))
    logits, weights = model(src, tgt_in)
    with torch.no_grad():
        t_logits, t_weights = _torch_reference(model, src, tgt_in, torch)
    np.testing.assert_allclose(logits.numpy(), t_logits.numpy(), atol=1e-10)
    np.testing.assert_allclose(weights.numpy(), t_weights.numpy(), atol=1e-10)


# ---------------------------------------------------------------- learning, checkpoints, checks


def test_copy_length_5_is_learned_above_90_percent():
    task = ta.data.load("copy", length=5, n_train=2000, n_test=100, seed=0)
    ta.manual_seed(0)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=16, hidden=48, attention="additive")
    history = ta.models.train(model, task, steps=250, batch_size=32, lr=1e-2, seed=0)
    assert np.mean([r["loss"] for r in history[-20:]]) < 0.5 * np.mean([r["loss"] for r in history[:20]])
    metrics = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
    assert metrics["token_error_rate"] < 0.1, metrics


def test_checkpoint_round_trip_decodes_the_same(tmp_path):
    task = ta.data.load("copy", length=4, n_train=50, n_test=10, seed=1)
    ta.manual_seed(6)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=4, hidden=8, cell="lstm",
                              attention="concat", style="luong", bidirectional=True)
    path = tmp_path / "copy.ckpt"
    ta.models.save_checkpoint(path, model, task, step=7)
    loaded, info = ta.models.load_checkpoint(path)
    assert loaded.config == model.config and info.extras == {"step": 7} and info.name == "copy"
    src = ta.data.encode_batch([s for s, _ in task.test], task.src_vocab)
    np.testing.assert_array_equal(loaded.greedy(src, 6)[0], model.greedy(src, 6)[0])
    text, source, tokens, attention = ta.models.translate(loaded, task.detokenize(task.test[0][0]), info)
    assert attention.shape == (len(tokens) + (END in loaded.greedy(src[:1], 50)[0][0]), len(source))
    ta.save({"not": "a checkpoint"}, tmp_path / "other.npz")
    with pytest.raises(ta.SerializationError, match="not a seq2seq checkpoint"):
        ta.models.load_checkpoint(tmp_path / "other.npz")


def test_nodes_carry_the_seeds_scopes():
    model = ta.models.Seq2Seq(V, V, embed=4, hidden=6, attention="additive", bidirectional=True)
    src, tgt_in = _batch(np.random.default_rng(7))
    logits, _ = model(src, tgt_in)
    scopes = {t.node.scope for t in ta.autograd.toposort(logits) if t.node is not None}
    assert {"encoder/t3", "encoder/t3/reverse", "decoder/t2"} <= scopes
    assert "decoder/t2/attention/additive_attention" in scopes
    assert not any(s.startswith("decoder/t4") for s in scopes)


@pytest.mark.parametrize("cell,style", [("gru", "bahdanau"), ("lstm", "luong")])
def test_a_tiny_model_passes_the_finite_difference_check(cell, style):
    # The whole model in float64 against central differences (the symbolic check of a
    # Bahdanau step runs in test_cli.py's `verify`: sympy on a whole unrolled model is slow).
    ta.manual_seed(8)
    model = ta.models.Seq2Seq(5, 5, embed=2, hidden=3, cell=cell, attention="additive", style=style,
                              bidirectional=True).double()
    src, tgt_in = np.array([[3, 4, 0], [4, 4, 3]]), np.array([[START, 3], [START, 4]])
    report = ta.check.gradcheck(lambda: model.loss(src, tgt_in, np.array([[3, END], [4, END]])))
    assert report.ok, report
    assert len(report.inputs) == len(model.parameters())


def test_constructor_and_input_errors_are_clear():
    with pytest.raises(ValueError, match=r"cell must be one of \['gru', 'lstm', 'rnn'\]"):
        ta.models.Seq2Seq(V, V, cell="transformer")
    with pytest.raises(ValueError, match="attention='dot' needs decoder states and encoder outputs"):
        ta.models.Seq2Seq(V, V, attention="dot", bidirectional=True)
    with pytest.raises(ValueError, match="must hold at least the 4 reserved ids"):
        ta.models.Seq2Seq(3, V)
    model = ta.models.Seq2Seq(V, V, embed=4, hidden=6)
    with pytest.raises(ta.ShapeError, match=r"^Seq2Seq: src must be an integer array \(B, L\)"):
        model(np.array([3, 4]), np.array([[1]]))
    with pytest.raises(ta.ShapeError, match=r"^Seq2Seq: tgt_in must be a non-empty integer array \(B, L\)"):
        model(np.array([[3, 4]]), np.zeros((1, 0), np.int64))
    with pytest.raises(ta.ShapeError, match=r"differ in batch size"):
        model(np.array([[3, 4]]), np.array([[1], [1]]))
    with pytest.raises(ta.ShapeError, match=rf"id {V + 3} is outside \[0, {V}\)"):
        model(np.array([[3, V + 3]]), np.array([[1]]))


@pytest.mark.parametrize(("change", "error", "pattern"), [
    (dict(embed=0), ValueError, r"embed must be >= 1, got 0$"),
    (dict(hidden=8.0), TypeError, r"hidden must be an int, got 8.0"),
    (dict(num_layers=0), ValueError, r"num_layers must be >= 1, got 0$"),
    (dict(dropout=1.0), ValueError, r"dropout must be a finite number in \[0.0, 1.0\), got 1.0$"),
    (dict(bidirectional="no"), TypeError, r"bidirectional must be True or False, got 'no' \(str\)$"),
    (dict(attn_dim=0), ValueError, r"attn_dim must be >= 1, got 0$"),
    (dict(attention=["dot"]), ValueError, r"attention must be one of"),
    (dict(src_vocab=None), TypeError, r"src_vocab must be an int or a ta.data.Vocab, got None"),
])
def test_every_bad_constructor_argument_is_one_line_naming_seq2seq_and_it(change, error, pattern):
    arguments = dict(src_vocab=V, tgt_vocab=V) | change
    with pytest.raises(error, match=rf"^Seq2Seq: {pattern}"):
        ta.models.Seq2Seq(**arguments)


def test_repr_names_the_parts_and_counts_parameters():
    model = ta.models.Seq2Seq(V, V, embed=4, hidden=6, attention="additive")
    text = repr(model)
    assert text.startswith("Seq2Seq(cell='gru', attention='additive', style='bahdanau', embed=4, hidden=6)")
    assert "(attention): AdditiveAttention" in text and "parameters" in text
    assert isinstance(model.attention, nn.AdditiveAttention)


def test_evaluate_scores_each_source_once_against_all_its_targets():
    class Echo:
        """Stands in for a model: decodes the sources of a batch to fixed outputs, by first token."""

        def __init__(self, outputs):
            self.outputs = outputs

        def greedy(self, src, max_len):
            ids = np.zeros((len(src), int(np.max(max_len))), dtype=np.int64)      # max_len: one per row
            for row, first in enumerate(src[:, 0]):
                out = self.outputs[int(first)]
                ids[row, : len(out) + 1] = [*out, END]
            return ids, None

    vocab = ta.data.Vocab(["a", "b"])
    a, b = vocab.id("a"), vocab.id("b")
    pairs = [(["a"], ["a", "b"]), (["b"], ["b"]), (["a"], ["a"])]      # "a" has two targets
    metrics, rows = ta.models.evaluate(Echo({a: [a], b: [b, b, a]}), pairs, vocab, vocab,
                                       return_outputs=True)
    assert [(source, output) for source, output, _ in rows] == [(["a"], ["a"]), (["b"], ["b", "b", "a"])]
    assert metrics["n"] == 2
    assert metrics["exact_match"] == pytest.approx(1 / 2)          # "a" matches its second target
    assert metrics["wer"] == pytest.approx(1 / 2)
    # "a": 0 edits against its closest target ["a"] (length 1); "b": 2 insertions over 1
    assert metrics["token_error_rate"] == pytest.approx((0 + 2) / (1 + 1))


def test_bahdanau_step_from_seq2seq_is_the_models_decoder_step():
    """The written-out step that `verify` checks with sympy and examples/render_graph.py
    draws is the model's own: with the model's weights it gives the model's logits at every
    teacher-forced step, fed the model's states and encoder outputs."""
    ta.manual_seed(3)
    model = ta.models.Seq2Seq(11, 9, embed=4, hidden=5, cell="gru", attention="additive",
                              style="bahdanau", attn_dim=6).double()
    rng = np.random.default_rng(3)
    # float64 weights that float32 cannot hold: a step built in float32 would round them.
    model.load_state_dict({k: rng.standard_normal(v.shape) for k, v in model.state_dict().items()})
    src, tgt_in = rng.integers(3, 11, size=(2, 4)), rng.integers(3, 9, size=(2, 3))
    logits, _ = model(src, tgt_in)                                      # (B, T, V)
    memory = model.encode(src)
    step = ta.models.BahdanauStep.from_seq2seq(model)
    s = memory.states[0][:, 0]                                          # (B, H)
    for t in range(tgt_in.shape[1]):
        y = model.tgt_embed(tgt_in[:, t])                               # (B, E)
        want = logits.numpy()[:, t]
        np.testing.assert_allclose(step(y, s, memory.keys).numpy(), want, rtol=1e-12, atol=1e-12)
        context, _ = step.attention(s[:, None, :], memory.keys)
        s = step.cell(ta.cat([y, context[:, 0]], axis=-1), s)


@pytest.mark.parametrize("change", [dict(cell="lstm"), dict(style="luong"), dict(attention="dot"),
                                    dict(num_layers=2), dict(bidirectional=True)])
def test_bahdanau_step_refuses_other_models(change):
    config = dict(cell="gru", attention="additive", style="bahdanau") | change
    model = ta.models.Seq2Seq(7, 7, embed=3, hidden=4, **config)
    with pytest.raises(ValueError, match="BahdanauStep.from_seq2seq: needs a model with"):
        ta.models.BahdanauStep.from_seq2seq(model)


def test_a_source_row_of_only_padding_decodes_from_nothing():
    ta.manual_seed(3)
    model = ta.models.Seq2Seq(V, V, embed=4, hidden=6, attention="additive", bidirectional=True)
    src = np.array([[4, 5, 6], [0, 0, 0], [0, 0, 0]])
    ids, weights = model.greedy(src, max_len=5)
    np.testing.assert_array_equal(ids[1], ids[2])                   # the same output for every such row
    assert not weights[1].any() and not weights[2].any()            # nothing to attend to
    alone, _ = model.greedy(src[1:2], max_len=5)
    np.testing.assert_array_equal(alone[0, : ids.shape[1]], ids[1, : alone.shape[1]])
