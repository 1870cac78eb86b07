"""Every registered op passes both checks: an op cannot be added unchecked."""

import pytest

import tinygrad_attn as ta
from tinygrad_attn.autograd import registry

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
