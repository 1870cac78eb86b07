"""ONNX export (``ta.export.onnx``): the checker accepts the files, onnxruntime reproduces the
engine's encoder and decoder steps at sizes other than the traced ones, for Seq2Seq and
Transformer models, and decodes trained dates models to the engine's translations; an op with
no mapping is named."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import tinygrad_attn as ta
from tests import optional
from tinygrad_attn.export import onnx_ops, onnx_seq2seq
from tinygrad_attn.ops import registry

ta_onnx = ta.export

ONNX_REASON = "onnx and onnxruntime are not installed (pip install 'tinygrad_attn[onnx]')"
TOLERANCE = dict(rtol=1e-5, atol=1e-5)

# (cell, attention, style, bidirectional, num_layers): every score, both styles, both cells
# the models use, a bidirectional bridge and stacked layers.
CONFIGS = [
    ("gru", "additive", "bahdanau", False, 1),          # the demo's model
    ("gru", "concat", "luong", False, 2),
    ("gru", "dot", "bahdanau", False, 1),
    ("lstm", "general", "luong", True, 1),
    ("lstm", "additive", "bahdanau", False, 2),
    ("rnn", None, "bahdanau", True, 2),
]
# Transformer options: both norm placements, both activations, both position tables, tied
# output weights, and unequal stacks.
TRANSFORMERS = {
    "post-norm-relu-sinusoidal": dict(num_encoder_layers=2, num_decoder_layers=2),
    "pre-norm-gelu-learned-tied": dict(num_encoder_layers=1, num_decoder_layers=3, norm_first=True,
                                       activation="gelu", positions="learned", tie_embeddings=True),
    # A stack of zero layers is its final LayerNorm alone (as torch's): no encoder layer; no
    # decoder layer, so no cross-attention and a step that reads nothing of the source.
    "no-encoder-layers": dict(num_encoder_layers=0, num_decoder_layers=2),
    "no-decoder-layers": dict(num_encoder_layers=2, num_decoder_layers=0),
    "no-layers": dict(num_encoder_layers=0, num_decoder_layers=0, norm_first=True),
}


def config_id(config) -> str:
    if isinstance(config, str):
        return f"transformer-{config}"
    cell, attention, style, bidirectional, layers = config
    return f"{cell}-{attention}-{style}{'-bi' if bidirectional else ''}-{layers}l"


@pytest.fixture(scope="module")
def onnx():
    found = optional.module("onnx", ONNX_REASON)
    optional.module("onnxruntime", ONNX_REASON)
    return found


def small_model(cell, attention, style, bidirectional, layers) -> ta.models.Seq2Seq:
    ta.manual_seed(0)
    return ta.models.Seq2Seq(20, 22, embed=8, hidden=16, cell=cell, attention=attention, style=style,
                             bidirectional=bidirectional, num_layers=layers)


def small_transformer(name: str, max_len: int = 64) -> ta.models.Transformer:
    ta.manual_seed(0)
    return ta.models.Transformer(20, 22, d_model=16, nhead=4, dim_feedforward=24, dropout=0.1,
                                 max_len=max_len, **TRANSFORMERS[name])


def sources(batch: int, length: int) -> np.ndarray:
    """Right-padded ids with rows of every length, the last row all padding."""
    src = np.random.default_rng(batch * 31 + length).integers(4, 20, size=(batch, length))
    for row in range(batch):
        src[row, length - row % length:] = 0
    src[-1] = 0
    return src


def engine_encoder_outputs(model, src: np.ndarray) -> dict:
    """What the exported encoder should write, from the engine, by output name."""
    if isinstance(model, ta.models.Transformer):
        memory = model.encode(src)
        if not model.transformer.decoder.layers:        # nothing reads the memory: it is the output
            return {"memory": memory.numpy()}
        found = {}
        for k, layer in enumerate(model.transformer.decoder.layers):
            keys, values = layer.multihead_attn.project_memory(memory)
            found[f"memory_key{k}"], found[f"memory_value{k}"] = keys.numpy(), values.numpy()
        return found
    memory = model.encode(src)
    names = onnx_seq2seq.state_names(model)
    found = {name: state.numpy() for name, state in
             zip(names, onnx_seq2seq._flatten_states(model, memory.states), strict=True)}
    for name in ("keys", "keys_proj"):
        if getattr(memory, name) is not None:
            found[name] = getattr(memory, name).numpy()
    return found


@pytest.fixture(scope="module", params=CONFIGS + list(TRANSFORMERS), ids=config_id)
def exported(request, onnx, tmp_path_factory):
    config = request.param
    model = small_transformer(config) if isinstance(config, str) else small_model(*config)
    model.train()                            # exported as in eval mode all the same
    files = ta_onnx.onnx(model, tmp_path_factory.mktemp("onnx") / "model.onnx")
    assert model.training
    model.eval()
    return model, files, ta_onnx.OnnxModel(files)


def test_export_files_pass_the_checker_at_opset_17(exported, onnx):
    _, files, _ = exported
    for path in (files.encoder_path, files.decoder_path):
        proto = onnx.load(str(path))
        onnx.checker.check_model(proto, full_check=True)
        assert [o.version for o in proto.opset_import if o.domain == ""] == [17]


def test_export_parameters_are_initializers_named_after_the_state_dict(exported, onnx):
    model, files, _ = exported
    names = set()
    for path in (files.encoder_path, files.decoder_path):
        names |= {init.name for init in onnx.load(str(path)).graph.initializer}
    assert set(model.state_dict()) <= names


def test_export_encoder_matches_the_engine_at_other_sizes(exported):
    model, _, ort_model = exported
    src = sources(5, 7)                      # traced at (2, 3)
    expected = engine_encoder_outputs(model, src)
    found = ort_model.encode(src)
    assert set(found) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(found[name], value, **TOLERANCE, err_msg=name)


def test_export_decoder_steps_match_the_engine_at_other_sizes(exported):
    model, _, ort_model = exported
    src = sources(4, 6)
    engine_state, ort_state = model.decode_start(src), ort_model.decode_start(src)
    tokens = np.full(len(src), ta.data.START, dtype=np.int64)
    for t in range(6):
        engine_lp, engine_attention, engine_state = model.decode_step(engine_state, tokens, t)
        ort_lp, ort_attention, ort_state = ort_model.decode_step(ort_state, tokens, t)
        np.testing.assert_allclose(ort_lp, engine_lp, **TOLERANCE)
        if engine_attention is None:
            assert ort_attention is None
        else:
            np.testing.assert_allclose(ort_attention, engine_attention, **TOLERANCE)
        tokens = engine_lp.argmax(axis=1)
    # A beam's reordering of rows: both states pick the same rows.
    rows = np.array([2, 2, 0])
    engine_lp, _, _ = model.decode_step(model.decode_select(engine_state, rows), tokens[rows], 6)
    ort_lp, _, _ = ort_model.decode_step(ort_model.decode_select(ort_state, rows), tokens[rows], 6)
    np.testing.assert_allclose(ort_lp, engine_lp, **TOLERANCE)


@pytest.mark.parametrize("config", ["no-encoder-layers", "no-decoder-layers", "no-layers"])
def test_export_of_zero_layers_decodes_as_the_engine(onnx, tmp_path, config):
    """No decoder layer: no attention (None, as the engine's) and a step that reads no source."""
    model = small_transformer(config).eval()
    ort_model = ta_onnx.OnnxModel(ta_onnx.onnx(model, tmp_path / "z.onnx"))
    src = sources(4, 6)
    for call in (lambda m: m.greedy(src, max_len=7), lambda m: m.beam_search(src, beam=3, max_len=7)):
        (expected, engine_weights), (ids, weights) = call(model), call(ort_model)
        np.testing.assert_array_equal(ids, expected)
        if engine_weights is None:
            assert weights is None and not model.transformer.decoder.layers
        else:
            np.testing.assert_allclose(weights, engine_weights, **TOLERANCE)


# ---------------------------------------------------------------- a trained dates model


@pytest.fixture(scope="module", params=["seq2seq", "transformer"])
def dates(request, onnx, tmp_path_factory):
    task = ta.data.load("dates", n_train=2000, n_test=200)
    ta.manual_seed(0)
    if request.param == "seq2seq":
        model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=16, hidden=32, cell="gru",
                                  attention="additive", style="bahdanau")
    else:
        model = ta.models.Transformer(task.src_vocab, task.tgt_vocab, d_model=32, nhead=4,
                                      num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=64,
                                      dropout=0.0)
    # Trained enough that the decodes compared are not an untrained model's near-ties.
    ta.models.train(model, task, steps=200 if request.param == "seq2seq" else 100, batch_size=32, lr=1e-2,
                    eval_every=0)
    files = ta_onnx.onnx(model, tmp_path_factory.mktemp("dates") / "dates.onnx")
    src = ta.data.encode_batch([s for s, _ in task.test], task.src_vocab)
    return model, ta_onnx.OnnxModel(files), src


def test_export_greedy_decode_gives_the_engine_translations(dates):
    model, ort_model, src = dates
    engine_ids, engine_weights = model.greedy(src, max_len=12)
    ort_ids, ort_weights = ort_model.greedy(src, max_len=12)
    np.testing.assert_array_equal(ort_ids, engine_ids)
    np.testing.assert_allclose(ort_weights, engine_weights, **TOLERANCE)


def test_export_beam_decode_gives_the_engine_translations(dates):
    model, ort_model, src = dates
    engine = model.beam_search(src[:60], beam=4, max_len=12, n_best=2)
    found = ort_model.beam_search(src[:60], beam=4, max_len=12, n_best=2)
    for engine_best, ort_best in zip(engine, found, strict=True):
        assert [h.tokens for h in ort_best] == [h.tokens for h in engine_best]
        np.testing.assert_allclose([h.score for h in ort_best], [h.score for h in engine_best], rtol=1e-5)


# ---------------------------------------------------------------- every op, and errors


def _example_cases():
    for name in sorted(registry):
        for k, example in enumerate(registry[name].examples()):
            yield pytest.param(name, example, id=f"{name}-{k}")


@pytest.mark.parametrize(("name", "example"), list(_example_cases()))
def test_export_every_op_maps_to_onnx_or_names_itself(onnx, name, example):
    import onnxruntime

    inputs = {}
    for k, array in enumerate(example.inputs):
        array = np.asarray(array)
        if array.dtype.kind == "f":
            array = array.astype(np.float32)
        inputs[f"x{k}"] = ta.Tensor(array, requires_grad=array.dtype.kind == "f", dtype=array.dtype)
    y = registry[name].apply(*inputs.values(), **example.attrs)
    try:
        proto = ta_onnx.graph_to_onnx(inputs, {"y": y})
    except ta_onnx.UnsupportedOpError as error:
        assert f"op {name!r}" in str(error)
        return
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (found,) = session.run(None, {k: t.numpy() for k, t in inputs.items()})
    np.testing.assert_allclose(found, y.numpy(), **TOLERANCE)


def test_export_the_ops_the_models_use_are_mapped():
    used = {"Add", "Cat", "Embedding", "GRUCell", "LSTMCellState", "LSTMHidden", "Linear", "MatMul",
            "MaskedSoftmax", "AdditiveScores", "Tanh", "Permute", "GetItem", "Where", "LayerNorm",
            "ScaledDotProduct", "Softmax", "Relu", "Gelu", "Reshape"}
    assert used <= set(onnx_ops.supported_ops())


def test_export_unmapped_op_raises_naming_it(onnx):
    logits = ta.Tensor(np.zeros((3, 5), dtype=np.float32), requires_grad=True)
    loss = ta.functional.cross_entropy(logits, np.array([1, 2, 3]))
    with pytest.raises(ta_onnx.UnsupportedOpError, match=r"op 'CrossEntropy' .*has no ONNX mapping"):
        ta_onnx.graph_to_onnx({"logits": logits}, {"loss": loss})


def test_export_of_another_model_names_what_it_exports(onnx, tmp_path):
    with pytest.raises(TypeError, match="exports a ta.models.Seq2Seq or ta.models.Transformer; got Linear"):
        ta_onnx.onnx(ta.nn.Linear(3, 4), tmp_path / "t.onnx")


def test_exported_transformer_bounds_sources_and_decodes_by_its_position_table(onnx, tmp_path):
    """As the engine's: a decode stops at the table's end, a longer source is refused."""
    model = small_transformer("post-norm-relu-sinusoidal", max_len=6).eval()
    ort_model = ta_onnx.OnnxModel(ta_onnx.onnx(model, tmp_path / "t.onnx"))
    src = sources(2, 3)
    for call in (lambda m: m.greedy(src, max_len=9), lambda m: m.beam_search(src, beam=2, max_len=9)):
        (expected, _), (ids, _) = call(model), call(ort_model)
        np.testing.assert_array_equal(ids, expected)
    long = sources(2, 7)
    with pytest.raises(ta.ShapeError, match=r"source 0 has 7 tokens, longer than the Transformer's position "
                                            r"table \(max_len=6\)"):
        model.greedy(long, max_len=3)
    with pytest.raises(ta.ShapeError, match=r"source 0 has 7 tokens, longer than the OnnxModel's position "
                                            r"table \(max_len=6\)"):
        ort_model.greedy(long, max_len=3)
    with pytest.raises(ta.ShapeError, match=r"OnnxModel: a source of 7 tokens is longer than the position "
                                            r"table \(max_len=6\)"):
        ort_model.encode(long)


def test_export_without_onnx_says_how_to_install(monkeypatch, tmp_path):
    # None in sys.modules makes `import onnx` fail, whether or not it is installed.
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ImportError) as caught:
        ta_onnx.onnx(small_model(*CONFIGS[0]), tmp_path / "m.onnx")
    assert str(caught.value) == "onnx needs the optional extra: pip install 'tinygrad_attn[onnx]'"
    assert caught.value.__cause__ is None


def test_export_of_a_float64_model_says_to_cast_it(onnx, tmp_path):
    model = small_model("gru", "dot", "luong", False, 1).astype(np.float64)
    with pytest.raises(ta.DTypeError, match=r"writes float32 models.*float64 parameters: export "
                                            r"model.astype\(np.float32\)"):
        ta_onnx.onnx(model, tmp_path / "f64.onnx")
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- ids, empty batches, paths


@pytest.fixture(scope="module", params=["seq2seq", "transformer"])
def tiny(request, onnx, tmp_path_factory):
    """An engine model (source vocabulary 20) and its exported twin on onnxruntime."""
    if request.param == "seq2seq":
        model = small_model(*CONFIGS[0]).eval()
    else:
        model = small_transformer("post-norm-relu-sinusoidal").eval()
    return model, ta_onnx.OnnxModel(ta_onnx.onnx(model, tmp_path_factory.mktemp("ids") / "m.onnx"))


BAD_SOURCES = {
    "negative-id": np.array([[4, -1, 5]]),
    "float-ids": np.array([[4.0, 5.5]]),
    "id-past-the-vocabulary": np.array([[4, 20]]),
    "one-axis": np.array([4, 5]),
    "bools": np.array([[True, False]]),
}


@pytest.mark.parametrize("method", ["greedy", "beam_search", "encode"])
@pytest.mark.parametrize("bad", list(BAD_SOURCES))
def test_onnx_model_refuses_the_ids_the_engine_refuses_with_its_message(tiny, bad, method):
    """Before onnxruntime runs (whose Gather wraps a negative id, and fails on others deep
    inside): the engine's own checks, raising what the engine's decoders raise."""
    model, ort_model = tiny
    src = BAD_SOURCES[bad]
    with pytest.raises(Exception) as engine:
        getattr(model, "greedy" if method == "encode" else method)(src, max_len=4)
    with pytest.raises(type(engine.value)) as found:
        getattr(ort_model, method)(src, **({} if method == "encode" else {"max_len": 4}))
    assert str(found.value) == str(engine.value)


EMPTY_SOURCES = {
    "no-rows": np.zeros((0, 5), dtype=np.int64),
    "no-rows-width-0": np.zeros((0, 0), dtype=np.int64),
    "width-0": np.zeros((3, 0), dtype=np.int64),
    "only-padding": np.zeros((3, 4), dtype=np.int64),
}


@pytest.mark.parametrize("empty", list(EMPTY_SOURCES))
def test_onnx_model_decodes_empty_batches_and_sources_as_the_engine(tiny, empty):
    """What onnxruntime cannot run (no rows, width 0) gives the engine's result all the same."""
    model, ort_model = tiny
    src = EMPTY_SOURCES[empty]
    for call in (lambda m: m.greedy(src, max_len=4), lambda m: m.beam_search(src, beam=3, max_len=4)):
        (engine_ids, engine_weights), (ids, weights) = call(model), call(ort_model)
        np.testing.assert_array_equal(ids, engine_ids)
        assert ids.dtype == engine_ids.dtype and weights.dtype == engine_weights.dtype
        np.testing.assert_allclose(weights, engine_weights, **TOLERANCE)
    engine_best = model.beam_search(src, beam=3, max_len=4, n_best=2)
    found = ort_model.beam_search(src, beam=3, max_len=4, n_best=2)
    assert [[h.tokens for h in best] for best in found] == [[h.tokens for h in best] for best in engine_best]
    expected = engine_encoder_outputs(model, src)
    encoded = ort_model.encode(src)
    assert set(encoded) == set(expected)
    for name, value in expected.items():
        assert encoded[name].shape == value.shape, name
        np.testing.assert_allclose(encoded[name], value, **TOLERANCE, err_msg=name)


def test_export_to_a_folder_writes_inside_it(onnx, tmp_path):
    """A folder (an existing one, or a path ending with a separator) gets model.encoder.onnx
    and model.decoder.onnx inside it, and OnnxModel opens the folder the same way."""
    model = small_model(*CONFIGS[0]).eval()
    existing = tmp_path / "existing"
    existing.mkdir()
    src = sources(3, 4)
    expected, _ = model.greedy(src, max_len=5)
    for target in (existing, str(existing), str(tmp_path / "new") + os.sep):
        files = ta_onnx.onnx(model, target)
        folder = Path(target)
        assert (files.encoder_path, files.decoder_path) == (folder / "model.encoder.onnx",
                                                            folder / "model.decoder.onnx")
        assert sorted(p.name for p in folder.iterdir()) == ["model.decoder.onnx", "model.encoder.onnx"]
        ids, _ = ta_onnx.OnnxModel(target).greedy(src, max_len=5)
        np.testing.assert_array_equal(ids, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "new"]      # nothing beside them
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"OnnxModel: no file .*empty/model\.encoder\.onnx'"):
        ta_onnx.OnnxModel(tmp_path / "empty")
    with pytest.raises(ValueError, match="ta.export.onnx: path is empty"):
        ta_onnx.onnx(model, "")


def test_export_replaces_its_own_files_only_and_writes_both_or_neither(onnx, tmp_path):
    model = small_model(*CONFIGS[0]).eval()
    first = ta_onnx.onnx(model, tmp_path / "m.onnx")
    ta_onnx.onnx(model, tmp_path / "m.onnx")                     # its own files: replaced
    ta_onnx.OnnxModel(first).greedy(sources(2, 3), max_len=3)
    foreign = tmp_path / "x.decoder.onnx"
    foreign.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError, match=r"^ta\.export\.onnx: .*x\.decoder\.onnx' exists and is not an "
                                              r"ONNX file written by tinygrad_attn"):
        ta_onnx.onnx(model, tmp_path / "x.onnx")
    assert foreign.read_bytes() == b"someone else's"
    (tmp_path / "y.decoder.onnx").mkdir()
    with pytest.raises(FileExistsError, match=r"y\.decoder\.onnx' exists and is not an ONNX file"):
        ta_onnx.onnx(model, tmp_path / "y.onnx")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["m.decoder.onnx", "m.encoder.onnx", "x.decoder.onnx", "y.decoder.onnx"]   # no halves
