"""Buffers that sample by priority: :class:`PrioritizedReplayBuffer` and
:class:`TensorDictPrioritizedReplayBuffer` (a buffer preset with a :class:`PrioritizedSampler`)."""

from __future__ import annotations

import torch

from torchrl._validation import check_bool
from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers._priorities import check_tree_device
from torchrl.data.replay_buffers.samplers.prioritized import PrioritizedSampler
from torchrl.data.replay_buffers.storages import ListStorage, Storage


def _prioritized_parts(
    buffer: str, base: str, storage, kwargs: dict, *, sampler_device, sync, **sampler_kwargs
) -> tuple[Storage, PrioritizedSampler]:
    """The storage (``ListStorage(1000)`` when ``None``) and the :class:`PrioritizedSampler` of a prioritized
    buffer class named ``buffer``, built over it with ``sampler_kwargs`` (``alpha``, ``beta``, ...).

    Checks first TorchRL's ``sampler_device`` (the sampler's ``device``: where its priority trees live) and
    ``sync``, that ``kwargs`` (the buffer's other arguments) holds no ``sampler`` (the buffer builds its own:
    ``base`` names the class that takes one), and that ``storage`` is a Storage, whose ``max_size`` sizes the
    trees.
    """
    sampler_device = check_tree_device(sampler_device, "sampler_device")
    check_bool("sync", sync)  # both accepted: the sampler's state is shareable either way
    if "sampler" in kwargs:
        raise TypeError(
            f"{buffer} builds its own PrioritizedSampler: pass {'/'.join(sampler_kwargs)}, or use "
            f"{base}(sampler=...) for another sampler."
        )
    if storage is None:
        storage = ListStorage(1000)
    elif not isinstance(storage, Storage):
        raise TypeError(
            f"`storage` must be a Storage instance (e.g. LazyTensorStorage(capacity)), got "
            f"{type(storage).__name__}. Its `max_size` sizes the priority trees."
        )
    return storage, PrioritizedSampler(storage.max_size, device=sampler_device, **sampler_kwargs)


class PrioritizedReplayBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` that samples items with probability proportional to ``priority ** alpha``.

    New items get the highest priority seen so far; update priorities after a learning step with
    :meth:`update_priority`. ``sample(return_info=True)`` returns the importance weights in
    ``info["priority_weight"]`` (``(p_i / p_min) ** -beta``, at most 1).

    Keyword Args:
        alpha (float): how much prioritization is used (0 = uniform).
        beta (float): the importance-sampling correction exponent.
        eps (float): added to every priority so none is zero. Defaults to ``1e-8``.
        dtype (torch.dtype): the dtype of the priority weights. Defaults to ``torch.float``.
        storage (Storage, optional): defaults to ``ListStorage(1000)``.
        sampler (Sampler, optional): TorchRL's keyword; the buffer builds its own :class:`PrioritizedSampler`
            from ``alpha``/``beta``/``eps``/``dtype``, so a sampler raises a ``TypeError`` (use
            ``ReplayBuffer(sampler=...)`` for another sampler). Defaults to ``None``.
        sample_unit (SampleUnit, optional): what one drawn position reads (see :class:`ReplayBuffer`).
            Defaults to ``None``.
        sampler_device (torch.device or str, optional): where the priority trees live: the sampler's ``device``
            (see :class:`~torchrl.data.PrioritizedSampler`; an accelerator uses the torch-tensor trees). Defaults
            to ``None`` (the CPU, or the device of a CUDA storage).
        sync (bool): accepted for TorchRL compatibility, no effect: the prioritized sampler's state is
            shared with worker processes either way. Defaults to ``True``.
        collate_fn: as in :class:`ReplayBuffer`. Defaults to ``None``.
        pin_memory: as in :class:`ReplayBuffer`. Defaults to ``False``.
        prefetch: as in :class:`ReplayBuffer`. Defaults to ``None``.
        transform: as in :class:`ReplayBuffer`. Defaults to ``None``.
        batch_size: as in :class:`ReplayBuffer`. Defaults to ``None``.
        dim_extend: as in :class:`ReplayBuffer`. Defaults to ``None``.
        delayed_init (bool): build the components at the first write (see :class:`ReplayBuffer`). Defaults to
            ``False``, as in TorchRL.
        transport: as in :class:`ReplayBuffer`. Defaults to ``"auto"``.
        transport_options: as in :class:`ReplayBuffer`. Defaults to ``None``.
        **kwargs: the other arguments of :class:`ReplayBuffer` (``generator``, ``shared``, ``rate_limiter``,
            ...).

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer
        >>> rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(100), batch_size=4)
        >>> index = rb.extend(torch.arange(10))
        >>> rb.update_priority(index, torch.arange(10).float() + 1)
        >>> data, info = rb.sample(return_info=True)
        >>> data.shape, bool((info["priority_weight"] <= 1).all())
        (torch.Size([4]), True)
    """

    def __init__(
        self, *, alpha: float, beta: float, eps: float = 1e-8, dtype: torch.dtype = torch.float,
        storage: Storage | None = None, sampler=None, sample_unit=None, sampler_device=None, sync: bool = True,
        collate_fn=None, pin_memory: bool = False, prefetch: int | None = None, transform=None,
        batch_size: int | None = None, dim_extend: int | None = None, delayed_init: bool = False,
        transport: str = "auto", transport_options: dict | None = None, **kwargs,
    ) -> None:  # fmt: skip
        given = {"sampler": sampler} if sampler is not None else kwargs  # a sampler is refused there
        storage, sampler = _prioritized_parts(
            type(self).__name__, "ReplayBuffer", storage, given, sampler_device=sampler_device, sync=sync,
            alpha=alpha, beta=beta, eps=eps, dtype=dtype,
        )  # fmt: skip
        super().__init__(
            storage=storage, sampler=sampler, sample_unit=sample_unit, collate_fn=collate_fn, pin_memory=pin_memory,
            prefetch=prefetch, transform=transform, batch_size=batch_size, dim_extend=dim_extend,
            delayed_init=delayed_init, transport=transport, transport_options=transport_options, **kwargs,
        )  # fmt: skip

    @property
    def prioritized_sampler(self) -> PrioritizedSampler:
        """The buffer's :class:`~torchrl.data.PrioritizedSampler` (TorchRL's property; here the buffer's
        :attr:`sampler`, since ``sync`` has no effect)."""
        return self.sampler


class TensorDictPrioritizedReplayBuffer(TensorDictReplayBuffer):
    """A :class:`TensorDictReplayBuffer` that samples by priority and reads priorities from the data.

    ``extend``/``add`` read each item's priority from ``priority_key`` when the entry is present (reduced over
    its trailing dims with ``reduction``); :meth:`update_tensordict_priority` does the same for a sampled batch
    after the learner wrote its new ``priority_key`` values. Sampled batches carry ``"index"`` and
    ``"priority_weight"``, with the batch's full shape (``[B, T]`` when items are trajectories, each value
    repeated over the steps of its item, as in TorchRL); :meth:`update_tensordict_priority` takes such a batch
    back (one priority per item, reduced over the steps with ``reduction``).

    Keyword Args:
        alpha (float): how much prioritization is used (0 = uniform).
        beta (float): the importance-sampling correction exponent.
        priority_key (NestedKey): the entry holding priorities. Defaults to ``"td_error"``.
        eps (float): added to every priority. Defaults to ``1e-8``.
        reduction (str): how a priority entry with extra dims is reduced per item: ``"max"``, ``"min"``,
            ``"sum"``, ``"mean"`` or ``"median"``. Defaults to ``"max"``.
        storage (Storage, optional): defaults to ``ListStorage(1000)``.
        sampler_device, sync: as in :class:`PrioritizedReplayBuffer`.
        sample_unit: as in :class:`ReplayBuffer`. Defaults to ``None``.
        collate_fn: as in :class:`ReplayBuffer`. Defaults to ``None``.
        pin_memory: as in :class:`ReplayBuffer`. Defaults to ``False``.
        prefetch: as in :class:`ReplayBuffer`. Defaults to ``None``.
        transform: as in :class:`ReplayBuffer`. Defaults to ``None``.
        batch_size: as in :class:`ReplayBuffer`. Defaults to ``None``.
        dim_extend: as in :class:`ReplayBuffer`. Defaults to ``None``.
        generator: as in :class:`ReplayBuffer`. Defaults to ``None``.
        shared: as in :class:`ReplayBuffer`. Defaults to ``False``.
        compilable: as in :class:`ReplayBuffer`. Defaults to ``False``.
        transport: as in :class:`ReplayBuffer`. Defaults to ``"auto"``.
        transport_options: as in :class:`ReplayBuffer`. Defaults to ``None``.
        **kwargs: the other arguments of :class:`ReplayBuffer` (``delayed_init``, ``rate_limiter``, ...).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
        >>> rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(100), batch_size=8)
        >>> _ = rb.extend(TensorDict(obs=torch.randn(20, 3), td_error=torch.rand(20), batch_size=[20]))
        >>> batch = rb.sample()
        >>> sorted(batch.keys())
        ['index', 'obs', 'priority_weight', 'td_error']
        >>> batch["td_error"] = torch.rand(8)  # the learner's new errors
        >>> rb.update_tensordict_priority(batch)
    """

    def __init__(
        self, *, alpha: float, beta: float, priority_key="td_error", eps: float = 1e-8,
        storage: Storage | None = None, sample_unit=None, sampler_device=None, sync: bool = True, collate_fn=None,
        pin_memory: bool = False, prefetch: int | None = None, transform=None, reduction: str = "max",
        batch_size: int | None = None, dim_extend: int | None = None, generator: torch.Generator | None = None,
        shared: bool = False, compilable: bool = False, transport: str = "auto", transport_options: dict | None = None,
        dtype: torch.dtype = torch.float, **kwargs,
    ) -> None:  # fmt: skip
        storage, sampler = _prioritized_parts(
            type(self).__name__, "TensorDictReplayBuffer", storage, kwargs, sampler_device=sampler_device,
            sync=sync, alpha=alpha, beta=beta, eps=eps, dtype=dtype, reduction=reduction,
        )  # fmt: skip
        super().__init__(
            priority_key=priority_key, storage=storage, sampler=sampler, sample_unit=sample_unit,
            collate_fn=collate_fn, pin_memory=pin_memory, prefetch=prefetch, transform=transform,
            batch_size=batch_size, dim_extend=dim_extend, generator=generator, shared=shared, compilable=compilable,
            transport=transport, transport_options=transport_options, **kwargs,
        )  # fmt: skip

    @property
    def prioritized_sampler(self) -> PrioritizedSampler:
        """The buffer's :class:`~torchrl.data.PrioritizedSampler` (TorchRL's property; here the buffer's
        :attr:`sampler`, since ``sync`` has no effect)."""
        return self.sampler
