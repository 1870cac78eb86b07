"""Compiled decoding where a user meets it: ``ta.models.evaluate/translate/translate_tokens/
decode(..., compile=True)`` and ``tinygrad-attn translate/evaluate --compile`` give what the
eager decoders give, bit for bit (greedy and beam search, n-best with scores), for a
Transformer and a Seq2Seq, and refuse a model whose decoding does not compile."""

import json

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import cli
from tinygrad_attn.models.decoding import _COMPILED_STEPS as _COMPILED

TINY = ["--arch", "transformer", "--task", "copy", "--length", "4", "--steps", "30", "--d-model", "16",
        "--heads", "2", "--ff", "32", "--layers", "1"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-compile") / "copy.ckpt"
    assert cli.main(["train", *TINY, "--no-progress", "--out", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def seq2seq_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-compile-rnn") / "copy.ckpt"
    assert cli.main(["train", "--task", "copy", "--length", "4", "--steps", "5", "--hidden", "8", "--embed",
                     "8", "--no-progress", "--out", str(path)]) == 0
    return path


SOURCES = [list("abca"), list("cab"), [], list("bbbb"), list("a")]


def _translations_compiled_equal_eager(model, info, beam, sources=SOURCES, batch_size=2) -> None:
    """translate_tokens and decode with compile=True give eager's tokens and attention."""
    eager = ta.models.translate_tokens(model, sources, info.src_vocab, info.tgt_vocab, beam=beam,
                                       batch_size=batch_size)
    compiled = ta.models.translate_tokens(model, sources, info.src_vocab, info.tgt_vocab, beam=beam,
                                          batch_size=batch_size, compile=True)
    for (tokens, attention), (tokens_c, attention_c) in zip(eager, compiled, strict=True):
        assert tokens == tokens_c
        np.testing.assert_array_equal(attention, attention_c)
    assert ta.models.decode(model, sources, info.src_vocab, info.tgt_vocab, beam=beam, compile=True) == \
        [tokens for tokens, _ in eager]


@pytest.mark.parametrize("beam", [None, 3])
def test_translate_tokens_and_decode_compiled_equal_eager(checkpoint, beam):
    model, info = ta.models.load_checkpoint(checkpoint)
    _translations_compiled_equal_eager(model, info, beam)
    assert _COMPILED[model].stats.replays > 0 and _COMPILED[model].stats.eager_calls == 0


def test_n_best_evaluate_and_translate_compiled_equal_eager(checkpoint):
    model, info = ta.models.load_checkpoint(checkpoint)
    eager = ta.models.translate_tokens(model, SOURCES, info.src_vocab, info.tgt_vocab, beam=3, n_best=3)
    compiled = ta.models.translate_tokens(model, SOURCES, info.src_vocab, info.tgt_vocab, beam=3, n_best=3,
                                          compile=True)
    for best, best_c in zip(eager, compiled, strict=True):
        assert [(t, h.tokens, h.score, h.log_prob) for t, h in best] == \
            [(t, h.tokens, h.score, h.log_prob) for t, h in best_c]
    pairs = [(list("abca"), list("abca")), (list("cab"), list("cab")), (list("bb"), list("ba"))]
    for beam in (None, 2):
        options = dict(beam=beam, return_outputs=True)
        assert ta.models.evaluate(model, pairs, info.src_vocab, info.tgt_vocab, **options) == \
            ta.models.evaluate(model, pairs, info.src_vocab, info.tgt_vocab, **options, compile=True)
    text, source, tokens, attention = ta.models.translate(model, "abca", info, compile=True)
    want = ta.models.translate(model, "abca", info)
    assert (text, source, tokens) == want[:3]
    np.testing.assert_array_equal(attention, want[3])


@pytest.mark.parametrize("extra", [[], ["--beam", "3"], ["--beam", "3", "--n-best", "2"]])
def test_translate_compile_prints_what_eager_prints(checkpoint, capsys, extra):
    args = ["translate", str(checkpoint), "abca", "cab", "bbb", *extra]
    assert cli.main(args) == 0
    eager = capsys.readouterr().out
    assert cli.main([*args, "--compile"]) == 0
    assert capsys.readouterr().out == eager and "'abca' -> " in eager


def test_translate_compile_from_standard_input(checkpoint, capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("abca\ncab\n\nbb\n"))
    assert cli.main(["translate", str(checkpoint), "-", "--beam", "2"]) == 0
    eager = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("abca\ncab\n\nbb\n"))
    assert cli.main(["translate", str(checkpoint), "-", "--beam", "2", "--compile"]) == 0
    assert capsys.readouterr().out == eager and eager.count("\n") == 4


@pytest.mark.parametrize("beam", [[], ["--beam", "2"]])
def test_evaluate_compile_reports_what_eager_reports(checkpoint, capsys, beam):
    assert cli.main(["evaluate", str(checkpoint), "--json", *beam]) == 0
    eager = json.loads(capsys.readouterr().out)
    assert cli.main(["evaluate", str(checkpoint), "--json", "--compile", *beam]) == 0
    assert json.loads(capsys.readouterr().out) == eager and eager["n"] > 0


@pytest.mark.parametrize("extra", [[], ["--beam", "3"], ["--beam", "3", "--n-best", "2"]])
def test_seq2seq_translate_compile_prints_what_eager_prints(seq2seq_checkpoint, capsys, extra):
    args = ["translate", str(seq2seq_checkpoint), "abca", "cab", "a", "bbb", *extra]
    assert cli.main(args) == 0
    eager = capsys.readouterr().out
    assert cli.main([*args, "--compile"]) == 0
    assert capsys.readouterr().out == eager and "'abca' -> " in eager


@pytest.mark.parametrize("beam", [[], ["--beam", "2"]])
def test_seq2seq_evaluate_compile_reports_what_eager_reports(seq2seq_checkpoint, capsys, beam):
    assert cli.main(["evaluate", str(seq2seq_checkpoint), "--json", *beam]) == 0
    eager = json.loads(capsys.readouterr().out)
    assert cli.main(["evaluate", str(seq2seq_checkpoint), "--json", "--compile", *beam]) == 0
    assert json.loads(capsys.readouterr().out) == eager and eager["n"] > 0


@pytest.mark.parametrize("beam", [None, 3])
def test_seq2seq_translate_tokens_and_decode_compiled_equal_eager(seq2seq_checkpoint, beam):
    from tinygrad_attn.models.decoding import _COMPILED_STEPS as SEQ2SEQ_COMPILED

    model, info = ta.models.load_checkpoint(seq2seq_checkpoint)
    _translations_compiled_equal_eager(model, info, beam)
    best = ta.models.translate_tokens(model, SOURCES, info.src_vocab, info.tgt_vocab, beam=3, n_best=2)
    best_c = ta.models.translate_tokens(model, SOURCES, info.src_vocab, info.tgt_vocab, beam=3, n_best=2,
                                        compile=True)
    assert [[(t, h.tokens, h.score, h.log_prob) for t, h in b] for b in best] == \
        [[(t, h.tokens, h.score, h.log_prob) for t, h in b] for b in best_c]
    stats = SEQ2SEQ_COMPILED[model].stats
    assert stats.replays > 0 and stats.eager_calls == 0


class _EagerOnly(ta.models.Seq2Seq):
    """A model whose ``greedy`` takes no ``compile``: what the refusals look for."""

    def greedy(self, src, max_len=50, min_length=0, no_repeat_ngram_size=0, hypotheses=False):
        return super().greedy(src, max_len, min_length, no_repeat_ngram_size, hypotheses)


def test_compile_refused_for_a_model_whose_decoding_does_not_compile(seq2seq_checkpoint):
    import argparse

    from tinygrad_attn.cli.common import UsageError, compile_options

    model, info = ta.models.load_checkpoint(seq2seq_checkpoint)
    eager_only = _EagerOnly(**model.config)
    assert compile_options(argparse.Namespace(compile=True), model) == {"compile": True}
    assert compile_options(argparse.Namespace(compile=False), eager_only) == {}
    with pytest.raises(UsageError, match="_EagerOnly, which decodes eagerly"):
        compile_options(argparse.Namespace(compile=True), eager_only)
    with pytest.raises(ValueError, match="compile=True needs a model whose decoding compiles"):
        ta.models.decode(eager_only, SOURCES, info.src_vocab, info.tgt_vocab, compile=True)


# ------------------------------------------------- --compile reaches the decoders and the trainer
# The outputs above are eager's, bit for bit: they cannot tell whether --compile took effect.
# These spy on the real path: the compiled steps the models ask for (and replay).


@pytest.fixture
def compiled_steps(monkeypatch):
    """The compiled decode steps (and encoders) the models ask ``compiled_step`` for while the
    test runs: the real ones, each recorded with its model's class and method."""
    from tinygrad_attn.models import decoding

    asked, real = [], decoding.compiled_step

    def spy(model, method, *args, **kwargs):
        step = real(model, method, *args, **kwargs)
        asked.append((type(model).__name__, method, step))
        return step

    monkeypatch.setattr(decoding, "compiled_step", spy)
    return asked


def _decoded_compiled(asked, model: str) -> None:
    """Some decode step of ``model`` was compiled, and every one replayed its plans."""
    steps = [step for name, method, step in asked if name == model and method != "_decode_memory"]
    assert steps, asked
    assert all(step.stats.replays > 0 and step.stats.eager_calls == 0 for step in steps), \
        [step.stats for step in steps]


CLI_ARCHS = [("checkpoint", "Transformer"), ("seq2seq_checkpoint", "Seq2Seq")]


@pytest.mark.parametrize("fixture, model", CLI_ARCHS)
@pytest.mark.parametrize("extra", [[], ["--beam", "2"], ["--beam", "2", "--n-best", "2"]])
def test_translate_compile_reaches_the_decoders(request, fixture, model, extra, compiled_steps, capsys):
    args = ["translate", str(request.getfixturevalue(fixture)), "abca", "cab", *extra]
    assert cli.main(args) == 0
    assert compiled_steps == []                         # without --compile nothing is compiled
    assert cli.main([*args, "--compile"]) == 0
    _decoded_compiled(compiled_steps, model)


@pytest.mark.parametrize("fixture, model", CLI_ARCHS)
@pytest.mark.parametrize("extra", [[], ["--n-best", "2"]])
def test_translate_compile_from_standard_input_reaches_the_decoders(request, fixture, model, extra,
                                                                   compiled_steps, capsys, monkeypatch):
    import io

    args = ["translate", str(request.getfixturevalue(fixture)), "-", "--beam", "2", *extra]
    monkeypatch.setattr("sys.stdin", io.StringIO("abca\n\ncab\n"))
    assert cli.main(args) == 0
    assert compiled_steps == []
    monkeypatch.setattr("sys.stdin", io.StringIO("abca\n\ncab\n"))
    assert cli.main([*args, "--compile"]) == 0
    _decoded_compiled(compiled_steps, model)


@pytest.mark.parametrize("fixture, model", CLI_ARCHS)
@pytest.mark.parametrize("beam", [[], ["--beam", "2"]])
def test_evaluate_compile_reaches_the_decoders(request, fixture, model, beam, compiled_steps, capsys):
    args = ["evaluate", str(request.getfixturevalue(fixture)), "--json", *beam]
    assert cli.main(args) == 0
    assert compiled_steps == []
    assert cli.main([*args, "--compile"]) == 0
    _decoded_compiled(compiled_steps, model)


def test_train_compile_reaches_the_trainer_also_when_resuming(tmp_path, monkeypatch, capsys):
    """train --compile (and --resume --compile) runs its steps as a compiled plan: the real
    ``ta.compile`` the trainer calls, spied on, replays; without --compile it is never called."""
    from tinygrad_attn.models import training

    made, real = [], training.compile_step

    def spy(function, *args, **kwargs):
        step = real(function, *args, **kwargs)
        made.append(step)
        return step

    monkeypatch.setattr(training, "compile_step", spy)
    flags = ["train", "--task", "copy", "--length", "4", "--hidden", "8", "--embed", "8", "--batch-size", "8",
             "--eval-every", "0", "--no-progress"]
    assert cli.main([*flags, "--steps", "3", "--out", str(tmp_path / "eager.ckpt")]) == 0
    assert made == []
    out = str(tmp_path / "compiled.ckpt")
    assert cli.main([*flags, "--steps", "3", "--compile", "--out", out]) == 0
    assert len(made) == 1 and made[0].stats.replays > 0 and made[0].stats.eager_calls == 0, made[0].stats
    assert cli.main([*flags, "--steps", "6", "--compile", "--resume", out]) == 0
    assert len(made) == 2 and made[1].stats.replays > 0, made[1].stats
    assert ta.models.load_checkpoint(out)[1].training["step"] == 6


@pytest.mark.parametrize("which", ["checkpoint", "seq2seq_checkpoint"])
def test_a_test_set_of_many_widths_decodes_compiled_without_falling_back_to_eager(which, request):
    """Sources of 16 lengths in batches of 3, decoded greedily then with a beam: the batches
    are padded to fewer widths (and the caches to fewer lengths), so every step replays a
    plan, where 6 widths x 2 decoders passed the cap of 8 plans and ran eagerly; and the
    outputs are eager's."""
    model, info = ta.models.load_checkpoint(request.getfixturevalue(which))
    letters = "abc"
    sources = [[letters[(n + i) % 3] for i in range(n)] for n in range(1, 17)]
    for beam in (None, 2):
        _translations_compiled_equal_eager(model, info, beam, sources, batch_size=3)
    step = _COMPILED[model]
    assert step.stats.eager_calls == 0 and step.stats.replays > 0


def test_padding_a_batch_changes_no_source_s_output(checkpoint):
    """translate_tokens pads each batch's sources to a multiple of SOURCE_COLUMNS columns:
    every source still gets what the model's greedy gives it alone and unpadded."""
    from tinygrad_attn.models.evaluation import SOURCE_COLUMNS

    model, info = ta.models.load_checkpoint(checkpoint)
    sources = [list("abcab"[:n]) for n in range(1, 6)]
    assert any(len(s) % SOURCE_COLUMNS for s in sources)
    found = ta.models.translate_tokens(model, sources, info.src_vocab, info.tgt_vocab, batch_size=5)
    for source, (tokens, attention) in zip(sources, found, strict=True):
        src = ta.data.encode_batch([source], info.src_vocab)                      # (1, S): no padding
        ids, weights = model.greedy(src, max_len=ta.models.decoding.default_max_len(np.array([len(source)])))
        assert tokens == info.tgt_vocab.decode(ids[0])
        np.testing.assert_allclose(attention, weights[0, : attention.shape[0], : len(source)], atol=1e-6)
