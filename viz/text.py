"""Text pictures: the recorded graph, one line per tensor in the order it was computed, and an
attention matrix as aligned columns."""

from __future__ import annotations

import sys

import numpy as np

from tinygrad_attn.autograd import toposort


def nodes(root) -> list:
    """Every tensor that ``root`` was computed from (leaves and constants included),
    inputs before the tensors made from them."""
    return list(reversed(toposort(root, only_grad=False)))


def _label(t) -> str:
    dtype = "" if t.dtype == np.float32 else f" {t.dtype}"
    return f"{tuple(t.shape)}{dtype}"


def summary(root) -> str:
    """One line per tensor: id, what made it (op and attributes, or leaf/constant), the
    ids of its inputs, its shape, and the scope it was made in.

    Example:
        >>> print(ta.viz.summary((x @ W).tanh().sum()))
        %0  leaf 'x'                (2, 3)
        %1  leaf 'W'                (3, 4)
        %2  MatMul(%0, %1)          (2, 4)
        ...
    """
    order = nodes(root)
    ids = {id(t): k for k, t in enumerate(order)}
    rows = []
    for k, t in enumerate(order):
        if t.node is None:
            kind = "leaf" if t.requires_grad else "const"
            what = f"{kind} {t.name!r}" if t.name else kind
            scope = ""
        else:
            args = ", ".join(f"%{ids[id(x)]}" for x in t.node.inputs)
            attrs = t.node.op.attrs_text()
            what = f"{t.node.op_name}[{args}]" + (f"({attrs})" if attrs else "")
            scope = t.node.scope
        rows.append((f"%{k}", what, _label(t), scope))
    width = max(len(r[1]) for r in rows)
    lines = [f"{i:<5}{what:<{width}}  {shape:<16}{scope}".rstrip() for i, what, shape, scope in rows]
    return "\n".join(lines)


def visible(token: str) -> str:
    """A column label that shows up: a space becomes an open box (or _ where that can't print)."""
    if token != " ":
        return token
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        "\u2423".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return "_"
    return "\u2423"


def format_attention(weights: np.ndarray, src_tokens, out_tokens) -> str:
    """The attention matrix as aligned text: one row per output token (``<end>`` after the
    tokens when the decoder produced it), one column per source token, weights to 2 decimals.

    Example:
        >>> print(format_attention(attention, list("3 may"), list("05-03")))
                 3    ␣    m    a    y
        0     0.01 0.02 0.85 0.10 0.02
        ...
    """
    weights = np.asarray(weights, dtype=np.float64)
    rows = [visible(t) for t in row_labels(out_tokens, weights)]
    columns = [visible(t) for t in src_tokens]
    width = max([4] + [len(c) for c in columns])          # "0.00" is 4 wide
    label = max([0] + [len(r) for r in rows])
    lines = [" " * label + "".join(f" {c:>{width}}" for c in columns)]
    for name, row in zip(rows, weights, strict=True):
        lines.append(f"{name:<{label}}" + "".join(f" {w:>{width}.2f}" for w in row))
    return "\n".join(lines)


def row_labels(tokens, attention) -> list[str]:
    """The output tokens, and ``<end>`` when the attention has a row for it."""
    return list(tokens) + ["<end>"] * (attention.shape[0] - len(tokens))
