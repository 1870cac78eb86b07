"""Pictures of the engine's recorded graphs (installed as ``tinygrad_attn.viz``).

Reads only the records each op leaves on its output (``tensor.node``: op name, attributes,
inputs, scope), or a compiled plan's source; nothing in the engine imports this package.

    >>> from tinygrad_attn import viz
    >>> print(viz.summary(loss))      # the graph as text, grouped by scope
    >>> viz.graph(loss)               # a graphviz.Digraph: displays as SVG in Jupyter
    >>> viz.render(loss, "loss.svg")  # or .png/.pdf (needs Graphviz's dot), .dot (source)
    >>> viz.graph(step)               # a ta.compile'd step's plan: its kernel calls, fused ones
    ...                               # labelled with their formula
    >>> print(viz.format_attention(weights, list("3 may"), list("05-03")))   # as text
    >>> viz.explore(model, "3 may 1998", task, path="attention.html")     # in the browser

Loading this package also makes Jupyter show a tensor that has a graph as its picture
(``notebook_display`` turns that off and on).
"""

from tinygrad_attn.tensor import Tensor

from .explore import Explorer, explore
from .graph import (
    FORMATS,
    MAX_VALUES,
    NOTEBOOK_COLLAPSE_ABOVE,
    NOTEBOOK_MAX_NODES,
    RENDER_MAX_NODES,
    Drawing,
    GraphvizNotFound,
    graph,
    notebook_display,
    notebook_svg,
    render,
)
from .heatmap import heatmap
from .plan import plan_graph as _plan_graph  # noqa: F401 - loading it lets graph() draw compiled plans
from .text import format_attention, nodes, row_labels, summary

__all__ = ["heatmap", "explore", "Explorer", "format_attention", "row_labels", "nodes", "summary", "graph",
           "render", "Drawing", "notebook_display", "GraphvizNotFound", "FORMATS", "MAX_VALUES",
           "RENDER_MAX_NODES", "NOTEBOOK_COLLAPSE_ABOVE", "NOTEBOOK_MAX_NODES"]

Tensor._graph_svg = staticmethod(notebook_svg)
