"""Data-parallel learners over one replay buffer: :class:`DataParallelReplayBufferClient`.

Data model. Data-parallel training (``DistributedDataParallel``, FSDP) runs one process per device, the *ranks*;
each step, every rank needs its share of one global batch. The buffer stays whole at one *owner* (a
:class:`~torchrl.data.RayReplayBuffer` actor, or any buffer the ranks reach): its storage, sampler state (priorities,
epoch permutations), writer and priority updates live there only. Each rank wraps its handle on the owner in a
:class:`DataParallelReplayBufferClient` that knows the rank, the world size and the global batch size; its
``sample()`` asks the owner for ``batch_size // world_size`` items (the owner's ``_sample_data_parallel``, which
TorchRL's buffers implement). The owner serves one call at a time, so the ranks' draws are independent draws of
one sampler: together they have the distribution of one global draw (a sampler without replacement gives the ranks
disjoint items within an epoch), in no particular order between ranks.
"""

from __future__ import annotations

from typing import Any

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_int, is_int

__all__ = ["DataParallelReplayBufferClient"]

DATA_PARALLEL_NO_BATCH_SIZE = TorchRLPhrase(
    RuntimeError,
    "batch_size not specified",
    "batch_size not specified: the wrapped client had no batch_size when this DataParallelReplayBufferClient was "
    "built, and sample() got none. Call sample(batch_size) with the global batch size, or build the owner's buffer "
    "with batch_size=... before wrapping its client.",
)
DATA_PARALLEL_INDIVISIBLE = TorchRLPhrase(
    ValueError,
    r"The global batch size must be divisible by world_size, got batch_size={batch_size} and "
    r"world_size={world_size}\.",
    "The global batch size must be divisible by world_size, got batch_size={batch_size} and "
    "world_size={world_size}. Each rank draws batch_size // world_size items and nothing is rounded: pass a "
    "multiple of {world_size}.",
)
DATA_PARALLEL_ITERATION = TorchRLPhrase(
    RuntimeError,
    r"does not support shared next\(\) or iteration\. Call sample\(\) explicitly on every rank\.",
    "DataParallelReplayBufferClient.{method} was called: a data-parallel client does not support shared next() or "
    "iteration. Call sample() explicitly on every rank.",
)
DATA_PARALLEL_PRIVATE_NAME = TorchRLPhrase(
    AttributeError,
    "has no attribute '{name}'",
    "'DataParallelReplayBufferClient' object has no attribute '{name}': only public names are forwarded to the "
    "wrapped client.",
)

#: Names a rank's client neither has nor forwards: the wrapped handle itself and the owner's lifecycle.
HIDDEN_NAMES = frozenset({"client", "close", "shutdown", "start"})


def _check_world(rank, world_size) -> tuple[int, int]:
    """``(rank, world_size)`` as ints: non-bool ints, ``world_size >= 1``, ``0 <= rank < world_size``."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if not is_int(value):
            raise TypeError(f"`{name}` must be an int (not a bool), got {value!r} ({type(value).__name__}).")
    if world_size <= 0:
        raise ValueError(
            f"`world_size` must be a positive int (the number of data-parallel ranks), got {world_size!r}."
        )
    if not 0 <= rank < world_size:
        raise ValueError(
            f"`rank` must be in [0, world_size) = [0, {world_size}), got rank={rank!r}: pass this process's rank "
            f"(torch.distributed.get_rank())."
        )
    return int(rank), int(world_size)


class DataParallelReplayBufferClient:
    """One data-parallel rank's view of a replay buffer: :meth:`sample` draws this rank's share of a global batch.

    ``client`` is a handle on the buffer that every rank shares (``rb.client()`` of a
    :class:`~torchrl.data.RayReplayBuffer`, or any object with a buffer's methods and the owner-side
    ``_sample_data_parallel(batch_size, *args, **kwargs)`` of :class:`~torchrl.data.ReplayBuffer`). The owner keeps
    the sampler state, the writes and the priority updates; each rank's :meth:`sample` asks it for
    ``batch_size // world_size`` items, and the ``world_size`` draws of one step together are distributed as one
    global draw of ``batch_size`` items (see the module's data model). ``extend``, ``add``, ``update_priority``,
    ``rb[index]``, ``rb[index] = value`` and ``len()`` (the global size) go to the owner unchanged; other public
    names are the wrapped client's. ``client``, ``close``, ``shutdown`` and ``start`` are hidden (a rank has no
    lifecycle rights), and so are private names. Picklable when ``client`` is.

    Args:
        client: the shared buffer's handle (its ``batch_size`` is read once, here: the global batch size).

    Keyword Args:
        rank (int): this process's rank, in ``[0, world_size)``.
        world_size (int): the number of ranks (positive).

    Raises:
        TypeError: ``rank`` or ``world_size`` is not an int (``True``/``False`` are not).
        ValueError: ``world_size <= 0``, or ``rank`` outside ``[0, world_size)``.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
        >>> from torchrl.data import DataParallelReplayBufferClient
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=SamplerWithoutReplacement(), batch_size=4)
        >>> _ = rb.extend(torch.arange(8))
        >>> ranks = [DataParallelReplayBufferClient(rb, rank=r, world_size=2) for r in range(2)]
        >>> draws = [rank.sample() for rank in ranks for _ in range(2)]  # two steps: 2 x 4 items, 2 per rank
        >>> [d.numel() for d in draws], sorted(torch.cat(draws).tolist()) == list(range(8))
        ([2, 2, 2, 2], True)
    """

    def __init__(self, client, *, rank: int, world_size: int) -> None:
        rank, world_size = _check_world(rank, world_size)
        self._client = client
        self._rank = rank
        self._world_size = world_size
        self._batch_size = client.batch_size  # read once: the global batch size

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of ranks that share the buffer."""
        return self._world_size

    @property
    def batch_size(self) -> int | None:
        """The global batch size: the wrapped client's ``batch_size`` when this object was built."""
        return self._batch_size

    def sample(self, batch_size: int | None = None, *args, **kwargs):
        """This rank's share of a global batch: ``batch_size // world_size`` items drawn by the owner.

        The other arguments go to the owner's draw unchanged: ``return_info``, and for a local buffer or a Ray
        client ``wait``, ``timeout`` and ``cancel_event`` (see :meth:`ReplayBuffer.sample
        <torchrl.data.ReplayBuffer.sample>`).

        Args:
            batch_size (int, optional): the **global** batch size, divisible by ``world_size``. Defaults to
                :attr:`batch_size`.

        Raises:
            RuntimeError: no batch size (neither here nor at construction).
            TypeError: ``batch_size`` is not an int.
            ValueError: ``batch_size`` is not positive or not divisible by ``world_size``.
        """
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                raise DATA_PARALLEL_NO_BATCH_SIZE.error()
        else:
            batch_size = check_int(
                "batch_size", batch_size, minimum=1, hint="Pass the global batch size, a multiple of world_size."
            )
        if batch_size % self._world_size:
            raise DATA_PARALLEL_INDIVISIBLE.error(batch_size=batch_size, world_size=self._world_size)
        return self._client._sample_data_parallel(batch_size // self._world_size, *args, **kwargs)

    # -- forwarded unchanged to the owner -------------------------------------------------------------------------
    def extend(self, *args, **kwargs):
        """The owner's ``extend``: writes into the one shared buffer; returns the written indices."""
        return self._client.extend(*args, **kwargs)

    def add(self, *args, **kwargs):
        """The owner's ``add``: writes one item into the shared buffer; returns its index."""
        return self._client.add(*args, **kwargs)

    def update_priority(self, index, priority, *args, **kwargs):
        """The owner's ``update_priority``: the priorities of the shared sampler, as every rank sees them."""
        return self._client.update_priority(index, priority, *args, **kwargs)

    def __getitem__(self, index):
        return self._client[index]

    def __setitem__(self, index, value) -> None:
        self._client[index] = value

    def __len__(self) -> int:
        """The number of items of the shared buffer (all ranks' writes)."""
        return len(self._client)

    def next(self):
        """Refused (``RuntimeError``): a shared iteration cannot be split between ranks; call :meth:`sample`."""
        raise DATA_PARALLEL_ITERATION.error(method="next()")

    def __iter__(self):
        raise DATA_PARALLEL_ITERATION.error(method="__iter__()")

    def __getattr__(self, name: str) -> Any:
        # only called for names not found on this object; never reached for `_client` once it is set
        if name.startswith("_"):
            raise DATA_PARALLEL_PRIVATE_NAME.error(name=name)
        if name in HIDDEN_NAMES:
            raise AttributeError(
                f"'DataParallelReplayBufferClient' object has no attribute {name!r}: a rank has no lifecycle rights "
                f"and does not expose the client it wraps; the owner of the buffer (e.g. the RayReplayBuffer) "
                f"handles it."
            )
        return getattr(self._client, name)

    def __repr__(self) -> str:
        return (
            f"DataParallelReplayBufferClient(rank={self._rank}, world_size={self._world_size}, "
            f"batch_size={self._batch_size}, client={self._client!r})"
        )
