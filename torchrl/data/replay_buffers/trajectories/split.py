"""Splitting a batch of transitions into trajectories by its signal: the trajectory ids, else the done flags.

A batch (a TensorDict whose batch dims are time, or ``n_cols`` time streams laid end to end) holds its own signal:
the first found of the probe of :mod:`.keys` (a given ``trajectory_key``, the trajectory-id entries, the OR of the
``("next", ...)`` end-of-episode flags, else of the root ones). :func:`split_signal` reads it, one value per step;
:func:`~.ends.time_ordered_runs` turns it into ``(starts, lengths)``, and :func:`split_streams` does both for
streams laid end to end. :func:`signal_keys` names the stored entries that hold the signal of a tensor storage, so
a reader fetches only those. Trajectory queries (``iter_trajectories``, ``filter_trajectories``, ``rb.query``)
stand on it.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase, unravel_key

from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers.storages.tensor import TensorStorage
from torchrl.data.replay_buffers.trajectories.ends import time_ordered_runs
from torchrl.data.replay_buffers.trajectories.interleaved import (
    FRAGMENTED_DUPLICATE,
    FRAGMENTED_NEGATIVE_STEP,
    FRAGMENTED_NO_TRAJ,
    FRAGMENTED_STEP_KEY,
    entry_values,
)
from torchrl.data.replay_buffers.trajectories.keys import END_FLAG_NAMES, TRAJECTORY_KEYS

QUERY_END_FLAGS = TorchRLPhrase(
    UserWarning,
    "No trajectory id entry was found; splitting on the end-of-episode flags",
    "No trajectory id entry was found; splitting on the end-of-episode flags {flags}. Pass trajectory_key= "
    "(e.g. ('collector', 'traj_ids')) to split on trajectory ids.",
)
QUERY_NO_SIGNAL = TorchRLPhrase(
    KeyError,
    "Cannot split data into trajectories",
    "Cannot split data into trajectories: the data has no trajectory id entry ({ids}) and no end-of-episode "
    "flag ({flags}). Pass trajectory_key= naming the entry that holds trajectory ids, or store done flags.",
)


def _step_values(value: torch.Tensor, shape: torch.Size, *, reduce_any: bool) -> torch.Tensor:
    """A per-step signal ``[*shape]`` from an entry ``[*shape, *feature]`` (features OR-ed for flags)."""
    value = torch.as_tensor(value)
    per_step = value.shape[len(shape) :].numel()
    if per_step == 1:
        return value.reshape(shape)
    if reduce_any:
        return value.reshape(*shape, -1).bool().any(-1)
    if per_step != 1:
        raise ValueError(
            f"A trajectory id entry must hold one id per step, got shape {list(value.shape)} for "
            f"{list(shape)} steps."
        )
    return value.reshape(shape)


def split_signal(data: TensorDictBase, trajectory_key=None, *, warn: bool = True):
    """``("trajectory", ids)`` or ``("end", flags)``, per step of ``data`` (shape ``data.batch_size``).

    The first found wins: ``trajectory_key``; ``("collector", "traj_ids")``, ``"traj_ids"``, ``"episode"``;
    the OR of the ``("next", done|terminated|truncated)`` flags present; the OR of the root ones (the flag
    fallbacks warn, :data:`QUERY_END_FLAGS`; no signal raises :data:`QUERY_NO_SIGNAL`).

    Args:
        data (TensorDictBase): the transitions.
        trajectory_key (NestedKey, optional): the entry holding trajectory ids (``KeyError`` if absent).
            Defaults to ``None``.

    Keyword Args:
        warn (bool): whether to warn when splitting on the flags. Defaults to ``True``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> split_signal(TensorDict(episode=torch.tensor([3, 3, 4]), batch_size=[3]))
        ('trajectory', tensor([3, 3, 4]))
    """
    shape = data.batch_size
    keys = set(data.keys(include_nested=True, leaves_only=True))
    if trajectory_key is not None:
        key = unravel_key(trajectory_key)
        if key not in keys:
            raise KeyError(
                f"trajectory_key {key!r} not found in data. The data holds {sorted(data.keys(), key=str)}."
            )
        return "trajectory", _step_values(data.get(key), shape, reduce_any=False)
    for key in TRAJECTORY_KEYS:
        if key in keys:
            return "trajectory", _step_values(data.get(key), shape, reduce_any=False)
    for prefix in (("next",), ()):
        present = [(*prefix, name) if prefix else name for name in END_FLAG_NAMES]
        present = [k for k in present if k in keys]
        if present:
            if warn:
                QUERY_END_FLAGS.warn(flags=present, stacklevel=4)
            flags = None
            for k in present:
                f = _step_values(data.get(k), shape, reduce_any=True).bool()
                flags = f if flags is None else flags | f
            return "end", flags
    raise QUERY_NO_SIGNAL.error(
        ids=", ".join(map(repr, TRAJECTORY_KEYS)),
        flags=", ".join(f"('next', {n!r}) or {n!r}" for n in END_FLAG_NAMES),
    )  # fmt: skip


def split_streams(
    signal: TensorDictBase, n_cols: int, trajectory_key=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(starts, lengths)`` in flat positions of ``n_cols`` time streams laid end to end, each split on its own.

    Args:
        signal (TensorDictBase): the steps (one batch dim), env-major: stream ``e`` holds the flat positions
            ``[e * n, (e + 1) * n)``. Only its signal entries are read (see :func:`split_signal`).
        n_cols (int): the number of streams.
        trajectory_key (NestedKey, optional): the entry holding trajectory ids. Defaults to ``None``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> split_streams(TensorDict(traj_ids=torch.tensor([0, 0, 1, 2, 2, 2]), batch_size=[6]), 2)
        (tensor([0, 2, 3]), tensor([2, 1, 3]))
    """
    kind, values = split_signal(signal, trajectory_key)
    if n_cols != 1:
        values = values.reshape(n_cols, -1).T  # [n, n_cols]: column e is stream e
    return time_ordered_runs(values, is_done=kind == "end")  # ordered by stream, then time


def signal_keys(storage, trajectory_key=None) -> set | None:
    """The stored entries that split a tensor storage into trajectories (``None``: read them from the data).

    The probe of :func:`split_signal`, on the storage's columns: the one trajectory-id entry found, else every
    end-of-episode flag stored (root or under ``"next"``). ``None`` for a storage that is not a
    :class:`~torchrl.data.TensorStorage`, or when a given ``trajectory_key`` is not stored.
    """
    if not isinstance(storage, TensorStorage):
        return None
    candidates = [unravel_key(trajectory_key)] if trajectory_key is not None else list(TRAJECTORY_KEYS)
    for key in candidates:
        if isinstance(storage.get_entry(key), torch.Tensor):
            return {key}
    if trajectory_key is not None:
        return None  # split_signal raises the KeyError naming it
    flags = {("next", n) for n in END_FLAG_NAMES} | set(END_FLAG_NAMES)
    found = {k for k in flags if isinstance(storage.get_entry(k), torch.Tensor)}
    return found or None


# -- interleaved (fragmented) trajectories -------------------------------------------------------------------------
# The checks of the stored ids and steps are those of the interleaved-runs index (its phrase constants and
# entry_values), so a query and a fragmented sampler refuse the same data with the same messages.
def fragmented_signal(data: TensorDictBase, trajectory_key=None, step_key="step_count"):
    """``(ids, steps)`` per step of ``data`` (shape ``data.batch_size``), for interleaved trajectories.

    The trajectory id is read from ``trajectory_key``, else from the first of ``("collector", "traj_ids")``,
    ``"traj_ids"``, ``"episode"`` found (the query probe; end-of-episode flags cannot say which trajectory an
    interleaved step belongs to: TorchRL's ``RuntimeError``); the step number from ``step_key``. Both must hold
    one integer per step (checked as the interleaved-runs index checks them), steps ``>= 0``.

    Args:
        data (TensorDictBase): the transitions.
        trajectory_key (NestedKey, optional): the entry holding trajectory ids. Defaults to ``None``.
        step_key (NestedKey): the entry holding each step's number in its trajectory. Defaults to
            ``"step_count"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> data = TensorDict(episode=torch.tensor([0, 1, 0]), step_count=torch.tensor([0, 0, 1]), batch_size=[3])
        >>> fragmented_signal(data)
        (tensor([0, 1, 0]), tensor([0, 0, 1]))
    """
    traj_key, step_key = _fragmented_entries(data, trajectory_key, step_key)
    count = data.batch_size.numel()
    ids = torch.from_numpy(entry_values(data.get(traj_key), traj_key, count)).reshape(data.batch_size)
    steps = torch.from_numpy(entry_values(data.get(step_key), step_key, count)).reshape(data.batch_size)
    if steps.numel() and bool((steps < 0).any()):
        raise FRAGMENTED_NEGATIVE_STEP.error(key=step_key, value=int(steps.min()))
    return ids, steps


def _fragmented_entries(data: TensorDictBase, trajectory_key, step_key) -> tuple:
    """The trajectory-id and step entries of ``data`` (``(traj_key, step_key)``), checked to be there."""
    if step_key is None:
        raise FRAGMENTED_STEP_KEY.error()
    keys = set(data.keys(include_nested=True, leaves_only=True))
    if trajectory_key is not None:
        traj_key = unravel_key(trajectory_key)
        if traj_key not in keys:
            raise KeyError(
                f"trajectory_key {traj_key!r} not found in data. The data holds {sorted(data.keys(), key=str)}."
            )
    else:
        traj_key = next((k for k in TRAJECTORY_KEYS if k in keys), None)
        if traj_key is None:
            raise FRAGMENTED_NO_TRAJ.error(tried=list(TRAJECTORY_KEYS))
    step_key = unravel_key(step_key)
    if step_key not in keys:
        raise KeyError(
            f"step_key {step_key!r} not found in data: fragmented=True orders each trajectory's steps by it. The "
            f"data holds {sorted(data.keys(), key=str)}; pass step_key= naming the step counter."
        )
    return traj_key, step_key


def fragmented_split(data: TensorDictBase, trajectory_key=None, step_key="step_count") -> tuple:
    """``(order, starts, lengths)`` of the interleaved trajectories of ``data`` (one batch dim): the entries of
    :func:`fragmented_signal`, split by :func:`fragmented_runs`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> data = TensorDict(episode=torch.tensor([0, 1, 0]), step_count=torch.tensor([0, 0, 1]), batch_size=[3])
        >>> fragmented_split(data)
        (tensor([0, 2, 1]), tensor([0, 2]), tensor([2, 1]))
    """
    ids, steps = fragmented_signal(data, trajectory_key, step_key)
    traj_key, step_key = _fragmented_entries(data, trajectory_key, step_key)
    return fragmented_runs(ids, steps, traj_key=traj_key, step_key=step_key)


def fragmented_runs(
    ids: torch.Tensor, steps: torch.Tensor, *, traj_key="traj_ids", step_key="step_count"
) -> tuple:
    """``(order, starts, lengths)``: the runs of interleaved trajectories, each gathered in step order.

    ``data[order]`` lays each trajectory's steps side by side, sorted by step; a *run* is a maximal stretch of
    consecutive steps of one trajectory id (a missing step ends one, as a trajectory end does). Run ``r`` is
    ``data[order][starts[r] : starts[r] + lengths[r]]``; runs are listed by the position of their earliest written
    step (oldest first). Duplicate ``(id, step)`` pairs raise TorchRL's ``RuntimeError`` (duplicate records).

    Args:
        ids (Tensor): the trajectory id of each step, ``[n]``, in write order.
        steps (Tensor): the step number of each step, ``[n]``.

    Keyword Args:
        traj_key, step_key (NestedKey): the names shown in errors. Default to ``"traj_ids"``, ``"step_count"``.

    Examples:
        >>> import torch
        >>> ids, steps = torch.tensor([0, 1, 0, 1, 0]), torch.tensor([0, 0, 1, 1, 3])
        >>> fragmented_runs(ids, steps)  # trajectory 0 misses step 2: two runs
        (tensor([0, 2, 4, 1, 3]), tensor([0, 3, 2]), tensor([2, 2, 1]))
    """
    ids, steps = ids.reshape(-1), steps.reshape(-1)
    n = ids.numel()
    if not n:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty, empty
    by_step = torch.argsort(steps, stable=True)
    order = by_step[torch.argsort(ids[by_step], stable=True)]
    sid, sstep = ids[order], steps[order]
    same_traj = sid[1:] == sid[:-1]
    duplicate = same_traj & (sstep[1:] == sstep[:-1])
    if bool(duplicate.any()):
        at = int(duplicate.nonzero()[0, 0])
        raise FRAGMENTED_DUPLICATE.error(
            traj=int(sid[at]), step=int(sstep[at]), traj_key=traj_key, step_key=step_key
        )
    new_run = torch.ones(n, dtype=torch.bool)
    new_run[1:] = ~(same_traj & (sstep[1:] == sstep[:-1] + 1))
    starts = new_run.nonzero().squeeze(-1)
    lengths = torch.diff(starts, append=torch.tensor([n]))
    run_of = torch.cumsum(new_run.long(), 0) - 1
    earliest = torch.full((starts.numel(),), n, dtype=torch.long)
    earliest = earliest.scatter_reduce(0, run_of, order, reduce="amin")
    oldest_first = torch.argsort(earliest, stable=True)
    return order, starts[oldest_first], lengths[oldest_first]


def fragmented_keys(storage, trajectory_key=None, step_key="step_count") -> set | None:
    """The stored entries :func:`fragmented_signal` reads from a tensor storage: the trajectory id and ``step_key``.

    ``None`` (read them from the data, which raises the errors) for a storage that is not a
    :class:`~torchrl.data.TensorStorage`, or when an entry is not stored.
    """
    if not isinstance(storage, TensorStorage) or step_key is None:
        return None
    candidates = [unravel_key(trajectory_key)] if trajectory_key is not None else list(TRAJECTORY_KEYS)
    found = next((k for k in candidates if isinstance(storage.get_entry(k), torch.Tensor)), None)
    step_key = unravel_key(step_key)
    if found is None or not isinstance(storage.get_entry(step_key), torch.Tensor):
        return None
    return {found, step_key}
