"""ta.save / ta.load: round trips of checkpoints, dtypes, atomic writes, and the errors for
missing, corrupt, truncated, foreign and future files."""

from __future__ import annotations

import math
import os
import zipfile

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import Tensor, nn, optim, serialize


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 3)
        self.outer = nn.Linear(3, 2)

    def forward(self, x):
        return self.outer(self.inner(x).tanh())


def assert_same(loaded, expected):
    """Equal structure, types (tuples stay tuples), dtypes and values; NaN equals NaN."""
    if isinstance(expected, (np.ndarray, np.generic, Tensor)):
        expected = np.asarray(expected.numpy() if isinstance(expected, Tensor) else expected)
        assert isinstance(loaded, np.ndarray)
        assert loaded.dtype == expected.dtype and loaded.shape == expected.shape
        np.testing.assert_array_equal(loaded, expected)
        return
    assert type(loaded) is type(expected), (loaded, expected)
    if isinstance(expected, dict):
        assert list(loaded) == list(expected)
        for key in expected:
            assert_same(loaded[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(loaded) == len(expected)
        for a, b in zip(loaded, expected, strict=True):
            assert_same(a, b)
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(loaded)
    else:
        assert loaded == expected


def leftovers(directory, keep):
    return sorted(set(os.listdir(directory)) - set(keep))


# ---------------------------------------------------------------- round trips


def test_training_checkpoint_round_trips(tmp_path):
    ta.manual_seed(0)
    model = TwoLayer()
    opt = optim.Adam(model.parameters(), lr=3e-4)
    model(Tensor(np.ones((2, 4)))).sum().backward()
    opt.step()
    checkpoint = {
        "config": {"embed": 64, "hidden": 128, "cell": "gru", "attention": None,
                   "dropout": 0.1, "bidirectional": False, "betas": (0.9, 0.98)},
        "model": model,
        "optimizer": opt.state_dict(),
        "src_vocab": {"<pad>": 0, "<start>": 1, "<end>": 2, "<unk>": 3, "héllo wörld ✓": 4},
        "step": 1200,
        "losses": [2.5, 1.25, float("nan"), float("inf"), -float("inf")],
        "big": 2**70,
    }
    path = tmp_path / "ckpt.npz"
    ta.save(checkpoint, path)
    loaded = ta.load(path)

    expected = dict(checkpoint, model=model.state_dict())
    assert_same(loaded, expected)
    fresh = TwoLayer()
    fresh.load_state_dict(loaded["model"])
    for (name, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    resumed = optim.Adam(fresh.parameters())
    resumed.load_state_dict(loaded["optimizer"])
    assert resumed.lr == 3e-4 and resumed.state[0]["step"] == 1


def test_module_saves_its_state_dict(tmp_path):
    model = TwoLayer()
    ta.save(model, tmp_path / "model")
    loaded = ta.load(tmp_path / "model")
    assert list(loaded) == ["inner.weight", "inner.bias", "outer.weight", "outer.bias"]
    other = TwoLayer()
    other.load_state_dict(loaded)
    x = Tensor(np.arange(8.0).reshape(2, 4))
    np.testing.assert_array_equal(other(x).numpy(), model(x).numpy())


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "bool", "uint8",
                                   "float16", "<U5"])
def test_array_dtypes_shapes_and_values_are_kept(dtype, tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "matrix": (rng.standard_normal((3, 4)) * 50).astype(dtype),
        "scalar": np.array(7).astype(dtype),
        "empty": np.zeros((0, 3), dtype=dtype),
        "transposed": (rng.standard_normal((2, 5)) * 50).astype(dtype).T,   # not C-contiguous
    }
    ta.save(arrays, tmp_path / "arrays")
    assert_same(ta.load(tmp_path / "arrays"), arrays)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool"])
def test_tensors_and_parameters_come_back_as_arrays(dtype, tmp_path):
    values = np.arange(-3, 3).reshape(2, 3).astype(dtype)
    obj = {"tensor": Tensor(values, dtype=dtype), "plain": values}
    if dtype.startswith("float"):
        obj["parameter"] = nn.Parameter(values, dtype=dtype)
    ta.save(obj, tmp_path / "t")
    loaded = ta.load(tmp_path / "t")
    for value in loaded.values():
        assert type(value) is np.ndarray and value.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(value, values)


def test_plain_values_and_containers_round_trip(tmp_path):
    obj = [
        None, True, False, 0, -5, 3.25, "", "text",
        [], (), {}, [[1, [2, (3,)]]], (None, "a", (1.5,)),
        {1: "one", 2.5: "two and a half", None: "none", False: "no", "s": "str"},
        {"nested": {"deeper": {"array": np.eye(2)}}},
        np.float32(0.5),
    ]
    ta.save(obj, tmp_path / "plain")
    loaded = ta.load(tmp_path / "plain")
    assert_same(loaded[:-1], obj[:-1])
    # A numpy scalar comes back as a 0-d array of its dtype.
    assert loaded[-1].shape == () and loaded[-1].dtype == np.float32 and loaded[-1] == 0.5


def test_a_bare_array_round_trips(tmp_path):
    array = np.arange(6, dtype=np.int64).reshape(3, 2)
    ta.save(array, tmp_path / "bare")
    assert_same(ta.load(tmp_path / "bare"), array)


def test_path_is_used_exactly_without_adding_npz(tmp_path):
    ta.save({"x": np.ones(2)}, tmp_path / "checkpoint")
    ta.save({"x": np.ones(2)}, str(tmp_path / "other.ckpt"))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "other.ckpt"]
    # The file is a plain .npz that numpy reads without pickle.
    with np.load(tmp_path / "checkpoint", allow_pickle=False) as contents:
        assert serialize._STRUCTURE in contents.files
        np.testing.assert_array_equal(contents["a0"], np.ones(2))


def test_saving_overwrites_an_existing_checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    ta.save({"step": 1}, path)
    ta.save({"step": 2}, path)
    assert ta.load(path) == {"step": 2}
    assert os.listdir(tmp_path) == ["ckpt"]


# ---------------------------------------------------------------- atomic writes


def test_failure_after_some_arrays_leaves_the_old_file_untouched(tmp_path):
    path = tmp_path / "ckpt.npz"
    ta.save({"step": 1, "w": np.ones(3)}, path)
    before = path.read_bytes()
    calls = []
    original = serialize._Writer.write_array

    def counting(self, name, array):
        calls.append(name)
        original(self, name, array)

    bad = {"a": np.zeros((100, 100)), "b": np.ones(7), "c": {1, 2, 3}}   # a set: found last
    serialize._Writer.write_array = counting
    try:
        with pytest.raises(TypeError, match=r"cannot save obj\['c'\], an object of type set"):
            ta.save(bad, path)
    finally:
        serialize._Writer.write_array = original
    assert calls == ["a0", "a1"]            # the failure came midway, after two arrays
    assert path.read_bytes() == before
    assert leftovers(tmp_path, ["ckpt.npz"]) == []
    assert_same(ta.load(path), {"step": 1, "w": np.ones(3)})


def test_failure_while_writing_an_array_removes_the_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    ta.save({"old": True}, path)
    before = path.read_bytes()
    original = np.lib.format.write_array
    written = []

    def disk_full(file, array, **kwargs):
        if written:
            raise OSError(28, "No space left on device")
        written.append(array)
        original(file, array, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", disk_full)
    with pytest.raises(OSError, match="No space left"):
        ta.save({"a": np.ones(5), "b": np.ones(5)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert leftovers(tmp_path, ["ckpt"]) == []


def test_failure_at_the_rename_removes_the_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", dst)

    monkeypatch.setattr(serialize.os, "replace", refuse)
    with pytest.raises(PermissionError):
        ta.save({"x": np.ones(2)}, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_interrupt_during_save_leaves_no_file(tmp_path, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(serialize.os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        ta.save({"x": np.ones(2)}, tmp_path / "ckpt")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- links and special files


needs_posix = pytest.mark.skipif(os.name != "posix", reason="symbolic links and FIFOs as on POSIX")


@needs_posix
def test_save_through_a_link_writes_its_target_atomically_and_keeps_the_link(tmp_path):
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "real.ckpt"
    ta.save({"step": 1}, target)
    os.chmod(target, 0o640)
    link = tmp_path / "latest.ckpt"
    link.symlink_to(os.path.join("runs", "real.ckpt"))          # relative, as ln -s makes them
    ta.save({"step": 2}, link)
    assert link.is_symlink() and os.readlink(link) == os.path.join("runs", "real.ckpt")
    assert ta.load(target) == {"step": 2}
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o640)
    assert sorted(os.listdir(tmp_path / "runs")) == ["real.ckpt"] and sorted(os.listdir(tmp_path)) == [
        "latest.ckpt", "runs"]


@needs_posix
def test_save_through_a_dangling_link_creates_its_target(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "new.ckpt")
    ta.save({"x": np.ones(2)}, link)
    assert link.is_symlink()
    np.testing.assert_array_equal(ta.load(tmp_path / "new.ckpt")["x"], np.ones(2))


@needs_posix
def test_a_read_only_target_behind_a_link_is_kept(tmp_path):
    target = tmp_path / "kept.ckpt"
    ta.save({"step": 1}, target)
    os.chmod(target, 0o444)
    link = tmp_path / "link.ckpt"
    link.symlink_to(target)
    with pytest.raises(PermissionError, match="read-only"):
        ta.save({"step": 2}, link)
    assert ta.load(target) == {"step": 1} and link.is_symlink()


def through_a_fifo(fifo, write) -> bytes:
    """What a reader of the FIFO ``fifo`` receives while ``write(fifo)`` runs."""
    import threading

    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write(fifo)
    reader.join(timeout=30)
    if reader.is_alive():                  # unblock the reader of a write that never came
        with open(fifo, "wb"):
            pass
    return received[0] if received else b""


@needs_posix
def test_write_text_to_a_fifo_feeds_its_reader_and_leaves_the_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    received = through_a_fifo(fifo, lambda path: serialize.write_text(path, "one\ntwo\n", "test"))
    assert received == b"one\ntwo\n" and fifo.is_fifo()
    assert os.listdir(tmp_path) == ["pipe"]


@needs_posix
def test_a_checkpoint_streamed_through_a_fifo_loads_back(tmp_path):
    state = {"w": np.arange(6.0).reshape(2, 3), "step": 3}
    (tmp_path / "copy.ckpt").write_bytes(through_a_fifo(tmp_path / "pipe", lambda path: ta.save(state, path)))
    assert_same(ta.load(tmp_path / "copy.ckpt"), state)


# ---------------------------------------------------------------- errors while saving


@pytest.mark.parametrize("obj, error, message", [
    ({"f": print}, TypeError, r"cannot save obj\['f'\], an object of type builtin_function"),
    ([1, b"bytes"], TypeError, r"cannot save obj\[1\], an object of type bytes"),
    ({"o": np.array([None, 1])}, TypeError, r"obj\['o'\] is an array of Python objects"),
    ({(1, 2): 3}, TypeError, r"obj has a key of type tuple"),
    ({"opt": optim.SGD([nn.Parameter(np.ones(1))], lr=0.1)}, TypeError,
     r"type SGD \(call its .state_dict\(\) first\)"),
], ids=["function", "bytes", "object-array", "tuple-key", "optimizer"])
def test_unsupported_objects_are_named_with_their_place(obj, error, message, tmp_path):
    with pytest.raises(error, match=message):
        ta.save(obj, tmp_path / "x")
    assert os.listdir(tmp_path) == []


def test_a_reference_cycle_is_refused(tmp_path):
    loop = {"name": "loop"}
    loop["self"] = [loop]
    with pytest.raises(ValueError, match=r"obj\['self'\]\[0\] contains itself"):
        ta.save(loop, tmp_path / "x")


def test_shared_values_are_not_cycles(tmp_path):
    shared = [1, 2]
    ta.save({"a": shared, "b": shared}, tmp_path / "x")
    assert ta.load(tmp_path / "x") == {"a": [1, 2], "b": [1, 2]}


def test_saving_into_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ta.save({}, tmp_path / "missing" / "ckpt")


# ---------------------------------------------------------------- errors while loading


def test_load_of_a_missing_file():
    with pytest.raises(FileNotFoundError):
        ta.load("/nonexistent/dir/ckpt.npz")


def test_serialization_error_is_a_value_error():
    assert issubclass(ta.SerializationError, ValueError)
    assert ta.SerializationError is serialize.SerializationError


def make_checkpoint(tmp_path) -> bytes:
    path = tmp_path / "good"
    ta.save({"w": np.arange(500.0), "step": 3}, path)
    return path.read_bytes()


@pytest.mark.parametrize("damage, message", [
    (lambda good: good[: len(good) // 2], "damaged .npz archive"),
    (lambda good: good[:-10], "damaged .npz archive"),
    (lambda good: os.urandom(300), "not an .npz archive"),
    (lambda good: b"", "it is empty"),
    (lambda good: good[:200] + bytes([good[200] ^ 0xFF]) + good[201:], "damaged"),
], ids=["half", "tail-cut", "random-bytes", "empty", "flipped-byte"])
def test_corrupt_files_raise_serialization_error_naming_the_path(damage, message, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(damage(make_checkpoint(tmp_path)))
    with pytest.raises(ta.SerializationError, match=message) as caught:
        ta.load(bad)
    assert str(bad) in str(caught.value)
    assert "allow_pickle" not in str(caught.value)


def test_a_foreign_npz_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "weights.npz"
    np.savez(path, weight=np.ones(3), bias=np.zeros(3))
    with pytest.raises(ta.SerializationError,
                       match=r"an .npz archive but not a tinygrad_attn checkpoint.*holds: "):
        ta.load(path)


def test_a_npy_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "array.npy"
    np.save(path, np.ones(3))
    with pytest.raises(ta.SerializationError, match="a single .npy array"):
        ta.load(path)


def test_a_future_version_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(serialize, "VERSION", serialize.VERSION + 1)
    ta.save({"x": 1}, tmp_path / "future")
    monkeypatch.undo()
    with pytest.raises(ta.SerializationError,
                       match=r"format version 2 by a newer tinygrad_attn; this one reads versions up to 1"):
        ta.load(tmp_path / "future")


def write_structure(path, text: str, arrays=()):
    with zipfile.ZipFile(path, "w") as archive:
        for name in arrays:
            with archive.open(name + ".npy", "w") as entry:
                np.lib.format.write_array(entry, np.ones(2))
        with archive.open(serialize._STRUCTURE + ".npy", "w") as entry:
            np.lib.format.write_array(entry, np.frombuffer(text.encode(), dtype=np.uint8))


HEADER = '{"format": "tinygrad_attn.checkpoint", "version": '


@pytest.mark.parametrize("text, message", [
    ('{"format": "something.else", "version": 1, "root": null}',
     "is not a tinygrad_attn.checkpoint header"),
    (HEADER + '"one", "root": null}', "invalid format version 'one'"),
    (HEADER + '1, "root": {"array": "a7"}}', "missing array entry 'a7'"),
    (HEADER + '1, "root": [{"what": 1}]}', r"obj\[0\] is a malformed node"),
    (HEADER + '1, "ro', "damaged structure entry"),
], ids=["format", "version-type", "missing-array", "malformed-node", "bad-json"])
def test_damaged_structures_are_reported(text, message, tmp_path):
    path = tmp_path / "ckpt"
    write_structure(path, text)
    with pytest.raises(ta.SerializationError, match=message):
        ta.load(path)


def test_save_and_load_are_exported():
    assert ta.save is serialize.save and ta.load is serialize.load
    assert {"save", "load", "SerializationError", "optim"} <= set(ta.__all__)


def test_numpy_scalars_of_every_kind_come_back_as_0d_arrays(tmp_path):
    path = tmp_path / "scalars.npz"
    ta.save({"f64": np.float64(0.25), "f32": np.float32(0.5), "i64": np.int64(3), "b": np.bool_(True)}, path)
    back = ta.load(path)
    for key, dtype in (("f64", np.float64), ("f32", np.float32), ("i64", np.int64), ("b", np.bool_)):
        assert isinstance(back[key], np.ndarray) and back[key].shape == () and back[key].dtype == dtype


def test_new_files_get_the_umask_mode_and_old_files_keep_theirs(tmp_path):
    import os
    import stat

    fresh = tmp_path / "fresh.npz"
    ta.save({"x": 1}, fresh)
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o666 & ~umask
    private = tmp_path / "private.npz"
    ta.save({"x": 1}, private)
    os.chmod(private, 0o600)
    ta.save({"x": 2}, private)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600


# ---------------------------------------------------------------- files that would exhaust memory


def write_archive(path, entries: dict, compression=zipfile.ZIP_STORED) -> None:
    """An .npz written by hand: ``entries`` maps entry names to raw .npy bytes."""
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in entries.items():
            archive.writestr(name + ".npy", data)


def npy_bytes(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def structure(root, text: str | None = None) -> bytes:
    """The structure entry of a checkpoint whose root is ``root`` (or the JSON ``text``)."""
    import json

    text = json.dumps(root) if text is None else text
    header = f'{{"format": "{serialize.FORMAT}", "version": {serialize.VERSION}, "root": {text}}}'
    return npy_bytes(np.frombuffer(header.encode(), dtype=np.uint8))


@pytest.mark.parametrize("depth", [serialize.MAX_DEPTH + 5, 3000])       # json itself fails at 3000
def test_load_refuses_a_structure_nested_too_deeply(depth, tmp_path):
    path = tmp_path / "deep.ckpt"
    write_archive(path, {"__tinygrad_attn__": structure(None, "[" * depth + '"leaf"' + "]" * depth)})
    with pytest.raises(ta.SerializationError, match="nest|nested more deeply"):
        ta.load(path)


def test_load_refuses_an_array_header_claiming_more_than_its_entry_holds(tmp_path):
    path = tmp_path / "claims.ckpt"
    honest = npy_bytes(np.zeros(4, dtype=np.float64))
    lying = honest.replace(b"(4,)", b"(10000000000000,)".ljust(len(b"(4,)")))     # 10^13 values
    assert b"10000000000000" in lying
    write_archive(path, {"__tinygrad_attn__": structure({"array": "a"}), "a": lying})
    assert path.stat().st_size < 1000
    with pytest.raises(ta.SerializationError, match=r"claims shape \(10000000000000,\) of float64"):
        ta.load(path)


def test_load_refuses_a_zip_bomb_before_inflating_it(tmp_path):
    path = tmp_path / "bomb.ckpt"
    zeros = npy_bytes(np.zeros(serialize.INFLATION_ALLOWANCE // 8 + 1024, dtype=np.float64))
    write_archive(path, {"__tinygrad_attn__": structure({"array": "a"}), "a": zeros},
                  compression=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size * serialize.MAX_INFLATION < len(zeros)
    with pytest.raises(ta.SerializationError, match="would inflate to .* refused"):
        ta.load(path)


def test_a_deep_copied_model_trains_beside_its_original():
    """copy.deepcopy(model) (an averaged or EMA copy, a twin per thread) keeps its weights on
    the process's one device: the copy mixes with fresh tensors and with the original's, and
    owns its arrays.  Before, the copy's weights sat on a copied device object and every op
    with a fresh input failed with "inputs are on different devices (cpu, cpu)"."""
    import copy

    ta.manual_seed(0)
    model = TwoLayer()
    twin = copy.deepcopy(model)
    x = Tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    np.testing.assert_array_equal(twin(x).numpy(), model(x).numpy())
    assert twin.inner.weight.device == "cpu" and (twin.inner.weight + model.inner.weight).shape == (3, 4)
    opt = optim.SGD(twin.parameters(), lr=0.1)
    twin(x).sum().backward()
    opt.step()
    assert not np.array_equal(twin.inner.weight.numpy(), model.inner.weight.numpy())


def test_a_pickled_tensor_comes_back_on_its_device():
    import pickle

    for device in ("cpu", "numpy"):
        t = Tensor(np.arange(6.0).reshape(2, 3), device=device)
        back = pickle.loads(pickle.dumps(t))
        assert back.device == device
        np.testing.assert_array_equal((back + t).numpy(), 2 * t.numpy())
