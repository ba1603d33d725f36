"""Export layouts: which rows go in which order, key -> column names, and the columns derived at export.

- ``"flat"``: rows in storage order (a 1-D storage's positions ``0..len-1``; the cells of an ``ndim > 1``
  storage row by row); a nested key ``("a", "b")`` becomes the column ``"a.b"``.
- ``"trajectories"``: rows in the order they were written (a ring buffer that wrapped starts at its oldest
  row, so that no episode is cut in two), plus ``episode_index`` and ``frame_index`` columns.
- ``"lerobot"``: the rows of ``"trajectories"``, with LeRobot's column names for TorchRL's TED keys
  (:data:`LEROBOT_NAMES`), ``timestamp``, ``index`` and ``task_index`` columns, and an episode table.

An episode starts at the first row, after a row whose end flag (``("next", "done")`` by default) is set, and
where the trajectory id (``"episode"`` or ``("collector", "traj_ids")`` by default) changes.
"""

from __future__ import annotations

import torch

from torchrl.data.replay_buffers.trajectories.keys import as_tuple, end_keys, trajectory_keys
from torchrl.data.replay_buffers.trajectories.layout import oldest_first

LAYOUTS = ("flat", "trajectories", "lerobot")
#: The end flag looked for (the first stored): the probe's ``done`` then ``truncated`` (no ``terminated``).
END_KEYS = end_keys(("done", "truncated"))
#: The trajectory ids looked for (the first stored), as tuples: the probe's ``"episode"`` first (the name an import
#: of a LeRobot dataset gives its episodes), no root ``"traj_ids"``.
TRAJ_KEYS = tuple(as_tuple(key) for key in trajectory_keys(exclude=("traj_ids",), first=("episode",)))
#: The TED keys LeRobot names differently (other keys keep their "a.b" name; see `lerobot_column`).
LEROBOT_NAMES = {("observation",): "observation.state", ("pixels",): "observation.image"}
#: The columns LeRobot derives for every frame, and TorchRL's names of two of them (``"episode"``, ``"frame"``,
#: as an import of a LeRobot dataset names them): a stored entry of that name is dropped (the export writes them).
LEROBOT_DERIVED = ("timestamp", "frame_index", "episode_index", "index", "task_index", "episode", "frame")


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"`layout` must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}.")
    return layout


def column_name(key: tuple[str, ...]) -> str:
    for part in key:
        if "." in part:
            raise ValueError(
                f"Key {key!r} contains a '.', which the columns use to join nested keys ('a.b' is the key "
                f"('a', 'b')): the column name would be ambiguous. Rename the entry, or leave it out with "
                f"`exclude_keys=[{key!r}]`."
            )
    return ".".join(key)


def _is_observation(key: tuple[str, ...]) -> bool:
    return key[0] == "observation" or key in LEROBOT_NAMES


def lerobot_column(key: tuple[str, ...]) -> str | None:
    """The LeRobot column of a TED key; ``None`` for a key the layout drops: the next observation (the
    observation of the following frame in the same episode) and the columns LeRobot derives (``LEROBOT_DERIVED``)."""
    column_name(key)
    if key in LEROBOT_NAMES:
        return LEROBOT_NAMES[key]
    if key[0] == "observation":
        return ".".join(key)
    if key[0] == "next" and len(key) > 1 and _is_observation(key[1:]):
        return None
    if ".".join(key) in LEROBOT_DERIVED:  # the export writes its own (an import of a LeRobot dataset has them)
        return None
    return ".".join(key)


def lerobot_row_shape(key: tuple[str, ...], shape) -> list[int] | None:
    """The row shape of a LeRobot column when it differs from the items' shape, else ``None``: an item of
    shape ``[1]`` (a reward, a flag, a one-dimensional state) is one scalar per frame, as LeRobot stores every
    feature of shape ``[1]`` (its reader expects a ``Value`` column there)."""
    if list(shape) == [1]:
        return []
    return None


def export_order(storage, layout: str) -> torch.Tensor:
    """The storage positions in export order (see the module docstring)."""
    n = len(storage)
    if layout == "flat" or n == 0:
        return torch.arange(n)
    return oldest_first(storage, n)  # a ring buffer that wrapped: the oldest row follows the newest


def find_key(keys, given, defaults, what: str):
    """The trajectory key or end key to use: ``given`` (which must be present) or the first default present."""
    if given is not None:
        given = (given,) if isinstance(given, str) else tuple(given)
        if given not in keys:
            raise KeyError(
                f"`{what}`={given!r} is not a key of the stored items; they have {sorted(keys)}. Pass one of "
                f"them, or None to look for {', '.join(map(repr, defaults))}."
            )
        return given
    return next((k for k in defaults if k in keys), None)


class EpisodeCounter:
    """Episode and frame indices of consecutive chunks of rows, carried from one chunk to the next."""

    def __init__(self):
        self.episode = -1
        self.frame = 0
        self.prev_end = True
        self.prev_traj = None
        self.lengths: list[int] = []

    def update(self, end: torch.Tensor | None, traj: torch.Tensor | None, n: int):
        """``(episode_index, frame_index)`` int64 tensors of the next ``n`` rows."""
        start = torch.zeros(n, dtype=torch.bool)
        if end is not None:
            end = end.reshape(n, -1).any(-1)
            start[0] = self.prev_end
            start[1:] |= end[:-1]
        else:
            start[0] = self.episode < 0
        if traj is not None:
            traj = traj.reshape(n, -1)[:, 0]
            if self.prev_traj is not None:
                start[0] |= bool(traj[0] != self.prev_traj)
            start[1:] |= traj[1:] != traj[:-1]
            self.prev_traj = traj[-1].clone()
        if self.episode < 0:
            start[0] = True
        episode = self.episode + torch.cumsum(start.long(), 0)
        positions = torch.arange(n)
        starts = torch.where(start, positions, torch.full_like(positions, -1))
        last_start = torch.cummax(starts, 0).values  # -1 where the episode began in an earlier chunk
        frame = torch.where(last_start >= 0, positions - last_start, self.frame + positions)
        for e, count in zip(*torch.unique_consecutive(episode, return_counts=True)):
            if int(e) < len(self.lengths):
                self.lengths[int(e)] += int(count)
            else:
                self.lengths.append(int(count))
        self.episode, self.frame = int(episode[-1]), int(frame[-1]) + 1
        self.prev_end = bool(end[-1]) if end is not None else False
        return episode, frame
