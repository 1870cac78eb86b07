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


def _translations_compiled_equal_eager(model, info, beam) -> None:
    """translate_tokens and decode with compile=True give eager's tokens and attention."""
    eager = ta.models.translate_tokens(model, SOURCES, info.src_vocab, info.tgt_vocab, beam=beam,
                                       batch_size=2)
    compiled = ta.models.translate_tokens(model, SOURCES, info.src_vocab, info.tgt_vocab, beam=beam,
                                          batch_size=2, compile=True)
    for (tokens, attention), (tokens_c, attention_c) in zip(eager, compiled, strict=True):
        assert tokens == tokens_c
        np.testing.assert_array_equal(attention, attention_c)
    assert ta.models.decode(model, SOURCES, info.src_vocab, info.tgt_vocab, beam=beam, compile=True) == \
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
