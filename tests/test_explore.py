"""ta.viz.explore without a browser: the weights the page embeds against the model's own (the
decode's attention, and an eager teacher-forced pass for every Transformer layer and head),
the page's self-containment and escaping, saving (atomic, no silent overwrite), Jupyter's
iframe, the cap on large inputs, errors, and ``tinygrad-attn translate --explore``."""

import html
import importlib
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import cli

explore_module = importlib.import_module("tinygrad_attn.viz.explore")

# Tokens that would break a page that pasted them in as markup.
HOSTILE = ["</script>", "<b>", "&amp;", '"q"', "<!--"]
WORDS = ["a", "b", "c", "d", *HOSTILE]
TEXT = "a </script> b <b> &amp; c"
MAX_LEN = 5


def never_ends(model) -> None:
    """Make ``<end>`` never the likeliest token, so every decode produces exactly max_len tokens:
    rows enough to compare, whatever the untrained weights pick."""
    bias = model.out.bias.numpy().copy()
    bias[ta.data.END] = -1e4
    model.out.bias.data = bias


@pytest.fixture(scope="module")
def task():
    vocab = ta.data.Vocab(WORDS)
    return ta.data.Task.empty("hostile", vocab, vocab, {"src": "space", "tgt": "space", "lowercase": False})


@pytest.fixture(scope="module")
def transformer(task):
    ta.manual_seed(0)
    model = ta.models.Transformer(task.src_vocab, task.tgt_vocab, d_model=16, nhead=2, num_encoder_layers=2,
                                  num_decoder_layers=2, dim_feedforward=32, dropout=0.0, max_len=32)
    never_ends(model)
    return model.eval()


@pytest.fixture(scope="module")
def seq2seq(task):
    ta.manual_seed(1)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=8, hidden=16, attention="additive")
    return model.eval()


def embedded(page: str) -> dict:
    """The JSON the page carries, as its script reads it."""
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', page, re.S)
    return json.loads(match.group(1))


class Tags(HTMLParser):
    """The start tags of a page and the text of its elements, as a browser's parser sees them."""

    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> Tags:
    tags = Tags()
    tags.feed(page)
    return tags


def teacher_forced(model, task, source, rows):
    """Every layer's and head's weights for ``rows`` (output tokens, <end> if made), from the
    model's forward: {"encoder": (L, H, S, S), "cross": (L, H, T, S), "decoder": (L, H, T, T)}."""
    ids = task.tgt_vocab.encode([t for t in rows if t != "<end>"], end="<end>" in rows)
    tgt_in = np.array([[ta.data.START, *ids[: len(rows) - 1]]])
    src = ta.data.encode_batch([source], task.src_vocab)
    with ta.no_grad():
        _, weights = model(src, tgt_in, need_weights=True)
    return {"encoder": model.layer_attention(weights, "encoder/self_attention")[:, 0],
            "cross": model.layer_attention(weights)[:, 0],
            "decoder": model.layer_attention(weights, "self_attention")[:, 0]}


def torch_weights(model, task, source, rows):
    """The same three kinds as ``teacher_forced``, computed by PyTorch instead: the model's
    twin (``to_torch()``: torch.nn.Transformer's post-norm layers with the engine's weights)
    run layer by layer, each layer's attention modules asked for their per-head weights on the
    inputs that layer receives."""
    torch = pytest.importorskip("torch")
    twin = model.to_torch().eval()
    ids = task.tgt_vocab.encode([t for t in rows if t != "<end>"], end="<end>" in rows)
    src = torch.from_numpy(ta.data.encode_batch([source], task.src_vocab))
    tgt_in = torch.from_numpy(np.array([[ta.data.START, *ids[: len(rows) - 1]]]))
    length = tgt_in.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).triu(1)               # True: may not attend
    found = {"encoder": [], "cross": [], "decoder": []}

    def heads(attention, query, key, **masks):
        return attention(query, key, key, need_weights=True, average_attn_weights=False, **masks)

    with torch.no_grad():
        x = twin.embed(twin.src_embed, src)
        for layer in twin.transformer.encoder.layers:
            assert not layer.norm_first
            found["encoder"].append(heads(layer.self_attn, x, x, key_padding_mask=src == 0)[1][0])
            x = layer(x, src_key_padding_mask=src == 0)
        memory = twin.encode(src)
        x = twin.embed(twin.tgt_embed, tgt_in)
        for layer in twin.transformer.decoder.layers:
            out, weights = heads(layer.self_attn, x, x, attn_mask=causal)
            found["decoder"].append(weights[0])
            x = layer.norm1(x + out)
            out, weights = heads(layer.multihead_attn, x, memory, key_padding_mask=src == 0)
            found["cross"].append(weights[0])
            x = layer.norm3(layer.norm2(x + out) + layer.linear2(layer.activation(layer.linear1(
                layer.norm2(x + out)))))
    return {kind: torch.stack(weights).numpy() for kind, weights in found.items()}


# ---------------------------------------------------------------- the weights


def test_explore_transformer_embeds_every_layer_and_head_of_the_models_weights(transformer, task):
    explorer = ta.viz.explore(transformer, TEXT, task, max_len=MAX_LEN)
    page = embedded(explorer.html)
    source = task.tokenize(TEXT)
    [hyp] = page["hypotheses"]
    assert page["source"] == source and hyp["rows"] == hyp["inputs"][1:] + [hyp["rows"][-1]]
    assert len(hyp["rows"]) == MAX_LEN and hyp["inputs"][0] == "<start>"
    # The output shown is the model's greedy decode of the text.
    ids, attention = transformer.greedy(ta.data.encode_batch([source], task.src_vocab), max_len=MAX_LEN)
    assert hyp["rows"] == task.tgt_vocab.decode(ids[0])
    reference = teacher_forced(transformer, task, source, hyp["rows"])
    np.testing.assert_allclose(page["encoder"], reference["encoder"], atol=1e-6)
    np.testing.assert_allclose(hyp["cross"], reference["cross"], atol=1e-6)
    np.testing.assert_allclose(hyp["decoder"], reference["decoder"], atol=1e-6)
    # And against PyTorch's own attention modules, which share no code with the engine.
    theirs = torch_weights(transformer, task, source, hyp["rows"])
    np.testing.assert_allclose(page["encoder"], theirs["encoder"], atol=1e-5)
    np.testing.assert_allclose(hyp["cross"], theirs["cross"], atol=1e-5)
    np.testing.assert_allclose(hyp["decoder"], theirs["decoder"], atol=1e-5)
    assert np.shape(hyp["cross"]) == (2, 2, MAX_LEN, len(source))
    assert np.shape(hyp["decoder"]) == (2, 2, MAX_LEN, MAX_LEN)
    # The decode's own weights (cached, step by step) are the last layer's, averaged over heads.
    np.testing.assert_allclose(np.mean(hyp["cross"][-1], axis=0), attention[0], atol=1e-5)
    # Causal: a position sees <start> and the tokens before it, never after.
    assert np.all(np.triu(np.asarray(hyp["decoder"]), k=1) == 0)
    assert [k["id"] for k in page["kinds"]] == ["cross", "encoder", "decoder"] and page["heads"] == 2


def test_explore_seq2seq_embeds_the_decodes_own_attention(seq2seq, task):
    page = embedded(ta.viz.explore(seq2seq, TEXT, task, max_len=MAX_LEN).html)
    source = task.tokenize(TEXT)
    ids, attention = seq2seq.greedy(ta.data.encode_batch([source], task.src_vocab), max_len=MAX_LEN)
    [hyp] = page["hypotheses"]
    rows = len(hyp["rows"])
    np.testing.assert_allclose(hyp["cross"], attention[0, :rows][None, None], atol=1e-6)
    np.testing.assert_allclose(np.sum(hyp["cross"], axis=-1), 1.0, atol=1e-5)
    assert page["encoder"] is None and hyp["decoder"] is None
    assert [k["id"] for k in page["kinds"]] == ["cross"] and page["heads"] == 1


@pytest.mark.parametrize("which", ["seq2seq", "transformer"])
def test_explore_n_best_shows_every_hypothesis_with_the_beams_scores(which, request, task):
    model = request.getfixturevalue(which)
    page = embedded(ta.viz.explore(model, TEXT, task, beam=3, n_best=3, max_len=MAX_LEN).html)
    source = task.tokenize(TEXT)
    found = model.beam_search(ta.data.encode_batch([source], task.src_vocab), beam=3, max_len=MAX_LEN,
                              n_best=3)[0]
    assert [h["text"] for h in page["hypotheses"]] == [task.detokenize(task.tgt_vocab.decode(h.tokens))
                                                       for h in found]
    np.testing.assert_allclose([h["score"] for h in page["hypotheses"]], [h.score for h in found], rtol=1e-12)
    np.testing.assert_allclose([h["log_prob"] for h in page["hypotheses"]], [h.log_prob for h in found])
    for shown, hypothesis in zip(page["hypotheses"], found, strict=True):
        # The decode's attention: the Seq2Seq's as it is, the Transformer's last layer's mean.
        cross = np.asarray(shown["cross"])
        np.testing.assert_allclose(cross[-1].mean(axis=0), hypothesis.attention, atol=1e-5)


# ---------------------------------------------------------------- the page


def test_explore_page_is_self_contained(transformer, task):
    page = ta.viz.explore(transformer, TEXT, task, max_len=MAX_LEN).html
    tags = parse(page)
    for tag, attrs in tags.tags:
        assert "src" not in attrs and "href" not in attrs, (tag, attrs)
        assert tag not in ("link", "iframe", "img", "object", "embed"), tag
    assert not re.search(r"https?://", page.replace("http://www.w3.org/2000/svg", ""))
    assert "@import" not in page and "url(" not in page
    assert [attrs.get("type") for tag, attrs in tags.tags if tag == "script"] == ["application/json", None]
    assert page.startswith("<!DOCTYPE html>\n" + explore_module.MARKER)


def test_explore_escapes_tokens_and_title(transformer, task):
    title = "<i>dates</i> & </script>"
    explorer = ta.viz.explore(transformer, TEXT, task, max_len=MAX_LEN, title=title)
    tags = parse(explorer.html)
    # Two script elements, nothing else from the tokens became markup.
    names = [tag for tag, _ in tags.tags]
    assert names.count("script") == 2 and "b" not in names and "i" not in names
    assert explorer.html.count("</script>") == 2 and "<b>" not in explorer.html
    page = embedded(explorer.html)
    assert page["source"] == task.tokenize(TEXT)             # every hostile token intact
    assert title in tags.text                                # the heading, as text
    assert f"<title>{html.escape(title)}</title>" in explorer.html


def test_explore_marks_tokens_the_vocabulary_lacks(seq2seq, task):
    explorer = ta.viz.explore(seq2seq, "a zz b", task, max_len=MAX_LEN)
    page = embedded(explorer.html)
    assert page["unknown"] == [False, True, False]
    assert explorer.notes == ["not in the source vocabulary, read as <unk> (underlined): 'zz'"]


def test_explore_keeps_only_head_means_past_the_cap_and_says_so(transformer, task, monkeypatch):
    full = embedded(ta.viz.explore(transformer, TEXT, task, max_len=MAX_LEN).html)
    monkeypatch.setattr(explore_module, "MAX_VALUES", 200)      # 364 weights, 182 averaged
    explorer = ta.viz.explore(transformer, TEXT, task, max_len=MAX_LEN)
    page = embedded(explorer.html)
    assert page["averaged"] and page["heads"] == 2
    assert np.shape(page["encoder"])[1] == 1 and np.shape(page["hypotheses"][0]["cross"])[1] == 1
    np.testing.assert_allclose(np.asarray(page["encoder"])[:, 0], np.mean(full["encoder"], axis=1), atol=2e-6)
    assert "averaged over its 2 heads" in explorer.notes[0] and "averaged over its 2 heads" in explorer.html
    monkeypatch.setattr(explore_module, "MAX_VALUES", 10)
    with pytest.raises(ValueError, match="explore: the page would hold .* even averaged over the heads"):
        ta.viz.explore(transformer, TEXT, task, max_len=MAX_LEN)


# ---------------------------------------------------------------- saving and display


def test_explore_save_is_atomic_and_never_overwrites_a_users_file(seq2seq, task, tmp_path):
    explorer = ta.viz.explore(seq2seq, TEXT, task, max_len=MAX_LEN)
    path = tmp_path / "attention.html"
    assert explorer.save(path) == path and path.read_text(encoding="utf-8") == explorer.html
    other = ta.viz.explore(seq2seq, "a b", task, max_len=MAX_LEN)
    other.save(path)                                             # its own page: replaced
    assert path.read_text(encoding="utf-8") == other.html
    mine = tmp_path / "notes.html"
    mine.write_text("<p>my notes</p>")
    with pytest.raises(FileExistsError, match="explore: .*notes.html.* not an attention explorer"):
        explorer.save(mine)
    assert mine.read_text() == "<p>my notes</p>"
    with pytest.raises(FileExistsError):
        ta.viz.explore(seq2seq, TEXT, task, max_len=MAX_LEN, path=mine)
    with pytest.raises(FileExistsError):                         # refused before decoding anything
        ta.viz.explore(None, TEXT, task, path=mine)
    explorer.save(mine, overwrite=True)
    assert mine.read_text(encoding="utf-8") == explorer.html
    with pytest.raises(FileNotFoundError, match="explore: cannot write"):
        explorer.save(tmp_path / "missing" / "a.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.html", "notes.html"]   # no temporaries


def test_explore_displays_in_jupyter_as_an_isolated_iframe(seq2seq, task):
    explorer = ta.viz.explore(seq2seq, TEXT, task, max_len=MAX_LEN)
    shown = explorer._repr_html_()
    [(tag, attrs)] = parse(shown).tags
    assert tag == "iframe" and attrs["sandbox"] == "allow-scripts"
    assert attrs["srcdoc"] == explorer.html                   # the parser unescapes the attribute


# ---------------------------------------------------------------- errors


def test_explore_errors_name_the_function(seq2seq, task, monkeypatch):
    plain = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=8, hidden=16, attention=None)
    with pytest.raises(ValueError, match="explore: this model has no attention"):
        ta.viz.explore(plain, TEXT, task)
    with pytest.raises(ValueError, match="explore: n_best=2 needs a beam of at least 2, got beam=None"):
        ta.viz.explore(seq2seq, TEXT, task, n_best=2)
    with pytest.raises(ValueError, match="explore: '  ' has no tokens"):
        ta.viz.explore(seq2seq, "  ", task)
    with pytest.raises(TypeError, match="explore: model must be"):
        ta.viz.explore(object(), TEXT, task)
    monkeypatch.setattr(explore_module, "MAX_TOKENS", 3)
    with pytest.raises(ValueError, match="explore: the source has 6 tokens, more than the 3"):
        ta.viz.explore(seq2seq, TEXT, task)


# ---------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def checkpoint(transformer, task, tmp_path_factory):
    path = tmp_path_factory.mktemp("explore") / "model.ckpt"
    ta.models.save_checkpoint(path, transformer, task)
    return path


def one_line_error(capsys, *words):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, (word, err)


def test_cli_translate_explore_writes_the_page_for_one_line(checkpoint, transformer, task, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert cli.main(["translate", str(checkpoint), "a b c d", "--beam", "2", "--n-best", "2",
                     "--explore", str(out)]) == 0
    assert f"wrote the attention explorer to {out}" in capsys.readouterr().out
    page = embedded(out.read_text(encoding="utf-8"))
    expected = embedded(ta.viz.explore(transformer, "a b c d", task, beam=2, n_best=2).html)
    assert len(page["hypotheses"]) == 2
    np.testing.assert_allclose(page["hypotheses"][1]["cross"], expected["hypotheses"][1]["cross"], atol=1e-6)
    np.testing.assert_allclose(page["encoder"], expected["encoder"], atol=1e-6)
    # Run again: its own page is replaced.
    assert cli.main(["translate", str(checkpoint), "a b", "--explore", str(out)]) == 0
    assert embedded(out.read_text(encoding="utf-8"))["source"] == ["a", "b"]


def test_cli_translate_explore_refuses_what_it_cannot_write(checkpoint, tmp_path, capsys):
    mine = tmp_path / "mine.html"
    mine.write_text("keep me")
    cases = [
        (["a b", "c d", "--explore", str(tmp_path / "x.html")], ["--explore", "one TEXT, got 2"]),
        (["-", "--explore", str(tmp_path / "x.html")], ["--explore", "'-'"]),
        (["a b", "--explore", str(mine)], ["--explore", "not an attention explorer"]),
        (["a b", "--explore", str(tmp_path)], ["--explore", "is a directory"]),
        (["a b", "--explore", str(mine / "page.html")], ["cannot create the directory of --explore"]),
        (["a b", "--explore", str(checkpoint)], ["CHECKPOINT"]),
    ]
    for flags, words in cases:
        assert cli.main(["translate", str(checkpoint), *flags]) == 2, flags
        one_line_error(capsys, *words)
    assert mine.read_text() == "keep me" and not (tmp_path / "x.html").exists()


def test_cli_translate_explore_refuses_a_model_without_attention(task, tmp_path, capsys):
    path = tmp_path / "plain.ckpt"
    ta.models.save_checkpoint(path, ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=8, hidden=16,
                                                      attention=None), task)
    assert cli.main(["translate", str(path), "a b", "--explore", str(tmp_path / "x.html")]) == 2
    one_line_error(capsys, "without attention", "nothing to explore")
