"""Computation graphs as Graphviz pictures: one node per op, nested boxes by scope.

``graph(t)`` reads the records the engine leaves on every tensor (``t.node``: the op, its
inputs, the scope it ran in) and returns a ``graphviz.Digraph``; ``render(t, "g.svg")``
writes it with Graphviz's ``dot`` program.  In Jupyter a Digraph displays itself as SVG, so
``ta.viz.graph(loss)`` as the last line of a cell draws the graph (the engine's Tensor is
left alone: nothing in the engine knows about pictures).

What is drawn:

* every op as a rounded box: the op's name (and short attributes), the output shape, the
  dtype when it is not float32; the tensor the graph is drawn from has a bold border;
* parameters (``nn.Parameter``) as blue filled boxes with their module path and shape,
  other leaves that require grad (your inputs) as yellow ellipses, constants (token ids,
  masks, zero initial states) as small grey boxes, next to the ops that read them;
* each parameter once, outside the scope boxes, just above its first use: every step's
  edge meets at the one weight, as every step's gradient adds into its one ``.grad``;
* attention weights (a MaskedSoftmax/Softmax in an ``*attention*`` scope) filled pink;
* scopes as nested boxes (Graphviz clusters): ``encoder``, each ``encoder/t3``, its
  ``reverse`` direction, ``decoder``, each ``decoder/t2`` and its ``attention`` group, the
  layout of the lecture notes' encoder-decoder diagrams.  A scope holding nothing but one
  inner scope is drawn as one box named by both (``attention / additive_attention``).

Node ids are ``n<k>`` with ``k`` the tensor's position in ``ta.viz.summary``'s listing
(``%k``), so the DOT source is stable from run to run and the two views cross-reference.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import graphviz
import numpy as np

from tinygrad_attn import attention as _attention
from tinygrad_attn import scopes as _scopes
from tinygrad_attn.nn import Parameter
from tinygrad_attn.serialize import atomic_file
from tinygrad_attn.tensor import Tensor

from .text import nodes

#: Output formats ``render`` knows, by file suffix; ``dot`` (and ``gv``) write DOT source.
FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": "dot", ".gv": "dot"}

#: ``values=True`` prints a tensor's numbers only up to this many entries (else its shape).
MAX_VALUES = 12

_STEP = re.compile(r"t(\d+)")
_STEP_PATTERN = "t[0-9]*"

FONT = "Helvetica"
# Cluster fills by what the scope is, light enough that black text on white ops stays sharp.
CLUSTER_FILL = {"encoder": "#e8f0fa", "decoder": "#fbefe1", "attention": "#fbe3e8", "step": "#ffffff"}
_CLUSTER_PEN = {"encoder": "#7b9cc9", "decoder": "#d9a066", "attention": "#d97b8f", "step": "#b0b0b0"}
PARAM_FILL = "#c6dbef"
INPUT_FILL = "#fff3b0"
PARAM_EDGE = "#8fa8c8"
_ATTENTION_EDGE = "#c0392b"
_WEIGHTS_FILL = "#f4b6c2"


class GraphvizNotFound(RuntimeError):
    """Graphviz's ``dot`` program is not installed (or not on PATH)."""


# ---------------------------------------------------------------- the public functions


def graph(tensor, collapse=None, backward: bool = False, values: bool = False,
          attention_edges: bool = False, rankdir: str = "TB") -> graphviz.Digraph:
    """The graph that computed ``tensor``: ops, parameters and inputs, boxed by scope.

    Args:
        tensor: any Tensor; its recorded graph (``tensor.node`` and the nodes behind it) is drawn.
            Or a compiled plan (a ``ta.compile``d function: its latest plan; or one of its
            ``.plans``): its kernel calls are drawn, a fused kernel as one node labelled with
            its formula, in the same scope boxes (plan.py; ``collapse`` by scope names and
            ``rankdir`` apply).
        collapse: how much to fold away, so a long unroll stays readable:

            * ``None``: draw every op.
            * an int ``k``: keep the first and last ``k`` steps of every unrolled sequence
              (the ``t0, t1, ...`` scopes inside ``encoder``, ``decoder``, ...) and draw the
              steps between as one node "… 36 steps …"; edges into or out of the hidden steps
              are rerouted to that node.  Ops outside the step scopes that only serve hidden
              steps (their embedding lookups, token ids) are folded in too.
            * ``"steps"``: every time step drawn as one box (its ops counted in the label).
            * scope names or patterns (a string or a set of strings, shell-style as in
              ``fnmatch``): every scope whose name (``"attention"``) or whole path
              (``"decoder/t1"``, ``"encoder/*"``) matches is drawn as one box; the outermost
              match wins.  ``"*/*"`` draws each scope two levels down as a box.
            * a set holding one int and names, e.g. ``{2, "steps"}``: both at once.
        backward: draw the gradient graph instead: edges run from each op to the inputs it
            sends a gradient to, labelled ``d<input> (shape)`` (``d%12`` names the tensor
            ``%12`` of ``ta.viz.summary``, parameters go by name); constants, which get no
            gradient, are left out, and a ``d<root> = 1`` node seeds the walk.
        values: for tensors of at most ``MAX_VALUES`` entries, print the values (rounded to
            3 decimals) and, where ``.grad`` is set, the gradient in the node's label.
        attention_edges: add one dashed red edge per (decoder step, source position): from
            the encoder state h_j to the step's attention weights node (its
            MaskedSoftmax/Softmax), pen width and opacity growing with the weight a_ij of
            batch row 0 (averaged over query rows and heads when one node holds several, as
            Luong-style training's one attention call for every step does: then there is one
            edge per source position); the weights are listed in the node (hover an edge
            for its own).  Not drawn into folded boxes.  h_j is the j-th piece of the ``cat`` that built the
            attended values, or the values node itself when they were not built by one.
        rankdir: Graphviz's direction: "TB" (top to bottom), "LR", "BT" or "RL".

    Returns:
        a ``graphviz.Digraph``: ``.source`` is the DOT text; in Jupyter it displays as SVG.

    Example:
        >>> loss = model.loss(src, tgt_in, tgt_out)
        >>> ta.viz.graph(loss, collapse=2, attention_edges=True)     # shows in Jupyter
        >>> ta.viz.render(loss, "loss.svg", collapse="steps")
    """
    if not isinstance(tensor, Tensor):
        plan = _plan_of(tensor)
        if plan is None:
            raise TypeError(f"graph(): expected a Tensor (the result whose graph to draw) or a compiled "
                            f"plan (a ta.compile'd function, or one of its .plans), got "
                            f"{type(tensor).__name__}")
        if backward or values or attention_edges:
            raise TypeError("graph(): backward, values and attention_edges draw a tensor's graph; a plan "
                            "is drawn as its kernel calls (collapse and rankdir apply)")
        return _plan_graph(plan, collapse, rankdir)
    return _drawing(tensor, collapse, backward, values, attention_edges, rankdir).digraph()


def _no_plan(what):
    return None


# Plans are drawn by viz/plan.py, which builds on this module and so registers itself here
# when the package loads (``draw_plans_with``) rather than being imported from it.
_plan_of, _plan_graph = _no_plan, None


def draw_plans_with(plan_of, plan_graph) -> None:
    """Let ``graph`` draw compiled plans: ``plan_of(obj)`` gives the plan an object stands for
    (or None), ``plan_graph(plan, collapse, rankdir)`` its picture."""
    global _plan_of, _plan_graph
    _plan_of, _plan_graph = plan_of, plan_graph


class Drawing(graphviz.Digraph):
    """What ``graph`` returns: a ``graphviz.Digraph`` that also knows how much it draws, as
    ``nodes``, ``edges`` and ``boxes`` (scope clusters)."""

    nodes = edges = boxes = 0


# Past this many nodes dot's layout, about quadratic in the nodes, runs into minutes: render
# collapses a tensor's unrolls first, then refuses.
RENDER_MAX_NODES = 2000


def _drawing(tensor, collapse=None, backward=False, values=False, attention_edges=False,
             rankdir="TB") -> GraphLayout:
    if rankdir not in ("TB", "LR", "BT", "RL"):
        raise ValueError(f"graph(): rankdir must be 'TB', 'LR', 'BT' or 'RL', got {rankdir!r}")
    keep_steps, patterns = parse_collapse(collapse)
    return GraphLayout(tensor, keep_steps, patterns, backward, values, attention_edges, rankdir)


def render(tensor_or_digraph, path, **graph_options) -> Path:
    """Write a tensor's graph (or a Digraph) to ``path``, in the format its suffix names.

    Args:
        tensor_or_digraph: a Tensor or a compiled plan (drawn with ``graph(it, **graph_options)``)
            or a ``graphviz.Digraph`` (drawn as it is).
        path: where to write: ``.svg``, ``.png``, ``.pdf``, or ``.dot`` / ``.gv`` for the DOT
            source (which needs no Graphviz program).  Only this one file is written: the
            picture goes to a temporary file beside it, then replaces ``path``.
        **graph_options: ``collapse``, ``backward``, ``values``, ``attention_edges``,
            ``rankdir``, as in ``graph``.

    A picture (not ``.dot``) of more than ``RENDER_MAX_NODES`` nodes would keep dot busy for
    minutes: a tensor's graph is then drawn with ``collapse=2`` (the first and last two steps
    of each unroll) unless ``collapse`` was given, and one still too large (or such a
    Digraph from ``graph``) raises ValueError saying how to draw less.

    Returns:
        the path written, as a ``pathlib.Path``.

    Raises:
        GraphvizNotFound: the ``dot`` program is missing (the message says how to install it).

    Example:
        >>> ta.viz.render(loss, "loss.png", collapse=2, rankdir="LR")
        PosixPath('loss.png')
    """
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"render(): cannot tell the format of {str(path)!r}; use one of the "
                         f"suffixes {', '.join(FORMATS)}")
    if isinstance(tensor_or_digraph, graphviz.Digraph):
        if graph_options:
            raise TypeError(f"render(): options {sorted(graph_options)} apply when drawing a tensor, "
                            f"not to a ready Digraph; pass them to ta.viz.graph instead")
        digraph = tensor_or_digraph
    elif not isinstance(tensor_or_digraph, Tensor):
        digraph = graph(tensor_or_digraph, **graph_options)     # a plan (or graph's TypeError)
    else:
        if fmt != "dot" and graph_options.get("collapse") is None and \
                len(nodes(tensor_or_digraph)) > RENDER_MAX_NODES:
            # Counted before drawing: drawing thousands of nodes takes seconds itself.
            graph_options = {**graph_options, "collapse": 2}
        digraph = graph(tensor_or_digraph, **graph_options)
    drawn = getattr(digraph, "nodes", 0)           # a Digraph made elsewhere: its maker knows
    if fmt != "dot" and drawn > RENDER_MAX_NODES:
        raise ValueError(f"render(): the graph has {drawn:,} nodes, more than RENDER_MAX_NODES "
                         f"({RENDER_MAX_NODES:,}), which dot would take minutes to lay out; draw less "
                         f"(collapse=2, or collapse='steps' for one box per time step) or write the "
                         f"DOT source (a .dot path)")
    if not path.parent.is_dir():       # before drawing: dot may take seconds
        raise FileNotFoundError(f"render(): the folder {str(path.parent)!r} does not exist")
    if fmt == "dot":
        data = digraph.source.encode("utf-8")
    else:
        try:
            # pipe(), not Digraph.render(): render() also leaves the DOT source beside the picture.
            data = digraph.pipe(format=fmt)
        except graphviz.ExecutableNotFound as error:
            raise GraphvizNotFound(
                "render(): Graphviz's 'dot' program was not found on PATH, so the graph cannot "
                f"be drawn as {fmt}. Install Graphviz (Debian/Ubuntu: 'sudo apt-get install "
                "graphviz'; macOS: 'brew install graphviz'; conda: 'conda install -c conda-forge "
                "graphviz'), or write the DOT source, which needs no program: "
                "ta.viz.render(t, 'graph.dot')"
            ) from error
    with atomic_file(path, "render()") as stream:
        stream.write(data)
    return path


# Above this many tensors a notebook shows the first and last 2 steps (collapse=2); above
# NOTEBOOK_MAX_NODES, even collapsed, it shows the text repr (dot would take long).
NOTEBOOK_COLLAPSE_ABOVE = 200
NOTEBOOK_MAX_NODES = 2000
_notebook = {"enabled": True}


def notebook_display(enabled: bool = True) -> None:
    """Whether Jupyter shows a tensor that has a recorded graph as a picture of the graph
    (on by default once ``ta.viz`` is loaded; its text repr is always in the output too).

    A graph of more than NOTEBOOK_COLLAPSE_ABOVE tensors is drawn with ``collapse=2``; one
    still above NOTEBOOK_MAX_NODES, or without Graphviz's ``dot``, or that ``dot`` fails on,
    shows as text.  Jupyter shows only the richest form, so ``print(t)`` shows the values.
    ``ta.viz.graph(t, ...)`` returns a Digraph, which Jupyter also shows as SVG, with every
    option of ``graph``.

        >>> ta.viz.notebook_display(False)     # tensors show as text again
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"notebook_display(): enabled must be True or False, got {enabled!r}")
    _notebook["enabled"] = enabled


def notebook_svg(tensor) -> str | None:
    """The SVG Jupyter shows for a tensor (Tensor._repr_mimebundle_), or None for text."""
    if not _notebook["enabled"]:
        return None
    digraph = graph(tensor, collapse=2 if len(nodes(tensor)) > NOTEBOOK_COLLAPSE_ABOVE else None)
    if digraph.nodes > NOTEBOOK_MAX_NODES:
        return None
    try:
        return digraph.pipe(format="svg", encoding="utf-8")
    except (graphviz.ExecutableNotFound, graphviz.CalledProcessError):
        return None


def parse_collapse(collapse) -> tuple[int | None, tuple[str, ...]]:
    """``collapse`` -> (steps to keep at each end or None, scope patterns)."""
    if collapse is None:
        return None, ()
    wrong = TypeError(f"graph(): collapse takes None, an int, scope names or a set of both, "
                      f"got {collapse!r}")
    if isinstance(collapse, (int, str)):
        items = [collapse]
    else:
        try:
            items = list(collapse)
        except TypeError:
            raise wrong from None
    keep_steps, patterns = None, []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise wrong
        if isinstance(item, int):
            if item < 1 or keep_steps is not None:
                raise ValueError(f"graph(): collapse holds at most one int, the number (>= 1) of "
                                 f"steps to keep at each end of an unroll, got {collapse!r}")
            keep_steps = item
        else:
            patterns.append(_STEP_PATTERN if item == "steps" else item)
    return keep_steps, tuple(patterns)


# ---------------------------------------------------------------- reading the records


@functools.lru_cache(maxsize=4096)
def _step_of(scope: str) -> tuple[str, int] | None:
    """The unroll a scope belongs to and its step: "decoder/t3/attention" -> ("decoder", 3).
    Cached: a long unroll asks about the same few thousand scopes again and again."""
    parts = scope.split("/")
    for i, part in enumerate(parts):
        match = _STEP.fullmatch(part)
        if match:
            return "/".join(parts[:i]), int(match.group(1))
    return None


def _common_scope(scopes: list[str]) -> str:
    """The deepest scope holding all of ``scopes``."""
    if not scopes:
        return ""
    split = [s.split("/") if s else [] for s in scopes]
    common = []
    for parts in zip(*split, strict=False):   # scopes differ in depth
        if any(p != parts[0] for p in parts):
            break
        common.append(parts[0])
    return "/".join(common)


def _kind(t) -> str:
    if t.node is not None:
        return "op"
    if isinstance(t, Parameter):
        return "param"
    return "input" if t.requires_grad else "const"


def _shape_text(t) -> str:
    dtype = "" if t.dtype == np.float32 else f" {t.dtype}"
    return f"{tuple(t.shape)}{dtype}"


def _numbers(array) -> str:
    """A small array's values, rounded, one row per line (DOT's "\\n")."""
    array = np.asarray(array)
    if array.dtype.kind == "f":
        array = np.round(array.astype(np.float64), 3) + 0.0   # + 0.0 turns -0.0 into 0.0
    text = np.array2string(array, separator=", ", max_line_width=60, formatter={
        "float_kind": lambda v: np.format_float_positional(v, precision=3, trim="-")})
    return "\\n".join(line.strip() for line in text.splitlines())


@dataclass
class Cluster:
    items: list = field(default_factory=list)        # DOT node names drawn directly inside
    children: list = field(default_factory=list)     # child scope paths, first seen first
    weight: list = field(default_factory=list)       # topological indices, to order siblings


class GraphLayout:
    """One drawing: decides what each tensor becomes (a node, a hidden step, part of a
    box), then writes clusters, nodes and edges."""

    def __init__(self, root, keep_steps, patterns, backward, values, attention_edges, rankdir):
        if backward and not root.requires_grad:
            raise ValueError(f"graph(backward=True): the tensor of shape {root.shape} does not "
                             f"require grad, so it has no gradient graph to draw")
        self.root = root
        self.backward = backward
        self.values = values
        self.attention_edges = attention_edges
        self.rankdir = rankdir
        # Ids follow viz.summary's %k listing even when backward drops the constants.
        self.order = nodes(root)
        self.index = {id(t): k for k, t in enumerate(self.order)}
        if backward:
            self.order = [t for t in self.order if t.requires_grad]
        self.consumers: dict[int, list] = {id(t): [] for t in self.order}
        self.first_use: dict[int, str] = {}
        for t in self.order:
            if t.node is not None:
                for inp in t.node.inputs:
                    if id(inp) in self.consumers:
                        self.consumers[id(inp)].append(t)
        self.scope = {id(t): self._scope(t) for t in self.order}
        # rep: the DOT node that stands for each tensor (itself, a "… steps …" node or a box).
        self.rep: dict[int, str] = {id(t): f"n{self.index[id(t)]}" for t in self.order}
        self.extra: dict[str, tuple[str, str, dict]] = {}     # name -> (scope, label, attrs)
        self.hidden: set[int] = set()
        self._hide_steps(keep_steps)
        self._fold_scopes(patterns)

    # ------------------------------------------------------------ placement

    def _scope(self, t) -> str | None:
        """The cluster a tensor is drawn in; None for parameters (drawn once, outside)."""
        if t.node is not None:
            return t.node.scope
        if isinstance(t, Parameter):
            # A weight is shared by every step: one node outside the boxes keeps the shared
            # gradient visible (all steps' edges meet at it) and gives each step no copy
            # that would suggest separate weights.
            return None
        # Constants and inputs sit with their consumers (a step's token ids in that step).
        return _common_scope([c.node.scope for c in self.consumers[id(t)]])

    def _hide_steps(self, keep_steps) -> None:
        """collapse=k: steps k .. n-k-1 of each unroll become one "… steps …" node."""
        if keep_steps is None:
            return
        unrolls: dict[str, set[int]] = {}
        for t in self.order:
            step = _step_of(t.node.scope) if t.node is not None else None
            if step is not None:
                unrolls.setdefault(step[0], set()).add(step[1])
        hidden: dict[str, tuple[str, set[int]]] = {}
        for k, (unroll, steps) in enumerate(sorted(unrolls.items())):
            steps = sorted(steps)
            if len(steps) <= 2 * keep_steps + 1:     # hiding a single step saves nothing
                continue
            middle = steps[keep_steps:-keep_steps]
            label = f"… {len(middle)} steps …"
            attrs = {"shape": "box", "style": "dashed,rounded", "fontsize": "12"}
            # In a cluster of its own, like the steps it stands for, so dot ranks it between them.
            skipped = f"t{middle[0]}..t{middle[-1]}"
            self.extra[f"skip{k}"] = (f"{unroll}/{skipped}" if unroll else skipped, label, attrs)
            hidden[unroll] = (f"skip{k}", set(middle))
        is_hidden: dict[int, bool] = {}
        for t in self.order:                          # inputs first
            step = _step_of(t.node.scope) if t.node is not None else None
            if step is not None:
                unroll = hidden.get(step[0])
                if unroll is not None and step[1] in unroll[1]:
                    is_hidden[id(t)] = True
                    self.rep[id(t)] = unroll[0]
                continue
            # An op outside the steps made only from hidden steps' tensors (a bidirectional
            # encoder's [h_fwd; h_bwd] of a hidden step) goes with them.
            made_from = [x for x in (t.node.inputs if t.node is not None else ())
                         if x.node is not None and id(x) in self.rep]
            if made_from and all(is_hidden.get(id(x)) for x in made_from) and t is not self.root:
                is_hidden[id(t)] = True
                self.rep[id(t)] = self.rep[id(made_from[0])]
        for t in reversed(self.order):                # consumers first
            if is_hidden.get(id(t)) or t is self.root or isinstance(t, Parameter):
                continue
            if t.node is not None and _step_of(t.node.scope) is not None:
                continue
            # What only hidden steps use (their embedding lookups, token ids) is hidden too.
            users = self.consumers[id(t)]
            if users and all(is_hidden.get(id(c)) for c in users):
                is_hidden[id(t)] = True
                self.rep[id(t)] = self.rep[id(users[0])]
        self.hidden = {key for key, flag in is_hidden.items() if flag}

    def _fold_scopes(self, patterns) -> None:
        """collapse=names: each outermost matching scope becomes one box."""
        if not patterns:
            return
        boxes: dict[str, str] = {}
        members: dict[str, list] = {}
        for t in self.order:
            scope = self.scope[id(t)]
            if id(t) in self.hidden or not scope:
                continue
            box_scope = outermost_match(scope, patterns)
            if box_scope is None:
                continue
            if box_scope not in boxes:
                boxes[box_scope] = f"box{len(boxes)}"
                members[box_scope] = []
            self.rep[id(t)] = boxes[box_scope]
            if t.node is not None:
                members[box_scope].append(t.node.op_name)
        for box_scope, name in boxes.items():
            ops = members[box_scope]
            counts = {op: ops.count(op) for op in dict.fromkeys(ops)}
            listed = ", ".join(f"{op} ×{n}" if n > 1 else op for op, n in counts.items())
            label = f"{box_scope.rsplit('/', 1)[-1]}\\n{len(ops)} ops: {wrap_label(listed, 28)}"
            attrs = {"shape": "box3d", "style": "filled", "margin": "0.12,0.08",
                     "fillcolor": CLUSTER_FILL[scope_kind(box_scope)], "fontsize": "10"}
            parent = box_scope.rsplit("/", 1)[0] if "/" in box_scope else ""
            self.extra[name] = (parent, label, attrs)

    # ------------------------------------------------------------ labels

    def _name(self, t) -> str:
        return t.name if t.name else f"%{self.index[id(t)]}"

    def _grad_name(self, t) -> str:
        name = self._name(t)
        return f"d{name}" if name.startswith("%") or name.isidentifier() else f"d({name})"

    def _label(self, t) -> str:
        kind = _kind(t)
        if kind == "op":
            op = t.node.op
            attrs = op.attrs_text()
            lines = [op.name + (f" {attrs}" if attrs and len(attrs) <= 24 else "")]
            if t.name:
                lines.append(repr(t.name))
        else:
            lines = [t.name] if t.name else []
        if self.backward and kind == "op":
            lines[0] = f"%{self.index[id(t)]} {lines[0]}"   # what the edges' d%k refer to
        lines.append(_shape_text(t))
        if kind == "const" and t.dtype.kind in "iu" and t.size <= 4 and not self.values:
            lines.append("ids " + _numbers(t.numpy()))    # which tokens an embedding step reads
        if self.values and t.size <= MAX_VALUES:
            lines.append(_numbers(t.numpy()))
            if t.grad is not None:
                lines.append(f"grad {_numbers(t.grad.numpy())}")
        if self.attention_edges and _is_attention_weights(t) and t.shape[-1] <= MAX_VALUES:
            lines.append("a: " + " ".join(f"{a:.2f}" for a in _weights_row(t)))
        if self.backward and kind == "param":
            uses = len(self.consumers[id(t)])    # every use, drawn or folded away
            if uses > 1:
                lines.append(f"grad = sum of {uses}")
        return "\\n".join(lines)

    def _node_attrs(self, t) -> dict:
        kind = _kind(t)
        attrs: dict[str, str] = {"tooltip": f"%{self.index[id(t)]}"}
        if kind == "op":
            attrs.update(shape="box", style="rounded,filled", fillcolor="white", fontsize="10")
            if _is_attention_weights(t):
                attrs["fillcolor"] = _WEIGHTS_FILL       # the a_ij a reader looks for first
            attrs["tooltip"] += f" {t.node.op!r}" + (f" in {t.node.scope}" if t.node.scope else "")
        elif kind == "param":
            attrs.update(shape="box", style="filled", fillcolor=PARAM_FILL, color="#4a6fa5",
                         fontsize="10")
        elif kind == "input":
            attrs.update(shape="ellipse", style="filled", fillcolor=INPUT_FILL, fontsize="10")
        else:
            attrs.update(shape="box", style="filled", fillcolor="#eeeeee", color="#bbbbbb",
                         fontcolor="#555555", fontsize="8", height="0.2", margin="0.04,0.02")
        if t is self.root:
            attrs["penwidth"] = "2.5"
        return attrs

    # ------------------------------------------------------------ output

    def digraph(self) -> graphviz.Digraph:
        g = Drawing(name="tinygrad_attn", strict=False)
        # newrank: rank the whole graph at once, so no edge between steps points back up
        # (dot's older per-cluster ranking does that to unrolled RNNs).  nslimit caps the
        # x-placement's iterations at a multiple of the node count: small graphs converge
        # well inside it, and a 20-step unroll draws in seconds instead of minutes.
        g.attr(rankdir=self.rankdir, fontname=FONT, nodesep="0.2", ranksep="0.3", newrank="true",
               nslimit="2")
        g.attr("node", fontname=FONT, height="0.3", margin="0.08,0.03")
        g.attr("edge", fontname=FONT, fontsize="8", arrowsize="0.6")
        tree = {"": Cluster()}
        statements: dict[str, tuple[str, dict]] = {}
        for t in self.order:
            name = self.rep[id(t)]
            if name != f"n{self.index[id(t)]}":
                continue                      # hidden in a "… steps …" node or a box
            statements[name] = (self._label(t), self._node_attrs(t))
            self._place(tree, self.scope[id(t)] or "", name, self.index[id(t)])
        first_index = {}
        for t in self.order:
            first_index.setdefault(self.rep[id(t)], self.index[id(t)])
        for name, (scope, label, attrs) in self.extra.items():
            if name in first_index:           # a box or skip node that something maps to
                statements[name] = (label, attrs)
                self._place(tree, scope, name, first_index[name])
        self._write_cluster(g, tree, "", statements)
        self._write_edges(g)
        if self.attention_edges:
            self._write_attention_edges(g)
        g.nodes = len(statements)
        g.edges = sum(" -> " in line for line in g.body)          # the lines this drawing wrote
        g.boxes = sum(line.lstrip().startswith("subgraph ") for line in g.body)
        return g

    def _place(self, tree: dict, scope: str, name: str, index: int) -> None:
        parts = scope.split("/") if scope else []
        path = ""
        tree[""].weight.append(index)
        for part in parts:
            child = f"{path}/{part}" if path else part
            if child not in tree:
                tree[child] = Cluster()
                tree[path].children.append(child)
            tree[child].weight.append(index)
            path = child
        tree[path].items.append(name)

    def _write_cluster(self, g, tree: dict, path: str, statements: dict) -> None:
        cluster = tree[path]
        # Top-level nodes (parameters, the loss) after the clusters: written first, they make
        # dot order the encoder's steps right to left.
        if path:
            self._write_nodes(g, cluster.items, statements)
        for child in sorted(cluster.children, key=lambda c: _sibling_key(c, tree[c])):
            # A scope holding only one inner scope is one box: "attention / additive_attention".
            title, inner = [child.rsplit("/", 1)[-1]], child
            while not tree[inner].items and len(tree[inner].children) == 1:
                inner = tree[inner].children[0]
                title.append(inner.rsplit("/", 1)[-1])
            kind = scope_kind(inner)
            sub = graphviz.Digraph(name=f"cluster_{inner}")
            style = "rounded,dashed,filled" if ".." in inner.rsplit("/", 1)[-1] else "rounded,filled"
            sub.attr(label=" / ".join(title), style=style, fillcolor=CLUSTER_FILL[kind],
                     color=_CLUSTER_PEN[kind], fontname=FONT, fontsize="11" if kind == "step" else "13",
                     labeljust="l")
            self._write_cluster(sub, tree, inner, statements)
            g.subgraph(sub)
        if not path:
            self._write_nodes(g, cluster.items, statements)
            self._write_rows(g)

    @staticmethod
    def _write_nodes(g, names: list, statements: dict) -> None:
        for name in names:
            label, attrs = statements[name]
            g.node(name, label, **attrs)

    def _write_edges(self, g) -> None:
        edges: dict[tuple[str, str], list] = {}
        for t in self.order:
            if t.node is None:
                continue
            for inp in t.node.inputs:
                if id(inp) not in self.rep:
                    continue                  # a constant, left out of the gradient graph
                source, target = self.rep[id(inp)], self.rep[id(t)]
                if source == target:
                    continue                  # inside one box or one "… steps …" node
                edges.setdefault((source, target), []).append((inp, t))
        for (source, target), uses in edges.items():
            inp, user = uses[0]
            attrs = {}
            if isinstance(inp, Parameter):
                # Weights feed many steps: thin blue-grey edges keep the data path in front,
                # and only the edge to the earliest use pulls on the layout, so the weight sits
                # just above its first step instead of dragging every step to one rank.
                anchor = self._first_use(inp)
                attrs.update(color=PARAM_EDGE, penwidth="0.7", weight="1" if target == anchor else "0")
            elif inp.node is None and not inp.requires_grad:
                attrs.update(color="#aaaaaa", penwidth="0.7")
            elif self.scope[id(inp)] == self.scope[id(user)] and _step_of(self.scope[id(user)]):
                # Keeps a step's ops together: a step's input projection needs nothing from
                # the step before, and would otherwise float to the top of a tall step box.
                attrs["weight"] = "3"
            elif _backward_in_time(self.scope[id(inp)], self.scope[id(user)]):
                # A bidirectional RNN's reverse direction runs t3 -> t2 -> ...: laid out along,
                # it would stretch every step box over the whole unroll, so the steps keep
                # their forward order and these edges point back against it.
                attrs["constraint"] = "false"
            label = ""
            shared = isinstance(inp, Parameter) and len(self.consumers[id(inp)]) > 1
            if self.backward and not shared:
                # A shared weight's node says "grad = sum of N": its N edges stay unlabelled.
                label = f"{self._grad_name(inp)} {tuple(inp.shape)}"
            if len(uses) > 1 and source.startswith("n") and target.startswith("n"):
                # x*x: one tensor used twice by one op (edges into a box or a "… steps …"
                # node stand for many uses anyway, so those go unlabelled)
                label = f"{label} ×{len(uses)}".strip()
            if label:
                attrs["label"] = label
            if self.backward:
                g.edge(target, source, **attrs)
            else:
                g.edge(source, target, **attrs)
        if self.backward:
            seed = f"d{self._name(self.root)} = 1" if self.root.size == 1 else f"d{self._name(self.root)}"
            g.node("seed", seed, shape="plaintext", fontsize="10")
            g.edge("seed", self.rep[id(self.root)], label=f"{tuple(self.root.shape)}")

    def _input_rows(self) -> list:
        """Inputs that one op reads together (h_1, h_2, h_3 into a cat), each row to be drawn
        left to right in argument order (dot places them as it likes).  Only inputs drawn
        outside every box: inside a cluster dot ignores both this and ``ordering=in``."""
        rows = []
        for t in self.order:
            if t.node is None:
                continue
            names = []
            for inp in t.node.inputs:
                name = self.rep.get(id(inp))
                if (name == f"n{self.index[id(inp)]}" and name not in names
                        and _kind(inp) == "input" and not self.scope[id(inp)]):
                    names.append(name)
            if len(names) > 1:
                rows.append(names)
        return rows

    def _write_rows(self, g) -> None:
        """An invisible chain in one rank keeps each row of inputs in order."""
        for names in self._input_rows():
            with g.subgraph() as row:
                row.attr(rank="same")
                for left, right in pairwise(names):
                    row.edge(left, right, style="invis")

    def _first_use(self, t) -> str:
        """The DOT node of a tensor's earliest consumer: lowest time step, then first made.
        Kept per tensor: every edge from a weight asks, and a weight has a consumer per step."""
        first = self.first_use.get(id(t))
        if first is None:
            def when(user):
                step = _step_of(user.node.scope)
                return (step[1] if step else -1, self.index[id(user)])

            first = self.first_use[id(t)] = self.rep[id(min(self.consumers[id(t)], key=when))]
        return first

    def _write_attention_edges(self, g) -> None:
        for t in self.order:
            if not _is_attention_weights(t) or id(t) in self.hidden:
                continue
            if self.rep[id(t)] != f"n{self.index[id(t)]}":    # folded into a box: no edges
                continue
            values = self._attended_values(t)
            if values is None:
                continue
            weights = _weights_row(t)
            sources = self._source_positions(values, len(weights))
            for j, (source, a) in enumerate(zip(sources, weights, strict=True)):
                if source is None:
                    continue
                a = float(min(max(a, 0.0), 1.0))
                opacity = int(60 + 195 * a)
                # No text on the edges: S labels crowd around one node; the weights node
                # lists them in order instead, and each edge's tooltip names its own.
                # constraint=false: these edges are read, not laid out along.
                g.edge(source, self.rep[id(t)], style="dashed", color=f"{_ATTENTION_EDGE}{opacity:02x}",
                       penwidth=f"{0.6 + 4.0 * a:.2f}", arrowsize="0.4", constraint="false",
                       tailport="e", headport="e", tooltip=f"a[{j}] = {a:.3f} (batch row 0)")

    def _attended_values(self, weights):
        """The values a weights tensor is multiplied with (weights @ values), or None."""
        frontier = [weights]
        while frontier:
            current = frontier.pop()
            for user in self.consumers.get(id(current), []):
                name = user.node.op_name
                if name == "MatMul" and user.node.inputs[0] is current:
                    return user.node.inputs[1]
                if name == "Dropout":
                    frontier.append(user)
        return None

    def _source_positions(self, values, length: int) -> list:
        """The DOT node of each source position h_j: the pieces of the cat along the
        positions axis that built ``values``, else ``values`` itself for every j."""
        node = values.node
        if node is not None and node.op_name == "Cat" and len(node.inputs) == length:
            axis = node.attrs.get("axis")
            if axis in (values.ndim - 2, -2) and all(x.shape[-2] == 1 for x in node.inputs):
                pieces = [x for x in node.inputs]
                return [self._visible(x) for x in pieces]
        return [self._visible(values)] * length

    def _visible(self, t) -> str | None:
        name = self.rep.get(id(t))
        return None if name is None or name.startswith("skip") else name


def _backward_in_time(source_scope: str | None, target_scope: str | None) -> bool:
    source = _step_of(source_scope) if source_scope else None
    target = _step_of(target_scope) if target_scope else None
    return source is not None and target is not None and source[0] == target[0] and source[1] > target[1]


def _weights_row(t) -> np.ndarray:
    """Attention weights (B, ..., S) -> (S,): batch row 0, averaged over query rows and
    heads when one node holds several."""
    weights = np.asarray(t.numpy(), dtype=np.float64)
    if weights.ndim >= 2:
        weights = weights[0]
    return weights.reshape(-1, weights.shape[-1]).mean(axis=0)


def _attention_scopes() -> set[str]:
    """The scope names attention is recorded under: a decoder's, and each mechanism's own.
    Read at each call, so a renamed scope is drawn as what it is."""
    return {_scopes.ATTENTION, *_attention.SCOPES.values()}


def _is_attention_weights(t) -> bool:
    return (t.node is not None and t.node.op_name in ("MaskedSoftmax", "Softmax")
            and not _attention_scopes().isdisjoint(t.node.scope.split("/")))


def scope_kind(path: str) -> str:
    parts = path.split("/")
    if parts[-1] in _attention_scopes():
        return "attention"
    if _STEP.match(parts[-1]) or parts[-1] == _scopes.REVERSE:
        return "step"
    if parts[0] == _scopes.ENCODER:
        return "encoder"
    return "decoder" if parts[0] == _scopes.DECODER else "step"


def _sibling_key(path: str, cluster: Cluster):
    # Time steps (and "t2..t37", the hidden ones) in time order; other scopes in the order
    # their ops mostly ran.
    match = _STEP.match(path.rsplit("/", 1)[-1])
    if match:
        return (0, int(match.group(1)))
    return (1, sum(cluster.weight) / len(cluster.weight))


def outermost_match(scope: str, patterns) -> str | None:
    parts = scope.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        for pattern in patterns:
            if fnmatch.fnmatchcase(prefix, pattern) or fnmatch.fnmatchcase(parts[i - 1], pattern):
                return prefix
    return None


def wrap_label(text: str, width: int) -> str:
    lines, line = [], ""
    for word in text.split(", "):
        if line and len(line) + len(word) + 2 > width:
            lines.append(line + ",")
            line = word
        else:
            line = f"{line}, {word}" if line else word
    lines.append(line)
    return "\\n".join(lines)
