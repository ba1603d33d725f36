"""What a dataset over a buffer uses: :meth:`as_dataset` and the hooks for DataLoader adapters.

A mixin of :class:`~torchrl.data.ReplayBuffer`. :class:`~torchrl.data.ReplayBufferDataset` (and a user's own
dataset) reads a buffer through these public methods only, so that any object offering them can be read the
same way (see the module docstring of :mod:`torchrl.data.replay_buffers.replay_buffers.dataset`).
"""

from __future__ import annotations

from typing import Any

from torchrl.data.replay_buffers.replay_buffers.dataset import ReplayBufferDataset

__all__ = ["WorkerHooksMixin"]


class WorkerHooksMixin:
    """``as_dataset``, ``stateful_component``, ``pin_epoch``/``unpin_epoch`` and ``prepare_worker_copy``."""

    def as_dataset(
        self,
        *,
        num_batches: int | None = None,
        transport: str = "ring",
        share_sampler: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> ReplayBufferDataset:
        """An iterable :class:`torch.utils.data.IterableDataset` of sampled batches, for DataLoader workers.

        See :class:`~torchrl.data.ReplayBufferDataset` for ``num_batches``, ``transport`` (how worker
        processes send batches back: ``"ring"``, ``"consolidated"`` or ``"torch"``), ``share_sampler``
        (a stateful sampler's state moves to shared memory, see :ref:`stateful-samplers-in-workers`) and
        ``rank``/``world_size`` (data-parallel ranks; read from :mod:`torch.distributed` when not given).
        """
        return ReplayBufferDataset(
            self, num_batches=num_batches, transport=transport, share_sampler=share_sampler, rank=rank,
            world_size=world_size,
        )

    # -- hooks for DataLoader adapters (ReplayBufferDataset and user datasets) --------------------------------------
    def stateful_component(self) -> tuple[str, Any] | None:
        """The first component whose state a copy of the buffer in another process would duplicate, if any.

        ``("sampler", sampler)`` or ``("storage", storage)`` when that component declares
        ``requires_shared_state = True`` (an epoch permutation, priorities, a stream position) and its state
        is not in shared memory already (``can_share_state`` and ``is_shared``, see
        :meth:`Sampler.share_memory_ <torchrl.data.replay_buffers.Sampler.share_memory_>`), else ``None``.
        A dataset read by DataLoader workers holds one copy of the buffer per worker: it shares such a
        component's state if it can, else refuses the buffer (:class:`~torchrl.data.ReplayBufferDataset`) or
        warns about it.

        Examples:
            >>> from torchrl.data import ReplayBuffer, SamplerWithoutReplacement
            >>> ReplayBuffer().stateful_component() is None
            True
            >>> ReplayBuffer(sampler=SamplerWithoutReplacement()).stateful_component()[0]
            'sampler'
        """
        for name, component in (("sampler", self._sampler), ("storage", self._storage)):
            if getattr(component, "requires_shared_state", False):
                if getattr(component, "can_share_state", False) and component.is_shared:
                    continue  # one copy of the state for every process
                return name, component
        return None

    def pin_epoch(self, key: int | None = None, readers: int = 1) -> None:
        """Pins the sampler's draws in this process to its epoch in progress (samplers without replacement):
        once that epoch ended, in this process or another one sharing the sampler, :meth:`sample` raises
        :class:`~torchrl.data.EpochEnded` until :meth:`unpin_epoch`. A no-op for
        samplers that never run out. :class:`~torchrl.data.ReplayBufferDataset` pins each DataLoader iteration
        with ``num_batches=None``; see :meth:`Sampler.pin_epoch <torchrl.data.replay_buffers.Sampler.pin_epoch>`
        for ``key`` and ``readers``.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
            >>> from torchrl.data import EpochEnded
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=SamplerWithoutReplacement(), batch_size=4)
            >>> _ = rb.extend(torch.arange(8))
            >>> rb.pin_epoch()
            >>> epoch = [rb.sample(), rb.sample()]
            >>> try:
            ...     rb.sample()
            ... except EpochEnded:
            ...     print("one epoch:", sorted(torch.cat(epoch).tolist()))
            one epoch: [0, 1, 2, 3, 4, 5, 6, 7]
            >>> rb.unpin_epoch()
        """
        self._sampler.pin_epoch(key, readers)

    def unpin_epoch(self) -> None:
        """Ends :meth:`pin_epoch`."""
        self._sampler.unpin_epoch()

    def prepare_worker_copy(self, seed: int) -> None:
        """Readies this object, a copy of the buffer held by a DataLoader worker, to sample in that worker.

        Turns prefetching off, gives the copy fresh locks and an empty prefetch queue, and reseeds its
        ``torch.Generator`` (if it was built with one) from ``seed``. Call it once per worker, before the first
        sample, with ``torch.utils.data.get_worker_info().seed``: workers then draw distinct streams, epochs
        differ, and a DataLoader with a fixed ``generator`` reproduces them. Never call it on the buffer the
        main process uses.

        Args:
            seed (int): the worker's seed (reduced modulo ``2**63``).

        Examples:
            >>> import pickle, torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4, generator=torch.Generator())
            >>> _ = rb.extend(torch.arange(10))
            >>> copy = pickle.loads(pickle.dumps(rb))  # what a DataLoader worker holds
            >>> copy.prepare_worker_copy(seed=7)
            >>> first = copy.sample()
            >>> copy.prepare_worker_copy(seed=7)
            >>> torch.equal(first, copy.sample())
            True
        """
        self._prefetch = 0
        self._make_runtime_state()
        if self._rng is not None:
            self._rng.manual_seed(int(seed) % (2**63))

