"""Module bookkeeping (parameters, state_dict, modes, repr) and the attention modules."""

import numpy as np
import pytest

import tinygrad_attn as ta
from tests import optional
from tinygrad_attn import Tensor, nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 3)
        self.scale = nn.Parameter(np.ones(3))
        self.attn = nn.AdditiveAttention(3, 3, 5)
        self.shared = self.proj            # the same module twice: listed once

    def forward(self, x):
        h = self.proj(x) * self.scale                                        # (B, T, 3)
        return self.attn(h[:, -1], h)


def test_named_parameters_are_dotted_paths_own_first():
    # A module's own parameters come before its children's, as in PyTorch.
    names = [name for name, _ in Block().named_parameters()]
    assert names == ["scale", "proj.weight", "proj.bias", "attn.W_q", "attn.W_k", "attn.v"]


def test_parameters_carry_their_path_as_name():
    block = Block()
    assert block.proj.weight.name == "proj.weight"
    assert block.attn.v.name == "attn.v"
    outer = nn.Module()
    outer.block = block
    assert block.attn.v.name == "block.attn.v"


def test_state_dict_round_trip_and_shapes():
    ta.manual_seed(0)
    a, b = Block(), Block()
    state = a.state_dict()
    assert state["proj.weight"].shape == (3, 4) and state["attn.v"].shape == (5,)
    b.load_state_dict(state)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    state["proj.weight"][...] = 7.0                     # a copy: the module is unaffected
    assert not np.any(a.proj.weight.numpy() == 7.0)


def test_load_state_dict_checks_everything_before_changing_anything():
    block = Block()
    before = block.state_dict()
    bad = dict(before)
    bad["attn.v"] = np.zeros(4)
    with pytest.raises(ValueError, match=r"'attn.v' has shape \(4,\), the parameter has shape \(5,\)"):
        block.load_state_dict({**bad, "proj.weight": np.zeros((3, 4))})
    np.testing.assert_array_equal(block.proj.weight.numpy(), before["proj.weight"])
    with pytest.raises(KeyError, match=r"missing keys \['scale'\], unexpected keys \['extra'\]"):
        block.load_state_dict({**{k: v for k, v in before.items() if k != "scale"}, "extra": 1})
    block.load_state_dict({"scale": np.full(3, 2.0)}, strict=False)
    np.testing.assert_array_equal(block.scale.numpy(), 2.0)


@pytest.mark.parametrize(("bias", "error", "message"), [
    (np.array(["x", "y"]), TypeError, r"'bias' holds <U1 values; a parameter takes real numbers"),
    (np.array([1 + 2j, 3]), TypeError, r"'bias' holds complex128 values"),
    (np.array([1e300, 0.0]), ValueError, r"'bias' holds 1e\+300, beyond float32's range"),
])
def test_load_state_dict_refuses_values_it_would_change_and_changes_nothing(bias, error, message):
    layer = nn.Linear(3, 2)
    before = layer.state_dict()
    with pytest.raises(error, match=message):
        layer.load_state_dict({"weight": np.full((2, 3), 7.0), "bias": bias})
    for name, value in layer.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    layer.double().load_state_dict({"weight": np.full((2, 3), 1e300), "bias": np.zeros(2)})   # fits float64


def test_load_state_dict_keeps_parameter_dtype():
    block = Block()
    block.load_state_dict({k: v.astype(np.float64) for k, v in block.state_dict().items()})
    assert all(p.dtype == np.float32 for p in block.parameters())
    block.double()
    assert all(p.dtype == np.float64 for p in block.parameters())


def test_train_eval_zero_grad_and_repr():
    block = Block()
    assert block.eval() is block and not block.attn.training
    block.train()
    assert block.proj.training
    x = Tensor(np.random.default_rng(0).normal(size=(2, 3, 4)))
    context, _ = block(x)
    context.sum().backward()
    assert all(p.grad is not None for p in block.parameters())
    block.zero_grad()
    assert all(p.grad is None for p in block.parameters())
    text = repr(block)
    assert text.startswith(f"Block()  # {block.num_parameters():,} parameters")
    assert "(attn): AdditiveAttention(query_dim=3, key_dim=3, attn_dim=5)  # 35 parameters" in text
    assert block.num_parameters() == 3 * 4 + 3 + 3 + 5 * 3 * 2 + 5


def test_module_without_super_init_says_so():
    class Broken(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(np.ones(2))

    with pytest.raises(AttributeError, match=r"call super\(\).__init__\(\)"):
        Broken()


def test_linear_matches_torch():
    torch = optional.module("torch", optional.TORCH_REASON)
    ref = torch.nn.Linear(4, 3).double()
    layer = nn.Linear(4, 3).double()
    layer.load_state_dict(ref.state_dict())
    x = np.random.default_rng(1).normal(size=(2, 5, 4))
    tx = torch.tensor(x, requires_grad=True)
    ours = Tensor(x, requires_grad=True, dtype=np.float64)
    ref(tx).sum().backward()
    layer(ours).sum().backward()
    np.testing.assert_allclose(layer(ours).numpy(), ref(tx).detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(layer.weight.grad.numpy(), ref.weight.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(layer.bias.grad.numpy(), ref.bias.grad.numpy(), rtol=1e-12)


def test_linear_initialisation_bounds_follow_pytorch():
    ta.manual_seed(3)
    layer = nn.Linear(100, 50)
    bound = 1 / np.sqrt(100)
    assert np.abs(layer.weight.numpy()).max() <= bound
    assert np.abs(layer.weight.numpy()).max() > 0.9 * bound
    mha = nn.MultiHeadAttention(16, 4)
    assert np.all(mha.in_proj_bias.numpy() == 0) and np.all(mha.out_proj.bias.numpy() == 0)
    assert np.abs(mha.in_proj_weight.numpy()).max() <= np.sqrt(6 / (48 + 16))


def test_linear_names_its_shapes_on_bad_input():
    with pytest.raises(ValueError, match=r"Linear\(in_features=4, out_features=3, bias=True\): input of "
                                         r"shape \(2, 5\) must end in in_features=4"):
        nn.Linear(4, 3)(Tensor(np.ones((2, 5))))


# ---------------------------------------------------------------- attention modules


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return Tensor(rng.normal(size=(2, 3))), Tensor(rng.normal(size=(2, 4, 3)))


@pytest.mark.parametrize("module, call", [
    (lambda: nn.DotAttention(), lambda m, q, k: ta.attention.dot(q, k)),
    (lambda: nn.GeneralAttention(3), lambda m, q, k: ta.attention.general(q, k, m.W)),
    (lambda: nn.ConcatAttention(3, 3, 5), lambda m, q, k: ta.attention.concat(q, k, m.W, m.v)),
    (lambda: nn.AdditiveAttention(3, 3, 5),
     lambda m, q, k: ta.attention.additive(q, k, m.W_q, m.W_k, m.v)),
], ids=["dot", "general", "concat", "additive"])
def test_score_modules_compute_their_function(module, call):
    m = module()
    q, k = _inputs()
    context, weights = m(q, k)
    ref_context, ref_weights = call(m, q, k)
    np.testing.assert_array_equal(context.numpy(), ref_context.numpy())
    np.testing.assert_array_equal(weights.numpy(), ref_weights.numpy())
    if m.parameters():
        context.sum().backward()
        assert all(p.grad is not None for p in m.parameters())


def test_dropout_in_attention_modules_only_while_training():
    ta.manual_seed(0)
    x = Tensor(np.random.default_rng(4).normal(size=(2, 5, 8)))
    mha = nn.MultiHeadAttention(8, 2, dropout=0.5)
    sdpa = nn.ScaledDotProductAttention(dropout=0.5)
    for module, call in ((mha, lambda: mha(x, x, x)[0]), (sdpa, lambda: sdpa(x, x, x)[0])):
        module.eval()
        first, second = call().numpy(), call().numpy()
        np.testing.assert_array_equal(first, second)
        module.train()
        assert not np.allclose(call().numpy(), first)


def test_multi_head_with_kdim_uses_separate_projection_weights():
    mha = nn.MultiHeadAttention(8, 2, kdim=5, vdim=3)
    assert list(mha.state_dict()) == ["q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                                      "out_proj.weight", "out_proj.bias"]
    rng = np.random.default_rng(5)
    out, weights = mha(Tensor(rng.normal(size=(2, 4, 8))), Tensor(rng.normal(size=(2, 6, 5))),
                       Tensor(rng.normal(size=(2, 6, 3))), average_weights=False)
    assert out.shape == (2, 4, 8) and weights.shape == (2, 2, 4, 6)


def test_graph_attention_module_shapes_and_bias():
    gat = nn.GraphAttention(3, 4, heads=2)
    adjacency = np.random.default_rng(6).random((5, 5)) < 0.5
    h, weights = gat(Tensor(np.ones((5, 3))), adjacency)
    assert h.shape == (5, 8) and weights.shape == (2, 5, 5)
    assert [name for name, _ in gat.named_parameters()] == ["W", "a_src", "a_dst", "bias"]
    mean = nn.GraphAttention(3, 4, heads=2, concat=False, bias=False)
    assert mean(Tensor(np.ones((5, 3))), adjacency)[0].shape == (5, 4)


def test_luong_attention_vector_is_tanh_of_projected_concatenation():
    layer = nn.LuongAttentionVector(3, 2)
    rng = np.random.default_rng(7)
    c, h = rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    out = layer(Tensor(c), Tensor(h))
    expected = np.tanh(np.concatenate([c, h], -1) @ layer.W_c.weight.numpy().T)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    assert list(layer.state_dict()) == ["W_c.weight"]
    with pytest.raises(ValueError, match=r"LuongAttentionVector: expected context \(\.\.\., 3\)"):
        layer(Tensor(h), Tensor(h))


def test_calling_a_module_without_forward_says_so():
    with pytest.raises(TypeError, match=r"Module is a container without forward\(\)"):
        nn.Module()(Tensor(np.ones(2)))
