"""Decoding 1,000 dates-task sources with beam 5 and greedily: sentences per second of

    old      the beam search this engine had before issue 19 (kept here as the contender):
             one source at a time in a Python loop, its beam the batch, stopping once `beam`
             hypotheses have finished, log-probabilities renormalised without <pad>/<start>
    ours     ta.models.decoding (model.beam_search / model.greedy): every source and every
             beam are rows of one batch per step, exact stopping
    torch    a plain batched beam search in PyTorch eager over the same weights (model.to_torch(),
             the engine's bidirectional-GRU Seq2Seq built from torch's layers): a fixed
             (sources x beam) layout, torch.topk over each source's beam x V candidates, the
             same candidate rule (the 2 x beam best; an ending counts if among the beam best)
             and the same exact stopping bound as ours; greedy: tinygrad_attn.export.torch.greedy

The model: ta.models.Seq2Seq, bidirectional GRU encoder, Bahdanau (additive) attention, embed
64, hidden 128, float32, trained on the dates task for --steps steps (cached under
runs/decoding/, which git ignores).  Sources are sorted by length and decoded --batch-size at a
time with max_len = 2 x the batch's longest source + 10, as ``ta.models.evaluate`` does;
length_penalty 1.0 (the default).  Contenders alternate within each repeat (old: --old-sources
of the sources, its rate per sentence being what is compared); ours / torch is the median of
the repeats' own ratios, ours / old the ratio of the medians.
Before timing, torch's twin is checked to give the engine's loss, and the outputs of the three
searches are compared.

Run:  .venv/bin/python bench/decoding.py [--repeats 5] [--threads 1] [--batch-size 250]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from timing import cpu_model, cpu_seconds, others_note, set_threads

import tinygrad_attn as ta
from tinygrad_attn.models.decoding import END, PAD, START

try:
    import torch
    from g2p_torch import check_twin

    from tinygrad_attn.export.torch import greedy as torch_greedy
except ImportError:  # time ours alone
    torch = None

SETTINGS = dict(embed=64, hidden=128, cell="gru", attention="additive", style="bahdanau", bidirectional=True)
BEAM, ALPHA = 5, 1.0


def trained_model(steps: int, cache: Path, settings: dict = SETTINGS, kind=ta.models.Seq2Seq,
                  lr: float = 5e-3):
    """The dates model (a ``kind`` built with ``settings``), trained once and cached."""
    task = ta.data.load("dates", n_test=1000)
    if cache.exists():
        model, _ = ta.models.load_checkpoint(cache)
        return model, task
    ta.manual_seed(0)
    model = kind(task.src_vocab, task.tgt_vocab, **settings)
    print(f"# training the dates model for {steps} steps (cached in {cache})")
    ta.models.train(model, task, steps=steps, batch_size=64, lr=lr)
    cache.parent.mkdir(parents=True, exist_ok=True)
    ta.models.save_checkpoint(cache, model, task)
    return model, task


def batches(task, sources: list, batch_size: int) -> list[np.ndarray]:
    """Sources sorted by length, padded in batches, as ``ta.models.evaluate`` decodes them."""
    order = sorted(sources, key=len)
    return [ta.data.encode_batch(order[i : i + batch_size], task.src_vocab)
            for i in range(0, len(order), batch_size)]


def max_len(src: np.ndarray) -> int:
    return ta.models.evaluation.default_max_len(src.shape[1])


# ---------------------------------------------------------------- old: one source at a time


def old_beam_search(model, src: np.ndarray, beam: int, limit: int, alpha: float) -> list[list[int]]:
    """The engine's beam search before issue 19, for each source in turn."""
    with ta.models.decoding.inference(model):
        return [_old_beam_one(model, src[b : b + 1], beam, limit, alpha) for b in range(src.shape[0])]


def _old_beam_one(model, src, beam, limit, alpha):
    state = model.decode_start(src)
    tokens, logp, finished = [[]], np.zeros(1), []
    for t in range(limit):
        y = np.array([hyp[-1] if hyp else START for hyp in tokens], dtype=np.int64)
        log_probs, _, new_state = model.decode_step(state, y, t)
        # the old step renormalised over the tokens it may produce
        log_probs[:, [PAD, START]] = -np.inf
        log_probs -= np.logaddexp.reduce(log_probs, axis=1, keepdims=True)
        total = logp[:, None] + log_probs
        order = np.argsort(-total, axis=None, kind="stable")[: 2 * beam]
        rows, words = np.unravel_index(order, total.shape)
        keep_rows, keep_words = [], []
        for rank, (row, word) in enumerate(zip(rows, words, strict=True)):
            if total[row, word] == -np.inf:
                break
            if word == END or t == limit - 1:
                if rank < beam:
                    hyp = tokens[row] + [int(word)]
                    finished.append((total[row, word] / ((5.0 + len(hyp)) / 6.0) ** alpha, hyp))
            elif len(keep_rows) < beam:
                keep_rows.append(row)
                keep_words.append(word)
        if len(finished) >= beam or not keep_rows:
            break
        index = np.array(keep_rows)
        tokens = [tokens[r] + [int(w)] for r, w in zip(keep_rows, keep_words, strict=True)]
        logp = total[index, np.array(keep_words)]
        state = model.decode_select(new_state, index)
    return max(finished, key=lambda item: item[0])[1] if finished else tokens[0]


# ---------------------------------------------------------------- torch: a plain batched search


def torch_beam_search(model, src: np.ndarray, beam: int, limit: int, alpha: float) -> list[list[int]]:
    """Batched beam search over the torch twin's decoder steps (``model.to_torch()``): rows
    (B * beam), beam-major per source; dead rows carry -inf."""
    with torch.no_grad():
        src_t = torch.from_numpy(src)
        batch = src.shape[0]
        memory = model.encode(src_t)
        expand = torch.arange(batch).repeat_interleave(beam)                        # (B * beam,)
        states = [state[expand] for state in memory.states]                         # GRU: (B * beam, H)
        memory = memory._replace(keys=memory.keys[expand], keys_proj=memory.keys_proj[expand],
                                 mask=memory.mask[expand], states=None)
        logp = torch.full((batch, beam), -torch.inf, dtype=torch.float64)
        logp[:, 0] = 0.0                                 # one live hypothesis per source at first
        y = torch.full((batch * beam,), START, dtype=torch.long)
        history = torch.zeros((batch * beam, 0), dtype=torch.long)
        finished = [[] for _ in range(batch)]
        worst = torch.full((batch,), -torch.inf, dtype=torch.float64)
        done = torch.zeros(batch, dtype=torch.bool)
        for t in range(limit):
            logits, states = model.decode_step(y, states, memory)
            log_probs = torch.log_softmax(logits.double(), -1)                     # (B*beam, V)
            vocab = log_probs.shape[1]
            log_probs[:, [PAD, START]] = -torch.inf
            total = (logp.reshape(-1, 1) + log_probs).reshape(batch, beam * vocab)
            values, top = torch.topk(total, 2 * beam, dim=1)                       # (B, 2 beam)
            rows, words = top // vocab, top % vocab
            valid = values > -torch.inf
            ends = valid & ((words == END) | (t == limit - 1))
            finish = ends & (torch.arange(2 * beam) < beam) & ~done[:, None]
            for b, j in finish.nonzero().tolist():
                tokens = history[b * beam + rows[b, j]].tolist() + [int(words[b, j])]
                score = float(values[b, j]) / ((5.0 + t + 1) / 6.0) ** alpha
                finished[b].append((score, tokens))
                if len(finished[b]) >= 1:
                    worst[b] = max(entry[0] for entry in finished[b])
            extend = valid & ~ends
            extend &= extend.cumsum(1) <= beam
            # the first `beam` non-ending candidates of each source (-inf where there are fewer)
            slot = torch.where(extend, extend.cumsum(1) - 1, beam)                  # (B, 2 beam)
            new_logp = torch.full((batch, beam + 1), -torch.inf, dtype=torch.float64)
            new_rows = torch.zeros((batch, beam + 1), dtype=torch.long)
            new_words = torch.full((batch, beam + 1), END, dtype=torch.long)
            new_logp.scatter_(1, slot, torch.where(extend, values, -torch.inf))
            new_rows.scatter_(1, slot, rows)
            new_words.scatter_(1, slot, words)
            logp, rows, words = new_logp[:, :beam], new_rows[:, :beam], new_words[:, :beam]
            if t + 1 < limit:
                lp = max(((5.0 + t + 2) / 6.0) ** alpha, ((5.0 + limit) / 6.0) ** alpha)
                done |= (logp.max(1).values / lp) <= worst
            else:
                done[:] = True
            if bool(done.all()):
                break
            logp[done] = -torch.inf
            parent = (torch.arange(batch)[:, None] * beam + rows).reshape(-1)       # (B * beam,)
            states = [state[parent] for state in states]
            y = words.reshape(-1)
            history = torch.cat([history[parent], y[:, None]], 1)
        return [max(found)[1] for found in finished]


# ---------------------------------------------------------------- timing


def rate(decode, sources: list) -> float:
    """Sentences per second of one pass of ``decode`` over its batches."""
    start = time.perf_counter()
    decode()
    return len(sources) / (time.perf_counter() - start)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="pin every thread pool to N")
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--sources", type=int, default=1000)
    parser.add_argument("--old-sources", type=int, default=200,
                        help="how many of the sources the old search decodes a repeat")
    parser.add_argument("--steps", type=int, default=300, help="training steps of the cached model")
    parser.add_argument("--cache", default="runs/decoding/dates-bigru-additive.ckpt")
    args = parser.parse_args(argv)
    set_threads(args.threads, torch)
    model, task = trained_model(args.steps, Path(args.cache))
    model.eval()
    sources = [source for source, _ in task.test[: args.sources]]
    old_sources = sources[: args.old_sources]
    work, old_work = batches(task, sources, args.batch_size), batches(task, old_sources, args.batch_size)
    print(f"# decoding {len(sources)} dates sources, beam {BEAM} (length_penalty {ALPHA}) and greedy; "
          f"batch {args.batch_size}, {args.threads} thread(s), float32; {cpu_model()}")
    contenders = {
        "beam old": (lambda: [old_beam_search(model, src, BEAM, max_len(src), ALPHA) for src in old_work],
                     old_sources),
        "beam ours": (lambda: [model.beam_search(src, BEAM, max_len(src), ALPHA) for src in work], sources),
        "greedy ours": (lambda: [model.greedy(src, max_len(src)) for src in work], sources),
    }
    if torch is None:
        print("# torch is not installed: the engine is timed alone")
    else:
        twin = model.to_torch().eval()
        check_twin(model, twin, SimpleNamespace(valid=task.test[:64], src_vocab=task.src_vocab,
                                                tgt_vocab=task.tgt_vocab))
        contenders["beam torch"] = (lambda: [torch_beam_search(twin, src, BEAM, max_len(src), ALPHA)
                                             for src in work], sources)
        contenders["greedy torch"] = (lambda: [torch_greedy(twin, src, max_len(src)) for src in work],
                                      sources)
        compare(model, twin, task, work, old_work)
    since = cpu_seconds()
    rates = {name: [] for name in contenders}
    for decode, _ in contenders.values():
        decode()                                                   # warm: compile, allocator
    for _ in range(args.repeats):
        for name, (decode, counted) in contenders.items():
            rates[name].append(rate(decode, counted))
    med = {name: statistics.median(values) for name, values in rates.items()}
    print(f"{'contender':<13} {'sentences/s':>11}  (median of {args.repeats}; min-max)")
    for name, values in rates.items():
        print(f"{name:<13} {med[name]:11.0f}  ({min(values):.0f}-{max(values):.0f})")
    print(f"beam 5: ours / old {med['beam ours'] / med['beam old']:.1f}x", end="")
    if torch is not None:
        ratios = [o / t for o, t in zip(rates["beam ours"], rates["beam torch"], strict=True)]
        greedy = [o / t for o, t in zip(rates["greedy ours"], rates["greedy torch"], strict=True)]
        print(f", ours / torch {statistics.median(ratios):.2f}x (target >= 1.0); greedy: ours / torch "
              f"{statistics.median(greedy):.2f}x", end="")
    print()
    others_note(since, "during the timing")


def compare(model, twin, task, work, old_work) -> None:
    """How often the three searches choose the same output (float32: near-ties may differ)."""
    ours = [row for src in work for row in _rows(model.beam_search(src, BEAM, max_len(src), ALPHA)[0])]
    theirs = [tokens for src in work for tokens in torch_beam_search(twin, src, BEAM, max_len(src), ALPHA)]
    old = [tokens for src in old_work for tokens in old_beam_search(model, src, BEAM, max_len(src), ALPHA)]
    ours_old = [row for src in old_work
                for row in _rows(model.beam_search(src, BEAM, max_len(src), ALPHA)[0])]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    same_old = sum(a == b for a, b in zip(ours_old, old, strict=True))
    print(f"# outputs: ours = torch's for {same} of {len(ours)} sources; ours = old's for {same_old} of "
          f"{len(old)}")


def _rows(ids: np.ndarray) -> list[list[int]]:
    rows = []
    for row in ids.tolist():
        rows.append(row[: row.index(END) + 1] if END in row else [t for t in row if t != PAD])
    return rows


if __name__ == "__main__":
    main()
