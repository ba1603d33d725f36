"""LeRobotExperienceReplay over LeRobot v3.0 datasets, and ``lerobot_columns_to_tensordict``.

Data model: one row per frame, keys as TorchRL maps LeRobot's columns (``observation.state`` ->
``("observation", "state")``, ``observation.images.<cam>`` -> ``("observation", "image", <cam>)``,
``episode_index`` -> ``"episode"``, ``frame_index`` -> ``"frame"``, the task text -> ``"language_instruction"``,
``next.reward`` / ``next.done`` -> ``("next", ...)`` of shape ``[N, 1]``; see
:mod:`~torchrl.data.replay_buffers.hf.lerobot_reader`). A dataset directory (a Hub snapshot, or any local v3.0
directory) is converted once into memory-mapped files at ``root/<repo_id with "/" -> "_">`` and re-opened from
there; ``lerobot_source.json`` beside them records the source files, so a changed local source is converted anew.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl.data.datasets.common import BaseDatasetExperienceReplay
from torchrl.data.replay_buffers.hf.lerobot import is_lerobot_dir
from torchrl.data.replay_buffers.hf.lerobot_reader import TASK_COLUMN, LeRobotDirectory, lerobot_key
from torchrl.data.replay_buffers.samplers.slice import SliceSampler
from torchrl.data.replay_buffers.storages import TensorStorage

LEROBOT_SLICES_BOTH = TorchRLPhrase(
    ValueError,
    "num_slices or slice_len can be passed, but not both.",
    "num_slices or slice_len can be passed, but not both. Got num_slices={num_slices!r} and "
    "slice_len={slice_len!r}: pass the number of slices per batch or the length of each slice.",
)
LEROBOT_NOT_FOUND = TorchRLPhrase(
    RuntimeError,
    "Dataset .* not found at",
    "Dataset {repo_id!r} not found at {path} and download=False. Pass download=True to convert it (from the "
    "Hub, or from a local LeRobot directory with LeRobotExperienceReplay.from_local(path)).",
)
LEROBOT_MIXED_STRINGS = TorchRLPhrase(
    ValueError,
    "mixes strings",
    "Column {column!r} mixes strings and other values: a column holds one kind of value per frame (all str "
    "for text, all numbers otherwise).",
)

__all__ = ["LeRobotExperienceReplay", "lerobot_columns_to_tensordict"]

_SOURCE_FILE = "lerobot_source.json"
_INFO_FILE = "lerobot_info.json"
_SCHEMA_VERSION = 1


def _default_root() -> Path:
    return Path("~/.cache/torchrl/lerobot").expanduser()


# -- columns -> TensorDict ------------------------------------------------------------------------------------------
def _column_values(name: str, values):
    """A tensor ``[N, ...]`` or a NonTensorStack of ``N`` strings from one column's values."""
    if isinstance(values, torch.Tensor):
        return values
    if isinstance(values, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(values))
    if isinstance(values, NonTensorStack):
        return values
    if isinstance(values, (list, tuple)):
        strings = [isinstance(v, str) for v in values]
        if values and all(strings):
            return NonTensorStack.from_list(list(values))
        if any(strings):
            raise LEROBOT_MIXED_STRINGS.error(column=name)
        try:
            return torch.as_tensor(np.asarray(values))
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"Column {name!r} holds values that make no tensor ({err}): pass a tensor, an array, a list of "
                f"numbers (or of equal-length lists) or a list of str."
            ) from None
    raise TypeError(
        f"Column {name!r} holds a {type(values).__name__}: pass a tensor, a numpy array, a list of numbers or a "
        f"list of str."
    )


def lerobot_columns_to_tensordict(
    columns: Mapping, *, key_map: Mapping | None = None, tasks=None
) -> TensorDict:
    """LeRobot-style columns (name -> values of every frame) as a TensorDict with TorchRL's keys.

    Why: LeRobot's datasets, and code written around them, hold frames as named columns; a replay buffer holds
    nested TensorDict keys. This is the mapping TorchRL's ``LeRobotExperienceReplay`` applies (see the module
    docstring): ``observation.state`` -> ``("observation", "state")``, ``observation.images.<cam>`` ->
    ``("observation", "image", <cam>)``, ``episode_index`` -> ``"episode"``, ``frame_index`` -> ``"frame"``,
    ``task`` -> ``"language_instruction"`` (strings, as a ``NonTensorStack``), other dotted names nest, plain names
    stay. One-dimensional tensors under ``"next"`` get a trailing dim (``[N, 1]``); ``"episode"`` stays ``[N]``.

    Args:
        columns (Mapping[str, tensor, array or list]): each column's values, one per frame (tensors, numpy arrays,
            lists of numbers or lists of str).

    Keyword Args:
        key_map (Mapping[str, key], optional): column -> key overrides and additions (a str key is split on
            ``"."``). Defaults to ``None``.
        tasks (Mapping[int, str] or Sequence[str], optional): the task table: when there is no ``task`` column,
            ``task_index`` is resolved to its text (``"language_instruction"``). Defaults to ``None``.

    Returns:
        TensorDict: batch size ``[N]``, the number of frames (taken from the first column).

    Raises:
        ValueError: no column, columns of different lengths, or a list mixing strings and other values.
        TypeError: a column whose values make no tensor.

    Examples:
        >>> import torch
        >>> from torchrl.data.datasets import lerobot_columns_to_tensordict
        >>> td = lerobot_columns_to_tensordict({
        ...     "observation.state": torch.zeros(3, 4), "action": torch.zeros(3, 2),
        ...     "next.reward": torch.tensor([0.0, 0.0, 1.0]), "episode_index": torch.tensor([0, 0, 0]),
        ...     "task": ["push", "push", "push"]})
        >>> td["observation", "state"].shape, td["next", "reward"].shape, td["episode"].shape
        (torch.Size([3, 4]), torch.Size([3, 1]), torch.Size([3]))
        >>> td["language_instruction"][0]
        'push'
    """
    if not isinstance(columns, Mapping):
        raise TypeError(f"`columns` must be a mapping column name -> values, got {type(columns).__name__}.")
    if key_map is not None and not isinstance(key_map, Mapping):
        raise TypeError(f"`key_map` must be a mapping column -> key or None, got {type(key_map).__name__}.")
    values = {name: _column_values(name, v) for name, v in columns.items()}
    if not values:
        raise ValueError("`columns` holds no column: pass at least one (e.g. {'action': tensor}).")
    n = len(next(iter(values.values())))
    for name, v in values.items():
        if len(v) != n:
            raise ValueError(
                f"Column {name!r} has {len(v)} values but the first column has {n}: every column holds one value "
                f"per frame."
            )
    if TASK_COLUMN not in values and tasks is not None and "task_index" in values:
        table = dict(enumerate(tasks)) if not isinstance(tasks, Mapping) else dict(tasks)
        try:
            values[TASK_COLUMN] = NonTensorStack.from_list([table[int(i)] for i in values["task_index"]])
        except KeyError as err:
            raise ValueError(
                f"`task_index` {err.args[0]} is not in `tasks` (it has {sorted(table)})."
            ) from None
    td = TensorDict({}, batch_size=[n])
    for name, v in values.items():
        key = lerobot_key(name, key_map)
        if key[0] == "next" and isinstance(v, torch.Tensor) and v.ndim == 1:
            v = v.unsqueeze(-1)
        if key in _key_set(td):
            raise ValueError(f"Two columns map to the key {key!r}: rename one with `key_map`.")
        td.set(key, v)
    return td


# -- checks -----------------------------------------------------------------------------------------------------
def _check_repo_id(repo_id) -> str:
    if not isinstance(repo_id, str) or not repo_id.strip():
        raise TypeError(f"`repo_id` must be a non-empty str such as 'lerobot/pusht', got {repo_id!r}.")
    if Path(repo_id).is_absolute() or ".." in Path(repo_id).parts:
        raise ValueError(f"`repo_id` must be a Hub id such as 'lerobot/pusht', got {repo_id!r}.")
    return repo_id


def _check_download(download):
    if not isinstance(download, (bool, str)) or download not in (True, False, "force"):
        raise ValueError(f"`download` must be True, False or 'force', got {download!r}.")
    return download


def _check_slices(num_slices, slice_len) -> None:
    if num_slices is not None and slice_len is not None:
        raise LEROBOT_SLICES_BOTH.error(num_slices=num_slices, slice_len=slice_len)


def _fingerprint(source: Path) -> dict:
    """What identifies a source directory's content: its metadata and data files' sizes and times."""
    files = []
    for path in sorted(source.glob("meta/*.json")) + sorted(source.glob("meta/*.parquet")):
        files.append(path)
    files += sorted(source.glob("data/chunk-*/file-*.parquet")) + sorted(source.glob("videos/**/*.mp4"))
    return {str(p.relative_to(source)): [p.stat().st_size, p.stat().st_mtime_ns] for p in files}


def _read_json(path: Path):
    """The JSON in ``path`` (a file of the converted copy); a ``ValueError`` naming the file when it is damaged."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, bad UTF-8; nesting beyond the recursion limit
        raise ValueError(
            f"{str(path)!r} is not readable JSON ({type(err).__name__}: {str(err)[:160]}): the converted copy is "
            f"damaged. Build the dataset again with download='force' to convert it anew."
        ) from None


# -- the dataset ------------------------------------------------------------------------------------------------
class LeRobotExperienceReplay(BaseDatasetExperienceReplay):
    """A LeRobot dataset (format v3.0) as a read-only replay buffer of frames.

    Why: LeRobot's datasets (robot demonstrations with states, actions, camera frames and task texts) train
    imitation and offline-RL policies; this class serves their frames as TensorDict batches, with TorchRL's keys
    (see :func:`lerobot_columns_to_tensordict`), slice sampling along episodes and optional next-state
    reconstruction. The dataset is read once from its directory with pyarrow (LeRobot itself is not needed),
    converted into memory-mapped files at :attr:`data_path` and re-opened from there.

    Where the dataset comes from:

    - ``LeRobotExperienceReplay(repo_id)``: the converted copy under ``root`` if there is one, else the Hub
      snapshot of ``repo_id`` (``huggingface_hub.snapshot_download``; with ``HF_HUB_OFFLINE=1`` only the local Hub
      cache is looked at, and a dataset absent from it raises at once);
    - ``LeRobotExperienceReplay(repo_id, root=<a LeRobot directory>)`` (LeRobot's meaning of ``root``) or
      :meth:`from_local` ``(path)``: a local v3.0 directory, e.g. one written by LeRobot or by
      ``rb.export_hf(path, layout="lerobot")``; no network. The converted copy goes to the default cache root;
    - :meth:`from_columns`: columns already in memory (nothing is written).

    Args:
        repo_id (str): the dataset's Hub id, e.g. ``"lerobot/pusht"``; the converted copy is at
            ``root/<repo_id with "/" replaced by "_">``.

    Keyword Args:
        root (str or os.PathLike, optional): the cache directory of converted datasets, or a LeRobot dataset
            directory to read (see above). Defaults to ``None``: ``~/.cache/torchrl/lerobot``.
        download (bool or str): ``True`` converts the dataset when no converted copy is present (downloading
            a Hub snapshot if needed); ``"force"`` converts it again; ``False`` only opens a converted copy
            (``RuntimeError`` if there is none). Defaults to ``True``.
        batch_size (int, optional): the default ``sample()`` size. Defaults to ``None``.
        num_slices (int, optional): sample ``num_slices`` slices of consecutive frames of one episode per batch
            (a :class:`~torchrl.data.SliceSampler` over ``"episode"``), when no ``sampler`` is given. Defaults to
            ``None``.
        slice_len (int, optional): the same with slices of ``slice_len`` frames (not with ``num_slices``).
            Defaults to ``None``.
        sampler (Sampler, optional): Defaults to ``None``: the slice sampler above, else random sampling.
        writer (Writer, optional): Defaults to ``None``: :class:`~torchrl.data.ImmutableDatasetWriter`.
        collate_fn (Callable, optional): Defaults to ``None``.
        transform (Transform, optional): applied to every sample, after the reconstruction of
            ``rehydrate``. Defaults to ``None``.
        key_map (Mapping[str, key], optional): column -> key overrides of the mapping. Defaults to ``None``.
        decode_video (bool): decode video features into uint8 ``[C, H, W]`` frames at conversion (needs
            ``torchcodec`` or ``av``; without either an ``ImportError`` names them); ``False`` leaves video
            features out. Defaults to ``True``.
        rehydrate (bool): rebuild ``("next", <observation entry>)`` of each sampled frame from the following frame
            of the same episode (:class:`~torchrl.envs.transforms.NextStateReconstructor`; NaN, or 0 for integer
            entries, where there is none). Defaults to ``False``.
        strict_length (bool): the slice sampler's ``strict_length``. Defaults to ``True``.
        pin_memory (bool): Defaults to ``False``.
        prefetch (int, optional): Defaults to ``None``.
        _data (TensorDict, optional): TorchRL's private keyword: frames already in memory (batch size ``[N]``,
            TorchRL's keys), served as they are; nothing is read or written and ``root``/``download`` are not
            used. :meth:`from_columns` passes it. Defaults to ``None``.

    Attributes:
        metadata (dict): the dataset's ``meta/info.json`` (``fps``, ``features``, ``total_episodes``, ...), with
            ``"tasks"``: the task table (task index -> text).

    Examples:
        >>> import pathlib, tempfile
        >>> import torchrl
        >>> from torchrl.data.datasets import LeRobotExperienceReplay
        >>> repo = pathlib.Path(torchrl.__file__).resolve().parents[1]
        >>> fixture = repo / "test" / "datasets" / "data" / "lerobot_v30_cartpole_like"
        >>> ds = LeRobotExperienceReplay.from_local(fixture, root=tempfile.mkdtemp(), batch_size=8, slice_len=4)
        >>> len(ds), ds.metadata["fps"], ds.metadata["tasks"]
        (150, 10, {0: 'push the cube', 1: 'pull the cube'})
        >>> batch = ds.sample()
        >>> batch["observation", "state"].shape, batch["next", "done"].shape
        (torch.Size([8, 4]), torch.Size([8, 1]))
        >>> bool((batch["episode"][:4] == batch["episode"][0]).all())
        True
    """

    def __init__(
        self,
        repo_id: str,
        *,
        root: str | os.PathLike | None = None,
        download: bool | str = True,
        batch_size: int | None = None,
        num_slices: int | None = None,
        slice_len: int | None = None,
        sampler=None,
        writer=None,
        collate_fn=None,
        transform=None,
        key_map: Mapping | None = None,
        decode_video: bool = True,
        rehydrate: bool = False,
        strict_length: bool = True,
        pin_memory: bool = False,
        prefetch: int | None = None,
        _data: TensorDictBase | None = None,
    ) -> None:
        if _data is not None:  # frames already in memory (from_columns): nothing is read or written
            self._adopt(repo_id, root, key_map, _data)
        else:
            source = None
            if root is not None and isinstance(root, (str, os.PathLike)) and is_lerobot_dir(root):
                source, root = Path(root).resolve(), None
            self._open(repo_id, source, root, download, key_map, decode_video)
        self._finish(batch_size=batch_size, num_slices=num_slices, slice_len=slice_len, sampler=sampler,
                     writer=writer, collate_fn=collate_fn, transform=transform, rehydrate=rehydrate,
                     strict_length=strict_length, pin_memory=pin_memory, prefetch=prefetch)  # fmt: skip

    # -- other constructors -----------------------------------------------------------------------------------
    @classmethod
    def from_local(
        cls,
        path: str | os.PathLike,
        *,
        repo_id: str | None = None,
        root=None,
        download=True,
        key_map=None,
        decode_video: bool = True,
        **kwargs,
    ) -> LeRobotExperienceReplay:
        """The dataset in the local LeRobot v3.0 directory ``path``, converted under ``root`` (no network).

        Args:
            path (str or os.PathLike): a LeRobot dataset directory (``meta/info.json`` with a
                ``codebase_version``), e.g. written by LeRobot or by ``rb.export_hf(path, layout="lerobot")``.

        Keyword Args:
            repo_id (str, optional): the name of the converted copy under ``root``. Defaults to ``None``:
                ``"local/<directory name>"``.
            root (str or os.PathLike, optional): the cache directory of converted datasets. Defaults to
                ``None``: ``~/.cache/torchrl/lerobot``.
            download (bool or str): ``True`` converts when there is no converted copy of this source's current
                content (it is converted again when the source files changed); ``"force"`` always converts;
                ``False`` only opens a converted copy. Defaults to ``True``.
            key_map (Mapping[str, key], optional): column -> key overrides. Defaults to ``None``.
            decode_video (bool): decode video features (else leave them out). Defaults to ``True``.
            **kwargs: the other arguments of :class:`LeRobotExperienceReplay` (``batch_size``, ``slice_len``,
                ``sampler``, ``transform``, ``rehydrate``, ...).

        Examples:
            >>> import pathlib, tempfile
            >>> import torchrl
            >>> from torchrl.data.datasets import LeRobotExperienceReplay
            >>> repo = pathlib.Path(torchrl.__file__).resolve().parents[1]
            >>> fixture = repo / "test" / "datasets" / "data" / "lerobot_v30_cartpole_like"
            >>> ds = LeRobotExperienceReplay.from_local(fixture, root=tempfile.mkdtemp(), batch_size=4)
            >>> ds.repo_id, ds.data_path.name
            ('local/lerobot_v30_cartpole_like', 'local_lerobot_v30_cartpole_like')
        """
        if not isinstance(path, (str, os.PathLike)) or not is_lerobot_dir(path):
            raise ValueError(
                f"`path` must be a LeRobot dataset directory (meta/info.json with a codebase_version), got "
                f"{path!r}. For a dataset of the Hub use LeRobotExperienceReplay(repo_id)."
            )
        source = Path(path).resolve()
        self = cls.__new__(cls)
        self._open(repo_id or f"local/{source.name}", source, root, download, key_map, decode_video)
        self._finish(**kwargs)
        return self

    @classmethod
    def from_columns(
        cls, columns: Mapping, *, repo_id: str = "local", key_map: Mapping | None = None, **kwargs
    ) -> LeRobotExperienceReplay:
        """A dataset over columns held in memory (see :func:`lerobot_columns_to_tensordict`); no file is written.

        Args:
            columns (Mapping[str, values]): LeRobot column name -> the values of every frame.

        Keyword Args:
            repo_id (str): the dataset's name. Defaults to ``"local"``.
            key_map (Mapping[str, key], optional): column -> key overrides. Defaults to ``None``.
            **kwargs: ``batch_size``, ``num_slices``, ``slice_len``, ``sampler``, ``writer``, ``collate_fn``,
                ``transform``, ``rehydrate``, ``strict_length``, ``pin_memory``, ``prefetch``, ``root``, as in
                :class:`LeRobotExperienceReplay`.

        Examples:
            >>> import torch
            >>> from torchrl.data.datasets import LeRobotExperienceReplay
            >>> ds = LeRobotExperienceReplay.from_columns(
            ...     {"observation.state": torch.arange(6.0).unsqueeze(-1), "episode_index": [0, 0, 0, 1, 1, 1],
            ...      "frame_index": [0, 1, 2, 0, 1, 2]}, batch_size=4, slice_len=2, rehydrate=True)
            >>> batch = ds.sample()
            >>> batch["next", "observation", "state"].shape
            torch.Size([4, 1])
        """
        frames = lerobot_columns_to_tensordict(columns, key_map=key_map)
        return cls(repo_id, key_map=key_map, _data=frames, **kwargs)

    # -- paths ------------------------------------------------------------------------------------------------
    @property
    def data_path_root(self) -> Path:
        """``root/<repo_id with "/" replaced by "_">``: the converted frames and their metadata."""
        return self.root / self.repo_id.replace("/", "_")

    @property
    def data_path(self) -> Path:
        """The same as :attr:`data_path_root`."""
        return self.data_path_root

    def _is_downloaded(self) -> bool:
        return (self.data_path / _SOURCE_FILE).is_file()

    # -- building ---------------------------------------------------------------------------------------------
    def _adopt(self, repo_id, root, key_map, frames) -> None:
        """Serves ``frames`` (TorchRL's private ``_data`` keyword): a TensorDict of frames with TorchRL's keys
        (batch size ``[N]``), as :func:`lerobot_columns_to_tensordict` returns; no file is read or written."""
        if not isinstance(frames, TensorDictBase) or frames.batch_dims != 1:
            raise TypeError(
                f"`_data` must be a TensorDict of frames with batch size [N] (see lerobot_columns_to_tensordict), "
                f"got {type(frames).__name__}"
                f"{f' with batch size {list(frames.batch_size)}' if isinstance(frames, TensorDictBase) else ''}. "
                f"Use LeRobotExperienceReplay.from_columns(columns) to build a dataset from columns."
            )
        if key_map is not None and not isinstance(key_map, Mapping):
            raise TypeError(f"`key_map` must be a mapping column -> key or None, got {type(key_map).__name__}.")
        self.repo_id = _check_repo_id(repo_id)
        self.root = _default_root() if root is None else root
        self.source = None
        self.key_map = None if key_map is None else dict(key_map)
        self.metadata = {}
        self._frames_td = frames

    def _open(self, repo_id, source, root, download, key_map, decode_video) -> None:
        self.repo_id = _check_repo_id(repo_id)
        download = _check_download(download)
        if key_map is not None and not isinstance(key_map, Mapping):
            raise TypeError(
                f"`key_map` must be a mapping column -> key or None, got {type(key_map).__name__}."
            )
        if not isinstance(decode_video, bool):
            raise TypeError(f"`decode_video` must be a bool, got {decode_video!r}.")
        self.key_map = None if key_map is None else dict(key_map)
        self.decode_video = decode_video
        self.root = _default_root() if root is None else root
        self.source = source
        stale = source is not None and self._is_downloaded() and not self._matches(source)
        if download == "force" or (download and (not self._is_downloaded() or stale)):
            self._convert(source if source is not None else self._hub_snapshot())
        elif not self._is_downloaded():
            raise LEROBOT_NOT_FOUND.error(repo_id=self.repo_id, path=str(self.data_path))
        self.metadata = _read_json(self.data_path / _INFO_FILE)
        self.metadata["tasks"] = {int(k): v for k, v in self.metadata.get("tasks", {}).items()}
        self._frames_td = TensorDict.load_memmap(self.data_path)

    def _matches(self, source: Path) -> bool:
        doc = _read_json(self.data_path / _SOURCE_FILE)
        wanted = {"key_map": _jsonable_map(self.key_map), "decode_video": self.decode_video}
        return doc.get("files") == _fingerprint(source) and all(doc.get(k) == v for k, v in wanted.items())

    def _hub_snapshot(self) -> Path:
        """The local directory of the Hub snapshot of ``repo_id`` (downloaded if the Hub can be reached)."""
        try:
            import datasets  # noqa: F401
            import huggingface_hub
        except ImportError as err:
            raise ImportError(
                f"Downloading the LeRobot dataset {self.repo_id!r} needs huggingface_hub and datasets: pip install "
                f"huggingface_hub datasets (or torchrl[hf]). A local LeRobot directory needs only datasets: "
                f"LeRobotExperienceReplay.from_local(path). ({err})"
            ) from err
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on") or bool(
            getattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        )
        try:
            path = huggingface_hub.snapshot_download(
                self.repo_id, repo_type="dataset", local_files_only=offline
            )
        except Exception as err:  # no network, unknown repo, offline mode: one clear error
            where = "the local Hub cache (HF_HUB_OFFLINE is set)" if offline else "the Hugging Face Hub"
            raise RuntimeError(
                f"The LeRobot dataset {self.repo_id!r} is not converted under root={str(self.root)!r} and could not "
                f"be fetched from {where}: {type(err).__name__}: {err}. Download it where the Hub is reachable "
                f"(`huggingface-cli download {self.repo_id} --repo-type dataset`), or read a local copy with "
                f"LeRobotExperienceReplay.from_local(path)."
            ) from None
        if not is_lerobot_dir(path):
            raise RuntimeError(
                f"The Hub snapshot of {self.repo_id!r} at {path} is not a LeRobot dataset (no meta/info.json with "
                f"a codebase_version)."
            )
        return Path(path)

    def _convert(self, source: Path) -> None:
        """Reads ``source`` and writes its frames as memory-mapped files at :attr:`data_path` (atomically)."""
        from torchrl.data.replay_buffers.hf.reader import HFReader, lerobot_specs

        directory = LeRobotDirectory(source)
        import pyarrow.parquet as pq

        available = pq.read_schema(directory.files[0]).names
        specs = lerobot_specs(directory, available)
        columns = {}
        for column, spec in specs.items():
            if spec["encoding"] == "video" and not self.decode_video:
                continue
            columns[column] = lerobot_key(column, self.key_map) if self.key_map else tuple(spec["key"])
        skipped = [c for c in specs if c not in columns]
        if skipped:
            warnings.warn(
                f"decode_video=False: the video features {skipped} of {self.repo_id!r} are left out.",
                UserWarning,
                stacklevel=3,
            )
        reader = HFReader(source, columns=columns, ignore_metadata=True)
        rows = reader.rows(range(len(reader)))
        if isinstance(rows, list):
            raise ValueError(
                f"The frames of {source} differ in shape: they do not make one tensor per feature."
            )
        info = dict(directory.info, tasks={str(k): v for k, v in directory.tasks.items()})
        doc = {"schema_version": _SCHEMA_VERSION, "source": str(source), "files": _fingerprint(source),
               "key_map": _jsonable_map(self.key_map), "decode_video": self.decode_video}  # fmt: skip
        _write_atomically(self.data_path, rows, {_INFO_FILE: info, _SOURCE_FILE: doc})

    def _finish(
        self,
        *,
        batch_size=None,
        num_slices=None,
        slice_len=None,
        sampler=None,
        writer=None,
        collate_fn=None,
        transform=None,
        rehydrate=False,
        strict_length=True,
        pin_memory=False,
        prefetch=None,
    ) -> None:
        _check_slices(num_slices, slice_len)
        for name, value in (("rehydrate", rehydrate), ("strict_length", strict_length)):
            if not isinstance(value, bool):
                raise TypeError(f"`{name}` must be a bool, got {value!r}.")
        data = self._frames_td
        keys = _key_set(data)
        episode_key = lerobot_key("episode_index", self.key_map)
        if sampler is None and (num_slices is not None or slice_len is not None):
            if episode_key not in keys:
                raise ValueError(
                    f"num_slices/slice_len sample slices along episodes, and the dataset has no {episode_key!r} "
                    f"entry (the episode_index column). Pass a sampler instead."
                )
            sampler = SliceSampler(num_slices=num_slices, slice_len=slice_len, traj_key=episode_key,
                                   strict_length=strict_length)  # fmt: skip
        transforms = self._rehydration(data, episode_key) if rehydrate else []
        if transform is not None:
            transforms.append(transform)
        if len(transforms) > 1:
            from torchrl.envs.transforms import Compose

            transform = Compose(*transforms)
        else:
            transform = transforms[0] if transforms else None
        self.rehydrate = rehydrate
        super().__init__(storage=TensorStorage(data), sampler=sampler, writer=writer, collate_fn=collate_fn,
                         transform=transform, batch_size=batch_size, pin_memory=pin_memory,
                         prefetch=prefetch)  # fmt: skip

    def _rehydration(self, data: TensorDict, episode_key) -> list:
        """The NextStateReconstructors of ``rehydrate=True``: float observation entries (NaN fill) and integer
        ones (0 fill), along the episode and frame entries."""
        from torchrl.envs.transforms import NextStateReconstructor

        keys = _key_set(data)
        if episode_key not in keys:
            raise ValueError(
                f"rehydrate=True rebuilds next observations within an episode, and the dataset has no "
                f"{episode_key!r} entry (the episode_index column): pass rehydrate=False, or map the episode "
                f"column with key_map."
            )
        frame_key = lerobot_key("frame_index", self.key_map)
        if frame_key not in keys:
            warnings.warn(
                f"rehydrate=True: the dataset has no {frame_key!r} entry (frame_index): consecutive frames are told "
                f"by the episode and done flags only.",
                UserWarning,
                stacklevel=4,
            )
            frame_key = None
        done_key = ("next", "done") if ("next", "done") in keys else None
        observations = [k for k in keys if k[0] == "observation" and isinstance(data.get(k), torch.Tensor)]
        floats = sorted(k for k in observations if data.get(k).dtype.is_floating_point)
        ints = sorted(k for k in observations if not data.get(k).dtype.is_floating_point)
        out = []
        for group, fill in ((floats, float("nan")), (ints, 0)):
            if group:
                out.append(NextStateReconstructor(list(group), traj_key=episode_key, done_key=done_key,
                                                  step_count_key=frame_key, fill_value=fill))  # fmt: skip
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(repo_id={self.repo_id!r}, frames={len(self)}, data_path={str(self.data_path)!r})"


def _key_set(td: TensorDict) -> set:
    return {(k,) if isinstance(k, str) else tuple(k) for k in td.keys(True, True)}


def _jsonable_map(key_map):
    if key_map is None:
        return None
    return {k: (v if isinstance(v, str) else list(v)) for k, v in sorted(key_map.items())}


def _write_atomically(path: Path, rows: TensorDict, sidecars: dict) -> None:
    """Memory-maps ``rows`` into a sibling temporary directory, adds the JSON ``sidecars`` and renames it to
    ``path`` (replacing an older conversion), so an interrupted conversion never looks converted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        raise RuntimeError(
            f"{str(path)!r} is a symbolic link; remove it yourself before converting the dataset."
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        rows.memmap_(tmp)
        for name, doc in sidecars.items():
            with open(tmp / name, "w", encoding="utf-8") as f:
                json.dump(doc, f)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}-old-", dir=path.parent))
            os.replace(path, old / "data")
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
