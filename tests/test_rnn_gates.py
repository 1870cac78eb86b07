"""The fused GRU and LSTM cell ops (GRUGates, LSTMCellState, LSTMHidden) and the cell
functions built on them (``F.gru_cell``, ``F.lstm_cell``).

Against PyTorch: ``torch.nn.GRUCell`` / ``LSTMCell`` with the same parameters, outputs and
the gradient of every input and parameter in float64, one step and a few steps unrolled
(skipped, saying why, without PyTorch).  Against the engine itself: each fused op equals
the same formula composed from primitive ops, values and gradients, on every device.  Bad
shapes and dtypes name the op.  Both Numba drivers (serial and prange) equal the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tests.optional import needs_torch, torch
from tests.strategies import arrays
from tinygrad_attn import Tensor
from tinygrad_attn.compiler import available_devices, get_backend
from tinygrad_attn.ops import GRUGates, LSTMCellState, LSTMHidden

RTOL, ATOL = 1e-8, 1e-10
DEVICES = available_devices()
DTYPES = [np.float32, np.float64]


def tolerance(dtype):
    # float32 kernels use a polynomial exp and tanh; the composition rounds after every op.
    return {"rtol": 1e-4, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}


def cotangent(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape)


# ---------------------------------------------------------------- against PyTorch


def assert_close(ours, theirs, what: str) -> None:
    actual = np.zeros(theirs.shape) if ours is None else np.asarray(ours.numpy())
    expected = theirs.detach().numpy()
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != torch {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=what)


@st.composite
def cell_cases(draw, gates: int, steps: int = 1):
    """Inputs and parameters of a cell with ``gates`` blocks, as float64 arrays: x (T, B, I)
    for ``steps`` > 1, else (B, I) or unbatched (I,); states (B, H) or (H,)."""
    unbatched = steps == 1 and draw(st.booleans(), label="unbatched")
    batch = () if unbatched else (draw(st.integers(1, 4), label="B"),)
    size_in, hidden = draw(st.integers(1, 4), label="I"), draw(st.integers(1, 4), label="H")
    bias = draw(st.booleans(), label="bias")
    x_shape = ((steps,) if steps > 1 else ()) + batch + (size_in,)
    case = {"x": draw(arrays(x_shape), label="x"),
            "h": draw(arrays(batch + (hidden,)), label="h"),
            "c": draw(arrays(batch + (hidden,)), label="c"),
            "weight_ih": draw(arrays((gates * hidden, size_in), low=-1.5, high=1.5), label="weight_ih"),
            "weight_hh": draw(arrays((gates * hidden, hidden), low=-1.5, high=1.5), label="weight_hh")}
    if bias:
        case["bias_ih"] = draw(arrays((gates * hidden,), low=-1.5, high=1.5), label="bias_ih")
        case["bias_hh"] = draw(arrays((gates * hidden,), low=-1.5, high=1.5), label="bias_hh")
    return case


PARAMETERS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")   # torch's names and order


def torch_cell(kind: str, case: dict):
    """torch.nn.GRUCell / LSTMCell (float64) holding the case's parameters."""
    size_in, hidden = case["x"].shape[-1], case["h"].shape[-1]
    cls = torch.nn.GRUCell if kind == "gru" else torch.nn.LSTMCell
    cell = cls(size_in, hidden, bias="bias_ih" in case).double()
    cell.load_state_dict({k: torch.tensor(np.array(case[k], order="C")) for k in PARAMETERS if k in case})
    return cell


def run_both(kind: str, case: dict, device: str = "cpu"):
    """Our cell and torch's over every step of x (one step unless x is (T, B, I)); each
    side backpropagates sum over outputs of a fixed cotangent times the output.

    Returns (our leaves, torch's leaves, our outputs, torch's outputs); leaves by name."""
    ours = {k: Tensor(v, requires_grad=True, dtype=np.float64, device=device) for k, v in case.items()}
    cell = torch_cell(kind, case)
    theirs = {k: torch.tensor(np.array(v, order="C"), requires_grad=True)
              for k, v in case.items() if k not in PARAMETERS}
    theirs.update(cell.named_parameters())
    weights = [ours.get(k) for k in PARAMETERS]                     # None where there is no bias

    xs, txs = [ours["x"]], [theirs["x"]]
    if case["x"].ndim == 3:                                          # (T, B, I): one step per t
        xs = [ours["x"][t] for t in range(case["x"].shape[0])]
        txs = [theirs["x"][t] for t in range(case["x"].shape[0])]
    state, tstate = (ours["h"], ours["c"]), (theirs["h"], theirs["c"])
    outputs, references = [], []
    for x, tx in zip(xs, txs, strict=True):
        if kind == "gru":
            state = (F.gru_cell(x, state[0], *weights),)
            tstate = (cell(tx, tstate[0]),)
        else:
            state = F.lstm_cell(x, state, *weights)
            tstate = cell(tx, tstate)
        outputs += list(state)
        references += list(tstate)

    loss, tloss = 0.0, 0.0
    for k, (out, ref) in enumerate(zip(outputs, references, strict=True)):
        c = cotangent(ref.shape, k)
        loss = loss + (out * Tensor(c, dtype=np.float64, device=device)).sum()
        tloss = tloss + (ref * torch.from_numpy(c)).sum()
    loss.backward()
    tloss.backward()
    return ours, theirs, outputs, references


def check_against_torch(kind: str, case: dict, device: str = "cpu") -> None:
    ours, theirs, outputs, references = run_both(kind, case, device)
    for k, (out, ref) in enumerate(zip(outputs, references, strict=True)):
        assert_close(out, ref, f"output {k}")
    for name, leaf in ours.items():
        if kind == "gru" and name == "c":
            continue
        assert_close(leaf.grad, theirs[name].grad, f"gradient of {name}")


@needs_torch
@given(case=cell_cases(gates=3))
def test_gru_cell_matches_torch(case):
    check_against_torch("gru", case)


@needs_torch
@given(case=cell_cases(gates=4))
def test_lstm_cell_matches_torch(case):
    check_against_torch("lstm", case)


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["gru", "lstm"])
@given(data=st.data())
def test_cells_unrolled_over_steps_match_torch(kind, device, data):
    case = data.draw(cell_cases(gates=3 if kind == "gru" else 4, steps=data.draw(st.integers(2, 4))))
    check_against_torch(kind, case, device)


@needs_torch
def test_cells_start_from_zero_states_without_hx_as_torch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4))
    for kind in ("gru", "lstm"):
        cls = torch.nn.GRUCell if kind == "gru" else torch.nn.LSTMCell
        cell = cls(4, 5).double()
        weights = [Tensor(p.detach().numpy(), dtype=np.float64) for p in cell.parameters()]
        fn = F.gru_cell if kind == "gru" else F.lstm_cell
        ours = fn(Tensor(x, dtype=np.float64), None, *weights)
        theirs = cell(torch.from_numpy(x))
        for out, ref in zip(ours if kind == "lstm" else (ours,), theirs if kind == "lstm" else (theirs,),
                            strict=True):
            assert_close(out, ref, f"{kind} output")


# ---------------------------------------------------------------- fused op == its primitive composition


def gru_gates_composed(gi, gh, h_prev):
    hidden = h_prev.shape[-1]
    r = (gi[..., :hidden] + gh[..., :hidden]).sigmoid()
    z = (gi[..., hidden : 2 * hidden] + gh[..., hidden : 2 * hidden]).sigmoid()
    n = (gi[..., 2 * hidden :] + r * gh[..., 2 * hidden :]).tanh()
    return (1 - z) * n + z * h_prev


def lstm_cell_state_composed(gates, c_prev):
    hidden = c_prev.shape[-1]
    i, f = gates[..., :hidden].sigmoid(), gates[..., hidden : 2 * hidden].sigmoid()
    return f * c_prev + i * gates[..., 2 * hidden : 3 * hidden].tanh()


def lstm_hidden_composed(gates, c):
    hidden = c.shape[-1]
    return gates[..., 3 * hidden :].sigmoid() * c.tanh()


FUSED = [(GRUGates.apply, gru_gates_composed, (3, 3, 1)),
         (LSTMCellState.apply, lstm_cell_state_composed, (4, 1)),
         (LSTMHidden.apply, lstm_hidden_composed, (4, 1))]


def run_graph(fn, arrays_in, device, dtype, dy):
    leaves = [Tensor(a, requires_grad=True, dtype=dtype, device=device) for a in arrays_in]
    out = fn(*leaves)
    out.backward(dy.astype(dtype))
    return out.numpy(), [leaf.grad.numpy() for leaf in leaves]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused, composed, blocks", FUSED, ids=["GRUGates", "LSTMCellState", "LSTMHidden"])
@given(batch=st.lists(st.integers(1, 3), max_size=2).map(tuple), hidden=st.integers(1, 5),
       scale=st.sampled_from([0.1, 1.0, 6.0]), seed=st.integers(0, 2**32 - 1))
def test_fused_cell_op_equals_its_primitive_composition(fused, composed, blocks, device, dtype,
                                                        batch, hidden, scale, seed):
    rng = np.random.default_rng(seed)
    arrays_in = [rng.normal(size=batch + (k * hidden,)) * scale for k in blocks]
    dy = cotangent(batch + (hidden,), seed)
    want = run_graph(composed, arrays_in, device, dtype, dy)
    got = run_graph(fused, arrays_in, device, dtype, dy)
    np.testing.assert_allclose(got[0], want[0], **tolerance(dtype), err_msg="forward")
    for k, (g, w) in enumerate(zip(got[1], want[1], strict=True)):
        np.testing.assert_allclose(g, w, **tolerance(dtype), err_msg=f"gradient of input {k}")


def test_fused_cells_are_one_node_each_after_the_products():
    x, h, c = Tensor.randn(2, 3), Tensor.randn(2, 4), Tensor.randn(2, 4)
    w_ih = Tensor.randn(12, 3, requires_grad=True)
    h_next = F.gru_cell(x, h, w_ih, Tensor.randn(12, 4))
    assert h_next.node.op_name == "GRUCell"                  # products and gates in one node
    assert h_next.node.inputs[2] is w_ih
    h_next = F.gru_cell(x, h, w_ih, Tensor.randn(12, 4), Tensor.randn(12), None)
    assert h_next.node.op_name == "GRUGates"                 # one bias only: Linear nodes + gates
    h_next, c_next = F.lstm_cell(x, (h, c), Tensor.randn(16, 3, requires_grad=True), Tensor.randn(16, 4))
    assert h_next.node.op_name == "LSTMHidden" and c_next.node.op_name == "LSTMCellState"
    assert h_next.node.inputs[1] is c_next


# ---------------------------------------------------------------- both Numba drivers


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "prange"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_cpu_kernels_match_the_reference_on_both_drivers(monkeypatch, parallel, dtype):
    from tinygrad_attn.compiler.cpu import rnn as cpu_rnn

    monkeypatch.setattr(cpu_rnn, "_use_prange", lambda entries, dtype: parallel)
    reference = get_backend("numpy")
    rng = np.random.default_rng(1)
    rows, hidden = 7, 5
    tol = {"rtol": 2e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}

    def normal(width):
        # Every other column of a wider array: the kernels must accept non-contiguous input.
        return (rng.normal(size=(rows, 2 * width)) * 3).astype(dtype)[:, ::2]

    gi, gh, gates = normal(3 * hidden), normal(3 * hidden), normal(4 * hidden)
    h_prev, c_prev, dh = normal(hidden), normal(hidden), normal(hidden)
    _, gru_saved = reference.gru_gates(gi, gh, h_prev)
    c, state_saved = reference.lstm_cell_state(gates, c_prev)
    _, hidden_saved = reference.lstm_hidden(gates, c)
    keep = rng.random((rows, 1)) < 0.5                              # padded rows keep their state
    keep[:2] = [[True], [False]]
    calls = [("gru_gates", (gi, gh, h_prev)), ("gru_gates_back", (gru_saved, gh, h_prev, dh)),
             ("gru_gates", (gi, gh, h_prev, keep)), ("gru_gates_back", (gru_saved, gh, h_prev, dh, keep)),
             ("lstm_cell_state", (gates, c_prev)), ("lstm_cell_state_back", (state_saved, c_prev, dh)),
             ("lstm_hidden", (gates, c)), ("lstm_hidden_back", (hidden_saved, dh))]
    # The masked reference against its definition: where(keep, cell, h_prev), and backward
    # routes dh to h_prev (not the gates) at the padded rows.
    h_masked, _ = reference.gru_gates(gi, gh, h_prev, keep)
    np.testing.assert_array_equal(h_masked, np.where(keep, reference.gru_gates(gi, gh, h_prev)[0], h_prev))
    masked_back = reference.gru_gates_back(gru_saved, gh, h_prev, dh, keep)
    for got, want in zip(masked_back, reference.gru_gates_back(gru_saved, gh, h_prev, np.where(keep, dh, 0)),
                         strict=True):
        np.testing.assert_array_equal(got[keep[:, 0]], want[keep[:, 0]])
    assert not masked_back[0][~keep[:, 0]].any() and not masked_back[1][~keep[:, 0]].any()
    np.testing.assert_array_equal(masked_back[2][~keep[:, 0]], dh[~keep[:, 0]])
    for name, args in calls:
        for got, want in zip(cpu_rnn.KERNELS[name](*args), getattr(reference, name)(*args), strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_allclose(got, want, **tol, err_msg=name)


def _masked_gru_grads(device, dtype, fused):
    """A GRU step on ``device`` with padded rows, masked in the fused node (``fused``) or by
    a ``where`` after it; the output and every input's gradient."""
    rng = np.random.default_rng(4)
    x, h = rng.normal(size=(5, 3)), rng.normal(size=(5, 4))
    weights = rng.normal(size=(12, 3)), rng.normal(size=(12, 4)), rng.normal(size=12), rng.normal(size=12)
    leaves = [Tensor(a, dtype=dtype, device=device, requires_grad=True) for a in (x, h, *weights)]
    keep = Tensor(np.array([[True], [False], [True], [False], [True]]), device=device)
    if fused:
        out = F.gru_step(leaves[0], *leaves[1:], keep=keep)
        assert out.node.op_name == "GRUCell" and out.node.attrs["masked"]
    else:
        out = ta.where(keep, F.gru_step(leaves[0], *leaves[1:]), leaves[1])
    out.backward(Tensor(rng.normal(size=(5, 4)), dtype=dtype, device=device))
    return [out.numpy()] + [leaf.grad.numpy() for leaf in leaves]


@pytest.mark.parametrize("device", ["numpy", "cpu"])
def test_masked_gru_step_is_the_where_of_the_step_bit_for_bit(device):
    """GRUCell(masked=True) gives where(keep, cell, h_prev) and its gradients exactly (float64):
    padded rows keep h_prev, pass dh on to it and give the gates nothing."""
    fused = _masked_gru_grads(device, np.float64, True)
    for got, want in zip(fused, _masked_gru_grads(device, np.float64, False), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.skipif("cuda" not in available_devices(), reason="no CUDA (NUMBA_ENABLE_CUDASIM=1 simulates)")
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_masked_gru_step_on_cuda_matches_the_reference(dtype):
    tol = {"rtol": 2e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}
    for got, want in zip(_masked_gru_grads("cuda", dtype, True), _masked_gru_grads("numpy", dtype, True),
                         strict=True):
        np.testing.assert_allclose(got, want, **tol)


def _projected_gru_grads(device: str, dtype, projected: bool, masked: bool, bias: bool) -> list:
    """A GRU step on (x, h, weights) with the input's product inside the cell or given to it
    (``projected=True``, gi = Linear(x, w_ih, b_ih)): the output and every leaf's gradient."""
    rng = np.random.default_rng(31)
    x, h = rng.normal(size=(5, 3)), rng.normal(size=(5, 4))
    weights = [rng.normal(size=(12, 3)), rng.normal(size=(12, 4))]
    if bias:
        weights += [rng.normal(size=12), rng.normal(size=12)]
    leaves = [Tensor(a, dtype=dtype, device=device, requires_grad=True) for a in (x, h, *weights)]
    x_t, h_t, w_ih, w_hh, *biases = leaves
    b_ih, b_hh = biases if bias else (None, None)
    keep = Tensor(np.array([[True], [False], [True], [False], [True]]), device=device) if masked else None
    if projected:
        out = F.gru_projected_step(F.linear(x_t, w_ih, b_ih), h_t, w_hh, b_hh, keep)
        assert out.node.op_name == "GRUCell" and out.node.attrs["projected"]
    else:
        out = F.gru_step(x_t, h_t, w_ih, w_hh, b_ih, b_hh, keep=keep)
    out.backward(Tensor(rng.normal(size=(5, 4)), dtype=dtype, device=device))
    return [out.numpy()] + [leaf.grad.numpy() for leaf in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("masked", [False, True], ids=["all-rows", "masked"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_projected_gru_step_equals_the_cell_given_x(device, masked, bias):
    """GRUCell(projected=True) fed gi = x W_ih^T + b_ih is the same step as the cell given x:
    output and every gradient (x's and W_ih's through gi's), float64, padded rows too."""
    got = _projected_gru_grads(device, np.float64, True, masked, bias)
    want = _projected_gru_grads(device, np.float64, False, masked, bias)
    for name, a, b in zip(["h'", "x", "h", "w_ih", "w_hh", "b_ih", "b_hh"], got, want, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13, err_msg=name)


def test_projected_gru_step_names_the_shapes_it_expects():
    with pytest.raises(ta.ShapeError, match=r"GRUCell: projected=True expects gi \(\.\.\., 3H\), h_prev "
                                            r"\(\.\.\., H\), w_hh \(3H, H\) and optionally b_hh \(3H,\); "
                                            r"got gi \(2, 6\), h_prev \(2, 3\), w_hh \(9, 3\)"):
        ta.ops.GRUCell.apply(t(2, 6), t(2, 3), t(9, 3), projected=True)
    with pytest.raises(ta.ShapeError, match="projected=True takes gi, the input's product, whole"):
        ta.ops.GRUCell.apply(t(2, 3), t(2, 6), t(2, 3), t(9, 3), projected=True, parts=2)


def test_cpu_float32_tanh_keeps_its_relative_accuracy_near_zero_and_saturates():
    # 1 - 2/(e^{2x} + 1) would lose every digit near 0; the kernel's polynomial must not.
    from tinygrad_attn.compiler.cpu import rnn as cpu_rnn

    x = np.concatenate([np.geomspace(1e-30, 40.0, 4000), -np.geomspace(1e-30, 40.0, 4000), [0.0]])
    gates = np.zeros((1, 4 * x.size), dtype=np.float32)
    _, act = cpu_rnn.lstm_hidden(gates, x.astype(np.float32)[None])
    tanh_c = act[0, x.size :].astype(np.float64)
    exact = np.tanh(x.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(tanh_c, exact, rtol=4e-7, atol=0)
    assert np.all(np.abs(tanh_c) <= 1.0)


# ---------------------------------------------------------------- errors name the op


def t(*shape, dtype="float64"):
    return Tensor(np.zeros(shape), dtype=dtype)


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: GRUGates.apply(t(2, 9), t(2, 6), t(2, 3)), ta.ShapeError,
     r"GRUGates: gh must end in 3H = 9 for H = 3 \(the last axis of h_prev\); "
     r"got gi \(2, 9\), gh \(2, 6\), h_prev \(2, 3\)"),
    (lambda: GRUGates.apply(t(2, 6), t(2, 6), t(2, 3)), ta.ShapeError, r"GRUGates: gi must end in 3H = 9"),
    (lambda: GRUGates.apply(t(2, 9), t(3, 9), t(2, 3)), ta.ShapeError,
     r"GRUGates: batch axes differ: gi \(2, 9\), gh \(3, 9\), h_prev \(2, 3\)"),
    (lambda: GRUGates.apply(t(), t(), t()), ta.ShapeError,
     r"GRUGates: expected gi \(\.\.\., 3H\), gh \(\.\.\., 3H\), h_prev \(\.\.\., H\)"),
    (lambda: GRUGates.apply(t(2, 9), t(2, 9, dtype="float32"), t(2, 3)), ta.DTypeError,
     r"GRUGates: dtype mismatch: float64 \(2, 9\) and float32 \(2, 9\) and float64 \(2, 3\)"),
    (lambda: LSTMCellState.apply(t(2, 9), t(2, 3)), ta.ShapeError,
     r"LSTMCellState: gates must end in 4H = 12 for H = 3 \(the last axis of c_prev\)"),
    (lambda: LSTMCellState.apply(t(4, 12), t(2, 3)), ta.ShapeError,
     r"LSTMCellState: batch axes differ: gates \(4, 12\), c_prev \(2, 3\)"),
    (lambda: LSTMHidden.apply(t(2, 12), t(2, 4)), ta.ShapeError,
     r"LSTMHidden: gates must end in 4H = 16 for H = 4 \(the last axis of c\)"),
    (lambda: LSTMHidden.apply(t(2, 12, dtype="float32"), t(2, 3)), ta.DTypeError,
     r"LSTMHidden: dtype mismatch"),
    (lambda: LSTMHidden.apply(Tensor(np.zeros((2, 12), int)), Tensor(np.zeros((2, 3), int))), ta.DTypeError,
     r"LSTMHidden: gates must be a float tensor, got int64"),
    (lambda: F.gru_cell(t(2, 5), t(2, 3), t(9, 4), t(9, 3)), ta.ShapeError,
     r"gru_cell: x must end in I = 4 \(w_ih's columns\); got x \(2, 5\), h \(2, 3\), w_ih \(9, 4\)"),
    (lambda: F.gru_cell(t(2, 4), t(2, 3), t(12, 4), t(9, 3)), ta.ShapeError,
     r"gru_cell: w_ih must have 3H = 9 rows for H = 3"),
    (lambda: F.gru_cell(t(2, 4), t(3, 3), t(9, 4), t(9, 3)), ta.ShapeError,
     r"gru_cell: states must be \(2, 3\)"),
    (lambda: F.gru_cell(t(2, 4), t(2, 3), t(9, 4), t(9, 3), t(3)), ta.ShapeError,
     r"gru_cell: b_ih must be \(9,\)"),
    (lambda: F.lstm_cell(t(2, 4), (t(2, 3), t(2, 3)), t(12, 4), t(9, 3)), ta.ShapeError,
     r"lstm_cell: expected w_ih \(4H, I\) and w_hh \(4H, H\)"),
    (lambda: F.lstm_cell(t(2, 4), (t(2, 3), t(2, 2)), t(12, 4), t(12, 3)), ta.ShapeError,
     r"lstm_cell: states must be \(2, 3\) .* c \(2, 2\)"),
])
def test_bad_cell_inputs_raise_errors_naming_the_op(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()
