"""The scope names the engine's models record, and that ``ta.viz`` draws by.

A picture colours a box by what it holds (an encoder, a decoder, one time step, an attention
call) and finds attention weights by the scope they were made in.  It reads these names, never
substrings of them: rename a scope here and the pictures follow.

    encoder/t3, encoder/t3/reverse, decoder/t2, decoder/t2/attention/additive_attention
    encoder/layer0/self_attention, decoder/layer1/cross_attention, decoder/layer1/feed_forward
"""

from __future__ import annotations

import re

__all__ = ["ENCODER", "DECODER", "ATTENTION", "REVERSE", "SELF_ATTENTION", "CROSS_ATTENTION",
           "FEED_FORWARD", "step", "step_of", "layer", "layer_of"]

ENCODER = "encoder"        # a Seq2Seq's encoder unroll
DECODER = "decoder"        # its decoder unroll
ATTENTION = "attention"    # where a decoder step attends (a mechanism's own scope sits inside)
REVERSE = "reverse"        # the second direction of a bidirectional RNN's step
SELF_ATTENTION = "self_attention"    # a Transformer layer's sublayers
CROSS_ATTENTION = "cross_attention"
FEED_FORWARD = "feed_forward"

_STEP = re.compile(r"t(\d+)")
_LAYER = re.compile(r"layer(\d+)")


def step(t: int) -> str:
    """The scope of time step ``t``: "t3"."""
    return f"t{t}"


def step_of(name: str) -> int | None:
    """The time step a scope name is (``step_of("t3") == 3``), or None."""
    match = _STEP.fullmatch(name)
    return int(match.group(1)) if match else None


def layer(i: int) -> str:
    """The scope of a Transformer's layer ``i``: "layer0"."""
    return f"layer{i}"


def layer_of(name: str) -> int | None:
    """The layer a scope name is (``layer_of("layer1") == 1``), or None."""
    match = _LAYER.fullmatch(name)
    return int(match.group(1)) if match else None
