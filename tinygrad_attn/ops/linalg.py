"""Matrix product with numpy's batching rules (1-D operands, broadcast batch axes)."""

from __future__ import annotations

import numpy as np

from ..autograd import DeferredGrad, Example, Op, register
from ..shapes import batch_shape, dim
from ._common import check_float, check_same_dtype, uniform


def _matmul_flat(k, a, b):
    """a @ b; a batched a times a 2-D b is one GEMM over the flattened rows (faster than
    one GEMM per batch entry, which is what broadcasting b would do)."""
    if b.ndim == 2 and a.ndim > 2:
        y = k.matmul(k.reshape(a, (-1, dim(a, -1))), b)           # (N*n, m)
        return k.reshape(y, a.shape[:-1] + (dim(b, -1),))
    return k.matmul(a, b)


@register
class MatMul(Op):
    """y = a @ b: (..., n, k) @ (..., k, m) -> (..., n, m), batch axes broadcast;
    a 1-D a is a row (k,), a 1-D b a column (k,), and that axis is dropped from y."""

    kernels = ("matmul", "matmul_nt", "matmul_tn", "reshape", "sum_to")

    @staticmethod
    def symbolic(sp, a, b):
        return np.matmul(np.asarray(a, dtype=object), np.asarray(b, dtype=object))

    def forward(self, a, b):
        check_same_dtype(self, a, b)
        check_float(self, a)
        if a.ndim == 0 or b.ndim == 0:
            self.fail(f"operands must have at least 1 axis, got shapes {tuple(a.shape)} @ {tuple(b.shape)}")
        k = self.backend
        a2 = k.reshape(a, (1,) + a.shape) if a.ndim == 1 else a   # (..., n, k)
        b2 = k.reshape(b, b.shape + (1,)) if b.ndim == 1 else b   # (..., k, m)
        if dim(a2, -1) != dim(b2, -2):
            self.fail(f"inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)} "
                      f"({dim(a2, -1)} != {dim(b2, -2)})")
        try:
            batch = batch_shape(a2.shape[:-2], b2.shape[:-2])
        except ValueError:
            self.fail(f"batch axes do not broadcast: {tuple(a.shape)} @ {tuple(b.shape)}")
        y2 = _matmul_flat(k, a2, b2)                               # (..., n, m)
        self.saved = (a2, b2, a.shape, b.shape, y2.shape)
        shape = tuple(batch)
        shape += () if a.ndim == 1 else (dim(a2, -2),)
        shape += () if b.ndim == 1 else (dim(b2, -1),)
        return k.reshape(y2, shape)

    def backward(self, dy):
        a2, b2, a_shape, b_shape, y2_shape = self.saved
        k = self.backend
        dy2 = k.reshape(dy, y2_shape)                               # (..., n, m)
        da = db = None
        if self.needs_grad[0]:
            if b2.ndim == 2:                                        # (N, n, m) @ (m, k) as one GEMM
                da = k.reshape(k.matmul_nt(k.reshape(dy2, (-1, dim(dy2, -1))), b2),
                               dy2.shape[:-1] + (b2.shape[0],))
            else:
                da = k.matmul_nt(dy2, b2)                           # (..., n, k)
            da = k.reshape(k.sum_to(da, a2.shape), a_shape)
        if self.needs_grad[1]:
            if b2.ndim == 2 and a2.ndim > 2:
                # A weight shared by every row: summing the per-batch products is one GEMM
                # over the flattened rows, (k, N*n) @ (N*n, m).
                db = k.matmul_tn(k.reshape(a2, (-1, dim(a2, -1))), k.reshape(dy2, (-1, dim(dy2, -1))))
            else:
                db = k.sum_to(k.matmul_tn(a2, dy2), b2.shape)       # (..., k, m)
            db = k.reshape(db, b_shape)
        return da, db

    @classmethod
    def examples(cls):
        return [
            Example((uniform(400, 2, 3), uniform(401, 3, 2))),
            Example((uniform(402, 2, 2, 3), uniform(403, 3, 2))),      # batch broadcast
            Example((uniform(404, 3), uniform(405, 2, 3, 2))),         # 1-D @ batched
            Example((uniform(406, 2, 3), uniform(407, 3))),            # matrix @ vector
        ]


@register
class Linear(Op):
    """y = x W^T + b: x (..., in), W (out, in) as a PyTorch Linear weight, b (out,) or absent.

    One node instead of a transpose, a product and an add: BLAS reads W^T in place (no
    transposed copy of the weight per call), every leading axis of x is one GEMM's rows, and
    backward is three products: dx = dy W, dW = dy^T x, db = the rows of dy summed.
    """

    kernels = ("add_", "cat", "matmul", "matmul_nt", "matmul_tn", "reshape", "sum")

    @staticmethod
    def symbolic(sp, x, weight, bias=None):
        y = np.matmul(np.asarray(x, dtype=object), np.asarray(weight, dtype=object).T)
        return y if bias is None else y + np.asarray(bias, dtype=object)

    def forward(self, x, weight, bias=None):
        check_same_dtype(self, x, weight, *(() if bias is None else (bias,)))
        check_float(self, x)
        if x.ndim == 0 or weight.ndim != 2 or dim(x, -1) != weight.shape[1]:
            self.fail(f"expected x (..., in) and weight (out, in) with the same in, got x "
                      f"{tuple(x.shape)} and weight {tuple(weight.shape)}")
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            self.fail(f"bias must be (out,) = ({weight.shape[0]},), got {tuple(bias.shape)}")
        k = self.backend
        x2 = k.reshape(x, (-1, dim(x, -1)))                           # (N, in)
        y2 = k.matmul_nt(x2, weight)                                   # (N, out)
        if bias is not None:
            y2 = k.add_(y2, bias)             # into the product's own new array: no second one
        self.saved = (x2, weight, x.shape)
        return k.reshape(y2, x.shape[:-1] + (weight.shape[0],))

    def backward(self, dy):
        x2, weight, x_shape = self.saved
        k = self.backend
        dy2 = k.reshape(dy, (-1, weight.shape[0]))                     # (N, out)
        dx = k.reshape(k.matmul(dy2, weight), x_shape) if self.needs_grad[0] else None
        # The weight's and bias's: one GEMM (one sum) over every call's rows, when read.
        stacks: dict = {}                     # dy's rows stacked once for both
        need = self.needs_grad
        dw = DeferredGrad(k, "matmul_tn", weight.shape, (dy2, x2), (), stacks) if need[1] else None
        grads = (dx, dw)
        if len(need) == 3:
            db = DeferredGrad(k, "sum", dy2.shape[1:], (dy2,), (0, False), stacks) if need[2] else None
            grads += (db,)
        return grads

    @classmethod
    def examples(cls):
        return [
            Example((uniform(410, 2, 3), uniform(411, 4, 3), uniform(412, 4))),
            Example((uniform(413, 2, 2, 3), uniform(414, 2, 3))),           # no bias, batched
            Example((uniform(415, 3), uniform(416, 2, 3), uniform(417, 2))),   # one sample
        ]
