"""CMUdict grapheme-to-phoneme: the model of ``examples/g2p_cmudict.py`` trained in PyTorch
eager on the same data, for the same wall-clock budget, scored the same way.

    engine   examples/g2p_cmudict.py: ta.models.Seq2Seq with a GRU encoder (bidirectional by
             default) and the attention its settings.json names (Bahdanau additive or Luong
             "general" in the runs reported)
    torch    this script: the same model written the usual PyTorch way, the engine model's
             ``to_torch()`` twin (tinygrad_attn.export.torch: nn.GRU over packed sequences
             for the encoder; Bahdanau: torch's GRU cell kernel and the additive score step
             by step; Luong: one nn.GRU call over the target, then attention for every step
             at once), starting from the engine's initial weights (same seed), trained on the
             same batches (ta.data.sample_batches, same seed and bucketing) with
             torch.optim.Adam, the same warm-up + cosine schedule, clipping and dropout,
             validated every --eval-every steps on the same split (greedy exact match, best
             weights kept), stopped by the same --minutes budget (evaluations included), as
             ta.models.train does

Both are scored on the same 6,298 held-out words with ``ta.metrics`` (WER: a word is right if
it matches any of its pronunciations; PER against the closest one), greedy decoding.  The
issue's target: the engine's held-out WER at least as good as torch's at the same budget.

Run:  .venv/bin/python bench/g2p_torch.py [--minutes 60] [--threads 1] [--engine runs/g2p]
          [--out runs/g2p_torch] [--report]
      (start the engine's run first, python examples/g2p_cmudict.py --out runs/g2p ...: this
      script reads its settings.json; both may run at once, one thread each; --report
      compares two finished runs without training)
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import tinygrad_attn as ta

try:
    import torch

    from tinygrad_attn.export.torch import greedy
except ImportError:  # pragma: no cover - said once, in main
    torch = None


def decode(model, sources, task, batch_size=256) -> list[list[str]]:
    """Greedy outputs, sources sorted by length and batched as the engine's evaluation does."""
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs = [None] * len(sources)
    for begin in range(0, len(order), batch_size):
        chunk = order[begin : begin + batch_size]
        src = ta.data.encode_batch([sources[i] for i in chunk], task.src_vocab)
        ids = greedy(model, src, ta.models.evaluation.default_max_len(src.shape[1]))
        for row, index in enumerate(chunk):
            outputs[index] = task.tgt_vocab.decode(ids[row])
    model.train()
    return outputs


def score(model, pairs, task) -> dict:
    grouped = ta.data.references(pairs)
    outputs = decode(model, [source for source, _ in grouped], task)
    return ta.metrics.score(outputs, [targets if len(targets) > 1 else targets[0] for _, targets in grouped])


def check_twin(engine, model, task) -> None:
    """Both models, dropout off, give the same loss on one batch: they are one computation."""
    batch = next(ta.data.batches(task.valid, task.src_vocab, task.tgt_vocab, 64, shuffle=False))
    engine.eval()
    model.eval()
    mine = float(engine.loss(batch.src, batch.tgt_in, batch.tgt_out).item())
    with torch.no_grad():
        theirs = model.loss(*(torch.from_numpy(a) for a in (batch.src, batch.tgt_in, batch.tgt_out))).item()
    engine.train()
    model.train()
    if abs(mine - theirs) > 1e-4 * abs(theirs):
        raise SystemExit(f"the torch twin disagrees: loss {theirs} against the engine's {mine}")
    print(f"the torch twin's loss equals the engine's on a validation batch: {theirs:.6f} / {mine:.6f}")


def plot(engine_log: Path, torch_log: list[dict], path: Path, model: str) -> None:
    """Validation WER against training minutes, the engine's run and torch's."""
    try:
        import matplotlib

        matplotlib.use("Agg")        # no display needed: the figure only goes to a file
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no curves.png")
        return
    engine = [json.loads(line) for line in engine_log.read_text().splitlines()]
    figure, axes = plt.subplots(figsize=(5.5, 3.5))
    axes.plot([e["seconds"] / 60 for e in engine], [1 - e["valid_exact_match"] for e in engine], marker=".",
              label="tinygrad_attn")
    axes.plot([e["minutes"] for e in torch_log], [e["valid_wer"] for e in torch_log], marker=".",
              label="PyTorch eager")
    axes.set_xlabel("training time (minutes)")
    axes.set_ylabel("validation WER (greedy)")
    axes.set_title(f"CMUdict g2p, the same GRU + {model} attention")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    print(f"wrote {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engine", default="runs/g2p", help="the engine's run (its settings.json)")
    parser.add_argument("--report", action="store_true", help="compare two finished runs, no training")
    parser.add_argument("--out", default="runs/g2p_torch")
    parser.add_argument("--quick", action="store_true", help="a few steps on a few hundred words")
    args = parser.parse_args(argv)
    if torch is None:
        raise SystemExit("PyTorch is not installed: pip install 'tinygrad_attn[torch]'")
    engine_dir = Path(args.engine)
    settings_file = engine_dir / "settings.json"           # written when the engine's run starts
    if not settings_file.exists():
        raise SystemExit(f"{settings_file} not found: start the engine's run first "
                         f"(python examples/g2p_cmudict.py --out {engine_dir} ...)")
    settings = json.loads(settings_file.read_text())
    kind = settings["attention"][0]
    style = settings["styles"][kind]         # the decoder the engine's run gave that score
    if args.quick:
        settings.update(hidden=16, embed=8, steps=40, eval_every=20, warmup=5)
        args.minutes = 0.5
    out = Path(args.out)
    if args.report:
        report(engine_dir, kind, style, out)
        return
    torch.set_num_threads(args.threads)
    task = ta.data.load("cmudict")
    if args.quick:
        task = ta.data.Task("cmudict", task.train[:800], task.test[:60], task.src_vocab, task.tgt_vocab,
                            task.level, valid=task.valid[:60], tgt_level=task.tgt_level, lowercase=False)
    ta.manual_seed(settings["seed"])
    engine = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=settings["embed"],
                               hidden=settings["hidden"], attention=kind, style=style,
                               bidirectional=settings["bidirectional"], dropout=settings["dropout"])
    torch.manual_seed(settings["seed"])
    model = engine.to_torch()                       # the same network, the engine's initial weights
    check_twin(engine, model, task)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr"])
    schedule = ta.optim.WarmupCosine(ta.optim.Adam(engine.parameters(), lr=settings["lr"]),
                                     settings["warmup"], settings["steps"])
    batches = ta.data.sample_batches(task.train, task.src_vocab, task.tgt_vocab, settings["batch_size"],
                                     seed=settings["seed"], bucket=settings["bucket"])
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {args.threads} thread(s); {task!r}; {args.minutes:g} min budget")
    best, best_state, log = -1.0, None, []
    start = time.perf_counter()
    step = 0
    while step < settings["steps"]:
        batch = next(batches)
        for group in optimizer.param_groups:
            group["lr"] = schedule.rate(step)
        optimizer.zero_grad()
        loss = model.loss(*(torch.from_numpy(a) for a in (batch.src, batch.tgt_in, batch.tgt_out)))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % settings["eval_every"] == 0 or step == settings["steps"]:
            exact = score(model, task.valid, task)["exact_match"]
            if exact > best:
                best, best_state = exact, {k: v.clone() for k, v in model.state_dict().items()}
            minutes = (time.perf_counter() - start) / 60
            log.append({"step": step, "minutes": round(minutes, 2), "loss": loss.item(),
                        "valid_wer": 1 - exact})
            print(f"  step {step:>6}  {minutes:5.1f} min  loss {loss.item():.3f}  valid WER {1 - exact:.2%}",
                  flush=True)
        if time.perf_counter() - start >= args.minutes * 60:
            break
    trained = time.perf_counter() - start
    if best_state is not None:
        model.load_state_dict(best_state)
    metrics = score(model, task.test, task)
    result = {"framework": f"torch {torch.__version__}", "threads": args.threads, "steps": step,
              "train_seconds": round(trained, 1), "wer": metrics.get("wer", 1 - metrics["exact_match"]),
              "per": metrics["token_error_rate"], "words": metrics["n"], "log": log}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"torch: {step} steps in {trained / 60:.1f} min; test, greedy: WER {result['wer']:.2%}, "
          f"PER {result['per']:.2%} ({metrics['n']} words)")
    if not args.quick:
        report(engine_dir, kind, style, out)


def report(engine_dir: Path, kind: str, style: str, out: Path) -> None:
    """Both finished runs side by side, and their validation curves in one plot."""
    theirs = json.loads((out / "results.json").read_text())
    engine_file = engine_dir / "results.json"
    if not engine_file.exists():
        print(f"the engine's run has not finished ({engine_file} missing): compare later with --report")
        return
    plot(ta.models.log_path(engine_dir / f"{kind}.ckpt"), theirs["log"], out / "curves.png",
         f"{kind} ({style})")
    mine = json.loads(engine_file.read_text())["results"][0]
    ratio = mine["greedy"]["wer"] / theirs["wer"] if theirs["wer"] else math.nan
    print(f"torch: {theirs['steps']} steps in {theirs['train_seconds'] / 60:.1f} min, {theirs['threads']} "
          f"thread(s); test, greedy: WER {theirs['wer']:.2%}, PER {theirs['per']:.2%}")
    print(f"engine: {mine['steps']} steps in {mine['train_seconds'] / 60:.1f} min; test, greedy: "
          f"WER {mine['greedy']['wer']:.2%}, PER {mine['greedy']['per']:.2%}; "
          f"WER engine / torch {ratio:.3f} (target <= 1)")

if __name__ == "__main__":
    main()
