"""MinariExperienceReplay over local Minari datasets (hdf5 and arrow).

A Minari dataset ``<namespace>/<name>`` lives in Minari's cache (``$MINARI_DATASETS_PATH``, else
``~/.minari/datasets``) as ``<id>/data/``: ``main_data.hdf5`` (format ``hdf5``) or one directory of Arrow files per
episode (format ``arrow``), plus ``metadata.json``. It is converted once into memory-mapped TED rows under
``root/<id>`` (with ``env_metadata.json``) and re-opened from there; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tensordict import TensorDict

from torchrl._phrases import TorchRLPhrase
from torchrl.data.datasets._files import remove_converted, write_atomically
from torchrl.data.datasets._minari_arrow import episode_ids as arrow_episode_ids
from torchrl.data.datasets._minari_arrow import read_episodes as read_arrow_episodes
from torchrl.data.datasets._minari_hdf5 import MAIN_FILE as HDF5_MAIN_FILE
from torchrl.data.datasets._minari_hdf5 import episode_ids as hdf5_episode_ids
from torchrl.data.datasets._minari_hdf5 import read_episodes as read_hdf5_episodes
from torchrl.data.datasets._minari_spaces import parse_space
from torchrl.data.datasets._minari_ted import episodes_to_td
from torchrl.data.datasets._split import split_by_done
from torchrl.data.datasets.common import BaseDatasetExperienceReplay
from torchrl.data.replay_buffers.storages import TensorStorage

MINARI_LOCAL_MISSING = TorchRLPhrase(
    FileNotFoundError,
    "does not exist in local Minari cache!",
    "Dataset {dataset_id!r} does not exist in local Minari cache! Looked in {path} (the directory "
    "$MINARI_DATASETS_PATH names, else ~/.minari/datasets). Point MINARI_DATASETS_PATH at the directory that "
    "holds <namespace>/<name>/data/, or pass the right dataset_id.",
)

__all__ = ["MinariExperienceReplay"]

_METADATA_FILE = "env_metadata.json"
_SPACE_KEYS = ("observation_space", "action_space", "env_spec", "eval_env_spec")


def minari_cache_dir() -> Path:
    """Minari's local dataset directory: ``$MINARI_DATASETS_PATH``, else ``~/.minari/datasets``."""
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env).expanduser() if env else Path("~/.minari/datasets").expanduser()


def local_dataset_ids(cache: Path | None = None) -> list[str]:
    """The ids of the Minari datasets in Minari's local cache (``cache``, default :func:`minari_cache_dir`):
    each directory that holds ``data/metadata.json``, as ``<namespace>/<name>``, sorted."""
    cache = minari_cache_dir() if cache is None else Path(cache)
    if not cache.is_dir():
        return []
    found = {meta.parent.parent.relative_to(cache).as_posix() for meta in cache.rglob("data/metadata.json")}
    return sorted(found)


class _ClassProperty:
    """A read-only property of the class itself (TorchRL's ``_classproperty``): ``Cls.name`` calls ``fget(Cls)``."""

    def __init__(self, fget):
        self.fget = fget
        self.__doc__ = fget.__doc__

    def __get__(self, obj, owner=None):
        return self.fget(owner if owner is not None else type(obj))


def _check_dataset_id(dataset_id) -> str:
    if not isinstance(dataset_id, str) or not dataset_id.strip():
        raise TypeError(
            f"`dataset_id` must be a non-empty str such as 'D4RL/door/human-v2', got {dataset_id!r}."
        )
    parts = Path(dataset_id).parts
    if Path(dataset_id).is_absolute() or ".." in parts:
        raise ValueError(
            f"`dataset_id` must be a relative Minari id such as 'D4RL/door/human-v2', got {dataset_id!r}."
        )
    return dataset_id


def _check_download(download):
    if download not in (True, False, "force") or not isinstance(download, (bool, str)):
        raise ValueError(f"`download` must be True, False or 'force', got {download!r}.")
    return download


class MinariExperienceReplay(BaseDatasetExperienceReplay):
    """A Minari dataset as a read-only replay buffer of TED transitions.

    Why: Minari is the Farama format for offline RL datasets (D4RL's successor). This class reads a Minari
    dataset from Minari's local cache, in either of its formats (``hdf5`` or ``arrow``), converts its
    episodes into rows (one per step) of memory-mapped tensors under ``root`` once, and re-opens them from
    there, so the buffer starts fast, can exceed memory, and DataLoader workers share the files.

    Rows follow TorchRL's mapping: ``"observation"`` and ``("next", "observation")`` (the observation after the
    step; Dict spaces stay nested), ``"action"``, ``("next", "reward")`` ``[N, 1]``, ``("next", "terminated")``,
    ``("next", "truncated")``, ``("next", "done")`` (their or) ``[N, 1]`` bool, ``"episode"`` (the episode id),
    ``"info"`` / ``("next", "info")`` (shifted like observations), in episode-id order.

    The source is checked before anything is converted: a dataset whose episodes or steps disagree with its
    ``metadata.json`` (``total_episodes``, ``total_steps``: an episode missing) raises ``RuntimeError`` naming the
    missing episodes; an HDF5 file whose links or virtual datasets read files outside its directory, an episode
    directory linked from elsewhere, and damaged content (metadata that is no JSON, values that do not fill their
    space's shape) raise ``ValueError`` naming the file and the field.

    Args:
        dataset_id (str): the Minari id, e.g. ``"D4RL/door/human-v2"`` (directories nest under ``root``).
        batch_size (int): the default ``sample()`` size.

    Keyword Args:
        root (str or os.PathLike, optional): where the converted dataset is kept (created). Defaults to
            ``None``: ``~/.cache/torchrl/minari``.
        download (bool or str): ``True`` converts the dataset if it is not under ``root`` yet, reading it from
            Minari's local cache (nothing is downloaded: a dataset absent from the cache raises an error that
            says how to get it); ``"force"`` deletes the converted copy and converts again; ``False`` only
            opens a converted copy. Defaults to ``True``.
        sampler (Sampler, optional): Defaults to ``None``: :class:`~torchrl.data.RandomSampler`.
        writer (Writer, optional): Defaults to ``None``: :class:`~torchrl.data.ImmutableDatasetWriter`.
        collate_fn (Callable, optional): Defaults to ``None``.
        pin_memory (bool): Defaults to ``False``.
        prefetch (int, optional): Defaults to ``None``.
        transform (Transform, optional): Defaults to ``None``.
        split_trajs (bool): store one row per episode (``[num_episodes, max_len]``, zero-padded, with
            ``"mask"`` and ``"traj_ids"``) under ``root/<id>_split``. Defaults to ``False``.
        load_from_local_minari (bool): convert again from Minari's local cache (``$MINARI_DATASETS_PATH``,
            else ``~/.minari/datasets``), even when a converted copy exists. Defaults to ``False``.

    Attributes:
        metadata (dict): Minari's ``metadata.json`` (``total_episodes``, ``total_steps``, ``data_format``,
            ...), with ``observation_space``, ``action_space`` and ``env_spec`` as dicts (Minari's serialized
            spaces, e.g. ``{"type": "Box", "shape": [4], ...}``; TorchRL gives TorchRL specs there).

    Examples:
        >>> import os, pathlib, tempfile
        >>> import torchrl
        >>> from torchrl.data.datasets import MinariExperienceReplay
        >>> repo = pathlib.Path(torchrl.__file__).resolve().parents[1]
        >>> os.environ["MINARI_DATASETS_PATH"] = str(repo / "test" / "datasets" / "data" / "minari_datasets")
        >>> ds = MinariExperienceReplay("cartpole/random-arrow-v0", batch_size=8, root=tempfile.mkdtemp())
        >>> len(ds), ds.metadata["data_format"], ds.metadata["action_space"]["type"]
        (46, 'arrow', 'Discrete')
        >>> sample = ds.sample()
        >>> sample["observation"].shape, sample["next", "done"].shape
        (torch.Size([8, 4]), torch.Size([8, 1]))
        >>> del os.environ["MINARI_DATASETS_PATH"]
    """

    def __init__(
        self,
        dataset_id: str,
        batch_size: int,
        *,
        root: str | os.PathLike | None = None,
        download: bool | str = True,
        sampler=None,
        writer=None,
        collate_fn=None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform=None,
        split_trajs: bool = False,
        load_from_local_minari: bool = False,
    ) -> None:
        self.dataset_id = _check_dataset_id(dataset_id)
        download = _check_download(download)
        for name, value in (("split_trajs", split_trajs), ("load_from_local_minari", load_from_local_minari)):
            if not isinstance(value, bool):
                raise TypeError(f"`{name}` must be a bool, got {value!r}.")
        self.split_trajs = split_trajs
        self.load_from_local_minari = load_from_local_minari
        self.root = Path("~/.cache/torchrl/minari").expanduser() if root is None else root
        self.root.mkdir(parents=True, exist_ok=True)
        if download == "force" or load_from_local_minari or (download and not self._is_downloaded()):
            self._convert(self._local_source(required=load_from_local_minari or download == "force"))
        elif not self._is_downloaded():
            raise FileNotFoundError(
                f"Minari dataset {dataset_id!r} was not converted under root={str(self.root)!r} and "
                f"download=False. Pass download=True (or load_from_local_minari=True) to convert it from Minari's "
                f"local cache ({minari_cache_dir()})."
            )
        if split_trajs and not self.data_path.exists():
            write_atomically(self.data_path, split_by_done(TensorDict.load_memmap(self.data_path_root)))
        self.metadata = _read_metadata(self.metadata_path)
        storage = TensorStorage(TensorDict.load_memmap(self.data_path))
        super().__init__(
            storage=storage, sampler=sampler, writer=writer, collate_fn=collate_fn, pin_memory=pin_memory,
            prefetch=prefetch, transform=transform, batch_size=batch_size,
        )  # fmt: skip

    # -- paths ----------------------------------------------------------------------------------------------
    @property
    def data_path_root(self) -> Path:
        """``root/<dataset_id>``: the converted rows and ``env_metadata.json``."""
        return self.root / self.dataset_id

    @property
    def data_path(self) -> Path:
        """``root/<dataset_id>_split`` when ``split_trajs``, else :attr:`data_path_root`."""
        if self.split_trajs:
            return self.root / (self.dataset_id + "_split")
        return self.data_path_root

    @_ClassProperty
    def available_datasets(cls) -> list[str]:
        """The ids of the datasets this class can open: those in Minari's local cache (``$MINARI_DATASETS_PATH``,
        else ``~/.minari/datasets``), sorted. TorchRL lists Minari's remote datasets here; this package works
        without network access, so it lists what can be converted from the local cache (``minari download <id>``
        adds one).

        Examples:
            >>> import os, pathlib
            >>> import torchrl
            >>> from torchrl.data.datasets import MinariExperienceReplay
            >>> repo = pathlib.Path(torchrl.__file__).resolve().parents[1]
            >>> os.environ["MINARI_DATASETS_PATH"] = str(repo / "test" / "datasets" / "data" / "minari_datasets")
            >>> "cartpole/random-arrow-v0" in MinariExperienceReplay.available_datasets
            True
            >>> del os.environ["MINARI_DATASETS_PATH"]
        """
        return local_dataset_ids()

    @property
    def metadata_path(self) -> Path:
        """``root/<dataset_id>/env_metadata.json``."""
        return self.data_path_root / _METADATA_FILE

    def _is_downloaded(self) -> bool:
        return self.data_path_root.exists()

    # -- conversion -----------------------------------------------------------------------------------------
    def _local_source(self, *, required: bool) -> Path:
        """The ``data`` directory of the dataset in Minari's local cache (errors say how to get it there)."""
        cache = minari_cache_dir()
        data_dir = cache / self.dataset_id / "data"
        if (data_dir / "metadata.json").exists():
            return data_dir
        if required:
            raise MINARI_LOCAL_MISSING.error(dataset_id=self.dataset_id, path=str(data_dir))
        raise RuntimeError(
            f"Minari dataset {self.dataset_id!r} is neither converted under root={str(self.root)!r} nor in "
            f"Minari's local cache ({data_dir}), and this package does not download datasets (no network "
            f"access). Get it with Minari (`minari download {self.dataset_id}`, which writes to "
            f"$MINARI_DATASETS_PATH, else ~/.minari/datasets), or set MINARI_DATASETS_PATH to the directory that "
            f"holds it, then build again with load_from_local_minari=True (or download=True)."
        )

    def _convert(self, data_dir: Path) -> None:
        metadata = _read_json(data_dir / "metadata.json")
        fmt = metadata.get("data_format") or ("hdf5" if (data_dir / HDF5_MAIN_FILE).exists() else "arrow")
        formats = {"hdf5": (read_hdf5_episodes, hdf5_episode_ids), "arrow": (read_arrow_episodes, arrow_episode_ids)}
        if fmt not in formats:
            raise ValueError(
                f"Minari dataset {self.dataset_id!r} is in the {fmt!r} format; this package reads 'hdf5' and "
                f"'arrow'. Convert it with Minari to one of them."
            )
        read, list_ids = formats[fmt]
        source = data_dir / HDF5_MAIN_FILE if fmt == "hdf5" else data_dir
        _check_episodes(metadata, list_ids(data_dir), data_dir, source, fmt)
        rows = episodes_to_td(read(data_dir, metadata), f"Minari dataset {self.dataset_id!r}")
        _check_steps(metadata, rows.shape[0], data_dir)
        for path in (self.data_path_root, self.root / (self.dataset_id + "_split")):
            remove_converted(path)
        write_atomically(self.data_path_root, rows, sidecars={_METADATA_FILE: metadata})


def _read_json(path: Path) -> dict:
    """The JSON object in ``path``; a ``ValueError`` naming the file for anything else."""
    try:
        with open(path, encoding="utf-8") as file:
            content = json.load(file)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, bad UTF-8; nesting beyond the recursion limit
        raise ValueError(
            f"The Minari metadata file {str(path)!r} is not readable JSON ({type(err).__name__}: {str(err)[:160]}). "
            f"Write the dataset again with Minari (or download it again)."
        ) from None
    if not isinstance(content, dict):
        raise ValueError(
            f"The Minari metadata file {str(path)!r} holds a JSON {type(content).__name__}, expected an object "
            f"(total_episodes, total_steps, data_format, ...). Write the dataset again with Minari."
        )
    return content


def _count_field(metadata: dict, field: str, data_dir: Path) -> int | None:
    """``metadata[field]`` (an int >= 0), ``None`` when absent; a ``ValueError`` naming it otherwise."""
    value = metadata.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"The Minari metadata file {str(data_dir / 'metadata.json')!r} has `{field}` = {value!r:.80}, expected "
            f"an int >= 0. Write the dataset again with Minari (or download it again)."
        )
    return value


def _check_episodes(metadata: dict, ids: list[int], data_dir: Path, source: Path, fmt: str) -> None:
    """Raises ``RuntimeError`` naming the missing episodes when the dataset does not hold episodes
    ``0 .. total_episodes - 1`` (the ids Minari gives), as its ``metadata.json`` says."""
    total = _count_field(metadata, "total_episodes", data_dir)
    if total is None or ids == list(range(total)):
        return
    missing = sorted(set(range(total)) - set(ids))
    extra = sorted(set(ids) - set(range(total)))
    where = "a group episode_<id> in" if fmt == "hdf5" else "a directory <id> in"
    problems = []
    if missing:
        problems.append(f"episode(s) {missing[:10]}{' ...' if len(missing) > 10 else ''} missing ({where} "
                        f"{str(source)!r})")  # fmt: skip
    if extra:
        problems.append(f"episode(s) {extra[:10]}{' ...' if len(extra) > 10 else ''} beyond that count")
    raise RuntimeError(
        f"The Minari dataset {str(data_dir)!r} is incomplete: its metadata.json gives total_episodes={total}, and "
        f"{'; '.join(problems)}. Download the dataset again (minari download <id>) or write it again with Minari; "
        f"nothing was converted."
    )


def _check_steps(metadata: dict, steps: int, data_dir: Path) -> None:
    """Raises ``RuntimeError`` when the episodes read hold another number of steps than ``total_steps``."""
    total = _count_field(metadata, "total_steps", data_dir)
    if total is not None and total != steps:
        raise RuntimeError(
            f"The Minari dataset {str(data_dir)!r} is incomplete: its metadata.json gives total_steps={total}, and "
            f"its episodes hold {steps} steps. Download the dataset again (minari download <id>) or write it again "
            f"with Minari; nothing was converted."
        )


def _read_metadata(path: Path) -> dict:
    if not path.exists():
        return {}
    metadata = _read_json(path)
    for key in _SPACE_KEYS:
        if isinstance(metadata.get(key), str):
            metadata[key] = parse_space(metadata[key], f"`{key}` of {str(path)!r}")
    return metadata
