"""ONNX export from the engine's own graph record: a model's encoder and one decoder step as
standard ONNX operators (opset 17), which onnxruntime runs and decodes with.

How it works: the exporter runs the model's own code on small example inputs with graph
recording on (the inputs are leaves that require grad, so every op records a node), walks the
recorded graph in topological order and writes each node as one ONNX node or a small
subgraph (``onnx_ops``, one lowering per engine op; ``onnx_graph`` writes the graph).  What
each file holds:

    Seq2Seq       onnx_seq2seq: the encoder's recurrence as ONNX Scans; a step's states are
                  the decoder's hidden (and cell) states
    Transformer   onnx_transformer: the encoder writes each decoder layer's cross-attention
                  keys and values; a step's states are the self-attention caches

The logits are what the engine's ``decode_step`` takes a float64 log-softmax of; ``OnnxModel``
does the same, and plugs the two onnxruntime sessions into ``ta.models.decoding``'s protocol,
so greedy decoding, sampling and beam search run unchanged on them.

Needs the optional extra: ``pip install 'tinygrad_attn[onnx]'`` (onnx, and onnxruntime to run).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..autograd import DTypeError, ShapeError, enable_grad
from ..data.vocab import END, PAD, START, UNK
from ..ops import Embedding
from ..ops.nn import check_ids
from ..serialize import atomic_file
from . import onnx_seq2seq, onnx_transformer
from .onnx_ops import OPSET, require

SPECIAL_IDS = {"pad": PAD, "start": START, "end": END, "unk": UNK}


@dataclass
class OnnxExport:
    """What ``ta.export.onnx`` wrote: the two files and the names of the decoder step's states
    (each is an input, and an output with ``_next`` appended)."""

    encoder_path: Path
    decoder_path: Path
    state_names: list[str]          # Seq2Seq: "h0" ("c0" for an LSTM) per layer; Transformer: past_key0 ...


# The files' stem when a folder is given: <folder>/model.encoder.onnx, <folder>/model.decoder.onnx.
FOLDER_STEM = "model"
_SEPARATORS = tuple(sep for sep in (os.sep, os.altsep) if sep)
_PRODUCER = b"tinygrad_attn"            # the producer_name every file written here carries


def _paths(path, where: str) -> tuple[Path, Path]:
    """The encoder's and the decoder's files for ``path``: beside it, ``<stem>.encoder.onnx``
    and ``<stem>.decoder.onnx``; inside it, stem ``model``, for a folder (one that exists, or
    a path ending with a separator)."""
    text = os.fspath(path)
    if not text:
        raise ValueError(f"{where}: path is empty; give a file name such as 'model.onnx', or a folder")
    path = Path(text)
    if text.endswith(_SEPARATORS) or path.is_dir():
        path = path / FOLDER_STEM
    stem = path.name[: -len(".onnx")] if path.name.endswith(".onnx") else path.name
    return path.with_name(f"{stem}.encoder.onnx"), path.with_name(f"{stem}.decoder.onnx")


def _check_replaceable(path: Path) -> None:
    """An export replaces only files it wrote: what else is at ``path`` (a user's file, a
    folder, a FIFO) is refused before anything is written."""
    if not os.path.lexists(path) or _written_here(path):
        return
    raise FileExistsError(f"ta.export.onnx: {str(path)!r} exists and is not an ONNX file written by "
                          f"tinygrad_attn; remove it or export to another path")


def _written_here(path: Path) -> bool:
    """Whether ``path`` is a regular file this exporter wrote, read from its first bytes:
    protobuf writes a ModelProto's fields in number order, ir_version (field 1, a varint)
    then producer_name (field 2, length-delimited), which ``make_model`` sets to "tinygrad_attn"."""
    if not (os.path.exists(path) and stat.S_ISREG(os.stat(path).st_mode)):
        return False
    with open(path, "rb") as file:
        head = file.read(64)
    if head[:1] != b"\x08":
        return False
    end = 1
    while end < len(head) and head[end] & 0x80:         # the varint's continuation bytes
        end += 1
    producer = bytes([0x12, len(_PRODUCER)]) + _PRODUCER
    return head[end + 1 : end + 1 + len(producer)] == producer


def onnx(model, path, opset: int = OPSET) -> OnnxExport:
    """Write ``model``'s encoder and one decoder step as two ONNX files (opset 17), checked
    by ``onnx.checker``: ``<stem>.encoder.onnx`` and ``<stem>.decoder.onnx`` next to ``path``
    (``"dates.onnx"`` -> ``dates.encoder.onnx``, ``dates.decoder.onnx``), or inside it,
    ``model.encoder.onnx`` and ``model.decoder.onnx``, when ``path`` is a folder (one that
    exists, or a path ending with a separator, made if missing).

    Each file is written atomically (a temporary file renamed over the target), and both are
    complete before either is renamed: an export that fails while tracing or writing leaves
    what was there.  An existing file is replaced only if an export wrote it; anything else at
    a target (a user's file, a folder, a FIFO) raises FileExistsError before any work.

    Args:
        model: a ``ta.models.Seq2Seq`` (any cell, attention and style) or a
            ``ta.models.Transformer`` (any option, zero layers included); exported as in
            eval mode.
        path: where the files go, as above.

    Returns:
        an ``OnnxExport`` (the paths and the step's state names); ``OnnxModel(export)``
        decodes with onnxruntime.

    Raises:
        UnsupportedOpError: naming an op of the model with no ONNX mapping.
        DTypeError: the model is not float32 (``model.astype(np.float32)`` first).
        FileExistsError: a target holds something an export did not write.
        ImportError: onnx is not installed (``pip install 'tinygrad_attn[onnx]'``).

    Example:
        >>> files = ta.export.onnx(model, "dates.onnx")
        >>> ids, weights = ta.export.OnnxModel(files).greedy(src, max_len=12)
    """
    from ..models.seq2seq import Seq2Seq
    from ..models.transformer import Transformer

    require()
    if opset != OPSET:
        raise ValueError(f"ta.export.onnx: only opset {OPSET} is written, got {opset}")
    if isinstance(model, Seq2Seq):
        family, writer, states = "seq2seq", onnx_seq2seq, onnx_seq2seq.state_names(model)
    elif isinstance(model, Transformer):
        family, writer, states = "transformer", onnx_transformer, onnx_transformer.state_names(model)
    else:
        raise TypeError(f"ta.export.onnx: exports a ta.models.Seq2Seq or ta.models.Transformer; got "
                        f"{type(model).__name__}")
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    if dtypes != ["float32"]:
        raise DTypeError(f"ta.export.onnx: writes float32 models (the graphs' inputs and outputs are "
                         f"float32); this one has {', '.join(dtypes)} parameters: export "
                         f"model.astype(np.float32)")
    encoder_path, decoder_path = _paths(path, "ta.export.onnx")
    for target in (encoder_path, decoder_path):
        _check_replaceable(target)
    param_names = {id(p): name for name, p in model.named_parameters()}
    metadata = {"tinygrad_attn.model": family, "tinygrad_attn.config": json.dumps(model.config),
                "tinygrad_attn.special_ids": json.dumps(SPECIAL_IDS),
                "tinygrad_attn.states": json.dumps(states)}
    was_training = model.training
    model.eval()
    try:
        with enable_grad():
            encoder = writer.encoder_model(model, param_names, metadata)
            decoder = writer.decoder_model(model, param_names, metadata)
    finally:
        model.train(was_training)
    encoder_bytes, decoder_bytes = encoder.SerializeToString(), decoder.SerializeToString()
    encoder_path.parent.mkdir(parents=True, exist_ok=True)
    # Both files are complete before either is renamed over its target (the decoder's first):
    # a failure while writing replaces neither.
    with atomic_file(encoder_path, "ta.export.onnx") as encoder_file, \
            atomic_file(decoder_path, "ta.export.onnx") as decoder_file:
        encoder_file.write(encoder_bytes)
        decoder_file.write(decoder_bytes)
    return OnnxExport(encoder_path, decoder_path, states)



# ---------------------------------------------------------------- decoding with onnxruntime


@dataclass
class _OrtDecoding:
    """A decode of N rows on onnxruntime: what the step reads of the source (the memory:
    keys, src_mask ...), the step's states by name, which source each row decodes, and the
    source's width (the attention's; a source of width 0 runs as one padding column)."""

    memory: dict
    states: dict
    source: np.ndarray
    width: int


class OnnxModel:
    """An exported model's encoder and decoder step as two onnxruntime sessions, decoding
    through ``ta.models.decoding``'s protocol (decode_start / decode_step / decode_select):
    greedy, sampling and beam search are the engine's own code, run on onnxruntime's numbers.
    One class for both families: the files name the step's states and memory.

    Sources get the engine's own checks, with its errors, before onnxruntime sees them (its
    Gather would wrap a negative id silently): an integer (B, S) array of ids in [0, vocab).
    Where onnxruntime cannot run (no rows, a source of width 0) the engine's result comes back
    all the same; a Transformer's position table bounds sources and decodes as the engine's
    (``max_src_len``, ``max_tgt_len``).

    Args:
        exported: what ``ta.export.onnx`` returned, or the ``path`` given to it (a folder
            opens its ``model.encoder.onnx`` and ``model.decoder.onnx``).
        threads: onnxruntime's intra-op threads (0: its default).
        providers: onnxruntime execution providers (default CPU).

    Example:
        >>> ort_model = ta.export.OnnxModel(ta.export.onnx(model, "dates.onnx"))
        >>> ids, weights = ort_model.greedy(src, max_len=12)
        >>> ids, weights = ort_model.beam_search(src, beam=5, max_len=12)
    """

    def __init__(self, exported, threads: int = 0, providers=None):
        ort = require("onnxruntime")
        if isinstance(exported, OnnxExport):
            encoder_path, decoder_path = exported.encoder_path, exported.decoder_path
        else:
            encoder_path, decoder_path = _paths(exported, "OnnxModel")
        for path in (encoder_path, decoder_path):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"OnnxModel: no file {str(path)!r} (what ta.export.onnx writes for "
                                        f"{os.fspath(exported)!r})")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        providers = providers or ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(encoder_path), options, providers=providers)
        self.decoder = ort.InferenceSession(str(decoder_path), options, providers=providers)
        meta = self.decoder.get_modelmeta().custom_metadata_map
        self.family = meta["tinygrad_attn.model"]
        self.config = json.loads(meta["tinygrad_attn.config"])
        self.state_names = json.loads(meta["tinygrad_attn.states"])
        self.step_inputs = {i.name: i.shape for i in self.decoder.get_inputs()}
        self.step_input_types = {i.name: _ORT_TYPES[i.type] for i in self.decoder.get_inputs()}
        self.step_outputs = [o.name for o in self.decoder.get_outputs()]
        self.encoder_outputs = [o.name for o in self.encoder.get_outputs()]
        # Each encoder output's source axis, to give a source of width 0 outputs of width 0.
        self._source_axes = {o.name: o.shape.index("S") for o in self.encoder.get_outputs() if "S" in o.shape}
        transformer = self.family == "transformer"
        # The checks' and messages' subject, and the source embedding's shape, as the engine's.
        self._engine_name = "Transformer" if transformer else "Seq2Seq"
        self._src_table_shape = (self.config["src_vocab"], self.config["d_model" if transformer else "embed"])
        # What ta.models.decoding reads of a model: the position table bounds sources and decodes.
        self.max_src_len = self.max_tgt_len = self.config["max_len"] if transformer else None

    def _ids(self, src) -> np.ndarray:
        """The models' own check of a source (an integer (B, S) array), with their message."""
        from ..models.seq2seq import ids_array

        return ids_array(src, "src", self._engine_name, empty=True)

    def _checked(self, src) -> np.ndarray:
        """``src`` as int64 ids after every check the engine makes before encoding: the
        models', then the source Embedding op's (ids in [0, vocab))."""
        src = self._ids(src)
        check_ids(Embedding.__name__, src, self._src_table_shape)
        limit = self.max_src_len
        if limit is not None and src.shape[1] > limit:
            raise ShapeError(f"OnnxModel: a source of {src.shape[1]} tokens is longer than the position "
                             f"table (max_len={limit})")
        return src

    def _encoded(self, src: np.ndarray) -> tuple[np.ndarray, dict]:
        """The source run (width 0 as one padding column, which every row masks, as the
        engine's Seq2Seq encodes it: onnxruntime cannot take width 0) and its encoder outputs."""
        if src.shape[1] == 0:
            src = np.zeros((src.shape[0], 1), dtype=np.int64)
        return src, dict(zip(self.encoder_outputs, _run(self.encoder, {"src": src}), strict=True))

    def encode(self, src) -> dict:
        """The encoder's outputs by name (Seq2Seq: keys, keys_proj, h0 ...; Transformer:
        memory_key0, memory_value0 ..., or memory without decoder layers)."""
        src = self._checked(src)
        _, found = self._encoded(src)
        if src.shape[1] == 0:
            found = {name: np.take(value, [], axis=self._source_axes[name]) if name in self._source_axes
                     else value for name, value in found.items()}
        return found

    def decode_start(self, src: np.ndarray) -> _OrtDecoding:
        src = self._checked(src)
        run, found = self._encoded(src)
        memory = {name: value for name, value in found.items() if name in self.step_inputs
                  and name not in self.state_names}
        if "src_mask" in self.step_inputs:
            memory["src_mask"] = run != PAD
        # A state the encoder does not give starts empty: a Transformer's caches, 0 tokens long.
        states = {name: found[name] if name in found else self._empty(name, len(src))
                  for name in self.state_names}
        return _OrtDecoding(memory, states, np.arange(src.shape[0]), src.shape[1])

    def _empty(self, name: str, rows: int) -> np.ndarray:
        shape = [rows if axis == "N" else 0 if isinstance(axis, str) else axis
                 for axis in self.step_inputs[name]]
        return np.zeros(shape, dtype=self.step_input_types[name])

    def decode_step(self, state: _OrtDecoding, tokens: np.ndarray, t: int):
        from ..models import decoding

        limit = self.max_tgt_len
        if limit is not None and t >= limit:
            raise ShapeError(f"OnnxModel: step {t} is beyond the position table (max_len={limit})")
        feed = {"tokens": np.asarray(tokens, dtype=np.int64), **state.memory, **state.states}
        found = dict(zip(self.step_outputs, _run(self.decoder, feed), strict=True))
        log_probs = decoding.log_softmax(found["logits"])                          # (N, V) float64
        attention = found.get("attention")
        if attention is not None:
            attention = attention[:, : state.width]                                # (N, S)
        states = {name: found[f"{name}_next"] for name in self.state_names}
        return log_probs, attention, _OrtDecoding(state.memory, states, state.source, state.width)

    def decode_select(self, state: _OrtDecoding, rows: np.ndarray) -> _OrtDecoding:
        source = state.source[rows]
        same = np.array_equal(source, state.source)
        memory = state.memory if same else {name: array[rows] for name, array in state.memory.items()}
        states = {name: array[rows] for name, array in state.states.items()}
        return _OrtDecoding(memory, states, source, state.width)

    def greedy(self, src, max_len=50, **options):
        """``ta.models.decoding.greedy`` on the sessions; returns what the model's ``greedy`` does."""
        from ..models import decoding

        return decoding.greedy(self, self._ids(src), max_len, **options)

    def beam_search(self, src, beam: int = 5, max_len=50, **options):
        """``ta.models.decoding.beam_search`` on the sessions; as the model's ``beam_search``."""
        from ..models import decoding

        return decoding.beam_search(self, self._ids(src), beam, max_len, **options)


_ORT_TYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_}


def _run(session, feed: dict) -> list:
    """``session.run`` on every output, also for no rows, which onnxruntime's kernels cannot
    take (some divide by the batch size): one row of zeros goes in and no row comes out.
    Every input and output of the exported graphs has the rows first."""
    if next(iter(feed.values())).shape[0]:
        return session.run(None, feed)
    one_row = {name: np.zeros((1,) + array.shape[1:], dtype=array.dtype) for name, array in feed.items()}
    return [output[:0] for output in session.run(None, one_row)]
