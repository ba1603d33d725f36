"""Serving fresh trajectory slices once each: :class:`StreamingSliceSampler`.

Data model (see NOTE [streaming windows] in :mod:`._streaming_windows`): the buffer reports every write
(``mark_update``); the sampler cuts the written steps, in write order and per trajectory, into consecutive
non-overlapping windows of ``slice_len`` steps, and keeps them on a stack. A batch takes windows from the top of
the stack (the newest first), each window once, and fills the slices it lacks with uniform slices drawn as
:class:`~torchrl.data.replay_buffers.samplers.SliceSampler` draws them. A window whose rows the ring buffer
overwrote before it was served is dropped.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import NestedKey

from torchrl.data.replay_buffers.samplers._slice_args import SliceArgs
from torchrl.data.replay_buffers.samplers._streaming_windows import WindowQueue
from torchrl.data.replay_buffers.samplers.base import check_not_empty
from torchrl.data.replay_buffers.samplers.slice import SliceSampler, _check_tensordict_storage
from torchrl.data.replay_buffers.trajectories.columns import flags_at, has_key, values_at
from torchrl.data.replay_buffers.trajectories.interleaved import entry_values, resolve_traj_key
from torchrl.data.replay_buffers.trajectories.keys import DONE_KEY, normalize_key

_MASK_KEY = ("collector", "mask")
_SLICE_INIT_KEY = "is_init"  # the key SliceSampler reads and returns its slice-start flags under
_WHO = "StreamingSliceSampler"


class StreamingSliceSampler(SliceSampler):
    """Serves each slice of freshly written trajectories once, newest first, then falls back to uniform slices.

    Made for learners that train on slices (recurrent policies, sequence models) while actors keep writing:
    every written step reaches a batch once, in slices that follow the trajectories, and the freshest data is
    used first. The steps are cut, in write order and per trajectory, into consecutive non-overlapping windows
    of ``slice_len`` steps. A batch of ``batch_size`` steps holds ``batch_size // slice_len`` slices: first the
    queued windows, newest first (by their newest step), each served once, then, when the queue runs short,
    uniform slices drawn like :class:`SliceSampler` (which repeat data). A window whose rows were overwritten
    by the ring buffer before it was served is dropped.

    Trajectories: with trajectory ids (``traj_key``), a trajectory may be spread over several writes and
    interleaved with others (e.g. a collector writing steps of several envs); the steps of each id are cut
    separately, and a stored done flag (``end_key``/``end_keys``, else ``("next", "done")`` when stored) ends
    it. With done flags only, the writes are one stream and a done flag ends the trajectory. The rows that do
    not fill a window wait for the next writes of their trajectory; when a trajectory ends with fewer than
    ``slice_len`` steps left, they are dropped (``strict_length=True``) or queued as a shorter window
    (``strict_length=False``; padded or shortened as :class:`SliceSampler` does with ``pad_output``).

    Stateful (``requires_shared_state = True``): the queue and the write stamps would be duplicated by a
    per-worker copy, so a buffer with this sampler is refused by DataLoader workers. The state round-trips
    through ``state_dict``/``load_state_dict``, ``dumps``/``loads`` and pickling. The sampler learns of writes
    through the buffer (``mark_update``); use it in a buffer, or call ``mark_update(index, storage=storage)``
    after each ``storage.set``. It needs a 1-D storage whose items are read as TensorDicts (a TensorStorage or a
    :class:`~torchrl.data.LazyStackStorage`; a plain :class:`~torchrl.data.ListStorage` raises a ``RuntimeError``
    at :meth:`sample`, as in :class:`SliceSampler`).

    Keyword Args:
        slice_len (int): steps per slice (window); ``batch_size`` must be a multiple of it.
        step_key, fragmented: interleaved trajectories, as in :class:`SliceSampler`: the new steps of each
            trajectory id are cut in ``step_key`` order, and a missing step ends a window as a done flag does
            (TorchRL has no such option here). Defaults to ``"step_count"`` and ``False``.
        end_key, end_keys, traj_key: where trajectories come from, as in :class:`SliceSampler` (the same
            defaults and fallbacks), plus the done flags that end a trajectory given by ids (see above).
        cache_values (bool): keep the trajectory boundaries of the uniform fallback between calls, until the
            storage is written again (as in :class:`SliceSampler`). Defaults to ``False``.
        truncated_key (NestedKey, optional): the info entry marking the last step of each slice, returned
            with its ``"done"`` and ``"terminated"`` siblings (``("next", "done")`` and ``("next", "terminated")``
            for the default) as in :class:`SliceSampler`.
            Defaults to ``("next", "truncated")``.
        init_key (NestedKey): the stored entry flagging the first step of a trajectory, and the info entry
            returned under that name when it is stored: ``True`` on the first step of each slice and where the
            stored flag is set. Defaults to ``"is_init"``.
        strict_length (bool): see above and :class:`SliceSampler`. Defaults to ``True``.
        pad_output (bool): with ``strict_length=False``, pad short slices to ``slice_len`` (see
            :class:`SliceSampler`). Defaults to ``False``.
        compile, use_gpu: accepted for compatibility with TorchRL, without effect (see :class:`SliceSampler`).
        span: as in :class:`SliceSampler`, for the uniform fallback only (queued windows never span).
            Defaults to ``False``.

    ``sample`` returns ``(index, info)`` as :class:`SliceSampler` does: a 1-tuple of row indices, the served
    windows first, then the uniform slices.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, StreamingSliceSampler, TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(100), sampler=StreamingSliceSampler(slice_len=4), batch_size=8
        ... )
        >>> done = torch.zeros(16, 1, dtype=torch.bool)
        >>> done[7] = done[15] = True  # two trajectories of 8 steps
        >>> _ = rb.extend(TensorDict(step=torch.arange(16), next=TensorDict(done=done, batch_size=[16]),
        ...     batch_size=[16]))
        >>> rb.sample()["step"].view(2, 4)  # the two newest windows
        tensor([[12, 13, 14, 15],
                [ 8,  9, 10, 11]])
        >>> rb.sample()["step"].view(2, 4)  # then the two others; then uniform slices
        tensor([[4, 5, 6, 7],
                [0, 1, 2, 3]])
        >>> rb.sampler.queued
        0
    """

    requires_shared_state = True

    def __init__(
        self,
        *,
        slice_len: int,
        end_key: NestedKey | None = None,
        end_keys: list[NestedKey] | None = None,
        traj_key: NestedKey | None = None,
        step_key: NestedKey | None = "step_count",
        fragmented: bool = False,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        init_key: NestedKey = "is_init",
        strict_length: bool = True,
        pad_output: bool = False,
        compile: bool | dict = False,
        span: bool | int | tuple = False,
        use_gpu: bool | torch.device = False,
    ):
        if slice_len is None:
            raise TypeError(
                "StreamingSliceSampler cuts writes into windows of `slice_len` steps: pass slice_len=N "
                "(got None). The number of slices of a batch is batch_size // slice_len."
            )
        self._configure_slices(SliceArgs.from_arguments(locals()))
        self.init_key = normalize_key(init_key)
        self._queue = WindowQueue(self.slice_len, keep_short=not self.strict_length)

    # -- writes ------------------------------------------------------------------------------------------------
    def mark_update(self, index, *, storage=None) -> None:
        """Records that the rows ``index`` were written, in this order (the buffer calls it on every write;
        ``add``/``extend`` record nothing).

        Only the rows are recorded; the trajectory entries are read when the next batch is drawn.
        """
        super().mark_update(index, storage=storage)
        if storage is not None and storage.ndim != 1:
            return  # sample() refuses such a storage, with the reason
        rows = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu()
        if rows.numel() and bool((rows < 0).any()):  # -1: nothing written there (top-k writers)
            rows = rows[rows >= 0]
        if rows.numel():
            self._queue.record(rows)

    @staticmethod
    def _check_ndim(storage) -> None:
        if storage.ndim != 1:
            raise ValueError(
                f"StreamingSliceSampler serves windows of a 1-D storage (one stream of steps); got a storage with "
                f"ndim={storage.ndim}. Flatten the env dims (e.g. extend with data.reshape(-1)) into a 1-D storage."
            )

    def _stream_keys(self, storage) -> tuple[Any, list]:
        """``(trajectory id key or None, done keys present)``: how written steps are grouped and cut."""
        # fragmented: ids are required (TorchRL's probe), done flags alone cannot order interleaved steps
        if self.fragmented:
            source, is_done = (resolve_traj_key(storage, self.traj_key),), False
        else:
            source, is_done = self._resolve_source(storage)
        if is_done:
            return None, list(source)
        ends = self.end_keys or ((self.end_key,) if self.end_key is not None else (DONE_KEY,))
        return source[0], [key for key in ends if has_key(storage, key)]

    def _cut(self, storage, key, rows, stamps, done, steps) -> list[tuple]:
        """Cuts the new steps of one trajectory; with ``fragmented=True`` in step order, a missing step (within
        the new steps, or between the pending ones and them) ending a window as a done flag does."""
        if steps is None:
            return self._queue.cut(key, rows, stamps, done)
        order = torch.argsort(steps, stable=True)
        rows, stamps, done, steps = rows[order], stamps[order], done[order], steps[order]
        done = done.clone()
        done[:-1] |= steps[1:] != steps[:-1] + 1
        held = self._queue.pending.get(key)
        last = None if held is None else values_at(storage, self.step_key, held[0][-1:], who=_WHO)
        gap = last is not None and int(last.reshape(-1)[0]) + 1 != int(steps[0])
        return self._queue.cut(key, rows, stamps, done, close_pending=gap)

    def _cut_log(self, storage) -> None:
        """Cuts the steps written since the last sample into windows (see the module data model)."""
        queue = self._queue
        if not queue.log_size:
            return
        # read what the cut needs first: if the storage lacks an entry, the log stays for the next try
        rows, stamps = queue.take_log(clear=False)
        if not rows.numel():  # all overwritten since
            queue.take_log()
            return
        id_key, done_keys = self._stream_keys(storage)
        done = (
            flags_at(storage, done_keys, rows, who=_WHO).squeeze(-1)
            if done_keys
            else torch.zeros(rows.numel(), dtype=torch.bool)
        )
        if id_key is not None:
            ids = values_at(storage, id_key, rows, who=_WHO).reshape(rows.numel(), -1)
            if ids.shape[1] != 1:
                raise ValueError(
                    f"The trajectory ids {id_key!r} have shape {[rows.numel(), *ids.shape[1:]]}: pass one scalar "
                    f"id per step."
                )
        steps = None
        if self.fragmented:  # checked as the uniform fallback checks them
            ids = torch.from_numpy(entry_values(ids, id_key, rows.numel())).unsqueeze(-1)
            steps = values_at(storage, self.step_key, rows, who=_WHO)
            steps = torch.from_numpy(entry_values(steps, self.step_key, rows.numel()))
        queue.take_log()
        if id_key is None:
            queue.push(queue.cut(None, rows, stamps, done))
            return
        keys, inverse = torch.unique(ids.squeeze(-1).cpu(), return_inverse=True)
        if keys.numel() == 1:
            queue.push(self._cut(storage, keys.item(), rows, stamps, done, steps))
            return
        order = torch.argsort(inverse, stable=True)
        counts = torch.bincount(inverse, minlength=keys.numel()).tolist()
        parts = []
        for key, chunk in zip(keys.tolist(), order.split(counts)):
            parts += self._cut(
                storage, key, rows[chunk], stamps[chunk], done[chunk], None if steps is None else steps[chunk]
            )
        queue.push(parts)

    # -- sampling ----------------------------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        """The number of windows waiting to be served (those overwritten since are dropped when reached)."""
        return self._queue.size

    def sample(self, storage, batch_size: int) -> tuple[tuple[torch.Tensor, ...], dict]:
        batch_size = self._scaled_batch_size(batch_size)
        num_slices, slice_len = self._slice_shape(batch_size)
        self._check_ndim(storage)
        _check_tensordict_storage(self, storage)
        check_not_empty(storage)
        self._cut_log(storage)
        rows, stamps, lengths = self._queue.pop(num_slices)
        parts = []
        if rows.shape[0]:
            parts.append(self._served(storage, rows, lengths))
        if rows.shape[0] < num_slices:
            try:
                parts.append(self._uniform_slices(storage, (num_slices - rows.shape[0]) * slice_len))
            except Exception:
                self._queue.push([(rows, stamps, lengths)])  # the windows were not served: queued again
                raise
        if len(parts) == 1:
            return parts[0]
        return _merge(parts)

    def can_sample(self, storage, batch_size: int) -> bool:
        """Whether :meth:`sample` can draw a batch now: enough queued windows, or uniform slices to fill it
        (see :meth:`SliceSampler.can_sample`; the rows written since the last draw are cut into windows first).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, StreamingSliceSampler
            >>> storage = LazyTensorStorage(100)
            >>> sampler = StreamingSliceSampler(slice_len=4, traj_key="episode")
            >>> sampler.can_sample(storage, 8)
            False
            >>> storage.set(torch.arange(8), TensorDict(episode=torch.zeros(8, dtype=torch.long), batch_size=[8]))
            >>> sampler.mark_update(torch.arange(8), storage=storage)
            >>> sampler.can_sample(storage, 8)
            True
        """
        num_slices, _ = self._slice_shape(self._scaled_batch_size(batch_size))
        self._check_ndim(storage)
        if len(storage) == 0:
            return False
        _check_tensordict_storage(self, storage)
        self._cut_log(storage)
        return self.queued >= num_slices or super().can_sample(storage, batch_size)

    def _uniform_slices(self, storage, batch_size: int) -> tuple[tuple[torch.Tensor, ...], dict]:
        index, info = self._sample_steps(storage, batch_size)
        if self.init_key != _SLICE_INIT_KEY and _SLICE_INIT_KEY in info:
            info[self.init_key] = info.pop(_SLICE_INIT_KEY)
        return index, info

    def _init_key(self):
        return self.init_key  # the uniform fallback reads the slice-start flags from init_key

    def _served(self, storage, rows: torch.Tensor, lengths: torch.Tensor) -> tuple[tuple[torch.Tensor], dict]:
        """Index and info of queued windows ``rows`` (``[k, L]``, padded after ``lengths`` steps)."""
        k, length = rows.shape
        real = None
        if self.strict_length or bool((lengths == length).all()):  # full windows: the cached layout
            steps, last, first = self._steps(k, length, rows.device)
            flat, truncated = rows.reshape(-1), last.clone()
        else:
            steps = torch.arange(length)
            truncated = steps == (lengths - 1).unsqueeze(-1)
            first = (steps == 0).expand(k, length)
            if self.pad_output:
                real = steps < lengths.unsqueeze(-1)
                flat = rows.reshape(-1)
            else:
                keep = steps < lengths.unsqueeze(-1)
                flat, truncated, first = rows[keep], truncated[keep], first[keep]
            truncated, first = truncated.reshape(-1, 1), first.reshape(-1, 1)
        info: dict = {}
        if self.truncated_key is not None:  # with its stored "done"/"terminated" siblings, as SliceSampler
            done_key, terminated_key = self._info_keys()
            if has_key(storage, done_key):
                done = flags_at(storage, [done_key], flat, who=_WHO).logical_or_(truncated)
            else:
                done = truncated.clone()
            if has_key(storage, terminated_key):
                terminated = flags_at(storage, [terminated_key], flat, who=_WHO)
            else:
                terminated = torch.zeros_like(truncated)
            info[self.truncated_key] = truncated
            info[done_key] = done
            info[terminated_key] = terminated
        if has_key(storage, self.init_key):
            info[self.init_key] = flags_at(storage, [self.init_key], flat, who=_WHO).logical_or_(first)
        if real is not None:
            info[_MASK_KEY] = real.reshape(-1)
        device = getattr(storage, "device", None)
        if isinstance(device, torch.device) and device.type != "cpu":
            flat = flat.to(device)
            info = {key: value.to(device) for key, value in info.items()}
        return (flat,), info

    # -- state -------------------------------------------------------------------------------------------------
    def _empty(self) -> None:
        super()._empty()
        self._queue.clear()

    def state_dict(self) -> dict[str, Any]:
        """The write stamps, the steps not cut yet, the pending rows per trajectory and the queued windows."""
        return self._queue.state_dict()

    # load_state_dict: NOTE [sampler state validation] in samplers/base.py (check everything, then install)
    def _validate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"parsed": self._queue.check_state(state)}

    def _apply_state(self, state: dict[str, Any]) -> None:
        self._queue.apply_state(state["parsed"])

    def _repr_fields(self) -> list[str]:
        return super()._repr_fields() + [f"init_key={self.init_key!r}", f"queued={self.queued}"]


def _merge(parts: list[tuple]) -> tuple[tuple[torch.Tensor], dict]:
    """Concatenates ``(index, info)`` parts; a mask that only one part returns is ``True`` on the others."""
    index = (torch.cat([part[0][0] for part in parts]),)
    keys = []
    for _, info in parts:
        keys += [key for key in info if key not in keys]
    info = {}
    for key in keys:
        values = []
        for (part_index,), part_info in parts:
            value = part_info.get(key)
            if value is None:
                like = next(p[1][key] for p in parts if key in p[1])
                fill = torch.ones if key == _MASK_KEY else torch.zeros
                value = fill((part_index.numel(), *like.shape[1:]), dtype=like.dtype, device=like.device)
            values.append(value)
        info[key] = torch.cat(values)
    return index, info
