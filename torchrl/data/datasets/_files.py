"""Writing a converted dataset: memory-mapped rows plus JSON sidecars, switched into place atomically.

A conversion writes into a hidden sibling directory and renames it to its final name at the end, so an
interrupted conversion never leaves a directory that looks converted (``_is_downloaded`` only checks that the
directory exists). When two processes convert the same dataset at once, the first rename wins and the other
process drops its copy and uses the winner's.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from tensordict import TensorDictBase

__all__ = ["write_atomically", "remove_converted"]


def remove_converted(path: Path) -> None:
    """Removes a converted dataset directory (a symbolic link is refused, never followed)."""
    if path.is_symlink():
        raise RuntimeError(
            f"{str(path)!r} is a symbolic link; remove it yourself before converting the dataset."
        )
    if path.exists():
        shutil.rmtree(path)


def write_atomically(path: Path, rows: TensorDictBase, *, sidecars: dict[str, dict] | None = None) -> None:
    """Memory-maps ``rows`` into the directory ``path``, with each ``name: content`` of ``sidecars`` as a JSON
    file next to them (see the module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        rows.memmap_(tmp)
        for name, content in (sidecars or {}).items():
            with open(tmp / name, "w", encoding="utf-8") as file:
                json.dump(content, file)
        try:
            os.replace(tmp, path)
        except OSError:
            if not path.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # converted meanwhile by another process: keep its copy
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
