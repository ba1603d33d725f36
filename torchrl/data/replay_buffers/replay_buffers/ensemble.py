"""A buffer over several buffers: :class:`ReplayBufferEnsemble`, which samples mixed batches and, when built
with a routing rule, writes each record into the member it names.

Data model: the ensemble wraps member buffers without copying them. Their storages, samplers and writers
become a :class:`~torchrl.data.StorageEnsemble`, a :class:`~torchrl.data.SamplerEnsemble` and a
:class:`~torchrl.data.WriterEnsemble`; each member's collate function and transforms are applied to what is
read from it. Built from components (``storages=``, ``samplers=``, ``writers=``), the ensemble first builds one
member :class:`~torchrl.data.ReplayBuffer` per storage, so both forms have member buffers (``rb_ensemble[i]``).

Reads. A batch of ``batch_size`` is ``num_buffer_sampled`` sub-batches of ``k = batch_size //
num_buffer_sampled`` items, each drawn from one member by the member's own sampler. The list of sub-batches
goes through the ensemble's ``collate_fn`` (default :func:`~torchrl.data.tensordict_collate`), which stacks them
along a new first dim, so a batch has leading shape ``[num_buffer_sampled, k]``:

- TensorDict sub-batches with the same keys and shapes give a dense TensorDict; members with different keys
  or shapes give a :class:`~tensordict.LazyStackedTensorDict` (``batch[i]`` is sub-batch ``i``; read the
  keys all members share, or index a sub-batch first). Each TensorDict sub-batch gets, per item, a
  ``"buffer_ids"`` entry (the member it comes from), an ``"index"`` sub-TensorDict holding, as in TorchRL,
  ``("index", "index")`` (its position in that member, like :class:`~torchrl.data.TensorDictReplayBuffer`'s
  ``"index"``) and ``("index", "buffer_ids")``, and the entries of the member sampler's info (e.g.
  ``"priority_weight"``).
- other data (tensors) is stacked as is; ``sample(return_info=True)`` gives ``info["buffer_ids"]``, the member
  of each sub-batch.

Routed writes. With ``routing_key`` (an entry holding each record's member id) or ``routing_dim`` (a batch dim
of size ``len(rb_ensemble)``: a record's member is its coordinate along it), ``extend(data)`` runs the ensemble's
inverse transforms, flattens the data to ``N`` records, and gives each member, in member order, one ``extend``
with its records in their original order. It returns the routing metadata, a TensorDict of batch ``[N]`` aligned
with the flattened records: ``"buffer_ids"`` (the member), ``"index"`` (the row in that member; ``-1`` for a
record a member's writer rejected, e.g. :class:`~torchrl.data.TensorDictMaxValueWriter`) and, when every member
writer tracks generations, ``"index_generation"`` (the generation each record was written with: a record
overwritten later in the same call has an older generation than its row, so it counts as stale).
:meth:`ReplayBufferEnsemble.update_if_present` takes this metadata (or a sample's ``"index"`` entry) as ``index``.

Everything a routed write can check is checked before any member is written: the data type, the member ids
(integers, one per record, each in ``[0, len(rb_ensemble))``), the members' storages (one item dim) and each
member's records against that member's stored layout (keys, shapes, dtypes). What a member does on its own after
that (its inverse transforms, a rate limiter's wait) runs in its ``extend``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_member_states, check_members, check_per_member, is_int, member_at
from torchrl.data.replay_buffers._checkpoint.generator_state import generator_from_state, generator_to_state
from torchrl.data.replay_buffers._checkpoint.parts import (
    PartContext,
    check_state_part,
    dump_state_part,
    load_state_part,
)
from torchrl.data.replay_buffers.loading.collate import stack_samples
from torchrl.data.replay_buffers.replay_buffers._checks import share_transform_write_state
from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.conditional_update import (
    ConditionalUpdateResult,
    check_conditional_support,
)
from torchrl.data.replay_buffers.replay_buffers.tensordict import set_entries
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.samplers.ensemble import SamplerEnsemble
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.storages.ensemble import StorageEnsemble, _member_index, selected_members
from torchrl.data.replay_buffers.writers import Writer
from torchrl.data.replay_buffers.writers.ensemble import WriterEnsemble

ROUTING_EXCLUSIVE = TorchRLPhrase(
    ValueError,
    "routing_key and routing_dim are mutually exclusive.",
    "routing_key and routing_dim are mutually exclusive. Got routing_key={key!r} and routing_dim={dim!r}: route "
    "by an entry holding each record's member id (routing_key) or by a batch dim indexing the members "
    "(routing_dim), not both.",
)
ROUTED_WRITE_NOT_TENSORDICT = TorchRLPhrase(
    TypeError,
    "Routed replay writes require a TensorDict input.",
    "Routed replay writes require a TensorDict input. {call} got a {got}: pass the records as a TensorDict whose "
    "batch dims index them ({how}).",
)
ENSEMBLE_WRITES_DISABLED = TorchRLPhrase(
    RuntimeError,
    "ReplayBufferEnsemble writes are disabled. Configure routing_key or routing_dim to enable routed writes.",
    "ReplayBufferEnsemble writes are disabled. Configure routing_key or routing_dim to enable routed writes. "
    "{call} was called on an ensemble built without either: build it with routing_key=<the entry holding each "
    "record's member id> or routing_dim=<the batch dim that indexes the members>, or write into the member "
    "buffers, e.g. rb_ensemble[i].extend(data).",
)
MEMBER_IDS_NOT_INTEGERS = TorchRLPhrase(
    TypeError,
    "member ids must be integers",
    "Routing reads each record's member from {source}, and member ids must be integers; got dtype {dtype}. Store "
    "the ids as an integer entry (e.g. torch.long).",
)
ADD_WITH_ROUTING_DIM = TorchRLPhrase(
    RuntimeError,
    r"Use extend\(\) for routing_dim writes\.",
    "add() writes one record, which has no batch dim to route by, and this ensemble routes by routing_dim={dim}. "
    "Use extend() for routing_dim writes.",
)

#: The keywords of ReplayBuffer that an ensemble does not take: it builds its components from its members.
_MEMBER_KEYWORDS = {
    "storage": "storages=[...] (one per member) or member buffers",
    "sampler": "samplers=[...] (one per member) or member buffers",
    "writer": "writers=[...] (one per member) or member buffers",
    "sample_unit": "member buffers built with sample_unit=...",
    "transform_factory": "transform=... (or member buffers with their own transforms)",
    "delayed_init": "member buffers built with delayed_init=...",
    "consume_after_n_samples": "member buffers built with consume_after_n_samples=...",
    "compilable": "member buffers built with compilable=True (the ensemble's own draw takes locks)",
    "checkpointer": "member buffers (or storages) with their own checkpointer",
    "dim_extend": "routing_dim=... (routed writes flatten the data to records)",
}


class ReplayBufferEnsemble(ReplayBuffer):
    """Samples batches mixed from several replay buffers (e.g. an expert dataset and online data) and, with a
    routing rule, writes records into the members they name.

    See the module docstring for how a batch is drawn, how sub-batches of different members are combined, and
    what a routed write checks and returns.

    Args:
        *rbs (ReplayBuffer): the member buffers; member ``i`` is buffer ``i`` in ``buffer_ids``. Exclusive with
            ``storages``/``samplers``/``writers`` (``RuntimeError``).

    Keyword Args:
        storages (StorageEnsemble or sequence of Storage, optional): the components form: one member
            :class:`~torchrl.data.ReplayBuffer` is built per storage (with the transform of a
            :class:`~torchrl.data.StorageEnsemble`'s member, if any, and the sub-batch size ``batch_size //
            num_buffer_sampled`` as its ``batch_size``). Defaults to ``None``.
        samplers (SamplerEnsemble or sequence of Sampler, optional): with ``storages``, one sampler per storage
            (a :class:`~torchrl.data.SamplerEnsemble` also sets ``p``, ``sample_from_all`` and
            ``num_buffer_sampled``, which are then not to be passed). Defaults to ``None``
            (:class:`~torchrl.data.RandomSampler` each).
        writers (WriterEnsemble or sequence of Writer, optional): with ``storages``, one writer per storage.
            Defaults to ``None`` (each member buffer's default writer).
        transform (Transform or callable, optional): applied to the combined batch, after the members'
            transforms; inverted on routed writes, before the records are routed. Defaults to ``None``.
        batch_size (int, optional): the default batch size of :meth:`sample`. Defaults to ``None``.
        collate_fn (callable, optional): combines the list of sub-batches. Defaults to
            :func:`~torchrl.data.tensordict_collate`.
        collate_fns (sequence of callables, optional): one per member, turning what its storage reads into a
            sub-batch. Defaults to each member buffer's ``collate_fn`` (in the components form, the storage's
            default: identity for tensor storages, stacking for the others).
        p (sequence of float or "sampleable", optional): the probability of drawing each sub-batch from each
            buffer (normalized). ``"sampleable"`` weighs member ``i`` at each draw by ``w_i = s_i`` when its
            sampler can draw a sub-batch now (``sampler.can_sample(storage, batch_size // num_buffer_sampled)``)
            and ``w_i = 0`` otherwise, where ``s_i`` is ``sampler.num_sampleable(storage)`` for samplers that
            have it (e.g. :class:`~torchrl.data.ConsumingSampler`) and ``len(storage)`` for the others; the
            probability is ``w_i / sum(w)``. Defaults to ``None`` (uniform).
        sample_from_all (bool): draw one sub-batch from every buffer. Cannot be combined with ``p``.
            Defaults to ``False``.
        num_buffer_sampled (int, optional): sub-batches per batch; ``batch_size`` must be a multiple of it.
            Defaults to the number of buffers.
        routing_key (NestedKey, optional): enables routed writes: the entry of the written records that holds
            each record's member id (trailing dims of size 1 are squeezed). Defaults to ``None``.
        routing_dim (int, optional): enables routed writes: the batch dim of the written data whose coordinate is
            the member id (its size must be the number of members). Exclusive with ``routing_key``. Defaults to
            ``None``.
        generator (torch.Generator, optional): drives the choice of buffers and, when given, every member
            sampler too (it replaces the members' generators), so one seed fixes the whole draw. Defaults to
            ``None`` (torch's global generator for the choice; members keep their generators).
        shared (bool): share every member with other processes (:meth:`ReplayBuffer.share`), and the ensemble's
            own counters. Defaults to ``False``.
        **kwargs: other keywords of :class:`~torchrl.data.ReplayBuffer` for the ensemble's own draw
            (``prefetch``, ``pin_memory``, ``rate_limiter``, ...); those that configure components
            (``storage``, ``sampler``, ``writer``, ``dim_extend``, ...) are refused (``TypeError``).

    ``len(rb_ensemble)`` is the number of buffers and ``rb_ensemble[i]`` the ``i``-th buffer (a slice or a list
    of ints gives a sub-ensemble, ``rb_ensemble[i, index]`` reads ``rb_ensemble[i][index]``). The sampler is
    stateful (``requires_shared_state``) when any member's is. Without ``routing_key``/``routing_dim`` the
    ensemble is read-only: ``extend``/``add`` raise and say to write into the members.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBufferEnsemble, TensorDictReplayBuffer
        >>> expert = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
        >>> online = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
        >>> _ = expert.extend(TensorDict(obs=torch.ones(10, 3), batch_size=[10]))
        >>> _ = online.extend(TensorDict(obs=torch.zeros(10, 3), batch_size=[10]))
        >>> rb = ReplayBufferEnsemble(expert, online, sample_from_all=True, batch_size=8)
        >>> batch = rb.sample()
        >>> batch.batch_size, batch["buffer_ids"][:, 0], batch["obs"][:, 0, 0]
        (torch.Size([2, 4]), tensor([0, 1]), tensor([1., 0.]))
        >>> rb[1] is online, len(rb)
        (True, 2)

        Routed writes, from storages: each record goes to the member its ``"task"`` entry names.

        >>> rb = ReplayBufferEnsemble(storages=[LazyTensorStorage(10), LazyTensorStorage(10)], routing_key="task")
        >>> meta = rb.extend(TensorDict(task=torch.tensor([1, 0, 1]), obs=torch.arange(3.0), batch_size=[3]))
        >>> meta["buffer_ids"].tolist(), meta["index"].tolist(), len(rb[0]), len(rb[1])
        ([1, 0, 1], [0, 0, 1], 1, 2)
    """

    # class defaults: an ensemble pickled before routed writes existed unpickles without routing
    _routing_key = None
    _routing_dim = None

    def __init__(
        self,
        *rbs: ReplayBuffer,
        storages: StorageEnsemble | Sequence[Storage] | None = None,
        samplers: SamplerEnsemble | Sequence[Sampler] | None = None,
        writers: WriterEnsemble | Sequence[Writer] | None = None,
        transform=None,
        batch_size: int | None = None,
        collate_fn: Callable | None = None,
        collate_fns: Sequence[Callable | None] | None = None,
        p: Sequence[float] | torch.Tensor | str | None = None,
        sample_from_all: bool = False,
        num_buffer_sampled: int | None = None,
        routing_key=None,
        routing_dim: int | None = None,
        generator: torch.Generator | None = None,
        shared: bool = False,
        **kwargs,
    ) -> None:
        _check_kwargs(kwargs)
        self._routing_key, self._routing_dim = _check_routing(routing_key, routing_dim)
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"`collate_fn` must be callable or None, got {type(collate_fn).__name__}.")
        if rbs:
            given = [
                name
                for name, v in (("storages", storages), ("samplers", samplers), ("writers", writers))
                if v is not None
            ]
            if given:
                raise RuntimeError(
                    f"ReplayBufferEnsemble takes member buffers or components, not both: got {len(rbs)} buffers and "
                    f"{', '.join(f'`{n}`' for n in given)}. Pass ReplayBufferEnsemble(*buffers, ...) or "
                    f"ReplayBufferEnsemble(storages=[...], samplers=[...], writers=[...], ...)."
                )
            check_members("ReplayBufferEnsemble", rbs, ReplayBuffer)
            for i, rb in enumerate(rbs):
                if isinstance(rb, ReplayBufferEnsemble):
                    raise TypeError(
                        f"Member {i} of a ReplayBufferEnsemble is itself a ReplayBufferEnsemble; nesting is not "
                        f"supported. Pass its members directly: ReplayBufferEnsemble(*inner.buffers, ...)."
                    )
            members = list(rbs)
            fns = (
                [rb.collate_fn for rb in members]
                if collate_fns is None
                else _check_collate_fns(collate_fns, members)
            )
        else:
            if isinstance(samplers, SamplerEnsemble):  # a SamplerEnsemble brings its own choice rule
                if p is not None or sample_from_all or num_buffer_sampled is not None:
                    raise ValueError(
                        "`samplers` is a SamplerEnsemble, which sets p, sample_from_all and num_buffer_sampled "
                        "itself: do not pass them too (got "
                        f"p={p!r}, sample_from_all={sample_from_all!r}, num_buffer_sampled={num_buffer_sampled!r}). "
                        "Configure the SamplerEnsemble, or pass a list of samplers with these keywords."
                    )
                p, sample_from_all, num_buffer_sampled = (
                    samplers.p,
                    samplers.sample_from_all,
                    samplers.num_buffer_sampled,
                )
            members, fns = _members_from_components(
                storages,
                samplers,
                writers,
                collate_fns,
                batch_size=batch_size,
                num_buffer_sampled=num_buffer_sampled,
            )
        self._rbs = members
        super().__init__(
            storage=StorageEnsemble(
                *(rb.storage for rb in members),
                transforms=[rb.transform for rb in members],
                collate_fns=fns,
            ),
            sampler=SamplerEnsemble(
                *(rb.sampler for rb in members),
                p=p,
                sample_from_all=sample_from_all,
                num_buffer_sampled=num_buffer_sampled,
            ),
            writer=WriterEnsemble(*(rb.writer for rb in members)),
            collate_fn=collate_fn if collate_fn is not None else stack_samples,
            transform=transform,
            batch_size=batch_size,
            generator=generator,
            shared=shared,
            **kwargs,
        )

    @property
    def buffers(self) -> list[ReplayBuffer]:
        """The member buffers (a new list)."""
        return list(self._rbs)

    @property
    def routing_key(self):
        """The entry routed writes read member ids from (``None``: not routed by key)."""
        return self._routing_key

    @property
    def routing_dim(self) -> int | None:
        """The batch dim routed writes read member ids from (``None``: not routed by dim)."""
        return self._routing_dim

    def __len__(self) -> int:
        return len(self._rbs)

    def __getitem__(self, item):
        """The ``item``-th member buffer (int); ``rb_ensemble[i, index]`` reads ``rb_ensemble[i][index]``; a slice
        or a list of ints gives a sub-ensemble of those members, with the same configuration (a tensor ``p``
        restricted to them and renormalized, ``"sampleable"`` kept, the same routing, transform and batch size)."""
        hint = "To read data, index a member: rb_ensemble[i][index] or rb_ensemble[i, index]."
        if isinstance(item, tuple) and item and is_int(item[0]):
            rest = item[1] if len(item) == 2 else item[1:]
            member = member_at("ReplayBufferEnsemble", self._rbs, item[0], hint=hint)
            return member if len(item) == 1 else member[rest]
        if isinstance(item, (slice, list, tuple, torch.Tensor)) and not is_int(item):
            ids = selected_members("ReplayBufferEnsemble", item, len(self._rbs))
            sampler = self._sampler[ids]
            return type(self)(
                *(self._rbs[i] for i in ids),
                collate_fns=[self._storage.collate_fns[i] for i in ids],
                p=sampler.p, sample_from_all=sampler.sample_from_all,
                num_buffer_sampled=None if sampler.sample_from_all else sampler.num_buffer_sampled,
                transform=self._transform, batch_size=self._batch_size, collate_fn=self._collate_fn,
                routing_key=self._routing_key, routing_dim=self._routing_dim, generator=self._rng,
            )  # fmt: skip
        return member_at("ReplayBufferEnsemble", self._rbs, item, hint=hint)

    def __repr__(self) -> str:
        routing = ""
        if self._routing_key is not None:
            routing = f", routing_key={self._routing_key!r}"
        elif self._routing_dim is not None:
            routing = f", routing_dim={self._routing_dim}"
        return (
            f"{type(self).__name__}({', '.join(map(repr, self._rbs))}, sampler={self._sampler!r}, "
            f"batch_size={self._batch_size}, transform={self._transform!r}{routing})"
        )

    def _members_locked(self) -> contextlib.ExitStack:
        """The ensemble's lock and every member's, held together (members may be used from other threads)."""
        locks = contextlib.ExitStack()
        locks.enter_context(self._replay_lock)
        for rb in self._rbs:
            locks.enter_context(rb.replay_lock)
        return locks

    # -- sharing ---------------------------------------------------------------------------------------------
    def share(self, shared: bool = True) -> ReplayBufferEnsemble:
        """Prepares every member to be written from several processes (:meth:`ReplayBuffer.share` on each) and
        shares the ensemble's own counters (readiness, rate limiting); returns the ensemble."""
        if shared:
            share_transform_write_state(self._transform)
        for rb in self._rbs:
            rb.share(shared)
        self._shared = bool(shared)
        if shared:
            self._flow.share_memory_()
        return self

    def share_memory_(self) -> ReplayBufferEnsemble:
        """Shares every member's writer cursor and counters, and the ensemble's own counters."""
        for rb in self._rbs:
            rb.share_memory_()
        self._flow.share_memory_()
        return self

    # -- writes ----------------------------------------------------------------------------------------------
    def extend(self, data, *, update_priority=None, timeout: float | None = None) -> TensorDictBase:
        """Writes each record of ``data`` into the member its routing names; needs ``routing_key`` or
        ``routing_dim`` (see the module docstring).

        Args:
            data (TensorDictBase): the records, any batch shape (flattened to ``N`` records after the
                ensemble's inverse transforms).

        Keyword Args:
            update_priority: not supported on an ensemble (``NotImplementedError``): update priorities through
                the members, ``rb_ensemble[i].update_priority(index, priority)``.
            timeout (float, optional): how long the ensemble's rate limiter may make the write wait, also
                passed to each member's ``extend`` (see :meth:`ReplayBuffer.extend`). A member whose own
                limiter blocks inserts waits under the ensemble's locks: give limiters to the ensemble rather
                than to routed members.

        Returns:
            TensorDict of batch ``[N]``: ``"buffer_ids"``, ``"index"`` and (every member writer tracking
            generations) ``"index_generation"``, aligned with ``data.reshape(-1)``.

        Raises:
            RuntimeError: the ensemble has no routing; a member storage has more than one item dim.
            TypeError: ``data`` is not a TensorDict; member ids are not integers.
            ValueError: not one member id per record, an id out of range, a routing dim of the wrong size, or
                records a member's storage cannot hold. Nothing is written then.
            KeyError: the records lack ``routing_key``.
        """
        self._check_routed("extend()")
        if update_priority is not None:
            raise NotImplementedError(
                f"ReplayBufferEnsemble.extend() does not take update_priority (got {update_priority!r}): routed "
                f"records go to several members. Update priorities through the members: "
                f"rb_ensemble[i].update_priority(index, priority), with the 'buffer_ids' and 'index' entries the "
                f"extend() returned."
            )
        if not isinstance(data, TensorDictBase):
            raise ROUTED_WRITE_NOT_TENSORDICT.error(
                call="extend()", got=type(data).__name__, how=self._routing_hint()
            )
        stored = self._as_stored_batch(data)  # the ensemble's inverse transforms, before routing
        if stored is None:
            return self._metadata(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), None)
        if not isinstance(stored, TensorDictBase):
            raise TypeError(
                f"The ensemble's inverse transforms turned the records into a {type(stored).__name__}; routed writes "
                f"need a TensorDict. Make the transform's inv() return a TensorDict."
            )
        ids = self._member_ids(stored)
        return self._write_routed(stored.reshape(-1), ids, timeout)

    def add(self, data, *, timeout: float | None = None) -> TensorDictBase:
        """Writes one record into the member its ``routing_key`` entry names; returns its metadata row (batch
        ``[]``: ``"buffer_ids"``, ``"index"`` and, when tracked, ``"index_generation"``). Needs ``routing_key``:
        with ``routing_dim`` use :meth:`extend`."""
        self._check_routed("add()")
        if self._routing_dim is not None:
            raise ADD_WITH_ROUTING_DIM.error(dim=self._routing_dim)
        if not isinstance(data, TensorDictBase):
            raise ROUTED_WRITE_NOT_TENSORDICT.error(
                call="add()", got=type(data).__name__, how=self._routing_hint()
            )
        if data.batch_dims:
            raise ValueError(
                f"ReplayBufferEnsemble.add() writes one record (a TensorDict with batch_size=[]), got batch_size="
                f"{list(data.batch_size)}. Use extend() to write a batch of records."
            )
        return self.extend(data.unsqueeze(0), timeout=timeout)[0]

    def _check_routed(self, call: str) -> None:
        if self._routing_key is None and self._routing_dim is None:
            raise ENSEMBLE_WRITES_DISABLED.error(call=call)

    def _routing_hint(self) -> str:
        if self._routing_key is not None:
            return f"each record holding its member id in {self._routing_key!r}"
        return f"dim {self._routing_dim} of size {len(self._rbs)} indexing the members"

    def _member_ids(self, data: TensorDictBase) -> torch.Tensor:
        """The member of each record of ``data`` (flattened order), int64 ``[N]``, checked."""
        n = len(self._rbs)
        count = data.batch_size.numel()
        if self._routing_key is not None:
            key = self._routing_key
            ids = data.get(key, None)
            if ids is None:
                stored = sorted(map(str, data.keys(include_nested=True, leaves_only=True)))
                raise KeyError(
                    f"Routed writes read each record's member id from routing_key={key!r}, which the records do "
                    f"not hold (their entries: {stored}). Add the entry, one id per record."
                )
            if not isinstance(ids, torch.Tensor):
                raise MEMBER_IDS_NOT_INTEGERS.error(source=f"the entry {key!r}", dtype=type(ids).__name__)
            ids = ids.reshape(count, *ids.shape[data.batch_dims :])
            while ids.ndim > 1 and ids.shape[-1] == 1:
                ids = ids.squeeze(-1)
            if tuple(ids.shape) != (count,):
                raise ValueError(
                    f"Routed writes need one member id per record in routing_key={key!r}: {count} records (batch "
                    f"size {list(data.batch_size)}) hold ids of shape {list(data.get(key).shape)}. Store one id per "
                    f"record (shape {list(data.batch_size)}, or with trailing dims of size 1)."
                )
            source = f"the entry {key!r}"
        else:
            dim = self._routing_dim
            if data.batch_dims == 0:
                raise ValueError(
                    f"Routed writes by routing_dim={dim} need a batch dim to route by; the records have batch_size="
                    f"[]. Pass data with a dim of size {n} (one slice per member)."
                )
            if not -data.batch_dims <= dim < data.batch_dims:
                raise ValueError(
                    f"routing_dim={dim} is out of range for records of batch_size {list(data.batch_size)}. Pass data "
                    f"whose dim {dim} has size {n} (one slice per member)."
                )
            dim = dim % data.batch_dims
            if data.batch_size[dim] != n:
                raise ValueError(
                    f"routing_dim={self._routing_dim} routes by the coordinate along dim {dim}, which has size "
                    f"{data.batch_size[dim]}; the ensemble has {n} members. Pass data whose dim {dim} has size {n}."
                )
            shape = [1] * data.batch_dims
            shape[dim] = n
            ids = torch.arange(n).reshape(shape).expand(data.batch_size).reshape(-1)
            source = f"dim {dim}"
        return _checked_ids(ids, n, source)

    def _write_routed(self, flat: TensorDictBase, ids: torch.Tensor, timeout) -> TensorDictBase:
        """Writes the records of ``flat`` (batch ``[N]``) into their members ``ids``: everything checked first,
        then one ``extend`` per member, in member order, all under the ensemble's and the members' locks."""
        n_records = flat.batch_size[0]
        index = torch.full((n_records,), -1, dtype=torch.long)
        track = all(getattr(rb.writer, "tracks_generations", False) for rb in self._rbs)
        generation = torch.full((n_records,), -1, dtype=torch.long) if track else None
        if n_records == 0:
            return self._metadata(ids, index, generation)
        order = torch.argsort(ids, stable=True)  # stable: each member's records keep their order
        counts = torch.bincount(ids, minlength=len(self._rbs)).tolist()
        groups, start = [], 0
        for i, count in enumerate(counts):
            if count:
                groups.append((i, order[start : start + count]))
            start += count
        flow = self._flow
        gated = (
            timeout is not None or flow.gates_inserts
        )  # as ReplayBuffer's writes: the limiter's permission first
        with flow.insert(n_records, timeout) if gated else contextlib.nullcontext(), self._members_locked():
            parts = [(i, rows, self._checked_part(i, flat[rows])) for i, rows in groups]  # all checks first
            for i, rows, part in parts:
                member = self._rbs[i]
                written = member.extend(part) if timeout is None else member.extend(part, timeout=timeout)
                written = _member_rows(written, rows.numel(), i)
                index[rows] = written
                if generation is not None:
                    generation[rows] = _write_generations(member.writer, written)
        if not gated and flow.waiters:  # (flow.insert wakes them itself)
            flow.notify()
        return self._metadata(ids, index, generation)

    def _checked_part(self, i: int, part: TensorDictBase) -> TensorDictBase:
        """Member ``i``'s records, checked against its storage (one item dim; stored keys, shapes, dtypes)."""
        member = self._rbs[i]
        storage = member.storage
        if storage.ndim != 1:
            raise RuntimeError(
                f"Routed writes give each member a flat batch of records, and member {i}'s storage has "
                f"ndim={storage.ndim}: its indices would not align with the records. Nothing was written. Route "
                f"into members with 1-D storages, or write member {i} directly."
            )
        if not len(member.transform):  # a member's inverse transforms run in its extend: checked there
            storage.check_write(part, part.batch_size[0])
        return part

    @staticmethod
    def _metadata(ids, index, generation) -> TensorDictBase:
        entries = {"buffer_ids": ids, "index": index}
        if generation is not None:
            entries["index_generation"] = generation
        return TensorDict(entries, batch_size=[ids.numel()])

    def __setitem__(self, index, value) -> None:
        raise RuntimeError(
            "A ReplayBufferEnsemble does not support item assignment: write into the member buffers instead, e.g. "
            "rb_ensemble[i][index] = value."
        )

    def empty(self, empty_write_count: bool = True) -> None:
        raise RuntimeError(
            "A ReplayBufferEnsemble cannot be emptied: empty the member buffers (rb_ensemble[i].empty())."
        )

    def _swap(self, attribute: str, component, wire):
        raise RuntimeError(
            f"A ReplayBufferEnsemble's components are those of its member buffers: call "
            f"rb_ensemble[i].set_{attribute.lstrip('_')}(...) on a member, not on the ensemble."
        )

    def update_priority(self, index, priority) -> None:
        raise RuntimeError(
            "Update priorities through the member buffers: rb_ensemble[buffer_id].update_priority(index, "
            "priority), with the ('index', 'buffer_ids') and ('index', 'index') entries of each sub-batch of "
            "the sample."
        )

    # -- conditional updates -----------------------------------------------------------------------------------
    def update_if_present(
        self, *, index, generation, patch, version_key=None, version=None, require_newer=False
    ) -> ConditionalUpdateResult:
        """Writes ``patch`` into the records of ``index`` that were not overwritten since ``generation``, each in
        its member (:meth:`ReplayBuffer.update_if_present` per member).

        Args:
            index (TensorDictBase): which records: what a routed :meth:`extend` returned, or a sample's
                ``"index"`` entry (``"buffer_ids"`` and ``"index"`` per record, any batch shape).
            generation (torch.Tensor): one generation per record (the metadata's ``"index_generation"``).
            patch (dict or TensorDict): ``{key: values}``, one value per record (leading dims: ``index``'s batch
                shape, or flat).
            version_key, version, require_newer: see :meth:`ReplayBuffer.update_if_present`; ``version`` is a
                scalar or one per record.

        Records are grouped by member (stable order) and every member's group is checked (keys, shapes, dtypes,
        versions) before any member is written. Needs, in every member, a writer that tracks generations and a
        tensor storage.

        Returns:
            ConditionalUpdateResult: ``updated`` (and ``version_rejected``) shaped like ``index``'s batch.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBufferEnsemble, RoundRobinWriter
            >>> rb = ReplayBufferEnsemble(storages=[LazyTensorStorage(4), LazyTensorStorage(4)],
            ...                           writers=[RoundRobinWriter(track_generations=True) for _ in range(2)],
            ...                           routing_key="task")
            >>> meta = rb.extend(TensorDict(task=torch.tensor([0, 1]), obs=torch.zeros(2), batch_size=[2]))
            >>> result = rb.update_if_present(index=meta, generation=meta["index_generation"],
            ...                               patch={"obs": torch.tensor([5.0, 6.0])})
            >>> result.updated.tolist(), rb[0][:]["obs"].tolist(), rb[1][:]["obs"].tolist()
            ([True, True], [5.0], [6.0])
        """
        if not isinstance(index, TensorDictBase) or not {"buffer_ids", "index"} <= set(index.keys()):
            raise TypeError(
                f"ReplayBufferEnsemble.update_if_present() takes as `index` the metadata a routed extend() returned "
                f"(or a sample's 'index' entry): a TensorDict with 'buffer_ids' and 'index' entries; got "
                f"{type(index).__name__}. To update one member, call rb_ensemble[i].update_if_present(...)."
            )
        if (version_key is None) != (version is None):
            given, missing = ("version_key", "version") if version is None else ("version", "version_key")
            raise ValueError(
                f"update_if_present() got `{given}` without `{missing}`: pass both (version_key=<the stored entry "
                f"holding each record's version>, version=<the patch's version>) or neither."
            )
        for i, rb in enumerate(self._rbs):
            check_conditional_support(rb.storage, rb.writer, owner=f"member {i}'s", build="every member",
                                      where=" in every member")
        shape = index.batch_size
        n = shape.numel()
        ids = index.get("buffer_ids")
        ids = _checked_ids(
            ids.reshape(-1) if ids.numel() == n else ids, len(self._rbs), "index['buffer_ids']", n
        )
        rows = index.get("index")
        rows = (
            rows.reshape(n, *rows.shape[len(shape) :])
            if tuple(rows.shape[: len(shape)]) == tuple(shape)
            else rows
        )
        if rows.shape[:1] != (n,):
            raise ValueError(
                f"index['index'] has shape {list(index.get('index').shape)}; with batch_size {list(shape)} it must hold "
                f"one member row per record (leading dims {list(shape)})."
            )
        generation = _per_record("generation", generation, n, shape, allow_scalar=True)
        values = [
            (key, _per_record(f"patch value of {key!r}", value, n, shape))
            for key, value in _patch_entries(patch)
        ]
        if version is not None:
            version = _per_record("version", version, n, shape, allow_scalar=True)
        groups = []
        order = torch.argsort(ids, stable=True)
        start = 0
        for i, count in enumerate(torch.bincount(ids, minlength=len(self._rbs)).tolist()):
            if count:
                groups.append((i, order[start : start + count]))
            start += count
        updated = torch.zeros(n, dtype=torch.bool)
        rejected = torch.zeros(n, dtype=torch.bool) if version_key is not None else None

        def call(i, sel, gen):
            return self._rbs[i].update_if_present(
                index=rows[sel],
                generation=gen,
                patch={key: value[sel] for key, value in values},
                version_key=version_key,
                version=None if version is None else (version if version.ndim == 0 else version[sel]),
                require_newer=require_newer,
            )

        with self._members_locked():
            for i, sel in groups:  # a dry run per member: a generation no record has (-2) writes nothing,
                call(i, sel, torch.full((sel.numel(),), -2, dtype=torch.long))  # but checks the whole call
            for i, sel in groups:
                result = call(i, sel, generation if generation.ndim == 0 else generation[sel])
                updated[sel] = result.updated.reshape(-1)
                if rejected is not None and result.version_rejected is not None:
                    rejected[sel] = result.version_rejected.reshape(-1)
        return ConditionalUpdateResult(  # the counts are properties of the result
            updated=updated.reshape(shape),
            version_rejected=None if rejected is None else rejected.reshape(shape),
        )

    # -- reads -----------------------------------------------------------------------------------------------
    def _sample(self, batch_size: int, transform: bool = True):
        with self._members_locked():  # members may be written from other threads while we read them
            index, info = self._sampler.sample(self._storage, batch_size)
            parts = self._storage.get(index)
        chunks = []
        for row, (buffer_id, data) in enumerate(parts):
            if isinstance(data, TensorDictBase):
                storage = self._storage[buffer_id]
                buffer_ids = _as_entry(torch.tensor(buffer_id), data)
                member_index = _as_entry(_member_index(index[row].get("index"), storage), data)
                entries = {
                    "buffer_ids": buffer_ids,
                    # as TorchRL: "index" holds the member position ("index", "index") and the member
                    # ("index", "buffer_ids"), both per item
                    "index": TensorDict(
                        index=member_index,
                        buffer_ids=buffer_ids,
                        batch_size=data.batch_size,
                        device=data.device,
                    ),
                    **info["member_info"][row],
                }
                data = set_entries(data, entries, _entry_value)
            chunks.append(data)
        data = self._collate_fn(chunks)
        if transform and len(self._transform):
            data = self._transform(data)
        info["index"] = index
        return data, info

    # -- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The members' states (keyed by ``str(i)``), the ensemble's transform, batch size and generator."""
        rng = self._rng
        return {
            "_buffers": {str(i): rb.state_dict() for i, rb in enumerate(self._rbs)},
            "_transforms": self._transform.state_dict(),
            "_batch_size": self._batch_size,
            "_rng": generator_to_state(rng),
            "_readiness": self._flow.state_dict(),  # the ensemble's own sample counters (see ReplayBuffer.stats)
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        buffers = state_dict.get("_buffers")
        check_member_states("ReplayBufferEnsemble", buffers, len(self._rbs))
        with self._replay_lock:
            for i, rb in enumerate(self._rbs):
                rb.load_state_dict(buffers[str(i)])
            self._transform.load_state_dict(state_dict["_transforms"])
            self._batch_size = state_dict.get("_batch_size", self._batch_size)
            rng = generator_from_state(state_dict.get("_rng"))
            if rng is not None:
                self.set_rng(rng)
            else:
                self.set_rng(self._rng)  # members' loaded generators stay unless the ensemble has its own
            if state_dict.get("_readiness") is not None:
                self._flow.load_state_dict(state_dict["_readiness"])

    # -- checkpoint part: the state dict (members, transform, batch size, generator) ----------------------------
    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        return dump_state_part(self, ctx)

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        check_state_part(self, doc, tensors, ctx)

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        load_state_part(self, doc, tensors, ctx)


# -- construction ------------------------------------------------------------------------------------------------
def _check_kwargs(kwargs: dict) -> None:
    for name, instead in _MEMBER_KEYWORDS.items():
        if kwargs.get(name) not in (None, False):
            raise TypeError(
                f"ReplayBufferEnsemble builds its components from its members, so `{name}` is not accepted (got "
                f"{name}={kwargs[name]!r}); use {instead}."
            )
        kwargs.pop(name, None)


def _check_routing(routing_key, routing_dim) -> tuple:
    if routing_key is not None and routing_dim is not None:
        raise ROUTING_EXCLUSIVE.error(key=routing_key, dim=routing_dim)
    if routing_dim is not None and (isinstance(routing_dim, bool) or not isinstance(routing_dim, int)):
        raise TypeError(
            f"`routing_dim` must be an int (the batch dim whose coordinate is the member id) or None, got "
            f"{type(routing_dim).__name__}: {routing_dim!r}."
        )
    if routing_key is not None:
        nested = (
            isinstance(routing_key, tuple) and routing_key and all(isinstance(k, str) for k in routing_key)
        )
        if not (isinstance(routing_key, str) or nested):
            raise TypeError(
                f"`routing_key` must be a key of the written records (a str or a tuple of str), got "
                f"{type(routing_key).__name__}: {routing_key!r}."
            )
    return routing_key, routing_dim


def _check_collate_fns(collate_fns, members: list) -> list:
    fns = check_per_member("collate_fns", collate_fns, len(members))
    for i, fn in enumerate(fns):
        if fn is not None and not callable(fn):
            raise TypeError(f"`collate_fns[{i}]` must be callable or None, got {type(fn).__name__}.")
    return [members[i].collate_fn if fn is None else fn for i, fn in enumerate(fns)]


def _members_from_components(
    storages, samplers, writers, collate_fns, *, batch_size, num_buffer_sampled
) -> tuple[list, list]:
    """The components form: one member ReplayBuffer per storage (its batch size: the ensemble's sub-batch size,
    when ``batch_size`` divides into ``num_buffer_sampled`` sub-batches); returns ``(members, collate_fns)``."""
    if storages is None:
        if samplers is not None or writers is not None:
            raise ValueError(
                "ReplayBufferEnsemble got `samplers`/`writers` without `storages`: the components form needs one "
                "storage per member, e.g. ReplayBufferEnsemble(storages=[LazyTensorStorage(100), ...], ...)."
            )
        check_members("ReplayBufferEnsemble", (), ReplayBuffer)  # raises: at least one member
    transforms = None
    if isinstance(storages, StorageEnsemble):
        transforms = storages.transforms
        if collate_fns is None:
            collate_fns = storages.collate_fns
        storages = storages.storages
    storages = check_members("ReplayBufferEnsemble's `storages`", _as_list("storages", storages), Storage)
    n = len(storages)
    if isinstance(samplers, SamplerEnsemble):
        samplers = samplers.samplers
    if isinstance(writers, WriterEnsemble):
        writers = writers.writers
    samplers = (
        [None] * n if samplers is None else check_per_member("samplers", _as_list("samplers", samplers), n)
    )
    writers = [None] * n if writers is None else check_per_member("writers", _as_list("writers", writers), n)
    fns = [None] * n if collate_fns is None else check_per_member("collate_fns", collate_fns, n)
    for i, fn in enumerate(fns):
        if fn is not None and not callable(fn):
            raise TypeError(f"`collate_fns[{i}]` must be callable or None, got {type(fn).__name__}.")
    k = num_buffer_sampled if isinstance(num_buffer_sampled, int) and num_buffer_sampled > 0 else n
    member_batch = (
        batch_size // k if isinstance(batch_size, int) and batch_size > 0 and batch_size % k == 0 else None
    )
    members = [
        ReplayBuffer(
            storage=storages[i], sampler=samplers[i], writer=writers[i], collate_fn=fns[i],
            transform=None if transforms is None else transforms[i], batch_size=member_batch,
        )
        for i in range(n)
    ]  # fmt: skip
    return members, [rb.collate_fn for rb in members]


def _as_list(name: str, values) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"`{name}` must be a list with one entry per member, got {type(values).__name__}.")
    return list(values)


# -- routing -----------------------------------------------------------------------------------------------------
def _checked_ids(ids, n: int, source: str, expected: int | None = None) -> torch.Tensor:
    """Member ids as int64 ``[N]`` on the CPU: integers in ``[0, n)``."""
    ids = torch.as_tensor(ids)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise MEMBER_IDS_NOT_INTEGERS.error(source=source, dtype=ids.dtype)
    ids = ids.to(device="cpu", dtype=torch.long)
    if expected is not None and tuple(ids.shape) != (expected,):
        raise ValueError(
            f"{source} must hold one member id per record ({expected}), got shape {list(ids.shape)}."
        )
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        bad = ids[(ids < 0) | (ids >= n)].unique()[:5].tolist()
        raise ValueError(
            f"Member ids read from {source} must lie in [0, {n - 1}] (the ensemble has {n} members); got {bad}."
        )
    return ids


def _member_rows(written, count: int, i: int) -> torch.Tensor:
    """What member ``i``'s extend returned as ``count`` rows (``-1``: a record its writer rejected)."""
    if written is None:
        return torch.full((count,), -1, dtype=torch.long)
    written = torch.as_tensor(written, dtype=torch.long).cpu()
    if written.numel() != count:
        raise RuntimeError(
            f"Member {i} wrote {count} routed records but returned {written.numel()} indices (shape "
            f"{list(written.shape)}), so the metadata cannot align with the records: the member's inverse "
            f"transforms changed their number. Route into members without such transforms, or write that member "
            f"directly."
        )
    return written.reshape(count)


def _write_generations(writer, rows: torch.Tensor) -> torch.Tensor:
    """The generation each record of one write got: the row's generation now, less the times a later record of
    the same write overwrote that row (``-1`` for rejected records)."""
    valid = rows >= 0
    out = torch.full_like(rows, -1)
    if not bool(valid.any()):
        return out
    kept = rows[valid]
    generations = torch.as_tensor(writer.generations_of(kept), dtype=torch.long).reshape(-1).cpu()
    if kept.unique().numel() != kept.numel():  # a row written several times: earlier records are stale
        perm = torch.argsort(kept, stable=True)
        _, inverse, counts = torch.unique_consecutive(kept[perm], return_inverse=True, return_counts=True)
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(kept.numel()) - starts[inverse]
        later = torch.empty_like(kept)
        later[perm] = counts[inverse] - 1 - rank
        generations = generations - later
    out[valid] = generations
    return out


# -- conditional updates -----------------------------------------------------------------------------------------
def _patch_entries(patch) -> list:
    """``patch`` as ``[(key, value)]`` leaves (nested dicts give tuple keys)."""
    if isinstance(patch, TensorDictBase):
        return list(patch.items(include_nested=True, leaves_only=True))
    if not isinstance(patch, Mapping):
        raise TypeError(
            f"`patch` must be a dict {{key: tensor}} (str or tuple keys) or a TensorDict, got {type(patch).__name__}."
        )
    out = []
    for key, value in patch.items():
        if isinstance(value, (Mapping, TensorDictBase)):
            prefix = key if isinstance(key, tuple) else (key,)
            out.extend(
                ((*prefix, *(k if isinstance(k, tuple) else (k,))), v) for k, v in _patch_entries(value)
            )
        else:
            out.append((key, value))
    return out


def _per_record(what: str, value, n: int, shape: torch.Size, allow_scalar: bool = False) -> torch.Tensor:
    """``value`` with one leading entry per record (``[n, ...]``); a 0-d tensor stays one for all when allowed."""
    value = torch.as_tensor(value)
    if allow_scalar and value.ndim == 0:
        return value
    if tuple(value.shape[: len(shape)]) == tuple(shape):
        return value.reshape(n, *value.shape[len(shape) :])
    if n and value.numel() % n == 0:
        return value.reshape(n, -1)
    raise ValueError(
        f"The {what} has shape {list(value.shape)}; {n} records (index batch size {list(shape)}) need one value "
        f"per record: leading dims {list(shape)}{' (or a scalar)' if allow_scalar else ''}."
    )


# -- reads -------------------------------------------------------------------------------------------------------
def _entry_value(value, like: TensorDictBase):
    """A per-item entry of a sub-batch (``buffer_ids``, ``index``, member info): TensorDicts as they are."""
    return value if isinstance(value, TensorDictBase) else _as_entry(value, like)


def _as_entry(value, like: TensorDictBase) -> torch.Tensor:
    """A per-item tensor shaped like ``like``'s batch (scalars expanded, per-dim tuples stacked last)."""
    if isinstance(value, tuple):
        value = torch.stack([torch.as_tensor(v) for v in value], -1)
    value = torch.as_tensor(value, device=like.device)
    batch = like.batch_size
    if value.ndim == 0:
        return value.expand(batch).clone()
    if value.shape[: len(batch)] != batch and value.numel() == batch.numel():
        value = value.reshape(batch)
    while value.ndim < len(batch):
        value = value.unsqueeze(-1)
    if value.shape[: len(batch)] != batch:
        value = value.expand(*batch, *value.shape[len(batch) :]).clone()
    return value
