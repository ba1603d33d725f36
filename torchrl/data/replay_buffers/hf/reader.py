"""The plan of an import from a Hugging Face dataset or a LeRobot directory: :class:`HFReader`.

A dataset exported by this library carries its metadata (``torchrl_export.json``, also kept in
``info.description``): its columns become the stored keys again, with their dtypes and item shapes, and the
columns derived at export (episode and frame indices) are skipped unless asked for. A LeRobot directory not
exported by this library is read with TorchRL's ``LeRobotExperienceReplay`` keys (:func:`lerobot_specs`). Any other
dataset is read column by column: the column ``"a.b"`` becomes the key ``("a", "b")``, numbers and bools become
tensors, fixed-length lists and ``ArrayND`` columns become tensors of their shape.

This module knows no storage or buffer (:mod:`~torchrl.data.replay_buffers.hf.importer` writes the chunks into a
buffer; :class:`~torchrl.data.DatasetStorage` reads rows of a LeRobot directory through it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping

import numpy as np
from tensordict import NonTensorStack, TensorDict

import torchrl.data.replay_buffers._checkpoint.fs as _fs
import torchrl.data.replay_buffers.hf.columns as _cols
from torchrl.data.replay_buffers.hf.columns import (
    FORMAT,
    MARKER,
    METADATA_FILE,
    SCHEMA_VERSION,
    VALUE_COLUMN,
)
from torchrl.data.replay_buffers.hf.lerobot_reader import (
    TASK_COLUMN,
    LeRobotDirectory,
    is_lerobot_dir,
    lerobot_key,
    require_video_decoder,
)

__all__ = ["HFReader", "chunk_rows_for", "lerobot_specs"]


def _load(source):
    """``(dataset, path, lerobot)``: the ``datasets.Dataset`` of ``source``, its directory (``None`` for a Dataset
    object) and, for a LeRobot directory, its :class:`~.lerobot_reader.LeRobotDirectory`."""
    datasets = _cols.require_datasets()
    path = None
    if isinstance(source, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(source))
        # missing only after a crash between the two renames of a switch: the previous export sits aside
        path = _fs.resolve_for_read(path) or path
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"`source` {path} is not a directory: pass the directory an export or `save_to_disk` wrote, a "
                f"LeRobot dataset directory, or a datasets.Dataset."
            )
        if is_lerobot_dir(path):
            directory = LeRobotDirectory(path)
            return directory.frames(), path, directory
        try:
            source = datasets.load_from_disk(path)
        except FileNotFoundError as err:
            raise FileNotFoundError(
                f"`source` {path} is not a dataset directory this reader knows: not a `save_to_disk` (or "
                f"`export_hf`) directory (dataset_info.json, state.json), nor a LeRobot dataset (meta/info.json "
                f"with a codebase_version). For parquet or CSV files, load them first, e.g. "
                f"`datasets.load_dataset('parquet', data_files=...)['train']`, and pass that Dataset. ({err})"
            ) from None
    if isinstance(source, datasets.DatasetDict):
        raise TypeError(
            f"`source` is a DatasetDict with splits {list(source)}: pass one split, e.g. source['train']."
        )
    if not isinstance(source, datasets.Dataset):
        raise TypeError(
            f"`source` must be a path or a datasets.Dataset, got {type(source).__name__} (an IterableDataset has "
            f"no length to size a storage: materialize it with datasets.Dataset.from_generator)."
        )
    return source, path, None


def _metadata(dataset, path):
    description = dataset.info.description or ""
    embedded = json.loads(description[len(MARKER):]) if description.startswith(MARKER) else None
    if path is not None:
        file = os.path.join(path, METADATA_FILE)
        if os.path.isfile(file):
            with open(file, encoding="utf-8") as f:
                try:
                    meta = json.load(f)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{file} is not valid JSON ({err}): re-export the buffer.") from None
            if embedded is not None and embedded.get("columns") != meta.get("columns"):
                raise ValueError(
                    f"{file} does not describe the columns of the dataset next to it (its copy in the dataset's "
                    f"info differs): the directory was edited or mixed. Re-export the buffer, or pass "
                    f"ignore_metadata=True to read it as a plain dataset."
                )
            return meta
        if embedded is not None:
            raise FileNotFoundError(
                f"{path} was exported by torchrl but its metadata file {METADATA_FILE} is missing (a partial copy?). "
                f"Copy the whole directory, re-export the buffer, or pass ignore_metadata=True to read the columns "
                f"as a plain dataset (dtypes and shapes as Arrow has them)."
            )
    return embedded


def _check_metadata(meta, dataset, whole: bool) -> None:
    """Raises a ValueError when ``meta`` does not describe ``dataset`` (``whole``: the dataset read from the
    export's directory, whose row count must match; a Dataset object may be a selection of the rows)."""
    if meta.get("format") != FORMAT or not isinstance(meta.get("columns"), list):
        raise ValueError(f"The export metadata is not a {FORMAT} document: re-export the buffer.")
    version = meta.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(
            f"The export has schema version {version!r}; this torchrl reads versions up to {SCHEMA_VERSION}. "
            f"Upgrade torchrl to read it."
        )
    if whole and meta.get("num_rows") != len(dataset):
        raise ValueError(
            f"The export metadata says {meta.get('num_rows')} rows, the dataset has {len(dataset)}: they do not "
            f"belong together. Re-export the buffer, or pass ignore_metadata=True."
        )
    missing = [s["column"] for s in meta["columns"]
               if s["column"] not in dataset.column_names and s.get("encoding") != "video"]  # fmt: skip
    if missing:
        raise ValueError(
            f"The export metadata lists the columns {missing}, which the dataset lacks (it has "
            f"{dataset.column_names}). Re-export the buffer, or pass ignore_metadata=True."
        )


def _as_key(value, column: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(value.split("."))
    if isinstance(value, tuple) and value and all(isinstance(p, str) for p in value):
        return value
    raise TypeError(f"`columns[{column!r}]` must be a key (a str or a tuple of str), got {value!r}.")


class HFReader:
    """The plan of an import: which column becomes which key, and the chunks of rows as TensorDicts."""

    def __init__(self, source, *, columns=None, ignore_metadata: bool = False):
        self.dataset, path, self.lerobot = _load(source)
        meta = None if ignore_metadata else _metadata(self.dataset, path)
        available = self.dataset.column_names
        if meta is not None:
            _check_metadata(meta, self.dataset, whole=path is not None)
            specs = {s["column"]: dict(s) for s in meta["columns"]}
            self.item_kind = meta.get("item", "tensordict")
            self.batch_sizes = meta.get("batch_sizes", {"": []})
            self.list_items = (meta.get("storage") or {}).get("class") == "ListStorage"
            if meta.get("task_key") is not None and self.lerobot is not None:
                specs[TASK_COLUMN] = _task_spec(meta["task_key"])
        elif self.lerobot is not None:
            specs = lerobot_specs(self.lerobot, available)
            self.item_kind, self.batch_sizes, self.list_items = "tensordict", {"": []}, False
        else:
            specs = {c: {"column": c, "key": list(c.split(".")), "dtype": None, "shape": None, "encoding": None}
                     for c in available if not c.endswith(_cols.SHAPE_SUFFIX)}  # fmt: skip
            self.item_kind, self.batch_sizes, self.list_items = "tensordict", {"": []}, False
        if columns is None:
            chosen = {c: tuple(s["key"]) for c, s in specs.items() if s["key"] is not None}
        elif isinstance(columns, Mapping):
            chosen = {c: _as_key(k, c) for c, k in columns.items()}
        elif isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
            chosen = {c: tuple(specs[c]["key"] or c.split(".")) if c in specs else None for c in columns}
        else:
            raise TypeError(
                f"`columns` must be None, a list of column names or a mapping column -> key, got {columns!r}."
            )
        unknown = [c for c in chosen if c not in specs]
        if unknown:
            raise ValueError(f"Unknown columns {unknown}: the dataset has the columns {available}.")
        if not chosen:
            raise ValueError("No column to import: pass `columns` with at least one of " f"{available}.")
        if self.item_kind == "tensor" and list(chosen.values()) != [(VALUE_COLUMN,)]:
            self.item_kind = "tensordict"
        self.specs = []
        for column, key in chosen.items():
            spec = dict(specs[column])
            if spec["key"] is None:  # a derived column asked for by name
                spec["dtype"], spec["shape"], spec["encoding"] = None, None, None
            spec["key"] = list(key)
            self.specs.append(spec)
        _check_keys([tuple(s["key"]) for s in self.specs])
        self.ragged = any(s["encoding"] == "ragged" for s in self.specs)
        videos = [s["column"] for s in self.specs if s["encoding"] == "video"]
        if videos:
            require_video_decoder(videos)

    def __len__(self) -> int:
        return len(self.dataset)

    def chunks(self, chunk_rows: int, *, copy: bool = True) -> Iterator:
        """The rows in chunks of ``chunk_rows``: a TensorDict (or tensor) batch, or a list of items when rows
        differ in shape. ``copy=False``: the tensors may be read-only views of the dataset's Arrow buffers, for a
        caller that copies them before anything writes to them (an extend into a tensor storage)."""
        table_view = self._table_view()
        for start in range(0, len(self.dataset), chunk_rows):
            for table in _whole_chunks(table_view[start : start + chunk_rows]):
                yield self._decode(table, table.num_rows, copy)

    def _table_view(self):
        names = []
        for spec in self.specs:
            for name in _source_columns(spec):
                if name not in names:
                    names.append(name)
        return self.dataset.select_columns(names).with_format("arrow")

    def rows(self, indices):
        """The rows at ``indices`` (a list of ints) as one decoded batch (a TensorDict, or a list of items when
        rows differ in shape), in the order given."""
        table = self._table_view()[list(indices)]
        return self._decode(table, table.num_rows, True)

    def _decode(self, table, n: int, copy: bool = True):
        values = {}
        for spec in self.specs:
            column = spec["column"]
            dtype = None if spec["dtype"] is None else _cols.TORCH_DTYPES[spec["dtype"]]
            if spec["encoding"] == "ragged":
                values[column] = _cols.ragged_from_arrow(
                    table[column], table[column + _cols.SHAPE_SUFFIX], column, dtype
                )
            elif spec["encoding"] in _LEROBOT_ENCODINGS:
                values[column] = self._decode_lerobot(spec, table)
            else:
                values[column] = _cols.from_arrow(table[column], column, dtype, spec["shape"], copy=copy)
        if any(isinstance(v, list) for v in values.values()):
            return [self._item({c: (v[i] if isinstance(v, list) else v[i]) for c, v in values.items()})
                    for i in range(n)]  # fmt: skip
        if self.item_kind == "tensor":
            return next(iter(values.values()))
        return self._build(values, [n])

    def _decode_lerobot(self, spec: dict, table):
        """A LeRobot column that is not a plain tensor: task text, PNG images or video frames."""
        encoding, column = spec["encoding"], spec["column"]
        if encoding == "task":
            index = table["task_index"].to_numpy()
            return NonTensorStack.from_list(self.lerobot.task_texts(index))
        if encoding == "text":
            return NonTensorStack.from_list(table[column].to_pylist())
        if encoding == "image":
            return _decode_images(table[column], column)
        episode = table["episode_index"].to_numpy()
        timestamp = table["timestamp"].to_numpy()
        frames = self.lerobot.decode_video(column, episode, timestamp)  # [n, C, H, W]
        shape = spec.get("shape")
        if shape and len(shape) == 3 and list(frames.shape[1:]) != list(shape):  # exported from [H, W, C] items
            frames = frames.permute(0, 2, 3, 1)
        return frames

    def split_videos(self) -> dict:
        """Takes the video features out of the import plan (they are kept as files, not decoded): returns
        ``{column: (key, layout)}``, ``layout`` being ``"HWC"`` for items exported as ``[H, W, C]``, else
        ``"CHW"`` (what a decoding import gives)."""
        videos = {}
        for spec in self.specs:
            if spec["encoding"] == "video":
                shape = spec.get("shape")
                hwc = bool(shape) and len(shape) == 3 and shape[-1] in (1, 3) and shape[0] not in (1, 3)
                videos[spec["column"]] = (tuple(spec["key"]), "HWC" if hwc else "CHW")
        if videos and len(videos) == len(self.specs):
            raise ValueError(
                f"Only video features were asked for ({list(videos)}): video='keep' stores their frames in an "
                f"EncodedFrameStorage beside the other entries; import at least one other column (e.g. "
                f"'episode_index')."
            )
        self.specs = [s for s in self.specs if s["encoding"] != "video"]
        return videos

    def _item(self, values: dict):
        if self.item_kind == "tensor":
            return next(iter(values.values()))
        return self._build(values, [])

    def _build(self, values: dict, lead: list[int]):
        td = TensorDict({}, batch_size=lead + self.batch_sizes.get("", []))
        for name, size in sorted(self.batch_sizes.items(), key=lambda kv: kv[0].count(".")):
            if name:
                td.set(tuple(name.split(".")), TensorDict({}, batch_size=lead + size))
        for spec in self.specs:
            td.set(tuple(spec["key"]), values[spec["column"]])
        return td


_LEROBOT_ENCODINGS = ("task", "text", "image", "video")


def _task_spec(key) -> dict:
    return {"column": TASK_COLUMN, "key": list(key), "dtype": None, "shape": None, "encoding": "task"}


def _source_columns(spec: dict) -> list[str]:
    """The dataset columns a spec is decoded from."""
    encoding = spec["encoding"]
    if encoding == "task":
        return ["task_index"]
    if encoding == "video":
        return ["episode_index", "timestamp"]
    if encoding == "ragged":
        return [spec["column"], spec["column"] + _cols.SHAPE_SUFFIX]
    return [spec["column"]]


def lerobot_specs(directory: LeRobotDirectory, available: list[str]) -> dict:
    """The import plan of a LeRobot directory not exported by this library: TorchRL's keys (see
    :mod:`~.lerobot_reader`), rewards and flags under ``"next"`` as ``[N, 1]``, the task text from the task
    table, images and videos decoded."""
    specs = {}
    for column in available:
        key = lerobot_key(column)
        feature = directory.features.get(column) or {}
        shape = None
        if key[0] == "next" and list(feature.get("shape") or [1]) == [1]:
            shape = [1]
        encoding = {"image": "image", "string": "text"}.get(feature.get("dtype"))
        specs[column] = {"column": column, "key": list(key), "dtype": None, "shape": shape, "encoding": encoding}
    for column in directory.video_columns:
        if column not in specs:
            specs[column] = {"column": column, "key": list(lerobot_key(column)), "dtype": None, "shape": None,
                             "encoding": "video"}  # fmt: skip
    if TASK_COLUMN not in specs and "task_index" in available and directory.tasks:
        specs[TASK_COLUMN] = _task_spec(lerobot_key(TASK_COLUMN))
    return specs


def _decode_images(column_values, column: str):
    """PNG/JPEG image cells (``{"bytes", "path"}`` structs, as ``datasets.Image`` stores them) as a uint8 tensor
    ``[n, C, H, W]``."""
    import io

    import torch

    try:
        from PIL import Image
    except ImportError as err:  # pragma: no cover - PIL comes with the gym extra
        raise ImportError(
            f"The LeRobot image column {column!r} holds encoded images: decoding them needs Pillow (pip install "
            f"pillow). Leave the column out with `columns=[...]` to read the others."
        ) from err
    frames = []
    for cell in column_values.to_pylist():
        data = cell.get("bytes") if isinstance(cell, dict) else None
        if data is None:
            raise ValueError(f"An image of column {column!r} has no embedded bytes (only a path): re-save it.")
        array = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        frames.append(torch.from_numpy(array.copy()).permute(2, 0, 1))
    return torch.stack(frames)


def _whole_chunks(table) -> Iterator:
    """``table`` cut where any of its columns changes Arrow chunk (a dataset saved in several shards has one
    chunk per shard), so that each piece's columns are single arrays, converted without being concatenated
    first (a copy of every value)."""
    cuts = set()
    for column in table.columns:
        ends = np.cumsum([len(chunk) for chunk in column.chunks])
        cuts.update(int(end) for end in ends[:-1])
    start = 0
    for end in sorted(cuts) + [table.num_rows]:
        if end > start:
            yield table.slice(start, end - start)
            start = end


def _check_keys(keys: list[tuple[str, ...]]) -> None:
    as_set = set(keys)
    if len(as_set) != len(keys):
        raise ValueError(f"Two columns map to the same key: {sorted(k for k in as_set if keys.count(k) > 1)}.")
    for key in keys:
        for i in range(1, len(key)):
            if key[:i] in as_set:
                raise ValueError(
                    f"The key {key[:i]!r} is both a tensor and the parent of {key!r}: map one of the columns to "
                    f"another key with `columns={{'column': 'new.key'}}`."
                )


def chunk_rows_for(reader: HFReader, chunk_bytes: int) -> int:
    """Rows per chunk for about ``chunk_bytes`` of tensor data (at least one row)."""
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes <= 0:
        raise ValueError(f"`chunk_bytes` must be a positive int (bytes), got {chunk_bytes!r}.")
    size = reader.dataset.data.nbytes
    per_row = max(1, size // max(1, len(reader)))
    return max(1, min(len(reader), chunk_bytes // per_row))

