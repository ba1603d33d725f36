"""Reading the per-step values that delimit trajectories (done flags, trajectory ids) from a storage.

:func:`read_column` reads an entry over the filled rows (a view of a tensor storage's column), :func:`values_at`
and :func:`flags_at` at given rows, :func:`read_ring_range` over a range of ring rows (the live index's catch-up),
:func:`as_step_values` reshapes what was read to one value per step. :class:`~torchrl.data.ListStorage` items
(TensorDicts or mappings) are read one by one and stacked.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensorclass

from torchrl.data.replay_buffers.storages.list import ListStorage
from torchrl.data.replay_buffers.storages.tensor import TensorStorage


def _get_nested(item, key):
    if isinstance(item, TensorDictBase) or is_tensorclass(item):
        return item.get(key)
    for part in (key,) if isinstance(key, str) else key:
        if not isinstance(item, Mapping):  # e.g. a tensor item: it holds no entries
            raise KeyError(key)
        item = item[part]
    return item


def has_key(storage, key) -> bool:
    """Whether the items of ``storage`` hold an entry ``key`` (a str or a tuple of str)."""
    if isinstance(storage, TensorStorage):
        return storage.get_entry(key) is not None
    if isinstance(storage, ListStorage):
        if not len(storage):
            return False
        try:
            value = _get_nested(storage.get(0), key)
        except (KeyError, TypeError, IndexError, AttributeError):
            return False
        return value is not None  # TensorDict.get returns None for a missing key
    data = storage.get(slice(None))
    return isinstance(data, TensorDictBase) and data.get(key, None) is not None


def read_column(storage, key, n_rows: int) -> torch.Tensor:
    """The values of entry ``key`` over the filled rows of ``storage`` (``[n_rows, *cols, *feature]``).

    Tensor storages return a view of the backing (no copy); a :class:`ListStorage` stacks the items' values.
    """
    if isinstance(storage, TensorStorage):
        column = storage.get_entry(key)
        if column is None:
            raise KeyError(f"The storage holds no entry {key!r}.")
        return _check_column(column, key)[:n_rows]
    if isinstance(storage, ListStorage):
        values = [_check_column(_get_nested(item, key), key) for item in storage.get(slice(0, n_rows))]
        return torch.stack([torch.as_tensor(value) for value in values])
    data = storage.get(slice(None))
    if not isinstance(data, TensorDictBase):
        raise RuntimeError(
            f"Cannot read the entry {key!r} from a {type(storage).__name__} whose items are "
            f"{type(data).__name__}: store TensorDicts, or pass `ends=`/`trajectories=` (with "
            f"cache_values=True)."
        )
    return _check_column(data.get(key), key)[:n_rows]


def _check_column(value, key):
    """``value`` unless it is a group of entries (a sub-TensorDict), which holds no per-step values."""
    if isinstance(value, (TensorDictBase, Mapping)) or is_tensorclass(value):
        raise ValueError(
            f"The entry {key!r} is a group of entries ({type(value).__name__}), not one value per step: name "
            f"a tensor inside it, e.g. {(key if isinstance(key, tuple) else (key,)) + ('done',)!r}. A nested "
            f"key is one tuple: pass several end keys as a list, end_keys=[('next', 'done'), ...]."
        )
    return value


def as_step_values(column: torch.Tensor, n_rows: int, n_cols: int, *, name: str, reduce_any: bool):
    """Reshapes a column to ``[n_rows, n_cols]``: one value per step.

    Trailing feature dims of size 1 are dropped (a view); larger ones are reduced with ``any`` for flags, and
    refused for trajectory ids.
    """
    column = torch.as_tensor(column)
    lead = n_rows * n_cols
    if column.numel() == lead:
        return column.reshape(n_rows, n_cols)
    if column.ndim == 0 or column.shape[0] != n_rows or column.numel() % lead:
        raise ValueError(
            f"The {name} has shape {list(column.shape)}, which does not give one value per step of the "
            f"{n_rows} x {n_cols} stored steps. Pass one value per stored step."
        )
    if not reduce_any:
        raise ValueError(
            f"The {name} has shape {list(column.shape)}: trajectory ids must be one scalar per step "
            f"(shape [{n_rows}] or [{n_rows}, 1]{'' if n_cols == 1 else f' per env ({n_cols})'})."
        )
    return column.reshape(n_rows, n_cols, -1).any(-1)


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
            return torch.stack([torch.as_tensor(_get_nested(item, key)) for item in data])
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


def read_ring_range(storage, keys, is_done: bool, start: int, k: int, *, who: str) -> np.ndarray:
    """The done flags (OR-ed over ``keys``, bool) or the trajectory ids (``keys[0]``) of the ``k`` rows
    ``start, start + 1, ...`` (modulo the capacity) of a tensor storage, as a 1-D numpy array.

    A CPU column is read through a numpy view (a slice, or two when the range wraps); other dtypes go through
    :func:`values_at`.
    """
    capacity = int(storage.max_size)
    out = None
    for key in keys if is_done else keys[:1]:
        column = storage.get_entry(key)
        try:
            array = None if column is None else column.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, ...): read through torch
            array = None
        if array is None:
            rows = torch.arange(start, start + k).remainder_(capacity)
            values = values_at(storage, key, rows, who=who).reshape(k, -1)
            values = values != 0 if is_done and values.dtype != torch.bool else values
            array = values.numpy() if values.dtype in (torch.bool, torch.int64) else values.double().numpy()
        elif start + k <= capacity:
            array = array[start : start + k].reshape(k, -1)
        else:
            array = np.concatenate([array[start:], array[: start + k - capacity]]).reshape(k, -1)
        if not is_done:
            return array[:, 0]
        flags = array if array.dtype == np.bool_ else array != 0
        flags = flags[:, 0] if flags.shape[1] == 1 else flags.any(-1)
        out = flags if out is None else out | flags
    return out


def column_or_none(storage, key, n: int) -> torch.Tensor | None:
    """The stored values of ``key`` over the ``n`` filled rows (a view for tensor storages), or ``None`` when the
    storage (every item of a list storage) does not hold it."""
    if isinstance(storage, TensorStorage):
        column = storage.get_entry(key)
        return None if column is None else column[:n]
    data = storage.get(slice(0, n))
    if isinstance(data, list):
        values = [item.get(key, None) if isinstance(item, TensorDictBase) else None for item in data]
        if not values or any(v is None for v in values):
            return None
        return torch.stack([torch.as_tensor(v) for v in values])
    return data.get(key, None) if isinstance(data, TensorDictBase) else None
