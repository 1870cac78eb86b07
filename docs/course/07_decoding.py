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
# # 7. Decoding: greedy, beam search, n-best lists and their scores
#
# Seed 001 draws the two phases of the same decoder: in **training** the decoder reads the true
# previous word ("$\langle start\rangle$ ich liebe meine katze — Training", teacher forcing), at
# **test** time it reads its own previous output ("— Test"): "$y(t)$ output or $c(t)$ target (depends
# on training or test phase)". Seed 004 counts the cost: with attention, $t$ output steps over $m$
# source states compute $mt$ weights.
#
# At test time the model gives, step by step, $P(y_t \mid y_{<t}, X)$, and a decoder must choose
# an output $Y$. Its log-probability is the sum of the steps' log-probabilities:
#
# $$\log P(Y \mid X) = \sum_{t=1}^{|Y|} \log P(y_t \mid y_{<t}, X).$$
#
# - **Greedy** takes $y_t = \arg\max_y P(y \mid y_{<t}, X)$ at each step: fast, but a choice is never
#   revisited.
# - **Beam search** keeps the $k$ best prefixes at every step and extends each by every token.
#   Finished hypotheses are ranked by the length-normalised score of Wu et al. (*Google's neural
#   machine translation system*, 2016, eq. 14), since a raw sum of log-probabilities favours short
#   outputs:
#
# $$s(Y, X) = \frac{\log P(Y \mid X)}{lp(Y)}, \qquad lp(Y) = \Big(\frac{5 + |Y|}{6}\Big)^{\alpha}$$
#
#   ($|Y|$ counts `<end>`; $\alpha$ is `length_penalty`, 0 ranks by $\log P$ alone).
# - An **n-best list** is the $n$ best finished hypotheses of one beam search, each with its tokens,
#   score, log-probability and attention.

# %%
import numpy as np
from IPython.display import SVG

import tinygrad_attn as ta

ta.set_num_threads(1)

# %% [markdown]
# ## A model to decode with
#
# Dates written by people to ISO dates ("tue, 16 dec 2008" → "2008-12-16"), characters in and out:
# a GRU encoder-decoder with additive attention, trained briefly on purpose (150 steps) so that it
# still makes mistakes for a decoder to fix.

# %%
task = ta.data.load("dates", n_train=5000, n_test=200, seed=0)
ta.manual_seed(0)
model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=16, hidden=48, cell="gru",
                          attention="additive", style="bahdanau")
ta.models.train(model, task, steps=150, batch_size=32, lr=1e-2, seed=0, eval_every=0)
model.eval()
sources = [source for source, _ in task.test]
targets = [target for _, target in task.test]

# %% [markdown]
# ## Greedy against beam search, one source
#
# We look for a held-out date that greedy decoding gets wrong and a beam of 5 gets right.

# %%
greedy = ta.models.translate_tokens(model, sources, task.src_vocab, task.tgt_vocab)
beam = ta.models.translate_tokens(model, sources, task.src_vocab, task.tgt_vocab, beam=5)
fixed = [i for i in range(len(sources)) if greedy[i][0] != targets[i] and beam[i][0] == targets[i]]
index = fixed[0] if fixed else 0
source, target = task.test[index]
print("source :", "".join(source))
print("target :", "".join(target))
print("greedy :", "".join(greedy[index][0]))
print("beam 5 :", "".join(beam[index][0]))

# %% [markdown]
# The n-best list of that source: the 5 finished hypotheses, best first, with the score the beam
# ranks by and the model's log-probability. The score is recomputed from the formula beside it.

# %%
src = ta.data.encode_batch([source], task.src_vocab)                        # (1, S) ids
[hypotheses] = model.beam_search(src, beam=5, max_len=12, length_penalty=1.0, n_best=5)
print(f"{'output':<14}{'|Y|':>4}{'log P(Y|X)':>12}{'score':>9}{'log P / lp':>12}")
for h in hypotheses:
    lp = ((5 + len(h.tokens)) / 6) ** 1.0                                   # Wu et al.'s lp(Y), alpha = 1
    print(f"{''.join(task.tgt_vocab.decode(h.tokens)):<14}{len(h.tokens):>4}{h.log_prob:>12.4f}"
          f"{h.score:>9.4f}{h.log_prob / lp:>12.4f}")
[greedy_hypothesis] = model.greedy(src, max_len=12, hypotheses=True)
print(f"greedy: {''.join(task.tgt_vocab.decode(greedy_hypothesis.tokens))}  "
      f"log P {greedy_hypothesis.log_prob:.4f}")

# %% [markdown]
# Greedy decoding's output is in the list too, ranked below the winner: at the step where the two
# part, greedy took the token that was more likely *on its own*, and the rest of that output cost
# more than the difference. Beam search kept both prefixes alive long enough to compare the whole
# outputs.
#
# ## The log-probability is the model's own
#
# Teacher forcing the best hypothesis through `model(src, tgt_in)` and summing the log-softmax of
# the tokens it produced must give its `log_prob`: the search reports the model's distribution,
# not a renormalised one.

# %%
best = hypotheses[0]
tgt_in = np.array([[ta.data.START] + best.tokens[:-1]])                     # <start> y_1 .. y_{|Y|-1}
with ta.no_grad():
    logits, _ = model(src, tgt_in)                                          # (1, |Y|, V)
log_softmax = logits.log_softmax(axis=-1).numpy()[0]
teacher_forced = log_softmax[np.arange(len(best.tokens)), best.tokens].sum()
print(f"beam search log P = {best.log_prob:.6f}, teacher forcing = {teacher_forced:.6f}")
rows = task.tgt_vocab.decode(best.tokens) + (["<end>"] if best.tokens[-1] == ta.data.END else [])
SVG(ta.viz.heatmap(best.attention[:, : len(source)], source, rows, title="attention of the best hypothesis"))

# %% [markdown]
# ## What to check
#
# Exact match on the 200 held-out dates for greedy decoding and for beams of 2, 5 and 10, with and
# without the length penalty.

# %%
print("| decoder | length penalty α | exact match | token error rate |")
print("|---|---:|---:|---:|")
scores = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab)
print(f"| greedy | - | {scores['exact_match']:.3f} | {scores['token_error_rate']:.4f} |")
for k in (2, 5, 10):
    for alpha in (0.0, 1.0):
        scores = ta.models.evaluate(model, task.test, task.src_vocab, task.tgt_vocab, beam=k,
                                    length_penalty=alpha)
        print(f"| beam {k} | {alpha:g} | {scores['exact_match']:.3f} | {scores['token_error_rate']:.4f} |")
