"""The write path of a replay buffer, below its locks: the inverse transforms, the writer, the sampler.

``extend(data)`` -> :func:`as_stored_batch` (inverse transforms, the extend dim first) -> :func:`insert_gate` (a
rate limiter's permission, then readers woken) -> the buffer's lock -> :func:`write_locked` (the writer's
``prepare`` outside the storage's write lock, then cursor, rows, sampler and priorities under it). ``add`` goes
through :func:`inv_transform_item` and :func:`add_locked`; ``rb[index] = value`` through :func:`set_rows`, and the
in-place edits (``set_``, ``update_``) through :func:`edit_rows`. The buffer takes its locks (replay lock, then the
storage's ``write_lock``) and calls these functions with the components it read under them; each function takes
what it uses as arguments.
"""

from __future__ import annotations

import collections.abc
import contextlib

import torch
from tensordict import TensorDictBase

import torchrl.data.replay_buffers.replay_buffers._readiness as _readiness
from torchrl.data.replay_buffers.replay_buffers._batch_layout import move_dim_to_front, shares_memory
from torchrl.data.replay_buffers.storages import ListStorage, TensorStorage


@contextlib.contextmanager
def insert_gate(buffer, flow: _readiness.FlowState, limiter, n: int, timeout):
    """Around a write of ``n`` items: waits for the rate ``limiter``'s permission (when it blocks inserts), and
    wakes the waiting readers afterwards (NOTE [readiness and waiting] in ``_readiness.py``)."""
    if limiter is None or not limiter.blocks_inserts:
        if timeout is not None:
            _readiness.check_wait_args(False, timeout, None)
        yield
        flow.notify()
        return
    timeout = _readiness.check_wait_args(False, timeout, None)
    _readiness.reserve_insert(buffer, flow, limiter, n, timeout=timeout)
    try:
        yield
    finally:
        flow.release_inserts(n)


def inv_transform_item(transform, data):
    """One item through the inverse ``transform``; ``None`` when the transforms dropped it."""
    if isinstance(data, TensorDictBase):  # unsqueeze gives a new TensorDict: the caller's is untouched
        out = transform.inv(data.unsqueeze(0))
        if out is None or (out.batch_dims and out.batch_size[0] == 0):  # the transforms dropped the item
            return None
        return out.squeeze(0)
    return transform.inv(data)


def as_stored_batch(data, storage, transform, dim_extend: int):
    """``data`` through the inverse ``transform``, items first; ``None`` when the transforms dropped it."""
    if isinstance(storage, ListStorage) and isinstance(data, (range, tuple, set, collections.abc.Iterator)):
        data = list(data)  # a list storage takes any iterable of items, e.g. rb.extend(range(2000))
    if len(transform):
        if isinstance(data, TensorDictBase):
            data = data.clone(False)  # transforms edit the structure in place, not the caller's TensorDict
        data = transform.inv(data)
        if data is None:
            return None
    if dim_extend > 0:
        data = move_dim_to_front(data, dim_extend)
    return data


def add_locked(data, writer, sampler):
    """Writes one item (under the buffer's locks): consumed slots first for a consuming sampler; returns its
    index (``None``: a top-k writer rejected it)."""
    if sampler.consumes_items:  # consumed slots first (the writer was checked at construction)
        index = writer.add_free_first(data, sampler.free_slots)
    else:
        index = writer.add(data)
    if index is not None:
        sampler.add(index)
    return index


def write_locked(data, priority, storage, writer, sampler, update_priority) -> torch.Tensor:
    """Writes a batch (under the buffer's lock): the writer's ``prepare`` (validation) first, then, under the
    storage's write lock, the rows, the sampler and ``update_priority(index, priority)`` when ``priority`` is given."""
    if sampler.consumes_items:  # consumed slots first (the writer was checked at construction)
        with storage.write_lock:
            index = writer.extend_free_first(data, sampler.free_slots)
            sampler.extend(index)
        return index
    data = writer.prepare(data)
    with storage.write_lock:
        index = writer.extend(data)
        sampler.extend(index)
        if priority is not None and index.numel():
            update_priority(index, priority)
    return index


def set_rows(storage, index, value, dim_extend: int) -> None:
    """``storage[index] = value`` in the buffer's layout (under its locks); the overwritten items are new items
    for the sampler. A ``value`` whose memory overlaps the storage's (a read written back) is cloned first."""
    if isinstance(storage, TensorStorage) and len(storage) and shares_memory(value, storage[:]):
        value = value.clone()  # a read of the storage written back: source and destination overlap
    storage.set_in_layout(index, value, dim_extend)
    if isinstance(index, slice):
        index = torch.arange(*index.indices(storage.rows_written()))
    if not isinstance(index, tuple):  # overwritten items are new items for the sampler
        storage.mark_update(index)


def edit_rows(storage, index, edit) -> None:
    """Reads the rows at ``index`` (``None``: every row written), calls ``edit(rows)`` and writes them back
    without moving the cursor (under the buffer's locks); ``TypeError`` unless the storage holds TensorDicts."""
    if index is None:
        index = torch.arange(storage.rows_written())
    data = storage.get(index)
    if not isinstance(data, TensorDictBase):
        raise TypeError(
            f"In-place edits need a storage of TensorDicts; this buffer's storage returned "
            f"{type(data).__name__}. Write the new values with rb[index] = value instead."
        )
    edit(data)
    storage.set(index, data, set_cursor=False)
