"""Checkpoints: ``ta.save(obj, path)`` and ``ta.load(path)``, as .npz files without pickle.

    ta.save({"config": config, "model": model, "optimizer": opt.state_dict(), "step": 1200},
            "run/ckpt.npz")
    checkpoint = ta.load("run/ckpt.npz")
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["optimizer"])

The file is an ordinary .npz archive (``np.load`` opens it): every array is one ``.npy``
entry, and the structure around them (dicts, lists, tuples, str, int, float, bool, None) is
JSON in one more entry, ``__tinygrad_attn__``, with a format name and version.  Nothing is
pickled, so loading a file runs no code from it.

What comes back:
    * arrays, Tensors and Parameters come back as numpy arrays (same dtype and shape);
      a numpy scalar (``np.float32(0.5)``) comes back as a 0-d array;
    * a Module is saved as its ``state_dict()``, so it comes back as a dict of arrays;
    * dicts (keys str, int, float, bool or None, in order), lists, tuples, str, int,
      float (NaN and infinities too), bool and None come back as they were.

Reading refuses what would exhaust memory rather than run out of it: a structure nested
deeper than ``MAX_DEPTH`` levels, an array whose header claims more values than its entry
holds, and an archive whose entries inflate to more than ``MAX_INFLATION`` times its own size
(beyond ``INFLATION_ALLOWANCE`` bytes): ``ta.save`` stores entries uncompressed, so only a
foreign or crafted file comes near these limits.

Writing is atomic: the archive goes to a temporary file next to ``path``, is flushed and
fsync'ed, and only then renamed over ``path``; on any error the temporary file is removed
and a file already at ``path`` is left untouched.  The file is written exactly at ``path``
(no ``.npz`` is appended, unlike ``np.savez``).  A symbolic link at ``path`` is written
through to its target (the link stays); a FIFO or a device is written in place.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import sys
import uuid
import zipfile

import numpy as np

from .nn.module import Module
from .tensor import Tensor

__all__ = ["FORMAT", "VERSION", "MAX_DEPTH", "MAX_INFLATION", "INFLATION_ALLOWANCE"]

FORMAT = "tinygrad_attn.checkpoint"
VERSION = 1
_STRUCTURE = "__tinygrad_attn__"      # the .npz entry holding the JSON structure
MAX_DEPTH = 200                        # nesting levels a loaded structure may have
MAX_INFLATION = 100                    # uncompressed entries / archive size, at most ...
INFLATION_ALLOWANCE = 64 << 20         # ... once the entries exceed this many bytes


class SerializationError(ValueError):
    """A file that ``ta.load`` cannot read: corrupt, truncated, not a tinygrad_attn
    checkpoint, or written by a newer version.  The message names the path."""


# ---------------------------------------------------------------- save


class _Writer:
    """Encodes a structure as JSON, writing each array into the archive as it is found."""

    def __init__(self, archive: zipfile.ZipFile):
        self.archive = archive
        self.count = 0
        self.open_containers: set[int] = set()   # ids on the current path, to catch cycles

    def write_array(self, name: str, array: np.ndarray) -> None:
        with self.archive.open(name + ".npy", "w", force_zip64=True) as entry:
            np.lib.format.write_array(entry, array, allow_pickle=False)

    def array(self, value, where: str) -> dict:
        array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
        if array.dtype.hasobject:
            raise TypeError(f"ta.save: {where} is an array of Python objects (dtype object); "
                            f"only numeric, bool and string arrays can be saved without pickle")
        name = f"a{self.count}"
        self.count += 1
        self.write_array(name, array)
        return {"array": name}

    def encode(self, value, where: str):
        if value is None or isinstance(value, (bool, str)):
            return value
        # Before int and float: np.float64 is a float and must still come back as an array.
        if isinstance(value, (np.ndarray, np.generic, Tensor)):
            return self.array(value, where)
        if isinstance(value, (int, float)):
            return int(value) if isinstance(value, int) else float(value)
        if isinstance(value, Module):
            value = value.state_dict()
        if not isinstance(value, (dict, list, tuple)):
            hint = (" (call its .state_dict() first)" if hasattr(value, "state_dict") else "")
            raise TypeError(f"ta.save: cannot save {where}, an object of type "
                            f"{type(value).__name__}{hint}; supported are Modules, arrays, "
                            f"Tensors, dicts, lists, tuples, str, int, float, bool and None")
        if id(value) in self.open_containers:
            raise ValueError(f"ta.save: {where} contains itself (a reference cycle)")
        self.open_containers.add(id(value))
        try:
            if isinstance(value, list):
                return [self.encode(item, f"{where}[{i}]") for i, item in enumerate(value)]
            if isinstance(value, tuple):
                return {"tuple": [self.encode(item, f"{where}[{i}]") for i, item in enumerate(value)]}
            return self.encode_dict(value, where)
        finally:
            self.open_containers.discard(id(value))

    def encode_dict(self, value: dict, where: str) -> dict:
        for key in value:
            if key is not None and not isinstance(key, (str, int, float)):
                raise TypeError(f"ta.save: {where} has a key of type {type(key).__name__} "
                                f"({key!r}); keys must be str, int, float, bool or None")
        if all(isinstance(key, str) for key in value):
            return {"dict": {key: self.encode(item, f"{where}[{key!r}]") for key, item in value.items()}}
        # JSON objects only have string keys: other keys go as [key, value] pairs.
        return {"items": [[key, self.encode(item, f"{where}[{key!r}]")] for key, item in value.items()]}


def save(obj, path) -> None:
    """Write ``obj`` to ``path`` as an .npz checkpoint, atomically (see the module docstring).

    Args:
        obj: a Module (its state_dict is saved), an array or Tensor, or nested dicts, lists
            and tuples of those and of str, int, float, bool and None.
        path: the file to write, exactly as given (no suffix is added); its directory must
            exist.  A symbolic link at ``path`` is written through (its target gets the new
            file, atomically; the link stays); a FIFO or another file that is not a regular
            file is written in place (see ``atomic_file``).

    Example:
        >>> ta.save({"model": model, "optimizer": opt.state_dict(), "step": 1200}, "ckpt.npz")
    """
    with atomic_file(path, "ta.save") as file:
        with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            writer = _Writer(archive)
            header = {"format": FORMAT, "version": VERSION, "root": writer.encode(obj, "obj")}
            text = json.dumps(header, allow_nan=True, separators=(",", ":"))
            # Written last: an archive cut short by an error never carries the marker.
            writer.write_array(_STRUCTURE, np.frombuffer(text.encode("utf-8"), dtype=np.uint8))


@contextlib.contextmanager
def atomic_file(path, where: str):
    """A binary file to write that appears at ``path`` only once complete: it is written
    beside ``path`` under a hidden temporary name, flushed and fsync'ed, then renamed over
    ``path``; on any error it is removed and a file already at ``path`` stays as it was.

    What ``path`` names decides how it is written:
        * a symbolic link is written through: the new file replaces the link's target
          (atomically, beside the target), and the link stays; a dangling link creates its
          target;
        * this process's standard output or error (``/dev/stdout``, ``/proc/self/fd/2``, or the
          file the shell redirected it to) is written through the stream, after what was
          printed to it;
        * a FIFO, a terminal or another file that is not a regular file is opened and written
          in place (nothing can be renamed over it; its reader sees the bytes as they come).

    Example:
        >>> with atomic_file("hyps.txt", "evaluate") as file:
        ...     file.write("".join(line + "\\n" for line in lines).encode("utf-8"))
    """
    path = os.fspath(path)
    if not path or path.endswith(os.sep) or os.path.isdir(path):
        raise IsADirectoryError(f"{where}: {path!r} names no file (a path to a file is needed)")
    try:
        status = os.stat(path)           # through links, as open() sees the file
    except FileNotFoundError:
        status = None                    # nothing there yet, or a dangling link
    if status is not None and (not stat.S_ISREG(status.st_mode) or _standard_stream(status) is not None):
        with _in_place(path, status) as file:
            yield file
        return
    # The link's target is the file to replace; the temporary file goes beside it so the rename
    # stays within one file system.
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        through = "" if target == os.path.abspath(path) else f" (the link leads to {target!r})"
        raise FileNotFoundError(f"{where}: cannot write {path!r}: the folder {directory!r} does not "
                                f"exist{through}")
    if status is not None and (not os.access(target, os.W_OK) or not status.st_mode & 0o222):
        # The rename would replace it all the same: a read-only file is kept, as open() would
        # (the mode bits too, which root's access() ignores).
        raise PermissionError(f"{where}: {path!r} is read-only; make it writable or write elsewhere")
    temporary = os.path.join(directory, f".{os.path.basename(target)}.{uuid.uuid4().hex[:12]}.tmp")
    # O_EXCL: never reuse a file someone else made.  0o600 while it is written; the final
    # mode (an old file's, else what open() would give) is set just before the rename.
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                             0o600)
    except PermissionError:
        raise PermissionError(f"{where}: cannot write {path!r}: its directory {directory!r} is not "
                              f"writable") from None
    try:
        try:
            file = os.fdopen(descriptor, "wb")
        except BaseException:
            os.close(descriptor)
            raise
        with file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        with contextlib.suppress(OSError):
            os.chmod(temporary, _final_mode(target))
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)


def _standard_stream(status: os.stat_result):
    """(stream, descriptor) of this process's standard output or error when ``status`` is
    the file behind it, else None."""
    for stream, number in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            if os.path.samestat(status, os.fstat(number)):
                return stream, number
        except OSError:              # no such descriptor (a daemon, some IDEs)
            continue
    return None


@contextlib.contextmanager
def _in_place(path: str, status: os.stat_result):
    """A file that is not to be replaced (a FIFO, a terminal, this process's standard output
    or error), opened for writing where it is."""
    standard = _standard_stream(status)
    if standard is not None:
        stream, number = standard
        # A duplicate of the descriptor shares its offset: the bytes follow what was printed,
        # and a file the shell redirected the stream to is written on, not replaced.
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.flush()
        with os.fdopen(os.dup(number), "wb") as file:
            yield file
        return
    with open(path, "wb") as file:
        yield file


def write_text(path, text: str, where: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, as ``atomic_file``."""
    with atomic_file(path, where) as file:
        file.write(text.encode("utf-8"))


def _final_mode(path: str) -> int:
    """An existing file's permission bits, else 0o666 less the umask (what open() gives)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0o022)       # reading the umask means setting it: put it straight back
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_directory(directory: str) -> None:
    """Make the rename itself durable; not possible on every platform (Windows), so best effort."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


# ---------------------------------------------------------------- load

# What numpy and zipfile raise on a damaged archive.
_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError, UnicodeDecodeError)
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")   # a zip with entries, an empty zip: as np.load
_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def load(path):
    """Read a checkpoint written by ``ta.save``.

    Args:
        path: the file to read.

    Returns:
        The saved structure; arrays, Tensors and Modules come back as numpy arrays and dicts
        of them (see the module docstring).

    Raises:
        FileNotFoundError: nothing is at ``path``.
        SerializationError: the file is corrupt or truncated, is not a tinygrad_attn
            checkpoint, or was written by a newer version.

    Example:
        >>> model.load_state_dict(ta.load("ckpt.npz")["model"])
    """
    path = os.fspath(path)
    with open(path, "rb") as file:
        magic = file.read(len(_NPY_MAGIC))
        file.seek(0)
        if magic.startswith(_NPY_MAGIC):
            raise SerializationError(f"ta.load: {path!r} is a single .npy array, not a "
                                     f"tinygrad_attn checkpoint; read it with np.load")
        if not magic.startswith(_ZIP_MAGIC):
            # Checked here: np.load would take any other bytes for a pickle and suggest
            # loading it unsafely.
            raise SerializationError(f"ta.load: {path!r} is not a tinygrad_attn checkpoint: "
                                     f"{'it is empty' if not magic else 'it is not an .npz archive'}"
                                     f" (it starts with {magic!r})")
        try:
            contents = np.load(file, allow_pickle=False)
        except _READ_ERRORS as exc:
            raise SerializationError(f"ta.load: {path!r} is a damaged .npz archive (corrupt or "
                                     f"truncated): {exc}") from exc
        with contents:
            _check_inflation(path, contents, os.fstat(file.fileno()).st_size)
            if _STRUCTURE not in contents.files:
                shown = ", ".join(contents.files[:5]) + (", ..." if len(contents.files) > 5 else "")
                raise SerializationError(f"ta.load: {path!r} is an .npz archive but not a "
                                         f"tinygrad_attn checkpoint (no {_STRUCTURE!r} entry; it "
                                         f"holds: {shown or 'nothing'}); read it with np.load")
            try:
                header = json.loads(_read_array(path, contents, _STRUCTURE, "the structure entry")
                                    .tobytes().decode("utf-8"))
            except RecursionError:
                raise SerializationError(f"ta.load: {path!r} has a structure nested more deeply "
                                         f"than Python can read") from None
            except _READ_ERRORS as exc:
                raise SerializationError(f"ta.load: {path!r} has a damaged structure entry: "
                                         f"{exc}") from exc
            _check_header(path, header)
            reader = _Reader(path, contents)
            return reader.decode(header["root"], "obj")


def _check_inflation(path: str, contents, size: int) -> None:
    """Refuse a zip bomb before inflating any of it."""
    inflated = sum(info.file_size for info in contents.zip.infolist())
    if inflated > INFLATION_ALLOWANCE and inflated > MAX_INFLATION * max(size, 1):
        raise SerializationError(f"ta.load: {path!r} ({size:,} bytes) would inflate to {inflated:,} bytes, "
                                 f"more than {MAX_INFLATION} times its size (ta.serialize.MAX_INFLATION); "
                                 f"refused")


def _read_array(path: str, contents, name: str, where: str) -> np.ndarray:
    """One array entry, after checking that its header claims no more values than the entry
    holds (a damaged header would otherwise ask for terabytes)."""
    info = contents.zip.getinfo(name + ".npy")
    with contents.zip.open(info) as member:
        try:
            version = np.lib.format.read_magic(member)
            read_header = _NPY_HEADERS.get(version)
            if read_header is None:
                raise ValueError(f".npy format version {version} is not one ta.save writes")
            shape, _, dtype = read_header(member)
        except _READ_ERRORS as exc:
            raise SerializationError(f"ta.load: {path!r} is damaged: {where} has a bad array header: "
                                     f"{exc}") from exc
        claimed = math.prod(shape) * dtype.itemsize
        held = info.file_size - member.tell()
    if claimed > held:
        raise SerializationError(f"ta.load: {path!r} is damaged: {where} claims shape {shape} of {dtype} "
                                 f"({claimed:,} bytes) but its entry holds {held:,} bytes")
    return contents[name]


def _check_header(path: str, header) -> None:
    if not isinstance(header, dict) or header.get("format") != FORMAT or "root" not in header:
        raise SerializationError(f"ta.load: {path!r} has a {_STRUCTURE!r} entry that is not a "
                                 f"{FORMAT} header")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SerializationError(f"ta.load: {path!r} has an invalid format version {version!r}")
    if version > VERSION:
        raise SerializationError(f"ta.load: {path!r} was written in format version {version} by "
                                 f"a newer tinygrad_attn; this one reads versions up to {VERSION}")


class _Reader:
    def __init__(self, path: str, contents):
        self.path = path
        self.contents = contents

    def malformed(self, where: str, node) -> SerializationError:
        shown = repr(node)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return SerializationError(f"ta.load: {self.path!r} is damaged: {where} is a malformed "
                                  f"node {shown}")

    def decode(self, node, where: str, depth: int = 0):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if depth > MAX_DEPTH:
            raise SerializationError(f"ta.load: {self.path!r} nests {where} more than {MAX_DEPTH} levels "
                                     f"deep (ta.serialize.MAX_DEPTH); refused")
        depth += 1
        if isinstance(node, list):
            return [self.decode(item, f"{where}[{i}]", depth) for i, item in enumerate(node)]
        if not isinstance(node, dict) or len(node) != 1:
            raise self.malformed(where, node)
        ((tag, body),) = node.items()
        if tag == "array" and isinstance(body, str):
            return self.array(body, where)
        if tag == "tuple" and isinstance(body, list):
            return tuple(self.decode(item, f"{where}[{i}]", depth) for i, item in enumerate(body))
        if tag == "dict" and isinstance(body, dict):
            return {key: self.decode(item, f"{where}[{key!r}]", depth) for key, item in body.items()}
        if tag == "items" and isinstance(body, list):
            decoded = {}
            for pair in body:
                if not isinstance(pair, list) or len(pair) != 2 or isinstance(pair[0], (list, dict)):
                    raise self.malformed(where, pair)
                decoded[pair[0]] = self.decode(pair[1], f"{where}[{pair[0]!r}]", depth)
            return decoded
        raise self.malformed(where, node)

    def array(self, name: str, where: str) -> np.ndarray:
        if name not in self.contents.files:
            raise SerializationError(f"ta.load: {self.path!r} is damaged: {where} refers to "
                                     f"the missing array entry {name!r}")
        try:
            return _read_array(self.path, self.contents, name, f"the array {where}")
        except _READ_ERRORS as exc:
            raise SerializationError(f"ta.load: {self.path!r} is damaged: the array {where} "
                                     f"cannot be read: {exc}") from exc
