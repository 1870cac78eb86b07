"""Reverse-mode semantics: accumulation, graph shapes, no_grad, scopes, freed buffers."""

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import Tensor
from tinygrad_attn import functional as F


def test_backward_chain_of_10000_steps_needs_no_recursion():
    x = Tensor([0.5], requires_grad=True, dtype="float64")
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0001**10_000], rtol=1e-9)


def test_backward_diamond_sums_both_paths():
    x = Tensor([2.0], requires_grad=True, dtype="float64")
    a = x * 3
    b = x.exp()
    (a * b).sum().backward()   # d/dx (3x e^x) = 3 e^x + 3x e^x
    np.testing.assert_allclose(x.grad.numpy(), [3 * np.exp(2) * 3], rtol=1e-12)


def test_backward_accumulates_across_calls():
    x = Tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2 + 3, 4 + 3])


def test_grads_of_two_leaves_do_not_share_memory():
    a = Tensor([1.0, 2.0], requires_grad=True)
    b = Tensor([3.0, 4.0], requires_grad=True)
    (a + b).sum().backward()
    a.grad.data *= 0
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 1.0])


def test_backward_with_explicit_grad_for_non_scalar():
    x = Tensor([[1.0, 2.0]], requires_grad=True)
    (x * 2).backward(np.array([[10.0, 20.0]]))
    np.testing.assert_allclose(x.grad.numpy(), [[20.0, 40.0]])


def test_backward_non_scalar_without_grad_raises():
    x = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"not a scalar.*grad="):
        (x * 2).backward()


def test_backward_on_tensor_without_grad_raises():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor([1.0]).sum().backward()


def test_backward_grad_shape_must_match():
    x = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ta.ShapeError, match=r"grad has shape \(3,\)"):
        (x * 2).backward(np.ones(3))


def test_second_backward_through_freed_buffers_raises():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x.tanh().sum()
    y.backward()
    with pytest.raises(RuntimeError, match=r"saved buffers of Sum.*freed.*retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = Tensor([1.0, 2.0], requires_grad=True, dtype="float64")
    y = x.tanh().sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * (1 - np.tanh([1.0, 2.0]) ** 2))


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(ta.DTypeError, match="only float tensors can require grad"):
        Tensor([1, 2, 3], requires_grad=True)
    with pytest.raises(ta.DTypeError):
        Tensor([True, False]).requires_grad_()


def test_no_grad_records_nothing():
    x = Tensor([1.0], requires_grad=True)
    with ta.no_grad():
        y = x * 2
        assert not ta.is_grad_enabled()
        with ta.enable_grad():
            z = x * 2
    assert ta.is_grad_enabled()
    assert y.node is None and not y.requires_grad
    assert z.node is not None and z.requires_grad


def test_no_grad_works_as_decorator():
    @ta.no_grad()
    def infer(x):
        return x * 2

    assert not infer(Tensor([1.0], requires_grad=True)).requires_grad


def test_detach_cuts_the_graph():
    x = Tensor([3.0], requires_grad=True, dtype="float64")
    y = x * x.detach()       # d/dx = x (only the first factor is in the graph)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0])


def test_scope_tags_every_node_and_nests():
    x = Tensor(np.ones((2, 2)), requires_grad=True)
    with ta.scope("decoder"), ta.scope("t2"):
        with ta.scope("attention"):
            w = x.softmax(axis=-1)
        h = (w @ x).tanh()
    outside = h.sum()
    assert w.node.scope == "decoder/t2/attention"
    assert h.node.scope == "decoder/t2"
    assert h.node.inputs[0].node.scope == "decoder/t2"
    assert outside.node.scope == ""


def test_scope_rejects_bad_names():
    with pytest.raises(ValueError, match="scope"):
        with ta.scope("a/b"):
            pass


def test_node_records_op_inputs_attrs_shape_and_dtype():
    x = Tensor(np.ones((2, 3)), requires_grad=True, dtype="float64", name="x")
    y = x.sum(axis=-1, keepdims=True)
    assert y.node.op_name == "Sum"
    assert y.node.inputs == (x,)
    assert y.node.attrs == {"axis": (1,), "keepdims": True}   # canonical axes
    assert y.shape == (2, 1) and y.dtype == np.float64


def test_retain_grad_keeps_intermediate_gradients():
    x = Tensor([1.0, 2.0], requires_grad=True)
    h = (x * 3).retain_grad()
    (h * h).sum().backward()
    np.testing.assert_allclose(h.grad.numpy(), [6.0, 12.0])
    assert x.grad is not None


def test_anomaly_mode_names_the_op_that_made_nan():
    x = Tensor([0.0, 1.0], requires_grad=True, dtype="float64")
    with ta.detect_anomaly(), np.errstate(all="ignore"):
        y = (x.log() * 0.0).sum()          # Log's backward: 0 / 0 at x = 0
        with pytest.raises(RuntimeError, match=r"backward of Log.*produced NaN.*created at .*test_autograd"):
            y.backward()


def test_without_anomaly_mode_nan_propagates_silently():
    x = Tensor([0.0, 1.0], requires_grad=True, dtype="float64")
    with np.errstate(all="ignore"):
        (x.log() * 0.0).sum().backward()
    assert np.isnan(x.grad.numpy()[0])


def test_unused_input_gets_no_grad():
    x = Tensor([1.0], requires_grad=True)
    unused = Tensor([1.0], requires_grad=True)
    (x * 2).sum().backward()
    assert unused.grad is None


def test_gradient_does_not_flow_into_integer_ids():
    weight = Tensor(np.ones((4, 2)), requires_grad=True)
    ids = Tensor([[0, 3]])
    ta.functional.embedding(ids, weight).sum().backward()
    assert ids.grad is None
    np.testing.assert_array_equal(weight.grad.numpy()[:, 0], [1, 0, 0, 1])


def test_viz_summary_lists_every_tensor_in_order_with_scopes():
    from tinygrad_attn import viz

    x = Tensor(np.ones((2, 3)), requires_grad=True, name="x")
    W = Tensor(np.ones((3, 4)), requires_grad=True, name="W")
    with ta.scope("encoder"), ta.scope("t0"):
        h = (x @ W).tanh()
    lines = viz.summary((h * 2).sum()).splitlines()
    assert lines[0].split()[:3] == ["%0", "leaf", "'x'"]
    assert lines[1].split()[:3] == ["%1", "leaf", "'W'"]
    assert "MatMul[%0, %1]" in lines[2] and lines[2].endswith("encoder/t0")
    assert "Tanh[%2]" in lines[3]
    assert "const" in lines[4]                      # the scalar 2 is drawn too
    assert "Sum[%5](axis=None, keepdims=False)" in lines[6]
    assert len(viz.nodes(h)) == 4


# ------------------------------------------------------------ deferred weight gradients


def _numeric_grad(fn, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = fn()
        x[i] = old - eps
        down = fn()
        x[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


def test_a_weight_used_at_every_step_gets_the_summed_gradient():
    """Linear, GRUCell and Embedding defer their weights' gradients and stack the rows of
    every use: the result equals the per-use sum, here against central differences."""
    rng = np.random.default_rng(0)
    table, w_out = rng.standard_normal((5, 3)), rng.standard_normal((4, 2))
    w_ih, w_hh = rng.standard_normal((6, 3)), rng.standard_normal((6, 2))
    ids = rng.integers(0, 5, (2, 4))

    def loss(grad: bool):
        params = [Tensor(a, dtype=np.float64, requires_grad=grad) for a in (table, w_out, w_ih, w_hh)]
        emb, out, ih, hh = params
        h = Tensor(np.zeros((2, 2)), dtype=np.float64)
        total = 0.0
        for t in range(4):
            x = F.embedding(ids[:, t], emb)                          # (2, 3)
            h = F.gru_cell(x, h, ih, hh)
            total = total + (F.linear(h, out) ** 2).sum()
        return total, params

    value, params = loss(True)
    value.backward()
    for array, param in zip((table, w_out, w_ih, w_hh), params, strict=True):
        expected = _numeric_grad(lambda: float(loss(False)[0].numpy()), array)
        np.testing.assert_allclose(param.grad.numpy(), expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dense", [False, True])
def test_deferred_and_dense_gradients_of_one_tensor_add_up(dense):
    """A tied weight: the embedding table is also the output layer's weight (a scatter and
    a GEMM, which cannot stack), with and without a dense use; and a non-leaf (a slice)
    feeding Linear."""
    rng = np.random.default_rng(1)
    table = rng.standard_normal((5, 3))
    ids = np.array([[1, 4], [2, 1]])

    def loss(w: Tensor):
        emb = F.embedding(ids, w)                                     # (2, 2, 3)
        logits = F.linear(emb, w)                                     # (2, 2, 5)
        if dense:
            logits = logits + F.linear(emb, w[:, ::-1] * 1.0) + (w * w).sum()
        return (logits.tanh() ** 2).sum()

    w = Tensor(table, dtype=np.float64, requires_grad=True)
    loss(w).backward()
    expected = _numeric_grad(lambda: float(loss(Tensor(table, dtype=np.float64)).numpy()), table)
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-6, atol=1e-8)


def test_deferred_gradients_reach_retained_and_anomaly_checked_tensors():
    rng = np.random.default_rng(2)
    w = Tensor(rng.standard_normal((4, 3)), dtype=np.float64, requires_grad=True)
    x = Tensor(rng.standard_normal((2, 3)), dtype=np.float64)
    v = w * 2.0                                                        # a non-leaf weight
    v.retain_grad()
    with ta.detect_anomaly():
        (F.linear(x, v).sum() + F.linear(x * 3.0, v).sum()).backward()
    expected = np.tile(x.numpy().sum(0) * 4.0, (4, 1))
    np.testing.assert_allclose(v.grad.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), 2.0 * expected, rtol=1e-12)


def test_deferred_rows_are_summed_once_they_outgrow_the_gradient():
    """A per-step output layer over a large vocabulary: the rows waiting for the weight's
    turn are folded into a partial sum instead of piling up, and the gradient is the same."""
    rng = np.random.default_rng(3)
    B, H, V, T = 4, 3, 70_000, 6                      # 4 x 70k entries a step pass the 1M limit
    w = Tensor(rng.standard_normal((V, H)) * 0.01, dtype=np.float64, requires_grad=True)
    xs = [rng.standard_normal((B, H)) for _ in range(T)]
    total = 0.0
    for x in xs:
        total = total + F.linear(Tensor(x, dtype=np.float64), w).tanh().sum()
    grads = {}
    original = ta.autograd.DeferredGrad._add_partial
    folds = []

    def counting(self, array):
        folds.append(array.shape)
        original(self, array)

    ta.autograd.DeferredGrad._add_partial = counting
    try:
        total.backward()
    finally:
        ta.autograd.DeferredGrad._add_partial = original
    grads["deferred"] = w.grad.numpy()
    expected = sum((1 - np.tanh(x @ w.numpy().T) ** 2).T @ x for x in xs)
    np.testing.assert_allclose(grads["deferred"], expected, rtol=1e-12)
    assert folds and all(shape == (V, H) for shape in folds)


def test_a_weight_and_its_bias_stack_their_shared_rows_once():
    """A Linear used at every step: dW = dY^T X and db = dY's column sums over all the steps'
    rows.  One backward stacks dY once for both (a captured plan lists its kernel calls: one
    cat for dY, one for X), and both gradients are exact."""
    rng = np.random.default_rng(4)
    T, B, I, O = 5, 3, 4, 2
    w = Tensor(rng.standard_normal((O, I)), dtype=np.float64, requires_grad=True)
    b = Tensor(rng.standard_normal(O), dtype=np.float64, requires_grad=True)
    xs = rng.standard_normal((T, B, I))

    def step(x):
        total = F.linear(x[0], w, b).tanh().sum()
        for t in range(1, T):
            total = total + F.linear(x[t], w, b).tanh().sum()
        total.backward()
        return total

    compiled = ta.compile(step)
    compiled(Tensor(xs, dtype=np.float64))
    (plan,) = compiled.plans
    assert [e.kernel for e in plan.entries].count("cat") == 2, plan.source
    dys = [1 - np.tanh(x @ w.numpy().T + b.numpy()) ** 2 for x in xs]
    np.testing.assert_allclose(w.grad.numpy(), sum(dy.T @ x for dy, x in zip(dys, xs, strict=True)),
                               rtol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), sum(dy.sum(0) for dy in dys), rtol=1e-12)


def test_op_attributes_may_not_hide_the_ops_own_fields():
    with pytest.raises(TypeError, match=r"Mul: attribute names \['name'\] are taken"):
        ta.ops.Mul.apply(Tensor([1.0]), Tensor([2.0]), name="label")


def test_a_failed_backward_writes_no_gradient():
    x = Tensor([1.0, 2.0], requires_grad=True)
    first = (x * x).sum()
    first.backward()                                  # frees the saved buffers of x * x
    before = x.grad.numpy().copy()
    w = Tensor([3.0, 4.0], requires_grad=True)
    both = first * 2.0 + (w * 3.0).sum()               # w's branch is reached before the freed one
    with pytest.raises(RuntimeError, match="were freed by an earlier backward"):
        both.backward()
    assert w.grad is None
    np.testing.assert_array_equal(x.grad.numpy(), before)


# ---------------------------------------------------------------- in-place changes


def test_a_leaf_changed_through_data_after_forward_refuses_backward():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    x.data[:] = 10                                  # the values Mul saved are gone
    with pytest.raises(RuntimeError, match=r"input 0 .* of Mul was changed in place .*version 0, now 1"):
        y.backward()
    assert x.grad is None


def test_numpy_of_a_saved_output_is_read_only_and_backward_stays_right():
    x = Tensor([0.5, -1.0], requires_grad=True, dtype="float64")
    y = x.tanh()
    s = y.sum()
    with pytest.raises(ValueError, match="read-only"):
        y.numpy()[:] = 0
    own = y.numpy().copy()
    own[:] = 0                                      # a copy is the caller's to change
    s.backward()
    np.testing.assert_allclose(x.grad.numpy(), 1 - np.tanh([0.5, -1.0]) ** 2, rtol=1e-12)


def test_an_output_changed_through_data_refuses_backward():
    x = Tensor([0.5, -1.0], requires_grad=True)
    y = x.tanh()
    y.data[:] = 0                                   # Tanh's gradient reads its output
    with pytest.raises(RuntimeError, match=r"its output \(shape \(2,\)\) of Tanh"):
        y.backward(np.ones(2))
    s = x.tanh().sum()
    _ = s.data                                      # handing the array out counts as a change
    with pytest.raises(RuntimeError, match=r"its output \(shape \(\)\) of Sum"):
        s.backward()


def test_a_constant_saved_for_a_weights_gradient_is_guarded_too():
    w = Tensor(np.ones((2, 3)), requires_grad=True, name="w")
    c = Tensor(np.arange(4.0).reshape(2, 2))
    out = (c @ w).sum()
    c.data[0, 0] = 7.0
    with pytest.raises(RuntimeError, match=r"input 0 \(shape \(2, 2\)\) of MatMul"):
        out.backward()


@pytest.mark.parametrize("alias", ["reshape", "reshape twice", "detach"])
def test_views_and_detach_share_the_version(alias):
    x = Tensor(np.arange(1.0, 5.0), requires_grad=True)
    y = (x * x).sum()
    other = {"reshape": lambda: x.reshape(2, 2), "reshape twice": lambda: x.reshape(2, 2).reshape(4, 1),
             "detach": lambda: x.detach()}[alias]()
    assert np.shares_memory(other.numpy(), x.numpy())
    other.data[...] = 0.0                           # writes x's memory
    with pytest.raises(RuntimeError, match="changed in place"):
        y.backward()


def test_indexing_copies_so_changing_the_copy_leaves_the_graph_right():
    x = Tensor(np.arange(1.0, 5.0), requires_grad=True)
    y = (x * x).sum()
    part = x[1:3]
    assert not np.shares_memory(part.numpy(), x.numpy())
    part.data[...] = 0.0
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.arange(1.0, 5.0))


def test_a_view_made_before_the_change_is_guarded_through_its_base():
    x = Tensor(np.arange(1.0, 5.0), requires_grad=True)
    v = x.reshape(2, 2)
    y = (v * v).sum()
    x.data[0] = 9.0
    with pytest.raises(RuntimeError, match="of Mul was changed in place"):
        y.backward()


def test_an_optimizer_step_between_forward_and_backward_is_refused():
    layer = ta.nn.Linear(3, 2)
    opt = ta.optim.SGD(layer.parameters(), lr=0.1)
    x = Tensor(np.ones((4, 3)))
    layer(x).sum().backward()
    loss = layer(x).sum()
    opt.step()                                      # changes the weight this graph saw
    with pytest.raises(RuntimeError, match="changed in place"):
        loss.backward()


def test_the_usual_update_after_backward_works_and_counts_as_a_change():
    x = Tensor([1.0, 2.0], requires_grad=True)
    for _ in range(3):
        x.grad = None
        (x * x).sum().backward()
        before = x.version
        x.data -= 0.25 * x.grad.data               # after backward: allowed
        assert x.version > before
    np.testing.assert_allclose(x.numpy(), [0.125, 0.25])


def test_reading_with_numpy_is_free_and_every_cpu_array_is_read_only():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    for t in (x, y, Tensor([3, 4]), Tensor(5.0)):
        assert not t.numpy().flags.writeable
        assert not np.asarray(t).flags.writeable
    assert x.version == 0
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


@pytest.mark.parametrize("device", ["numpy", "cpu"])
def test_a_module_moved_between_host_devices_owns_its_memory_and_trains(device):
    layer = ta.nn.Linear(3, 2)
    before = layer.weight.numpy().copy()
    moved = ta.nn.Linear(3, 2)
    moved.load_state_dict(layer.state_dict())
    moved.to("numpy" if device == "cpu" else "cpu").to(device)
    opt = ta.optim.SGD(moved.parameters(), lr=0.5)
    moved(Tensor(np.ones((1, 3)), device=moved.weight.device)).sum().backward()
    opt.step()                                      # its arrays are writable, and its own
    assert not np.allclose(moved.weight.numpy(), before)
    np.testing.assert_array_equal(layer.weight.numpy(), before)
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x.to("numpy")
    assert not np.shares_memory(x.numpy(), y.numpy())
