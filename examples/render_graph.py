"""Draw the engine's recorded graphs: one Bahdanau decoder step, and a whole tiny seq2seq.

1. ``bahdanau_step``: one decoder step i of the lecture notes' picture, from the nn modules
   that ``tinygrad-attn verify`` checks against sympy (``ta.models.BahdanauStep``):

       e_ij = v . tanh(W_q s_{i-1} + W_k h_j)      additive scores of the previous state
       a_ij = softmax_j(e_ij)                       the pink node; dashed red edges from each h_j
       c_i  = sum_j a_ij h_j
       s_i  = GRU([y_{i-1}; c_i], s_{i-1})
       logits = W_out [s_i; c_i] + b_out

2. ``seq2seq``: the loss of a GRU encoder-decoder with additive attention, trained for a few
   seconds to reverse 3 letters, on one held-out pair: 3 encoder steps, the first 2 decoder
   steps.  The dashed red edges run from each encoder state h_j to each step's attention
   weights, as thick as the weight: step t0 reads the last letter, t1 the middle one.

Run:  python examples/render_graph.py                  (writes docs/bahdanau_step.svg, docs/seq2seq.svg)
      python examples/render_graph.py --format png --out-dir /tmp/pictures
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import tinygrad_attn as ta
from tinygrad_attn import Tensor

DOCS = Path(__file__).resolve().parents[1] / "docs"


def bahdanau_step():
    """One decoder step's logits, its inputs named as in the notes (h_1..h_S kept in order)."""
    E, H, S, V = 2, 3, 3, 5
    ta.manual_seed(2)
    step = ta.models.BahdanauStep(embed=E, hidden=H, vocab=V)
    # Untrained scores are all close to 0 and the weights close to 1/S; a larger v spreads
    # them as a trained model's are, so the edges' widths differ.
    state = step.state_dict()
    state["attention.v"] = 4.0 * state["attention.v"]
    step.load_state_dict(state)

    rng = np.random.default_rng(2)
    hs = [Tensor(rng.standard_normal((1, 1, H)), requires_grad=True, name=f"h_{j + 1}") for j in range(S)]
    y_prev = Tensor(rng.standard_normal((1, E)), requires_grad=True, name="y_{i-1}")
    s_prev = Tensor(rng.standard_normal((1, H)), requires_grad=True, name="s_{i-1}")
    keys = ta.cat(hs, axis=1)                                            # (B, S, H)
    with ta.scope("decoder"), ta.scope("step i"):
        with ta.scope("attention"):
            context, _ = step.attention(s_prev, keys)                    # (B, H): one query per row
        context.name = "c_i"
        s = step.cell((y_prev, context), s_prev)                         # [y; c] in, (B, H) out
        s.name = "s_i"
        logits = step.out(ta.cat([s, context], axis=-1))                 # (B, V)
        logits.name = "logits"
    return logits


def tiny_seq2seq():
    """A GRU encoder-decoder with additive attention that reverses 3 letters (about 2 s of
    training); returns (the loss of one held-out pair's first 2 output tokens, their attention
    (T, S), source, target)."""
    task = ta.data.reverse(length=3, symbols=6, n_train=2000, n_test=20)
    ta.manual_seed(0)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=8, hidden=16, cell="gru",
                              attention="additive", style="bahdanau")
    ta.models.train(model, task, steps=300, batch_size=32, lr=1e-2)
    model.eval()
    source, target = task.test[0]
    batch = next(ta.data.batches([(source, target)], task.src_vocab, task.tgt_vocab, batch_size=1))
    # 2 decoder steps: <start> -> y_1, y_1 -> y_2 (teacher forcing); model.loss, with the weights
    logits, weights = model(batch.src, batch.tgt_in[:, :2])                      # (B, T, V), (B, T, S)
    loss = ta.functional.cross_entropy(logits, batch.tgt_out[:, :2], ignore_index=ta.data.PAD)
    return loss, weights.numpy()[0], source, target


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=DOCS, help=f"default {DOCS}")
    parser.add_argument("--format", choices=("svg", "png"), default="svg", help="default svg")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)

    logits = bahdanau_step()
    path = ta.viz.render(logits, args.out_dir / f"bahdanau_step.{args.format}", attention_edges=True)
    print(f"one Bahdanau decoder step (E=2, H=3, S=3, V=5): {len(ta.viz.nodes(logits))} tensors -> {path}")

    loss, weights, source, target = tiny_seq2seq()
    path = ta.viz.render(loss, args.out_dir / f"seq2seq.{args.format}", attention_edges=True)
    print(f"a tiny seq2seq trained to reverse 3 letters, on {' '.join(source)!r} -> {' '.join(target)!r} "
          f"(first 2 output tokens, loss {loss.item():.3g}): {len(ta.viz.nodes(loss))} tensors -> {path}")
    for t, row in enumerate(weights):
        print(f"  decoder step t{t} attends to h_1..h_{len(row)} with " + " ".join(f"{a:.2f}" for a in row))


if __name__ == "__main__":
    main()
