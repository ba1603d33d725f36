"""What a buffer checks of its storage's capabilities when it is built.

A storage declares, as class attributes read here with ``getattr`` (storages import no sampler or writer):

- ``writable`` (default ``True``): ``False`` for a read-only storage (:class:`~torchrl.data.DatasetStorage`),
  whose buffer gets an :class:`~torchrl.data.ImmutableDatasetWriter` when no writer is given;
- ``stable_items`` (default ``True``): ``False`` when reading index ``i`` twice may give two different items
  and the storage cannot index trajectories; only samplers that draw indices uniformly fit such a storage.
"""

from __future__ import annotations

from collections.abc import Callable

from torchrl.data.replay_buffers.samplers import RandomSampler, SamplerWithoutReplacement, SliceSampler
from torchrl.data.replay_buffers.samplers._stable_items import unstable_items_error
from torchrl.data.replay_buffers.writers import ImmutableDatasetWriter, Writer


def default_writer_for(storage, default: Callable[..., Writer], compilable: bool) -> Writer:
    """The writer of a buffer built over ``storage`` without one: read-only storages get an
    :class:`~torchrl.data.ImmutableDatasetWriter`, the others ``default(compilable=compilable)``."""
    if not getattr(storage, "writable", True):
        return ImmutableDatasetWriter()
    return default(compilable=compilable)


def check_sampler_fits_storage(sampler, storage) -> None:
    """Raises ``TypeError`` when ``storage`` declares ``stable_items = False`` and ``sampler`` is not one that
    draws indices uniformly (``RandomSampler`` or ``SamplerWithoutReplacement``); the message is
    ``unstable_items_error``'s (``samplers/_stable_items.py``), which the prioritized and
    trajectory samplers also raise when used on such a storage directly."""
    if getattr(storage, "stable_items", True):
        return
    uniform = isinstance(sampler, (RandomSampler, SamplerWithoutReplacement)) and not isinstance(sampler, SliceSampler)
    if uniform:
        return
    raise unstable_items_error(sampler, storage)


def check_component(name: str, value, cls: type):
    """``value`` if it is a ``cls`` instance, else a ``TypeError`` naming the argument ``name``."""
    if not isinstance(value, cls):
        raise TypeError(f"`{name}` must be a {cls.__name__} instance, got {type(value).__name__}.")
    return value


def check_drop_last(sampler, batch_size) -> None:
    """As in TorchRL, a sampler built with ``drop_last=True`` needs the buffer's ``batch_size`` (ValueError)."""
    if getattr(sampler, "drop_last", False) and batch_size is None:
        raise ValueError(
            f"{type(sampler).__name__}(drop_last=True) drops the last batch of an epoch when it is "
            f"shorter than the buffer's batch size, and the buffer has none. Pass "
            f"ReplayBuffer(..., batch_size=N), or drop_last=False."
        )
