"""Swapping a component of a running replay buffer (``set_storage``, ``set_writer``, ``set_sampler``).

Every check runs before anything changes (:func:`check_swap`). The buffer's ``_swap`` then waits for the
prefetch tasks in flight, takes its locks, replaces the component and wires the new one with these functions:
the storage is attached to the buffer and the writer resumes after the rows it holds; a shared buffer shares
the new component; the sampler learns of the items already stored (:func:`announce_items`).
"""

from __future__ import annotations

import contextlib

import torch

from torchrl.data.replay_buffers.replay_buffers._batch_layout import next_row
from torchrl.data.replay_buffers.replay_buffers._checks import (
    check_component,
    check_consuming_buffer,
    check_drop_last,
    check_sampler_fits_storage,
)
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.writers import Writer


def check_swap(role: str, *, storage, sampler, writer, prefetch: int, batch_size: int | None) -> None:
    """Checks the buffer that swapping its ``role`` component (``"storage"``, ``"writer"`` or ``"sampler"``)
    would give: the new component (passed under its role) with the other two."""
    check_component(role, {"storage": storage, "sampler": sampler, "writer": writer}[role],
                    {"storage": Storage, "sampler": Sampler, "writer": Writer}[role])  # fmt: skip
    if role != "writer":
        check_sampler_fits_storage(sampler, storage)
    check_consuming_buffer(sampler, storage, writer, prefetch)
    if role == "sampler":
        check_drop_last(sampler, batch_size)


def move_to_storage(buffer, previous, storage, writer, *, shared: bool) -> None:
    """Detaches ``buffer`` from its ``previous`` storage and attaches it to ``storage``: ``writer`` writes there
    from now on, after the rows it holds (its write count kept); a ``shared`` buffer shares the new storage."""
    previous.detach(buffer)
    storage.attach(buffer)
    writer.register_storage(storage)
    if getattr(storage, "writable", True):  # the writer starts after the rows the new storage holds
        writer._empty(empty_write_count=False)
        if len(storage):
            with contextlib.suppress(AttributeError):  # a writer that keeps no cursor
                writer._cursor = next_row(storage)
    if shared and hasattr(storage, "share_memory_"):
        storage.share_memory_()


def announce_items(sampler, storage) -> None:
    """Tells ``sampler`` of the items ``storage`` holds (a prioritized sampler gives them its default priority)."""
    if len(storage):
        sampler.mark_update(torch.arange(len(storage)), storage=storage)
