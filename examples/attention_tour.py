"""A tour of every attention mechanism on the lecture notes' toy example.

Four encoder states h_1..h_4 (the source sentence "i love my cat") and one decoder state s
(about to emit "ich").  Each mechanism scores every h_j against s, turns the scores into a
distribution with a softmax, and takes the weighted sum of the h_j:

    e_j = score(s, h_j)        alpha = softmax(e)        c = sum_j alpha_j h_j

For each one this prints the scores (computed by hand in numpy from the formula), the
weights and context from ``ta.attention`` (checked against the hand computation), then
multi-head self-attention and graph attention over the same four states, Luong's attention
vector, and an exact sympy check of one mechanism.

Run:  python examples/attention_tour.py
"""

from __future__ import annotations

import numpy as np

import tinygrad_attn as ta
from tinygrad_attn import Tensor

WORDS = ["i", "love", "my", "cat"]
H = np.array([[1.0, 0.0, 1.0, 0.0],      # h_1  "i"
              [0.0, 1.0, 0.0, 1.0],      # h_2  "love"
              [1.0, 1.0, 0.0, 0.0],      # h_3  "my"
              [0.0, 0.0, 1.0, 1.0]])     # h_4  "cat"
S = np.array([1.0, 0.0, 0.5, 0.0])       # s    the decoder state before "ich"
D, A = 4, 3                               # state size, attention size of the learned scores


def softmax(e: np.ndarray) -> np.ndarray:
    z = np.exp(e - e.max())
    return z / z.sum()


def params(seed: int = 0) -> dict[str, np.ndarray]:
    """Fixed small weights for the mechanisms that learn some (as if trained)."""
    rng = np.random.default_rng(seed)
    return {"W": rng.normal(0, 0.5, (D, D)), "W_cat": rng.normal(0, 0.5, (A, 2 * D)),
            "W_q": rng.normal(0, 0.5, (A, D)), "W_k": rng.normal(0, 0.5, (A, D)),
            "v": rng.normal(0, 1.0, A)}


def mechanisms(p: dict[str, np.ndarray]):
    """(name, formula, scores by hand, call into ta.attention) for each score function."""
    s, h = Tensor(S), Tensor(H)
    return [
        ("dot", "s . h_j", H @ S,
         lambda: ta.attention.dot(s, h)),
        ("general (Luong)", "s^T W h_j", H @ p["W"].T @ S,
         lambda: ta.attention.general(s, h, Tensor(p["W"]))),
        ("concat (Luong)", "v . tanh(W [s; h_j])",
         np.array([p["v"] @ np.tanh(p["W_cat"] @ np.concatenate([S, hj])) for hj in H]),
         lambda: ta.attention.concat(s, h, Tensor(p["W_cat"]), Tensor(p["v"]))),
        ("additive (Bahdanau)", "v . tanh(W_q s + W_k h_j)",
         np.array([p["v"] @ np.tanh(p["W_q"] @ S + p["W_k"] @ hj) for hj in H]),
         lambda: ta.attention.additive(s, h, Tensor(p["W_q"]), Tensor(p["W_k"]), Tensor(p["v"]))),
        ("scaled dot-product", "s . h_j / sqrt(d)", H @ S / np.sqrt(D),
         lambda: ta.attention.scaled_dot_product(s, h, h)),
    ]


def row(label: str, values) -> str:
    return f"  {label:<8}" + "".join(f"{x:>8.3f}" for x in values)


def main() -> None:
    np.set_printoptions(precision=3, suppress=True)
    p = params()
    print("encoder states h_j (rows):", *[f"  {w:<5} {h}" for w, h in zip(WORDS, H, strict=True)],
          f"decoder state s: {S}\n", sep="\n")

    for name, formula, scores, call in mechanisms(p):
        context, weights = call()
        assert np.allclose(weights.numpy(), softmax(scores), atol=1e-6), name
        assert np.allclose(context.numpy(), softmax(scores) @ H, atol=1e-6), name
        print(f"{name}:  e_j = {formula}")
        print(f"  {'':<8}" + "".join(f"{w:>8}" for w in WORDS))
        print(row("score", scores))
        print(row("weight", weights.numpy()))
        focus = WORDS[int(weights.numpy().argmax())]
        print(f"  context c = {context.numpy()}   (attends most to {focus!r})\n")

    print("masked: 'my' and 'cat' hidden (mask True = may attend)")
    context, weights = ta.attention.dot(Tensor(S), Tensor(H), mask=np.array([True, True, False, False]))
    print(row("weight", weights.numpy()) + "\n")

    ta.manual_seed(0)
    mha = ta.nn.MultiHeadAttention(embed_dim=D, num_heads=2)
    x = Tensor(H[None])                                       # (B=1, T=4, E=4)
    _, weights = mha(x, x, x, causal=True, average_weights=False)
    print("multi-head self-attention over h_1..h_4, 2 heads, causal (row i: where word i looks):")
    for head in range(2):
        print(f" head {head}:")
        for word, w in zip(WORDS, weights.numpy()[0, head], strict=True):
            print(row(word, w))
    print()

    chain = np.array([[False, True, False, False],          # i - love - my - cat
                      [True, False, True, False],
                      [False, True, False, True],
                      [False, False, True, False]])
    gat = ta.nn.GraphAttention(D, 2, heads=1)
    out, weights = gat(Tensor(H), chain)
    print("graph attention (GAT) on the chain i - love - my - cat, with self loops:")
    for word, w in zip(WORDS, weights.numpy()[0], strict=True):
        print(row(word, w))
    print(f"  new node features (4, 2):\n{out.numpy()}\n")

    context, _ = ta.attention.dot(Tensor(S), Tensor(H))
    vector = ta.nn.LuongAttentionVector(context_dim=D, hidden_dim=D)(context, Tensor(S))
    print(f"Luong attention vector a = tanh(W_c [c; s]) = {vector.numpy()}\n")

    print("exact check: additive attention's gradients derived by sympy vs backward")
    report = ta.check.symbolic(
        lambda s, h, W_q, W_k, v: ta.attention.additive(s, h, W_q, W_k, v)[0],
        S[:2], H[:3, :2], p["W_q"][:2, :2], p["W_k"][:2, :2], p["v"][:2])
    print(report)
    if not report.ok:
        raise SystemExit("gradient verification FAILED")


if __name__ == "__main__":
    main()
