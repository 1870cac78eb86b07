"""ta.check catches wrong gradients: a check that cannot fail is worthless."""

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import Tensor
from tinygrad_attn.autograd import Example, Op, registry


class Square(Op):
    """y = x^2 (correct)"""

    @staticmethod
    def symbolic(sp, x):
        return x * x

    def forward(self, x):
        self.saved = (x,)
        return x * x

    def backward(self, dy):
        (x,) = self.saved
        return (2 * x * dy,)

    @classmethod
    def examples(cls):
        return [Example((np.array([0.5, -1.5, 2.0]),))]


class SquareWrongBackward(Square):
    """y = x^2, with the factor 2 forgotten in backward"""

    def backward(self, dy):
        (x,) = self.saved
        return (x * dy,)


class SquareWrongForward(Square):
    """y = x^2 claimed, x^3 computed (backward is consistent with the claim)"""

    def forward(self, x):
        self.saved = (x,)
        return x * x * x


X = np.array([0.5, -1.5, 2.0])


def test_symbolic_passes_a_correct_op_and_shows_the_formula():
    report = ta.check.symbolic(Square, X)
    assert report.ok
    assert "d y[0] / d x0[0] = 2*x0[0]" in str(report)


def test_symbolic_catches_a_wrong_backward():
    report = ta.check.symbolic(SquareWrongBackward, X)
    assert not report.ok
    assert "wrong gradient" in str(report) and "FAILED" in str(report)
    assert report.inputs[0].max_abs_err > 0.1


def test_gradcheck_catches_a_wrong_backward():
    report = ta.check.gradcheck(SquareWrongBackward, X)
    assert not report.ok
    assert report.inputs[0].max_abs_err > 0.1


def test_symbolic_catches_a_forward_that_disagrees_with_its_formula():
    report = ta.check.symbolic(SquareWrongForward, X)
    assert not report.ok
    assert "DIFFERS" in str(report)


def test_ops_report_flags_a_registered_wrong_op():
    ta.ops.register(SquareWrongBackward)
    try:
        report = ta.check.ops(["SquareWrongBackward"])
        assert not report.ok
        assert "0 of 1 ops pass" in str(report)
        assert report.failures
    finally:
        del registry["SquareWrongBackward"]


def test_ops_report_flags_an_op_without_examples():
    class NoExamples(Square):
        """y = x^2"""

        @classmethod
        def examples(cls):
            return []

    ta.ops.register(NoExamples)
    try:
        report = ta.check.ops(["NoExamples"])
        assert not report.ok
        assert "no examples" in str(report)
    finally:
        del registry["NoExamples"]


def test_register_rejects_an_op_without_symbolic():
    class Incomplete(Op):
        def forward(self, x):
            return x

        def backward(self, dy):
            return (dy,)

    with pytest.raises(TypeError, match="does not define symbolic"):
        ta.ops.register(Incomplete)


def test_user_op_works_end_to_end():
    y = Square.apply(Tensor([3.0], requires_grad=True, dtype="float64"))
    y.sum().backward()
    assert y.node.op_name == "Square"
    np.testing.assert_allclose(y.node.inputs[0].grad.numpy(), [6.0])


def test_symbolic_checks_a_whole_composite_graph():
    def layer(x, W, b):
        return (x @ W + b).tanh().softmax(axis=-1).log().mean()

    rng = np.random.default_rng(0)
    report = ta.check.symbolic(layer, rng.normal(size=(2, 3)), rng.normal(size=(3, 2)),
                               rng.normal(size=2))
    assert report.ok, str(report)
    assert [i.name for i in report.inputs] == ["x", "W", "b"]


def test_symbolic_checks_parameters_captured_by_the_function():
    W = Tensor(np.array([[0.3, -0.2], [0.1, 0.4]]), requires_grad=True, dtype="float64", name="W")
    report = ta.check.symbolic(lambda x: (x @ W).sigmoid().sum(), np.array([[1.0, 2.0]]))
    assert report.ok, str(report)
    assert [i.name for i in report.inputs] == ["x", "W"]


def test_symbolic_catches_a_wrong_gradient_inside_a_composite_graph():
    def f(x):
        return SquareWrongBackward.apply((x * 2).tanh()).sum()

    assert not ta.check.symbolic(f, X).ok
    assert not ta.check.gradcheck(f, X).ok


def test_checks_pass_ids_and_masks_through_unperturbed():
    logits = np.random.default_rng(1).normal(size=(3, 4))
    target = np.array([0, 3, 1])
    for check in (ta.check.symbolic, ta.check.gradcheck):
        report = check(lambda z, t: ta.functional.cross_entropy(z, t), logits, target)
        assert report.ok, str(report)
        assert len(report.inputs) == 1


def test_report_records_an_exception_instead_of_raising():
    report = ta.check.symbolic(lambda x: x @ x, np.ones((2, 3)))
    assert not report.ok
    assert "MatMul: inner dimensions differ" in str(report)


def test_gradcheck_checks_parameters_captured_by_the_function_and_keeps_their_grads():
    w = Tensor(np.array([0.5, -1.5, 2.0]), dtype=np.float64, requires_grad=True, name="w")
    w.grad = Tensor(np.full(3, 7.0), dtype=np.float64)
    good = ta.check.gradcheck(lambda: Square.apply(w))
    assert good.ok and [r.name for r in good.inputs] == ["w"]
    bad = ta.check.gradcheck(lambda: SquareWrongBackward.apply(w))
    assert not bad.ok
    np.testing.assert_array_equal(w.grad.numpy(), 7.0)      # the caller's gradient is untouched
