"""Pictures of the engine's recorded graphs (installed as ``tinygrad_attn.viz``).

Reads only the records each op leaves on its output (``tensor.node``: op name, attributes,
inputs, scope); nothing in the engine imports this package.

    >>> from tinygrad_attn import viz
    >>> print(viz.summary(loss))      # the graph as text, grouped by scope
    >>> viz.graph(loss)               # a graphviz.Digraph: displays as SVG in Jupyter
    >>> viz.render(loss, "loss.svg")  # or .png/.pdf (needs Graphviz's dot), .dot (source)
"""

from .graph import FORMATS, MAX_VALUES, GraphvizNotFound, graph, render
from .heatmap import heatmap
from .text import nodes, summary

__all__ = ["heatmap", "nodes", "summary", "graph", "render", "GraphvizNotFound", "FORMATS", "MAX_VALUES"]
