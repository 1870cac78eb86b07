"""The README's code runs as written, and imports flow one way."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinygrad_attn.autograd import registry

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
PRELUDE = "import numpy as np\nimport tinygrad_attn as ta\nfrom tinygrad_attn import Tensor\n"


@pytest.mark.parametrize("index", [k for k, b in enumerate(BLOCKS) if ">>>" not in b])
def test_readme_python_block_runs(index, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                 # files the examples write land here
    before = set(registry)
    try:
        exec(compile(PRELUDE + BLOCKS[index], f"README block {index}", "exec"), {})
    finally:
        for name in set(registry) - before:
            del registry[name]


def test_readme_shows_the_two_setup_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_import_is_light_and_flows_one_way():
    probe = ("import sys, tinygrad_attn\n"
             "print('sympy' in sys.modules, 'tinygrad_attn.viz' in sys.modules, 'numba' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_compiler_never_imports_the_engine():
    compiler = Path(__file__).resolve().parents[1] / "compiler"
    for path in compiler.glob("*.py"):
        source = path.read_text()
        assert "tinygrad_attn" not in re.sub(r'""".*?"""', "", source, flags=re.S), path
