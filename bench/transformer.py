"""The Transformer against PyTorch eager, same weights, float32: one training step, and cached
greedy decoding.

    training step   ta.models.Transformer(d_model 128, 4 heads, 2+2 layers, feed-forward 512,
                    dropout 0) with ta.optim.Adam: zero_grad, loss, backward, update, on a batch
                    of 32 with source and target length 20 (no padding); against the same model
                    in PyTorch, model.to_torch() (torch.nn.Transformer(batch_first=True),
                    nn.Embedding, nn.Linear, the same sinusoids, the engine's weights), with
                    torch.optim.Adam.
    greedy decode   64 sources of length 20, 30 steps each (issue 32's shape; --sentences and
                    --steps change it; the untrained models agree on every token, so both run
                    every step), sentences per second:
                      ta          model.greedy(src, max_len=30), keys and values cached
                      ta compiled the same with compile=True: every step replays one ta.compile
                                  plan (checked identical to ta's ids, attention and scores)
                      torch       the same model, eval mode and no_grad, decoded the way the
                                  PyTorch tutorials do: the whole prefix through
                                  nn.TransformerDecoder each step (it has no cache)
                      torch+cache the same weights with a hand-written key/value cache (each
                                  layer's projections via F.linear, F.scaled_dot_product_attention)
                      inductor    (--inductor) that decoder with its caches preallocated and the
                                  position an input, each step torch.compile'd (Inductor, CPU): a
                                  contender, not a target; checked to decode the same ids

Before timing, the twins are checked to agree: training loss and every gradient to 1e-4 relative,
and identical greedy outputs.  Contenders alternate within each repeat; ratios are of medians
from the same run (absolute times drift between runs on shared machines).

Run:  .venv/bin/python bench/transformer.py [--repeats 7] [--budget 0.5] [--threads N]
          [--only train|decode] [--profile] [--compiled] [--sentences 64] [--steps 30]
          [--inductor]
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time

import numpy as np
from profiling import profile_plans, profile_step
from timing import cpu_model, cpu_seconds, others_note, run_alternating, set_threads, training_step

import tinygrad_attn as ta

try:
    import torch
except ImportError:  # time ours alone
    torch = None

VOCAB, D_MODEL, HEADS, LAYERS, FF, BATCH, LENGTH = 40, 128, 4, 2, 512, 32, 20
SENTENCES, STEPS = 64, 30                      # the greedy decode's batch and steps
TOL = 1e-4


def batch(size: int = BATCH, seed: int = 1):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, VOCAB, (size, LENGTH))
    tgt = rng.integers(3, VOCAB, (size, LENGTH))
    tgt_in = np.concatenate([np.full((size, 1), 1), tgt[:, :-1]], axis=1)
    return src, tgt_in, tgt


def engine_model():
    ta.manual_seed(0)
    return ta.models.Transformer(VOCAB, VOCAB, d_model=D_MODEL, nhead=HEADS, num_encoder_layers=LAYERS,
                                 num_decoder_layers=LAYERS, dim_feedforward=FF, dropout=0.0)


def torch_greedy(twin, src, max_len: int):
    """The whole prefix through the decoder every step, as the tutorials decode."""
    with torch.no_grad():
        memory = twin.encode(src)
        ys = torch.ones(src.shape[0], 1, dtype=torch.long)
        for _ in range(max_len):
            logits = twin.out(twin.decode(ys, memory, src)[:, -1])
            ys = torch.cat([ys, _pick(logits)[:, None]], dim=1)
        return ys[:, 1:]


def project(mha, x, which: int):
    """One of an nn.MultiheadAttention's packed projections (0 query, 1 key, 2 value) of x
    (B, T, d_model), split into heads: (B, H, T, D)."""
    w, b = mha.in_proj_weight.chunk(3)[which], mha.in_proj_bias.chunk(3)[which]
    y = torch.nn.functional.linear(x, w, b)
    return y.view(x.shape[0], -1, HEADS, D_MODEL // HEADS).transpose(1, 2)


def merge(a):
    """One position's heads (B, H, 1, D) back to (B, 1, d_model)."""
    return a.transpose(1, 2).reshape(a.shape[0], 1, D_MODEL)


def torch_greedy_cached(twin, src, max_len: int):
    """A key/value cache written by hand over the twin's modules (post-norm layers)."""
    F = torch.nn.functional
    with torch.no_grad():
        memory = twin.encode(src)
        batch_size = src.shape[0]
        pad = (src == 0)[:, None, None, :]                      # True = masked, torch's convention
        layers = twin.transformer.decoder.layers
        memory_kv = [(project(la.multihead_attn, memory, 1), project(la.multihead_attn, memory, 2))
                     for la in layers]
        self_kv = [None] * len(layers)
        y = torch.ones(batch_size, dtype=torch.long)
        out = []
        for t in range(max_len):
            x = twin.embed(twin.tgt_embed, y[:, None], start=t)
            for i, la in enumerate(layers):
                k, v = project(la.self_attn, x, 1), project(la.self_attn, x, 2)
                if self_kv[i] is not None:
                    k, v = torch.cat([self_kv[i][0], k], 2), torch.cat([self_kv[i][1], v], 2)
                self_kv[i] = (k, v)
                a = F.scaled_dot_product_attention(project(la.self_attn, x, 0), k, v)
                x = la.norm1(x + la.self_attn.out_proj(merge(a)))
                mk, mv = memory_kv[i]
                a = F.scaled_dot_product_attention(project(la.multihead_attn, x, 0), mk, mv, attn_mask=~pad)
                x = la.norm2(x + la.multihead_attn.out_proj(merge(a)))
                x = la.norm3(x + la.linear2(F.relu(la.linear1(x))))
            y = _pick(twin.out(twin.transformer.decoder.norm(x)[:, 0]))
            out.append(y)
        return torch.stack(out, 1)


def torch_static_decoder(twin, src, max_len: int, compile_step: bool = True):
    """The cached decoder above with its self-attention caches preallocated to ``max_len``
    positions and the position a tensor input (the static cache of gpt-fast and Hugging Face's
    ``StaticCache``): every step has the same shapes, so ``torch.compile`` traces one graph and
    replays it.  Returns ``decode()`` (ids (B, max_len)) and, compiled, the seconds its first
    call took (Dynamo's trace and Inductor's C++ build)."""
    F = torch.nn.functional
    layers = twin.transformer.decoder.layers
    batch_size = src.shape[0]
    scale = math.sqrt(D_MODEL)

    def step(y, t, keys, values, memory_keys, memory_values, keep):
        """One token (B,) at position t (0-d int64): its logits (B, V); the caches written at t."""
        x = twin.tgt_embed(y[:, None]) * scale + twin.sinusoids[t][None, None]
        visible = (torch.arange(max_len) <= t)[None]                          # (1, max_len)
        for i, la in enumerate(layers):
            keys[i].index_copy_(2, t.view(1), project(la.self_attn, x, 1))
            values[i].index_copy_(2, t.view(1), project(la.self_attn, x, 2))
            a = F.scaled_dot_product_attention(project(la.self_attn, x, 0), keys[i], values[i],
                                               attn_mask=visible)
            x = la.norm1(x + la.self_attn.out_proj(merge(a)))
            a = F.scaled_dot_product_attention(project(la.multihead_attn, x, 0), memory_keys[i],
                                               memory_values[i], attn_mask=keep)
            x = la.norm2(x + la.multihead_attn.out_proj(merge(a)))
            x = la.norm3(x + la.linear2(F.relu(la.linear1(x))))
        return twin.out(twin.transformer.decoder.norm(x)[:, 0])

    run = torch.compile(step, dynamic=False) if compile_step else step
    positions = [torch.tensor(t) for t in range(max_len)]

    def decode():
        with torch.no_grad():
            memory = twin.encode(src)
            keep = (src != 0)[:, None, None, :]                                # True = may attend
            memory_keys = [project(la.multihead_attn, memory, 1) for la in layers]
            memory_values = [project(la.multihead_attn, memory, 2) for la in layers]
            shape = (batch_size, HEADS, max_len, D_MODEL // HEADS)
            keys = [torch.zeros(shape) for _ in layers]
            values = [torch.zeros(shape) for _ in layers]
            y = torch.ones(batch_size, dtype=torch.long)
            out = []
            for t in range(max_len):
                y = _pick(run(y, positions[t], keys, values, memory_keys, memory_values, keep))
                out.append(y)
            return torch.stack(out, 1)

    if not compile_step:
        return decode, None
    torch._logging.set_logs(dynamo=logging.ERROR)
    t0 = time.perf_counter()
    decode()
    return decode, time.perf_counter() - t0


def _pick(logits):
    """argmax over the tokens the engine may produce (<pad> and <start> excluded)."""
    logits = logits.clone()
    logits[:, :2] = float("-inf")
    return logits.argmax(-1)


def check_training(model, twin) -> None:
    src, tgt_in, tgt_out = batch()
    loss = model.loss(src, tgt_in, tgt_out)
    loss.backward()
    theirs = twin.loss(*(torch.from_numpy(a) for a in (src, tgt_in, tgt_out)))
    theirs.backward()
    if abs(loss.item() - theirs.item()) > TOL * abs(theirs.item()):
        sys.exit(f"the torch twin disagrees: loss {theirs.item()} against the engine's {loss.item()}")
    grads = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        g, h = p.grad.numpy(), grads[name].grad.numpy()
        if np.abs(g - h).max() > TOL * max(np.abs(h).max(), 1e-6):
            sys.exit(f"the torch twin disagrees on the gradient of {name}")
    model.zero_grad()
    twin.zero_grad()


def bench_training(args) -> None:
    model = engine_model()
    contenders = {"ta": training_step(model, ta.optim.Adam(model.parameters(), lr=1e-4), *batch())}
    if torch is not None:
        twin = model.to_torch()       # torch's own layers, the engine's names and weights
        check_training(model, twin)
        src, tgt_in, tgt_out = (torch.from_numpy(a) for a in batch())
        contenders["torch"] = training_step(twin, torch.optim.Adam(twin.parameters(), lr=1e-4),
                                            src, tgt_in, tgt_out)
    report("training step, ms", run_alternating(contenders, args.repeats, args.budget), lower_is_better=True)


def bench_decode(args) -> None:
    model = engine_model()
    src, steps = batch(args.sentences)[0], args.steps
    contenders = {"ta": lambda: model.greedy(src, max_len=steps),
                  "ta compiled": lambda: model.greedy(src, max_len=steps, compile=True)}
    eager, compiled = (model.greedy(src, max_len=steps, hypotheses=True, compile=c) for c in (False, True))
    if any(a.tokens != b.tokens or a.log_prob != b.log_prob or not np.array_equal(a.attention, b.attention)
           for a, b in zip(eager, compiled, strict=True)):
        sys.exit("the compiled decode differs from the eager one")
    if torch is not None:
        twin = model.to_torch().eval()
        ours = model.greedy(src, max_len=steps)[0]
        source = torch.from_numpy(src)
        for name, decode in (("torch", torch_greedy), ("torch+cache", torch_greedy_cached)):
            theirs = decode(twin, source, steps).numpy()
            if ours.shape != theirs.shape or not (ours == theirs).all():
                sys.exit(f"{name} decodes differently from the engine")
            contenders[name] = (lambda d: lambda: d(twin, source, steps))(decode)
        if args.inductor:
            _add_inductor_decoder(contenders, twin, source, steps, ours)
    # run_alternating times calls; sentences/s = batch / seconds per call.
    times = run_alternating(contenders, args.repeats, args.budget, unit=1.0)
    rates = {k: [args.sentences / t for t in ts] for k, ts in times.items()}
    report(f"greedy decoding, {args.sentences} sentences x {steps} steps, sentences/s", rates,
           lower_is_better=False)
    if "torch+cache" in rates:
        ratio = statistics.median(rates["ta compiled"]) / statistics.median(rates["torch+cache"])
        # Each repeat times every contender back to back: the median of the repeats' own ratios
        # is what a busy machine disturbs least.
        pairs = zip(rates["ta compiled"], rates["torch+cache"], strict=True)
        paired = statistics.median(a / b for a, b in pairs)
        print(f"  ta compiled decodes {ratio:.2f}x the sentences/s of torch+cache (median of the repeats' "
              f"ratios: {paired:.2f}x)")
    if "inductor" in rates:
        pairs = zip(rates["ta compiled"], rates["inductor"], strict=True)
        paired = statistics.median(a / b for a, b in pairs)
        print(f"  ta compiled decodes {paired:.2f}x the sentences/s of torch.compile's static-cache decoder "
              f"(median of the repeats' ratios); torch.compile / torch+cache "
              f"{statistics.median(rates['inductor']) / statistics.median(rates['torch+cache']):.2f}x")


def _add_inductor_decoder(contenders: dict, twin, source, steps: int, ours: np.ndarray) -> None:
    """The static-cache decoder compiled by torch.compile (Inductor, CPU) as a contender, when
    it compiles here and decodes what the engine does (checked eagerly and compiled)."""
    plain, _ = torch_static_decoder(twin, source, steps, compile_step=False)
    if not np.array_equal(plain().numpy(), ours):
        sys.exit("torch's static-cache decoder decodes differently from the engine")
    try:
        decode, seconds = torch_static_decoder(twin, source, steps)
        theirs = decode().numpy()
    except Exception as error:  # noqa: BLE001 - a failure of Inductor here is reported, not fatal
        text = str(error).strip().splitlines()
        print(f"  torch.compile: failed here, left out ({type(error).__name__}: {text[0] if text else ''})")
        return
    if not np.array_equal(theirs, ours):
        print("  torch.compile: its static-cache decode differs from the engine's ids, left out")
        return
    print(f"  torch.compile (Inductor) of the static-cache step: first decode {seconds:.1f} s (the compile)")
    contenders["inductor"] = decode


def report(title: str, times: dict, lower_is_better: bool) -> None:
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"{title}:")
    for name, value in med.items():
        spread = f"{min(times[name]):.1f}-{max(times[name]):.1f}"
        line = f"  {name:<12} {value:9.1f}   (repeats {spread})"
        if name != "ta":
            ratio = med["ta"] / value if lower_is_better else value / med["ta"]
            line += f"   ta takes {ratio:.2f}x the time of {name}"
        print(line)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.5, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=None, help="pin every thread pool to N")
    parser.add_argument("--only", choices=["train", "decode"], default=None)
    parser.add_argument("--profile", action="store_true", help="break ours down by op and kernel instead")
    parser.add_argument("--compiled", action="store_true",
                        help="--profile the compiled step and decode (replays, by kernel)")
    parser.add_argument("--sentences", type=int, default=SENTENCES, help="sources the greedy decode runs")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps the greedy decode runs")
    parser.add_argument("--inductor", action="store_true",
                        help="add torch.compile (Inductor) of a static-cache torch decoder as a contender "
                             "(its compile takes a minute or more)")
    args = parser.parse_args(argv)
    if args.threads:
        set_threads(args.threads, torch)
    if args.profile:
        model = engine_model()
        if args.only in (None, "train"):
            optimizer = ta.optim.Adam(model.parameters(), lr=1e-4)
            if args.compiled:
                inputs = tuple(ta.Tensor(a) for a in batch())
                compiled = ta.compile(training_step(model, optimizer))
                profile_plans([compiled], lambda: compiled(*inputs), "compiled training step", steps=10)
            else:
                profile_step(training_step(model, optimizer, *batch()), "training step", steps=10)
        if args.only in (None, "decode"):
            src = batch(args.sentences)[0]
            decode = lambda: model.greedy(src, max_len=args.steps, compile=args.compiled)  # noqa: E731
            if args.compiled:
                decode()
                functions = ta.models.decoding.compiled_functions(model)
                profile_plans(functions, decode, "compiled greedy decoding", steps=5)
            else:
                profile_step(decode, "greedy decoding", steps=5)
        return
    print(f"# Transformer, d_model {D_MODEL}, {HEADS} heads, {LAYERS}+{LAYERS} layers, feed-forward {FF}, "
          f"training batch {BATCH} x length {LENGTH}, decoding {args.sentences} sources x {args.steps} "
          f"steps, float32; {cpu_model()}")
    if torch is None:
        print("# torch is not installed: the engine is timed alone")
    since = cpu_seconds()
    if args.only in (None, "train"):
        bench_training(args)
    if args.only in (None, "decode"):
        bench_decode(args)
    others_note(since, "during the run")


if __name__ == "__main__":
    main()
