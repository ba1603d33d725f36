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


def parse_space(space, where: str = "the space") -> dict | None:
    """The space as a dict (``space`` is Minari's JSON string, or already a dict); ``None`` stays ``None``.

    Raises ``ValueError`` naming ``where`` (the field and its file) for anything else: text that is no JSON, JSON
    nested beyond what Python reads, JSON that is not an object."""
    if space is None or isinstance(space, dict):
        return space
    problem = None
    if not isinstance(space, str):
        problem = f"is a {type(space).__name__}, expected Minari's JSON string of the space"
    else:
        try:
            parsed = json.loads(space)
        except (ValueError, RecursionError) as err:  # JSONDecodeError; nesting deeper than the recursion limit
            problem = f"is not readable JSON ({type(err).__name__}: {str(err)[:120]})"
        else:
            if isinstance(parsed, dict):
                return parsed
            problem = f"is JSON of a {type(parsed).__name__}, expected an object such as {{\"type\": \"Box\", ...}}"
    raise ValueError(
        f"{where} {problem}. Write the dataset's metadata again with Minari (or download the dataset again)."
    )


def tuple_key(i: int) -> str:
    """The key of member ``i`` of a Tuple space (Minari's HDF5 group name)."""
    return f"_index_{i}"


def subspace(space: dict | None, name: str) -> dict | None:
    """The member ``name`` of a Dict or Tuple space, ``None`` if unknown."""
    if space is None:
        return None
    kind = space.get("type")
    members = space.get("subspaces")
    if kind == "Dict" and isinstance(members, dict):
        found = members.get(name)
        return found if isinstance(found, dict) else None
    if kind == "Tuple" and isinstance(members, list) and name.startswith("_index_") and name[7:].isdigit():
        i = int(name[len("_index_") :])
        found = members[i] if i < len(members) else None
        return found if isinstance(found, dict) else None
    return None


def is_image_space(space: dict | None) -> bool:
    """Minari's rule for spaces it stores as JPEG: uint8 Box of 2 or 3 dims, at least 32 x 32, bounds 0..255."""
    if space is None or space.get("type") != "Box" or space.get("dtype") != "uint8":
        return False
    shape = space.get("shape", [])
    if not isinstance(shape, list) or len(shape) not in (2, 3) or not all(isinstance(d, int) for d in shape):
        return False
    if shape[0] < 32 or shape[1] < 32:
        return False
    return bool(np.all(np.asarray(space.get("low")) == 0) and np.all(np.asarray(space.get("high")) == 255))


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
