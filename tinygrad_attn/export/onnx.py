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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..autograd import DTypeError, ShapeError, enable_grad
from ..data.vocab import END, PAD, START, UNK
from . import onnx_seq2seq, onnx_transformer
from .onnx_graph import graph_to_onnx
from .onnx_ops import OPSET, UnsupportedOpError, _require, supported_ops

__all__ = ["export_onnx", "onnx", "graph_to_onnx", "OnnxModel", "OnnxExport", "UnsupportedOpError",
           "OPSET", "supported_ops"]

SPECIAL_IDS = {"pad": PAD, "start": START, "end": END, "unk": UNK}


@dataclass
class OnnxExport:
    """What ``export_onnx`` wrote: the two files and the names of the decoder step's states
    (each is an input, and an output with ``_next`` appended)."""

    encoder_path: Path
    decoder_path: Path
    state_names: list[str]          # Seq2Seq: "h0" ("c0" for an LSTM) per layer; Transformer: past_key0 ...


def _paths(path) -> tuple[Path, Path]:
    path = Path(path)
    stem = path.name[: -len(".onnx")] if path.name.endswith(".onnx") else path.name
    return path.with_name(f"{stem}.encoder.onnx"), path.with_name(f"{stem}.decoder.onnx")


def export_onnx(model, path, opset: int = OPSET) -> OnnxExport:
    """Write ``model``'s encoder and one decoder step as two ONNX files (opset 17), checked
    by ``onnx.checker``: ``<stem>.encoder.onnx`` and ``<stem>.decoder.onnx`` next to ``path``
    (``"dates.onnx"`` -> ``dates.encoder.onnx``, ``dates.decoder.onnx``).

    Args:
        model: a ``ta.models.Seq2Seq`` (any cell, attention and style) or a
            ``ta.models.Transformer`` (any option); exported as in eval mode.
        path: where the files go, as above.

    Returns:
        an ``OnnxExport`` (the paths and the step's state names); ``OnnxModel(export)``
        decodes with onnxruntime.

    Raises:
        UnsupportedOpError: naming an op of the model with no ONNX mapping.
        DTypeError: the model is not float32 (``model.astype(np.float32)`` first).
        ImportError: onnx is not installed (``pip install 'tinygrad_attn[onnx]'``).

    Example:
        >>> files = ta.export.onnx(model, "dates.onnx")
        >>> ids, weights = ta.export.OnnxModel(files).greedy(src, max_len=12)
    """
    from ..models.seq2seq import Seq2Seq
    from ..models.transformer import Transformer

    onnx = _require()
    if opset != OPSET:
        raise ValueError(f"export_onnx: only opset {OPSET} is written, got {opset}")
    if isinstance(model, Seq2Seq):
        family, writer, states = "seq2seq", onnx_seq2seq, onnx_seq2seq.state_names(model)
    elif isinstance(model, Transformer):
        family, writer, states = "transformer", onnx_transformer, onnx_transformer.state_names(model)
    else:
        raise TypeError(f"export_onnx: exports a ta.models.Seq2Seq or ta.models.Transformer; got "
                        f"{type(model).__name__}")
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    if dtypes != ["float32"]:
        raise DTypeError(f"export_onnx: writes float32 models (the graphs' inputs and outputs are "
                         f"float32); this one has {', '.join(dtypes)} parameters: export "
                         f"model.astype(np.float32)")
    encoder_path, decoder_path = _paths(path)
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
    encoder_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(encoder, str(encoder_path))
    onnx.save(decoder, str(decoder_path))
    return OnnxExport(encoder_path, decoder_path, states)


onnx = export_onnx


# ---------------------------------------------------------------- decoding with onnxruntime


@dataclass
class _OrtDecoding:
    """A decode of N rows on onnxruntime: what the step reads of the source (the memory:
    keys, src_mask ...), the step's states by name, and which source each row decodes."""

    memory: dict
    states: dict
    source: np.ndarray


class OnnxModel:
    """An exported model's encoder and decoder step as two onnxruntime sessions, decoding
    through ``ta.models.decoding``'s protocol (decode_start / decode_step / decode_select):
    greedy, sampling and beam search are the engine's own code, run on onnxruntime's numbers.
    One class for both families: the files name the step's states and memory.

    Args:
        exported: what ``export_onnx`` returned, or the ``path`` given to it.
        threads: onnxruntime's intra-op threads (0: its default).
        providers: onnxruntime execution providers (default CPU).

    Example:
        >>> ort_model = ta.export.OnnxModel(ta.export.onnx(model, "dates.onnx"))
        >>> ids, weights = ort_model.greedy(src, max_len=12)
        >>> ids, weights = ort_model.beam_search(src, beam=5, max_len=12)
    """

    def __init__(self, exported, threads: int = 0, providers=None):
        ort = _require("onnxruntime")
        if isinstance(exported, OnnxExport):
            encoder_path, decoder_path = exported.encoder_path, exported.decoder_path
        else:
            encoder_path, decoder_path = _paths(exported)
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
        self.step_outputs = [o.name for o in self.decoder.get_outputs()]
        self.encoder_outputs = [o.name for o in self.encoder.get_outputs()]

    def encode(self, src) -> dict:
        """The encoder's outputs by name (Seq2Seq: keys, keys_proj, h0 ...; Transformer:
        memory_key0, memory_value0 ...)."""
        src = np.asarray(src, dtype=np.int64)
        limit = self.config.get("max_len")
        if self.family == "transformer" and src.shape[1] > limit:
            raise ShapeError(f"OnnxModel: a source of {src.shape[1]} tokens is longer than the position "
                             f"table (max_len={limit})")
        return dict(zip(self.encoder_outputs, self.encoder.run(None, {"src": src}), strict=True))

    def decode_start(self, src: np.ndarray) -> _OrtDecoding:
        src = np.asarray(src, dtype=np.int64)
        found = self.encode(src)
        memory = {name: value for name, value in found.items() if name in self.step_inputs
                  and name not in self.state_names}
        if "src_mask" in self.step_inputs:
            memory["src_mask"] = src != PAD
        # A state the encoder does not give starts empty: a Transformer's caches, 0 tokens long.
        states = {name: found[name] if name in found else self._empty(name, len(src))
                  for name in self.state_names}
        return _OrtDecoding(memory, states, np.arange(src.shape[0]))

    def _empty(self, name: str, rows: int) -> np.ndarray:
        shape = [rows if axis == "N" else 0 if isinstance(axis, str) else axis
                 for axis in self.step_inputs[name]]
        return np.zeros(shape, dtype=np.float32)

    def decode_step(self, state: _OrtDecoding, tokens: np.ndarray, t: int):
        from ..models import decoding

        if self.family == "transformer" and t >= self.config["max_len"]:
            raise ShapeError(f"OnnxModel: step {t} is beyond the position table "
                             f"(max_len={self.config['max_len']})")
        feed = {"tokens": np.asarray(tokens, dtype=np.int64), **state.memory, **state.states}
        found = dict(zip(self.step_outputs, self.decoder.run(None, feed), strict=True))
        log_probs = decoding.log_softmax(found["logits"])                          # (N, V) float64
        states = {name: found[f"{name}_next"] for name in self.state_names}
        return log_probs, found.get("attention"), _OrtDecoding(state.memory, states, state.source)

    def decode_select(self, state: _OrtDecoding, rows: np.ndarray) -> _OrtDecoding:
        source = state.source[rows]
        same = np.array_equal(source, state.source)
        memory = state.memory if same else {name: array[rows] for name, array in state.memory.items()}
        return _OrtDecoding(memory, {name: array[rows] for name, array in state.states.items()}, source)

    def greedy(self, src, max_len: int = 50, **options):
        """``ta.models.decoding.greedy`` on the sessions; returns what the model's ``greedy`` does."""
        from ..models import decoding

        return decoding.greedy(self, np.asarray(src, dtype=np.int64), max_len, **options)

    def beam_search(self, src, beam: int = 5, max_len: int = 50, **options):
        """``ta.models.decoding.beam_search`` on the sessions; as the model's ``beam_search``."""
        from ..models import decoding

        return decoding.beam_search(self, np.asarray(src, dtype=np.int64), beam, max_len, **options)
