"""Ops compute through kernels only, never from values read on the host, so a captured step
replays them: the losses' count of kept rows and their divisor, label smoothing's mask, the
range checks on ids (guard kernels) and dropout's multiplier (a kernel that advances the
generator).  Each result stays bit for bit what the previous host code gave; that code is
kept here as the oracle."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn import Tensor
from tinygrad_attn.compiler import available_devices, get_backend
from tinygrad_attn.ops import CrossEntropy, Embedding, NLLLoss

NO_IGNORE = np.iinfo(np.int64).min
DTYPES = [np.float32, np.float64]
HOST_DEVICES = [d for d in available_devices() if d != "cuda"]


def assert_bitwise(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), f"{got} != {want}"


def host(t: Tensor) -> np.ndarray:
    return np.asarray(t.backend.to_numpy(t._data))


# ---------------------------------------------------------------- the previous host code


def old_loss(kb, name, scores, target, ignore_index, reduction, dloss):
    """The losses as they were: the count of kept rows read on the host, the divisor made by
    ``full`` from it, in forward and backward.  Returns (loss, dscores)."""
    ignore = NO_IGNORE if ignore_index is None else ignore_index
    scores2 = kb.reshape(scores, (-1, scores.shape[scores.ndim - 1]))   # device shapes refuse -1
    target1 = kb.reshape(target, (-1,))
    count = int(np.sum(np.asarray(kb.to_numpy(target1)) != ignore))
    if name == "CrossEntropy":
        rows, lse = kb.cross_entropy(scores2, target1, ignore)
    else:
        rows = kb.nll_loss(scores2, target1, ignore)
    if reduction == "none":
        loss = kb.reshape(rows, target.shape)
    else:
        loss = kb.sum(rows, None, False)
        if reduction == "mean":
            loss = kb.div(loss, kb.full((), max(count, 1), rows.dtype))
    n = scores2.shape[0]
    if reduction == "none":
        drows = kb.reshape(dloss, (n,))
    else:
        dy = dloss
        if reduction == "mean":
            dy = kb.div(dy, kb.full((), max(count, 1), dy.dtype))
        drows = kb.broadcast_to(kb.reshape(dy, (1,)), (n,))
    if name == "CrossEntropy":
        dscores = kb.cross_entropy_back(scores2, lse, target1, ignore, drows)
    else:
        dscores = kb.nll_loss_back(scores2.shape, target1, ignore, drows)
    return loss, kb.reshape(dscores, scores.shape)


def old_label_smoothing(logits, target, ignore_index, reduction, eps):
    """functional.cross_entropy with label smoothing as it was: the mask and the count of
    kept rows computed by numpy on the host."""
    nll = CrossEntropy.apply(logits, target, ignore_index=ignore_index, reduction="none")
    spread = -logits.log_softmax(-1).mean(axis=-1)
    kept = np.ones(target.shape, dtype=bool) if ignore_index is None else target.numpy() != ignore_index
    keep = Tensor(kept, dtype=logits.dtype, device=logits.device)
    rows = nll * (1.0 - eps) + spread * keep * eps
    if reduction == "none":
        return rows
    total = rows.sum()
    return total if reduction == "sum" else total / max(int(kept.sum()), 1)


def old_check_targets(where, classes, scores_shape, target, ignore):
    bad = ((target < 0) | (target >= classes)) & (target != ignore)
    if np.any(bad):
        raise ta.ShapeError(f"{where}: target value {int(target[bad][0])} is outside [0, {classes}) for "
                            f"scores of shape {scores_shape}")


def old_check_ids(where, ids, table_shape):
    rows = table_shape[0]
    unsigned = {np.dtype(f"i{n}"): np.dtype(f"u{n}") for n in (4, 8)}.get(ids.dtype)
    if unsigned is not None:
        bad = ids.size and np.maximum.reduce(ids.view(unsigned), axis=None) >= rows
    else:
        bad = ids.size and (ids.min() < 0 or ids.max() >= rows)
    if bad:
        low, high = ids.min(), ids.max()
        bad = int(low) if low < 0 else int(high)
        raise ta.ShapeError(f"{where}: id {bad} is outside [0, {rows}) for weight of shape {table_shape}")


def old_dropout(x: np.ndarray, rng, p, dy):
    """F.dropout as it was: the mask drawn by numpy, scaled and cast on the host."""
    mask = rng.random(x.shape) >= p
    multiplier = np.asarray(mask * (0.0 if p >= 1.0 else 1.0 / (1.0 - p)), dtype=x.dtype)
    return x * multiplier, dy * multiplier


def raised(fn):
    """(type, message) of what ``fn()`` raises, or None."""
    try:
        fn()
    except Exception as error:          # noqa: BLE001 - the comparison is the point
        return type(error), str(error)
    return None


# ---------------------------------------------------------------- losses


def _targets(rng, shape, classes, padded):
    target = rng.integers(0, classes, size=shape)
    if padded:
        target[rng.random(shape) < 0.4] = 0            # padding: the ignored id
        target.reshape(-1)[-1] = 0                     # at least one ignored row
    return target


@pytest.mark.parametrize("device", HOST_DEVICES + (["cuda"] if "cuda" in available_devices() else []))
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", ["CrossEntropy", "NLLLoss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(("ignore_index", "padded"), [(0, True), (0, False), (None, False), (3, True)])
def test_losses_equal_the_host_count_bit_for_bit(device, dtype, name, reduction, ignore_index, padded):
    kb = get_backend(device)
    rng = np.random.default_rng(hash((name, reduction, ignore_index, padded)) % 2**32)
    shape, classes = (3, 5), 7
    scores = rng.normal(size=shape + (classes,)).astype(dtype)
    if name == "NLLLoss":
        scores = np.asarray(get_backend("numpy").log_softmax(scores, -1))
    target = _targets(rng, shape, classes, padded)
    dloss = rng.normal(size=shape if reduction == "none" else ()).astype(dtype)

    x = Tensor(scores, dtype=dtype, requires_grad=True, device=device)
    op = CrossEntropy if name == "CrossEntropy" else NLLLoss
    loss = op.apply(x, Tensor(target, dtype=np.int64, device=device), ignore_index=ignore_index,
                    reduction=reduction)
    loss.backward(dloss)

    want_loss, want_grad = old_loss(kb, name, kb.asarray(scores, dtype), kb.asarray(target, np.int64),
                                    ignore_index, reduction, kb.asarray(dloss, dtype))
    assert_bitwise(host(loss), np.asarray(kb.to_numpy(want_loss)))
    assert_bitwise(host(x.grad), np.asarray(kb.to_numpy(want_grad)))


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_mean_over_only_ignored_rows_is_zero_with_zero_gradient(dtype):
    x = Tensor(np.ones((2, 3), dtype), dtype=dtype, requires_grad=True)
    loss = F.cross_entropy(x, np.array([0, 0]), ignore_index=0)
    loss.backward()
    assert_bitwise(loss.numpy(), np.zeros((), dtype))
    assert_bitwise(x.grad.numpy(), np.zeros((2, 3), dtype))


@pytest.mark.parametrize("device", available_devices())
def test_count_ne_counts_exactly_as_a_0d_int64(device):
    kb = get_backend(device)
    rng = np.random.default_rng(1)
    for target, value in [(rng.integers(0, 3, size=37), 0), (np.zeros(5, np.int64), 0),
                          (np.arange(6), NO_IGNORE), (np.zeros(0, np.int64), 0),
                          (rng.integers(-2, 2, size=(4, 3)).astype(np.int32), -1)]:
        count = np.asarray(kb.to_numpy(kb.count_ne(kb.asarray(target, target.dtype), value)))
        assert count.dtype == np.int64 and count.shape == ()
        assert int(count) == int(np.sum(target != value))


@pytest.mark.parametrize("device", available_devices())
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_clamp_divisor_has_the_bits_full_gave(device, dtype):
    kb = get_backend(device)
    # 2**24 + 1 rounds in float32: the kernel must round as the conversion in full did.
    for count in [0, 1, 2, 7, 2**24 + 1, 2**31 + 3]:
        got = kb.clamp_divisor(kb.asarray(np.asarray(count, np.int64), np.int64), dtype)
        want = get_backend("numpy").full((), max(count, 1), dtype)
        assert_bitwise(np.asarray(kb.to_numpy(got)), want)


@pytest.mark.parametrize("device", available_devices())
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(("ignore_index", "padded"), [(0, True), (0, False), (None, False), (2, True)])
def test_label_smoothing_equals_the_host_mask_bit_for_bit(device, dtype, reduction, ignore_index, padded):
    rng = np.random.default_rng(7)
    logits_np = rng.normal(size=(2, 4, 6)).astype(dtype)
    target = _targets(rng, (2, 4), 6, padded)
    cotangent = rng.normal(size=(2, 4) if reduction == "none" else ()).astype(dtype)
    results = []
    for fn in (lambda lg, t: F.cross_entropy(lg, t, ignore_index=ignore_index, reduction=reduction,
                                             label_smoothing=0.1),
               lambda lg, t: old_label_smoothing(lg, t, ignore_index, reduction, 0.1)):
        logits = Tensor(logits_np, dtype=dtype, requires_grad=True, device=device)
        loss = fn(logits, Tensor(target, dtype=np.int64, device=device))
        loss.backward(cotangent)
        results.append((loss.numpy(), logits.grad.numpy()))
    (loss, grad), (want_loss, want_grad) = results
    assert_bitwise(loss, want_loss)
    assert_bitwise(grad, want_grad)


def test_label_smoothing_takes_int32_targets_with_an_ignore_index_outside_their_range():
    logits = Tensor(np.random.default_rng(3).normal(size=(4, 5)), requires_grad=True)
    narrow = Tensor(np.array([1, 0, 4, 2]), dtype=np.int32)
    for ignore_index in (-100, 2**40):
        loss = F.cross_entropy(logits, narrow, ignore_index=ignore_index, label_smoothing=0.2)
        want = old_label_smoothing(logits, narrow, ignore_index, "mean", 0.2)
        assert_bitwise(loss.numpy(), want.numpy())


# ---------------------------------------------------------------- guards


@given(st.data())
def test_target_guard_raises_exactly_as_the_host_check(data):
    dtype = data.draw(st.sampled_from([np.int64, np.int32]))
    info = np.iinfo(dtype)
    values = st.integers(max(int(info.min), -10), min(int(info.max), 12))
    shape = data.draw(st.sampled_from([(0,), (5,), (2, 3)]))
    target = np.array(data.draw(st.lists(values, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
                      dtype=dtype).reshape(shape)
    ignore_index = data.draw(st.sampled_from([None, 0, -1, 11]))
    scores = np.zeros(shape + (6,), np.float32)
    ignore = NO_IGNORE if ignore_index is None else ignore_index
    for name, op in (("CrossEntropy", CrossEntropy), ("NLLLoss", NLLLoss)):
        got = raised(lambda op=op: op.apply(Tensor(scores), Tensor(target, dtype=dtype),
                                            ignore_index=ignore_index, reduction="mean"))
        want = raised(lambda name=name: old_check_targets(name, 6, scores.shape, target, ignore))
        assert got == want


@given(st.data())
def test_embedding_guard_raises_exactly_as_the_host_check(data):
    # Tensors hold int32 and int64 ids; the exporter's host check takes any integer array.
    dtype = data.draw(st.sampled_from([np.int64, np.int32, np.uint16, np.int8, np.uint64]))
    info = np.iinfo(dtype)
    values = st.integers(max(int(info.min), -9), min(int(info.max), 9))
    ids = np.array(data.draw(st.lists(values, max_size=7)), dtype=dtype)
    want = raised(lambda: old_check_ids("Embedding", ids, (5, 2)))
    assert raised(lambda: ta.ops.nn.check_ids("Embedding", ids, (5, 2))) == want
    if dtype in (np.int64, np.int32):
        weight = np.zeros((5, 2), np.float32)
        got = raised(lambda: Embedding.apply(Tensor(weight), Tensor(ids, dtype=dtype), padding_idx=None))
        assert got == want


@pytest.mark.parametrize("device", available_devices())
def test_guard_ids_calls_fail_only_on_a_bad_id_with_the_ids_on_the_host(device):
    kb = get_backend(device)
    seen = []
    cases = [(np.array([0, 4, 2]), 5, None, False), (np.array([0, 5, 2]), 5, None, True),
             (np.array([-1, 0]), 5, None, True), (np.array([-1, 0]), 5, -1, False),
             (np.array([[3, 7], [7, 1]], np.int32), 4, 7, False), (np.array([1, 9], np.int32), 4, None, True),
             (np.array([NO_IGNORE, 2]), 3, NO_IGNORE, False), (np.zeros(0, np.int64), 1, None, False)]
    for ids, rows, ignore, bad in cases:
        seen.clear()
        assert kb.guard_ids(kb.asarray(ids, ids.dtype), rows, ignore, seen.append) is None
        assert len(seen) == bad
        if bad:
            assert isinstance(seen[0], np.ndarray)
            np.testing.assert_array_equal(seen[0], ids)


# ---------------------------------------------------------------- dropout


@pytest.mark.parametrize("device", available_devices())
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1.0])
def test_dropout_draws_the_old_stream_bit_for_bit(device, dtype, p):
    rng = np.random.default_rng(11)
    x_np = rng.normal(size=(3, 4)).astype(dtype)
    dy = rng.normal(size=(3, 4)).astype(dtype)
    generator, old_generator = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(3):                               # successive draws keep following the stream
        x = Tensor(x_np, dtype=dtype, requires_grad=True, device=device)
        y = F.dropout(x, p, generator=generator)
        y.backward(dy)
        want_y, want_dx = old_dropout(x_np, old_generator, p, dy)
        assert_bitwise(y.numpy(), want_y)
        assert_bitwise(x.grad.numpy(), want_dx)
    assert generator.random() == old_generator.random()


def test_dropout_follows_the_engine_generator_as_before():
    x = Tensor(np.random.default_rng(2).normal(size=(5, 6)))
    ta.manual_seed(123)
    y = F.dropout(x, 0.3)
    ta.manual_seed(123)
    want, _ = old_dropout(x.numpy(), ta.random.generator(), 0.3, x.numpy())
    assert_bitwise(y.numpy(), want)


@pytest.mark.parametrize("device", available_devices())
def test_dropout_multiplier_is_the_reference_draw_on_every_device(device):
    kb = get_backend(device)
    got = kb.dropout_multiplier(np.random.default_rng(9), (4, 5), 0.25, np.float32)
    want = get_backend("numpy").dropout_multiplier(np.random.default_rng(9), (4, 5), 0.25, np.float32)
    assert_bitwise(np.asarray(kb.to_numpy(got)), want)
    assert set(np.unique(want)) == {np.float32(0.0), np.float32(4.0 / 3.0)}


def test_dropout_is_a_formula_op_of_the_input_and_its_multiplier():
    from tinygrad_attn.ops import Dropout, Elementwise

    assert issubclass(Dropout, Elementwise)
    assert Dropout.kernels[0] == "dropout" and "dropout_multiplier" not in Dropout.kernels
    report = ta.check.ops(["Dropout"])
    assert report.ok, "\n".join(report.failures)


# ---------------------------------------------------------------- nothing read on the host


class _Watching:
    """The numpy backend, counting the kernels read from it."""

    def __init__(self, backend):
        self._backend, self.used = backend, []

    def __getattr__(self, kernel):
        value = getattr(self._backend, kernel)
        if callable(value) and kernel in self._backend.kernel_names():
            self.used.append(kernel)
        return value


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_a_loss_step_reads_nothing_on_the_host(label_smoothing):
    """Every value flows through kernels: no ``to_numpy`` (a read) and no ``asarray`` (a host
    array entering) in the ops of an embedding, dropout and cross-entropy step."""
    numpy_backend = get_backend("numpy")
    watching = _Watching(numpy_backend)

    def tensor(array, requires_grad=False):
        return Tensor._make(numpy_backend.asarray(array, array.dtype), watching, requires_grad)

    rng = np.random.default_rng(4)
    weight = tensor(rng.normal(size=(7, 4)).astype(np.float32), requires_grad=True)
    ids = tensor(rng.integers(0, 7, size=(2, 3)))
    target = tensor(np.array([[1, 0, 2], [0, 0, 5]]))
    h = F.dropout(F.embedding(ids, weight), 0.2, generator=np.random.default_rng(0))
    loss = F.cross_entropy(h.reshape(2, 3, 4) @ weight.T, target, ignore_index=0,
                           label_smoothing=label_smoothing)
    loss.backward()
    assert "to_numpy" not in watching.used and "asarray" not in watching.used, watching.used
    for kernel in ("guard_ids", "count_ne", "clamp_divisor", "dropout_multiplier"):
        assert kernel in watching.used
