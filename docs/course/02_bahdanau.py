# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. Bahdanau's additive attention, one decoder step at a time
#
# Seed 002 (the handwritten notes, "Bahdanau Attention") works through decoder step $i$ of
# Bahdanau, Cho & Bengio (ICLR 2015) on four encoder states $h_1 \dots h_4$:
#
# $$e_{ij} = v^\top \tanh\!\big(W [s_{i-1}; h_j] + b\big), \qquad
# \alpha_{ij} = \frac{\exp(e_{ij})}{\sum_{k} \exp(e_{ik})}, \qquad c_i = \sum_j \alpha_{ij} h_j .$$
#
# The score reads the **previous** decoder state $s_{i-1}$ ("$\alpha_{ij} = f(h_j, s_{i-1})$"), and the
# context $c_i$ then joins the input of the recurrent cell that makes $s_i$ (seed 004's
# "SimpleRNN + Attention": $s_1 = \tanh(A'[x'_1; s_0; c_0] + b)$).
#
# **Where the note and the paper differ, we follow the paper.** The paper's alignment model
# (appendix A.1.2) is $e_{ij} = v_a^\top \tanh(W_a s_{i-1} + U_a h_j)$, with no bias inside the tanh.
# Splitting the note's $W$ into the columns that meet $s_{i-1}$ and those that meet $h_j$ gives the same
# thing, $W[s; h] = W_q s + W_k h$, which is how the package writes it:
#
# $$e_{ij} = v^\top \tanh(W_q s_{i-1} + W_k h_j).$$
#
# The seed also writes a $1/\sqrt{d_k}$ in one version of the score; that scaling belongs to the
# Transformer's dot product (notebook 4), not to Bahdanau's additive score.

# %%
import numpy as np
import sympy as sp

import tinygrad_attn as ta
from tinygrad_attn import Tensor

ta.set_num_threads(1)
np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## One step by hand, then by the package
#
# `ta.models.BahdanauStep` is one decoder step built from three modules: the additive
# attention, a GRU cell that reads $[y_{i-1}; c_i]$, and a readout of $[s_i; c_i]$:
#
# $$s_i = \mathrm{GRU}([y_{i-1}; c_i], s_{i-1}), \qquad \text{logits}_i = W_{out}[s_i; c_i] + b_{out}.$$
#
# We take its (random) weights and compute the attention part with numpy, line by line from the
# formulas, then compare with `ta.attention.additive`.

# %%
E, H, S, V = 3, 4, 4, 6            # embedding, state size, source length (h_1..h_4), vocabulary
ta.manual_seed(0)
step = ta.models.BahdanauStep(embed=E, hidden=H, vocab=V).double()
rng = np.random.default_rng(0)
h = rng.standard_normal((S, H))    # encoder states h_1..h_4, one per row
s_prev = rng.standard_normal(H)    # s_{i-1}
y_prev = rng.standard_normal(E)    # embedding of the previous output y_{i-1}

W_q, W_k, v = (p.numpy() for p in (step.attention.W_q, step.attention.W_k, step.attention.v))
e = np.array([v @ np.tanh(W_q @ s_prev + W_k @ h_j) for h_j in h])   # e_ij = v . tanh(W_q s + W_k h_j)
alpha = np.exp(e - e.max()) / np.exp(e - e.max()).sum()              # softmax over j
c = alpha @ h                                                        # c_i = sum_j alpha_ij h_j
print("scores  e_i  =", e)
print("weights α_i  =", alpha, " (sum", alpha.sum().round(12), ")")
print("context c_i  =", c)

context, weights = ta.attention.additive(Tensor(s_prev, dtype="float64"), Tensor(h, dtype="float64"),
                                         step.attention.W_q,
                                         step.attention.W_k, step.attention.v)
print("package α_i  =", weights.numpy())
print("max |difference|: weights", np.abs(weights.numpy() - alpha).max(),
      " context", np.abs(context.numpy() - c).max())

# %% [markdown]
# ## The computation graph of the step
#
# The engine records every op with the scope it ran in, and `ta.viz.graph` draws it with
# Graphviz. The named inputs are the notes' symbols; the dashed red edges run from each
# $h_j$ to the attention weights $\alpha_{ij}$ (pink), as thick as the weight.

# %%
# One tensor per h_j, joined by a cat, so that the drawing has a node (and an edge) per h_j; only
# tensors that need a gradient are recorded, so the h_j ask for one.
hs = [Tensor(h[None, j : j + 1], dtype="float64", requires_grad=True, name=f"h_{j + 1}")
      for j in range(S)]                                                                 # S x (1, 1, H)
keys = ta.cat(hs, axis=1)                                                                # (B=1, S, H)
with ta.scope("decoder"), ta.scope("step i"):
    logits = step(Tensor(y_prev[None], dtype="float64", name="y_{i-1}"),
                  Tensor(s_prev[None], dtype="float64", name="s_{i-1}"), keys)
ta.viz.graph(logits, attention_edges=True)

# %% [markdown]
# ## The gradient, checked exactly with sympy
#
# For the score alone the derivatives are short enough to write down. With
# $u_j = \tanh(W_q s + W_k h_j)$,
#
# $$\frac{\partial e_j}{\partial v} = u_j, \qquad
# \frac{\partial e_j}{\partial s} = W_q^\top\big(v \odot (1 - u_j^2)\big).$$
#
# sympy derives them from the formula; we compare with what `backward` computes.

# %%
s_sym = sp.Matrix(sp.symbols("s1:3"))
h_sym = sp.Matrix(sp.symbols("h1:3"))
Wq_sym = sp.Matrix(2, 2, sp.symbols("q1:5"))
Wk_sym = sp.Matrix(2, 2, sp.symbols("k1:5"))
v_sym = sp.Matrix(sp.symbols("v1:3"))
e_sym = (v_sym.T * (Wq_sym * s_sym + Wk_sym * h_sym).applyfunc(sp.tanh))[0]
de_ds = [sp.diff(e_sym, x) for x in s_sym]
print("e =", e_sym)
print("∂e/∂s1 =", de_ds[0])

values = dict(zip(list(s_sym) + list(h_sym) + list(Wq_sym) + list(Wk_sym) + list(v_sym),
                  rng.standard_normal(14), strict=True))
exact = np.array([float(g.subs(values)) for g in de_ds])


def f64(matrix, requires_grad=False):
    """A float64 Tensor holding a sympy matrix's value at the point ``values``."""
    return Tensor(np.array(matrix.subs(values), dtype=float).squeeze(), dtype="float64",
                  requires_grad=requires_grad)


s_t = f64(s_sym, requires_grad=True)
score = (f64(v_sym) * (f64(Wq_sym) @ s_t + f64(Wk_sym) @ f64(h_sym)).tanh()).sum()   # e = v . tanh(...)
score.backward()
print("sympy ∂e/∂s =", exact, "\nbackward    =", s_t.grad.numpy(),
      "\nmax |difference| =", np.abs(exact - s_t.grad.numpy()).max())

# %% [markdown]
# `ta.check.symbolic` does this for any function: it replays the recorded graph on sympy
# symbols, differentiates exactly, and compares every input's gradient with `backward`. Here
# it checks the whole Bahdanau step (attention, GRU cell, readout) for every input and every
# parameter, at $E = H = S = 2$:

# %%
report = ta.models.BahdanauStep.verify()
print(report)
assert report.ok

# %% [markdown]
# ## A trained model, one decoder step at a time
#
# `Seq2Seq(attention="additive", style="bahdanau")` repeats exactly this step.
# We train one for a few seconds to **reverse** 5 letters, take its step with
# `BahdanauStep.from_seq2seq`, and run the decoder by hand: start from $s_0$ (the encoder's last
# state), feed $y_0 = \langle start \rangle$, pick the most likely letter, feed it back.

# %%
task = ta.data.reverse(length=5, symbols=8, n_train=3000, n_test=100, seed=0)
ta.manual_seed(0)
model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=16, hidden=32, cell="gru",
                          attention="additive", style="bahdanau")
ta.models.train(model, task, steps=300, batch_size=32, lr=1e-2, eval_every=0)
model.eval()

source, target = task.test[0]
src = ta.data.encode_batch([source], task.src_vocab)                # (1, S) ids
bahdanau = ta.models.BahdanauStep.from_seq2seq(model)
with ta.no_grad():
    memory = model.encode(src)                                       # h_j and s_0
    s_i, token, outputs, rows = memory.states[0][:, 0], ta.data.START, [], []
    for _ in range(len(source) + 1):
        y_prev = model.tgt_embed(np.array([[token]]))[:, 0]          # (1, E)
        context_i, alpha_i = bahdanau.attention(s_i, memory.keys)    # α_i from s_{i-1}, c_i
        s_i = bahdanau.cell((y_prev, context_i), s_i)                # s_i = GRU([y; c], s_{i-1})
        step_logits = bahdanau.out(ta.cat([s_i, context_i], axis=-1))
        token = int(step_logits.numpy().argmax())
        rows.append(alpha_i.numpy()[0])
        outputs.append(token)
        if token == ta.data.END:
            break
produced = task.tgt_vocab.decode(outputs)
print("source:", " ".join(source), "  target:", " ".join(target))
for i, (word, row) in enumerate(zip(produced + ["<end>"], rows, strict=True)):
    print(f"step {i + 1}: α = {np.round(row, 2)}  ->  {word}")

# %% [markdown]
# ## What to check
#
# The hand-run decoder must agree with the model's own greedy decoding, token for token, and
# reversing means step $i$ should look at source position $S + 1 - i$: the anti-diagonal.

# %%
ids, weights = model.greedy(src, max_len=len(source) + 1)
print("model.greedy :", task.tgt_vocab.decode(ids[0].tolist()))
print("by hand      :", produced)
print("max |α by hand - α greedy| =", np.abs(np.array(rows) - weights[0, : len(rows)]).max())
scores = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
print(f"held-out exact match after 300 steps: {scores['exact_match']:.2f}")
