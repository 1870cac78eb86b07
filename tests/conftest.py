"""Shared fixtures: the devices every kernel must agree on, and hypothesis settings."""

import os
import shutil

import pytest
from hypothesis import settings

from tests import optional, simulator
from tinygrad_attn.compiler import available_devices, get_backend

# Wall time is noisy on shared 2-core machines: hypothesis must never fail on a deadline.
settings.register_profile("ci", deadline=None, max_examples=30, derandomize=True)
settings.load_profile("ci")

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    simulator.apply()


@pytest.fixture(params=available_devices())
def device(request):
    """Each device the engine knows, by name ("numpy" is the reference)."""
    return request.param


@pytest.fixture
def backend(device):
    return get_backend(device)


@pytest.fixture
def _torch_present():
    """For ``optional.needs_torch``: skip without PyTorch (fail where extras are required)."""
    if optional.torch is None:
        optional.missing(optional.TORCH_REASON)


@pytest.fixture
def _dot_present():
    """For ``optional.needs_dot``: skip without Graphviz's dot (fail where extras are required)."""
    if shutil.which("dot") is None:
        optional.missing(optional.DOT_REASON)
