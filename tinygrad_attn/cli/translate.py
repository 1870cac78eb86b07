"""``tinygrad-attn translate``: translate text with a checkpoint and show the attention, or
translate standard input line by line, in batches."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import tinygrad_attn as ta

from .common import (
    EXIT_OK,
    UsageError,
    add_beam,
    add_compile,
    add_threads,
    beam_options,
    check_source,
    compile_options,
    load_checkpoint,
    model_errors,
    positive_int,
    refuse_inputs,
    set_threads,
    writable,
)


def add_parser(commands) -> None:
    translate = commands.add_parser(
        "translate", help="translate text (or standard input, '-') with a checkpoint",
        description="Decode each TEXT with the model in CHECKPOINT and print the output and its "
                    "attention matrix: one row per output token (<end> included), one column per "
                    "source token. With '-' instead of TEXT, read standard input and write one "
                    "output line per input line (an empty line gives an empty line), decoding "
                    "in batches. With --beam K --n-best N, print the N best hypotheses of each "
                    "TEXT, best first, with their scores (Wu et al.'s log P / ((5 + |Y|) / 6), "
                    "|Y| counting <end>) and log-probabilities; the attention shown is the best "
                    "one's.")
    translate.add_argument("checkpoint", metavar="CHECKPOINT", help="a file written by 'tinygrad-attn train'")
    translate.add_argument("texts", metavar="TEXT", nargs="+", help="what to translate (quote it), or -")
    add_beam(translate)
    add_compile(translate)
    translate.add_argument("--n-best", type=positive_int, default=None, metavar="N",
                           help="print the N best hypotheses with their scores (needs --beam K, K >= N; "
                                "with '-': N lines per input line, each the output, a tab and its score)")
    translate.add_argument("--heatmap", default=None, metavar="PATH",
                           help="also draw the attention of the chosen (best) hypothesis to PATH (needs "
                                "ta.viz.heatmap); with several texts, PATH-1, PATH-2, ...")
    translate.add_argument("--explore", default=None, metavar="PATH",
                           help="also write an attention explorer for the one TEXT to PATH: a self-contained "
                                "HTML page (ta.viz.explore) with every layer and head, and with --n-best "
                                "every hypothesis; an existing file is replaced only if it is such a page")
    translate.add_argument("--batch-size", type=positive_int, default=256,
                           help="with '-': lines decoded at once (default 256)")
    add_threads(translate)
    translate.set_defaults(run=run)


def run(args) -> int:
    model, info = load_checkpoint(args.checkpoint)
    set_threads(args.threads)
    decoding = beam_options(args) | compile_options(args, model)
    if args.n_best is not None and (args.beam is None or args.n_best > args.beam):
        beam = "no --beam" if args.beam is None else f"--beam {args.beam}"
        raise UsageError(f"--n-best {args.n_best} needs --beam K with K >= {args.n_best}, got {beam}")
    if args.texts == ["-"]:
        return _translate_stream(model, info, args, decoding)
    if "-" in args.texts:
        raise UsageError("'-' (read standard input) cannot be mixed with TEXT arguments")
    if args.explore is not None:
        _check_explore(args, model)
    if args.heatmap is not None and model.attention_kind is None:
        raise UsageError(f"{args.checkpoint} is a model without attention: there is no heatmap to draw")
    if args.heatmap is not None:
        for index in range(1, len(args.texts) + 1):
            path = _heatmap_path(args.heatmap, index, len(args.texts))
            refuse_inputs(path, f"--heatmap {path}", [(f"CHECKPOINT {args.checkpoint}", args.checkpoint)])
    for text in args.texts:
        check_source(text, info, model)
    sources = [info.tokenize(text) for text in args.texts]
    with model_errors():
        outputs = ta.models.translate_tokens(model, sources, info.src_vocab, info.tgt_vocab, **decoding,
                                             batch_size=args.batch_size, n_best=args.n_best)
    rows = zip(args.texts, sources, outputs, strict=True)
    for index, (text, source, output) in enumerate(rows, start=1):
        if args.n_best is not None:
            tokens, attention = output[0][0], output[0][1].attention
            print(f"{text!r} -> {info.detokenize(tokens)!r}")
            for rank, (hypothesis_tokens, hypothesis) in enumerate(output, start=1):
                print(f"  {rank}. {info.detokenize(hypothesis_tokens)!r}  score {hypothesis.score:.4f}  "
                      f"log P {hypothesis.log_prob:.4f}")
        else:
            tokens, attention = output
            print(f"{text!r} -> {info.detokenize(tokens)!r}")
        if attention is None:
            print("(this model has no attention: its decoder sees only the encoder's final state)")
            continue
        print(ta.viz.format_attention(attention, source, tokens))
        if args.heatmap is not None:
            _draw(model, info, args, index, source, tokens, attention)
        if index < len(args.texts):
            print()
    if args.explore is not None:
        _explore(model, info, args, decoding)
    return EXIT_OK


def _check_explore(args, model) -> None:
    """Refuse --explore before any work: one TEXT, a model with attention, a path that can be
    written and holds no file of the user's."""
    if len(args.texts) != 1:
        raise UsageError(f"--explore writes one page for one TEXT, got {len(args.texts)} texts; translate "
                         f"them one at a time")
    if model.attention_kind is None:
        raise UsageError(f"{args.checkpoint} is a model without attention: there is nothing to explore")
    path = Path(args.explore)
    refuse_inputs(path, f"--explore {path}", [(f"CHECKPOINT {args.checkpoint}", args.checkpoint)])
    writable(path, "--explore")
    if not ta.viz.Explorer.replaceable(path):
        raise UsageError(f"--explore {path} exists and is not an attention explorer written by "
                         f"tinygrad-attn; remove it or choose another path")


def _explore(model, info, args, decoding: dict) -> None:
    """The page.  ``explore`` decodes the text again, as above but eagerly (compiled decoding gives
    the same outputs, bit for bit), to read the weights of that decode."""
    try:
        with model_errors():
            ta.viz.explore(model, args.texts[0], info, beam=decoding["beam"], n_best=args.n_best,
                           length_penalty=decoding["length_penalty"], path=args.explore, overwrite=True)
    except OSError as err:
        raise UsageError(f"cannot write --explore {args.explore}: {err}") from None
    print(f"wrote the attention explorer to {args.explore}")


def _draw(model, info, args, index: int, source: list, tokens: list, attention) -> None:
    """The chosen hypothesis' attention as a heatmap (a Transformer's: every layer and head)."""
    path = _heatmap_path(args.heatmap, index, len(args.texts))
    rows = ta.viz.row_labels(tokens, attention)
    drawn = attention
    if isinstance(model, ta.models.Transformer):
        with model_errors():
            drawn = _cross_attention_grid(model, info, source, tokens, len(rows))
    try:
        ta.viz.heatmap(drawn, source, rows, path, title=None if drawn is attention else
                       "cross-attention, every layer and head")
    except (ImportError, ValueError, OSError) as err:       # messages start "heatmap:"
        raise UsageError(str(err)) from None
    print(f"wrote the heatmap to {path}")


def _translate_stream(model, info, args, decoding: dict) -> int:
    """Every line of stdin, checked first (so bad input writes nothing), then decoded in
    batches; one output line per input line."""
    if args.heatmap is not None or args.explore is not None:
        flag = "--heatmap draws one picture" if args.heatmap is not None else "--explore writes one page"
        raise UsageError(f"{flag} per TEXT; it does not apply to '-'")
    # Bytes, decoded here: the locale's encoding may not be UTF-8, and only "\n" ends a line
    # (str.splitlines also splits at form feeds and U+2028), as in files of pairs.
    # Bounded as files of pairs are: standard input may never end (`translate m.ckpt - < /dev/zero`).
    limit = ta.data.MAX_STREAM_BYTES
    raw = (sys.stdin.buffer.read(limit + 1) if hasattr(sys.stdin, "buffer")
           else sys.stdin.read(limit + 1).encode("utf-8"))
    if len(raw) > limit:
        raise UsageError(f"<stdin>: more than {limit} bytes (ta.data.MAX_STREAM_BYTES); translate a file "
                         f"of that size in parts")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        number = raw[: err.start].count(b"\n") + 1
        raise UsageError(f"<stdin>:{number}: invalid UTF-8 (byte 0x{raw[err.start]:02x})") from None
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()                      # the newline that ends the last line
    sources = []
    for number, line in enumerate(lines, start=1):
        if len(line.encode("utf-8")) > ta.data.MAX_LINE_BYTES:
            raise UsageError(f"<stdin>:{number}: the line is longer than {ta.data.MAX_LINE_BYTES} bytes "
                             f"(ta.data.MAX_LINE_BYTES)")
        if not line.strip():
            sources.append(None)
            continue
        try:
            check_source(line, info, model)
        except UsageError as err:
            raise UsageError(f"<stdin>:{number}: {err}") from None
        sources.append(info.tokenize(line))
    real = [source for source in sources if source is not None]
    if args.n_best is not None:
        with model_errors():
            found = iter(ta.models.translate_tokens(model, real, info.src_vocab, info.tgt_vocab, **decoding,
                                                    batch_size=args.batch_size, n_best=args.n_best)
                         if real else [])
        for source in sources:
            hypotheses = next(found) if source is not None else []
            lines = [f"{info.detokenize(tokens)}\t{h.score:.6f}" for tokens, h in hypotheses]
            # Every input line gets N lines, so the output can be read back N at a time.
            lines += [""] * (args.n_best - len(lines))
            sys.stdout.write("".join(line + "\n" for line in lines))
        return EXIT_OK
    with model_errors():
        outputs = iter(ta.models.decode(model, real, info.src_vocab, info.tgt_vocab, **decoding,
                                        batch_size=args.batch_size) if real else [])
    for source in sources:
        sys.stdout.write((info.detokenize(next(outputs)) if source is not None else "") + "\n")
    return EXIT_OK


def _cross_attention_grid(model, info, source: list, tokens: list, rows: int):
    """A Transformer's cross-attention for one translation, (layers, heads, rows, S): the
    output teacher-forced (what decoding computed), every layer's weights recorded."""
    src = ta.data.encode_batch([source], info.src_vocab)                          # (1, S)
    output = info.tgt_vocab.encode(tokens, end=True)
    tgt_in = np.array([[ta.data.START] + output[: rows - 1]])
    with ta.no_grad():
        _, weights = model(src, tgt_in, need_weights=True)
    return model.layer_attention(weights)[:, 0]


def _heatmap_path(path: str, index: int, count: int) -> Path:
    path = Path(path)
    return path if count == 1 else path.with_name(f"{path.stem}-{index}{path.suffix}")
