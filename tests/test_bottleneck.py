"""examples/bottleneck.py runs end to end and writes its table (a tiny budget: the numbers
themselves are only measured by the full run)."""

import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "bottleneck.py"
LENGTHS = [3, 5]


@pytest.fixture(scope="module")
def bottleneck():
    # Not run as __main__, so the script leaves this process's thread settings alone.
    return runpy.run_path(str(SCRIPT), run_name="bottleneck")


@pytest.fixture
def quick_run(bottleneck, tmp_path, monkeypatch, capsys):
    # Hide matplotlib whether or not it is installed, so the skip path always runs and no
    # test depends on a plotting library.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "table.md"
    argv = ["--quick", "--lengths", *map(str, LENGTHS), "--steps", "3",
            "--out", str(out), "--plot", str(tmp_path / "plot.png")]
    results = bottleneck["main"](argv)
    return results, out.read_text(), capsys.readouterr().out, tmp_path


def test_bottleneck_table_has_both_variants_at_every_length(quick_run):
    results, markdown, _, _ = quick_run
    assert "no attention: token acc" in markdown
    assert "| attention: token acc" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and line[2:8].strip().isdigit()]
    assert [int(row.split("|")[1]) for row in rows] == LENGTHS
    for row in rows:
        values = [float(cell) for cell in row.split("|")[2:-1]]
        assert len(values) == 4
        assert all(0.0 <= value <= 1.0 for value in values)
    assert set(results) == {(variant, length) for variant in ("no attention", "attention")
                            for length in LENGTHS}


def test_bottleneck_prints_one_line_per_run_and_the_table(quick_run):
    _, markdown, stdout, _ = quick_run
    run_lines = [line for line in stdout.splitlines() if line.startswith("length ")]
    assert len(run_lines) == 2 * len(LENGTHS)
    assert all(line.endswith(" s)") for line in run_lines)
    table = markdown[markdown.index("| length"):].strip()
    assert table in stdout


def test_bottleneck_skips_the_plot_with_a_note_without_matplotlib(quick_run):
    _, _, stdout, tmp_path = quick_run
    notes = [line for line in stdout.splitlines() if "matplotlib" in line]
    assert len(notes) == 1 and "not installed" in notes[0]
    assert not (tmp_path / "plot.png").exists()
