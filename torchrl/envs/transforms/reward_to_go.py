"""Reward-to-go computed as data is written to a replay buffer: :class:`Reward2GoTransform` (TorchRL's).

Data model: the written TensorDict holds time series along the second-to-last dim of its reward and done entries
(``[*B, T, F]`` rewards, ``[*B, T, 1]`` done flags read at ``("next", done_key)``). Each series is cut after every
done step; the steps after its last done step form a segment of their own that ends with the series. Within a
segment, ``r2g[t] = r[t] + gamma * r2g[t + 1]``.

The sum is vectorised (no loop over time steps): with ``w[t] = gamma ** t * r[t]`` and its reverse cumulative
sum ``S``, the reward-to-go of step ``t`` whose segment ends at ``e`` is ``(S[t] - S[e + 1]) / gamma ** t``,
accumulated in float64. So that ``gamma ** t`` stays far from float64's smallest numbers, long series are cut into
chunks over which the powers stay above :data:`SMALLEST_POWER` (one chunk for ``gamma=1`` and, for
``gamma=0.99``, up to ~34,000 steps); a chunk adds the discounted reward-to-go of the next one to its open
segment.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import is_real
from torchrl.envs.transforms.transforms import Transform

R2G_NO_EPISODE_END = TorchRLPhrase(
    RuntimeError,
    "No episode ends found to calculate the reward to go",
    "No episode ends found to calculate the reward to go: {missing} of the {total} time series written have no "
    "done step in ('next', {done_key!r}) along their time dim (-2). Write whole episodes (e.g. a collector's "
    "frames_per_batch larger than the episode length), or compute the reward-to-go once the episodes end.",
)
R2G_NO_INPUT_KEY = TorchRLPhrase(
    KeyError,
    "Could not find any of the input keys",
    "Could not find any of the input keys {in_keys} in the data written (its keys: {keys}). Pass the reward "
    "entries it holds with `in_keys=`.",
)

__all__ = ["Reward2GoTransform"]

#: The smallest power of ``gamma`` a chunk of the vectorised sum reaches (float64 reaches 1e-308).
SMALLEST_POWER = 1e-150


def _check_key(name: str, key) -> Any:
    if isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key)):
        return key
    raise TypeError(f"`{name}` must hold keys (a str or a tuple of str), got {key!r} ({type(key).__name__}).")


def _next(key) -> tuple:
    return ("next", key) if isinstance(key, str) else ("next", *key)


def _check_gamma(gamma) -> float:
    if isinstance(gamma, torch.Tensor) and gamma.numel() == 1 and gamma.is_floating_point():
        gamma = gamma.item()
    if not is_real(gamma) or not 0 <= float(gamma) <= 1:
        raise ValueError(
            f"`gamma` must be a number in [0, 1] (the discount of one step, e.g. 0.99), got {gamma!r}."
        )
    return float(gamma)


def reward_to_go(reward: torch.Tensor, done: torch.Tensor, gamma: float) -> torch.Tensor:
    """The discounted reward-to-go of each step along dim ``-2``, segments ending at each ``done`` step.

    ``done`` broadcasts to ``reward``'s shape ``[*B, T, F]``; the result has ``reward``'s shape and its dtype (the
    default float dtype for integer rewards). See the module docstring for the rule and the method.

    Examples:
        >>> import torch
        >>> from torchrl.envs.transforms.reward_to_go import reward_to_go
        >>> reward = torch.ones(4, 1)
        >>> done = torch.tensor([[False], [True], [False], [False]])
        >>> reward_to_go(reward, done, 0.5).squeeze(-1)
        tensor([1.5000, 1.0000, 1.5000, 1.0000])
    """
    out_dtype = reward.dtype if reward.is_floating_point() else torch.get_default_dtype()
    shape, steps = reward.shape, reward.shape[-2]
    r = reward.to(torch.float64).movedim(-2, -1).reshape(-1, steps)  # [series, T]
    d = torch.broadcast_to(done, shape).movedim(-2, -1).reshape(-1, steps).bool()
    if gamma == 0 or steps == 0:
        out = r.clone()  # (never a view of the caller's reward)
    else:
        chunk = steps if gamma == 1 else max(1, int(math.log(SMALLEST_POWER) / math.log(gamma)))
        out = torch.empty_like(r)
        carry = None  # the reward-to-go at the first step of the chunk after this one
        for stop in range(steps, 0, -chunk):
            start = max(0, stop - chunk)
            out[:, start:stop] = _chunk_reward_to_go(r[:, start:stop], d[:, start:stop], gamma, carry)
            carry = out[:, start]
    out = out.reshape(*shape[:-2], shape[-1], steps).movedim(-1, -2)
    return out.to(out_dtype)


def _chunk_reward_to_go(r: torch.Tensor, d: torch.Tensor, gamma: float, carry: torch.Tensor | None) -> torch.Tensor:
    """:func:`reward_to_go` of a chunk ``[series, L]`` (float64), its open last segment continued by ``carry``
    (the reward-to-go of the step after the chunk, or ``None``)."""
    length = r.shape[-1]
    steps = torch.arange(length, device=r.device)
    base = torch.full((length,), gamma, dtype=torch.float64, device=r.device)
    powers = base.pow(steps)
    suffix = (r * powers).flip(-1).cumsum(-1).flip(-1)  # S[t] = sum of w[k] for k >= t
    suffix = torch.cat([suffix, suffix.new_zeros(suffix.shape[0], 1)], -1)  # S[L] = 0
    last = torch.full_like(steps, length - 1)
    ends = torch.where(d, steps, last).flip(-1).cummin(-1).values.flip(-1)  # each step's segment end
    out = (suffix[:, :-1] - suffix.gather(-1, ends + 1)) / powers
    if carry is not None:
        open_end = ~d.flip(-1).cumsum(-1).flip(-1).bool()  # no done from t to the chunk's end
        out = out + open_end * base.pow(length - steps) * carry.unsqueeze(-1)
    return out


class Reward2GoTransform(Transform):
    """Replaces each written reward by its discounted reward-to-go (the return from that step to its episode's end).

    An inverse transform: a replay buffer runs it on the data it writes (``extend``), so the stored data holds
    ``r2g[t] = r[t] + gamma * r2g[t + 1]`` along the time dim (``-2`` of the reward and done entries), restarting
    after each ``("next", done_key)`` step; the steps after the last done step of a series form a segment of
    their own. Sampling returns the stored data unchanged (``forward`` is the identity). Every time series written
    must hold at least one done step (``RuntimeError`` otherwise): write whole episodes.

    Args:
        gamma (float): the discount of one step, in ``[0, 1]``. Kept as a buffer (``transform.gamma``, saved by
            ``state_dict()``). Defaults to ``1.0`` (plain sums).
        in_keys (NestedKey or list, optional): the rewards. Defaults to ``[("next", "reward")]``; the keys absent
            from a write are skipped (``KeyError`` when none is present).
        out_keys (NestedKey or list, optional): where the reward-to-go is written. Defaults to ``in_keys``.
        done_key (NestedKey): the end-of-episode flag, read at ``("next", done_key)``. Defaults to ``"done"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from torchrl.envs import Reward2GoTransform
        >>> done = torch.zeros(2, 5, 1, dtype=torch.bool)
        >>> done[:, 2] = done[:, 4] = True  # two series of 5 steps, episodes ending at steps 2 and 4
        >>> td = TensorDict({"next": {"reward": torch.ones(2, 5, 1), "done": done}}, batch_size=[2, 5])
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4), transform=Reward2GoTransform(gamma=0.5))
        >>> _ = rb.extend(td)  # two items, each a series of 5 steps
        >>> rb[0]["next", "reward"].squeeze(-1)
        tensor([1.7500, 1.5000, 1.0000, 1.5000, 1.0000])
    """

    def __init__(self, gamma: float = 1.0, in_keys=None, out_keys=None, done_key: Any = "done"):
        in_keys = [("next", "reward")] if in_keys is None else in_keys
        super().__init__(in_keys=in_keys, out_keys=out_keys)
        for name, keys in (("in_keys", self.in_keys), ("out_keys", self.out_keys)):
            for key in keys:
                _check_key(name, key)
        self.done_key = _check_key("done_key", done_key)
        self.register_buffer("gamma", torch.tensor(_check_gamma(gamma), dtype=torch.float64))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The sample path: returns ``tensordict`` unchanged (the stored rewards are already rewards-to-go)."""
        return tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The write path: writes the reward-to-go of each present ``in_key`` at its ``out_key``.

        Raises:
            TypeError: the data is not a TensorDict.
            KeyError: no ``("next", done_key)`` entry, or none of ``in_keys`` is present.
            ValueError: done flags without a time dim (``[..., T, 1]`` expected) or that do not broadcast to
                a reward's shape.
            RuntimeError: a time series holds no done step.
        """
        if not isinstance(tensordict, TensorDictBase):
            raise TypeError(
                f"Reward2GoTransform takes TensorDicts (rewards and done flags under 'next'), got "
                f"{type(tensordict).__name__}: use it in a TensorDictReplayBuffer or a ReplayBuffer written with "
                f"TensorDicts."
            )
        done_key = _next(self.done_key)
        done = tensordict.get(done_key, None)
        if not isinstance(done, torch.Tensor):
            raise KeyError(
                f"Reward2GoTransform reads the episode ends at {done_key!r}, and the data written has no such "
                f"tensor entry. Pass the done flag it holds with `done_key=` (read under 'next')."
            )
        if done.ndim < 2:
            raise ValueError(
                f"Reward2GoTransform reads time along dim -2, so the done flags need a trailing dim: got {done_key!r} "
                f"of shape {list(done.shape)}; write them as [..., T, 1] (e.g. done.unsqueeze(-1))."
            )
        ended = done.bool().any(-2)
        if not bool(ended.all()):
            raise R2G_NO_EPISODE_END.error(
                missing=int((~ended).sum()), total=ended.numel(), done_key=self.done_key
            )
        present = [(i, o, tensordict.get(i, None)) for i, o in zip(self.in_keys, self.out_keys)]
        present = [(i, o, v) for i, o, v in present if isinstance(v, torch.Tensor)]
        if not present:
            keys = sorted(map(str, tensordict.keys(include_nested=True, leaves_only=True)))
            raise R2G_NO_INPUT_KEY.error(in_keys=self.in_keys, keys=keys)
        gamma = float(self.gamma)
        results = []
        for in_key, out_key, reward in present:  # every entry checked before any is written
            try:
                fits = torch.broadcast_shapes(done.shape, reward.shape) == reward.shape
            except RuntimeError:
                fits = False
            if not fits:
                raise ValueError(
                    f"Reward2GoTransform: the done flags {done_key!r} of shape {list(done.shape)} do not broadcast "
                    f"to the reward {in_key!r} of shape {list(reward.shape)} (time is dim -2 of both). Write "
                    f"rewards and done flags as [..., T, 1]."
                )
            results.append((out_key, reward_to_go(reward, done, gamma)))
        for out_key, value in results:
            tensordict.set(out_key, value)
        return tensordict

    def extra_repr(self) -> str:
        return f"gamma={float(self.gamma)}, in_keys={self.in_keys}, out_keys={self.out_keys}, done_key={self.done_key!r}"

    def __repr__(self) -> str:
        return f"Reward2GoTransform({self.extra_repr()})"

