"""Every device agrees with the numpy reference: every registered op that calls a kernel the
device overrides (forward and backward, float32 and float64) and, with hypothesis shapes,
every kernel a device overrides."""

import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.test_optim_kernels import optimizer_kernels
from tinygrad_attn import Tensor
from tinygrad_attn.autograd import registry
from tinygrad_attn.compiler import available_devices, elementwise_formulas, formulas, get_backend

DEVICES = [d for d in available_devices() if d != "numpy"]
REFERENCE = get_backend("numpy")
# Generated kernels are built on first call: build them, so each table says what it runs.
for _device in ["numpy", *DEVICES]:
    get_backend(_device).build_all()
DTYPES = [np.float32, np.float64]


def tolerance(dtype):
    # float32 kernels may use a polynomial exp (relative error 2e-7) and other summation orders.
    return {"rtol": 2e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}


def run_op(op, inputs, attrs, device, dtype, seed=0):
    """Forward and the gradient of every float input for a fixed cotangent, on ``device``."""
    leaves = []
    for x in inputs:
        x = np.asarray(x)
        if x.dtype.kind == "f":
            leaves.append(Tensor(x, requires_grad=True, dtype=dtype, device=device))
        else:
            leaves.append(Tensor(x, device=device))
    out = op.apply(*leaves, **attrs)
    cotangent = np.random.default_rng(seed).uniform(-1, 1, size=out.shape)
    out.backward(cotangent.astype(out.dtype))
    grads = [leaf.grad.numpy() for leaf in leaves if leaf.requires_grad]
    return out.numpy(), grads


def overridden(device: str) -> set[str]:
    """The kernels ``device`` runs that are not the reference's own functions."""
    reference = REFERENCE.table()
    return {name for name, fn in get_backend(device).table().items() if fn is not reference.get(name)}


# An op is compared on a device only where it calls a kernel the device overrides: elsewhere
# both sides would run the same reference code.  The test id names the kernels compared.
CASES = [(device, name, k, sorted(set(registry[name].kernels) & overridden(device)))
         for device in DEVICES for name in sorted(registry)
         for k in range(len(registry[name].examples()))
         if set(registry[name].kernels) & overridden(device)]


def test_every_device_is_compared_on_every_kernel_it_overrides():
    for device in DEVICES:
        compared = {kernel for d, _, _, kernels in CASES if d == device for kernel in kernels}
        # Kernels no op calls (allocation, transfers, the elementwise maps behind a Python
        # scalar) are covered by the hypothesis comparisons below and tests/test_cuda.py.
        called = set().union(*(op.kernels for op in registry.values()))
        assert overridden(device) & called <= compared, device


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize(("device", "name", "k", "kernels"), CASES,
                         ids=[f"{d}-{n}-{k}[{' '.join(c)}]" for d, n, k, c in CASES])
def test_every_op_matches_the_reference_on_every_device(device, name, k, kernels, dtype):
    op = registry[name]
    example = op.examples()[k]
    attrs = dict(example.attrs)
    if name == "Cast":
        attrs["dtype"] = np.dtype(dtype).name
    expected = run_op(op, example.inputs, attrs, "numpy", dtype)
    actual = run_op(op, example.inputs, attrs, device, dtype)
    np.testing.assert_allclose(actual[0], expected[0], **tolerance(dtype), err_msg="forward")
    for got, want in zip(actual[1], expected[1], strict=True):
        np.testing.assert_allclose(got, want, **tolerance(dtype), err_msg="backward")


# ---------------------------------------------------------------- overridden kernels, hypothesis shapes


def scores(rng, shape, dtype, masked_rows=True):
    """Scores with large and -inf entries (and some rows entirely -inf)."""
    x = rng.normal(size=shape) * rng.choice([1.0, 30.0])
    x[rng.random(shape) < 0.2] = -np.inf
    if masked_rows and len(shape) >= 1 and x.size:
        x.reshape(-1, shape[-1])[rng.random(x.size // shape[-1]) < 0.2] = -np.inf
    return x.astype(dtype)


def formula_kernels(rng, dtype, shape):
    """Every kernel generated from a formula (the ops', the compiler's own, any a test
    defined), forward and backward: inputs of either sign and large, then positive (the
    domain of log and powers; cases outside a formula's domain are left out), broadcasting,
    and a transposed (non-contiguous) view; "out" is the reference forward's output on the
    same inputs."""
    cases = []
    for formula in elementwise_formulas():
        plan = formulas.plan(formula)
        for kind in ("signed", "positive", "transposed"):
            if kind == "transposed" and (len(formula.inputs) > 1 or len(shape) < 2):
                continue
            inputs = []
            for i, name in enumerate(formula.inputs):
                size = shape if i == 0 else _partner(rng, shape)
                if name in formula.bools:
                    inputs.append(rng.random(size) < 0.5)
                elif kind == "positive":
                    inputs.append(rng.uniform(0.5, 2.0, size=size).astype(dtype))
                else:
                    inputs.append((rng.normal(size=size) * rng.choice([1.0, 30.0])).astype(dtype))
            if kind == "transposed":
                inputs = [inputs[0].T]
            params = [0.2] * len(formula.params)
            with np.errstate(all="ignore"):
                out = getattr(REFERENCE, formula.name)(*inputs, *params)
            pool = dict(zip(formula.inputs, inputs, strict=True))
            pool |= {formulas.OUTPUT: out, formulas.GRAD: rng.normal(size=np.shape(out)).astype(dtype)}
            for kernel in (plan.forward, *plan.backward):
                args = (*[pool[a] for a in kernel.args], *params)
                with np.errstate(all="ignore"):
                    want = getattr(REFERENCE, kernel.name)(*args)
                # Outside the formula's real domain (log of a negative) numpy gives NaN and the
                # simulator's math raises: such cases compare nothing of the kernel.
                if not np.isnan(want).any():
                    cases.append((kernel.name, args))
    return cases


def softmax_family(rng, dtype, shape):
    x = scores(rng, shape, dtype)
    y = REFERENCE.softmax(x, -1)
    logy = REFERENCE.log_softmax(x, -1)
    dy = rng.normal(size=shape).astype(dtype)
    return [("softmax", (x, -1)), ("softmax_back", (y, dy, -1)),
            ("log_softmax", (x, -1)), ("log_softmax_back", (np.where(np.isfinite(logy), logy, -80), dy, -1)),
            ("masked_softmax", (np.where(np.isfinite(x), x, 1.0).astype(dtype),
                                rng.random(shape[-1:] if rng.random() < 0.5 else shape) < 0.6))]


def losses(rng, dtype, shape):
    n, c = int(np.prod(shape[:-1])), shape[-1]
    logits = (rng.normal(size=(n, c)) * 10).astype(dtype)
    target = rng.integers(0, c, size=n)
    target[rng.random(n) < 0.3] = 1
    _, lse = REFERENCE.cross_entropy(logits, target, 1)
    dloss = rng.normal(size=n).astype(dtype)
    ids = rng.integers(0, 5, size=shape[:-1])
    dy = rng.normal(size=shape[:-1] + (3,)).astype(dtype)
    return [("cross_entropy", (logits, target, 1)), ("cross_entropy_back", (logits, lse, target, 1, dloss)),
            ("cross_entropy", (logits, np.where(target == 1, 0, target), -(2**63))),
            ("embedding_back", (5, ids, dy, None)), ("embedding_back", (5, ids, dy, 2))]


def attention(rng, dtype, shape):
    n = shape[0]
    t_q, t_k, d, d_v = rng.integers(1, 300), rng.integers(1, 40), rng.integers(1, 5), rng.integers(1, 4)
    if rng.random() < 0.5:   # keep most cases small; some cross the 128-query block boundary
        t_q = rng.integers(1, 6)
    q, k, v = (rng.normal(size=(n, t, e)).astype(dtype) for t, e in ((t_q, d), (t_k, d), (t_k, d_v)))
    mask = None if rng.random() < 0.3 else rng.random((rng.choice([1, n]), t_q, t_k)) < 0.6
    causal = bool(rng.random() < 0.4)
    o, lse = REFERENCE.sdpa(q, k, v, mask, 0.6, causal)
    do = rng.normal(size=o.shape).astype(dtype)
    return [("sdpa", (q, k, v, mask, 0.6, causal)), ("sdpa_back", (q, k, v, o, lse, do, mask, 0.6, causal)),
            ("sdpa_weights", (q, k, lse, mask, 0.6, causal)), ("sdpa", (q, k, v, mask, 0.6, causal, True)),
            ("sdpa_prefix", (q, k, v, np.array(rng.integers(0, t_k), dtype=np.int64), 0.6))]


def additive(rng, dtype, shape):
    """Bahdanau scores, q (N, T_q, A) against k (N, T_k, A); masked pairs get a zero gradient.
    Small sums only: a float32 sum of many terms drifts by more than the tolerance from the
    reference's own float32 sum (tests/test_cpu_kernels.py checks large ones against float64)."""
    n, t_q, t_k, a = shape[0], rng.integers(1, 6), rng.integers(1, 8), rng.integers(1, 8)
    q = rng.normal(size=(n, t_q, a)).astype(dtype)
    k = (rng.normal(size=(n, t_k, a)) * 2).astype(dtype)
    v = rng.normal(size=a).astype(dtype)
    de = rng.normal(size=(n, t_q, t_k)).astype(dtype) * (rng.random((n, t_q, t_k)) < 0.7)
    return [("additive_scores", (q, k, v)), ("additive_scores_back", (q, k, v, de))]


def rnn_gates(rng, dtype, shape):
    """GRU and LSTM cell gates: B rows of hidden size H, pre-activations at a scale that
    sometimes saturates sigmoid and tanh (and reaches tanh's small-|x| branch)."""
    b, h = int(np.prod(shape[:-1])), shape[-1]

    def normal(*size):
        return (rng.normal(size=size) * rng.choice([0.05, 1.0, 12.0])).astype(dtype)

    gi, gh = normal(b, 3 * h), normal(b, 3 * h)
    gates = normal(b, 4 * h)
    h_prev, c_prev, dh = normal(b, h), normal(b, h), normal(b, h)
    _, gru_saved = REFERENCE.gru_gates(gi, gh, h_prev)
    c, state_saved = REFERENCE.lstm_cell_state(gates, c_prev)
    _, hidden_saved = REFERENCE.lstm_hidden(gates, c)
    keep = rng.random((b, 1)) < 0.5                  # a masked step: padded rows keep their state
    return [("gru_gates", (gi, gh, h_prev)), ("gru_gates_back", (gru_saved, gh, h_prev, dh)),
            ("gru_gates", (gi, gh, h_prev, keep)), ("gru_gates_back", (gru_saved, gh, h_prev, dh, keep)),
            ("lstm_cell_state", (gates, c_prev)), ("lstm_cell_state_back", (state_saved, c_prev, dh)),
            ("lstm_hidden", (gates, c)), ("lstm_hidden_back", (hidden_saved, dh))]


def layer_norm(rng, dtype, shape):
    """Rows of x with a mean a few spreads from zero (the kernels must centre before
    squaring), with or without a weight and a bias.  (Not further: a float32 row of mean 10
    and spread 0.01 keeps only 4 digits of its deviations, whichever kernel reads it.)"""
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    spread = rng.choice([0.01, 1.0, 30.0])
    x = ((rng.normal(size=(rows, cols)) + rng.normal() * 3) * spread).astype(dtype)
    weight = rng.normal(size=cols).astype(dtype) if rng.random() < 0.7 else None
    bias = rng.normal(size=cols).astype(dtype) if weight is not None and rng.random() < 0.7 else None
    _, mean, rstd = REFERENCE.layer_norm(x, weight, bias, 1e-5)
    dy = rng.normal(size=(rows, cols)).astype(dtype)
    return [("layer_norm", (x, weight, bias, 1e-5)), ("layer_norm_back", (dy, x, mean, rstd, weight))]


GENERATORS = [formula_kernels, softmax_family, losses, attention, additive, rnn_gates, layer_norm]


# ---------------------------------------------------------------- primitives (cuda overrides every kernel)


def _partner(rng, shape):
    """A shape that broadcasts to ``shape``: some leading axes dropped, some set to 1."""
    shrunk = tuple(1 if rng.random() < 0.4 else n for n in shape)
    return shrunk[rng.integers(0, len(shape) + 1):]


def arithmetic(rng, dtype, shape):
    """Maps and zips on ties and integers, and the in-place add."""
    x = rng.normal(size=shape).astype(dtype)
    y = rng.normal(size=_partner(rng, shape)).astype(dtype)
    ties = np.where(rng.random(shape) < 0.5, x, 0).astype(dtype)
    ints = rng.integers(-3, 4, size=shape)
    cond = rng.random(_partner(rng, shape)) < 0.5
    # Beyond formula_kernels: ties, integers and the in-place add.
    cases = [(name, (x, ties)) for name in ("eq", "ne")] + [("add_", (x, y))]
    cases += [("add", (ints, ints[..., :1])), ("div", (ints, ints + 10)), ("lt", (ints, 0 * ints[0])),
              ("where", (cond, ints, ints[..., :1]))]
    return cases


def memory(rng, dtype, shape):
    x = rng.normal(size=shape).astype(dtype)
    other = np.float64 if dtype == np.float32 else np.float32
    # from_host reads host data: a nested list stays on the host where arrays would move.
    return [("zeros", (shape, dtype)), ("full", (shape, 1.5, dtype)), ("full", ((), -np.inf, dtype)),
            ("from_host", (x.tolist(), dtype)), ("from_host", ((x * 3).tolist(), np.int64)),
            ("copy", (x,)), ("astype", (x, other)), ("astype", (x * 3, np.int64)), ("astype", (x, np.bool_))]


def reductions(rng, dtype, shape):
    """Sums and maxima over any axes (ties included), and their backward helpers."""
    x = rng.normal(size=shape).astype(dtype)
    x[rng.random(shape) < 0.3] = 0.5                            # ties: max_back splits the gradient
    axes = tuple(int(a) for a in rng.choice(len(shape), size=rng.integers(0, len(shape) + 1), replace=False))
    axis = None if rng.random() < 0.2 else axes
    keepdims = bool(rng.random() < 0.5)
    y_keep = REFERENCE.max(x, axis, True)
    dy_keep = rng.normal(size=y_keep.shape).astype(dtype)
    return [("sum", (x, axis, keepdims)), ("max", (x, axis, keepdims)), ("sum", (x > 0, axis, keepdims)),
            ("sum", (x.astype(np.int64), axis, keepdims)), ("sum_to", (x, _partner(rng, shape))),
            ("max_back", (x, y_keep, dy_keep))]


def movement(rng, dtype, shape):
    """Reshape, permute, broadcast, basic and advanced indexing, and their inverses."""
    x = rng.normal(size=shape).astype(dtype)
    order = tuple(int(a) for a in rng.permutation(len(shape)))
    axis = int(rng.integers(-len(shape), len(shape)))
    small = rng.normal(size=_partner(rng, shape)).astype(dtype)
    sizes = [1, shape[axis] - 1] if shape[axis] > 1 else [1]
    cases = [("reshape", (x, (-1,))), ("reshape", (x, (shape[0], -1))), ("permute", (x, order)),
             ("broadcast_to", (small, (2,) + shape)), ("cat", ([x, x[:1] * 2, x], 0)),
             ("cat", ([x, x], axis)), ("split", (x, sizes, axis)), ("stack", ([x, -x], axis)),
             ("stack", ([x.astype(np.int64)] * 2, -1))]
    # A decoding cache's write: one position along an axis, in place (the result is x).
    row = rng.normal(size=shape[:axis % len(shape)] + (1,) + shape[axis % len(shape) + 1:]).astype(dtype)
    cases += [("write_at_", (x.copy(), np.array(rng.integers(0, shape[axis]), dtype=np.int64), row,
                             axis % len(shape)))]
    for index in [(0,), (slice(None, None, -1), Ellipsis), (Ellipsis, -1), (None, slice(1, None, 2)),
                  (0,) * len(shape), (np.array([0, -1, 0]),), (x > 0,), (slice(None), np.array([0, 0]))]:
        picked = REFERENCE.getitem(x, index)
        cases += [("getitem", (x, index)),
                  ("getitem_back", (shape, index, rng.normal(size=picked.shape).astype(dtype)))]
    return cases


def linear_algebra(rng, dtype, shape):
    """Products with batch axes that broadcast, sizes across tile edges, 1-D operands."""
    n, k, m = (int(s) for s in rng.integers(1, 7, size=3))
    batch = tuple(shape[:-2])
    a = rng.normal(size=batch + (n, k)).astype(dtype)
    b = rng.normal(size=(k, m)).astype(dtype)
    b_batch = rng.normal(size=(1,) * len(batch) + (k, m)).astype(dtype)
    return [("matmul", (a, b)), ("matmul", (a, b_batch)), ("matmul", (b[:, 0], b)), ("matmul", (a, b[:, 0])),
            ("matmul_nt", (a, np.swapaxes(b, -1, -2).copy())), ("matmul_nt", (a, a)),
            ("matmul_tn", (a, rng.normal(size=batch + (n, m)).astype(dtype))), ("matmul_tn", (b, b_batch))]


def lookups(rng, dtype, shape):
    """Embedding rows and the negative log-likelihood of log-probabilities."""
    n, c = int(np.prod(shape[:-1])), shape[-1]
    logp = REFERENCE.log_softmax(rng.normal(size=(n, c)).astype(dtype), -1)
    target = rng.integers(0, c, size=n)
    dloss = rng.normal(size=n).astype(dtype)
    weight = rng.normal(size=(5, 3)).astype(dtype)
    ids = rng.integers(0, 5, size=shape[:-1])
    # Beam search's row gather: a decode cache (rows, H * L * D) reshaped flat, its surviving
    # rows picked with repeats and the padding rows pointing at row 0 (models/transformer.py).
    cache = rng.normal(size=(shape[0], int(np.prod(shape)) * 7)).astype(dtype)
    survivors = np.concatenate([rng.integers(0, shape[0], size=shape[0] + 1), np.zeros(2, dtype=np.int64)])
    return [("nll_loss", (logp, target, 0)), ("nll_loss", (logp, target, -(2**63))),
            ("nll_loss_back", ((n, c), target, 0, dloss)), ("embedding", (weight, ids)),
            ("embedding", (cache, survivors))]


def losses_and_draws(rng, dtype, shape):
    """A mean loss's kept-row count and its divisor, the id guard on ids in range (it
    returns None; ``fail`` must not be called), and dropout's multiplier and the random
    tensors' draws from a fresh seed."""
    target = rng.integers(0, 3, size=shape)
    count = REFERENCE.count_ne(target, 0)

    def fail(ids):
        raise AssertionError(f"guard_ids flagged ids in range: {ids}")

    seeded = np.random.default_rng(int(rng.integers(2**32)))
    return [("count_ne", (target, 0)), ("count_ne", (target, -(2**63))), ("clamp_divisor", (count, dtype)),
            ("clamp_divisor", (np.zeros((), np.int64), dtype)), ("guard_ids", (target, 3, None, fail)),
            ("guard_ids", (target - 1, 2, -1, fail)), ("dropout_multiplier", (seeded, shape, 0.25, dtype)),
            ("random_normal", (seeded, shape, dtype)), ("random_uniform", (seeded, shape, dtype)),
            ("guard_finite", (rng.normal(size=shape).astype(dtype), fail))]


PRIMITIVES = [arithmetic, memory, reductions, movement, linear_algebra, lookups, losses_and_draws]
# The optimizers' kernels: what the in-place ones write is compared in test_optim_kernels.py.
GENERATORS += [*PRIMITIVES, optimizer_kernels]


def to_device(backend, args):
    """Kernel arguments on ``backend``'s device: arrays and lists of arrays move, the rest
    (shapes, indices, scalars) stays."""
    def move(a):
        if isinstance(a, np.ndarray):
            return backend.asarray(a, a.dtype)
        if isinstance(a, list) and a and isinstance(a[0], np.ndarray):
            return [move(x) for x in a]
        return a
    return [move(a) for a in args]


def to_host(backend, out):
    if out is None:                              # an absent result (layer_norm_back's dweight)
        return None
    if isinstance(out, (tuple, list)):
        return type(out)(to_host(backend, x) for x in out)
    return np.asarray(backend.to_numpy(out))


# The CUDA simulator runs every GPU thread in Python: there, a case with a larger array
# (the attention generator draws up to 300 queries) is skipped.
SIMULATED_MAX_ENTRIES = 512


def too_big(device, args) -> bool:
    if device != "cuda":
        return False
    from tinygrad_attn.compiler import cuda

    arrays = [a for a in args if isinstance(a, np.ndarray)]
    return cuda.SIMULATOR and any(a.size > SIMULATED_MAX_ENTRIES for a in arrays)


@pytest.mark.parametrize("device", DEVICES)
def test_every_overridden_kernel_has_a_conformance_generator(device):
    rng = np.random.default_rng(0)
    covered = {name for gen in GENERATORS for dtype in DTYPES for name, _ in gen(rng, dtype, (2, 3))}
    covered |= {"asarray", "to_numpy"}          # every case moves its arrays with these
    # Fused chains' kernels (named fused_*) join a device's table when a plan fuses them, each
    # checked against its chain by ta.check (tests/test_fuse*.py); earlier tests may have made some.
    own = {name for name in get_backend(device).kernels if not name.startswith("fused_")}
    assert own <= covered, f"{device} overrides {sorted(own - covered)} without a conformance test"


def compare(got, want, dtype, what, scale: float = 1.0):
    """``scale``: the inputs' largest magnitude (at least 1).  A result that is a difference
    of large intermediates (a loss of 0.04 as log-sum-exp 30.01 minus a logit 29.97) carries
    their rounding error, so the absolute tolerance grows with it."""
    if isinstance(want, (tuple, list)):
        for g, w in zip(got, want, strict=True):
            compare(g, w, dtype, what, scale)
        return
    if want is None:
        assert got is None, what
        return
    assert got.dtype == want.dtype and got.shape == want.shape, what
    tol = tolerance(dtype)
    np.testing.assert_allclose(got, want, rtol=tol["rtol"], atol=tol["atol"] * scale, err_msg=what)


def magnitude(args) -> float:
    floats = [a for a in args if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size]
    return max([1.0] + [float(np.abs(a[np.isfinite(a)]).max(initial=0.0)) for a in floats])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("generator", GENERATORS, ids=lambda g: g.__name__)
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=3).map(tuple),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1))
def test_overridden_kernels_match_the_reference(device, generator, shape, dtype, seed):
    backend = get_backend(device)
    for name, args in generator(np.random.default_rng(seed), dtype, shape):
        if name not in backend.kernels or too_big(device, args):
            continue
        # Copies for the reference: an in-place kernel (add_) writes into its first argument.
        # A generator is copied too: both sides draw the same stream.
        reference_args = tuple(a.copy() if isinstance(a, np.ndarray) else
                               copy.deepcopy(a) if isinstance(a, np.random.Generator) else a for a in args)
        with np.errstate(all="ignore"):         # signed bases of powers, on both sides
            want = getattr(REFERENCE, name)(*reference_args)
            got = to_host(backend, getattr(backend, name)(*to_device(backend, args)))
        compare(got, want, dtype, f"{name} on {device}, shape {shape}, {np.dtype(dtype).name}",
                magnitude(args))
