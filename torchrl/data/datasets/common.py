"""BaseDatasetExperienceReplay: offline datasets as read-only replay buffers.

A dataset class converts its source once into memory-mapped TensorDict files under ``root`` (``data_path``) and
serves them through a :class:`~torchrl.data.TensorStorage`; later constructions re-open the files. The buffer
refuses writes by default (:class:`~torchrl.data.ImmutableDatasetWriter`); pass ``writer=`` to write.
Subclasses give ``data_path``, ``data_path_root`` and ``_is_downloaded()``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from tensordict import TensorDictBase

from torchrl.data.replay_buffers.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl.data.replay_buffers.storages import TensorStorage
from torchrl.data.replay_buffers.writers import ImmutableDatasetWriter

__all__ = ["BaseDatasetExperienceReplay"]


class BaseDatasetExperienceReplay(TensorDictReplayBuffer):
    """The parent of every offline dataset buffer: a read-only :class:`~torchrl.data.TensorDictReplayBuffer`.

    A dataset is converted once into memory-mapped files under :attr:`data_path` and re-opened from there, so
    it can be larger than memory, and DataLoader workers map the same files. Subclasses define
    :attr:`data_path` (where the storage files are, a split variant included), :attr:`data_path_root` (the
    dataset's own directory) and :meth:`_is_downloaded`.

    Keyword Args:
        writer (Writer, optional): the writer. Defaults to ``None``: an
            :class:`~torchrl.data.ImmutableDatasetWriter`, which refuses ``add``, ``extend`` and ``empty``.
        **kwargs: the arguments of :class:`~torchrl.data.TensorDictReplayBuffer` (``storage``, ``sampler``,
            ``batch_size``, ``transform``, ...).

    Examples:
        >>> import tempfile, torch
        >>> from pathlib import Path
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorStorage
        >>> from torchrl.data.datasets import BaseDatasetExperienceReplay
        >>> class Squares(BaseDatasetExperienceReplay):
        ...     def __init__(self, root, batch_size):
        ...         self.root = root
        ...         if not self._is_downloaded():
        ...             data = TensorDict(x=torch.arange(10.0) ** 2, batch_size=[10])
        ...             data.memmap_(self.data_path)
        ...         data = TensorDict.load_memmap(self.data_path)
        ...         super().__init__(storage=TensorStorage(data), batch_size=batch_size)
        ...     @property
        ...     def data_path_root(self):
        ...         return self.root / "squares"
        ...     @property
        ...     def data_path(self):
        ...         return self.data_path_root
        ...     def _is_downloaded(self):
        ...         return self.data_path_root.exists()
        >>> root = Path(tempfile.mkdtemp())
        >>> ds = Squares(root, batch_size=4)
        >>> ds.sample()["x"].shape, len(ds)
        (torch.Size([4]), 10)
        >>> ds.delete()
        >>> (root / "squares").exists()
        False
    """

    _root: Path | None = None

    def __init__(self, *, writer=None, **kwargs) -> None:
        super().__init__(writer=ImmutableDatasetWriter() if writer is None else writer, **kwargs)

    # -- where the dataset lives ----------------------------------------------------------------------------
    @property
    def root(self) -> Path | None:
        """The cache directory of the dataset's source (a :class:`~pathlib.Path`), or ``None`` if it has none."""
        return self._root

    @root.setter
    def root(self, value: str | os.PathLike | None) -> None:
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(
                f"`root` must be a path (str or os.PathLike) or None, got {type(value).__name__} ({value!r})."
            )
        self._root = None if value is None else Path(value)

    @property
    def data_path(self) -> Path:
        """The directory of this dataset's storage files (the split variant when ``split_trajs=True``)."""
        raise NotImplementedError(f"{type(self).__name__} must define the `data_path` property.")

    @property
    def data_path_root(self) -> Path:
        """The dataset's own directory under :attr:`root`."""
        raise NotImplementedError(f"{type(self).__name__} must define the `data_path_root` property.")

    def _is_downloaded(self) -> bool:
        """Whether the converted dataset is present under :attr:`root` (subclasses decide how to tell)."""
        raise NotImplementedError(f"{type(self).__name__} must define `_is_downloaded()`.")

    def delete(self) -> None:
        """Removes the dataset's converted files (the directory :attr:`data_path`) from disk.

        The buffer keeps reading the files it has already mapped until it is dropped; build the dataset
        again (with ``download=True``) to convert it anew. Does nothing if the directory is absent.
        """
        path = Path(self.data_path)
        if path.is_symlink():
            raise RuntimeError(
                f"`data_path` {str(path)!r} is a symbolic link: delete() removes only directories the dataset "
                f"created. Remove the link (or its target) yourself."
            )
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()

    # -- preprocessing ----------------------------------------------------------------------------------------
    def preprocess(
        self,
        fn: Callable[[TensorDictBase], TensorDictBase],
        dim: int = 0,
        num_workers: int | None = None,
        *,
        chunksize: int | None = None,
        num_chunks: int | None = None,
        pool=None,
        generator: torch.Generator | None = None,
        max_tasks_per_child: int | None = None,
        worker_threads: int = 1,
        index_with_generator: bool = False,
        pbar: bool = False,
        mp_start_method: str | None = None,
        num_frames: int | None = None,
        dest: str | os.PathLike,
    ) -> TensorStorage:
        """Applies ``fn`` to the whole dataset and writes the result into a new memory-mapped storage.

        Why: transforms that cost a lot (image resizing, feature extraction, reward relabelling) are better run
        once over the dataset, in worker processes, than at every sample. ``fn`` is called once on the first
        sample (batch size ``[]``) to learn the output's structure, then on chunks of rows (batch size
        ``[n]``), so it must not depend on the batch size: write it with ``...`` indexing or TensorDict ops.
        The chunks are spread over worker processes with :meth:`tensordict.TensorDictBase.map`, which writes
        each result straight into the memory-mapped output. The dataset itself is left unchanged.

        Args:
            fn (Callable): takes a TensorDict of rows, returns a TensorDict (new keys allowed). It must be
                picklable (defined at module level) when ``num_workers != 0``.
            dim (int): the dimension along which the data is split into chunks. Defaults to ``0``.
            num_workers (int, optional): the worker processes. ``0`` runs in this process (no pool). Defaults
                to ``None``: one per CPU.

        Keyword Args:
            chunksize (int, optional): rows per chunk (exclusive with ``num_chunks``). Defaults to ``None``.
            num_chunks (int, optional): number of chunks. Defaults to ``None``: one chunk per worker.
            pool (multiprocessing.Pool, optional): a pool to run in. Defaults to ``None``.
            generator (torch.Generator, optional): seeds the workers (see ``TensorDictBase.map``). Defaults to
                ``None``.
            max_tasks_per_child (int, optional): chunks per worker before it is replaced. Defaults to ``None``.
            worker_threads (int): torch threads per worker. Defaults to ``1``.
            index_with_generator (bool): index chunks lazily. Defaults to ``False``.
            pbar (bool): show a progress bar (needs ``tqdm``; without it, none is shown). Defaults to
                ``False``.
            mp_start_method (str, optional): the workers' start method. Defaults to ``None``.
            num_frames (int, optional): process only the first ``num_frames`` rows. Defaults to ``None``: all.
            dest (str or os.PathLike): the directory of the output's memory-mapped files; it must not exist or
                be empty. Required.

        Returns:
            a :class:`~torchrl.data.TensorStorage` over the memory-mapped result, to build a new buffer with.

        Examples:
            >>> import tempfile, torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import ReplayBuffer, TensorStorage
            >>> from torchrl.data.datasets import BaseDatasetExperienceReplay
            >>> def double(td):
            ...     return td.set("x2", td["x"] * 2)
            >>> ds = BaseDatasetExperienceReplay(storage=TensorStorage(TensorDict(x=torch.arange(8.0),
            ...     batch_size=[8])))
            >>> storage = ds.preprocess(double, num_workers=0, num_frames=6, dest=tempfile.mkdtemp())
            >>> rb = ReplayBuffer(storage=storage, batch_size=3)
            >>> len(storage), storage[:]["x2"].tolist()
            (6, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0])
        """
        storage = self.storage
        if not isinstance(storage, TensorStorage):
            raise RuntimeError(
                f"preprocess() works on datasets stored in a TensorStorage (tensors the workers can map), this "
                f"dataset is stored in a {type(storage).__name__}. Build it over a TensorStorage (the default of "
                f"every dataset class)."
            )
        if not callable(fn):
            raise TypeError(f"`fn` must be callable (a TensorDict -> TensorDict function), got {fn!r}.")
        dest = _check_dest(dest)
        rows = len(storage)
        if rows == 0:
            raise RuntimeError("preprocess() needs a dataset with at least one row; this one is empty.")
        if num_frames is not None:
            if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1:
                raise ValueError(f"`num_frames` must be a positive int or None, got {num_frames!r}.")
            rows = min(rows, num_frames)
        if num_workers is not None and (
            isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0
        ):
            raise ValueError(
                f"`num_workers` must be an int >= 0 or None, got {num_workers!r} (0 runs in this process)."
            )
        data = storage.get(slice(0, rows))
        probe = fn(data[0].clone())
        if not isinstance(probe, TensorDictBase):
            raise TypeError(
                f"`fn` must return a TensorDict, got {type(probe).__name__} for the first sample. Return the "
                f"(modified) TensorDict it received."
            )
        # the first `data.batch_dims` dims of every output leaf index rows, like the input's
        out = probe.expand(*data.batch_size).memmap_like(prefix=str(dest))
        if num_workers == 0 and pool is None:
            _map_in_process(fn, data, out, dim=dim, chunksize=chunksize, num_chunks=num_chunks, pbar=pbar)
        else:
            data.map(
                fn, dim=dim, num_workers=num_workers, out=out, chunksize=chunksize, num_chunks=num_chunks,
                pool=pool, generator=generator, max_tasks_per_child=max_tasks_per_child,
                worker_threads=worker_threads, index_with_generator=index_with_generator, pbar=pbar,
                mp_start_method=mp_start_method,
            )  # fmt: skip
        return TensorStorage(out)


def _check_dest(dest) -> Path:
    if dest is None or not isinstance(dest, (str, os.PathLike)):
        raise TypeError(
            f"`dest` must be the path of a directory for the output's memory-mapped files (str or "
            f"os.PathLike), got {dest!r}."
        )
    path = Path(dest)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(
            f"`dest` {str(path)!r} exists and is not an empty directory: preprocess() writes a new storage "
            f"there and never overwrites files. Pass a new (or empty) directory."
        )
    return path


def _map_in_process(fn, data, out, *, dim, chunksize, num_chunks, pbar) -> None:
    """``TensorDictBase.map`` without a pool: ``fn`` on each chunk in turn, written into ``out``."""
    if chunksize is not None and num_chunks is not None:
        raise ValueError("`chunksize` and `num_chunks` are exclusive: pass one of them.")
    size = data.batch_size[dim]
    if chunksize == 0:
        step = 1
    elif chunksize is not None:
        step = chunksize
    else:
        step = -(-size // (num_chunks or 1))
    starts = range(0, size, max(1, step))
    if pbar:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            starts = tqdm(starts, desc="preprocess")
    for start in starts:
        index = (slice(None),) * dim + (slice(start, start + step),)
        chunk = data[index]
        if chunksize == 0:
            chunk = chunk.squeeze(dim)
        result = fn(chunk)
        if chunksize == 0:
            result = result.unsqueeze(dim)
        out[index].update_(result)
