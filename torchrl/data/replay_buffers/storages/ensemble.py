"""A read-only view over several storages: :class:`StorageEnsemble`.

Data model: the ensemble holds member storages in order; member ``i`` is "buffer ``i``". It is read with
the index drawn by :class:`~torchrl.data.SamplerEnsemble`, a :class:`~tensordict.TensorDict` with one row per
sub-batch (batch size ``[num_buffer_sampled]``) holding

- ``"buffer_ids"``: the member each sub-batch is read from (int64, ``[num_buffer_sampled]``);
- ``"index"``: the positions read in that member, flattened over the member's item grid (int64,
  ``[num_buffer_sampled, k]``; a lazily stacked TensorDict when sub-batches have different lengths ``k``).

Each member keeps its own data layout, so reads return one ``(buffer_id, data)`` pair per sub-batch; how
they are combined into one batch is the buffer's business (see :class:`~torchrl.data.ReplayBufferEnsemble`).
Writes go through the member buffers (a :class:`~torchrl.data.ReplayBufferEnsemble` built with a routing rule
routes records to them), never through the storage ensemble.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from torchrl._validation import check_member_states, check_members, check_per_member, member_id
from torchrl.data.replay_buffers.checkpointers import StorageEnsembleCheckpointer
from torchrl.data.replay_buffers.loading.collate import stack_samples
from torchrl.data.replay_buffers.storages._index import is_int
from torchrl.data.replay_buffers.storages.base import Storage
from torchrl.envs.transforms.transforms import Compose, as_transform


def _write_refused(what: str):
    raise RuntimeError(
        f"A StorageEnsemble is read-only: {what} write into the member buffers (or storages) instead, e.g. "
        f"rb_ensemble[i].extend(data) or storage_ensemble[i].set(index, data)."
    )


def _as_member_transform(transform) -> Compose:
    if transform is None:
        return Compose()
    if isinstance(transform, Compose):
        return transform
    return Compose(as_transform(transform))


class StorageEnsemble(Storage):
    """Several storages read as one, with the index drawn by :class:`~torchrl.data.SamplerEnsemble`.

    A building block of :class:`~torchrl.data.ReplayBufferEnsemble`, which mixes batches from several
    buffers (e.g. an expert dataset and online data). See the module docstring for the index format.

    Args:
        *storages (Storage): the member storages; member ``i`` is buffer ``i``.

    Keyword Args:
        transforms (list, optional): one transform (or callable, or ``None``) per storage, applied to what is
            read from it. Defaults to ``None`` (no transform).
        collate_fns (list of callables, optional): one function per storage turning what its ``get`` returns
            into a batch, applied before the transform. Defaults to
            :func:`~torchrl.data.tensordict_collate` (stacks the lists read from a ``ListStorage``; leaves
            batches unchanged).

    ``len(ensemble)`` is the number of storages and ``ensemble[i]`` the ``i``-th storage (a slice or a list
    of ints gives a sub-ensemble).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, StorageEnsemble
        >>> s0, s1 = LazyTensorStorage(10), LazyTensorStorage(10)
        >>> s0.set(torch.arange(3), torch.arange(3))
        >>> s1.set(torch.arange(3), torch.arange(3) + 100)
        >>> ensemble = StorageEnsemble(s0, s1)
        >>> index = TensorDict(buffer_ids=torch.tensor([1, 0]), index=torch.tensor([[0, 2], [1, 1]]),
        ...                    batch_size=[2])
        >>> ensemble.get(index)
        [(1, tensor([100, 102])), (0, tensor([1, 1]))]
    """

    ndim = 1
    is_ensemble = True  # StorageDataset refuses ensembles
    _default_checkpointer = StorageEnsembleCheckpointer

    def __init__(
        self,
        *storages: Storage,
        transforms: Sequence | None = None,
        collate_fns: Sequence[Callable] | None = None,
    ) -> None:
        self._storages = check_members("StorageEnsemble", storages, Storage)
        n = len(self._storages)
        transforms = [None] * n if transforms is None else check_per_member("transforms", transforms, n)
        self._transforms = [_as_member_transform(t) for t in transforms]
        collate_fns = [None] * n if collate_fns is None else check_per_member("collate_fns", collate_fns, n)
        for i, fn in enumerate(collate_fns):
            if fn is not None and not callable(fn):
                raise TypeError(f"`collate_fns[{i}]` must be callable or None, got {type(fn).__name__}.")
        self._collate_fns = [stack_samples if fn is None else fn for fn in collate_fns]
        self._attached_entities: list[Any] = []

    @property
    def storages(self) -> list[Storage]:
        """The member storages (a new list)."""
        return list(self._storages)

    @property
    def transforms(self) -> list[Compose]:
        """The per-member transforms (a new list)."""
        return list(self._transforms)

    @property
    def collate_fns(self) -> list[Callable]:
        """The per-member collate functions (a new list)."""
        return list(self._collate_fns)

    @property
    def max_size(self) -> int:
        """The total capacity of the members."""
        return sum(s.max_size for s in self._storages)

    # -- reads -----------------------------------------------------------------------------------------------
    def get(self, item) -> list[tuple[int, Any]]:
        """Reads every sub-batch of an ensemble index.

        Args:
            item (TensorDictBase): what :meth:`SamplerEnsemble.sample` returns (``"buffer_ids"`` and
                ``"index"`` entries, one row per sub-batch).

        Returns:
            A list of ``(buffer_id, data)`` pairs, one per sub-batch, in order; ``data`` went through the
            member's collate function and transform.
        """
        if not isinstance(item, TensorDictBase) or not {"buffer_ids", "index"} <= set(item.keys()):
            raise TypeError(
                f"StorageEnsemble.get() takes the index drawn by SamplerEnsemble.sample() (a TensorDict with "
                f"'buffer_ids' and 'index' entries), got {type(item).__name__}. To read one member, index "
                f"the ensemble first: ensemble[buffer_id].get(index)."
            )
        out = []
        buffer_ids = item.get("buffer_ids").tolist()
        for row, buffer_id in enumerate(buffer_ids):
            storage = self[buffer_id]
            positions = item[row].get("index")
            out.append((buffer_id, self._read(buffer_id, storage, positions)))
        return out

    def _read(self, buffer_id: int, storage: Storage, positions: torch.Tensor):
        data = self._collate_fns[buffer_id](storage.get(_member_index(positions, storage)))
        transform = self._transforms[buffer_id]
        if len(transform):
            data = transform(data)
        return data

    def __getitem__(self, item):
        """The ``item``-th storage (int), or a sub-ensemble (slice or list of ints)."""
        if is_int(item):  # an int, a numpy integer or a 0-d integer tensor
            return self._storages[member_id(int(item), len(self._storages))]
        ids = selected_members("StorageEnsemble", item, len(self._storages))
        return type(self)(
            *(self._storages[i] for i in ids),
            transforms=[self._transforms[i] for i in ids],
            collate_fns=[self._collate_fns[i] for i in ids],
        )

    def __len__(self) -> int:
        return len(self._storages)

    def __iter__(self):
        return iter(list(self._storages))

    def contains(self, item) -> bool:
        raise TypeError(
            "`in` is ambiguous on a StorageEnsemble: ask a member, e.g. "
            "`index in storage_ensemble[buffer_id]`."
        )

    @property
    def _is_full(self) -> bool:
        return all(s._is_full for s in self._storages)

    def rows_written(self) -> int:
        return sum(s.rows_written() for s in self._storages)

    # -- writes are refused ---------------------------------------------------------------------------------
    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        _write_refused("set() is not supported;")

    def __setitem__(self, index, value) -> None:
        _write_refused("item assignment is not supported;")

    def add(self, value) -> None:
        _write_refused("add() is not supported;")

    def extend(self, value) -> None:
        _write_refused("extend() is not supported;")

    def _empty(self) -> None:
        _write_refused("empty() is not supported;")

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The members' states, keyed by ``str(buffer_id)``, and their transforms' states."""
        return {
            str(i): {"storage": s.state_dict(), "transform": t.state_dict()}
            for i, (s, t) in enumerate(zip(self._storages, self._transforms))
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_member_states("StorageEnsemble", state_dict, len(self._storages))
        for i, (s, t) in enumerate(zip(self._storages, self._transforms)):
            s.load_state_dict(state_dict[str(i)]["storage"])
            t.load_state_dict(state_dict[str(i)]["transform"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._storages))})"


def selected_members(kind: str, item, n: int) -> list[int]:
    """The members of an ensemble ``kind`` of ``n`` members that ``item`` selects for a sub-ensemble: a slice, or
    a list, tuple or 1-D tensor of ints (negative ones count from the end); ``TypeError`` for anything else."""
    if isinstance(item, slice):
        return list(range(n))[item]
    if isinstance(item, (list, tuple)) or (isinstance(item, torch.Tensor) and item.ndim == 1):
        if not all(is_int(i) for i in item):
            raise TypeError(f"A sub-ensemble of a {kind} is selected with ints, got {item!r}.")
        return [member_id(int(i), n) for i in item]
    raise TypeError(
        f"Index a {kind} with an int (a member), a slice or a list of ints (a sub-ensemble); got "
        f"{type(item).__name__}."
    )


def _member_index(positions: torch.Tensor, storage: Storage):
    """Flat positions in a member's item grid -> what ``storage.get`` takes (per-dim tuple for ndim > 1)."""
    positions = torch.as_tensor(positions, dtype=torch.long).reshape(-1)
    if storage.ndim == 1:
        return positions
    return torch.unravel_index(positions, tuple(storage.shape))


def _flat_member_index(index, storage: Storage) -> torch.Tensor:
    """What a member sampler returns -> flat positions in the member's item grid (1-D int64)."""
    if isinstance(index, tuple):
        if len(index) == 1:
            index = index[0]
        else:
            parts = [torch.as_tensor(i, dtype=torch.long).reshape(-1) for i in index]
            flat = torch.zeros_like(parts[0])
            for size, part in zip(storage.shape, parts):
                flat = flat * size + part
            return flat
    return torch.as_tensor(index, dtype=torch.long).reshape(-1)
