"""The policy checkpoint format played back by ``rlrender``.

A checkpoint is a directory with two files:

- ``weights.pt``: the policy's ``state_dict``, written with ``torch.save`` and read back with
  ``torch.load(weights_only=True)``, which only rebuilds tensors and plain containers;
- ``policy.json``: the format name and version, the environment id, the policy architecture (class name and
  the arguments that rebuild it, e.g. :meth:`MLPPolicy.config`), the SHA-256 of ``weights.pt`` and free-form
  user metadata.

Nothing is pickled, so loading an untrusted checkpoint runs no code: the architecture is rebuilt from a
known class and the JSON arguments, then the weights are loaded into it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchrl._files import write_file_atomically
from torchrl._validation import is_int
from torchrl.render.policy import MLPPolicy

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CheckpointFormatError",
    "PolicyCheckpoint",
    "save_policy_checkpoint",
    "load_policy_checkpoint",
]

FORMAT_NAME = "torchrl.render.policy_checkpoint"
FORMAT_VERSION = 1
WEIGHTS_FILE = "weights.pt"
SPEC_FILE = "policy.json"

# Architectures the format can rebuild, by the class name stored in policy.json.
_POLICY_CLASSES: dict[str, type[nn.Module]] = {"MLPPolicy": MLPPolicy}


class CheckpointFormatError(ValueError):
    """Raised when a path exists but is not a readable policy checkpoint of this format."""


@dataclasses.dataclass
class PolicyCheckpoint:
    """A loaded policy checkpoint.

    Attributes:
        policy (nn.Module): the rebuilt policy with its weights, in eval mode, on CPU.
        env_id (str): the environment id the policy was trained on.
        metadata (dict): the user metadata stored at save time.
        path (Path): the checkpoint directory.
        version (int): the format version the checkpoint was written with.
    """

    policy: nn.Module
    env_id: str
    metadata: dict[str, Any]
    path: Path
    version: int


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_metadata(metadata) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(isinstance(key, str) for key in metadata):
        raise TypeError(f"`metadata` must be a dict with str keys (or None), got {metadata!r}.")
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"`metadata` must be JSON-serializable (str, numbers, bools, None, lists, dicts; no NaN): {err}. "
            f"Convert tensors with .tolist() or .item()."
        ) from None
    return dict(metadata)


def save_policy_checkpoint(
    path: str | os.PathLike,
    policy: nn.Module,
    *,
    env_id: str,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Writes a policy checkpoint directory that ``rlrender`` and :func:`load_policy_checkpoint` read.

    The directory is created if needed; ``weights.pt`` and ``policy.json`` are each written to a temporary
    file and renamed into place, ``policy.json`` last, so a crash never leaves a torn file. Other files in the
    directory are left alone.

    Args:
        path (str or PathLike): the checkpoint directory.
        policy (nn.Module): the policy; for now an :class:`~torchrl.render.MLPPolicy`, the architecture the
            format can rebuild.

    Keyword Args:
        env_id (str): the gymnasium environment id the policy plays (e.g. ``"CartPole-v1"``).
        metadata (Mapping, optional): JSON-serializable extra information (training settings, scores).
            Defaults to ``None`` (empty).

    Returns:
        the checkpoint directory as a :class:`~pathlib.Path`.

    Examples:
        >>> import tempfile
        >>> from torchrl.render import MLPPolicy, load_policy_checkpoint, save_policy_checkpoint
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = save_policy_checkpoint(f"{tmp}/ckpt", MLPPolicy(4, 2), env_id="CartPole-v1")
        ...     sorted(p.name for p in path.iterdir())
        ...     ckpt = load_policy_checkpoint(path)
        ...     ckpt.env_id, type(ckpt.policy).__name__
        ['policy.json', 'weights.pt']
        ('CartPole-v1', 'MLPPolicy')
    """
    name = type(policy).__name__
    if _POLICY_CLASSES.get(name) is not type(policy):
        raise TypeError(
            f"`policy` must be one of the architectures the checkpoint format can rebuild "
            f"({sorted(_POLICY_CLASSES)}), got {name}. Build the policy with torchrl.render.MLPPolicy."
        )
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(
            f"`env_id` must be a non-empty gymnasium environment id such as 'CartPole-v1', got {env_id!r}."
        )
    metadata = _check_metadata(metadata)
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise FileExistsError(
            f"`path`={str(path)!r} is an existing file; a policy checkpoint is a directory. Pass a new path."
        )
    directory.mkdir(parents=True, exist_ok=True)

    state_dict = {key: value.detach().cpu().contiguous() for key, value in policy.state_dict().items()}
    write_file_atomically(directory / WEIGHTS_FILE, lambda file: torch.save(state_dict, file))
    spec = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "env_id": env_id,
        "policy": {"class": name, "config": policy.config()},
        "weights": {"file": WEIGHTS_FILE, "sha256": _sha256(directory / WEIGHTS_FILE)},
        "metadata": metadata,
        "torch_version": torch.__version__,
    }
    text = json.dumps(spec, indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_file_atomically(directory / SPEC_FILE, lambda file: file.write(text.encode("utf-8")))
    return directory


def _read_spec(directory: Path) -> dict[str, Any]:
    spec_path = directory / SPEC_FILE
    if not spec_path.is_file():
        present = sorted(p.name for p in directory.iterdir())[:10]
        raise CheckpointFormatError(
            f"{str(directory)!r} is not a policy checkpoint: it has no {SPEC_FILE} (files present: "
            f"{present}). Write checkpoints with torchrl.render.save_policy_checkpoint."
        )
    try:
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointFormatError(f"{str(spec_path)!r} is not valid JSON: {err}.") from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT_NAME:
        found = spec.get("format") if isinstance(spec, dict) else type(spec).__name__
        raise CheckpointFormatError(
            f"{str(spec_path)!r} describes another format ({found!r}); expected {FORMAT_NAME!r}."
        )
    version = spec.get("version")
    if not is_int(version) or version < 1:
        raise CheckpointFormatError(f"{str(spec_path)!r} has an invalid format version {version!r}.")
    if version > FORMAT_VERSION:
        raise CheckpointFormatError(
            f"{str(spec_path)!r} was written with format version {version}, newer than the {FORMAT_VERSION} "
            f"this torchrl reads. Upgrade torchrl."
        )
    for key, kind in (("env_id", str), ("policy", dict), ("weights", dict), ("metadata", dict)):
        if not isinstance(spec.get(key), kind):
            raise CheckpointFormatError(
                f"{str(spec_path)!r} is malformed: {key!r} must be a {kind.__name__}, got {spec.get(key)!r}."
            )
    return spec


def _build_policy(spec: dict[str, Any], spec_path: Path) -> nn.Module:
    name = spec["policy"].get("class")
    if name not in _POLICY_CLASSES:
        raise CheckpointFormatError(
            f"{str(spec_path)!r} describes a policy class {name!r} this torchrl cannot rebuild; known: "
            f"{sorted(_POLICY_CLASSES)}."
        )
    try:
        return _POLICY_CLASSES[name].from_config(spec["policy"].get("config"))
    except (TypeError, ValueError) as err:
        raise CheckpointFormatError(f"{str(spec_path)!r} has an invalid {name} config: {err}") from None


def _load_weights(spec: dict[str, Any], directory: Path) -> dict[str, torch.Tensor]:
    file = spec["weights"].get("file", WEIGHTS_FILE)
    if not isinstance(file, str) or Path(file).name != file:
        raise CheckpointFormatError(
            f"The weights file name {file!r} in {SPEC_FILE} must be a plain file name."
        )
    weights_path = directory / file
    if not weights_path.is_file():
        raise CheckpointFormatError(f"The checkpoint {str(directory)!r} has no weights file {file!r}.")
    expected = spec["weights"].get("sha256")
    if expected is not None and _sha256(weights_path) != expected:
        raise CheckpointFormatError(
            f"{str(weights_path)!r} does not match the SHA-256 recorded in {SPEC_FILE}: the file is "
            f"corrupted or was replaced. Save the checkpoint again."
        )
    try:
        state_dict = torch.load(weights_path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError/RuntimeError/... for foreign or torn files
        raise CheckpointFormatError(
            f"Cannot read {str(weights_path)!r} as tensors only (torch.load(weights_only=True)): "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        ) from None
    if not isinstance(state_dict, Mapping) or not all(
        isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in state_dict.items()
    ):
        raise CheckpointFormatError(f"{str(weights_path)!r} does not hold a state_dict (a dict of tensors).")
    return dict(state_dict)


def load_policy_checkpoint(path: str | os.PathLike) -> PolicyCheckpoint:
    """Loads a checkpoint written by :func:`save_policy_checkpoint`, without unpickling anything.

    Args:
        path (str or PathLike): the checkpoint directory (or its ``policy.json``).

    Returns:
        a :class:`PolicyCheckpoint` whose ``policy`` is rebuilt from the JSON description, holds the saved
        weights and is in eval mode.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointFormatError: ``path`` is not a checkpoint of this format (e.g. a pickle file, a directory
            without ``policy.json``, another format or a newer version, weights that do not fit the
            architecture).

    Examples:
        >>> import tempfile, torch
        >>> from torchrl.render import MLPPolicy, load_policy_checkpoint, save_policy_checkpoint
        >>> policy = MLPPolicy(4, 2, hidden=(8,), activation="relu")
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = save_policy_checkpoint(tmp, policy, env_id="CartPole-v1", metadata={"updates": 10})
        ...     ckpt = load_policy_checkpoint(tmp)
        >>> ckpt.metadata, ckpt.policy.config()["hidden"]
        ({'updates': 10}, [8])
        >>> torch.equal(ckpt.policy(torch.ones(4)), policy(torch.ones(4)))
        True
    """
    directory = Path(path)
    if not directory.exists():
        raise FileNotFoundError(f"No policy checkpoint at {str(path)!r}: the path does not exist.")
    if directory.is_file():
        if directory.name != SPEC_FILE:
            raise CheckpointFormatError(
                f"{str(path)!r} is a file, but a policy checkpoint is a directory holding {SPEC_FILE} and "
                f"{WEIGHTS_FILE} (written by torchrl.render.save_policy_checkpoint). Pickled models and "
                f"bare torch.save files are not loaded: they could run arbitrary code."
            )
        directory = directory.parent
    spec = _read_spec(directory)
    policy = _build_policy(spec, directory / SPEC_FILE)
    state_dict = _load_weights(spec, directory)
    try:
        policy.load_state_dict(state_dict)
    except RuntimeError as err:
        raise CheckpointFormatError(
            f"The weights in {str(directory)!r} do not fit the architecture described in {SPEC_FILE}: {err}"
        ) from None
    policy.eval()
    return PolicyCheckpoint(
        policy=policy,
        env_id=spec["env_id"],
        metadata=spec["metadata"],
        path=directory,
        version=spec["version"],
    )
