"""Every registered op passes both checks: an op cannot be added unchecked."""

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.autograd import DeferredGrad, registry

OPS = sorted(registry)


def test_registry_has_the_engine_ops():
    assert len(OPS) >= 25
    for name in ("Add", "MatMul", "Softmax", "LogSoftmax", "CrossEntropy", "Embedding", "GetItem"):
        assert name in OPS


@pytest.mark.parametrize("name", OPS)
def test_op_has_examples_and_symbolic_form(name):
    op = registry[name]
    assert op.examples(), f"{name} has no examples() for ta.check.ops()"
    assert op.__doc__, f"{name} needs a one-line docstring with its formula"


@pytest.mark.parametrize("name", OPS)
def test_op_backward_matches_sympy_and_finite_differences(name):
    report = ta.check.ops([name])
    assert report.ok, "\n".join(report.failures)


def test_ops_report_lists_every_op():
    report = ta.check.ops()
    text = str(report)
    assert report.ok, "\n".join(report.failures)
    assert f"{len(OPS)} of {len(OPS)} ops pass both checks" in text
    for name in OPS:
        assert name in text


# ---------------------------------------------------------------- the kernels each op names


class _Recording:
    """A backend that remembers which kernels were read from it."""

    def __init__(self, backend):
        self._backend, self.name, self.used = backend, backend.name, set()

    def __getattr__(self, kernel):
        fn = getattr(self._backend, kernel)
        self.used.add(kernel)
        return fn


def _device_tables() -> dict[str, set]:
    from tinygrad_attn.compiler import cuda, elementwise_formulas, get_backend

    # The cuda table is read from its module, which imports without a GPU (nothing compiles
    # until a kernel is launched): what a GPU would run is checked on every machine.  The
    # device adds every formula's kernels, built by cuda.elementwise.build, when it loads.
    generated = {name for formula in elementwise_formulas() for name in formula.kernel_names()}
    assert callable(cuda.elementwise.build)
    return {"numpy": set(get_backend("numpy").kernel_names()),
            "cpu": set(get_backend("cpu").kernel_names()), "cuda": set(cuda.KERNELS) | generated}


@pytest.mark.parametrize("name", OPS)
def test_op_names_the_kernels_it_calls_and_every_device_provides_them(name):
    from tinygrad_attn.compiler import get_backend

    cls = registry[name]
    assert cls.kernels, f"{name} names no kernels (its class attribute `kernels`)"
    for device, table in _device_tables().items():
        missing = sorted(set(cls.kernels) - table)
        assert not missing, f"device {device!r} lacks {missing}, which {name} calls"
    recording = _Recording(get_backend("numpy"))
    for example in cls.examples():
        op = cls(recording, **example.attrs)
        arrays = [np.asarray(a) for a in example.inputs]
        op.needs_grad = tuple(a.dtype.kind == "f" for a in arrays)
        out = op.forward(*arrays)
        for grad in op.backward(np.ones_like(np.asarray(out))):
            if isinstance(grad, DeferredGrad):
                grad.value()                     # a deferred gradient calls its kernel late
    unnamed = sorted(recording.used - set(cls.kernels))
    assert not unnamed, f"{name} calls kernels its `kernels` does not name: {unnamed}"
    assert recording.used, f"{name}'s examples called no kernel"


def test_a_kernel_an_op_does_not_name_is_caught(monkeypatch):
    monkeypatch.setattr(registry["Tanh"], "kernels", ("tanh",))        # tanh_back left out
    with pytest.raises(AssertionError, match=r"does not name: \['tanh_back'\]"):
        test_op_names_the_kernels_it_calls_and_every_device_provides_them("Tanh")
