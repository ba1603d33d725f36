"""The sampler contract.

A sampler draws indices from a storage: ``sample(storage, batch_size) -> (index, info)``. ``index`` is a
1-D int64 tensor for 1-D storages and a tuple of per-dimension tensors for ``ndim > 1`` storages; ``info``
is a dict of per-sample tensors (priority weights, slice flags, ...) that TensorDict buffers write into the
batch. The buffer tells the sampler about writes (``extend``/``add``/``mark_update``) and priority updates
(``update_priority``). All randomness goes through ``self._rng`` (the buffer's ``torch.Generator``, set by
``ReplayBuffer.set_rng``) or, when it is ``None``, torch's global generator.

``requires_shared_state`` says whether a copy of the sampler in another process (a DataLoader worker) would
change what is sampled: True for samplers holding an epoch permutation or priorities, False for samplers
whose draws depend only on the storage content and their configuration. It defaults to True, so a sampler
that does not declare it is treated as stateful.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from torchrl.data.replay_buffers._component import Component

_INT64_MAX = torch.iinfo(torch.int64).max


class Sampler(Component, abc.ABC):
    """Base class of replay-buffer samplers (see the module docstring for the contract)."""

    requires_shared_state: bool = True
    _rng: torch.Generator | None = None
    _remaining_batches: int = _INT64_MAX

    @abc.abstractmethod
    def sample(self, storage, batch_size: int) -> tuple[Any, dict]: ...

    def add(self, index) -> None:
        """Called after one item was written at ``index``."""

    def extend(self, index) -> None:
        """Called after a batch was written at ``index``."""

    def update_priority(self, index, priority, *, storage=None) -> None:
        """Sets priorities; only prioritized samplers use them."""
        import warnings

        warnings.warn(
            f"update_priority() was called on {type(self).__name__}, which is not prioritized; the priorities "
            f"are ignored. Use PrioritizedSampler (or PrioritizedReplayBuffer) to sample by priority.",
            UserWarning,
            stacklevel=2,
        )

    def mark_update(self, index, *, storage=None) -> None:
        """Called by the writer (through the buffer) after ``index`` was written."""

    @property
    def default_priority(self) -> float:
        return 1.0

    @property
    def ran_out(self) -> bool:
        """True when a finite sampler finished an epoch with its last batch."""
        return False

    @ran_out.setter
    def ran_out(self, value: bool) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None

    def _empty(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def check_batch_size(batch_size) -> int:
    """Validates a sampling ``batch_size`` (a positive int)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(
            f"`batch_size` must be a positive int, got {batch_size!r}. Pass it to sample() or to the buffer."
        )
    return batch_size


def unravel(flat: torch.Tensor, storage):
    """Flat cell positions -> what ``storage.get`` takes (the tensor itself for 1-D storages)."""
    if storage.ndim == 1:
        return flat
    return torch.unravel_index(flat, tuple(storage.shape))
