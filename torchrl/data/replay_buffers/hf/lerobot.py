"""The LeRobot v3.0 file set, written with pyarrow only: what ``export_hf(path, layout="lerobot")`` produces.

Layout (as LeRobot 0.6.1 writes it; ``LeRobotDataset(repo_id, root=path)`` opens it offline)::

    meta/info.json                                 codebase_version "v3.0", fps, features, totals, paths
    meta/tasks.parquet                             task_index int64, task string (the pandas index)
    meta/stats.json                                {feature: {min, max, mean, std, count, q01 ... q99}}
    meta/episodes/chunk-000/file-000.parquet       one row per episode: index range, tasks, stats/<feature>/...
    data/chunk-XXX/file-YYY.parquet                the frames, a new file every ``file_bytes`` (whole episodes)
    videos/<column>/chunk-XXX/file-YYY.mp4         video features (see :mod:`~.lerobot_video`), when written

Data files are numbered as LeRobot numbers them: file ``k`` is ``chunk-{k // 1000:03d}/file-{k % 1000:03d}``. An
episode never straddles two files (the episode table gives one file per episode). Statistics are exact over each
episode (``numpy.quantile`` for the quantiles); ``meta/stats.json`` aggregates them as LeRobot does (count-weighted
means and pooled variances, extrema, quantiles averaged with the counts as weights).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import numpy as np

from torchrl._files import fsync_file, write_new_file

__all__ = ["CODEBASE_VERSION", "DATA_PATH", "LeRobotFileWriter", "feature_entry", "is_lerobot_dir"]

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
VIDEO_FILES_SIZE_IN_MB = 200
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
#: The columns LeRobot adds to every dataset, in its order, with their dtypes.
DERIVED_FEATURES = (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                    ("index", "int64"), ("task_index", "int64"))  # fmt: skip
STAT_NAMES = ("min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99")
_QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
# The pandas metadata of meta/tasks.parquet: LeRobot reads it with pandas.read_parquet, the task text as index.
_TASKS_PANDAS = {
    "index_columns": ["task"],
    "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                        "metadata": {"encoding": "UTF-8"}}],
    "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
                 "metadata": None},
                {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object",
                 "metadata": None}],
    "attributes": {},
    "creator": {"library": "pyarrow", "version": None},
    "pandas_version": "2.3.3",
}  # fmt: skip


def is_lerobot_dir(path) -> bool:
    """Whether ``path`` is a LeRobot dataset directory: ``meta/info.json`` with a ``codebase_version``.

    Args:
        path (str or path-like): the directory.

    Examples:
        >>> import tempfile
        >>> from torchrl.data.replay_buffers.hf.lerobot import is_lerobot_dir
        >>> is_lerobot_dir(tempfile.mkdtemp())
        False
    """
    info = os.path.join(os.fspath(path), "meta", "info.json")
    if not os.path.isfile(info):
        return False
    try:
        with open(info, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "codebase_version" in doc


def feature_entry(dtype: str, shape: Sequence[int], names=None) -> dict:
    """One entry of ``info.json["features"]``: ``{"dtype", "shape", "names"}`` (a scalar has shape ``[1]``).

    Args:
        dtype (str): the numpy name of the values' dtype (``"float32"``, ``"int64"``, ``"bool"``, ...).
        shape (sequence of int): the shape of one frame's value (``[]`` for a scalar).
        names (list of str, optional): the names of the values (or of the image axes). Defaults to ``None``.

    Examples:
        >>> from torchrl.data.replay_buffers.hf.lerobot import feature_entry
        >>> feature_entry("float32", [], None)
        {'dtype': 'float32', 'shape': [1], 'names': None}
    """
    return {"dtype": dtype, "shape": [int(d) for d in shape] or [1], "names": None if names is None else list(names)}


def default_names(column: str, dtype: str, shape: Sequence[int]):
    """The ``names`` LeRobot gives a feature when they are known from its shape: image axes."""
    if dtype == "uint8" and len(shape) == 3:
        if shape[0] in (1, 3, 4) and shape[-1] not in (1, 3, 4):
            return ["channels", "height", "width"]
        if shape[-1] in (1, 3, 4):
            return ["height", "width", "channels"]
    return None


def data_file(file_number: int) -> tuple[int, int, str]:
    chunk, index = divmod(file_number, CHUNKS_SIZE)
    return chunk, index, DATA_PATH.format(chunk_index=chunk, file_index=index)


# -- the export's arguments ------------------------------------------------------------------------------------------
#: The string entries a LeRobot export reads the task text from, when no ``task_key`` is given.
TASK_KEYS = (("task",), ("language_instruction",))


def check_lerobot_args(fps, task, task_key, names, robot_type) -> None:
    """Raises for an argument of a LeRobot export that LeRobot cannot store."""
    if float(fps) != int(fps):
        raise ValueError(f"`fps` must be a whole number for layout='lerobot' (LeRobot stores an int), got {fps!r}.")
    if task is not None and not isinstance(task, str):
        raise TypeError(f"`task` must be a str (the task text of every frame) or None, got {task!r}.")
    if task is not None and task_key is not None:
        raise ValueError(
            f"Pass `task` (one text for every frame) or `task_key` (the string entry of each frame's task), not "
            f"both: got task={task!r} and task_key={task_key!r}."
        )
    if names is not None:
        if not isinstance(names, Mapping):
            raise TypeError(f"`names` must be a mapping key -> list of str, got {type(names).__name__}.")
        for key, value in names.items():
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"`names[{key!r}]` must be a list of str (the feature's names), got {value!r}.")
    if robot_type is not None and not isinstance(robot_type, str):
        raise TypeError(f"`robot_type` must be a str or None, got {robot_type!r}.")


def _string_keys(item) -> set:
    import torch
    from tensordict import is_leaf_nontensor

    out = set()
    for key, value in item.items(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor):
        if not isinstance(value, torch.Tensor):
            out.add((key,) if isinstance(key, str) else tuple(key))
    return out


def find_task_key(first, task, task_key):
    """The string entry holding the task text (``None``: the fixed ``task``, or ``""``)."""
    if task is not None:
        return None
    strings = _string_keys(first[0] if isinstance(first, list) else first)
    if task_key is not None:
        key = (task_key,) if isinstance(task_key, str) else tuple(task_key)
        if key not in strings:
            raise KeyError(
                f"`task_key`={key!r} is not a string entry of the stored items (their string entries are "
                f"{sorted(strings)}). Pass one of them, or `task='...'` for one task text for every frame."
            )
        return key
    return next((k for k in TASK_KEYS if k in strings), None)


def task_strings(chunk, task, task_key, n: int) -> list[str]:
    """The task text of each of the ``n`` rows of ``chunk`` (a TensorDict batch or a list of items)."""
    if task_key is None:
        return [task or ""] * n
    if isinstance(chunk, list):
        values = [item.get(task_key) for item in chunk]
        values = [getattr(v, "data", v) for v in values]
    else:
        values = chunk.get(task_key).tolist()
        if isinstance(values, str):
            values = [values] * n
    bad = [v for v in values if not isinstance(v, str)]
    if bad or len(values) != n:
        raise TypeError(
            f"The task entry {task_key!r} must hold one str per frame, got {bad[:1] or values!r}. Store the task "
            f"text as a string, or pass `task='...'`."
        )
    return values


def feature_columns(specs: list[dict], names) -> list:
    """``[(column, dtype, feature shape, names)]`` of the data columns of ``specs`` (see LeRobotFileWriter)."""
    by_column = {}
    for key, value in (names or {}).items():
        if isinstance(key, str) and any(s["column"] == key for s in specs):
            by_column[key] = list(value)
            continue
        key = (key,) if isinstance(key, str) else tuple(key)
        spec = next((s for s in specs if s["key"] is not None and tuple(s["key"]) == key), None)
        if spec is None:
            raise KeyError(
                f"`names` has the key {key!r}, which is neither a stored key nor a column of the export (columns: "
                f"{[s['column'] for s in specs]})."
            )
        by_column[spec["column"]] = list(value)
    out = []
    for spec in specs:
        shape = list(spec.get("column_shape", spec["shape"])) or [1]
        column, dtype = spec["column"], spec["dtype"]
        out.append((column, dtype, shape, by_column.get(column, default_names(column, dtype, shape))))
    return out


def extension_type():
    import pyarrow as pa

    return pa.ExtensionType


def storage_schema(features):
    """The Arrow schema of the data files: ``features``' schema with each extension type (``ArrayND``) replaced
    by its storage type (nested lists), and the ``huggingface`` metadata that tells ``datasets`` the features."""
    import pyarrow as pa

    schema = features.arrow_schema
    fields = [pa.field(f.name, f.type.storage_type if isinstance(f.type, pa.ExtensionType) else f.type)
              for f in schema]  # fmt: skip
    return pa.schema(fields, metadata=schema.metadata)


# -- statistics ---------------------------------------------------------------------------------------------------
def episode_stats(values: np.ndarray) -> dict:
    """LeRobot's statistics of one feature over one episode: ``values`` is ``[T, *feature shape]``."""
    x = np.sort(values.astype(np.float64), axis=0)  # one sort gives the extrema and every quantile
    n = len(x)
    out = {"min": x[0], "max": x[-1], "mean": x.mean(0), "std": x.std(0), "count": np.array([n])}
    for name, q in _QUANTILES.items():  # numpy's default ("linear") quantile, from the sorted values
        position = q * (n - 1)
        lo = int(np.floor(position))
        hi, t = min(lo + 1, n - 1), position - lo
        out[name] = x[lo] + (x[hi] - x[lo]) * t if t < 0.5 else x[hi] - (x[hi] - x[lo]) * (1 - t)
    return {name: out[name] for name in STAT_NAMES}


def aggregate_stats(per_episode: list[dict]) -> dict:
    """The dataset's statistics of one feature from its episodes' (see the module docstring)."""
    counts = np.array([float(s["count"][0]) for s in per_episode])
    total = counts.sum()
    weights = counts / total

    def weighted(name):
        return sum(w * s[name] for w, s in zip(weights, per_episode))

    mean = weighted("mean")
    var = sum(w * (s["std"] ** 2 + (s["mean"] - mean) ** 2) for w, s in zip(weights, per_episode))
    out = {"min": np.min([s["min"] for s in per_episode], 0), "max": np.max([s["max"] for s in per_episode], 0),
           "mean": mean, "std": np.sqrt(var), "count": np.array([int(total)])}  # fmt: skip
    for name in _QUANTILES:
        out[name] = weighted(name)
    return {name: out[name] for name in STAT_NAMES}


def _as_list(value: np.ndarray):
    value = np.asarray(value)
    return value.tolist() if value.ndim else [value.item()]


# -- the writer -----------------------------------------------------------------------------------------------------
class LeRobotFileWriter:
    """Writes the frames of a LeRobot v3.0 dataset, chunk by chunk, then its metadata files.

    ``columns``: ``[(column, dtype name, feature shape, names)]`` of every column in the data files, in order
    (the derived ``timestamp`` ... ``task_index`` included). Call :meth:`write` with each chunk's Arrow arrays (in
    ``columns`` order), its episode indices and task strings, then :meth:`finish`.
    """

    def __init__(self, root: str, schema, columns: list, *, fps: int, file_bytes: int, robot_type, fsync: bool):
        self.root, self.schema, self.columns = root, schema, columns
        self.fps, self.file_bytes, self.robot_type, self.fsync = fps, file_bytes, robot_type, fsync
        self.tasks: dict[str, int] = {}
        self.episodes: list[dict] = []  # finished episodes
        self.current: dict | None = None  # the episode being written: its rows' values per column
        self.file_number, self.file_rows, self.file_size, self.writer, self.paths = -1, 0, 0, None, []
        self.rows = 0

    def task_indices(self, tasks: list[str]) -> np.ndarray:
        """The task index of each frame's task text (new texts are added to the task table)."""
        return np.array([self.tasks.setdefault(t, len(self.tasks)) for t in tasks], dtype=np.int64)

    def _open_file(self) -> None:
        import pyarrow.parquet as pq

        self._close_file()
        self.file_number += 1
        path = os.path.join(self.root, data_file(self.file_number)[2])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.writer = pq.ParquetWriter(path, self.schema)
        self.paths.append(path)
        self.file_size = 0

    def _close_file(self) -> None:
        if self.writer is not None:
            self.writer.close()
            if self.fsync:
                fsync_file(self.paths[-1])
            self.writer = None

    def write(self, arrays: list, episode: np.ndarray, tasks: list[str], values: list[np.ndarray]) -> None:
        """Appends one chunk: its Arrow ``arrays``, each row's ``episode`` and task text, and the numpy
        ``values`` of each column (for the statistics)."""
        import pyarrow as pa

        table = pa.Table.from_arrays(arrays, schema=self.schema)
        n = len(episode)
        cuts = [0] + [int(i) for i in np.flatnonzero(episode[1:] != episode[:-1]) + 1] + [n]
        row_bytes = table.nbytes / max(1, n)
        pending = 0  # the rows of the chunk not written yet (they go to the current file)
        for lo, hi in zip(cuts[:-1], cuts[1:]):  # one piece per episode of the chunk
            new_episode = self.current is None or self.current["episode_index"] != int(episode[lo])
            if new_episode:
                self._end_episode()
                if self.writer is None or self.file_size + (lo - pending) * row_bytes >= self.file_bytes:
                    self._write_rows(table, pending, lo)
                    pending = lo
                    self._open_file()
                chunk_index, file_index, _ = data_file(self.file_number)
                self.current = {"episode_index": int(episode[lo]), "tasks": [], "from": self.rows,
                                "data/chunk_index": chunk_index, "data/file_index": file_index,
                                "values": [[] for _ in self.columns]}  # fmt: skip
            self.rows += hi - lo
            for t in tasks[lo:hi]:
                if t not in self.current["tasks"]:
                    self.current["tasks"].append(t)
            for store, v in zip(self.current["values"], values):
                store.append(v[lo:hi])
        self._write_rows(table, pending, n)

    def _write_rows(self, table, lo: int, hi: int) -> None:
        """Rows ``lo:hi`` of ``table`` appended to the current data file (one row group)."""
        if hi > lo:
            piece = table.slice(lo, hi - lo)
            self.writer.write_table(piece)
            self.file_size += piece.nbytes

    def _end_episode(self) -> None:
        ep = self.current
        if ep is None:
            return
        stats = {}
        for (column, _, shape, _), parts in zip(self.columns, ep.pop("values")):
            x = np.concatenate(parts).reshape(-1, *(shape or [1]))
            stats[column] = episode_stats(x)
        ep.update(to=self.rows, stats=stats)
        self.episodes.append(ep)
        self.current = None

    def finish(self, videos=None) -> None:
        """Closes the last data file and writes the metadata files. ``videos``, when given, is called with the
        episode table (``[{"episode_index", "from", "to", ...}]``) once the data files are closed: it writes the
        video files, adds each episode's ``"videos"`` entries (``{column: {"chunk_index", "file_index",
        "from_timestamp", "to_timestamp"}}``) and returns the video features of ``info.json``."""
        self._end_episode()
        self._close_file()
        video_features = {} if videos is None else videos(self.episodes)
        self._write_episodes(list(video_features))
        self._write_tasks()
        stats = {c[0]: aggregate_stats([ep["stats"][c[0]] for ep in self.episodes]) for c in self.columns}
        self._json("meta/stats.json", {c: {k: _as_list(v) for k, v in s.items()} for c, s in stats.items()})
        features = dict(video_features)
        features.update((column, feature_entry(dtype, shape, names)) for column, dtype, shape, names in self.columns)
        info = {
            "codebase_version": CODEBASE_VERSION, "fps": self.fps, "features": features,
            "total_episodes": len(self.episodes), "total_frames": self.rows, "total_tasks": len(self.tasks),
            "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": max(1, round(self.file_bytes / 2**20)),
            "video_files_size_in_mb": VIDEO_FILES_SIZE_IN_MB, "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if video_features else None,
            "robot_type": self.robot_type, "splits": {"train": f"0:{len(self.episodes)}"},
        }  # fmt: skip
        self._json("meta/info.json", info)

    def _json(self, name: str, doc) -> None:
        write_new_file(os.path.join(self.root, name), json.dumps(doc, indent=4).encode(), fsync=self.fsync)

    def _write_table(self, name: str, table) -> None:
        import pyarrow.parquet as pq

        path = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(table, path)
        if self.fsync:
            fsync_file(path)

    def _write_episodes(self, video_columns=()) -> None:
        import pyarrow as pa

        f64, i64 = pa.list_(pa.float64()), pa.list_(pa.int64())
        cols = {"episode_index": pa.array([e["episode_index"] for e in self.episodes], pa.int64()),
                "tasks": pa.array([e["tasks"] for e in self.episodes], pa.list_(pa.string())),
                "length": pa.array([e["to"] - e["from"] for e in self.episodes], pa.int64()),
                "data/chunk_index": pa.array([e["data/chunk_index"] for e in self.episodes], pa.int64()),
                "data/file_index": pa.array([e["data/file_index"] for e in self.episodes], pa.int64()),
                "dataset_from_index": pa.array([e["from"] for e in self.episodes], pa.int64()),
                "dataset_to_index": pa.array([e["to"] for e in self.episodes], pa.int64())}  # fmt: skip
        for column in video_columns:  # LeRobot's order: the camera's file, then its time range in it
            for part, kind in (("chunk_index", pa.int64()), ("file_index", pa.int64()),
                               ("from_timestamp", pa.float64()), ("to_timestamp", pa.float64())):  # fmt: skip
                cols[f"videos/{column}/{part}"] = pa.array([e["videos"][column][part] for e in self.episodes], kind)
        for column, _, shape, _ in self.columns:
            for stat in STAT_NAMES:
                rows = [_as_list(e["stats"][column][stat]) for e in self.episodes]
                if stat == "count":
                    cols[f"stats/{column}/{stat}"] = pa.array(rows, i64)
                else:
                    kind = pa.float64()
                    for _ in range(max(1, len(shape))):
                        kind = pa.list_(kind)
                    cols[f"stats/{column}/{stat}"] = pa.array(rows, kind if len(shape) > 1 else f64)
        zeros = pa.array([0] * len(self.episodes), pa.int64())
        cols["meta/episodes/chunk_index"], cols["meta/episodes/file_index"] = zeros, zeros
        self._write_table(EPISODES_FILE, pa.table(cols))

    def _write_tasks(self) -> None:
        import pyarrow as pa

        meta = dict(_TASKS_PANDAS, creator={"library": "pyarrow", "version": pa.__version__})
        table = pa.table({"task_index": pa.array(list(self.tasks.values()), pa.int64()),
                          "task": pa.array(list(self.tasks), pa.string())})  # fmt: skip
        self._write_table("meta/tasks.parquet", table.replace_schema_metadata({"pandas": json.dumps(meta)}))
