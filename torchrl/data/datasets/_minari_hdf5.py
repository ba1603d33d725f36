"""Minari's HDF5 format (``data/main_data.hdf5``), read with h5py.

One group ``episode_<id>`` per episode, holding ``observations`` (T + 1 entries), ``actions``, ``rewards``,
``terminations``, ``truncations`` (T entries each) and ``infos`` (a group); Dict spaces are groups, Tuple spaces
groups of ``_index_<i>``, Text spaces byte strings, image spaces JPEG bytes when ``jpeg_encoding``. An episode is
returned as a nested dict of numpy arrays (lists of ``str`` for text), in numeric id order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from torchrl.data.datasets._minari_spaces import decode_jpeg, is_image_space, parse_space, subspace

__all__ = ["MAIN_FILE", "read_episodes"]

MAIN_FILE = "main_data.hdf5"


def _h5py():
    try:
        import h5py
    except ImportError as err:
        raise ImportError(
            "Reading a Minari dataset in the hdf5 format needs h5py: pip install h5py (the 'h5' or 'minari' extra)."
        ) from err
    return h5py


def _read(node, space: dict | None, jpeg: bool, h5py):
    if isinstance(node, h5py.Group):
        return {name: _read(node[name], subspace(space, name), jpeg, h5py) for name in node.keys()}
    if jpeg and is_image_space(space) and node.dtype.kind in "OSV":
        return decode_jpeg(node[()])
    values = node[()]
    if values.dtype.kind in "OS":  # byte strings: text
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
    return values


def read_episodes(data_dir: Path, metadata: dict) -> Iterator[dict]:
    """Yields each episode of ``data_dir/main_data.hdf5`` as a dict (``"id"`` plus the group's content)."""
    h5py = _h5py()
    jpeg = bool(metadata.get("jpeg_encoding", False))
    space_of = {
        "observations": parse_space(metadata.get("observation_space")),
        "actions": parse_space(metadata.get("action_space")),
    }
    with h5py.File(Path(data_dir) / MAIN_FILE, "r") as file:
        names = [name for name in file.keys() if name.startswith("episode_")]
        for name in sorted(names, key=lambda n: int(n[len("episode_") :])):
            group = file[name]
            episode = {"id": int(name[len("episode_") :])}
            for key in group.keys():
                episode[key] = _read(group[key], space_of.get(key), jpeg, h5py)
            yield episode
