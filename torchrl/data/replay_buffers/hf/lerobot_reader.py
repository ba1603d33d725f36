"""Reading a LeRobot v3.0 directory (the format LeRobot 0.6 writes) with pyarrow only.

A directory is recognised by ``meta/info.json`` with a ``codebase_version`` (:func:`is_lerobot_dir`). Its frames
are the rows of ``data/chunk-*/file-*.parquet`` in file order; ``meta/tasks.parquet`` gives the task text of
each ``task_index``; video features (``dtype: "video"``) live in ``videos/<key>/chunk-*/file-*.mp4``, at the
``videos/<key>/from_timestamp`` of each episode (``meta/episodes/...``) plus the frame's ``timestamp``.

Columns become keys as TorchRL's ``LeRobotExperienceReplay`` maps them (:func:`lerobot_key`):
``observation.state`` -> ``("observation", "state")``, ``observation.images.<cam>`` ->
``("observation", "image", <cam>)``, ``episode_index`` -> ``"episode"``, ``frame_index`` -> ``"frame"``, the task
text -> ``"language_instruction"``, ``next.reward`` / ``next.done`` -> ``("next", ...)`` with a trailing ``[1]``;
other dotted names nest, plain names stay.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from torchrl.data.replay_buffers.hf.lerobot import CODEBASE_VERSION, is_lerobot_dir

__all__ = ["LeRobotDirectory", "lerobot_key", "is_lerobot_dir", "require_video_decoder", "TASK_COLUMN"]

#: The pseudo column of the task text (LeRobot keeps ``task_index`` in the frames and the text in a table).
TASK_COLUMN = "task"
_RENAMES = {
    "episode_index": ("episode",),
    "frame_index": ("frame",),
    "task": ("language_instruction",),
    "observation.state": ("observation", "state"),
}


def lerobot_key(column: str, key_map=None) -> tuple[str, ...]:
    """The TensorDict key of a LeRobot column, as TorchRL's ``LeRobotExperienceReplay`` maps it.

    Args:
        column (str): the LeRobot column (feature) name.
        key_map (Mapping[str, key], optional): column -> key overrides (a str key is split on ``"."``).
            Defaults to ``None``.

    Examples:
        >>> from torchrl.data.replay_buffers.hf.lerobot_reader import lerobot_key
        >>> lerobot_key("observation.images.top"), lerobot_key("episode_index"), lerobot_key("next.reward")
        (('observation', 'image', 'top'), ('episode',), ('next', 'reward'))
    """
    if key_map and column in key_map:
        key = key_map[column]
        return tuple(key.split(".")) if isinstance(key, str) else tuple(key)
    if column in _RENAMES:
        return _RENAMES[column]
    parts = tuple(column.split("."))
    if len(parts) >= 3 and parts[:2] == ("observation", "images"):
        return ("observation", "image", *parts[2:])
    return parts


def require_video_decoder(columns) -> str:
    """The name of an installed video decoder (``"torchcodec"`` or ``"av"``), else an ``ImportError`` naming
    both and the video ``columns`` that need one.

    Args:
        columns (sequence of str): the video features to decode (named in the error).

    Examples:
        >>> from torchrl.data.replay_buffers.hf.lerobot_reader import require_video_decoder
        >>> try:
        ...     name = require_video_decoder(["observation.images.top"])
        ... except ImportError as err:
        ...     name = "none: " + str(err).split(":")[0]
        >>> name in ("torchcodec", "av") or name.startswith("none")
        True
    """
    import importlib.util

    for name in ("torchcodec", "av"):
        if importlib.util.find_spec(name) is not None:
            return name
    raise ImportError(
        f"The LeRobot video features {list(columns)} are stored as MP4 files and need a video decoder: install "
        f"torchcodec (pip install torchcodec) or PyAV (pip install av). To read the other features without "
        f"them, leave the video columns out with `columns=[...]` (or decode_video=False in "
        f"LeRobotExperienceReplay)."
    )


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}): the LeRobot dataset is damaged.") from None


class LeRobotDirectory:
    """The parts of a LeRobot v3.0 directory a reader needs: info, tasks, episodes, data files, frames."""

    def __init__(self, path):
        import pyarrow.parquet as pq

        self.path = os.path.abspath(os.fspath(path))
        info = _read_json(os.path.join(self.path, "meta", "info.json"))
        version = str(info.get("codebase_version"))
        if not version.startswith("v3."):
            raise ValueError(
                f"{self.path} is a LeRobot dataset of codebase_version {version!r}; only the v3.x format "
                f"({CODEBASE_VERSION}, what LeRobot >= 0.4 writes) is read. Convert it with LeRobot's "
                f"`python -m lerobot.datasets.v30.convert_dataset_v21_to_v30`."
            )
        if not isinstance(info.get("features"), dict):
            raise ValueError(f"{self.path}/meta/info.json has no `features` mapping: the LeRobot dataset is damaged.")
        self.info = info
        self.features: dict = info["features"]
        self.fps = info.get("fps")
        self.files = sorted(glob.glob(os.path.join(self.path, "data", "chunk-*", "file-*.parquet")))
        if not self.files:
            raise FileNotFoundError(
                f"{self.path} has meta/info.json but no data/chunk-*/file-*.parquet: the frames are missing (an "
                f"incomplete download?). Download or copy the whole dataset directory."
            )
        self.tasks = self._read_tasks(pq)
        self.video_columns = [c for c, f in self.features.items() if isinstance(f, dict) and f.get("dtype") == "video"]
        self._episodes = None

    def _read_tasks(self, pq) -> dict[int, str]:
        path = os.path.join(self.path, "meta", "tasks.parquet")
        if not os.path.isfile(path):
            return {}
        table = pq.read_table(path)
        names = table.column_names
        text = TASK_COLUMN if TASK_COLUMN in names else next((n for n in names if n.startswith("__index")), None)
        if text is None or "task_index" not in names:
            raise ValueError(
                f"{path} has the columns {names}; a LeRobot task table has `task_index` and `task`: the dataset is "
                f"damaged."
            )
        return dict(zip(table.column("task_index").to_pylist(), table.column(text).to_pylist()))

    def frames(self):
        """The frames as a ``datasets.Dataset`` (the data files read into memory, in file order)."""
        import datasets
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = [pq.read_table(f, memory_map=True) for f in self.files]
        try:
            table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        except pa.ArrowInvalid as err:
            raise ValueError(f"The data files of {self.path} do not share one schema ({err}).") from None
        return datasets.Dataset(datasets.table.InMemoryTable(table))

    def task_texts(self, task_index: np.ndarray) -> list[str]:
        """The task text of each frame's ``task_index``."""
        try:
            return [self.tasks[int(i)] for i in task_index]
        except KeyError as err:
            raise ValueError(
                f"A frame of {self.path} has task_index {err.args[0]}, which meta/tasks.parquet does not list "
                f"(it has {sorted(self.tasks)}): the dataset is damaged."
            ) from None

    @property
    def episodes(self):
        """The episode table (``meta/episodes/chunk-*/file-*.parquet``) as a pyarrow Table."""
        if self._episodes is None:
            import pyarrow as pa
            import pyarrow.parquet as pq

            files = sorted(glob.glob(os.path.join(self.path, "meta", "episodes", "chunk-*", "file-*.parquet")))
            if not files:
                raise FileNotFoundError(f"{self.path} has no meta/episodes/chunk-*/file-*.parquet episode table.")
            self._episodes = pa.concat_tables([pq.read_table(f) for f in files])
        return self._episodes

    def decode_video(self, column: str, episode: np.ndarray, timestamp: np.ndarray):
        """The frames of the video feature ``column`` at ``timestamp`` in each row's ``episode``: a uint8 tensor
        ``[n, C, H, W]``."""
        import torch

        decoder = require_video_decoder([column])
        table = self.episodes.to_pydict()
        by_episode = {e: i for i, e in enumerate(table["episode_index"])}
        template = self.info.get("video_path") or "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
        out = [None] * len(episode)
        for e in np.unique(episode):
            row = by_episode.get(int(e))
            if row is None:
                raise ValueError(f"Episode {int(e)} of {self.path} is not in the episode table.")
            chunk = table[f"videos/{column}/chunk_index"][row]
            file = table[f"videos/{column}/file_index"][row]
            start = table[f"videos/{column}/from_timestamp"][row]
            path = os.path.join(self.path, template.format(video_key=column, chunk_index=chunk, file_index=file))
            where = np.flatnonzero(episode == e)
            frames = _decode_frames(decoder, path, [float(start) + float(timestamp[i]) for i in where], self.fps)
            for i, frame in zip(where, frames):
                out[i] = frame
        return torch.stack(out)


def _decode_frames(decoder: str, path: str, seconds: list[float], fps):
    """Frames of the MP4 file ``path`` shown at ``seconds`` (uint8 ``[C, H, W]`` tensors)."""
    import torch

    if decoder == "torchcodec":
        from torchcodec.decoders import VideoDecoder

        return list(VideoDecoder(path).get_frames_played_at(seconds=seconds).data)
    import av

    wanted = sorted(set(seconds))
    frames: dict[float, torch.Tensor] = {}
    tolerance = 0.5 / float(fps or 30)
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        container.seek(int(max(0.0, wanted[0] - 1.0) / stream.time_base), stream=stream, backward=True)
        pending, missing = list(wanted), []
        for frame in container.decode(stream):
            t = float(frame.pts * stream.time_base)
            while pending and pending[0] < t - tolerance:  # no frame was shown at that time
                missing.append(pending.pop(0))
            while pending and abs(pending[0] - t) <= tolerance:
                frames[pending.pop(0)] = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)
            if not pending:
                break
    missing += pending
    if missing:
        raise ValueError(f"{path} has no frame at the timestamps {missing[:5]} (seconds): the video is truncated.")
    return [frames[s] for s in seconds]
