"""Tensors <-> Arrow columns of a Hugging Face dataset, for :mod:`~torchrl.data.replay_buffers.hf.export`.

A column spec (a JSON-able dict, stored in the export's metadata) describes how one tensor leaf of the stored
items becomes one column:

- ``column``: the column name; ``key``: the nested key (a list of str), ``None`` for a column derived at export
  (episode and frame indices), which an import skips unless asked for it;
- ``dtype``: the torch dtype name; ``shape``: the per-item shape (``None`` when items differ in shape);
- ``encoding``: ``"value"`` (a scalar per row: ``Value``), ``"list"`` (a 1-D item: a fixed-length ``List``),
  ``"array"`` (a 2- to 5-D item: ``Array2D`` ... ``Array5D``), ``"flat"`` (any other shape, e.g. 6-D or with a
  zero-sized dim: the values of an item as one fixed-length ``List``, reshaped on import), ``"empty"`` (items
  with no values: an empty variable-length ``List`` per row) or ``"ragged"``
  (items of different shapes: a variable-length ``List`` of the values plus a ``<column>__shape`` column);
- ``column_shape``: the per-row shape of the column when it differs from ``shape`` (same number of values).

``pyarrow`` and ``datasets`` are imported by the functions that need them, never at module import.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

#: torch dtypes with an Arrow type, by the name both libraries use.
ARROW_DTYPES = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        ARROW_DTYPES[getattr(torch, _name)] = _name
TORCH_DTYPES = {name: dtype for dtype, name in ARROW_DTYPES.items()}
SHAPE_SUFFIX = "__shape"
METADATA_FILE = "torchrl_export.json"
FORMAT = "torchrl.hf_export"
SCHEMA_VERSION = 1
VALUE_COLUMN = "value"  # the column of a storage whose items are plain tensors
MARKER = FORMAT + " "  # prefix of the metadata document kept in the dataset's info.description


def require_datasets():
    """The ``datasets`` module, or an ImportError that says how to install it."""
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - the extra is installed in CI
        raise ImportError(
            "Exchanging data with Hugging Face datasets needs the `datasets` package: pip install "
            "'torchrl[hf]' (or pip install datasets)."
        ) from err
    return datasets


def dtype_name(dtype: torch.dtype, column: str) -> str:
    """The Arrow name of ``dtype``; a ``TypeError`` naming ``column`` for a dtype Arrow cannot hold."""
    name = ARROW_DTYPES.get(dtype)
    if name is None:
        raise TypeError(
            f"Column {column!r} holds {dtype} tensors, which Arrow (and so a Hugging Face dataset) cannot store: "
            f"supported dtypes are {', '.join(sorted(TORCH_DTYPES))}. Store that entry as float32 (every "
            f"bfloat16 value is exactly a float32), or leave it out with `exclude_keys=[...]`."
        )
    return name


def plan_fixed(column: str, key, dtype: torch.dtype, shape, column_shape=None) -> dict:
    """The spec of a column whose items all have ``shape`` (``column_shape``: the row shape, if different)."""
    shape = [int(d) for d in shape]
    row = shape if column_shape is None else [int(d) for d in column_shape]
    if len(row) == 0:
        encoding = "value"
    elif len(row) == 1 and row[0] > 0:
        encoding = "list"
    elif 2 <= len(row) <= 5 and all(d > 0 for d in row):
        encoding = "array"
    else:
        encoding, row = "flat", [math.prod(row)]
        if not row[0]:  # Arrow has no fixed-size list of size 0: every row is an empty list
            encoding = "empty"
    spec = {"column": column, "key": None if key is None else list(key), "dtype": dtype_name(dtype, column),
            "shape": shape, "encoding": encoding}  # fmt: skip
    if row != shape:
        spec["column_shape"] = row
    return spec


def plan_ragged(column: str, key, dtype: torch.dtype) -> dict:
    """The spec of a column whose items differ in shape (values plus a shape column)."""
    return {"column": column, "key": list(key), "dtype": dtype_name(dtype, column), "shape": None,
            "encoding": "ragged"}  # fmt: skip


def row_shape(spec: dict) -> list[int]:
    return spec.get("column_shape", spec["shape"])


def features_of(specs: list[dict]):
    """The ``datasets.Features`` of the columns ``specs`` (ragged columns add their shape column)."""
    import datasets

    out = {}
    for spec in specs:
        value = datasets.Value(spec["dtype"])
        encoding, row = spec["encoding"], spec.get("column_shape", spec["shape"])
        if encoding == "value":
            out[spec["column"]] = value
        elif encoding in ("list", "flat"):
            out[spec["column"]] = datasets.Sequence(value, length=row[0])
        elif encoding == "empty":
            out[spec["column"]] = datasets.Sequence(value)
        elif encoding == "array":
            array_cls = getattr(datasets, f"Array{len(row)}D")
            out[spec["column"]] = array_cls(shape=tuple(row), dtype=spec["dtype"])
        else:
            out[spec["column"]] = datasets.Sequence(value)
            out[spec["column"] + SHAPE_SUFFIX] = datasets.Sequence(datasets.Value("int64"))
    return datasets.Features(out)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu").contiguous().numpy()


def _nest(pa, values, dims: list[int], n: int):
    """``values`` (a flat Arrow array of ``n * prod(dims)`` values) as ``n`` rows of nested lists ``dims``."""
    arr, count = values, n * math.prod(dims)
    for d in reversed(dims):
        count //= d
        offsets = pa.array(np.arange(0, count * d + 1, d, dtype=np.int32))
        arr = pa.ListArray.from_arrays(offsets, arr)
    return arr


def to_arrow(spec: dict, rows: torch.Tensor, arrow_type):
    """The Arrow array of a fixed-shape column from a batch ``rows`` of shape ``[n, *spec["shape"]]``."""
    import pyarrow as pa

    n, expected = rows.shape[0], [rows.shape[0], *spec["shape"]]
    if list(rows.shape) != expected:
        raise ValueError(
            f"Column {spec['column']!r}: items of shape {list(rows.shape[1:])} in a column planned for "
            f"{spec['shape']} (the items' shapes changed during the export). Export a storage whose items all "
            f"have the same shape, or a ListStorage (which exports ragged items)."
        )
    values = pa.array(_numpy(rows).reshape(-1))
    encoding, row = spec["encoding"], row_shape(spec)
    if encoding == "value":
        arr = values
    elif encoding in ("list", "flat"):
        arr = pa.FixedSizeListArray.from_arrays(values, row[0])
    elif encoding == "empty":
        arr = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), values)
    else:
        arr = pa.ExtensionArray.from_storage(arrow_type, _nest(pa, values, row, n).cast(arrow_type.storage_type))
    return arr if arr.type == arrow_type else arr.cast(arrow_type)


def ragged_to_arrow(items: list[torch.Tensor]):
    """The values column and the shape column of items of different shapes."""
    import pyarrow as pa

    flat = [_numpy(t).reshape(-1) for t in items]
    offsets = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum([f.size for f in flat], out=offsets[1:])
    values = pa.array(np.concatenate(flat) if flat else np.zeros(0))
    column = pa.LargeListArray.from_arrays(pa.array(offsets), values).cast(pa.list_(values.type))
    shapes = pa.array([list(t.shape) for t in items], type=pa.list_(pa.int64()))
    return column, shapes


# -- Arrow -> torch ---------------------------------------------------------------------------------------------
def _combined(arr):
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if isinstance(arr.type, pa.ExtensionType):
        arr = arr.storage
    return arr


def _check_nulls(arr, column: str) -> None:
    if arr.null_count:
        raise ValueError(
            f"Column {column!r} has {arr.null_count} missing values (nulls), which a tensor cannot hold. Fill them "
            f"first (e.g. `ds.map(...)`), or leave the column out with `columns=[...]`."
        )


def flatten_column(arr, column: str, *, copy: bool = True):
    """``(values, dims)``: the flat numpy values of a (nested) list column and the per-row dims, or
    ``(None, None)`` when rows differ in length (ragged). ``copy=False`` may return a read-only view of the
    Arrow buffers (see :func:`from_arrow`)."""
    import pyarrow as pa

    arr = _combined(arr)
    dims: list[int] = []
    count = len(arr)
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        _check_nulls(arr, column)
        if pa.types.is_fixed_size_list(arr.type):
            d = arr.type.list_size
        else:
            lengths = arr.value_lengths().to_numpy(zero_copy_only=False)
            if count and lengths.min() != lengths.max():
                return None, None
            d = int(lengths[0]) if count else 0
        dims.append(d)
        arr = arr.flatten()
        count *= d
    _check_nulls(arr, column)
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_boolean(arr.type)):
        raise TypeError(
            f"Column {column!r} holds {arr.type} values, which do not make a tensor (numbers and bools do). Leave "
            f"it out with `columns=[...]`, or convert it first (e.g. `ds.map(...)`)."
        )
    values = arr.to_numpy(zero_copy_only=False)  # read-only when it views Arrow's buffers, else a new array
    return (values.copy() if copy and not values.flags.writeable else values), dims


def _as_tensor(values: np.ndarray) -> torch.Tensor:
    if values.flags.writeable:
        return torch.from_numpy(values)
    with warnings.catch_warnings():  # torch warns that writing to it is undefined: the caller only reads it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(values)


def from_arrow(arr, column: str, dtype: torch.dtype | None, shape: list[int] | None, *, copy: bool = True):
    """A tensor ``[n, *dims]`` from a column, or a list of per-row tensors when rows differ in shape.

    ``dtype``/``shape``: what the export's metadata says the items are (``None``: take the column's own);
    a column whose rows do not hold ``prod(shape)`` values raises a ``ValueError``. ``copy=False`` returns,
    where Arrow allows it, a tensor over the Arrow buffers themselves (for a dataset read from disk, a
    read-only memory map: writing to it crashes the process): only for a caller that copies it right away.
    """
    n = len(arr)
    values, dims = flatten_column(arr, column, copy=copy)
    if values is None:
        rows = _combined(arr).to_pylist()
        return [torch.tensor(r, dtype=dtype) for r in rows]
    tensor = _as_tensor(values)
    if dtype is not None and tensor.dtype != dtype:
        # an export writes each column with the Arrow type of its metadata dtype: a difference means that one
        # of them was edited, and a cast would change the values silently (floats truncated to ints)
        raise ValueError(
            f"Column {column!r} holds {ARROW_DTYPES.get(tensor.dtype, tensor.dtype)} values, but the export's "
            f"metadata says its items are {ARROW_DTYPES.get(dtype, dtype)}: the dataset and its metadata do not "
            f"match (was one of them edited?). Re-export the buffer, or read the dataset without its metadata "
            f"with `ignore_metadata=True` (the column's own dtype)."
        )
    if shape is not None:
        if math.prod(dims) != math.prod(shape):
            raise ValueError(
                f"Column {column!r} has rows of shape {dims}, but the export's metadata says its items have shape "
                f"{shape}: the dataset and its metadata do not match (was one of them edited?). Re-export the "
                f"buffer, or read the dataset without its metadata with `ignore_metadata=True`."
            )
        dims = shape
    return tensor.reshape(n, *dims)


def ragged_from_arrow(values, shapes, column: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """The per-row tensors of a ragged column and its shape column."""
    values, shapes = _combined(values), _combined(shapes)
    _check_nulls(values, column)
    _check_nulls(shapes, column + SHAPE_SUFFIX)
    flat = torch.from_numpy(np.array(values.flatten().to_numpy(zero_copy_only=False), copy=True)).to(dtype)
    offsets = values.offsets.to_numpy()
    offsets = offsets - offsets[0]
    out = []
    for i, shape in enumerate(shapes.to_pylist()):
        start, stop = int(offsets[i]), int(offsets[i + 1])
        if math.prod(shape) != stop - start:
            raise ValueError(
                f"Row {i} of column {column!r} holds {stop - start} values but its shape column says {shape}: the "
                f"dataset is corrupt. Re-export the buffer."
            )
        out.append(flat[start:stop].reshape(shape))
    return out
