"""Buffer methods and constructor keywords that TorchRL code relies on: :class:`BufferCompatMixin`.

:class:`~torchrl.data.ReplayBuffer` inherits the mixin, which keeps ``base.py`` to the read/write paths. The
methods here only use the buffer's components (``_storage``, ``_writer``, ``_sampler``) and its locks.

In-place edits (:meth:`~BufferCompatMixin.set_`, :meth:`~BufferCompatMixin.set_at_`,
:meth:`~BufferCompatMixin.update_`, :meth:`~BufferCompatMixin.update_if_present`) read the rows, edit the
copy and write it back with ``storage.set(rows, data, set_cursor=False)`` under the buffer's locks: they act
on what is stored (no transform runs) and only on TensorDict data.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from torchrl._validation import check_bool, check_positive_int
from torchrl.data.replay_buffers.sample_units import check_sample_unit
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler
from torchrl.data.replay_buffers.samplers.consuming import ConsumingSampler
from torchrl.data.replay_buffers.writers import ImmutableDatasetWriter

# the iterator behind ReplayBuffer.next(), per buffer: kept out of the buffer's __dict__ (never pickled)
_NEXT_ITERATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class ConditionalUpdateResult:
    """What :meth:`BufferCompatMixin.update_if_present` did with each requested row.

    Attributes:
        updated (torch.Tensor): bool, ``True`` where the patch was written.
        version_rejected (torch.Tensor): bool, ``True`` where the row was still there but its stored
            version was newer (or, with ``require_newer=True``, not older) than the patch's.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, TensorDictRoundRobinWriter
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2),
        ...                             writer=TensorDictRoundRobinWriter(track_generations=True))
        >>> _ = rb.extend(TensorDict(obs=torch.arange(2), batch_size=[2]))
        >>> _ = rb.add(TensorDict(obs=torch.tensor(7)))  # overwrites row 0: its generation changes
        >>> result = rb.update_if_present(index=torch.arange(2), generation=torch.zeros(2, dtype=torch.long),
        ...                               patch=TensorDict(obs=torch.full((2,), -1), batch_size=[2]))
        >>> result.updated.tolist(), result.stale_count, rb[:]["obs"].tolist()
        ([False, True], 1, [7, -1])
    """

    updated: torch.Tensor
    version_rejected: torch.Tensor

    @property
    def updated_count(self) -> int:
        return int(self.updated.sum())

    @property
    def version_rejected_count(self) -> int:
        return int(self.version_rejected.sum())

    @property
    def stale_count(self) -> int:
        """Rows not updated because they were overwritten (or emptied) since they were read."""
        return int((~self.updated & ~self.version_rejected).sum())


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


class BufferCompatMixin:
    """TorchRL's buffer methods: statistics, in-place edits, conditional updates, ``next()``, hooks."""

    _sample_unit = None
    _compilable = False

    @property
    def sample_unit(self):
        """The :class:`~torchrl.data.replay_buffers.sample_units.SampleUnit` that turns drawn positions into
        the positions read (``None``: one item per position)."""
        return self._sample_unit

    @property
    def initialized(self) -> bool:
        """Always ``True``: a buffer is built at once (``delayed_init`` is accepted without effect)."""
        return True

    def stats(self) -> dict[str, Any]:
        """``{"size", "write_count", "prefetch_queue_size", "initialized"}``, plus ``"capacity"`` and
        ``"utilization"`` (size / capacity) for a storage of finite capacity."""
        out = {
            "size": len(self),
            "write_count": self.write_count,
            "prefetch_queue_size": len(self._prefetch_queue),
            "initialized": True,
        }
        capacity = getattr(self._storage, "max_size", None)
        if capacity is not None and capacity < torch.iinfo(torch.int64).max:
            out["capacity"] = int(capacity)
            out["utilization"] = len(self) / capacity if capacity else 0.0
        return out

    # -- in-place edits of the stored data ------------------------------------------------------------------
    def _edit_rows(self, index, edit) -> None:
        with self._replay_lock, self._storage.write_lock:
            if index is None:
                index = torch.arange(self._storage.rows_written())
            data = self._storage.get(index)
            if not isinstance(data, TensorDictBase):
                raise TypeError(
                    f"In-place edits need a storage of TensorDicts; this buffer's storage returned "
                    f"{type(data).__name__}. Write the new values with rb[index] = value instead."
                )
            edit(data)
            self._storage.set(index, data, set_cursor=False)

    def set_(self, key, value) -> None:
        """Sets entry ``key`` of every stored item to ``value`` (shaped like the stored rows)."""
        self._edit_rows(None, lambda data: data.set_(key, value))

    def set_at_(self, key, value, index) -> None:
        """Sets entry ``key`` of the stored items at ``index`` (rows) to ``value``."""
        self._edit_rows(torch.as_tensor(index, dtype=torch.long), lambda data: data.set_(key, value))

    def update_(self, tensordict: TensorDictBase, clone: bool = False, *, keys_to_update=None) -> None:
        """Updates the stored items in place with the entries of ``tensordict`` (shaped like the stored rows)."""
        src = tensordict.clone() if clone else tensordict
        self._edit_rows(None, lambda data: data.update_(src, keys_to_update=keys_to_update))

    def read_all_in_order(self, end: int | None = None):
        """The stored items in storage order, up to ``end`` (``rb[:end]``)."""
        return self[:end]

    def write_all(self, data, end: int | None = None) -> None:
        """Overwrites the stored items up to ``end`` (``rb[:end] = data``)."""
        self[:end] = data

    def update_if_present(
        self, *, index, generation, patch: TensorDictBase, version_key=None, version=None, require_newer=False
    ) -> ConditionalUpdateResult:
        """Writes ``patch`` into the rows at ``index`` that were not overwritten since they were read.

        ``generation`` is what ``info["index_generation"]`` held when the rows were sampled; a row whose
        generation changed since (overwritten or emptied) is left alone. With ``version_key``, a row is also
        left alone when its stored version is newer than ``version`` (or not older, with
        ``require_newer=True``); written rows get ``version`` in that entry. Needs a writer built with
        ``track_generations=True``.

        Returns:
            ConditionalUpdateResult: the ``updated`` and ``version_rejected`` masks over ``index``.
        """
        if not self._writer.tracks_generations:
            raise RuntimeError(
                "update_if_present() compares slot generations: build the writer with "
                "RoundRobinWriter(track_generations=True) (or TensorDictRoundRobinWriter(track_generations=True))."
            )
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        generation = torch.as_tensor(generation, dtype=torch.long).reshape(-1).expand_as(index)
        with self._replay_lock, self._storage.write_lock:
            fresh = self._writer.generations_of(index) == generation
            rejected = torch.zeros_like(fresh)
            if version_key is not None:
                if version is None:
                    raise ValueError("`version_key` needs `version`, the version of the patch.")
                version = torch.as_tensor(version).reshape(-1).expand(index.shape)
                stored = self._storage.get(index).get(version_key).reshape(index.shape[0], -1)[:, 0]
                ok = version > stored if require_newer else version >= stored
                rejected = fresh & ~ok
                fresh = fresh & ok
            if bool(fresh.any()):
                rows = index[fresh]
                part = patch[fresh] if patch.batch_dims else patch.expand(rows.shape[0])
                current = self._storage.get(rows)
                current.update(part)
                if version_key is not None:
                    current.set(version_key, version[fresh].to(current.get(version_key).dtype))
                self._storage.set(rows, current, set_cursor=False)
        return ConditionalUpdateResult(updated=fresh, version_rejected=rejected)

    # -- iteration and hooks -------------------------------------------------------------------------------
    def next(self):
        """One batch of a persistent iteration over the buffer (see ``__iter__``); ``None`` once the sampler
        ran out, after which the next call starts a new pass."""
        iterator = _NEXT_ITERATORS.get(self)
        if iterator is None:
            iterator = _NEXT_ITERATORS[self] = iter(self)
        try:
            return next(iterator)
        except StopIteration:
            _NEXT_ITERATORS.pop(self, None)
            return None

    def register_save_hook(self, hook) -> None:
        """Forwarded to the storage's checkpointer, which refuses hooks (they would run arbitrary code on the
        saved data: this checkpoint format runs none)."""
        self._storage.checkpointer.register_save_hook(hook)

    def register_load_hook(self, hook) -> None:
        """Forwarded to the storage's checkpointer, which refuses hooks (see :meth:`register_save_hook`)."""
        self._storage.checkpointer.register_load_hook(hook)
