"""Fixed-shape windows of history and future around an anchor step: :class:`GeometricTrajectoryWindowSampler`.

Data model. The storage is 1-D and every stored step carries a trajectory id and a step number; steps of several
trajectories may be interleaved in any order (see :mod:`torchrl.data.replay_buffers.trajectories.interleaved`).
Sorted by (trajectory, step), the live steps form *runs*: maximal stretches of consecutive step numbers of one
trajectory. A window is ``W = history + max_future + 1`` storage slots of one run in step order: ``history`` steps
before the anchor (oldest first), the anchor (column ``history``), then ``max_future`` columns of which the first
``k`` hold the next steps. ``k`` is drawn once per batch, geometrically truncated to the futures available.

NOTE [geometric window tables]
What a draw needs depends on the index only, not on the draw: for each eligible anchor (a stored step whose whole
history is stored, or whose run starts at step 0) its available future ``f = min(max_future, last - s)``. The
anchors are kept sorted by ``f``, largest first, so the anchors with ``f >= k`` are a prefix of that order whose
length is ``count[k]``. A draw is then ``O(B * W)`` whatever the storage size: one uniform picks ``k`` (inverse
CDF over ``y**j`` for ``j <= K``, ``K`` the largest future), one uniform per row picks a position of the prefix.
The tables are rebuilt when the index changes (a write), on the host, outside the compiled kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import NestedKey

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_int, is_real
from torchrl.data.replay_buffers.samplers.base import (
    Sampler,
    check_batch_size,
    check_not_empty,
    uniform_draws,
)
from torchrl.data.replay_buffers.trajectories.interleaved import InterleavedRuns
from torchrl.data.replay_buffers.trajectories.keys import normalize_key

__all__ = ["GeometricTrajectoryWindowSampler"]

GEOMETRIC_NDIM = TorchRLPhrase(
    NotImplementedError,
    "only supports single-dimensional storages, got storage.ndim=",
    "GeometricTrajectoryWindowSampler only supports single-dimensional storages, got storage.ndim={ndim}. Store the "
    "steps in a 1-D storage (flatten the env dims, e.g. rb.extend(td.reshape(-1))): the trajectory ids and step "
    "numbers keep the trajectories apart.",
)
GEOMETRIC_NO_ANCHOR = TorchRLPhrase(
    RuntimeError,
    "complete stored history",
    "GeometricTrajectoryWindowSampler found no anchor with a complete stored history among the {stored} stored "
    "steps: an anchor needs its history={history} previous steps stored, or its trajectory stored from step 0. "
    "Write longer trajectories, or lower `history`.",
)


@dataclass(frozen=True)
class WindowTables:
    """The per-index tables of NOTE [geometric window tables] (positions index the sorted ``slots``).

    Attributes:
        slots: ``[M]`` storage positions sorted by (trajectory, step).
        back: ``[M]`` steps between each position and its run's first step (``s - first``).
        order: ``[E]`` the eligible positions, largest available future first.
        counts: ``[max_future + 1]`` int64, ``counts[k]`` eligible anchors with a future ``>= k``.
        cdf: ``[max_future + 1]`` float64, the cumulative distribution of ``k`` (``y**k`` for ``k <= K``).
        eligible: ``E`` (a host int).
    """

    slots: torch.Tensor
    back: torch.Tensor
    order: torch.Tensor
    counts: torch.Tensor
    cdf: torch.Tensor
    eligible: int


def window_tables(
    slots: torch.Tensor,
    steps: torch.Tensor,
    run_start: torch.Tensor,
    run_length: torch.Tensor,
    *,
    history: int,
    max_future: int,
    continuation_probability: float,
) -> WindowTables:
    """The tables of NOTE [geometric window tables] for runs given as positions of the sorted ``slots``.

    Args:
        slots (Tensor): ``[M]`` storage positions sorted by (trajectory, step).
        steps (Tensor): ``[M]`` the step number of each.
        run_start (Tensor): ``[R]`` the position (in ``slots``) of each run's first step.
        run_length (Tensor): ``[R]`` the number of steps of each run (they tile ``0 .. M - 1``).

    Keyword Args:
        history, max_future, continuation_probability: the sampler's configuration.
    """
    device = slots.device
    slots, steps = slots.long(), steps.long()
    run_start, run_length = run_start.long(), run_length.long()
    run_of = torch.repeat_interleave(torch.arange(run_length.numel(), device=device), run_length)
    position = torch.arange(slots.numel(), device=device)
    back = position - run_start[run_of]  # steps since the run's first step
    first = steps - back
    last_step = first + run_length[run_of] - 1
    eligible = (steps - history).clamp_min(0) >= first
    future = torch.clamp(last_step - steps, max=max_future)
    order = position[eligible]
    order = order[torch.sort(future[order], descending=True, stable=True).indices]
    counts = torch.bincount(future[order], minlength=max_future + 1).flip(0).cumsum(0).flip(0)
    powers = continuation_probability ** torch.arange(max_future + 1, dtype=torch.float64, device=device)
    weights = torch.where(counts > 0, powers, torch.zeros_like(powers))
    total = weights.sum()
    cdf = weights.cumsum(0) / torch.where(total > 0, total, torch.ones_like(total))
    return WindowTables(slots, back, order, counts, cdf, int(order.numel()))


def draw_windows(
    slots: torch.Tensor,
    back: torch.Tensor,
    order: torch.Tensor,
    counts: torch.Tensor,
    cdf: torch.Tensor,
    u_future: torch.Tensor,
    u_anchor: torch.Tensor,
    history: int,
    max_future: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch of windows from the tables (tensor-only, fixed shapes: what ``compile=True`` compiles).

    Args:
        slots, back, order, counts, cdf: the :class:`WindowTables` fields.
        u_future (Tensor): one float64 uniform (shape ``[1]``): picks ``k``.
        u_anchor (Tensor): ``[B]`` float64 uniforms: pick the anchors among those with a future ``>= k``.
        history (int): steps before the anchor.
        max_future (int): future columns.

    Returns:
        ``(index, valid, future_offset, anchor)``, each ``[B, history + max_future + 1]``: the storage slots, the
        validity mask, ``k`` and the anchor's slot repeated over the row.
    """
    k = torch.searchsorted(cdf, u_future.to(cdf.dtype), right=True)  # [1]
    # at most K, the largest future an anchor has (a rounded cdf below 1 could otherwise give more)
    k = torch.minimum(k, (counts > 0).sum(0, keepdim=True) - 1)
    available = counts.gather(0, k)  # [1], > 0 whenever an anchor is eligible
    pick = (u_anchor * available.to(u_anchor.dtype)).long()
    pick = torch.minimum(pick, available - 1)  # the caller checked that an anchor is eligible
    anchor = order.gather(0, pick)  # [B] positions in slots
    offsets = torch.arange(-history, max_future + 1, device=slots.device)  # [W]
    # the run's first step relative to the anchor: step 0 when the history reaches before it (eligibility
    # guarantees that a run starting later holds the whole history)
    low = -back[anchor].unsqueeze(-1)
    relative = torch.minimum(torch.maximum(offsets, low), k.unsqueeze(-1))
    valid = (offsets >= low) & (offsets <= k.unsqueeze(-1))
    index = slots[anchor.unsqueeze(-1) + relative]
    shape = index.shape
    future_offset = k.expand(shape).contiguous()
    anchor_slot = slots[anchor].unsqueeze(-1).expand(shape).contiguous()
    return index, valid, future_offset, anchor_slot


def _check_probability(value) -> float:
    if not is_real(value):
        raise TypeError(
            f"`continuation_probability` must be a real number in [0, 1), got {value!r} ({type(value).__name__}). "
            f"Pass e.g. 0.9: the probability that the future extends by one more step."
        )
    value = float(value)
    if not 0.0 <= value < 1.0:  # NaN fails too
        raise ValueError(
            f"`continuation_probability` must be in [0, 1), got {value!r}: 1 would never stop extending the future. "
            f"Pass e.g. 0.9, or 0 for windows without future steps."
        )
    return value


def _check_compile(value) -> bool | dict:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, bool):
        return value
    raise TypeError(
        f"`compile` must be a bool or a dict of torch.compile keyword arguments, got {value!r} "
        f"({type(value).__name__}). Pass compile=True, or e.g. compile={{'backend': 'eager'}}."
    )


class GeometricTrajectoryWindowSampler(Sampler):
    """Draws fixed-shape windows around anchor steps: ``history`` steps before, the anchor, a geometric future.

    World models and goal-conditioned learners train on a stretch of past steps and a future of random length
    around each anchor step. This sampler returns them with a fixed shape (friendly to compiled code), whatever
    the lengths drawn: the index is ``[B, W]`` with ``W = history + max_future + 1`` (oldest step leftmost, the
    anchor at column ``history``), so that a :class:`~torchrl.data.TensorDictReplayBuffer` sample has batch size
    ``[B, W]``. The steps of several trajectories may be interleaved in the storage in any order (vectorised envs,
    asynchronous collectors): the trajectory id ``trajectory_key`` and the step number ``step_key`` of each stored
    step say where it belongs; a missing step (an overwritten or lost one) splits a trajectory into runs, and no
    window crosses a run.

    Each batch draws one future length ``k`` in ``0 .. min(max_future, K)`` with probability proportional to
    ``(1 - y) * y**k`` (``y = continuation_probability``, ``K`` the largest future any eligible anchor has), then
    ``B`` anchors uniformly, with replacement, among the stored steps that are eligible and have at least ``k``
    future steps. A step is eligible when its whole history is stored, or when the history would reach before
    step 0 and its run starts at step 0. Columns outside ``[anchor - history, anchor + k]`` of the run are
    padding: a position before step 0 repeats the step-0 slot, a position after ``anchor + k`` repeats the slot
    of ``anchor + k``; both are marked invalid. Info entries, each ``[B, W]`` (written into a TensorDict sample):

    - ``"validity_mask"`` (bool): the columns that hold a step of the window;
    - ``"future_offset"`` (int64): ``k``, repeated over the row;
    - ``"anchor_index"`` (int64): the anchor's storage slot, repeated over the row.

    The index of runs is kept per sampler and followed after each write (writes through another buffer sharing
    the storage included); it holds nothing that needs saving: ``state_dict()`` is ``{}``, and
    ``load_state_dict`` drops the index (it is found again at the next draw). The draws depend only on the
    storage and the configuration (``requires_shared_state = False``).

    Args:
        history (int): steps before the anchor, ``>= 0``.
        max_future (int): the most future steps, ``>= 0``.
        continuation_probability (float): ``y`` in ``[0, 1)``; ``0`` always gives ``k = 0``.

    Keyword Args:
        trajectory_key (NestedKey): the stored per-step trajectory id. Defaults to ``("collector", "traj_ids")``.
        step_key (NestedKey): the stored per-step step number (consecutive integers within a trajectory).
            Defaults to ``"step_count"``.
        compile (bool or dict): compile the tensor-only draw with :func:`torch.compile` (a dict is passed as its
            keyword arguments, e.g. ``{"backend": "eager", "fullgraph": True}``). Defaults to ``False``.

    Raises:
        RuntimeError: when sampling an empty storage, and when no stored step is eligible as an anchor.

    .. note:: The storage must be 1-D and return tensor collections (``LazyTensorStorage``, ``LazyMemmapStorage``);
        every live (trajectory, step) pair must be unique.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import GeometricTrajectoryWindowSampler, LazyTensorStorage, TensorDictReplayBuffer
        >>> sampler = GeometricTrajectoryWindowSampler(2, 3, 0.5, trajectory_key="traj")
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=4)
        >>> steps = torch.arange(10)  # two trajectories of 10 steps, written interleaved
        >>> _ = rb.extend(TensorDict(traj=torch.stack([steps * 0, steps * 0 + 1], 1).reshape(-1),
        ...     step_count=torch.stack([steps, steps], 1).reshape(-1), batch_size=[20]))
        >>> batch = rb.sample()
        >>> batch.batch_size, batch["anchor_index"].shape
        (torch.Size([4, 6]), torch.Size([4, 6]))
        >>> same_trajectory = (batch["traj"] == batch["traj"][:, 2:3]).all()
        >>> valid = batch["validity_mask"]
        >>> consecutive = (batch["step_count"][:, 1:] - batch["step_count"][:, :-1])[valid[:, 1:] & valid[:, :-1]]
        >>> bool(same_trajectory), bool((consecutive == 1).all())
        (True, True)
    """

    requires_shared_state = False

    def __init__(
        self,
        history: int,
        max_future: int,
        continuation_probability: float,
        *,
        trajectory_key: NestedKey = ("collector", "traj_ids"),
        step_key: NestedKey = "step_count",
        compile: bool | dict = False,
    ):
        self.history = check_int("history", history, minimum=0, hint="Pass the steps before the anchor, e.g. 4.")
        self.max_future = check_int(
            "max_future", max_future, minimum=0, hint="Pass the most future steps of a window, e.g. 8."
        )
        self.continuation_probability = _check_probability(continuation_probability)
        if trajectory_key is None or step_key is None:
            raise ValueError(
                f"GeometricTrajectoryWindowSampler reads a trajectory id and a step number per stored step, got "
                f"trajectory_key={trajectory_key!r} and step_key={step_key!r}: pass the keys of both entries."
            )
        self.trajectory_key = normalize_key(trajectory_key)
        self.step_key = normalize_key(step_key)
        self.compile = _check_compile(compile)
        self._runs: InterleavedRuns | None = None
        self._tables: tuple | None = None  # (the index version they were built from, WindowTables)
        self._kernel = None

    @property
    def window(self) -> int:
        """The columns of each window: ``history + max_future + 1``."""
        return self.history + self.max_future + 1

    # -- the index of runs and the tables --------------------------------------------------------------------
    def _current_tables(self, storage) -> WindowTables:
        if storage.ndim != 1:
            raise GEOMETRIC_NDIM.error(ndim=storage.ndim)
        runs = self._runs
        if runs is None:
            runs = self._runs = InterleavedRuns(self.trajectory_key, self.step_key)
        runs.refresh(storage)
        cached = self._tables
        if cached is not None and cached[0] == runs.version:
            return cached[1]
        tables = window_tables(
            runs.slots,
            runs.steps,
            runs.run_start,
            runs.run_length,
            history=self.history,
            max_future=self.max_future,
            continuation_probability=self.continuation_probability,
        )
        self._tables = (runs.version, tables)
        return tables

    def _draw(self):
        kernel = self._kernel
        if kernel is None:
            if self.compile:
                options = self.compile if isinstance(self.compile, dict) else {}
                kernel = torch.compile(draw_windows, **options)
            else:
                kernel = draw_windows
            self._kernel = kernel
        return kernel

    def can_sample(self, storage, batch_size: int) -> bool:
        """Whether a stored step is eligible as an anchor (see the class docstring)."""
        return len(storage) > 0 and self._current_tables(storage).eligible > 0

    def sample(self, storage, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draws ``batch_size`` windows: ``(index, info)``, the index and each info entry ``[B, W]``."""
        batch_size = check_batch_size(batch_size)
        check_not_empty(storage)
        tables = self._current_tables(storage)
        if not tables.eligible:
            raise GEOMETRIC_NO_ANCHOR.error(stored=tables.slots.numel(), history=self.history)
        device = tables.slots.device
        uniforms = uniform_draws(batch_size + 1, self._rng, device).to(device)
        index, valid, future_offset, anchor = self._draw()(
            tables.slots,
            tables.back,
            tables.order,
            tables.counts,
            tables.cdf,
            uniforms[:1],
            uniforms[1:],
            self.history,
            self.max_future,
        )
        return index, {"validity_mask": valid, "future_offset": future_offset, "anchor_index": anchor}

    # -- write notifications and state -------------------------------------------------------------------------
    def add(self, index) -> None:
        """A no-op: the index follows the storage's writes at the next draw."""

    def extend(self, index) -> None:
        """A no-op: the index follows the storage's writes at the next draw."""

    def mark_update(self, index, *, storage=None) -> None:
        """A no-op: the index follows the storage's writes at the next draw."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def _apply_state(self, state: dict[str, Any]) -> None:
        self._empty()

    def _empty(self) -> None:
        self._runs = None
        self._tables = None

    def __getstate__(self):
        state = super().__getstate__()
        state["_runs"] = None
        state["_tables"] = None
        state["_kernel"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(history={self.history}, max_future={self.max_future}, "
            f"continuation_probability={self.continuation_probability}, trajectory_key={self.trajectory_key!r}, "
            f"step_key={self.step_key!r})"
        )
