"""Sample units: what one draw of a sampler stands for. :class:`Transition` (one step) and :class:`Sequence`
(a window of steps around each drawn step, for recurrent learners).

Contract. A buffer calls, after its sampler and before reading the storage::

    index, info = sampler.sample(storage, batch_size)
    index, info = sample_unit.expand(index, info, storage)
    info["index"] = index
    data = sample_unit.read(storage, index)

``expand`` turns the drawn positions (*anchors*) into the positions to read and may add entries to ``info``;
``read`` reads them and returns data shaped like the expanded index (:meth:`Storage.get` reads a flat
batch). A prioritized buffer maps priorities computed on sampled data back to the anchors with
:meth:`SampleUnit.anchor_priorities`. :func:`check_sample_unit` validates the ``sample_unit=`` argument of a
buffer.
"""

from __future__ import annotations

import abc
from typing import Literal

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDictBase, is_tensorclass

from torchrl.data.replay_buffers.samplers._trajectories import (
    TrajectoryIndex,
    as_step_values,
    find_trajectories,
    has_key,
    normalize_key,
    read_column,
    ring_layout,
)
from torchrl.data.replay_buffers.storages.tensor import TensorStorage

__all__ = ["SampleUnit", "Transition", "Sequence"]

_BOUNDARIES = ("pad", "stop", "include_reset")


class SampleUnit(abc.ABC):
    """Base class of sample units: turns the positions a sampler drew into the positions a buffer reads.

    Subclasses implement :meth:`expand`; :meth:`read` and :meth:`anchor_priorities` have defaults for units
    that read one item per drawn position.
    """

    @abc.abstractmethod
    def expand(self, index, info: dict, storage) -> tuple:
        """Returns ``(index, info)``: the positions to read for the drawn ``index`` and the updated info."""

    def read(self, storage, index):
        """Reads ``index`` (as returned by :meth:`expand`) from ``storage``."""
        return storage.get(index)

    def anchor_priorities(self, data: TensorDictBase, priority: torch.Tensor, *, index_key="index"):
        """Returns ``(index, priority)`` to give a prioritized sampler for sampled ``data``: one per item."""
        return data.get(index_key), priority

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Transition(SampleUnit):
    """One step per draw: the sampler's index is read as is (the default of every buffer).

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers.sample_units import Transition
        >>> Transition().expand(torch.tensor([3, 1]), {}, storage=None)
        (tensor([3, 1]), {})
    """

    def expand(self, index, info: dict, storage) -> tuple:
        return index, info


def check_sample_unit(sample_unit) -> SampleUnit | None:
    """Validates the ``sample_unit=`` argument of a buffer: ``None`` or a :class:`SampleUnit` instance.

    Returns ``None`` for ``None`` and for :class:`Transition` (nothing to do on the sample path).
    """
    if sample_unit is None:
        return None
    if isinstance(sample_unit, type) and issubclass(sample_unit, SampleUnit):
        raise TypeError(
            f"`sample_unit` must be an instance, got the class {sample_unit.__name__}: pass "
            f"{sample_unit.__name__}(...)."
        )
    if not isinstance(sample_unit, SampleUnit):
        raise TypeError(
            f"`sample_unit` must be a SampleUnit (Transition() or Sequence(length)), got "
            f"{type(sample_unit).__name__}: {sample_unit!r}."
        )
    return None if type(sample_unit) is Transition else sample_unit


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
    return value


class Sequence(SampleUnit):
    """A window of consecutive steps around each drawn step (the *anchor*), for recurrent learners.

    Each anchor becomes ``burn_in + length + bootstrap`` steps, ``dilation`` apart: ``burn_in`` steps before the
    anchor (to warm up a recurrent state), the ``length`` steps to learn from starting at the anchor, then
    ``bootstrap`` steps after them (for value targets). Sampled batches have shape ``[B, W]`` with
    ``W = burn_in + length + bootstrap``; ``info`` (and a TensorDict batch) gets, laid out ``[B, W]``:

    - ``"anchor_index"``: the storage position of the anchor of the window;
    - ``"validity_mask"``: whether each step belongs to the window's data (see ``episode_boundary``);
    - ``"learning_mask"``: valid steps among the ``length`` learning steps;

    and every other info entry of the sampler (``"priority_weight"``, ...) is repeated along the window.

    Episodes end at steps whose ``done_key`` is set and at the newest step of each stream; the oldest data of a
    full ring buffer starts one. A step outside the written data is never read.

    Args:
        length (int): the number of learning steps, ``>= 1``.

    Keyword Args:
        episode_boundary (str): what happens where a window leaves the anchor's episode. ``"pad"``: the steps
            outside it read the nearest step of the episode and are invalid. ``"stop"``: a window that would
            run past the end of the episode is moved back so that it stops at its last step (the anchor moves
            with it, never before the episode start); a shorter episode leaves padded, invalid steps at the
            end. ``"include_reset"``:
            windows run across episode ends into the next episode (all steps valid; only steps outside the
            stored stream are padded and invalid); use the done flags to reset a recurrent state.
            Defaults to ``"pad"``.
        done_key (NestedKey): the per-step done flag in the storage. Defaults to ``("next", "done")``.
        burn_in (int): steps before the anchor. Defaults to ``0``.
        bootstrap (int): steps after the learning steps. Defaults to ``0``.
        dilation (int): the distance between consecutive steps of a window. Defaults to ``1``.

    .. note:: It needs a :class:`~torchrl.data.TensorStorage` (``ndim=1``, or ``ndim=2`` for ``[time, envs]``)
        holding ``done_key``. Episode boundaries are computed once per storage write and cached.

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
        tensor([[1, 2, 2],
                [3, 4, 5]])
        >>> info["validity_mask"]
        tensor([[ True,  True, False],
                [ True,  True,  True]])
        >>> unit.read(storage, index)["obs"].shape
        torch.Size([2, 3])
    """

    def __init__(
        self,
        length: int,
        episode_boundary: Literal["pad", "stop", "include_reset"] = "pad",
        done_key=("next", "done"),
        burn_in: int = 0,
        bootstrap: int = 0,
        dilation: int = 1,
    ):
        self.length = _check_int("length", length, 1)
        if episode_boundary not in _BOUNDARIES:
            raise ValueError(f"`episode_boundary` must be one of {_BOUNDARIES}, got {episode_boundary!r}.")
        self.episode_boundary = episode_boundary
        self.done_key = normalize_key(done_key)
        self.burn_in = _check_int("burn_in", burn_in, 0)
        self.bootstrap = _check_int("bootstrap", bootstrap, 0)
        self.dilation = _check_int("dilation", dilation, 1)
        self._cache: tuple | None = None

    @property
    def window(self) -> int:
        """The number of steps of each window: ``burn_in + length + bootstrap``."""
        return self.burn_in + self.length + self.bootstrap

    # -- episodes ------------------------------------------------------------------------------------------------
    def _episodes(self, storage) -> TrajectoryIndex:
        key = (id(storage), _write_revision(storage), len(storage))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        n_rows, n_cols, offset, last_row = ring_layout(storage)
        if not has_key(storage, self.done_key):
            raise KeyError(
                f"Sequence finds episodes with the done flags {self.done_key!r}, which the storage does not hold: "
                f"pass `done_key` naming the stored done entry."
            )
        column = read_column(storage, self.done_key, n_rows)
        flags = as_step_values(column, n_rows, n_cols, name=f"done flags {self.done_key!r}", reduce_any=True)
        episodes = find_trajectories(
            flags, is_done=True, n_rows=n_rows, n_cols=n_cols, offset=offset, last_row=last_row, ndim=storage.ndim
        )
        self._cache = (key, episodes)
        return episodes

    def _check_storage(self, storage) -> None:
        if not isinstance(storage, TensorStorage):
            raise TypeError(
                f"Sequence reads windows of steps from a TensorStorage (LazyTensorStorage, LazyMemmapStorage, ...); "
                f"got a {type(storage).__name__}."
            )
        if storage.ndim > 2:
            raise ValueError(f"Sequence handles storages with ndim=1 or 2 ([time, envs]), got ndim={storage.ndim}.")
        if len(storage) == 0:
            raise RuntimeError("Cannot sample sequences from an empty storage: add data first.")

    # -- contract ------------------------------------------------------------------------------------------------
    def expand(self, index, info: dict, storage) -> tuple:
        """Expands the anchors ``index`` (``[B]``, or a per-dim tuple) into windows ``[B, W]`` of the same form."""
        self._check_storage(storage)
        episodes = self._episodes(storage)
        as_tuple = isinstance(index, tuple)
        parts = [torch.as_tensor(i).reshape(-1).long() for i in (index if as_tuple else (index,))]
        if len(parts) != storage.ndim:
            raise ValueError(
                f"Sequence got an index with {len(parts)} dim(s) for a storage with ndim={storage.ndim}: pass one "
                f"index tensor per storage dim."
            )
        n = episodes.n_rows
        row = parts[0].remainder(n)
        unrolled = row if episodes.offset == 0 else (row - episodes.offset).remainder(n)
        col = parts[1] if len(parts) > 1 else torch.zeros_like(row)
        anchor = col * n + unrolled  # flat position (see samplers/_trajectories.py)
        which = torch.searchsorted(episodes.starts, anchor, right=True) - 1
        start = episodes.starts[which]
        last = start + episodes.lengths[which] - 1
        if self.episode_boundary == "include_reset":
            start, last = col * n, col * n + n - 1
        offsets = (torch.arange(self.window, device=anchor.device) - self.burn_in) * self.dilation
        steps = anchor.unsqueeze(-1) + offsets
        if self.episode_boundary == "stop":  # move back to end at the episode end, the anchor staying in it
            back = torch.minimum(-(-(steps[:, -1] - last).clamp(min=0) // self.dilation), (anchor - start) // self.dilation)
            steps = steps - (back * self.dilation).unsqueeze(-1)
        valid = (steps >= start.unsqueeze(-1)) & (steps <= last.unsqueeze(-1))
        steps = torch.minimum(torch.maximum(steps, start.unsqueeze(-1)), last.unsqueeze(-1))
        rows, cols = episodes.storage_rows(steps)
        anchor_rows, anchor_cols = episodes.storage_rows(steps[:, self.burn_in])
        learning = torch.zeros_like(valid)
        learning[:, self.burn_in : self.burn_in + self.length] = True
        batch = steps.shape
        new_info = {key: _along_window(value, batch) for key, value in info.items()}
        if storage.ndim == 1:
            expanded = (rows,) if as_tuple else rows
            anchor_index = anchor_rows
        else:
            expanded = (rows, cols)
            anchor_index = torch.stack([anchor_rows, anchor_cols], -1)
        new_info["anchor_index"] = _along_window(anchor_index, batch)
        new_info["validity_mask"] = valid
        new_info["learning_mask"] = valid & learning
        return expanded, new_info

    def read(self, storage, index):
        """Reads windows ``[B, W]`` (one flat gather) and returns data of batch shape ``[B, W]``."""
        parts = index if isinstance(index, tuple) else (index,)
        shape = parts[0].shape
        flat = tuple(p.reshape(-1) for p in parts)
        data = storage.get(flat if len(flat) > 1 else flat[0])
        return _unflatten(data, shape)

    def anchor_priorities(self, data: TensorDictBase, priority: torch.Tensor, *, index_key="index"):
        """One priority per window: the max over its valid steps, for the window's anchor.

        Args:
            data (TensorDictBase): a batch sampled with this unit (holds ``"anchor_index"`` and
                ``"validity_mask"``).
            priority (Tensor): per-step priorities, ``[B, W]`` (trailing dims are reduced with ``max``).

        Returns:
            ``(anchor_index, priority)``, ``[B]`` (or ``[B, ndim]``) and ``[B]``.
        """
        anchor = data.get("anchor_index", None)
        valid = data.get("validity_mask", None)
        if anchor is None or valid is None:
            raise KeyError(
                "anchor_priorities() needs the 'anchor_index' and 'validity_mask' entries that sampling with a "
                "Sequence unit writes into the batch."
            )
        priority = torch.as_tensor(priority, device=valid.device)
        if priority.shape[: valid.ndim] != valid.shape:
            raise ValueError(
                f"`priority` has shape {list(priority.shape)}; expected one value per sampled step, "
                f"{list(valid.shape)}."
            )
        if priority.ndim > valid.ndim:
            priority = priority.reshape(*valid.shape, -1).amax(-1)
        lowest = torch.finfo(priority.dtype).min if priority.is_floating_point() else torch.iinfo(priority.dtype).min
        per_window = torch.where(valid, priority, torch.full_like(priority, lowest)).amax(-1)
        if anchor.shape[: valid.ndim] == valid.shape:  # repeated along the window in the batch
            anchor = anchor[:, 0]
        return anchor, per_window

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"Sequence(length={self.length}, episode_boundary={self.episode_boundary!r}, done_key={self.done_key!r}, "
            f"burn_in={self.burn_in}, bootstrap={self.bootstrap}, dilation={self.dilation})"
        )


def _write_revision(storage) -> int | None:
    """The storage's write counter (bumped by every write): episode boundaries are cached against it."""
    revision = getattr(storage, "write_revision", None)
    if revision is None or callable(revision):
        counters = getattr(storage, "_counters", None)
        revision = None if counters is None else counters["revision"]
    return revision


def _along_window(value, batch: torch.Size):
    """An info value of leading shape ``[B]`` repeated along the window (``[B, W, ...]``)."""
    if isinstance(value, tuple):
        return tuple(_along_window(v, batch) for v in value)
    if not isinstance(value, torch.Tensor) or value.ndim == 0 or value.shape[0] != batch[0]:
        return value
    return value.unsqueeze(1).expand(batch[0], batch[1], *value.shape[1:])


def _unflatten(data, shape: torch.Size):
    """Data read for a flat index, reshaped to the window layout ``shape`` (``[B, W]``)."""
    if isinstance(data, TensorDictBase) or is_tensorclass(data):
        return data.reshape(*shape)
    if isinstance(data, torch.Tensor):
        return data.reshape(*shape, *data.shape[1:])
    return pytree.tree_map(lambda t: t.reshape(*shape, *t.shape[1:]), data)
