"""Replay-buffer data to and from Hugging Face datasets: :func:`export_hf` and :func:`import_hf`.

On disk, an export is the directory ``datasets.Dataset.save_to_disk`` writes (Arrow shards
``data-XXXXX-of-NNNNN.arrow``, ``dataset_info.json``, ``state.json``; ``datasets.load_from_disk`` reads it
with no torchrl installed) plus ``torchrl_export.json``: the schema version, the layout, and for each column the
nested key, dtype and item shape it holds, so that an import gives back the stored items bit for bit. The same
document is kept in the dataset's ``info.description``, so that a ``datasets.Dataset`` object carries it too.
The ``"lerobot"`` layout adds ``meta/info.json`` and ``meta/episodes.jsonl`` (the episode table).

Writes stream: rows are read from the storage in chunks of about ``chunk_bytes`` and appended to the shards,
so an export's memory does not grow with the buffer. The directory is written next to its destination and
switched into place atomically, as checkpoints are (:mod:`~torchrl.data.replay_buffers.checkpointers`): a crash
or an error leaves the previous export, or nothing, never a half-written one.

``datasets`` (extra ``hf``) is imported when a function runs, never when this module is imported.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import secrets
import warnings
from collections.abc import Mapping, Sequence

import torch
from tensordict import TensorDict, TensorDictBase, is_leaf_nontensor, is_tensorclass

import torchrl.data.replay_buffers._checkpoint.fs as _fs
import torchrl.data.replay_buffers.hf.columns as _cols
import torchrl.data.replay_buffers.hf.layouts as _layouts
import torchrl.data.replay_buffers.hf.lerobot as _lerobot
import torchrl.data.replay_buffers.hf.lerobot_video as _video
from torchrl._files import fsync_file, write_new_file
from torchrl.data.replay_buffers._shared.cleanup import make_scratch_dir
from torchrl.data.replay_buffers.hf.columns import (
    FORMAT,
    MARKER,
    METADATA_FILE,
    SCHEMA_VERSION,
    VALUE_COLUMN,
    require_datasets,
)
from torchrl.data.replay_buffers.hf.importer import import_hf
from torchrl.data.replay_buffers.storages.base import Storage
from torchrl.data.replay_buffers.storages.encoded_frames import EncodedFrameStorage

__all__ = ["export_hf", "import_hf", "METADATA_FILE"]



# -- reading the source -----------------------------------------------------------------------------------------
def _source_storage(data, layout: str) -> Storage:
    storage = getattr(data, "storage", data)
    if not isinstance(storage, Storage):
        raise TypeError(
            f"`data` must be a ReplayBuffer or a Storage, got {type(data).__name__}. Export a buffer with "
            f"`rb.export_hf(path)`."
        )
    if getattr(storage, "is_ensemble", False):
        raise TypeError("A StorageEnsemble has no single row order: export each member storage on its own.")
    if storage.ndim > 1:
        if layout != "flat":
            raise ValueError(
                f"layout={layout!r} follows trajectories along the rows of a 1-D storage; this storage has "
                f"ndim={storage.ndim}. Use layout='flat' (cells row by row), or write the data into a 1-D storage."
            )
        storage = storage.flatten()
    return storage


def _video_keys(storage, layout: str, fps) -> list[tuple]:
    """The pixel keys written as LeRobot videos: those of an :class:`EncodedFrameStorage` exported with
    ``layout="lerobot"`` (``fps`` must then be the storage's frame rate)."""
    if layout != "lerobot" or not isinstance(storage, EncodedFrameStorage):
        return []
    if int(fps) != storage.fps:
        raise ValueError(
            f"`fps`={fps!r} differs from the frame rate of the EncodedFrameStorage's videos ({storage.fps}): LeRobot "
            f"reads the frames of a video at the dataset's fps. Pass fps={storage.fps}."
        )
    return [(k,) if isinstance(k, str) else tuple(k) for k in storage.pixel_keys]


def _video_specs(storage, keys: list, order: torch.Tensor, columns: list[str]) -> list[dict]:
    """The column specs of the pixel entries written as videos (``encoding: "video"``, not in the data files):
    the item shape read from one decoded frame."""
    if not keys:
        return []
    frame = storage.get(order[:1])
    out = []
    for key in keys:
        column = _layouts.lerobot_column(key)
        if column in columns:
            raise ValueError(f"The pixel entry {key!r} and another entry map to the column {column!r}: rename one.")
        out.append({"column": column, "key": list(key), "dtype": "uint8", "shape": list(frame.get(key).shape[1:]),
                    "encoding": "video"})  # fmt: skip
    return out


def _as_batch(batch, n: int, column_kind: list):
    """A chunk read from the storage as a TensorDict ``[n, ...]`` or a list of TensorDict items."""
    if isinstance(batch, list):
        return [_as_item(item, column_kind) for item in batch]
    return _as_td(batch, [n], column_kind, "batch")


def _as_item(item, column_kind: list):
    return _as_td(item, [], column_kind, "item")


def _as_td(data, batch_size, column_kind: list, what: str):
    if isinstance(data, TensorDictBase):
        kind = "tensordict"
    elif is_tensorclass(data):
        data, kind = data.to_tensordict(), "tensordict"
    elif isinstance(data, torch.Tensor):
        data, kind = TensorDict({VALUE_COLUMN: data}, batch_size=batch_size), "tensor"
    elif isinstance(data, Mapping):
        data, kind = TensorDict(dict(data), batch_size=batch_size), "tensordict"
    else:
        raise TypeError(
            f"Cannot export a {what} of type {type(data).__name__}: items must be tensors, TensorDicts, "
            f"tensorclasses or mappings of tensors, whose keys name the columns (a tuple has no names: make the "
            f"dataset return a dict)."
        )
    if column_kind and column_kind[0] != kind:
        raise TypeError(f"The storage mixes {column_kind[0]} and {kind} items; export needs one kind.")
    column_kind[:1] = [kind]
    return data


def _leaves(td: TensorDictBase, exclude) -> dict:
    out = {}
    for key, value in td.items(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor):
        key = (key,) if isinstance(key, str) else tuple(key)
        if key in exclude:
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"Entry {key!r} holds {type(value).__name__} data, not a tensor: only tensors become columns. "
                f"Leave it out with `exclude_keys=[{key!r}]`."
            )
        out[key] = value
    return out


def _batch_sizes(td: TensorDictBase, drop: int) -> dict:
    sizes = {"": list(td.batch_size[drop:])}
    for key, value in td.items(include_nested=True):
        if isinstance(value, TensorDictBase):
            key = (key,) if isinstance(key, str) else tuple(key)
            sizes[".".join(key)] = list(value.batch_size[drop:])
    return sizes


# -- planning the columns ---------------------------------------------------------------------------------------
def _plan(first, items_all, layout: str, exclude, traj_key, end_key) -> tuple[list, dict, list, list]:
    """Column specs, sub-TensorDict batch sizes, dropped keys and the ``[traj_key, end_key]`` of the trajectory
    layouts, from the first chunk (from all items for a list storage)."""
    if isinstance(first, list):
        per_item = [_leaves(item, exclude) for item in items_all]
        keys = list(per_item[0])
        for leaves in per_item[1:]:
            if list(leaves) != keys:
                raise ValueError(
                    f"The stored items do not all have the same keys ({sorted(keys)} vs {sorted(leaves)}): a "
                    f"dataset has one set of columns. Leave the differing keys out with `exclude_keys=[...]`."
                )
        shapes = {k: {tuple(leaves[k].shape) for leaves in per_item} for k in keys}
        dtypes = {k: {leaves[k].dtype for leaves in per_item} for k in keys}
        sizes = {json.dumps(_batch_sizes(item, 0), sort_keys=True) for item in items_all}
        batch_sizes = _batch_sizes(items_all[0], 0) if len(sizes) == 1 else {"": []}
    else:
        leaves = _leaves(first, exclude)
        keys = list(leaves)
        shapes = {k: {tuple(v.shape[1:])} for k, v in leaves.items()}
        dtypes = {k: {v.dtype} for k, v in leaves.items()}
        batch_sizes = _batch_sizes(first, 1)
    if not keys:
        raise ValueError("The stored items have no tensor entry to export (all were excluded or non-tensor).")
    specs, dropped = [], []
    for key in keys:
        if len(dtypes[key]) > 1:
            raise TypeError(f"Entry {key!r} has items of several dtypes ({dtypes[key]}); a column has one dtype.")
        dtype = next(iter(dtypes[key]))
        column = _layouts.lerobot_column(key) if layout == "lerobot" else _layouts.column_name(key)
        if column is None:
            dropped.append(list(key))
            continue
        if len(shapes[key]) > 1:
            specs.append(_cols.plan_ragged(column, key, dtype))
        else:
            shape = next(iter(shapes[key]))
            row = _layouts.lerobot_row_shape(key, shape) if layout == "lerobot" else None
            specs.append(_cols.plan_fixed(column, key, dtype, shape, row))
    if layout == "lerobot":
        _check_lerobot_encodings(specs)
    specs += _derived_specs(layout)
    _check_unique([s["column"] for s in specs] + [s["column"] + _cols.SHAPE_SUFFIX for s in specs
                                                    if s["encoding"] == "ragged"])  # fmt: skip
    if layout != "flat":
        key_set = set(keys)
        traj = _layouts.find_key(key_set, traj_key, _layouts.TRAJ_KEYS, "traj_key")
        end = _layouts.find_key(key_set, end_key, _layouts.END_KEYS, "end_key")
        if traj is None and end is None:
            raise ValueError(
                f"layout={layout!r} needs trajectory metadata, and the stored items have none of the end flags "
                f"{_layouts.END_KEYS} or trajectory ids {_layouts.TRAJ_KEYS}. Pass `end_key=` or `traj_key=`, "
                f"or use layout='flat'."
            )
        return specs, batch_sizes, dropped, [list(traj) if traj else None, list(end) if end else None]
    return specs, batch_sizes, dropped, [None, None]


def _derived_specs(layout: str) -> list[dict]:
    if layout == "flat":
        return []
    if layout == "lerobot":  # LeRobot's columns, in its order
        return [_cols.plan_fixed(name, None, _cols.TORCH_DTYPES[dtype], []) for name, dtype in _lerobot.DERIVED_FEATURES]
    return [_cols.plan_fixed(name, None, torch.int64, []) for name in ("episode_index", "frame_index")]


def _check_lerobot_encodings(specs: list[dict]) -> None:
    for spec in specs:
        if spec["encoding"] not in ("value", "list", "array"):
            shape = "items of different shapes" if spec["shape"] is None else f"items of shape {spec['shape']}"
            raise ValueError(
                f"Entry {tuple(spec['key'])!r} holds {shape}, which a LeRobot feature cannot hold (a LeRobot "
                f"feature has one shape of 1 to 5 non-empty dims). Leave it out with "
                f"`exclude_keys=[{tuple(spec['key'])!r}]`, reshape it, or use layout='trajectories'."
            )


def _check_unique(columns: list[str]) -> None:
    seen = set()
    for column in columns:
        if column in seen:
            raise ValueError(
                f"Two entries map to the column {column!r}; rename one, or leave it out with `exclude_keys`."
            )
        seen.add(column)


# -- writing ----------------------------------------------------------------------------------------------------
def _chunk_arrays(chunk, specs, schema, exclude, counter, traj_end, start: int, fps: float,
                  task_index: torch.Tensor | None = None) -> list:
    """The Arrow arrays of one chunk (``chunk``: a TensorDict batch or a list of items), in ``specs`` order."""
    if isinstance(chunk, list):
        per_item = [_leaves(item, exclude) for item in chunk]
        leaves = {s["column"]: [p[tuple(s["key"])] for p in per_item] for s in specs if s["key"] is not None}
        n = len(chunk)
    else:
        by_key = _leaves(chunk, exclude)
        leaves = {s["column"]: by_key[tuple(s["key"])] for s in specs if s["key"] is not None}
        n = chunk.batch_size[0]
    derived = {}
    if counter is not None:
        traj, end = traj_end

        def column_of(key):
            if key is None:
                return None
            if isinstance(chunk, list):
                return torch.stack([item.get(tuple(key)).reshape(-1)[:1] for item in chunk])
            return chunk.get(tuple(key))

        episode, frame = counter.update(column_of(end), column_of(traj), n)
        derived = {"episode_index": episode, "frame_index": frame, "index": torch.arange(start, start + n),
                   "task_index": torch.zeros(n, dtype=torch.long) if task_index is None else task_index,
                   "timestamp": (frame.double() / fps).float()}  # fmt: skip
    arrays = []
    for spec in specs:
        column = spec["column"]
        if spec["encoding"] == "ragged":
            values, shapes = _cols.ragged_to_arrow(leaves[column])
            arrays += [values.cast(schema.field(column).type), shapes]
            continue
        rows = derived[column] if spec["key"] is None else leaves[column]
        if isinstance(rows, list):
            rows = torch.stack(rows)
        arrays.append(_cols.to_arrow(spec, rows.reshape(n, *spec["shape"]), schema.field(column).type))
    return arrays


def _write_shards(tmp, read, n: int, specs, features, exclude, layout, traj_end, *, chunk_rows: int,
                  shard_rows: int, fps: float, fsync: bool):
    """Writes the ``n`` rows (``read(start, stop)`` gives a chunk) as Arrow shards; returns their names and
    the episode counter (``None`` for the flat layout)."""
    import pyarrow as pa

    schema = features.arrow_schema
    num_shards = max(1, math.ceil(n / shard_rows))
    names = [f"data-{i:05d}-of-{num_shards:05d}.arrow" for i in range(num_shards)]
    counter = _layouts.EpisodeCounter() if layout != "flat" else None
    bounds = [(i * n // num_shards, (i + 1) * n // num_shards) for i in range(num_shards)]
    for name, (lo, hi) in zip(names, bounds):
        path = os.path.join(tmp, name)
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for start in range(lo, hi, chunk_rows):
                stop = min(start + chunk_rows, hi)
                arrays = _chunk_arrays(read(start, stop), specs, schema, exclude, counter, traj_end, start, fps)
                writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
        if fsync:
            fsync_file(path)
    return names, counter


def export_hf(
    data,
    path=None,
    *,
    layout: str = "flat",
    exclude_keys: Sequence = (),
    traj_key=None,
    end_key=None,
    fps: float = 1.0,
    chunk_bytes: int = 64 << 20,
    shard_bytes: int | None = None,
    fsync: bool = True,
    task: str | None = None,
    task_key=None,
    names: Mapping | None = None,
    robot_type: str | None = None,
    video_codec: str | None = None,
):
    """Writes the items of a buffer or storage as a Hugging Face dataset; see :meth:`ReplayBuffer.export_hf
    <torchrl.data.ReplayBuffer.export_hf>` for the arguments. Returns the ``datasets.Dataset`` read back from
    ``path`` (memory-mapped), or, when ``path`` is ``None``, one written to a temporary directory.

    ``layout="lerobot"`` writes the LeRobot v3.0 file set (:mod:`~torchrl.data.replay_buffers.hf.lerobot`), which
    ``lerobot.datasets.lerobot_dataset.LeRobotDataset(repo_id, root=path)`` opens, plus ``torchrl_export.json``
    (so that :meth:`ReplayBuffer.from_hf <torchrl.data.ReplayBuffer.from_hf>` gives back the stored keys); its
    parquet frames are returned read into memory. Its extra keyword arguments:

    - ``task`` (str): the task text of every frame; ``task_key``: the string entry holding each frame's task
      (default: ``"task"`` or ``"language_instruction"`` when stored; pass one of them at most). Without either,
      every frame has the task ``""`` (LeRobot needs one task).
    - ``names``: a mapping key (or column) -> list of str, the ``names`` of LeRobot's feature entries (default:
      image axes for 3-D ``uint8`` entries, else ``null``); ``robot_type``: ``info.json``'s ``robot_type``.
    - an :class:`~torchrl.data.EncodedFrameStorage`'s pixel entries become LeRobot video features
      (``videos/<column>/chunk-XXX/file-YYY.mp4``, see :mod:`~torchrl.data.replay_buffers.hf.lerobot_video`): its
      H.264/AV1 segments are copied as they are, others (FFV1) are re-encoded with ``video_codec`` (``"h264"``,
      the default, or ``"av1"``); ``fps`` must then be the storage's.
    - ``shard_bytes`` is the size of a data file (``data_files_size_in_mb``, default 100 MiB, whole episodes per
      file); ``fps`` must be a whole number (LeRobot stores it as an int).

    Examples:
        >>> import torch
        >>> from torchrl.data import ListStorage
        >>> from torchrl.data.replay_buffers.hf.export import export_hf
        >>> storage = ListStorage(4)
        >>> storage.set([0, 1], [torch.arange(3), torch.arange(5)])  # items of different shapes
        >>> ds = export_hf(storage)
        >>> ds.column_names, ds[1]["value"]
        (['value', 'value__shape'], [0, 1, 2, 3, 4])
    """
    datasets = require_datasets()
    layout = _layouts.check_layout(layout)
    exclude = {(k,) if isinstance(k, str) else tuple(k) for k in exclude_keys}
    if shard_bytes is None:
        shard_bytes = (100 << 20) if layout == "lerobot" else (500 << 20)
    for name, value in (("chunk_bytes", chunk_bytes), ("shard_bytes", shard_bytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"`{name}` must be a positive int (bytes), got {value!r}.")
    if not isinstance(fps, (int, float)) or isinstance(fps, bool) or not fps > 0:
        raise ValueError(f"`fps` must be a positive number (frames per second of the timestamps), got {fps!r}.")
    if layout == "lerobot":
        _lerobot.check_lerobot_args(fps, task, task_key, names, robot_type)
        video_codec = _video.check_video_codec("h264" if video_codec is None else video_codec)
    elif (task, task_key, names, robot_type, video_codec) != (None, None, None, None, None):
        raise ValueError(
            f"`task`, `task_key`, `names`, `robot_type` and `video_codec` describe a LeRobot dataset: pass them "
            f"with layout='lerobot', not layout={layout!r}."
        )
    source = getattr(data, "storage", data)
    storage = _source_storage(data, layout)
    video_keys = _video_keys(storage, layout, fps)
    get_rows = storage.get
    if video_keys:  # the pixel entries go to video files: the rows are read without decoding them
        storage.close_segments()
        get_rows = functools.partial(storage.get, decode=False)
    n = len(storage)
    if n == 0:
        raise ValueError("The storage holds no items: there is nothing to export. Write data first.")
    order = _layouts.export_order(storage, layout)
    kinds: list = []
    head = order[: min(n, 64)]
    probe = get_rows(head)
    if isinstance(probe, list):  # a list storage: plan over every item (ragged shapes; one pass, in memory)
        items_all = _as_batch(get_rows(order), n, kinds)
        first = items_all[: len(head)]
    else:
        first, items_all = _as_batch(probe, len(head), kinds), None
    found_task_key = None
    if layout == "lerobot":
        found_task_key = _lerobot.find_task_key(first, task, task_key)
        if found_task_key is not None:
            exclude.add(found_task_key)
    specs, batch_sizes, dropped, traj_end = _plan(first, items_all, layout, exclude, traj_key, end_key)
    video_specs = _video_specs(storage, video_keys, order, [s["column"] for s in specs])
    metadata = {
        "format": FORMAT, "schema_version": SCHEMA_VERSION, "layout": layout, "item": kinds[0], "num_rows": n,
        "batch_sizes": batch_sizes, "columns": specs + video_specs, "dropped_keys": dropped,
        "storage": {"class": type(source).__name__, "ndim": source.ndim},
        "traj_key": traj_end[0], "end_key": traj_end[1], "fps": float(fps),
    }  # fmt: skip
    if layout == "lerobot":
        metadata["task_key"] = None if found_task_key is None else list(found_task_key)
        columns = _lerobot.feature_columns(specs, names)
    features = _cols.features_of(specs)
    row_bytes = max(1, sum(_row_bytes(s, first) for s in specs))
    chunk_rows = max(1, min(n, chunk_bytes // row_bytes))
    shard_rows = max(1, shard_bytes // row_bytes)
    # The trajectory key itself loses nothing: its episodes are written as LeRobot's episode_index column.
    lost = [tuple(k) for k in dropped if traj_end[0] is None or list(k) != list(traj_end[0])]
    if lost:
        warnings.warn(
            f"layout='lerobot' drops the keys {lost} (next observations: the observation of "
            f"the following frame of the same episode; and entries named like the columns LeRobot derives, "
            f"{', '.join(_layouts.LEROBOT_DERIVED)}, which the export writes anew); they are listed in "
            f"{METADATA_FILE}. Use layout='trajectories' to keep every key.",
            UserWarning,
            stacklevel=3,
        )
    target = path
    if path is None:  # removed when this process exits, like a memmap storage's scratch directory
        target = os.path.join(make_scratch_dir(), "dataset")
    target = os.path.abspath(os.fspath(target))

    def write(tmp: str) -> None:
        if items_all is not None:
            def read(start, stop):
                return items_all[start:stop]
        else:
            def read(start, stop):
                if start == 0 and len(first) == stop:
                    return first
                return _as_batch(get_rows(_positions(order, start, stop)), stop - start, kinds)
        if layout == "lerobot":
            videos = None
            if video_specs:
                videos = _video.LeRobotVideoWriter(tmp, storage, {tuple(v["key"]): v["column"] for v in video_specs},
                                                   fps=int(fps), video_codec=video_codec, fsync=fsync)  # fmt: skip
                videos = functools.partial(videos, order=order)
            episodes = _write_lerobot(tmp, read, n, specs, features, exclude, traj_end, columns, task,
                                      found_task_key, chunk_rows=chunk_rows, file_bytes=shard_bytes, fps=int(fps),
                                      robot_type=robot_type, fsync=fsync, videos=videos)  # fmt: skip
            metadata["num_episodes"] = len(episodes)
            _write_json(os.path.join(tmp, METADATA_FILE), metadata, fsync)
        else:
            names, counter = _write_shards(tmp, read, n, specs, features, exclude, layout, traj_end,
                                           chunk_rows=chunk_rows, shard_rows=shard_rows, fps=fps, fsync=fsync)
            if counter is not None:
                metadata["num_episodes"] = len(counter.lengths)
            _finish_directory(tmp, names, metadata, features, fsync=fsync)
        write_new_file(os.path.join(tmp, _fs.MARKER), b"", fsync=fsync)

    _write_atomically(target, write, fsync=fsync)
    if layout == "lerobot":
        from torchrl.data.replay_buffers.hf.lerobot_reader import LeRobotDirectory

        ds = LeRobotDirectory(target).frames()
        ds.info.description = MARKER + json.dumps(metadata)
        return ds
    return datasets.load_from_disk(target)


def _write_lerobot(tmp, read, n, specs, features, exclude, traj_end, columns, task, task_key, *, chunk_rows: int,
                   file_bytes: int, fps: int, robot_type, fsync: bool, videos=None) -> list:
    """Writes the LeRobot v3.0 file set of the ``n`` rows into ``tmp``; returns the episode table's rows."""
    schema = _lerobot.storage_schema(features)
    writer = _lerobot.LeRobotFileWriter(tmp, schema, columns, fps=fps, file_bytes=file_bytes,
                                        robot_type=robot_type, fsync=fsync)  # fmt: skip
    counter = _layouts.EpisodeCounter()
    episode_at = [s["column"] for s in specs].index("episode_index")
    for start in range(0, n, chunk_rows):
        stop = min(start + chunk_rows, n)
        chunk = read(start, stop)
        tasks = _lerobot.task_strings(chunk, task, task_key, stop - start)
        task_index = torch.from_numpy(writer.task_indices(tasks))
        arrays = _chunk_arrays(chunk, specs, features.arrow_schema, exclude, counter, traj_end, start, fps,
                               task_index)  # fmt: skip
        arrays = [a.storage if isinstance(a.type, _lerobot.extension_type()) else a for a in arrays]
        numbers = [_cols.from_arrow(a, s["column"], None, None).numpy() for a, s in zip(arrays, specs)]
        episode = numbers[episode_at]
        writer.write(arrays, episode, tasks, numbers)
    writer.finish(videos)
    lines = [json.dumps({"episode_index": e["episode_index"], "length": e["to"] - e["from"],
                         "dataset_from_index": e["from"], "dataset_to_index": e["to"], "tasks": e["tasks"]})
             for e in writer.episodes]  # fmt: skip
    # the v2.1 episode list, for readers of that format (LeRobot 0.6 reads meta/episodes/ and ignores it)
    write_new_file(os.path.join(tmp, "meta", "episodes.jsonl"), ("\n".join(lines) + "\n").encode(), fsync=fsync)
    return writer.episodes


def _finish_directory(tmp: str, names: list[str], metadata: dict, features, *, fsync: bool) -> None:
    """Writes what ``datasets.load_from_disk`` reads next to the shards (``dataset_info.json``, ``state.json``,
    as ``save_to_disk`` writes them) and the export's metadata, then checks that the directory reads back."""
    datasets = require_datasets()
    info = datasets.DatasetInfo(description=MARKER + json.dumps(metadata), features=features)
    info_doc = dataclasses.asdict(info)
    state = {"_data_files": [{"filename": name} for name in names], "_fingerprint": secrets.token_hex(8),
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
             "_split": None}  # fmt: skip
    _write_json(os.path.join(tmp, "dataset_info.json"), {k: info_doc[k] for k in sorted(info_doc)}, fsync)
    _write_json(os.path.join(tmp, "state.json"), state, fsync)
    _write_json(os.path.join(tmp, METADATA_FILE), metadata, fsync)
    check = datasets.load_from_disk(tmp)
    if len(check) != metadata["num_rows"] or check.features != features:
        raise RuntimeError(
            f"The dataset written at {tmp} reads back as {len(check)} rows with features {check.features}, not "
            f"{metadata['num_rows']} rows with {features}: this datasets version ({datasets.__version__}) reads "
            f"its directory differently. Please report it."
        )


def _positions(order: torch.Tensor, start: int, stop: int):
    """The storage positions of export rows ``start:stop``: a slice when they are consecutive (a view of a
    tensor storage, no gather), else an index tensor."""
    first, last = int(order[start]), int(order[stop - 1])
    if last - first == stop - 1 - start:  # ``order`` is at most two increasing runs: consecutive positions
        return slice(first, last + 1)
    return order[start:stop]


def _row_bytes(spec: dict, first) -> int:
    itemsize = torch.empty((), dtype=_cols.TORCH_DTYPES[spec["dtype"]]).element_size()
    if spec["shape"] is not None:
        return itemsize * math.prod(spec["shape"])
    values = [item.get(tuple(spec["key"])).numel() for item in first]
    return itemsize * max(1, sum(values) // max(1, len(values)))


def _write_json(path: str, doc, fsync: bool) -> None:
    write_new_file(path, json.dumps(doc, indent=2).encode(), fsync=fsync)


def _write_atomically(path: str, write, *, fsync: bool) -> None:
    _fs.replace_dir(path, write, lambda: _check_replaceable(path), fsync=fsync)


def _check_replaceable(path: str) -> None:
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        raise FileExistsError(f"`path` {path} exists and is not a directory: pass a new path or an earlier export.")
    if os.listdir(path) and not os.path.isfile(os.path.join(path, METADATA_FILE)):
        raise FileExistsError(
            f"`path` {path} is a non-empty directory that is not an export of this library: it is not replaced. "
            f"Pass a new path, an empty directory, or an earlier export to replace."
        )
