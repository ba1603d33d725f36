"""The :class:`Sequence` sample unit: a window of steps around each drawn step, for recurrent learners.

Episodes are found with :mod:`torchrl.data.replay_buffers.trajectories` (ring layout, the one episode-end finder,
the live index on 1-D CPU tensor storages); with ``fragmented=True`` an episode is a run of consecutive steps of one
trajectory id in the interleaved index (NOTE [interleaved runs index] in ``trajectories/interleaved.py``).
"""

from __future__ import annotations

import weakref
from typing import Literal

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensorclass

from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers.sample_units.base import SampleUnit
from torchrl.data.replay_buffers.storages.tensor import TensorStorage
from torchrl.data.replay_buffers.trajectories.columns import (
    as_step_values,
    has_key,
    read_column,
    read_ring_range,
)
from torchrl.data.replay_buffers.trajectories.ends import find_trajectories
from torchrl.data.replay_buffers.trajectories.interleaved import check_fragmented_step_key
from torchrl.data.replay_buffers.trajectories.keys import normalize_key
from torchrl.data.replay_buffers.trajectories.layout import TrajectoryIndex, ring_layout
from torchrl.data.replay_buffers.trajectories.run_positions import RunPositions
from torchrl.data.replay_buffers.trajectories.sync import TrajectorySync, supports_live_index

__all__ = ["Sequence"]

_BOUNDARIES = ("pad", "stop", "include_reset")
_NO_POSITIONS = torch.zeros(0, dtype=torch.long)

SEQUENCE_PLAIN_TENSOR = TorchRLPhrase(
    TypeError,
    "TensorDict",
    "Sequence reads its done flags ({key!r}) from a TensorDict storage; this storage holds {got}. Store "
    "TensorDicts with a done entry, or pass done_key=None to treat the written span as one trajectory.",
)
SEQUENCE_LIST_STORAGE = TorchRLPhrase(
    TypeError,
    "TensorStorage",
    "Sequence reads done flags from a TensorStorage (LazyTensorStorage or LazyMemmapStorage), got {storage}.",
)


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
    return value


class Sequence(SampleUnit):
    """A window of steps around each drawn step (the *anchor*), for recurrent learners.

    Each anchor becomes ``W = burn_in + length + bootstrap`` records, ``dilation`` steps apart: ``burn_in`` steps
    before the anchor (to warm up a recurrent state), the ``length`` steps to learn from starting at the anchor,
    then ``bootstrap`` steps after them (for value targets). As in TorchRL, the output is **flat**: ``B``
    anchors give an index of ``B * W`` positions (a tuple of ``B * W`` positions per dim on ``ndim=2``
    storages), window-major (the ``W`` records of the first anchor come first), and a sampled batch has batch
    size ``[B * W]``. ``info`` (and a TensorDict batch) gets, one value per record:

    - ``"sequence_id"`` (int64): the window's number in the batch, ``0 .. B-1``, each repeated ``W`` times;
    - ``"step_in_sequence"`` (int64): the record's position in its window, ``0 .. W-1``;
    - ``"learning_mask"`` (bool): True on the ``length`` learning positions ``[burn_in, burn_in + length)``
      of every window (combine it with ``"validity_mask"`` to skip padded records);
    - ``"validity_mask"`` (bool): whether the record holds a step of the window (see ``episode_boundary``);
      invalid records repeat the nearest valid step;
    - ``"anchor_index"`` (int64): the drawn anchor of the window (``[B * W]``, or ``[B * W, ndim]`` with one
      ``(time, env)`` pair per record on ``ndim=2``), also where :meth:`anchor_priorities` writes priorities.

    Every other info entry of the sampler with at least one dim (``"priority_weight"``, ...) is repeated
    ``W`` times along its first dim, as :func:`torch.repeat_interleave` does; 0-d tensors and Python scalars
    are kept as they are.

    Episodes end at steps whose ``done_key`` is set and at the newest step of each stream (the write seam); the
    oldest data of a full ring buffer starts one. A step outside the written data is never read.

    Args:
        length (int): the number of learning steps, ``>= 1``.

    Keyword Args:
        episode_boundary (str): what happens where a window leaves the anchor's episode. ``"pad"``: the steps
            outside it read the nearest step of the episode and are invalid. ``"stop"``: a window that would run
            past the end of the episode is moved back so that it ends at the episode's last step (never so far
            that the anchor leaves it, nor before the episode start: a shorter episode leaves padded, invalid
            records at the end); ``"anchor_index"`` keeps the drawn anchor. ``"include_reset"``: windows run
            across done steps into the next episode (use the done flags to reset a recurrent state); only the
            write seam and the unwritten slots bound them (padded, invalid). Defaults to ``"pad"``.
        done_key (NestedKey or None): the per-step done flag in the storage (``[N]`` or ``[N, 1]`` flags; any
            nested key). ``None``: the whole written span is one trajectory, bounded only by the write seam (no
            entry is read, so any :class:`~torchrl.data.TensorStorage` works). Defaults to ``("next", "done")``.
        burn_in (int): steps before the anchor. Defaults to ``0``.
        bootstrap (int): steps after the learning steps. Defaults to ``0``.
        dilation (int): the distance between consecutive steps of a window. Defaults to ``1``.
        fragmented (bool): the steps of several trajectories are interleaved in the storage (vectorised envs or
            collectors writing step by step): a window holds steps of the anchor's trajectory in step order
            (``step_key``), wherever they are stored, and its episode is the anchor's run of consecutive steps (a
            missing step ends it as an episode end does; ``done_key`` plays no role). These are the keywords of
            ``SliceSampler(fragmented=True)``, which TorchRL's ``Sequence`` does not take: issue 41 adds them.
            ``episode_boundary="include_reset"`` needs env streams and is refused. Defaults to ``False``.
        step_key (NestedKey): with ``fragmented=True``, the stored per-step step number. Defaults to
            ``"step_count"``.
        traj_key (NestedKey, optional): with ``fragmented=True``, the stored per-step trajectory id. Defaults to
            ``None``: the storage's ``("collector", "traj_ids")``, else ``"episode"``.

    .. note:: It needs a :class:`~torchrl.data.TensorStorage` (``ndim=1``, or ``ndim=2`` for ``[time, envs]``,
        each env column one stream) holding TensorDicts with ``done_key``. Episode boundaries are computed once
        per storage write and cached (writes of other processes to a shared storage count).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, Sequence
        >>> storage = LazyTensorStorage(10)
        >>> done = torch.tensor([False, False, True, False, False, False])
        >>> storage.set(torch.arange(6), TensorDict(obs=torch.arange(6), next=TensorDict(done=done, batch_size=[6]),
        ...     batch_size=[6]))
        >>> unit = Sequence(3)
        >>> index, info = unit.expand(torch.tensor([1, 3]), {}, storage)
        >>> index  # anchor 1 leaves its episode [0, 2] after step 2: padded with step 2
        tensor([1, 2, 2, 3, 4, 5])
        >>> info["validity_mask"]
        tensor([ True,  True, False,  True,  True,  True])
        >>> info["sequence_id"], info["step_in_sequence"], info["anchor_index"]
        (tensor([0, 0, 0, 1, 1, 1]), tensor([0, 1, 2, 0, 1, 2]), tensor([1, 1, 1, 3, 3, 3]))
        >>> unit.read(storage, index)["obs"].reshape(2, unit.window)  # one row per window
        tensor([[1, 2, 2],
                [3, 4, 5]])
    """

    _live: TrajectorySync | None = None
    fragmented: bool = False  # (pickles made before the keyword load as contiguous units)
    _runs: RunPositions | None = None

    def __init__(
        self,
        length: int,
        episode_boundary: Literal["pad", "stop", "include_reset"] = "pad",
        done_key=("next", "done"),
        burn_in: int = 0,
        bootstrap: int = 0,
        dilation: int = 1,
        *,
        fragmented: bool = False,
        step_key="step_count",
        traj_key=None,
    ):
        self.length = _check_int("length", length, 1)
        if episode_boundary not in _BOUNDARIES:
            raise ValueError(f"`episode_boundary` must be one of {_BOUNDARIES}, got {episode_boundary!r}.")
        self.episode_boundary = episode_boundary
        self.done_key = None if done_key is None else normalize_key(done_key)
        self.burn_in = _check_int("burn_in", burn_in, 0)
        self.bootstrap = _check_int("bootstrap", bootstrap, 0)
        self.dilation = _check_int("dilation", dilation, 1)
        self.fragmented = check_fragmented_step_key(fragmented, step_key)
        if fragmented and episode_boundary == "include_reset":
            raise ValueError(
                "Sequence(fragmented=True) cannot take episode_boundary='include_reset': interleaved trajectories "
                "have no env stream to run on into. Pass episode_boundary='pad' or 'stop'."
            )
        self.step_key = None if step_key is None else normalize_key(step_key)
        self.traj_key = None if traj_key is None else normalize_key(traj_key)
        self._runs = RunPositions(self.traj_key, self.step_key) if fragmented else None
        self._cache: tuple | None = None  # (weakref to the storage, its write state, TrajectoryIndex)
        self._live: TrajectorySync | None = None  # NOTE [live trajectory index]; per process, never pickled

    @property
    def trajectory_index_stats(self) -> dict[str, int]:
        """How this copy of the unit followed the writes: ``{"rebuilds": n, "catch_ups": m}`` (see
        :attr:`SliceSampler.trajectory_index_stats <torchrl.data.SliceSampler.trajectory_index_stats>`).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(20)
            >>> done = (torch.arange(8) % 4 == 3).unsqueeze(-1)
            >>> storage.set(torch.arange(8), TensorDict(next=TensorDict(done=done, batch_size=[8]), batch_size=[8]))
            >>> unit = Sequence(2)
            >>> _ = unit.expand(torch.tensor([0, 5]), {}, storage)
            >>> storage.set(torch.arange(8, 12), TensorDict(next=TensorDict(done=done[:4], batch_size=[4]), batch_size=[4]))
            >>> _ = unit.expand(torch.tensor([9]), {}, storage)
            >>> unit.trajectory_index_stats
            {'rebuilds': 1, 'catch_ups': 1}
        """
        live = self._live
        return {"rebuilds": 0 if live is None else live.rebuilds, "catch_ups": 0 if live is None else live.catch_ups}

    @property
    def window(self) -> int:
        """The number of records of each window: ``burn_in + length + bootstrap``."""
        return self.burn_in + self.length + self.bootstrap

    # -- episodes ------------------------------------------------------------------------------------------------
    def _episodes(self, storage) -> TrajectoryIndex:
        n_rows, n_cols, offset, last_row = ring_layout(storage)
        # the revision is a shared counter for shared storages: another process's write changes it too
        state = (storage.write_revision, len(storage), n_rows, offset, last_row)
        cache = self._cache
        if cache is not None and cache[0]() is storage and cache[1] == state:
            return cache[2]
        if self.done_key is None:  # one trajectory per stream, cut at the write seam only
            flags = torch.zeros(n_rows, n_cols, dtype=torch.bool)
        else:
            column = read_column(storage, self._checked_done_key(storage), n_rows)
            flags = as_step_values(
                column, n_rows, n_cols, name=f"done flags {self.done_key!r}", reduce_any=True
            )
        episodes = find_trajectories(
            flags,
            is_done=True,
            n_rows=n_rows,
            n_cols=n_cols,
            offset=offset,
            last_row=last_row,
            ndim=storage.ndim,
        )
        self._cache = (weakref.ref(storage), state, episodes)
        return episodes

    def _live_episodes(self, storage):
        """The incremental episode index of a 1-D CPU tensor storage (NOTE [live trajectory index]), or ``None``
        where the whole storage is read (``ndim=2``, another device, ``done_key=None``, a layout it cannot
        follow)."""
        if self.done_key is None or not supports_live_index(storage):
            return None
        live = self._live
        if live is None:
            live = self._live = TrajectorySync()
        source = ((self._checked_done_key(storage),), True)
        return live.current(storage, source, self._live_values_all, self._live_values_at)

    def _live_values_all(self, storage, source: tuple, n_rows: int) -> torch.Tensor:
        column = read_column(storage, source[0][0], n_rows)
        return as_step_values(column, n_rows, 1, name=f"done flags {self.done_key!r}", reduce_any=True)

    @staticmethod
    def _live_values_at(storage, source: tuple, start: int, k: int):
        return read_ring_range(storage, source[0], True, start, k, who="Sequence")

    def _bounds_of(self, storage, parts: list[torch.Tensor]):
        """``(layout, anchor, start, last)``: the flat anchors and the first/last flat steps of their episodes."""
        live = self._live_episodes(storage)
        if live is not None:
            layout = TrajectoryIndex(
                starts=_NO_POSITIONS, lengths=_NO_POSITIONS, n_rows=live.n_rows, n_cols=1, offset=live.offset, ndim=1
            )
            anchor = layout.flat_positions(parts[0].remainder(live.n_rows))
            start, last = live.locate(anchor.numpy())
            return layout, anchor, torch.from_numpy(start), torch.from_numpy(last)
        episodes = self._episodes(storage)
        device = episodes.starts.device
        n, n_cols = episodes.n_rows, episodes.n_cols
        row = parts[0].to(device).remainder(n)
        col = parts[1].to(device).remainder(n_cols) if len(parts) > 1 else torch.zeros_like(row)
        anchor = episodes.flat_positions(row, col)
        which = torch.searchsorted(episodes.starts, anchor, right=True) - 1
        start = episodes.starts[which]
        last = start + episodes.lengths[which] - 1
        return episodes, anchor, start, last

    def _run_bounds(self, storage, parts: list[torch.Tensor]):
        """``fragmented=True``: ``(to_storage, anchor, start, last, row, col)``: the anchors' positions among the
        interleaved steps sorted by (trajectory, step) and the first/last positions of their runs
        (:class:`~torchrl.data.replay_buffers.trajectories.run_positions.RunPositions`), a function from positions
        to ``(rows, cols)`` of the storage (``cols`` ``None`` on 1-D storages), and the anchors' rows and columns."""
        lookup = self._runs
        runs = lookup.refresh(storage)
        n, n_cols = runs.n_rows, runs.n_cols
        row = parts[0].remainder(max(n, 1))
        col = parts[1].remainder(n_cols) if len(parts) > 1 else torch.zeros_like(row)
        anchor, start, last = lookup.locate(row * n_cols + col)

        def to_storage(positions: torch.Tensor) -> tuple:
            cells = lookup.cells(positions)
            if n_cols == 1:
                return cells, None
            return torch.div(cells, n_cols, rounding_mode="floor"), cells.remainder(n_cols)

        return to_storage, anchor, start, last, row.cpu(), col.cpu()

    def _checked_done_key(self, storage):
        """``done_key``, once checked to be stored (TypeError for storages of plain tensors, else KeyError)."""
        if has_key(storage, self.done_key):
            return self.done_key
        item = storage.get(torch.zeros(1, dtype=torch.long))
        if not (isinstance(item, TensorDictBase) or is_tensorclass(item)):
            got = "plain tensors" if isinstance(item, torch.Tensor) else f"{type(item).__name__} items"
            raise SEQUENCE_PLAIN_TENSOR.error(key=self.done_key, got=got)
        raise KeyError(
            f"Sequence finds episodes with the done flags {self.done_key!r}, which the storage does not hold: "
            f"pass `done_key` naming the stored done entry (or done_key=None: the written span is one trajectory)."
        )

    def _check_storage(self, storage) -> None:
        if not isinstance(storage, TensorStorage):
            raise SEQUENCE_LIST_STORAGE.error(storage=type(storage).__name__)
        if storage.ndim > 2:
            raise ValueError(
                f"Sequence handles storages with ndim=1 or 2 ([time, envs]), got ndim={storage.ndim}."
            )
        if len(storage) == 0:
            raise RuntimeError("Cannot sample sequences from an empty storage: add data first.")

    def _anchors(self, index, storage) -> list[torch.Tensor]:
        """The drawn anchors as one flat int64 tensor per storage dim, checked to lie in the written data."""
        parts = [
            torch.as_tensor(i).reshape(-1).long() for i in (index if isinstance(index, tuple) else (index,))
        ]
        if len(parts) != storage.ndim:
            raise ValueError(
                f"Sequence got an index with {len(parts)} dim(s) for a storage with ndim={storage.ndim}: pass one "
                f"index tensor per storage dim."
            )
        if any(p.shape != parts[0].shape for p in parts):
            raise ValueError(
                f"Sequence got per-dim index tensors of {[p.numel() for p in parts]} positions: pass one position "
                f"per anchor along each dim."
            )
        sizes = (storage.rows_written(), *storage.shape[1 : storage.ndim])
        for dim, (part, size) in enumerate(zip(parts, sizes)):
            outside = (part < -size) | (part >= size)
            if outside.any():
                raise IndexError(
                    f"Sequence got the anchor {int(part[outside][0])} along dim {dim}, outside the {size} written "
                    f"positions of that dim: pass anchors drawn from the written data (0..{size - 1})."
                )
        return parts

    # -- contract ------------------------------------------------------------------------------------------------
    def expand(self, index, info: dict, storage) -> tuple:
        """Expands the anchors ``index`` (``[B]``, or a tuple of ``[B]`` tensors) into ``B * W`` positions.

        Returns:
            ``(index, info)``: ``index`` of shape ``[B * W]`` (a tuple of ``[B * W]`` tensors, one per storage
            dim, when ``index`` is a tuple), window-major; ``info`` with every entry repeated per record and the
            entries listed in the class docstring added.
        """
        self._check_storage(storage)
        parts = self._anchors(index, storage)
        if self.fragmented:  # positions of the sorted interleaved steps: runs are ranges of them
            to_storage, anchor, start, last, row, col = self._run_bounds(storage, parts)
        else:
            episodes, anchor, start, last = self._bounds_of(storage, parts)
            to_storage = episodes.storage_rows
            n, n_cols = episodes.n_rows, episodes.n_cols
            row = parts[0].to(anchor.device).remainder(n)
            col = parts[1].to(anchor.device).remainder(n_cols) if len(parts) > 1 else torch.zeros_like(row)
            if self.episode_boundary == "include_reset":  # the whole stream, from the oldest to the newest step
                start, last = col * n, col * n + n - 1
        device = anchor.device
        offsets = (torch.arange(self.window, device=device) - self.burn_in) * self.dilation
        steps = anchor.unsqueeze(-1) + offsets  # [B, W]
        if self.episode_boundary == "stop":  # move back to end at the episode end, the anchor staying inside
            overrun = (steps[:, -1] - last).clamp(min=0)
            back = torch.minimum(-(-overrun // self.dilation), (anchor - start) // self.dilation)
            steps = steps - (back * self.dilation).unsqueeze(-1)
        valid = (steps >= start.unsqueeze(-1)) & (steps <= last.unsqueeze(-1))
        steps = torch.minimum(torch.maximum(steps, start.unsqueeze(-1)), last.unsqueeze(-1))
        b, w = steps.shape
        rows, cols = to_storage(steps.reshape(-1))
        new_info = {key: _per_record(value, w) for key, value in info.items()}
        if storage.ndim == 1:
            expanded = (rows,) if isinstance(index, tuple) else rows
            drawn = row
        else:
            expanded = (rows, torch.zeros_like(rows) if cols is None else cols)
            drawn = torch.stack([row, col], -1)
        learning = torch.zeros(w, dtype=torch.bool, device=device)
        learning[self.burn_in : self.burn_in + self.length] = True
        new_info["sequence_id"] = torch.arange(b, device=device).repeat_interleave(w)
        new_info["step_in_sequence"] = torch.arange(w, device=device).repeat(b)
        new_info["learning_mask"] = learning.repeat(b)
        new_info["validity_mask"] = valid.reshape(-1)
        new_info["anchor_index"] = drawn.repeat_interleave(w, dim=0)
        return expanded, new_info

    def read(self, storage, index):
        """Reads the ``B * W`` positions of :meth:`expand` (one gather): data of batch size ``[B * W]``."""
        if isinstance(index, tuple) and len(index) == 1:
            index = index[0]
        return storage.get(index)

    def anchor_priorities(self, data: TensorDictBase, priority: torch.Tensor, *, index_key="index"):
        """One priority per drawn anchor: the max of ``priority`` over the anchor's valid records.

        Records of several windows on the same anchor are reduced together; padded (invalid) records are
        ignored. :meth:`TensorDictReplayBuffer.update_tensordict_priority` writes the result to the anchors'
        slots only.

        Args:
            data (TensorDictBase): a batch sampled with this unit (it holds ``"anchor_index"`` and
                ``"validity_mask"``).
            priority (Tensor): one priority per record, ``[B * W]`` (trailing dims are reduced with ``max``).

        Returns:
            ``(anchor, priority)``: the distinct anchors, sorted (``[K]``, or ``[K, ndim]`` of
            ``(time, env)`` pairs), and their priorities ``[K]``.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import Sequence
            >>> batch = TensorDict(anchor_index=torch.tensor([7, 7, 7, 7, 3, 3, 3, 3]),
            ...     validity_mask=torch.tensor([True, True, True, False] * 2), batch_size=[8])
            >>> Sequence(4).anchor_priorities(batch, torch.tensor([1.0, 2.0, 3.0, 50.0, 4.0, 5.0, 6.0, 60.0]))
            (tensor([3, 7]), tensor([6., 3.]))
        """
        anchor = data.get("anchor_index", None)
        valid = data.get("validity_mask", None)
        if anchor is None or valid is None:
            raise KeyError(
                "anchor_priorities() needs the 'anchor_index' and 'validity_mask' entries that sampling with a "
                "Sequence unit writes into the batch."
            )
        valid = torch.as_tensor(valid).bool()
        priority = torch.as_tensor(priority, device=valid.device)
        anchor = torch.as_tensor(anchor, device=valid.device)
        if priority.shape[: valid.ndim] != valid.shape:
            raise ValueError(
                f"`priority` has shape {list(priority.shape)}; expected one value per sampled record, "
                f"{list(valid.shape)}."
            )
        if anchor.shape[: valid.ndim] != valid.shape:
            raise ValueError(
                f"'anchor_index' has shape {list(anchor.shape)}; expected one anchor per sampled record, "
                f"{list(valid.shape)}."
            )
        n, lead = valid.numel(), valid.ndim  # records may come flat ([B * W]) or reshaped ([B, W])
        priority = priority.reshape(n, -1).amax(-1) if priority.ndim > lead else priority.reshape(n)
        anchor = anchor.reshape(n, *anchor.shape[lead:])
        valid = valid.reshape(n)
        anchor, priority = anchor[valid], priority[valid]
        if anchor.ndim == 1:
            distinct, which = torch.unique(anchor, return_inverse=True)
        else:
            distinct, which = torch.unique(anchor, dim=0, return_inverse=True)
        out = torch.zeros(distinct.shape[0], dtype=priority.dtype, device=priority.device)
        out = out.scatter_reduce(0, which, priority, reduce="amax", include_self=False)
        return distinct, out

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = None
        state["_live"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"Sequence(length={self.length}, episode_boundary={self.episode_boundary!r}, done_key={self.done_key!r}, "
            f"burn_in={self.burn_in}, bootstrap={self.bootstrap}, dilation={self.dilation}"
            + (f", fragmented=True, step_key={self.step_key!r}, traj_key={self.traj_key!r})" if self.fragmented else ")")
        )


def _per_record(value, w: int):
    """A sampler info value for ``B * W`` records: repeated ``w`` times along dim 0 when it has a dim."""
    if isinstance(value, torch.Tensor):
        return value if value.ndim == 0 else value.repeat_interleave(w, dim=0)
    if isinstance(value, np.ndarray):
        return value if value.ndim == 0 else np.repeat(value, w, axis=0)
    if isinstance(value, tuple):
        return tuple(_per_record(v, w) for v in value)
    if isinstance(value, list):
        try:
            return _per_record(torch.as_tensor(value), w)
        except (TypeError, ValueError, RuntimeError):
            return [v for v in value for _ in range(w)]
    return value  # Python scalars and other objects
