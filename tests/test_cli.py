"""The command line, called in-process through ``main(argv)`` with tiny budgets, plus the
installed ``tinygrad-attn`` script and ``python -m tinygrad_attn`` in a child process."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import cli
from tinygrad_attn.check import OpsReport, Report

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("tinygrad-attn")
TINY = ["--task", "copy", "--length", "4", "--steps", "30", "--hidden", "16", "--embed", "8"]
WEIGHT = re.compile(r"^\d\.\d\d$")


@pytest.fixture(scope="module")
def copy_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "copy.ckpt"
    assert cli.main(["train", *TINY, "--no-progress", "--out", str(path)]) == 0
    return path


def attention_rows(text: str) -> tuple[list[str], list[tuple[str, list[float]]]]:
    """The column labels and (row label, weights) of the first matrix ``translate`` printed."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if " -> " in line) + 1
    columns = lines[start].split()
    rows = []
    for line in lines[start + 1 :]:
        fields = line.split()
        if len(fields) != len(columns) + 1 or not all(WEIGHT.match(f) for f in fields[1:]):
            break
        rows.append((fields[0], [float(f) for f in fields[1:]]))
    return columns, rows


# ---------------------------------------------------------------- help, version, packaging


def test_cli_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("demo", "train", "evaluate", "translate", "verify", "bench"):
        assert command in out


@pytest.mark.parametrize("command", ["demo", "train", "evaluate", "translate", "verify", "bench"])
def test_cli_command_help_exits_zero(command, capsys):
    assert cli.main([command, "--help"]) == 0
    assert f"usage: tinygrad-attn {command}" in capsys.readouterr().out


def test_cli_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"tinygrad-attn {ta.__version__}"


def test_cli_console_script_runs():
    if not SCRIPT.exists():
        pytest.skip(f"{SCRIPT} is not installed (pip install -e . creates it)")
    result = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "usage: tinygrad-attn" in result.stdout


def test_cli_python_dash_m_and_lean_import():
    result = subprocess.run([sys.executable, "-m", "tinygrad_attn", "--version"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"tinygrad-attn {ta.__version__}"
    probe = ("import sys, tinygrad_attn\n"
             "print(sorted(m for m in ('tqdm', 'tinygrad_attn.cli') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


# ---------------------------------------------------------------- train and translate


def test_cli_train_saves_checkpoint_with_step_and_metrics(copy_checkpoint):
    model, info = ta.models.load_checkpoint(copy_checkpoint)
    assert info.name == "copy"
    assert model.config["hidden"] == 16 and model.config["attention"] == "additive"
    assert info.extras["step"] == 30
    assert set(info.extras["metrics"]) == {"n", "exact_match", "token_error_rate", "bleu", "chrf"}
    assert info.extras["metrics"]["n"] == 500
    assert info.extras["source"] == {"task": "copy", "options": {"length": 4}}


def test_cli_train_progress_lines_without_a_terminal_and_default_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--task", "reverse", "--length", "3", "--steps", "20", "--hidden", "8", "--embed", "4",
            "--cell", "lstm", "--attention", "dot", "--style", "luong"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert (tmp_path / "checkpoints" / "reverse-lstm-dot.ckpt").is_file()
    progress = re.findall(r"^step (\d+)/20: loss [\d.]+, [\d,]+ tok/s", captured.out, re.M)
    assert progress == [str(step) for step in range(2, 21, 2)]          # a line every tenth
    assert "\r" not in captured.out + captured.err                        # no bar redrawn in a log
    assert re.search(r"exact match \d+\.\d%, token error rate \d+\.\d\d%, BLEU", captured.out)
    assert "checkpoints/reverse-lstm-dot.ckpt" in captured.out


def test_cli_train_shows_a_bar_on_a_terminal(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    argv = ["train", *TINY[:4], "--steps", "3", "--hidden", "8", "--embed", "4", "--out", str(tmp_path / "c")]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "tok/s" in err and "loss" in err and "training on copy" in err          # tqdm's postfix


def test_cli_translate_prints_output_and_attention_matrix(copy_checkpoint, capsys):
    assert cli.main(["translate", str(copy_checkpoint), "abcd", "dcba"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^'abcd' -> '[a-t]*'$", out, re.M)
    assert re.search(r"^'dcba' -> '[a-t]*'$", out, re.M)
    columns, rows = attention_rows(out)
    assert columns == ["a", "b", "c", "d"]
    assert rows, out
    for _, weights in rows:
        assert sum(weights) == pytest.approx(1.0, abs=0.03)        # 4 weights rounded to 0.01


def test_cli_translate_with_beam(copy_checkpoint, capsys):
    assert cli.main(["translate", str(copy_checkpoint), "aabb", "--beam", "3"]) == 0
    columns, rows = attention_rows(capsys.readouterr().out)
    assert columns == ["a", "a", "b", "b"] and rows


def test_cli_translate_n_best_prints_each_hypothesis_with_its_score(copy_checkpoint, capsys):
    assert cli.main(["translate", str(copy_checkpoint), "abcd", "--beam", "4", "--n-best", "3"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^  (\d)\. '([a-t]*)'  score (-?[\d.]+)  log P (-?[\d.]+)$", out, re.M)
    assert [rank for rank, *_ in listed] == ["1", "2", "3"]
    assert len({text for _, text, _, _ in listed}) == 3
    assert re.search(rf"^'abcd' -> '{listed[0][1]}'$", out, re.M)              # the chosen: the best
    model, info = ta.models.load_checkpoint(copy_checkpoint)
    src = ta.data.encode_batch([list("abcd")], info.src_vocab)
    [nbest] = model.beam_search(src, beam=4, max_len=ta.models.evaluation.default_max_len(4), n_best=3)
    assert [score for _, _, score, _ in listed] == [f"{h.score:.4f}" for h in nbest]
    assert [log_p for *_, log_p in listed] == [f"{h.log_prob:.4f}" for h in nbest]
    # the attention printed under the list is the chosen hypothesis'
    unlisted = "\n".join(line for line in out.splitlines() if not re.match(r"  \d\. ", line))
    columns, rows = attention_rows(unlisted)
    assert columns == ["a", "b", "c", "d"] and len(rows) == len(nbest[0].tokens)


def test_cli_translate_length_penalty_reaches_the_beam_search(copy_checkpoint, capsys):
    # alpha 0: the score is log P itself, and the list is the search's at alpha 0.
    argv = ["abcd", "--beam", "4", "--n-best", "3", "--length-penalty", "0"]
    assert cli.main(["translate", str(copy_checkpoint), *argv]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^  \d\. '[a-t]*'  score (-?[\d.]+)  log P (-?[\d.]+)$", out, re.M)
    assert listed and all(score == log_p for score, log_p in listed)
    model, info = ta.models.load_checkpoint(copy_checkpoint)
    src = ta.data.encode_batch([list("abcd")], info.src_vocab)
    [nbest] = model.beam_search(src, beam=4, max_len=ta.models.evaluation.default_max_len(4), n_best=3,
                                length_penalty=0.0)
    assert [score for score, _ in listed] == [f"{h.score:.4f}" for h in nbest]


def test_cli_length_penalty_needs_a_beam_and_a_number_at_least_0(copy_checkpoint, capsys):
    for command in ("translate", "evaluate"):
        text = ["abcd"] if command == "translate" else []
        assert cli.main([command, str(copy_checkpoint), *text, "--length-penalty", "0.6"]) == 2
        assert "--length-penalty scores beam search hypotheses: it needs --beam K" in capsys.readouterr().err
        assert cli.main([command, str(copy_checkpoint), *text, "--beam", "2", "--length-penalty", "-1"]) == 2
        assert "expected a finite number >= 0, got -1.0" in capsys.readouterr().err


def test_cli_translate_n_best_needs_a_wide_enough_beam(copy_checkpoint, capsys):
    for argv in (["--n-best", "2"], ["--beam", "2", "--n-best", "3"]):
        assert cli.main(["translate", str(copy_checkpoint), "abcd", *argv]) == 2
        assert "--n-best" in capsys.readouterr().err


# ---------------------------------------------------------------- errors: one line, status 2


def _error_cases(tmp_path, checkpoint):
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"not a checkpoint at all")
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(Path(checkpoint).read_bytes()[:300])
    return [
        (["translate", str(tmp_path / "missing.ckpt"), "abc"], "does not exist"),
        (["translate", str(corrupt), "abc"], "not a tinygrad_attn checkpoint"),
        (["translate", str(truncated), "abc"], "damaged"),
        (["translate", str(checkpoint), "abz!"], "lacks: 'z', '!'"),
        (["train", "--task", "klingon"], "invalid choice: 'klingon'"),
        (["train", "--task", "dates", "--length", "5"], "--length applies to the copy and reverse"),
        (["train", "--steps", "0"], "expected a positive integer"),
        (["train", "--attention", "dot", "--bidirectional"], "attention='dot' needs"),
        (["train", "--lr", "inf"], "expected a positive finite number, got inf"),
        (["train", "--task", "copy", "--length", "100000"], "expected an integer from 1 to 1000"),
        (["train", "--threads", "1000"], "expected an integer from 1 to"),
        (["train", "--task", "copy", "--length", "3", "--hidden", "200000",
          "--out", str(tmp_path / "x.ckpt")], "does not fit in memory"),
        (["demo", "--out-dir", str(corrupt)], "is a file, not a directory"),
        (["demo", "--out-dir", "/proc/x"], "cannot create --out-dir /proc/x"),
        (["translate", str(checkpoint)], "required"),
        ([], "required"),
    ]


def test_cli_errors_are_one_line_with_status_2(tmp_path, copy_checkpoint, capsys):
    for argv, message in _error_cases(tmp_path, copy_checkpoint):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err
        assert message in err, (argv, err)


def test_cli_heatmap_without_viz_support_says_so(copy_checkpoint, tmp_path, capsys):
    if hasattr(ta.viz, "heatmap"):
        path = tmp_path / "attention.svg"
        assert cli.main(["translate", str(copy_checkpoint), "abcd", "--heatmap", str(path)]) == 0
        assert path.exists()
        return
    assert cli.main(["translate", str(copy_checkpoint), "abcd", "--heatmap", str(tmp_path / "a.svg")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "ta.viz.heatmap" in err


# ---------------------------------------------------------------- verify, bench, demo


def test_cli_verify_passes_and_prints_both_reports(capsys):
    assert cli.main(["verify"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"(\d+) of \1 ops pass both checks", out)
    assert "symbolic check of bahdanau_step_logit: ok" in out
    assert "d/d attention.W_q (2, 2) float64" in out and "d/d cell.weight_hh" in out
    assert "verify: all gradients match" in out


def test_cli_verify_fails_when_a_check_fails(monkeypatch, capsys):
    broken = Report("symbolic", "bahdanau_step_logit", error="ValueError: broken on purpose")
    monkeypatch.setattr(ta.check, "ops", lambda: OpsReport([]))
    monkeypatch.setattr(ta.models.BahdanauStep, "verify", classmethod(lambda cls: broken))
    assert cli.main(["verify"]) == 1
    assert "verify: FAILED" in capsys.readouterr().out


def test_cli_bench_prints_ms_per_step_and_tokens_per_second(capsys):
    before = ta.get_num_threads() if hasattr(ta, "get_num_threads") else None
    assert cli.main(["bench", "--steps", "2", "--hidden", "8", "--batch-size", "4", "--threads", "1"]) == 0
    if before is not None:
        assert ta.get_num_threads() == before          # in-process callers keep their setting
    out = capsys.readouterr().out
    assert re.search(r"\d+\.\d ms median of 2 steps", out)
    assert re.search(r"[\d,]+ target tokens/s", out)
    assert "bench/seq2seq.py" in out


def test_cli_demo_quick_runs_every_part(tmp_path, capsys):
    assert cli.main(["demo", "--quick", "--no-progress", "--out-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"held-out: 500 dates .* exact match \d+\.\d%", out)
    for text, _ in cli.DEMO_DATES:
        assert f"{text!r} -> " in out
    assert "attention while translating '3 may 1998'" in out
    assert "symbolic check of bahdanau_step_logit: ok" in out
    assert "summary:" in out
    assert (tmp_path / "out" / "dates.ckpt").is_file()
    if not hasattr(ta.viz, "heatmap"):
        assert "come with the viz package" in out


def test_train_refuses_a_bad_seed_or_output_before_training(tmp_path, capsys):
    assert cli.main(["train", "--task", "copy", "--length", "3", "--seed", "-1"]) == 2
    assert "expected an integer >= 0" in capsys.readouterr().err
    status = cli.main(["train", "--task", "copy", "--length", "3", "--steps", "1", "--no-progress",
                       "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and "is a directory" in err and "Traceback" not in err


# ---------------------------------------------------------------- graph

GRAPH_SIZE = re.compile(r"wrote the (?:gradient )?graph to (\S+): (\d+) nodes, (\d+) edges, (\d+) boxes")


def drawn(out: str) -> tuple[str, int, int, int]:
    """The path and the node, edge and box counts ``graph`` printed."""
    match = GRAPH_SIZE.search(out)
    assert match, out
    path, nodes, edges, boxes = match.groups()
    return path, int(nodes), int(edges), int(boxes)


def test_cli_graph_is_listed_and_has_help(capsys):
    assert cli.main(["--help"]) == 0
    assert "graph" in capsys.readouterr().out
    assert cli.main(["graph", "--help"]) == 0
    assert "usage: tinygrad-attn graph" in capsys.readouterr().out


def test_cli_graph_draws_an_untrained_model_as_svg(tmp_path, capsys):
    path = tmp_path / "pictures" / "seq2seq.svg"          # the folder is created
    assert cli.main(["graph", "--attention-edges", "--out", str(path)]) == 0
    out = capsys.readouterr().out
    assert "untrained model: cell='gru', attention='additive'" in out
    assert "3 source steps, 2 decoder steps" in out
    printed, nodes, _, boxes = drawn(out)
    assert printed == str(path) and nodes > 20
    # encoder, its t0..t2, decoder, its t0 and t1, one attention box in each decoder step
    assert boxes == 9
    svg = path.read_text()
    assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    for title in ("encoder", "decoder", "attention / additive_attention", "MaskedSoftmax"):
        assert title in svg


def test_cli_graph_dot_source_matches_the_printed_counts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))               # .dot needs no Graphviz program
    path = tmp_path / "lstm.dot"
    argv = ["graph", "--cell", "lstm", "--attention", "general", "--style", "luong", "--hidden", "3",
            "--src-len", "6", "--tgt-len", "3", "--collapse", "1", "--rankdir", "LR", "--out", str(path)]
    assert cli.main(argv) == 0
    _, nodes, edges, boxes = drawn(capsys.readouterr().out)
    source = path.read_text()
    assert source.startswith("digraph") and "rankdir=LR" in source
    assert "… 4 steps …" in source                           # encoder t1..t4 as one node
    assert len(re.findall(r"^\s*\w+ \[label=", source, re.M)) == nodes
    assert len(re.findall(r"^\s*\w+ -> \w+", source, re.M)) == edges
    assert source.count("subgraph ") == boxes


def test_cli_graph_backward_and_values(tmp_path, capsys):
    path = tmp_path / "grad.dot"
    assert cli.main(["graph", "--backward", "--values", "--collapse", "attention", "--out", str(path)]) == 0
    _, nodes, _, _ = drawn(capsys.readouterr().out)
    source = path.read_text()
    assert "d%" in source and "= 1" in source                # gradient edges and the seed d(loss) = 1
    assert "grad [" in source                                # --values ran backward: gradients shown
    assert "box3d" in source                                 # each attention call folded into one box
    assert nodes > 10


def test_cli_graph_of_a_checkpoint_on_text_and_on_a_held_out_source(copy_checkpoint, tmp_path, capsys):
    path = tmp_path / "copy.svg"
    assert cli.main(["graph", str(copy_checkpoint), "--text", "abcd", "--attention-edges",
                     "--out", str(path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"copy model \(cell='gru'.*\): 'abcd' -> '[a-t]*', teacher-forced on its greedy "
                     r"output: 4 source steps, \d+ decoder steps", out), out
    assert path.stat().st_size > 1000
    held_out = ta.data.load("copy", length=4).test[0][0]
    assert cli.main(["graph", str(copy_checkpoint), "--tgt-len", "2", "--out", str(tmp_path / "g.dot")]) == 0
    out = capsys.readouterr().out
    assert f"'{''.join(held_out)}' -> " in out
    assert re.search(r"4 source steps, [12] decoder steps", out), out    # at most --tgt-len


def test_cli_graph_errors_are_one_line_with_status_2(tmp_path, copy_checkpoint, monkeypatch, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("")
    (tmp_path / "folder.svg").mkdir()
    locked = tmp_path / "locked.svg"
    locked.write_text("<svg/>")
    locked.chmod(0o444)
    out = str(tmp_path / "g.svg")
    cases = [
        (["graph", "--out", str(locked)], "is read-only"),
        (["graph", "--out", str(tmp_path / "g.txt")], "cannot tell the format from the suffix"),
        (["graph", "--out", str(a_file / "g.svg")], "cannot create the directory"),
        (["graph", "--out", str(tmp_path / "folder.svg")], "is a directory"),
        (["graph"], "required: --out"),
        (["graph", "--text", "abc", "--out", out], "--text needs a CHECKPOINT"),
        (["graph", "--attention", "dot", "--bidirectional", "--out", out], "attention='dot' needs"),
        (["graph", "--collapse", "0", "--out", out], "expected a positive integer"),
        (["graph", "--rankdir", "XY", "--out", out], "invalid choice: 'XY'"),
        (["graph", str(tmp_path / "missing.ckpt"), "--out", out], "does not exist"),
        (["graph", str(copy_checkpoint), "--cell", "lstm", "--src-len", "4", "--out", out],
         "--cell, --src-len describe the untrained model"),
        (["graph", str(copy_checkpoint), "--text", "abz!", "--out", out], "lacks: 'z', '!'"),
    ]
    for argv, message in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err
        assert message in err, (argv, err)
    assert not (tmp_path / "g.svg").exists()

    monkeypatch.setenv("PATH", str(tmp_path))               # no Graphviz 'dot' to run
    assert cli.main(["graph", "--out", out]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Graphviz's 'dot' program was not found" in err
    assert "graph.dot" in err                                # the way out: write the DOT source


def test_cli_train_label_smoothing_and_checkpoint_averaging_reach_the_run(tmp_path, capsys):
    """--label-smoothing and --average-last are the run's settings (resumed with it, refused
    changed) and the checkpoint holds the mean of the last evaluations' weights."""
    out = tmp_path / "avg.ckpt"
    rng = np.random.default_rng(0)
    for name, count in (("train", 200), ("valid", 20)):
        words = ["".join(rng.choice(list("abcdef"), 4)) for _ in range(count)]
        (tmp_path / f"{name}.tsv").write_text("".join(f"{w}\t{w[::-1]}\n" for w in words))
    argv = ["train", "--data", str(tmp_path / "train.tsv"), "--valid", str(tmp_path / "valid.tsv"),
            "--steps", "12", "--hidden", "8", "--embed", "4", "--eval-every", "4",
            "--label-smoothing", "0.1", "--average-last", "2", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    saved = ta.load(out)
    assert saved["training"]["settings"]["label_smoothing"] == 0.1
    assert saved["training"]["settings"]["average_last"] == 2
    assert saved["extras"]["averaged_steps"] == [8, 12]
    assert "the mean of the weights at steps 8, 12 is in" in printed
    # The file's weights are the mean of the two evaluations' snapshots the run kept.
    snapshots = saved["training"]["snapshots"]
    assert [entry["step"] for entry in snapshots] == [8, 12]
    model, _ = ta.models.load_checkpoint(out)
    for name, value in model.state_dict().items():
        want = (snapshots[0]["weights"][name].astype(np.float64) + snapshots[1]["weights"][name]) / 2
        np.testing.assert_array_equal(value, want.astype(value.dtype))
    # A resumed run keeps them: a different value is refused, naming the run's.
    assert cli.main(["train", "--resume", str(out), "--steps", "16", "--label-smoothing", "0.2",
                     "--no-progress"]) == 2
    assert "--label-smoothing 0.2 (the run's: 0.1)" in capsys.readouterr().err
    assert cli.main(["train", "--label-smoothing", "1"]) == 2
    assert "expected a number in [0, 1)" in capsys.readouterr().err
