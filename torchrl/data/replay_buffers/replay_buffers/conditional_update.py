"""What :meth:`ReplayBuffer.update_if_present <torchrl.data.ReplayBuffer.update_if_present>` did with each row:
:class:`ConditionalUpdateResult`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ConditionalUpdateResult"]


@dataclass
class ConditionalUpdateResult:
    """What :meth:`~torchrl.data.ReplayBuffer.update_if_present` did with each requested row.

    Attributes:
        updated (torch.Tensor): bool, ``True`` where the patch was written.
        version_rejected (torch.Tensor): bool, ``True`` where the row was still there but its stored
            version was newer (or, with ``require_newer=True``, not older) than the patch's.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, TensorDictRoundRobinWriter
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2),
        ...                             writer=TensorDictRoundRobinWriter(track_generations=True))
        >>> _ = rb.extend(TensorDict(obs=torch.arange(2), batch_size=[2]))
        >>> _ = rb.add(TensorDict(obs=torch.tensor(7)))  # overwrites row 0: its generation changes
        >>> result = rb.update_if_present(index=torch.arange(2), generation=torch.zeros(2, dtype=torch.long),
        ...                               patch=TensorDict(obs=torch.full((2,), -1), batch_size=[2]))
        >>> result.updated.tolist(), result.stale_count, rb[:]["obs"].tolist()
        ([False, True], 1, [7, -1])
    """

    updated: torch.Tensor
    version_rejected: torch.Tensor

    @property
    def updated_count(self) -> int:
        return int(self.updated.sum())

    @property
    def version_rejected_count(self) -> int:
        return int(self.version_rejected.sum())

    @property
    def stale_count(self) -> int:
        """Rows not updated because they were overwritten (or emptied) since they were read."""
        return int((~self.updated & ~self.version_rejected).sum())
