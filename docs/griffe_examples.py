"""A griffe extension (mkdocs.yml lists it under the Python handler's `extensions`).

The package's docstrings follow STYLE.md: Google style, with an `Example:` section of `>>>`
lines. Griffe's Google parser knows only the plural, `Examples:`; it renders the singular as
an admonition whose `>>>` lines become nested block quotes (and `x[0][0]` a broken link).
This reads `Example:` as `Examples:`, so the examples render as Python sessions.
"""

import re

import griffe

_SINGULAR = re.compile(r"(?m)^(\s*)Example:[ \t]*$")


class SingularExamples(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        docstring = obj.docstring
        if docstring is not None and "Example:" in docstring.value:
            docstring.value = _SINGULAR.sub(r"\1Examples:", docstring.value)
