"""Frame stacks rebuilt at sample time from frames stored once: the :class:`FrameStack` sample unit.

Data model. The storage holds one frame per step (e.g. ``"pixels"``: ``[C, H, W]``) and an episode signal per
step: a trajectory id (``traj_key``) or a done flag (``end_key``, set on an episode's last step). The sampler
draws ``B`` anchors (the steps ``t`` whose stacks are returned); :meth:`FrameStack.expand` turns each into the
``k`` rows of ``t-k+1 .. t`` in ring order (see :mod:`torchrl.data.replay_buffers.trajectories.layout`), where the slots before ``t``'s episode
start are clamped to that start. The episode start is found from the signal of those ``k`` rows only (``O(B k)``,
no scan of the storage, no cache), and a window never reaches across the write seam: the oldest row of a full
ring (or row 0 of one that is not full) starts the stored history. Clamped slots repeat a row, so
:meth:`FrameStack.read` tells them from real ones by the index alone: slot ``j`` is padding iff it reads the
same row as slot ``j + 1``. With ``fragmented=True`` (steps of several trajectories interleaved), the window is
instead ``t-k+1 .. t`` in step order within ``t``'s run of consecutive steps of one trajectory id, read from the
interleaved index (NOTE [interleaved runs index] in ``trajectories/interleaved.py``), clamped to the run's first step.
"""

from __future__ import annotations

import functools

import torch
from tensordict import NestedKey, TensorDictBase

from torchrl._validation import check_positive_int, is_real
from torchrl.data.replay_buffers.sample_units.base import SampleUnit
from torchrl.data.replay_buffers.storages.tensor import TensorStorage
from torchrl.data.replay_buffers.trajectories.columns import read_column
from torchrl.data.replay_buffers.trajectories.interleaved import check_fragmented_step_key
from torchrl.data.replay_buffers.trajectories.keys import DONE_KEY, normalize_key, trajectory_keys
from torchrl.data.replay_buffers.trajectories.layout import ring_layout
from torchrl.data.replay_buffers.trajectories.run_positions import RunPositions

__all__ = ["FrameStack"]

_PADDINGS = ("same", "constant")
#: The trajectory-id entries probed without `traj_key`/`end_key` (then DONE_KEY): the slice samplers' probe, no root
#: "traj_ids".
_PROBED_TRAJ_KEYS = trajectory_keys(exclude=("traj_ids",))


def _next_key(key) -> tuple:
    return ("next", key) if isinstance(key, str) else ("next", *key)


@functools.lru_cache(maxsize=32)
def _aranges(k: int, device: torch.device) -> tuple:
    """``(window, slots, weights)`` on ``device``: ``arange(1 - k, 1)``, ``arange(k)`` and ``[1, ..., k - 1, 0]``
    (constants, made once; never written in place)."""
    weights = torch.arange(1, k + 1, device=device)
    weights[-1] = 0
    return torch.arange(1 - k, 1, device=device), torch.arange(k, device=device), weights


def _as_index(index) -> torch.Tensor:
    """``index`` as a 1-D int64 tensor (itself when it is one)."""
    if isinstance(index, torch.Tensor) and index.dtype == torch.int64 and index.ndim == 1:
        return index
    return torch.as_tensor(index).reshape(-1).long()


class FrameStack(SampleUnit):
    """Samples ``[B, k, *frame]`` stacks of the last ``k`` frames of each drawn step, from frames stored once.

    Atari-style agents learn from the last ``k`` frames of each step. Storing those stacks costs ``k`` times
    the memory of the frames (each frame is in ``k`` stacks); with this unit the storage holds each frame once
    and the stacks are read at sample time, in one gather. A stack never reaches across an episode start (its
    earlier slots are padded: the episode's first frame repeated, or ``padding_value``) nor across the
    ring buffer's write seam (the oldest stored step starts the history).

    Pass it to a buffer as ``sample_unit=``; the buffer's sampler draws the steps whose stacks are returned
    (uniformly with the default :class:`~torchrl.data.RandomSampler`, which is stateless, so DataLoader
    workers of ``rb.as_dataset()`` each draw on their own; prioritized and without-replacement samplers work
    too, priorities being those of the drawn steps). A sampled batch has batch size ``[B]``: the frame entries
    are ``[B, k, *frame]`` stacks (oldest first), every other entry is that of the drawn step, and
    ``"index"`` (in a :class:`~torchrl.data.TensorDictReplayBuffer` batch and in ``info``) is the ``[B, k]``
    rows read. The unit holds configuration only (nothing to checkpoint: it is rebuilt with the buffer).

    Args:
        num_frames (int): ``k``, the frames per stack.
        frame_keys (NestedKey or list of NestedKey): the frame entries to stack. Defaults to ``"pixels"``.

    Keyword Args:
        traj_key (NestedKey, optional): a stored per-step trajectory id; an episode is a run of consecutive
            steps with the same id. Excludes ``end_key``. Defaults to ``None``.
        end_key (NestedKey, optional): a stored per-step done flag, set on the last step of each episode.
            With neither key, the storage's ``("collector", "traj_ids")``, ``"episode"`` or ``("next",
            "done")`` is used (the first stored). Defaults to ``None``.
        padding (str): ``"same"`` (repeat the episode's first frame, as Atari agents do) or ``"constant"``
            (``padding_value``), as :class:`~torchrl.envs.transforms.CatFrames`. Defaults to ``"same"``.
        padding_value (float): the fill value of ``"constant"`` padding. Defaults to ``0``.
        next_frames (bool): also return ``("next", key)`` stacks: the stack shifted by one frame, with the
            stored ``("next", key)`` frame of the drawn step appended (it must be stored). Defaults to ``False``.
        mask_key (NestedKey, optional): where to write a bool ``[B, k]`` mask, ``True`` on padded slots (as
            ``CatFrames``' ``mask_key``). Defaults to ``None`` (no mask).
        fragmented (bool): the steps of several trajectories are interleaved in the storage (vectorised envs or
            collectors writing step by step): a stack holds the previous steps of the drawn step's trajectory by
            ``step_key``, wherever they are stored, and a missing step starts the stack's episode as a trajectory
            start does (the keywords of ``SliceSampler(fragmented=True)``; issue 41 adds them to this unit, which
            TorchRL does not have). Needs a trajectory id (``traj_key``, or the stored ``("collector",
            "traj_ids")`` or ``"episode"``); ``end_key`` plays no role and is refused. Defaults to ``False``.
        step_key (NestedKey): with ``fragmented=True``, the stored per-step step number. Defaults to
            ``"step_count"``.

    .. note:: It reads a :class:`~torchrl.data.TensorStorage` (``LazyTensorStorage``, ``LazyMemmapStorage``)
        of TensorDicts, ``ndim=1`` or ``ndim=2`` (``[time, envs]``: each env column is a stream).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from torchrl.data.replay_buffers.sample_units import FrameStack
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), sample_unit=FrameStack(4, traj_key="episode"))
        >>> steps = torch.arange(30)  # 3 episodes of 10 steps; frame value = step
        >>> _ = rb.extend(TensorDict(pixels=steps.view(30, 1, 1, 1).expand(30, 1, 2, 2).to(torch.uint8),
        ...     episode=steps // 10, batch_size=[30]))
        >>> batch, info = rb.sample(8, return_info=True)
        >>> batch["pixels"].shape
        torch.Size([8, 4, 1, 2, 2])
        >>> unit = FrameStack(3, traj_key="episode", padding="constant", mask_key="pad")
        >>> index, _ = unit.expand(torch.tensor([11, 25]), {}, rb.storage)
        >>> index
        tensor([[10, 10, 11],
                [23, 24, 25]])
        >>> out = unit.read(rb.storage, index)
        >>> out["pixels"][:, :, 0, 0, 0], out["pad"], out["episode"]
        (tensor([[ 0, 10, 11],
                [23, 24, 25]], dtype=torch.uint8), tensor([[ True, False, False],
                [False, False, False]]), tensor([1, 2]))
    """

    fragmented: bool = False  # (pickles made before the keyword load as contiguous units)
    _runs: RunPositions | None = None

    def __init__(
        self,
        num_frames: int,
        frame_keys: NestedKey | list[NestedKey] = "pixels",
        *,
        traj_key: NestedKey | None = None,
        end_key: NestedKey | None = None,
        padding: str = "same",
        padding_value: float = 0,
        next_frames: bool = False,
        mask_key: NestedKey | None = None,
        fragmented: bool = False,
        step_key: NestedKey = "step_count",
    ):
        self.num_frames = check_positive_int("num_frames", num_frames, hint="Pass the frames per stack, e.g. 4.")
        keys = [frame_keys] if isinstance(frame_keys, (str, tuple)) else list(frame_keys)
        if not keys:
            raise ValueError("`frame_keys` must name at least one frame entry, e.g. 'pixels'; got none.")
        self.frame_keys = [normalize_key(k) for k in keys]
        if traj_key is not None and end_key is not None:
            raise ValueError(
                f"Pass one episode signal: `traj_key` (per-step trajectory ids, got {traj_key!r}) or `end_key` "
                f"(per-step done flags, got {end_key!r}), not both."
            )
        self.traj_key = None if traj_key is None else normalize_key(traj_key)
        self.end_key = None if end_key is None else normalize_key(end_key)
        self.fragmented = check_fragmented_step_key(fragmented, step_key)
        if fragmented and end_key is not None:
            raise ValueError(
                f"FrameStack(fragmented=True) finds episodes by trajectory id and step number; done flags "
                f"(`end_key`={end_key!r}) cannot tell interleaved trajectories apart. Drop `end_key`, and pass "
                f"`traj_key` naming the stored trajectory id."
            )
        self.step_key = None if step_key is None else normalize_key(step_key)
        self._runs = RunPositions(self.traj_key, self.step_key) if fragmented else None
        if padding == "zeros":
            raise ValueError("`padding`='zeros' is spelled padding='constant' (padding_value defaults to 0).")
        if padding not in _PADDINGS:
            raise ValueError(f"`padding` must be one of {_PADDINGS}, got {padding!r}.")
        if not is_real(padding_value):
            raise TypeError(f"`padding_value` must be a number, got {padding_value!r}.")
        self.padding = padding
        self.padding_value = padding_value
        if not isinstance(next_frames, bool):
            raise TypeError(f"`next_frames` must be a bool, got {next_frames!r}.")
        self.next_frames = next_frames
        self.mask_key = None if mask_key is None else normalize_key(mask_key)

    # -- the episode signal -------------------------------------------------------------------------------------
    def _signal(self, storage) -> tuple:
        """``(key, is_done, column)``: the stored entry that says where episodes start, and its values over every
        row of the backing (a view, looked up at each call: nothing about the storage is cached)."""
        if self.traj_key is not None:
            candidates = [(self.traj_key, False)]
        elif self.end_key is not None:
            candidates = [(self.end_key, True)]
        else:
            candidates = [(k, False) for k in _PROBED_TRAJ_KEYS] + [(DONE_KEY, True)]
        for key, is_done in candidates:
            column = storage.get_entry(key)
            if column is not None:
                if not isinstance(column, torch.Tensor):  # a group of entries: read_column names the fix
                    column = read_column(storage, key, storage.rows_written())
                return key, is_done, column
        tried = [key for key, _ in candidates]
        raise KeyError(
            f"FrameStack needs an episode signal to keep stacks inside episodes, but the storage holds none of "
            f"{tried}. Pass `traj_key` (a stored per-step trajectory id) or `end_key` (a stored per-step done flag "
            f"set on each episode's last step) naming a stored entry."
        )

    def _check_storage(self, storage) -> None:
        if not isinstance(storage, TensorStorage):
            raise TypeError(
                f"FrameStack reads a TensorStorage (LazyTensorStorage or LazyMemmapStorage) of TensorDicts, got a "
                f"{type(storage).__name__}: build the buffer with one of those."
            )
        if storage.ndim > 2:
            raise ValueError(
                f"FrameStack handles storages with ndim=1 or ndim=2 ([time, envs]), got ndim={storage.ndim}: "
                f"flatten the env dims into one before storing."
            )
        if len(storage) == 0:
            raise RuntimeError("Cannot sample frame stacks from an empty storage: add data first (rb.extend).")

    # -- the contract -------------------------------------------------------------------------------------------
    def expand(self, index, info: dict, storage) -> tuple:
        """The ``[B, k]`` rows of the stacks ending at the drawn steps ``index`` (``[B]``; a ``(time, env)``
        tuple of ``[B]`` tensors on ``ndim=2``), padded slots clamped to the episode start; ``info`` unchanged.

        Raises:
            KeyError: the storage holds no episode signal (see ``traj_key``/``end_key``).
            IndexError: a drawn step lies outside the written rows.
        """
        self._check_storage(storage)
        n, n_cols, offset, _ = ring_layout(storage)
        parts = [_as_index(i) for i in (index if isinstance(index, tuple) else (index,))]
        if len(parts) != storage.ndim:
            raise ValueError(
                f"FrameStack got an index with {len(parts)} dim(s) for a storage with ndim={storage.ndim}: pass "
                f"one index tensor per storage dim."
            )
        row = parts[0]
        k = self.num_frames
        low = 0
        if row.numel():
            low, high = torch.aminmax(row)
            low, high = int(low), int(high)
            if low < 0 or high >= n:
                bad = (row < 0) | (row >= n)
                raise IndexError(
                    f"FrameStack got the step {int(row[bad][0])}, outside the {n} written rows: draw steps from "
                    f"the written data (0..{n - 1})."
                )
        col = parts[1].remainder(n_cols) if len(parts) > 1 else None
        window, slots, weights = _aranges(k, row.device)
        if self.fragmented:  # the window in step order within the run, wherever its steps are stored
            rows, col = self._interleaved_window(storage, row, col, window)
        else:
            # the window t-k+1 .. t (oldest first) in unrolled positions; slots before the oldest stored step (the
            # write seam: position 0) read that step
            if offset:
                steps = ((row - offset).remainder_(n).unsqueeze(-1) + window).clamp_min_(0)
                rows = (steps + offset).remainder_(n)
            else:
                rows = row.unsqueeze(-1) + window
                if low < k - 1:
                    rows.clamp_min_(0)
            first = self._episode_start(storage, rows, col, weights)
            if first is not None:  # slot j < first reads the row of slot ``first``
                rows = rows.gather(1, torch.maximum(slots, first))
        if col is None:
            expanded = (rows,) if isinstance(index, tuple) else rows
        else:
            expanded = (rows, col.unsqueeze(-1).expand_as(rows) if col.ndim == 1 else col)
        return expanded, dict(info)

    def _interleaved_window(self, storage, row: torch.Tensor, col, window: torch.Tensor) -> tuple:
        """``fragmented=True``: ``(rows, cols)`` ``[B, k]`` of the steps ``t-k+1 .. t`` of each drawn step's run of
        consecutive steps (:class:`~torchrl.data.replay_buffers.trajectories.run_positions.RunPositions`), the slots
        before the run's first step clamped to it; ``cols`` is ``None`` on 1-D storages."""
        lookup = self._runs
        runs = lookup.refresh(storage)
        n_cols = runs.n_cols
        cells = row if col is None else row * n_cols + col
        position, first, _ = lookup.locate(cells)
        cells = lookup.cells(torch.maximum(position.unsqueeze(-1) + window.cpu(), first.unsqueeze(-1)))
        cells = cells.to(row.device)
        if col is None:
            return cells, None
        return torch.div(cells, n_cols, rounding_mode="floor"), cells.remainder(n_cols)

    def _episode_start(self, storage, rows: torch.Tensor, col, weights: torch.Tensor):
        """Int ``[B, 1]``: the first slot of each window in the episode of its last slot (``None`` for ``k = 1``).

        ``rows`` (``[B, k]``) are the window's rows, those before the oldest stored step clamped to it. Slot
        ``j < k - 1`` ends the episode of the slots up to it when its id differs from the last slot's (a done
        flag: when it is set), so the episode starts after the last such slot: ``(ends * weights).amax(1)``
        with ``weights = [1, ..., k - 1, 0]`` (0: the last slot's own flag does not count).
        """
        key, is_done, column = self._signal(storage)
        per_step = column.shape[storage.ndim :].numel()
        if per_step != 1 and not is_done:
            raise ValueError(
                f"The trajectory ids {key!r} hold {per_step} values per step; FrameStack needs one id per step "
                f"(shape [N] or [N, 1])."
            )
        if self.num_frames == 1:
            return None
        if per_step == 1 and column.is_contiguous() and column.device == rows.device:  # one value per cell
            values = column.take(rows if col is None else rows * column.shape[1] + col.unsqueeze(-1))
        else:
            values = column[rows] if col is None else column[rows, col.unsqueeze(-1)]
            values = values.to(rows.device).reshape(*rows.shape, -1)
            values = values.bool().any(-1) if is_done else values[..., 0]
        if is_done:  # a done slot ends its episode: the slots up to it are outside the next one
            ends = values if values.dtype == torch.bool else values.bool()
        else:
            ends = values != values[:, -1:]
        return (ends * weights).amax(1, keepdim=True)

    def read(self, storage, index):
        """Reads the rows of :meth:`expand` in one gather: a ``[B]`` batch with ``[B, k, *frame]`` stacks."""
        parts = index if isinstance(index, tuple) else (index,)
        rows = parts[0]
        b, k = rows.shape
        flat = tuple(p.reshape(-1) for p in parts)
        full = storage.get(flat if len(flat) > 1 else flat[0])
        if not isinstance(full, TensorDictBase):
            raise TypeError(
                f"FrameStack stacks entries of stored TensorDicts, but the storage holds {type(full).__name__} "
                f"items: store TensorDicts holding {self.frame_keys}."
            )
        out = full[k - 1 :: k]  # the drawn step of each stack (its last slot)
        padded = None  # clamped slots repeat the cell after them
        if self.padding == "constant" or self.mask_key is not None:
            same = rows[:, :-1] == rows[:, 1:]
            if len(parts) > 1:  # interleaved windows of an ndim=2 storage may change column
                same &= parts[1][:, :-1] == parts[1][:, 1:]
            padded = torch.nn.functional.pad(same, (0, 1))
        for key in self.frame_keys:
            frames = full.get(key, None)
            if frames is None:
                raise KeyError(
                    f"FrameStack stacks the frame entry {key!r}, which the storage does not hold (it holds "
                    f"{sorted(map(str, full.keys(True, True)))}): pass `frame_keys` naming stored entries."
                )
            frames = frames.view(b, k, *frames.shape[1:])
            if self.padding == "constant" and bool(padded.any()):
                mask = padded.to(frames.device).reshape(b, k, *([1] * (frames.ndim - 2)))
                frames = frames.masked_fill(mask, self.padding_value)
            out.set(key, frames)
            if self.next_frames:
                nxt = out.get(_next_key(key), None)
                if nxt is None:
                    raise KeyError(
                        f"FrameStack(next_frames=True) appends the stored {_next_key(key)!r} frame of each drawn "
                        f"step, which the storage does not hold: store it, or pass next_frames=False."
                    )
                out.set(_next_key(key), torch.cat([frames[:, 1:], nxt.unsqueeze(1)], 1))
        if self.mask_key is not None:
            out.set(self.mask_key, padded)
        return out

    def anchor_priorities(self, data: TensorDictBase, priority: torch.Tensor, *, index_key="index"):
        """``(index, priority)`` for a prioritized sampler: the drawn step of each stack (its last row)."""
        index = data.get(index_key, None)
        if index is None:
            raise KeyError(f"anchor_priorities() needs the {index_key!r} entry that sampling writes into the batch.")
        index = torch.as_tensor(index)
        priority = torch.as_tensor(priority)
        b = index.shape[0]
        priority = priority.reshape(b, -1).amax(-1) if priority.numel() != b else priority.reshape(b)
        return index[:, -1], priority

    def __repr__(self) -> str:
        signal = f"traj_key={self.traj_key!r}" if self.end_key is None else f"end_key={self.end_key!r}"
        if self.fragmented:
            signal += f", fragmented=True, step_key={self.step_key!r}"
        return (
            f"FrameStack(num_frames={self.num_frames}, frame_keys={self.frame_keys}, {signal}, "
            f"padding={self.padding!r}, next_frames={self.next_frames})"
        )
