"""``tinygrad-attn verify``: every op's gradient, and a Bahdanau decoder step's, against sympy."""

from __future__ import annotations

import time

import numpy as np

import tinygrad_attn as ta

from .common import EXIT_FAILED, EXIT_OK


def add_parser(commands) -> None:
    verify = commands.add_parser(
        "verify", help="check every op's gradient and a Bahdanau decoder step's exactly with sympy",
        description="Run ta.check.ops() (every registered op: sympy-exact derivative and central "
                    "differences) and ta.check.symbolic on one Bahdanau decoder step built from "
                    "nn modules (additive attention, GRU cell, readout; float64). Exit status 0 "
                    "only when everything passes.")
    verify.set_defaults(run=run)


def bahdanau_step_check():
    """``ta.check.symbolic`` on one Bahdanau decoder step at E = H = S = 2, vocabulary 6,
    batch 1, float64: every input and parameter's gradient against sympy's exact one.

    The output checked is one logit: the whole step's 6 logits take sympy about 3 times
    longer, and a whole 2-step seq2seq minutes (the expressions grow with every step).
    """
    ta.manual_seed(0)
    step = ta.models.BahdanauStep(embed=2, hidden=2, vocab=6).double()
    rng = np.random.default_rng(0)
    y_prev = rng.standard_normal((1, 2))            # (B, E)
    s_prev = rng.standard_normal((1, 2))            # (B, H)
    keys = rng.standard_normal((1, 2, 2))           # (B, S, H)

    def bahdanau_step_logit(y_prev, s_prev, keys):
        return step(y_prev, s_prev, keys)[:, 3]

    return ta.check.symbolic(bahdanau_step_logit, y_prev, s_prev, keys)


def run(args) -> int:
    print("1. every registered op: sympy-exact derivative and central differences, float64")
    start = time.perf_counter()
    ops_report = ta.check.ops()
    print(ops_report)
    print(f"({time.perf_counter() - start:.1f} s)\n")
    print("2. one Bahdanau decoder step (additive attention + GRU cell + readout, E = H = S = 2, float64):")
    start = time.perf_counter()
    step_report = bahdanau_step_check()
    print(step_report)
    print(f"({time.perf_counter() - start:.1f} s)\n")
    passed = ops_report.ok and step_report.ok
    print("verify: all gradients match" if passed else "verify: FAILED (see above)")
    return EXIT_OK if passed else EXIT_FAILED
