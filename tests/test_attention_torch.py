"""Every attention function and layer against PyTorch (CPU, float64): values and gradients.

Each check runs the same inputs through ``ta.attention`` (or a ``ta.nn`` layer) and through
PyTorch: ``F.scaled_dot_product_attention``, ``nn.MultiheadAttention`` with its weights
loaded into ours, or a literal torch composition of the mechanism's formula.  Every output
is compared; then, once per output, backward runs with a fixed random cotangent on that
output alone and the gradient of every input and parameter is compared.

Masks are drawn with at least one attendable key in every row: for a row with nothing to
attend to PyTorch gives NaN where this library gives zeros (tested elsewhere).  Our masks are
True = may attend; PyTorch's ``key_padding_mask`` and ``nn.MultiheadAttention``'s boolean
``attn_mask`` are True = NOT allowed, so those get the negation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_attn as ta
from tests import optional
from tests.strategies import arrays, broadcastable_to, masks
from tinygrad_attn import Tensor

torch = optional.module("torch", optional.TORCH_REASON)
TF = torch.nn.functional

RTOL, ATOL = 1e-8, 1e-10


# ---------------------------------------------------------------- comparison machinery


def as_torch(a, requires_grad: bool = False) -> torch.Tensor:
    """A C-ordered torch copy of an array of any layout (torch rejects negative strides)."""
    return torch.tensor(np.array(a, order="C"), requires_grad=requires_grad)


def assert_close(actual, expected, what: str) -> None:
    actual = actual.numpy() if isinstance(actual, Tensor) else np.asarray(actual)
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != torch {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != torch {expected.dtype}"
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=what)


def leaf(a) -> Tensor:
    return Tensor(a, requires_grad=True, dtype=np.float64)


def one_query_mask(mask):
    """A one-query-per-row mask (..., T_k) for the many-queries layout (..., 1, T_k)."""
    return mask if mask is None or mask.ndim == 0 else mask[..., None, :]


def cotangent(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape)


def check_outputs(run, seed: int = 0) -> None:
    """``run()`` builds everything afresh and returns ``(outputs, references, leaves,
    torch_leaves)``: our outputs and torch's (tuples, None where there is none) and two
    dicts name -> leaf (inputs and parameters) with the same keys.

    Every output is compared, then for each output separately the gradient of every leaf
    for a random cotangent on that output only."""
    outputs, references, _, _ = run()
    assert len(outputs) == len(references)
    for i, (out, ref) in enumerate(zip(outputs, references, strict=True)):
        if ref is None:
            assert out is None, f"output {i}: torch gives None, we give {out.shape}"
        else:
            assert_close(out, ref, f"output {i}")
    for i, ref in enumerate(references):
        if ref is None:
            continue
        outputs, references, leaves, torch_leaves = run()
        assert sorted(leaves) == sorted(torch_leaves)
        dy = cotangent(ref.shape, seed + i)
        outputs[i].backward(dy)
        references[i].backward(torch.from_numpy(dy.copy()))
        for name, ours in leaves.items():
            theirs = torch_leaves[name]
            # A leaf this output does not depend on has no gradient on either side: zeros.
            expected = np.zeros(theirs.shape) if theirs.grad is None else theirs.grad
            actual = np.zeros(ours.shape) if ours.grad is None else ours.grad
            assert_close(actual, expected, f"gradient of {name} for a cotangent on output {i}")


def functional_run(engine_fn, torch_fn, **arrays_in):
    """A ``run`` for ``check_outputs``: ``engine_fn`` and ``torch_fn`` take the named arrays
    as fresh leaves (ours possibly non-contiguous views, torch's C-ordered copies)."""

    def run():
        leaves = {k: leaf(a) for k, a in arrays_in.items()}
        torch_leaves = {k: as_torch(a, requires_grad=True) for k, a in arrays_in.items()}
        return engine_fn(**leaves), torch_fn(**torch_leaves), leaves, torch_leaves

    return run


def torch_masked_softmax(scores, allowed):
    """softmax over the last axis where ``allowed`` (a numpy bool array) is True."""
    if allowed is None:
        return torch.softmax(scores, dim=-1)
    allowed = torch.from_numpy(np.broadcast_to(allowed, scores.shape).copy())
    return torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)


def causal_allowed(T_q: int, T_k: int) -> np.ndarray:
    """Top-left aligned, as torch's is_causal: query i may attend to keys j <= i."""
    return torch.tril(torch.ones(T_q, T_k, dtype=torch.bool)).numpy()


# ---------------------------------------------------------------- strategies


@st.composite
def attend_masks(draw, full_shape: tuple[int, ...], causal: bool = False) -> np.ndarray:
    """A boolean mask (True = may attend) of a shape that broadcasts to ``full_shape``
    (..., T_k), with at least one attendable key in every row of the full shape, also
    after ANDing the causal mask in (then key 0 is always allowed)."""
    shape = draw(broadcastable_to(full_shape))
    mask = np.array(draw(masks(shape)), dtype=bool)
    if mask.ndim == 0:
        return np.array(True)
    rows = mask.reshape(-1, mask.shape[-1])                          # a view
    if causal:
        rows[:, 0] = True
    else:
        anchors = draw(st.lists(st.integers(0, mask.shape[-1] - 1), min_size=len(rows),
                                max_size=len(rows)))
        for row, j in zip(rows, anchors, strict=True):
            if not row.any():
                row[j] = True
    return mask


batch_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)
lengths = st.integers(1, 5)
features = st.integers(1, 4)


# ---------------------------------------------------------------- scaled dot-product


def torch_sdpa(q, k, v, allowed, scale):
    """(context from F.scaled_dot_product_attention, weights from the explicit formula)."""
    attn_mask = None if allowed is None else torch.from_numpy(
        np.broadcast_to(allowed, q.shape[:-1] + k.shape[-2:-1]).copy())
    context = TF.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
    scale = 1.0 / math.sqrt(k.shape[-1]) if scale is None else scale
    weights = torch_masked_softmax(q @ k.transpose(-2, -1) * scale, allowed)
    return context, weights


@given(data=st.data())
def test_scaled_dot_product_matches_torch(data):
    batch = data.draw(batch_shapes, label="batch")
    T_q, T_k = data.draw(lengths, label="T_q"), data.draw(lengths, label="T_k")
    d_k, d_v = data.draw(features, label="d_k"), data.draw(features, label="d_v")
    causal = data.draw(st.booleans(), label="causal")
    scale = data.draw(st.none() | st.floats(0.1, 2.0), label="scale")
    full = batch + (T_q, T_k)
    mask = data.draw(st.none() | attend_masks(full, causal), label="mask")
    q = data.draw(arrays(batch + (T_q, d_k)), label="q")
    k = data.draw(arrays(batch + (T_k, d_k)), label="k")
    v = data.draw(arrays(batch + (T_k, d_v)), label="v")
    allowed = mask
    if causal:
        tril = causal_allowed(T_q, T_k)
        allowed = tril if mask is None else np.broadcast_to(mask, full) & tril

    # need_weights=False runs the fused ScaledDotProduct node instead of the composite graph.
    need_weights = data.draw(st.booleans(), label="need_weights")

    def reference(q, k, v):
        context, weights = torch_sdpa(q, k, v, allowed, scale)
        return context, (weights if need_weights else None)

    check_outputs(functional_run(
        lambda q, k, v: ta.attention.scaled_dot_product(q, k, v, mask=mask, causal=causal, scale=scale,
                                                        need_weights=need_weights),
        reference, q=q, k=k, v=v))


@given(data=st.data())
def test_scaled_dot_product_one_query_per_row_matches_torch_with_one_query(data):
    batch = data.draw(batch_shapes, label="batch")
    T_k = data.draw(lengths, label="T_k")
    d_k, d_v = data.draw(features, label="d_k"), data.draw(features, label="d_v")
    scale = data.draw(st.none() | st.floats(0.1, 2.0), label="scale")
    # One query per row: the mask broadcasts to (..., T_k), e.g. a key padding mask.
    mask = data.draw(st.none() | attend_masks(batch + (T_k,)), label="mask")
    q = data.draw(arrays(batch + (d_k,)), label="q")
    k = data.draw(arrays(batch + (T_k, d_k)), label="k")
    v = data.draw(arrays(batch + (T_k, d_v)), label="v")

    need_weights = data.draw(st.booleans(), label="need_weights")

    def reference(q, k, v):
        allowed = one_query_mask(mask)
        context, weights = torch_sdpa(q.unsqueeze(-2), k, v, allowed, scale)
        return context.squeeze(-2), (weights.squeeze(-2) if need_weights else None)

    check_outputs(functional_run(
        lambda q, k, v: ta.attention.scaled_dot_product(q, k, v, mask=mask, scale=scale,
                                                        need_weights=need_weights),
        reference, q=q, k=k, v=v))
    # And ours against ours: the many-queries layout with T_q = 1, squeezed.
    single = ta.attention.scaled_dot_product(leaf(q), leaf(k), leaf(v), mask=mask, scale=scale)
    many = ta.attention.scaled_dot_product(leaf(q[..., None, :]), leaf(k), leaf(v),
                                           mask=one_query_mask(mask), scale=scale)
    for one, other in zip(single, many, strict=True):
        np.testing.assert_allclose(one.numpy(), other.numpy().squeeze(-2), rtol=RTOL, atol=ATOL)


def test_scaled_dot_product_module_matches_torch():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 2))
    layer = ta.nn.ScaledDotProductAttention(scale=0.7)
    check_outputs(functional_run(
        lambda q, k, v: layer(q, k, v, causal=True),
        lambda q, k, v: torch_sdpa(q, k, v, causal_allowed(3, 5), 0.7),
        q=q, k=k, v=v))


# ---------------------------------------------------------------- dot, general, concat, additive


def torch_scores(kind, q, k, params):
    """The mechanism's score formula, written out literally in torch: (..., T_q, T_k)."""
    if kind == "dot":
        return q @ k.transpose(-2, -1)
    if kind == "general":
        return (q @ params["W"]) @ k.transpose(-2, -1)
    if kind == "additive":
        hidden = (q @ params["W_q"].T)[..., :, None, :] + (k @ params["W_k"].T)[..., None, :, :]
        return torch.tanh(hidden) @ params["v"]
    if kind == "concat":
        # [s_i; h_j] for every pair (i, j), then v . tanh(W [s_i; h_j]).
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        T_q, T_k = q.shape[-2], k.shape[-2]
        pair_q = q[..., :, None, :].expand(batch + (T_q, T_k, q.shape[-1]))
        pair_k = k[..., None, :, :].expand(batch + (T_q, T_k, k.shape[-1]))
        pairs = torch.cat([pair_q, pair_k], dim=-1)                 # (..., T_q, T_k, d_q + d_k)
        return torch.tanh(pairs @ params["W"].T) @ params["v"]
    raise ValueError(kind)


def engine_attention(kind, query, keys, values, mask, params):
    if kind == "dot":
        return ta.attention.dot(query, keys, values, mask)
    if kind == "general":
        return ta.attention.general(query, keys, params["W"], values, mask)
    if kind == "concat":
        return ta.attention.concat(query, keys, params["W"], params["v"], values, mask)
    return ta.attention.additive(query, keys, params["W_q"], params["W_k"], params["v"], values, mask)


def weight_shapes(kind, d_q, d_k, d_a):
    return {"dot": {}, "general": {"W": (d_q, d_k)},
            "concat": {"W": (d_a, d_q + d_k), "v": (d_a,)},
            "additive": {"W_q": (d_a, d_q), "W_k": (d_a, d_k), "v": (d_a,)}}[kind]


@pytest.mark.parametrize("kind", ["dot", "general", "concat", "additive"])
@given(data=st.data())
def test_score_attention_matches_torch_composition(kind, data):
    batch = data.draw(batch_shapes, label="batch")
    single = data.draw(st.booleans(), label="one query per row")
    T_q = 1 if single else data.draw(lengths, label="T_q")
    T_k = data.draw(lengths, label="T_k")
    d_q = data.draw(features, label="d_q")
    d_k = d_q if kind == "dot" else data.draw(features, label="d_k")
    d_a = data.draw(features, label="d_a")
    with_values = data.draw(st.booleans(), label="with values")
    visible = batch + ((T_k,) if single else (T_q, T_k))
    mask = data.draw(st.none() | attend_masks(visible), label="mask")
    inputs = {"query": data.draw(arrays(batch + ((d_q,) if single else (T_q, d_q))), label="query"),
              "keys": data.draw(arrays(batch + (T_k, d_k)), label="keys")}
    if with_values:
        inputs["values"] = data.draw(arrays(batch + (T_k, data.draw(features, label="d_v"))),
                                     label="values")
    params = {name: data.draw(arrays(shape, low=-1.5, high=1.5), label=name)
              for name, shape in weight_shapes(kind, d_q, d_k, d_a).items()}

    def engine(query, keys, values=None, **params):
        return engine_attention(kind, query, keys, values, mask, params)

    def reference(query, keys, values=None, **params):
        many = query.unsqueeze(-2) if single else query                # (..., T_q, d_q)
        allowed = one_query_mask(mask) if single else mask
        weights = torch_masked_softmax(torch_scores(kind, many, keys, params), allowed)
        context = weights @ (keys if values is None else values)
        if single:
            context, weights = context.squeeze(-2), weights.squeeze(-2)
        return context, weights

    check_outputs(functional_run(engine, reference, **inputs, **params))


@pytest.mark.parametrize("kind", ["dot", "general", "concat", "additive"])
def test_score_attention_modules_match_functional(kind):
    rng = np.random.default_rng(2)
    B, T_q, T_k, d = 2, 3, 4, 3
    layer = {"dot": ta.nn.DotAttention(), "general": ta.nn.GeneralAttention(d, d),
             "concat": ta.nn.ConcatAttention(d, d, 5), "additive": ta.nn.AdditiveAttention(d, d, 5)}[kind]
    layer.double()
    query, keys = rng.normal(size=(B, T_q, d)), rng.normal(size=(B, T_k, d))
    mask = rng.random((B, 1, T_k)) < 0.7
    mask[:, :, 0] = True
    params = {name: p.numpy().copy() for name, p in layer.named_parameters()}

    def run():
        layer.zero_grad()
        leaves = {"query": leaf(query), "keys": leaf(keys)}
        torch_leaves = {name: as_torch(a, requires_grad=True) for name, a in {**params, "query": query,
                                                                             "keys": keys}.items()}
        outputs = layer(leaves["query"], leaves["keys"], mask=mask)
        leaves.update(dict(layer.named_parameters()))
        weights = torch_masked_softmax(
            torch_scores(kind, torch_leaves["query"], torch_leaves["keys"], torch_leaves), mask)
        return outputs, (weights @ torch_leaves["keys"], weights), leaves, torch_leaves

    check_outputs(run)


# ---------------------------------------------------------------- multi-head


def torch_attn_mask(mask, key_mask, causal, B, H, T, S, unbatched):
    """Our (mask, causal) as torch MultiheadAttention's boolean attn_mask (True = NOT allowed),
    our key_mask as its key_padding_mask (True = padding)."""
    allowed = None if mask is None else np.broadcast_to(mask, (B, H, T, S))
    if causal:
        tril = causal_allowed(T, S)
        allowed = tril if allowed is None else allowed & tril
    attn_mask = None
    if allowed is not None:
        if allowed.ndim == 4:
            allowed = allowed[0] if unbatched else allowed.reshape(B * H, T, S)
        attn_mask = torch.from_numpy(~allowed)
    padding = None if key_mask is None else torch.from_numpy(~key_mask)
    return attn_mask, padding


@given(data=st.data())
def test_multi_head_matches_torch_multihead_attention(data):
    H = data.draw(st.integers(1, 3), label="H")
    E = H * data.draw(st.integers(1, 2), label="head size")
    B = data.draw(st.integers(1, 2), label="B")
    unbatched = data.draw(st.booleans(), label="unbatched")
    if unbatched:
        B = 1
    T = data.draw(st.integers(1, 4), label="T")
    self_attention = data.draw(st.booleans(), label="self-attention")
    S = T if self_attention else data.draw(st.integers(1, 4), label="S")
    kdim = vdim = E
    if not self_attention:
        kdim = data.draw(st.sampled_from([E, 1, 3]), label="kdim")
        vdim = data.draw(st.sampled_from([E, 2]), label="vdim")
    bias = data.draw(st.booleans(), label="bias")
    causal = data.draw(st.booleans(), label="causal")
    need_weights = data.draw(st.booleans(), label="need_weights")
    average = data.draw(st.booleans(), label="average_weights")
    # Key 0 is always allowed (causal or not), so every row has something to attend to.
    key_mask = None
    if data.draw(st.booleans(), label="with key_mask"):
        key_mask = np.array(data.draw(masks((B, S)), label="key_mask"), dtype=bool)
        key_mask[:, 0] = True
    mask = None
    if data.draw(st.booleans(), label="with mask"):
        shapes = [(T, S), (H, T, S), (1, H, T, S)] if unbatched else [(T, S), (B, 1, T, S), (B, H, T, S)]
        mask = np.array(data.draw(masks(data.draw(st.sampled_from(shapes), label="mask shape")),
                                  label="mask"), dtype=bool)
        mask[..., 0] = True
    seed = data.draw(st.integers(0, 2**16), label="seed")
    lead = () if unbatched else (B,)
    x = {"query": data.draw(arrays(lead + (T, E)), label="query")}
    if not self_attention:
        x["key"] = data.draw(arrays(lead + (S, kdim)), label="key")
        x["value"] = data.draw(arrays(lead + (S, vdim)), label="value")
    our_key_mask = None if key_mask is None else (key_mask[0] if unbatched else key_mask)
    attn_mask, padding = torch_attn_mask(mask, our_key_mask, causal, B, H, T, S, unbatched)
    kwargs = {"kdim": kdim, "vdim": vdim, "bias": bias}

    def run():
        torch.manual_seed(seed)
        reference = torch.nn.MultiheadAttention(E, H, batch_first=True, **kwargs).double()
        # Random biases too (torch starts them at zero).
        with torch.no_grad():
            for name, p in reference.named_parameters():
                if "bias" in name:
                    p.uniform_(-1.0, 1.0)
        ours = ta.nn.MultiHeadAttention(E, H, **kwargs).double()
        assert list(ours.state_dict()) == list(reference.state_dict())  # same keys, same order
        ours.load_state_dict(reference.state_dict())
        leaves = {k: leaf(a) for k, a in x.items()}
        torch_leaves = {k: as_torch(a, requires_grad=True) for k, a in x.items()}
        q = leaves["query"]
        k, v = (q, q) if self_attention else (leaves["key"], leaves["value"])
        out = ours(q, k, v, key_mask=our_key_mask, mask=mask, causal=causal,
                   need_weights=need_weights, average_weights=average)
        tq = torch_leaves["query"]
        tk, tv = (tq, tq) if self_attention else (torch_leaves["key"], torch_leaves["value"])
        ref = reference(tq, tk, tv, key_padding_mask=padding, attn_mask=attn_mask,
                        need_weights=need_weights, average_attn_weights=average)
        leaves.update({"param " + n: p for n, p in ours.named_parameters()})
        torch_leaves.update({"param " + n: p for n, p in reference.named_parameters()})
        return out, ref, leaves, torch_leaves

    check_outputs(run, seed=seed)


# ---------------------------------------------------------------- graph attention (GAT)


def torch_gat(x, W, a_src, a_dst, adjacency, heads, negative_slope, concat, add_self_loops):
    N = x.shape[-2]
    F_out = W.shape[0] // heads
    batch = x.shape[:-2]
    Wh = (x @ W.T).reshape(batch + (N, heads, F_out)).transpose(-3, -2)     # (..., H, N, F)
    s_dst = (Wh * a_dst[:, None, :]).sum(-1)                                # (..., H, N): a_dst . Wh_i
    s_src = (Wh * a_src[:, None, :]).sum(-1)                                # (..., H, N): a_src . Wh_j
    e = TF.leaky_relu(s_dst[..., :, None] + s_src[..., None, :], negative_slope)
    allowed = adjacency | np.eye(N, dtype=bool) if add_self_loops else adjacency
    alpha = torch_masked_softmax(e, allowed[..., None, :, :])               # (..., H, N, N)
    out = alpha @ Wh                                                         # (..., H, N, F)
    if concat:
        out = out.transpose(-3, -2).reshape(batch + (N, heads * F_out))
    else:
        out = out.mean(-3)
    return out, alpha


@st.composite
def gat_cases(draw):
    batch = draw(st.lists(st.integers(1, 2), max_size=1).map(tuple), label="batch")
    N = draw(st.integers(1, 5), label="N")
    heads = draw(st.integers(1, 3), label="heads")
    F_in, F_out = draw(features, label="F_in"), draw(features, label="F_out")
    add_self_loops = draw(st.booleans(), label="add_self_loops")
    # Only the batch axes of the adjacency broadcast; the last two are (N, N).
    adjacency_batch = draw(broadcastable_to(batch), label="adjacency batch")
    adjacency = np.array(draw(masks(adjacency_batch + (N, N)), label="adjacency"), dtype=bool)
    if not add_self_loops:
        # The torch reference needs a neighbour in every row (else NaN): add one.
        rows = adjacency.reshape(-1, N)                                      # a view
        anchors = draw(st.lists(st.integers(0, N - 1), min_size=len(rows), max_size=len(rows)),
                       label="anchors")
        for row, j in zip(rows, anchors, strict=True):
            if not row.any():
                row[j] = True
    case = {
        "batch": batch, "N": N, "heads": heads, "F_in": F_in, "F_out": F_out,
        "add_self_loops": add_self_loops, "adjacency": adjacency,
        "concat": draw(st.booleans(), label="concat"),
        "negative_slope": draw(st.sampled_from([0.2, 0.01, 0.5]), label="negative_slope"),
        "x": draw(arrays(batch + (N, F_in)), label="x"),
        "W": draw(arrays((heads * F_out, F_in), low=-1.5, high=1.5), label="W"),
        "a_src": draw(arrays((heads, F_out), low=-1.5, high=1.5), label="a_src"),
        "a_dst": draw(arrays((heads, F_out), low=-1.5, high=1.5), label="a_dst"),
    }
    return case


@given(case=gat_cases())
def test_graph_matches_torch_composition(case):
    options = {k: case[k] for k in ("heads", "negative_slope", "concat", "add_self_loops")}
    check_outputs(functional_run(
        lambda x, W, a_src, a_dst: ta.attention.graph(x, case["adjacency"], W, a_src, a_dst, **options),
        lambda x, W, a_src, a_dst: torch_gat(x, W, a_src, a_dst, case["adjacency"], **options),
        x=case["x"], W=case["W"], a_src=case["a_src"], a_dst=case["a_dst"]))


@given(case=gat_cases(), bias=st.booleans())
def test_graph_attention_module_matches_torch_composition(case, bias):
    options = {k: case[k] for k in ("heads", "negative_slope", "concat", "add_self_loops")}
    size = case["heads"] * case["F_out"] if case["concat"] else case["F_out"]
    state = {k: case[k] for k in ("W", "a_src", "a_dst")}
    if bias:
        state["bias"] = np.linspace(-1.0, 1.0, size)

    def run():
        layer = ta.nn.GraphAttention(case["F_in"], case["F_out"], bias=bias, **options).double()
        layer.load_state_dict(state)
        x = leaf(case["x"])
        out = layer(x, case["adjacency"])
        leaves = {"x": x, **dict(layer.named_parameters())}
        torch_leaves = {k: as_torch(a, requires_grad=True) for k, a in {"x": case["x"], **state}.items()}
        t = torch_leaves
        ref_out, alpha = torch_gat(t["x"], t["W"], t["a_src"], t["a_dst"], case["adjacency"], **options)
        if bias:
            ref_out = ref_out + t["bias"]
        return out, (ref_out, alpha), leaves, torch_leaves

    check_outputs(run)


# ---------------------------------------------------------------- Luong's attentional vector


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("out_dim", [None, 2])
def test_luong_attention_vector_matches_torch_linear(bias, out_dim):
    context_dim, hidden_dim = 3, 4
    rng = np.random.default_rng(3)
    c, h = rng.normal(size=(2, 5, context_dim)), rng.normal(size=(2, 5, hidden_dim))

    def run():
        torch.manual_seed(4)
        linear = torch.nn.Linear(context_dim + hidden_dim, hidden_dim if out_dim is None else out_dim,
                                 bias=bias).double()
        ours = ta.nn.LuongAttentionVector(context_dim, hidden_dim, out_dim, bias=bias).double()
        assert list(ours.W_c.state_dict()) == list(linear.state_dict())
        ours.W_c.load_state_dict(linear.state_dict())
        leaves = {"c": leaf(c), "h": leaf(h)}
        torch_leaves = {"c": as_torch(c, requires_grad=True), "h": as_torch(h, requires_grad=True)}
        out = ours(leaves["c"], leaves["h"])
        ref = torch.tanh(linear(torch.cat([torch_leaves["c"], torch_leaves["h"]], dim=-1)))
        leaves.update({"W_c." + n: p for n, p in ours.W_c.named_parameters()})
        torch_leaves.update({"W_c." + n: p for n, p in linear.named_parameters()})
        return (out,), (ref,), leaves, torch_leaves

    check_outputs(run)


# ---------------------------------------------------------------- large logits


def large_logit_inputs(rng, batch=(2,), T_q=3, T_k=4, d=3):
    """q . k = 1e4 + O(1) for every pair: the first feature contributes 100 * 100."""
    q, k = rng.normal(size=batch + (T_q, d)), rng.normal(size=batch + (T_k, d))
    q[..., 0], k[..., 0] = 100.0, 100.0
    return q, k, rng.normal(size=batch + (T_k, 2))


@pytest.mark.parametrize("masked", [False, True])
def test_scaled_dot_product_large_logits_finite_and_match_torch(masked):
    q, k, v = large_logit_inputs(np.random.default_rng(5))
    mask = None
    if masked:
        mask = np.array([[True, False, True, True]])[None]               # (1, 1, T_k)
    context, weights = ta.attention.scaled_dot_product(leaf(q), leaf(k), leaf(v), mask=mask, scale=1.0)
    assert np.isfinite(context.numpy()).all() and np.isfinite(weights.numpy()).all()
    check_outputs(functional_run(
        lambda q, k, v: ta.attention.scaled_dot_product(q, k, v, mask=mask, scale=1.0),
        lambda q, k, v: torch_sdpa(q, k, v, mask, 1.0),
        q=q, k=k, v=v))


@pytest.mark.parametrize("kind", ["dot", "general"])
def test_score_attention_large_logits_match_torch(kind):
    rng = np.random.default_rng(6)
    q, k, v = large_logit_inputs(rng)
    params = {"W": np.eye(3) + 0.01 * rng.normal(size=(3, 3))} if kind == "general" else {}

    def engine(query, keys, values, **params):
        context, weights = engine_attention(kind, query, keys, values, None, params)
        assert np.isfinite(weights.numpy()).all()
        return context, weights

    def reference(query, keys, values, **params):
        weights = torch.softmax(torch_scores(kind, query, keys, params), dim=-1)
        return weights @ values, weights

    check_outputs(functional_run(engine, reference, query=q, keys=k, values=v, **params))
