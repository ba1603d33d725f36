"""The writer of a read-only buffer: :class:`ImmutableDatasetWriter`, which refuses every write."""

from __future__ import annotations

from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers.writers.writer import Writer

DATASET_READ_ONLY = TorchRLPhrase(
    RuntimeError,
    "This dataset doesn't allow writing.",
    "This dataset doesn't allow writing. The buffer is read-only ({cls}): it does not accept "
    "add/extend/empty. Build the buffer with writer=RoundRobinWriter() to write data.",
)


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
        raise DATASET_READ_ONLY.error(cls=type(self).__name__)

    def add(self, data):
        self._refuse()

    def extend(self, data):
        self._refuse()

    def _empty(self, empty_write_count: bool = True) -> None:
        self._refuse()
