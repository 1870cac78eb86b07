"""The examples run and print what their docstrings promise."""

import runpy
from pathlib import Path

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
