"""Generated Python (plans, ops' forward and backward, formula kernels) that tracebacks,
debuggers and ``inspect.getsource`` can show: each text is registered with ``linecache``
under a readable name instead of running as an anonymous ``<string>``."""

from __future__ import annotations

import linecache

__all__ = ["compile_source"]


def compile_source(source: str, filename: str, namespace: dict) -> str:
    """Run ``source`` (generated code defining functions) in ``namespace`` under ``filename``,
    registered with ``linecache`` so tracebacks and ``inspect.getsource`` show its lines.

    ``filename`` should read like ``<Tanh generated from its formula>``; if another text is
    already registered under it, a number is added (``<... #2>``).  Returns the name used.
    """
    name, number = filename, 1
    while name in linecache.cache and linecache.cache[name][2] != source.splitlines(True):
        number += 1
        name = f"{filename[:-1]} #{number}>" if filename.endswith(">") else f"{filename} #{number}"
    # mtime None: linecache.checkcache leaves an entry without a file alone.
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), namespace)  # noqa: S102 - our own generated source
    return name
