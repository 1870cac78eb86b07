"""ta.viz.graph of a compiled plan (viz/plan.py): one node per kernel call of ``step.source``,
fused kernels labelled with their formula, calls boxed by the scopes the engine's own graph
of the same step draws; drawn with the real Graphviz ``dot``."""

import functools
import re

import numpy as np
import pytest
import sympy as sp

import tinygrad_attn as ta
from tests import optional
from tests.test_fuse import loss_of
from tests.test_viz_graph import cluster_members, clusters, drawn_edges, drawn_nodes, svg_of
from tinygrad_attn import viz
from tinygrad_attn.compiler import fuse as fusing

needs_dot = optional.needs_dot
_CALL = re.compile(r"^    (?:[^=]+ = )?(\w+)\(")


@pytest.fixture
def fusing_compile(monkeypatch):
    """ta.compile with fusion on, at every size and for every member (the "cpu" rules that
    leave small chains and transcendental members unfused are off: these tests are of the
    fused kernels, test_fuse.py's test_fusion_rules_* of the rules)."""
    monkeypatch.setattr(fusing, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(fusing, "SCALAR_MATH", {})
    return functools.partial(ta.compile, fuse=True)


def _tiny(compile_fn):
    step = compile_fn(loss_of(lambda a, b: a * b + a))
    a = ta.Tensor([1.0, 2.0, 3.0], dtype="float64", requires_grad=True)
    b = ta.Tensor([0.5, -1.0, 2.0], dtype="float64", requires_grad=True)
    step(a, b)
    return step


def _kernel_lines(source: str) -> list[str]:
    """The kernels the plan calls, in order, read off the source by a regex (the oracle)."""
    found = [_CALL.match(line) for line in source.splitlines()]
    return [m.group(1) for m in found if m and m.group(1) not in ("rebuild_view", "def")]


def _transformer_step():
    ta.manual_seed(0)
    model = ta.models.Transformer(11, 11, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                  dim_feedforward=16, dropout=0.0)

    def step(src, tgt_in, tgt_out):
        loss = model.loss(src, tgt_in, tgt_out)
        loss.backward()
        return loss

    rng = np.random.default_rng(0)
    batch = [ta.Tensor(rng.integers(3, 11, size=(2, 5))) for _ in range(3)]
    compiled = ta.compile(step)
    compiled(*batch)
    return compiled, model, batch


# ---------------------------------------------------------------- nodes and labels


def test_every_kernel_call_is_one_node_in_source_order():
    step = _tiny(ta.compile)
    plan = step.plans[0]
    g = viz.graph(step)
    kernels = _kernel_lines(plan.source)
    assert len(kernels) == plan.calls
    labels = {}
    for line in g.body:
        node = re.match(r'\s*(k\d+) \[label="?([^" ]+)"?', line)
        if node:
            labels[int(node.group(1)[1:])] = node.group(2)
    assert [labels[k] for k in sorted(labels)] == kernels
    # The calls, arguments a and b, backward's seed (folded into a constant), the return.
    assert plan.constants and g.nodes == plan.calls + 2 + len(plan.constants) + 1
    # The forward mul reads both arguments, drawn once each.
    mul = 1 + kernels.index("mul")
    into = {line.split(" -> ")[0].strip() for line in g.body if line.endswith(f" -> k{mul}\n")}
    assert into == {"a_xs_0", "a_xs_1"}          # _loss's *xs: the plan's arguments xs_0, xs_1


def test_graph_of_a_compiled_function_is_its_latest_plan():
    step = _tiny(ta.compile)
    step(*(ta.Tensor(np.arange(5.0), dtype="float64", requires_grad=True) for _ in range(2)))   # 2nd plan
    first, latest = (viz.graph(plan).source for plan in step.plans)
    assert first != latest and viz.graph(step).source == latest
    assert "(5,)" in latest and "(3,)" in first                  # the shapes each plan was captured at


def test_a_fused_kernel_is_one_node_labelled_with_its_formula(fusing_compile):
    step = _tiny(fusing_compile)
    g = viz.graph(step)
    fused = [line for line in g.body if "fused_" in line and "[label=" in line]
    # The forward chain, and its backward: the composed derivative's kernel for each leaf.
    assert len(fused) == 3, step.source
    forward = next(line for line in fused if '"mul → add' in line)
    formula = re.search(r'\\n= ([^"]+)"', forward).group(1)
    x0, x1 = sp.symbols("x0 x1")
    assert sp.simplify(sp.sympify(formula) - (x0 * x1 + x0)) == 0
    for leaf in (0, 1):
        backward = next(line for line in fused if f'"d/dx{leaf} of mul → add' in line)
        assert sp.simplify(sp.sympify(re.search(r'\\nf = ([^"]+)"', backward).group(1)) - (x0 * x1 + x0)) == 0
    # Edges into the forward fused node say which leaf each argument is: a (xs_0) is x0, b x1.
    node = re.match(r"\s*(k\d+)", forward).group(1)
    assert f"\ta_xs_0 -> {node} [label=x0]\n" in g.body and f"\ta_xs_1 -> {node} [label=x1]\n" in g.body
    assert g.nodes == step.plans[0].calls + 3 + len(step.plans[0].constants)    # a, b, the return, seed


def test_each_plan_labels_its_fused_kernel_with_its_own_parameters(fusing_compile):
    from tests.test_fuse import leaky_step

    step = fusing_compile(leaky_step, static=("slope",))
    for slope in (0.1, 0.3):
        step(*(ta.Tensor(np.linspace(-1, 1, 4), requires_grad=True) for _ in range(2)), slope)
    labels = []
    for plan in step.plans:
        line = next(line for line in viz.graph(plan).body if '"mul → leaky_relu → add' in line)
        labels.append(sp.sympify(re.search(r'\\n= ([^"]+)"', line).group(1).replace("\\n", "")))
    x0, x1 = sp.symbols("x0 x1")
    for label, slope in zip(labels, (0.1, 0.3), strict=True):
        point = {x0: 1.0, x1: -2.0}                       # leaky_relu(1 * -2) + 1 = -2*slope + 1
        assert abs(float(label.subs(point)) - (-2 * slope + 1)) < 1e-4, label


def test_graph_rejects_options_of_a_tensor_graph_and_an_uncalled_function():
    step = _tiny(ta.compile)
    with pytest.raises(TypeError, match="plan"):
        viz.graph(step, backward=True)
    with pytest.raises(ValueError, match="no unrolled steps"):
        viz.graph(step, collapse=2)
    with pytest.raises(ValueError, match="no plan yet"):
        viz.graph(ta.compile(lambda x: x * 2))
    with pytest.raises(TypeError, match="compiled plan"):
        viz.graph(object())


# ---------------------------------------------------------------- clusters


@needs_dot
def test_a_transformer_plan_sits_in_the_clusters_of_the_engines_graph():
    step, model, batch = _transformer_step()
    drawing = viz.graph(step)
    engine = viz.graph(model.loss(*batch))
    assert set(clusters(svg_of(drawing))) == set(clusters(svg_of(engine)))
    members = cluster_members(drawing.source)
    labels = {name: lines for name, lines in drawn_nodes(svg_of(drawing)).items()}
    attention = "cluster_encoder/layer0/self_attention/multi_head_attention/scaled_dot_product_attention"
    sdpa = [n for n, lines in labels.items() if lines[0] in ("sdpa", "sdpa_back")]
    assert sdpa and all(members[n][-1].endswith("scaled_dot_product_attention") for n in sdpa)
    assert any(members[n][-1] == attention for n in sdpa)
    # Every call's innermost box is the scope of the comment above it in the source (this plan
    # is unfused: a comment is "phase Op scope", the scope left out at the top level).
    comment, scope_of_line = "", {}
    for number, line in enumerate(step.source.splitlines(), start=1):
        if line.startswith("    # "):
            words = line.split()[1:]
            comment = words[2] if len(words) > 2 else ""
        scope_of_line[number] = comment
    for line in drawing.body:
        node = re.match(r'\s*(k\d+) \[.* line (\d+):', line)
        if node:
            want = scope_of_line[int(node.group(2))]
            got = members.get(node.group(1), ["cluster_"])[-1].removeprefix("cluster_")
            assert got == want, line


@needs_dot
def test_collapse_draws_each_matching_scope_as_one_box():
    step, _, _ = _transformer_step()
    full = viz.graph(step)
    boxed = viz.graph(step, collapse="multi_head_attention")
    boxes = [line for line in boxed.body if "box3d" in line]
    assert len(boxes) == 3                 # encoder self-, decoder self- and cross-attention
    assert boxed.nodes < full.nodes - 50
    assert all("kernel calls: " in line for line in boxes)


# ---------------------------------------------------------------- rendering


@needs_dot
def test_dot_renders_a_plan_with_every_node_and_edge(tmp_path, fusing_compile):
    step = _tiny(fusing_compile)
    g = viz.graph(step)
    svg = svg_of(g)
    assert len(drawn_nodes(svg)) == g.nodes
    assert len(drawn_edges(svg)) == g.edges
    written = viz.render(step, tmp_path / "plan.png")
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert viz.render(step.plans[0], tmp_path / "plan.dot").read_text() == g.source
