"""Elementwise kernels generated from one formula (compiler/formulas.py): an op written as a
formula alone runs and checks on every device, derivatives read the output where that is
cheaper, and what sympy derived is cached on disk."""

import subprocess
import sys

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn.autograd import registry
from tinygrad_attn.compiler import define_elementwise, formulas, get_backend
from tinygrad_attn.ops import Elementwise, Example, Sigmoid, Tanh
from tinygrad_attn.ops.elementwise import Exp, LeakyRelu, Log, Pow, Relu


@pytest.fixture
def softplus():
    """An op stated only as a formula and examples, registered for the test and removed after."""

    @ta.ops.register
    class Softplus(Elementwise):
        """y = log(1 + exp(x))"""

        @staticmethod
        def symbolic(sp, x):
            return sp.log(1 + sp.exp(x))

        @classmethod
        def examples(cls):
            return [Example((np.linspace(-3.0, 3.0, 6).reshape(2, 3),))]

    yield Softplus
    registry.pop("Softplus")


def test_an_op_written_as_a_formula_passes_the_exact_and_numeric_checks(softplus):
    report = ta.check.ops(["Softplus"])
    assert report.ok, "\n".join(report.failures)
    assert softplus.kernels == ("softplus", "softplus_back")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_op_written_as_a_formula_runs_on_every_device(softplus, device, dtype):
    x = np.array([[-30.0, -2.0, -0.5], [0.0, 1.5, 30.0]])
    t = ta.Tensor(x, dtype=dtype, device=device, requires_grad=True)
    y = softplus.apply(t)
    y.backward(np.ones(x.shape, dtype))
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-14}
    np.testing.assert_allclose(y.numpy(), np.logaddexp(0.0, x), **tol)
    np.testing.assert_allclose(t.grad.numpy(), 1 / (1 + np.exp(-x)), **tol)
    assert y.dtype == dtype and t.grad.numpy().dtype == dtype


def _backward(op):
    return formulas.plan(op.formula).backward


@pytest.mark.parametrize(("op", "reads"), [(Tanh, ("out", "dy")), (Sigmoid, ("out", "dy")),
                                           (Exp, ("out", "dy")), (Log, ("x", "dy")), (Relu, ("x", "dy"))])
def test_a_derivative_reads_the_output_where_that_saves_a_function(op, reads):
    (back,) = _backward(op)
    assert back.args == reads


def test_the_output_is_not_used_where_it_would_divide():
    base, exponent = _backward(Pow)
    # d/dp x^p = x^p log x reads the output; d/dx = p x^(p-1) would become p y / x, which
    # divides by a base that may be 0: it keeps the input.
    assert exponent.args == ("base", "out", "dy")
    assert base.args == ("base", "exponent", "dy")
    assert "out" not in base.numpy


def test_generated_kernels_compute_the_derivative_and_carry_attributes():
    (back,) = _backward(Tanh)
    x = np.linspace(-1, 1, 5)
    y, dy = np.tanh(x), np.full(5, 2.0)
    np.testing.assert_allclose(get_backend("numpy").tanh_back(y, dy), (1 - y * y) * dy)
    assert back.ufunc is None and back.operations > 1          # several numpy passes: Numba on "cpu"
    (forward, (slope_back,)) = (formulas.plan(LeakyRelu.formula).forward, _backward(LeakyRelu))
    assert forward.params == ("negative_slope",) and slope_back.params == ("negative_slope",)


@pytest.mark.parametrize("op", [Relu, LeakyRelu])
@pytest.mark.filterwarnings("ignore:invalid value encountered")   # Numba's compare of a NaN flags it
def test_nan_passes_through_relus(op, device):
    attrs = {"negative_slope": 0.1} if op is LeakyRelu else {}
    y = op.apply(ta.Tensor([np.nan, -1.0, 2.0], device=device), **attrs).numpy()
    assert np.isnan(y[0]) and y[2] == 2.0


def test_kernels_are_derived_once_and_read_back_from_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYGRAD_ATTN_CACHE", str(tmp_path))
    cube = formulas.Formula("cube_for_cache_test", ("x",), lambda sp, x: x**3)
    first = formulas.plan(cube)
    assert list((tmp_path / "formulas").glob("cube_for_cache_test-*.json"))
    formulas._PLANS.clear()

    def no_sympy(formula):
        raise AssertionError("derived again instead of read from the cache")

    monkeypatch.setattr(formulas, "derive", no_sympy)
    assert formulas.plan(cube) == first
    (back,) = first.backward
    x, dy = np.array([0.5, -2.0]), np.array([1.0, 3.0])
    np.testing.assert_allclose(get_backend("numpy").build(back)(x, dy), 3 * x * x * dy)


def test_a_changed_formula_is_derived_afresh():
    square = formulas.Formula("f", ("x",), lambda sp, x: x**2, source="x**2")
    cube = formulas.Formula("f", ("x",), lambda sp, x: x**3, source="x**3")
    assert square.key() != cube.key()


def test_a_name_another_kernel_has_is_refused():
    taken = formulas.Formula("softmax", ("x",), lambda sp, x: x, source="x")
    with pytest.raises(ValueError, match="'softmax' is taken"):
        define_elementwise(taken)


def test_forward_and_backward_are_written_from_the_kernels_as_by_hand(softplus):
    # Straight-line code, the op as one would write it: tanh's backward reads only its
    # output; a broadcasting op sums each gradient back to its input's shape.
    x = ta.Tensor([0.5, -1.0], requires_grad=True)
    (x.tanh() * x + softplus.apply(x)).sum().backward()
    assert "self.saved = (y,)" in Tanh.source and "return (kb.tanh_back(y, dy),)" in Tanh.source
    mul = ta.ops.Mul.source
    assert "kb.sum_to(kb.mul_back_a(b, dy), a.shape) if needs[0] else None" in mul
    assert "kb.softplus_back(x, dy)" in softplus.source


def test_a_formula_may_not_take_the_names_generated_code_uses():
    with pytest.raises(ValueError, match=r"Shadow: the formula's argument names \['dy'\]"):
        class Shadow(Elementwise):
            @staticmethod
            def symbolic(sp, x, dy):
                return x * dy


def test_importing_the_package_imports_neither_sympy_nor_numba():
    code = "import sys, tinygrad_attn; print('sympy' in sys.modules, 'numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
