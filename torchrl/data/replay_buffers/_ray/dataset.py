"""``RayReplayBuffer.as_dataset()``: :class:`RayReplayBufferDataset`, a DataLoader dataset over a buffer hosted in a
Ray actor.

Each reader (a DataLoader worker, or the main process) holds a client of the actor
(:class:`~torchrl.data.replay_buffers.ray_buffer.RayReplayBufferClient`), draws raw batches from it
(``client.sample_raw``) and runs the actor's forward transforms (``client.sample_transform()``) itself. The
dataset builds on :class:`~torchrl.data.ReplayBufferDataset` through its public hooks: :meth:`draw`, and an
object offering the methods that class uses on a buffer (:class:`_ActorSource`).
"""

from __future__ import annotations

from collections import deque

from torchrl._validation import check_int, check_positive_int
from torchrl.data.replay_buffers._ray.runtime import check_not_forked
from torchrl.data.replay_buffers.loading.worker_transport import DEFAULT_TRANSPORT
from torchrl.data.replay_buffers.replay_buffers.dataset import ReplayBufferDataset

__all__ = ["RayReplayBufferDataset"]

_CLIENT_METHODS = ("request_raw", "poll_raw", "sample_transform", "batch_size")


class _RemoteLength:
    """Stands for the actor's storage in a dataset: nothing to share (the data stays in the actor); its length
    is the buffer's."""

    def __init__(self, client) -> None:
        self.client = client

    def __len__(self) -> int:
        return len(self.client)


class _ActorSource:
    """What a :class:`RayReplayBufferDataset` samples from: raw batches of the actor, transformed here.

    It offers the methods :class:`~torchrl.data.ReplayBufferDataset` uses (``sample``, ``storage``,
    ``stateful_component``, ``prepare_worker_copy``, ``set_rng``); the transforms are fetched from the actor at
    the first sample of each process, so they are the actor's transforms as they are when a worker starts.

    Pipelining: :meth:`sample` keeps up to ``prefetch`` batches requested beyond the one it returns, asked for
    ``batches_per_call`` at a time, so that the actor samples (and the object store carries) the next batches
    while this process transforms the current one. It never asks for more than ``limit``, the draws left in
    this reader's share of the epoch: no batch is drawn from the sampler (and lost to a without-replacement
    epoch) that this reader will not yield.
    """

    def __init__(self, client, batch_size: int, prefetch: int, batches_per_call: int) -> None:
        self.client = client
        self.wait, self.timeout = False, None  # set by the dataset: see RayReplayBufferDataset's wait
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.batches_per_call = batches_per_call
        self.storage = _RemoteLength(client)
        self.transform = None
        self.ready: deque = deque()  # batches received, not returned yet
        self.pending: deque = deque()  # PendingBatches, oldest first

    def __getstate__(self):
        state = self.__dict__.copy()
        state.update(transform=None, ready=deque(), pending=deque())  # a copy starts with nothing in flight
        return state

    def stateful_component(self):
        return None  # the sampler's state lives once, in the actor

    def set_rng(self, generator) -> None:
        """No-op: the draws come from the actor's sampler and generator, one stream for all readers."""

    def prepare_worker_copy(self, seed: int) -> None:
        check_not_forked("RayReplayBuffer.as_dataset() in a DataLoader worker")

    @property
    def in_flight(self) -> int:
        """Batches requested from the actor or received, and not returned by :meth:`sample` yet."""
        return len(self.ready) + sum(pending.count for pending in self.pending)

    def _request(self, limit: int | None) -> None:
        wanted = 1 + self.prefetch if limit is None else min(1 + self.prefetch, limit)
        outstanding = self.in_flight
        while outstanding < wanted:
            count = self.batches_per_call if limit is None else min(self.batches_per_call, limit - outstanding)
            self.pending.append(self.client.request_raw(self.batch_size, count))
            outstanding += count

    def sample(self, limit: int | None = None):
        """The next raw batch of the actor, transformed here; ``limit``: the draws left to this reader,
        this one included (``None``: endless)."""
        if self.transform is None:
            self.transform = self.client.sample_transform()
        if self.wait:  # polled: nothing requested ahead (a request the actor cannot serve now would fail)
            if not self.ready:
                count = self.batches_per_call if limit is None else min(self.batches_per_call, limit)
                self.ready.extend(self.client.poll_raw(self.batch_size, count, timeout=self.timeout))
        else:
            self._request(limit)  # before waiting: the actor works on the next batches meanwhile
            if not self.ready:
                try:
                    self.ready.extend(self.pending.popleft().result())
                except BaseException:  # e.g. an empty buffer: the calls sent after this one would fail alike
                    self.pending.clear()
                    raise
        batch = self.ready.popleft()
        return self.transform(batch) if len(self.transform) else batch


class RayReplayBufferDataset(ReplayBufferDataset):
    """``RayReplayBuffer.as_dataset()``: a :class:`~torchrl.data.ReplayBufferDataset` over a buffer in a Ray actor.

    Each DataLoader worker holds a client of the actor, draws raw batches from it (sampler and storage read in
    the actor) and runs the buffer's forward transforms itself, so the transforms scale with the workers while
    every sampler stays exact: its state (priorities, a without-replacement permutation) lives once, in the
    actor, and batches of all workers come from it in turn. ``update_priority`` from the training loop goes to
    the actor through the :class:`RayReplayBuffer`. The transforms are copied from the actor when a worker draws
    its first batch; stateful transforms then have one state per worker.

    Workers must be started with ``multiprocessing_context="spawn"`` or ``"forkserver"``: a worker forked from a
    Ray driver raises ``RuntimeError`` at its first batch (Ray calls hang in forked children). A spawned worker
    joins the parent's cluster (its address travels with the dataset).

    Args:
        client (RayReplayBufferClient): a client of the actor (``rb.client()``).

    Speed: each reader keeps ``prefetch`` batches requested from the actor beyond the one it transforms, so
    that the actor samples them, and Ray's object store carries them, while the reader works; it never requests
    more than its share of ``num_batches``, so a without-replacement epoch is still read exactly once. Batches
    travel as numpy arrays that Ray hands over without a copy: the tensors of a batch view the object store's
    memory until the batch is released. With prioritized sampling, a batch's priorities and weights are those
    of the moment it was drawn, up to ``prefetch + batches_per_call - 1`` draws of this reader before it is
    yielded (plus what the DataLoader queues): pass ``prefetch=0, batches_per_call=1`` for draws that follow
    every priority update.

    Keyword Args:
        num_batches (int, optional): batches per epoch over all workers. Defaults to ``None`` (endless).
        transport (str): worker-to-main batch transport (see :class:`~torchrl.data.ReplayBufferDataset`).
            Defaults to ``"ring"``.
        prefetch (int): batches each reader keeps requested beyond the one it transforms. Defaults to ``1``.
        batches_per_call (int): batches the actor returns per call (fewer calls, larger replies).
            Defaults to ``8``.
        wait (bool): each reader waits until the actor's buffer can serve a batch (data written, a rate
            limiter's permission: :class:`~torchrl.data.RateLimitedReplayBuffer`, ``rate_limiter=``) instead of
            failing. The reader polls (:meth:`RayReplayBufferClient.poll_raw
            <torchrl.data.replay_buffers.ray_buffer.RayReplayBufferClient.poll_raw>`), so the actor keeps
            serving the writers; each poll draws up to ``batches_per_call`` batches that the buffer serves at
            once, and nothing is requested ahead (``prefetch`` is not used). Defaults to ``False``.
        timeout (float, optional): the longest wait of one poll with ``wait=True`` (``TimeoutError`` past it).
            Defaults to ``None`` (as long as it takes).

    Examples:
        >>> import functools, torch
        >>> from torch.utils.data import DataLoader
        >>> from torchrl.data import LazyTensorStorage, RayReplayBuffer, SamplerWithoutReplacement
        >>> from torchrl.data import tensordict_collate
        >>> rb = RayReplayBuffer(storage=functools.partial(LazyTensorStorage, 100),
        ...                      sampler=SamplerWithoutReplacement, batch_size=5,
        ...                      transform_factory=lambda: (lambda x: x * 10),
        ...                      ray_init_config={"num_cpus": 2})
        >>> _ = rb.extend(torch.arange(20))
        >>> loader = DataLoader(rb.as_dataset(num_batches=4), batch_size=None, collate_fn=tensordict_collate)
        >>> sorted(torch.cat(list(loader)).tolist()) == list(range(0, 200, 10))
        True
        >>> rb.close()
    """

    refuse_stateful = False  # the state lives once, in the actor

    def __init__(self, client, *, num_batches: int | None = None, transport: str = DEFAULT_TRANSPORT,
                 prefetch: int = 1, batches_per_call: int = 8, wait: bool = False,
                 timeout: float | None = None) -> None:  # fmt: skip
        prefetch = check_int("prefetch", prefetch, minimum=0, hint="Pass 0 to request one batch at a time.")
        batches_per_call = check_positive_int("batches_per_call", batches_per_call)
        if not all(hasattr(type(client), name) for name in _CLIENT_METHODS):
            raise TypeError(
                f"`client` must be a RayReplayBufferClient (rb.client()), got {type(client).__name__}."
            )
        batch_size = client.batch_size
        if batch_size is None:
            raise ValueError(
                "rb.as_dataset() yields batches of the buffer's batch size, and the buffer has none: build it "
                "with RayReplayBuffer(..., batch_size=N)."
            )
        source = _ActorSource(client, batch_size, prefetch, batches_per_call)
        super().__init__(source, num_batches=num_batches, transport=transport, wait=wait, timeout=timeout)
        source.wait, source.timeout = self.wait, self.timeout  # checked by the base class

    def draw(self):
        """A raw batch from the actor, transformed in this process."""
        quota = self._batches_for_this_process()
        return self.replay_buffer.sample(None if quota is None else quota - self._position.draws)
