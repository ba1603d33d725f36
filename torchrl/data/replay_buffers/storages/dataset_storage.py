"""A read-only storage over a map-style dataset: :class:`DatasetStorage`.

Data model: item ``i`` of the storage is ``dataset[i]``, for ``i`` in ``range(len(dataset))``; the length is
fixed when the storage is built. A batch of indices is read with ONE ``dataset.__getitems__(indices)`` call
when the dataset has that method (what :class:`torch.utils.data.DataLoader` calls), else with one
``__getitem__`` per index, and the items are stacked with :func:`~torchrl.data.tensordict_collate`.

The storage declares two capabilities that buffers read when they are built (it imports no buffer, writer or
sampler):

- ``writable = False``: a buffer built over it without a writer gets an
  :class:`~torchrl.data.ImmutableDatasetWriter`, and :meth:`DatasetStorage.set` refuses writes;
- ``stable_items = False``: item ``i`` may differ between two reads (a dataset with random augmentation) and
  carries no trajectory metadata the storage could index, so a buffer accepts only samplers that draw
  indices uniformly (:class:`~torchrl.data.RandomSampler`, :class:`~torchrl.data.SamplerWithoutReplacement`).
"""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from torchrl.data.replay_buffers._checkpoint.parts import PartContext
from torchrl.data.replay_buffers.loading.collate import tensordict_collate
from torchrl.data.replay_buffers.storages._index import as_index_tensor, check_bounds, check_int, is_int
from torchrl.data.replay_buffers.storages.base import Storage

__all__ = ["DatasetStorage"]

_EXPORT_HINT = (
    "To save the data itself, export it: `rb.export_hf(path)` writes a Hugging Face dataset that "
    "`ReplayBuffer.from_hf(path)` reads back into any tensor storage."
)


def _check_dataset(dataset) -> int:
    """Validates ``dataset`` (a non-empty, fixed-length, map-style dataset) and returns its length."""
    if isinstance(dataset, IterableDataset):
        raise TypeError(
            f"`dataset` must be a map-style dataset (with __getitem__ and __len__), got the IterableDataset "
            f"{type(dataset).__name__}: a stream has no index to sample. Collect it into a buffer with "
            f"`rb.extend(...)` over a LazyTensorStorage, or wrap a map-style dataset."
        )
    if not (hasattr(type(dataset), "__getitem__") and hasattr(type(dataset), "__len__")):
        raise TypeError(
            f"`dataset` must be a map-style dataset with __getitem__ and __len__ (a torch.utils.data.Dataset, a "
            f"datasets.Dataset, ...), got {type(dataset).__name__}."
        )
    length = len(dataset)
    if not isinstance(length, int) or length <= 0:
        raise ValueError(
            f"`dataset` must hold at least one item, got len(dataset)={length!r}. A DatasetStorage has a fixed "
            f"length; pass a non-empty dataset."
        )
    return length


#: The openers of dataset directories, tried in order: ``opener(path)`` returns the dataset of a directory it reads,
#: else ``None``. ``hf/`` registers the LeRobot one (:func:`register_directory_opener`), so that this module
#: imports nothing from it.
_DIRECTORY_OPENERS: list = []


def register_directory_opener(opener) -> None:
    """Lets :class:`DatasetStorage` open the directories ``opener(path) -> dataset or None`` reads."""
    if opener not in _DIRECTORY_OPENERS:
        _DIRECTORY_OPENERS.append(opener)


def _open_directory(dataset):
    """A LeRobot directory (``meta/info.json`` with a ``codebase_version``) as its frames; other values as they are."""
    if not isinstance(dataset, (str, os.PathLike)):
        return dataset
    for opener in _DIRECTORY_OPENERS:
        opened = opener(dataset)
        if opened is not None:
            return opened
    raise TypeError(
        f"`dataset` {os.fspath(dataset)!r} is a path, but not a LeRobot dataset directory (meta/info.json with "
        f"a codebase_version), the only directory a DatasetStorage opens itself. For a `save_to_disk` "
        f"directory pass `datasets.load_from_disk(path).with_format('torch')`."
    )


def _dataset_name(dataset) -> str:
    cls = type(dataset)
    return f"{cls.__module__}.{cls.__qualname__}"


class DatasetStorage(Storage):
    """A read-only storage over a fixed-length map-style :class:`torch.utils.data.Dataset`.

    ``len(storage)`` is ``len(dataset)``. ``get(i)`` returns ``dataset[i]``; ``get(indices)`` calls
    ``dataset.__getitems__(indices)`` once when the dataset has it (else ``dataset[i]`` for each index) and
    stacks the items with :func:`~torchrl.data.tensordict_collate` (tuples and mappings element-wise,
    TensorDicts into one TensorDict). Any map-style dataset works: a :class:`~torch.utils.data.TensorDataset`,
    a Hugging Face ``datasets.Dataset`` (in ``"torch"`` format), a
    :class:`~torchrl.data.StorageDataset`, or your own class.

    A buffer built over it writes nothing: its default writer is :class:`~torchrl.data.ImmutableDatasetWriter`
    and :meth:`set` raises. It samples with :class:`~torchrl.data.RandomSampler` or
    :class:`~torchrl.data.SamplerWithoutReplacement`; trajectory-aware samplers (``SliceSampler`` and its
    family) and prioritized samplers are refused when the buffer is built, because:

    - the storage has no trajectory metadata it can index without reading every item, and the items it would
      read need not be the same on the next read;
    - a priority belongs to an index, not to the realised sample: when ``__getitem__`` is stochastic (random
      crops, noise, a sampled frame), the TD error measured on one draw of item ``i`` says nothing reliable
      about the next draw of ``i``.

    Args:
        dataset (torch.utils.data.Dataset, str or path-like): a map-style dataset with ``__getitem__`` and
            ``__len__``, holding at least one item (its length must not change while the storage is used), or the
            path of a LeRobot dataset directory (``meta/info.json`` with a ``codebase_version``), read as
            :class:`~torchrl.data.replay_buffers.hf.lerobot_frames.LeRobotFrames`: its frames with TorchRL's
            ``LeRobotExperienceReplay`` keys. A LeRobot directory's frames are the same at every read and carry
            their episode (``"episode"``), so trajectory samplers work on it
            (``SliceSampler(slice_len=..., traj_key="episode")``).

    .. note:: Reads of a dataset whose ``__getitem__`` is stochastic return a new draw every time: reading the
        same index twice (two samples, or a sample and an export) may give different items.

    .. note:: :meth:`dumps` (and ``rb.dumps``) writes only a reference to the dataset (its class and length),
        never its content; :meth:`loads` checks that the dataset wrapped here matches it. To save the content,
        export it with ``rb.export_hf(path)`` (see :ref:`exchanging-datasets`).

    Examples:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from torchrl.data import DatasetStorage, ReplayBuffer
        >>> dataset = TensorDataset(torch.arange(10.0), torch.arange(10) % 2)
        >>> rb = ReplayBuffer(storage=DatasetStorage(dataset), batch_size=4)
        >>> obs, label = rb.sample()
        >>> obs.shape, label.shape, len(rb)
        (torch.Size([4]), torch.Size([4]), 10)
        >>> rb.extend(torch.zeros(2))
        Traceback (most recent call last):
        ...
        RuntimeError: This dataset doesn't ...
    """

    writable = False
    stable_items = False

    def __init__(self, dataset: Dataset | str | os.PathLike):
        dataset = _open_directory(dataset)
        length = _check_dataset(dataset)
        super().__init__(length)
        self.dataset = dataset
        self._length = length
        # frames read from files (a LeRobot directory) are the same at every read, and carry their episodes
        self.stable_items = bool(getattr(dataset, "stable_items", False))

    # -- reads ----------------------------------------------------------------------------------------------------
    def get(self, index):
        """``dataset[i]`` for an int; the collated items for a slice or an index (tensor, list, ndarray)."""
        n = self._length
        if isinstance(index, tuple):
            if len(index) != 1:
                raise IndexError(f"A DatasetStorage is indexed along one dimension; got a tuple of {len(index)}.")
            index = index[0]
        if is_int(index):
            return self.dataset[check_int(index, n)]
        if isinstance(index, slice):
            positions = list(range(*index.indices(n)))
        elif isinstance(index, list) and not index:
            positions = []
        else:
            positions = check_bounds(as_index_tensor(index), n).tolist()
        if not positions:
            raise IndexError(
                f"Cannot read an empty index from a DatasetStorage (got {index!r}): items are collated, and "
                f"there is no item to collate. Pass at least one position."
            )
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(positions) if callable(getitems) else [self.dataset[i] for i in positions]
        return tensordict_collate(list(items) if isinstance(items, tuple) else items)

    def __len__(self) -> int:
        return self._length

    # -- writes are refused -----------------------------------------------------------------------------------------
    def _refuse_write(self, what: str):
        raise RuntimeError(
            f"A DatasetStorage is read-only: it cannot {what}. Its items are the items of the dataset it wraps "
            f"({type(self.dataset).__name__}). Write into a LazyTensorStorage or LazyMemmapStorage instead, e.g. "
            f"`ReplayBuffer.from_hf(path)` after `rb.export_hf(path)`."
        )

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Raises ``RuntimeError``: the storage is read-only."""
        self._refuse_write("write items")

    def _empty(self) -> None:
        self._refuse_write("be emptied")

    # -- state: a reference to the dataset, never its content -------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A reference to the dataset: ``{"dataset_class": "<module>.<class>", "length": n}``."""
        return {"dataset_class": _dataset_name(self.dataset), "length": self._length}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Checks that ``state_dict`` describes the dataset wrapped here (class and length); changes nothing."""
        self._check_reference(state_dict, "state_dict")

    def _check_reference(self, doc, source: str) -> None:
        if not isinstance(doc, dict) or "dataset_class" not in doc or "length" not in doc:
            raise ValueError(
                f"`{source}` must describe a DatasetStorage ({{'dataset_class': ..., 'length': ...}}), got "
                f"{doc!r}."
            )
        expected = self.state_dict()
        if doc["dataset_class"] != expected["dataset_class"] or doc["length"] != expected["length"]:
            raise ValueError(
                f"The {source} refers to a {doc['dataset_class']} of {doc['length']} items, but this DatasetStorage "
                f"wraps a {expected['dataset_class']} of {expected['length']} items. A DatasetStorage saves only "
                f"this reference, not the data: build it over the same dataset. {_EXPORT_HINT}"
            )

    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        """The reference to the dataset (no tensors): the content is not embedded in a checkpoint."""
        return {}, {"reference": self.state_dict(), "embedded": False, "hint": _EXPORT_HINT}

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        self._check_reference(doc.get("reference") if isinstance(doc, dict) else doc, "checkpoint")

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        return None

    def __repr__(self) -> str:
        return f"DatasetStorage(dataset={type(self.dataset).__name__}, len={self._length})"
