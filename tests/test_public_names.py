"""The public names: each has one home (one ``__all__`` lists it), every listed name exists, and
no module reaches into another's private names (a leading underscore means "this module's
own": a name other modules need is given a public name in its module instead)."""

import ast
import collections
import importlib
import inspect
import pkgutil
from pathlib import Path

import tinygrad_attn as ta
import tinygrad_attn.viz  # noqa: F401 - loaded lazily by ta; its names are public too

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "tinygrad_attn", ROOT / "compiler", ROOT / "viz"]
# The benchmarks and examples are the package's users: they too use only public names.
USERS = [ROOT / "bench", ROOT / "examples"]


def _modules() -> list[str]:
    names = ["tinygrad_attn"]
    for package in ("tinygrad_attn", "tinygrad_attn.compiler", "tinygrad_attn.viz"):
        module = importlib.import_module(package)
        names += [package] * (package != "tinygrad_attn")
        names += [info.name for info in pkgutil.walk_packages(module.__path__, package + ".")
                  if not info.name.endswith("__main__")]
    return sorted(set(names))


def test_each_public_name_is_listed_in_one_all():
    homes = collections.defaultdict(list)
    for name in _modules():
        module = importlib.import_module(name)
        for attribute in getattr(module, "__all__", ()):
            assert hasattr(module, attribute), f"{name}.__all__ lists {attribute!r}, which it lacks"
            value = getattr(module, attribute)
            if not inspect.ismodule(value):
                homes[(attribute, id(value))].append(name)
    twice = {key[0]: where for key, where in homes.items() if len(where) > 1}
    assert not twice, f"listed in more than one __all__: {twice}"


def test_the_top_level_names_are_not_private():
    assert not [name for name in ta.__all__ if name.startswith("_")]


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            inside = node.level > 0 or (node.module or "").startswith("tinygrad_attn")
            found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name} from "
                      f"{'.' * node.level}{node.module or ''}"
                      for alias in node.names
                      if inside and alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_names():
    found = [line for source in SOURCES + USERS for path in sorted(source.rglob("*.py"))
             for line in _private_imports(path)]
    assert not found, "\n".join(found)
