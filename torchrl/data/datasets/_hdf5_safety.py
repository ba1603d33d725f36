"""What an HDF5 dataset file may point at: nothing outside the directory it lives in.

An HDF5 file can make a read open other files: an external link (``h5py.ExternalLink``) names a file and an object
in it, and a virtual dataset maps pieces of datasets of other files; h5py follows both silently. A dataset file
(Minari's ``main_data.hdf5``, a D4RL file) whose links lead out of its directory would read whatever those paths
hold (``/etc/...``, another user's files) into the converted dataset. :func:`check_links` refuses such a file
before anything is read; a link to a file inside the directory is read like any other. Soft links stay within the
file; the readers refuse the ones that loop back to a group being read (:func:`check_not_ancestor`).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["check_links", "check_not_ancestor"]


def _inside(target: str, root: Path) -> bool:
    resolved = os.path.realpath(os.path.join(root, target))  # relative names resolve next to the file
    return resolved == str(root) or resolved.startswith(str(root) + os.sep)


def check_links(file, path: Path, h5py) -> None:
    """Raises ``ValueError`` naming the link when the open h5py ``file`` (read from ``path``) holds an external
    link or a virtual dataset whose file lies outside ``path``'s directory (after resolving symbolic links)."""
    root = Path(os.path.realpath(Path(path).parent))
    problems: list[str] = []

    def visit(name: str, link) -> None:
        if isinstance(link, h5py.ExternalLink) and not _inside(link.filename, root):
            problems.append(f"the external link {name!r} points to {link.filename!r} (object {link.path!r})")
        elif isinstance(link, h5py.HardLink):
            node = file.get(name)
            if isinstance(node, h5py.Dataset) and node.is_virtual:
                for source in node.virtual_sources():
                    if source.file_name != "." and not _inside(source.file_name, root):
                        problems.append(f"the virtual dataset {name!r} maps data of {source.file_name!r}")
                        break

    file.visititems_links(visit)
    if problems:
        raise ValueError(
            f"The HDF5 file {str(path)!r} refers to data outside its directory {str(root)!r}: {problems[0]}"
            f"{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}. A dataset file is read only "
            f"with what its directory holds: copy the linked data into the file (h5py's Group.copy) or next to "
            f"it, or open the dataset from where the linked files are. Nothing was read."
        )


def check_not_ancestor(node, ancestors: list, path: Path, name: str) -> None:
    """Raises ``ValueError`` when the group ``node`` (reached as ``name``) is one of ``ancestors``, the groups
    being read around it: a soft or hard link that loops back would make the reader recurse without end."""
    if any(node.id == other.id for other in ancestors):
        raise ValueError(
            f"The HDF5 file {str(path)!r} holds a link loop: {name!r} is the group {node.name!r} that contains it, "
            f"so its content has no end. Remove the link (del file[{name!r}]) or rewrite the dataset with Minari."
        )
