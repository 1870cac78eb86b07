"""Continue training an engine checkpoint in PyTorch's DistributedDataParallel, then bring the
result back into the engine.

    1. engine   a ta.models.Seq2Seq (GRU, Bahdanau additive attention) trained on the dates task
                with ta.models.train, saved as OUT/engine.ckpt (reused when it is there)
    2. torch    model.to_torch(): the same network of torch's own layers, the engine's weights;
                wrapped in DistributedDataParallel (gloo); every process draws its own batches
                (seed + rank), DDP averages the gradients; Adam, gradient clipping as the engine
    3. back     ta.models.Seq2Seq.from_torch(twin): the engine model again, which must decode
                the held-out sources to the same ids as the twin; saved as OUT/ddp.ckpt

Run (this machine: CPU processes, gloo):

    python examples/ddp.py --quick                         one process, a few steps (tests)
    torchrun --nproc_per_node 2 examples/ddp.py            two processes
    torchrun --nproc_per_node 1 examples/ddp.py            one, to compare steps/s

On a cluster: ``--backend nccl`` with one process per GPU (torchrun sets LOCAL_RANK; the twin
moves to cuda:LOCAL_RANK), torchrun's --nnodes/--rdzv-endpoint across machines.

Prints the loss on the held-out pairs (the task's test split: dates has no validation split)
where the engine stopped and after the torch steps, steps/s and sentences/s, and writes
OUT/ddp_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import tinygrad_attn as ta
from tinygrad_attn.export.torch import cross_entropy, greedy


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/ddp")
    parser.add_argument("--engine-steps", type=int, default=150, help="the engine's run, before torch")
    parser.add_argument("--steps", type=int, default=300, help="DDP steps (each process)")
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (one process per GPU)")
    parser.add_argument("--quick", action="store_true", help="a small model, a few steps, one process")
    args = parser.parse_args(argv)
    if args.quick:
        args.engine_steps, args.steps, args.batch_size = 30, 12, 32
    return args


def load_task(quick: bool) -> ta.data.Task:
    return ta.data.dates(n_train=600, n_test=40) if quick else ta.data.load("dates")


def engine_checkpoint(path: Path, task, args) -> None:
    """Train the engine's model and save it (rank 0 only)."""
    ta.manual_seed(0)
    size = dict(embed=8, hidden=16) if args.quick else dict(embed=32, hidden=64)
    model = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, cell="gru", attention="additive", **size)
    log = ta.models.train(model, task, steps=args.engine_steps, batch_size=64, lr=3e-3, eval_every=0)
    ta.models.save_checkpoint(path, model, task, step=args.engine_steps, loss=log[-1]["loss"])
    print(f"engine: {args.engine_steps} steps, last training loss {log[-1]['loss']:.4f}, saved {path}")


def held_out_loss(model, task, device) -> float:
    """The twin's teacher-forced loss per target token on the held-out pairs (what the engine's
    ``ta.models.validation_loss`` computes)."""
    was_training = model.training
    model.eval()
    total = tokens = 0.0
    with torch.no_grad():
        for batch in ta.data.batches(task.test, task.src_vocab, task.tgt_vocab, 256, shuffle=False):
            src, tgt_in, tgt_out = (torch.from_numpy(a).to(device) for a in batch[:3])
            count = float((tgt_out != ta.data.PAD).sum())
            total += cross_entropy(model(src, tgt_in), tgt_out).item() * count
            tokens += count
    model.train(was_training)
    return total / tokens


def train(ddp, task, args, rank: int, world: int, device) -> dict:
    optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    batches = ta.data.sample_batches(task.train, task.src_vocab, task.tgt_vocab, args.batch_size,
                                     seed=1000 + rank, bucket=8)
    warmup = min(3, args.steps - 1)         # the first steps build DDP's buckets: not timed
    losses = []
    for step in range(args.steps):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
        batch = next(batches)
        src, tgt_in, tgt_out = (torch.from_numpy(a).to(device) for a in batch[:3])
        optimizer.zero_grad()
        loss = cross_entropy(ddp(src, tgt_in), tgt_out)
        loss.backward()                     # DDP all-reduces (averages) the gradients here
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if rank == 0 and (step + 1) % max(1, args.steps // 8) == 0:
            print(f"  step {step + 1:>5}  training loss (rank 0's batches) {np.mean(losses[-10:]):.4f}",
                  flush=True)
    dist.barrier()
    seconds = time.perf_counter() - start
    steps_per_s = (args.steps - warmup) / seconds
    return {"steps_per_s": steps_per_s, "sentences_per_s": steps_per_s * args.batch_size * world,
            "first_loss": losses[0], "last_loss": float(np.mean(losses[-5:]))}


def main(argv=None) -> None:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    if "RANK" in os.environ:                # torchrun: rank, world size and rendezvous from the env
        dist.init_process_group(args.backend)
    else:                                   # a plain run: a group of one, met through a file
        rendezvous = out / "rendezvous"
        rendezvous.unlink(missing_ok=True)
        dist.init_process_group(args.backend, init_method=f"file://{rendezvous.resolve()}", rank=0,
                                world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if args.backend == "nccl" else "cpu")
    try:
        run(args, out, rank, world, device)
    finally:
        dist.destroy_process_group()


def run(args, out: Path, rank: int, world: int, device) -> None:
    task = load_task(args.quick)
    checkpoint = out / "engine.ckpt"
    if rank == 0 and not checkpoint.exists():
        engine_checkpoint(checkpoint, task, args)
    dist.barrier()                          # the others wait for rank 0's checkpoint
    engine, info = ta.models.load_checkpoint(checkpoint)
    vocabularies = (task.src_vocab.to_dict(), task.tgt_vocab.to_dict())
    if (info.src_vocab.to_dict(), info.tgt_vocab.to_dict()) != vocabularies:
        raise SystemExit(f"{checkpoint} was trained with other vocabularies than this task's: remove it")
    engine_loss = ta.models.validation_loss(engine, task.test, task.src_vocab, task.tgt_vocab)

    torch.manual_seed(rank)
    twin = engine.train().to_torch().to(device)
    start_loss = held_out_loss(twin, task, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ddp = DistributedDataParallel(twin, device_ids=[device.index] if device.type == "cuda" else None)
    if rank == 0:
        print(f"torch {torch.__version__}, backend {args.backend}, {world} process(es) x {args.threads} "
              f"thread(s), batch {args.batch_size} per process; {task!r}")
        print(f"held-out loss where the engine stopped: engine {engine_loss:.4f}, its torch twin "
              f"{start_loss:.4f}")
    timing = train(ddp, task, args, rank, world, device)
    if rank != 0:
        return
    end_loss = held_out_loss(twin, task, device)
    print(f"held-out loss after {args.steps} DDP steps: {end_loss:.4f}")

    back = ta.models.Seq2Seq.from_torch(ddp).eval()
    src = ta.data.encode_batch([source for source, _ in task.test], task.src_vocab)
    max_len = ta.models.evaluation.default_max_len(src.shape[1])
    ours, _ = back.greedy(src, max_len=max_len)
    theirs = greedy(twin.cpu(), src, max_len=max_len)
    same = ours.shape == theirs.shape and bool((ours == theirs).all())
    rows_same = int((ours == theirs).all(axis=1).sum()) if ours.shape == theirs.shape else 0
    exact = ta.models.evaluate(back, task.test, task.src_vocab, task.tgt_vocab)["exact_match"]
    ta.models.save_checkpoint(out / "ddp.ckpt", back, task, step=args.engine_steps + args.steps)
    print(f"back in the engine: greedy decodes {rows_same}/{len(src)} held-out sources to the twin's ids; "
          f"exact match {exact:.1%}; saved {out / 'ddp.ckpt'}")
    print(f"{world} process(es): {timing['steps_per_s']:.2f} steps/s, {timing['sentences_per_s']:.0f} "
          f"sentences/s (the machine is shared: timings are noisy)")
    result = dict(world_size=world, threads=args.threads, batch_size=args.batch_size, steps=args.steps,
                  engine_held_out_loss=engine_loss, start_held_out_loss=start_loss,
                  end_held_out_loss=end_loss,
                  decodes_same=same, rows_same=rows_same, rows=len(src), exact_match=exact, **timing)
    (out / "ddp_results.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
