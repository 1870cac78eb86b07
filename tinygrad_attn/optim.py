"""Optimizers: SGD and Adam with PyTorch's update formulas, updating parameters in place.

    opt = optim.Adam(model.parameters(), lr=1e-3)
    schedule = optim.WarmupCosine(opt, warmup=500, total=10_000)   # or ReduceLROnPlateau(opt)
    for src, tgt_in, tgt_out in batches:
        opt.zero_grad()
        logits, _ = model(src, tgt_in)                            # (B, T, V)
        ta.functional.cross_entropy(logits, tgt_out, ignore_index=0).backward()
        opt.step()
        schedule.step()

``step()`` is one in-place kernel call per parameter on the parameter's device
(``backend.adam_`` / ``backend.sgd_``, compiler/reference/optim.py; on "cpu" Adam is one fused
Numba pass, bit for bit the numpy ufuncs'), so it builds no graph nodes and keeps each
parameter's dtype (float32 parameters get float32 state).  Everything that changes from step
to step lives in arrays the kernels read: each parameter's update count (``state["step"]``,
a 0-d int64 array the kernel increments) and the hyperparameters (a float64 vector the
optimizer owns: setting ``opt.lr``, ``opt.betas``... writes it in place).  A recorded
``adam_`` call replayed later therefore uses the current step and learning rate.

The state lives on the parameter's device ("cuda" included: no host round trip) and follows
a change of the parameter's dtype or device (``model.double()``, ``model.to(...)``).
``state_dict()`` copies it to numpy with the step as a Python int, the form checkpoints
have always had.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

import numpy as np

from .arguments import check_flag, check_int, check_number
from .autograd import DeviceError, DTypeError, ShapeError, enable_grad, outside_capture
from .tensor import Tensor

__all__ = ["Optimizer", "SGD", "Adam", "WarmupCosine", "ReduceLROnPlateau"]


def _collect_parameters(owner: str, params) -> list[Tensor]:
    """The parameters as a list, with clear errors for the usual mistakes."""
    if isinstance(params, Tensor):
        raise TypeError(f"{owner}: params must be an iterable of Parameters (e.g. "
                        f"model.parameters()), got a single Tensor of shape {params.shape}; "
                        f"wrap it in a list")
    if hasattr(params, "named_parameters"):
        raise TypeError(f"{owner}: got the module {type(params).__name__} itself; pass "
                        f"model.parameters()")
    if isinstance(params, (str, bytes, dict)) or not isinstance(params, Iterable):
        raise TypeError(f"{owner}: params must be an iterable of Parameters (e.g. "
                        f"model.parameters()), got {type(params).__name__}")
    collected = list(params)
    if not collected:
        raise ValueError(f"{owner}: got an empty parameter list (a model without parameters, "
                         f"or a generator that was already used up?)")
    seen: set[int] = set()
    for index, p in enumerate(collected):
        if not isinstance(p, Tensor):
            raise TypeError(f"{owner}: params[{index}] is a {type(p).__name__}, not a "
                            f"Parameter or Tensor")
        if p.dtype.kind != "f":
            raise DTypeError(f"{owner}: params[{index}] has dtype {p.dtype} (shape {p.shape}); "
                             f"only float tensors can be optimized")
        if not p.is_leaf:
            raise ValueError(f"{owner}: params[{index}] (shape {p.shape}) was made by "
                             f"{p.node.op_name}; only leaf tensors can be optimized")
        if id(p) in seen:
            raise ValueError(f"{owner}: params[{index}] (shape {p.shape}) appears more than "
                             f"once; it would be updated twice per step")
        seen.add(id(p))
    return collected


class _Hyper:
    """A setting stored in the optimizer's float64 vector that the update kernels read
    (``Optimizer.hyper_names`` gives its place); assigning it writes the vector in place."""

    def __init__(self, name: str, flag: bool = False):
        self.name, self.flag = name, flag

    def __get__(self, optimizer, owner=None):
        if optimizer is None:
            return self
        value = float(optimizer._hyper[optimizer.hyper_names.index(self.name)])
        return value != 0.0 if self.flag else value

    def __set__(self, optimizer, value) -> None:
        optimizer._write_hyper(self.name, value)


class Optimizer(ABC):
    """Base of the optimizers: the parameters, the hyperparameters and per-parameter state.

    A subclass names its settings in ``hyper_names`` (the layout of the float64 vector its
    kernel reads; "lr" first), its per-parameter arrays in ``state_arrays``, saves and
    restores its settings through ``hyperparameters``/``_set_hyperparameters``, and
    implements ``_update(backend, param, grad, state, extras)`` as kernel calls on the
    parameter's device.  The base class skips parameters without a gradient and handles
    devices, dtypes and checkpoints.

    Args:
        params: an iterable of Parameters (or leaf float Tensors), e.g. ``model.parameters()``.
        lr: the learning rate (>= 0); may be changed between steps (``opt.lr = 1e-4``).
    """

    hyper_names: tuple[str, ...] = ("lr",)
    state_arrays: tuple[str, ...] = ()

    def __init__(self, params, lr: float):
        self.params: list[Tensor] = _collect_parameters(type(self).__name__, params)
        # The settings the kernels read, written in place so that a recorded call sees a
        # new lr; a copy per device that cannot read host memory (_hyper_on).
        self._hyper = np.zeros(len(self.hyper_names), np.float64)
        self._device_hyper: dict[str, object] = {}
        self.lr = lr
        # Per parameter, None until its first update: {"step": 0-d int64 array, name: array
        # or None}, on the parameter's device.
        self.state: list[dict | None] = [None] * len(self.params)
        # (dtype, backend, extras) per parameter: what the state was last made for, and
        # arrays a kernel needs that are not state (never saved; remade with the state).
        self._extras: list[tuple | None] = [None] * len(self.params)

    @property
    def lr(self) -> float:
        return float(self._hyper[0])

    @lr.setter
    def lr(self, value) -> None:
        self._write_hyper("lr", check_number(value, "lr", type(self).__name__, low=0.0))

    def _write_hyper(self, name: str, value) -> None:
        self._hyper[self.hyper_names.index(name)] = float(value)
        for array in self._device_hyper.values():
            if array is not self._hyper:
                array.copy_to_device(self._hyper)

    def _hyper_on(self, backend):
        array = self._device_hyper.get(backend.name)
        if array is None:
            # The host devices take the vector itself; "cuda" a device copy kept in step.
            with outside_capture():
                array = self._device_hyper[backend.name] = backend.asarray(self._hyper, np.float64)
        return array

    def hyperparameters(self) -> dict:
        """The settings ``state_dict`` saves, by constructor argument name."""
        return {"lr": self.lr}

    def branches(self) -> tuple:
        """The settings that choose which kernels ``step`` calls (not only what they read):
        a compiled step replays its recorded calls only while these are unchanged.  The
        settings the kernels read (lr, betas, ...) may change freely."""
        return ()

    def _set_hyperparameters(self, lr) -> None:
        self.lr = lr

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient: drop it (the default, as PyTorch), or replace
        it by zeros (a fresh array from the device's ``zeros`` kernel)."""
        for p in self.params:
            grad = p.grad
            if grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                grad._version.count += 1            # as assigning ``.data`` counts
                grad._data = grad.backend.zeros(grad.shape, grad.dtype)

    def step(self, closure: Callable | None = None):
        """Update every parameter that has a gradient, in place.  A parameter whose
        ``.grad`` is None is skipped, and its state does not advance.

        Args:
            closure: optional function that recomputes the loss (with gradients enabled)
                before the update.

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        for index, p in enumerate(self.params):
            grad = p.grad
            if grad is None:
                continue
            param, g = p._data, grad._data
            if tuple(g.shape) != tuple(param.shape):
                raise ShapeError(f"{type(self).__name__}.step: params[{index}] has shape "
                                 f"{tuple(param.shape)} but its gradient has shape {tuple(g.shape)}")
            backend = p.backend
            if grad.backend is not backend:
                raise DeviceError(f"{type(self).__name__}.step: params[{index}] is on "
                                  f"{backend.name!r} but its gradient is on {grad.backend.name!r}")
            # The kernel writes the parameter in place: its version counts the change, as
            # handing out ``.data`` did (a graph that saved it refuses backward), and the
            # gradient's as before.
            p._version.count += 1
            grad._version.count += 1
            # State is made (or moved) once, not at every step: a compiled step binds it.
            with outside_capture():
                prepared = self._extras[index]
                # ``dtype == None`` is True in numpy: the None that load_state_dict leaves is
                # tested by identity.
                if prepared is None or prepared[0] is None or prepared[0] != param.dtype or \
                        prepared[1] is not backend:
                    prepared = self._prepare(index, p)
                state = self.state[index]
                if state is None:
                    state = self.state[index] = self._init_state(p)
            self._update(backend, param, g, state, prepared[2])
        return loss

    def _prepare(self, index: int, p: Tensor) -> tuple:
        """Move existing state to the parameter's device and dtype (``model.double()``,
        ``model.to(...)``) and make the extras."""
        state, backend = self.state[index], p.backend
        previous = self._extras[index]
        home = previous[1] if previous is not None else backend
        if state is not None:
            for name in ("step", *self.state_arrays):
                array = state[name]
                if array is None:
                    continue
                dtype = np.int64 if name == "step" else p.dtype
                if home is not backend:
                    array = backend.asarray(np.array(home.to_numpy(array), copy=True), dtype)
                elif array.dtype != dtype:
                    array = backend.astype(array, dtype)
                state[name] = array
        prepared = (p.dtype, backend, self._make_extras(backend, state))
        self._extras[index] = prepared
        return prepared

    def _make_extras(self, backend, state: dict | None) -> tuple:
        return ()

    def _init_state(self, p: Tensor) -> dict:
        backend = p.backend
        return {"step": backend.zeros((), np.int64),
                **{name: backend.zeros(p.shape, p.dtype) for name in self.state_arrays}}

    @abstractmethod
    def _update(self, backend, param, grad, state: dict, extras: tuple) -> None:
        """Update ``param`` in place from ``grad`` and ``state`` (this parameter's, updated
        in place), raw arrays on ``backend``, by kernel calls that read every setting from
        ``self._hyper_on(backend)``; every optimizer defines it."""

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        """The hyperparameters and a copy of every parameter's state, as plain values and
        numpy arrays (``ta.save`` writes it as it is); each step is a Python int.

        Returns:
            ``{"optimizer": class name, "hyperparameters": {...}, "state": [a dict, or None
            before the parameter's first update, per parameter in order]}``.

        Example:
            >>> ta.save({"model": model, "optimizer": opt.state_dict()}, "ckpt.npz")
        """
        state = []
        for index, entry in enumerate(self.state):
            if entry is None:
                state.append(None)
                continue
            prepared = self._extras[index]
            home = prepared[1] if prepared is not None else self.params[index].backend
            saved = {}
            for key, value in entry.items():
                if value is None:
                    saved[key] = None
                elif key == "step":
                    saved[key] = int(np.asarray(home.to_numpy(value)))
                else:
                    saved[key] = np.array(home.to_numpy(value), copy=True)
            state.append(saved)
        return {"optimizer": type(self).__name__, "hyperparameters": self.hyperparameters(),
                "state": state}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the hyperparameters (lr included) and state that ``state_dict`` saved, so
        training resumes exactly.  Everything is checked before anything changes.

        Args:
            state_dict: from ``state_dict()``, possibly through ``ta.save``/``ta.load``; this
                optimizer must hold parameters of the same shapes in the same order.  The
                step may be an int or a 0-d array.

        Example:
            >>> opt.load_state_dict(ta.load("ckpt.npz")["optimizer"])
        """
        owner = f"{type(self).__name__}.load_state_dict"
        keys = ("optimizer", "hyperparameters", "state")
        if not isinstance(state_dict, dict) or any(key not in state_dict for key in keys):
            found = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"{owner}: expected a dict with keys {list(keys)} (from "
                             f"state_dict()), got {found}")
        if state_dict["optimizer"] != type(self).__name__:
            raise ValueError(f"{owner}: the state is from {state_dict['optimizer']!r}, this "
                             f"optimizer is {type(self).__name__!r}")
        saved = list(state_dict["state"])
        if len(saved) != len(self.params):
            raise ValueError(f"{owner}: the state has {len(saved)} parameters, this optimizer "
                             f"holds {len(self.params)}")
        settings = dict(state_dict["hyperparameters"])
        if set(settings) != set(self.hyperparameters()):
            raise ValueError(f"{owner}: hyperparameters {sorted(settings)} do not match "
                             f"{sorted(self.hyperparameters())}")
        restored = [self._restore_entry(owner, index, p, entry)
                    for index, (p, entry) in enumerate(zip(self.params, saved, strict=True))]
        previous = self.hyperparameters()
        try:
            self._set_hyperparameters(**settings)
        except (TypeError, ValueError):
            self._set_hyperparameters(**previous)
            raise
        self.state = [None if entry is None else
                      {key: None if value is None else p.backend.asarray(value, value.dtype)
                       for key, value in entry.items()}
                      for p, entry in zip(self.params, restored, strict=True)]
        # Where the state now is; the dtype None has the extras remade at the next step.
        self._extras = [(None, p.backend, ()) for p in self.params]

    def _restore_entry(self, owner: str, index: int, p: Tensor, entry) -> dict | None:
        """The saved entry checked, as host arrays (the step a 0-d int64 array)."""
        if entry is None:
            return None
        expected = {"step", *self.state_arrays}
        if not isinstance(entry, dict) or set(entry) != expected:
            found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise ValueError(f"{owner}: state[{index}] should have keys {sorted(expected)}, "
                             f"got {found}")
        restored = {"step": np.array(int(entry["step"]), dtype=np.int64)}
        for name in self.state_arrays:
            value = entry[name]
            if value is None:
                restored[name] = None
                continue
            array = np.array(value, dtype=p.dtype, copy=True, order="C")
            if array.shape != p.shape:
                raise ShapeError(f"{owner}: state[{index}][{name!r}] has shape {array.shape}, "
                                 f"params[{index}] has shape {p.shape}")
            restored[name] = array
        return restored

    def __repr__(self) -> str:
        settings = ", ".join(f"{key}={value}" for key, value in self.hyperparameters().items())
        return f"{type(self).__name__}({len(self.params)} parameters, {settings})"


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, as ``torch.optim.SGD``:
    g = grad + wd*p;  b = mu*b + (1 - dampening)*g (b = g at first);
    g = g + mu*b if nesterov else b;  p = p - lr*g.

    Args:
        params: an iterable of Parameters, e.g. ``model.parameters()``.
        lr: learning rate (>= 0).
        momentum: momentum factor mu (>= 0; 0 keeps no buffer).
        dampening: dampening of the gradient's share of the momentum.
        weight_decay: L2 penalty added to the gradient (>= 0).
        nesterov: Nesterov momentum (needs momentum > 0 and dampening 0).

    Example:
        >>> opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    hyper_names = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
    state_arrays = ("momentum_buffer",)
    momentum = _Hyper("momentum")
    dampening = _Hyper("dampening")
    weight_decay = _Hyper("weight_decay")
    nesterov = _Hyper("nesterov", flag=True)

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr)
        self._set_hyperparameters(lr, momentum, dampening, weight_decay, nesterov)

    def hyperparameters(self) -> dict:
        return {"lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov}

    def _set_hyperparameters(self, lr, momentum, dampening, weight_decay, nesterov) -> None:
        momentum = check_number(momentum, "momentum", "SGD", low=0.0)
        dampening = check_number(dampening, "dampening", "SGD")
        weight_decay = check_number(weight_decay, "weight_decay", "SGD", low=0.0)
        nesterov = check_flag(nesterov, "nesterov", "SGD")
        if nesterov and (momentum == 0.0 or dampening != 0.0):
            raise ValueError(f"SGD: Nesterov momentum needs momentum > 0 and dampening 0, got "
                             f"momentum={momentum}, dampening={dampening}")
        self.lr = lr
        self.momentum, self.dampening = momentum, dampening
        self.weight_decay, self.nesterov = weight_decay, bool(nesterov)

    def branches(self) -> tuple:
        # With momentum on, a parameter without a buffer gets one at its next update.
        return (self.momentum != 0.0,)

    def _init_state(self, p: Tensor) -> dict:
        # No buffer without momentum; torch's buffer starts as the first gradient, which the
        # kernel copies in while ``started`` (an extra) is 0.
        backend = p.backend
        buffer = backend.zeros(p.shape, p.dtype) if self.momentum != 0.0 else None
        return {"step": backend.zeros((), np.int64), "momentum_buffer": buffer}

    def _make_extras(self, backend, state: dict | None) -> tuple:
        started = state is not None and state["momentum_buffer"] is not None
        return (backend.asarray(np.array(int(started), dtype=np.int64), np.int64),)

    def _update(self, backend, param, grad, state, extras) -> None:
        (started,) = extras
        if self.momentum != 0.0 and state["momentum_buffer"] is None:
            # Momentum switched on after the first update: a fresh buffer, as torch's.
            with outside_capture():
                state["momentum_buffer"] = backend.zeros(param.shape, param.dtype)
        backend.sgd_(param, grad, state["momentum_buffer"], state["step"], started,
                     self._hyper_on(backend))


class Adam(Optimizer):
    """Adam, as ``torch.optim.Adam`` (not amsgrad): g = grad + wd*p;
    m = lerp(m, g, 1 - beta1);  v = beta2*v + (1 - beta2)*g*g;
    p = p - lr/(1 - beta1^t) * m / (sqrt(v)/sqrt(1 - beta2^t) + eps).

    Args:
        params: an iterable of Parameters, e.g. ``model.parameters()``.
        lr: learning rate (>= 0).
        betas: decay rates (beta1, beta2) of the gradient's running mean and of its
            square's, each in [0, 1).
        eps: added to the denominator for stability (>= 0).
        weight_decay: L2 penalty added to the gradient (>= 0; not AdamW's decoupled decay).

    Example:
        >>> opt = optim.Adam(model.parameters(), lr=1e-3)
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    hyper_names = ("lr", "beta1", "beta2", "eps", "weight_decay")
    state_arrays = ("exp_avg", "exp_avg_sq")
    eps = _Hyper("eps")
    weight_decay = _Hyper("weight_decay")

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self._set_hyperparameters(lr, betas, eps, weight_decay)

    @property
    def betas(self) -> tuple[float, float]:
        return float(self._hyper[1]), float(self._hyper[2])

    @betas.setter
    def betas(self, value) -> None:
        self._write_hyper("beta1", value[0])
        self._write_hyper("beta2", value[1])

    def hyperparameters(self) -> dict:
        return {"lr": self.lr, "betas": self.betas, "eps": self.eps,
                "weight_decay": self.weight_decay}

    def _set_hyperparameters(self, lr, betas, eps, weight_decay) -> None:
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise TypeError(f"Adam: betas must be a pair (beta1, beta2), got {betas!r}")
        beta1 = check_number(betas[0], "betas[0]", "Adam", low=0.0, high=1.0, high_open=True)
        beta2 = check_number(betas[1], "betas[1]", "Adam", low=0.0, high=1.0, high_open=True)
        eps = check_number(eps, "eps", "Adam", low=0.0)
        weight_decay = check_number(weight_decay, "weight_decay", "Adam", low=0.0)
        self.lr = lr
        self.betas = (beta1, beta2)
        self.eps, self.weight_decay = eps, weight_decay

    def _update(self, backend, param, grad, state, extras) -> None:
        # One kernel (compiler/reference/optim.py; one fused Numba pass on "cpu"): the step
        # count and lr come from arrays, the bias corrections are derived from them in double
        # as torch does, and the result is bit for bit the ufunc sequence torch's formulas spell.
        backend.adam_(param, grad, state["exp_avg"], state["exp_avg_sq"], state["step"],
                      self._hyper_on(backend))



# ---------------------------------------------------------------- learning-rate schedules


class WarmupCosine:
    """Linear warm-up, then cosine decay: the learning rate after ``step`` optimizer steps is

        base * step / warmup                                          while step < warmup
        final + (base - final) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2

    and ``final`` from ``total`` on, with ``final = base * final_ratio``.  Warm-up keeps
    Adam's first, badly estimated steps small (Vaswani et al. 2017 warm up too); the cosine
    spends most steps near the base rate and ends slow.  The rate is a pure function of the
    step, so ``state_dict`` holds only the step.

    Args:
        optimizer: its ``lr`` is set on every ``step()``; its ``lr`` at construction is ``base``.
        warmup: steps of linear warm-up (0: none).
        total: the step at which the decay ends (the run's total steps).
        final_ratio: the last rate as a share of ``base``, in [0, 1].

    Example:
        >>> schedule = optim.WarmupCosine(opt, warmup=500, total=20_000)
        >>> loss.backward(); opt.step(); schedule.step()
    """

    def __init__(self, optimizer: Optimizer, warmup: int, total: int, final_ratio: float = 0.0):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"WarmupCosine: expected an Optimizer, got {type(optimizer).__name__}")
        warmup = check_int(warmup, "warmup", "WarmupCosine", 0)
        total = check_int(total, "total", "WarmupCosine", max(warmup, 1))
        self.final_ratio = check_number(final_ratio, "final_ratio", "WarmupCosine", low=0.0, high=1.0)
        self.optimizer, self.base, self.warmup, self.total = optimizer, optimizer.lr, warmup, total
        self.last_step = 0
        optimizer.lr = self.rate(0)

    def rate(self, step: int) -> float:
        """The learning rate for the update after ``step`` updates."""
        if step < self.warmup:
            return self.base * (step + 1) / self.warmup
        final = self.base * self.final_ratio
        span = self.total - self.warmup
        progress = min((step - self.warmup) / span, 1.0) if span > 0 else 1.0
        return final + (self.base - final) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def step(self) -> None:
        """Call after each ``optimizer.step()``: sets the rate of the next update."""
        self.last_step += 1
        self.optimizer.lr = self.rate(self.last_step)

    def state_dict(self) -> dict:
        return {"schedule": "WarmupCosine", "base": self.base, "warmup": self.warmup,
                "total": self.total, "final_ratio": self.final_ratio, "last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        _check_schedule_state(self, state, ("base", "warmup", "total", "final_ratio", "last_step"))
        self.base, self.warmup, self.total = float(state["base"]), int(state["warmup"]), int(state["total"])
        self.final_ratio, self.last_step = float(state["final_ratio"]), int(state["last_step"])
        self.optimizer.lr = self.rate(self.last_step)


class ReduceLROnPlateau:
    """Multiply the learning rate by ``factor`` when a validation score has not improved for
    ``patience`` evaluations, as ``torch.optim.lr_scheduler.ReduceLROnPlateau`` (relative
    threshold, no cooldown).

    Args:
        optimizer: the optimizer whose ``lr`` is lowered.
        mode: "max" (a score such as exact match) or "min" (a loss).
        factor: in (0, 1).  patience: evaluations without improvement before lowering.
        threshold: an improvement must beat the best by this share of it.
        min_lr: the rate never goes below this.

    Example:
        >>> plateau = optim.ReduceLROnPlateau(opt, mode="max", patience=2)
        >>> plateau.step(valid_exact_match)          # after each evaluation
    """

    def __init__(self, optimizer: Optimizer, mode: str = "max", factor: float = 0.5, patience: int = 2,
                 threshold: float = 1e-4, min_lr: float = 0.0):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"ReduceLROnPlateau: expected an Optimizer, got {type(optimizer).__name__}")
        if mode not in ("max", "min"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'max' or 'min', got {mode!r}")
        factor = check_number(factor, "factor", "ReduceLROnPlateau", low=0.0, high=1.0, low_open=True,
                              high_open=True)
        patience = check_int(patience, "patience", "ReduceLROnPlateau", 0)
        self.optimizer, self.mode, self.factor, self.patience = optimizer, mode, float(factor), patience
        self.threshold = check_number(threshold, "threshold", "ReduceLROnPlateau", low=0.0)
        self.min_lr = check_number(min_lr, "min_lr", "ReduceLROnPlateau", low=0.0)
        self.best: float | None = None
        self.bad_evaluations = 0

    def improved(self, score: float) -> bool:
        if self.best is None:
            return True
        if self.mode == "max":
            return score > self.best + abs(self.best) * self.threshold
        return score < self.best - abs(self.best) * self.threshold

    def step(self, score: float) -> None:
        """Report one evaluation's score; lowers the rate after ``patience`` bad ones."""
        score = float(score)
        if self.improved(score):
            self.best, self.bad_evaluations = score, 0
            return
        self.bad_evaluations += 1
        if self.bad_evaluations > self.patience:
            self.optimizer.lr = max(self.optimizer.lr * self.factor, self.min_lr)
            self.bad_evaluations = 0

    def state_dict(self) -> dict:
        return {"schedule": "ReduceLROnPlateau", "best": self.best, "bad_evaluations": self.bad_evaluations}

    def load_state_dict(self, state: dict) -> None:
        _check_schedule_state(self, state, ("best", "bad_evaluations"))
        self.best = None if state["best"] is None else float(state["best"])
        self.bad_evaluations = int(state["bad_evaluations"])


def _check_schedule_state(schedule, state, keys: tuple[str, ...]) -> None:
    name = type(schedule).__name__
    if not isinstance(state, dict) or state.get("schedule") != name or any(key not in state for key in keys):
        raise ValueError(f"{name}.load_state_dict: expected the dict {name}.state_dict() returns "
                         f"(keys {['schedule', *keys]}), got {state!r:.120}")
