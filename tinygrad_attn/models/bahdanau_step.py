"""One decoder step of Bahdanau et al. (2015), small enough to check symbolically and to draw.

    e_ij = v . tanh(W_q s_{i-1} + W_k h_j)      additive scores of the previous state
    a_ij = softmax_j(e_ij)
    c_i  = sum_j a_ij h_j
    s_i  = GRU([y_{i-1}; c_i], s_{i-1})
    logits = W_out [s_i; c_i] + b_out

It is the step that ``Seq2Seq(cell="gru", attention="additive", style="bahdanau")`` repeats
(its weights load into this module, see ``from_seq2seq``) for a source without padding and
without dropout (this step has no key mask and no dropout), written out as three modules for
``tinygrad-attn verify`` (sympy on every gradient) and ``examples/render_graph.py``.
"""

from __future__ import annotations

import numpy as np

from .. import check, nn
from .. import random as _random
from ..tensor import Tensor, cat


class BahdanauStep(nn.Module):
    """One Bahdanau decoder step from nn modules: s_{i-1} scores the keys (additive), the
    context joins the input of a GRU cell, and [s_i; c_i] is read out to logits.

    Args:
        embed: size E of y_{i-1}.  hidden: size H of the state and of the keys h_j.
        vocab: number V of logits.  attn_dim: size of the additive scores' hidden layer
            (default ``hidden``).
    """

    def __init__(self, embed: int, hidden: int, vocab: int, attn_dim: int | None = None):
        super().__init__()
        self.attention = nn.AdditiveAttention(hidden, hidden, hidden if attn_dim is None else attn_dim)
        self.cell = nn.GRUCell(embed + hidden, hidden)
        self.out = nn.Linear(2 * hidden, vocab)

    def forward(self, y_prev: Tensor, s_prev: Tensor, keys: Tensor) -> Tensor:
        """y_prev (B, E), s_prev (B, H), keys (B, S, H) -> logits (B, V)."""
        context, _ = self.attention(s_prev[:, None, :], keys)            # (B, 1, H)
        context = context[:, 0]                                          # (B, H)
        s = self.cell((y_prev, context), s_prev)                         # [y; c] in, (B, H) out
        return self.out(cat([s, context], axis=-1))                      # (B, V)

    @classmethod
    def from_seq2seq(cls, model) -> BahdanauStep:
        """The decoder step of a one-layer, unidirectional ``Seq2Seq(cell="gru",
        attention="additive", style="bahdanau")``, with its weights."""
        c = model.config
        wanted = dict(cell="gru", attention="additive", style="bahdanau", num_layers=1,
                      bidirectional=False)
        if any(c[k] != v for k, v in wanted.items()):
            got = ", ".join(f"{k}={c[k]!r}" for k in wanted)
            raise ValueError(f"BahdanauStep.from_seq2seq: needs a model with "
                             f"{', '.join(f'{k}={v!r}' for k, v in wanted.items())}; got {got}")
        weight = model.out.weight
        # dtype and device first: load_state_dict keeps each parameter's own dtype.
        step = cls(c["embed"], c["hidden"], c["tgt_vocab"], c["attn_dim"])
        step.astype(weight.dtype).to(weight.device)
        state = {f"attention.{k}": v for k, v in model.attention.state_dict().items()}
        state |= {f"cell.{k.removesuffix('_l0')}": v for k, v in model.decoder.state_dict().items()}
        state |= {f"out.{k}": v for k, v in model.out.state_dict().items()}
        step.load_state_dict(state)
        return step

    @classmethod
    def verify(cls) -> check.Report:
        """``ta.check.symbolic`` on one step at E = H = S = 2, vocabulary 6, batch 1, float64:
        every input's and parameter's gradient against sympy's exact one (what ``tinygrad-attn
        verify`` and ``make demo`` run).

        The output checked is one logit: the whole step's 6 logits take sympy about 3 times
        longer, and a whole 2-step seq2seq minutes (the expressions grow with every step).
        """
        with _random.using(np.random.default_rng(0)):
            step = cls(embed=2, hidden=2, vocab=6).double()
        rng = np.random.default_rng(0)
        y_prev = rng.standard_normal((1, 2))            # (B, E)
        s_prev = rng.standard_normal((1, 2))            # (B, H)
        keys = rng.standard_normal((1, 2, 2))           # (B, S, H)

        def bahdanau_step_logit(y_prev, s_prev, keys):
            return step(y_prev, s_prev, keys)[:, 3]

        return check.symbolic(bahdanau_step_logit, y_prev, s_prev, keys)
