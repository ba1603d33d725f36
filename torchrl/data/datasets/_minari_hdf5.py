"""Minari's HDF5 format (``data/main_data.hdf5``), read with h5py.

One group ``episode_<id>`` per episode, holding ``observations`` (T + 1 entries), ``actions``, ``rewards``,
``terminations``, ``truncations`` (T entries each) and ``infos`` (a group); Dict spaces are groups, Tuple spaces
groups of ``_index_<i>``, Text spaces byte strings, image spaces JPEG bytes when ``jpeg_encoding``. An episode is
returned as a nested dict of numpy arrays (lists of ``str`` for text), in numeric id order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from torchrl.data.datasets._hdf5_safety import check_links, check_not_ancestor
from torchrl.data.datasets._minari_spaces import decode_jpeg, is_image_space, parse_space, subspace

__all__ = ["MAIN_FILE", "episode_ids", "read_episodes"]

MAIN_FILE = "main_data.hdf5"
_MAX_DEPTH = 64  # groups within an episode: Dict/Tuple spaces nest a few levels; this bounds the reader's recursion


def _h5py():
    try:
        import h5py
    except ImportError as err:
        raise ImportError(
            "Reading a Minari dataset in the hdf5 format needs h5py: pip install h5py (the 'h5' or 'minari' extra)."
        ) from err
    return h5py


def _read(node, space: dict | None, jpeg: bool, h5py, path: Path, ancestors: list):
    if isinstance(node, h5py.Group):
        check_not_ancestor(node, ancestors, path, node.name)
        if len(ancestors) >= _MAX_DEPTH:
            raise ValueError(
                f"The group {node.name!r} of the Minari file {str(path)!r} is nested {len(ancestors)} groups deep; "
                f"Minari's spaces nest at most a few levels, so the file is damaged. Write the dataset again with "
                f"Minari (or download it again)."
            )
        inner = ancestors + [node]
        return {
            name: _read(node[name], subspace(space, name), jpeg, h5py, path, inner) for name in node.keys()
        }
    try:
        if jpeg and is_image_space(space) and node.dtype.kind in "OSV":
            return decode_jpeg(node[()])
        values = node[()]
        if values.dtype.kind in "OS":  # byte strings: text
            return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
    except (OSError, ValueError, TypeError) as err:  # a damaged dataset, undecodable bytes or images
        raise ValueError(
            f"The field {node.name!r} of the Minari file {str(path)!r} cannot be read ({type(err).__name__}: "
            f"{err}). The file is damaged: write the dataset again with Minari (or download it again)."
        ) from err
    return values


def _open(path: Path, h5py):
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise ValueError(
            f"The Minari file {str(path)!r} is not a readable HDF5 file ({err}). Write the dataset again with "
            f"Minari (or download it again)."
        ) from err


def _episode_names(file) -> dict[int, str]:
    """``{id: group name}`` of the ``episode_<id>`` groups of ``file``."""
    out = {}
    for name in file.keys():
        suffix = name[len("episode_") :]
        if name.startswith("episode_") and suffix.isdigit():
            out[int(suffix)] = name
    return out


def episode_ids(data_dir: Path) -> list[int]:
    """The ids of the episodes ``data_dir/main_data.hdf5`` holds, in numeric order."""
    h5py = _h5py()
    with _open(Path(data_dir) / MAIN_FILE, h5py) as file:
        return sorted(_episode_names(file))


def read_episodes(data_dir: Path, metadata: dict) -> Iterator[dict]:
    """Yields each episode of ``data_dir/main_data.hdf5`` as a dict (``"id"`` plus the group's content).

    A file with links to data outside ``data_dir`` is refused first (see :mod:`._hdf5_safety`)."""
    h5py = _h5py()
    path = Path(data_dir) / MAIN_FILE
    jpeg = bool(metadata.get("jpeg_encoding", False))
    space_of = {
        "observations": parse_space(metadata.get("observation_space"), f"`observation_space` of {path.parent}"),
        "actions": parse_space(metadata.get("action_space"), f"`action_space` of {path.parent}"),
    }
    with _open(path, h5py) as file:
        check_links(file, path, h5py)
        names = _episode_names(file)
        for ep_id in sorted(names):
            group = file[names[ep_id]]
            episode = {"id": ep_id}
            for key in group.keys():
                episode[key] = _read(group[key], space_of.get(key), jpeg, h5py, path, [group])
            yield episode
