"""What the command line writes, and what stops it: outputs that would overwrite an input are
refused; links, FIFOs and '-' as outputs; a diverging run stops with its log intact; sources
longer than a Transformer's position table are refused before any work; SIGTERM saves a
resumable run; a resumed run accepts the flags it was started with."""

import io
import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import tinygrad_attn as ta
from tests.test_cli_data import TRAIN, write_pairs
from tinygrad_attn import cli

pytestmark = pytest.mark.skipif(os.name != "posix", reason="links, FIFOs and signals as on POSIX")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One small run on a file: its folder, checkpoint and test file."""
    folder = tmp_path_factory.mktemp("outputs")
    write_pairs(folder / "train.tsv", 300, seed=0)
    write_pairs(folder / "test.tsv", 30, seed=1)
    checkpoint = folder / "run.ckpt"
    assert cli.main(["train", "--data", str(folder / "train.tsv"), *TRAIN, "--steps", "20",
                     "--out", str(checkpoint)]) == 0
    return folder, checkpoint


def one_line_error(capsys, *words):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, (word, err)
    return err


def strict_json(line: str):
    """json.loads that refuses the NaN and Infinity Python's json writes by default."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


# ---------------------------------------------------------------- outputs that are inputs


def test_outputs_that_are_inputs_of_the_run_are_refused_and_left_untouched(run, tmp_path, capsys):
    folder, checkpoint = run
    data = tmp_path / "data.tsv"
    write_pairs(data, 50, seed=5)
    logged = tmp_path / "logged.jsonl"                 # a data file named like --out's log
    write_pairs(logged, 50, seed=6)
    test = folder / "test.tsv"
    link = tmp_path / "link.ckpt"
    link.symlink_to(checkpoint)
    as_dot = tmp_path / "model.dot"                    # a checkpoint whose name graph would draw to
    as_dot.write_bytes(checkpoint.read_bytes())
    as_svg = tmp_path / "model.svg"
    as_svg.write_bytes(checkpoint.read_bytes())
    cases = [
        (["train", "--data", str(data), "--out", str(data)], "--data"),
        (["train", "--data", str(data), "--valid", str(test), "--out", str(test)], "--valid"),
        (["train", "--data", str(logged), "--out", str(tmp_path / "logged.ckpt")], "log"),
        (["train", "--resume", str(checkpoint), "--out", str(folder / "train.tsv")], "data"),
        (["evaluate", str(checkpoint), "--output", str(checkpoint)], "CHECKPOINT"),
        (["evaluate", str(checkpoint), "--output", str(link)], "CHECKPOINT"),
        (["evaluate", str(checkpoint), "--data", str(test), "--output", str(test)], "--data"),
        (["evaluate", str(checkpoint), "--output", str(folder / "train.tsv")], "data"),
        (["graph", str(as_dot), "--text", "abc", "--out", str(as_dot)], "CHECKPOINT"),
        (["translate", str(as_svg), "abc", "--heatmap", str(as_svg)], "CHECKPOINT"),
    ]
    before = {path: path.read_bytes() for path in (data, logged, test, checkpoint, as_dot, as_svg,
                                                   folder / "train.tsv")}
    for argv, word in cases:
        assert cli.main(argv) == 2, argv
        one_line_error(capsys, "same file", word)
    for path, content in before.items():
        assert path.read_bytes() == content, path
    assert link.is_symlink()
    assert not (tmp_path / "logged.ckpt").exists()


# ---------------------------------------------------------------- links, FIFOs, standard output


def hypotheses(run, tmp_path, capsys) -> str:
    """evaluate --output to a plain file: the reference for the other kinds of output."""
    folder, checkpoint = run
    plain = tmp_path / "plain.txt"
    assert cli.main(["evaluate", str(checkpoint), "--data", str(folder / "test.tsv"),
                     "--output", str(plain)]) == 0
    capsys.readouterr()
    return plain.read_text(encoding="utf-8")


def test_evaluate_output_through_a_link_writes_its_target(run, tmp_path, capsys):
    folder, checkpoint = run
    expected = hypotheses(run, tmp_path, capsys)
    target = tmp_path / "target.txt"
    target.write_text("stale\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    assert cli.main(["evaluate", str(checkpoint), "--data", str(folder / "test.tsv"),
                     "--output", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == target
    assert target.read_text(encoding="utf-8") == expected


def test_evaluate_output_to_a_fifo_feeds_its_reader(run, tmp_path, capsys):
    folder, checkpoint = run
    expected = hypotheses(run, tmp_path, capsys)
    fifo = tmp_path / "hyps.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    status = cli.main(["evaluate", str(checkpoint), "--data", str(folder / "test.tsv"),
                       "--output", str(fifo)])
    reader.join(timeout=60)
    if reader.is_alive():                              # unblock the reader before failing
        with open(fifo, "wb"):
            pass
    assert status == 0
    assert received == [expected.encode("utf-8")]
    assert fifo.is_fifo()


def test_evaluate_output_dash_writes_the_hypotheses_alone_to_stdout(run, tmp_path, capsys, monkeypatch):
    folder, checkpoint = run
    expected = hypotheses(run, tmp_path, capsys)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["evaluate", str(checkpoint), "--data", str(folder / "test.tsv"), "--output", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out == expected
    assert "exact match" in captured.err                   # the report goes to stderr instead
    assert not (tmp_path / "-").exists()                   # no file named "-"
    assert cli.main(["evaluate", str(checkpoint), "--data", str(folder / "test.tsv"), "--output", "-",
                     "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.out == expected and set(json.loads(captured.err)) >= {"n", "exact_match"}


def test_train_out_through_a_link_writes_its_target(tmp_path, capsys):
    target = tmp_path / "runs" / "real.ckpt"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "latest.ckpt"
    link.symlink_to(target)
    assert cli.main(["train", "--task", "copy", "--length", "3", "--steps", "2", "--hidden", "8",
                     "--embed", "4", "--no-progress", "--out", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == target
    assert ta.load(target)["training"]["step"] == 2


# ---------------------------------------------------------------- a diverging run


def test_train_that_diverges_stops_with_one_line_naming_the_step_and_a_strict_json_log(run, tmp_path, capsys):
    folder, _ = run
    out = tmp_path / "nan.ckpt"
    status = cli.main(["train", "--data", str(folder / "train.tsv"), *TRAIN, "--steps", "30", "--lr", "1e30",
                       "--clip", "1e30", "--eval-every", "1", "--out", str(out)])
    assert status == 2
    err = one_line_error(capsys, "step")
    assert "nan" in err.lower() or "finite" in err
    log = ta.models.log_path(out)
    for line in (log.read_text().splitlines() if log.exists() else []):
        strict_json(line)
    if out.exists():                                   # the last checkpoint written holds finite weights
        state = ta.load(out)
        for name, value in {**state["model"], **state["training"]["model"]}.items():
            assert np.isfinite(value).all(), name


# ---------------------------------------------------------------- the Transformer's position table


@pytest.fixture(scope="module")
def short_table(run):
    """A Transformer whose position table holds 12 positions, with the run's vocabularies."""
    folder, checkpoint = run
    _, info = ta.models.load_checkpoint(checkpoint)
    ta.manual_seed(0)
    model = ta.models.Transformer(info.src_vocab, info.tgt_vocab, d_model=8, nhead=2, num_encoder_layers=1,
                                  num_decoder_layers=1, dim_feedforward=16, max_len=12)
    path = folder / "table12.ckpt"
    ta.models.save_checkpoint(path, model, info.task)
    return path


def test_sources_longer_than_the_position_table_are_one_line_errors_before_any_work(short_table, tmp_path,
                                                                                    capsys, monkeypatch):
    long = "abcdef" * 3                                 # 18 characters > max_len 12
    data = tmp_path / "long.tsv"
    data.write_text(f"abc\tc b a\n{long}\t{' '.join(reversed(long))}\n", encoding="utf-8")
    out = tmp_path / "never.txt"
    cases = [
        ["evaluate", str(short_table), "--data", str(data), "--output", str(out)],
        ["translate", str(short_table), long],
        ["graph", str(short_table), "--text", long, "--out", str(tmp_path / "g.dot")],
    ]
    for argv in cases:
        assert cli.main(argv) == 2, argv
        one_line_error(capsys, "18", "max_len=12")
    assert not out.exists() and not (tmp_path / "g.dot").exists()
    monkeypatch.setattr("sys.stdin", io.StringIO(f"abc\n{long}\n"))
    assert cli.main(["translate", str(short_table), "-"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "<stdin>:2: " in captured.err and "max_len=12" in captured.err


def test_train_transformer_max_len_is_a_flag_stored_in_the_checkpoint(tmp_path, capsys):
    data = tmp_path / "words.tsv"
    write_pairs(data, 100, seed=7)
    long = "abcdefabcdef"                               # 12 source tokens; its target 13 with <start>
    with open(data, "a", encoding="utf-8") as file:
        file.write(f"{long}\t{' '.join(reversed(long))}\n")
    flags = ["train", "--arch", "transformer", "--data", str(data), "--src-tokens", "char", "--tgt-tokens",
             "space", "--d-model", "8", "--heads", "2", "--ff", "16", "--layers", "1", "--steps", "2",
             "--batch-size", "8", "--no-progress"]
    out = tmp_path / "t.ckpt"
    assert cli.main([*flags, "--max-len", "12", "--out", str(out)]) == 2
    one_line_error(capsys, "--max-len", "13")
    assert not out.exists()
    assert cli.main([*flags, "--max-len", "13", "--out", str(out)]) == 0
    model, _ = ta.models.load_checkpoint(out)
    assert model.max_len == 13 and model.config["max_len"] == 13
    capsys.readouterr()
    assert cli.main(["train", "--task", "copy", "--max-len", "20", "--out", str(tmp_path / "s.ckpt")]) == 2
    one_line_error(capsys, "--max-len is not an option of --arch seq2seq")


def test_train_transformer_names_the_longest_pair_of_every_split_the_run_reads(tmp_path, capsys):
    """The run decodes its test split at the end: a test pair past the position table is
    refused before any work too, and the message names the longest pair of all the splits, so
    the --max-len it gives takes every pair."""
    write_pairs(tmp_path / "train.tsv", 40, seed=1)          # words of 2 to 5 letters
    words = {"valid": ["abcdef", "bcdefa", "abcdefabcdef"],   # the last: 12 tokens, 13 with <start>
             "test": ["cdefab", "abcdefabcd"]}
    for name, sources in words.items():
        lines = "".join(f"{word}\t{' '.join(word)}\n" for word in sources)
        (tmp_path / f"{name}.tsv").write_text(lines, encoding="utf-8")
    with open(tmp_path / "test.tsv", "a", encoding="utf-8") as file:
        file.write(f"defabc\t{' '.join('abcdefabcdefab')}\n")               # a target of 14, 15 with <start>
    flags = ["train", "--arch", "transformer", "--data", str(tmp_path / "train.tsv"), "--valid",
             str(tmp_path / "valid.tsv"), "--test", str(tmp_path / "test.tsv"), "--src-tokens", "char",
             "--tgt-tokens", "space", "--d-model", "8", "--heads", "2", "--ff", "16", "--layers", "1",
             "--steps", "1", "--batch-size", "8", "--no-progress"]
    out = tmp_path / "run" / "t.ckpt"
    assert cli.main([*flags, "--max-len", "12", "--out", str(out)]) == 2
    one_line_error(capsys, "test pair 2", "a target of 14 tokens (15 with <start>)", "max_len=12",
                   "give --max-len 15 or more")
    assert not out.parent.exists()
    assert cli.main([*flags, "--max-len", "15", "--out", str(out)]) == 0


# ---------------------------------------------------------------- resuming by re-running the command


def test_resume_accepts_the_command_that_started_the_run_and_names_flags_that_differ(tmp_path, capsys,
                                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_pairs(tmp_path / "d.tsv", 200, seed=8)
    write_pairs(tmp_path / "v.tsv", 20, seed=9)
    command = ["train", "--data", "d.tsv", "--valid", "v.tsv", *TRAIN, "--dropout", "0.1", "--seed", "3",
               "--steps", "30"]
    assert cli.main([*command, "--out", "whole.ckpt"]) == 0
    assert cli.main([*command, "--time-limit", "1e-9", "--out", "half.ckpt"]) == 0
    assert ta.load(tmp_path / "half.ckpt")["training"]["step"] == 1
    capsys.readouterr()
    # The same command, the data named by an absolute path this time.
    again = [str(tmp_path / "d.tsv") if arg == "d.tsv" else arg for arg in command]
    assert cli.main([*again, "--resume", "half.ckpt", "--out", "run.ckpt"]) == 0
    whole, resumed = ta.load(tmp_path / "whole.ckpt"), ta.load(tmp_path / "run.ckpt")
    assert resumed["training"]["step"] == 30
    for name, value in whole["training"]["model"].items():
        np.testing.assert_array_equal(resumed["training"]["model"][name], value, err_msg=name)
    capsys.readouterr()

    write_pairs(tmp_path / "other.tsv", 200, seed=10)
    changed = [arg for arg in command]
    changed[changed.index("--seed") + 1] = "4"
    changed[changed.index("--hidden") + 1] = "32"
    changed[changed.index("d.tsv")] = "other.tsv"
    assert cli.main([*changed, "--resume", "half.ckpt", "--out", "never.ckpt"]) == 2
    err = one_line_error(capsys, "--seed 4", "3", "--hidden 32", "24", "--data other.tsv",
                         str(tmp_path / "d.tsv"))
    assert "--valid" not in err and "--dropout" not in err
    assert not (tmp_path / "never.ckpt").exists()

    # Files that moved keep their contents: the command naming them where they are now resumes.
    (tmp_path / "moved").mkdir()
    (tmp_path / "d.tsv").rename(tmp_path / "moved" / "d.tsv")
    assert cli.main(["train", "--resume", "half.ckpt", "--out", "never.ckpt"]) == 2
    one_line_error(capsys, "cannot read the data file", "--data")
    moved = [str(tmp_path / "moved" / "d.tsv") if arg == "d.tsv" else arg for arg in command]
    assert cli.main([*moved, "--resume", "half.ckpt", "--out", "again.ckpt"]) == 0
    again = ta.load(tmp_path / "again.ckpt")
    assert again["extras"]["source"]["data"] == str(tmp_path / "moved" / "d.tsv")
    for name, value in whole["training"]["model"].items():
        np.testing.assert_array_equal(again["training"]["model"][name], value, err_msg=name)


# ---------------------------------------------------------------- SIGTERM

# Runs ``tinygrad-attn train`` in a child process that stops after step 7's progress line until
# a line arrives on its standard input: the test sends SIGTERM there, mid-run, then the line.
_PAUSED_TRAIN = """
import sys
from tinygrad_attn import cli
from tinygrad_attn.cli import train

shown = train.Progress.update

def update(self, record):
    shown(self, record)
    if record["step"] == 7:
        print("paused at step 7", flush=True)
        sys.stdin.readline()

train.Progress.update = update
sys.exit(cli.main(sys.argv[1:]))
"""


def test_sigterm_mid_run_saves_a_run_that_resumes_bitwise_equal_to_an_uninterrupted_one(tmp_path, capsys):
    write_pairs(tmp_path / "d.tsv", 200, seed=11)
    command = ["train", "--data", str(tmp_path / "d.tsv"), *TRAIN, "--dropout", "0.1", "--steps", "40",
               "--threads", "1"]
    assert cli.main([*command, "--out", str(tmp_path / "whole.ckpt")]) == 0
    argv = [sys.executable, "-c", _PAUSED_TRAIN, *command, "--out", str(tmp_path / "cut.ckpt")]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        for line in child.stdout:
            if line.startswith("paused at step 7"):
                break
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate("go on\n", timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 128 + signal.SIGTERM, err
    assert "step 7" in err and "resumable" in err and "Traceback" not in err
    assert ta.load(tmp_path / "cut.ckpt")["training"]["step"] == 7
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(tmp_path / "cut.ckpt"), "--no-progress", "--threads", "1"]) == 0
    whole, cut = ta.load(tmp_path / "whole.ckpt"), ta.load(tmp_path / "cut.ckpt")
    assert cut["training"]["step"] == 40
    for name, value in whole["training"]["model"].items():
        np.testing.assert_array_equal(cut["training"]["model"][name], value, err_msg=name)
    for name, value in whole["model"].items():
        np.testing.assert_array_equal(cut["model"][name], value, err_msg=name)

    def evaluations(name):
        return [{k: v for k, v in strict_json(line).items() if k != "seconds"}
                for line in (tmp_path / name).read_text().splitlines()]

    assert evaluations("whole.jsonl") == evaluations("cut.jsonl")


def test_a_reader_that_leaves_early_ends_translate_quietly(run):
    """`translate m.ckpt - | head -1`: the pipe closes under the writer; the command stops with
    SIGPIPE's status (141) and no traceback."""
    _, checkpoint = run
    argv = [sys.executable, "-m", "tinygrad_attn", "translate", str(checkpoint), "-"]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = b"abc\n" * 20000               # more output than a pipe's buffer holds
    writer = threading.Thread(target=lambda: (child.stdin.write(lines), child.stdin.close()))
    writer.start()
    try:
        assert child.stdout.readline()
        child.stdout.close()                # the reader leaves
        err = child.stderr.read().decode()
        child.wait(timeout=300)
    finally:
        writer.join(timeout=300)
        if child.poll() is None:
            child.kill()
    assert child.returncode == 128 + signal.SIGPIPE, err
    assert "Traceback" not in err


def test_train_compile_runs_and_resumes_within_a_short_position_table(tmp_path, capsys):
    """--compile pads batch lengths (pad_to "auto"), but never past the model's position
    table: a Transformer whose table just fits the data trains, and resumes, compiled."""
    data = tmp_path / "words.tsv"
    write_pairs(data, 100, seed=7)
    long = "abcdefabcdef"                    # 12 source tokens, 13 target positions: padded to 16 > 13
    with open(data, "a", encoding="utf-8") as file:
        file.write(f"{long}\t{' '.join(reversed(long))}\n" * 40)
    flags = ["train", "--arch", "transformer", "--data", str(data), "--src-tokens", "char", "--tgt-tokens",
             "space", "--d-model", "8", "--heads", "2", "--ff", "16", "--layers", "1", "--batch-size", "8",
             "--max-len", "13", "--no-progress", "--compile", "--out", str(tmp_path / "t.ckpt")]
    assert cli.main([*flags, "--steps", "6"]) == 0
    assert cli.main([*flags, "--steps", "10", "--resume", str(tmp_path / "t.ckpt")]) == 0
    _, info = ta.models.load_checkpoint(tmp_path / "t.ckpt")
    assert info.training["step"] == 10
    capsys.readouterr()
