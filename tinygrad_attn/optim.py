"""Optimizers: SGD and Adam with PyTorch's update formulas, updating parameters in place.

    opt = optim.Adam(model.parameters(), lr=1e-3)
    schedule = optim.WarmupCosine(opt, warmup=500, total=10_000)   # or ReduceLROnPlateau(opt)
    for src, tgt_in, tgt_out in batches:
        opt.zero_grad()
        logits, _ = model(src, tgt_in)                            # (B, T, V)
        ta.functional.cross_entropy(logits, tgt_out, ignore_index=0).backward()
        opt.step()
        schedule.step()

``step()`` works on the raw arrays (``p.data``, ``p.grad.data``) in place (SGD with numpy
ufuncs into preallocated buffers; Adam in one fused Numba pass per parameter, bit for bit the
ufuncs' result), so it builds no graph nodes, allocates nothing after a parameter's first
update, and keeps each parameter's dtype (float32 parameters get float32 state).
``p.data`` is read afresh every step, so ``load_state_dict`` or ``astype`` on the model
(which replace the arrays) are seen; state follows a dtype change.

Parameters on the "cuda" device take a host round trip each step: the parameter and its
gradient are copied to the host, updated there by the same code (the optimizer state
lives on the host), and the result is copied back into the same device array.  Correct and
simple, at the cost of three transfers per parameter per step; a fused numba.cuda kernel
would avoid them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

import numpy as np

from .arguments import check_number
from .autograd import DTypeError, ShapeError, enable_grad
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


# The fused update kernels, imported on first use, not with the package: importing
# compiler.cpu starts Numba's OpenMP pool, and a program that imports torch after the engine
# then runs torch beside a second OpenMP runtime (its training step took 300 ms instead of 46;
# compiler/numba_support.py).
_kernels: dict = {}


def _load_adam():
    from .compiler.cpu.optim import adam

    _kernels["adam"] = adam
    return adam


class Optimizer(ABC):
    """Base of the optimizers: the parameters, the learning rate and per-parameter state.

    A subclass names its per-parameter arrays in ``state_arrays``, saves and restores its
    settings through ``hyperparameters``/``_set_hyperparameters``, and implements
    ``_update(param, grad, state, scratch)`` on host numpy arrays.  The base class skips
    parameters without a gradient and handles devices, dtypes and checkpoints.

    Args:
        params: an iterable of Parameters (or leaf float Tensors), e.g. ``model.parameters()``.
        lr: the learning rate (>= 0); may be changed between steps (``opt.lr = 1e-4``).
    """

    state_arrays: tuple[str, ...] = ()
    scratch_arrays = 2          # work buffers shaped like a parameter that ``_update`` gets

    def __init__(self, params, lr: float):
        self.params: list[Tensor] = _collect_parameters(type(self).__name__, params)
        self.lr = lr
        # Per parameter, None until its first update: {"step": int, name: array or None}.
        self.state: list[dict | None] = [None] * len(self.params)
        # (dtype, work buffers), not state: never saved, remade when a parameter changes dtype.
        self._scratch: list[tuple | None] = [None] * len(self.params)

    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value) -> None:
        self._lr = check_number(value, "lr", type(self).__name__, low=0.0)

    def hyperparameters(self) -> dict:
        """The settings ``state_dict`` saves, by constructor argument name."""
        return {"lr": self.lr}

    def _set_hyperparameters(self, lr) -> None:
        self.lr = lr

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient: drop it (the default, as PyTorch), or zero it."""
        for p in self.params:
            grad = p.grad
            if grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                grad.data = grad.backend.zeros(grad.shape, grad.dtype)

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
            data = grad.data
            g = data if type(data) is np.ndarray else grad.backend.to_numpy(data)
            data = p.data
            on_host = type(data) is np.ndarray
            param = data if on_host else p.backend.to_numpy(data)
            if g.shape != param.shape:
                raise ShapeError(f"{type(self).__name__}.step: params[{index}] has shape "
                                 f"{param.shape} but its gradient has shape {g.shape}")
            prepared = self._scratch[index]
            if prepared is None or prepared[0] != param.dtype:
                prepared = self._prepare(index, param)
            state = self.state[index]
            if state is None:
                state = self.state[index] = self._init_state(param)
            self._update(param, g, state, prepared[1])
            if not on_host:
                self._write_back(index, data, param)
        return loss

    def _write_back(self, index: int, device_array, host: np.ndarray) -> None:
        copy_to_device = getattr(device_array, "copy_to_device", None)
        if copy_to_device is None:
            raise TypeError(f"{type(self).__name__}.step: params[{index}] holds a "
                            f"{type(device_array).__name__}, which cannot be updated in place")
        copy_to_device(host)

    def _prepare(self, index: int, param: np.ndarray) -> tuple:
        """Allocate work buffers, converting existing state after a dtype change (model.double())."""
        state = self.state[index]
        if state is not None:
            for name in self.state_arrays:
                array = state[name]
                if array is not None and array.dtype != param.dtype:
                    state[name] = array.astype(param.dtype)
        prepared = (param.dtype, tuple(np.empty_like(param) for _ in range(self.scratch_arrays)))
        self._scratch[index] = prepared
        return prepared

    def _init_state(self, param: np.ndarray) -> dict:
        return {"step": 0, **{name: None for name in self.state_arrays}}

    @abstractmethod
    def _update(self, param: np.ndarray, grad: np.ndarray, state: dict,
                scratch: tuple[np.ndarray, ...]) -> None:
        """Update ``param`` in place from ``grad``, ``state`` (this parameter's, updated in
        place) and ``scratch_arrays`` work buffers shaped like ``param``; every optimizer
        defines it."""

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        """The hyperparameters and a copy of every parameter's state, as plain values and
        numpy arrays (``ta.save`` writes it as it is).

        Returns:
            ``{"optimizer": class name, "hyperparameters": {...}, "state": [a dict, or None
            before the parameter's first update, per parameter in order]}``.

        Example:
            >>> ta.save({"model": model, "optimizer": opt.state_dict()}, "ckpt.npz")
        """
        state = []
        for entry in self.state:
            if entry is None:
                state.append(None)
            else:
                state.append({key: value.copy() if isinstance(value, np.ndarray) else value
                              for key, value in entry.items()})
        return {"optimizer": type(self).__name__, "hyperparameters": self.hyperparameters(),
                "state": state}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the hyperparameters (lr included) and state that ``state_dict`` saved, so
        training resumes exactly.  Everything is checked before anything changes.

        Args:
            state_dict: from ``state_dict()``, possibly through ``ta.save``/``ta.load``; this
                optimizer must hold parameters of the same shapes in the same order.

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
        self.state = restored
        self._scratch = [None] * len(self.params)

    def _restore_entry(self, owner: str, index: int, p: Tensor, entry) -> dict | None:
        if entry is None:
            return None
        expected = {"step", *self.state_arrays}
        if not isinstance(entry, dict) or set(entry) != expected:
            found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise ValueError(f"{owner}: state[{index}] should have keys {sorted(expected)}, "
                             f"got {found}")
        restored = {"step": int(entry["step"])}
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

    state_arrays = ("momentum_buffer",)

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
        if not isinstance(nesterov, (bool, np.bool_)):
            raise TypeError(f"SGD: nesterov must be True or False, got {nesterov!r}")
        if nesterov and (momentum == 0.0 or dampening != 0.0):
            raise ValueError(f"SGD: Nesterov momentum needs momentum > 0 and dampening 0, got "
                             f"momentum={momentum}, dampening={dampening}")
        self.lr = lr
        self.momentum, self.dampening = momentum, dampening
        self.weight_decay, self.nesterov = weight_decay, bool(nesterov)

    def _update(self, param, grad, state, scratch) -> None:
        momentum = self.momentum
        work, extra = scratch
        d_p = grad
        if self.weight_decay != 0.0:
            np.multiply(param, self.weight_decay, out=work)
            np.add(grad, work, out=work)
            d_p = work
        if momentum != 0.0:
            buf = state["momentum_buffer"]
            if buf is None:
                buf = state["momentum_buffer"] = d_p.copy()
            else:
                np.multiply(buf, momentum, out=buf)
                if self.dampening != 0.0:
                    np.multiply(d_p, 1.0 - self.dampening, out=extra)
                    np.add(buf, extra, out=buf)
                else:
                    np.add(buf, d_p, out=buf)
            if self.nesterov:
                np.multiply(buf, momentum, out=extra)
                np.add(d_p, extra, out=extra)
                d_p = extra
            else:
                d_p = buf
        state["step"] += 1
        np.multiply(d_p, -self._lr, out=work)
        np.add(param, work, out=param)


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

    state_arrays = ("exp_avg", "exp_avg_sq")
    scratch_arrays = 0          # the fused update needs none

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self._set_hyperparameters(lr, betas, eps, weight_decay)

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

    def _init_state(self, param: np.ndarray) -> dict:
        # C order whatever the parameter's: the fused update reads them flat.
        return {"step": 0, "exp_avg": np.zeros(param.shape, param.dtype),
                "exp_avg_sq": np.zeros(param.shape, param.dtype)}

    def _update(self, param, grad, state, scratch) -> None:
        beta1, beta2 = self.betas
        step = state["step"] = state["step"] + 1
        # One fused pass (compiler/cpu/optim.py), bit for bit the ufuncs torch's formulas
        # spell: g = grad + wd*p; m = lerp(m, g, 1 - beta1) (torch's two-branch lerp);
        # v = v*beta2 + ((1 - beta2)*g)*g; p = p + ((-step_size)*m) / (sqrt(v)/sqrt(bc2) + eps),
        # the bias corrections in Python floats (double), as torch computes them.
        adam_update = _kernels.get("adam") or _load_adam()
        target = param if param.flags.c_contiguous else np.ascontiguousarray(param)
        step_size, bias_correction2_sqrt = self._lr / (1.0 - beta1**step), (1.0 - beta2**step) ** 0.5
        adam_update(target, np.ascontiguousarray(grad), state["exp_avg"], state["exp_avg_sq"],
                    self.weight_decay, beta1, beta2, step_size, bias_correction2_sqrt, self.eps)
        if target is not param:
            param[...] = target


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
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"WarmupCosine: warmup must be an int >= 0, got {warmup!r}")
        if isinstance(total, bool) or not isinstance(total, int) or total < max(warmup, 1):
            raise ValueError(f"WarmupCosine: total must be an int >= max(warmup, 1), got {total!r}")
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
        if not 0.0 < factor < 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be in (0, 1), got {factor!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"ReduceLROnPlateau: patience must be an int >= 0, got {patience!r}")
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
