"""Minari's Arrow format (``data/<id>/part-0.arrow``), read with pyarrow.

One directory per episode, named by its id, holding an Arrow IPC file of T + 1 rows: ``observations`` and
``infos`` have one entry per row; ``actions``, ``rewards``, ``terminations`` and ``truncations`` are padded with
one trailing row, dropped here. Dict and Tuple spaces are struct columns (Tuple members named ``"<i>"``,
renamed ``"_index_<i>"`` as in the HDF5 format), Box spaces fixed-size lists reshaped to the space's shape,
image spaces JPEG bytes when ``jpeg_encoding``, infos structs whose array fields carry a ``shape`` metadata.
An episode is returned like :func:`torchrl.data.datasets._minari_hdf5.read_episodes` returns it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from torchrl.data.datasets._minari_spaces import decode_jpeg, is_image_space, parse_space, subspace, tuple_key

__all__ = ["read_episodes", "episode_dirs", "episode_ids"]

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
    """The episode directories of ``data_dir``, in numeric id order.

    An episode directory that is a symbolic link leading out of ``data_dir`` is refused (``ValueError``): a
    dataset is read only with what its directory holds."""
    root = os.path.realpath(data_dir)
    found = [p for p in Path(data_dir).iterdir() if p.is_dir() and p.name.isdigit()]
    for p in found:
        target = os.path.realpath(p)
        if not target.startswith(root + os.sep):
            raise ValueError(
                f"The Minari episode directory {str(p)!r} is a link to {target!r}, outside the dataset directory "
                f"{root!r}. A dataset is read only with what its directory holds: copy the episode into it. Nothing "
                f"was read."
            )
    return sorted(found, key=lambda p: int(p.name))


def episode_ids(data_dir: Path) -> list[int]:
    """The ids of the episodes under ``data_dir``, in numeric order."""
    return [int(p.name) for p in episode_dirs(data_dir)]


def _reshape(flat: np.ndarray, rows: int, shape: tuple, field: str, where: str) -> np.ndarray:
    """``flat`` as ``[rows, *shape]``; a ``ValueError`` naming the field when its values do not fill that shape."""
    if not all(isinstance(d, int) and d >= 0 for d in shape) or flat.size != rows * int(np.prod(shape)):
        raise ValueError(
            f"The field {field!r} of {where} holds {flat.size} values for {rows} rows, which do not fill rows of "
            f"shape {list(shape)} (the shape its space or metadata gives). The dataset is damaged: write it again "
            f"with Minari (or download it again)."
        )
    return flat.reshape(rows, *shape)


def _decode(space: dict | None, column, jpeg: bool, pa, field: str, where: str):
    kind = None if space is None else space.get("type")
    if pa.types.is_struct(column.type):
        out = {}
        for i in range(column.type.num_fields):
            name = column.type.field(i).name
            if kind == "Tuple" and not name.isdigit():
                raise ValueError(
                    f"The field {field!r} of {where} is a Tuple space whose member {name!r} is not numbered. The "
                    f"dataset is damaged: write it again with Minari (or download it again)."
                )
            key = tuple_key(int(name)) if kind == "Tuple" else name
            out[key] = _decode(subspace(space, key), column.field(i), jpeg, pa, f"{field}/{name}", where)
        return out
    if jpeg and is_image_space(space):
        return decode_jpeg(column.to_pylist())
    if pa.types.is_fixed_size_list(column.type):
        flat = column.flatten().to_numpy(zero_copy_only=False)
        shape = tuple(space["shape"]) if space is not None and "shape" in space else (column.type.list_size,)
        return _reshape(flat, len(column), shape, field, where)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.to_pylist()
    if pa.types.is_binary(column.type):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in column.to_pylist()]
    return column.to_numpy(zero_copy_only=False)


def _decode_info(column, pa, path: str, where: str) -> dict:
    out = {}
    for i in range(column.type.num_fields):
        field = column.type.field(i)
        values = column.field(i)
        name = f"{path}/{field.name}"
        if pa.types.is_struct(field.type):
            out[field.name] = _decode_info(values, pa, name, where)
            continue
        if pa.types.is_fixed_size_list(field.type):
            flat = values.flatten().to_numpy(zero_copy_only=False)
            meta = field.metadata or {}
            dims = (field.type.list_size,)
            if b"shape" in meta:
                text = meta[b"shape"].split(b",")
                if not all(d.strip().isdigit() for d in text if d):
                    raise ValueError(
                        f"The field {name!r} of {where} has the shape metadata {meta[b'shape']!r}, expected "
                        f"comma-separated sizes such as b'2,3'. The dataset is damaged: write it again with Minari."
                    )
                dims = tuple(int(d) for d in text if d)
            out[field.name] = _reshape(flat, len(values), dims, name, where)
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
        "observations": parse_space(metadata.get("observation_space"), f"`observation_space` of {data_dir}"),
        "actions": parse_space(metadata.get("action_space"), f"`action_space` of {data_dir}"),
    }
    for directory in episode_dirs(data_dir):
        where = f"the Minari episode directory {str(directory)!r}"
        try:
            table = pads.dataset(
                directory, format="arrow", ignore_prefixes=["_", ".", "metadata.json"]
            ).to_table()
            table = table.combine_chunks()
        except (OSError, pa.ArrowException) as err:
            raise ValueError(
                f"{where[0].upper()}{where[1:]} holds no readable Arrow file ({type(err).__name__}: {err}). The "
                f"dataset is damaged: write it again with Minari (or download it again)."
            ) from err
        episode = {"id": int(directory.name)}
        for name in table.column_names:
            column = table.column(name).combine_chunks()
            if name in _PADDED:
                column = column.slice(0, len(column) - 1)
            if name == "infos" and pa.types.is_struct(column.type):
                episode[name] = _decode_info(column, pa, name, where)
            else:
                episode[name] = _decode(space_of.get(name), column, jpeg, pa, name, where)
        for name in ("rewards", "terminations", "truncations"):
            if name in episode:
                episode[name] = np.asarray(episode[name])
        yield episode
