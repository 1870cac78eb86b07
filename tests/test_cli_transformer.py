"""The command line with ``--arch transformer``: train, resume, translate (beam, the heatmap
of every layer and head), evaluate and graph a Transformer checkpoint; options of the
other architecture refused; checkpoints say which model they hold."""

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import cli

TINY = ["--arch", "transformer", "--task", "copy", "--length", "4", "--steps", "30", "--d-model", "16",
        "--heads", "2", "--ff", "32", "--layers", "1"]
NS = {"svg": "http://www.w3.org/2000/svg"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-transformer") / "copy.ckpt"
    assert cli.main(["train", *TINY, "--no-progress", "--out", str(path)]) == 0
    return path


def test_train_saves_a_transformer_that_loads_back(checkpoint):
    model, info = ta.models.load_checkpoint(checkpoint)
    assert isinstance(model, ta.models.Transformer)
    assert model.config["d_model"] == 16 and model.config["nhead"] == 2
    assert model.config["num_encoder_layers"] == model.config["num_decoder_layers"] == 1
    assert ta.load(checkpoint)["arch"] == "transformer" and info.training["step"] == 30


def test_resume_continues_the_transformer_run(checkpoint, tmp_path, capsys):
    out = tmp_path / "more.ckpt"
    assert cli.main(["train", "--resume", str(checkpoint), "--steps", "35", "--out", str(out),
                     "--no-progress"]) == 0
    assert "resuming" in capsys.readouterr().out
    model, info = ta.models.load_checkpoint(out)
    assert isinstance(model, ta.models.Transformer) and info.training["step"] == 35


def test_translate_with_beam_and_a_heatmap_of_every_layer_and_head(checkpoint, tmp_path, monkeypatch, capsys):
    drawn = []
    heatmap = ta.viz.heatmap
    monkeypatch.setattr(ta.viz, "heatmap", lambda weights, *args, **kw: drawn.append(weights) or
                        heatmap(weights, *args, **kw))
    path = tmp_path / "heads.png"
    assert cli.main(["translate", str(checkpoint), "abca", "--beam", "3", "--heatmap", str(path)]) == 0
    out = capsys.readouterr().out
    assert "'abca' -> " in out and f"wrote the heatmap to {path}" in out and path.stat().st_size > 0
    # (layers, heads, output tokens with <end>, source tokens), rows summing to one
    [grid] = drawn
    assert grid.shape[:2] == (1, 2) and grid.shape[3] == 4
    np.testing.assert_allclose(grid.sum(axis=-1), 1.0, rtol=1e-5)
    panels = ET.fromstring(heatmap(grid, list("abca"), ["x"] * grid.shape[2], backend="svg"))
    assert len(panels.findall("svg:svg", NS)) == 2


def test_translate_n_best_of_a_transformer(checkpoint, capsys):
    assert cli.main(["translate", str(checkpoint), "abca", "--beam", "3", "--n-best", "3"]) == 0
    out = capsys.readouterr().out
    scores = [float(s) for s in re.findall(r"^  \d\. '[a-t]*'  score (-?[\d.]+)  log P", out, re.M)]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)


def test_evaluate_and_graph_read_a_transformer_checkpoint(checkpoint, tmp_path, capsys):
    assert cli.main(["evaluate", str(checkpoint), "--beam", "2"]) == 0
    assert "exact match" in capsys.readouterr().out
    out = tmp_path / "graph.dot"
    assert cli.main(["graph", str(checkpoint), "--text", "abc", "--out", str(out)]) == 0
    source = out.read_text()
    boxes = ("encoder/layer0/self_attention", "encoder/layer0/feed_forward", "decoder/layer0/self_attention",
             "decoder/layer0/cross_attention", "decoder/layer0/feed_forward")
    for box in boxes:
        # A box with no nodes of its own joins its one child's (self_attention/multi_head_attention).
        assert re.search(f'subgraph "cluster_{box}(/[a-z_]+)*"', source), box


@pytest.mark.parametrize(("flags", "message"), [
    (["--arch", "transformer", "--cell", "lstm"], "--cell is not an option of --arch transformer"),
    (["--arch", "transformer", "--hidden", "8", "--embed", "4"], "--embed, --hidden are not an option"),
    (["--d-model", "8"], "--d-model is not an option of --arch seq2seq"),
    (["--arch", "transformer", "--d-model", "10", "--heads", "4"], "nhead=4 must divide d_model=10"),
])
def test_options_of_the_other_architecture_are_refused(flags, message, tmp_path, capsys):
    out = str(tmp_path / "x.ckpt")
    assert cli.main(["train", "--task", "copy", "--steps", "1", "--out", out, *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_checkpoint_of_an_unknown_architecture_says_so(checkpoint, tmp_path):
    state = ta.load(checkpoint)
    state["arch"] = "mamba"
    ta.save(state, tmp_path / "odd.ckpt")
    with pytest.raises(ta.SerializationError, match="architecture 'mamba', which this version does not know"):
        ta.models.load_checkpoint(tmp_path / "odd.ckpt")
    del state["arch"]                                  # files from before the Transformer
    state["config"] = ta.models.Seq2Seq(8, 8, embed=4, hidden=4).config
    state["model"] = ta.models.Seq2Seq(8, 8, embed=4, hidden=4).state_dict()
    ta.save(state, tmp_path / "old.ckpt")
    assert isinstance(ta.models.load_checkpoint(tmp_path / "old.ckpt")[0], ta.models.Seq2Seq)


def test_greedy_output_of_the_cli_matches_the_library(checkpoint, capsys):
    model, info = ta.models.load_checkpoint(checkpoint)
    output, *_ = ta.models.translate(model, "abca", info)
    assert cli.main(["translate", str(checkpoint), "abca"]) == 0
    assert f"'abca' -> {output!r}" in capsys.readouterr().out
    assert np.isfinite(model(np.array([[4, 5]]), np.array([[1, 4]]))[0].numpy()).all()
