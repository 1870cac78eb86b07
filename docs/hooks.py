"""MkDocs hooks for the documentation site (mkdocs.yml names this file under `hooks:`).

Three jobs:

- The API reference is read from the source by griffe, which looks packages up on disk. The
  package installs `compiler/` and `viz/` from the repository root *inside* itself
  (`tinygrad_attn.compiler`, `tinygrad_attn.viz`), a layout no search path shows. So before
  mkdocstrings starts, a temporary folder gets a `tinygrad_attn` made of links: the package's
  own files plus `compiler` and `viz`, the tree as it is installed.
- Every course notebook (`docs/course/*.py`, jupytext's percent format, rendered and executed by
  mkdocs-jupyter) is also written into the site as a `.ipynb` to download, and its page links it.
- The notebooks' `$...$` and `$$...$$` formulas become MathML when the site is built (latex2mathml),
  which browsers draw themselves: the pages need no script from the network to show them.
"""

import html as html_text
import logging
import re
import shutil
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
COURSE = "course/"
_farm: Path | None = None


@event_priority(100)        # before mkdocstrings' own on_config reads its handler options
def on_config(config):
    global _farm
    if _farm is None:                   # `mkdocs serve` calls on_config again at every rebuild
        _farm = Path(tempfile.mkdtemp(prefix="tinygrad_attn_docs_"))
        package = _farm / "tinygrad_attn"
        package.mkdir()
        for entry in (ROOT / "tinygrad_attn").iterdir():
            if entry.name != "__pycache__":
                (package / entry.name).symlink_to(entry)
        for folder in ("compiler", "viz"):
            (package / folder).symlink_to(ROOT / folder)
    if "mkdocstrings" in config.plugins:
        python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
        python["paths"] = [str(_farm)]
    return config


def on_shutdown():
    global _farm
    if _farm is not None:
        shutil.rmtree(_farm, ignore_errors=True)
        _farm = None


def _is_notebook(src_uri: str) -> bool:
    return src_uri.startswith(COURSE) and src_uri.endswith(".py")


def on_files(files, config):
    import jupytext

    for file in list(files):
        if _is_notebook(file.src_uri):
            notebook = jupytext.read(file.abs_src_path, fmt="py:percent")
            content = jupytext.writes(notebook, fmt="ipynb")
            files.append(File.generated(config, file.src_uri[:-3] + ".ipynb", content=content))
    return files


def on_page_content(html, page, config, files):
    if _is_notebook(page.file.src_uri):
        name = Path(page.file.src_uri).stem + ".ipynb"
        link = (f'<p class="notebook-download"><a href="../{name}" download>'
                f"Download this notebook ({name})</a></p>\n")
        return link + _mathml(html, page.file.src_uri)
    return html


_log = logging.getLogger("mkdocs.hooks.math")
# Code, scripts and styles keep their dollar signs; math is looked for in the rest.
_VERBATIM = re.compile(r"(<(pre|code|script|style)\b.*?</\2>)", re.S)
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE = re.compile(r"(?<![\\$])\$(?=\S)([^$\n]+?)(?<=\S)\$(?!\d)")


def _mathml(html: str, where: str) -> str:
    from latex2mathml.converter import convert

    def replace(display: str):
        def one(match):
            latex = html_text.unescape(match.group(1)).strip()
            try:
                return convert(latex, display=display)
            except Exception as error:     # the converter raises many kinds; the build must say which formula
                _log.warning("%s: cannot draw the formula %r as MathML (%s)", where, latex, error)
                return match.group(0)
        return one

    parts = _VERBATIM.split(html)
    out = []
    for index in range(0, len(parts), 3):            # text, verbatim block, its tag name, text, ...
        text = _DISPLAY.sub(replace("block"), parts[index])
        out.append(_INLINE.sub(replace("inline"), text))
        if index + 1 < len(parts):
            out.append(parts[index + 1])
    return "".join(out)
