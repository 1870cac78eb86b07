"""The lecture notes' cost claim, measured: how the time attention takes in one training step
grows with the source length m and the target length t.

    RNN decoder, additive attention   t steps, each scoring m encoder states     m * t scores
    Transformer encoder self-attention                                            m * m
    Transformer decoder self-attention (causal)                                   t * t
    Transformer cross-attention                                                   t * m

What is timed.  Whole training steps (forward, loss, backward) of the two models of
``examples/transformer_vs_gru.py`` (a GRU encoder-decoder with Bahdanau attention, embed 64,
hidden 128; a Transformer with d_model 64, 4 heads, 2 + 2 layers, feed-forward 256, no
dropout), on batches of random token ids, every source of length m and every target of
length t.  During the measured steps every op's ``forward`` and ``backward`` is wrapped in a
timer (the classes' methods, restored afterwards; ``bench/attention.py --profile`` does the
same), and an op's time counts as attention when the op ran inside an attention
mechanism's scope (``ta.attention.SCOPES``; backward is charged to the scope its forward ran
in):

    "additive_attention"             the RNN decoder's attention at each step: the fused
                                     AdditiveScores node, the masked softmax and the weighted
                                     sum of the encoder states
    "scaled_dot_product_attention"   the Transformer's: the fused ScaledDotProduct node
                                     (scores, softmax and weighted sum in one), split by the
                                     sublayer it ran in (``ta.scopes``)

The projections are not attention by this rule: W_k h_j (once per source, O(m)) and the
Transformer's query, key, value and output projections (O(m + t)).  One is inside: the
AdditiveScores node projects its query W_q s_{i-1} itself, a (B, d) x (d, d_a) product per
decoder step, O(t).  Gradients that ``ta.ops.DeferredGrad`` sums once over every step
(W_q's, v's) are computed outside the ops and are not counted.

The grid: m over ``--lengths`` with t fixed at ``--fixed``, then t over the lengths with m
fixed, batches of ``--batch-size`` (64, as the comparison trains).  ``--rounds`` passes go
over the whole grid; at each point a pass runs one untimed step, then ``--repeats`` timed
ones.  Each series keeps its least time over the samples (other processes on a shared
machine only ever add time, and a burst of theirs spoils one pass, not every sample of a
point), and the least whole step (timers included) is kept for scale.  The exponent of
each series is the least-squares slope of log(time) against log(length): time ~ length^p.
Fixed costs (a Python call per op, a kernel launch, a loop over heads) flatten the slopes
where the work is small, so a series approaches its asymptotic exponent only at the long
end; the fit over the whole grid is printed, and the fit over the longest three points
next to it.

Run:  python examples/attention_cost.py [--lengths 16 32 64 128 256 512] [--fixed 32]
          [--batch-size 64] [--repeats 2] [--rounds 3] [--threads 1] [--out runs/attention_cost]
          [--figure PATH] [--quick]

The figure in docs/guide/transformer.md comes from ``python examples/attention_cost.py --figure
docs/attention_cost.png``.  It writes, under ``--out``: ``results.json`` (every timing and
fit), ``results.md`` (the timings in ms per step, and the exponents) and
``attention_cost.png`` (when matplotlib is installed; ``--figure`` writes a copy there).
``--quick`` runs small models on a short grid in seconds: it checks that the script runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import tinygrad_attn as ta
from tinygrad_attn.autograd import current_scope

ADDITIVE = ta.attention.SCOPES["additive"]
SDPA = ta.attention.SCOPES["scaled_dot_product"]

# Each series, what it scores, and the exponents the notes predict against (m, t).
SERIES = {
    "rnn_additive": ("RNN decoder, additive attention", "m·t", (1, 1)),
    "encoder_self": ("Transformer encoder self-attention", "m²", (2, 0)),
    "decoder_self": ("Transformer decoder self-attention", "t²", (0, 2)),
    "cross": ("Transformer cross-attention", "m·t", (1, 1)),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512])
    parser.add_argument("--fixed", type=int, default=32, help="the length held fixed while the other varies")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per point in each round")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the whole grid")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/attention_cost")
    parser.add_argument("--figure", default=None, help="also write the figure here")
    parser.add_argument("--quick", action="store_true",
                        help="small models on a short grid: checks that it runs")
    return parser.parse_args(argv)


# ---------------------------------------------------------------- timing the attention ops


def series_of(scope: str) -> str | None:
    """Which series an op's time belongs to, from the scope it ran in (None: not attention)."""
    parts = scope.split("/")
    if ADDITIVE in parts:
        return "rnn_additive"
    if SDPA not in parts:
        return None
    if parts[0] == ta.scopes.ENCODER:
        return "encoder_self"
    return "cross" if ta.scopes.CROSS_ATTENTION in parts else "decoder_self"


@contextmanager
def attention_timers():
    """Time every op's forward and backward inside the block; yields a dict series ->
    seconds that the timers add to.  The ops' methods are restored on leaving."""
    seconds: dict[str, float] = defaultdict(float)
    originals = {}

    def timed(cls, forward, backward):
        def timed_forward(self, *inputs):
            # The scope is known only now: backward runs later, outside it.
            self.__dict__["_cost_series"] = series = series_of(current_scope())
            if series is None:
                return forward(self, *inputs)
            start = time.perf_counter()
            try:
                return forward(self, *inputs)
            finally:
                seconds[series] += time.perf_counter() - start

        def timed_backward(self, dy):
            series = self.__dict__.get("_cost_series")
            if series is None:
                return backward(self, dy)
            start = time.perf_counter()
            try:
                return backward(self, dy)
            finally:
                seconds[series] += time.perf_counter() - start

        cls.forward, cls.backward = timed_forward, timed_backward

    for cls in ta.ops.registry.values():
        originals[cls] = (cls.forward, cls.backward)
        timed(cls, *originals[cls])
    try:
        yield seconds
    finally:
        for cls, (forward, backward) in originals.items():
            cls.forward, cls.backward = forward, backward


# ---------------------------------------------------------------- the models and a step

VOCAB = 24          # 4 reserved ids and 20 symbols, as ta.data.reverse


def build(quick: bool, seed: int, longest: int) -> dict:
    ta.manual_seed(seed)
    embed, hidden = (16, 32) if quick else (64, 128)
    d_model, nhead, layers, ff = (32, 2, 1, 64) if quick else (64, 4, 2, 256)
    return {
        "rnn": ta.models.Seq2Seq(VOCAB, VOCAB, embed=embed, hidden=hidden, cell="gru", attention="additive",
                                 style="bahdanau"),
        "transformer": ta.models.Transformer(VOCAB, VOCAB, d_model=d_model, nhead=nhead,
                                             num_encoder_layers=layers, num_decoder_layers=layers,
                                             dim_feedforward=ff, dropout=0.0, max_len=max(longest, 512)),
    }


def attention_seconds(model, m: int, t: int, batch: int, repeats: int, rng) -> list[dict[str, float]]:
    """Seconds per series in each of ``repeats`` training steps (forward, loss, backward) at
    source length m and target length t, after one untimed step; "step": the whole step
    (timers included)."""
    src = rng.integers(4, VOCAB, size=(batch, m))                          # (B, S), no padding
    tgt_in = np.concatenate([np.full((batch, 1), ta.data.START), rng.integers(4, VOCAB, size=(batch, t - 1))],
                            axis=1)                                         # (B, T)
    tgt_out = np.concatenate([tgt_in[:, 1:], np.full((batch, 1), ta.data.END)], axis=1)
    model.loss(src, tgt_in, tgt_out).backward()                            # warm: kernels loaded
    steps = []
    for _ in range(repeats):
        model.zero_grad()
        with attention_timers() as seconds:
            start = time.perf_counter()
            model.loss(src, tgt_in, tgt_out).backward()
            seconds["step"] = time.perf_counter() - start
        steps.append(dict(seconds))
    return steps


# ---------------------------------------------------------------- fits and report


def exponent(lengths, seconds) -> float:
    """The least-squares slope of log(seconds) against log(length)."""
    slope, _ = np.polyfit(np.log(lengths), np.log(seconds), 1)
    return float(slope)


def describe(point: dict) -> str:
    attention = "  ".join(f"{series} {point[series] * 1e3:7.1f}" for series in SERIES)
    return (f"  m={point['m']:>4} t={point['t']:>4}  {attention} ms; whole steps: rnn "
            f"{point['rnn_step'] * 1e3:.0f}, transformer {point['transformer_step'] * 1e3:.0f} ms")


def measure(args) -> dict:
    longest = max(args.lengths)
    models = build(args.quick, args.seed, longest)
    rng = np.random.default_rng(args.seed)
    # One step at the largest shape first: the allocator then holds the memory every later
    # step needs, instead of the first points paying to fault it in.
    for model in models.values():
        attention_seconds(model, longest, longest, args.batch_size, 1, rng)
    grid = [(axis, (length, args.fixed) if axis == "m" else (args.fixed, length))
            for axis in ("m", "t") for length in args.lengths]
    samples: dict[tuple, list] = defaultdict(list)
    # Rounds over the whole grid, not all repeats of a point at once: a burst of other work
    # on the machine then spoils one sample of several points, not every sample of one.
    for _ in range(args.rounds):
        for axis, (m, t) in grid:
            for name, model in models.items():
                for step in attention_seconds(model, m, t, args.batch_size, args.repeats, rng):
                    samples[axis, m, t].append((name, step))
    sweeps: dict[str, list] = {"m": [], "t": []}
    for axis, (m, t) in grid:
        point = {"m": m, "t": t}
        for name in models:
            steps = [step for owner, step in samples[axis, m, t] if owner == name]
            # The least time: other processes only ever add to it.
            point[f"{name}_step"] = min(step["step"] for step in steps)
            for series in {key for step in steps for key in step} - {"step"}:
                point[series] = min(step[series] for step in steps)
        sweeps[axis].append(point)
        print(describe(point), flush=True)
    return sweeps


def fits(sweeps: dict) -> dict:
    """series -> axis -> {"all": slope over the grid, "long": slope over the longest three}."""
    result = {}
    for series in SERIES:
        result[series] = {}
        for axis, points in sweeps.items():
            lengths = [point[axis] for point in points]
            seconds = [point[series] for point in points]
            result[series][axis] = {"all": exponent(lengths, seconds),
                                    "long": exponent(lengths[-3:], seconds[-3:])}
    return result


def shown(slope: float) -> str:
    """An exponent to two places, without the "-0.00" of a slope a hair below zero."""
    return f"{0.0 if abs(slope) < 0.005 else slope:.2f}"


def table(sweeps: dict, fitted: dict, args) -> str:
    """The timings (ms per training step) and the fitted exponents, as markdown."""
    rows = ["| varies | m | t | RNN additive | RNN step | encoder self | decoder self | cross "
            "| Transformer step |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    # The point where both lengths are --fixed is in both sweeps: measured twice, shown twice.
    for axis, point in [(axis, point) for axis, points in sweeps.items() for point in points]:
        ms = {key: point[key] * 1e3 for key in (*SERIES, "rnn_step", "transformer_step")}
        rows.append(f"| {axis} | {point['m']} | {point['t']} | {ms['rnn_additive']:.1f} "
                    f"| {ms['rnn_step']:.0f} | {ms['encoder_self']:.1f} | {ms['decoder_self']:.1f} "
                    f"| {ms['cross']:.1f} | {ms['transformer_step']:.0f} |")
    longest = args.lengths[-3:]
    rows += ["", f"| attention | scores | predicted (m, t) | exponent in m | in m, m >= {longest[0]} "
                 f"| exponent in t | in t, t >= {longest[0]} |",
             "|---|---|---|---:|---:|---:|---:|"]
    for series, (label, scores, predicted) in SERIES.items():
        m, t = fitted[series]["m"], fitted[series]["t"]
        rows.append(f"| {label} | {scores} | {predicted} | {shown(m['all'])} | {shown(m['long'])} "
                    f"| {shown(t['all'])} | {shown(t['long'])} |")
    return "\n".join(rows)


def plot(sweeps: dict, fitted: dict, args, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")        # no display needed: the figure only goes to a file
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullLocator
    except ImportError:
        print("matplotlib is not installed: no attention_cost.png")
        return False
    figure, axes = plt.subplots(1, 2, figsize=(11, 5.4), sharey=True)
    for axis, (name, points) in zip(axes, sweeps.items(), strict=True):
        lengths = np.array([point[name] for point in points], dtype=float)
        longest = lengths[-3:]
        other = "t" if name == "m" else "m"
        for series, (label, scores, _) in SERIES.items():
            ms = np.array([point[series] for point in points]) * 1e3
            fit = fitted[series][name]
            line, = axis.loglog(lengths, ms, marker="o", linewidth=1)
            # The power law fitted to the longest three points, through their geometric mean.
            centre = np.exp(np.mean(np.log(ms[-3:])) - fit["long"] * np.mean(np.log(longest)))
            axis.loglog(longest, centre * longest ** fit["long"], color=line.get_color(), linestyle="--",
                        linewidth=2.5, alpha=0.5)
            line.set_label(f"{label} ({scores}): {name}^{shown(fit['all'])} overall, "
                           f"{name}^{shown(fit['long'])} from {int(longest[0])} (dashed)")
        axis.set_xlabel(f"{'source length m' if name == 'm' else 'target length t'} ({other} = {args.fixed})")
        axis.xaxis.set_minor_locator(NullLocator())     # the lengths alone, as plain numbers
        axis.set_xticks(lengths, [str(int(n)) for n in lengths])
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    axes[0].set_ylabel(f"attention ms per training step (B={args.batch_size}, fwd+bwd)")
    figure.suptitle("Time in the attention ops against sequence length (fitted exponents)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    print(f"wrote {path}")
    return True


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.quick:
        args.lengths, args.fixed, args.batch_size, args.repeats, args.rounds = [16, 64, 256], 16, 8, 1, 3
    args.lengths = sorted(set(args.lengths))
    ta.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"attention time per training step, batch {args.batch_size}, {args.threads} thread(s), the "
          f"least of {args.rounds} rounds x {args.repeats} steps")
    sweeps = measure(args)
    fitted = fits(sweeps)
    text = table(sweeps, fitted, args)
    (out / "results.json").write_text(json.dumps({"settings": vars(args), "sweeps": sweeps, "fits": fitted},
                                                 indent=1))
    (out / "results.md").write_text(text + "\n")
    print("\n" + text)
    figure = out / "attention_cost.png"
    if plot(sweeps, fitted, args, figure) and args.figure:
        Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(figure, args.figure)
        print(f"wrote {args.figure}")
    return fitted


if __name__ == "__main__":
    main()
