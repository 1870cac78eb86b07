"""Fusion over the shipped models (issue 32, item 3): a training step of every model family
compiled with ``fuse=True`` trains as eager training does (float64, to 1e-12 relative), every
fused chain of every plan passes ``ta.check.fused`` (forward against the unfused member
kernels, each derivative against sympy's derivative of the composition), and so does the
compiled decoding step's; a fused kernel made wrong (its backward, or the forward of a fused
backward chain) on a chain taken from a model is rejected by the check.

Identical chains (same composed formula, parameters, shapes, dtype) met by several models are
checked once (``CHECKED``).  The "cpu" rules that leave small chains and transcendental
members unfused are off here (test_fuse.py tests them)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import tinygrad_attn as ta
from tests.test_compile_models import VOCAB, _batches, _train_step, _twins
from tests.test_fuse import assert_wrong_kernel_rejected
from tinygrad_attn import compiled as compiled_module
from tinygrad_attn.compiler import formulas, fuse_backward, get_backend
from tinygrad_attn.compiler import fuse as fusing

STEPS = 3                      # capture (no .grad yet), capture (.grad set), replay
TOLERANCE = 1e-12

# Chain key -> the check's report, shared by the tests of this module.
CHECKED: dict = {}


@pytest.fixture(autouse=True)
def fuse_everything(monkeypatch):
    """The models here are small: "cpu"'s rules (no chain under fuse.MIN_ELEMENTS, no
    float64 transcendental member) would leave most chains unfused, and these tests are of every
    chain the models can produce."""
    monkeypatch.setattr(fusing, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(fusing, "SCALAR_MATH", {})
    monkeypatch.setattr(fuse_backward, "RECORDED_IF_TRANSCENDENTAL", ())


def _check_chains(plans) -> int:
    """Check every fused chain of ``plans`` not checked yet; returns how many chains they hold."""
    chains = [chain for plan in plans for chain in plan.chains]
    for chain in chains:
        if chain.key() not in CHECKED:
            (CHECKED[chain.key()],) = ta.check.fused(chain)
        report = CHECKED[chain.key()]
        assert report.ok, str(report)
    return len(chains)


def _close(got, want, name=""):
    got, want = np.asarray(got), np.asarray(want)
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE * scale, err_msg=name)


def _grads(model) -> list:
    return [p.grad.numpy() for p in model.parameters()]


def _fused_training_equals_eager(make) -> int:
    """A few training steps of ``make()``'s model compiled with fusion against eager ones
    (float64): the losses, every gradient (to 1e-12 of the largest gradient entry) and the
    parameters after; returns how many fused chains the plans hold, all checked.

    SGD, not Adam: Adam divides a gradient by its own size, so a gradient that is rounding
    noise alone (a key bias: softmax ignores it) would become an update of full size whose
    sign is the noise's, and the comparison would be of two noises."""
    fused_model, eager_model = _twins(make, np.float64)
    fused_opt, eager_opt = (ta.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
                            for m in (fused_model, eager_model))
    step = ta.compile(lambda src, tgt_in, tgt_out: _train_step(fused_model, fused_opt, src, tgt_in, tgt_out),
                      fuse=True)
    for src, tgt_in, tgt_out in _batches(0, steps=STEPS):
        got = step(src, tgt_in, tgt_out)
        want = _train_step(eager_model, eager_opt, src, tgt_in, tgt_out)
        _close(got.numpy(), want.numpy(), "loss")
        wanted = _grads(eager_model)
        scale = max(float(np.max(np.abs(g))) for g in wanted)
        for (name, _), g, w in zip(fused_model.named_parameters(), _grads(fused_model), wanted, strict=True):
            np.testing.assert_allclose(g, w, rtol=TOLERANCE, atol=TOLERANCE * scale, err_msg=f"grad {name}")
    for (name, p), q in zip(fused_model.named_parameters(), eager_model.parameters(), strict=True):
        _close(p.numpy(), q.numpy(), name)
    assert step.stats.replays == STEPS - 2
    return _check_chains(step.plans)


# ---------------------------------------------------------------- training steps

SEQ2SEQ = [(cell, attention, "luong" if attention in ("dot", "general") else "bahdanau", {})
           for cell in ("rnn", "gru", "lstm") for attention in (None, "dot", "general", "concat", "additive")]
SEQ2SEQ += [("lstm", "general", "luong", dict(bidirectional=True, num_layers=2)),
            ("gru", "additive", "bahdanau", dict(bidirectional=True)),
            ("rnn", "concat", "bahdanau", dict(bidirectional=True))]


@pytest.mark.parametrize("cell,attention,style,options", SEQ2SEQ, ids=str)
def test_fused_seq2seq_training_equals_eager_and_its_chains_check(cell, attention, style, options):
    count = _fused_training_equals_eager(lambda: ta.models.Seq2Seq(
        VOCAB, VOCAB, embed=6, hidden=8, cell=cell, attention=attention, style=style, **options))
    # Without attention the chains left are below the size rule's floor even here (the
    # Seq2Seq's elementwise work is inside its cell kernels), and a one-direction GRU's step
    # adds its biases and its state gradients in place, into its products, which no chain
    # holds: only then may nothing fuse (the bidirectional GRU's step still fuses).
    alone = attention is None or (cell == "gru" and not options)
    assert count or alone, "the step fused nothing: this test would check no chain"


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_fused_transformer_training_equals_eager_and_its_chains_check(norm_first, activation):
    count = _fused_training_equals_eager(lambda: ta.models.Transformer(
        VOCAB, VOCAB, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16,
        max_len=16, dropout=0.0, norm_first=norm_first, activation=activation))
    assert count, "the Transformer's step fused nothing: this test would check no chain"


# ---------------------------------------------------------------- decoding steps


@pytest.fixture
def fused_compile(monkeypatch):
    """Every ta.compile made while the test runs (the models' compiled decode steps) fuses."""
    made = []

    def compile_fused(fn=None, **options):
        step = original(fn, **{**options, "fuse": True})
        made.append(step)
        return step

    original = compiled_module.compile
    monkeypatch.setattr(compiled_module, "compile", functools.wraps(original)(compile_fused))
    return made


@pytest.mark.parametrize("family", ["transformer", "seq2seq"])
def test_fused_decoding_equals_eager_and_its_chains_check(family, fused_compile):
    ta.manual_seed(0)
    if family == "transformer":
        model = ta.models.Transformer(VOCAB, VOCAB, d_model=8, nhead=2, num_encoder_layers=1,
                                      num_decoder_layers=2, dim_feedforward=16, max_len=16, dropout=0.0)
    else:
        model = ta.models.Seq2Seq(VOCAB, VOCAB, embed=6, hidden=8, cell="lstm", attention="additive",
                                  bidirectional=True)
    model = model.astype(np.float64)
    src = _batches(1, steps=1)[0][0]
    eager = model.greedy(src, max_len=6, hypotheses=True)
    fused = model.greedy(src, max_len=6, hypotheses=True, compile=True)
    assert fused_compile and all(step.fuse for step in fused_compile)
    for got, want in zip(fused, eager, strict=True):
        assert list(got.tokens) == list(want.tokens)
        _close(got.log_prob, want.log_prob, "log_prob")
        _close(got.attention, want.attention, "attention")
    plans = [plan for step in fused_compile for plan in step.plans]
    count = _check_chains(plans)
    # The Seq2Seq decode step's elementwise work is inside its cell and attention kernels.
    assert count or family == "seq2seq", "the decode steps fused nothing: no chain was checked"


# ---------------------------------------------------------------- the check rejects a wrong kernel


def _model_chains():
    """The fused chains of a Transformer's training step (post-norm, relu)."""
    ta.manual_seed(0)
    model = ta.models.Transformer(VOCAB, VOCAB, d_model=8, nhead=2, num_encoder_layers=1,
                                  num_decoder_layers=1, dim_feedforward=16, max_len=16, dropout=0.0)
    model = model.astype(np.float64)
    optimizer = ta.optim.SGD(model.parameters(), lr=0.1)
    step = ta.compile(lambda *batch: _train_step(model, optimizer, *batch), fuse=True)
    for batch in _batches(0, steps=2):
        step(*batch)
    return [chain for plan in step.plans for chain in plan.chains]


def test_a_wrong_fused_kernel_of_a_model_chain_is_rejected():
    chains = _model_chains()
    # Each chain's backward is its composed derivative: no chain of recorded *_back kernels is
    # left to fuse on its own (test_fuse.py checks a wrong one of those, where a chain's
    # intermediate escapes).
    assert chains and not any("_back" in m.kernel_name for c in chains for m in c.members)
    forward = chains[0]
    cpu = get_backend("cpu")
    cases = [
        # The fused forward kernel, its sign flipped.
        (forward, forward.formula.name, lambda fn: lambda *a: -fn(*a)),
        # The composed derivative for leaf x0, off by one part in a million.
        (forward, formulas.plan(forward.formula).backward[0].name, lambda fn: lambda *a: fn(*a) * (1 + 1e-6)),
    ]
    for chain, name, wrong in cases:
        assert_wrong_kernel_rejected(cpu, chain, name, wrong)
        (report,) = ta.check.fused(chain)
        assert report.ok, str(report)
