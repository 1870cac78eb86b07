"""Missing extras skip a user's test run, and fail CI's (TINYGRAD_ATTN_REQUIRE_EXTRAS=1)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NEEDS_A_MISSING_EXTRA = '''
from tests import optional


def test_uses_it():
    optional.module("no_such_extra_module", "no_such_extra_module is not installed (pip install it)")
'''


@pytest.mark.parametrize(("required", "outcome"), [("", "1 skipped"), ("1", "1 failed")])
def test_a_missing_extra_skips_unless_extras_are_required(tmp_path, required, outcome):
    (tmp_path / "test_missing.py").write_text(NEEDS_A_MISSING_EXTRA)
    env = {**os.environ, "TINYGRAD_ATTN_REQUIRE_EXTRAS": required, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                          str(tmp_path / "test_missing.py")], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert outcome in run.stdout, run.stdout
    assert "no_such_extra_module is not installed (pip install it)" in run.stdout
    assert ("requires it" in run.stdout) == (required == "1")
