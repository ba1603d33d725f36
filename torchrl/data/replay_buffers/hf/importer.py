"""Reading a Hugging Face dataset back as replay-buffer items (see :mod:`~torchrl.data.replay_buffers.hf.export`).

A dataset exported by this library carries its metadata (``torchrl_export.json``, also kept in
``info.description``): its columns become the stored keys again, with their dtypes and item shapes, and the
columns derived at export (episode and frame indices) are skipped unless asked for. Any other dataset is read
column by column: the column ``"a.b"`` becomes the key ``("a", "b")``, numbers and bools become tensors,
fixed-length lists and ``ArrayND`` columns become tensors of their shape.

The buffer's side, :func:`extend_from_hf` and :func:`buffer_from_hf`, is what ``rb.extend_from_hf`` and
``ReplayBuffer.from_hf`` call: the rows go through the buffer's public ``extend``, chunk by chunk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping

import numpy as np
from tensordict import TensorDict

import torchrl.data.replay_buffers._checkpoint.fs as _fs
import torchrl.data.replay_buffers.hf.columns as _cols
from torchrl.data.replay_buffers.hf.columns import (
    FORMAT,
    MARKER,
    METADATA_FILE,
    SCHEMA_VERSION,
    VALUE_COLUMN,
)
from torchrl.data.replay_buffers.storages import LazyTensorStorage, ListStorage, TensorStorage


def _load(source):
    datasets = _cols.require_datasets()
    path = None
    if isinstance(source, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(source))
        # missing only after a crash between the two renames of a switch: the previous export sits aside
        path = _fs.resolve_for_read(path) or path
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"`source` {path} is not a directory: pass the directory an export or `save_to_disk` wrote, or a "
                f"datasets.Dataset."
            )
        source = datasets.load_from_disk(path)
    if isinstance(source, datasets.DatasetDict):
        raise TypeError(
            f"`source` is a DatasetDict with splits {list(source)}: pass one split, e.g. source['train']."
        )
    if not isinstance(source, datasets.Dataset):
        raise TypeError(
            f"`source` must be a path or a datasets.Dataset, got {type(source).__name__} (an IterableDataset has "
            f"no length to size a storage: materialize it with datasets.Dataset.from_generator)."
        )
    return source, path


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
    missing = [s["column"] for s in meta["columns"] if s["column"] not in dataset.column_names]
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
        self.dataset, path = _load(source)
        meta = None if ignore_metadata else _metadata(self.dataset, path)
        available = self.dataset.column_names
        if meta is not None:
            _check_metadata(meta, self.dataset, whole=path is not None)
            specs = {s["column"]: dict(s) for s in meta["columns"]}
            self.item_kind = meta.get("item", "tensordict")
            self.batch_sizes = meta.get("batch_sizes", {"": []})
            self.list_items = (meta.get("storage") or {}).get("class") == "ListStorage"
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

    def __len__(self) -> int:
        return len(self.dataset)

    def chunks(self, chunk_rows: int, *, copy: bool = True) -> Iterator:
        """The rows in chunks of ``chunk_rows``: a TensorDict (or tensor) batch, or a list of items when rows
        differ in shape. ``copy=False``: the tensors may be read-only views of the dataset's Arrow buffers, for a
        caller that copies them before anything writes to them (an extend into a tensor storage)."""
        names = [s["column"] for s in self.specs]
        names += [s["column"] + _cols.SHAPE_SUFFIX for s in self.specs if s["encoding"] == "ragged"]
        table_view = self.dataset.select_columns(names).with_format("arrow")
        for start in range(0, len(self.dataset), chunk_rows):
            for table in _whole_chunks(table_view[start : start + chunk_rows]):
                yield self._decode(table, table.num_rows, copy)

    def _decode(self, table, n: int, copy: bool = True):
        values = {}
        for spec in self.specs:
            column = spec["column"]
            dtype = None if spec["dtype"] is None else _cols.TORCH_DTYPES[spec["dtype"]]
            if spec["encoding"] == "ragged":
                values[column] = _cols.ragged_from_arrow(
                    table[column], table[column + _cols.SHAPE_SUFFIX], column, dtype
                )
            else:
                values[column] = _cols.from_arrow(table[column], column, dtype, spec["shape"], copy=copy)
        if any(isinstance(v, list) for v in values.values()):
            return [self._item({c: (v[i] if isinstance(v, list) else v[i]) for c, v in values.items()})
                    for i in range(n)]  # fmt: skip
        if self.item_kind == "tensor":
            return next(iter(values.values()))
        return self._build(values, [n])

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


def import_hf(source, *, columns=None, ignore_metadata: bool = False, chunk_bytes: int = 64 << 20) -> Iterator:
    """The rows of a Hugging Face dataset as chunks of replay-buffer items (TensorDict batches, or lists of items
    when rows differ in shape), ready for ``rb.extend(chunk)``; see :meth:`ReplayBuffer.from_hf
    <torchrl.data.ReplayBuffer.from_hf>` for the arguments.

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import TensorDict
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
def extend_from_hf(rb, source, *, columns=None, ignore_metadata: bool = False, chunk_bytes: int = 64 << 20) -> int:
    """Extends the buffer ``rb`` with the rows of a Hugging Face dataset, in chunks, through ``rb.extend``;
    returns how many rows were written. See :meth:`ReplayBuffer.extend_from_hf
    <torchrl.data.ReplayBuffer.extend_from_hf>` for the arguments."""
    reader = HFReader(source, columns=columns, ignore_metadata=ignore_metadata)
    _check_ragged_fits(reader, rb.storage)
    _write_chunks(rb, reader, chunk_bytes)
    return len(reader)


def buffer_from_hf(
    buffer_class: type,
    source,
    *,
    storage=None,
    columns=None,
    ignore_metadata: bool = False,
    chunk_bytes: int = 64 << 20,
    **kwargs,
):
    """A new ``buffer_class(storage=..., **kwargs)`` holding the rows of a Hugging Face dataset. See
    :meth:`ReplayBuffer.from_hf <torchrl.data.ReplayBuffer.from_hf>` for the arguments."""
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
    rb = buffer_class(storage=storage, **kwargs)
    _check_ragged_fits(reader, storage)
    _write_chunks(rb, reader, chunk_bytes)
    return rb


def _write_chunks(rb, reader: HFReader, chunk_bytes: int) -> None:
    """``rb.extend`` of each chunk, once every chunk decoded into items of one layout (validate, then write: a
    bad row anywhere refuses the import before the first row is written). The storage allocated by the first
    chunk is advised to use huge pages (a bulk fill: see :meth:`TensorStorage.advise_huge_pages
    <torchrl.data.TensorStorage.advise_huge_pages>`)."""
    rows = chunk_rows_for(reader, chunk_bytes)
    check_chunks(reader, rows, tensor_storage=isinstance(rb.storage, TensorStorage))
    for i, chunk in enumerate(reader.chunks(rows, copy=_needs_own_tensors(rb))):
        rb.extend(chunk)
        if i == 0 and isinstance(rb.storage, TensorStorage):  # allocated by this first write
            rb.storage.advise_huge_pages()


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
