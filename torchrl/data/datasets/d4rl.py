"""D4RLExperienceReplay over local D4RL-layout HDF5 files.

A D4RL file holds flat per-step datasets: ``observations``, ``actions``, ``rewards``, ``terminals``,
``timeouts``, optionally ``next_observations``, ``infos/<name>`` and ``metadata/<name>``. It is converted once
into memory-mapped TED rows under ``root/<dataset_id>`` (with ``d4rl_metadata.json``) and re-opened from there;
nothing is downloaded and the ``d4rl`` package is not needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl.data.datasets._files import remove_converted, write_atomically
from torchrl.data.datasets._hdf5_safety import check_links
from torchrl.data.datasets._split import split_by_done
from torchrl.data.datasets.common import BaseDatasetExperienceReplay
from torchrl.data.replay_buffers.storages import TensorStorage

D4RL_NOT_FOUND = TorchRLPhrase(
    RuntimeError,
    "The dataset could not be found in",
    "The dataset could not be found in {path} and download=False. Put the D4RL HDF5 file at {file} (or pass "
    "path=<file>), or pass download=True to convert a file given with path=.",
)
D4RL_IMPORT = TorchRLPhrase(
    ImportError,
    "Could not import d4rl",
    "Could not import d4rl, which {why} needs. This package reads D4RL's HDF5 files without d4rl: pass "
    "path=<file.hdf5> (or put the file at root/<dataset_id>.hdf5) and from_env=False.",
)

__all__ = ["D4RLExperienceReplay"]

_METADATA_FILE = "d4rl_metadata.json"
_CONVERSION_FILE = "torchrl_conversion.json"  # the options the rows were converted with
_RENAMED = {
    "observations": "observation",
    "actions": "action",
    "rewards": "reward",
    "terminals": "terminated",
    "timeouts": "truncated",
}
_FLAGS = ("reward", "done", "terminated", "truncated")


class D4RLExperienceReplay(BaseDatasetExperienceReplay):
    """A D4RL dataset (an HDF5 file in D4RL's layout) as a read-only replay buffer of TED transitions.

    Why: D4RL's HDF5 files (MuJoCo locomotion, AntMaze, Adroit, Kitchen) are what most offline RL papers
    report on, and the ``d4rl`` package that reads them no longer installs with current gym. This class reads
    the file with h5py, converts it once into memory-mapped rows under ``root`` and re-opens them from there.

    The file is ``path`` if given, else ``root/<dataset_id>.hdf5``. Rows follow TorchRL's mapping:
    ``observations`` -> ``"observation"``, ``actions`` -> ``"action"``, ``("next", "reward")`` ``[N, 1]``,
    ``terminals`` -> ``("next", "terminated")``, ``timeouts`` -> ``("next", "truncated")``, ``("next", "done")``
    (their or, or ``terminated`` alone with ``use_truncated_as_done=False``), ``infos/*`` -> ``"info"``;
    ``("next", "observation")`` is ``next_observations`` when the file has it, else the next row's observation,
    zeroed where ``("next", "done")``; the last row is dropped (it has no successor). As in TorchRL, the root
    ``reward`` / ``done`` / ``terminated`` / ``truncated`` hold the previous row's values (zero on row 0).
    ``metadata/*`` goes to :attr:`metadata`.

    Args:
        dataset_id (str): the dataset's name, e.g. ``"hopper-medium-v2"``.
        batch_size (int): the default ``sample()`` size.
        sampler (Sampler, optional): Defaults to ``None``: :class:`~torchrl.data.RandomSampler`.
        writer (Writer, optional): Defaults to ``None``: :class:`~torchrl.data.ImmutableDatasetWriter`.
        collate_fn (Callable, optional): Defaults to ``None``.
        pin_memory (bool): Defaults to ``False``.
        prefetch (int, optional): Defaults to ``None``.
        transform (Transform, optional): Defaults to ``None``.
        split_trajs (bool): store one row per trajectory (``[num_trajectories, max_len]``, zero-padded, with
            ``"mask"`` and ``"traj_ids"``; ``("next", "done")`` set on the last column, as TorchRL does).
            Defaults to ``False``.
        from_env (bool): read the data through ``d4rl``'s environment (not supported here: raises).
            Defaults to ``False``.
        use_truncated_as_done (bool): whether ``timeouts`` count as done. Defaults to ``True``.
        direct_download (bool, optional): TorchRL's switch between its two download routes; here ``False``
            raises (it needs ``d4rl``). Defaults to ``None``.
        terminate_on_end (bool, optional): accepted for TorchRL compatibility; ``False`` raises as in
            TorchRL's direct route. Defaults to ``None``.
        download (bool or str): ``True`` converts the local file if the dataset is not converted yet;
            ``"force"`` converts again; ``False`` only opens a converted copy. Nothing is downloaded.
            Defaults to ``True``.
        root (str or os.PathLike, optional): where the converted dataset is kept. Defaults to ``None``:
            ``~/.cache/torchrl/d4rl``.

    Keyword Args:
        path (str or os.PathLike, optional): the D4RL HDF5 file to convert. Defaults to ``None``:
            ``root/<dataset_id>.hdf5``.
        **env_kwargs: TorchRL's arguments of the d4rl environment route; refused here.

    Attributes:
        metadata (dict): the file's ``metadata/*`` entries (``{}`` if none).
        specs: ``None`` (no environment is built).

    Examples:
        >>> import tempfile, h5py, numpy as np
        >>> from pathlib import Path
        >>> from torchrl.data.datasets import D4RLExperienceReplay
        >>> root = Path(tempfile.mkdtemp())
        >>> with h5py.File(root / "toy-v0.hdf5", "w") as f:
        ...     f["observations"] = np.arange(12, dtype=np.float32).reshape(6, 2)
        ...     f["actions"] = np.zeros((6, 1), dtype=np.float32)
        ...     f["rewards"] = np.ones(6, dtype=np.float32)
        ...     f["terminals"] = np.array([0, 0, 1, 0, 0, 0], dtype=bool)
        ...     f["timeouts"] = np.array([0, 0, 0, 0, 0, 1], dtype=bool)
        >>> ds = D4RLExperienceReplay("toy-v0", batch_size=4, root=root)
        >>> len(ds), ds[0]["next", "observation"].tolist()
        (5, [2.0, 3.0])
    """

    def __init__(
        self,
        dataset_id: str,
        batch_size: int,
        sampler=None,
        writer=None,
        collate_fn=None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform=None,
        split_trajs: bool = False,
        from_env: bool = False,
        use_truncated_as_done: bool = True,
        direct_download: bool | None = None,
        terminate_on_end: bool | None = None,
        download: bool | str = True,
        root: str | os.PathLike | None = None,
        *,
        path: str | os.PathLike | None = None,
        **env_kwargs,
    ) -> None:
        if not isinstance(dataset_id, str) or not dataset_id.strip() or Path(dataset_id).is_absolute():
            raise TypeError(
                f"`dataset_id` must be a non-empty relative name such as 'hopper-medium-v2', got {dataset_id!r}."
            )
        if ".." in Path(dataset_id).parts:
            raise ValueError(f"`dataset_id` must not contain '..', got {dataset_id!r}.")
        if download not in (True, False, "force") or not isinstance(download, (bool, str)):
            raise ValueError(f"`download` must be True, False or 'force', got {download!r}.")
        for name, value in (("split_trajs", split_trajs), ("from_env", from_env),
                            ("use_truncated_as_done", use_truncated_as_done)):  # fmt: skip
            if not isinstance(value, bool):
                raise TypeError(f"`{name}` must be a bool, got {value!r}.")
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"`path` must be the path of a D4RL HDF5 file (str or os.PathLike), got {path!r}."
            )
        # TorchRL picks its d4rl route when d4rl is importable and direct_download is None; the file route is
        # the only one here, so None means the file route whatever is installed
        if from_env or direct_download is False:
            why = "from_env=True" if from_env else "direct_download=False"
            if importlib.util.find_spec("d4rl") is None:
                raise D4RL_IMPORT.error(why=why)
            raise RuntimeError(
                f"{why} reads the data through d4rl's environment, which this package does not do. Pass "
                f"path=<file.hdf5> (or put the file at root/<dataset_id>.hdf5) with from_env=False."
            )
        if env_kwargs:
            raise RuntimeError(
                f"Environment keyword arguments ({sorted(env_kwargs)}) only apply to d4rl's environment route, "
                f"which this package does not provide; remove them."
            )
        if terminate_on_end is False:
            raise ValueError(
                "terminate_on_end=False is not supported when reading D4RL files directly (every stored "
                "transition is kept, as with terminate_on_end=True). Leave terminate_on_end out."
            )
        self.dataset_id = dataset_id
        self.split_trajs = split_trajs
        self.use_truncated_as_done = use_truncated_as_done
        self.from_env = from_env
        self.specs = None
        self.root = Path("~/.cache/torchrl/d4rl").expanduser() if root is None else root
        self.source_path = Path(path) if path is not None else self.root / f"{dataset_id}.hdf5"
        if download == "force" or (download and not self._is_downloaded()):
            self._convert()
        elif not self._is_downloaded():
            raise D4RL_NOT_FOUND.error(path=str(self.data_path), file=str(self.source_path))
        self._check_conversion()
        with open(self.data_path / _METADATA_FILE, encoding="utf-8") as file:
            self.metadata = json.load(file)
        super().__init__(
            storage=TensorStorage(TensorDict.load_memmap(self.data_path)), sampler=sampler, writer=writer,
            collate_fn=collate_fn, pin_memory=pin_memory, prefetch=prefetch, transform=transform,
            batch_size=batch_size,
        )  # fmt: skip

    @property
    def data_path_root(self) -> Path:
        """``root/<dataset_id>``."""
        return self.root / self.dataset_id

    @property
    def data_path(self) -> Path:
        """``root/<dataset_id>`` (as :attr:`data_path_root`; a split dataset replaces the flat one there)."""
        return self.data_path_root

    def _is_downloaded(self) -> bool:
        return self.data_path_root.exists()

    def _check_conversion(self) -> None:
        """Refuses a converted copy built with other ``split_trajs`` / ``use_truncated_as_done`` (same directory)."""
        path = self.data_path / _CONVERSION_FILE
        if not path.exists():
            return
        with open(path, encoding="utf-8") as file:
            saved = json.load(file)
        asked = {"split_trajs": self.split_trajs, "use_truncated_as_done": self.use_truncated_as_done}
        differ = {k: (saved.get(k), v) for k, v in asked.items() if saved.get(k, v) != v}
        if differ:
            shown = ", ".join(f"{k}={old!r} (asked {new!r})" for k, (old, new) in differ.items())
            raise ValueError(
                f"The converted copy of {self.dataset_id!r} at {str(self.data_path)!r} was built with {shown}. "
                f"Pass download='force' to convert it again with the new options, or the options it was built with."
            )

    def _convert(self) -> None:
        if not self.source_path.is_file():
            raise RuntimeError(
                f"D4RL dataset {self.dataset_id!r} is not converted under root={str(self.root)!r} and its HDF5 "
                f"file {str(self.source_path)!r} does not exist. This package does not download datasets (no "
                f"network access): download the file from D4RL yourself, then pass path=<file.hdf5> or put it "
                f"at root/<dataset_id>.hdf5."
            )
        rows, metadata = read_d4rl_file(self.source_path, use_truncated_as_done=self.use_truncated_as_done)
        if self.split_trajs:
            rows = split_by_done(rows)
            rows["next", "done"][:, -1] = True
        remove_converted(self.data_path)
        conversion = {"split_trajs": self.split_trajs, "use_truncated_as_done": self.use_truncated_as_done}
        write_atomically(
            self.data_path, rows, sidecars={_METADATA_FILE: metadata, _CONVERSION_FILE: conversion}
        )


def _h5py():
    try:
        import h5py
    except ImportError as err:
        raise ImportError("Reading a D4RL file needs h5py: pip install h5py (the 'h5' extra).") from err
    return h5py


def _json_value(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        return [_json_value(v) for v in value.tolist()] if value.dtype.kind in "OS" else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def read_d4rl_file(path: Path, *, use_truncated_as_done: bool = True) -> tuple[TensorDictBase, dict]:
    """The TED rows of a D4RL HDF5 file and its ``metadata/*`` entries (see :class:`D4RLExperienceReplay`)."""
    h5py = _h5py()
    flat: dict[str, np.ndarray] = {}
    metadata: dict = {}
    try:
        opened = h5py.File(path, "r")
    except OSError as err:
        raise ValueError(
            f"{str(path)!r} is not a readable HDF5 file ({err}): download the D4RL file again."
        ) from err
    with opened as file:
        check_links(file, Path(path), h5py)

        def visit(name, node):
            if isinstance(node, h5py.Dataset):
                try:
                    values = node[()]
                except (OSError, ValueError, TypeError) as err:  # damaged chunks, an unreadable dtype
                    raise ValueError(
                        f"The dataset {name!r} of {str(path)!r} cannot be read ({type(err).__name__}: {err}): the "
                        f"file is damaged; download the D4RL file again."
                    ) from err
                if name.startswith("metadata/"):
                    metadata[name[len("metadata/") :]] = _json_value(values)
                else:
                    flat[name] = values

        file.visititems(visit)
    missing = [k for k in ("observations", "actions", "rewards", "terminals") if k not in flat]
    if missing:
        raise KeyError(
            f"{str(path)!r} is not a D4RL file: it has no {missing} dataset(s); found {sorted(flat)}."
        )
    n = len(flat["observations"])
    for name, values in flat.items():
        if values.ndim == 0 or len(values) != n:
            raise RuntimeError(
                f"Dataset {name!r} of {str(path)!r} has {len(values) if values.ndim else 0} entries, expected {n} "
                f"(one per step, as 'observations')."
            )
    if n < 2:
        raise RuntimeError(
            f"{str(path)!r} holds {n} step(s): at least 2 are needed (the last one is dropped)."
        )
    data = TensorDict({}, batch_size=[n])
    next_obs = None
    for name, values in flat.items():
        tensor = torch.from_numpy(np.array(values, copy=True))
        if name == "next_observations":
            next_obs = tensor
            continue
        key = _RENAMED.get(name, name)
        if key.startswith("infos/"):
            key = ("info", *key[len("infos/") :].split("/"))
        elif "/" in key:
            key = tuple(key.split("/"))
        if key in ("terminated", "truncated"):
            tensor = tensor.bool()
        if key in _FLAGS:
            tensor = tensor.reshape(n, 1)
        data.set(key, tensor)
    terminated = data.get("terminated")
    truncated = data.get("truncated", torch.zeros_like(terminated))
    data.set("done", terminated | truncated if use_truncated_as_done else terminated.clone())
    nxt = TensorDict({}, batch_size=[n])
    for key in _FLAGS:
        if key in data.keys():
            nxt.set(key, data.get(key).clone())
            shifted = torch.zeros_like(data.get(key))
            shifted[1:] = data.get(key)[:-1]
            data.set(key, shifted)  # TorchRL's root flags: the previous row's (Odd, kept for compatibility)
    obs = data.get("observation")
    nxt.set(
        "observation", next_obs if next_obs is not None else torch.cat([obs[1:], torch.zeros_like(obs[:1])])
    )
    if "info" in data.keys():
        info = data.get("info")
        nxt.set("info", torch.cat([info[1:], torch.zeros_like(info[:1])]))
    done = nxt.get("done").reshape(n, *([1] * (obs.ndim - 1)))
    nxt.set(
        "observation", torch.where(done, torch.zeros_like(nxt.get("observation")), nxt.get("observation"))
    )
    data.set("next", nxt)
    return data[:-1].clone(), metadata
