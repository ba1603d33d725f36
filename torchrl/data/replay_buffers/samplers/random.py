"""Uniform samplers: :class:`RandomSampler` (with replacement) and :class:`SamplerWithoutReplacement`."""

from __future__ import annotations

from typing import Any

import torch

from torchrl.data.replay_buffers.samplers.base import (
    Sampler,
    check_batch_size,
    register_without_replacement,
    unravel,
)


def _check_not_empty(storage) -> int:
    n = len(storage)
    if n == 0:
        raise RuntimeError("Cannot sample from an empty storage: add data first (rb.add / rb.extend).")
    return n


class RandomSampler(Sampler):
    """Draws indices uniformly at random, with replacement.

    Stateless: its draws depend only on the storage length and the generator, so DataLoader workers can
    each hold a copy (``requires_shared_state = False``). ``RandomSampler(replacement=False, **kwargs)``
    returns ``SamplerWithoutReplacement(**kwargs)`` (see :class:`Sampler`).

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, RandomSampler
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(torch.arange(10), torch.arange(10))
        >>> index, info = RandomSampler().sample(storage, 4)
        >>> index.shape, info
        (torch.Size([4]), {})
    """

    requires_shared_state = False

    def sample(self, storage, batch_size: int):
        batch_size = check_batch_size(batch_size)
        n = _check_not_empty(storage)
        device = getattr(storage, "device", None)
        device = device if isinstance(device, torch.device) else None
        if self._rng is not None and device is not None and self._rng.device != device:
            device = self._rng.device
        flat = torch.randint(0, n, (batch_size,), generator=self._rng, device=device)
        return unravel(flat, storage), {}


class SamplerWithoutReplacement(Sampler):
    """Visits every stored item exactly once per epoch, in a random (or fixed) order.

    Stateful: it holds the epoch permutation and the position in it, so a per-worker copy would make every
    DataLoader worker replay the same epoch (``requires_shared_state = True``). A new permutation is drawn
    when the epoch ends and when the storage length changed since the last draw.

    Args:
        drop_last (bool): if ``True``, the last batch of an epoch is dropped when it would be short; if
            ``False`` it is returned short. Defaults to ``False``.
        shuffle (bool): ``False`` visits items in storage order. Defaults to ``True``.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, SamplerWithoutReplacement
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(torch.arange(5), torch.arange(5))
        >>> sampler = SamplerWithoutReplacement()
        >>> seen = torch.cat([sampler.sample(storage, 2)[0] for _ in range(3)])
        >>> sorted(seen.tolist()), sampler.ran_out
        ([0, 1, 2, 3, 4], True)
    """

    requires_shared_state = True

    def __init__(self, drop_last: bool = False, shuffle: bool = True):
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self._perm: torch.Tensor | None = None
        self._pos = 0
        self._len_storage = 0
        self._ran_out = False

    def _new_epoch(self, n: int) -> None:
        if self.shuffle:
            device = self._rng.device if self._rng is not None else None
            self._perm = torch.randperm(n, generator=self._rng, device=device)
        else:
            self._perm = torch.arange(n)
        self._pos = 0
        self._len_storage = n

    def sample(self, storage, batch_size: int):
        batch_size = check_batch_size(batch_size)
        n = _check_not_empty(storage)
        if self.drop_last and n < batch_size:
            raise ValueError(
                f"`batch_size`={batch_size} is larger than the {n} stored items and drop_last=True: every "
                f"batch would be dropped. Lower the batch size or pass drop_last=False."
            )
        return unravel(self._next_in_epoch(n, batch_size), storage), {}

    def _next_in_epoch(self, n: int, count: int) -> torch.Tensor:
        """The next ``count`` (or fewer, at the end) of an epoch over ``n`` things; sets :attr:`ran_out`.

        A new permutation is drawn when ``n`` changed since the last one and once the epoch is over (all
        visited, or with ``drop_last`` fewer than ``count`` left).
        """
        if self._perm is None or self._len_storage != n:
            self._new_epoch(n)
        self._ran_out = False
        chosen = self._perm[self._pos : self._pos + count]
        self._pos += chosen.numel()
        remaining = n - self._pos
        if remaining == 0 or (self.drop_last and remaining < count):
            self._ran_out = True
            self._new_epoch(n)
        return chosen

    @property
    def _sample_list(self) -> torch.Tensor | None:
        """TorchRL's name of the positions left in the current epoch (``None`` before the first draw).

        Setting it makes those positions the rest of the epoch, drawn in that order.
        """
        return None if self._perm is None else self._perm[self._pos :]

    @_sample_list.setter
    def _sample_list(self, value) -> None:
        value = torch.as_tensor(value, dtype=torch.long).reshape(-1)
        if self._perm is None or value.numel() > self._len_storage:
            self._perm, self._pos, self._len_storage = value.clone(), 0, value.numel()
            return
        done = self._len_storage - value.numel()  # keep len(perm) == the storage length the epoch covers
        self._perm = torch.cat([self._perm[:done].to(value.device), value])
        self._pos = done

    def _empty(self) -> None:
        self._perm = None
        self._pos = 0
        self._len_storage = 0
        self._ran_out = False

    def state_dict(self) -> dict[str, Any]:
        return {
            "_perm": None if self._perm is None else self._perm.clone(),
            "_pos": self._pos,
            "_len_storage": self._len_storage,
            "_ran_out": self._ran_out,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        perm = state_dict["_perm"]
        self._perm = None if perm is None else torch.as_tensor(perm).clone()
        self._pos = int(state_dict["_pos"])
        self._len_storage = int(state_dict["_len_storage"])
        self._ran_out = bool(state_dict["_ran_out"])
        self.drop_last = bool(state_dict.get("drop_last", self.drop_last))
        self.shuffle = bool(state_dict.get("shuffle", self.shuffle))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(drop_last={self.drop_last}, shuffle={self.shuffle})"


register_without_replacement(RandomSampler, SamplerWithoutReplacement)
