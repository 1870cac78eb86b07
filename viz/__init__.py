"""Pictures of the engine's recorded graphs (installed as ``tinygrad_attn.viz``).

Reads only the records each op leaves on its output (``tensor.node``: op name, attributes,
inputs, scope); nothing in the engine imports this package.

    >>> from tinygrad_attn import viz
    >>> print(viz.summary(loss))      # the graph as text, grouped by scope
"""

from .text import nodes, summary

__all__ = ["nodes", "summary"]
