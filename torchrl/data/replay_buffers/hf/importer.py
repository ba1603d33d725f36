"""Reading a Hugging Face dataset back as replay-buffer items (see :mod:`~torchrl.data.replay_buffers.hf.export`).

Which column becomes which key is planned by :class:`~torchrl.data.replay_buffers.hf.reader.HFReader` (an export
of this library, a LeRobot directory, any other dataset).

The buffer's side, :func:`extend_from_hf` and :func:`buffer_from_hf`, is what ``rb.extend_from_hf`` and
``ReplayBuffer.from_hf`` call: the rows go through the buffer's public ``extend``, chunk by chunk. With
``video="keep"``, the video features of a LeRobot directory are not decoded: the other columns are written, then
each episode's frame range of its video file becomes a segment of the :class:`~torchrl.data.EncodedFrameStorage`
(see :mod:`~torchrl.data.replay_buffers.hf.lerobot_video`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from tensordict import TensorDict

from torchrl.data.replay_buffers.hf.lerobot_video import VideoImportPlan, check_video_mode
from torchrl.data.replay_buffers.hf.reader import HFReader, chunk_rows_for
from torchrl.data.replay_buffers.storages import LazyTensorStorage, ListStorage, TensorStorage
from torchrl.data.replay_buffers.storages.encoded_frames import EncodedFrameStorage

__all__ = ["HFReader", "chunk_rows_for", "import_hf", "extend_from_hf", "buffer_from_hf", "check_chunks"]


def import_hf(source, *, columns=None, ignore_metadata: bool = False, chunk_bytes: int = 64 << 20) -> Iterator:
    """The rows of a Hugging Face dataset as chunks of replay-buffer items (TensorDict batches, or lists of items
    when rows differ in shape), ready for ``rb.extend(chunk)``; see :meth:`ReplayBuffer.from_hf
    <torchrl.data.ReplayBuffer.from_hf>` for the arguments.

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import NonTensorStack, TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from torchrl.data.replay_buffers.hf.export import import_hf
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
        >>> _ = rb.extend(TensorDict(obs=torch.randn(8, 3), batch_size=[8]))
        >>> path = tempfile.mkdtemp() + "/export"
        >>> _ = rb.export_hf(path)
        >>> [chunk.batch_size for chunk in import_hf(path, chunk_bytes=48)]
        [torch.Size([4]), torch.Size([4])]
    """
    reader = HFReader(source, columns=columns, ignore_metadata=ignore_metadata)
    return reader.chunks(chunk_rows_for(reader, chunk_bytes))


# -- the buffer's side: rb.extend_from_hf and ReplayBuffer.from_hf ------------------------------------------------
def extend_from_hf(rb, source, *, columns=None, ignore_metadata: bool = False, chunk_bytes: int = 64 << 20,
                   video: str = "decode") -> int:  # fmt: skip
    """Extends the buffer ``rb`` with the rows of a Hugging Face dataset, in chunks, through ``rb.extend``;
    returns how many rows were written. See :meth:`ReplayBuffer.extend_from_hf
    <torchrl.data.ReplayBuffer.extend_from_hf>` for the arguments."""
    video = check_video_mode(video)
    reader = HFReader(source, columns=columns, ignore_metadata=ignore_metadata)
    videos = _video_plan(reader, rb.storage, video)
    _check_ragged_fits(reader, rb.storage)
    rows = _write_chunks(rb, reader, chunk_bytes)
    if videos is not None:
        videos.attach(rb.storage, rows)
    return len(reader)


def buffer_from_hf(
    buffer_class: type,
    source,
    *,
    storage=None,
    columns=None,
    ignore_metadata: bool = False,
    chunk_bytes: int = 64 << 20,
    video: str = "decode",
    **kwargs,
):
    """A new ``buffer_class(storage=..., **kwargs)`` holding the rows of a Hugging Face dataset. See
    :meth:`ReplayBuffer.from_hf <torchrl.data.ReplayBuffer.from_hf>` for the arguments."""
    video = check_video_mode(video)
    reader = HFReader(source, columns=columns, ignore_metadata=ignore_metadata)
    if storage is None and video == "keep" and any(s["encoding"] == "video" for s in reader.specs):
        storage = _encoded_storage_for(reader)
    if storage is None:
        list_items = reader.ragged or reader.list_items
        storage = (ListStorage if list_items else LazyTensorStorage)(max(1, len(reader)))
    elif storage.max_size < len(reader):
        raise ValueError(
            f"`storage` holds {storage.max_size} items and the dataset has {len(reader)} rows: the first rows "
            f"would be overwritten. Pass a storage of at least {len(reader)} items, or use "
            f"rb.extend_from_hf(source) to keep only the newest rows."
        )
    videos = _video_plan(reader, storage, video)
    rb = buffer_class(storage=storage, **kwargs)
    _check_ragged_fits(reader, storage)
    rows = _write_chunks(rb, reader, chunk_bytes)
    if videos is not None:
        videos.attach(storage, rows)
    return rb


def _encoded_storage_for(reader: HFReader) -> EncodedFrameStorage:
    """The storage of ``video="keep"`` when none is given: an :class:`EncodedFrameStorage` of ``len(reader)`` rows
    whose pixel keys are the video features' keys, at the dataset's frame rate."""
    keys = [tuple(s["key"]) for s in reader.specs if s["encoding"] == "video"]
    fps = (reader.lerobot.info.get("fps") if reader.lerobot is not None else None) or 30
    return EncodedFrameStorage(max(1, len(reader)), pixel_keys=keys, fps=max(1, int(round(float(fps)))))


def _video_plan(reader: HFReader, storage, video: str):
    """``video="keep"``: the video features taken out of ``reader``'s plan and checked against ``storage`` and the
    dataset's files (before anything is written); ``None`` when there is nothing to keep."""
    if video != "keep" or reader.lerobot is None:
        return None
    if not any(s["encoding"] == "video" for s in reader.specs):
        return None
    if not isinstance(storage, EncodedFrameStorage):
        raise TypeError(
            f"video='keep' keeps LeRobot's video files as segments of an EncodedFrameStorage; the storage is a "
            f"{type(storage).__name__}. Pass storage=EncodedFrameStorage(n, pixel_keys=[...]) (or no storage), or "
            f"video='decode' to decode every frame into uint8 rows."
        )
    videos = reader.split_videos()
    pixel_keys = {(k,) if isinstance(k, str) else tuple(k) for k in storage.pixel_keys}
    missing = [key for key, _ in videos.values() if key not in pixel_keys]
    if missing:
        raise ValueError(
            f"The video features map to the keys {missing}, which are not `pixel_keys` of the EncodedFrameStorage "
            f"({sorted(pixel_keys)}): build it with pixel_keys={[k for k, _ in videos.values()]}."
        )
    if len(reader) > storage.max_size:
        raise ValueError(
            f"video='keep' needs a row of the storage for every frame of the dataset ({len(reader)} rows), the "
            f"storage holds {storage.max_size}: a wrapped ring would pair frames with the wrong rows. Pass a "
            f"storage of at least {len(reader)} items."
        )
    dataset = reader.dataset
    episode = dataset.data.column("episode_index").to_numpy()
    timestamp = dataset.data.column("timestamp").to_numpy()
    return VideoImportPlan(reader.lerobot, videos, episode, timestamp)


def _write_chunks(rb, reader: HFReader, chunk_bytes: int) -> None:
    """``rb.extend`` of each chunk, once every chunk decoded into items of one layout (validate, then write: a
    bad row anywhere refuses the import before the first row is written). The storage allocated by the first
    chunk is advised to use huge pages (a bulk fill: see :meth:`TensorStorage.advise_huge_pages
    <torchrl.data.TensorStorage.advise_huge_pages>`). Returns the storage index of each
    row written, in the dataset's order."""
    rows = chunk_rows_for(reader, chunk_bytes)
    check_chunks(reader, rows, tensor_storage=isinstance(rb.storage, TensorStorage))
    written = []
    for i, chunk in enumerate(reader.chunks(rows, copy=_needs_own_tensors(rb))):
        written.append(torch.as_tensor(rb.extend(chunk)).reshape(-1))
        if i == 0 and isinstance(rb.storage, TensorStorage):  # allocated by this first write
            rb.storage.advise_huge_pages()
    return torch.cat(written) if written else torch.empty(0, dtype=torch.long)


def check_chunks(reader: HFReader, chunk_rows: int, *, tensor_storage: bool) -> None:
    """Decodes every chunk of ``reader`` (views of the Arrow buffers, nothing kept) and raises a ``ValueError``
    naming the column and the rows when one cannot be written: a null, a non-numeric value, rows whose shapes
    differ (for a ``tensor_storage``: it holds items of one shape), or a chunk whose layout differs from the first
    one's. Run before anything is written, so that a refused import leaves the buffer as it was."""
    layout, start = None, 0
    chunks = reader.chunks(chunk_rows, copy=False)
    while True:
        try:
            chunk = next(chunks)
        except StopIteration:
            return
        except (ValueError, TypeError) as err:
            end = min(len(reader), start + chunk_rows)
            raise type(err)(f"{err} (in rows {start}..{end - 1} of the dataset; nothing was written)") from None
        n = len(chunk) if isinstance(chunk, list) else chunk.shape[0]
        if isinstance(chunk, list):
            if tensor_storage:
                column = _ragged_column(chunk, reader)
                raise ValueError(
                    f"Column {column!r} holds rows of different shapes in rows {start}..{start + n - 1} of the "
                    f"dataset, which a tensor storage cannot store (its items have one shape); nothing was "
                    f"written. Import into a ListStorage (storage=ListStorage(n)), pad the rows to one shape "
                    f"first, or leave the column out with `columns=[...]`."
                )
        else:
            this = _layout(chunk)
            if layout is None:
                layout = this
            elif this != layout:
                key = next(k for k in sorted(set(layout) | set(this), key=str) if layout.get(k) != this.get(k))
                raise ValueError(
                    f"Entry {key!r} holds {this.get(key)} (dtype, item shape) in rows {start}..{start + n - 1} "
                    f"of the dataset, but {layout.get(key)} before: the rows do not share one layout; nothing "
                    f"was written. Fix the dataset, or leave the column out with `columns=[...]`."
                )
        start += n


def _layout(chunk) -> dict:
    """``{key: (dtype, item shape)}`` of a decoded chunk (a TensorDict or a tensor batch)."""
    if isinstance(chunk, TensorDict):
        items = chunk.items(include_nested=True, leaves_only=True)
        return {k: (v.dtype, tuple(v.shape[chunk.batch_dims :])) for k, v in items}
    return {"": (chunk.dtype, tuple(chunk.shape[1:]))}


def _ragged_column(items: list, reader: HFReader) -> str:
    """The first column whose values differ in shape between the decoded ``items`` (a list of per-row items)."""
    for spec in reader.specs:
        key = tuple(spec["key"])
        shapes = {tuple((item if reader.item_kind == "tensor" else item[key]).shape) for item in items}
        if len(shapes) > 1:
            return spec["column"]
    return reader.specs[0]["column"]


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
