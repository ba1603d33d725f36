"""A buffer that samples from several buffers at once: :class:`ReplayBufferEnsemble`.

Data model: the ensemble wraps member buffers without copying them. Their storages, samplers and writers
become a :class:`~torchrl.data.StorageEnsemble`, a :class:`~torchrl.data.SamplerEnsemble` and a
:class:`~torchrl.data.WriterEnsemble`; each member's collate function and transforms are applied to what is
read from it. A batch of ``batch_size`` is ``num_buffer_sampled`` sub-batches of ``k = batch_size //
num_buffer_sampled`` items, each drawn from one member by the member's own sampler.

Combining sub-batches: the list of sub-batches goes through the ensemble's ``collate_fn`` (default
:func:`~torchrl.data.tensordict_collate`), which stacks them along a new first dim, so a batch has leading
shape ``[num_buffer_sampled, k]``:

- TensorDict sub-batches with the same keys and shapes give a dense TensorDict; members with different keys
  or shapes give a :class:`~tensordict.LazyStackedTensorDict` (``batch[i]`` is sub-batch ``i``; read the
  keys all members share, or index a sub-batch first). Each TensorDict sub-batch gets, per item, a
  ``"buffer_ids"`` entry (the member it comes from), an ``"index"`` sub-TensorDict holding, as in TorchRL,
  ``("index", "index")`` (its position in that member, like :class:`~torchrl.data.TensorDictReplayBuffer`'s
  ``"index"``) and ``("index", "buffer_ids")``, and the entries of the member sampler's info (e.g.
  ``"priority_weight"``).
- other data (tensors) is stacked as is; ``sample(return_info=True)`` gives ``info["buffer_ids"]``, the member
  of each sub-batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from torchrl._validation import check_member_states, check_members, member_at
from torchrl.data.replay_buffers._checkpoint.generator_state import generator_from_state, generator_to_state
from torchrl.data.replay_buffers._checkpoint.parts import (
    PartContext,
    check_state_part,
    dump_state_part,
    load_state_part,
)
from torchrl.data.replay_buffers.loading.collate import stack_samples
from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.tensordict import set_entries
from torchrl.data.replay_buffers.samplers.ensemble import SamplerEnsemble
from torchrl.data.replay_buffers.storages.ensemble import StorageEnsemble, _member_index
from torchrl.data.replay_buffers.writers.ensemble import WriterEnsemble

_WRITE_HINT = "write into the member buffers instead, e.g. rb_ensemble[i].extend(data)"


class ReplayBufferEnsemble(ReplayBuffer):
    """Samples batches mixed from several replay buffers (e.g. an expert dataset and online data).

    The ensemble is read-only: each member keeps its own storage, writer, sampler and transforms, and data is
    written into the members (``rb_ensemble[i].extend(data)``). See the module docstring for how a batch is
    drawn and how sub-batches of different members are combined.

    Args:
        *rbs (ReplayBuffer): the member buffers; member ``i`` is buffer ``i`` in ``buffer_ids``.

    Keyword Args:
        p (sequence of float, optional): the probability of drawing each sub-batch from each buffer
            (normalized). Defaults to ``None`` (uniform).
        sample_from_all (bool): draw one sub-batch from every buffer. Cannot be combined with ``p``.
            Defaults to ``False``.
        num_buffer_sampled (int, optional): sub-batches per batch; ``batch_size`` must be a multiple of it.
            Defaults to the number of buffers.
        batch_size (int, optional): the default batch size of :meth:`sample`. Defaults to ``None``.
        collate_fn (callable, optional): combines the list of sub-batches. Defaults to
            :func:`~torchrl.data.tensordict_collate`.
        transform (Transform or callable, optional): applied to the combined batch, after the members'
            transforms. Defaults to ``None``.
        generator (torch.Generator, optional): drives the choice of buffers and, when given, every member
            sampler too (it replaces the members' generators), so one seed fixes the whole draw. Defaults to
            ``None`` (torch's global generator for the choice; members keep their generators).

    ``len(rb_ensemble)`` is the number of buffers and ``rb_ensemble[i]`` the ``i``-th buffer. The sampler is
    stateful (``requires_shared_state``) when any member's is.

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
    """

    def __init__(
        self,
        *rbs: ReplayBuffer,
        p: Sequence[float] | torch.Tensor | None = None,
        sample_from_all: bool = False,
        num_buffer_sampled: int | None = None,
        batch_size: int | None = None,
        collate_fn: Callable | None = None,
        transform=None,
        generator: torch.Generator | None = None,
    ) -> None:
        check_members("ReplayBufferEnsemble", rbs, ReplayBuffer)
        for i, rb in enumerate(rbs):
            if isinstance(rb, ReplayBufferEnsemble):
                raise TypeError(
                    f"Member {i} of a ReplayBufferEnsemble is itself a ReplayBufferEnsemble; nesting is not "
                    f"supported. Pass its members directly: ReplayBufferEnsemble(*inner.buffers, ...)."
                )
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"`collate_fn` must be callable or None, got {type(collate_fn).__name__}.")
        self._rbs = list(rbs)
        super().__init__(
            storage=StorageEnsemble(
                *(rb.storage for rb in rbs),
                transforms=[rb.transform for rb in rbs],
                collate_fns=[rb.collate_fn for rb in rbs],
            ),
            sampler=SamplerEnsemble(
                *(rb.sampler for rb in rbs), p=p, sample_from_all=sample_from_all,
                num_buffer_sampled=num_buffer_sampled,
            ),
            writer=WriterEnsemble(*(rb.writer for rb in rbs)),
            collate_fn=collate_fn if collate_fn is not None else stack_samples,
            transform=transform,
            batch_size=batch_size,
            generator=generator,
        )

    @property
    def buffers(self) -> list[ReplayBuffer]:
        """The member buffers (a new list)."""
        return list(self._rbs)

    def __len__(self) -> int:
        return len(self._rbs)

    def __getitem__(self, item: int) -> ReplayBuffer:
        """The ``item``-th member buffer."""
        hint = "To read data, index a member: rb_ensemble[i][index]."
        return member_at("ReplayBufferEnsemble", self._rbs, item, hint=hint)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({', '.join(map(repr, self._rbs))}, sampler={self._sampler!r}, "
            f"batch_size={self._batch_size}, transform={self._transform!r})"
        )

    # -- writes are refused ----------------------------------------------------------------------------------
    def add(self, data) -> Any:
        raise RuntimeError(f"A ReplayBufferEnsemble is read-only: add() is not supported; {_WRITE_HINT}.")

    def extend(self, data, **kwargs) -> torch.Tensor:
        raise RuntimeError(f"A ReplayBufferEnsemble is read-only: extend() is not supported; {_WRITE_HINT}.")

    def __setitem__(self, index, value) -> None:
        raise RuntimeError(
            f"A ReplayBufferEnsemble is read-only: item assignment is not supported; {_WRITE_HINT}."
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

    # -- reads -----------------------------------------------------------------------------------------------
    def _sample(self, batch_size: int, transform: bool = True):
        with contextlib.ExitStack() as locks:
            locks.enter_context(self._replay_lock)
            for rb in self._rbs:  # members may be written from other threads while we read them
                locks.enter_context(rb.replay_lock)
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
                        index=member_index, buffer_ids=buffer_ids, batch_size=data.batch_size, device=data.device
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
        value = value.expand(*batch, *value.shape[len(batch):]).clone()
    return value
