"""The buffer's side of :mod:`~torchrl.data.replay_buffers.hf.export`: ``rb.export_hf``,
``rb.extend_from_hf`` and ``ReplayBuffer.from_hf``."""

from __future__ import annotations

from collections.abc import Sequence

from torchrl.data.replay_buffers.hf.export import export_hf
from torchrl.data.replay_buffers.hf.importer import HFReader, chunk_rows_for
from torchrl.data.replay_buffers.storages import LazyTensorStorage, ListStorage, TensorStorage


class HFExchangeMixin:
    """Export to and import from Hugging Face datasets (mixed into :class:`~torchrl.data.ReplayBuffer`)."""

    def export_hf(
        self,
        path=None,
        *,
        layout: str = "flat",
        exclude_keys: Sequence = (),
        traj_key=None,
        end_key=None,
        fps: float = 1.0,
        chunk_bytes: int = 64 << 20,
        shard_bytes: int = 500 << 20,
        fsync: bool = True,
    ):
        """Writes the stored items as a Hugging Face dataset (``save_to_disk`` format) and returns it.

        Each tensor entry becomes a column: nested keys are joined by ``"."`` (``("next", "reward")`` ->
        ``"next.reward"``), scalars are ``Value`` columns, 1-D items fixed-length ``List`` columns, 2- to 5-D
        items ``Array2D`` ... ``Array5D`` columns (other shapes are stored flat and reshaped on import), items of
        a :class:`~torchrl.data.ListStorage` that differ in shape a variable-length ``List`` plus a
        ``<column>__shape`` column. ``torchrl_export.json`` records the key, dtype and shape behind every column,
        so that :meth:`from_hf` gives back the stored items bit for bit. Rows are read and written in chunks
        (bounded memory); the directory is written aside and switched into place atomically, so an error or a
        crash leaves the previous export at ``path`` (or nothing), never a partial one. Transforms are not
        applied: the export holds what the storage holds.

        Args:
            path (str or path-like, optional): the directory to write: a new path (missing parents are
                created), an empty directory or an earlier export (replaced). ``None`` writes into a new
                temporary directory, removed when the process exits. Defaults to ``None``.

        Keyword Args:
            layout (str): ``"flat"`` (rows in storage order), ``"trajectories"`` (rows in the order they were
                written, plus ``episode_index`` and ``frame_index`` columns) or ``"lerobot"`` (the trajectories,
                with LeRobot's column names: see :ref:`exchanging-datasets`). Defaults to ``"flat"``.
            exclude_keys (sequence of keys): entries to leave out (e.g. non-tensor data). Defaults to ``()``.
            traj_key (key, optional): the trajectory-id entry of the trajectory layouts. Defaults to ``None``
                (``"episode"`` or ``("collector", "traj_ids")`` when stored).
            end_key (key, optional): the end-of-trajectory flag of the trajectory layouts. Defaults to ``None``
                (``("next", "done")`` or ``("next", "truncated")`` when stored).
            fps (float): frames per second, for the ``timestamp`` column of the ``"lerobot"`` layout
                (``frame_index / fps``). Defaults to ``1.0``.
            chunk_bytes (int): about how many bytes of rows to read and convert at once. Defaults to 64 MiB.
            shard_bytes (int): about how many bytes per Arrow file. Defaults to 500 MiB (as ``save_to_disk``).
            fsync (bool): flush files and directories to the disk before the switch. Defaults to ``True``.

        Returns:
            datasets.Dataset: the export, read back (memory-mapped) from ``path``.

        .. note:: Export while nothing writes to the buffer: the rows are read in several chunks, and a write
            between two chunks would mix old and new rows in the export.

        Raises:
            TypeError: an entry's dtype has no Arrow type (``bfloat16``, complex) or holds non-tensor data.
            ValueError: a bad argument, an empty storage, or a trajectory layout without trajectory metadata.
            FileExistsError: ``path`` is a file, or a non-empty directory that is not an export.

        Examples:
            >>> import tempfile, torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> _ = rb.extend(TensorDict(obs=torch.randn(10, 4), next=TensorDict(reward=torch.ones(10, 1),
            ...                          batch_size=[10]), batch_size=[10]))
            >>> ds = rb.export_hf(tempfile.mkdtemp() + "/export")
            >>> sorted(ds.column_names), ds.num_rows
            (['next.reward', 'obs'], 10)
        """
        return export_hf(
            self, path, layout=layout, exclude_keys=exclude_keys, traj_key=traj_key, end_key=end_key, fps=fps,
            chunk_bytes=chunk_bytes, shard_bytes=shard_bytes, fsync=fsync,
        )  # fmt: skip

    def extend_from_hf(
        self, source, *, columns=None, ignore_metadata: bool = False, chunk_bytes: int = 64 << 20
    ) -> int:
        """Extends the buffer with the rows of a Hugging Face dataset, in chunks; returns how many were written.

        See :meth:`from_hf` for the arguments. The rows go through :meth:`extend` (the writer, the inverse
        transforms, the sampler), so a ring buffer smaller than the dataset keeps its newest rows.

        Examples:
            >>> import tempfile, torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> _ = rb.extend(torch.arange(4))
            >>> path = tempfile.mkdtemp() + "/export"
            >>> _ = rb.export_hf(path)
            >>> rb.extend_from_hf(path), rb[:]
            (4, tensor([0, 1, 2, 3, 0, 1, 2, 3]))
        """
        reader = HFReader(source, columns=columns, ignore_metadata=ignore_metadata)
        _check_ragged_fits(reader, self.storage)
        _write_chunks(self, reader, chunk_bytes)
        return len(reader)

    @classmethod
    def from_hf(
        cls,
        source,
        *,
        storage=None,
        columns=None,
        ignore_metadata: bool = False,
        chunk_bytes: int = 64 << 20,
        **kwargs,
    ):
        """A new buffer holding the rows of a Hugging Face dataset (an export of :meth:`export_hf`, or any
        dataset of numeric columns).

        An export of this library comes back bit for bit: the same keys, dtypes and item shapes (the columns
        the export derived, ``episode_index`` and ``frame_index``, are skipped unless named in ``columns``).
        Any other dataset is read column by column: ``"a.b"`` becomes the key ``("a", "b")``; numbers and bools
        become tensors, fixed-length lists and ``ArrayND`` columns tensors of their shape; string or image
        columns raise (leave them out with ``columns``).

        Args:
            source (str, path-like or datasets.Dataset): a directory written by :meth:`export_hf` or
                ``save_to_disk``, or a ``datasets.Dataset`` (one split of a ``DatasetDict``).

        Keyword Args:
            storage (Storage, optional): where to put the rows; it must hold at least ``len(source)`` items.
                Defaults to ``None``: a :class:`~torchrl.data.LazyTensorStorage` of ``len(source)`` items, or a
                :class:`~torchrl.data.ListStorage` when items differ in shape or were exported from one.
            columns (list of str or mapping, optional): the columns to import, or a mapping column -> key to
                rename them (a str key is split on ``"."``, a tuple is taken as is). Defaults to ``None`` (every
                column).
            ignore_metadata (bool): read an export as a plain dataset (column types as Arrow has them).
                Defaults to ``False``.
            chunk_bytes (int): about how many bytes of rows to convert at once. Defaults to 64 MiB.
            **kwargs: the other arguments of the buffer class (``sampler``, ``batch_size``, ...).

        Raises:
            FileNotFoundError: ``source`` is not a directory, or an export lacks its metadata file.
            ValueError: unknown columns, a storage too small, or a dataset that does not match its metadata.
            TypeError: a column that does not make a tensor (strings, images, nulls).

        Examples:
            >>> import tempfile, torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> data = TensorDict(obs=torch.randn(10, 2, 3), done=torch.rand(10, 1) > 0.5, batch_size=[10])
            >>> _ = rb.extend(data)
            >>> path = tempfile.mkdtemp() + "/export"
            >>> _ = rb.export_hf(path)
            >>> copy = ReplayBuffer.from_hf(path, storage=LazyMemmapStorage(10), batch_size=4)
            >>> (copy[:] == data).all()
            True
        """
        reader = HFReader(source, columns=columns, ignore_metadata=ignore_metadata)
        if storage is None:
            list_items = reader.ragged or reader.list_items
            storage = (ListStorage if list_items else LazyTensorStorage)(max(1, len(reader)))
        elif storage.max_size < len(reader):
            raise ValueError(
                f"`storage` holds {storage.max_size} items and the dataset has {len(reader)} rows: the first rows "
                f"would be overwritten. Pass a storage of at least {len(reader)} items, or use "
                f"rb.extend_from_hf(source) to keep only the newest rows."
            )
        rb = cls(storage=storage, **kwargs)
        _check_ragged_fits(reader, storage)
        _write_chunks(rb, reader, chunk_bytes)
        return rb


def _write_chunks(rb, reader: HFReader, chunk_bytes: int) -> None:
    """``rb.extend`` of each chunk; the storage allocated by the first one is advised to use huge pages (a
    bulk fill: see :meth:`TensorStorage.advise_huge_pages <torchrl.data.TensorStorage.advise_huge_pages>`)."""
    for i, chunk in enumerate(reader.chunks(chunk_rows_for(reader, chunk_bytes), copy=_needs_own_tensors(rb))):
        rb.extend(chunk)
        if i == 0 and isinstance(rb.storage, TensorStorage):  # allocated by this first write
            rb.storage.advise_huge_pages()


def _needs_own_tensors(rb) -> bool:
    """Whether the chunks written to ``rb`` must own their memory. A tensor storage copies what it is given and
    a buffer without transforms writes nothing into it, so views of the dataset's (read-only, memory-mapped)
    Arrow buffers are enough, which spares a copy of every row; a list storage keeps the objects themselves,
    and an inverse transform may work in place."""
    return not isinstance(rb.storage, TensorStorage) or len(rb.transform) > 0


def _check_ragged_fits(reader: HFReader, storage) -> None:
    if reader.ragged and isinstance(storage, TensorStorage):
        ragged = [s["column"] for s in reader.specs if s["encoding"] == "ragged"]
        raise ValueError(
            f"The columns {ragged} hold items of different shapes, which a {type(storage).__name__} cannot store. "
            f"Import into a ListStorage (storage=ListStorage(n)), or leave them out with `columns=[...]`."
        )
