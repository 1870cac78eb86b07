# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 8. Verifying gradients, and writing an op of your own from its formula
#
# Every model in this course learns by gradient descent, and seed 001 names what can go wrong on
# the way, the **vanishing gradient problem**, which attention eases by letting the decoder "look
# back into the past as far as it wants". None of that helps if a gradient is simply wrong: a
# wrong backward still trains, only worse, and nothing crashes. So every op in the package is
# checked two ways, and so can yours be.
#
# - **Finite differences** (`ta.check.gradcheck`): perturb one input entry by $\pm\varepsilon$ and compare
#   $$\frac{\partial f}{\partial x_i} \approx
#     \frac{f(x + \varepsilon e_i) - f(x - \varepsilon e_i)}{2\varepsilon},$$
#   whose error is $O(\varepsilon^2)$ from truncation plus $O(u / \varepsilon)$ from rounding ($u$ the
#   machine epsilon), so it needs float64 and a tolerance.
# - **Symbolic** (`ta.check.symbolic`): replay the recorded graph on sympy symbols, differentiate
#   exactly, and compare with `backward` at 30 digits: no tolerance to tune, and a derived formula
#   to read.

# %%
import matplotlib.pyplot as plt
import numpy as np
import sympy as sp

import tinygrad_attn as ta
from tinygrad_attn import Tensor

ta.set_num_threads(1)
rng = np.random.default_rng(0)

# %% [markdown]
# ## Checking a function
#
# Scaled dot-product attention with a causal mask (notebook 4), every input checked with central
# differences, then the same with sympy at a smaller size (the formula printed is one entry of one
# gradient).

# %%
q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((3, 2)), rng.standard_normal((3, 2))


def attention_context(q, k, v):
    return ta.attention.scaled_dot_product(q, k, v, causal=True)[0]


print(ta.check.gradcheck(attention_context, q, k, v))

# %%
def dot_context(s, h):
    return ta.attention.dot(s, h)[0]                  # c = softmax(h s) h


print(ta.check.symbolic(dot_context, rng.standard_normal(2), rng.standard_normal((2, 2))))

# %% [markdown]
# ## An op from its formula
#
# Say you want **softplus**, $y = \log(1 + e^x)$, as one node. Its derivative is
# $\frac{dy}{dx} = \frac{e^x}{1 + e^x} = \sigma(x)$. For an elementwise function the formula is
# all the package needs: subclass `ta.ops.Elementwise`, write `symbolic` for one entry, and sympy
# derives the derivative, from which the package prints the forward and backward kernels
# (`Softplus.source` shows the op it wrote). `examples()` lists the inputs at which
# `ta.check.ops()` verifies it, and `@ta.ops.register` adds it to the registry that check walks.

# %%
@ta.ops.register
class Softplus(ta.ops.Elementwise):
    """y = log(1 + exp(x)), elementwise."""

    @staticmethod
    def symbolic(sp, x):
        return sp.log(1 + sp.exp(x))

    @classmethod
    def examples(cls):
        return [ta.ops.Example((np.array([-3.0, -0.5, 0.0, 0.7, 4.0]),))]


x = Tensor([-2.0, 0.0, 2.0], requires_grad=True)
y = Softplus.apply(x)
y.sum().backward()
print("softplus:", y.numpy(), " gradient σ(x):", x.grad.numpy())
print(Softplus.source)
print(ta.check.ops(["Softplus"]))

# %% [markdown]
# ## An op with a hand-written backward
#
# The derived kernels compute the formula as written, and $\log(1 + e^x)$ overflows once $e^x$ does
# ($x \gtrsim 89$ in float32):

# %%
with np.errstate(all="ignore"):
    print("formula op at x = 100:", Softplus.apply(Tensor([100.0])).numpy())

# %% [markdown]
# Numerics the formula does not know are a reason to write forward and backward by hand, as
# the package's fused ops do: subclass `ta.ops.Op`. Forward uses $\log(e^0 + e^x)$ = `logaddexp(0, x)`,
# backward returns the vector-Jacobian product $\bar x = \bar y \cdot \sigma(x)$ with
# $\sigma(x) = \frac{1}{2}(1 + \tanh(x / 2))$, which never overflows either. `symbolic` still states
# the exact formula, applied entry by entry to the object array of sympy symbols the check passes.

# %%
@ta.ops.register
class StableSoftplus(ta.ops.Op):
    """y = log(1 + exp(x)), elementwise, without overflow."""

    @staticmethod
    def symbolic(sp, x):
        return np.frompyfunc(lambda entry: sp.log(1 + sp.exp(entry)), 1, 1)(x)

    def forward(self, x):
        self.saved = (x,)
        return np.logaddexp(0.0, x)                   # log(e^0 + e^x): no overflow

    def backward(self, dy):
        (x,) = self.saved
        return (dy * 0.5 * (1.0 + np.tanh(0.5 * x)),)  # dy * sigmoid(x)

    @classmethod
    def examples(cls):
        return [ta.ops.Example((np.array([-3.0, -0.5, 0.0, 0.7, 4.0]),))]


x = Tensor([-1000.0, -2.0, 0.0, 2.0, 1000.0], requires_grad=True)
y = StableSoftplus.apply(x)
y.sum().backward()
print("softplus:", y.numpy(), "\ngradient:", x.grad.numpy())
print(ta.check.ops(["StableSoftplus"]))

# %% [markdown]
# A check that cannot fail proves nothing, so here is one that does: the same op with a
# plausible slip in backward, $\sigma(x)(1 - \sigma(x))$ (that is $\sigma'(x)$, one derivative too many).
# Both checks catch it; `ta.check.symbolic` also takes an op class directly, registered or not.

# %%
class WrongSoftplus(StableSoftplus):
    """Softplus with a wrong backward, to see the checks fail."""

    def backward(self, dy):
        (x,) = self.saved
        s = 0.5 * (1.0 + np.tanh(0.5 * x))
        return (dy * s * (1.0 - s),)


wrong = ta.check.symbolic(WrongSoftplus, np.array([-0.5, 0.0, 0.7]))
print(wrong)
print("finite differences agree?", ta.check.gradcheck(WrongSoftplus, np.array([-0.5, 0.0, 0.7])).ok)

# %% [markdown]
# ## Your op in a graph
#
# Once registered the op is a node like any other: it composes, it is drawn, and a whole function
# using it is checked end to end. Here a tiny additive-style score with softplus in place of tanh,
# $e_j = v \cdot \mathrm{softplus}(W h_j)$, drawn with its gradient edges (`backward=True`).

# %%
W = Tensor(rng.standard_normal((2, 2)), requires_grad=True, name="W")
h = Tensor(rng.standard_normal((3, 2)), requires_grad=True, name="h")
v_ = Tensor(rng.standard_normal(2), requires_grad=True, name="v")


def scores(W, h, v):
    return StableSoftplus.apply(h @ W.T) @ v          # e_j = v . softplus(W h_j), (3,)


e = scores(W, h, v_)
e.name = "e"
print("symbolic check of the scores passes:", ta.check.symbolic(scores, W.numpy(), h.numpy(), v_.numpy()).ok)
ta.viz.graph(e.sum(), backward=True)

# %% [markdown]
# ## What to check
#
# The finite-difference error of softplus' derivative at $x = 0.7$ against $\varepsilon$, with the exact
# value from sympy: the V shape is the two error terms above, truncation ($\propto \varepsilon^2$, right)
# and rounding ($\propto u/\varepsilon$, left). Balancing them puts the best $\varepsilon$ at
# $u^{1/3} \approx 6 \cdot 10^{-6}$ times a constant that depends on $f$'s third derivative.
# This is why `gradcheck` uses float64 and $\varepsilon = 10^{-6}$.

# %%
x0 = 0.7
xs = sp.Symbol("x")
exact = float(sp.diff(sp.log(1 + sp.exp(xs)), xs).subs(xs, x0))      # sigma(0.7)
epsilons = np.logspace(-12, -1, 23)
errors = []
for eps in epsilons:
    ends = StableSoftplus.apply(Tensor([x0 + eps, x0 - eps], dtype="float64")).numpy()
    errors.append(abs((ends[0] - ends[1]) / (2 * eps) - exact))
best = epsilons[int(np.argmin(errors))]
print(f"exact derivative {exact:.15f}; smallest error {min(errors):.1e} at eps = {best:.0e}")
figure, axes = plt.subplots(figsize=(5, 3.2))
axes.loglog(epsilons, errors, marker="o")
axes.set(xlabel="ε", ylabel="|central difference - exact|", title="softplus'(0.7) in float64")
plt.show()
