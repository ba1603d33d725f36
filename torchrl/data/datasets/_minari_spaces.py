"""Minari's serialized spaces (the JSON of ``data/metadata.json``), read without gymnasium.

A space is the dict Minari's ``serialize_space`` writes: ``{"type": "Box", "dtype", "shape", "low", "high"}``,
``{"type": "Discrete", "n", "start"}``, ``{"type": "Dict", "subspaces": {name: space}}``, ``{"type": "Tuple",
"subspaces": [space, ...]}``, ``{"type": "Text", ...}``, ``MultiDiscrete`` / ``MultiBinary``. Tuple members are
stored under ``"_index_<i>"`` (HDF5 group names; the Arrow format's ``"<i>"`` fields are renamed to match).
"""

from __future__ import annotations

import io
import json

import numpy as np

__all__ = ["parse_space", "subspace", "is_image_space", "decode_jpeg", "tuple_key"]


def parse_space(space) -> dict | None:
    """The space as a dict (``space`` is Minari's JSON string, or already a dict); ``None`` stays ``None``."""
    if space is None or isinstance(space, dict):
        return space
    return json.loads(space)


def tuple_key(i: int) -> str:
    """The key of member ``i`` of a Tuple space (Minari's HDF5 group name)."""
    return f"_index_{i}"


def subspace(space: dict | None, name: str) -> dict | None:
    """The member ``name`` of a Dict or Tuple space, ``None`` if unknown."""
    if space is None:
        return None
    kind = space.get("type")
    if kind == "Dict":
        return space.get("subspaces", {}).get(name)
    if kind == "Tuple" and name.startswith("_index_"):
        members = space.get("subspaces", [])
        i = int(name[len("_index_") :])
        return members[i] if i < len(members) else None
    return None


def is_image_space(space: dict | None) -> bool:
    """Minari's rule for spaces it stores as JPEG: uint8 Box of 2 or 3 dims, at least 32 x 32, bounds 0..255."""
    if space is None or space.get("type") != "Box" or space.get("dtype") != "uint8":
        return False
    shape = space.get("shape", [])
    if len(shape) not in (2, 3) or shape[0] < 32 or shape[1] < 32:
        return False
    return bool(np.all(np.asarray(space["low"]) == 0) and np.all(np.asarray(space["high"]) == 255))


def decode_jpeg(frames) -> np.ndarray:
    """Decodes a sequence of JPEG byte strings into a uint8 array ``[T, H, W(, C)]`` (needs Pillow)."""
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError(
            "This Minari dataset stores images as JPEG, which needs Pillow to decode: pip install pillow "
            "(or the 'gym' extra)."
        ) from err
    images = [np.asarray(Image.open(io.BytesIO(bytes(frame))), dtype=np.uint8) for frame in frames]
    return np.stack(images) if images else np.zeros((0,), dtype=np.uint8)
