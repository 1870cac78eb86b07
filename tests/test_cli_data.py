"""The command line on a user's own files: train --data, evaluate --json/--output,
translate -, --resume, and bad input (one line on stderr, status 2, nothing written)."""

import io
import json
import re

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import cli

LETTERS = "abcdef"


def write_pairs(path, count, seed):
    """Words of 2-5 letters -> their letters reversed, space-separated ("abc" -> "c b a")."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(count):
        word = "".join(rng.choice(list(LETTERS), size=rng.integers(2, 6)))
        lines.append(f"{word}\t{' '.join(reversed(word))}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines


TRAIN = ["--src-tokens", "char", "--tgt-tokens", "space", "--hidden", "24", "--embed", "8",
         "--batch-size", "16", "--lr", "1e-2", "--eval-every", "20", "--no-progress"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One small run on a file: its folder, checkpoint and the test file's lines."""
    folder = tmp_path_factory.mktemp("files")
    write_pairs(folder / "train.tsv", 600, seed=0)
    test_lines = write_pairs(folder / "test.tsv", 40, seed=1)
    checkpoint = folder / "run.ckpt"
    assert cli.main(["train", "--data", str(folder / "train.tsv"), *TRAIN, "--steps", "60",
                     "--out", str(checkpoint)]) == 0
    return folder, checkpoint, test_lines


def test_cli_train_on_a_file_records_its_tokenization_and_log(run, capsys):
    folder, checkpoint, _ = run
    model, info = ta.models.load_checkpoint(checkpoint)
    assert info.tokenization == {"src": "char", "tgt": "space", "lowercase": False}
    assert info.extras["source"]["data"] == str(folder / "train.tsv")
    evaluations = [json.loads(line) for line in (folder / "run.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evaluations] == [20, 40, 60]
    assert set(evaluations[0]) >= {"train_loss", "valid_loss", "valid_exact_match", "best_step", "lr"}


def test_cli_evaluate_json_is_one_object_with_the_metrics(run, capsys):
    folder, checkpoint, test_lines = run
    assert cli.main(["evaluate", str(checkpoint), "--data", str(folder / "test.tsv"), "--json"]) == 0
    out = capsys.readouterr().out
    metrics = json.loads(out)                      # exactly one JSON object: nothing else printed
    assert set(metrics) >= {"n", "exact_match", "token_error_rate", "bleu", "chrf"}
    assert metrics["n"] == len({line.split("\t")[0] for line in test_lines})
    model, info = ta.models.load_checkpoint(checkpoint)
    pairs = ta.data.read_pairs(folder / "test.tsv", "char", "space")
    assert metrics == ta.models.evaluate(model, pairs, info.src_vocab, info.tgt_vocab)


def test_cli_evaluate_output_writes_one_detokenized_line_per_pair(run, capsys):
    folder, checkpoint, test_lines = run
    hyps = folder / "hyps.txt"
    assert cli.main(["evaluate", str(checkpoint), "--data", str(folder / "test.tsv"), "--beam", "2",
                     "--output", str(hyps)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"beam 2, length penalty 1: \d+ sources, exact match [\d.]+%, token error rate", out)
    assert "BLEU signature: nrefs:1" in out.replace("bleu signature", "BLEU signature")
    lines = hyps.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(test_lines)
    assert all(re.fullmatch(r"([a-f]( [a-f])*)?", line) for line in lines)   # phonemes joined by spaces


def test_cli_evaluate_defaults_to_the_runs_test_split(run, capsys):
    _, checkpoint, _ = run
    assert cli.main(["evaluate", str(checkpoint), "--json"]) == 0
    task = ta.data.from_pairs(ta.data.read_pairs(run[0] / "train.tsv", "char", "space"), src_tokens="char",
                              tgt_tokens="space")
    assert json.loads(capsys.readouterr().out)["n"] == len(ta.data.references(task.test))


def test_cli_translate_stdin_with_n_best_writes_n_lines_per_input_line(run, monkeypatch, capsys):
    _, checkpoint, _ = run
    monkeypatch.setattr("sys.stdin", io.StringIO("abc\n\nfed\n"))
    assert cli.main(["translate", str(checkpoint), "-", "--beam", "3", "--n-best", "2"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines[-1] == "" and len(lines[:-1]) == 6 and lines[2:4] == ["", ""]
    model, info = ta.models.load_checkpoint(checkpoint)
    src = ta.data.encode_batch([list("abc")], info.src_vocab)
    [nbest] = model.beam_search(src, beam=3, max_len=ta.models.evaluation.default_max_len(3), n_best=2)
    # Decoded beside "fed" the float32 products run over more rows than alone: scores agree to
    # rounding, the hypotheses exactly.
    printed = [line.split("\t") for line in lines[:2]]
    assert [text for text, _ in printed] == [info.detokenize(info.tgt_vocab.decode(h.tokens)) for h in nbest]
    np.testing.assert_allclose([float(score) for _, score in printed], [h.score for h in nbest], rtol=1e-5)
    assert all(re.fullmatch(r"([a-f]( [a-f])*)?\t-?\d+\.\d{6}", line) for line in lines[4:6])


def test_cli_translate_stdin_writes_one_line_per_line_in_batches(run, monkeypatch, capsys):
    _, checkpoint, _ = run
    words = ["abc", "", "fed", "ab"] * 3
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(words) + "\n"))
    calls = []
    decode = ta.models.decode
    monkeypatch.setattr(ta.models, "decode", lambda *a, **k: calls.append(len(a[1])) or decode(*a, **k))
    assert cli.main(["translate", str(checkpoint), "-", "--batch-size", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(words)
    assert [line == "" for line in lines] == [word == "" for word in words]
    assert calls == [9]                              # one call for the 9 words, decoded 4 at a time
    model, info = ta.models.load_checkpoint(checkpoint)
    expected = ta.models.decode(model, [list("abc")], info.src_vocab, info.tgt_vocab)[0]
    assert lines[0] == " ".join(expected)


def test_cli_resume_continues_to_the_total_and_equals_an_uninterrupted_run(tmp_path, capsys):
    write_pairs(tmp_path / "train.tsv", 300, seed=2)
    common = ["train", "--data", str(tmp_path / "train.tsv"), *TRAIN, "--dropout", "0.1"]
    assert cli.main([*common, "--steps", "40", "--out", str(tmp_path / "whole.ckpt")]) == 0
    part = ["--steps", "40", "--time-limit", "1e-9", "--out", str(tmp_path / "part.ckpt")]
    assert cli.main([*common, *part]) == 0
    assert ta.load(tmp_path / "part.ckpt")["training"]["step"] == 1           # stopped after one step
    assert cli.main(["train", "--resume", str(tmp_path / "part.ckpt"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "resuming" in out and "at step 1 of 40" in out
    whole, part = ta.load(tmp_path / "whole.ckpt"), ta.load(tmp_path / "part.ckpt")
    assert part["training"]["step"] == 40
    for name, value in whole["model"].items():
        np.testing.assert_array_equal(part["model"][name], value, err_msg=name)
    strip = [{k: v for k, v in json.loads(line).items() if k != "seconds"}
             for line in (tmp_path / "whole.jsonl").read_text().splitlines()]
    again = [{k: v for k, v in json.loads(line).items() if k != "seconds"}
             for line in (tmp_path / "part.jsonl").read_text().splitlines()]
    assert strip == again


def test_cli_bad_data_and_resume_input_is_one_line_and_writes_nothing(run, tmp_path, capsys, monkeypatch):
    _, checkpoint, _ = run
    bad = tmp_path / "bad.tsv"
    bad.write_text("ab\tb a\nabc c b a\n", encoding="utf-8")
    plain = tmp_path / "plain.ckpt"
    model, info = ta.models.load_checkpoint(checkpoint)
    ta.models.save_checkpoint(plain, model, info.task)
    out = tmp_path / "never.ckpt"
    cases = [
        (["train", "--data", str(bad), "--out", str(out)], f"{bad}:2: "),
        (["train", "--data", str(tmp_path / "missing.tsv"), "--out", str(out)], "no such file"),
        (["train", "--task", "copy", "--data", str(bad), "--out", str(out)], "either --task or --data"),
        (["train", "--valid", str(bad), "--out", str(out)], "--valid goes with --data"),
        (["train", "--resume", str(checkpoint), "--hidden", "8"],
         "--hidden 8 (the run's: 24): a resumed run keeps"),
        (["train", "--resume", str(plain)], "no training state to resume"),
        (["evaluate", str(checkpoint), "--data", str(bad)], f"{bad}:2: "),
        (["evaluate", str(plain)], "does not record its data"),
        (["evaluate", str(checkpoint), "--output", str(tmp_path)], "is a directory"),
        (["translate", str(checkpoint), "-", "abc"], "cannot be mixed"),
    ]
    for argv, message in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert message in err, (argv, err)
    assert not out.exists()
    monkeypatch.setattr("sys.stdin", io.StringIO("abc\nabz\n"))
    hyps = tmp_path / "hyps.txt"
    assert cli.main(["translate", str(checkpoint), "-"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "<stdin>:2: " in captured.err and "'z'" in captured.err
    assert not hyps.exists()


def test_cli_translate_stdin_ends_lines_only_at_newline_and_names_bad_utf8(run, monkeypatch, capsys):
    _, checkpoint, _ = run

    def stdin(data: bytes):
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="latin-1"))

    stdin(b"ab\r\nabc\n\nfe")               # CRLF, a blank line, no newline at the end
    assert cli.main(["translate", str(checkpoint), "-"]) == 0
    assert [line == "" for line in capsys.readouterr().out.split("\n")] == [False, False, True, False, True]
    stdin(b"ab\x0cc\n")                      # a form feed is a character, not a line end
    assert cli.main(["translate", str(checkpoint), "-"]) == 2
    assert "<stdin>:1: " in capsys.readouterr().err
    stdin(b"abc\nab\xffc\n")
    assert cli.main(["translate", str(checkpoint), "-"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "<stdin>:2: invalid UTF-8 (byte 0xff)" in captured.err


def test_cli_resume_from_another_directory_and_a_vanished_data_file(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    write_pairs(folder / "train.tsv", 200, seed=4)
    monkeypatch.chdir(folder)
    assert cli.main(["train", "--data", "train.tsv", *TRAIN, "--steps", "20", "--time-limit", "1e-9",
                     "--out", "run.ckpt"]) == 0
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--resume", "data/run.ckpt", "--out", "copy.ckpt", "--no-progress"]) == 0
    assert ta.load(tmp_path / "copy.ckpt")["training"]["step"] == 20
    assert ta.load(folder / "run.ckpt")["training"]["step"] == 1           # the original is left as it was
    (folder / "train.tsv").rename(folder / "moved.tsv")
    capsys.readouterr()
    assert cli.main(["train", "--resume", "copy.ckpt"]) == 2
    err = capsys.readouterr().err
    assert "cannot read the data file" in err and len(err.strip().splitlines()) == 1


def test_cli_failed_new_run_keeps_the_old_runs_log(run, tmp_path, capsys):
    folder, checkpoint, _ = run
    log = folder / "run.jsonl"
    before = log.read_text()
    assert cli.main(["train", "--task", "copy", "--patience", "3", "--out", str(checkpoint)]) == 2
    assert "need validation" in capsys.readouterr().err
    assert log.read_text() == before
