"""The window queue behind :class:`~torchrl.data.replay_buffers.samplers.StreamingSliceSampler`.

NOTE [streaming windows]
Every write of a storage row gets a *stamp* from a write clock (1, 2, 3, ... in write order), and
``slot_stamp[row]`` holds the stamp of the write that last wrote ``row`` (``0``: never written). A window is
``slice_len`` rows of one trajectory in time order together with the stamps those rows had when it was cut; it
still holds the data it was cut from if and only if ``slot_stamp[rows] == stamps``. A ring buffer that wraps
overwrites rows, which bumps their stamps, so an overwritten window is recognised (and dropped) without any
search. Three stages, all keyed on stamps:

1. the *log*: rows written since the last sample, in write order (``mark_update`` only appends to it, so a
   write costs one indexed store);
2. *pending*: per trajectory, the rows that do not yet fill a window (they wait for the next writes);
3. the *queue*: the cut windows, a stack ordered by the stamp of their newest step, served from the top
   (newest first), each once.

A log entry or pending row whose stamp is stale was overwritten before it was cut, and is dropped when the
log is processed.
"""

from __future__ import annotations

from typing import Any

import torch

_EMPTY = torch.zeros(0, dtype=torch.long)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    if not parts:
        return _EMPTY
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class WindowQueue:
    """Stamps, log, pending rows and queued windows of one streaming sampler (see the module note).

    Args:
        slice_len (int): the steps of a window.
        keep_short (bool): queue the last window of a finished trajectory when it is shorter than
            ``slice_len`` (padded with its last row); ``False`` drops it.
    """

    def __init__(self, slice_len: int, keep_short: bool):
        self.slice_len = slice_len
        self.keep_short = keep_short
        self.clear()

    def clear(self) -> None:
        """Forgets every write (``rb.empty()``)."""
        self.clock = 0
        self.slot_stamp = torch.zeros(0, dtype=torch.long)
        self._log_rows: list[torch.Tensor] = []
        self._log_stamps: list[torch.Tensor] = []
        self._log_len = 0
        self.pending: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}
        self._rows = torch.zeros(0, self.slice_len, dtype=torch.long)
        self._stamps = torch.zeros(0, self.slice_len, dtype=torch.long)
        self._lengths = torch.zeros(0, dtype=torch.long)
        self._size = 0

    # -- writes --------------------------------------------------------------------------------------------------
    def record(self, rows: torch.Tensor) -> None:
        """Stamps ``rows`` (written in this order) and appends them to the log."""
        n = rows.numel()
        top = int(rows.max()) + 1
        if top > self.slot_stamp.numel():
            grown = torch.zeros(max(top, 2 * self.slot_stamp.numel()), dtype=torch.long)
            grown[: self.slot_stamp.numel()] = self.slot_stamp
            self.slot_stamp = grown
        stamps = torch.arange(self.clock + 1, self.clock + n + 1)
        self.clock += n
        self.slot_stamp[rows] = stamps
        self._log_rows.append(rows)
        self._log_stamps.append(stamps)
        self._log_len += n
        if (
            self._log_len > 2 * self.slot_stamp.numel() + 1024
        ):  # only the rows still current are worth keeping
            rows, stamps = self.take_log()
            self._log_rows, self._log_stamps, self._log_len = [rows], [stamps], rows.numel()

    @property
    def log_size(self) -> int:
        return self._log_len

    def take_log(self, *, clear: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The log's entries that were not overwritten since, in write order; ``clear=True`` empties the log."""
        rows, stamps = _cat(self._log_rows), _cat(self._log_stamps)
        if rows.numel():
            current = self.slot_stamp[rows] == stamps
            if not bool(current.all()):
                rows, stamps = rows[current], stamps[current]
        if clear:
            self._log_rows, self._log_stamps, self._log_len = [], [], 0
        else:  # keep the filtered entries, as one part
            self._log_rows, self._log_stamps, self._log_len = [rows], [stamps], rows.numel()
        return rows, stamps

    # -- cutting -------------------------------------------------------------------------------------------------
    def cut(
        self,
        key,
        rows: torch.Tensor,
        stamps: torch.Tensor,
        done: torch.Tensor,
        *,
        close_pending: bool = False,
    ) -> list[tuple]:
        """Cuts one trajectory stream (its pending rows, then ``rows``) into windows.

        ``done[i]`` ends the trajectory at ``rows[i]``; ``close_pending`` ends it at the last pending row (a step
        missing between it and ``rows[0]``: interleaved trajectories). Returns the new windows as ``(rows [W, L], stamps
        [W, L], lengths [W])`` parts (not queued yet: :meth:`push` sorts and queues them); the rows after the
        last full window of the open trajectory become the pending rows of ``key``.
        """
        held = self.pending.pop(key, None)
        if held is not None:
            p_rows, p_stamps = held
            if bool((self.slot_stamp[p_rows] == p_stamps).all()):  # else: overwritten, the gap splits it
                rows, stamps = torch.cat([p_rows, rows]), torch.cat([p_stamps, stamps])
                done = torch.cat([torch.zeros(p_rows.numel(), dtype=torch.bool), done])
                done[p_rows.numel() - 1] = close_pending
        m, length = rows.numel(), self.slice_len
        if m == 0:
            return []
        ends = done.nonzero().squeeze(-1)
        seg_start = torch.cat([torch.zeros(1, dtype=torch.long), ends + 1])
        seg_len = torch.cat([ends + 1, torch.tensor([m])]) - seg_start  # the last segment is open
        done_long = done.long()
        seg = done_long.cumsum(0) - done_long
        pos = torch.arange(m) - seg_start[seg]
        full = (torch.div(pos, length, rounding_mode="floor") + 1) * length <= seg_len[seg]
        out = []
        if bool(full.any()):
            out.append((rows[full].view(-1, length), stamps[full].view(-1, length), None))
        n_closed = ends.numel()
        tail = seg_start[n_closed]
        kept = tail + torch.div(seg_len[n_closed], length, rounding_mode="floor") * length
        if kept < m:
            self.pending[key] = (rows[kept:].clone(), stamps[kept:].clone())
        if self.keep_short and n_closed:
            short = seg_len[:n_closed] % length
            which = short.nonzero().squeeze(-1)
            if which.numel():
                count = short[which]
                first = seg_start[which] + seg_len[which] - count
                steps = torch.minimum(torch.arange(length), (count - 1).unsqueeze(-1))
                at = first.unsqueeze(-1) + steps
                out.append((rows[at], stamps[at], count))
        return out

    def push(self, parts: list[tuple]) -> None:
        """Queues new windows (from :meth:`cut`), ordered by the stamp of their newest step."""
        if not parts:
            return
        length = self.slice_len
        rows = torch.cat([p[0] for p in parts])
        stamps = torch.cat([p[1] for p in parts])
        lengths = torch.cat(
            [torch.full((p[0].shape[0],), length, dtype=torch.long) if p[2] is None else p[2] for p in parts]
        )
        if rows.shape[0] > 1:
            order = torch.argsort(stamps[:, -1], stable=True)
            rows, stamps, lengths = rows[order], stamps[order], lengths[order]
        self._reserve(self._size + rows.shape[0])
        end = self._size + rows.shape[0]
        self._rows[self._size : end] = rows
        self._stamps[self._size : end] = stamps
        self._lengths[self._size : end] = lengths
        self._size = end
        if self._size > 2 * (self.slot_stamp.numel() // length) + 64:  # drop the overwritten windows
            self._compact()

    def _reserve(self, size: int) -> None:
        if size <= self._rows.shape[0]:
            return
        capacity = max(size, 2 * self._rows.shape[0], 16)
        for name in ("_rows", "_stamps"):
            grown = torch.zeros(capacity, self.slice_len, dtype=torch.long)
            grown[: self._size] = getattr(self, name)[: self._size]
            setattr(self, name, grown)
        lengths = torch.zeros(capacity, dtype=torch.long)
        lengths[: self._size] = self._lengths[: self._size]
        self._lengths = lengths

    def _compact(self) -> None:
        rows, stamps = self._rows[: self._size], self._stamps[: self._size]
        current = (self.slot_stamp[rows] == stamps).all(1)
        keep = int(current.sum())
        self._rows[:keep] = rows[current]
        self._stamps[:keep] = stamps[current]
        self._lengths[:keep] = self._lengths[: self._size][current]
        self._size = keep
        stale = [k for k, (r, s) in self.pending.items() if not bool((self.slot_stamp[r] == s).all())]
        for key in stale:
            del self.pending[key]

    # -- serving -------------------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """The windows queued (some may have been overwritten since: they are dropped when reached)."""
        return self._size

    def pop(self, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Up to ``count`` current windows, newest first, removed from the queue: ``(rows [k, L], stamps [k, L],
        lengths [k])``. :meth:`push` puts them back (e.g. when the batch they were for failed)."""
        rows_out, stamps_out, lengths_out = [], [], []
        while count and self._size:
            take = min(count, self._size)
            start = self._size - take
            rows = self._rows[start : self._size].flip(0)
            stamps = self._stamps[start : self._size].flip(0)
            lengths = self._lengths[start : self._size].flip(0)
            self._size = start
            current = (self.slot_stamp[rows] == stamps).all(1)
            if not bool(current.all()):
                rows, stamps, lengths = rows[current], stamps[current], lengths[current]
            rows_out.append(rows)
            stamps_out.append(stamps)
            lengths_out.append(lengths)
            count -= rows.shape[0]
        if not rows_out:
            empty = torch.zeros(0, self.slice_len, dtype=torch.long)
            return empty, empty.clone(), _EMPTY
        if len(rows_out) == 1:  # flip() copied them: nothing aliases the queue
            return rows_out[0], stamps_out[0], lengths_out[0]
        return torch.cat(rows_out), torch.cat(stamps_out), torch.cat(lengths_out)

    # -- state ---------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        log_rows, log_stamps = _cat(self._log_rows), _cat(self._log_stamps)
        keys = list(self.pending)
        return {
            "slice_len": self.slice_len,
            "clock": self.clock,
            "slot_stamp": self.slot_stamp.clone(),
            "log_rows": log_rows.clone(),
            "log_stamps": log_stamps.clone(),
            "pending_keys": keys,
            "pending_rows": [self.pending[k][0].clone() for k in keys],
            "pending_stamps": [self.pending[k][1].clone() for k in keys],
            "queue_rows": self._rows[: self._size].clone(),
            "queue_stamps": self._stamps[: self._size].clone(),
            "queue_lengths": self._lengths[: self._size].clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict` (checked first: a bad state raises and changes nothing)."""
        self.apply_state(self.check_state(state))

    def check_state(self, state: dict[str, Any]) -> tuple:
        """The parts of a :meth:`state_dict` that :meth:`apply_state` installs; a ``ValueError`` if they do not
        fit together or this queue's ``slice_len``. Changes nothing."""
        length = self.slice_len
        if state.get("slice_len") != length:
            raise ValueError(
                f"The saved streaming state cuts windows of {state.get('slice_len')!r} steps and this sampler "
                f"{length}: build it with slice_len={state.get('slice_len')!r} to load it."
            )
        try:
            clock, tensors, pending, queue = self._parse_state(state)
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise ValueError(
                f"The streaming state is inconsistent ({err}); nothing was loaded. Load a state saved by "
                f"StreamingSliceSampler.state_dict()."
            ) from None
        return clock, tensors, pending, queue

    def apply_state(self, parsed: tuple) -> None:
        """Installs what :meth:`check_state` returned (copies of its tensors)."""
        clock, tensors, pending, queue = parsed
        self.clock = clock
        self.slot_stamp = tensors["slot_stamp"].clone()
        self._log_rows, self._log_stamps = [tensors["log_rows"].clone()], [tensors["log_stamps"].clone()]
        self._log_len = tensors["log_rows"].numel()
        self.pending = {key: (r.clone(), s.clone()) for key, r, s in pending}
        self._size = queue.shape[0]
        self._rows = queue.clone()
        self._stamps = tensors["queue_stamps"].reshape(queue.shape).clone()
        self._lengths = tensors["queue_lengths"].clone()

    def _parse_state(self, state: dict[str, Any]) -> tuple:
        """``(clock, tensors, pending, queue)`` of a saved state; raises if its parts do not fit together."""
        length = self.slice_len
        names = ("slot_stamp", "log_rows", "log_stamps", "queue_rows", "queue_stamps", "queue_lengths")
        tensors = {name: torch.as_tensor(state[name], dtype=torch.long) for name in names}
        clock = state["clock"]
        keys, rows, stamps = state["pending_keys"], state["pending_rows"], state["pending_stamps"]
        pending = [
            (key, torch.as_tensor(r, dtype=torch.long), torch.as_tensor(s, dtype=torch.long))
            for key, r, s in zip(keys, rows, stamps, strict=True)
        ]
        queue = tensors["queue_rows"].reshape(-1, length)
        stamp = tensors["slot_stamp"]
        checks = {
            "clock": isinstance(clock, int) and not isinstance(clock, bool) and clock >= 0,
            "slot_stamp": stamp.ndim == 1 and bool((stamp >= 0).all() and (stamp <= clock).all()),
            "log": tensors["log_rows"].shape == tensors["log_stamps"].shape,
            "queue_stamps": tensors["queue_stamps"].numel() == queue.numel(),
            "queue_lengths": tensors["queue_lengths"].shape == (queue.shape[0],)
            and bool(((tensors["queue_lengths"] >= 1) & (tensors["queue_lengths"] <= length)).all()),
            "pending": all(r.ndim == 1 and r.shape == s.shape for _, r, s in pending),
        }
        for rows_seen in [tensors["log_rows"], queue.reshape(-1)] + [r for _, r, _ in pending]:
            if rows_seen.numel() and not (0 <= int(rows_seen.min()) and int(rows_seen.max()) < stamp.numel()):
                checks["rows"] = False
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"bad {', '.join(bad)}")
        return clock, tensors, pending, queue
