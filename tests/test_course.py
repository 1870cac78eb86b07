"""The course's notebooks (docs/course/): each file is a jupytext percent-format notebook with the
expected title, in the lecture notes' order, whose code cells compile, which fixes its seeds and
ends with a measured "What to check" section; docs/course/index.md links all nine, in order.

Executing them is the documentation build's job (mkdocs-jupyter with execute: true, in
tests/test_site.py's strict build), so CI runs each notebook once, there.
"""

import re
from pathlib import Path

import pytest

from tests import optional

COURSE = Path(__file__).resolve().parents[1] / "docs" / "course"

# (file, title) in the course's order: the seeds' order of the issue that asked for the course.
NOTEBOOKS = [
    ("01_bottleneck.py", "The bottleneck: a seq2seq without attention forgets long inputs"),
    ("02_bahdanau.py", "Bahdanau's additive attention, one decoder step at a time"),
    ("03_luong.py", "Luong's dot, general and concat scores, and the attention vector"),
    ("04_scaled_dot_product.py", "Scaled dot-product, self- and multi-head attention"),
    ("05_transformer.py", "The Transformer, and what each layer and head attends to"),
    ("06_gat.py", "Graph attention (GAT) on Zachary's karate club"),
    ("07_decoding.py", "Decoding: greedy, beam search, n-best lists and their scores"),
    ("08_gradients_and_ops.py", "Verifying gradients, and writing an op of your own from its formula"),
    ("09_cmudict_g2p.py", "Your own data: grapheme-to-phoneme on CMUdict"),
]
FILES = [name for name, _ in NOTEBOOKS]
SEEDED = re.compile(r"\bmanual_seed\(|default_rng\(\d+\)")
NETWORK = re.compile(r"\b(urllib|requests|http\.client|socket|urlopen|wget|curl)\b")


def read(name: str):
    """The notebook jupytext reads from ``docs/course/<name>``."""
    jupytext = optional.module("jupytext", "jupytext is not installed (pip install 'tinygrad_attn[docs]')")
    return jupytext.read(COURSE / name)


def test_course_holds_exactly_the_nine_notebooks():
    # The site renders every course/*.py: a stray script would become a page.
    assert sorted(p.name for p in COURSE.glob("*.py")) == FILES


@pytest.mark.parametrize(("number", "name", "title"),
                         [(i + 1, name, title) for i, (name, title) in enumerate(NOTEBOOKS)], ids=FILES)
def test_course_notebook_parses_as_percent_format_with_its_title(number, name, title):
    notebook = read(name)
    assert notebook.metadata["jupytext"]["text_representation"]["format_name"] == "percent"
    first = notebook.cells[0]
    assert first.cell_type == "markdown"
    assert first.source.splitlines()[0] == f"# {number}. {title}"
    kinds = {cell.cell_type for cell in notebook.cells}
    assert kinds == {"markdown", "code"}, f"{name}: cells of kinds {kinds}"


@pytest.mark.parametrize("name", FILES)
def test_course_notebook_code_cells_compile(name):
    for index, cell in enumerate(read(name).cells):
        if cell.cell_type == "code":
            compile(cell.source, f"{name} cell {index}", "exec")


@pytest.mark.parametrize("name", FILES)
def test_course_notebook_ends_with_what_to_check(name):
    cells = read(name).cells
    assert cells[-1].cell_type == "code", f"{name} must end with the code that measures"
    assert cells[-2].cell_type == "markdown" and cells[-2].source.startswith("## What to check"), \
        f"{name}: the last text cell must be its '## What to check' section"


@pytest.mark.parametrize("name", FILES)
def test_course_notebook_fixes_seeds_and_needs_no_network(name):
    code = "\n".join(cell.source for cell in read(name).cells if cell.cell_type == "code")
    assert SEEDED.search(code), f"{name} fixes no seed"
    found = NETWORK.search(code)
    assert found is None, f"{name} reaches for the network ({found.group(0)!r})"


def test_course_index_links_every_notebook_in_order():
    text = (COURSE / "index.md").read_text()
    positions = []
    for name in FILES:
        links = [m.start() for m in re.finditer(rf"\]\({re.escape(name)}\)", text)]
        assert links, f"index.md does not link {name}"
        positions.append(links[0])
    assert positions == sorted(positions), "index.md lists the notebooks out of order"
    assert "jupytext --to ipynb" in text, "index.md must say how to run a notebook locally"
