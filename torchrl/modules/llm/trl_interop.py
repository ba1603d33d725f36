"""Feed replay buffers to Hugging Face / TRL trainers: :class:`TorchRLBufferDataset`.

Trainers of ``transformers`` and ``trl`` consume datasets whose items are flat ``dict[str, Any]`` samples.
:class:`TorchRLBufferDataset` is a :class:`~torchrl.data.ReplayBufferDataset` that draws ``batch_size`` items
per sampling call and yields them one at a time as such dicts; :meth:`TorchRLBufferDataset.as_hf_dataset`
wraps it in a ``datasets.IterableDataset`` for trainers that want one.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from torchrl.data import ReplayBufferDataset
from torchrl.data.replay_buffers.replay_buffers import ReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.dataset import SHAREABLE_SAMPLERS

__all__ = ["TorchRLBufferDataset"]


def _flat_name(key) -> str:
    return ".".join(key) if isinstance(key, tuple) else key


def _is_leaf(cls: type) -> bool:
    """Tensors and non-tensor entries are leaves; nested TensorDicts are not."""
    return not issubclass(cls, TensorDictBase) or issubclass(cls, (NonTensorData, NonTensorStack))


def _leaf_keys(batch: TensorDictBase) -> list:
    return list(batch.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf))


def _column(batch: TensorDictBase, key):
    """The entry ``key`` of every item: a batched tensor, or a list of tensors for ragged lazy stacks."""
    try:
        return batch.get(key)
    except RuntimeError:  # a lazy stack of items whose tensors differ in shape
        return batch.get(key, as_list=True)


def _unwrap(value) -> Any:
    if isinstance(value, NonTensorData):
        return value.data
    if isinstance(value, NonTensorStack):
        return value.tolist()
    return value


class TorchRLBufferDataset(ReplayBufferDataset):
    """An iterable dataset of flat ``dict`` samples drawn from a replay buffer, for HF / TRL trainers.

    Each sampling call draws ``batch_size`` items with ``replay_buffer.sample(batch_size)`` and yields them
    one by one as ``dict[str, Any]`` without a batch dim: nested keys are joined with ``"."``
    (``("tokens", "full")`` -> ``"tokens.full"``) and non-tensor entries (strings) are unwrapped to Python
    values.

    It is built on the public hooks of :class:`~torchrl.data.ReplayBufferDataset`: :meth:`draw` samples
    ``batch_size`` items, :meth:`items` splits them into dicts, and ``refuse_stateful = False``. Under DataLoader
    workers it behaves like its base: the buffer's worker copy is readied and reseeded per worker, the
    ``num_batches`` sampling calls are split across workers, and a stateful sampler that can share its state
    (``can_share_state``: prioritized samplers, samplers without replacement) is moved to shared memory when the
    dataset is built, so that every worker samples from and updates one copy. Only a buffer whose sampler (or
    storage) requires shared state but cannot share it differs: it is not refused yet, building the dataset
    emits a ``FutureWarning`` (refused with workers from v0.17), and each worker then samples from its own copy.

    Strings are yielded as Python strings whatever the storage: a :class:`~torchrl.data.ListStorage` keeps
    them as written, the tensor storages as UTF-8 bytes that every worker reads from the shared storage.

    Args:
        replay_buffer (ReplayBuffer): the buffer to sample; its data must be TensorDicts.
        batch_size (int): the number of items each sampling call draws.

    Keyword Args:
        keys (list of NestedKey, optional): keep only these entries. A key missing from the sampled data
            raises a ``KeyError``. Defaults to ``None`` (every leaf entry).
        device (torch.device or str, optional): move tensors there. Defaults to ``None`` (no move).
        num_batches (int, optional): sampling calls per iteration, in total over all DataLoader workers.
            ``None`` is an unbounded stream: the consumer must impose its own step limit (e.g. a trainer's
            ``max_steps``). Defaults to ``1``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import ListStorage, ReplayBuffer
        >>> from torchrl.modules.llm import TorchRLBufferDataset
        >>> rb = ReplayBuffer(storage=ListStorage(100), batch_size=4)
        >>> for _ in range(10):
        ...     _ = rb.add(TensorDict(input_ids=torch.randint(0, 100, (8,)), attention_mask=torch.ones(8)))
        >>> dataset = TorchRLBufferDataset(rb, batch_size=4)
        >>> next(iter(dataset))["input_ids"].shape
        torch.Size([8])
        >>> len(list(dataset))
        4
    """

    refuse_stateful = False

    def __init__(self, replay_buffer: ReplayBuffer, batch_size: int, *, keys=None, device=None,
                 num_batches: int | None = 1):
        if not issubclass(type(replay_buffer), ReplayBuffer):  # a RayReplayBuffer passes isinstance only
            raise TypeError(
                f"`replay_buffer` must be a torchrl ReplayBuffer in this process, got {type(replay_buffer).__name__}"
                f" (a RayReplayBuffer is read through rb.as_dataset())."
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"`batch_size` must be a positive integer, got {batch_size!r}.")
        self.batch_size = batch_size
        self.keys = None if keys is None else [k if isinstance(k, (str, tuple)) else str(k) for k in keys]
        self.device = None if device is None else torch.device(device)
        super().__init__(replay_buffer, num_batches=num_batches)
        stateful = replay_buffer.stateful_component()
        if stateful is not None:
            name, component = stateful
            warnings.warn(
                f"The buffer's {name} {type(component).__name__} requires shared state and cannot put it in "
                f"shared memory: with DataLoader workers each worker would hold its own copy of it. "
                f"TorchRLBufferDataset will refuse such a buffer with workers from v0.17 (as ReplayBufferDataset "
                f"does); use num_workers=0, a stateless sampler (RandomSampler, SliceSampler) or one that shares "
                f"its state with the workers ({SHAREABLE_SAMPLERS}).",
                FutureWarning,
                stacklevel=2,
            )

    def __len__(self) -> int:
        """The number of items (``num_batches * batch_size``); a ``TypeError`` for an endless dataset."""
        return super().__len__() * self.batch_size

    def draw(self) -> TensorDictBase:
        """Samples ``batch_size`` items; a ``TypeError`` if the buffer's data are not TensorDicts."""
        batch = self.replay_buffer.sample(self.batch_size)
        if not isinstance(batch, TensorDictBase):
            raise TypeError(
                f"TorchRLBufferDataset yields dicts of the entries of TensorDict samples; the buffer returned "
                f"{type(batch).__name__}. Store TensorDicts in the buffer."
            )
        return batch

    def _selected_keys(self, batch: TensorDictBase) -> list:
        if self.keys is None:
            return _leaf_keys(batch)
        present = set(batch.keys(include_nested=True))
        missing = [k for k in self.keys if k not in present]
        if missing:
            raise KeyError(
                f"`keys` asks for {missing}, which the sampled data does not hold; it holds "
                f"{sorted(map(_flat_name, _leaf_keys(batch)))}."
            )
        return self.keys

    def items(self, batch: TensorDictBase):
        """Yields each item of ``batch`` as a flat dict (``keys`` selected, moved to ``device``)."""
        keys = self._selected_keys(batch)
        columns = {}
        for key in keys:
            value = _column(batch, key)
            if isinstance(value, (NonTensorData, NonTensorStack)):
                value = _unwrap(value)
                if not isinstance(value, list):
                    value = [value] * batch.batch_size[0]
            elif self.device is not None:
                value = [v.to(self.device) for v in value] if isinstance(value, list) else value.to(self.device)
            columns[_flat_name(key)] = value
        for i in range(batch.batch_size[0]):
            yield {name: column[i] for name, column in columns.items()}

    def as_hf_dataset(self):
        """This dataset as a ``datasets.IterableDataset`` (needs the ``datasets`` package).

        Examples:
            >>> ds = dataset.as_hf_dataset()  # doctest: +SKIP
            >>> next(iter(ds))["input_ids"]  # doctest: +SKIP
        """
        try:
            import datasets
        except ImportError as err:
            raise ImportError(
                "as_hf_dataset() needs the `datasets` package: pip install datasets (or torchrl[hf])."
            ) from err
        # ``IterableDataset.from_generator`` would pickle the whole buffer to fingerprint it (a full copy, and
        # an error for shared-memory data): build the iterable directly instead.
        from datasets.iterable_dataset import ExamplesIterable

        return datasets.IterableDataset(ExamplesIterable(_generate_examples, {"dataset": self}))

    def __repr__(self) -> str:
        keys = "<all>" if self.keys is None else self.keys
        return (
            f"TorchRLBufferDataset(replay_buffer={type(self.replay_buffer).__name__}, batch_size={self.batch_size}, "
            f"keys={keys}, device={self.device}, num_batches={self.num_batches})"
        )


def _generate_examples(dataset: TorchRLBufferDataset):
    yield from enumerate(dataset)
