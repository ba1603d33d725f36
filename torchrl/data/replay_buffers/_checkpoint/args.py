"""Argument checks and progress bars of :func:`~torchrl.data.replay_buffers.checkpointers.write_checkpoint`
and :func:`~torchrl.data.replay_buffers.checkpointers.read_checkpoint`: each raises with the argument's name,
the value received and what to pass instead."""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

import torchrl.data.replay_buffers._checkpoint.fs as _fs
import torchrl.data.replay_buffers._checkpoint.io as _io

PROGRESS_THRESHOLD_BYTES = 256 << 20


# -- progress ---------------------------------------------------------------------------------------------------
def check_progress(progress) -> None:
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(
            f"`progress` must be None (automatic), True or False; got {progress!r} ({type(progress).__name__})."
        )


def progress_bar(progress: bool | None, total: int, desc: str):
    """A tqdm bar over ``total`` bytes, or ``None``: ``None`` shows one for large jobs on a terminal."""
    if progress is False or (progress is None and (total < PROGRESS_THRESHOLD_BYTES or not sys.stderr.isatty())):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if progress:
            warnings.warn("`progress=True` needs tqdm (`pip install tqdm`); no progress bar is shown.", stacklevel=3)
        return None
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


def advance_fn(bar) -> Callable[[int], None]:
    return (lambda n: None) if bar is None else bar.update


# -- argument checks --------------------------------------------------------------------------------------------
def check_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`path` must be a str or os.PathLike; got {path!r} ({type(path).__name__}).")
    path = os.path.abspath(os.fsdecode(path))
    if os.path.dirname(path) == path:
        raise ValueError(f"`path` must name a directory below a parent; got the root {path!r}.")
    return path


def check_tensors(tensors, *, allow_reused: bool = False) -> list[tuple[str, torch.Tensor, str]]:
    """``(name, tensor, dtype name)`` for each entry; with ``allow_reused``, a value may also be a
    :class:`~torchrl.data.replay_buffers._checkpoint.io.ReusedFile` (returned with its own dtype name)."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"`tensors` must be a mapping from names to tensors; got {type(tensors).__name__}.")
    out = []
    for name, tensor in tensors.items():
        problem = _io.name_problem(name)
        if problem is not None:
            raise ValueError(
                f"`tensors` key {name!r} cannot name a file of the checkpoint: {problem}. Use names made of "
                f"'/'-separated components such as 'storage/obs'."
            )
        if allow_reused and isinstance(tensor, _io.ReusedFile):
            out.append((name, tensor, tensor.dtype))
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"`tensors[{name!r}]` must be a torch.Tensor; got {type(tensor).__name__}.")
        if tensor.layout != torch.strided or tensor.is_nested:
            raise TypeError(
                f"`tensors[{name!r}]` has layout {tensor.layout}; checkpoints store dense tensors. Convert it "
                f"with `.to_dense()` or save its components as separate tensors."
            )
        try:
            dtype = _io.dtype_name(tensor.dtype)
        except TypeError as err:
            raise TypeError(f"`tensors[{name!r}]`: {err}") from None
        out.append((name, tensor, dtype))
    return out


def check_metadata(metadata) -> dict[str, Any]:
    if not isinstance(metadata, Mapping):
        raise TypeError(f"`metadata` must be a JSON-serializable mapping; got {type(metadata).__name__}.")
    try:
        return json.loads(json.dumps(dict(metadata)))
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"`metadata` must be JSON-serializable (str keys; str, numbers, bools, None, lists and dicts "
            f"of those): {err}. Store tensors in `tensors` instead."
        ) from None


def check_replaceable(path: str, *, adopt: bool = False) -> None:
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        raise FileExistsError(
            f"`path` {path!r} exists and is not a directory (or is a symlink); a checkpoint replaces only a "
            f"previous checkpoint. Remove it or choose another path."
        )
    names = set(os.listdir(path))
    if names and not adopt and not names & {_fs.MARKER, _fs.METADATA}:
        raise FileExistsError(
            f"`path` {path!r} is a non-empty directory that is not a checkpoint (no {_fs.METADATA}); refusing "
            f"to replace it. Remove it or choose another path."
        )
