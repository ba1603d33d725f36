"""Behaviour cloning loss: :class:`BCLoss`.

Data model: a batch is a TensorDict holding the expert ``"action"`` and whatever the actor reads (by default
``"observation"``). The actor predicts either logits over discrete actions or a continuous action, and the
loss measures how far that prediction is from the expert's choice. Nothing else (no distribution, no value
network) is involved, which keeps the loss usable with any ``nn.Module`` that maps observations to outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

__all__ = ["BCLoss"]

_STRING_LOSSES = ("l1", "l2", "mse", "smooth_l1", "cross_entropy")
_REDUCTIONS = ("mean", "sum", "none")
# Elementwise regression losses, all computed with reduction="none" and reduced afterwards.
_REGRESSION = {
    "l1": F.l1_loss,
    "l2": F.mse_loss,
    "mse": F.mse_loss,
    "smooth_l1": F.smooth_l1_loss,
}

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _check_loss_function(loss_function) -> str | LossFunction | None:
    if loss_function is None or callable(loss_function):
        return loss_function
    if isinstance(loss_function, str):
        name = loss_function.lower()
        if name not in _STRING_LOSSES:
            raise ValueError(
                f"`loss_function` must be one of {list(_STRING_LOSSES)}, a callable (pred, target) -> loss "
                f"or None, got {loss_function!r}."
            )
        return name
    raise TypeError(
        f"`loss_function` must be a string, a callable (pred, target) -> loss or None, got "
        f"{type(loss_function).__name__} {loss_function!r}."
    )


def _check_reduction(reduction) -> str:
    if reduction is None:
        return "mean"
    if not isinstance(reduction, str) or reduction not in _REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {list(_REDUCTIONS)} or None, got {reduction!r}.")
    return reduction


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _keys_present(td: TensorDictBase) -> list:
    return sorted(td.keys(include_nested=True, leaves_only=True), key=str)


def _is_integer(tensor: torch.Tensor) -> bool:
    return not tensor.dtype.is_floating_point and not tensor.dtype.is_complex and tensor.dtype != torch.bool


class BCLoss(nn.Module):
    """Behaviour cloning loss: how far the actor's output is from the expert action.

    Behaviour cloning trains a policy by supervised learning on expert demonstrations. This module runs the
    actor on a TensorDict batch and compares its prediction with the batch's expert ``"action"``:

    - integer (discrete) expert actions: cross-entropy between the predicted logits (last dim = number of
      actions) and the action indices; the expert action may have shape ``batch`` or ``batch + (1,)``;
    - floating (continuous) expert actions: mean squared error between the predicted and the expert action,
      which must have the same shape.

    Which tensors are used:

    - a :class:`tensordict.nn.TensorDictModule` (any ``TensorDictModuleBase``) is run on the batch restricted
      to its ``in_keys``; the prediction is its out key ``"logits"`` when it has one, else the action key
      (``"action"``), else its only out key. The user's batch is not modified (the expert action is never
      overwritten by the actor's output).
    - any other ``nn.Module`` is called as ``actor_network(td["observation"])`` and must return the
      prediction tensor (logits or action).

    The keys can be changed with :meth:`set_keys`.

    Args:
        actor_network (nn.Module): the policy being trained; a ``TensorDictModule`` or a module taking the
            observation tensor.

    Keyword Args:
        loss_function (str or callable, optional): ``"l1"``, ``"l2"`` (alias ``"mse"``), ``"smooth_l1"``,
            ``"cross_entropy"`` or a callable ``(pred, target) -> loss``. String regression losses need
            floating expert actions of the prediction's shape; ``"cross_entropy"`` takes integer action
            indices or floating class probabilities of the logits' shape. A callable receives the prediction
            and the expert action unchanged, and its result is then reduced by ``reduction`` (return the
            elementwise loss so that ``reduction`` has an effect). Defaults to ``None``: cross-entropy for
            integer expert actions, mean squared error for floating ones.
        reduction (str, optional): ``"mean"``, ``"sum"`` or ``"none"`` (the elementwise loss: shape
            ``batch`` for cross-entropy, the expert action's shape for regression losses). Defaults to
            ``None``, which means ``"mean"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.objectives import BCLoss
        >>> actor = torch.nn.Linear(4, 2)  # observation -> logits over 2 actions
        >>> loss = BCLoss(actor)
        >>> batch = TensorDict(
        ...     {"observation": torch.randn(8, 4), "action": torch.randint(2, (8,))}, batch_size=[8]
        ... )
        >>> out = loss(batch)
        >>> out["loss_bc"].shape
        torch.Size([])
        >>> out["loss_bc"].backward()
        >>> actor.weight.grad is not None
        True
    """

    out_keys = ["loss_bc"]

    def __init__(
        self,
        actor_network: nn.Module,
        *,
        loss_function: Literal["l1", "l2", "mse", "smooth_l1", "cross_entropy"] | LossFunction | None = None,
        reduction: Literal["mean", "sum", "none"] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(actor_network, nn.Module):
            raise TypeError(
                f"`actor_network` must be an nn.Module (a TensorDictModule or a module taking the "
                f"observation tensor), got {type(actor_network).__name__}."
            )
        self.actor_network = actor_network
        self.loss_function = _check_loss_function(loss_function)
        self.reduction = _check_reduction(reduction)
        self.action_key = "action"
        self.observation_key = "observation"
        self._check_prediction_key()

    # ------------------------------------------------------------------ keys
    @property
    def _is_td_module(self) -> bool:
        return isinstance(self.actor_network, TensorDictModuleBase)

    @property
    def prediction_key(self):
        """The key of the actor's output compared with the expert action (TensorDict actors only).

        ``"logits"`` when the actor writes it, else the action key when the actor writes it, else the actor's
        only out key; ``None`` for a plain ``nn.Module`` actor.
        """
        if not self._is_td_module:
            return None
        out_keys = list(self.actor_network.out_keys)
        if "logits" in out_keys:
            return "logits"
        if self.action_key in out_keys:
            return self.action_key
        if len(out_keys) == 1:
            return out_keys[0]
        return None

    @property
    def in_keys(self) -> list:
        """The keys :meth:`forward` reads: the expert action and the actor's inputs."""
        actor_keys = list(self.actor_network.in_keys) if self._is_td_module else [self.observation_key]
        return [self.action_key] + [key for key in actor_keys if key != self.action_key]

    def set_keys(self, *, action=None, observation=None) -> BCLoss:
        """Changes the keys the loss reads.

        Keyword Args:
            action (NestedKey, optional): the expert action key. Defaults to ``None`` (unchanged; initially
                ``"action"``).
            observation (NestedKey, optional): the observation passed to a plain ``nn.Module`` actor (a
                ``TensorDictModule`` reads its own ``in_keys``). Defaults to ``None`` (unchanged; initially
                ``"observation"``).

        Returns:
            this loss module, so calls can be chained.

        Examples:
            >>> import torch
            >>> from torchrl.objectives import BCLoss
            >>> loss = BCLoss(torch.nn.Linear(3, 2)).set_keys(action="expert_action", observation="obs")
            >>> loss.in_keys
            ['expert_action', 'obs']
        """
        if action is not None:
            self.action_key = action
        if observation is not None:
            self.observation_key = observation
        self._check_prediction_key()
        return self

    def _check_prediction_key(self) -> None:
        if self._is_td_module and self.prediction_key is None:
            raise ValueError(
                f"Cannot tell which output of `actor_network` to compare with the expert action: its "
                f"out_keys {list(self.actor_network.out_keys)} contain neither 'logits' nor "
                f"{self.action_key!r}. Make the actor write 'logits' (discrete actions) or "
                f"{self.action_key!r} (continuous actions)."
            )

    # --------------------------------------------------------------- forward
    def _expert_action(self, td: TensorDictBase) -> torch.Tensor:
        if self.action_key not in td.keys(include_nested=True):
            raise KeyError(
                f"BCLoss needs the expert action at key {self.action_key!r}, which the batch does not hold. "
                f"Keys present: {_keys_present(td)}. Add it, or point the loss at it with "
                f"`loss.set_keys(action=...)`."
            )
        return td.get(self.action_key)

    def _predict(self, td: TensorDictBase) -> torch.Tensor:
        if not self._is_td_module:
            if self.observation_key not in td.keys(include_nested=True):
                raise KeyError(
                    f"The actor is a plain nn.Module, called on the observation at key "
                    f"{self.observation_key!r}, which the batch does not hold. Keys present: "
                    f"{_keys_present(td)}. Use `loss.set_keys(observation=...)` or wrap the actor in a "
                    f"TensorDictModule."
                )
            pred = self.actor_network(td.get(self.observation_key))
            if not isinstance(pred, torch.Tensor):
                raise TypeError(
                    f"A plain nn.Module actor must return a tensor (logits or action), got "
                    f"{type(pred).__name__}. Wrap it in a TensorDictModule if it returns several outputs."
                )
            return pred
        present = td.keys(include_nested=True)
        missing = [key for key in self.actor_network.in_keys if key not in present]
        if missing:
            raise KeyError(
                f"The actor reads the keys {list(self.actor_network.in_keys)}, but the batch lacks "
                f"{missing}. Keys present: {_keys_present(td)}."
            )
        out = self.actor_network(td.select(*self.actor_network.in_keys))
        key = self.prediction_key
        if key not in out.keys(include_nested=True):
            raise RuntimeError(
                f"The actor declared out key {key!r} but did not write it; keys it returned: "
                f"{_keys_present(out)}."
            )
        return out.get(key)

    def _cross_entropy(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.ndim == 0:
            raise ValueError("Cross-entropy needs logits with a last dim over the actions, got a 0-d tensor.")
        batch_shape, num_actions = pred.shape[:-1], pred.shape[-1]
        if target.dtype.is_floating_point:
            # Class probabilities (e.g. one-hot actions).
            if target.shape != pred.shape:
                raise ValueError(
                    f"Shape mismatch: floating expert actions for cross-entropy are class probabilities and "
                    f"must have the logits' shape {list(pred.shape)}, got {list(target.shape)}."
                )
            flat = F.cross_entropy(
                pred.reshape(-1, num_actions), target.reshape(-1, num_actions), reduction="none"
            )
            return flat.reshape(batch_shape)
        if target.shape == batch_shape + (1,):
            target = target.squeeze(-1)
        if target.shape != batch_shape:
            raise ValueError(
                f"Shape mismatch: logits of shape {list(pred.shape)} need expert action indices of shape "
                f"{list(batch_shape)} (or {list(batch_shape) + [1]}), got {list(target.shape)}."
            )
        if target.numel() and (int(target.min()) < 0 or int(target.max()) >= num_actions):
            raise ValueError(
                f"Expert actions must be indices in [0, {num_actions}) for logits over {num_actions} "
                f"actions, got values in [{int(target.min())}, {int(target.max())}]."
            )
        flat = F.cross_entropy(pred.reshape(-1, num_actions), target.reshape(-1).long(), reduction="none")
        return flat.reshape(batch_shape)

    def _regression(self, name: str, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if _is_integer(target):
            raise ValueError(
                f"`loss_function`={name!r} needs floating (continuous) expert actions, but the expert "
                f"actions are integers ({target.dtype}). Use loss_function='cross_entropy' (or None) with "
                f"logits, or convert the actions to float (e.g. one-hot) first."
            )
        if pred.shape != target.shape:
            raise ValueError(
                f"Shape mismatch: the actor predicted shape {list(pred.shape)} but the expert action has "
                f"shape {list(target.shape)}; they must be equal for loss_function={name!r}."
            )
        return _REGRESSION[name](pred, target.to(pred.dtype), reduction="none")

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Computes the behaviour cloning loss on a batch.

        Args:
            tensordict (TensorDictBase): the batch, holding the expert action and the actor's inputs.

        Returns:
            a TensorDict with ``"loss_bc"``: a scalar for ``reduction="mean"``/``"sum"``, the elementwise
            loss for ``"none"``.
        """
        if not isinstance(tensordict, TensorDictBase):
            raise TypeError(
                f"BCLoss expects a TensorDict batch, got {type(tensordict).__name__}. Build one with "
                f"TensorDict({{'observation': obs, 'action': action}}, batch_size=[B])."
            )
        target = self._expert_action(tensordict)
        pred = self._predict(tensordict)
        if not pred.dtype.is_floating_point:
            raise TypeError(
                f"The actor's prediction has dtype {pred.dtype}; behaviour cloning needs floating outputs "
                f"(logits for discrete actions, the action for continuous ones) to get gradients."
            )
        loss_function = self.loss_function
        if callable(loss_function):
            loss = loss_function(pred, target)
            if not isinstance(loss, torch.Tensor):
                raise TypeError(
                    f"`loss_function` must return a tensor, got {type(loss).__name__} from {loss_function!r}."
                )
        elif loss_function == "cross_entropy" or (loss_function is None and _is_integer(target)):
            loss = self._cross_entropy(pred, target)
        elif loss_function is None and target.dtype == torch.bool:
            raise TypeError(
                "Boolean expert actions are ambiguous: pass integer action indices (cross-entropy) or float "
                "actions (regression)."
            )
        else:
            loss = self._regression(loss_function or "mse", pred, target)
        return TensorDict({"loss_bc": _reduce(loss, self.reduction)}, batch_size=[])

    def extra_repr(self) -> str:
        name = getattr(self.loss_function, "__name__", self.loss_function)
        return f"loss_function={name!r}, reduction={self.reduction!r}"
