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
# # 4. Scaled dot-product, self- and multi-head attention
#
# Seed 001 ("RNN with parameterized attention") already has the three roles: the decoder state
# is the **query**, the encoder states are the **keys** and the **values**, each through its own
# projection, $a(t) = (W^k [y^e(1), \dots])^\top (W^Q y^d(t))$ and $y^a(t) = (W^v[\dots]) a_1(t)$.
# Seed 004 calls it "Option 2 (more popular; the same to Transformer)": $k_i = W_K h_i$,
# $q_0 = W_Q s_0$, $\tilde\alpha_i = k_i^\top q_0$. Seed 003 writes the Transformer's form (Vaswani et
# al., *Attention is all you need*, NIPS 2017, eq. 1) for many queries at once:
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\Big(\frac{Q K^\top}{\sqrt{d_k}}\Big) V$$
#
# with the remark "scaling factor accounts for gradient saturation", and adds: "self-attention is
# when Q, K, V are the same", and multi-head attention is "h parallel & independent self-attention
# modules ... then concatenate/average their features". **The paper concatenates** (and then
# projects, $W^O$); averaging is not in it, so we follow the paper:
#
# $$\mathrm{MultiHead}(Q, K, V) = [\mathrm{head}_1; \dots; \mathrm{head}_h] W^O, \qquad
# \mathrm{head}_i = \mathrm{Attention}(Q W_i^Q, K W_i^K, V W_i^V).$$

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import SVG

import tinygrad_attn as ta
import tinygrad_attn.functional as F
from tinygrad_attn import Tensor

ta.set_num_threads(1)
np.set_printoptions(precision=3, suppress=True)
rng = np.random.default_rng(0)

# %% [markdown]
# ## The formula, in numpy and in the package
#
# `ta.attention.scaled_dot_product(q, k, v, mask=None, causal=False)` returns `(context, weights)`.
# A mask is boolean, **True = may attend**; `causal=True` lets query $t$ see keys $\le t$ only.

# %%
T, S, d_k, d_v = 3, 5, 4, 2
Q, K, V = rng.standard_normal((T, d_k)), rng.standard_normal((S, d_k)), rng.standard_normal((S, d_v))

scores = Q @ K.T / np.sqrt(d_k)                                   # (T, S)
weights = np.exp(scores - scores.max(-1, keepdims=True))          # softmax over the keys
weights /= weights.sum(-1, keepdims=True)
context = weights @ V                                             # (T, d_v)

ctx, w = ta.attention.scaled_dot_product(Tensor(Q), Tensor(K), Tensor(V))
print("weights (T, S):\n", w.numpy())
print("max |difference|: weights", np.abs(w.numpy() - weights).max(),
      " context", np.abs(ctx.numpy() - context).max())
_, w_causal = ta.attention.scaled_dot_product(Tensor(Q), Tensor(K[:T]), Tensor(V[:T]), causal=True)
print("causal (query t sees keys 1..t):\n", w_causal.numpy())

# %% [markdown]
# ## Why divide by $\sqrt{d_k}$
#
# If the entries of $q$ and $k$ are independent with mean 0 and variance 1, then
# $q \cdot k = \sum_{i=1}^{d_k} q_i k_i$ has variance $d_k$ (the paper's footnote 4). Without the
# scale, larger heads give larger scores, the softmax saturates to one key, and its Jacobian
# $\partial \alpha / \partial e = \mathrm{diag}(\alpha) - \alpha\alpha^\top$ goes to zero: whatever
# gradient reaches the weights no longer reaches the scores $e$, nor $W^Q$ and $W^K$ behind them
# ("gradient saturation"). We measure both for 200 random queries over 16 keys: the largest weight,
# and the gradient of $\sum c$ with respect to the scores, through the package's backward.

# %%
dims = [4, 16, 64, 256, 1024]
measured = {"scaled": [], "unscaled": []}
for d in dims:
    q = rng.standard_normal((200, 1, d))                                 # (B, T=1, d)
    k = rng.standard_normal((200, 16, d))                                # (B, S=16, d)
    v = Tensor(rng.standard_normal((200, 16, 1)))                        # (B, S, 1)
    dot = q @ k.transpose(0, 2, 1)                                       # (B, 1, S): q . k_j
    for name, scale in (("scaled", 1 / np.sqrt(d)), ("unscaled", 1.0)):
        e = Tensor(dot * scale, requires_grad=True)                      # the scores, a leaf
        weights = e.softmax(axis=-1)                                     # (B, 1, S)
        (weights @ v).sum().backward()                                   # sum of the contexts
        measured[name].append((weights.numpy().max(-1).mean(), np.abs(e.grad.numpy()).mean()))
    print(f"d_k {d:>5}: std of q.k {dot.std():7.2f}   mean largest weight "
          f"scaled {measured['scaled'][-1][0]:.2f}, unscaled {measured['unscaled'][-1][0]:.2f}")

figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
for name, values in measured.items():
    left.plot(dims, [m[0] for m in values], marker="o", label=name)
    right.plot(dims, [m[1] for m in values], marker="o", label=name)
left.set(xscale="log", xlabel="d_k", ylabel="mean largest weight", title="saturation (16 keys)")
right.set(xscale="log", yscale="log", xlabel="d_k", ylabel="mean |∂ sum(c) / ∂e|",
          title="gradient reaching the scores")
left.legend()
figure.tight_layout()
plt.show()

# %% [markdown]
# ## Multi-head self-attention, by hand
#
# `ta.nn.MultiHeadAttention(embed_dim, num_heads)` holds PyTorch's parameters: `in_proj_weight`
# stacks $W^Q, W^K, W^V$ (each $E \times E$, all heads side by side), `out_proj` is $W^O$. Self-attention
# passes the same sequence as query, key and value. Below, the same computation in numpy, head by
# head.

# %%
E, H, T = 8, 2, 5
D = E // H                                                        # each head's size
ta.manual_seed(0)
mha = ta.nn.MultiHeadAttention(embed_dim=E, num_heads=H)
x = rng.standard_normal((1, T, E))
out, heads = mha(Tensor(x), Tensor(x), Tensor(x), average_weights=False)   # (1, T, E), (1, H, T, T)

W_q, W_k, W_v = np.split(mha.in_proj_weight.numpy(), 3)          # each (E, E)
b_q, b_k, b_v = np.split(mha.in_proj_bias.numpy(), 3)
q, k, v = x[0] @ W_q.T + b_q, x[0] @ W_k.T + b_k, x[0] @ W_v.T + b_v        # (T, E)
per_head = []
for i in range(H):
    cols = slice(i * D, (i + 1) * D)                              # head i's slice of the projections
    e = q[:, cols] @ k[:, cols].T / np.sqrt(D)                    # (T, T)
    a = np.exp(e - e.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    per_head.append(a @ v[:, cols])                               # (T, D)
by_hand = np.concatenate(per_head, -1) @ mha.out_proj.weight.numpy().T + mha.out_proj.bias.numpy()
print("max |by hand - package| =", np.abs(by_hand - out.numpy()[0]).max())

# %% [markdown]
# ## What two heads learn
#
# A task that needs two things at once: at every position $t$ of a sequence of 8 digits, name
# the digit at $t - 1$ **and** the digit at $t + 1$ (cyclically). One self-attention layer with
# two heads, sinusoidal positions added to the embeddings (Vaswani et al., section 3.5), and two
# linear readouts; nothing else. Each head can attend to one place per query, so the layer has
# to split the job between them.

# %%
VOCAB, T, E, H = 10, 8, 32, 2
ta.manual_seed(0)
embed = ta.nn.Embedding(VOCAB, E)
positions = Tensor(ta.models.transformer.sinusoids(T, E))        # (T, E)
attention = ta.nn.MultiHeadAttention(E, H)
read_left, read_right = ta.nn.Linear(E, VOCAB), ta.nn.Linear(E, VOCAB)
parameters = [p for m in (embed, attention, read_left, read_right) for p in m.parameters()]
optimizer = ta.optim.Adam(parameters, lr=1e-2)


def sample(n):
    digits = rng.integers(0, VOCAB, (n, T))
    return digits, np.roll(digits, 1, axis=1), np.roll(digits, -1, axis=1)   # x, x_{t-1}, x_{t+1}


def forward(digits):
    h = embed(digits) + positions                                 # (B, T, E)
    out, weights = attention(h, h, h, average_weights=False)      # (B, T, E), (B, H, T, T)
    return read_left(out), read_right(out), weights


for step in range(300):
    digits, previous, following = sample(64)
    left_logits, right_logits, _ = forward(digits)
    loss = F.cross_entropy(left_logits, previous) + F.cross_entropy(right_logits, following)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        print(f"step {step:>3}  loss {loss.item():.3f}")

digits, previous, following = sample(500)
with ta.no_grad():
    left_logits, right_logits, weights = forward(digits)
accuracy_left = (left_logits.numpy().argmax(-1) == previous).mean()
accuracy_right = (right_logits.numpy().argmax(-1) == following).mean()
print(f"held-out accuracy: digit at t-1 {accuracy_left:.3f}, digit at t+1 {accuracy_right:.3f}")

labels = [str(t) for t in digits[0]]
SVG(ta.viz.heatmap(weights.numpy()[0], labels, labels, title="self-attention of one sequence, per head"))

# %% [markdown]
# ## What to check
#
# One head looks one step back, the other one step ahead (rows are queries $t$, columns keys).
# Averaged over the 500 held-out sequences, the weight each head puts on $t-1$ and on $t+1$:

# %%
mean = weights.numpy().mean(0)                                    # (H, T, T)
rows = np.arange(T)
for i in range(H):
    back, ahead = mean[i, rows, (rows - 1) % T].mean(), mean[i, rows, (rows + 1) % T].mean()
    print(f"head {i}: weight on t-1 {back:.2f}, on t+1 {ahead:.2f}")
