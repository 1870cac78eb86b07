"""nn layers against PyTorch: Embedding, Dropout, LayerNorm, the recurrent cells and the
RNN/GRU/LSTM layers (state_dict keys both ways, outputs, final states and gradients), masks
against packed sequences, and step() against unroll()."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_attn as ta
from tests.optional import needs_torch, torch
from tinygrad_attn import Tensor, nn

LAYERS = ["RNN", "GRU", "LSTM"]


def _engine_grads(module) -> dict:
    return {name: p.grad.numpy() for name, p in module.named_parameters()}


def _torch_grads(module) -> dict:
    return {name: p.grad.numpy() for name, p in module.named_parameters()}


def _assert_same_grads(ours: dict, theirs: dict, atol: float) -> None:
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], atol=atol, err_msg=name)


@needs_torch
@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, False), (1, True), (2, True)])
def test_layer_matches_torch_outputs_states_and_grads(kind, layers, bidirectional):
    ta.manual_seed(1)
    ours = getattr(nn, kind)(5, 7, num_layers=layers, bidirectional=bidirectional).double()
    theirs = getattr(torch.nn, kind)(5, 7, num_layers=layers, bidirectional=bidirectional,
                                     batch_first=True).double()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    x = np.random.default_rng(0).standard_normal((3, 4, 5))
    out, h_n = ours(Tensor(x, dtype=np.float64))
    t_out, t_h = theirs(torch.tensor(x))
    if kind == "LSTM":
        (h_n, c_n), (t_h, t_c) = h_n, t_h
        np.testing.assert_allclose(c_n.numpy(), t_c.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(h_n.numpy(), t_h.detach().numpy(), atol=1e-12)
    weights = np.random.default_rng(2).standard_normal(out.shape)
    ((out * Tensor(weights, dtype=np.float64)).sum() + (h_n * h_n).sum()).backward()
    ((t_out * torch.tensor(weights)).sum() + (t_h * t_h).sum()).backward()
    _assert_same_grads(_engine_grads(ours), _torch_grads(theirs), atol=1e-10)


@needs_torch
@pytest.mark.parametrize("kind", LAYERS)
def test_weights_load_into_torch_and_give_its_output(kind):
    ta.manual_seed(3)
    ours = getattr(nn, kind)(4, 6, num_layers=2).double()
    theirs = getattr(torch.nn, kind)(4, 6, num_layers=2, batch_first=True).double()
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    x = np.random.default_rng(1).standard_normal((2, 5, 4))
    np.testing.assert_allclose(ours(Tensor(x, dtype=np.float64))[0].numpy(),
                               theirs(torch.tensor(x))[0].detach().numpy(), atol=1e-12)


@needs_torch
@pytest.mark.parametrize("kind", LAYERS)
def test_initial_state_and_time_major_layout(kind):
    ta.manual_seed(4)
    ours = getattr(nn, kind)(3, 4, batch_first=False).double()
    theirs = getattr(torch.nn, kind)(3, 4).double()
    ours.load_state_dict(theirs.state_dict())
    rng = np.random.default_rng(5)
    x, h0, c0 = rng.standard_normal((6, 2, 3)), rng.standard_normal((1, 2, 4)), rng.standard_normal((1, 2, 4))
    if kind == "LSTM":
        hx = (Tensor(h0, dtype=np.float64), Tensor(c0, dtype=np.float64))
        t_hx = (torch.tensor(h0), torch.tensor(c0))
    else:
        hx, t_hx = Tensor(h0, dtype=np.float64), torch.tensor(h0)
    np.testing.assert_allclose(ours(Tensor(x, dtype=np.float64), hx)[0].numpy(),
                               theirs(torch.tensor(x), t_hx)[0].detach().numpy(), atol=1e-12)


@needs_torch
@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("layers", [1, 2])
def test_mask_matches_packed_sequences(kind, bidirectional, layers):
    # Right-padded rows: the masked layer must give what PyTorch gives on packed sequences
    # (zeros at padded outputs, final states taken at each row's last real token).
    ta.manual_seed(6)
    ours = getattr(nn, kind)(3, 5, num_layers=layers, bidirectional=bidirectional).double()
    theirs = getattr(torch.nn, kind)(3, 5, num_layers=layers, bidirectional=bidirectional,
                                     batch_first=True).double()
    ours.load_state_dict(theirs.state_dict())
    lengths = np.array([6, 2, 4])
    x = np.random.default_rng(7).standard_normal((3, 6, 3))
    mask = np.arange(6)[None, :] < lengths[:, None]
    out, h_n = ours(Tensor(x, dtype=np.float64), mask=mask)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.tensor(x), torch.tensor(lengths),
                                                     batch_first=True, enforce_sorted=False)
    t_out, t_h = theirs(packed)
    t_out, _ = torch.nn.utils.rnn.pad_packed_sequence(t_out, batch_first=True, total_length=6)
    if kind == "LSTM":
        h_n, t_h = h_n[0], t_h[0]
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(h_n.numpy(), t_h.detach().numpy(), atol=1e-12)


@pytest.mark.parametrize("kind", LAYERS)
def test_host_mask_columns_become_tensors_once_per_call(kind, monkeypatch):
    """A host mask's padded column is made a device Tensor once per call (and its 0/1 copy
    once), shared by every layer and direction, not converted again by each; the results are
    the bits of the same mask given as a Tensor."""
    ta.manual_seed(9)
    layer = getattr(nn, kind)(3, 5, num_layers=2, bidirectional=True).double()
    x = Tensor(np.random.default_rng(10).standard_normal((3, 6, 3)), dtype=np.float64)
    mask = np.arange(6)[None, :] < np.array([6, 2, 4])[:, None]                     # (B, T)
    padded = int((~mask.all(axis=0)).sum())                                          # steps 2..5
    made = []
    original = Tensor.__init__

    def counting(self, data, *args, **kwargs):
        if isinstance(data, np.ndarray) and data.shape == (3, 1, 1):     # (B, 1, 1): steps are (B, 1, ...)
            made.append(data.dtype)
        original(self, data, *args, **kwargs)

    monkeypatch.setattr(Tensor, "__init__", counting)
    out, h_n = layer(x, mask=mask)
    monkeypatch.undo()
    assert padded == 4 and len(made) == 2 * padded, made         # a boolean and a 0/1 column each
    out_tensor_mask, h_tensor_mask = layer(x, mask=Tensor(mask))
    np.testing.assert_array_equal(out.numpy(), out_tensor_mask.numpy())
    for ours, theirs in zip(h_n if kind == "LSTM" else (h_n,),
                            h_tensor_mask if kind == "LSTM" else (h_tensor_mask,), strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("kind", LAYERS)
def test_step_equals_unroll(kind):
    ta.manual_seed(8)
    layer = getattr(nn, kind)(3, 4, num_layers=2).double()
    xs = [Tensor(np.random.default_rng(t).standard_normal((2, 1, 3)), dtype=np.float64) for t in range(5)]
    outputs, _ = layer.unroll(xs)
    states = None
    for t, x in enumerate(xs):
        top, states = layer.step(x, states)
        np.testing.assert_allclose(top.numpy(), outputs[t].numpy(), atol=1e-14)


@pytest.mark.parametrize("kind", LAYERS)
def test_layer_multiplies_every_steps_input_in_one_product(kind):
    """Per layer and direction one Linear of W_ih over all steps' inputs (B, T, I), and every
    step is given its rows of that product: 4 input products for 2 bidirectional layers, not
    4 x T; a GRU's steps are GRUCell(projected=True) nodes."""
    ta.manual_seed(11)
    layer = getattr(nn, kind)(3, 4, num_layers=2, bidirectional=True).double()
    out, h_n = layer(Tensor(np.random.default_rng(12).standard_normal((2, 5, 3)), dtype=np.float64))
    h_n = h_n[0] if kind == "LSTM" else h_n
    nodes = [t.node for t in ta.viz.nodes(out.sum() + h_n.sum()) if t.node is not None]
    w_ih = {id(p) for name, p in layer.named_parameters() if name.startswith("weight_ih")}
    products = [node for node in nodes if any(id(x) in w_ih for x in node.inputs)]
    assert len(products) == 4 and {node.op_name for node in products} == {"Linear"}
    assert all(node.inputs[0].shape[:2] == (2, 5) for node in products)        # every step at once
    cells = [node for node in nodes if node.op_name == "GRUCell"]
    assert len(cells) == (2 * 2 * 5 if kind == "GRU" else 0)
    assert all(cell.attrs.get("projected") for cell in cells)


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("masked", [False, True])
def test_unroll_of_a_joined_input_equals_unroll_of_its_steps(kind, masked):
    """unroll((B, T, I)) is unroll of its T (B, 1, I) steps: outputs, final states and
    gradients (of the input and of every weight) bit for bit."""
    ta.manual_seed(13)
    layer = getattr(nn, kind)(3, 4, num_layers=2, bidirectional=True).double()
    x = np.random.default_rng(14).standard_normal((3, 5, 3))
    mask = (np.arange(5)[None, :] < np.array([5, 2, 4])[:, None]) if masked else None
    weights = np.random.default_rng(15).standard_normal((3, 1, 8))

    def run(joined: bool):
        layer.zero_grad()
        whole = Tensor(x, dtype=np.float64, requires_grad=True)
        steps = [Tensor(x[:, t : t + 1], dtype=np.float64, requires_grad=True) for t in range(5)]
        outputs, finals = layer.unroll(whole if joined else steps, mask=mask)
        states = [f[0] if kind == "LSTM" else f for f in finals]
        loss = sum((o * Tensor(weights * (t + 1), dtype=np.float64)).sum() for t, o in enumerate(outputs))
        (loss + sum((s * s).sum() for s in states)).backward()
        x_grad = whole.grad.numpy() if joined else np.concatenate([s.grad.numpy() for s in steps], axis=1)
        return ([o.numpy() for o in outputs] + [s.numpy() for s in states] + [x_grad]
                + [p.grad.numpy() for p in layer.parameters()])

    for a, b in zip(run(True), run(False), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", LAYERS)
def test_unroll_of_a_joined_input_checks_its_width_and_states(kind):
    layer = getattr(nn, kind)(3, 4)
    with pytest.raises(ta.ShapeError, match=rf"{kind}: a joined input must be \(B, T, I\) with I = 3, "
                                            r"got \(2, 5, 4\)"):
        layer.unroll(Tensor(np.zeros((2, 5, 4))))
    h = Tensor(np.zeros((2, 4)))                     # (B, H): the steps are (B, 1, I), so (B, 1, H)
    with pytest.raises(ta.ShapeError, match=rf"{kind}: state 0 must be \(2, 1, 4\) \(a step's batch "
                                            r"axes, then H\), got \(2, 4\)"):
        layer.unroll(Tensor(np.zeros((2, 5, 3))), [(h, h) if kind == "LSTM" else h])


@needs_torch
@pytest.mark.parametrize("kind", ["RNNCell", "GRUCell", "LSTMCell"])
def test_cells_match_torch(kind):
    ta.manual_seed(9)
    ours = getattr(nn, kind)(3, 4).double()
    theirs = getattr(torch.nn, kind)(3, 4).double()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 3))
    h = ours(Tensor(x, dtype=np.float64))
    t_h = theirs(torch.tensor(x))
    if kind == "LSTMCell":
        h, t_h = h[0], t_h[0]
    np.testing.assert_allclose(h.numpy(), t_h.detach().numpy(), atol=1e-12)


def test_initialisation_bounds_are_pytorchs():
    ta.manual_seed(0)
    gru = nn.GRU(10, 25)
    bound = 1 / np.sqrt(25)
    for name, p in gru.named_parameters():
        values = p.numpy()
        assert np.abs(values).max() <= bound, name
        assert np.abs(values).max() > 0.9 * bound, name         # uniform over the whole range


def test_rnn_errors_name_the_layer_and_shapes():
    gru = nn.GRU(4, 3)
    with pytest.raises(ta.ShapeError, match=r"GRU: input must be \(B, T, I\) with I = 4, got \(2, 5, 3\)"):
        gru(Tensor.zeros(2, 5, 3))
    with pytest.raises(ta.ShapeError, match=r"GRU: initial state must be \(1, 2, 3\)"):
        gru(Tensor.zeros(2, 5, 4), Tensor.zeros(2, 3))
    with pytest.raises(ta.ShapeError, match=r"GRU: mask must be boolean \(B, T\) = \(2, 5\)"):
        gru(Tensor.zeros(2, 5, 4), mask=np.ones((5, 2), bool))
    with pytest.raises(ta.ShapeError, match=r"GRU: input has no steps \(T = 0\): \(2, 0, 4\)"):
        gru(Tensor.zeros(2, 0, 4))
    with pytest.raises(ValueError, match="bidirectional layer needs the whole sequence"):
        nn.GRU(4, 3, bidirectional=True).step(Tensor.zeros(2, 4))
    with pytest.raises(ValueError, match="nonlinearity must be 'tanh' or 'relu'"):
        nn.RNN(4, 3, nonlinearity="sigmoid")


def test_repr_counts_parameters():
    text = repr(nn.LSTM(4, 3, num_layers=2, bidirectional=True))
    assert text.startswith("LSTM(4, 3, num_layers=2, bidirectional=True)")
    assert f"{nn.LSTM(4, 3, num_layers=2, bidirectional=True).num_parameters():,} parameters" in text


# ---------------------------------------------------------------- Embedding, Dropout, LayerNorm


@needs_torch
def test_embedding_matches_torch_and_skips_padding_row():
    ours = nn.Embedding(6, 3, padding_idx=0).double()
    assert np.all(ours.weight.numpy()[0] == 0)
    theirs = torch.nn.Embedding(6, 3, padding_idx=0).double()
    ours.load_state_dict(theirs.state_dict())
    ids = np.array([[0, 2, 5], [2, 2, 0]])
    out = ours(ids)
    t_out = theirs(torch.tensor(ids))
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy())
    (out * out).sum().backward()
    (t_out * t_out).sum().backward()
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy())
    assert np.all(ours.weight.grad.numpy()[0] == 0)
    with pytest.raises(ValueError, match="padding_idx 7 is outside"):
        nn.Embedding(6, 3, padding_idx=7)


def test_dropout_masks_in_training_and_is_identity_in_eval():
    ta.manual_seed(0)
    drop = nn.Dropout(0.5)
    x = Tensor.ones(2000)
    y = drop(x).numpy()
    assert set(np.unique(y)) == {0.0, 2.0}
    assert 0.4 < np.mean(y == 0) < 0.6
    drop.eval()
    assert drop(x) is x
    with pytest.raises(ValueError, match=r"Dropout: p must be in \[0, 1\]"):
        nn.Dropout(1.5)


@needs_torch
@given(st.integers(1, 3), st.integers(2, 6), st.booleans())
def test_layer_norm_matches_torch(batch, width, affine):
    rng = np.random.default_rng(batch * 10 + width)
    ours = nn.LayerNorm(width, elementwise_affine=affine).double()
    theirs = torch.nn.LayerNorm(width, elementwise_affine=affine).double()
    if affine:
        state = {"weight": rng.standard_normal(width), "bias": rng.standard_normal(width)}
        ours.load_state_dict(state)
        theirs.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    x = rng.standard_normal((batch, 3, width)) * 5 + 2
    xt = torch.tensor(x, requires_grad=True)
    xe = Tensor(x, dtype=np.float64, requires_grad=True)
    cotangent = rng.standard_normal(x.shape)
    out = ours(xe)
    t_out = theirs(xt)
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), atol=1e-10)
    (out * Tensor(cotangent, dtype=np.float64)).sum().backward()
    (t_out * torch.tensor(cotangent)).sum().backward()
    np.testing.assert_allclose(xe.grad.numpy(), xt.grad.numpy(), atol=1e-10)
    if affine:
        np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), atol=1e-10)


def test_layer_norm_checks_the_trailing_shape():
    with pytest.raises(ta.ShapeError,
                       match=r"LayerNorm: input of shape \(2, 3\) must end in normalized_shape \(4,\)"):
        nn.LayerNorm(4)(Tensor.zeros(2, 3))


def test_step_checks_input_and_states():
    gru = nn.GRU(4, 3, num_layers=2)
    with pytest.raises(ta.ShapeError, match=r"GRU.step: input must be \(B, I\) with I = 4, got \(2, 5\)"):
        gru.step(Tensor.zeros(2, 5))
    with pytest.raises(ta.ShapeError, match=r"GRU.step: states must be 2 per-layer states of shape \(2, 3\)"):
        gru.step(Tensor.zeros(2, 4), [Tensor.zeros(2, 3)])


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("layers", [1, 2])
def test_step_in_parts_equals_step_on_the_joined_input(kind, layers):
    """step((y, c)) is step(cat([y, c])): outputs, states and every gradient; a GRU reads
    the parts in its fused node (no Cat node), the other cells join them first."""
    ta.manual_seed(3)
    layer = getattr(nn, kind)(5, 4, num_layers=layers).double()
    rng = np.random.default_rng(0)
    y0, c0, h0 = (rng.standard_normal((3, 1, n)) for n in (2, 3, 4))

    def run(in_parts: bool):
        layer.zero_grad()
        y, c, h = (Tensor(a, dtype=np.float64, requires_grad=True) for a in (y0, c0, h0))
        state = (h, h * 0.5) if kind == "LSTM" else h
        x = (y, c) if in_parts else ta.cat([y, c], axis=-1)
        top, states = layer.step(x, [state] * layers)
        (top * top).sum().backward()
        ops = {n.node.op_name for n in ta.autograd.toposort(top) if n.node is not None}
        return top.numpy(), [y.grad, c.grad, h.grad], _engine_grads(layer), ops

    top, grads, weights, ops = run(True)
    top_ref, grads_ref, weights_ref, _ = run(False)
    np.testing.assert_allclose(top, top_ref, rtol=1e-12)
    for g, ref in zip(grads, grads_ref, strict=True):
        np.testing.assert_allclose(g, ref, rtol=1e-12)
    _assert_same_grads(weights, weights_ref, atol=1e-12)
    assert ("Cat" in ops) == (kind != "GRU")


@needs_torch
def test_gru_cell_in_parts_matches_torch_on_the_joined_input():
    cell = nn.GRUCell(5, 4).double()
    theirs = torch.nn.GRUCell(5, 4).double()
    cell.load_state_dict(theirs.state_dict())
    rng = np.random.default_rng(1)
    y, c = rng.standard_normal((3, 2)), rng.standard_normal((3, 3))
    ours = cell((Tensor(y, dtype=np.float64), Tensor(c, dtype=np.float64)))
    ref = theirs(torch.from_numpy(np.concatenate([y, c], axis=-1)))
    np.testing.assert_allclose(ours.numpy(), ref.detach().numpy(), rtol=1e-12)


def test_input_in_parts_errors_name_the_parts():
    gru = nn.GRU(4, 3)
    with pytest.raises(ta.ShapeError, match=r"GRU.step: input must be \(B, I\) with I = 4 \(the parts "
                                            r"joined along the last axis\), got \(2, 1\), \(2, 2\)"):
        gru.step((Tensor.zeros(2, 1), Tensor.zeros(2, 2)))
    with pytest.raises(ta.ShapeError, match=r"input must be .* got \(2, 1\), \(3, 3\)"):
        gru.step((Tensor.zeros(2, 1), Tensor.zeros(3, 3)))
    with pytest.raises(TypeError, match=r"GRU.step: x must be a Tensor or a non-empty tuple of "
                                        r"Tensors, got ndarray"):
        gru.step((Tensor.zeros(2, 1), np.zeros((2, 3))))
    cell = nn.GRUCell(4, 3)
    with pytest.raises(ta.ShapeError, match=r"gru_cell: x must end in I = 4 \(w_ih's columns\) \(the "
                                            r"parts' sizes added\); got x1 \(2, 1\), x2 \(2, 2\)"):
        cell((Tensor.zeros(2, 1), Tensor.zeros(2, 2)))
    with pytest.raises(ta.ShapeError, match=r"gru_cell: the parts of x must agree"):
        cell((Tensor.zeros(2, 1), Tensor.zeros(3, 3)))
    with pytest.raises(TypeError, match=r"gru_cell: x must be a Tensor or a non-empty tuple of "
                                        r"Tensors, got \(\)"):
        cell(())
    with pytest.raises(ta.ShapeError, match=r"GRUCell: expected x \(\.\.\., I\) joined along the last axis"):
        ta.ops.GRUCell.apply(Tensor.zeros(2, 1), Tensor.zeros(2, 2), Tensor.zeros(2, 3),
                             Tensor.zeros(9, 4), Tensor.zeros(9, 3), parts=2)


def test_embedding_rejects_negative_small_integer_ids():
    weight = Tensor(np.random.default_rng(0).standard_normal((300, 2)), requires_grad=True)
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        ids = Tensor(np.array([-1, 0])).astype(dtype)
        with pytest.raises(ta.ShapeError, match=r"Embedding: id -1 is outside \[0, 300\)"):
            ta.functional.embedding(ids, weight)
