"""CMUdict grapheme-to-phoneme: the model of ``examples/g2p_cmudict.py`` trained in PyTorch
eager on the same data, for the same wall-clock budget, scored the same way.

    engine   examples/g2p_cmudict.py: ta.models.Seq2Seq (--arch gru: a GRU encoder,
             bidirectional by default, and the attention its settings.json names) or
             ta.models.Transformer (--arch transformer)
    torch    this script: the same model written the usual PyTorch way, the engine model's
             ``to_torch()`` twin (tinygrad_attn.export.torch; GRU: nn.GRU over packed
             sequences for the encoder, Bahdanau: torch's GRU cell kernel and the additive
             score step by step, Luong: one nn.GRU call over the target, then attention for
             every step at once; Transformer: torch.nn.Transformer(batch_first=True), the
             engine's embeddings and sinusoids), built by the example's own ``build_model``
             from the engine's settings and seed, so it starts from the engine's initial
             weights; trained on the same batches (ta.data.sample_batches, same seed and
             bucketing; an engine run with --compile pads them, masked) with torch.optim.Adam,
             the same warm-up + cosine schedule, clipping (1.0), dropout and label smoothing
             (F.cross_entropy(label_smoothing=), the definition the engine's follows),
             validated every --eval-every steps on the same split (greedy exact match), and
             ending with the same weights: the best evaluation's, or with --average-last N the
             mean of the last N evaluations' (summed in float64, as ta.models.train does);
             stopped by the same --minutes budget (evaluations included), as ta.models.train is

Decoding: the GRU twin steps its decoder (tinygrad_attn.export.torch.greedy); the Transformer
twin decodes with a key/value cache written here over its own layers (``transformer_greedy``:
each step one token's work, as the engine's cached decode; the export's greedy re-runs the
whole prefix, which would charge torch's evaluations a quadratic cost the engine does not pay).
Both are scored on the same 6,298 held-out words with ``ta.metrics`` (WER: a word is right if
it matches any of its pronunciations; PER against the closest one), greedy decoding.  The
issue's target: the engine's held-out WER at least as good as torch's at the same budget.

Run:  .venv/bin/python bench/g2p_torch.py [--minutes 60] [--threads 1] [--engine runs/g2p]
          [--seed S] [--out runs/g2p_torch] [--report] [--quick] [--step-time [--repeats 7]]
      (start the engine's run first, python examples/g2p_cmudict.py --out runs/g2p ...: this
      script reads its settings.json and trains its first configuration (the first
      --attention kind, or the Transformer) with the engine's first seed, or --seed; both may
      run at once, one thread each; --report compares two finished runs without training;
      --step-time trains nothing and times one training step of each, alternating)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import time
from argparse import Namespace
from pathlib import Path

import numpy as np

import tinygrad_attn as ta

try:
    import torch
    from torch.nn import functional as F

    from tinygrad_attn.export.torch import TorchTransformer, greedy
except ImportError:  # pragma: no cover - said once, in main
    torch = None

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "g2p_cmudict.py"


def example():
    """examples/g2p_cmudict.py as a module: its build_model makes the engine's model."""
    spec = importlib.util.spec_from_file_location("g2p_cmudict", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loss_of(model, batch, label_smoothing: float = 0.0):
    """Mean cross-entropy of the twin's teacher-forced logits, padding ignored, smoothed as
    the engine's ``loss(..., label_smoothing=)``."""
    src, tgt_in, tgt_out = (torch.from_numpy(a) for a in (batch.src, batch.tgt_in, batch.tgt_out))
    logits = model(src, tgt_in)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1),
                           ignore_index=ta.data.PAD, label_smoothing=label_smoothing)


def transformer_greedy(twin, src, max_len: int) -> np.ndarray:
    """Greedy decoding of a ``TorchTransformer`` (in eval mode) with a key/value cache: each
    step runs one token through the decoder's layers (post- or pre-norm, as the twin's), its
    self-attention reading the cached keys and values of the tokens before, its
    cross-attention the memory's, projected once.  Laid out as the engine's ids: (B, L) int64,
    each row up to and including ``<end>``, then 0; ``<pad>`` and ``<start>`` never produced;
    at most the position table's length of tokens."""
    with torch.no_grad():
        return _transformer_greedy(twin, torch.as_tensor(src, dtype=torch.long), max_len)


def _transformer_greedy(twin, src, max_len: int) -> np.ndarray:
    batch, d_model, heads = src.shape[0], twin.d_model, twin.config["nhead"]
    memory = twin.encode(src)                                                     # (B, S, D)
    attend = (src != ta.data.PAD)[:, None, None, :]                  # True: may attend (sdpa's bool mask)
    layers = twin.transformer.decoder.layers

    def split(x):
        return x.view(batch, -1, heads, d_model // heads).transpose(1, 2)        # (B, H, L, D / H)

    def merge(a):
        return a.transpose(1, 2).reshape(batch, -1, d_model)

    def project(attention, x, which: int):
        weight, bias = attention.in_proj_weight.chunk(3)[which], attention.in_proj_bias.chunk(3)[which]
        return split(F.linear(x, weight, bias))

    memory_kv = [(project(la.multihead_attn, memory, 1), project(la.multihead_attn, memory, 2))
                 for la in layers]
    cache = [None] * len(layers)
    y = torch.full((batch,), ta.data.START, dtype=torch.long)
    done = torch.zeros(batch, dtype=torch.bool)
    ids = []
    for t in range(min(max_len, twin.max_len)):
        x = twin.embed(twin.tgt_embed, y[:, None], start=t)                       # (B, 1, D)
        for i, la in enumerate(layers):

            def self_attention(h, i=i, la=la):
                k, v = project(la.self_attn, h, 1), project(la.self_attn, h, 2)
                if cache[i] is not None:
                    k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
                cache[i] = (k, v)
                return la.self_attn.out_proj(merge(F.scaled_dot_product_attention(project(la.self_attn, h, 0),
                                                                                  k, v)))

            def cross_attention(h, i=i, la=la):
                a = F.scaled_dot_product_attention(project(la.multihead_attn, h, 0), *memory_kv[i],
                                                   attn_mask=attend)
                return la.multihead_attn.out_proj(merge(a))

            def feed_forward(h, la=la):
                return la.linear2(la.activation(la.linear1(h)))

            if twin.config["norm_first"]:
                x = x + self_attention(la.norm1(x))
                x = x + cross_attention(la.norm2(x))
                x = x + feed_forward(la.norm3(x))
            else:
                x = la.norm1(x + self_attention(x))
                x = la.norm2(x + cross_attention(x))
                x = la.norm3(x + feed_forward(x))
        logits = twin.out(twin.transformer.decoder.norm(x)[:, 0])                 # (B, V)
        logits[:, [ta.data.PAD, ta.data.START]] = -math.inf
        y = torch.where(done, torch.full_like(y, ta.data.PAD), logits.argmax(-1))
        ids.append(y)
        done |= y == ta.data.END
        if bool(done.all()):
            break
    return torch.stack(ids, 1).numpy()


def decode(model, sources, task, batch_size=256) -> list[list[str]]:
    """Greedy outputs, sources sorted by length and batched as the engine's evaluation does."""
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs = [None] * len(sources)
    for begin in range(0, len(order), batch_size):
        chunk = order[begin : begin + batch_size]
        src = ta.data.encode_batch([sources[i] for i in chunk], task.src_vocab)
        limit = ta.models.evaluation.default_max_len(src.shape[1])
        if isinstance(model, TorchTransformer):
            ids = transformer_greedy(model, src, limit)
        else:
            ids = greedy(model, src, limit)
        for row, index in enumerate(chunk):
            outputs[index] = task.tgt_vocab.decode(ids[row])
    model.train()
    return outputs


def score(model, pairs, task) -> dict:
    grouped = ta.data.references(pairs)
    outputs = decode(model, [source for source, _ in grouped], task)
    return ta.metrics.score(outputs, [targets if len(targets) > 1 else targets[0] for _, targets in grouped])


def check_twin(engine, model, task, label_smoothing: float = 0.0) -> None:
    """Both models, dropout off, give the same loss on one batch: they are one computation."""
    batch = next(ta.data.batches(task.valid, task.src_vocab, task.tgt_vocab, 64, shuffle=False))
    engine.eval()
    model.eval()
    mine = float(engine.loss(batch.src, batch.tgt_in, batch.tgt_out, label_smoothing=label_smoothing).item())
    with torch.no_grad():
        theirs = loss_of(model, batch, label_smoothing).item()
    engine.train()
    model.train()
    if abs(mine - theirs) > 1e-4 * abs(theirs):
        raise SystemExit(f"the torch twin disagrees: loss {theirs} against the engine's {mine}")
    print(f"the torch twin's loss equals the engine's on a validation batch: {theirs:.6f} / {mine:.6f}")


def average(states: list[dict]) -> dict:
    """The mean of state_dicts: summed in float64 in order, divided by the count, cast back."""
    return {name: (sum((state[name].double() for state in states[1:]), states[0][name].double())
                   / len(states)).to(first.dtype)
            for name, first in states[0].items()}


def closed(snapshots: list[tuple], averaging: int, step: int, model) -> list[tuple]:
    """The (step, state) pairs a run stopped by its budget at ``step`` averages, as
    ta.models.train closes a time limit's average: between evaluations, the last
    ``averaging`` - 1 evaluations' and the last step's weights; at one, the evaluations'."""
    if snapshots and snapshots[-1][0] == step:
        return snapshots
    kept = snapshots[-(averaging - 1):] if averaging > 1 else []
    return [*kept, (step, {k: v.clone() for k, v in model.state_dict().items()})]


def plot(engine_log: Path, torch_log: list[dict], path: Path, model: str) -> None:
    """Validation WER against training minutes, the engine's run and torch's (drawn by the
    example's ``draw``)."""
    g2p = example()
    curves = [("tinygrad_attn", *g2p._curves(engine_log)),
              ("PyTorch eager", [e["minutes"] for e in torch_log], [e["valid_wer"] for e in torch_log])]
    g2p.draw(curves, path, f"CMUdict g2p, the same {model}", "training time (minutes)")


def engine_run(settings: dict, seed: int | None) -> tuple[Namespace, str, int]:
    """The engine run's settings as the example's arguments (settings.json from before --arch
    and --seeds name one GRU run and one seed), its first configuration and the seed."""
    seeds = settings.get("seeds", [settings.get("seed", 0)])
    if seed is None:
        seed = seeds[0]
    elif seed not in seeds:
        raise SystemExit(f"--seed {seed}: the engine's run has seeds {seeds}")
    args = Namespace(**{"arch": "gru", "norm_first": False, "max_len": None, "label_smoothing": 0.0,
                        "average_last": 0, "layers": 1, "valid_fraction": 0.05, **settings, "seeds": seeds})
    kind = args.attention[0] if args.arch == "gru" else "transformer"
    if args.arch == "gru":
        args.style = args.styles[kind]          # the decoder the engine's run gave that score
    return args, kind, seed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engine", default="runs/g2p", help="the engine's run (its settings.json)")
    parser.add_argument("--seed", type=int, default=None,
                        help="which of the engine's seeds (default its first)")
    parser.add_argument("--report", action="store_true", help="compare two finished runs, no training")
    parser.add_argument("--out", default="runs/g2p_torch")
    parser.add_argument("--quick", action="store_true", help="a few steps on a few hundred words")
    parser.add_argument("--step-time", action="store_true",
                        help="train nothing: time a training step of each, alternating, on the run's batches")
    parser.add_argument("--repeats", type=int, default=7, help="--step-time's alternating repeats")
    args = parser.parse_args(argv)
    if torch is None:
        raise SystemExit("PyTorch is not installed: pip install 'tinygrad_attn[torch]'")
    engine_dir = Path(args.engine)
    settings_file = engine_dir / "settings.json"           # written when the engine's run starts
    if not settings_file.exists():
        raise SystemExit(f"{settings_file} not found: start the engine's run first "
                         f"(python examples/g2p_cmudict.py --out {engine_dir} ...)")
    g2p = example()
    run, kind, seed = engine_run(json.loads(settings_file.read_text()), args.seed)
    if args.quick:
        vars(run).update(steps=40, eval_every=20, warmup=5,
                         **(g2p.QUICK_GRU if run.arch == "gru" else g2p.QUICK_TRANSFORMER))
        args.minutes = 0.5
    out = Path(args.out)
    if args.report:
        report(engine_dir, run, kind, seed, out)
        return
    torch.set_num_threads(args.threads)
    task = g2p.load_task(Namespace(valid_fraction=run.valid_fraction, quick=args.quick))
    engine = g2p.build_model(kind, task, run, seed)
    torch.manual_seed(seed)
    model = engine.to_torch()                       # the same network, the engine's initial weights
    smoothing, averaging = run.label_smoothing, run.average_last
    check_twin(engine, model, task, smoothing)
    if args.step_time:
        step_time(engine, model, run, task, seed, args)
        return
    optimizer = torch.optim.Adam(model.parameters(), lr=run.lr)
    schedule = ta.optim.WarmupCosine(ta.optim.Adam(engine.parameters(), lr=run.lr), run.warmup, run.steps)
    batches = ta.data.sample_batches(task.train, task.src_vocab, task.tgt_vocab, run.batch_size, seed=seed,
                                     bucket=run.bucket)
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {args.threads} thread(s); {task!r}; {g2p.describe(kind, run)}, "
          f"seed {seed}, label smoothing {smoothing:g}, ending with "
          f"{f'the average of the last {averaging}' if averaging else 'the best'} evaluation(s); "
          f"{args.minutes:g} min budget")
    best, best_step, best_state, snapshots, log = -1.0, None, None, [], []
    start = time.perf_counter()
    step = 0
    while step < run.steps:
        batch = next(batches)
        for group in optimizer.param_groups:
            group["lr"] = schedule.rate(step)
        optimizer.zero_grad()
        loss = loss_of(model, batch, smoothing)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % run.eval_every == 0 or step == run.steps:
            exact = score(model, task.valid, task)["exact_match"]
            state = {k: v.clone() for k, v in model.state_dict().items()}
            if exact > best:
                best, best_step, best_state = exact, step, state
            if averaging:
                snapshots = [*snapshots, (step, state)][-averaging:]
            minutes = (time.perf_counter() - start) / 60
            log.append({"step": step, "minutes": round(minutes, 2), "loss": loss.item(),
                        "valid_wer": 1 - exact})
            print(f"  step {step:>6}  {minutes:5.1f} min  loss {loss.item():.3f}  valid WER {1 - exact:.2%}",
                  flush=True)
        if time.perf_counter() - start >= args.minutes * 60:
            if averaging:
                snapshots = closed(snapshots, averaging, step, model)
            break
    trained = time.perf_counter() - start
    if snapshots:
        model.load_state_dict(average([state for _, state in snapshots]))
    elif best_state is not None:
        model.load_state_dict(best_state)
    metrics = score(model, task.test, task)
    result = {"framework": f"torch {torch.__version__}", "threads": args.threads, "arch": run.arch,
              "model": g2p.describe(kind, run), "seed": seed, "label_smoothing": smoothing,
              "average_last": averaging, "best_step": best_step,
              "averaged_steps": [s for s, _ in snapshots] or None, "steps": step,
              "train_seconds": round(trained, 1), "wer": metrics.get("wer", 1 - metrics["exact_match"]),
              "per": metrics["token_error_rate"], "words": metrics["n"], "log": log}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"torch: {step} steps in {trained / 60:.1f} min; test, greedy: WER {result['wer']:.2%}, "
          f"PER {result['per']:.2%} ({metrics['n']} words)")
    if not args.quick:
        report(engine_dir, run, kind, seed, out)


def step_time(engine, model, run: Namespace, task, seed: int, args, count: int = 8) -> None:
    """ms per training step (loss, backward, clipping, Adam), the engine's (compiled as the run
    is, its batches padded as ``ta.models.train`` pads them) and the twin's, on the run's
    first ``count`` batches, alternating engine and torch in each of ``args.repeats``
    repeats; prints both medians and the median of the repeats' ratios."""
    stream = ta.data.sample_batches(task.train, task.src_vocab, task.tgt_vocab, run.batch_size, seed=seed,
                                    bucket=run.bucket)
    batches = [next(stream) for _ in range(count)]
    padding = ta.models.BatchPadding("auto", (engine.max_src_len, engine.max_tgt_len))
    padded = [padding(b.src, b.tgt_in, b.tgt_out) for b in batches]
    params = engine.parameters()
    mine = ta.optim.Adam(params, lr=run.lr)
    theirs = torch.optim.Adam(model.parameters(), lr=run.lr)

    def engine_step(src, tgt_in, tgt_out):
        loss = engine.loss(src, tgt_in, tgt_out, label_smoothing=run.label_smoothing)
        loss.backward()
        ta.nn.utils.clip_grad_norm_(params, 1.0)
        mine.step()
        mine.zero_grad()
        return loss

    engine_step = ta.compile(engine_step) if run.compile else engine_step

    def torch_step(batch):
        theirs.zero_grad()
        loss_of(model, batch, run.label_smoothing).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        theirs.step()

    def timed(fn, items) -> float:
        start = time.perf_counter()
        for item in items:
            fn(item)
        return (time.perf_counter() - start) / len(items) * 1e3

    timed(lambda arrays: engine_step(*arrays), padded)           # captures, warm-up
    timed(torch_step, batches)
    rows = []
    for _ in range(args.repeats):
        rows.append((timed(lambda arrays: engine_step(*arrays), padded), timed(torch_step, batches)))
    ours, torchs = (sorted(column)[len(column) // 2] for column in zip(*rows, strict=True))
    ratios = sorted(a / b for a, b in rows)
    print(f"training step, {args.threads} thread(s), {count} batches of {run.batch_size}, median of "
          f"{args.repeats}: engine{' compiled' if run.compile else ''} {ours:.1f} ms, torch eager "
          f"{torchs:.1f} ms; engine / torch {ratios[len(ratios) // 2]:.2f}x (repeats {ratios[0]:.2f}-"
          f"{ratios[-1]:.2f}x)")


def report(engine_dir: Path, run: Namespace, kind: str, seed: int, out: Path) -> None:
    """Both finished runs side by side, and their validation curves in one plot."""
    theirs = json.loads((out / "results.json").read_text())
    engine_file = engine_dir / "results.json"
    if not engine_file.exists():
        print(f"the engine's run has not finished ({engine_file} missing): compare later with --report")
        return
    results = json.loads(engine_file.read_text())["results"]
    # Results from before --arch and --seeds have neither field: one GRU run, one seed.
    mine = next((r for r in results if r.get("seed", seed) == seed
                 and (r.get("attention") == kind or r.get("arch") == "transformer")), results[0])
    checkpoint = mine.get("checkpoint", f"{kind}.ckpt")
    style = f" ({run.styles[kind]})" if run.arch == "gru" else ""
    model = f"GRU + {kind} attention{style}" if run.arch == "gru" else "Transformer"
    plot(ta.models.log_path(engine_dir / checkpoint), theirs["log"], out / "curves.png", model)
    ratio = mine["greedy"]["wer"] / theirs["wer"] if theirs["wer"] else math.nan
    print(f"torch: {theirs['steps']} steps in {theirs['train_seconds'] / 60:.1f} min, {theirs['threads']} "
          f"thread(s); test, greedy: WER {theirs['wer']:.2%}, PER {theirs['per']:.2%}")
    print(f"engine: {mine['steps']} steps in {mine['train_seconds'] / 60:.1f} min; test, greedy: "
          f"WER {mine['greedy']['wer']:.2%}, PER {mine['greedy']['per']:.2%}; "
          f"WER engine / torch {ratio:.3f} (target <= 1)")


if __name__ == "__main__":
    main()
