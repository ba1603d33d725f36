"""Where drawn storage cells sit in the runs of interleaved trajectories: :class:`RunPositions`.

Readers that start from cells a sampler drew (the ``Sequence`` and ``FrameStack`` sample units, HER relabelling)
need, for each cell, its *position* in the sorted ``slots`` of an :class:`~.interleaved.InterleavedRuns` index and
the first and last positions of its run: a window or a goal is then positions of that range, read back as cells with
``slots[position]`` (NOTE [interleaved runs index] in ``interleaved.py``). The inverse of ``slots`` and the run
bounds per position are kept until the index changes (its ``version``).
"""

from __future__ import annotations

import torch

from torchrl.data.replay_buffers.trajectories.interleaved import InterleavedRuns

__all__ = ["RunPositions"]


class RunPositions:
    """An :class:`~.interleaved.InterleavedRuns` index with the lookup from storage cells to run positions.

    Args:
        traj_key (NestedKey, optional): the per-step trajectory id; ``None`` probes the storage (see
            :class:`~.interleaved.InterleavedRuns`).
        step_key (NestedKey): the per-step step number.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> from torchrl.data.replay_buffers.trajectories.run_positions import RunPositions
        >>> storage = LazyTensorStorage(8)
        >>> data = TensorDict(traj=torch.tensor([0, 1, 0, 1, 0]), step_count=torch.tensor([0, 0, 1, 1, 2]),
        ...     batch_size=[5])
        >>> storage.set(torch.arange(5), data)
        >>> lookup = RunPositions("traj", "step_count")
        >>> lookup.refresh(storage).slots.tolist()
        [0, 2, 4, 1, 3]
        >>> position, first, last = lookup.locate(torch.tensor([4, 1]))
        >>> position.tolist(), first.tolist(), last.tolist()
        ([2, 3], [0, 3], [2, 4])
    """

    def __init__(self, traj_key=None, step_key="step_count"):
        self.runs = InterleavedRuns(traj_key, step_key)
        self._version: int | None = None
        self._inverse = self._first = self._last = None

    def refresh(self, storage) -> InterleavedRuns:
        """Brings the index up to date with ``storage`` (see :meth:`InterleavedRuns.refresh`); returns it."""
        runs = self.runs
        runs.refresh(storage)
        if runs.version != self._version:
            slots = runs.slots
            size = int(slots.max()) + 1 if slots.numel() else 0
            inverse = torch.full((size,), -1, dtype=torch.long)
            inverse[slots] = torch.arange(slots.numel())
            first = torch.repeat_interleave(runs.run_start, runs.run_length)
            self._inverse, self._first = inverse, first
            self._last = first + torch.repeat_interleave(runs.run_length, runs.run_length) - 1
            self._version = runs.version
        return runs

    def locate(self, cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(position, first, last)`` of ``cells`` (int64, any shape; live cells of the refreshed storage): each
        cell's position in ``slots`` and the first and last positions of its run.

        Raises:
            IndexError: a cell holds no live step (outside the filled rows).
        """
        inverse = self._inverse
        cells = cells.to("cpu", torch.long)
        inside = (cells >= 0) & (cells < inverse.numel())
        if inverse.numel():
            position = torch.where(inside, inverse[cells.clamp(0, inverse.numel() - 1)], -1)
        else:
            position = torch.full_like(cells, -1)
        if bool((position < 0).any()):
            bad = int(cells[position < 0].reshape(-1)[0])
            raise IndexError(
                f"The drawn cell {bad} holds no stored step of the trajectory index ({self.runs.slots.numel()} "
                f"live steps): draw positions from the written data."
            )
        return position, self._first[position], self._last[position]

    def cells(self, positions: torch.Tensor) -> torch.Tensor:
        """The storage cells at ``positions`` of ``slots`` (one gather)."""
        return self.runs.slots[positions]

    def __getstate__(self):
        return {"runs": self.runs, "_version": None, "_inverse": None, "_first": None, "_last": None}
