"""Greedy decoding of 1,000 dates-task sources: sentences per second of

    engine        model.greedy (ta.models.decoding on the engine's own decoder step)
    onnxruntime   the same decoding code on the exported encoder and decoder step
                  (ta.export.onnx -> OnnxModel: two onnxruntime sessions)

The model (--arch): "seq2seq", the ``make demo`` one (ta.models.Seq2Seq, GRU, Bahdanau additive
attention, embed 32, hidden 128), or "transformer", bench/transformer.py's (d_model 128, 4
heads, 2+2 layers, feed-forward 512; decoded with its key/value cache on both sides), float32,
trained on the dates task for --steps steps (cached under runs/onnx_decode/, which git
ignores).  Same weights, same run: sources sorted by length and
decoded --batch-size at a time with max_len = 2 x the batch's longest source + 10, as
``ta.models.evaluate`` does; the two contenders alternate within each repeat, and the ratio is
of same-run medians.  Before timing, the two outputs are compared (they must be equal).

Run:  .venv/bin/python bench/onnx_decode.py [--arch transformer] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from decoding import batches, trained_model
from timing import cpu_model, cpu_seconds, others_note, set_threads

import tinygrad_attn as ta

# arch -> (model class, settings, Adam's learning rate)
MODELS = {
    "seq2seq": (ta.models.Seq2Seq,
                dict(embed=32, hidden=128, cell="gru", attention="additive", style="bahdanau"), 5e-3),
    "transformer": (ta.models.Transformer,
                    dict(d_model=128, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                         dim_feedforward=512, dropout=0.0), 1e-3),
}


def decode_all(decoder, srcs: list[np.ndarray]) -> list[np.ndarray]:
    limit = ta.models.evaluation.default_max_len
    return [decoder.greedy(src, max_len=limit(src.shape[1]))[0] for src in srcs]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(MODELS), default="seq2seq")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="pin every pool, onnxruntime's too, to N")
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--sources", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=300, help="training steps of the cached model")
    parser.add_argument("--cache", default=None, help="default runs/onnx_decode/dates-<arch>.ckpt")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    ta_onnx = ta.export
    ort = importlib.import_module("onnxruntime")

    kind, settings, lr = MODELS[args.arch]
    name = "demo" if args.arch == "seq2seq" else args.arch
    cache = Path(args.cache or f"runs/onnx_decode/dates-{name}.ckpt")
    model, task = trained_model(args.steps, cache, settings, kind, lr)
    model.eval()
    sources = [s for s, _ in task.test[: args.sources]]
    srcs = batches(task, sources, args.batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        files = ta_onnx.onnx(model, Path(tmp) / "dates.onnx")
        ort_model = ta_onnx.OnnxModel(files, threads=args.threads)
    engine_ids, ort_ids = decode_all(model, srcs), decode_all(ort_model, srcs)
    same = all(np.array_equal(a, b) for a, b in zip(engine_ids, ort_ids, strict=True))
    print(f"# {cpu_model()}; {args.arch}; {args.threads} thread(s); onnxruntime {ort.__version__}; "
          f"{len(sources)} sources in batches of {args.batch_size}; outputs equal: {same}")
    if not same:
        raise SystemExit("onnxruntime's translations differ from the engine's")

    contenders = {"engine": model, "onnxruntime": ort_model}
    rates: dict = {name: [] for name in contenders}
    since = cpu_seconds()
    for _ in range(args.repeats):
        for name, decoder in contenders.items():
            start = time.perf_counter()
            decode_all(decoder, srcs)
            rates[name].append(len(sources) / (time.perf_counter() - start))
    others_note(since, "while timing")
    medians = {name: statistics.median(found) for name, found in rates.items()}
    for name, found in rates.items():
        print(f"{name:>12}: {medians[name]:8.0f} sentences/s  (median of {args.repeats}; "
              f"min {min(found):.0f}, max {max(found):.0f})")
    print(f"onnxruntime / engine: {medians['onnxruntime'] / medians['engine']:.2f}x")


if __name__ == "__main__":
    main()
