"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor, no
missing API reference, no docstring griffe cannot read, and the course's notebooks execute.

Without MkDocs (the ``docs`` extra) these tests skip, saying so, except under
``TINYGRAD_ATTN_REQUIRE_EXTRAS=1`` (CI), where they fail.
"""

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import optional

ROOT = Path(__file__).resolve().parents[1]
DOCS_REASON = "MkDocs is not installed: the site tests need pip install -e '.[docs]'"
yaml = optional.module("yaml", DOCS_REASON)          # PyYAML comes with MkDocs



@pytest.fixture(scope="module")
def mkdocs():
    for name in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter", "jupytext"):
        if importlib.util.find_spec(name) is None:
            optional.missing(f"{DOCS_REASON} ({name} is missing)")
    return [sys.executable, "-m", "mkdocs"]


def _build(mkdocs, config: Path, site: Path) -> subprocess.CompletedProcess:
    # --strict: a broken link, a missing reference or a docstring griffe cannot read fails.
    command = [*mkdocs, "build", "--strict", "--clean", "-f", str(config), "-d", str(site)]
    return subprocess.run(command, cwd=config.parent, capture_output=True, text=True, env=_env())


def _env() -> dict:
    return {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONWARNINGS": "ignore"}


def _warnings(log: str) -> list[str]:
    # MkDocs' own records ("WARNING  -  ..."); the notebooks' kernel may log its own
    # shutdown noise (tornado's "ERROR:tornado.general:..."), which is not the build's.
    return [line for line in log.splitlines() if re.match(r"(WARNING|ERROR)\s+-", line)]


@pytest.fixture(scope="module")
def site(mkdocs, tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    result = _build(mkdocs, ROOT / "mkdocs.yml", out)
    return result, out


def test_site_builds_strictly_without_warnings(site):
    result, _ = site
    log = result.stderr + result.stdout
    assert result.returncode == 0, log[-4000:]
    assert not _warnings(log), "mkdocs build warned:\n" + "\n".join(_warnings(log))


def test_site_has_the_guide_the_api_and_no_build_files(site):
    _, out = site
    assert "Two commands do all set-up" in (out / "index.html").read_text()
    attention = (out / "guide" / "attention" / "index.html").read_text()
    assert "scaled_dot_product" in attention and 'src="../../seq2seq.svg"' not in attention
    api = (out / "api" / "attention" / "index.html").read_text()
    assert 'id="tinygrad_attn.attention.scaled_dot_product"' in api
    # docstring examples render as Python sessions, not as block quotes
    assert '<span class="gp">&gt;&gt;&gt; </span>' in api
    for page in (out / "api").rglob("index.html"):
        assert "<blockquote>" not in page.read_text(), page
    assert not (out / "hooks.py").exists() and not (out / "griffe_examples.py").exists()


def _api_pages() -> dict[str, str]:
    pages = {}
    for page in (ROOT / "docs" / "api").glob("*.md"):
        for name in re.findall(r"(?m)^::: (\S+)", page.read_text()):
            pages[name] = page.name
    return pages


def test_every_public_namespace_has_an_api_page():
    import tinygrad_attn as ta

    namespaces = {"tinygrad_attn", "tinygrad_attn.viz", "tinygrad_attn.models.decoding"}
    namespaces |= {f"tinygrad_attn.{name}" for name in ta.__all__
                   if type(getattr(ta, name)).__name__ == "module"}
    assert namespaces <= set(_api_pages()), sorted(namespaces - set(_api_pages()))


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def walk(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for value in node.values():
                yield from walk(value)
        else:
            for item in node:
                yield from walk(item)

    listed = set(walk(config["nav"]))
    docs = ROOT / "docs"
    pages = {str(p.relative_to(docs)) for p in docs.rglob("*.md")}
    pages |= {str(p.relative_to(docs)) for p in (docs / "course").glob("*.py")}
    assert pages == listed, f"not in the nav: {sorted(pages - listed)}, missing: {sorted(listed - pages)}"


STAND_IN = """# %% [markdown]
# # A stand-in lesson
#
# The weights $\\alpha_{tj} = \\mathrm{softmax}_j(e_{tj})$ sum to one:
#
# $$\\sum_j \\alpha_{tj} = 1$$

# %%
answer = 6 * 7
print("the answer is", answer)
"""


def _course_site(mkdocs, tmp_path: Path, notebook: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The site's configuration, with only a course of one notebook (no API pages: quick)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["plugins"] = [p for p in config["plugins"] if not (isinstance(p, dict) and "mkdocstrings" in p)]
    config["hooks"] = [str(ROOT / "docs" / "hooks.py")]
    config["nav"] = [{"Home": "index.md"}, {"Course": ["course/index.md", "course/01_stand_in.py"]}]
    config["markdown_extensions"] = [e for e in config["markdown_extensions"]
                                     if not (isinstance(e, dict) and "pymdownx.snippets" in e)]
    docs = tmp_path / "docs"
    (docs / "course").mkdir(parents=True)
    (docs / "index.md").write_text("# Home\n\n[The course](course/index.md)\n")
    (docs / "course" / "index.md").write_text("# Course\n\n[Lesson 1](01_stand_in.py), "
                                              "[as a notebook](01_stand_in.ipynb)\n")
    (docs / "course" / "01_stand_in.py").write_text(notebook)
    config_path = tmp_path / "mkdocs.yml"
    config_path.write_text(yaml.safe_dump(config))
    return _build(mkdocs, config_path, tmp_path / "site"), tmp_path / "site"


def test_course_notebooks_execute_and_download_as_ipynb(mkdocs, tmp_path):
    result, out = _course_site(mkdocs, tmp_path, STAND_IN)
    assert result.returncode == 0 and not _warnings(result.stderr), result.stderr[-3000:]
    page = (out / "course" / "01_stand_in" / "index.html").read_text()
    assert "the answer is 42" in page                                   # executed, output shown
    assert 'href="../01_stand_in.ipynb" download' in page
    # Formulas are drawn as MathML at build time: no script from the network is needed to see them.
    assert page.count("<math") == 2 and 'display="block"' in page
    assert "\\alpha" not in page and "\\sum" not in page              # no raw LaTeX left
    notebook = json.loads((out / "course" / "01_stand_in.ipynb").read_text())
    assert notebook["nbformat"] == 4
    assert [cell["cell_type"] for cell in notebook["cells"]] == ["markdown", "code"]
    assert "answer = 6 * 7" in "".join(notebook["cells"][1]["source"])


def test_a_course_notebook_that_raises_fails_the_build(mkdocs, tmp_path):
    result, _ = _course_site(mkdocs, tmp_path, STAND_IN + "\n# %%\nraise ValueError('broken lesson')\n")
    assert result.returncode != 0
    assert "broken lesson" in result.stderr + result.stdout


def test_built_site_is_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "check-ignore", "-q", "site/index.html"], cwd=ROOT)
    assert out.returncode == 0
