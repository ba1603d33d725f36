"""The writer of a read-only buffer: :class:`ImmutableDatasetWriter`, which refuses every write."""

from __future__ import annotations

from torchrl.data.replay_buffers.errors import torchrl_error
from torchrl.data.replay_buffers.writers.base import Writer


class ImmutableDatasetWriter(Writer):
    """A writer that refuses every write: for buffers over a fixed dataset.

    Examples:
        >>> import torch
        >>> from torchrl.data import ImmutableDatasetWriter, LazyTensorStorage
        >>> writer = ImmutableDatasetWriter()
        >>> writer.register_storage(LazyTensorStorage(10))
        >>> writer.extend(torch.zeros(2))
        Traceback (most recent call last):
        ...
        RuntimeError: This dataset doesn't ...
    """

    def _refuse(self):
        raise torchrl_error("dataset_read_only", cls=type(self).__name__)

    def add(self, data):
        self._refuse()

    def extend(self, data):
        self._refuse()

    def _empty(self, empty_write_count: bool = True) -> None:
        self._refuse()
