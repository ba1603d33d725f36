"""Collate functions: :func:`tensordict_collate` (for DataLoaders) and :func:`stack_samples` (for buffers)."""

from __future__ import annotations

from typing import Any

from tensordict import collate as _td_collate


def stack_samples(batch: Any) -> Any:
    """A batch unchanged; a list of samples stacked with :func:`tensordict.collate` (what buffers use)."""
    if not isinstance(batch, list):
        return batch
    return _td_collate(batch)


def tensordict_collate(batch: Any) -> Any:
    """Collates replay-buffer samples for :class:`torch.utils.data.DataLoader` and for buffers.

    A batch that is already collated (a tensor, a TensorDict or tensorclass, or a tuple of them, e.g. what
    :meth:`~torchrl.data.StorageDataset.__getitems__` or ``rb.sample()`` return) is returned unchanged. A list
    of samples is stacked with :func:`tensordict.collate`: TensorDicts densely when they share keys and shapes
    and lazily (a :class:`~tensordict.LazyStackedTensorDict`) when they are ragged; tensors with
    :func:`torch.stack`; mappings and tuples element-wise.

    Use it as the ``collate_fn`` of a DataLoader over a replay buffer or a storage: torch's default collate
    (and ``default_convert`` when ``batch_size=None``) cannot pass a TensorDict batch through. It is a pure
    function: how a batch travels from a worker process to the main process is chosen by the dataset (its
    ``transport``), and wrapping this function (a lambda, :func:`functools.partial`) keeps that transport as
    long as the wrapper returns the batch it is given.

    Args:
        batch: a collated batch, or a list of samples.

    Returns:
        The batch.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import tensordict_collate
        >>> tensordict_collate([TensorDict(x=torch.zeros(2)), TensorDict(x=torch.ones(2))]).batch_size
        torch.Size([2])
        >>> td = TensorDict(x=torch.zeros(4, 2), batch_size=[4])
        >>> tensordict_collate(td) is td
        True
    """
    return stack_samples(batch)
