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

import os
from collections.abc import Callable
from typing import Any

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool, check_positive_int
from torchrl.data.replay_buffers.errors import TypeRuntimeError
from torchrl.data.replay_buffers.sample_units import check_sample_unit
from torchrl.data.replay_buffers.samplers import (
    RandomSampler,
    SamplerWithoutReplacement,
    SliceSampler,
)
from torchrl.data.replay_buffers.samplers._stable_items import unstable_items_error
from torchrl.data.replay_buffers.samplers.consuming import CONSUMING_NDIM, ConsumingSampler
from torchrl.data.replay_buffers.writers import ImmutableDatasetWriter, Writer

DROP_LAST_BATCH_SIZE = TorchRLPhrase(
    ValueError,
    "Samplers with drop_last=True must work with a predictable batch-size",
    "Samplers with drop_last=True must work with a predictable batch-size: {sampler} drops the last "
    "incomplete batch, which needs the batch size when the buffer is built. Pass batch_size=... to the "
    "buffer, or build the sampler with drop_last=False.",
)
TRANSFORM_WRITE_STATE = TorchRLPhrase(
    RuntimeError,
    "write state",
    "{cls} keeps a write state (requires_shared_write_state=True) but has no share_memory_() method, so "
    "processes sharing this buffer would each update a private copy. Give the transform a share_memory_() "
    "method that moves its write state to shared memory, or use the buffer in one process (shared=False).",
)
CONSUMING_SAMPLER = TorchRLPhrase(
    ValueError,
    "only supports the default RandomSampler",
    "consume_after_n_samples only supports the default RandomSampler, got {sampler}: consumption draws "
    "uniformly among the items left (priorities and epochs do not model items leaving the draw). Leave "
    "`sampler` out (ConsumingSampler({n}) is built for you), or drop consume_after_n_samples.",
)
CONSUMING_PREFETCH = TorchRLPhrase(
    ValueError,
    "Prefetching is not supported",
    "Prefetching is not supported with consumption (consume_after_n_samples or a ConsumingSampler; got "
    "prefetch={prefetch}): a batch sampled ahead consumes its items before anyone receives it, and they are "
    "lost with the queue. Pass prefetch=0 (or leave it out), or sample without consumption.",
)
CONSUMING_WRITER = TorchRLPhrase(
    TypeRuntimeError,
    "requires a writer with a callable",
    "{cls} requires a writer with a callable `write_at(index, data)` to refill consumed slots, got {writer}. "
    "Use a RoundRobinWriter (the default).",
)

DATA_PARALLEL_PREFETCH = TorchRLPhrase(
    RuntimeError,
    r"do not support owner-side prefetching\. Construct the replay buffer with prefetch=0\.",
    "This buffer prefetches (prefetch={prefetch}) and serves data-parallel ranks: DataParallelReplayBufferClients "
    "do not support owner-side prefetching. Construct the replay buffer with prefetch=0. (Batches sampled ahead "
    "have the buffer's batch size, not a rank's share of the global batch.)",
)


def check_data_parallel_owner(prefetch: int) -> None:
    """Refuses a buffer that prefetches as the owner of data-parallel ranks (``_sample_data_parallel``)."""
    if prefetch:
        raise DATA_PARALLEL_PREFETCH.error(prefetch=prefetch)


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
        raise DROP_LAST_BATCH_SIZE.error(sampler=f"{type(sampler).__name__}(drop_last=True)")


def _physical_memory_bytes() -> int:
    """The machine's physical memory in bytes (``2**63 - 1`` when the platform does not say)."""
    global _MEMORY_BYTES
    if _MEMORY_BYTES is None:
        try:
            _MEMORY_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, OSError, ValueError):
            _MEMORY_BYTES = 2**63 - 1
    return _MEMORY_BYTES


_MEMORY_BYTES: int | None = None


def check_sample_batch_size(batch_size) -> int:
    """``batch_size`` of a ``sample()`` call, validated before anything is allocated: a positive int whose int64
    indices alone (8 bytes each) fit in the machine's physical memory, else a ``ValueError`` naming
    ``batch_size`` (rather than the allocator's error once the draw started)."""
    batch_size = check_positive_int("batch_size", batch_size, type_error=False)
    if batch_size * 8 > _physical_memory_bytes():
        raise ValueError(
            f"`batch_size`={batch_size} cannot be sampled: its indices alone take {batch_size * 8 / 2**30:.0f} GiB "
            f"(8 bytes each), more than this machine's {_physical_memory_bytes() / 2**30:.0f} GiB of memory. "
            f"Pass a smaller batch_size, or sample several smaller batches."
        )
    return batch_size


def share_transform_write_state(transform) -> None:
    """Moves the write state of the transforms in ``transform`` (an :class:`torch.nn.Module`, its sub-transforms
    included) that declare ``requires_shared_write_state = True`` to shared memory with their ``share_memory_()``.

    All are checked first: one without a callable ``share_memory_`` raises TorchRL's ``RuntimeError`` ("write
    state") and nothing is shared.
    """
    modules = transform.modules() if hasattr(transform, "modules") else (transform,)
    stateful = [m for m in modules if getattr(m, "requires_shared_write_state", False)]
    for module in stateful:
        if not callable(getattr(module, "share_memory_", None)):
            raise TRANSFORM_WRITE_STATE.error(cls=type(module).__name__)
    for module in stateful:
        module.share_memory_()


def check_compat_keywords(
    *, transform, transform_factory, consume_after_n_samples, compilable, delayed_init, sample_unit
) -> tuple[Any, bool, Any, bool]:
    """Validates TorchRL's buffer keywords; returns ``(transform, compilable, sample_unit, delay)``.

    ``delay`` (whether the components are built at the first write, TorchRL's delayed init) is ``delayed_init``,
    or, when that is ``None``, whether ``transform_factory`` is given. ``transform`` is then the factory itself
    (called by the first write); without delay, the factory's transform.
    """
    if transform_factory is not None:
        if transform is not None:
            raise TypeError("Pass `transform` or `transform_factory`, not both.")
        if not callable(transform_factory):
            raise TypeError(f"`transform_factory` must be a zero-argument callable, got {transform_factory!r}.")
    if consume_after_n_samples is not None:  # the sampler is built by consuming_sampler_for()
        check_positive_int("consume_after_n_samples", consume_after_n_samples)
    if delayed_init is not None:
        check_bool("delayed_init", delayed_init)
    delay = delayed_init if delayed_init is not None else transform_factory is not None
    if transform_factory is not None:
        transform = transform_factory if delay else transform_factory()
    compilable = False if compilable is None else check_bool("compilable", compilable)
    return transform, compilable, check_sample_unit(sample_unit), delay


def component_or_factory(name: str, value, cls: type):
    """``value`` (``None``, a ``cls`` instance, or a zero-argument callable that builds one, e.g.
    ``functools.partial(ListStorage, 100)``, as TorchRL accepts); else a ``TypeError`` naming ``name``."""
    if value is None or isinstance(value, cls) or callable(value):
        return value
    raise TypeError(
        f"`{name}` must be a {cls.__name__} instance or a zero-argument callable returning one, got "
        f"{type(value).__name__}."
    )


def built(name: str, value, cls: type):
    """``value`` if it is a ``cls`` instance; the result of calling it if it is a factory (checked)."""
    if value is not None and not isinstance(value, cls) and callable(value):
        try:
            made = value()
        except TypeError as err:
            raise TypeError(
                f"`{name}` must be a {cls.__name__} instance or a zero-argument callable returning one; calling "
                f"{getattr(value, '__name__', value)!r}() failed ({err}). Pass an instance, or bind the "
                f"arguments it needs with functools.partial (e.g. partial(LazyTensorStorage, 100))."
            ) from err
        if not isinstance(made, cls):
            raise TypeError(f"`{name}` factory {value!r} returned a {type(made).__name__}, not a {cls.__name__}.")
        return made
    return value


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
    raise CONSUMING_SAMPLER.error(sampler=type(sampler).__name__, n=n)


def check_consuming_buffer(sampler, storage, writer, prefetch) -> None:
    """Refuses what a buffer with a :class:`~torchrl.data.ConsumingSampler` cannot do (ValueError)."""
    if not isinstance(sampler, ConsumingSampler):
        return
    if storage.ndim != 1:
        raise CONSUMING_NDIM.error(cls=type(sampler).__name__, ndim=storage.ndim)
    if prefetch:
        raise CONSUMING_PREFETCH.error(prefetch=prefetch)
    if not callable(getattr(writer, "write_at", None)) and not isinstance(writer, ImmutableDatasetWriter):
        raise CONSUMING_WRITER.error(cls=type(sampler).__name__, writer=type(writer).__name__)
    if not writer.fills_free_slots and not isinstance(writer, ImmutableDatasetWriter):
        raise ValueError(
            f"ConsumingSampler needs a writer that fills consumed slots first (RoundRobinWriter, "
            f"TensorDictRoundRobinWriter) or none (ImmutableDatasetWriter); got {type(writer).__name__}. Use "
            f"one of these writers, or another sampler."
        )
    if storage.max_size < 2**40:  # the slots a shared sampler allocates (unbounded list storages: none)
        sampler.reserve(storage.max_size)
