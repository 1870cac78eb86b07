"""The recorded graph as text: one line per tensor, in the order it was computed."""

from __future__ import annotations

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
