"""A replay buffer split over several Ray actors: :class:`ShardedRayReplayBuffer` and its clients.

Data model. ``num_shards`` actors each hold a whole buffer (``replay_buffer_cls`` built from constructors: its
storage, sampler, writer and transforms), hosted by :class:`~torchrl.data.replay_buffers._ray.shard_host.ShardHost`.
No actor coordinates the others: every handle (the owner, :class:`ShardedRayReplayBufferClient`) talks to all
shards itself.

- Writes go to one shard per row: the shard named by ``shard=``, else the row's ``route_key`` entry (an integer
  modulo ``num_shards``, or a string hashed), else the next shard in this handle's round robin (a whole batch to
  one shard, so a trajectory written in one call stays contiguous).
- Draws: NOTE [sharded draws] in ``shards.py`` (two actor round trips: each shard's weight, then each drawing
  its share, all shards in parallel). Indices are global (``slot * num_shards + shard``);
  ``update_priority`` goes to the shards that own them.
- Checkpoints: NOTE [sharded checkpoint] in ``shard_checkpoint.py``.
- A dead shard: the next call that reaches it raises ``RuntimeError`` naming it and the way out; with
  ``max_restarts`` Ray restarts it, and the restarted shard loads its part of the last checkpoint.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from torchrl._validation import check_int, is_int
from torchrl.data.replay_buffers._ray.host import check_constructors
from torchrl.data.replay_buffers._ray.runtime import (
    RuntimeLease,
    check_not_forked,
    connect,
    import_ray,
    ray_shut_down_error,
)
from torchrl.data.replay_buffers._ray.shard_checkpoint import (
    commit,
    new_version_dir,
    read_manifest,
    write_restore_pointer,
)
from torchrl.data.replay_buffers._ray.shard_host import ShardHost
from torchrl.data.replay_buffers._ray.shards import (
    check_num_shards,
    check_shard,
    from_global,
    global_weights,
    group_rows,
    shard_of_rows,
    split_counts,
    to_global,
)
from torchrl.data.replay_buffers._ray.waiting import poll_until
from torchrl.data.replay_buffers._ray.wire import decode
from torchrl.data.replay_buffers.loading.worker_transport import DEFAULT_TRANSPORT
from torchrl.data.replay_buffers.replay_buffers import (
    RateLimitedReplayBuffer,
    ReplayBuffer,
    ReplayBufferDataset,
)
from torchrl.data.replay_buffers.replay_buffers._readiness import RATE_NOT_PERMITTED, check_wait_args
from torchrl.data.replay_buffers.replay_buffers.rate_limiters import RateLimiter
from torchrl.data.replay_buffers.samplers.base import CONSUMED_EMPTY
from torchrl.data.replay_buffers.samplers.prioritized import check_priorities

__all__ = ["ShardedRayReplayBuffer", "ShardedRayReplayBufferClient"]

#: ``ray.init`` keywords used when this process has not initialized Ray (``ray_init_config`` overrides them).
DEFAULT_RAY_INIT_CONFIG: dict[str, Any] = {"include_dashboard": False}
#: Options of each shard actor (``remote_config`` overrides them).
DEFAULT_REMOTE_CONFIG: dict[str, Any] = {"num_cpus": 1}
#: Seconds the constructor waits for the shard actors to start.
ACTOR_START_TIMEOUT: float = 300.0
#: The timeout of one attempt to reserve insert budget, as its message writes it (``waiting.with_timeout``).
_ATTEMPT = 0.0


def _to_cpu(value):
    device = getattr(value, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu" and hasattr(value, "cpu"):
        return value.cpu()
    return value


def _rows(data) -> int:
    if isinstance(data, (torch.Tensor, TensorDictBase)):
        if not data.shape:
            raise ValueError("extend() writes a batch: pass data with a leading batch dimension (add() writes one item).")
        return data.shape[0]
    return len(data)


def _concat(batches: list):
    if len(batches) == 1:
        return batches[0]
    if all(isinstance(b, (torch.Tensor, TensorDictBase)) for b in batches):
        return torch.cat(batches, 0)
    out = []
    for batch in batches:
        out.extend(batch)
    return out


def _take(batch, order: torch.Tensor):
    if isinstance(batch, (torch.Tensor, TensorDictBase)):
        return batch[order]
    return [batch[i] for i in order.tolist()]


def _rebuild_client(identity: dict) -> ShardedRayReplayBufferClient:
    return ShardedRayReplayBufferClient(**identity)


class _ShardsLength:
    """Stands for the shards' storages in a dataset: nothing to share (the rows stay in the actors)."""

    def __init__(self, client: ShardedRayReplayBufferClient) -> None:
        self.client = client

    def __len__(self) -> int:
        return len(self.client)


class _ShardedSource:
    """What ``ShardedRayReplayBufferClient.as_dataset()`` reads: the methods
    :class:`~torchrl.data.ReplayBufferDataset` uses on a buffer, over a client of the shards. Each reader (a
    DataLoader worker) holds its own client, whose split of draws over shards is reseeded per worker; the
    samplers' state stays in the shard actors."""

    def __init__(self, client: ShardedRayReplayBufferClient, batch_size: int) -> None:
        self.client = client
        self.batch_size = batch_size
        self.storage = _ShardsLength(client)

    def sample(self, *args, **kwargs):
        return self.client.sample(self.batch_size)

    def stateful_component(self):
        return None  # the samplers' state lives in the shard actors

    def prepare_worker_copy(self, seed: int) -> None:
        check_not_forked("ShardedRayReplayBuffer.as_dataset() in a DataLoader worker")
        self.client.reseed(seed)

    def set_rng(self, generator) -> None:
        """No-op: the draws come from the shards' samplers."""


class ShardedRayReplayBufferClient:
    """A handle on the shards of a :class:`ShardedRayReplayBuffer`, without lifecycle rights.

    Picklable (it carries the shard actors' names, their namespace and the cluster's address, and finds the
    actors again where it is unpickled: a Ray task or actor, a spawned process); get one from ``rb.client()`` /
    ``rb.clients(n)``. Each handle has its own round-robin position (starting at a random shard) and its own
    random stream for the split of a draw over shards.

    Methods: ``extend``/``add`` (routed), ``sample`` (a two-level draw over all shards), ``update_priority`` /
    ``update_tensordict_priority`` (routed by global index), ``len()``, :meth:`shard_lengths`, ``empty``,
    ``dumps``/``loads`` (one consistent checkpoint of every shard). A call that reaches a dead shard raises
    ``RuntimeError`` naming the shard and what to do.
    """

    def __init__(self, actor_names: list[str], namespace: str | None, address: str | None, *,
                 route_key=None, batch_size: int | None = None, to_cpu: bool = True, max_restarts: int = 0,
                 restore_pointer: str | None = None, rate_limited: bool = False,
                 handles: list | None = None) -> None:  # fmt: skip
        if not actor_names or not all(isinstance(name, str) for name in actor_names):
            raise ValueError(f"`actor_names` must name one Ray actor per shard (strs), got {actor_names!r}.")
        self._actor_names = list(actor_names)
        self._namespace = namespace
        self._address = address
        self._route_key = route_key
        self._batch_size = batch_size
        self._to_cpu = bool(to_cpu)
        self._max_restarts = max_restarts
        self._restore_pointer = restore_pointer
        self._rate_limited = bool(rate_limited)
        self._handles = handles
        self._rng = np.random.default_rng()
        self._cursor = int(self._rng.integers(len(self._actor_names)))
        self._priority_key = None

    # -- identity and pickling --------------------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        """The number of shard actors."""
        return len(self._actor_names)

    @property
    def actor_names(self) -> list[str]:
        """The Ray names of the shard actors, shard ``0`` first."""
        return list(self._actor_names)

    @property
    def namespace(self) -> str | None:
        """The Ray namespace of the shard actors."""
        return self._namespace

    @property
    def address(self) -> str | None:
        """The address of the Ray cluster that a client joins where Ray is not initialized."""
        return self._address

    @property
    def route_key(self):
        """The entry whose value picks the shard of each written row (``None``: round robin)."""
        return self._route_key

    @property
    def batch_size(self) -> int | None:
        """The size of a :meth:`sample` called without one."""
        return self._batch_size

    @property
    def max_restarts(self) -> int:
        """How many times Ray restarts a dead shard (``0``: never; ``-1``: always)."""
        return self._max_restarts

    def _identity(self) -> dict:
        return {"actor_names": self._actor_names, "namespace": self._namespace, "address": self._address,
                "route_key": self._route_key, "batch_size": self._batch_size, "to_cpu": self._to_cpu,
                "max_restarts": self._max_restarts, "restore_pointer": self._restore_pointer,
                "rate_limited": self._rate_limited}  # fmt: skip

    def __reduce__(self):
        return (_rebuild_client, (self._identity(),))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_shards={self.num_shards}, route_key={self._route_key!r})"

    # -- remote calls --------------------------------------------------------------------------------------------
    def _dead_shard_error(self, shard: int, cause) -> RuntimeError:
        reason = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
        head = (f"Shard {shard} of {self.num_shards} of this ShardedRayReplayBuffer (Ray actor "
                f"{self._actor_names[shard]!r}, namespace {self._namespace!r}) died ({reason}).")  # fmt: skip
        if self._max_restarts:
            return RuntimeError(
                f"{head} Ray restarts it (max_restarts={self._max_restarts}) from the buffer's last checkpoint "
                f"(dumps()/loads(); empty without one), losing the rows written to it since: retry the call."
            )
        return RuntimeError(
            f"{head} Its rows are lost unless they were saved with dumps(): build a new ShardedRayReplayBuffer and "
            f"loads() the last checkpoint into it, or build it with max_restarts=N so that Ray restarts a dead "
            f"shard from the last checkpoint."
        )

    def _actors(self) -> list:
        check_not_forked(type(self).__name__)
        ray = import_ray()
        if self._handles is not None and not ray.is_initialized():
            raise ray_shut_down_error(self._actor_names[0], self._address)
        if self._handles is None:
            connect(ray, self._address, self._namespace)
            handles = []
            for shard, name in enumerate(self._actor_names):
                try:
                    handles.append(ray.get_actor(name, namespace=self._namespace))
                except ValueError as err:  # no live actor of that name
                    raise self._dead_shard_error(shard, "no live actor has that name") from err
            self._handles = handles
        return self._handles

    def _gather(self, calls: list[tuple[int, str, tuple]]) -> list:
        """Sends ``method(*args)`` to each ``shard`` of ``calls`` (all at once) and returns their results in
        order; a dead shard or a shard's own error is raised as the class docstring says."""
        ray = import_ray()
        handles = self._actors()
        refs = [(shard, getattr(handles[shard], method).remote(*args)) for shard, method, args in calls]
        out = []
        for shard, ref in refs:
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayActorError as err:
                raise self._dead_shard_error(shard, err) from err
            except ray.exceptions.RayTaskError as err:
                cause = err.cause
                if not isinstance(cause, Exception):
                    raise
                cause.add_note(f"(raised by shard {shard} of {self.num_shards}, Ray actor {self._actor_names[shard]!r})")
                raise cause from None
        return out

    def _call_all(self, name: str, *args, shards=None, **kwargs) -> list:
        shards = range(self.num_shards) if shards is None else shards
        return self._gather([(shard, "call", (name, args, kwargs)) for shard in shards])

    def _cpu(self, value):
        return _to_cpu(value) if self._to_cpu else value

    # -- writes ---------------------------------------------------------------------------------------------------
    def _next_shard(self) -> int:
        shard = self._cursor
        self._cursor = (self._cursor + 1) % self.num_shards
        return shard

    def _reserve_inserts(self, n: int, timeout: float | None) -> None:
        """Counts ``n`` rows in the rate limiter's budget (NOTE [one budget over shards] in ``shard_host.py``),
        waiting here (never in the actor) while the limiter blocks inserts, up to ``timeout`` seconds."""
        if timeout is not None:
            timeout = check_wait_args(False, timeout, None)

        def attempt(first: bool):
            why = self._gather([(0, "reserve_inserts", (n,))])[0]
            if why is None:
                return True, None, None
            return False, None, (f"ShardedRayReplayBuffer did not obtain insert budget for {n} rows within "
                                 f"{_ATTEMPT} seconds ({why}).")  # fmt: skip

        poll_until(attempt, timeout=timeout)

    def _write_counted(self, n: int, timeout: float | None, write):
        if not self._rate_limited:
            return write()
        self._reserve_inserts(n, timeout)
        try:
            return write()
        except BaseException:
            self._gather([(0, "release", (n, 0))])
            raise

    def extend(self, data, *, shard: int | None = None, timeout: float | None = None) -> torch.Tensor:
        """Writes the rows of ``data`` (a batch along its first dim) and returns their global indices.

        Each row goes to shard ``shard`` when given, else to the shard its ``route_key`` entry names (a
        TensorDict is needed then), else the whole batch to the next shard of this handle's round robin.
        With a ``rate_limiter`` that blocks inserts, the write first waits here for the budget, up to
        ``timeout`` seconds (``None``: as long as it takes; ``TimeoutError`` past it).

        Raises:
            KeyError: ``data`` lacks the ``route_key`` entry. TypeError / ValueError: a bad ``shard``, or a
                ``route_key`` entry that holds neither integers nor strings. Nothing is written then. An error
                raised by a shard's own buffer (data it refuses) is raised as it was raised there; when the rows
                went to several shards, the others may have written theirs.
        """
        data = self._cpu(data)
        if shard is not None:
            groups = [(check_shard(shard, self.num_shards), None)]
        elif self._route_key is not None:
            if not isinstance(data, TensorDictBase):
                raise TypeError(
                    f"This buffer routes rows by their {self._route_key!r} entry (route_key), so extend() needs a "
                    f"TensorDict, got a {type(data).__name__}: pass shard= to choose the shard yourself."
                )
            groups = group_rows(shard_of_rows(data, self._route_key, self.num_shards), self.num_shards)
            if len(groups) == 1:
                groups = [(groups[0][0], None)]
        else:
            groups = [(self._next_shard(), None)]
        calls = [(s, "call", ("extend", (data if rows is None else data[rows],), {})) for s, rows in groups]
        results = self._write_counted(_rows(data), timeout, lambda: self._gather(calls))
        if len(groups) == 1:
            return to_global(torch.as_tensor(results[0]).reshape(-1), groups[0][0], self.num_shards)
        index = torch.empty(_rows(data), dtype=torch.int64)
        for (s, rows), local in zip(groups, results):
            index[rows] = to_global(torch.as_tensor(local).reshape(-1), s, self.num_shards)
        return index

    def add(self, data, *, shard: int | None = None, timeout: float | None = None) -> int:
        """Writes one item (to ``shard``, to the shard of its ``route_key`` entry, or round robin) and returns
        its global index."""
        data = self._cpu(data)
        if shard is not None:
            shard = check_shard(shard, self.num_shards)
        elif self._route_key is not None:
            if not isinstance(data, TensorDictBase):
                raise TypeError(
                    f"This buffer routes items by their {self._route_key!r} entry (route_key), so add() needs a "
                    f"TensorDict, got a {type(data).__name__}: pass shard= to choose the shard yourself."
                )
            shard = int(shard_of_rows(data.unsqueeze(0), self._route_key, self.num_shards)[0])
        else:
            shard = self._next_shard()
        local = self._write_counted(1, timeout, lambda: self._gather([(shard, "call", ("add", (data,), {}))]))[0]
        return int(local) * self.num_shards + shard

    # -- reads ----------------------------------------------------------------------------------------------------
    def sample(self, batch_size: int | None = None, return_info: bool = False):
        """A batch drawn over all shards: in proportion to each shard's number of rows (uniform samplers) or
        to its priority mass (prioritized samplers), so the rows are drawn as one buffer holding them all would
        draw them (NOTE [sharded draws]). ``info`` (``return_info=True``) and a TensorDict batch's ``"index"``
        and ``"priority_weight"`` entries hold global indices and importance weights normalized by the global
        minimum priority. The batch's order is random.

        Raises:
            RuntimeError: no shard holds a row (or every priority is zero); TorchRL's "Cannot sample from an
                empty storage" phrase. ValueError: no ``batch_size`` here nor at construction.
        """
        if batch_size is None:
            batch_size = self._batch_size
        if batch_size is None:
            raise ValueError(
                "sample() needs a batch_size: pass one, or build the ShardedRayReplayBuffer with batch_size=N."
            )
        batch_size = check_int("batch_size", batch_size, minimum=1)
        summaries = self._gather([(s, "summary", ()) for s in range(self.num_shards)])
        prioritized = all(summary[1] is not None for summary in summaries)
        weights = [summary[1] if prioritized else summary[0] for summary in summaries]
        if not sum(weights) > 0:
            raise CONSUMED_EMPTY.error(
                why=f"none of the {self.num_shards} shards holds a row" + (" with a positive priority" if prioritized
                                                                         else "") + "; add data first (rb.extend)"
            )
        counts = split_counts(weights, batch_size, self._rng)
        shards = [s for s in range(self.num_shards) if counts[s]]
        if self._rate_limited:  # one budget for every handle: NOTE [one budget over shards] in shard_host.py
            why = self._gather([(0, "reserve_samples", (batch_size, sum(summary[0] for summary in summaries)))])[0]
            if why is not None:
                raise RATE_NOT_PERMITTED.error(detail=why)
        try:
            drawn = self._gather([(s, "draw", (int(counts[s]),)) for s in shards])
        except BaseException:
            if self._rate_limited:
                self._gather([(0, "release", (0, batch_size))])
            raise
        minima = {s: summary[2] for s, summary in enumerate(summaries) if prioritized}
        for s, (_, _, _, smallest) in zip(shards, drawn):
            if smallest is not None:
                minima[s] = smallest
        global_min = min(minima.values()) if minima else None
        batches, indices, weights_out = [], [], []
        for s, (batch, index, weight, smallest) in zip(shards, drawn):
            batches.append(decode(batch))
            indices.append(to_global(torch.as_tensor(index).reshape(-1), s, self.num_shards))
            if weight is not None and global_min is not None:
                weights_out.append(global_weights(torch.as_tensor(weight), smallest, global_min, summaries[s][3]))
        order = torch.from_numpy(self._rng.permutation(batch_size))
        data = _take(_concat(batches), order)
        index = torch.cat(indices)[order]
        info = {"index": index}
        if len(weights_out) == len(shards):
            info["priority_weight"] = torch.cat(weights_out)[order]
        if isinstance(data, TensorDictBase):
            for key, value in info.items():
                if key in data.keys():
                    data.set(key, value)
        return (data, info) if return_info else data

    def __len__(self) -> int:
        return sum(self.shard_lengths())

    def __getitem__(self, index):
        """The rows at ``index`` (global indices; one int gives one item), read from the shards that own them, in
        ``index``'s order."""
        shards, slots = from_global(index, self.num_shards)
        groups = group_rows(shards, self.num_shards)
        parts = self._gather([(s, "call", ("__getitem__", (torch.from_numpy(slots[rows.numpy()]),), {}))
                              for s, rows in groups])  # fmt: skip
        if len(groups) == 1:
            return parts[0][0] if is_int(index) else parts[0]
        order = torch.cat([rows for _, rows in groups]).argsort()
        return _take(_concat(parts), order)

    def manual_seed(self, seed: int) -> None:
        """Seeds this handle's split of draws over shards and each shard's generator (``seed + 1 + shard``), so
        that the draws of this handle are reproducible (while no other handle draws)."""
        seed = check_int("seed", seed, minimum=0)
        self._rng = np.random.default_rng(seed)
        self._gather([(s, "call", ("set_rng", (torch.Generator().manual_seed(seed + 1 + s),), {}))
                      for s in range(self.num_shards)])  # fmt: skip


    def shard_lengths(self) -> list[int]:
        """The number of rows of each shard, shard ``0`` first."""
        return self._call_all("__len__")

    def stats(self) -> dict[str, Any]:
        """``{"size", "shard_lengths"}`` and, with a ``rate_limiter``, the one budget's counters
        (``write_count``, ``samples_returned``, ``sample_budget``, ``samples_per_insert``)."""
        lengths = self.shard_lengths()
        out = {"size": sum(lengths), "shard_lengths": lengths}
        if self._rate_limited:
            out.update(self._gather([(0, "budget_stats", ())])[0])
        return out

    # -- priorities -----------------------------------------------------------------------------------------------
    def update_priority(self, index, priority) -> None:
        """Sets the priorities of the rows at ``index`` (global indices, as :meth:`sample` returns them), each in
        the shard that owns it. ``priority``: one number, or one per index (``[N, ...]`` priorities are reduced
        by the shards' samplers). Everything is checked before any shard is called.

        Raises:
            TypeError / ValueError: non-integer or negative indices, priorities that are not finite numbers
                ``>= 0``, or a number of priorities that is neither 1 nor the number of indices.
        """
        shards, slots = from_global(index, self.num_shards)
        priority = self._cpu(priority if isinstance(priority, torch.Tensor) else torch.as_tensor(priority))
        check_priorities(priority.reshape(-1))
        per_row = priority.numel() != 1
        if per_row and (priority.ndim == 0 or priority.shape[0] != len(slots)):
            raise ValueError(
                f"`priority` must be one number or one per index: got {tuple(priority.shape)} priorities for "
                f"{len(slots)} indices."
            )
        calls = []
        for shard, rows in group_rows(shards, self.num_shards):
            local = torch.from_numpy(slots[rows.numpy()])
            calls.append((shard, "call", ("update_priority", (local, priority[rows] if per_row else priority), {})))
        self._gather(calls)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """:meth:`update_priority` from a sampled TensorDict: its ``"index"`` entry and the shards' priority
        entry (``priority_key``, e.g. ``"td_error"``)."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"`data` must be a TensorDict sampled from this buffer, got {type(data).__name__}.")
        if self._priority_key is None:
            self._priority_key = self._gather([(0, "get", ("priority_key",))])[0]
        self.update_priority(data.get("index"), data.get(self._priority_key))

    def empty(self) -> None:
        """Removes every row of every shard."""
        self._call_all("empty")

    def reseed(self, seed: int) -> None:
        """Reseeds this handle's split of draws over shards only (the shards' samplers keep their streams)."""
        self._rng = np.random.default_rng(check_int("seed", seed, minimum=0))

    # -- DataLoader -----------------------------------------------------------------------------------------------
    def as_dataset(self, *, num_batches: int | None = None, transport: str = DEFAULT_TRANSPORT) -> ReplayBufferDataset:
        """A :class:`~torchrl.data.ReplayBufferDataset` of :meth:`sample` batches of :attr:`batch_size`, for a
        ``DataLoader(ds, batch_size=None, collate_fn=tensordict_collate, num_workers=N,
        multiprocessing_context="spawn")``: each worker holds its own client (a forked worker is refused: Ray
        calls hang there) and draws over all shards; the transforms run in the shards. ``num_batches``: batches
        per epoch over all workers (``None``: endless); ``transport``: see ReplayBufferDataset."""
        if self._batch_size is None:
            raise ValueError(
                "as_dataset() yields batches of the buffer's batch size, and it has none: build the "
                "ShardedRayReplayBuffer with batch_size=N."
            )
        return ReplayBufferDataset(_ShardedSource(ShardedRayReplayBufferClient(**self._identity()), self._batch_size),
                                   num_batches=num_batches, transport=transport)  # fmt: skip

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def dumps(self, path) -> None:
        """Saves every shard into one checkpoint at the directory ``path`` (on the shards' machines: a shared
        filesystem on a cluster): NOTE [sharded checkpoint]. A save interrupted (a shard or this process killed)
        leaves the previous checkpoint at ``path`` loadable."""
        version, name, parts = new_version_dir(path, self.num_shards)
        try:
            self._gather([(s, "call", ("dumps", (part,), {})) for s, part in enumerate(parts)])
        except BaseException:
            shutil.rmtree(os.path.join(os.path.abspath(os.fspath(path)), name), ignore_errors=True)
            raise
        entries = [{"shard": s, "part": os.path.basename(part)} for s, part in enumerate(parts)]
        route_key = list(self._route_key) if isinstance(self._route_key, tuple) else self._route_key
        commit(path, version, name, entries, {"route_key": route_key})
        if self._restore_pointer is not None:
            write_restore_pointer(self._restore_pointer, path)

    def loads(self, path) -> None:
        """Loads the checkpoint at ``path`` (written by :meth:`dumps` with as many shards) into every shard.
        A directory without a complete checkpoint (no manifest, a missing shard part) is refused before any
        shard is touched."""
        manifest = read_manifest(path, self.num_shards)
        self._gather([(s, "call", ("loads", (entry["path"],), {})) for s, entry in enumerate(manifest["shards"])])
        if self._restore_pointer is not None:
            write_restore_pointer(self._restore_pointer, path)

    dump = dumps
    load = loads


class ShardedRayReplayBuffer(ShardedRayReplayBufferClient):
    """A replay buffer split over ``num_shards`` Ray actors, sampled as one buffer.

    Each shard is a whole ``replay_buffer_cls(*args, **kwargs)`` (storage, sampler, writer, transforms) built in
    its own actor from constructors, as :class:`~torchrl.data.RayReplayBuffer` builds its one buffer; Ray places
    the actors on the cluster's nodes. Writes are routed to one shard per row (``route_key``, ``shard=``, or
    round robin). A draw splits the batch over the shards in proportion to their sizes (uniform samplers) or
    to their priority masses (prioritized samplers), then each shard draws its share: the distribution over all
    rows, and for prioritized shards the importance weights (normalized by the GLOBAL minimum priority), are
    those of one buffer holding every row. Indices are global (``slot * num_shards + shard``) and
    ``update_priority`` sends each to its shard. ``dumps``/``loads`` save and restore every shard as one
    checkpoint, whose manifest is written last: a save killed midway leaves the previous checkpoint loadable.

    This object owns the actors (:meth:`close` kills them); hand :meth:`client` / :meth:`clients` (picklable)
    to collectors and learners.

    A dead shard (its process killed, its node lost): with ``max_restarts=0`` every later call that reaches it
    raises ``RuntimeError`` naming it (build a new buffer and :meth:`loads` the last checkpoint). With
    ``max_restarts`` other than 0, Ray restarts it, and the restarted shard loads its part of the last
    checkpoint written or loaded through this buffer or its clients (it starts empty without one): the call
    that met the death raises the ``RuntimeError``, later calls reach the restarted shard.

    Args:
        *args: positional arguments of ``replay_buffer_cls`` (each shard gets them).

    Keyword Args:
        num_shards (int): the number of shard actors, ``>= 1``.
        route_key (str or tuple of str, optional): the entry of written TensorDicts whose value picks each row's
            shard: an integer (modulo ``num_shards``; e.g. the collector id) or a string (hashed). ``None``: each
            write goes whole to the next shard, round robin. Defaults to ``None``.
        replay_buffer_cls (type): the buffer class of each shard. Defaults to :class:`~torchrl.data.ReplayBuffer`.
        batch_size (int, optional): the size of ``sample()`` without an argument (kept here: the shards are
            built without one). Defaults to ``None``.
        ray_init_config (dict, optional): keywords of ``ray.init`` if Ray is not initialized yet. Defaults to
            ``{"include_dashboard": False}``, merged with what is passed.
        remote_config (dict, optional): options of each shard actor (``num_cpus``, ``num_gpus``, ``resources``,
            ``scheduling_strategy``, ...; ``name`` is the prefix of the shards' names). Defaults to
            ``{"num_cpus": 1}``, merged with what is passed.
        max_restarts (int): how many times Ray restarts a dead shard (``-1``: without limit), from the last
            checkpoint. Defaults to ``0`` (never: a dead shard raises).
        restore_dir (str, optional): where the buffer records its last checkpoint's path for restarted shards
            (used only with ``max_restarts``; on a cluster, a directory every node reads). Defaults to a new
            temporary directory, removed by :meth:`close`.
        rate_limiter (RateLimiter, optional): ONE budget for the whole buffer (:class:`~torchrl.data.MinSize`,
            :class:`~torchrl.data.SampleToInsertRatio`), kept by shard 0's actor for every handle: a draw it does
            not permit raises TorchRL's ``RuntimeError``; a write it blocks waits in the caller (``extend(...,
            timeout=)``) as a :class:`~torchrl.data.RayReplayBuffer` client's does. Defaults to ``None``.
        **kwargs: keyword arguments of ``replay_buffer_cls``, with constructors for the components
            (``storage=functools.partial(LazyTensorStorage, n)``: each shard holds up to ``n`` rows).

    Raises:
        TypeError / ValueError: a bad ``num_shards``, ``route_key``, ``batch_size``, ``max_restarts``,
            ``remote_config`` (``max_concurrency`` other than 1), ``prefetch`` (refused: each draw asks each shard
            for a different count), or a component instance instead of a constructor; all before Ray starts.
            ``replay_buffer_cls=RateLimitedReplayBuffer`` (pass ``rate_limiter=`` instead).

    Examples:
        >>> import functools, torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ShardedRayReplayBuffer, TensorDictPrioritizedReplayBuffer
        >>> rb = ShardedRayReplayBuffer(num_shards=2, route_key="collector_id", batch_size=8,
        ...                             replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=0.7, beta=0.5,
        ...                             storage=functools.partial(LazyTensorStorage, 100),
        ...                             ray_init_config={"num_cpus": 2}, remote_config={"num_cpus": 0})
        >>> index = rb.extend(TensorDict(obs=torch.arange(10), collector_id=torch.arange(10) % 2, batch_size=[10]))
        >>> rb.shard_lengths()
        [5, 5]
        >>> batch = rb.sample()
        >>> batch["index"].shape, batch["priority_weight"].shape
        (torch.Size([8]), torch.Size([8]))
        >>> rb.update_priority(batch["index"], torch.rand(8))
        >>> rb.close()
    """

    def __init__(self, *args, num_shards: int, route_key=None, replay_buffer_cls: type = ReplayBuffer,
                 batch_size: int | None = None, ray_init_config: dict | None = None,
                 remote_config: dict | None = None, max_restarts: int = 0, restore_dir: str | None = None,
                 rate_limiter: RateLimiter | None = None, **kwargs) -> None:  # fmt: skip
        num_shards = check_num_shards(num_shards)
        _check_route_key(route_key)
        if not (isinstance(replay_buffer_cls, type) and issubclass(replay_buffer_cls, ReplayBuffer)):
            raise TypeError(
                f"`replay_buffer_cls` must be a ReplayBuffer class (e.g. TensorDictPrioritizedReplayBuffer), got "
                f"{replay_buffer_cls!r}."
            )
        if batch_size is not None:
            batch_size = check_int("batch_size", batch_size, minimum=1, hint="Or pass None.")
        max_restarts = check_int("max_restarts", max_restarts, minimum=-1,
                                 hint="Pass 0 (a dead shard raises), N > 0 or -1 (restart without limit).")
        for name, value in (("ray_init_config", ray_init_config), ("remote_config", remote_config)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"`{name}` must be a dict of keyword arguments or None, got {value!r}.")
        remote_config = {**DEFAULT_REMOTE_CONFIG, **(remote_config or {})}
        if "max_restarts" in remote_config:
            raise TypeError("Pass `max_restarts` to ShardedRayReplayBuffer itself, not in `remote_config`.")
        if remote_config.get("max_concurrency", 1) != 1:
            raise ValueError(
                f"remote_config max_concurrency={remote_config['max_concurrency']!r}: a shard's two-level draw "
                f"reads its priority minimum in the call that draws, which needs an actor that runs one call at a "
                f"time. Leave max_concurrency at 1."
            )
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise TypeError(
                f"`rate_limiter` must be a RateLimiter (e.g. SampleToInsertRatio(1.0, 100, 10.0) or MinSize(100)) "
                f"or None, got {rate_limiter!r}."
            )
        if issubclass(replay_buffer_cls, RateLimitedReplayBuffer):
            raise TypeError(
                "replay_buffer_cls=RateLimitedReplayBuffer would give each shard a budget of its own, which would "
                "refuse its part of a draw the others served: pass rate_limiter=SampleToInsertRatio("
                "samples_per_insert, min_size_to_sample, error_buffer) to ShardedRayReplayBuffer instead (one "
                "budget for all shards)."
            )
        if kwargs.get("prefetch"):
            raise ValueError(
                f"prefetch={kwargs['prefetch']!r}: each draw asks each shard for a different number of items, so "
                f"shards cannot prefetch batches. Build the ShardedRayReplayBuffer without prefetch."
            )
        if restore_dir is not None and not isinstance(restore_dir, (str, os.PathLike)):
            raise TypeError(f"`restore_dir` must be a directory path or None, got {restore_dir!r}.")
        check_constructors(kwargs)
        ray = import_ray()
        self._closed = True  # until the actors exist
        self._owned_restore_dir = None
        restore_pointer = None
        if max_restarts:
            if restore_dir is None:
                restore_dir = self._owned_restore_dir = tempfile.mkdtemp(prefix="torchrl-sharded-restore-")
            restore_pointer = os.path.join(os.path.abspath(os.fspath(restore_dir)), "last_checkpoint.json")
        RuntimeLease.acquire(ray, {**DEFAULT_RAY_INIT_CONFIG, **(ray_init_config or {})})
        handles: list = []
        try:
            prefix = remote_config.pop("name", None) or f"torchrl-sharded-buffer-{uuid.uuid4().hex[:12]}"
            namespace = remote_config.pop("namespace", None) or ray.get_runtime_context().namespace
            names = [f"{prefix}-shard-{s}" for s in range(num_shards)]
            actor_cls = ray.remote(ShardHost)
            for s, name in enumerate(names):
                handles.append(actor_cls.options(name=name, namespace=namespace, max_restarts=max_restarts,
                                                 **remote_config).remote(
                    replay_buffer_cls, args, kwargs, s, num_shards, restore_pointer,
                    rate_limiter if s == 0 else None))  # fmt: skip
            _wait_ready(ray, handles, remote_config)
        except BaseException:
            for handle in handles:
                ray.kill(handle, no_restart=True)
            RuntimeLease.release(ray)
            self._remove_restore_dir()
            raise
        super().__init__(names, namespace, ray.get_runtime_context().gcs_address, route_key=route_key,
                         batch_size=batch_size, to_cpu=not remote_config.get("num_gpus"), max_restarts=max_restarts,
                         restore_pointer=restore_pointer, rate_limited=rate_limiter is not None,
                         handles=handles)  # fmt: skip
        self._closed = False

    def _remove_restore_dir(self) -> None:
        if self._owned_restore_dir is not None:
            shutil.rmtree(self._owned_restore_dir, ignore_errors=True)
            self._owned_restore_dir = None

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def client(self) -> ShardedRayReplayBufferClient:
        """A picklable handle on the shards, without lifecycle rights (it cannot close the buffer)."""
        return ShardedRayReplayBufferClient(**self._identity(), handles=self._handles)

    def clients(self, num_clients: int) -> list[ShardedRayReplayBufferClient]:
        """``num_clients`` clients (one per collector or learner), each as :meth:`client` returns it."""
        num_clients = check_int("num_clients", num_clients, minimum=0)
        return [self.client() for _ in range(num_clients)]

    def __reduce__(self):  # pickling the owner gives a client, as RayReplayBuffer's does
        return (_rebuild_client, (self._identity(),))

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def is_alive(self) -> bool:
        """Whether every shard answers (``False`` once closed, or a shard killed or crashed)."""
        if self._closed:
            return False
        try:
            self._gather([(s, "ready", ()) for s in range(self.num_shards)])
        except RuntimeError:
            return False
        return True

    def shard_pids(self) -> list[int]:
        """The process id of each shard actor, shard ``0`` first (on its node)."""
        return self._gather([(s, "pid", ()) for s in range(self.num_shards)])

    def close(self) -> None:
        """Kills every shard actor (their data is lost: save it with :meth:`dumps` first) and releases Ray,
        shutting it down if this process started it for buffers and none is left. Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        ray = import_ray()
        try:
            if ray.is_initialized():
                for handle in self._handles or ():
                    ray.kill(handle, no_restart=True)
        finally:
            self._handles = None
            self._remove_restore_dir()
            RuntimeLease.release(ray)

    def __enter__(self) -> ShardedRayReplayBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _actors(self) -> list:
        if self._closed:
            raise RuntimeError("This ShardedRayReplayBuffer was closed (its shard actors killed): build a new one.")
        return super()._actors()


def _check_route_key(route_key) -> None:
    if route_key is None or isinstance(route_key, str):
        return
    if isinstance(route_key, tuple) and route_key and all(isinstance(k, str) for k in route_key):
        return
    raise TypeError(
        f"`route_key` must be None (round robin), an entry name (str) or a nested key (tuple of str), got "
        f"{route_key!r}. For example route_key='collector_id'."
    )


def _wait_ready(ray, handles: list, remote_config: dict) -> None:
    """Waits for every shard actor to start; raises the buffer constructor's error, or a timeout naming the
    resources asked for."""
    try:
        ray.get([handle.ready.remote() for handle in handles], timeout=ACTOR_START_TIMEOUT)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"The {len(handles)} shard actors of ShardedRayReplayBuffer did not start within "
            f"{ACTOR_START_TIMEOUT:g} s: the cluster has no free resources for remote_config={remote_config} each "
            f"(ray.available_resources() = {ray.available_resources()}). Ask for less, e.g. "
            f"remote_config={{'num_cpus': 0}}, or use fewer shards."
        ) from None
    except ray.exceptions.RayTaskError as err:  # the buffer's constructor raised: raise its error here
        if isinstance(err.cause, Exception):
            raise err.cause from None
        raise

