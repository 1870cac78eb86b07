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
# # 3. Luong's dot, general and concat scores, and the attention vector
#
# Luong, Pham & Manning (*Effective approaches to attention-based neural machine translation*,
# EMNLP 2015) keep the weighted sum of notebook 2 but change two things, as seed 002 ("Luong
# Attention") puts it: *"instead of providing context vector in input we are providing it in
# output, also it changes how alignment score is calculated"*. Seed 003 writes the three
# equations ("vanilla attention"), with the decoder's **current** state $h_t$ and the encoder's
# states $\bar h_s$:
#
# $$\alpha_{ts} = \frac{\exp(\mathrm{score}(h_t, \bar h_s))}{\sum_{s'} \exp(\mathrm{score}(h_t, \bar h_{s'}))}
# \quad (1) \qquad c_t = \sum_s \alpha_{ts} \bar h_s \quad (2) \qquad
# a_t = \tanh(W_c [c_t; h_t]) \quad (3)$$
#
# and the output is $\hat y_t = \mathrm{softmax}(W_s a_t)$. Seed 000 (Tulabandhula) calls the same step
# "concatenate then generate", $\hat y_t = \mathrm{softmax}(g([z_t; s_t]))$; Luong's $g$ is
# $W_s \tanh(W_c \,\cdot)$. The paper's three scores (its eq. 8), which seed 000 lists as "basic
# dot-product", "multiplicative" and (a form of) "additive" attention:
#
# | name | $\mathrm{score}(h_t, \bar h_s)$ | learns |
# |---|---|---|
# | dot | $h_t^\top \bar h_s$ | nothing |
# | general | $h_t^\top W_a \bar h_s$ | $W_a \in \mathbb{R}^{d \times d}$ |
# | concat | $v_a^\top \tanh(W_a [h_t; \bar h_s])$ | $W_a, v_a$ |
#
# Two notes on notation. Seed 000 names the scores $a_{tu} = f(h_u, s_t)$, but on its slide of score
# functions writes them as $\alpha_{tu}$, the letter it otherwise keeps for the weights; we keep the
# paper's letters, $\mathrm{score}$ for the score and $\alpha$ for the weights. And the paper feeds
# $a_{t-1}$ back into the decoder ("input feeding", its section 3.3); the package's `style="luong"`
# is the paper's base model without it, so that
# with teacher forcing all decoder states are known before any attention is computed.

# %%
import numpy as np
from IPython.display import SVG

import tinygrad_attn as ta
from tinygrad_attn import Tensor

ta.set_num_threads(1)
np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## The three scores by hand, and by `ta.attention`
#
# One decoder state $h_t$ and four encoder states $\bar h_1 \dots \bar h_4$ of size $d = 4$.

# %%
d, d_a = 4, 3
rng = np.random.default_rng(0)
h_bar = rng.standard_normal((4, d))                 # encoder states, one per row
h_t = rng.standard_normal(d)                        # the decoder's current state
W_a = rng.normal(0, 0.5, (d, d))                    # general
W_cat = rng.normal(0, 0.5, (d_a, 2 * d))            # concat's W_a
v_a = rng.normal(0, 1.0, d_a)


def softmax(e):
    z = np.exp(e - e.max())
    return z / z.sum()


by_hand = {
    "dot": h_bar @ h_t,                                                        # h_t . h̄_s
    "general": h_bar @ W_a.T @ h_t,                                            # h_tᵀ W_a h̄_s
    "concat": np.array([v_a @ np.tanh(W_cat @ np.concatenate([h_t, hs])) for hs in h_bar]),
}
package = {
    "dot": ta.attention.dot(Tensor(h_t), Tensor(h_bar)),
    "general": ta.attention.general(Tensor(h_t), Tensor(h_bar), Tensor(W_a)),
    "concat": ta.attention.concat(Tensor(h_t), Tensor(h_bar), Tensor(W_cat), Tensor(v_a)),
}
for name, scores in by_hand.items():
    context, weights = package[name]
    print(f"{name:<8} score {scores}  α {softmax(scores)}  "
          f"|α - package| {np.abs(weights.numpy() - softmax(scores)).max():.1e}")

# %% [markdown]
# Equation (3), the attention vector, is `ta.nn.LuongAttentionVector`: one matrix $W_c$ of shape
# $(d, 2d)$ over the concatenation $[c_t; h_t]$, no bias (as in the paper).

# %%
context, _ = package["general"]
vector = ta.nn.LuongAttentionVector(context_dim=d, hidden_dim=d)
W_c = vector.W_c.weight.numpy()
a_t = np.tanh(W_c @ np.concatenate([context.numpy(), h_t]))       # a_t = tanh(W_c [c_t; h_t])
print("a_t by hand :", a_t)
print("a_t package :", vector(context, Tensor(h_t)).numpy())

# %% [markdown]
# ## Side by side on one task
#
# The same Luong-style GRU encoder-decoder, three times, with only the score changed: reverse
# 10 letters (the answer's first letter is the source's last, so alignment is everything). Same
# data, seed, steps and learning rate for each.

# %%
task = ta.data.reverse(length=10, symbols=12, n_train=4000, n_test=200, seed=0)
SCORES = ("dot", "general", "concat")
models, results = {}, {}
for kind in SCORES:
    ta.manual_seed(0)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=16, hidden=32, cell="gru",
                              attention=kind, style="luong")
    ta.models.train(model, task, steps=400, batch_size=32, lr=1e-2, seed=0, eval_every=0)
    model.eval()
    models[kind] = model
    results[kind] = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
    params = sum(p.size for p in model.parameters())
    print(f"{kind:<8} {params:>6} parameters  exact match {results[kind]['exact_match']:.3f}  "
          f"token error rate {results[kind]['token_error_rate']:.3f}")

# %% [markdown]
# The weights $\alpha_{ts}$ of each model on one held-out source, teacher forced (so the three
# matrices have the same rows): reversing should put the mass on the anti-diagonal.

# %%
source, target = task.test[0]
batch = next(ta.data.batches([(source, target)], task.src_vocab, task.tgt_vocab, batch_size=1))
panels = []
with ta.no_grad():
    for kind in SCORES:
        _, weights = models[kind](batch.src, batch.tgt_in)            # (1, T, S)
        panels.append(weights.numpy()[0])
rows = ["<start>"] + list(target)
SVG(ta.viz.heatmap(np.stack(panels), source, rows, title="α_ts: row t reads <start> y_1 .. y_{t-1}",
                   column_names=list(SCORES)))

# %% [markdown]
# ## What to check
#
# The share of each row's weight on the source position that reversing needs (row $t$, which
# predicts target letter $t$, should read source position $S + 1 - t$), averaged over 200
# held-out sources, next to the exact match above.

# %%
pairs = task.test[:200]
batch = next(ta.data.batches(pairs, task.src_vocab, task.tgt_vocab, batch_size=len(pairs)))
S = len(source)
print("| score | exact match | token error rate | weight on the reversed position |")
print("|---|---:|---:|---:|")
with ta.no_grad():
    for kind in SCORES:
        _, weights = models[kind](batch.src, batch.tgt_in)            # (B, T, S)
        on_target = weights.numpy()[:, np.arange(S), S - 1 - np.arange(S)].mean()
        print(f"| {kind} | {results[kind]['exact_match']:.3f} | {results[kind]['token_error_rate']:.3f} "
              f"| {on_target:.2f} |")
