"""Parameter schedulers: change a sampler's parameter (e.g. a prioritized sampler's ``beta``) step by step.

A scheduler holds an object (the sampler of a :class:`~torchrl.data.ReplayBuffer` given to it, or any other
object) and the name of one of its attributes. Each :meth:`ParameterScheduler.step` computes the next value,
clamps it to ``[min_value, max_value]`` and sets it: an attribute holding a tensor is updated in place (so a
copy of the object sharing that tensor sees the change), any other with ``setattr``, which runs the object's
validation (a :class:`~torchrl.data.PrioritizedSampler` checks ``alpha``/``beta``).

``state_dict()`` holds the step count, the initial value and the configuration (never the object or a
function), so that a scheduler rebuilt over a restored object continues the same schedule.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torchrl._validation import check_int, check_positive_int, is_real

__all__ = ["ParameterScheduler", "LambdaScheduler", "LinearScheduler", "StepScheduler", "SchedulerList"]


def _check_bound(name: str, value):
    if value is None or is_real(value) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        return value
    raise TypeError(f"`{name}` must be a number or None (no bound), got {value!r} ({type(value).__name__}).")


def _check_number(name: str, value, hint: str = ""):
    if is_real(value) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        return value
    tail = f" {hint}" if hint else ""
    raise TypeError(f"`{name}` must be a number, got {value!r} ({type(value).__name__}).{tail}")


def _target(obj):
    """The object whose attribute a scheduler changes: a buffer's sampler, or ``obj`` itself."""
    sampler = getattr(type(obj), "sampler", None)
    if isinstance(sampler, property) and hasattr(obj, "sample"):  # a replay buffer: schedule its sampler
        return obj.sampler
    return obj


def _snapshot(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


class ParameterScheduler(abc.ABC):
    """Base class of the schedulers of one attribute (see the module docstring).

    Subclasses implement :meth:`_step`, the next value (before clamping) at step ``self._step_cnt`` (``1`` at
    the first :meth:`step`).

    Args:
        obj (ReplayBuffer or Sampler or object): a replay buffer (its sampler's attribute is scheduled), a
            sampler, or any object with the attribute.
        param_name (str): the attribute, e.g. ``"beta"``.
        min_value (float, optional): the smallest value set. Defaults to ``None`` (no bound).
        max_value (float, optional): the largest value set. Defaults to ``None`` (no bound).

    Examples:
        >>> from torchrl.data import PrioritizedSampler
        >>> from torchrl.data.replay_buffers.scheduler import ParameterScheduler
        >>> class Halve(ParameterScheduler):
        ...     def _step(self):
        ...         return self.initial_val / 2 ** self._step_cnt
        >>> sampler = PrioritizedSampler(10, alpha=0.6, beta=0.8)
        >>> scheduler = Halve(sampler, "beta", min_value=0.15)
        >>> for _ in range(3):
        ...     scheduler.step()
        >>> sampler.beta
        0.15
    """

    def __init__(self, obj, param_name: str, min_value: float | None = None, max_value: float | None = None):
        if not isinstance(param_name, str):
            raise TypeError(f"`param_name` must be the name of an attribute (a str), got {param_name!r}.")
        target = _target(obj)
        if not hasattr(target, param_name):
            raise AttributeError(
                f"{type(target).__name__} has no attribute {param_name!r} to schedule (`param_name`). Pass the name "
                f"of one of its parameters, e.g. 'beta' for a PrioritizedSampler."
            )
        self.obj = target
        self.param_name = param_name
        self._min_val = _check_bound("min_value", min_value)
        self._max_val = _check_bound("max_value", max_value)
        if min_value is not None and max_value is not None and float(min_value) > float(max_value):
            raise ValueError(f"`min_value`={min_value} is larger than `max_value`={max_value}.")
        self.initial_val = _snapshot(getattr(target, param_name))
        self._step_cnt = 0

    @property
    def sampler(self):
        """The object whose attribute is scheduled (TorchRL's name)."""
        return self.obj

    @abc.abstractmethod
    def _step(self):
        """The next value of the parameter, before clamping."""

    def _clamp(self, value):
        lo, hi = self._min_val, self._max_val
        if isinstance(value, torch.Tensor):
            return value.clamp(min=lo, max=hi) if lo is not None or hi is not None else value
        if lo is not None:
            value = max(value, lo)
        if hi is not None:
            value = min(value, hi)
        return value

    def step(self) -> None:
        """Advances the schedule by one step and sets the parameter."""
        self._step_cnt += 1
        value = self._clamp(self._step())
        current = getattr(self.obj, self.param_name)
        if isinstance(current, torch.Tensor):
            with torch.no_grad():
                current.copy_(torch.as_tensor(value, dtype=current.dtype))
        else:
            setattr(self.obj, self.param_name, value)

    # -- state ----------------------------------------------------------------------------------------------------
    _config_keys: tuple[str, ...] = ()

    def state_dict(self) -> dict[str, Any]:
        """The step count, the initial value, the bounds and the configuration (not the object, nor functions)."""
        state = {
            "param_name": self.param_name,
            "_step_cnt": self._step_cnt,
            "initial_val": _snapshot(self.initial_val),
            "_min_val": self._min_val,
            "_max_val": self._max_val,
        }
        state.update({key: getattr(self, key) for key in self._config_keys})
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict` of a scheduler of the same parameter."""
        if state_dict.get("param_name", self.param_name) != self.param_name:
            raise ValueError(
                f"This state schedules {state_dict['param_name']!r}, and this scheduler {self.param_name!r}: load "
                f"it into a scheduler of the same parameter."
            )
        step = check_int("_step_cnt", state_dict["_step_cnt"], minimum=0)
        for key in self._config_keys:
            if key in state_dict:
                setattr(self, key, state_dict[key])
        self._step_cnt = step
        self.initial_val = _snapshot(state_dict["initial_val"])
        self._min_val = state_dict.get("_min_val", self._min_val)
        self._max_val = state_dict.get("_max_val", self._max_val)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(param_name={self.param_name!r}, step={self._step_cnt})"


class LambdaScheduler(ParameterScheduler):
    """Sets the parameter to its initial value times ``lambda_fn(step)``, like :class:`torch.optim.lr_scheduler.LambdaLR`.

    Args:
        obj (ReplayBuffer or Sampler or object): see :class:`ParameterScheduler`.
        param_name (str): the attribute, e.g. ``"beta"``.
        lambda_fn (callable): maps the step count (``1`` at the first :meth:`step`) to a factor.
        min_value (float, optional): the smallest value set. Defaults to ``None``.
        max_value (float, optional): the largest value set. Defaults to ``None``.

    Examples:
        >>> from torchrl.data import PrioritizedSampler
        >>> from torchrl.data.replay_buffers.scheduler import LambdaScheduler
        >>> sampler = PrioritizedSampler(10, alpha=0.6, beta=0.4)
        >>> scheduler = LambdaScheduler(sampler, "beta", lambda step: 1 + step / 4, max_value=1.0)
        >>> scheduler.step(); sampler.beta
        0.5
        >>> for _ in range(10):
        ...     scheduler.step()
        >>> sampler.beta
        1.0
    """

    def __init__(
        self,
        obj,
        param_name: str,
        lambda_fn: Callable[[int], float],
        min_value: float | None = None,
        max_value: float | None = None,
    ):
        super().__init__(obj, param_name, min_value, max_value)
        if not callable(lambda_fn):
            raise TypeError(f"`lambda_fn` must map the step count to a factor (a callable), got {lambda_fn!r}.")
        self.lambda_fn = lambda_fn

    def _step(self):
        return self.initial_val * self.lambda_fn(self._step_cnt)


class LinearScheduler(ParameterScheduler):
    """Moves the parameter linearly from its initial value to ``final_value`` in ``num_steps`` steps.

    Args:
        obj (ReplayBuffer or Sampler or object): see :class:`ParameterScheduler`.
        param_name (str): the attribute, e.g. ``"beta"``.
        final_value (float): the value reached at step ``num_steps`` and kept afterwards.
        num_steps (int): the number of steps to reach it.

    Examples:
        >>> from torchrl.data import PrioritizedSampler
        >>> from torchrl.data.replay_buffers.scheduler import LinearScheduler
        >>> sampler = PrioritizedSampler(10, alpha=0.6, beta=0.4)
        >>> scheduler = LinearScheduler(sampler, "beta", final_value=1.0, num_steps=3)
        >>> values = []
        >>> for _ in range(4):
        ...     scheduler.step()
        ...     values.append(round(sampler.beta, 3))
        >>> values
        [0.6, 0.8, 1.0, 1.0]
    """

    _config_keys = ("final_val", "num_steps")

    def __init__(self, obj, param_name: str, final_value: float, num_steps: int):
        super().__init__(obj, param_name)
        self.final_val = _check_number("final_value", final_value)
        self.num_steps = check_positive_int("num_steps", num_steps)

    def _step(self):
        if self._step_cnt >= self.num_steps:
            return self.final_val
        return self.initial_val + (self.final_val - self.initial_val) * (self._step_cnt / self.num_steps)


_MODES = {"multiplicative": operator.mul, "additive": operator.add}


class StepScheduler(ParameterScheduler):
    """Every ``n_steps`` steps, multiplies the parameter by ``gamma`` (or adds ``gamma`` to it).

    Args:
        obj (ReplayBuffer or Sampler or object): see :class:`ParameterScheduler`.
        param_name (str): the attribute, e.g. ``"beta"``.
        gamma (float): the factor (``"multiplicative"``) or the increment (``"additive"``). Defaults to ``0.9``.
        n_steps (int): the number of steps between two changes. Defaults to ``1``.
        mode (str): ``"multiplicative"`` or ``"additive"``. Defaults to ``"multiplicative"``.
        min_value (float, optional): the smallest value set. Defaults to ``None``.
        max_value (float, optional): the largest value set. Defaults to ``None``.

    Examples:
        >>> from torchrl.data import PrioritizedSampler
        >>> from torchrl.data.replay_buffers.scheduler import StepScheduler
        >>> sampler = PrioritizedSampler(10, alpha=0.6, beta=0.4)
        >>> scheduler = StepScheduler(sampler, "beta", gamma=0.25, n_steps=2, mode="additive", max_value=1.0)
        >>> values = []
        >>> for _ in range(6):
        ...     scheduler.step()
        ...     values.append(round(sampler.beta, 2))
        >>> values
        [0.4, 0.65, 0.65, 0.9, 0.9, 1.0]
    """

    _config_keys = ("gamma", "n_steps", "mode")

    def __init__(
        self,
        obj,
        param_name: str,
        gamma: float = 0.9,
        n_steps: int = 1,
        mode: str = "multiplicative",
        min_value: float | None = None,
        max_value: float | None = None,
    ):
        super().__init__(obj, param_name, min_value, max_value)
        self.gamma = _check_number("gamma", gamma)
        self.n_steps = check_positive_int("n_steps", n_steps)
        if mode not in _MODES:
            raise ValueError(f"`mode` must be 'multiplicative' or 'additive', got {mode!r}.")
        self.mode = mode

    @property
    def operator(self):
        """How ``gamma`` changes the value: ``operator.mul`` or ``operator.add``."""
        return _MODES[self.mode]

    def _step(self):
        current = getattr(self.obj, self.param_name)
        if self._step_cnt % self.n_steps == 0:
            return self.operator(current, self.gamma)
        return current


class SchedulerList:
    """Steps several schedulers together.

    Args:
        schedulers (ParameterScheduler or iterable of ParameterScheduler): the schedulers, stepped in order.

    Examples:
        >>> from torchrl.data import PrioritizedSampler
        >>> from torchrl.data.replay_buffers.scheduler import LinearScheduler, SchedulerList, StepScheduler
        >>> sampler = PrioritizedSampler(10, alpha=0.6, beta=0.4)
        >>> schedulers = SchedulerList(LinearScheduler(sampler, "beta", final_value=1.0, num_steps=2))
        >>> schedulers.append(StepScheduler(sampler, "alpha", gamma=0.5))
        >>> schedulers.step()
        >>> round(sampler.beta, 2), sampler.alpha
        (0.7, 0.3)
    """

    def __init__(self, schedulers: ParameterScheduler | Iterable[ParameterScheduler]):
        if isinstance(schedulers, ParameterScheduler):
            schedulers = [schedulers]
        self.schedulers: list[ParameterScheduler] = []
        for scheduler in schedulers:
            self.append(scheduler)

    def append(self, scheduler: ParameterScheduler) -> None:
        """Adds a scheduler, stepped after the others."""
        if not isinstance(scheduler, ParameterScheduler):
            raise TypeError(f"SchedulerList holds ParameterScheduler objects, got {type(scheduler).__name__}.")
        self.schedulers.append(scheduler)

    def step(self) -> None:
        """Steps every scheduler, in order."""
        for scheduler in self.schedulers:
            scheduler.step()

    def __len__(self) -> int:
        return len(self.schedulers)

    def state_dict(self) -> dict[str, Any]:
        """``{"schedulers": [state_dict of each scheduler]}``."""
        return {"schedulers": [scheduler.state_dict() for scheduler in self.schedulers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict["schedulers"]
        if len(states) != len(self.schedulers):
            raise ValueError(
                f"This state holds {len(states)} schedulers and this SchedulerList {len(self.schedulers)}: build "
                f"the list with the same schedulers before loading it."
            )
        for scheduler, state in zip(self.schedulers, states):
            scheduler.load_state_dict(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.schedulers!r})"
