"""The Tensor API: dtypes, factories, conversions, operators and display."""

import numpy as np
import pytest

import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn import Tensor


def test_dtype_defaults_float32_for_floats_and_int64_for_ints():
    assert Tensor([1.0, 2.0]).dtype == np.float32
    assert Tensor(np.zeros(3)).dtype == np.float32          # float64 data -> default float
    assert Tensor([1, 2]).dtype == np.int64
    assert Tensor([True]).dtype == np.bool_
    assert Tensor(np.zeros(3), dtype="float64").dtype == np.float64
    assert Tensor(np.zeros(3), dtype=np.int32).dtype == np.int32


def test_constructor_copies_its_data():
    array = np.zeros(3, dtype=np.float32)
    x = Tensor(array)
    array[0] = 5
    assert x.numpy()[0] == 0


def test_float64_flows_through_ops_and_gradients():
    x = Tensor([[1.0, 2.0]], requires_grad=True, dtype="float64")
    y = (x @ x.T).tanh().sum()
    y.backward()
    assert y.dtype == np.float64 and x.grad.dtype == np.float64


def test_python_scalars_take_the_tensor_dtype():
    x = Tensor([1.0, 2.0])
    assert (x * 2).dtype == np.float32
    assert (2 - x).numpy().tolist() == [1.0, 0.0]
    assert (1 / Tensor([2.0, 4.0])).numpy().tolist() == [0.5, 0.25]
    assert (2 ** Tensor([1.0, 3.0])).numpy().tolist() == [2.0, 8.0]
    assert (Tensor([1, 2]) + 1).dtype == np.int64


def test_numpy_arrays_on_the_left_defer_to_tensor():
    out = np.array([1.0, 2.0]) * Tensor([3.0, 4.0])
    assert isinstance(out, Tensor)
    assert out.numpy().tolist() == [3.0, 8.0]


def test_comparisons_give_boolean_tensors_without_grad():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    mask = x > 1.5
    assert mask.dtype == np.bool_ and not mask.requires_grad
    assert mask.numpy().tolist() == [False, True, True]
    assert (x == 2.0).numpy().tolist() == [False, True, False]
    assert {x: 1}[x] == 1          # tensors stay hashable


def test_factories_and_seeded_randomness():
    assert Tensor.zeros(2, 3).shape == (2, 3)
    assert Tensor.ones((2, 3), dtype="float64").dtype == np.float64
    assert Tensor.full((2,), 7.0).numpy().tolist() == [7.0, 7.0]
    assert Tensor.eye(3).numpy().trace() == 3
    assert Tensor.arange(4).numpy().tolist() == [0, 1, 2, 3]
    ta.manual_seed(3)
    a = Tensor.randn(4).numpy()
    ta.manual_seed(3)
    assert np.array_equal(a, Tensor.randn(4).numpy())
    r = Tensor.rand(100).numpy()
    assert r.min() >= 0 and r.max() < 1


def test_item_tolist_len_and_array_protocol():
    x = Tensor([[1.0, 2.0]])
    assert Tensor([5.0]).item() == 5.0
    assert x.tolist() == [[1.0, 2.0]]
    assert len(x) == 1
    assert np.asarray(x).shape == (1, 2)
    with pytest.raises(ValueError, match="has 2 elements"):
        x.item()


def test_transpose_permute_T_unsqueeze_squeeze():
    x = Tensor(np.arange(24.0).reshape(2, 3, 4))
    assert x.transpose(0, 2).shape == (4, 3, 2)
    assert x.permute(1, 2, 0).shape == (3, 4, 2)
    assert x.T.shape == (4, 3, 2)
    assert x.unsqueeze(1).shape == (2, 1, 3, 4)
    assert x.unsqueeze(-1).shape == (2, 3, 4, 1)
    assert x.unsqueeze(0).squeeze(0).shape == (2, 3, 4)
    assert np.array_equal(x.transpose(0, 2).numpy(), np.swapaxes(x.numpy(), 0, 2))


def test_astype_float_casts_are_differentiable_and_int_casts_are_not():
    x = Tensor([1.5, 2.5], requires_grad=True)
    y = x.double()
    assert y.dtype == np.float64 and y.requires_grad
    y.sum().backward()
    assert x.grad.dtype == np.float32
    ids = x.long()
    assert ids.dtype == np.int64 and not ids.requires_grad


def test_to_moves_leaves_between_devices():
    x = Tensor([1.0, 2.0], requires_grad=True, name="w")
    y = x.to("numpy")
    assert y.device == "numpy" and y.requires_grad and y.is_leaf and y.name == "w"
    with pytest.raises(RuntimeError, match="cannot move devices"):
        (x * 2).to("numpy")


def test_repr_shows_values_dtype_and_op():
    x = Tensor([1.0, 2.0], requires_grad=True)
    assert repr(x) == "Tensor([1., 2.], requires_grad=True)"
    assert "op=Mul" in repr(x * 2)
    assert "dtype=float64" in repr(Tensor([1.0], dtype="float64"))


def test_dropout_is_seeded_scaled_and_identity_in_eval():
    x = Tensor(np.ones(10_000), requires_grad=True)
    y = F.dropout(x, p=0.25, generator=np.random.default_rng(0))
    kept = y.numpy() != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(y.numpy()[kept], 1 / 0.75, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), kept / 0.75, rtol=1e-6)
    same = F.dropout(x, p=0.25, generator=np.random.default_rng(0))
    assert np.array_equal(same.numpy(), y.numpy())
    assert F.dropout(x, p=0.25, training=False) is x


def test_cross_entropy_ignores_rows_and_never_divides_by_zero():
    logits = Tensor(np.zeros((2, 3, 4)), requires_grad=True)
    target = np.array([[1, 0, 0], [2, 0, 3]])
    loss = F.cross_entropy(logits, target, ignore_index=0)
    np.testing.assert_allclose(loss.item(), np.log(4), rtol=1e-6)
    all_ignored = F.cross_entropy(logits, np.zeros((2, 3), int), ignore_index=0)
    assert all_ignored.item() == 0.0
    all_ignored.backward()
    assert np.all(logits.grad.numpy() == 0)


def test_softmax_survives_huge_logits_and_fully_masked_rows():
    x = Tensor([[1e4, 0.0, -1e4], [-np.inf, -np.inf, -np.inf]], requires_grad=True)
    y = x.softmax(axis=-1)
    assert np.all(np.isfinite(y.numpy()))
    np.testing.assert_allclose(y.numpy(), [[1, 0, 0], [0, 0, 0]], atol=1e-7)
    y.backward(np.ones((2, 3)))
    assert np.all(np.isfinite(x.grad.numpy()))


def test_log_softmax_of_a_fully_masked_row_is_minus_inf_not_nan():
    x = Tensor([[-np.inf, -np.inf], [0.0, 1.0]], requires_grad=True, dtype="float64")
    with np.errstate(all="raise"):
        y = x.log_softmax(axis=-1)
    assert np.all(np.isneginf(y.numpy()[0]))
    np.testing.assert_allclose(y.numpy()[1], [-np.log1p(np.e), 1 - np.log1p(np.e)])
    y.backward(np.ones((2, 2)))
    assert np.all(np.isfinite(x.grad.numpy()))
