"""n-step returns over collected batches: :class:`MultiStep`, with TorchRL's semantics.

Data model: a batch of TED data (see :mod:`torchrl.data.replay_buffers.ted`) of batch size ``[*B, T]``, time
last: step ``t`` holds its ``("next", reward)``, ``("next", "done")`` and the ``"next"`` observation. A trajectory
segment ends at each done step and at the end of the batch. Step ``t`` looks ahead ``m(t) = min(n_steps, steps
left in its segment)`` steps (``k(t) = m(t) - 1`` further steps): its reward becomes the discounted sum of those
``m`` rewards and its ``"next"`` entries, done flags excepted, those of step ``t + k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import is_int, is_real
from torchrl.data.postprocs.densify import DensifyReward  # noqa: F401  (TorchRL's path: postprocs.postprocs)
from torchrl.data.replay_buffers.ted import DEFAULT_DONE_KEYS

MULTISTEP_POSTPROC_N_STEPS = TorchRLPhrase(
    ValueError,
    "n_steps must be a non-negative integer.",
    "n_steps must be a non-negative integer. Got n_steps={value!r} ({cls}): pass an int >= 1 (the number of "
    "steps each transition looks ahead; 1 leaves one-step transitions).",
)
MULTISTEP_POSTPROC_GAMMA = TorchRLPhrase(
    ValueError,
    "got out-of-bounds gamma decay",
    "MultiStep got out-of-bounds gamma decay: gamma={value!r}. Pass the discount of one step, a float in "
    "(0, 1] (e.g. gamma=0.99).",
)
MULTISTEP_DONE_SHAPE = TorchRLPhrase(
    RuntimeError,
    r"tensordict shape must be compatible with the done's shape \(trailing singleton dimension excluded\).",
    "tensordict shape must be compatible with the done's shape (trailing singleton dimension excluded). Got "
    "done {done} for a batch of size {batch}: store done as [*B, T] or [*B, T, 1], or give every entry the "
    "leading dims of done.",
)

__all__ = ["MultiStep"]


def _as_tuple(key) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


def _original_reward_key(reward_key, n_reward_keys: int) -> tuple:
    """Where :class:`MultiStep` keeps the one-step reward of ``reward_key`` (one of ``n_reward_keys``).

    ``("next", "original_reward")`` for a single reward key, whatever its name (TorchRL's key); with several,
    each keeps its own, ``("next", *prefix, "original_<name>")`` (TorchRL writes them all onto one key).

    Examples:
        >>> _original_reward_key(("agent", "r"), 1), _original_reward_key(("agent", "r"), 2)
        (('next', 'original_reward'), ('next', 'agent', 'original_r'))
    """
    if n_reward_keys == 1:
        return ("next", "original_reward")
    path = _as_tuple(reward_key)
    return ("next", *path[:-1], f"original_{path[-1]}")


def _rebatch(tensordict: TensorDictBase, shape: torch.Size) -> TensorDictBase:
    """``tensordict`` with batch size ``shape`` (longer than its own) and its time dim moved last."""
    time = tensordict.batch_dims - 1
    out = TensorDict(tensordict.to_dict(), batch_size=shape, device=tensordict.device)
    return out.transpose(time, len(shape) - 1).contiguous()


class MultiStep(nn.Module):
    """Rewrites a batch of transitions into n-step transitions (Sutton, 1988), as TorchRL's ``MultiStep``.

    Why: n-step targets propagate rewards faster than one-step ones. For each step ``t`` of a batch ``[*B, T]``
    (time last), with ``k`` = ``min(n_steps, steps left in t's segment) - 1`` (a segment ends at each
    ``("next", done_key)`` step and at the end of the batch):

    - ``("next", reward_key)``: ``sum_{i <= k} gamma ** i * reward[t + i]``, for each of ``reward_keys``; the
      one-step reward is kept at ``("next", "original_reward")`` (with several reward keys, each at
      ``("next", ..., "original_<name>")``);
    - every other ``"next"`` entry except ``done_keys``: its value at step ``t + k`` (so the next observation is
      the one ``k + 1`` steps ahead); the done flags stay those of step ``t``, as in TorchRL;
    - ``"steps_to_next_obs"``: ``k + 1`` (int64); ``"gamma"``: ``gamma ** (k + 1)``; ``"nonterminal"``: ``k != 0``,
      and ``False`` where ``mask_key`` marks the step invalid. All three have the batch shape.

    ``n_steps=1`` leaves the input entries unchanged (``"nonterminal"`` is then ``False`` everywhere, as in
    TorchRL). Done entries are ``[*B, T]`` or ``[*B, T, 1]``; a done entry with more dims (one flag per agent,
    ``[*B, T, A]``) re-batches the data to its shape. The input is not modified: a new TensorDict is returned.

    .. note:: It sees one batch at a time: a trajectory cut by the end of the batch looks ahead fewer steps
        there (:class:`~torchrl.envs.MultiStepTransform` holds steps back to avoid it).

    Args:
        gamma (float): the discount factor, in ``(0, 1]``.
        n_steps (int): the number of steps looked ahead, ``>= 1``.

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
        (tensor([0.2500, 0.5000, 0.2500, 0.5000]), tensor([ True, False,  True, False]))
    """

    def __init__(self, gamma: float, n_steps: int):
        super().__init__()
        if not is_int(n_steps) or n_steps <= 0:
            raise MULTISTEP_POSTPROC_N_STEPS.error(value=n_steps, cls=type(n_steps).__name__)
        if not is_real(gamma) or not 0 < float(gamma) <= 1:
            raise MULTISTEP_POSTPROC_GAMMA.error(value=gamma)
        self.gamma = float(gamma)
        self.n_steps = int(n_steps)
        self.register_buffer("gammas", self.gamma ** torch.arange(self.n_steps + 1, dtype=torch.float))
        self.done_key: Any = "done"
        self.done_keys: Sequence = DEFAULT_DONE_KEYS
        self.reward_keys: Sequence = ("reward",)
        self.mask_key: Any = ("collector", "mask")

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Returns the n-step version of ``tensordict`` (batch size ``[*B, T]``, time last)."""
        if not isinstance(tensordict, TensorDictBase):
            raise TypeError(f"MultiStep takes a TensorDict, got {type(tensordict).__name__}.")
        if tensordict.batch_dims == 0:
            raise ValueError("MultiStep needs a time dim: pass a TensorDict of batch size [*B, T] (time last).")
        reward_keys = [self.reward_keys] if isinstance(self.reward_keys, str) else list(self.reward_keys)
        for key in [*[("next", *_as_tuple(k)) for k in reward_keys], ("next", *_as_tuple(self.done_key))]:
            if not isinstance(tensordict.get(key, None), torch.Tensor):
                raise KeyError(f"MultiStep needs the entry {key!r}; the TensorDict has none.")
        batch = tensordict.batch_size
        done = tensordict.get(("next", *_as_tuple(self.done_key)))
        if done.shape[-1:] == (1,) and done.shape[:-1] == batch:
            done = done.squeeze(-1)
        if done.shape == batch:
            return self._process(tensordict, done, reward_keys)
        try:
            rebatched = _rebatch(tensordict, done.shape)
        except Exception as err:  # any entry that does not start with done's shape
            raise MULTISTEP_DONE_SHAPE.error(done=list(done.shape), batch=list(batch)) from err
        out = self._process(rebatched, rebatched.get(("next", *_as_tuple(self.done_key))), reward_keys)
        out = out.transpose(tensordict.batch_dims - 1, done.ndim - 1).contiguous()
        return TensorDict(out.to_dict(), batch_size=batch, device=tensordict.device)

    def _process(self, tensordict: TensorDictBase, done: torch.Tensor, reward_keys: list) -> TensorDictBase:
        batch = tensordict.batch_size
        length = batch[-1]
        stop = done.bool().clone()
        stop[..., -1] = True
        steps = torch.arange(length, device=stop.device).expand(batch)
        end = torch.where(stop, steps, torch.full_like(steps, length))
        end = end.flip(-1).cummin(-1).values.flip(-1)  # the last step of each step's segment
        m = (end - steps + 1).clamp(max=self.n_steps)  # k + 1

        out = tensordict.copy()
        nxt = tensordict.get("next")
        excluded = [*reward_keys, *([self.done_keys] if isinstance(self.done_keys, str) else self.done_keys)]
        gathered = nxt.exclude(*excluded)
        target = (steps + m - 1).reshape(-1)
        rows = torch.arange(batch.numel() // max(length, 1), device=m.device).repeat_interleave(length) * length
        shifted = gathered.reshape(-1)[rows + target].reshape(batch)
        new_next = nxt.copy()
        new_next.update(shifted)
        for key in reward_keys:
            reward = nxt.get(key)
            new_next.set(key, self._discounted_sum(reward, m, batch))
            new_next.set(_original_reward_key(key, len(reward_keys))[1:], reward)
        out.set("next", new_next)
        out.set("steps_to_next_obs", m.to(torch.int64))
        out.set("gamma", self.gamma ** m.to(torch.get_default_dtype()))
        nonterminal = m != 1
        mask = tensordict.get(self.mask_key, None) if self.mask_key is not None else None
        if mask is not None:
            mask = mask.bool()
            nonterminal = nonterminal & (mask.reshape(batch) if mask.numel() == batch.numel() else mask)
        out.set("nonterminal", nonterminal)
        return out

    def _discounted_sum(self, reward: torch.Tensor, m: torch.Tensor, batch: torch.Size) -> torch.Tensor:
        """``sum_{i < m} gamma ** i * reward[t + i]`` along the time dim (``len(batch) - 1``)."""
        length = batch[-1]
        extra = reward.ndim - len(batch)
        acc = torch.promote_types(reward.dtype, torch.float32)
        ret = torch.zeros_like(reward, dtype=acc)
        tail = (slice(None),) * extra
        for i in range(min(self.n_steps, length)):
            shifted = torch.zeros_like(ret)
            shifted[(Ellipsis, slice(0, length - i)) + tail] = reward[(Ellipsis, slice(i, None)) + tail]
            take = (i < m).reshape(*batch, *[1] * extra)
            ret = ret + torch.where(take, shifted * self.gamma**i, torch.zeros_like(shifted))
        return ret.to(reward.dtype) if reward.dtype.is_floating_point else ret

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, n_steps={self.n_steps}"
