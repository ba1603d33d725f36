"""Uniform sampling: :class:`RandomSampler` (with replacement), and TorchRL's other names at this module path,
:class:`SamplerWithoutReplacement` (:mod:`.without_replacement`) and :class:`ConsumingSampler` (:mod:`.consuming`).

``RandomSampler(replacement=False)`` builds a :class:`SamplerWithoutReplacement`: the pair is registered here, below
both classes, so that the file of the class without replacement does not import this one back.
"""

from __future__ import annotations

import torch

from torchrl.data.replay_buffers.samplers.base import (
    Sampler,
    check_batch_size,
    check_has_rows,
    check_not_empty,
    register_without_replacement,
    uniform_draws,
    unravel,
)
from torchrl.data.replay_buffers.samplers.consuming import ConsumingSampler
from torchrl.data.replay_buffers.samplers.without_replacement import SamplerWithoutReplacement

__all__ = ["RandomSampler", "SamplerWithoutReplacement", "ConsumingSampler"]


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
    draws_in_bounds = True

    def can_sample(self, storage, batch_size: int) -> bool:
        """``True`` once ``storage`` holds an item: draws with replacement serve any batch size."""
        return len(storage) > 0

    def sample(self, storage, batch_size: int):
        batch_size = check_batch_size(batch_size)
        if storage.compilable:  # the length a tensor on the storage's device: no number read back, one graph
            n = check_has_rows(storage)
            u = uniform_draws(batch_size, self._rng, n.device)
            return unravel((u * n.to(u.device)).long(), storage), {}  # floor(u * n) < n for u < 1
        n = check_not_empty(storage)
        device = getattr(storage, "device", None)
        device = device if isinstance(device, torch.device) else None
        if self._rng is not None and device is not None and self._rng.device != device:
            device = self._rng.device
        flat = torch.randint(0, n, (batch_size,), generator=self._rng, device=device)
        return unravel(flat, storage), {}


register_without_replacement(RandomSampler, SamplerWithoutReplacement)
