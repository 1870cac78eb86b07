"""Every code block of the README and the documentation runs as written; the figures and tables
the README and the guide show agree with the code and bench/RESULTS.md; imports flow one way.

Python blocks of one page run in order in one namespace (a page reads like a notebook); blocks
with ``>>>`` lines run as doctests (ELLIPSIS, NORMALIZE_WHITESPACE; numpy's print options fixed,
so printed arrays are stable), the others as scripts. A block marked ```` ```python skip ````
says beside it why it cannot run here. Shell blocks are not run, but every ``tinygrad-attn``
command in them must parse with the command line's own parser, so a renamed flag fails.
CHANGELOG.md is exempt: it records names as they were.
"""

import doctest
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import optional
from tinygrad_attn.autograd import registry

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
PRELUDE = "import numpy as np\nimport tinygrad_attn as ta\nfrom tinygrad_attn import Tensor\n"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
# Modules a block may need that are optional extras: without one, the page's test skips (or
# fails under TINYGRAD_ATTN_REQUIRE_EXTRAS=1).
OPTIONAL = {"torch": optional.TORCH_REASON,
            "onnx": "onnx is not installed (pip install 'tinygrad_attn[onnx]')",
            "onnxruntime": "onnxruntime is not installed (pip install 'tinygrad_attn[onnx]')",
            "matplotlib": "matplotlib is not installed (pip install 'tinygrad_attn[plot]')"}


def blocks(path: Path) -> list[tuple[str, list[str], str, int]]:
    """(language, flags, code, line) of every fenced block in ``path``."""
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        info = match.group(1).split()
        line = text.count("\n", 0, match.start(2)) + 1
        found.append((info[0] if info else "", info[1:], match.group(2), line))
    return found


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _runnable(path: Path) -> bool:
    return any(lang == "python" and "skip" not in flags for lang, flags, _, _ in blocks(path))


@pytest.fixture
def page_sandbox(tmp_path, monkeypatch):
    """A folder for the files examples write, numpy print options fixed, new ops unregistered."""
    import tinygrad_attn as ta

    monkeypatch.chdir(tmp_path)
    # The pages count the package's ops ("43 of 43 ops"): ops other tests registered step aside.
    before, options = dict(registry), np.get_printoptions()
    for name, op in before.items():
        if not op.__module__.startswith("tinygrad_attn.ops"):
            del registry[name]
    np.set_printoptions(precision=4, suppress=True, linewidth=100, floatmode="maxprec")
    ta.manual_seed(0)
    yield
    np.set_printoptions(**options)
    registry.clear()
    registry.update(before)


@pytest.mark.parametrize("path", [p for p in PAGES if _runnable(p)], ids=_name)
def test_python_blocks_run(path, page_sandbox):
    namespace: dict = {"__name__": "__docs__"}
    exec(PRELUDE, namespace)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    for lang, marks, code, line in blocks(path):
        if lang != "python" or "skip" in marks:
            continue
        where = f"{_name(path)}:{line}"
        try:
            if ">>>" in code:
                test = doctest.DocTestParser().get_doctest(code, namespace, where, str(path), line - 1)
                output: list[str] = []
                runner = doctest.DocTestRunner(optionflags=flags)
                runner.run(test, out=output.append, clear_globs=False)
                namespace.update(test.globs)          # DocTest ran on a copy; later blocks see its names
                assert not runner.failures, f"doctest at {where} failed:\n" + "".join(output)
            else:
                exec(compile(code, where, "exec"), namespace)
        except ModuleNotFoundError as error:
            if error.name in OPTIONAL:
                optional.missing(f"{where}: {OPTIONAL[error.name]}")
            raise


def test_skipped_blocks_say_why():
    for path in PAGES:
        for _, marks, code, line in blocks(path):
            if "skip" in marks:
                assert len(marks) > 1 or code.lstrip().startswith("#"), (
                    f"{_name(path)}:{line}: a skipped block says why (```python skip <reason>)")


def _commands(code: str) -> list[list[str]]:
    """The tinygrad-attn command lines of a shell block, as argv lists (comments and redirections off)."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line.startswith("tinygrad-attn "):
            continue
        words = shlex.split(line)
        argv = []
        for word in words[1:]:
            if word in ("<", ">", "|") or word.startswith(("<", ">")):
                break
            argv.append(word)
        commands.append(argv)
    return commands


def test_shell_blocks_use_real_commands_and_flags():
    from tinygrad_attn.cli import build_parser

    checked = 0
    for path in PAGES:
        for lang, _, code, line in blocks(path):
            if lang not in ("sh", "bash", "shell"):
                continue
            for argv in _commands(code):
                try:
                    build_parser().parse_args(argv)
                except SystemExit as exit:
                    pytest.fail(f"{_name(path)}:{line}: 'tinygrad-attn {shlex.join(argv)}' does not parse "
                                f"(exit {exit.code})")
                checked += 1
    assert checked >= 20        # the README and the guide show the command line often


def test_readme_is_short_and_shows_the_two_setup_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "make demo" in text and "make test" in text


def test_readme_headline_figures_come_from_bench_results():
    text = README.read_text()
    table = text[text.index("## Headline figures"):].split("\n## ")[0]
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    number = re.compile(r"\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?(?:x|%)?")
    # A row's figures must stand together in one section of RESULTS (one run), not each
    # anywhere in the file; bare small counts ("1 thread", "(2)") are labels, not figures.
    sections = results.split("\n## ")
    rows = [[f for f in number.findall(row.split("|")[2]) if not f.isdigit() or len(f) > 2]
            for row in table.splitlines() if row.startswith("| ") and "---" not in row]
    assert sum(map(len, rows)) >= 10
    missing = [figures for figures in rows
               if figures and not any(all(f in section for f in figures) for section in sections)]
    assert not missing, f"README rows whose figures share no section of bench/RESULTS.md: {missing}"


def test_readme_cmudict_rows_of_ours_come_from_bench_results():
    # The published rows quote papers; each of our rows (marked "ours") is one run of RESULTS.
    text = README.read_text()
    table = text[text.index("## CMUdict beside published results"):].split("\n## ")[0]
    sections = (ROOT / "bench" / "RESULTS.md").read_text().split("\n## ")
    ours = [[cell.strip("* ") for cell in row.split("|")[3:5]] for row in table.splitlines()
            if row.startswith("| ") and "ours |" in row]
    assert len(ours) >= 4 and all(wer.endswith("%") and per.endswith("%") for wer, per in ours)
    missing = [row for row in ours if not any(all(f in section for f in row) for section in sections)]
    assert not missing, f"README CMUdict rows whose figures share no section of bench/RESULTS.md: {missing}"


def test_ops_table_lists_every_registered_op():
    import tinygrad_attn  # noqa: F401  (registers the package's ops)

    page = (ROOT / "docs" / "guide" / "tensors.md").read_text()
    table = page[page.index("## The ops"):].split("\n## ")[0]
    listed = set()
    for row in table.splitlines():
        cells = row.split("|")
        if row.startswith("| ") and len(cells) > 3 and "---" not in row:
            listed.update(re.findall(r"\b[A-Z][A-Za-z]+\b", re.sub(r"\(.*?\)", "", cells[2])))
    package = {name for name, op in registry.items() if op.__module__.startswith("tinygrad_attn.ops")}
    assert listed == package, f"missing from the table: {package - listed}, not ops: {listed - package}"


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
