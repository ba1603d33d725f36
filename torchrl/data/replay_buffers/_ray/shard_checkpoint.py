"""The on-disk protocol of a :class:`~torchrl.data.ShardedRayReplayBuffer` checkpoint: one consistent save of every
shard, crash-safe as a whole.

NOTE [sharded checkpoint]: ``dumps(root)`` writes a new version directory ``root/v<version>-<hex>/`` into which
each shard actor dumps its buffer (``shard-<i>/``, the pickle-free format of ``ReplayBuffer.dumps``); only once
every shard reported its part written does the client write ``root/manifest.json`` (format, schema version,
version, the directory, one entry per shard), atomically (a temporary file, ``os.replace``) and last. The
manifest is the commit: a process killed before it (the client, or any shard actor) leaves the previous manifest
in place, naming the previous, complete version directory, which stays loadable; the partial directory is
removed by the next successful ``dumps``, which removes every version directory the new manifest does not name.
``loads(root)`` reads the manifest and nothing else: a directory without one (a save that never finished, or a
version directory itself) is refused, as is a manifest whose shard parts are missing. One ``dumps`` at a time
per ``root``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil

from torchrl._files import fsync_dir, write_file_atomically

__all__ = [
    "FORMAT",
    "MANIFEST",
    "SCHEMA_VERSION",
    "commit",
    "new_version_dir",
    "read_manifest",
    "read_restore_pointer",
    "shard_part",
    "write_restore_pointer",
]

MANIFEST = "manifest.json"
FORMAT = "torchrl.ShardedRayReplayBuffer"
SCHEMA_VERSION = 1
_VERSION_DIR = re.compile(r"^v(\d{6,})-[0-9a-f]{8}$")


def _shard_dir(shard: int) -> str:
    return f"shard-{shard:03d}"


def _previous_version(root: str) -> int:
    try:
        with open(os.path.join(root, MANIFEST), encoding="utf-8") as file:
            return int(json.load(file).get("version", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def new_version_dir(root, num_shards: int) -> tuple[int, str, list[str]]:
    """Creates ``root`` (if needed) and a new empty version directory in it; returns ``(version, its name, the
    path where each shard dumps its part)``."""
    root = os.path.abspath(os.fspath(root))
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotADirectoryError(f"dumps(path={root!r}): the path is a file; pass a directory (new or a checkpoint).")
    os.makedirs(root, exist_ok=True)
    version = _previous_version(root) + 1
    name = f"v{version:06d}-{secrets.token_hex(4)}"
    os.mkdir(os.path.join(root, name))
    return version, name, [os.path.join(root, name, _shard_dir(i)) for i in range(num_shards)]


def commit(root, version: int, name: str, shards: list[dict], extra: dict) -> str:
    """Writes the manifest naming version directory ``name`` (atomically, last: NOTE [sharded checkpoint]),
    then removes the other version directories of ``root``; returns the manifest's path."""
    root = os.path.abspath(os.fspath(root))
    manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "version": version, "directory": name,
                "num_shards": len(shards), "shards": shards, **extra}  # fmt: skip
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    fsync_dir(os.path.join(root, name))
    path = os.path.join(root, MANIFEST)
    write_file_atomically(path, lambda file: file.write(data))
    for entry in os.listdir(root):
        if entry != name and _VERSION_DIR.match(entry) and os.path.isdir(os.path.join(root, entry)):
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    return path


def read_manifest(root, num_shards: int | None = None) -> dict:
    """The manifest of the checkpoint at ``root``, checked (format, schema version, every shard part present,
    ``num_shards`` when given); each shard entry gains ``"path"``, the absolute path of its part."""
    root = os.path.abspath(os.fspath(root))
    path = os.path.join(root, MANIFEST)
    if not os.path.isfile(path):
        partial = os.path.isdir(root) and any(_VERSION_DIR.match(e) for e in os.listdir(root))
        if _VERSION_DIR.match(os.path.basename(root)):
            hint = "this is a version directory inside a checkpoint: pass its parent, which holds manifest.json"
        elif partial:
            hint = ("it holds the part of a save that never finished (killed before its manifest was written), "
                    "which cannot be loaded")
        else:
            hint = "no ShardedRayReplayBuffer.dumps() wrote there"
        raise FileNotFoundError(f"loads(path={root!r}): no {MANIFEST} there, so no complete sharded checkpoint: {hint}.")
    try:
        with open(path, encoding="utf-8") as file:
            manifest = json.load(file)
    except (OSError, ValueError) as err:
        raise ValueError(f"loads(path={root!r}): {MANIFEST} cannot be read as JSON ({err}).") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"loads(path={root!r}): {MANIFEST} is not a {FORMAT} manifest.")
    schema = manifest.get("schema_version")
    if not isinstance(schema, int) or schema > SCHEMA_VERSION or schema < 1:
        raise ValueError(
            f"loads(path={root!r}): the checkpoint has schema_version={schema!r} and this version of torchrl reads "
            f"{SCHEMA_VERSION}: load it with the torchrl version that wrote it."
        )
    shards = manifest.get("shards")
    if not isinstance(shards, list) or len(shards) != manifest.get("num_shards"):
        raise ValueError(f"loads(path={root!r}): {MANIFEST} lists no valid shard entries.")
    if num_shards is not None and len(shards) != num_shards:
        raise ValueError(
            f"loads(path={root!r}): the checkpoint holds {len(shards)} shards and this buffer has {num_shards}: "
            f"load it into a ShardedRayReplayBuffer built with num_shards={len(shards)}."
        )
    directory = os.path.join(root, str(manifest.get("directory")))
    for shard, entry in enumerate(shards):
        part = os.path.join(directory, _shard_dir(shard))
        if not os.path.isdir(part):
            raise FileNotFoundError(
                f"loads(path={root!r}): the part of shard {shard} ({part}) named by {MANIFEST} is missing: the "
                f"checkpoint was altered after it was written, and is refused as a whole."
            )
        entry["path"] = part
    return manifest


def shard_part(manifest_root, shard: int, num_shards: int) -> str:
    """The path of ``shard``'s part in the checkpoint at ``manifest_root`` (checked as :func:`read_manifest`)."""
    return read_manifest(manifest_root, num_shards)["shards"][shard]["path"]


def write_restore_pointer(pointer, root) -> None:
    """Records (atomically) that ``root`` holds the buffer's last checkpoint: a restarted shard loads it."""
    data = json.dumps({"checkpoint": os.path.abspath(os.fspath(root))}).encode()
    os.makedirs(os.path.dirname(os.fspath(pointer)), exist_ok=True)
    write_file_atomically(pointer, lambda file: file.write(data), fsync=False)


def read_restore_pointer(pointer) -> str | None:
    """The checkpoint :func:`write_restore_pointer` recorded last, or ``None`` when none was."""
    try:
        with open(pointer, encoding="utf-8") as file:
            return json.load(file)["checkpoint"]
    except FileNotFoundError:
        return None
