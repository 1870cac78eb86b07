"""Attention functions: exact (sympy) and finite-difference gradients, mask semantics,
numerics, layouts, graph scopes and errors.  The PyTorch comparisons are in
test_attention_torch.py."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_attn as ta
from tinygrad_attn import Tensor
from tinygrad_attn.ops import AdditiveScores, MaskedSoftmax, ScaledDotProduct


def rand(seed, *shape):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape)


MASK = np.array([[True, False, True], [False, False, False]])        # (B=2, T_k=3); row 1 empty
CAUSAL_PLUS_EMPTY = np.array([[True, True, True], [False, False, False]])   # (T_q=2, T_k=3)

# (id, function of float tensors -> (context, weights), float inputs); tiny shapes for sympy.
CASES = [
    ("dot single", lambda q, k: ta.attention.dot(q, k), (rand(1, 2, 2), rand(2, 2, 3, 2))),
    ("dot many values", lambda q, k, v: ta.attention.dot(q, k, v),
     (rand(3, 2, 2), rand(4, 3, 2), rand(5, 3, 1))),
    ("dot masked empty row", lambda q, k: ta.attention.dot(q, k, mask=MASK),
     (rand(6, 2, 2), rand(7, 2, 3, 2))),
    ("general", lambda q, k, W: ta.attention.general(q, k, W, mask=MASK[0]),
     (rand(8, 2, 2), rand(9, 2, 3, 1), rand(10, 2, 1))),
    ("concat", lambda q, k, W, v: ta.attention.concat(q, k, W, v, mask=MASK),
     (rand(11, 2, 1), rand(12, 2, 3, 2), rand(13, 2, 3), rand(14, 2))),
    ("additive", lambda q, k, Wq, Wk, v: ta.attention.additive(q, k, Wq, Wk, v, mask=MASK),
     (rand(15, 2, 2), rand(16, 2, 3, 1), rand(17, 2, 2), rand(18, 2, 1), rand(19, 2))),
    ("additive many", lambda q, k, Wq, Wk, v: ta.attention.additive(q, k, Wq, Wk, v),
     (rand(20, 2, 1), rand(21, 3, 1), rand(22, 2, 1), rand(23, 2, 1), rand(24, 2))),
    ("sdpa causal", lambda q, k, v: ta.attention.scaled_dot_product(q, k, v, causal=True),
     (rand(25, 3, 2), rand(26, 3, 2), rand(27, 3, 1))),
    ("sdpa mask empty row scale", lambda q, k, v: ta.attention.scaled_dot_product(
        q, k, v, mask=CAUSAL_PLUS_EMPTY, scale=0.7), (rand(28, 2, 2), rand(29, 3, 2), rand(30, 3, 2))),
    ("multi_head", lambda x, Wq, Wk, Wv, Wo, bq: ta.attention.multi_head(
        x, x, x, 2, Wq, Wk, Wv, Wo, bq, key_mask=np.array([[True, False]]), causal=True),
     (rand(31, 1, 2, 2), rand(32, 2, 2), rand(33, 2, 2), rand(34, 2, 2), rand(35, 2, 2), rand(36, 2))),
    ("graph", lambda x, W, a_src, a_dst: ta.attention.graph(
        x, np.array([[False, True, False], [True, False, True], [False, False, False]]),
        W, a_src, a_dst, heads=2, add_self_loops=False),
     (rand(37, 3, 2), rand(38, 2, 2), rand(39, 2, 1), rand(40, 2, 1))),
    ("graph mean self loops", lambda x, W, a_src, a_dst: ta.attention.graph(
        x, np.array([[False, True], [False, False]]), W, a_src, a_dst, heads=2, concat=False,
        negative_slope=0.3), (rand(41, 2, 1), rand(42, 4, 1), rand(43, 2, 2), rand(44, 2, 2))),
]
IDS = [c[0] for c in CASES]


def _output(fn, which):
    """fn's context (which=0) or weights (which=1), keeping the parameter names for reports."""
    def out(*xs):
        return fn(*xs)[which]
    return out


@pytest.mark.parametrize("which", [0, 1], ids=["context", "weights"])
@pytest.mark.parametrize("name, fn, inputs", CASES, ids=IDS)
def test_attention_gradients_match_sympy(name, fn, inputs, which):
    report = ta.check.symbolic(_output(fn, which), *inputs)
    assert report.ok, str(report)


@pytest.mark.parametrize("which", [0, 1], ids=["context", "weights"])
@pytest.mark.parametrize("name, fn, inputs", CASES, ids=IDS)
def test_attention_gradients_match_finite_differences(name, fn, inputs, which):
    report = ta.check.gradcheck(_output(fn, which), *inputs)
    assert report.ok, str(report)


# ---------------------------------------------------------------- masks and numerics


def test_fully_masked_row_gives_zero_weights_context_and_gradients():
    q = Tensor(rand(50, 2, 3, 4), requires_grad=True, dtype=np.float64)
    k = Tensor(rand(51, 2, 5, 4), requires_grad=True, dtype=np.float64)
    mask = np.ones((2, 3, 5), bool)
    mask[1, 2] = False                                   # batch 1, query 2 sees nothing
    context, weights = ta.attention.scaled_dot_product(q, k, k, mask=mask)
    assert np.all(weights.numpy()[1, 2] == 0) and np.all(context.numpy()[1, 2] == 0)
    (context.sum() + weights.sum()).backward()
    assert np.all(np.isfinite(q.grad.numpy())) and np.all(np.isfinite(k.grad.numpy()))
    assert np.all(q.grad.numpy()[1, 2] == 0)
    np.testing.assert_allclose(weights.numpy()[mask.any(-1)].sum(-1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logits_of_1e4_do_not_overflow(dtype):
    q = Tensor(np.array([[100.0, 0.0], [-100.0, 0.0]]), requires_grad=True, dtype=dtype)
    k = Tensor(np.array([[100.0, 0.0], [99.0, 0.0], [0.0, 1.0]]), requires_grad=True, dtype=dtype)
    context, weights = ta.attention.dot(q, k)            # scores up to 1e4
    context.sum().backward()
    for x in (context, weights, q.grad, k.grad):
        assert np.all(np.isfinite(x.numpy()))
    # exp(1e4 - 9.9e3) = e^100: the first key takes all the weight.
    np.testing.assert_allclose(weights.numpy()[0], [1.0, 0.0, 0.0], atol=1e-30)


def test_masked_positions_get_exactly_zero_weight_even_with_huge_scores():
    scores = Tensor(np.array([[1e30, 1.0, 2.0]]), requires_grad=True, dtype=np.float64)
    weights = ta.attention.masked_softmax(scores, np.array([False, True, True]))
    expected = np.exp([1.0, 2.0]) / np.exp([1.0, 2.0]).sum()
    np.testing.assert_allclose(weights.numpy(), [[0.0, *expected]], rtol=1e-14)


@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_weights_rows_sum_to_one_or_zero(batch, t_q, t_k, seed):
    rng = np.random.default_rng(seed)
    q = Tensor(rng.normal(size=(batch, t_q, 3)) * 5)
    k = Tensor(rng.normal(size=(batch, t_k, 3)) * 5)
    mask = rng.random((batch, t_q, t_k)) < 0.6
    _, weights = ta.attention.scaled_dot_product(q, k, k, mask=mask)
    w = weights.numpy()
    np.testing.assert_allclose(w.sum(-1), mask.any(-1).astype(float), atol=1e-6)
    assert np.all(w[~mask] == 0)


@pytest.mark.parametrize("mechanism", ["dot", "general", "concat", "additive", "scaled_dot_product"])
def test_one_query_per_row_equals_many_queries_of_length_one(mechanism):
    rng = np.random.default_rng(60)
    q, k, v = rng.normal(size=(2, 3)), rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 4, 2))
    params = {
        "dot": (), "scaled_dot_product": (),
        "general": (Tensor(rng.normal(size=(3, 3))),),
        "concat": (Tensor(rng.normal(size=(5, 6))), Tensor(rng.normal(size=5))),
        "additive": (Tensor(rng.normal(size=(5, 3))), Tensor(rng.normal(size=(5, 3))),
                     Tensor(rng.normal(size=5))),
    }[mechanism]
    fn = getattr(ta.attention, mechanism)
    mask = np.array([[True, True, False, True], [False, True, True, True]])

    def call(query, mask):
        if mechanism == "scaled_dot_product":
            return fn(query, Tensor(k), Tensor(v), mask=mask)
        return fn(query, Tensor(k), *params, values=Tensor(v), mask=mask)

    c1, w1 = call(Tensor(q), mask)
    cm, wm = call(Tensor(q[:, None]), mask[:, None])
    assert c1.shape == (2, 2) and w1.shape == (2, 4)
    np.testing.assert_allclose(c1.numpy(), cm.numpy()[:, 0], rtol=1e-6)
    np.testing.assert_allclose(w1.numpy(), wm.numpy()[:, 0], rtol=1e-6)


def test_causal_forbids_later_keys():
    x = Tensor(np.random.default_rng(61).normal(size=(2, 4, 3)))
    _, weights = ta.attention.scaled_dot_product(x, x, x, causal=True)
    assert np.all(np.triu(weights.numpy(), k=1) == 0)
    np.testing.assert_allclose(weights.numpy()[:, 0, 0], 1.0)


def test_graph_attention_only_reaches_neighbours_and_self():
    rng = np.random.default_rng(62)
    adjacency = np.array([[False, True, False], [False, False, False], [True, True, False]])
    _, weights = ta.attention.graph(Tensor(rng.normal(size=(3, 2))), adjacency,
                                    Tensor(rng.normal(size=(4, 2))), Tensor(rng.normal(size=(2, 2))),
                                    Tensor(rng.normal(size=(2, 2))), heads=2)
    allowed = adjacency | np.eye(3, dtype=bool)
    assert weights.shape == (2, 3, 3)
    assert np.all(weights.numpy()[:, ~allowed] == 0)
    np.testing.assert_allclose(weights.numpy().sum(-1), 1.0, rtol=1e-6)


def test_dropout_keeps_returned_weights_a_distribution():
    ta.manual_seed(0)
    x = Tensor(np.random.default_rng(63).normal(size=(1, 6, 4)))
    context, weights = ta.attention.scaled_dot_product(x, x, x, dropout=0.5)
    plain, _ = ta.attention.scaled_dot_product(x, x, x)
    np.testing.assert_allclose(weights.numpy().sum(-1), 1.0, rtol=1e-6)
    assert not np.allclose(context.numpy(), plain.numpy())


def test_need_weights_false_returns_none():
    x = Tensor(np.ones((1, 2, 4)))
    context, weights = ta.attention.scaled_dot_product(x, x, x, need_weights=False)
    assert weights is None and context.shape == (1, 2, 4)


# ---------------------------------------------------------------- fused ops vs primitive formulas


def test_masked_softmax_equals_masked_fill_then_softmax():
    scores = rand(70, 2, 3, 4)
    mask = np.random.default_rng(71).random((3, 4)) < 0.7
    mask[:, 0] = True                                   # no empty rows: masked_fill would give NaN
    a = Tensor(scores, requires_grad=True, dtype=np.float64)
    b = Tensor(scores, requires_grad=True, dtype=np.float64)
    fused = MaskedSoftmax.apply(a, Tensor(mask))
    plain = b.masked_fill(~mask, -np.inf).softmax(-1)
    np.testing.assert_allclose(fused.numpy(), plain.numpy(), rtol=1e-14)
    c = rand(72, 2, 3, 4)
    fused.backward(c)
    plain.backward(c)
    np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_additive_scores_equal_broadcast_tanh_formula():
    s, W_q, k, v = rand(73, 2, 3, 6), rand(77, 4, 6), rand(74, 2, 5, 4), rand(75, 4)
    fused_in = [Tensor(x, requires_grad=True, dtype=np.float64) for x in (s, W_q, k, v)]
    plain_in = [Tensor(x, requires_grad=True, dtype=np.float64) for x in (s, W_q, k, v)]
    fused = AdditiveScores.apply(*fused_in)
    sp, Wp, kp, vp = plain_in
    qp = sp @ Wp.transpose(0, 1)                                             # (2, 3, 4)
    plain = (qp.unsqueeze(-2) + kp.unsqueeze(-3)).tanh() @ vp                # (2, 3, 5)
    np.testing.assert_allclose(fused.numpy(), plain.numpy(), rtol=1e-13)
    c = rand(76, 2, 3, 5)
    fused.backward(c)
    plain.backward(c)
    for x, y in zip(fused_in, plain_in, strict=True):
        np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-12)


# ---------------------------------------------------------------- graph records


@pytest.mark.parametrize("name, fn, inputs", CASES, ids=IDS)
def test_every_node_of_a_call_sits_in_the_mechanism_scope(name, fn, inputs):
    from tinygrad_attn.autograd import toposort

    leaves = [Tensor(x, requires_grad=True) for x in inputs]
    with ta.scope("decoder"):
        context, _ = fn(*leaves)
    mechanism = name.split()[0].replace("sdpa", "scaled_dot_product")
    scope = "decoder/" + ta.attention.SCOPES[mechanism]
    scopes = {t.node.scope for t in toposort(context) if t.node is not None}
    assert scopes and all(s == scope or s.startswith(scope + "/") for s in scopes), scopes


# ---------------------------------------------------------------- bad input


def t(*shape):
    return Tensor(np.ones(shape))


@pytest.mark.parametrize("call, pattern", [
    (lambda: ta.attention.dot(t(2, 3), t(2, 4, 5)),
     r"attention.dot: query \(2, 3\) and keys \(2, 4, 5\) must have the same feature size"),
    (lambda: ta.attention.dot(t(2, 2, 2, 3), t(2, 4, 3)), r"attention.dot: query \(2, 2, 2, 3\) must have the axes of keys"),
    (lambda: ta.attention.dot(t(3), t(4, 3), t(5, 2)), r"attention.dot: values \(5, 2\) and keys \(4, 3\) differ in length"),
    (lambda: ta.attention.dot(t(2, 3), t(2, 4, 3), mask=np.ones((3, 4), bool)),
     r"attention.dot: mask of shape \(3, 4\) does not broadcast to the weights' shape \(2, 4\)"),
    (lambda: ta.attention.dot(t(2, 5, 3), t(2, 4, 3), mask=np.ones((2, 4), bool)),
     r"mask of shape \(2, 4\) does not broadcast to the weights' shape \(2, 5, 4\).*mask\[:, None, :\]"),
    (lambda: ta.attention.dot(t(3, 3), t(2, 4, 3)), r"attention.dot: batch axes do not broadcast"),
    (lambda: ta.attention.general(t(2, 3), t(2, 4, 5), t(3, 4)),
     r"attention.general: keys feature size 5 does not match the weights \(expected 4\): keys \(2, 4, 5\)"),
    (lambda: ta.attention.concat(t(2, 3), t(2, 4, 5), t(6, 7), t(6)),
     r"attention.concat: W \(6, 7\) must have d_q \+ d_k = 3 \+ 5 = 8 columns"),
    (lambda: ta.attention.additive(t(2, 3), t(2, 4, 5), t(6, 3), t(6, 5), t(7)),
     r"attention.additive: v must have shape \(6\), got \(7,\)"),
    (lambda: ta.attention.additive(t(2, 3), t(2, 4, 5), t(6, 3), t(7, 5), t(6)),
     r"attention.additive: W_k must have shape \(6, \*\), got \(7, 5\)"),
    (lambda: ta.attention.scaled_dot_product(t(3), t(4, 3), t(4, 2), causal=True),
     r"attention.scaled_dot_product: causal=True needs many queries"),
    (lambda: ta.attention.multi_head(t(2, 3, 6), t(2, 3, 6), t(2, 3, 6), 4, t(6, 6), t(6, 6), t(6, 6), t(6, 6)),
     r"attention.multi_head: num_heads=4 must divide the embedding size E=6"),
    (lambda: ta.attention.multi_head(t(2, 3, 6), t(2, 3, 6), t(2, 3, 6), 2, t(6, 6), t(6, 6), t(6, 6), t(6, 6),
                                     key_mask=np.ones((3, 2), bool)),
     r"attention.multi_head: key_mask must be boolean \(B, S\) = \(2, 3\)"),
    (lambda: ta.attention.multi_head(t(2, 3, 6), t(2, 4, 5), t(2, 4, 5), 2, t(6, 6), t(6, 6), t(6, 5), t(6, 6)),
     r"attention.multi_head: W_k must have shape \(6, 5\), got \(6, 6\)"),
    (lambda: ta.attention.graph(t(4, 3), np.ones((3, 3), bool), t(2, 3), t(1, 2), t(1, 2)),
     r"attention.graph: adjacency must be boolean \(\.\.\., N, N\) = \(\.\.\., 4, 4\) for x \(4, 3\), got bool of shape \(3, 3\)"),
    (lambda: ta.attention.graph(t(4, 3), np.ones((4, 4), bool), t(4, 3), t(3, 2), t(3, 2), heads=3),
     r"attention.graph: W \(4, 3\) must have heads \* F_out rows \(heads=3\)"),
    (lambda: ta.nn.MultiHeadAttention(10, 3), r"MultiHeadAttention: num_heads=3 must divide embed_dim=10"),
])
def test_bad_attention_input_raises_errors_naming_the_function(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_float_mask_is_refused():
    with pytest.raises(TypeError, match="mask must be boolean"):
        ta.attention.dot(t(2, 3), t(2, 4, 3), mask=np.zeros((2, 4)))


# ---------------------------------------------------------------- the fused ScaledDotProduct op


FUSED_CASES = [
    ("plain", (rand(90, 2, 3, 2), rand(91, 2, 4, 2), rand(92, 2, 4, 3)), None, False),
    ("causal", (rand(93, 3, 2), rand(94, 3, 2), rand(95, 3, 2)), None, True),
    ("mask with empty row", (rand(96, 2, 2, 2), rand(97, 2, 3, 2), rand(98, 2, 3, 1)),
     CAUSAL_PLUS_EMPTY, False),
    ("one query per row, key mask", (rand(99, 2, 2), rand(100, 2, 3, 2), rand(101, 2, 3, 2)), MASK, False),
]


def _fused(mask, causal):
    """The fused op in the layout scaled_dot_product gives it: one query per row gets T_q = 1."""
    def context(q, k, v):
        single = q.ndim == k.ndim - 1
        masks = () if mask is None else (Tensor(mask[..., None, :] if single else mask),)
        out = ScaledDotProduct.apply(q.unsqueeze(-2) if single else q, k, v, *masks,
                                     scale=1 / np.sqrt(k.shape[-1]), causal=causal)
        return out.squeeze(-2) if single else out
    return context


@pytest.mark.parametrize("name, inputs, mask, causal", FUSED_CASES, ids=[c[0] for c in FUSED_CASES])
def test_fused_scaled_dot_product_matches_sympy_and_finite_differences(name, inputs, mask, causal):
    assert ta.check.symbolic(_fused(mask, causal), *inputs).ok
    assert ta.check.gradcheck(_fused(mask, causal), *inputs).ok


@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 5), st.booleans(), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_fused_scaled_dot_product_equals_the_composite_path(batch, t_q, t_k, causal, masked, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=(batch, t_q, 3)), rng.normal(size=(batch, t_k, 3)), rng.normal(size=(batch, t_k, 2))]
    mask = rng.random((batch, t_q, t_k)) < 0.7 if masked else None
    dout = rng.normal(size=(batch, t_q, 2))
    results = []
    for fused in (True, False):
        leaves = [Tensor(a, requires_grad=True, dtype=np.float64) for a in arrays]
        if fused:
            out = _fused(mask, causal)(*leaves)
        else:
            out, _ = ta.attention.scaled_dot_product(*leaves, mask=mask, causal=causal)
        out.backward(dout)
        results.append([out.numpy()] + [x.grad.numpy() for x in leaves])
    for fused, plain in zip(*results, strict=True):
        np.testing.assert_allclose(fused, plain, rtol=1e-10, atol=1e-12)


def test_fused_scaled_dot_product_is_one_node():
    q = Tensor(rand(102, 2, 4, 3), requires_grad=True)
    out = _fused(None, True)(q, q, q)
    assert out.node.op_name == "ScaledDotProduct" and out.node.inputs == (q, q, q)


def _nodes(out):
    from tinygrad_attn.autograd import toposort

    return [t.node for t in toposort(out) if t.node is not None]


@pytest.mark.parametrize("device", ["cpu", "numpy"])
@pytest.mark.parametrize("causal, masked", [(False, False), (True, True)])
def test_multi_head_reads_short_heads_in_place_and_copies_long_ones(monkeypatch, device, causal, masked):
    """Short sentences' heads go to the fused node as the projections leave them, (B, T, H, D),
    with no transposes in the graph; past HEADS_IN_PLACE_MAX_SCORES they are copied to
    (B, H, T, D).  Both give the same context and gradients."""
    B, T, S, E, H = 2, 5, 4, 6, 3
    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=(B, T, E)), rng.normal(size=(B, S, E))] + \
        [rng.normal(size=(E, E)) for _ in range(4)] + [rng.normal(size=E) for _ in range(4)]
    key_mask = np.array([[True] * S, [True, True, False, False]]) if masked else None
    dout = rng.normal(size=(B, T, E))
    results = []
    for limit in (ta.attention.HEADS_IN_PLACE_MAX_SCORES, 0):
        monkeypatch.setattr(ta.attention, "HEADS_IN_PLACE_MAX_SCORES", limit)
        x, memory, *params = (Tensor(a, requires_grad=True, dtype=np.float64, device=device) for a in arrays)
        out, weights = ta.attention.multi_head(x, memory, memory, H, *params[:4], *params[4:], key_mask=key_mask,
                                               causal=causal, need_weights=False)
        assert weights is None
        [sdpa] = [node for node in _nodes(out) if node.op_name == "ScaledDotProduct"]
        permutes = [node for node in _nodes(out) if node.op_name == "Permute"]
        assert (sdpa.op.layout, len(permutes)) == (("BTHD", 0) if limit else ("BHTD", 4))
        assert sdpa.scope == "multi_head_attention/scaled_dot_product_attention"      # either way
        out.backward(dout)
        results.append([out.numpy(), x.grad.numpy(), memory.grad.numpy()] + [p.grad.numpy() for p in params])
    for in_place, copied in zip(*results, strict=True):
        np.testing.assert_allclose(in_place, copied, rtol=1e-12, atol=1e-12)


def test_heads_in_place_record_the_weights_per_head():
    """A record() around the in-place node gets each head's weights, (B, H, T, S), equal to
    what need_weights=True returns."""
    B, T, E, H = 2, 4, 6, 3
    rng = np.random.default_rng(4)
    x = Tensor(rng.normal(size=(B, T, E)), dtype=np.float64)
    params = [Tensor(rng.normal(size=(E, E)), dtype=np.float64) for _ in range(4)]
    _, want = ta.attention.multi_head(x, x, x, H, *params, causal=True, average_weights=False)
    with ta.attention.record() as rec:
        ta.attention.multi_head(x, x, x, H, *params, causal=True, need_weights=False)
    [got] = rec.values()
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("shapes, match", [
    (((2, 3, 2, 4), (2, 3, 2, 4), (2, 3, 2)), r"layout BTHD takes q \(B, T_q, H, D\)"),
    (((2, 3, 2, 4), (2, 5, 3, 4), (2, 5, 3, 4)), r"layout BTHD: k \(2, 5, 3, 4\) must be \(B=2, T_k, H=2, D=4\)"),
    (((2, 3, 2, 4), (2, 5, 2, 4), (2, 4, 2, 1)), r"layout BTHD: .* with the same T_k"),
])
def test_heads_in_place_bad_shapes_name_the_op_and_shapes(shapes, match):
    inputs = [Tensor(np.zeros(shape)) for shape in shapes]
    with pytest.raises(ta.ShapeError, match="ScaledDotProduct: " + match):
        ScaledDotProduct.apply(*inputs, scale=1.0, causal=False, layout="BTHD")


def test_unknown_layout_is_refused():
    q = Tensor(np.zeros((1, 2, 1, 2)))
    with pytest.raises(ValueError, match=r"ScaledDotProduct: layout must be one of \('BHTD', 'BTHD'\)"):
        ScaledDotProduct.apply(q, q, q, scale=1.0, causal=False, layout="BHDT")


# ---------------------------------------------------------------- nothing to attend to


def _grad_of(x):
    return None if x.grad is None else x.grad.numpy()


@pytest.mark.parametrize("device", ["cpu", "numpy"])
def test_softmax_over_an_empty_axis_is_empty(device):
    for method in ("softmax", "log_softmax"):
        x = Tensor(np.ones((2, 0)), requires_grad=True, device=device)
        y = getattr(x, method)(-1)
        assert y.shape == (2, 0)
        y.sum().backward()
        assert _grad_of(x).shape == (2, 0)


@pytest.mark.parametrize("device", ["cpu", "numpy"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_with_zero_keys_gives_a_zero_context_and_no_gradient(device, need_weights):
    q = Tensor(np.ones((1, 2, 4, 3)), requires_grad=True, device=device)
    k = Tensor(np.ones((1, 2, 0, 3)), requires_grad=True, device=device)
    v = Tensor(np.ones((1, 2, 0, 5)), requires_grad=True, device=device)
    context, weights = ta.attention.scaled_dot_product(q, k, v, need_weights=need_weights)
    assert context.shape == (1, 2, 4, 5) and not context.numpy().any()
    assert (weights is None) != need_weights and (weights is None or weights.shape == (1, 2, 4, 0))
    context.sum().backward()
    assert not _grad_of(q).any() and _grad_of(k).shape == (1, 2, 0, 3)
    s = Tensor(np.ones((2, 3)), requires_grad=True, device=device)
    context, weights = ta.attention.dot(s, Tensor(np.ones((2, 0, 3)), device=device))
    assert context.shape == (2, 3) and weights.shape == (2, 0) and not context.numpy().any()
    context.sum().backward()
    assert not _grad_of(s).any()


# ---------------------------------------------------------------- packed in-projections


@given(st.data())
def test_split_pieces_gradients_equal_slicing_on_every_device(data):
    """The pieces' gradients gathered into one cat equal GetItem slices' (the oracle, which
    zero-fills and adds), bitwise; a piece backward never reaches contributes zeros."""
    from tinygrad_attn.compiler import available_devices
    from tinygrad_attn.ops.movement import split

    sizes = tuple(data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4)))
    ndim = data.draw(st.integers(1, 3))
    axis = data.draw(st.integers(-ndim, ndim - 1))
    shape = [data.draw(st.integers(1, 3)) for _ in range(ndim)]
    shape[axis] = sum(sizes)
    used = data.draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    rng = np.random.default_rng(len(sizes) * 10 + ndim)
    x_np = rng.normal(size=shape)
    for device in available_devices():
        grads = []
        for cut in (True, False):
            x = Tensor(x_np, device=device, dtype="float64", requires_grad=True)
            starts = np.cumsum((0,) + sizes)
            where = [(slice(None),) * (axis % ndim) + (slice(a, a + n),)
                     for a, n in zip(starts, sizes, strict=False)]
            pieces = split(x, sizes, axis) if cut else [x[w] for w in where]
            total = (x * 0.5).sum()
            for k, (piece, keep) in enumerate(zip(pieces, used, strict=True)):
                np.testing.assert_array_equal(piece.numpy(), x_np[where[k]])
                if keep:
                    total = total + (piece * float(k + 2)).sum()
            total.backward()
            grads.append(x.grad.numpy())
        np.testing.assert_array_equal(grads[0], grads[1])


def test_split_gathers_afresh_at_every_backward():
    from tinygrad_attn.ops.movement import split

    x = Tensor(np.arange(6.0).reshape(2, 3), dtype="float64", requires_grad=True)
    a, b = split(x, (1, 2), 1)
    loss = (a * 2.0).sum() + (b * 3.0).sum()
    loss.backward(retain_graph=True)
    (a * 5.0).sum().backward()            # b's gradient of the first pass, kept, would add 3 again
    np.testing.assert_array_equal(x.grad.numpy(), [[7.0, 3.0, 3.0]] * 2)


def _multi_head_args(rng, E):
    W, b, W_o, b_o = (Tensor(rng.normal(size=shape) * 0.3, dtype="float64", requires_grad=True)
                      for shape in ((3 * E, E), (3 * E,), (E, E), (E,)))
    return W, b, W_o, b_o


@pytest.mark.parametrize("kind", ["self", "cross", "distinct", "self-unbatched"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_packed_in_projection_equals_the_sliced_weights(kind, need_weights):
    """multi_head with in_proj_weight against the sliced weights passed as W_q, W_k, W_v
    (what MultiHeadAttention did before): outputs, weights and every gradient."""
    rng = np.random.default_rng(5)
    B, T, S, E, H = 2, 4, 3, 8, 2
    shape_q = (T, E) if kind == "self-unbatched" else (B, T, E)
    x_np, m_np, y_np = rng.normal(size=shape_q), rng.normal(size=(B, S, E)), rng.normal(size=(B, S, E))
    results = []
    for packed in (True, False):
        W, b, W_o, b_o = _multi_head_args(np.random.default_rng(6), E)
        x, m, y = (Tensor(a, dtype="float64", requires_grad=True) for a in (x_np, m_np, y_np))
        query, key, value = {"self": (x, x, x), "self-unbatched": (x, x, x), "cross": (x, m, m),
                             "distinct": (x, m, y)}[kind]
        options = dict(need_weights=need_weights, causal=kind.startswith("self"))
        if packed:
            out, w = ta.attention.multi_head(query, key, value, H, None, None, None, W_o, b_o=b_o,
                                             in_proj_weight=W, in_proj_bias=b, **options)
        else:
            out, w = ta.attention.multi_head(query, key, value, H, W[:E], W[E:2 * E], W[2 * E:], W_o,
                                             b[:E], b[E:2 * E], b[2 * E:], b_o, **options)
        (out * out).sum().backward()
        grads = [t.grad.numpy() if t.grad is not None else None for t in (x, m, y, W, b, W_o, b_o)]
        results.append((out.numpy(), None if w is None else w.numpy(), grads))
    (o1, w1, g1), (o2, w2, g2) = results
    np.testing.assert_allclose(o1, o2, rtol=1e-12, atol=1e-12)
    if need_weights:
        np.testing.assert_allclose(w1, w2, rtol=1e-12, atol=1e-12)
    for a, b in zip(g1, g2, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_packed_self_attention_projects_once_and_slices_nothing():
    """Self-attention's in-projection is one Linear cut by Split: no GetItem copies of the
    weights (each a (3E, E) zero-filled gradient), and cross-attention two Linears."""
    from tinygrad_attn.autograd import toposort

    mha = ta.nn.MultiHeadAttention(8, 2).double()
    x = Tensor(np.random.default_rng(0).normal(size=(2, 5, 8)), dtype="float64", requires_grad=True)
    m = Tensor(np.random.default_rng(1).normal(size=(2, 3, 8)), dtype="float64")
    for query, key, linears in ((x, x, 2), (x, m, 3)):
        out, _ = mha(query, key, key, need_weights=False)
        names = [t.node.op.name for t in toposort(out) if t.node is not None]
        assert "GetItem" not in names
        assert names.count("Linear") == linears                  # in-projections + out_proj
        assert "Split" in names
