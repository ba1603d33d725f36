"""DensifyReward: reward-to-go over trajectory segments.

Data model: a batch of TED steps whose time dim is the second to last (``[*B, T, 1]`` rewards and done flags,
read under ``"next"``). A trajectory segment ends at each done step; the steps after the last done step form a
segment that ends with the batch. The reward-to-go of step ``t`` is the discounted sum of the rewards from ``t``
to the end of its segment.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import is_real

DENSIFY_SHAPES = TorchRLPhrase(
    RuntimeError,
    "reward and done state are expected to have the same shape",
    "reward and done state are expected to have the same shape, got reward {reward} and done {done}: store "
    "both as [..., T, 1] (e.g. done.unsqueeze(-1)), or pass the matching entries with `reward_key=`/`done_key=`.",
)

__all__ = ["DensifyReward"]


def _check_key(name: str, key):
    if isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key)):
        return key
    raise TypeError(f"`{name}` must be a key (a str or a tuple of str), got {key!r} ({type(key).__name__}).")


def _next(key) -> tuple:
    return ("next", key) if isinstance(key, str) else ("next", *key)


def _reward_to_go(reward: torch.Tensor, done: torch.Tensor, discount: float = 1.0) -> torch.Tensor:
    """The discounted reward-to-go of each step along dim ``-2``, segments ending at each ``done`` step.

    ``reward`` and ``done`` have the same shape ``[*B, T, F]``; the result has ``reward``'s shape and dtype
    (sums are accumulated in float64).

    Examples:
        >>> import torch
        >>> reward = torch.tensor([[1.0], [1.0], [1.0]])
        >>> done = torch.tensor([[False], [True], [False]])
        >>> _reward_to_go(reward, done, 0.5).squeeze(-1)
        tensor([1.5000, 1.0000, 1.0000])
    """
    acc = torch.float64 if reward.dtype != torch.float64 else reward.dtype
    r = reward.to(acc).movedim(-2, 0)
    keep = (~done.bool()).movedim(-2, 0)
    out = torch.empty_like(r)
    running = torch.zeros_like(r[0])
    for t in range(r.shape[0] - 1, -1, -1):
        running = r[t] + discount * running * keep[t]
        out[t] = running
    return out.movedim(0, -2).to(reward.dtype if reward.dtype.is_floating_point else torch.get_default_dtype())


class DensifyReward(TensorDictModuleBase):
    """Replaces each step's reward by its reward-to-go: the (discounted) sum of the rewards until the end of its
    trajectory.

    Sparse-reward tasks (success only at the last step) give a learner nothing to regress on for most steps;
    the reward-to-go gives every step of a successful trajectory the final reward (return-conditioned and
    behaviour-cloning methods use it too). Trajectories are split after each ``("next", done_key)`` step; the
    steps after the last done step are summed to the end of the batch. The time dim is the second to last one,
    so rewards and done flags are ``[*B, T, 1]`` as TED data stores them. Works in place: the input TensorDict
    is returned.

    Keyword Args:
        reward_key (NestedKey): the reward, read under ``"next"``. Defaults to ``"reward"``.
        done_key (NestedKey): the end-of-trajectory flag, read under ``"next"``. Defaults to ``"done"``.
        reward_key_out (NestedKey, optional): where the reward-to-go is written, under ``"next"``. Defaults to
            ``reward_key`` (the reward is replaced).
        time_dim (int): kept for TorchRL compatibility; the time dim is always ``-2``. Defaults to ``2``.
        discount (float): the discount of one step. Defaults to ``1.0`` (plain sum).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import DensifyReward
        >>> reward = torch.zeros(10, 1)
        >>> reward[3], reward[7] = 3.0, 7.0
        >>> done = torch.zeros(10, 1, dtype=torch.bool)
        >>> done[3] = done[7] = True
        >>> td = TensorDict({"next": {"reward": reward, "done": done}}, batch_size=[10])
        >>> DensifyReward()(td)["next", "reward"].squeeze(-1)
        tensor([3., 3., 3., 3., 7., 7., 7., 7., 0., 0.])
    """

    def __init__(
        self,
        *,
        reward_key: Any = "reward",
        done_key: Any = "done",
        reward_key_out: Any = None,
        time_dim: int = 2,
        discount: float = 1.0,
    ):
        super().__init__()
        self.reward_key = _check_key("reward_key", reward_key)
        self.done_key = _check_key("done_key", done_key)
        self.reward_key_out = _check_key("reward_key_out", reward_key_out if reward_key_out is not None else reward_key)
        if isinstance(time_dim, bool) or not isinstance(time_dim, int):
            raise TypeError(f"`time_dim` must be an int, got {time_dim!r}.")
        if not is_real(discount) or not 0 <= float(discount) <= 1:
            raise ValueError(f"`discount` must be a number in [0, 1] (the discount of one step), got {discount!r}.")
        self.time_dim = time_dim
        self.discount = float(discount)
        self.in_keys = [self.reward_key, self.done_key]
        self.out_keys = [self.reward_key_out]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the reward-to-go at ``("next", reward_key_out)`` and returns ``tensordict``."""
        if not isinstance(tensordict, TensorDictBase):
            raise TypeError(f"DensifyReward takes a TensorDict, got {type(tensordict).__name__}.")
        reward = tensordict.get(_next(self.reward_key), None)
        done = tensordict.get(_next(self.done_key), None)
        for key, value in ((self.reward_key, reward), (self.done_key, done)):
            if not isinstance(value, torch.Tensor):
                raise KeyError(f"DensifyReward reads ('next', {key!r}); the TensorDict has no such tensor entry.")
        if reward.shape != done.shape:
            raise DENSIFY_SHAPES.error(reward=list(reward.shape), done=list(done.shape))
        if reward.ndim < 2:
            raise ValueError(
                f"DensifyReward reads time along dim -2, so rewards and done flags need a trailing feature dim: got "
                f"shape {list(reward.shape)}; pass them as [..., T, 1] (e.g. reward.unsqueeze(-1))."
            )
        tensordict.set(_next(self.reward_key_out), _reward_to_go(reward, done, self.discount))
        return tensordict

    def __repr__(self) -> str:
        return (
            f"DensifyReward(reward_key={self.reward_key!r}, done_key={self.done_key!r}, "
            f"reward_key_out={self.reward_key_out!r}, discount={self.discount})"
        )


DensifyReward.__module__ = "torchrl.data.postprocs"  # as MultiStep: TorchRL users import both from there
