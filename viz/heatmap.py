"""The attention matrix as a labelled image, like Figure 3 of Bahdanau et al. (2015): one row
per output token, one column per source token, darker cells for larger weights.

Two backends draw it. matplotlib (the ``plot`` extra) writes whatever format the path's
suffix names (png, svg, pdf, ...). Without it, a self-contained SVG is written by hand:
rects and text only, so no dependency is needed to look at a translation's attention.
"""

from __future__ import annotations

import html
import importlib.util
import unicodedata
from pathlib import Path

import numpy as np

from tinygrad_attn.serialize import atomic_file

BACKENDS = ("svg", "matplotlib")
INSTALL_HINT = "pip install tinygrad_attn[plot]"

# One hue from white (weight 0) to dark blue (weight 1). Every channel falls as the weight
# rises, so darkness is monotonic in the weight; both backends use these two ends.
LIGHT = (255, 255, 255)
DARK = (8, 48, 107)

NUMBERS_UP_TO = 12          # write the weights in the cells when T and S are both at most this

# SVG layout, in px. A monospace font makes a label's width predictable from its length.
FONT_FAMILY = "DejaVu Sans Mono, Menlo, Consolas, monospace"
CHAR_WIDTH = 0.62           # advance of one monospace character, in em
LABEL_FONT = 12
NUMBER_FONT = 10
TITLE_FONT = 14
CELL = 22
CELL_WITH_NUMBERS = 34      # "0.85" at 10 px is about 25 px wide: leave a gap between numbers
PAD = 10
GAP = 6                     # between a label and the grid
BAR_GAP = 16
BAR_WIDTH = 12
BAR_MIN_HEIGHT = 80


def heatmap(weights, src_tokens, tgt_tokens, path=None, title=None, *, backend=None, numbers=None,
            row_names=None, column_names=None):
    """Draw attention weights as a heatmap: rows are output tokens, columns source tokens, and
    a cell's darkness is its weight on a fixed 0-to-1 scale (shown by a colour bar).

    Args:
        weights: the attention matrix, a numpy array or Tensor of shape (T, S); (1, T, S) is
            squeezed. Weights outside [0, 1] are clipped for the colour, not for the numbers.
            A grid of matrices, one panel each, for a Transformer's layers and heads:
            (L, H, T, S) draws L rows of H panels (row i "layer i", column j "head j");
            (H, T, S) one row of them.
        src_tokens: S column labels (source tokens); a space is drawn as ``␣``.
        tgt_tokens: T row labels (output tokens, ``<end>`` included when it has a row).
        path: the file to write, its format taken from the suffix. None returns the picture
            instead of writing it.
        title: a line drawn above the matrix, or None for none.
        backend: ``"svg"`` (hand-written, no dependencies; writes only .svg), ``"matplotlib"``,
            or None: matplotlib when it is installed and ``path`` is given, else svg.
        numbers: write each weight (2 decimals) in its cell; None does so when the matrix is
            at most 12 x 12.
        row_names, column_names: a grid's panel names (default "layer i", "head j").

    Returns:
        The ``Path`` written to; with ``path=None``, the SVG text (svg backend) or a
        ``matplotlib.figure.Figure`` (matplotlib backend).

    Raises:
        ValueError: weights of another shape, labels that do not match it, non-finite weights,
            or a suffix the chosen backend cannot write.
        ImportError: matplotlib was asked for (``backend="matplotlib"`` or a .png/.pdf path)
            but is not installed.
        FileNotFoundError: the folder of ``path`` does not exist.

    Example:
        >>> output, source, tokens, attention = ta.models.translate(model, "3 may 1998", info)
        >>> rows = tokens + ["<end>"] * (len(attention) - len(tokens))   # <end>, if produced
        >>> ta.viz.heatmap(attention, source, rows, "attention.svg")
        PosixPath('attention.svg')
        >>> svg_text = ta.viz.heatmap(np.eye(3), list("abc"), list("xyz"))
        >>> _, weights = model(src, tgt_in, need_weights=True)        # a Transformer
        >>> grid = model.layer_attention(weights)[:, 0]               # (layers, H, T, S)
        >>> ta.viz.heatmap(grid, source, rows, "heads.svg")           # a panel each
    """
    grid = _grid(weights, row_names, column_names)
    if grid is not None:
        weights, row_names, column_names = grid
        for panel in weights.reshape((-1,) + weights.shape[-2:]):
            _matrix(panel, src_tokens, tgt_tokens)
    else:
        weights = _matrix(weights, src_tokens, tgt_tokens)
    src = [label_text(t) for t in src_tokens]
    tgt = [label_text(t) for t in tgt_tokens]
    if numbers is None:
        numbers = max(weights.shape[-2:]) <= NUMBERS_UP_TO
    path = None if path is None else Path(path)
    chosen = _choose_backend(backend, path)

    if chosen == "svg":
        if grid is not None:
            text = _svg_grid(weights, src, tgt, title, numbers, row_names, column_names)
        else:
            text = _svg(weights, src, tgt, title, numbers)
        if path is None:
            return text
        with atomic_file(path, "heatmap") as file:
            file.write(text.encode("utf-8"))
        return path

    fmt = None if path is None else path.suffix[1:].lower()
    if fmt is not None:
        _check_matplotlib_format(path, fmt)
    if grid is not None:
        figure = _matplotlib_grid(weights, src, tgt, title, numbers, row_names, column_names)
    else:
        figure = _matplotlib_figure(weights, src, tgt, title, numbers)
    if path is None:
        return figure
    # 150 dpi keeps a png's labels sharp; vector formats ignore it.
    with atomic_file(path, "heatmap") as file:
        figure.savefig(file, format=fmt, dpi=150)
    return path


# ---------------------------------------------------------------- checks


def _grid(weights, row_names, column_names):
    """(L, H, T, S) or (H > 1, T, S) weights -> (the (rows, columns, T, S) array, row names,
    column names); None for one matrix."""
    array = np.asarray(weights, dtype=np.float64)
    if array.ndim == 3 and array.shape[0] > 1:
        array = array[None]
        row_names = row_names or [""]
    if array.ndim != 4:
        if row_names is not None or column_names is not None:
            raise ValueError(f"heatmap: row_names and column_names name the panels of a grid, (L, H, T, S) "
                             f"weights; got one matrix of shape {array.shape}")
        return None
    rows, columns = array.shape[:2]
    row_names = list(row_names) if row_names is not None else [f"layer {i}" for i in range(rows)]
    column_names = list(column_names) if column_names is not None else [f"head {j}" for j in range(columns)]
    if len(row_names) != rows or len(column_names) != columns:
        raise ValueError(f"heatmap: weights of shape {array.shape} make a grid of {rows} x {columns} panels, "
                         f"but {len(row_names)} row names and {len(column_names)} column names were given")
    return array, row_names, column_names


def _matrix(weights, src_tokens, tgt_tokens) -> np.ndarray:
    """The weights as a float64 (T, S) array, with every mismatch reported against the shape."""
    # np.asarray reads a Tensor through its __array__ (copied to the host from a GPU).
    weights = np.asarray(weights, dtype=np.float64)
    shape = weights.shape
    if weights.ndim == 3 and shape[0] == 1:
        weights = weights[0]
    if weights.ndim != 2:
        raise ValueError(f"heatmap: weights must be (T, S) or (1, T, S), or a grid (H, T, S) or "
                         f"(L, H, T, S), got shape {shape}")
    T, S = weights.shape
    if T == 0 or S == 0:
        raise ValueError(f"heatmap: weights of shape {shape} have no cells to draw")
    if len(src_tokens) != S or len(tgt_tokens) != T:
        raise ValueError(f"heatmap: weights of shape {shape} need S={S} source tokens and T={T} "
                         f"target tokens, got {len(src_tokens)} source and {len(tgt_tokens)} target")
    if not np.isfinite(weights).all():
        bad = tuple(int(k) for k in np.argwhere(~np.isfinite(weights))[0])
        raise ValueError(f"heatmap: weights must be finite, but the (T, S) cell {bad} is "
                         f"{weights[bad]} (of shape {shape})")
    return weights


def _matplotlib_installed() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _choose_backend(backend, path: Path | None) -> str:
    if backend not in (None, *BACKENDS):
        raise ValueError(f"heatmap: backend must be 'svg', 'matplotlib' or None, got {backend!r}")
    fmt = None if path is None else path.suffix[1:].lower()
    if path is not None and not fmt:
        raise ValueError(f"heatmap: {str(path)!r} has no suffix to tell the format by; "
                         "end it in .svg (or .png, .pdf with matplotlib)")
    if backend == "svg":
        if fmt not in (None, "svg"):
            raise ValueError(f"heatmap: the svg backend writes only .svg files, not {str(path)!r}; "
                             "give a .svg path, or backend='matplotlib' for other formats")
        return backend
    if backend == "matplotlib" or (path is not None and _matplotlib_installed()):
        if not _matplotlib_installed():
            raise ImportError(f"heatmap: the matplotlib backend needs matplotlib, which is not "
                              f"installed: {INSTALL_HINT}, or draw a self-contained .svg without it")
        return "matplotlib"
    # path=None picks svg even when matplotlib is installed: what the call returns (text or a
    # Figure) should not depend on what happens to be installed.
    if fmt not in (None, "svg"):
        raise ImportError(f"heatmap: writing {str(path)!r} (.{fmt}) needs matplotlib, which is not "
                          f"installed: {INSTALL_HINT}, or give a .svg path instead")
    return "svg"


def _check_matplotlib_format(path: Path, fmt: str) -> None:
    # Checked before drawing, and in the same words as every other heatmap error.
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if fmt not in formats:
        raise ValueError(f"heatmap: matplotlib cannot write .{fmt} files ({str(path)!r}); "
                         f"it writes {', '.join('.' + f for f in sorted(formats))}")


# ---------------------------------------------------------------- shared helpers


def label_text(token) -> str:
    """A label that shows up: a space becomes an open box, and control characters (which XML
    cannot hold, and which print as nothing) become escapes."""
    out = []
    for ch in str(token):
        if ch == " ":
            out.append("\u2423")
        elif unicodedata.category(ch) == "Cc":
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def _rgb(weight: float) -> tuple[int, int, int]:
    w = min(max(float(weight), 0.0), 1.0)
    return tuple(round(lo + (hi - lo) * w) for lo, hi in zip(LIGHT, DARK, strict=True))


def _luminance(rgb) -> float:
    """WCAG relative luminance of an sRGB colour, 0 (black) to 1 (white)."""
    def linear(c):
        c = c / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _text_colour(rgb) -> str:
    """Black or white, whichever contrasts more with the cell (WCAG contrast ratio)."""
    lum = _luminance(rgb)
    return "#ffffff" if (1.05 / (lum + 0.05)) > ((lum + 0.05) / 0.05) else "#000000"


def _hex(rgb) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


# ---------------------------------------------------------------- svg


def _text_width(text: str, font: float) -> float:
    # East Asian wide characters take two monospace cells.
    cells = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
    return cells * CHAR_WIDTH * font


def _attr(value) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _svg_panel(weights: np.ndarray, src: list[str], tgt: list[str], title, numbers: bool, suffix: str = ""):
    """One matrix with its labels, drawn from (0, 0): (lines, its layout).  ``suffix`` keeps
    the group ids of a grid's panels distinct."""
    T, S = weights.shape
    cell = CELL_WITH_NUMBERS if numbers else CELL
    src_width = max(_text_width(s, LABEL_FONT) for s in src)
    tgt_width = max(_text_width(s, LABEL_FONT) for s in tgt)
    # Source labels sit above their columns, turned upright when one is wider than a column.
    rotate = src_width > cell - 4
    title_height = TITLE_FONT + GAP if title else 0
    left = PAD + tgt_width + GAP
    top = PAD + title_height + (src_width if rotate else LABEL_FONT) + GAP
    grid_w, grid_h = S * cell, T * cell
    title_width = 2 * PAD + _text_width(str(title), TITLE_FONT) if title else 0
    lines = []
    if title:
        centre = max(left + grid_w / 2, title_width / 2)
        lines.append(f'<text class="title" x="{_num(centre)}" y="{_num(PAD + TITLE_FONT)}" '
                     f'font-size="{TITLE_FONT}" text-anchor="middle">{_attr(title)}</text>')

    lines.append(f'<g id="source-labels{suffix}" font-size="{LABEL_FONT}">')
    for j, label in enumerate(src):
        x, y = left + (j + 0.5) * cell, top - GAP
        if rotate:
            # Rotated -90 about its anchor the text reads upwards; dy centres it on the column.
            lines.append(f'<text x="{_num(x)}" y="{_num(y)}" dy="0.35em" text-anchor="start" '
                         f'transform="rotate(-90 {_num(x)} {_num(y)})">{_attr(label)}</text>')
        else:
            lines.append(f'<text x="{_num(x)}" y="{_num(y)}" text-anchor="middle">{_attr(label)}</text>')
    lines.append("</g>")

    lines.append(f'<g id="target-labels{suffix}" font-size="{LABEL_FONT}" text-anchor="end">')
    for i, label in enumerate(tgt):
        lines.append(f'<text x="{_num(left - GAP)}" y="{_num(top + (i + 0.5) * cell)}" '
                     f'dy="0.35em">{_attr(label)}</text>')
    lines.append("</g>")

    # Each cell's tooltip names its pair and weight, so large matrices stay readable on hover.
    lines.append(f'<g id="cells{suffix}">')
    for i in range(T):
        for j in range(S):
            w = weights[i, j]
            lines.append(f'<rect x="{_num(left + j * cell)}" y="{_num(top + i * cell)}" width="{cell}" '
                         f'height="{cell}" fill="{_hex(_rgb(w))}"><title>{_attr(tgt[i])} \u2190 '
                         f'{_attr(src[j])}: {w:.2f}</title></rect>')
    lines.append("</g>")
    lines.append(f'<rect class="frame" x="{_num(left)}" y="{_num(top)}" width="{grid_w}" '
                 f'height="{grid_h}" fill="none" stroke="#999999" stroke-width="1"/>')

    if numbers:
        lines.append(f'<g id="numbers{suffix}" font-size="{NUMBER_FONT}" text-anchor="middle">')
        for i in range(T):
            for j in range(S):
                w = weights[i, j]
                lines.append(f'<text x="{_num(left + (j + 0.5) * cell)}" y="{_num(top + (i + 0.5) * cell)}" '
                             f'dy="0.35em" fill="{_text_colour(_rgb(w))}">{w:.2f}</text>')
        lines.append("</g>")
    return lines, dict(right=max(left + grid_w, title_width - PAD), top=top, grid_h=grid_h)


def _svg_document(width: float, height: float, label: str, body: list[str]) -> str:
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(width)}" height="{_num(height)}" '
        f'viewBox="0 0 {_num(width)} {_num(height)}" font-family="{FONT_FAMILY}" role="img">',
        f"<title>{_attr(label)}</title>",
        '<rect class="background" width="100%" height="100%" fill="#ffffff"/>',
        *body,
        "</svg>",
    ]
    return "\n".join(lines) + "\n"


def _svg(weights: np.ndarray, src: list[str], tgt: list[str], title, numbers: bool) -> str:
    T, S = weights.shape
    body, layout = _svg_panel(weights, src, tgt, title, numbers)
    bar_x = layout["right"] + BAR_GAP
    bar_h = max(layout["grid_h"], BAR_MIN_HEIGHT)
    width = bar_x + BAR_WIDTH + 4 + _text_width("0.5", NUMBER_FONT) + PAD
    height = layout["top"] + bar_h + PAD
    body.extend(_svg_colour_bar(bar_x, layout["top"], bar_h))
    return _svg_document(width, height, title or f"attention weights ({T} output x {S} source tokens)", body)


def _svg_grid(grid: np.ndarray, src: list[str], tgt: list[str], title, numbers: bool,
              row_names: list[str], column_names: list[str]) -> str:
    """A (rows, columns, T, S) stack of matrices as one picture: a panel each, titled by its
    row and column name (layer and head), one colour bar for all."""
    rows, columns, T, S = grid.shape
    panels = [[_svg_panel(grid[r, c], src, tgt, f"{row_names[r]} {column_names[c]}".strip(), numbers,
                          f"-{r}-{c}")
               for c in range(columns)] for r in range(rows)]
    # Every panel has the same labels, so the same layout: one size for all.
    _, layout = panels[0][0]
    panel_w = layout["right"] + PAD
    panel_h = layout["top"] + layout["grid_h"] + PAD
    title_height = TITLE_FONT + 2 * GAP if title else 0
    body = []
    if title:
        body.append(f'<text class="title" x="{_num(PAD)}" y="{_num(PAD + TITLE_FONT)}" '
                    f'font-size="{TITLE_FONT}">{_attr(title)}</text>')
    for r in range(rows):
        for c in range(columns):
            lines, _ = panels[r][c]
            body.append(f'<svg x="{_num(c * panel_w)}" y="{_num(title_height + r * panel_h)}" '
                        f'width="{_num(panel_w)}" height="{_num(panel_h)}" class="panel">')
            body.extend(lines)
            body.append("</svg>")
    bar_x = columns * panel_w + BAR_GAP
    bar_h = max(rows * panel_h - 2 * PAD, BAR_MIN_HEIGHT)
    body.extend(_svg_colour_bar(bar_x, title_height + layout["top"], bar_h - layout["top"] + PAD))
    width = bar_x + BAR_WIDTH + 4 + _text_width("0.5", NUMBER_FONT) + PAD
    height = max(title_height + rows * panel_h, title_height + layout["top"] + bar_h) + PAD
    label = title or f"attention weights of {rows} x {columns} panels ({T} output x {S} source tokens)"
    return _svg_document(width, height, label, body)


def _svg_colour_bar(x: float, top: float, height: float) -> list[str]:
    """A vertical 0-to-1 scale: weight 0 at the bottom, 1 at the top, ticks at 0, 0.5, 1."""
    lines = [
        '<g id="colour-bar">',
        '<defs><linearGradient id="tinygrad-attn-scale" x1="0" y1="1" x2="0" y2="0">'
        f'<stop offset="0" stop-color="{_hex(LIGHT)}"/><stop offset="1" stop-color="{_hex(DARK)}"/>'
        "</linearGradient></defs>",
        f'<rect x="{_num(x)}" y="{_num(top)}" width="{BAR_WIDTH}" height="{_num(height)}" '
        'fill="url(#tinygrad-attn-scale)" stroke="#999999" stroke-width="1"/>',
    ]
    for value in (0.0, 0.5, 1.0):
        y = top + (1 - value) * height
        lines.append(f'<line x1="{_num(x + BAR_WIDTH)}" y1="{_num(y)}" x2="{_num(x + BAR_WIDTH + 3)}" '
                     f'y2="{_num(y)}" stroke="#555555"/>')
        lines.append(f'<text x="{_num(x + BAR_WIDTH + 5)}" y="{_num(y)}" dy="0.35em" '
                     f'font-size="{NUMBER_FONT}">{_num(value)}</text>')
    lines.append("</g>")
    return lines


# ---------------------------------------------------------------- matplotlib


def _matplotlib_figure(weights: np.ndarray, src: list[str], tgt: list[str], title, numbers: bool):
    # Figure directly, not pyplot: no GUI backend is chosen and no global figure is left open.
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.figure import Figure

    T, S = weights.shape
    scale = LinearSegmentedColormap.from_list("tinygrad_attn", [_hex(LIGHT), _hex(DARK)])
    inch = 0.34 if numbers else 0.22     # per cell: the svg's 34 and 22 px cells at 100 dpi
    figure = Figure(figsize=(max(3.0, S * inch + 2.0), max(2.5, T * inch + 1.5)), layout="constrained")
    axes = figure.add_subplot()
    image = axes.imshow(np.clip(weights, 0.0, 1.0), cmap=scale, vmin=0.0, vmax=1.0,
                        interpolation="nearest", aspect="equal")
    rotate = max(len(s) for s in src) > 2
    # parse_math=False: a token such as "$" or "$5$" is a label, not mathtext.
    axes.set_xticks(range(S), labels=src, rotation=90 if rotate else 0, parse_math=False)
    axes.set_yticks(range(T), labels=tgt, parse_math=False)
    axes.xaxis.tick_top()
    axes.tick_params(length=0)
    if numbers:
        for i in range(T):
            for j in range(S):
                axes.text(j, i, f"{weights[i, j]:.2f}", ha="center", va="center", fontsize=7,
                          color=_text_colour(_rgb(weights[i, j])))
    figure.colorbar(image, ax=axes, ticks=[0.0, 0.5, 1.0], shrink=0.8)
    if title:
        axes.set_title(title, parse_math=False)
    return figure


def _matplotlib_grid(grid: np.ndarray, src: list[str], tgt: list[str], title, numbers: bool, row_names,
                     column_names):
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.figure import Figure

    rows, columns, T, S = grid.shape
    scale = LinearSegmentedColormap.from_list("tinygrad_attn", [_hex(LIGHT), _hex(DARK)])
    inch = 0.34 if numbers else 0.22
    figure = Figure(figsize=(columns * max(2.5, S * inch + 1.2) + 1.0, rows * max(2.2, T * inch + 1.0)),
                    layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    image = None
    for r in range(rows):
        for c in range(columns):
            ax = axes[r, c]
            image = ax.imshow(np.clip(grid[r, c], 0.0, 1.0), cmap=scale, vmin=0.0, vmax=1.0,
                              interpolation="nearest", aspect="equal")
            ax.set_xticks(range(S), labels=src, rotation=90 if max(len(s) for s in src) > 2 else 0,
                          parse_math=False)
            ax.set_yticks(range(T), labels=tgt, parse_math=False)
            ax.xaxis.tick_top()
            ax.tick_params(length=0, labelsize=7)
            ax.set_title(f"{row_names[r]} {column_names[c]}".strip(), fontsize=9, parse_math=False)
            if numbers:
                for i in range(T):
                    for j in range(S):
                        ax.text(j, i, f"{grid[r, c, i, j]:.2f}", ha="center", va="center", fontsize=6,
                                color=_text_colour(_rgb(grid[r, c, i, j])))
    figure.colorbar(image, ax=axes, ticks=[0.0, 0.5, 1.0], shrink=0.6)
    if title:
        figure.suptitle(title)
    return figure
