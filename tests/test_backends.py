"""The backend table: devices share kernel names and can replace any kernel by name."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinygrad_attn.compiler as compiler
from tinygrad_attn import Tensor
from tinygrad_attn.compiler import Backend, get_backend, register_backend


def test_every_device_has_every_reference_kernel(backend):
    assert set(get_backend("numpy").kernel_names()) <= set(backend.kernel_names())


def test_register_kernel_replaces_a_kernel_by_name_and_reaches_children():
    parent = Backend("test-parent", {"tanh": np.tanh})
    child = Backend("test-child", {}, parent=parent)
    assert child.tanh is np.tanh
    parent.register_kernel("tanh", np.sin)
    assert child.tanh is np.sin
    child.register_kernel("tanh", np.cos)
    assert child.tanh is np.cos and parent.tanh is np.sin


def test_a_device_with_one_replaced_kernel_runs_ops_through_it():
    calls = []

    def counting_tanh(x):
        calls.append(x.shape)
        return np.tanh(x)

    device = Backend("counting", {"tanh": counting_tanh}, parent=get_backend("numpy"))
    register_backend(device)
    try:
        y = Tensor([0.5, 1.0], device="counting").tanh()
    finally:
        del compiler._BACKENDS["counting"]
    assert calls == [(2,)] and y.device == "counting"
    np.testing.assert_allclose(y.numpy(), np.tanh([0.5, 1.0]), rtol=1e-6)


def test_missing_kernel_names_the_device():
    with pytest.raises(AttributeError, match="backend 'numpy' has no kernel 'nope'"):
        _ = get_backend("numpy").nope


def test_allocator_tuning_can_be_turned_off():
    probe = "from tinygrad_attn.compiler import keep_freed_memory; print(keep_freed_memory())"
    off = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "TINYGRAD_ATTN_KEEP_MEMORY": "0"})
    assert off.stdout.strip() == "False"
    on = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                        env={k: v for k, v in os.environ.items() if k != "TINYGRAD_ATTN_KEEP_MEMORY"})
    expected = "True" if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc" else "False"
    assert on.stdout.strip() == expected


def test_lazy_cpu_kernel_list_matches_compiler_cpu():
    from tinygrad_attn.compiler import CPU_KERNELS, cpu

    names = [name for family in cpu.FAMILIES for name in family.KERNELS]
    assert len(names) == len(set(names)), "two kernel families override one kernel"
    assert set(CPU_KERNELS) == set(names)


def _run_python(code: str, simulator: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_cuda_without_a_gpu_or_the_simulator_says_how_to_use_the_simulator():
    probe = ("import tinygrad_attn as ta\n"
             "from tinygrad_attn.compiler import available_devices\n"
             "print('cuda' in available_devices())\n"
             "try:\n"
             "    ta.Tensor([1.0]).to('cuda')\n"
             "except RuntimeError as error:\n"
             "    print(error)\n")
    out = _run_python(probe, simulator=False)
    if out.stdout.startswith("True"):
        pytest.skip("this machine has a CUDA GPU")
    assert out.stdout.startswith("False"), out.stderr
    assert "device 'cuda' is not available: no CUDA GPU was found" in out.stdout
    assert "NUMBA_ENABLE_CUDASIM=1" in out.stdout


def test_cuda_kernels_are_imported_on_first_use_of_the_device():
    probe = ("import sys, tinygrad_attn as ta\n"
             "print('numba' in sys.modules, 'tinygrad_attn.compiler.cuda' in sys.modules)\n"
             "x = ta.Tensor([1.0, 2.0], device='cuda')\n"
             "print('tinygrad_attn.compiler.cuda' in sys.modules, (x * x).sum().item())\n")
    out = _run_python(probe, simulator=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "True", "5.0"]


def test_the_package_runs_on_the_plain_simulator_and_patches_none_of_it():
    # The tests make the simulator stricter (tests/simulator.py); a user's process gets
    # Numba's simulator untouched, and a step of a GRU encoder with attention runs on it.
    probe = ("import numpy as np, tinygrad_attn as ta\n"
             "from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray\n"
             "from numba.cuda.simulator.kernel import BlockThread\n"
             "before = (dict(vars(FakeCUDAArray)), dict(vars(BlockThread)))\n"
             "ta.manual_seed(0)\n"
             "gru, att = ta.nn.GRU(3, 4, batch_first=True), ta.nn.MultiHeadAttention(4, 2)\n"
             "gru.to('cuda'); att.to('cuda')\n"
             "x = ta.Tensor(np.ones((2, 3, 3)), device='cuda')\n"
             "h, _ = gru(x)\n"
             "out, weights = att(h, h, h)\n"
             "out.sum().backward()\n"
             "print(weights.shape, gru.weight_ih_l0.grad.shape)\n"
             "print(before == (dict(vars(FakeCUDAArray)), dict(vars(BlockThread))))\n")
    out = _run_python(probe, simulator=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["(2, 3, 3) (12, 3)", "True"]


def test_numpy_broadcast_to_is_as_strict_as_numpy_and_never_writes_through():
    from tinygrad_attn.compiler import reference

    x = np.arange(3.0).reshape(1, 3)
    with pytest.raises(ValueError):
        reference.broadcast_to(x, (3,))                 # assignment would drop the leading 1
    with pytest.raises(ValueError):
        reference.broadcast_to(np.ones(2), (3,))
    same = reference.broadcast_to(x, (1, 3))
    assert not same.flags.writeable and np.shares_memory(same, x)
    np.testing.assert_array_equal(reference.broadcast_to(x, (2, 3)), np.broadcast_to(x, (2, 3)))


@pytest.mark.parametrize("a_shape, b_shape", [
    ((8, 20, 1), (8, 1, 32)),       # a decoder step's d(keys): batched outer products
    ((3, 1), (1, 4)),
    ((2, 5, 1), (1, 3)),            # broadcast batch axes
    ((5, 1), (2, 1, 3)),
    ((2, 4, 3), (2, 3, 5)),         # inner size above 1: numpy's matmul
])
def test_reference_matmuls_equal_numpy_for_outer_products(a_shape, b_shape):
    from tinygrad_attn.compiler import reference

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    want = np.matmul(a, b)
    np.testing.assert_array_equal(reference.matmul(a, b), want)
    np.testing.assert_array_equal(reference.matmul_tn(np.swapaxes(a, -1, -2).copy(), b), want)
    np.testing.assert_array_equal(reference.matmul_nt(a, np.swapaxes(b, -1, -2).copy()), want)


def _family(module) -> str:
    return module.__name__.rsplit(".", 1)[1]


def test_every_device_keeps_each_kernel_in_the_family_file_of_the_same_name():
    """compiler/reference/, cpu/ and cuda/ have one module per kernel family: a kernel a
    device overrides lives in the module named as the reference's home of that kernel."""
    from tinygrad_attn.compiler import cpu, cuda, reference

    home = {name: _family(f) for f in reference.FAMILIES for name in f.KERNELS}
    assert set(home) == set(reference.KERNELS)
    for device in (cpu, cuda):
        for family in device.FAMILIES:
            misplaced = {name: home[name] for name in family.KERNELS if home[name] != _family(family)}
            assert not misplaced, f"{family.__name__} holds kernels of other families: {misplaced}"


def test_no_compiler_file_is_over_600_lines():
    root = Path(__file__).resolve().parents[1] / "compiler"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
