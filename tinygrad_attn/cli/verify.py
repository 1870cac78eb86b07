"""``tinygrad-attn verify``: every op's gradient, and a Bahdanau decoder step's, against sympy."""

from __future__ import annotations

import time

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


def run(args) -> int:
    print("1. every registered op: sympy-exact derivative and central differences, float64")
    start = time.perf_counter()
    ops_report = ta.check.ops()
    print(ops_report)
    print(f"({time.perf_counter() - start:.1f} s)\n")
    print("2. one Bahdanau decoder step (additive attention + GRU cell + readout, E = H = S = 2, float64):")
    start = time.perf_counter()
    step_report = ta.models.BahdanauStep.verify()
    print(step_report)
    print(f"({time.perf_counter() - start:.1f} s)\n")
    passed = ops_report.ok and step_report.ok
    print("verify: all gradients match" if passed else "verify: FAILED (see above)")
    return EXIT_OK if passed else EXIT_FAILED
