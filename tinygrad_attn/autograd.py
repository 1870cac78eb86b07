"""Ops, the op registry, the graph record and reverse-mode differentiation.

An ``Op`` is one mathematical function with three faces:

* ``forward(*arrays)``  computes the output through ``self.backend``'s kernels and keeps
  what backward needs in ``self.saved``;
* ``backward(dy)``      returns one gradient array per input (``None`` where an input
  needs none), also through kernels;
* ``symbolic(sp, *inputs, **attrs)``  the same math on numpy object arrays of sympy
  expressions, which ``ta.check`` differentiates exactly.

``Op.apply(*tensors, **attrs)`` runs forward and, when any input requires grad, records a
``Node`` on the output: the op (with its attributes), the input tensors and the scope active
at the time.  ``backward`` walks those records with an iterative topological sort, so a
10,000-step chain never meets Python's recursion limit.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

__all__ = ["Node", "current_scope"]


class ShapeError(ValueError):
    """An op got shapes it cannot work with; the message names the op and the shapes."""


class DTypeError(TypeError):
    """An op got dtypes it cannot mix; the message names the op, dtypes and shapes."""


class DeviceError(ValueError):
    """An op got tensors on different devices."""


# ---------------------------------------------------------------- global state


class _State(threading.local):
    def __init__(self):
        self.grad_enabled = True
        self.scope_paths: list[str] = [""]     # "", "a", "a/b", ...: the scope path at each depth
        self.anomaly = False
        # The ta.compile capture running on this thread (tinygrad_attn/compiled.py), or None.
        self.capture = None


# The engine's state on this thread: grad mode, scopes, anomaly mode and the ta.compile capture
# (which tensor.py, nn/module.py and compiled.py consult).
state = _State()


class no_grad(contextlib.ContextDecorator):
    """Context (or decorator) in which ops record no graph and outputs need no grad.

    Example:
        >>> with ta.no_grad():
        ...     y = model(x)          # inference: no graph is kept
    """

    def __enter__(self):
        self._prev = state.grad_enabled
        state.grad_enabled = False
        return self

    def __exit__(self, *exc):
        state.grad_enabled = self._prev
        return False


class enable_grad(contextlib.ContextDecorator):
    """Turn graph recording back on inside a ``no_grad`` block."""

    def __enter__(self):
        self._prev = state.grad_enabled
        state.grad_enabled = True
        return self

    def __exit__(self, *exc):
        state.grad_enabled = self._prev
        return False


def is_grad_enabled() -> bool:
    """Whether ops record graph nodes now (False inside ``no_grad``), as ``torch.is_grad_enabled``."""
    return state.grad_enabled


class scope(contextlib.ContextDecorator):
    """Tag every node made inside the block with ``name`` (nested scopes join with '/').

    Example:
        >>> with ta.scope("encoder"), ta.scope("t3"):
        ...     h = (x @ W).tanh()
        >>> h.node.scope
        'encoder/t3'

    A class rather than a generator context manager: an unrolled model enters a few scopes
    per time step, and this costs a third as much.  The joined path is kept per depth, so
    recording a node does not join the names again.
    """

    def __init__(self, name: str):
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"scope(): a scope name must be non-empty and contain no '/', got {name!r}")
        self.name = name

    def __enter__(self):
        outer = state.scope_paths[-1]
        state.scope_paths.append(f"{outer}/{self.name}" if outer else self.name)
        return None

    def __exit__(self, *exc):
        state.scope_paths.pop()
        return False


def current_scope() -> str:
    return state.scope_paths[-1]


@contextlib.contextmanager
def outside_capture():
    """One-time set-up inside a step (an optimizer's state, made on its first update): under
    ``ta.compile``'s capture its kernel calls are not recorded, so a plan binds what they
    made by identity (read as it is at each replay) instead of making it afresh each time.
    Outside a capture this does nothing."""
    capture = state.capture
    if capture is None:
        yield
        return
    with capture.recorder.paused():
        yield


class detect_anomaly(contextlib.ContextDecorator):
    """Check every gradient for NaN/inf during backward and name the op that made it.

    Inside the block each op also remembers the line of user code that created it, which
    the error message quotes.  It costs time: use it to debug, not to train.

    Example:
        >>> with ta.detect_anomaly():
        ...     loss.backward()       # RuntimeError: ... backward of Log ... produced NaN
    """

    def __enter__(self):
        self._prev = state.anomaly
        state.anomaly = True
        return self

    def __exit__(self, *exc):
        state.anomaly = self._prev
        return False


# ---------------------------------------------------------------- ops


@dataclass
class Example:
    """Inputs at which ``ta.check.ops()`` verifies an op: arrays (float64 for the
    differentiable ones, int/bool for ids and masks) and the op's attributes.

    ``finite_differences=False`` marks an example where the op deliberately departs from
    the function's true derivative (a stop-gradient such as Embedding's padding row), which
    only the symbolic form can state; the symbolic check still runs.
    """

    inputs: tuple
    attrs: dict = field(default_factory=dict)
    finite_differences: bool = True


class Op:
    """Base class of every op.  Subclass, define forward/backward/symbolic/examples, and
    decorate with ``@register`` so the op is verified with every other one.

    Example:
        >>> @ta.ops.register
        ... class Cube(ta.ops.Op):
        ...     '''y = x^3'''
        ...     @staticmethod
        ...     def symbolic(sp, x):
        ...         return x ** 3
        ...     def forward(self, x):
        ...         self.saved = (x,)
        ...         return x ** 3
        ...     def backward(self, dy):
        ...         (x,) = self.saved
        ...         return (3 * x * x * dy,)
        >>> y = Cube.apply(Tensor([2.0], requires_grad=True))
    """

    name: ClassVar[str]
    # The backend kernels forward and backward call (``self.backend.<name>``): every device
    # must provide them, and a test checks that an op calls no other.  forward and backward
    # get the device's raw arrays: read an axis with ``shapes.dim(x, -1)``, not
    # ``x.shape[-1]``, which a CUDA device array's shape may refuse (the simulator's does).
    kernels: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    def __init__(self, backend, **attrs):
        # Attributes are also fields, read inside forward/backward as self.axis: a plain
        # lookup, where a __getattr__ fallback would cost a failed lookup (~1.5 us) each.
        if attrs and not _OP_FIELDS.isdisjoint(attrs):
            taken = sorted(_OP_FIELDS.intersection(attrs))
            raise TypeError(f"{type(self).__name__}: attribute names {taken} are taken by Op's "
                            f"own fields and methods; rename them")
        self.__dict__.update(attrs)
        self.backend = backend
        self.attrs = attrs
        self.saved: tuple = ()
        self.needs_grad: tuple[bool, ...] = ()
        self.freed = False

    def set_attr(self, key: str, value) -> None:
        """Change attribute ``key`` (e.g. to a normalised axis) where graphs, the symbolic
        check and forward/backward all read it."""
        self.attrs[key] = value
        setattr(self, key, value)

    def forward(self, *inputs):
        raise NotImplementedError  # abstract: every op defines it

    def backward(self, dy):
        raise NotImplementedError  # abstract: every op defines it

    @staticmethod
    def symbolic(sp, *inputs, **attrs):
        raise NotImplementedError  # abstract: every op defines it

    @classmethod
    def examples(cls) -> list[Example]:
        """Small inputs, inside the op's smooth domain, for ``ta.check.ops()``."""
        return []

    def fail(self, message: str, error: type[Exception] = ShapeError):
        """Raise ``error`` with the op's name in front of ``message``."""
        raise error(f"{self.name}: {message}")

    @classmethod
    def apply(cls, *inputs, **attrs):
        """Run the op on tensors and record it in the graph when a gradient is needed."""
        backend = inputs[0].backend
        needs_grad = tuple([t.requires_grad for t in inputs])
        for t in inputs:
            if t.backend is not backend:
                devices = ", ".join(f"{x.device} {x.shape}" for x in inputs)
                raise DeviceError(f"{cls.name}: inputs are on different devices ({devices}); "
                                  f"move them with .to(device) first")
        op = cls(backend, **attrs)
        record = state.grad_enabled and True in needs_grad
        if record:
            op.needs_grad = needs_grad
        capture = state.capture
        if capture is not None:
            capture.enter_op(op, inputs)
        data = op.forward(*[t._data for t in inputs])
        if capture is not None:
            capture.leave_op()
        out = _output_type._make(data, backend, record)
        if getattr(data, "base", None) is not None:
            _share_version(out, inputs)
        if record:
            where = _user_frame() if state.anomaly else None
            out.node = Node(op, inputs, current_scope(), where, out._version.count)
        if capture is not None:
            capture.made_tensor(out)
        return out

    def attrs_text(self) -> str:
        """The attributes as ``key=value`` text, long values shortened (for graphs)."""
        return ", ".join(f"{k}={_short(v)}" for k, v in self.attrs.items())

    def __repr__(self) -> str:
        return f"{self.name}({self.attrs_text()})"


# What an op's attribute may not be called: it would hide these.
_OP_FIELDS = frozenset({name for name in dir(Op) if not name.startswith("__")}
                       | {"name", "backend", "attrs", "saved", "needs_grad", "freed"})


def _short(value) -> str:
    if isinstance(value, np.ndarray):
        return f"array{value.shape}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# The class of the tensors ops return.  tensor.py names it (``use_tensor_type``) when it
# defines Tensor, so this module imports nothing of the package: imports flow one way,
# tensor -> autograd.
_output_type: Any = None


def use_tensor_type(tensor_type) -> None:
    """Make ``Op.apply`` return ``tensor_type`` (it needs a ``_make(data, backend, record)``)."""
    global _output_type
    _output_type = tensor_type


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_frame(package_dirs: str | tuple = _PACKAGE_DIR) -> str:
    """The innermost stack frame outside this package (or ``package_dirs``): where the user
    made this node."""
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(package_dirs):
            return f"{frame.filename}:{frame.lineno}: {frame.line}"
    return "unknown"


def _counts(tensors: tuple) -> tuple:
    """The tensors' version counts.  Every recorded op and every backward step reads them,
    so the usual one and two inputs are spelled out: ~120 ns for two against ~270 for the
    loop (measured with the call)."""
    n = len(tensors)
    if n == 1:
        return (tensors[0]._version.count,)
    if n == 2:
        return (tensors[0]._version.count, tensors[1]._version.count)
    return tuple([t._version.count for t in tensors])


def _share_version(out, inputs) -> None:
    """``out``'s array is a view (a reshape, a slice): if it views an input's memory, the two
    share one version count, so a change through either is seen by graphs that saved the
    other."""
    owner = out._data.base
    for t in inputs:
        data = t._data
        if data is owner or getattr(data, "base", None) is owner:
            out._version = t._version
            return


class Node:
    """What ``viz`` and ``check`` read about how a tensor was made.

    Attributes:
        op: the Op instance (``op.name``, ``op.attrs``).
        inputs: the input tensors, in order.
        scope: the ``ta.scope`` path active when the op ran, e.g. ``"decoder/t2/attention"``.
        where: the creating line of user code (recorded only under ``detect_anomaly``).
        versions: the inputs' version counts when the op ran (``Tensor.version``), which
            ``backward`` checks: an op computes its gradient from the values it saw.
    """

    __slots__ = ("op", "inputs", "scope", "where", "versions", "out_version")

    def __init__(self, op: Op, inputs: tuple, scope: str, where: str | None = None,
                 out_version: int = 0):
        self.op = op
        self.inputs = inputs
        self.scope = scope
        self.where = where
        self.versions = _counts(inputs)
        self.out_version = out_version      # the output's count when made (a view shares one)

    @property
    def op_name(self) -> str:
        return self.op.name

    @property
    def attrs(self) -> dict:
        return self.op.attrs

    def __repr__(self) -> str:
        at = f" in {self.scope!r}" if self.scope else ""
        return f"Node({self.op!r}{at})"


# ---------------------------------------------------------------- registry

registry: dict[str, type[Op]] = {}


def register(cls: type[Op]) -> type[Op]:
    """Class decorator: add an Op subclass to the registry that ``ta.check.ops()`` walks."""
    if not (isinstance(cls, type) and issubclass(cls, Op)):
        raise TypeError(f"register: expected an Op subclass, got {cls!r}")
    for method in ("forward", "backward", "symbolic"):
        if getattr(cls, method) is getattr(Op, method):
            raise TypeError(f"register: {cls.__name__} does not define {method}()")
    existing = registry.get(cls.name)
    if existing is not None and existing.__qualname__ != cls.__qualname__:
        raise ValueError(f"register: an op named {cls.name!r} is already registered ({existing!r})")
    registry[cls.name] = cls
    return cls


# ---------------------------------------------------------------- backward


class DeferredGrad:
    """A gradient ``fn(*args, *extras)`` left unevaluated because ``fn`` adds over rows:
    fn(X_1 ++ X_2, Y_1 ++ Y_2) = fn(X_1, Y_1) + fn(X_2, Y_2), ++ stacking rows (axis 0).

    A weight's gradient dG^T x, a bias's column sums and an embedding's scatter-add of rows
    are such sums.  An unrolled RNN uses its weights once per time step, so backward would
    compute a small product per step and add them up; instead it stacks the rows every step
    gives and calls ``fn`` once, when the gradient is read: one GEMM over the whole sequence
    for each weight, as cuDNN's RNN backward does.  Ops return one from ``backward`` for
    such inputs; ``value()`` gives the array.

    The rows held wait for the weight's turn in backward, so once they outgrow the gradient
    itself (or 1M entries, whichever is more) they are summed into a partial result: a
    per-step output layer over a large vocabulary holds at most about one gradient's worth
    of rows, not every step's.

    ``stacks``: a dict shared by the gradients one backward call makes (a layer's weight's
    dG^T x and its bias's column sums of dG), so that rows both hold are stacked once: the
    second to be read takes the first's stacked array (a GRU's step stacks each dG once
    instead of twice, at (steps x batch, 3H) a copy of megabytes per layer and direction).

    ``fn``: a kernel of ``backend`` by name ("matmul_tn"), looked up when the gradient is
    computed, or a function.  Gradients of the same kind are told apart by that name, not by
    the kernel's identity: a device's table is rebuilt whenever a kernel is built on its first
    call, and during a capture that gives every kernel a new recording wrapper, so two steps'
    gradients would hold different objects for one kernel and never join (a fresh process
    whose first step was compiled summed per step, and the plan replayed that: other bits
    than eager's).
    """

    __slots__ = ("backend", "fn", "shape", "args", "extras", "held", "limit", "partial", "stacks")

    def __init__(self, backend, fn, shape: tuple, args: tuple, extras: tuple = (),
                 stacks: dict | None = None):
        # Lean: ops make one per weight and step.  What only a gradient that absorbs others
        # needs (the count of entries held, the limit) is set on its first absorb.
        self.backend, self.fn, self.shape, self.extras = backend, fn, shape, extras
        self.args = [[a] for a in args]
        self.held = -1
        self.partial = None
        self.stacks = stacks

    def absorb(self, other: DeferredGrad) -> bool:
        """Take ``other``'s rows, if it is a gradient of the same kind; False if not."""
        if (other.fn != self.fn or other.backend is not self.backend or other.extras != self.extras
                or other.shape != self.shape):
            return False
        if self.held < 0:
            self.held = sum(a.size for rows in self.args for a in rows)
            self.limit = max(math.prod(self.shape), 1 << 20)
        for mine, theirs in zip(self.args, other.args, strict=True):
            mine.extend(theirs)
            for a in theirs:
                self.held += a.size
        if other.partial is not None:
            self._add_partial(other.partial)
        if self.held > self.limit:
            self._add_partial(self._stacked())
            self.args = [[] for _ in self.args]
            self.held = 0
        return True

    def value(self):
        """The gradient, a new array."""
        if self.held == 0 and self.partial is not None:
            return self.partial
        result = self._stacked(share=True)
        return result if self.partial is None else self.backend.add_(self.partial, result)

    def _stacked(self, share: bool = False):
        """fn over the rows held; ``share``: through ``stacks`` (the final value only: a
        partial sum's rows are another gradient's only by chance, and kept for it they would
        undo the limit on rows held)."""
        fn = getattr(self.backend, self.fn) if type(self.fn) is str else self.fn
        return fn(*[self._rows(rows, share) for rows in self.args], *self.extras)

    def _rows(self, rows: list, share: bool):
        if len(rows) == 1:
            return rows[0]
        if not share or self.stacks is None:
            return self.backend.cat(rows, 0)
        key = tuple(map(id, rows))
        found = self.stacks.pop(key, None)        # a second reader takes it; none keeps it
        if found is not None:
            return found[1]
        stacked = self.backend.cat(rows, 0)
        # The entry keeps the rows alive, so no other array can take their ids meanwhile.
        self.stacks[key] = (tuple(rows), stacked)
        return stacked

    def _add_partial(self, array) -> None:
        # The first partial is fn's own new array, so later ones add into it in place.
        self.partial = array if self.partial is None else self.backend.add_(self.partial, array)


def _accumulate(grads: dict, owned: set, key: int, gi, backend) -> None:
    """Add gradient ``gi`` into ``grads[key]`` (which exists)."""
    prev = grads[key]
    deferred = type(gi) is DeferredGrad
    if deferred and type(prev) is DeferredGrad and prev.absorb(gi):
        return
    if deferred:
        gi = gi.value()
    if type(prev) is DeferredGrad:
        prev = prev.value()           # a new array: owned from here on
        grads[key] = backend.add_(prev, gi)
        owned.add(key)
    elif key in owned:
        grads[key] = backend.add_(prev, gi)
    else:
        grads[key] = backend.add(prev, gi)
        owned.add(key)


def toposort(root, only_grad: bool = True, stop=()) -> list:
    """Tensors that lead to ``root`` (a tensor, or a list of them), root first, each after
    every tensor made from it.

    ``only_grad`` follows only inputs that require grad (what backward needs); False
    follows every input, constants included (what a drawing of the graph needs).  ``stop``:
    ids of tensors listed but not looked behind (an exporter's graph inputs).
    Iterative depth-first search: deep graphs (long unrolled RNNs) need no recursion.
    """
    roots = root if isinstance(root, (list, tuple)) else [root]
    order: list = []
    visited: set[int] = set()
    stack = [(t, False) for t in reversed(roots)]
    while stack:
        t, expanded = stack.pop()
        if expanded:
            order.append(t)
            continue
        if id(t) in visited:
            continue
        visited.add(id(t))
        stack.append((t, True))
        if t.node is not None and id(t) not in stop:
            for inp in reversed(t.node.inputs):  # reversed: inputs come out in argument order
                if (inp.requires_grad or not only_grad) and id(inp) not in visited:
                    stack.append((inp, False))
    order.reverse()
    return order


def backward(root, grad=None, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into ``leaf.grad`` for every leaf that requires grad.

    ``grad`` is the upstream gradient (same shape as root); it may be omitted only for a
    tensor with one element.  Saved buffers are freed unless ``retain_graph`` is True.

    All or nothing: the gradients are written into ``.grad`` only once the whole pass has
    succeeded, so a backward that fails (a freed graph, an anomaly) leaves every ``.grad``
    as it was (the saved buffers of the ops it got through are freed all the same).
    """
    if not root.requires_grad:
        raise RuntimeError(
            f"backward(): tensor of shape {root.shape} does not require grad; create the "
            f"leaves with requires_grad=True (and not inside no_grad())"
        )
    if grad is None:
        if root.size != 1:
            raise RuntimeError(
                f"backward(): tensor of shape {root.shape} is not a scalar; pass grad= of the "
                f"same shape (or reduce it first, e.g. loss.sum())"
            )
        grad_data = root.backend.full(root.shape, 1.0, root.dtype)
    else:
        # While capturing, .data would refuse: read the array itself (nothing is handed out).
        given = grad._data if state.capture is not None and isinstance(grad, _output_type) else \
            getattr(grad, "data", grad)
        grad_data = root.backend.asarray(given, root.dtype)
        if tuple(grad_data.shape) != root.shape:
            raise ShapeError(f"backward(): grad has shape {tuple(grad_data.shape)} "
                             f"but the tensor has shape {root.shape}")

    grads: dict[int, Any] = {id(root): grad_data}
    # Keys whose gradient buffer backward allocated itself (the result of a sum): later
    # gradients are added into it in place.  A buffer an op returned may be shared (Add
    # hands the same dy to both inputs), so the first sum always makes a new one.
    owned: set[int] = set()
    anomaly = state.anomaly
    capture = state.capture
    finished: list[tuple[Any, Any]] = []          # (tensor, its gradient), written at the end
    order = toposort(root)
    # A compiled step with fusion: chains of formula ops whose backward is their composed
    # derivative, run at the chain's root (compiler/fuse_backward.py); its other members
    # then receive no gradient and are never visited.
    chains = capture.backward_chains(order) if capture is not None else None
    for t in order:
        g = grads.pop(id(t), None)
        if g is None:
            continue
        if type(g) is DeferredGrad:
            g = g.value()
        node = t.node
        if node is None or t._retains_grad:
            finished.append((t, g))
        if node is None:
            continue
        op = node.op
        if op.freed:
            raise RuntimeError(
                f"backward(): the saved buffers of {op.name}"
                f"{' in ' + repr(node.scope) if node.scope else ''} were freed by an earlier "
                f"backward(); pass retain_graph=True to the first call to backward twice"
            )
        if node.versions != _counts(node.inputs) or \
                t._version.count != node.out_version:
            _changed_in_place(t, node)
        chain = chains.get(id(node)) if chains else None
        inputs = node.inputs
        if chain is None:
            if capture is not None:
                capture.backward_of(node)
            input_grads = op.backward(g)
        else:
            for member in chain.nodes[:-1]:
                if member.versions != _counts(member.inputs):
                    _changed_in_place(t, member)
            capture.backward_of(node, chain)
            inputs, input_grads = chain.inputs, chain.backward(g)
        if len(input_grads) != len(inputs):
            raise RuntimeError(f"{op.name}.backward returned {len(input_grads)} gradients "
                               f"for {len(inputs)} inputs")
        if anomaly:
            _check_finite(node, input_grads)
        for inp, gi in zip(inputs, input_grads, strict=True):
            if gi is None or not inp.requires_grad:
                continue
            if gi.shape != inp._data.shape:
                raise RuntimeError(f"{op.name}.backward returned a gradient of shape "
                                   f"{tuple(gi.shape)} for an input of shape {inp.shape}")
            key = id(inp)
            if key not in grads:
                grads[key] = gi
            else:
                _accumulate(grads, owned, key, gi, op.backend)
        if not retain_graph:
            for done in (node,) if chain is None else chain.nodes:
                done.op.saved = ()
                done.op.freed = True
    if capture is not None:
        capture.backward_done(retain_graph)
    for t, g in finished:
        t._accumulate_grad(g)


def _changed_in_place(t, node: Node):
    """Name what changed in place since ``node``'s op ran: an input, or its output ``t``."""
    for k, (inp, seen) in enumerate(zip(node.inputs, node.versions, strict=True)):
        if inp._version.count != seen:
            _changed(node, f"input {k} ({_describe(inp)})", seen, inp._version.count)
    _changed(node, f"its output ({_describe(t)})", node.out_version, t._version.count)


def _describe(t) -> str:
    label = f"{t.name!r}, " if t.name else ""
    return f"{label}shape {t.shape}"


def _changed(node: Node, what: str, seen: int, now: int):
    at = f" in {node.scope!r}" if node.scope else ""
    raise RuntimeError(
        f"backward(): {what} of {node.op.name}{at} was changed in place after {node.op.name} "
        f"ran (version {seen}, now {now}), so its gradient would come from values it never "
        f"saw. Change tensors only after backward() (an optimizer step does), or run the "
        f"forward pass again; note that handing out .data counts as a change, .numpy() reads "
        f"for free"
    )


def _check_finite(node: Node, input_grads) -> None:
    for k, gi in enumerate(input_grads):
        if gi is None:
            continue
        values = node.op.backend.to_numpy(gi.value() if type(gi) is DeferredGrad else gi)
        if np.all(np.isfinite(values)):
            continue
        kind = "NaN" if np.isnan(values).any() else "inf"
        at = f" in scope {node.scope!r}" if node.scope else ""
        where = f"; the op was created at {node.where}" if node.where else ""
        raise RuntimeError(
            f"detect_anomaly: backward of {node.op!r}{at} produced {kind} in the gradient of "
            f"input {k} (shape {tuple(values.shape)}){where}"
        )
