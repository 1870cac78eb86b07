"""Train a tiny attention-pooling classifier with the engine, then verify its gradients.

Each example is a sequence of T tokens with D features.  One token is marked (feature 0
is 1 there); the label is whether that token's feature 1 is positive.  The other tokens
are noise, so averaging the sequence is no better than chance: the model has to learn
*where to look*.  It scores each token against a learned query q, turns the scores into
attention weights with a softmax, and classifies the weighted sum:

    scores = X q            (B, T)
    alpha  = softmax(scores)
    z      = alpha X        (B, D)      the attention output
    logits = z W + b        (B, 2)

Run:  python examples/quickstart.py     (what `make demo` runs)
"""

from __future__ import annotations

import time

import numpy as np

import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn import Tensor

T, D = 6, 5


def make_task(n: int, rng: np.random.Generator):
    x = rng.standard_normal((n, T, D))
    x[:, :, 0] = 0.0
    marked = rng.integers(0, T, size=n)
    x[np.arange(n), marked, 0] = 1.0
    y = (x[np.arange(n), marked, 1] > 0).astype(np.int64)
    return x, y, marked


def forward(x: Tensor, q: Tensor, W: Tensor, b: Tensor):
    """Logits (B, 2) and attention weights (B, T)."""
    scores = x @ q                                    # (B, T, D) @ (D,) -> (B, T)
    alpha = scores.softmax(axis=-1)                   # (B, T)
    z = (alpha.unsqueeze(1) @ x).squeeze(1)           # (B, 1, T) @ (B, T, D) -> (B, D)
    return z @ W + b, alpha                           # (B, 2)


def main() -> None:
    rng = np.random.default_rng(0)
    x_train, y_train, _ = make_task(2000, rng)
    x_test, y_test, marked_test = make_task(500, rng)

    q = Tensor(rng.standard_normal(D) * 0.1, requires_grad=True, name="q")
    W = Tensor(rng.standard_normal((D, 2)) * 0.1, requires_grad=True, name="W")
    b = Tensor(np.zeros(2), requires_grad=True, name="b")
    params = [q, W, b]

    def evaluate():
        with ta.no_grad():
            logits, alpha = forward(Tensor(x_test), q, W, b)
        accuracy = float(np.mean(logits.numpy().argmax(-1) == y_test))
        on_marked = float(np.mean(alpha.numpy()[np.arange(len(y_test)), marked_test]))
        return accuracy, on_marked

    accuracy, on_marked = evaluate()
    print(f"before training: test accuracy {accuracy:.1%}, "
          f"attention on the marked token {on_marked:.2f} (uniform would be {1 / T:.2f})")

    start, lr, batch = time.perf_counter(), 0.5, 50
    for step in range(601):
        idx = rng.integers(0, len(y_train), size=batch)
        logits, _ = forward(Tensor(x_train[idx]), q, W, b)
        loss = F.cross_entropy(logits, y_train[idx])
        for p in params:
            p.grad = None
        loss.backward()
        for p in params:  # plain SGD
            p.data -= lr * p.grad.data
        if step % 150 == 0:
            print(f"  step {step:4d}  loss {loss.item():.4f}")
    accuracy, on_marked = evaluate()
    print(f"after {step} steps ({time.perf_counter() - start:.1f} s): test accuracy {accuracy:.1%}, "
          f"attention on the marked token {on_marked:.2f}")

    print("\nExact gradient check of the whole model at a tiny size (B=1, T=2, D=2, 2 classes):")
    tiny = np.random.default_rng(1)
    report = ta.check.symbolic(
        lambda x, q, W, b: F.cross_entropy(forward(x, q, W, b)[0], np.array([1])),
        tiny.standard_normal((1, 2, 2)), tiny.standard_normal(2),
        tiny.standard_normal((2, 2)), tiny.standard_normal(2),
    )
    print(report)

    print("\nEvery registered op, checked with sympy and with finite differences:")
    ops_report = ta.check.ops()
    print(str(ops_report).splitlines()[-1])
    if not (report.ok and ops_report.ok):
        raise SystemExit("gradient verification FAILED")


if __name__ == "__main__":
    main()
