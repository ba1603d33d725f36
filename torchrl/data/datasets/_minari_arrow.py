"""Minari's Arrow format (``data/<id>/part-0.arrow``), read with pyarrow.

One directory per episode, named by its id, holding an Arrow IPC file of T + 1 rows: ``observations`` and
``infos`` have one entry per row; ``actions``, ``rewards``, ``terminations`` and ``truncations`` are padded with
one trailing row, dropped here. Dict and Tuple spaces are struct columns (Tuple members named ``"<i>"``,
renamed ``"_index_<i>"`` as in the HDF5 format), Box spaces fixed-size lists reshaped to the space's shape,
image spaces JPEG bytes when ``jpeg_encoding``, infos structs whose array fields carry a ``shape`` metadata.
An episode is returned like :func:`torchrl.data.datasets._minari_hdf5.read_episodes` returns it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from torchrl.data.datasets._minari_spaces import decode_jpeg, is_image_space, parse_space, subspace, tuple_key

__all__ = ["read_episodes", "episode_dirs"]

_PADDED = ("actions", "rewards", "terminations", "truncations")


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.dataset as pads
    except ImportError as err:
        raise ImportError(
            "Reading a Minari dataset in the arrow format needs pyarrow: pip install pyarrow."
        ) from err
    return pa, pads


def episode_dirs(data_dir: Path) -> list[Path]:
    """The episode directories of ``data_dir``, in numeric id order."""
    found = [p for p in Path(data_dir).iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found, key=lambda p: int(p.name))


def _decode(space: dict | None, column, jpeg: bool, pa):
    kind = None if space is None else space.get("type")
    if pa.types.is_struct(column.type):
        out = {}
        for i in range(column.type.num_fields):
            name = column.type.field(i).name
            key = tuple_key(int(name)) if kind == "Tuple" else name
            out[key] = _decode(subspace(space, key), column.field(i), jpeg, pa)
        return out
    if jpeg and is_image_space(space):
        return decode_jpeg(column.to_pylist())
    if pa.types.is_fixed_size_list(column.type):
        flat = column.flatten().to_numpy(zero_copy_only=False)
        shape = tuple(space["shape"]) if space is not None and "shape" in space else (column.type.list_size,)
        return flat.reshape(len(column), *shape)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.to_pylist()
    if pa.types.is_binary(column.type):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in column.to_pylist()]
    return column.to_numpy(zero_copy_only=False)


def _decode_info(column, pa) -> dict:
    out = {}
    for i in range(column.type.num_fields):
        field = column.type.field(i)
        values = column.field(i)
        if pa.types.is_struct(field.type):
            out[field.name] = _decode_info(values, pa)
            continue
        if pa.types.is_fixed_size_list(field.type):
            flat = values.flatten().to_numpy(zero_copy_only=False)
            array = flat.reshape(len(values), -1)
            meta = field.metadata or {}
            if b"shape" in meta:
                dims = tuple(int(d) for d in meta[b"shape"].split(b",") if d)
                array = array.reshape(len(values), *dims)
            out[field.name] = array
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            out[field.name] = values.to_pylist()
        else:
            out[field.name] = values.to_numpy(zero_copy_only=False)
    return out


def read_episodes(data_dir: Path, metadata: dict) -> Iterator[dict]:
    """Yields each episode under ``data_dir`` as a dict (``"id"`` plus the decoded columns)."""
    pa, pads = _pyarrow()
    jpeg = bool(metadata.get("jpeg_encoding", False))
    space_of = {
        "observations": parse_space(metadata.get("observation_space")),
        "actions": parse_space(metadata.get("action_space")),
    }
    for directory in episode_dirs(data_dir):
        table = pads.dataset(
            directory, format="arrow", ignore_prefixes=["_", ".", "metadata.json"]
        ).to_table()
        table = table.combine_chunks()
        episode = {"id": int(directory.name)}
        for name in table.column_names:
            column = table.column(name).combine_chunks()
            if name in _PADDED:
                column = column.slice(0, len(column) - 1)
            if name == "infos" and pa.types.is_struct(column.type):
                episode[name] = _decode_info(column, pa)
            else:
                episode[name] = _decode(space_of.get(name), column, jpeg, pa)
        for name in ("rewards", "terminations", "truncations"):
            if name in episode:
                episode[name] = np.asarray(episode[name])
        yield episode
