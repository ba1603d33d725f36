"""Next observations rebuilt at sample time from the following row: :class:`NextStateReconstructor`.

Data model: a flat sampled batch ``(B,)`` whose rows ``i`` and ``i + 1`` are consecutive steps of one trajectory
when the sampler draws contiguous slices (:class:`~torchrl.data.SliceSampler`). The observation of step ``t + 1``
is the next observation of step ``t``, so a storage that keeps each observation once (no ``("next",
"observation")``) loses nothing: row ``i``'s next observation is row ``i + 1``'s observation, wherever the two
rows are known to be consecutive steps. Elsewhere (the end of a slice, the end of a trajectory, the end of the
batch) it is unknown and filled with ``fill_value``.

Which rows are consecutive steps: the batch says it with its markers. Trajectory ids and done flags (TorchRL's rule)
cannot tell two slices of one episode drawn back to back from one longer slice; a step counter can (step ``+ 1``),
and so can the storage position of each row, the ``"index"`` entry a
:class:`~torchrl.data.TensorDictReplayBuffer` stores with each item (slot ``+ 1``). Steps of interleaved
trajectories (several environments writing one buffer) are not in consecutive slots: there the step counter decides.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import is_real
from torchrl.envs.transforms.transforms import Transform

__all__ = ["NextStateReconstructor"]

NEXT_STATE_FILL_DTYPE = TorchRLPhrase(
    TypeError,
    "non-floating dtype",
    "NextStateReconstructor cannot fill ('next', {key!r}), of non-floating dtype {dtype}, with "
    "fill_value={fill}: pass an integer fill_value (e.g. fill_value=0) for integer entries such as uint8 frames.",
)
NEXT_STATE_TRAJ_KEY_MISSING = TorchRLPhrase(
    KeyError,
    "trajectory key",
    "NextStateReconstructor: the trajectory key {key!r} (`{name}`) is not in the sampled batch. Store the "
    "trajectory ids there, pass the stored key with `{name}=`, `{name}=None` to skip this check, or "
    "strict=False to skip it when absent.",
)
NEXT_STATE_DONE_KEY_MISSING = TorchRLPhrase(
    KeyError,
    "done key",
    "NextStateReconstructor: the done key {key!r} (`{name}`) is not in the sampled batch. Pass the stored done "
    "entry with `{name}=` (a full key, e.g. ('next', 'done')), `{name}=None` to skip this check, or "
    "strict=False to skip it when absent.",
)
NEXT_STATE_STEP_COUNT_KEY_MISSING = TorchRLPhrase(
    KeyError,
    "step-count key",
    "NextStateReconstructor: the step-count key {key!r} (`{name}`) is not in the sampled batch. Pass the stored "
    "step counter with `{name}=`, `{name}=None` to skip this check, or strict=False to skip it when absent.",
)
_MARKERS = (("traj_key", NEXT_STATE_TRAJ_KEY_MISSING), ("done_key", NEXT_STATE_DONE_KEY_MISSING),
            ("step_count_key", NEXT_STATE_STEP_COUNT_KEY_MISSING))
# The default markers ("collector", "traj_ids") and ("next", "done") are the first trajectory key and the done key of
# torchrl.data.replay_buffers.trajectories.keys, written out here: the transforms sit below torchrl.data.


def _is_key(value) -> bool:
    return isinstance(value, str) or (isinstance(value, tuple) and bool(value) and all(isinstance(k, str) for k in value))


def _check_optional_key(name: str, key):
    if key is None or _is_key(key):
        return key
    raise TypeError(f"`{name}` must be a key (a str or a tuple of str) or None, got {key!r} ({type(key).__name__}).")


def _check_reconstructed_keys(keys) -> list:
    """The observation keys: a str, or a list/tuple of keys (a nested key goes in a list: ``[("obs", "pixels")]``)."""
    if isinstance(keys, str):
        return [keys]
    if not isinstance(keys, (list, tuple)) or not keys:
        raise TypeError(
            f"`keys` must be a key or a non-empty list of keys (e.g. ('observation',) or [('obs', 'pixels')]), "
            f"got {keys!r}."
        )
    for key in keys:
        if not _is_key(key):
            raise TypeError(
                f"`keys` must hold keys (str or tuple of str), got {key!r} in {keys!r}. A nested key goes in a "
                f"list: keys=[('obs', 'pixels')]."
            )
    return list(keys)


def _as_tuple(key) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


class NextStateReconstructor(Transform):
    """Writes ``("next", key)`` of each sampled row from the row after it, so observations are stored once.

    A TED step stores its observation and, under ``"next"``, the observation that follows: every observation is
    stored twice. Keep only the root one (exclude ``("next", "observation")`` before writing, e.g. with
    ``td.exclude(("next", "observation"))``), sample contiguous slices (:class:`~torchrl.data.SliceSampler`),
    and add this transform to the buffer: it rebuilds ``("next", key)`` of row ``i`` from ``key`` of row
    ``i + 1`` wherever the two rows are consecutive steps of one trajectory, which halves the observation bytes.
    A row is followed by its next step when it is not the last row of the batch, and, for each marker given:
    the ``traj_key`` of both rows is equal, the ``done_key`` of row ``i`` is False (this catches two
    back-to-back slices of one trajectory), and the ``step_count_key`` of row ``i + 1`` is one more than row
    ``i``'s. Without a step counter in the batch, the storage index (``index_key``, stored by
    :class:`~torchrl.data.TensorDictReplayBuffer`'s writer) of row ``i + 1`` must be one more than row ``i``'s:
    two slices of one episode drawn back to back are never paired (TorchRL pairs them when the first does not
    end with ``done``). A slice that crosses the ring's seam (slot ``capacity - 1`` then slot ``0``) gets
    ``fill_value`` at the seam unless a step counter confirms it, as the transform does not know the capacity.
    Other rows get ``fill_value``. Markers with trailing dims (``(B, 1)``) are read at their first trailing
    element; an index with several trailing elements (``(row, env)`` of an ``ndim=2`` storage) must match in
    the others.

    For interleaved trajectories (``SliceSampler(fragmented=True)``: consecutive steps are not in consecutive
    slots), pass ``step_count_key`` (e.g. ``"step_count"``); with the storage index alone every row would be
    filled.

    It runs on the sample path only (``forward``; writes are unchanged) and holds no state: with DataLoader
    workers each worker rebuilds its own batches. A stored ``("next", key)`` entry is overwritten.

    Args:
        keys (NestedKey or sequence of NestedKey): the observations rebuilt. A tuple is a sequence of keys; a
            nested key goes in a list (``[("obs", "pixels")]``). Defaults to ``("observation",)``.

    Keyword Args:
        traj_key (NestedKey, optional): the trajectory id of each row; ``None`` skips this check. Defaults to
            ``("collector", "traj_ids")``.
        done_key (NestedKey, optional): the end-of-trajectory flag of each row (a full key, not relative to
            ``"next"``); ``None`` skips this check. Defaults to ``("next", "done")``.
        step_count_key (NestedKey, optional): a per-trajectory step counter; ``None`` skips this check.
            Defaults to ``None``.
        fill_value (float or int): the value of next entries that cannot be rebuilt. Defaults to
            ``float("nan")``, which only floating entries can hold: give integer entries (uint8 frames) an
            integer, e.g. ``fill_value=0``.
        strict (bool): a marker given but absent from the batch raises ``KeyError``; ``False`` skips its check
            instead. Defaults to ``True``.
        index_key (NestedKey, optional): the storage index of each row, used when the batch has it and no step
            counter (an absent entry skips the check, whatever ``strict``); ``None`` never uses it. Defaults to
            ``"index"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.transforms import NextStateReconstructor
        >>> batch = TensorDict({"observation": torch.arange(5.0), "episode": torch.tensor([0, 0, 0, 1, 1]),
        ...                     ("next", "done"): torch.tensor([False, False, True, False, False])}, batch_size=[5])
        >>> t = NextStateReconstructor(traj_key="episode")
        >>> t(batch)["next", "observation"]
        tensor([1., 2., nan, 4., nan])
        >>> slices = TensorDict({"observation": torch.tensor([4.0, 5.0, 6.0, 2.0, 3.0]), "episode": torch.zeros(5),
        ...                      "index": torch.tensor([4, 5, 6, 2, 3])}, batch_size=[5])  # two slices of one episode
        >>> NextStateReconstructor(traj_key="episode", done_key=None)(slices)["next", "observation"]
        tensor([5., 6., nan, 3., nan])
    """

    def __init__(
        self,
        keys: Any = ("observation",),
        *,
        traj_key: Any = ("collector", "traj_ids"),
        done_key: Any = ("next", "done"),
        step_count_key: Any = None,
        fill_value: float = float("nan"),
        strict: bool = True,
        index_key: Any = "index",
    ):
        keys = _check_reconstructed_keys(keys)
        super().__init__(in_keys=keys, out_keys=[("next", *_as_tuple(k)) for k in keys])
        self.keys = keys
        self.traj_key = _check_optional_key("traj_key", traj_key)
        self.done_key = _check_optional_key("done_key", done_key)
        self.step_count_key = _check_optional_key("step_count_key", step_count_key)
        self.index_key = _check_optional_key("index_key", index_key)
        if not is_real(fill_value):
            raise TypeError(f"`fill_value` must be a number (float or int), got {fill_value!r}.")
        if not isinstance(strict, bool):
            raise TypeError(f"`strict` must be a bool, got {strict!r}.")
        self.fill_value, self.strict = fill_value, strict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes ``("next", key)`` for each of ``keys`` (in place) and returns ``tensordict``."""
        if not isinstance(tensordict, TensorDictBase):
            raise TypeError(f"NextStateReconstructor takes a TensorDict, got {type(tensordict).__name__}.")
        if tensordict.batch_dims != 1:
            raise ValueError(
                f"NextStateReconstructor needs a flat (B,) sample, got a batch of size "
                f"{list(tensordict.batch_size)}: sample from a 1-D storage (slice samplers return flat batches), or "
                f"reshape(-1) the batch before this transform."
            )
        batch = tensordict.batch_size[0]
        if batch == 0:
            return tensordict
        values = {}
        for key in self.keys:  # everything is checked before anything is written
            value = tensordict.get(key, None)
            if not isinstance(value, torch.Tensor):
                raise KeyError(
                    f"NextStateReconstructor rebuilds ('next', {key!r}) from the entry {key!r}, which the sampled "
                    f"batch {'lacks' if value is None else 'holds as a ' + type(value).__name__}: pass the stored "
                    f"observation keys with `keys=`."
                )
            self._check_fill(key, value.dtype)
            values[key] = value
        follows = self._follows(tensordict, batch, next(iter(values.values())).device)
        for key, value in values.items():
            nxt = value.roll(-1, 0)
            nxt[~follows.to(value.device)] = self.fill_value
            tensordict.set(("next", *_as_tuple(key)), nxt)
        return tensordict

    def _check_fill(self, key, dtype: torch.dtype) -> None:
        if dtype.is_floating_point or dtype.is_complex:
            return
        fill = self.fill_value
        if isinstance(fill, float) and not (math.isfinite(fill) and fill.is_integer()):
            raise NEXT_STATE_FILL_DTYPE.error(key=key, dtype=dtype, fill=fill)

    def _marker(self, data: TensorDictBase, name: str, error: TorchRLPhrase, batch: int) -> torch.Tensor | None:
        key = getattr(self, name)
        if key is None:
            return None
        value = data.get(key, None)
        if value is None:
            if self.strict:
                raise error.error(key=key, name=name)
            return None
        if not isinstance(value, torch.Tensor) or value.ndim == 0 or value.shape[0] != batch:
            shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(
                f"The `{name}` entry {key!r} must hold one value per sampled row (shape ({batch}, ...)), got "
                f"{shape}."
            )
        return value.reshape(batch, -1)[:, 0]

    def _follows(self, data: TensorDictBase, batch: int, device: torch.device) -> torch.Tensor:
        """Whether row ``i + 1`` is the step after row ``i``, for each row ``i``."""
        traj, done, count = (self._marker(data, name, error, batch) for name, error in _MARKERS)
        follows = torch.ones(batch, dtype=torch.bool, device=device)
        follows[-1] = False
        if traj is not None:
            follows[:-1] &= (traj[1:] == traj[:-1]).to(device)
        if done is not None:
            follows[:-1] &= ~done[:-1].bool().to(device)
        if count is not None:
            follows[:-1] &= (count[1:] == count[:-1] + 1).to(device)
        else:
            slots = self._slots(data, batch)
            if slots is not None:  # consecutive slots (and the same env column, if any)
                consecutive = slots[1:, 0] == slots[:-1, 0] + 1
                if slots.shape[1] > 1:
                    consecutive &= (slots[1:, 1:] == slots[:-1, 1:]).all(-1)
                follows[:-1] &= consecutive.to(device)
        return follows

    def _slots(self, data: TensorDictBase, batch: int) -> torch.Tensor | None:
        """The storage index of each row, ``(B, k)``, or ``None`` when the batch has none."""
        if self.index_key is None:
            return None
        value = data.get(self.index_key, None)
        if not isinstance(value, torch.Tensor):
            return None
        if value.ndim == 0 or value.shape[0] != batch or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise ValueError(
                f"The `index_key` entry {self.index_key!r} must hold the integer storage index of each sampled row "
                f"(shape ({batch}, ...)), got {value.dtype} of shape {list(value.shape)}. Pass the entry that holds "
                f"it with `index_key=`, or index_key=None to ignore it."
            )
        return value.reshape(batch, -1)

    def __repr__(self) -> str:
        return (
            f"NextStateReconstructor(keys={self.keys}, traj_key={self.traj_key!r}, done_key={self.done_key!r}, "
            f"step_count_key={self.step_count_key!r}, fill_value={self.fill_value}, strict={self.strict}, "
            f"index_key={self.index_key!r})"
        )
