"""What a buffer checks of its arguments and components, at construction and when a component is swapped.

Each check takes the values it checks as arguments and raises an error that names the argument and the fix.

A storage declares two capabilities, as class attributes read here with ``getattr`` (storages import no
sampler or writer):

- ``writable`` (default ``True``): ``False`` for a read-only storage (:class:`~torchrl.data.DatasetStorage`),
  whose buffer gets an :class:`~torchrl.data.ImmutableDatasetWriter` when no writer is given;
- ``stable_items`` (default ``True``): ``False`` when reading index ``i`` twice may give two different items
  and the storage cannot index trajectories; only samplers that draw indices uniformly fit such a storage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchrl._validation import check_bool, check_positive_int
from torchrl.data.replay_buffers.sample_units import check_sample_unit
from torchrl.data.replay_buffers.samplers import (
    PrioritizedSampler,
    RandomSampler,
    SamplerWithoutReplacement,
    SliceSampler,
)
from torchrl.data.replay_buffers.samplers._stable_items import unstable_items_error
from torchrl.data.replay_buffers.samplers.consuming import ConsumingSampler
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


def check_compat_keywords(
    *, transform, transform_factory, consume_after_n_samples, compilable, delayed_init, sample_unit
) -> tuple[Any, bool, Any]:
    """Validates TorchRL's buffer keywords; returns ``(transform, compilable, sample_unit)``."""
    if transform_factory is not None:
        if transform is not None:
            raise TypeError("Pass `transform` or `transform_factory`, not both.")
        if not callable(transform_factory):
            raise TypeError(f"`transform_factory` must be a zero-argument callable, got {transform_factory!r}.")
        transform = transform_factory()
    if consume_after_n_samples is not None:  # the sampler is built by consuming_sampler_for()
        check_positive_int("consume_after_n_samples", consume_after_n_samples)
    if delayed_init is not None:
        check_bool("delayed_init", delayed_init)  # accepted; the buffer is always built at once
    compilable = False if compilable is None else check_bool("compilable", compilable)
    return transform, compilable, check_sample_unit(sample_unit)


def consuming_sampler_for(sampler, consume_after_n_samples: int | None):
    """The sampler of a buffer built with ``sampler`` and ``consume_after_n_samples`` (validated positive int).

    As in TorchRL: ``None`` keeps ``sampler``; with a positive int, the default sampler (``None`` or a
    :class:`~torchrl.data.RandomSampler`) becomes ``ConsumingSampler(consume_after_n_samples)``, a
    :class:`~torchrl.data.ConsumingSampler` must have that ``max_sample_count``, and any other sampler raises a
    ``ValueError``.
    """
    if consume_after_n_samples is None:
        return sampler
    n = consume_after_n_samples
    if sampler is None or type(sampler) is RandomSampler:
        return ConsumingSampler(n)
    if isinstance(sampler, ConsumingSampler):
        if sampler.max_sample_count != n:
            raise ValueError(
                f"`consume_after_n_samples`={n} contradicts the sampler {sampler!r}. Pass one of them, or the "
                f"same count to both."
            )
        return sampler
    if isinstance(sampler, PrioritizedSampler):
        raise ValueError(
            f"`consume_after_n_samples`={n} cannot be combined with the prioritized sampler "
            f"{type(sampler).__name__}: consumption removes items from the draw, which the priority trees do "
            f"not model. Drop `consume_after_n_samples`, or sample uniformly (the default sampler)."
        )
    raise ValueError(
        f"`consume_after_n_samples`={n} replaces the default RandomSampler by ConsumingSampler({n}), and this "
        f"buffer was given {type(sampler).__name__}. Leave `sampler` out, or pass sampler=ConsumingSampler({n})."
    )


def check_consuming_buffer(sampler, storage, writer, prefetch) -> None:
    """Refuses what a buffer with a :class:`~torchrl.data.ConsumingSampler` cannot do (ValueError)."""
    if not isinstance(sampler, ConsumingSampler):
        return
    if storage.ndim != 1:
        raise ValueError(
            f"ConsumingSampler tracks the items of a 1-D storage, and the storage has ndim={storage.ndim}. Use a "
            f"storage with ndim=1, or another sampler."
        )
    if prefetch:
        raise ValueError(
            f"A buffer with ConsumingSampler cannot prefetch (`prefetch`={prefetch}): a batch sampled ahead "
            f"consumes its items before anyone receives it, and they are lost with the queue (rb.empty(), a "
            f"checkpoint, the end of the program). Pass prefetch=None."
        )
    if not writer.fills_free_slots and not isinstance(writer, ImmutableDatasetWriter):
        raise ValueError(
            f"ConsumingSampler needs a writer that fills consumed slots first (RoundRobinWriter, "
            f"TensorDictRoundRobinWriter) or none (ImmutableDatasetWriter); got {type(writer).__name__}. Use "
            f"one of these writers, or another sampler."
        )
    if storage.max_size < 2**40:  # the slots a shared sampler allocates (unbounded list storages: none)
        sampler.reserve(storage.max_size)
