"""RateLimitedReplayBuffer: a sample-to-insert budget over cumulative counters (TorchRL's rule).

Budget = ``floor(write_count * samples_per_insert) - samples_returned - reserved_samples``: a sample of ``b``
records is permitted when the sampler can draw it and the budget covers ``b``; the reservation is taken and given
back atomically under the buffer's flow lock, which is a cross-process lock once the buffer is shared, so writer
processes, the learner and DataLoader workers share one budget (NOTE [readiness and waiting] in
``_readiness.py``). Hosted in a Ray actor (``service_backend="ray"``), the budget lives in the actor and every
client draws from it in one atomic actor step, waiting in its own process (NOTE [waiting through a Ray actor] in
``_ray/waiting.py``). Inserts never wait (Reverb's two-sided limiters: ``rate_limiter=`` on any buffer).
"""

from __future__ import annotations

from typing import Any

from torchrl.data.replay_buffers._checkpoint.parts import PartContext
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.replay_buffers._service_backend import ReadinessBackendMeta
from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.rate_limiters import SampleBudget, check_samples_per_insert

__all__ = ["RateLimitedReplayBuffer"]


class RateLimitedReplayBuffer(ReplayBuffer, metaclass=ReadinessBackendMeta):
    """A replay buffer that samples at most ``samples_per_insert`` records per inserted item.

    The counters are cumulative (``write_count``, ``samples_returned``), so the budget stays meaningful after the
    ring buffer wraps. ``sample(wait=False)`` (the default) raises a ``RuntimeError`` when the budget or the
    sampler's readiness does not permit the batch; ``sample(wait=True, timeout=...)`` waits for writes (of this
    process, or of another one writing into the shared buffer) and raises ``TimeoutError`` past ``timeout``.
    Share the buffer (``shared=True``, :meth:`share`, or ``rb.as_dataset()`` for DataLoader workers) and every
    process draws from one budget, none over-drawing it.

    Beyond TorchRL (which refuses prefetching): with ``prefetch=k`` a batch is sampled ahead only when the budget
    covers it at once, and counts against the budget when it is drawn. Beyond TorchRL (which refuses every
    ``service_backend`` but ``"direct"``): ``service_backend="ray"`` hosts the buffer in a Ray actor
    (a :class:`~torchrl.data.RayReplayBuffer`): one budget for every client, whose ``sample(wait=True,
    timeout=..., cancel_event=...)`` waits in the client's process and ``stats()`` returns the actor's.

    Keyword Args:
        samples_per_insert (float): the records each inserted item pays for (finite, ``> 0``).
        **kwargs: the other arguments of :class:`~torchrl.data.ReplayBuffer` (``service_backend`` is
            ``"direct"`` or ``"ray"``; ``rate_limiter`` is refused: this buffer is its own limiter).

    Raises:
        TypeError: ``samples_per_insert`` is not a real number (or is a bool).
        ValueError: ``samples_per_insert`` is not finite or ``<= 0``; ``service_backend`` is neither
            ``"direct"`` nor ``"ray"`` (a backend registered elsewhere does not forward the waits).

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, RateLimitedReplayBuffer
        >>> rb = RateLimitedReplayBuffer(samples_per_insert=1.0, storage=LazyTensorStorage(10), batch_size=2)
        >>> _ = rb.extend(torch.arange(2))
        >>> rb.sample(wait=True, timeout=1.0).shape
        torch.Size([2])
        >>> rb.can_sample(), rb.stats()["sample_budget"]
        (False, 0)
    """

    def __init__(self, *, samples_per_insert: float, **kwargs: Any) -> None:
        spi = self._check_own_arguments(samples_per_insert, kwargs)
        super().__init__(rate_limiter=SampleBudget(spi), **kwargs)

    @staticmethod
    def _check_own_arguments(samples_per_insert, kwargs: dict) -> float:
        spi = check_samples_per_insert(samples_per_insert)
        if "rate_limiter" in kwargs:
            raise TypeError(
                "RateLimitedReplayBuffer is its own rate limiter (samples_per_insert): `rate_limiter` is refused. "
                "Use ReplayBuffer(rate_limiter=SampleToInsertRatio(...)) for a Reverb limiter."
            )
        return spi

    @classmethod
    def check_hosted_kwargs(cls, kwargs: dict[str, Any]) -> None:
        """Checks this class's own keywords (``samples_per_insert``, no ``rate_limiter``) for a buffer built in
        a service (``service_backend="ray"``), so that a bad one raises before the actor starts.

        Raises:
            TypeError: ``samples_per_insert`` is missing or not a real number; a ``rate_limiter`` is passed.
            ValueError: ``samples_per_insert`` is not finite or ``<= 0``.

        Examples:
            >>> from torchrl.data import RateLimitedReplayBuffer
            >>> RateLimitedReplayBuffer.check_hosted_kwargs({"samples_per_insert": 0.5, "batch_size": 2})
            >>> try:  # refused before any Ray actor starts
            ...     RateLimitedReplayBuffer(samples_per_insert=0.0, service_backend="ray")
            ... except ValueError as err:
            ...     print(type(err).__name__, "samples_per_insert" in str(err))
            ValueError True
        """
        if "samples_per_insert" not in kwargs:
            raise TypeError(
                f"{cls.__name__}() missing the keyword argument `samples_per_insert` (the records each inserted "
                f"item pays for): pass e.g. samples_per_insert=1.0."
            )
        cls._check_own_arguments(kwargs["samples_per_insert"], {k: v for k, v in kwargs.items()
                                                                if k != "samples_per_insert"})

    @property
    def samples_per_insert(self) -> float:
        """The target number of sampled records per inserted item."""
        return self.rate_limiter.samples_per_insert

    @property
    def rate_limiter(self) -> SampleBudget:
        """The budget rule (a :class:`~torchrl.data.replay_buffers.replay_buffers.rate_limiters.SampleBudget`)."""
        return self._flow.limiter

    # -- state: TorchRL's "_rate_limit" entry, and the checkpoint part's "rate_limit" ----------------------------
    def _rate_limit_state(self) -> dict[str, Any]:
        return {"samples_per_insert": self.samples_per_insert, "sample_wait_count": self.stats()["sample_wait_count"]}

    def state_dict(self) -> dict[str, Any]:
        """:meth:`ReplayBuffer.state_dict` plus ``"_rate_limit": {"samples_per_insert", "sample_wait_count"}``."""
        state = super().state_dict()
        state["_rate_limit"] = self._rate_limit_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores :meth:`state_dict` (``"_rate_limit"`` is required: ``KeyError``); the reservations of draws
        in flight restart at 0 and waiting samples are woken (the budget is that of the loaded counters)."""
        if "_rate_limit" not in state_dict:
            raise KeyError(
                "RateLimitedReplayBuffer.load_state_dict() needs the '_rate_limit' entry that its state_dict() "
                "writes; this state has none (saved by another buffer class?). Load it into that class."
            )
        limit = state_dict["_rate_limit"]
        spi = check_samples_per_insert(limit.get("samples_per_insert") if isinstance(limit, dict) else limit)
        wait_count = limit.get("sample_wait_count", 0)
        super().load_state_dict(state_dict)
        self._flow.limiter = SampleBudget(spi)
        readiness = dict(state_dict.get("_readiness") or self._flow.state_dict())
        readiness["sample_wait_count"] = int(wait_count)
        self._flow.load_state_dict(readiness)

    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        tensors, doc = super().checkpoint_part(ctx)
        doc["rate_limit"] = self._rate_limit_state()
        return tensors, doc

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        super().check_checkpoint_part(doc, tensors, ctx)
        limit = doc.get("rate_limit")
        try:
            check_samples_per_insert(limit.get("samples_per_insert") if isinstance(limit, dict) else limit)
        except (TypeError, ValueError) as err:
            raise CheckpointError(
                f"{ctx.path}: the RateLimitedReplayBuffer's `rate_limit` entry is {limit!r:.200}: {err} Save the "
                f"buffer again with dumps. Nothing was loaded."
            ) from None

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        super().load_checkpoint_part(doc, tensors, ctx)
        self._flow.limiter = SampleBudget(doc["rate_limit"]["samples_per_insert"])
