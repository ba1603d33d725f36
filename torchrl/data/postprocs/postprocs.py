"""n-step returns over collected batches: :class:`MultiStep`.

Data model: a batch of TED data (see :mod:`torchrl.data.replay_buffers.ted`) of batch size ``[*B, T]``, time
last: step ``t`` holds its ``("next", "reward")``, ``("next", "done")`` and the ``"next"`` observation. The
n-step view of step ``t`` looks ahead ``m`` steps, ``m`` = ``n_steps`` or fewer where the trajectory ends
first (a done step, the end of the batch, or a step masked out by ``("collector", "mask")``): its reward
becomes the discounted sum of those ``m`` rewards and its ``"next"`` entries those of step ``t + m - 1``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import nn

from torchrl.data.postprocs.densify import DensifyReward  # noqa: F401  (TorchRL's path: postprocs.postprocs)

__all__ = ["MultiStep"]


def _per_step(value: torch.Tensor, batch: torch.Size, name) -> torch.Tensor:
    """``value`` as one flag per step (``batch``): trailing dims are reduced with ``any``."""
    if value.shape[: len(batch)] != batch:
        raise ValueError(
            f"The entry {name!r} has shape {list(value.shape)}, which does not start with the batch size "
            f"{list(batch)}: pass one value per step."
        )
    value = value.bool()
    return value.reshape(*batch, -1).any(-1) if value.ndim > len(batch) else value


class MultiStep(nn.Module):
    """Rewrites a batch of transitions into n-step transitions (Sutton, 1988).

    For each step ``t`` of a batch ``[*B, T]`` (time last), with ``m`` the number of steps looked ahead
    (``n_steps``, or fewer when the trajectory ends before: a done step, the last step of the batch, or a
    step followed by one that ``("collector", "mask")`` marks invalid):

    - ``("next", "original_reward")``: the reward of step ``t``, unchanged;
    - ``("next", "reward")``: ``sum_{k < m} gamma ** k * reward[t + k]``;
    - every other ``"next"`` entry (observations, done flags): its value at step ``t + m - 1``;
    - ``"steps_to_next_obs"``: ``m``; ``"gamma"``: ``gamma ** m``, the discount of the value of the new
      ``"next"`` observation;
    - ``"nonterminal"``: whether step ``t + m - 1`` did not terminate the episode (from
      ``("next", "terminated")`` when present, else ``("next", "done")``): ``False`` where the target must not
      bootstrap.

    ``n_steps=1`` leaves rewards and ``"next"`` entries unchanged (and adds the entries above). Done entries
    may have the batch shape or extra dims (reduced with ``any``); rewards the batch shape plus any feature
    dims. The input is not modified: a new TensorDict is returned.

    .. note:: It sees one batch at a time: a trajectory cut by the end of the batch looks ahead fewer steps
        there. Apply it to batches that hold whole trajectories, or accept the shorter look-ahead at the end.

    Args:
        gamma (float): the discount factor, in ``(0, 1]``.
        n_steps (int): the maximum number of steps looked ahead, ``>= 1``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import MultiStep
        >>> td = TensorDict({"obs": torch.arange(4.0), "next": {"obs": torch.arange(1.0, 5.0),
        ...     "reward": torch.ones(4), "done": torch.tensor([False, True, False, False])}}, batch_size=[4])
        >>> out = MultiStep(gamma=0.5, n_steps=2)(td)
        >>> out["next", "reward"]  # step 1 ends a trajectory; step 3 ends the batch
        tensor([1.5000, 1.0000, 1.5000, 1.0000])
        >>> out["next", "obs"], out["steps_to_next_obs"]
        (tensor([2., 2., 4., 4.]), tensor([2, 1, 2, 1]))
        >>> out["gamma"], out["nonterminal"]
        (tensor([0.2500, 0.5000, 0.2500, 0.5000]), tensor([False, False,  True,  True]))
    """

    def __init__(self, gamma: float, n_steps: int):
        super().__init__()
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
            raise ValueError(f"`n_steps` must be an int >= 1 (1 = one-step transitions), got {n_steps!r}.")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 < gamma <= 1:
            raise ValueError(f"`gamma` must be a float in (0, 1], got {gamma!r}.")
        self.gamma = float(gamma)
        self.n_steps = n_steps
        self.register_buffer("gammas", self.gamma ** torch.arange(n_steps + 1, dtype=torch.float))
        self.done_key = "done"
        self.terminated_key = "terminated"
        self.reward_key = "reward"
        self.mask_key = ("collector", "mask")

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Returns the n-step version of ``tensordict`` (batch size ``[*B, T]``, time last)."""
        if not isinstance(tensordict, TensorDictBase):
            raise TypeError(f"MultiStep takes a TensorDict, got {type(tensordict).__name__}.")
        if tensordict.batch_dims == 0:
            raise ValueError("MultiStep needs a time dim: pass a TensorDict of batch size [*B, T] (time last).")
        batch = tensordict.batch_size
        n = batch[-1]
        reward = tensordict.get(("next", self.reward_key), None)
        done = tensordict.get(("next", self.done_key), None)
        for key, value in ((("next", self.reward_key), reward), (("next", self.done_key), done)):
            if value is None:
                raise KeyError(f"MultiStep needs the entry {key!r}; the TensorDict has none.")
        stop = _per_step(done, batch, ("next", self.done_key)).clone()
        mask = tensordict.get(self.mask_key, None)
        if mask is not None:  # a step followed by an invalid one ends its look-ahead
            valid = _per_step(mask, batch, self.mask_key)
            stop[..., :-1] |= ~valid[..., 1:]
        stop[..., -1] = True
        steps = torch.arange(n, device=stop.device).expand(batch)
        end = torch.where(stop, steps, torch.full_like(steps, n))
        end = end.flip(-1).cummin(-1).values.flip(-1)  # the first stop at or after each step
        m = (end - steps + 1).clamp(max=self.n_steps)

        ret = torch.zeros_like(reward, dtype=torch.promote_types(reward.dtype, torch.float32))
        extra = reward.ndim - len(batch)
        for k in range(self.n_steps):
            if k >= n:
                break
            shifted = torch.zeros_like(ret)
            tail = (slice(None),) * extra
            shifted[(Ellipsis, slice(0, n - k)) + tail] = reward[(Ellipsis, slice(k, None)) + tail]
            take = (k < m).reshape(*batch, *[1] * extra)
            ret = ret + torch.where(take, shifted * self.gamma**k, torch.zeros_like(shifted))

        out = tensordict.copy()
        nxt = tensordict.get("next")
        target = steps + m - 1
        rows = torch.arange(batch.numel() // n, device=target.device).reshape(*batch[:-1], 1) * n
        shifted_next = nxt.reshape(-1)[(rows + target).reshape(-1)].reshape(batch)
        shifted_next.set(self.reward_key, ret)
        shifted_next.set("original_reward", reward)
        out.set("next", shifted_next)
        term = shifted_next.get(self.terminated_key, None)
        if term is None:
            term = shifted_next.get(self.done_key)
        flag_shape = done.shape
        out.set("steps_to_next_obs", m.reshape(flag_shape) if m.numel() == done.numel() else m)
        gamma = self.gamma ** m.to(ret.dtype)
        out.set("gamma", gamma.reshape(flag_shape) if gamma.numel() == done.numel() else gamma)
        nonterminal = ~_per_step(term, batch, ("next", self.terminated_key))
        out.set("nonterminal", nonterminal.reshape(flag_shape) if nonterminal.numel() == done.numel() else nonterminal)
        return out

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, n_steps={self.n_steps}"
