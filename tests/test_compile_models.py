"""The shipped models' training steps under ta.compile: 30 steps of forward, loss, backward,
gradient clipping and Adam with a warm-up-then-cosine learning rate, on batches of one shape
whose contents and padding change every step, leave exactly the parameters the eager steps
leave (bitwise: nothing is fused), in float32 and float64, dropout included (the plan draws
the same random stream).

The eager twin is fed host (numpy) ids, so it takes the models' host paths (masks built in
numpy, the RNN skipping the masking of steps without padding); the compiled step gets the
ids as Tensors (ta.compile makes every array argument one), so its masks and id columns are
kernels computed from each batch.  Equal parameters after 30 different batches mean both
that nothing of the first batch was frozen into the plan and that the device paths give the
host paths' bits."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import nn
from tinygrad_attn.models.seq2seq import PAD

STEPS = 30
VOCAB = 13
CLIP = 0.5
SRC_LEN, TGT_LEN, BATCH = 6, 5, 4


def _batches(seed: int, steps: int = STEPS, unpadded_every: int = 0):
    """(src, tgt_in, tgt_out) int64 of fixed shapes, right-padded with PAD to lengths that
    change every step (some rows full, so some columns need no mask); the last source
    column always has padding, except in every ``unpadded_every``-th batch, which has none."""
    rng = np.random.default_rng(seed)
    batches = []
    for k in range(steps):
        src = rng.integers(3, VOCAB, (BATCH, SRC_LEN))
        tgt = rng.integers(3, VOCAB, (BATCH, TGT_LEN + 1))
        tgt[:, 0] = 1                                              # <start>
        if not unpadded_every or k % unpadded_every:
            for row in range(BATCH):
                src[row, rng.integers(2, SRC_LEN + 1):] = PAD
                tgt[row, rng.integers(3, TGT_LEN + 2):] = PAD
            src[rng.integers(BATCH), -1] = PAD
        batches.append((src, tgt[:, :-1].copy(), tgt[:, 1:].copy()))
    return batches


def _twins(make, dtype):
    models = []
    for _ in range(2):
        ta.manual_seed(0)
        models.append(make().astype(dtype))
    for p, q in zip(*(m.parameters() for m in models), strict=True):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    return models


def _trainer(model):
    optimizer = ta.optim.Adam(model.parameters(), lr=0.01)
    schedule = ta.optim.WarmupCosine(optimizer, warmup=5, total=STEPS)
    return optimizer, schedule


def _train_step(model, optimizer, src, tgt_in, tgt_out):
    """What ``ta.models.train`` does per step, less its host read of the loss."""
    optimizer.zero_grad()
    loss = model.loss(src, tgt_in, tgt_out)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    return loss


def _assert_compiled_equals_eager(make, dtype, seed=0, batches=None, eager_ids=np.asarray):
    compiled_model, eager_model = _twins(make, dtype)
    compiled_opt, compiled_schedule = _trainer(compiled_model)
    eager_opt, eager_schedule = _trainer(eager_model)
    step = ta.compile(lambda src, tgt_in, tgt_out: _train_step(compiled_model, compiled_opt, src, tgt_in,
                                                               tgt_out))
    compiled_rng, eager_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    for src, tgt_in, tgt_out in _batches(seed) if batches is None else batches:
        with ta.random.using(compiled_rng):
            got = step(src, tgt_in, tgt_out)
        compiled_schedule.step()
        with ta.random.using(eager_rng):
            want = _train_step(eager_model, eager_opt, *map(eager_ids, (src, tgt_in, tgt_out)))
        eager_schedule.step()
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    for (name, p), q in zip(compiled_model.named_parameters(), eager_model.parameters(), strict=True):
        assert p.dtype == dtype
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    # Every update moved the weights: a plan replaying the first batch would not match above.
    assert compiled_opt.lr == eager_opt.lr < 0.01
    # .grad None on the first call, set from then on: two plans, and the rest replays.
    assert (step.stats.captures, step.stats.replays) == (2, STEPS - 2)
    assert "to_numpy" not in step.source
    return compiled_model


# ---------------------------------------------------------------- Transformer

TRANSFORMERS = {
    "post-norm-relu": dict(norm_first=False, activation="relu"),
    "pre-norm-gelu-tied": dict(norm_first=True, activation="gelu", tie_embeddings=True),
    "learned-positions-tied": dict(activation="relu", positions="learned", tie_embeddings=True),
    # Dropout takes the unfused attention, whose causal mask is ANDed with the padding mask.
    "dropout-gelu": dict(norm_first=False, activation="gelu", dropout=0.2),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("config", list(TRANSFORMERS), ids=list(TRANSFORMERS))
def test_compile_transformer_training_equals_eager(config, dtype):
    options = {"dropout": 0.0, **TRANSFORMERS[config]}

    def make():
        return ta.models.Transformer(VOCAB, VOCAB, d_model=8, nhead=2, num_encoder_layers=1,
                                     num_decoder_layers=2, dim_feedforward=16, max_len=16, **options)

    _assert_compiled_equals_eager(make, dtype)


# ---------------------------------------------------------------- Seq2Seq

SEQ2SEQ = [(cell, attention, style) for cell in ("rnn", "gru", "lstm")
           for attention in ("dot", "general", "concat", "additive") for style in ("bahdanau", "luong")]
SEQ2SEQ += [(cell, None, "bahdanau") for cell in ("rnn", "gru", "lstm")]


def _seq2seq(cell, attention, style, **options):
    def make():
        return ta.models.Seq2Seq(VOCAB, VOCAB, embed=6, hidden=8, cell=cell, attention=attention, style=style,
                                 **options)
    return make


@pytest.mark.parametrize("cell,attention,style", SEQ2SEQ, ids=lambda v: str(v))
def test_compile_seq2seq_training_equals_eager_float64(cell, attention, style):
    _assert_compiled_equals_eager(_seq2seq(cell, attention, style), np.float64)


@pytest.mark.parametrize("cell,attention,style,options", [
    ("gru", "additive", "bahdanau", {}),
    ("lstm", "general", "luong", {}),
    ("rnn", "concat", "bahdanau", dict(bidirectional=True, num_layers=2)),
    ("lstm", "additive", "luong", dict(bidirectional=True, num_layers=2)),
    ("gru", "general", "bahdanau", dict(bidirectional=True, num_layers=2, dropout=0.3)),
    ("lstm", "dot", "luong", dict(num_layers=2, dropout=0.3)),
], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_compile_seq2seq_deep_and_dropout_equals_eager(cell, attention, style, options, dtype):
    _assert_compiled_equals_eager(_seq2seq(cell, attention, style, **options), dtype)


# ---------------------------------------------------------------- the device paths themselves


@pytest.mark.parametrize("make", [
    _seq2seq("lstm", "additive", "bahdanau", bidirectional=True, num_layers=2),
    lambda: ta.models.Transformer(VOCAB, VOCAB, d_model=8, nhead=2, num_encoder_layers=1,
                                  num_decoder_layers=1, dim_feedforward=16, max_len=16, dropout=0.0),
], ids=["seq2seq", "transformer"])
def test_models_tensor_ids_give_the_host_ids_bits(make):
    """Eagerly, ids as Tensors (masks and columns as kernels, every RNN step masked) give the
    loss and gradients of the same ids as numpy arrays (host masks, unpadded steps skipped)."""
    [(src, tgt_in, tgt_out)] = _batches(3, steps=2)[1:]
    assert (src == PAD).any() and (src != PAD).all(axis=0).any()   # padded and unpadded columns
    results = []
    for as_tensor in (False, True):
        ta.manual_seed(0)
        model = make().astype(np.float64)
        ids = [ta.Tensor(x) if as_tensor else x for x in (src, tgt_in, tgt_out)]
        loss = model.loss(*ids)
        loss.backward()
        results.append([loss.numpy()] + [p.grad.numpy() for p in model.parameters()])
    for got, want in zip(*results, strict=True):
        np.testing.assert_array_equal(got, want)


def test_rnn_tensor_mask_masks_every_step_host_mask_skips_unpadded():
    """The RNN's masking graph depends on the mask's type, never on its values when it is a
    Tensor: what lets one plan serve batches of any padding."""
    gru = nn.GRU(3, 4)
    x = ta.Tensor(np.random.default_rng(0).standard_normal((2, 5, 3)))
    mask = np.array([[True] * 5, [True, True, True, False, False]])
    host = gru._mask_columns(mask, (2,), 5, x.dtype, x.device)
    device = gru._mask_columns(ta.Tensor(mask), (2,), 5, x.dtype, x.device)
    assert [c is None for c in host] == [True, True, True, False, False]
    for t in (3, 4):                 # the boolean column selects the state, the 0/1 one masks the output
        np.testing.assert_array_equal(host[t][0], mask[:, t, None])
        np.testing.assert_array_equal(host[t][1], mask[:, t, None].astype(x.dtype))
    for keep, ones in device:
        assert isinstance(keep, ta.Tensor) and keep.shape == (2, 1) and keep.dtype == np.bool_
        assert isinstance(ones, ta.Tensor) and ones.shape == (2, 1) and ones.dtype == x.dtype
    np.testing.assert_array_equal(np.stack([c.numpy() for c, _ in device]), mask.T[:, :, None])
    ones = mask.T[:, :, None].astype(x.dtype)
    np.testing.assert_array_equal(np.stack([c.numpy() for _, c in device]), ones)
    out_host, h_host = gru(x, mask=mask)
    out_device, h_device = gru(x, mask=ta.Tensor(mask))
    np.testing.assert_array_equal(out_device.numpy(), out_host.numpy())
    np.testing.assert_array_equal(h_device.numpy(), h_host.numpy())


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_compile_seq2seq_unpadded_batches_equal_eager_on_tensor_ids(cell):
    """A batch without padding is where the host path skips the masking of the encoder's last
    step.  An LSTM's masked state is a ``where`` of the cell's output, whose final state has
    two readers besides the encoder's output (a Bahdanau decoder's first query and cell):
    backward adds their three gradients in another order than on the host path, so the
    compiled step (one graph for every batch) equals eager training given the same ids as
    Tensors bitwise, and eager training on host ids to rounding.  A GRU keeps its state
    inside its fused node (``GRUCell(masked=True)``), the state's readers are the same on
    both paths, and the compiled step equals eager training on host ids bitwise too."""
    make, batches = _seq2seq(cell, "general", "bahdanau"), _batches(0, unpadded_every=5)
    compiled_model = _assert_compiled_equals_eager(make, np.float64, batches=batches, eager_ids=ta.Tensor)
    host_model = _twins(make, np.float64)[1]
    host_opt, host_schedule = _trainer(host_model)
    for src, tgt_in, tgt_out in batches:
        _train_step(host_model, host_opt, src, tgt_in, tgt_out)
        host_schedule.step()
    differ = 0
    for p, q in zip(compiled_model.parameters(), host_model.parameters(), strict=True):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-12, atol=1e-14)
        differ += not np.array_equal(p.numpy(), q.numpy())
    # The order does change bits for the LSTM (else this test would guard nothing there).
    assert bool(differ) == (cell == "lstm")


def test_a_fresh_process_whose_first_step_is_compiled_gives_eager_bits():
    """The first compiled step of a process builds kernels on their first calls during the
    capture, and each build rebuilds the device's table of recording wrappers; a weight's
    per-step gradients must still join into one product (DeferredGrad tells them apart by
    kernel name), or the plan sums them step by step, other bits than eager's (a GRU
    seq2seq differed by ~2e-6 after three steps).  Only a new interpreter has unbuilt kernels."""
    script = textwrap.dedent("""
        import numpy as np
        import tinygrad_attn as ta

        def make():
            ta.manual_seed(0)
            model = ta.models.Seq2Seq(12, 12, embed=8, hidden=16, cell="gru", attention="additive",
                                      style="bahdanau")
            return model, ta.optim.Adam(model.parameters(), lr=1e-2)

        def step_of(model, optimizer):
            def step(src, tgt_in, tgt_out):
                optimizer.zero_grad()
                loss = model.loss(src, tgt_in, tgt_out)
                loss.backward()
                optimizer.step()
                return loss
            return step

        rng = np.random.default_rng(0)
        src, tgt = ta.Tensor(rng.integers(3, 12, (4, 6))), rng.integers(3, 12, (4, 5))
        batch = (src, ta.Tensor(tgt[:, :-1]), ta.Tensor(tgt[:, 1:]))
        (compiled_model, compiled_opt), (eager_model, eager_opt) = make(), make()
        compiled, eager = ta.compile(step_of(compiled_model, compiled_opt)), step_of(eager_model, eager_opt)
        for _ in range(3):
            compiled(*batch)                     # first: the capture, the process's first step
            eager(*batch)
        print(all(np.array_equal(a.numpy(), b.numpy())
                  for a, b in zip(compiled_model.parameters(), eager_model.parameters(), strict=True)))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["True"], run.stdout + run.stderr
