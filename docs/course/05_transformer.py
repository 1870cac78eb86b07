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
# # 5. The Transformer, and what each layer and head attends to
#
# Seed 001's outline ends with "Self Attention and Transformers"; seed 003 gives the pieces
# (scaled dot-product attention, self-attention, multi-head attention, notebook 4). The Transformer
# (Vaswani et al., *Attention is all you need*, NIPS 2017) drops the recurrence: the encoder is a
# stack of layers, each
#
# $$x \leftarrow \mathrm{LayerNorm}(x + \mathrm{MultiHead}(x, x, x)), \qquad
# x \leftarrow \mathrm{LayerNorm}(x + \mathrm{FFN}(x)), \qquad
# \mathrm{FFN}(x) = \max(0, x W_1 + b_1) W_2 + b_2,$$
#
# and each decoder layer has three sublayers: **masked** self-attention over the outputs so far
# (query $t$ sees positions $\le t$), **cross-attention** whose queries are the decoder's states and
# whose keys and values are the encoder's output (the seq2seq attention of notebooks 2-3), and the
# FFN. Order comes only from the positions added to the embeddings (section 3.5):
#
# $$PE_{(pos, 2i)} = \sin(pos / 10000^{2i/d_{model}}), \qquad
# PE_{(pos, 2i+1)} = \cos(pos / 10000^{2i/d_{model}}),$$
#
# and the embeddings are multiplied by $\sqrt{d_{model}}$ (section 3.4). `ta.models.Transformer` is
# this model (post-norm, as in the paper; `norm_first=True` is the other order), with
# `ta.models.Seq2Seq`'s interface.

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import SVG

import tinygrad_attn as ta

ta.set_num_threads(1)

# %% [markdown]
# ## The positions
#
# Each row is one position's vector: low dimensions oscillate fast, high ones slowly, so every
# position gets a distinct pattern and $PE_{pos + k}$ is a linear function of $PE_{pos}$.

# %%
table = ta.models.transformer.sinusoids(32, 32)                   # (positions, d_model)
pos, i = 5, 3
print("PE[5, 6] =", table[pos, 2 * i], " sin(5 / 10000^(6/32)) =", np.sin(pos / 10000 ** (2 * i / 32)))
figure, axes = plt.subplots(figsize=(5, 3))
axes.imshow(table, cmap="RdBu", aspect="auto")
axes.set(xlabel="dimension", ylabel="position", title="sinusoidal positions")
plt.show()

# %% [markdown]
# ## Train a small one
#
# Reverse 8 letters: two encoder and two decoder layers, $d_{model} = 32$, 4 heads, FFN width 64,
# Adam with a short warm-up and a cosine decay, 400 steps of 32 pairs.

# %%
task = ta.data.reverse(length=8, symbols=12, n_train=4000, n_test=200, seed=0)
ta.manual_seed(0)
model = ta.models.Transformer(task.src_vocab, task.tgt_vocab, d_model=32, nhead=4, num_encoder_layers=2,
                              num_decoder_layers=2, dim_feedforward=64, dropout=0.0)
print(model.extra_repr(), f"({sum(p.size for p in model.parameters()):,} parameters)")
history = ta.models.train(model, task, steps=400, batch_size=32, lr=2e-3, schedule="cosine", warmup=40,
                          seed=0, eval_every=0)
model.eval()
scores = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
print(f"loss {history[0]['loss']:.3f} -> {history[-1]['loss']:.3f};  held-out exact match "
      f"{scores['exact_match']:.3f}, token error rate {scores['token_error_rate']:.3f}")

# %% [markdown]
# ## Every layer and every head
#
# `model(src, tgt_in, need_weights=True)` records each attention sublayer's weights, and
# `model.layer_attention(weights, sublayer)` stacks one sublayer's across layers:
# (layers, batch, heads, queries, keys). `ta.viz.heatmap` draws such a grid, one panel per layer
# and head. First the **cross-attention**: rows are the decoder's inputs (`<start>` then the
# target so far), columns the source letters.

# %%
source, target = task.test[0]
batch = next(ta.data.batches([(source, target)], task.src_vocab, task.tgt_vocab, batch_size=1))
with ta.no_grad():
    _, weights = model(batch.src, batch.tgt_in, need_weights=True)
rows = ["<start>"] + list(target)
cross = model.layer_attention(weights, "cross_attention")[:, 0]            # (layers, H, T, S)
SVG(ta.viz.heatmap(cross, source, rows, title="decoder cross-attention", numbers=False))

# %% [markdown]
# The decoder's **masked self-attention** (the upper triangle is zero by construction), and the
# **encoder's self-attention** over the source.

# %%
decoder_self = model.layer_attention(weights, "self_attention")[:, 0]    # (layers, H, T, T)
SVG(ta.viz.heatmap(decoder_self, rows, rows, title="decoder self-attention (causal)", numbers=False))

# %%
encoder_self = model.layer_attention(weights, "encoder/self_attention")[:, 0]   # (layers, H, S, S)
SVG(ta.viz.heatmap(encoder_self, source, source, title="encoder self-attention", numbers=False))

# %% [markdown]
# ## What to check
#
# Which heads do the aligning? For each layer and head of the cross-attention, the weight that
# row $t$ puts on source position $S - t$ (the letter that output $t$ copies), averaged over the 200
# held-out sources (1 would be a head that reads the answer straight from the source, $1/S$ one that
# spreads evenly). In the heatmaps above the first layer's heads are blurred and the second layer's
# sharp: the first layer gathers, the second aligns.

# %%
pairs = task.test
batch = next(ta.data.batches(pairs, task.src_vocab, task.tgt_vocab, batch_size=len(pairs)))
with ta.no_grad():
    _, weights = model(batch.src, batch.tgt_in, need_weights=True)
cross = model.layer_attention(weights, "cross_attention")                 # (layers, B, H, T, S)
S = len(source)
aligned = cross[:, :, :, np.arange(S), S - 1 - np.arange(S)].mean(axis=(1, 3))   # (layers, H)
print("weight on the reversed position, cross-attention:")
for layer, heads in enumerate(aligned):
    print(f"  layer {layer}: " + "  ".join(f"head {h} {w:.2f}" for h, w in enumerate(heads)))
