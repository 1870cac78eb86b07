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


def _package_imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports, function-level imports included."""
    import ast

    root = README.parent
    files = [p for folder in ("tinygrad_attn", "compiler", "viz") for p in (root / folder).rglob("*.py")]

    def name_of(path: Path) -> str:
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[0] in ("compiler", "viz"):            # installed inside the package
            parts = ["tinygrad_attn", *parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    names = {name_of(path) for path in files}
    graph = {}
    for path in files:
        name, package = name_of(path), path.name == "__init__.py"
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    candidate = f"{module}.{alias.name}"
                    found.add(candidate if candidate in names else module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in names and m != name}
    return graph


def test_imports_flow_one_way_with_no_cycle():
    graph = _package_imports()
    assert graph["tinygrad_attn.autograd"] == set()          # autograd imports nothing of the package
    state: dict[str, int] = {}

    def visit(module, path):
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
