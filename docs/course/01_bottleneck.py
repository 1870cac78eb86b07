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
# # 1. The bottleneck: a seq2seq without attention forgets long inputs
#
# The lecture notes start from one complaint about the encoder-decoder (seed 004, Shusen Wang's
# slides): **"the final state is incapable of remembering a long sequence."** The handwritten
# notes (seed 002) say the same in three words, *"sentence > 30 words ... bottleneck → attention
# mechanism"*, and seed 001 lists what attention fixes: "(1) the bottleneck problem, (2) the
# vanishing gradient problem, and (3) the alignment problem".
#
# In the notation of seed 004 the encoder reads the source $x_1 \dots x_m$ into states
# $h_1 \dots h_m$, and without attention the decoder starts from the last one and sees nothing else:
#
# $$h_j = \mathrm{GRU}(x_j, h_{j-1}), \qquad s_0 = h_m, \qquad s_t = \mathrm{GRU}(y_{t-1}, s_{t-1}),
# \qquad \hat y_t = \mathrm{softmax}(W s_t).$$
#
# Everything the decoder knows about the source has to fit into the $d$ numbers of $s_0$.
# With attention (Bahdanau, Cho & Bengio, *Neural machine translation by jointly learning to align
# and translate*, ICLR 2015) every step also reads a weighted sum of **all** encoder states,
#
# $$c_t = \sum_{j=1}^{m} \alpha_{tj} h_j, \qquad \alpha_t = \mathrm{softmax}(e_t),$$
#
# so nothing has to be squeezed into one vector. Bahdanau et al.'s Figure 2 measured the effect
# on translation: the plain encoder-decoder's BLEU falls as sentences grow, the attentive one's
# does not. This notebook measures the same curve on a task where the answer is unambiguous:
# **copy** a random string of letters.

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import SVG

import tinygrad_attn as ta

# Small matrices: one thread is faster than two fighting over a busy machine.
ta.set_num_threads(1)
SEED = 0

task = ta.data.load("copy", length=6, n_train=10, n_test=2, seed=SEED)
source, target = task.train[0]
print(task.description)
print("source:", " ".join(source), "  ->  target:", " ".join(target))

# %% [markdown]
# ## The experiment
#
# For each length we train the *same* GRU encoder-decoder twice, once with
# `attention=None` (the bottleneck) and once with `attention="additive"` (Bahdanau's score,
# notebook 2), with the same data, seed, steps and learning rate. Only the attention differs.
# We then decode held-out strings greedily and score them with the package's
# `ta.metrics`: **exact match** (the whole string right) and **token error rate** (edits over
# reference length; a decoder that guesses at random gets about $1 - 1/20 = 0.95$).
#
# The budget is tiny (a few hundred steps of batch 32) so that the notebook runs in seconds;
# `examples/bottleneck.py` runs the same experiment with a larger budget and longer strings.

# %%
LENGTHS = [4, 8, 12, 16, 24]
STEPS, HIDDEN = 300, 32


def run(length, attention):
    """Train one copy model at ``length`` and score it on 200 held-out strings."""
    task = ta.data.load("copy", length=length, n_train=4000, n_test=200, seed=SEED)
    ta.manual_seed(SEED)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=16, hidden=HIDDEN, cell="gru",
                              attention=attention, style="bahdanau")
    ta.models.train(model, task, steps=STEPS, batch_size=32, lr=1e-2, seed=SEED, eval_every=0)
    scores = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
    return model, task, scores


results, models = {}, {}
for length in LENGTHS:
    for attention in (None, "additive"):
        model, task, scores = run(length, attention)
        results[(attention, length)] = scores
        models[(attention, length)] = (model, task)
        print(f"length {length:>2}  attention={str(attention):<8}  exact match {scores['exact_match']:.3f}"
              f"  token error rate {scores['token_error_rate']:.3f}")

# %% [markdown]
# ## The measured curve
#
# Token error rate against the length of the string (lower is better; the dotted line is
# chance).

# %%
figure, axes = plt.subplots(figsize=(5.5, 3.5))
for attention, label in ((None, "no attention (s_0 only)"), ("additive", "additive attention")):
    errors = [results[(attention, length)]["token_error_rate"] for length in LENGTHS]
    axes.plot(LENGTHS, errors, marker="o", label=label)
axes.axhline(0.95, linestyle=":", color="gray", label="chance")
axes.set_xlabel("length of the string to copy")
axes.set_ylabel("held-out token error rate")
axes.set_ylim(-0.02, 1.02)
axes.set_title(f"GRU seq2seq, hidden {HIDDEN}, {STEPS} steps each")
axes.legend()
figure.tight_layout()
plt.show()

# %% [markdown]
# Without attention the error rises with the length: at this budget the $32$ numbers of $s_0$
# hold a few letters in order, not a dozen. With attention the error stays low, because step $t$
# reads the letter it needs from $h_t$ directly. Which $h_j$ each output step read is the
# attention matrix $\alpha$ (one row per output letter): for copying it should be the diagonal.

# %%
model, task = models[("additive", LENGTHS[-1])]
model.eval()
text = task.detokenize_source(task.test[0][0])
output, source, tokens, attention = ta.models.translate(model, text, task)
rows = tokens + ["<end>"] * (len(attention) - len(tokens))
print("source:", text)
print("output:", output)
SVG(ta.viz.heatmap(attention, source, rows, title=f"copying {len(source)} letters: α_tj"))

# %% [markdown]
# ## What to check
#
# The table below is the curve in numbers: at the longest lengths the model without attention
# is close to chance, the attentive one is not. And the weights above are concentrated near the
# diagonal; the mean weight on the diagonal itself, against what uniform attention would give:

# %%
diagonal = float(np.mean([attention[t, t] for t in range(len(source))]))
print(f"mean weight on the diagonal, length {len(source)}: {diagonal:.2f} "
      f"(uniform would be {1 / len(source):.2f})")
print("| length | no attention: TER | additive: TER |")
print("|---:|---:|---:|")
for length in LENGTHS:
    print(f"| {length} | {results[(None, length)]['token_error_rate']:.3f} "
          f"| {results[('additive', length)]['token_error_rate']:.3f} |")
