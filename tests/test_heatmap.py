"""ta.viz.heatmap: the hand-written SVG read back with xml.etree (cells, colours, labels,
numbers), its errors, the atomic write, and the matplotlib backend when it is installed."""

import importlib
import itertools
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from tests import optional
from tinygrad_attn import Tensor
from tinygrad_attn.viz import format_attention, heatmap

# viz.heatmap is the function; the module behind it is reached through sys.modules.
module = importlib.import_module("tinygrad_attn.viz.heatmap")

NS = {"svg": "http://www.w3.org/2000/svg"}
WEIGHTS = np.array([[0.90, 0.05, 0.05, 0.00],
                    [0.10, 0.60, 0.20, 0.10],
                    [0.00, 0.25, 0.35, 0.40]])


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg.encode("utf-8"))


def group(root: ET.Element, name: str) -> ET.Element | None:
    return root.find(f"svg:g[@id='{name}']", NS)


def texts(root: ET.Element, name: str) -> list[str]:
    return [t.text for t in group(root, name).findall("svg:text", NS)]


def luminance(fill: str) -> float:
    return module._luminance(tuple(int(fill[k:k + 2], 16) for k in (1, 3, 5)))


def test_heatmap_svg_has_one_rect_per_cell_in_row_major_order():
    root = parse(heatmap(WEIGHTS, list("abcd"), list("xyz")))
    rects = group(root, "cells").findall("svg:rect", NS)
    assert len(rects) == WEIGHTS.size
    xs = [float(r.get("x")) for r in rects]
    ys = [float(r.get("y")) for r in rects]
    assert xs[:4] == sorted(set(xs)) and xs[4:8] == xs[:4]          # columns left to right
    assert ys[::4] == sorted(set(ys)) and len(set(ys[:4])) == 1     # rows top to bottom
    titles = [r.find("svg:title", NS).text for r in rects]
    assert titles[1] == "x \u2190 b: 0.05" and titles[-1] == "z \u2190 d: 0.40"


def test_heatmap_svg_cell_darkness_rises_with_the_weight():
    weights = np.linspace(0.0, 1.0, 12).reshape(3, 4)[:, ::-1]      # not in reading order
    root = parse(heatmap(weights, list("abcd"), list("xyz")))
    fills = [r.get("fill") for r in group(root, "cells").findall("svg:rect", NS)]
    by_weight = [fill for _, fill in sorted(zip(weights.ravel(), fills, strict=True))]
    lums = [luminance(f) for f in by_weight]
    assert all(a > b for a, b in itertools.pairwise(lums)), lums
    assert by_weight[0] == "#ffffff" and by_weight[-1] == module._hex(module.DARK)


def test_heatmap_svg_clips_the_colour_but_not_the_number():
    root = parse(heatmap(np.array([[-0.5, 1.5]]), ["a", "b"], ["x"]))
    fills = [r.get("fill") for r in group(root, "cells").findall("svg:rect", NS)]
    assert fills == ["#ffffff", module._hex(module.DARK)]
    assert texts(root, "numbers") == ["-0.50", "1.50"]


def test_heatmap_svg_escapes_labels_and_shows_spaces():
    src = ["<end>", "&", " ", 'say "hi"', "\t"]
    tgt = ["<s>", "a&b"]
    svg = heatmap(np.full((2, 5), 0.2), src, tgt, title="<attention> & more")
    assert "&lt;end&gt;" in svg and "&amp;" in svg and "<end>" not in svg
    root = parse(svg)                                   # well-formed XML despite the tokens
    assert texts(root, "source-labels") == ["<end>", "&", "\u2423", 'say\u2423"hi"', "\\t"]
    assert texts(root, "target-labels") == ["<s>", "a&b"]
    title = root.find("svg:text[@class='title']", NS)
    assert title.text == "<attention> & more"


def test_heatmap_svg_turns_long_source_labels_upright():
    short = parse(heatmap(np.eye(2), ["a", "b"], ["x", "y"]))
    long = parse(heatmap(np.eye(2), ["a", "<end>"], ["x", "y"]))
    assert all(t.get("transform") is None for t in group(short, "source-labels"))
    assert all("rotate(-90" in t.get("transform") for t in group(long, "source-labels"))


def test_heatmap_svg_writes_numbers_in_small_matrices_with_contrasting_colour():
    root = parse(heatmap(WEIGHTS, list("abcd"), list("xyz")))
    numbers = group(root, "numbers").findall("svg:text", NS)
    assert [n.text for n in numbers] == [f"{w:.2f}" for w in WEIGHTS.ravel()]
    colours = {n.text: n.get("fill") for n in numbers}
    assert colours["0.90"] == "#ffffff" and colours["0.05"] == "#000000"


@pytest.mark.parametrize(("shape", "numbers", "shown"), [
    ((12, 12), None, True),
    ((13, 4), None, False),
    ((4, 13), None, False),
    ((13, 13), True, True),
    ((2, 2), False, False),
])
def test_heatmap_svg_numbers_only_up_to_12_by_12_unless_asked(shape, numbers, shown):
    weights = np.full(shape, 0.5)
    root = parse(heatmap(weights, ["a"] * shape[1], ["x"] * shape[0], numbers=numbers))
    assert (group(root, "numbers") is not None) == shown


def test_heatmap_accepts_a_tensor_and_a_leading_batch_of_one():
    expected = heatmap(WEIGHTS, list("abcd"), list("xyz"))
    assert heatmap(Tensor(WEIGHTS[None]), list("abcd"), list("xyz")) == expected
    assert heatmap(WEIGHTS.astype(np.float32).tolist(), list("abcd"), list("xyz")) == expected


@pytest.mark.parametrize(("weights", "src", "tgt", "message"), [
    (np.zeros((2, 2, 2, 3, 4)), "abcd", "xyz",
     r"\(T, S\) or \(1, T, S\).*\(L, H, T, S\).*got shape \(2, 2, 2, 3, 4\)"),
    (np.zeros((2, 3, 4)), "abc", "xyz", r"shape \(3, 4\) need S=4 source .* got 3 source"),
    (np.zeros(4), "abcd", "x", r"got shape \(4,\)"),
    (np.zeros((3, 4)), "abc", "xyz", r"shape \(3, 4\) need S=4 source .* got 3 source"),
    (np.zeros((1, 3, 4)), "abcd", "xy", r"shape \(1, 3, 4\) need S=4 .* T=3 target .* 2 target"),
    (np.zeros((0, 4)), "abcd", "", r"shape \(0, 4\) have no cells"),
    (np.array([[0.5, np.nan]]), "ab", "x", r"finite.*\(0, 1\) is nan"),
])
def test_heatmap_rejects_mismatched_shapes_and_labels(weights, src, tgt, message):
    with pytest.raises(ValueError, match="^heatmap: .*" + message):
        heatmap(weights, list(src), list(tgt))


def test_a_grid_of_layers_and_heads_draws_a_panel_each():
    """(L, H, T, S): L rows of H panels, each with its own labels, cells and title; one
    colour bar; panel names checked against the grid."""
    rng = np.random.default_rng(0)
    grid = rng.dirichlet(np.ones(4), size=(2, 3, 3))                          # (2 layers, 3 heads, 3, 4)
    root = ET.fromstring(heatmap(grid, list("abcd"), list("xyz"), title="cross-attention"))
    panels = root.findall("svg:svg", NS)
    assert len(panels) == 6
    titles = [panel.find("svg:text[@class='title']", NS).text for panel in panels]
    assert titles == [f"layer {i} head {j}" for i in range(2) for j in range(3)]
    for index, panel in enumerate(panels):
        cells = panel.find(f"svg:g[@id='cells-{index // 3}-{index % 3}']", NS).findall("svg:rect", NS)
        got = [float(rect.find("svg:title", NS).text.rsplit(": ", 1)[1]) for rect in cells]
        np.testing.assert_allclose(got, grid[index // 3, index % 3].ravel(), atol=0.005)
    assert len(root.findall(".//svg:g[@id='colour-bar']", NS)) == 1
    one_row = ET.fromstring(heatmap(grid[0], list("abcd"), list("xyz"), column_names=["a", "b", "c"]))
    names = [p.find("svg:text[@class='title']", NS).text for p in one_row.findall("svg:svg", NS)]
    assert names == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"grid of 2 x 3 panels, but 1 row names"):
        heatmap(grid, list("abcd"), list("xyz"), row_names=["only"])
    with pytest.raises(ValueError, match="row_names and column_names name the panels of a grid"):
        heatmap(grid[0, 0], list("abcd"), list("xyz"), row_names=["x"])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"backend": "png"}, r"backend must be 'svg', 'matplotlib' or None, got 'png'"),
    ({"backend": "svg", "path": "a.png"}, r"svg backend writes only \.svg"),
    ({"path": "attention"}, r"no suffix"),
])
def test_heatmap_rejects_unknown_backends_and_formats(kwargs, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="^heatmap: .*" + message):
        heatmap(WEIGHTS, list("abcd"), list("xyz"), **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_heatmap_png_without_matplotlib_says_to_install_the_plot_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(module, "_matplotlib_installed", lambda: False)
    with pytest.raises(ImportError, match=r"needs matplotlib.*pip install tinygrad_attn\[plot\].*\.svg"):
        heatmap(WEIGHTS, list("abcd"), list("xyz"), tmp_path / "a.png")
    with pytest.raises(ImportError, match=r"pip install tinygrad_attn\[plot\]"):
        heatmap(WEIGHTS, list("abcd"), list("xyz"), backend="matplotlib")
    assert list(tmp_path.iterdir()) == []


def test_heatmap_without_a_path_returns_svg_text_even_with_matplotlib(monkeypatch):
    monkeypatch.setattr(module, "_matplotlib_installed", lambda: True)
    svg = heatmap(WEIGHTS, list("abcd"), list("xyz"))
    assert isinstance(svg, str) and svg.startswith("<?xml")


def test_heatmap_svg_file_is_written_atomically(tmp_path, monkeypatch):
    monkeypatch.setattr(module, "_matplotlib_installed", lambda: False)
    path = tmp_path / "attention.svg"
    assert heatmap(WEIGHTS, list("abcd"), list("xyz"), str(path)) == path
    assert path.read_text(encoding="utf-8") == heatmap(WEIGHTS, list("abcd"), list("xyz"))
    assert [p.name for p in tmp_path.iterdir()] == ["attention.svg"]

    # A write that fails at the rename leaves the old picture whole and no temporary file.
    before = path.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")

    files = importlib.import_module("tinygrad_attn.serialize")      # the shared atomic write
    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        heatmap(np.eye(2), ["a", "b"], ["x", "y"], path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["attention.svg"]


def test_heatmap_into_a_missing_folder_names_the_folder(tmp_path):
    path = tmp_path / "nowhere" / "attention.svg"
    with pytest.raises(FileNotFoundError, match=r"^heatmap: .*the folder '.*nowhere' does not exist"):
        heatmap(WEIGHTS, list("abcd"), list("xyz"), path, backend="svg")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- matplotlib (the plot extra)


@pytest.fixture
def matplotlib():
    return optional.module("matplotlib", "matplotlib (the plot extra) is not installed")


@pytest.mark.parametrize(("suffix", "magic"), [(".png", b"\x89PNG"), (".pdf", b"%PDF"), (".svg", b"<?xml")])
def test_heatmap_matplotlib_writes_the_format_its_suffix_names(matplotlib, suffix, magic, tmp_path):
    path = tmp_path / f"attention{suffix}"
    src = ["<end>", "$", " ", "&"]
    assert heatmap(WEIGHTS, src, list("xyz"), path, title="dates $5$") == path
    assert path.read_bytes().startswith(magic)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_heatmap_matplotlib_is_the_default_for_paths_and_labels_the_axes(matplotlib, tmp_path):
    path = tmp_path / "attention.svg"
    heatmap(WEIGHTS, ["a", " ", "<end>", "d"], list("xyz"), path)
    svg = path.read_text(encoding="utf-8")
    assert "Matplotlib" in svg                          # drawn by matplotlib, not by hand
    figure = heatmap(WEIGHTS, ["a", " ", "<end>", "d"], list("xyz"), backend="matplotlib")
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["a", "\u2423", "<end>", "d"]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["x", "y", "z"]
    assert [t.get_text() for t in axes.texts] == [f"{w:.2f}" for w in WEIGHTS.ravel()]


def test_heatmap_matplotlib_names_the_formats_it_can_write(matplotlib, tmp_path):
    with pytest.raises(ValueError, match=r"^heatmap: matplotlib cannot write \.txt .*\.png"):
        heatmap(WEIGHTS, list("abcd"), list("xyz"), tmp_path / "attention.txt")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- as text


def test_format_attention_aligns_columns_and_adds_end_row():
    weights = np.array([[0.9, 0.05, 0.05], [0.004, 0.996, 0.0]])
    text = format_attention(weights, ["ich", "liebe", "katzen"], ["i"])
    assert text.splitlines() == [
        "         ich  liebe katzen",
        "i       0.90   0.05   0.05",
        "<end>   0.00   1.00   0.00",
    ]


def test_format_attention_shows_spaces(monkeypatch):
    text = format_attention(np.array([[0.5, 0.5]]), ["3", " "], [])
    header = text.splitlines()[0].split()
    assert header[0] == "3" and header[1] in ("\u2423", "_")
