"""The frames of a LeRobot v3.0 directory as a map-style dataset: :class:`LeRobotFrames`."""

from __future__ import annotations

import os

from torch.utils.data import Dataset

from torchrl.data.replay_buffers.hf.lerobot import is_lerobot_dir
from torchrl.data.replay_buffers.hf.reader import HFReader
from torchrl.data.replay_buffers.storages.dataset_storage import register_directory_opener

__all__ = ["LeRobotFrames"]


class LeRobotFrames(Dataset):
    """The frames of a LeRobot dataset directory, read by index with TorchRL's ``LeRobotExperienceReplay`` keys.

    Item ``i`` is frame ``i`` (the ``index`` column's order, the data files' order): a TensorDict with
    ``("observation", "state")``, ``"action"``, ``("next", "reward")`` / ``("next", "done")`` of shape ``[1]``,
    ``"episode"``, ``"frame"``, ``"language_instruction"`` (the task text), ... (see
    :mod:`~torchrl.data.replay_buffers.hf.lerobot_reader`). ``__getitems__`` reads a batch of frames at once
    (what :class:`~torch.utils.data.DataLoader` and :class:`~torchrl.data.DatasetStorage` call). The data files are
    read into memory once, when the dataset is built.

    Args:
        path (str or path-like): a LeRobot dataset directory (``meta/info.json`` with a ``codebase_version``).

    Keyword Args:
        columns (list of str or mapping, optional): the columns to read, or a mapping column -> key, as in
            :meth:`ReplayBuffer.from_hf <torchrl.data.ReplayBuffer.from_hf>`. Defaults to ``None`` (every column,
            video features decoded).

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from torchrl.data.replay_buffers.hf.lerobot_frames import LeRobotFrames
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(6))
        >>> _ = rb.extend(TensorDict(observation=torch.randn(6, 3), action=torch.randn(6, 1),
        ...     next=TensorDict(done=torch.tensor([0, 0, 1, 0, 0, 1]).bool().unsqueeze(-1), batch_size=[6]),
        ...     batch_size=[6]))
        >>> path = tempfile.mkdtemp() + "/lerobot"
        >>> _ = rb.export_hf(path, layout="lerobot", task="balance")
        >>> frames = LeRobotFrames(path)
        >>> len(frames), frames[4]["episode"], frames[4]["language_instruction"]
        (6, tensor(1), 'balance')
    """

    def __init__(self, path, *, columns=None):
        self.path = os.path.abspath(os.fspath(path))
        if not is_lerobot_dir(self.path):
            raise ValueError(
                f"`path` {self.path} is not a LeRobot dataset directory (meta/info.json with a codebase_version): "
                f"wrap a Hugging Face dataset with DatasetStorage(datasets.load_from_disk(path)) instead."
            )
        self.reader = HFReader(self.path, columns=columns, ignore_metadata=True)
        self.info = self.reader.lerobot.info
        self.stable_items = True

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int):
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"Frame {index} is out of range: the dataset has {n} frames.")
        return self.reader.rows([index % n])[0]

    def __getitems__(self, indices):
        return self.reader.rows([int(i) for i in indices])

    def __repr__(self) -> str:
        return f"LeRobotFrames(path={self.path!r}, frames={len(self)})"


def open_lerobot_dir(path) -> LeRobotFrames | None:
    """The frames of ``path`` when it is a LeRobot dataset directory, else ``None``: how
    :class:`~torchrl.data.DatasetStorage` opens a directory (registered below)."""
    return LeRobotFrames(path) if is_lerobot_dir(path) else None


register_directory_opener(open_lerobot_dir)
