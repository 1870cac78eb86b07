"""ta.attention.record: the weights of the fused path, rebuilt from the log-sum-exp, equal the
textbook graph's; recording changes no output or gradient; keys name the calls' scopes."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tinygrad_attn import Tensor

TOL = {"rtol": 1e-10, "atol": 1e-12}


@settings(deadline=None, max_examples=40)
@given(t_q=st.integers(0, 6), t_k=st.integers(0, 6), heads=st.integers(1, 3),
       masked=st.sampled_from([None, "keys", "full"]), causal=st.booleans(), single=st.booleans(),
       seed=st.integers(0, 2**31))
# A mask per batch entry with no rows to attend from: once an error in the fused node's reshape.
@example(t_q=0, t_k=0, heads=1, masked="keys", causal=False, single=False, seed=0)
def test_fused_weights_equal_the_textbook_weights(t_q, t_k, heads, masked, causal, single, seed):
    if single and (causal or t_q == 0):
        return                                   # causal needs many queries; one row needs a row
    rng = np.random.default_rng(seed)
    q_shape = (2, heads, 3) if single else (2, heads, t_q, 3)
    q = Tensor(rng.normal(size=q_shape), dtype=np.float64)
    k = Tensor(rng.normal(size=(2, heads, t_k, 3)), dtype=np.float64)
    v = Tensor(rng.normal(size=(2, heads, t_k, 2)), dtype=np.float64)
    rows = 1 if single else t_q
    mask = None
    if masked == "keys":
        mask = rng.random((2, 1, 1, t_k)) < 0.7
    elif masked == "full":
        mask = rng.random((2, heads, rows, t_k)) < 0.6
        if single:
            mask = mask[:, :, 0]
    with ta.attention.record() as record:
        fused, none = ta.attention.scaled_dot_product(q, k, v, mask=mask, causal=causal, need_weights=False)
    textbook, weights = ta.attention.scaled_dot_product(q, k, v, mask=mask, causal=causal)
    assert none is None and list(record) == [""]
    np.testing.assert_allclose(record[""], weights.numpy(), **TOL)
    np.testing.assert_allclose(fused.numpy(), textbook.numpy(), **TOL)


def test_recording_changes_no_output_or_gradient():
    rng = np.random.default_rng(0)
    ta.manual_seed(0)
    mha = ta.nn.MultiHeadAttention(8, 2).astype(np.float64)
    x = rng.normal(size=(2, 5, 8))
    key_mask = np.array([[True] * 5, [True, True, True, False, False]])

    def run(recorded):
        xt = Tensor(x, requires_grad=True, dtype=np.float64)
        mha.zero_grad()
        if recorded:
            with ta.attention.record() as record:
                out, _ = mha(xt, xt, xt, key_mask=key_mask, causal=True, need_weights=False)
        else:
            out, record = mha(xt, xt, xt, key_mask=key_mask, causal=True, need_weights=False)
        out.sum().backward()
        return out.numpy().copy(), xt.grad.numpy().copy(), mha.in_proj_weight.grad.numpy().copy(), record

    plain, recorded = run(False), run(True)
    for a, b in zip(plain[:3], recorded[:3], strict=True):
        np.testing.assert_array_equal(a, b)
    # and the recorded weights are the per-head weights the slow path returns
    _, per_head = mha(Tensor(x, dtype=np.float64), Tensor(x, dtype=np.float64), Tensor(x, dtype=np.float64),
                      key_mask=key_mask, causal=True, average_weights=False)
    np.testing.assert_allclose(recorded[3][""], per_head.numpy(), **TOL)


def test_keys_name_the_scope_without_the_mechanism_and_count_repeats():
    rng = np.random.default_rng(1)
    q, k = Tensor(rng.normal(size=(2, 3))), Tensor(rng.normal(size=(2, 4, 3)))
    with ta.attention.record() as record:
        with ta.scope("decoder"), ta.scope("t0"), ta.scope("attention"):
            ta.attention.dot(q, k)
            ta.attention.dot(q, k)
        with ta.scope("outer"), ta.attention.record() as inner:
            ta.attention.dot(q, k)
    assert list(record) == ["decoder/t0/attention", "decoder/t0/attention#2"]
    assert list(inner) == ["outer"] and record["decoder/t0/attention"].shape == (2, 4)
    with pytest.raises(KeyError, match="no attention was recorded in scope 'nowhere'"):
        record["nowhere"]


def test_only_keeps_the_named_calls_and_rebuilds_no_others(monkeypatch):
    rng = np.random.default_rng(3)
    q, k, v = (Tensor(rng.normal(size=(2, 3, 4))) for _ in range(3))
    rebuilt = []
    weights = ta.ops.ScaledDotProduct.weights
    monkeypatch.setattr(ta.ops.ScaledDotProduct, "weights", lambda op: rebuilt.append(op) or weights(op))
    with ta.attention.record(only=["b"]) as record:
        for name in ("a", "b"):
            with ta.scope(name):
                ta.attention.scaled_dot_product(q, k, v, need_weights=False)
                ta.attention.dot(q, k)
    assert list(record) == ["b", "b#2"] and len(rebuilt) == 1


def test_graph_attention_is_recorded():
    rng = np.random.default_rng(2)
    gat = ta.nn.GraphAttention(3, 2, heads=2)
    adjacency = rng.random((4, 4)) < 0.5
    with ta.attention.record() as record:
        _, weights = gat(Tensor(rng.normal(size=(4, 3)).astype(np.float32)), adjacency)
    np.testing.assert_array_equal(record[""], weights.numpy())
