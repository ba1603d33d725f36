"""How a replay buffer's arguments become its components: the checks of the constructor's arguments, the
defaults (storage, writer, sampler, transforms) and the checks of the components together.

A buffer built with delayed init (TorchRL's ``delayed_init``/``transform_factory``) keeps what it was given
until its first write; :func:`built_components` builds the instances (then, or at construction). The
buffer's ``__init__``, ``_build`` and ``_ready`` call these functions and wire what they return (attach the
storage, share, seed).
Every function takes the values it checks as arguments and raises an error that names the argument and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from torchrl._validation import check_int
from torchrl.data.replay_buffers.errors import torchrl_error
from torchrl.data.replay_buffers.replay_buffers._checks import (
    built,
    check_compat_keywords,
    check_component,
    check_consuming_buffer,
    check_drop_last,
    check_sample_batch_size,
    check_sampler_fits_storage,
    component_or_factory,
    consuming_sampler_for,
    default_writer_for,
)
from torchrl.data.replay_buffers.replay_buffers.rate_limiters import RateLimiter
from torchrl.data.replay_buffers.samplers import RandomSampler, Sampler
from torchrl.data.replay_buffers.storages import ListStorage, Storage
from torchrl.data.replay_buffers.writers import Writer
from torchrl.envs.transforms.transforms import Compose, as_transform


class CheckedArguments(NamedTuple):
    """The constructor's arguments once checked (components may still be zero-argument factories)."""

    transform: Any
    compilable: bool
    sample_unit: Any
    delay: bool
    batch_size: int | None
    storage: Any
    sampler: Any
    writer: Any


def check_arguments(
    *, rate_limiter, transform, transform_factory, consume_after_n_samples, compilable, delayed_init, sample_unit,
    batch_size, prefetch, shared, storage, sampler, writer, dim_extend, generator,
) -> CheckedArguments:  # fmt: skip
    """Checks the arguments of ``ReplayBuffer(...)``, in the order the constructor always did."""
    if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
        raise TypeError(
            f"`rate_limiter` must be a RateLimiter (MinSize, SampleToInsertRatio) or None, got "
            f"{type(rate_limiter).__name__}."
        )
    transform, compilable, sample_unit, delay = check_compat_keywords(
        transform=transform, transform_factory=transform_factory, consume_after_n_samples=consume_after_n_samples,
        compilable=compilable, delayed_init=delayed_init, sample_unit=sample_unit,
    )  # fmt: skip
    batch_size = None if batch_size is None else check_sample_batch_size(batch_size)
    check_int("prefetch", prefetch, minimum=0, allow_none=True, type_error=False)
    if prefetch and shared:
        raise torchrl_error("prefetch_shared", prefetch=prefetch)
    consuming = consume_after_n_samples is not None or getattr(sampler, "consumes_items", False)
    if prefetch and batch_size is None and not consuming:  # consuming: refused when built, as in TorchRL
        raise ValueError("`prefetch` samples ahead with the buffer's `batch_size`: pass batch_size too.")
    check_int("dim_extend", dim_extend, minimum=0, allow_none=True, type_error=False)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"`generator` must be a torch.Generator or None, got {type(generator).__name__}.")
    storage = component_or_factory("storage", storage, Storage)
    sampler = component_or_factory("sampler", sampler, Sampler)
    writer = component_or_factory("writer", writer, Writer)
    if delay and isinstance(sampler, Sampler):  # a delayed buffer checks what it can at construction
        check_drop_last(sampler, batch_size)
    return CheckedArguments(transform, compilable, sample_unit, delay, batch_size, storage, sampler, writer)


def checked_components(
    storage, sampler, writer, *, compilable: bool, default_writer: Callable[..., Writer], consume_after_n_samples,
    prefetch: int, batch_size: int | None, checkpointer,
) -> tuple[Storage, Sampler, Writer]:  # fmt: skip
    """``(storage, sampler, writer)`` of a buffer: the defaults for the ``None`` ones (``ListStorage(1000)``,
    ``default_writer``, :class:`RandomSampler` or the consuming sampler), checked together; ``checkpointer``
    (TorchRL's keyword, the storage's dumps/loads layout) is set on the storage when given."""
    storage = ListStorage(1000, compilable=compilable) if storage is None else storage
    writer = default_writer_for(storage, default_writer, compilable) if writer is None else writer
    storage = check_component("storage", storage, Storage)
    sampler = consuming_sampler_for(sampler, consume_after_n_samples)
    sampler = check_component("sampler", sampler if sampler is not None else RandomSampler(), Sampler)
    writer = check_component("writer", writer, Writer)
    check_sampler_fits_storage(sampler, storage)
    check_consuming_buffer(sampler, storage, writer, prefetch)
    check_drop_last(sampler, batch_size)
    if checkpointer is not None:
        storage.checkpointer = checkpointer
    return storage, sampler, writer


def built_components(storage, sampler, writer, transform, transform_factory) -> tuple:
    """``(storage, sampler, writer, transform)`` with the zero-argument factories called (checked), at
    construction or, with delayed init, at the first write (``transform_factory``: called when given)."""
    storage = built("storage", storage, Storage)
    sampler = built("sampler", sampler, Sampler)
    writer = built("writer", writer, Writer)
    if transform_factory is not None:
        transform = transform_factory()
    return storage, sampler, writer, transform


def as_compose(transform) -> Compose:
    """``transform`` as the buffer's :class:`~torchrl.envs.transforms.Compose` (empty for ``None``)."""
    if transform is None:
        return Compose()
    if isinstance(transform, Compose):
        return transform
    return Compose(as_transform(transform))
