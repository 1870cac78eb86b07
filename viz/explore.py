"""The attention explorer: one self-contained HTML file (inline CSS and JavaScript, nothing
fetched) showing how a model attended while it translated one text, in the manner of bertviz:
source and output tokens in two columns joined by lines as opaque as their weights, and the
matrix beside them.  Hovering a token shows what it attends to and what attends to it.

    >>> explorer = ta.viz.explore(model, "3 may 1998", task, path="attention.html")
    >>> explorer                          # in Jupyter: the page itself, in an iframe

A Seq2Seq has one matrix, its decoder's attention over the source.  A Transformer has, for
every layer and head, the encoder's self-attention, the decoder's (causal) self-attention and
the cross-attention, each also averaged over the heads.  With ``beam`` and ``n_best`` every
hypothesis is there with its score.
"""

from __future__ import annotations

import html
import json
import os
import stat
from pathlib import Path

import numpy as np

from tinygrad_attn import data, models
from tinygrad_attn.models import decoding
from tinygrad_attn.serialize import atomic_file

from .explore_page import CSS, JS, ROW
from .heatmap import label_text

__all__ = ["MAX_TOKENS", "MAX_VALUES", "MARKER"]

#: The most tokens a side may have: past it the lines and the matrix are no longer readable.
MAX_TOKENS = 256
#: The most weights the page embeds with every head (6 decimals each, about 9 bytes); past it
#: only each layer's mean over the heads is embedded, and the page says so.
MAX_VALUES = 2_000_000
#: The comment on the second line of every page ``explore`` writes: ``save`` replaces only
#: files that carry it (or anything, with ``overwrite=True``).
MARKER = "<!-- tinygrad_attn attention explorer -->"
DECIMALS = 6

_KINDS = {
    "cross": ("cross-attention (output \u2192 source)", "source (attended to)", "output (attending)"),
    "encoder": ("encoder self-attention", "source (attended to)", "source (attending)"),
    "decoder": ("decoder self-attention (causal)", "decoder input (attended to)",
                "output it produces (attending)"),
}


class Explorer:
    """What ``explore`` returns: the page (``html``), what it holds (``weights``: the arrays
    embedded, by name), ``notes`` (what was left out, also shown on the page), and ways to
    keep it: ``save(path)``, or Jupyter's display (``_repr_html_``)."""

    def __init__(self, page: str, weights: dict, notes: list[str], height: int):
        self.html, self.weights, self.notes = page, weights, notes
        self._height = height
        self.path: Path | None = None

    def save(self, path, overwrite: bool = False) -> Path:
        """Write the page to ``path`` atomically (complete, or not at all).  A file already there
        is replaced only if ``explore`` wrote it, or with ``overwrite=True``.

        Raises:
            FileExistsError: ``path`` is another file, and ``overwrite`` is False.
            FileNotFoundError, PermissionError, IsADirectoryError: as ``ta.serialize.atomic_file``.
        """
        path = Path(path)
        if not overwrite and not self.replaceable(path):
            self.refuse(path)
        with atomic_file(path, "explore") as file:
            file.write(self.html.encode("utf-8"))
        self.path = path
        return path

    @staticmethod
    def refuse(path):
        raise FileExistsError(f"explore: {str(path)!r} exists and is not an attention explorer written by "
                              f"tinygrad_attn; remove it, choose another path, or pass overwrite=True")

    @staticmethod
    def replaceable(path) -> bool:
        """Whether ``save`` may write ``path`` without ``overwrite``: nothing is there, a page
        ``explore`` wrote, or something that is not a regular file (a FIFO, /dev/stdout) and so
        is written through, not replaced."""
        if not os.path.lexists(path):
            return True
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return True                       # a dangling link: its target is created
        if not stat.S_ISREG(mode):
            return True
        with open(path, "rb") as file:
            head = file.read(256)
        return MARKER.encode("ascii") in head

    def _repr_html_(self) -> str:
        # An iframe's srcdoc keeps the page's script and styles apart from the notebook's.
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width: 100%; '
                f'height: {self._height}px; border: 1px solid #dde3ea;" sandbox="allow-scripts"></iframe>')

    def __repr__(self) -> str:
        where = f", saved to {str(self.path)!r}" if self.path is not None else ""
        return f"<Explorer: {', '.join(self.weights)}{where}>"


def explore(model, text: str, task_like, *, beam: int | None = None, n_best: int | None = None,
            length_penalty: float = 1.0, max_len: int | None = None, path=None, title: str | None = None,
            overwrite: bool = False) -> Explorer:
    """Translate ``text`` and build the page that explores the model's attention.

    The weights are the model's own: a Seq2Seq's are those its decoding returned with the
    output; a Transformer's, every layer and head, come from one eager teacher-forced pass
    over the output it produced (``model(src, tgt_in, need_weights=True)``, which decoding
    equals to rounding), the way ``beam_search(..., average_weights=False)`` gets them.

    Args:
        model: a ``ta.models.Seq2Seq`` or ``ta.models.Transformer`` with attention.
        text: the source text, tokenized by ``task_like``.
        task_like: gives ``tokenize``, ``detokenize`` and the vocabularies (a Task, or the
            Checkpoint ``load_checkpoint`` returns).
        beam: beam width (None: greedy).  n_best: show this many hypotheses of the beam,
            best first, with their scores (needs ``beam`` >= ``n_best``).  length_penalty: Wu
            et al.'s alpha for the beam's scores.
        max_len: tokens to produce at most (default: ``translate_tokens``').
        path: also ``save`` the page there.  title: the page's heading.
        overwrite: as ``Explorer.save``'s.

    Returns:
        an ``Explorer``.

    Raises:
        ValueError: a model without attention, an empty text, n_best without a wide enough
            beam, or a side longer than ``MAX_TOKENS`` tokens.

    Example:
        >>> model, info = ta.models.load_checkpoint("dates.ckpt")
        >>> ta.viz.explore(model, "3 may 1998", info, beam=4, n_best=3).save("dates.html")
    """
    if path is not None and not overwrite and not Explorer.replaceable(path):
        Explorer.refuse(path)                         # before any work, not after it
    if not isinstance(model, models.Seq2Seq | models.Transformer):
        raise TypeError(f"explore: model must be a ta.models.Seq2Seq or Transformer, got "
                        f"{type(model).__name__}")
    if model.attention_kind is None:
        raise ValueError("explore: this model has no attention (its decoder does not read the source "
                         "through attention), so there is nothing to explore")
    if n_best is not None and (beam is None or n_best > beam):
        raise ValueError(f"explore: n_best={n_best} needs a beam of at least {n_best}, got beam={beam}")
    source = task_like.tokenize(text)
    if not source:
        raise ValueError(f"explore: {text!r:.60} has no tokens to translate")
    _check_length(len(source), "the source")
    hypotheses = _decode(model, source, task_like, beam, n_best, length_penalty, max_len)
    for found in hypotheses:
        _check_length(len(found["rows"]), "the output")
    weights = _weights(model, source, task_like, hypotheses)
    payload, notes = _payload(model, source, task_like, hypotheses, weights)
    page = _page(payload, title, text, hypotheses[0]["text"])
    explorer = Explorer(page, weights, notes, _height(payload))
    if path is not None:
        explorer.save(path, overwrite=overwrite)
    return explorer


def _check_length(count: int, what: str) -> None:
    if count > MAX_TOKENS:
        raise ValueError(f"explore: {what} has {count} tokens, more than the {MAX_TOKENS} the page shows "
                         f"(MAX_TOKENS); explore a shorter text")


def _decode(model, source: list, task_like, beam, n_best, length_penalty, max_len) -> list[dict]:
    """The hypotheses to show, best first, decoded as ``ta.models.translate_tokens`` does: each
    one's ids, tokens, row labels (the tokens, and ``<end>`` if made), scores and the attention
    its decoding returned."""
    decoding.check_source_lengths(model, [len(source)], "explore")
    src = data.encode_batch([source], task_like.src_vocab)                         # (1, S)
    limit = max_len if max_len is not None else decoding.default_max_len(len(source))
    if beam is None:
        found = model.greedy(src, max_len=limit, hypotheses=True)
    else:
        # A beam is asked for its n-best (at least 1) so that its score can be shown.
        [found] = model.beam_search(src, beam=beam, max_len=limit, length_penalty=length_penalty,
                                    n_best=n_best or 1)
    hypotheses = []
    for h in found:
        tokens = task_like.tgt_vocab.decode(h.tokens)
        rows = list(tokens) + ["<end>"] * (len(h.tokens) - len(tokens))
        hypotheses.append({"ids": list(h.tokens), "rows": rows, "attention": np.asarray(h.attention),
                           "text": task_like.detokenize(tokens), "log_prob": h.log_prob,
                           "score": None if beam is None else h.score})
    return hypotheses


def _weights(model, source: list, task_like, hypotheses: list[dict]) -> dict:
    """Every matrix the page shows, as float arrays (layers, heads, queries, keys):
    ``"encoder"``, and per hypothesis k ``"cross/k"`` and ``"decoder/k"``."""
    if isinstance(model, models.Seq2Seq):
        return {f"cross/{k}": h["attention"][None, None] for k, h in enumerate(hypotheses)}
    length = max(len(h["rows"]) for h in hypotheses)
    tgt_in = np.zeros((len(hypotheses), length), dtype=np.int64)                   # (N, T)
    tgt_in[:, 0] = data.START
    for k, h in enumerate(hypotheses):
        tgt_in[k, 1 : len(h["ids"])] = h["ids"][:-1]
    src = data.encode_batch([source] * len(hypotheses), task_like.src_vocab)        # (N, S)
    with decoding.inference(model):
        _, record = model(src, tgt_in, need_weights=True)
    found = {}
    if len(model.transformer.encoder.layers):
        found["encoder"] = model.layer_attention(record, "encoder/self_attention")[:, 0]  # (L, H, S, S)
    cross = model.layer_attention(record)                                           # (L, N, H, T, S)
    causal = model.layer_attention(record, "self_attention")                        # (L, N, H, T, T)
    for k, h in enumerate(hypotheses):
        rows = len(h["rows"])
        found[f"cross/{k}"] = cross[:, k, :, :rows]
        found[f"decoder/{k}"] = causal[:, k, :, :rows, :rows]
    return found


def _payload(model, source, task_like, hypotheses, weights) -> tuple[dict, list[str]]:
    """The JSON the page reads, and the notes on what it leaves out."""
    heads = next(iter(weights.values())).shape[1]
    total = sum(w.size for w in weights.values())
    averaged = heads > 1 and total > MAX_VALUES
    kept = total // heads if averaged else total
    if kept > MAX_VALUES:
        even = " even averaged over the heads" if averaged else ""
        raise ValueError(f"explore: the page would hold {kept:,} weights{even}, more than MAX_VALUES "
                         f"({MAX_VALUES:,}); explore a shorter text or fewer hypotheses")
    notes = []
    if averaged:
        notes.append(f"{total:,} weights are more than this page holds ({MAX_VALUES:,}): each layer is shown "
                     f"averaged over its {heads} heads only")

    def matrices(name):
        if name not in weights:
            return None
        stack = weights[name].astype(np.float64)
        if averaged:
            stack = stack.mean(axis=1, keepdims=True)
        return np.round(stack, DECIMALS).tolist()

    kinds = [("cross", len(weights["cross/0"]))]
    if "encoder" in weights:
        kinds.append(("encoder", len(weights["encoder"])))
    if "decoder/0" in weights:
        kinds.append(("decoder", len(weights["decoder/0"])))
    vocab = task_like.src_vocab
    payload = {
        "row_height": ROW,
        "source": [label_text(t) for t in source],
        "unknown": [t not in vocab for t in source],
        "heads": heads,
        "averaged": averaged,
        "kinds": [{"id": kind, "name": _KINDS[kind][0], "keys": _KINDS[kind][1], "queries": _KINDS[kind][2],
                   "layers": layers} for kind, layers in kinds],
        "encoder": matrices("encoder"),
        "hypotheses": [{"text": h["text"], "score": h["score"], "log_prob": h["log_prob"],
                        "rows": [label_text(t) for t in h["rows"]],
                        "inputs": ["<start>"] + [label_text(t) for t in h["rows"][:-1]],
                        "cross": matrices(f"cross/{k}"), "decoder": matrices(f"decoder/{k}")}
                       for k, h in enumerate(hypotheses)],
        "model": _describe(model),
        "notes": notes + _unknown_note(source, vocab),
    }
    return payload, payload["notes"]


def _unknown_note(source, vocab) -> list[str]:
    unknown = list(dict.fromkeys(t for t in source if t not in vocab))
    if not unknown:
        return []
    return [f"not in the source vocabulary, read as <unk> (underlined): {', '.join(map(repr, unknown))}"]


def _describe(model) -> str:
    c = model.config
    if isinstance(model, models.Transformer):
        return (f"Transformer: {c['num_encoder_layers']} encoder and {c['num_decoder_layers']} decoder "
                f"layers, {c['nhead']} heads, d_model {c['d_model']}")
    return f"Seq2Seq: {c['cell']} cells, {c['attention']} attention ({c['style']}), hidden {c['hidden']}"


def _script_json(value) -> str:
    """JSON that is safe inside <script>: no "<", ">" or "&" can end the element early."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _page(payload: dict, title, text: str, output: str) -> str:
    heading = title if title is not None else "Attention explorer"
    notes = "".join(f'<p class="notice">{html.escape(n)}</p>' for n in payload["notes"])
    causal = "" if payload["hypotheses"][0]["decoder"] is None else (
        " The decoder's self-attention labels each position by the token it produces: it sees &lt;start&gt; "
        "and the tokens before.")
    return f"""<!DOCTYPE html>
{MARKER}
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(heading)}</title>
<style>{CSS}</style>
</head>
<body>
<h1>{html.escape(heading)}</h1>
<p class="summary">{html.escape(payload["model"])}</p>
<p class="translation">{html.escape(repr(text))} \u2192 {html.escape(repr(output))}</p>
{notes}
<table class="nbest" id="nbest"></table>
<div class="controls">
<label>attention<select id="kind"></select></label>
<label>layer<select id="layer"></select></label>
<label>head<select id="head"></select></label>
</div>
<p class="help">Lines join each token on the left (attended to) with each token on the right (attending),
as opaque as the weight. Hover a token on the right to see what it attends to, one on the left to see what
attends to it; the weights are written on the tokens and the matrix marks the row or column.{causal}</p>
<div class="views" id="views">
<div class="lines-view">
<div class="column"><h2 id="keys-title"></h2><div class="tokens keys" id="keys"></div></div>
<div class="column"><h2></h2><svg class="lines" id="lines" width="180" height="0"></svg></div>
<div class="column"><h2 id="queries-title"></h2><div class="tokens queries" id="queries"></div></div>
</div>
<div class="matrix-view"><h2>matrix: rows attend to columns</h2><table class="matrix" id="matrix"></table>
<div class="readout" id="readout"></div></div>
</div>
<script type="application/json" id="explorer-data">{_script_json(payload)}</script>
<script>{JS}</script>
</body>
</html>
"""


def _height(payload: dict) -> int:
    """The iframe's height in a notebook: the taller view, within reason (it scrolls past)."""
    rows = max([len(payload["source"])] + [len(h["rows"]) for h in payload["hypotheses"]])
    return min(260 + rows * ROW + 40 * len(payload["hypotheses"]), 900)
