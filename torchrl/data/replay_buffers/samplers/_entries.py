"""Reading one entry of the stored items at given rows, for samplers that look at the data they draw."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase, is_tensorclass

from torchrl.data.replay_buffers.storages.tensor import TensorStorage


def _nested(item, key):
    if isinstance(item, TensorDictBase) or is_tensorclass(item):
        return item.get(key)
    for part in (key,) if isinstance(key, str) else key:
        item = item[part]
    return item


def values_at(storage, key, rows: torch.Tensor, *, who: str) -> torch.Tensor:
    """The stored values of entry ``key`` at ``rows`` (``[len(rows), ...]``) of a 1-D storage.

    Tensor storages gather from the stored column (no read of the other entries); other storages read the
    items and stack the entry. ``who`` names the sampler in error messages.

    Raises:
        KeyError: the items hold no entry ``key``.
        TypeError: the storage returns items that are not TensorDicts (or mappings).
    """
    if isinstance(storage, TensorStorage):
        column = storage.get_entry(key)
        if column is None:
            raise KeyError(key)
        return column[rows.to(column.device)]
    data = storage.get(rows)
    if isinstance(data, list):
        try:
            return torch.stack([torch.as_tensor(_nested(item, key)) for item in data])
        except (KeyError, TypeError, IndexError) as err:
            raise KeyError(key) from err
    if isinstance(data, TensorDictBase) or is_tensorclass(data):
        value = data.get(key, None)
        if value is None:
            raise KeyError(key)
        return value
    raise TypeError(
        f"{who} reads the entry {key!r} from the stored items, and this {type(storage).__name__} returns "
        f"{type(data).__name__}: store TensorDicts."
    )


def flags_at(storage, keys, rows: torch.Tensor, *, who: str) -> torch.Tensor:
    """``[len(rows), 1]`` bool on the CPU: whether any of the flags ``keys`` is set at ``rows``.

    Trailing dims of a flag are reduced with ``any``.
    """
    out = None
    for key in keys:
        values = values_at(storage, key, rows, who=who).reshape(rows.numel(), -1)
        flags = values if values.dtype == torch.bool else values != 0
        if flags.shape[1] != 1:
            flags = flags.any(-1, keepdim=True)
        flags = flags.cpu()
        out = flags if out is None else out.logical_or_(flags)
    return torch.zeros(rows.numel(), 1, dtype=torch.bool) if out is None else out
