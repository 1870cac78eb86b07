"""Bad input gets a clear error naming the op and the shapes, never a numpy traceback."""

import numpy as np
import pytest

import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn import Tensor


def _model():
    return ta.models.Seq2Seq(8, 8, embed=4, hidden=4)


def t(*shape, dtype="float32"):
    return Tensor(np.ones(shape), dtype=dtype)


@pytest.mark.parametrize("name, call, pattern", [
    ("add", lambda: t(2, 3) + t(4), r"Add: shapes \(2, 3\) and \(4,\) do not broadcast"),
    ("mul", lambda: t(2, 3) * t(3, 2), r"Mul: shapes \(2, 3\) and \(3, 2\) do not broadcast"),
    ("matmul", lambda: t(2, 3) @ t(4, 5), r"MatMul: inner dimensions differ: \(2, 3\) @ \(4, 5\)"),
    ("matmul batch", lambda: t(2, 2, 3) @ t(3, 3, 1), r"MatMul: batch axes do not broadcast"),
    ("matmul 0-d", lambda: t() @ t(2), r"MatMul: operands must have at least 1 axis"),
    ("reshape", lambda: t(2, 3).reshape(4, 2), r"Reshape: cannot reshape \(2, 3\) \(6 elements\) to \(4, 2\)"),
    ("reshape -1", lambda: t(2, 3).reshape(-1, 4), r"Reshape: cannot reshape \(2, 3\)"),
    ("permute", lambda: t(2, 3).permute(0, 0), r"Permute: axes \(0, 0\) are not a permutation"),
    ("expand", lambda: t(2, 3).expand(4, 3), r"Expand: cannot expand shape \(2, 3\) to \(4, 3\)"),
    ("sum axis", lambda: t(2, 3).sum(axis=2), r"Sum: axis 2 is out of range for a 2-d input"),
    ("softmax axis", lambda: t(2, 3).softmax(axis=-3), r"Softmax: axis -3 is out of range"),
    ("cat", lambda: ta.cat([t(2, 3), t(2, 4)], axis=0), r"Cat: input shapes must match except along axis 0"),
    ("stack", lambda: ta.stack([t(2, 3), t(3, 2)]), r"Stack: input shapes must match"),
    ("getitem", lambda: t(2, 3)[5], r"GetItem: index \[5\] is invalid for shape \(2, 3\)"),
    ("masked_fill", lambda: t(2, 3).masked_fill(np.ones((4, 2, 3), bool), 0.0),
     r"MaskedFill: mask of shape \(4, 2, 3\) would enlarge the input of shape \(2, 3\)"),
    ("masked_fill broadcast", lambda: t(2, 3).masked_fill(np.ones((2,), bool), 0.0),
     r"MaskedFill: shapes \(2, 3\) and \(2,\) do not broadcast"),
    ("where", lambda: ta.where(np.ones((2,), bool), t(2, 3), t(2, 3)), r"Where: shapes .* do not broadcast"),
    ("cross_entropy shape", lambda: F.cross_entropy(t(2, 3, 5), np.zeros((3, 2), int)),
     r"CrossEntropy: target shape \(3, 2\) must equal the scores shape without its class axis"),
    ("cross_entropy value", lambda: F.cross_entropy(t(2, 5), np.array([1, 7])),
     r"CrossEntropy: target value 7 is outside \[0, 5\)"),
    ("nll_loss reduction", lambda: F.nll_loss(t(2, 5), np.array([1, 2]), reduction="avg"),
     r"NLLLoss: reduction must be"),
    ("embedding id", lambda: F.embedding(np.array([0, 9]), t(4, 2)), r"Embedding: id 9 is outside \[0, 4\)"),
    ("embedding weight", lambda: F.embedding(np.array([0]), t(4)), r"Embedding: weight must be 2-D"),
    ("mse_loss", lambda: F.mse_loss(t(2, 3), t(3)), r"mse_loss: input shape \(2, 3\) differs from target shape \(3,\)"),
    ("transpose", lambda: t(2, 3).transpose(0, 2), r"transpose: axes \(0, 2\) are out of range for shape \(2, 3\)"),
    ("squeeze", lambda: t(2, 3).squeeze(0), r"squeeze: axis 0 of shape \(2, 3\) has size 2"),
    ("dropout p", lambda: F.dropout(t(2), p=1.5), r"dropout: p must be in \[0, 1\]"),
])
def test_bad_shapes_raise_errors_naming_the_op(name, call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


@pytest.mark.parametrize("name, call, pattern", [
    ("add", lambda: t(2, 3) + t(2, 3, dtype="float64"),
     r"Add: dtype mismatch: float32 \(2, 3\) and float64 \(2, 3\)"),
    ("matmul", lambda: t(2, 3) @ t(3, 2, dtype="float64"), r"MatMul: dtype mismatch"),
    ("ids times float", lambda: Tensor([1, 2]) * 0.5, r"Mul: cannot combine a int64 tensor"),
    ("exp of ids", lambda: Tensor([1, 2]).exp(), r"Exp: input must be a float tensor, got int64"),
    ("float target", lambda: F.cross_entropy(t(2, 3), t(2)), r"CrossEntropy: target must be an integer tensor"),
    ("masked_fill float mask", lambda: t(2).masked_fill(t(2), 0.0), r"MaskedFill: mask must be a boolean tensor"),
    ("unsupported dtype", lambda: Tensor([1.0], dtype="float16"), r"unsupported dtype float16"),
    ("uint64 past int64", lambda: Tensor(np.array([2**63 + 5], np.uint64)),
     r"uint64 value 9223372036854775813 does not fit in int64"),
    ("int key_mask", lambda: ta.nn.MultiHeadAttention(4, 2)(t(1, 3, 4), t(1, 3, 4), t(1, 3, 4),
                                                            key_mask=np.ones((1, 3), int)),
     r"attention.multi_head: key_mask must be boolean .*got int64; compare ids"),
    ("graph of an array", lambda: ta.viz.graph(np.ones(3)), r"graph\(\): expected a Tensor .*got ndarray"),
    ("greedy float max_len", lambda: _model().greedy(np.full((1, 3), 4), 3.5), r"greedy: max_len must be an int"),
])
def test_bad_dtypes_raise_errors_naming_the_op(name, call, pattern):
    with pytest.raises(TypeError, match=pattern):
        call()


def test_mixing_devices_raises():
    with pytest.raises(ta.DeviceError, match=r"Add: inputs are on different devices \(cpu \(2,\), numpy \(2,\)\)"):
        Tensor([1.0, 2.0]) + Tensor([1.0, 2.0], device="numpy")


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown device 'tpu'; known devices: 'numpy', 'cpu'"):
        Tensor([1.0], device="tpu")


def test_setitem_is_refused_with_a_hint():
    with pytest.raises(TypeError, match="does not support item assignment.*ta.where"):
        t(2)[0] = 1.0


def test_decoding_no_sources_gives_empty_results():
    ids, weights = _model().beam_search(np.zeros((0, 3), np.int64), beam=3)
    again, _ = _model().greedy(np.zeros((0, 3), np.int64))
    assert ids.shape == again.shape == (0, 1) and weights.shape == (0, 1, 3)


def test_save_keeps_a_read_only_file_and_names_the_users_path(tmp_path):
    import os

    locked = tmp_path / "locked.ckpt"
    locked.write_text("keep me")
    locked.chmod(0o444)
    with pytest.raises(PermissionError, match=r"ta.save: '.*locked.ckpt' is read-only"):
        ta.save({"a": 1}, locked)
    assert locked.read_text() == "keep me"
    with pytest.raises(IsADirectoryError, match="names no file"):
        ta.save({"a": 1}, "")
    folder = tmp_path / "folder"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as a user who may write anywhere (root): a read-only folder is not")
        with pytest.raises(PermissionError, match=r"cannot write '.*folder/x.ckpt': its directory"):
            ta.save({"a": 1}, folder / "x.ckpt")
    finally:
        folder.chmod(0o755)


def _optimizer():
    return ta.optim.Adam([Tensor(np.ones(2), requires_grad=True)], lr=0.1)


@pytest.mark.parametrize("call, error, pattern", [
    # The plain arguments of every module are checked by tinygrad_attn/arguments.py, in one wording:
    # a wrong type is a TypeError, a value out of range a ValueError, each naming the function.
    (lambda: ta.optim.SGD([Tensor(np.ones(2), requires_grad=True)], lr=0.1, momentum=0.9, nesterov=1),
     TypeError, r"^SGD: nesterov must be True or False, got 1 \(int\)$"),
    (lambda: ta.optim.WarmupCosine(_optimizer(), warmup=2.0, total=10), TypeError,
     r"^WarmupCosine: warmup must be an int, got 2.0 \(float\)$"),
    (lambda: ta.optim.WarmupCosine(_optimizer(), warmup=5, total=4), ValueError,
     r"^WarmupCosine: total must be >= 5, got 4$"),
    (lambda: ta.optim.ReduceLROnPlateau(_optimizer(), factor=1.0), ValueError,
     r"^ReduceLROnPlateau: factor must be a finite number in \(0.0, 1.0\), got 1.0$"),
    (lambda: ta.optim.ReduceLROnPlateau(_optimizer(), patience=-1), ValueError,
     r"^ReduceLROnPlateau: patience must be >= 0, got -1$"),
    (lambda: ta.attention.scaled_dot_product(t(1, 2, 4), t(1, 3, 4), t(1, 3, 4), dropout=float("nan")),
     ValueError, r"^attention.scaled_dot_product: dropout must be a finite number in \[0.0, 1.0\), got nan$"),
    (lambda: ta.attention.multi_head(t(1, 2, 4), t(1, 3, 4), t(1, 3, 4), 2.0, t(4, 4), t(4, 4), t(4, 4), t(4, 4)),
     TypeError, r"^attention.multi_head: num_heads must be an int, got 2.0 \(float\)$"),
    (lambda: ta.data.Vocab.build([["a"]], min_freq=True), TypeError,
     r"^Vocab.build: min_freq must be an int, got True \(bool\)$"),
    (lambda: ta.data.from_pairs([(["a"], ["b"])] * 4, max_src_len=2.5), TypeError,
     r"^from_pairs: max_src_len must be None or an int, got 2.5 \(float\)$"),
])
def test_plain_arguments_are_checked_in_one_wording(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()
