"""ta.compile on the "cuda" device (under Numba's simulator in CI: `make test`'s second run):
a plan replays on device buffers, new values every call, equal to eager."""

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.compiler import available_devices

pytestmark = pytest.mark.skipif("cuda" not in available_devices(), reason="no GPU and no simulator")


def test_cuda_compiled_step_reads_new_values_every_replay():
    def step(a, b):
        y = (a * b + a).sum()
        y.backward()
        return y

    compiled = ta.compile(step)
    rng = np.random.default_rng(0)
    for _ in range(3):
        a_host, b_host = rng.random(5), rng.random(5)
        got_a = ta.Tensor(a_host, dtype="float64", device="cuda", requires_grad=True)
        want_a = ta.Tensor(a_host, dtype="float64", device="cuda", requires_grad=True)
        got = compiled(got_a, ta.Tensor(b_host, dtype="float64", device="cuda"))
        want = step(want_a, ta.Tensor(b_host, dtype="float64", device="cuda"))
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        np.testing.assert_array_equal(got_a.grad.numpy(), want_a.grad.numpy())
        np.testing.assert_allclose(got_a.grad.numpy(), b_host + 1.0, rtol=1e-12)
    assert (compiled.stats.captures, compiled.stats.replays) == (1, 2)
