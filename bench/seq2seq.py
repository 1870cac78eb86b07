"""One training step of a Bahdanau GRU seq2seq with additive attention: forward, loss,
backward and an Adam update, against the same model in PyTorch eager, float32.

    ta [cpu]      ta.models.Seq2Seq(cell="gru", attention="additive", style="bahdanau") with
                  ta.optim.Adam, on the default device
    ta [numpy]    the same on the numpy reference device (no compiled kernels)
    ta compiled   the cpu step under ta.compile (ids as Tensors: masks are kernels, every
                  step masked), replayed; checked bit for bit against an eager twin first
    ta fused      the same under ta.compile(fuse=True): elementwise chains fused
                  (compiler/fuse.py); its weights after three steps are compared with an eager
                  twin's (rounding only), and its time with compiled's as the median of
                  same-repeat ratios
    torch         the same model written the usual PyTorch way: nn.GRU runs the encoder in
                  one call (its time loop is in C++), a GRUCell and the additive score run
                  the decoder step by step, torch.optim.Adam; the same weights

The torch model starts from the engine's weights and its loss is checked against the engine's
before timing (to 1e-4 relative), so both time the same computation.  Sources and targets
have no padding, so torch's encoder needs no packing.  Contenders alternate within each
repeat; ratios to torch are of medians from the same run.

Sizes (the issue's): vocabulary 40, embedding 64, hidden 128, batch 32, source and target
length 20; and hidden 32, batch 8.

Run:  .venv/bin/python bench/seq2seq.py [--repeats 7] [--budget 0.5] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
from timing import cpu_model, cpu_seconds, others_note, run_alternating, set_threads, training_step

import tinygrad_attn as ta

try:
    import torch
except ImportError:  # time ours alone
    torch = None

VOCAB, EMBED, LENGTH = 40, 64, 20
SIZES = [(128, 32), (32, 8)]            # (hidden, batch)
TOL = 1e-4


def batch(size: int, seed: int):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, VOCAB, (size, LENGTH))
    tgt = rng.integers(3, VOCAB, (size, LENGTH))
    tgt_in = np.concatenate([np.full((size, 1), 1), tgt[:, :-1]], axis=1)
    return src, tgt_in, tgt


def engine_step(hidden: int, size: int, device: str):
    ta.manual_seed(0)
    model = ta.models.Seq2Seq(VOCAB, VOCAB, embed=EMBED, hidden=hidden, cell="gru",
                              attention="additive", style="bahdanau").to(device)
    optimizer = ta.optim.Adam(model.parameters(), lr=1e-3)
    return model, training_step(model, optimizer, *batch(size, 1))


class TorchSeq2Seq(torch.nn.Module if torch else object):
    """The engine's Bahdanau model, written as one writes it in PyTorch."""

    def __init__(self, hidden: int):
        super().__init__()
        nn = torch.nn
        self.src_embed = nn.Embedding(VOCAB, EMBED, padding_idx=0)
        self.tgt_embed = nn.Embedding(VOCAB, EMBED, padding_idx=0)
        self.encoder = nn.GRU(EMBED, hidden, batch_first=True)
        self.cell = nn.GRUCell(EMBED + hidden, hidden)
        self.W_q = nn.Parameter(torch.empty(hidden, hidden))
        self.W_k = nn.Parameter(torch.empty(hidden, hidden))
        self.v = nn.Parameter(torch.empty(hidden))
        self.out = nn.Linear(2 * hidden, VOCAB)

    def load_engine(self, model) -> None:
        state = model.state_dict()
        names = {"decoder.weight_ih_l0": "cell.weight_ih", "decoder.weight_hh_l0": "cell.weight_hh",
                 "decoder.bias_ih_l0": "cell.bias_ih", "decoder.bias_hh_l0": "cell.bias_hh",
                 "attention.W_q": "W_q", "attention.W_k": "W_k", "attention.v": "v"}
        self.load_state_dict({names.get(k, k): torch.from_numpy(v) for k, v in state.items()})

    def loss(self, src, tgt_in, tgt_out):
        keys, h_n = self.encoder(self.src_embed(src))                    # (B, S, H), (1, B, H)
        keys_proj = keys @ self.W_k.T                                   # (B, S, H)
        s = h_n[0]
        tops, contexts = [], []
        for t in range(tgt_in.shape[1]):
            scores = torch.tanh((s @ self.W_q.T)[:, None] + keys_proj) @ self.v      # (B, S)
            weights = torch.softmax(scores.masked_fill(src == 0, float("-inf")), dim=-1)
            context = torch.bmm(weights[:, None], keys)[:, 0]                        # (B, H)
            s = self.cell(torch.cat([self.tgt_embed(tgt_in[:, t]), context], -1), s)
            tops.append(s)
            contexts.append(context)
        features = torch.cat([torch.stack(tops, 1), torch.stack(contexts, 1)], -1)  # (B, T, 2H)
        logits = self.out(features)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tgt_out.reshape(-1),
                                                 ignore_index=0)


def compiled_step(hidden: int, size: int, fuse: bool = False):
    """The cpu step under ``ta.compile`` (one capture for the first call's None gradients, one
    after), and the largest relative difference between the weights three of its steps leave
    and those an eager twin's three leave (0.0: bit for bit)."""
    models = []
    for _ in range(2):
        ta.manual_seed(0)
        model = ta.models.Seq2Seq(VOCAB, VOCAB, embed=EMBED, hidden=hidden, cell="gru", attention="additive",
                                  style="bahdanau")
        models.append((model, ta.optim.Adam(model.parameters(), lr=1e-3)))
    ids = [ta.Tensor(a) for a in batch(size, 1)]
    (model, optimizer), (twin, twin_optimizer) = models
    step = ta.compile(lambda *tensors: training_step(model, optimizer, *tensors)(), fuse=fuse)
    eager = training_step(twin, twin_optimizer, *ids)
    for _ in range(3):
        step(*ids)
        eager()
    worst = max(float(np.abs(a.numpy() - b.numpy()).max() / max(np.abs(b.numpy()).max(), 1e-30))
                for a, b in zip(model.parameters(), twin.parameters(), strict=True))
    return worst, step, lambda: step(*ids)


def torch_step(model, hidden: int, size: int):
    twin = TorchSeq2Seq(hidden)
    twin.load_engine(model)
    optimizer = torch.optim.Adam(twin.parameters(), lr=1e-3)
    return twin, training_step(twin, optimizer, *(torch.from_numpy(a) for a in batch(size, 1)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.5, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=None, help="pin every thread pool to N")
    args = parser.parse_args(argv)
    if args.threads:
        set_threads(args.threads, torch)
    print(f"# seq2seq training step (Bahdanau GRU, additive attention), float32; {cpu_model()}")
    if torch is None:
        print("# torch is not installed: the engine is timed alone")
    since = cpu_seconds()
    print(f"{'hidden':>6} {'batch':>5} | {'ta [cpu] ms':>11} {'ta [numpy] ms':>13} {'compiled ms':>11} "
          f"{'fused ms':>9} {'torch ms':>9} | {'cpu/torch':>9} {'compiled/torch':>14} {'fused/compiled':>14} "
          f"{'nodes':>5}")
    for hidden, size in SIZES:
        model, ours = engine_step(hidden, size, "cpu")
        _, reference = engine_step(hidden, size, "numpy")
        worst, _, compiled = compiled_step(hidden, size)
        if worst != 0.0:
            sys.exit("the compiled step's weights differ from an eager twin's")
        worst, fused_step, fused = compiled_step(hidden, size, fuse=True)
        chains = sum(len(plan.chains) for plan in fused_step.plans[-1:])
        print(f"# hidden {hidden} batch {size}: fused, {chains} chains fused, "
              f"{fused_step.plans[-1].calls} kernel calls a replay; after 3 steps its weights and an eager "
              f"twin's differ by up to {worst:.3g} (relative)")
        contenders = {"cpu": ours, "numpy": reference, "compiled": compiled, "fused": fused}
        graph = ta.autograd.toposort(model.loss(*batch(size, 1)))
        nodes = sum(t.node is not None for t in graph)            # ops, not parameters
        if torch is not None:
            twin, theirs = torch_step(model, hidden, size)
            mine = float(model.loss(*batch(size, 1)).item())
            their = float(twin.loss(*(torch.from_numpy(a) for a in batch(size, 1))).item())
            if abs(mine - their) > TOL * abs(their):
                sys.exit(f"the torch twin disagrees: loss {their} against the engine's {mine}")
            contenders["torch"] = theirs
        times = run_alternating(contenders, args.repeats, args.budget)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        torch_ms = med.get("torch")
        ratio = f"{med['cpu'] / torch_ms:9.2f}" if torch_ms else f"{'-':>9}"
        compiled_ratio = f"{med['compiled'] / torch_ms:14.2f}" if torch_ms else f"{'-':>14}"
        torch_text = f"{torch_ms:9.2f}" if torch_ms else f"{'-':>9}"
        same_run = statistics.median(f / c for f, c in zip(times["fused"], times["compiled"], strict=True))
        print(f"{hidden:>6} {size:>5} | {med['cpu']:11.2f} {med['numpy']:13.2f} {med['compiled']:11.2f} "
              f"{med['fused']:9.2f} {torch_text} | {ratio} {compiled_ratio} {same_run:14.2f} {nodes:>5}")
    others_note(since, "during the run")


if __name__ == "__main__":
    main()
