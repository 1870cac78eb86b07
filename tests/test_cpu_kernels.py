"""Properties of the Numba kernels that the conformance suite's small shapes do not reach:
the float32 exp across its whole range, and the online softmax across several key blocks."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinygrad_attn.compiler import cpu
from tinygrad_attn.compiler import numpy_backend as reference

TOL = {np.float32: {"rtol": 2e-5, "atol": 1e-6}, np.float64: {"rtol": 1e-10, "atol": 1e-12}}


def test_exp32_relative_error_over_the_float32_range():
    x = np.linspace(-87.0, 88.0, 200_001).astype(np.float32)
    got = np.array([cpu._exp32(v) for v in x[::50]], dtype=np.float64)
    want = np.exp(x[::50].astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 4e-7   # a few float32 ulps


@pytest.mark.parametrize("x, want", [(-np.inf, 0.0), (-88.0, 0.0), (-1e30, 0.0), (0.0, 1.0),
                                     (89.0, np.inf), (np.inf, np.inf)])
def test_exp32_edges(x, want):
    assert cpu._exp32(np.float32(x)) == want


def test_exp32_keeps_nan():
    assert np.isnan(cpu._exp32(np.float32(np.nan)))


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 queries and 3 keys, so that small inputs take many of each."""
    monkeypatch.setattr(reference, "SDPA_BLOCK", 4)
    monkeypatch.setattr(cpu, "SDPA_KEY_BLOCK", 3)


# The patched block sizes hold for every generated input: the fixture need not rerun.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t_q=st.integers(1, 11), t_k=st.integers(1, 11), masked=st.booleans(), causal=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_sdpa_online_softmax_across_key_blocks(small_blocks, t_q, t_k, masked, causal, dtype, seed):
    rng = np.random.default_rng(seed)
    # Later keys get larger scores, so the running max changes from block to block.
    q = rng.normal(size=(2, t_q, 3)).astype(dtype)
    k = (rng.normal(size=(2, t_k, 3)) * np.linspace(0.5, 4.0, t_k)[:, None]).astype(dtype)
    v = rng.normal(size=(2, t_k, 2)).astype(dtype)
    mask = rng.random((2, t_q, t_k)) < 0.5 if masked else None
    o, lse = cpu.sdpa(q, k, v, mask, 0.7, causal)
    o_ref, lse_ref = reference.sdpa(q, k, v, mask, 0.7, causal)
    np.testing.assert_allclose(o, o_ref, **TOL[dtype])
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(lse_ref))
    np.testing.assert_allclose(lse[np.isfinite(lse)], lse_ref[np.isfinite(lse_ref)], **TOL[dtype])
    do = rng.normal(size=o.shape).astype(dtype)
    for got, want in zip(cpu.sdpa_back(q, k, v, o, lse, do, mask, 0.7, causal),
                         reference.sdpa_back(q, k, v, o_ref, lse_ref, do, mask, 0.7, causal), strict=True):
        np.testing.assert_allclose(got, want, **TOL[dtype])
