"""A tensor storage that allocates its tensors at the first write: :class:`LazyTensorStorage`.

The tensors are shaped like that first write (see :class:`~torchrl.data.TensorStorage` for the data model). With
``shared_init=True`` the first write may come from any process sharing the storage: it allocates memory-mapped
files in a scratch directory and publishes them (:class:`~torchrl.data.replay_buffers.storages._shared_init.SharedInit`),
and the other processes map them.
"""

from __future__ import annotations

import weakref

import torch
from tensordict import TensorDictBase

import torchrl.data.replay_buffers.storages._checkpoint as _ckpt
from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool, check_positive_int
from torchrl.data.replay_buffers._shared.cleanup import make_scratch_dir, remove_owned_path
from torchrl.data.replay_buffers._shared.row_versions import RowVersions
from torchrl.data.replay_buffers.storages._shared_init import SharedInit
from torchrl.data.replay_buffers.storages.tensor_storage import TensorStorage

SHARED_INIT_DEVICE = TorchRLPhrase(
    UserWarning,
    "cannot be honored",
    "shared_init=True with device={device!r} cannot be honored: shared memory lives on the CPU. The storage "
    "is allocated on the CPU, and samples come back on the CPU.",
)


class LazyTensorStorage(TensorStorage):
    """A :class:`TensorStorage` that allocates its tensors at the first write, shaped like that data.

    Args:
        max_size (int): the capacity in items (cells for ``ndim > 1``).

    Keyword Args:
        device (torch.device or str): where the data lives; ``"auto"`` takes the first datum's device.
            Defaults to ``"cpu"``.
        ndim (int): how many leading dims index items. Defaults to ``1``.
        compilable (bool): keep the counters as a tensor on the storage's device, for compiled writes and draws
            (see :class:`~torchrl.data.Storage`); not with ``shared_init``. Defaults to ``False``.
        consolidated (bool): allocate every entry as a view into one contiguous buffer
            (:meth:`~tensordict.TensorDictBase.consolidate`), which makes moving a whole storage between devices
            or processes one copy; not with ``shared_init``. Defaults to ``False``.
        shared_init (bool): let the first write come from any process that shares the storage (DataLoader
            workers, ``multiprocessing`` children started before any write). The storage is shared from
            construction; the first writer allocates memory-mapped files in a temporary directory that this
            storage removes with it, and the other processes map them (a read waits for that first write).
            Data then lives in those files on the host: with another ``device`` the first write warns
            (``UserWarning``) and :attr:`device` becomes the CPU. Defaults to ``False``: a storage
            shared before its first write must receive that write from the process that shared it.
        cleanup_memmap (bool): TorchRL's keyword, kept for signature compatibility; it has no effect (as in
            TorchRL: this storage writes no memory-mapped files except with ``shared_init``, whose scratch
            directory is always removed with the storage). Defaults to ``True``.
        consistent_reads (bool): see :class:`TensorStorage`. Defaults to ``True``.
        max_string_bytes (int, optional): the width, in UTF-8 bytes, of each string entry
            (``NonTensorData``/``NonTensorStack`` of str); longer strings are refused. ``None`` sizes each entry
            at its first write (at least 256 bytes) and lets a private storage widen it for longer strings
            later; a shared storage cannot widen it (see :mod:`~torchrl.data.replay_buffers.storages._nontensor`).
            Defaults to ``None``.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(100)
        >>> storage.set(torch.arange(3), {"obs": torch.randn(3, 4), "reward": torch.zeros(3)})
        >>> storage.get(torch.tensor([2, 0]))["obs"].shape
        torch.Size([2, 4])

        String entries are kept too, one per item:

        >>> from tensordict import NonTensorStack, TensorDict
        >>> storage = LazyTensorStorage(100)
        >>> storage.set(torch.arange(2), TensorDict(obs=torch.zeros(2), text=NonTensorStack("hi", "ho"), batch_size=[2]))
        >>> storage.get(torch.tensor([1, 0]))["text"].tolist()
        ['ho', 'hi']
    """

    def __init__(
        self,
        max_size: int,
        *,
        device="cpu",
        ndim: int = 1,
        compilable: bool = False,
        consolidated: bool = False,
        shared_init: bool = False,
        cleanup_memmap: bool = True,
        consistent_reads: bool = True,
        max_string_bytes: int | None = None,
    ):
        self.shared_init = check_bool("shared_init", shared_init)
        self.consolidated = check_bool("consolidated", consolidated)
        self.cleanup_memmap = check_bool("cleanup_memmap", cleanup_memmap)
        if self.consolidated and self.shared_init:
            raise ValueError(
                "LazyTensorStorage got consolidated=True with shared_init=True: a shared_init storage lives in "
                "memory-mapped files, one per entry, which cannot be consolidated into one buffer. Pass one of them."
            )
        if max_string_bytes is not None:
            self.max_string_bytes = check_positive_int("max_string_bytes", max_string_bytes)
        super().__init__(
            None,
            max_size=max_size,
            device=device,
            ndim=ndim,
            compilable=compilable,
            consistent_reads=consistent_reads,
        )
        if self.shared_init:
            self.shared_init_state = SharedInit(self._shared_init_dir())
            self._make_shared()
            self._use_versions(RowVersions(self.max_size))  # one set of row versions seen by every copy

    def _shared_init_dir(self) -> str:
        """The directory where the first writer of a ``shared_init`` storage allocates its files."""
        path = make_scratch_dir()  # removed at exit, on SIGTERM and with this storage, by this process only
        weakref.finalize(self, remove_owned_path, path)
        return path

    def _backing_for_checkpoint(self, doc: dict, tensors) -> TensorDictBase:
        """A private RAM storage loads into memory that the load fills (saved rows not zeroed first, laid out
        for fast reads: see ``_checkpoint.unfilled_backing``); others allocate as at a first write."""
        private = (
            type(self)._allocate is LazyTensorStorage._allocate  # a subclass allocating files allocates them
            and self.shared_init_state is None
            and not self.consolidated
            and not self._share_on_init
            and not self.is_shared
            and isinstance(self.device, torch.device)
            and self.device.type == "cpu"
        )
        if private:
            return _ckpt.unfilled_backing(doc)
        return super()._backing_for_checkpoint(doc, tensors)

    def _allocate(self, item: TensorDictBase, rows: int) -> TensorDictBase:
        state = self.shared_init_state
        if state is None:
            backing = super()._allocate(item, rows)
            return backing.consolidate() if self.consolidated else backing
        if self.device not in (None, "auto") and self.device.type != "cpu":
            # as in TorchRL, the first write says so (and the storage's device becomes the CPU)
            SHARED_INIT_DEVICE.warn(stacklevel=6, device=str(self.device))
            self.device = torch.device("cpu")
        return item.expand(rows, *item.batch_size).memmap_like(prefix=state.directory, existsok=True)
