"""Reverb-style rate limiters (MinSize, SampleToInsertRatio) for ``ReplayBuffer(..., rate_limiter=...)``.

A limiter is Reverb's ``(samples_per_insert, min_size_to_sample, min_diff, max_diff)`` over the buffer's cumulative
counters: ``inserts`` (the writer's ``write_count``), ``samples`` (``samples_returned``, plus the samples reserved
by draws in flight) and ``size`` (``len(rb)``). With ``diff = inserts * samples_per_insert - samples``:

- a sample of ``n`` records is permitted when ``size >= min_size_to_sample`` and ``diff - n >= min_diff``;
- an insert of ``n`` items is permitted when ``size + n <= min_size_to_sample`` (filling up to the minimum is
  never blocked), else when ``diff + n * samples_per_insert <= max_diff``.

So ``min_diff <= diff <= max(max_diff, samples_per_insert * min_size_to_sample)`` at every moment: the observed
samples per insert stays within the error buffer of the target. Both sides block (Reverb's rule; TorchRL's
:class:`~torchrl.data.RateLimitedReplayBuffer` blocks only sampling). The waiting, the reservations and their
sharing between processes are the buffer's (``_readiness.py``, NOTE [readiness and waiting]); a limiter only
answers "permitted?" and validates requests.
"""

from __future__ import annotations

import math
import numbers
import sys
import warnings
from typing import Any

from torchrl._phrases import TorchRLPhrase

RATE_SPI_TYPE = TorchRLPhrase(
    TypeError,
    "samples_per_insert must be a finite positive number.",
    "samples_per_insert must be a finite positive number. Got {got}: pass a float > 0 (e.g. 1.0 for one "
    "sampled record per inserted item).",
)
RATE_SPI_VALUE = TorchRLPhrase(
    ValueError,
    "samples_per_insert must be a finite positive number.",
    "samples_per_insert must be a finite positive number. Got {got}: pass a float > 0 (e.g. 1.0 for one "
    "sampled record per inserted item).",
)

__all__ = ["MinSize", "RateLimiter", "SampleToInsertRatio"]

_MAX_FLOAT = sys.float_info.max


def _check_min_size(value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`min_size_to_sample` must be an int >= 1, got {value!r}.")
    if value < 1:
        raise ValueError(
            f"`min_size_to_sample` must be >= 1 (as in Reverb), got {value}. Pass 1 to allow sampling as soon as "
            f"one item is stored."
        )
    return int(value)


def check_samples_per_insert(value) -> float:
    """A finite positive ``samples_per_insert`` (TorchRL's rule and messages) as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RATE_SPI_TYPE.error(got=repr(value))
    if not math.isfinite(value) or value <= 0:
        raise RATE_SPI_VALUE.error(got=repr(value))
    return float(value)


class RateLimiter:
    """The general limiter: Reverb's ``RateLimiter(samples_per_insert, min_size_to_sample, min_diff, max_diff)``.

    Prefer :class:`MinSize` or :class:`SampleToInsertRatio`, which derive the bounds and check them. See the module
    docstring for the rule; pass the limiter to a buffer with ``rate_limiter=``.

    Args:
        samples_per_insert (float): the target number of sampled records per inserted item.
        min_size_to_sample (int): the buffer size below which sampling waits.
        min_diff (float): the lowest ``inserts * samples_per_insert - samples`` a sample may leave.
        max_diff (float): the highest ``inserts * samples_per_insert - samples`` an insert may reach.

    Examples:
        >>> from torchrl.data import RateLimiter
        >>> limiter = RateLimiter(1.0, 1, -2.0, 2.0)
        >>> limiter.sample_permitted(inserts=4, samples=2, size=4, n=2)
        True
        >>> limiter.insert_permitted(inserts=4, samples=0, size=4, n=1)
        False
    """

    #: Whether inserts wait (``extend``/``add``) when the ratio ran ahead.
    blocks_inserts = True
    #: Whether :meth:`sample_permitted` reads ``size`` (the buffer need not count its items for a rule that
    #: does not: it passes 0).
    reads_size = True

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float, max_diff: float):
        self._spi = check_samples_per_insert(samples_per_insert)
        self._min_size = _check_min_size(min_size_to_sample)
        for name, value in (("min_diff", min_diff), ("max_diff", max_diff)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
                raise TypeError(f"`{name}` must be a real number, got {value!r}.")
        if min_diff > max_diff:
            raise ValueError(f"`min_diff`={min_diff} must be <= `max_diff`={max_diff}.")
        self._min_diff, self._max_diff = float(min_diff), float(max_diff)

    @property
    def samples_per_insert(self) -> float:
        return self._spi

    @property
    def min_size_to_sample(self) -> int:
        return self._min_size

    @property
    def min_diff(self) -> float:
        return self._min_diff

    @property
    def max_diff(self) -> float:
        return self._max_diff

    def sample_permitted(self, *, inserts: int, samples: int, size: int, n: int) -> bool:
        """Whether a sample of ``n`` records is permitted now (``samples`` counts the reserved ones)."""
        if size < self._min_size:
            return False
        return inserts * self._spi - samples - n >= self._min_diff

    def insert_permitted(self, *, inserts: int, samples: int, size: int, n: int) -> bool:
        """Whether an insert of ``n`` items is permitted now (``inserts`` counts the reserved ones)."""
        if size + n <= self._min_size:
            return True
        return (inserts + n) * self._spi - samples <= self._max_diff

    def check_sample_request(self, n: int) -> None:
        """``ValueError`` for a sample of ``n`` records no state of the counters can ever permit."""
        highest = max(self._max_diff, self._spi * self._min_size)
        if self._min_diff + n > highest:
            raise ValueError(
                f"A sample of {n} records can never be permitted by {self!r}: it needs inserts * samples_per_insert "
                f"- samples >= {self._min_diff + n:g}, and inserts stop at {highest:g}. Sample smaller batches, or "
                f"widen the limiter's error_buffer to at least the batch size."
            )

    def check_insert_request(self, n: int) -> None:
        """``ValueError`` for an insert of ``n`` items no state of the counters can ever permit."""
        if n > self._min_size and self._min_diff + n * self._spi > self._max_diff:
            raise ValueError(
                f"An insert of {n} items can never be permitted by {self!r}: it moves inserts * samples_per_insert "
                f"- samples by {n * self._spi:g}, more than the limiter's range max_diff - min_diff = "
                f"{self._max_diff - self._min_diff:g}. Write smaller chunks, or widen the error_buffer."
            )

    def state_dict(self) -> dict[str, Any]:
        """The configuration (what a checkpoint records beside the buffer's counters)."""
        return {
            "class": type(self).__name__,
            "samples_per_insert": self._spi,
            "min_size_to_sample": self._min_size,
            "min_diff": self._min_diff,
            "max_diff": self._max_diff,
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(samples_per_insert={self._spi:g}, min_size_to_sample={self._min_size}, "
            f"min_diff={self._min_diff:g}, max_diff={self._max_diff:g})"
        )


class MinSize(RateLimiter):
    """Sampling waits until the buffer holds ``min_size_to_sample`` items; inserts never wait (Reverb's ``MinSize``).

    Args:
        min_size_to_sample (int): the size from which sampling is permitted (``>= 1``).

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, MinSize, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, rate_limiter=MinSize(3))
        >>> _ = rb.extend(torch.arange(2))
        >>> rb.can_sample()
        False
        >>> _ = rb.extend(torch.arange(1))
        >>> rb.can_sample(), rb.sample().shape
        (True, torch.Size([2]))
    """

    blocks_inserts = False

    def __init__(self, min_size_to_sample: int):
        super().__init__(1.0, min_size_to_sample, -_MAX_FLOAT, _MAX_FLOAT)

    def __repr__(self) -> str:
        return f"MinSize(min_size_to_sample={self._min_size})"


class SampleToInsertRatio(RateLimiter):
    """Keeps the sampled records per inserted item near ``samples_per_insert`` (Reverb's ``SampleToInsertRatio``).

    Sampling waits when it ran ahead of the inserts, and inserts wait when they ran ahead of sampling, by more
    than ``error_buffer``: with ``offset = samples_per_insert * min_size_to_sample``, ``inserts *
    samples_per_insert - samples`` stays in ``[offset - error_buffer, offset + error_buffer]`` once the buffer
    holds ``min_size_to_sample`` items.

    Args:
        samples_per_insert (float): the target ratio (finite, ``> 0``).
        min_size_to_sample (int): the size from which sampling is permitted (``>= 1``).
        error_buffer (float or (float, float)): how far the ratio may drift, in records: a number (the
            bounds ``offset -/+ error_buffer``) or a ``(min_diff, max_diff)`` pair used as it is.

    Raises:
        ValueError: Reverb's checks: ``max_diff - min_diff < 2 * max(1, samples_per_insert)`` (the limiter could
            block both sides), ``min_diff > samples_per_insert * min_size_to_sample`` (sampling deadlocks once
            ``min_size_to_sample`` items are stored), ``min_size_to_sample < 1``. A ``max_diff`` below the
            offset warns (``UserWarning``): inserts then deadlock unless sampling runs concurrently.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, SampleToInsertRatio
        >>> limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=2, error_buffer=4.0)
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=2, rate_limiter=limiter)
        >>> _ = rb.extend(torch.arange(6))  # offset 2 + error 4: six inserts ahead is the limit
        >>> rb.can_sample(), rb.sample().shape
        (True, torch.Size([2]))
        >>> _ = rb.extend(torch.arange(2))
        >>> try:
        ...     rb.extend(torch.arange(1), timeout=0.01)  # inserts ran ahead: the writer waits
        ... except TimeoutError as err:
        ...     print("insert waited:", "samples_returned=2" in str(err))
        insert waited: True
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, error_buffer):
        spi = check_samples_per_insert(samples_per_insert)
        min_size = _check_min_size(min_size_to_sample)
        offset = spi * min_size
        if isinstance(error_buffer, (tuple, list)):
            if len(error_buffer) != 2:
                raise ValueError(f"`error_buffer` as a pair is (min_diff, max_diff), got {error_buffer!r}.")
            min_diff, max_diff = error_buffer
        elif isinstance(error_buffer, numbers.Real) and not isinstance(error_buffer, bool):
            if not math.isfinite(error_buffer) or error_buffer < 0:
                raise ValueError(f"`error_buffer` must be a finite number >= 0, got {error_buffer!r}.")
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        else:
            raise TypeError(
                f"`error_buffer` must be a number or a (min_diff, max_diff) pair, got {type(error_buffer).__name__}."
            )
        super().__init__(spi, min_size, min_diff, max_diff)
        self._error_buffer = error_buffer if not isinstance(error_buffer, list) else tuple(error_buffer)
        if self._max_diff - self._min_diff < 2 * max(1.0, spi):
            raise ValueError(
                f"`error_buffer`={error_buffer!r} gives max_diff - min_diff = {self._max_diff - self._min_diff:g}, "
                f"below 2 * max(1, samples_per_insert) = {2 * max(1.0, spi):g}: the limiter could block inserts "
                f"and samples at once (Reverb's check). Pass a larger error_buffer."
            )
        if self._min_diff > offset:
            raise ValueError(
                f"`error_buffer`={error_buffer!r} gives min_diff = {self._min_diff:g} above samples_per_insert * "
                f"min_size_to_sample = {offset:g}: sampling would deadlock once min_size_to_sample items are "
                f"stored (Reverb's check). Lower min_diff, or raise min_size_to_sample."
            )
        if self._max_diff < offset:
            warnings.warn(
                f"`error_buffer`={error_buffer!r} gives max_diff = {self._max_diff:g} below samples_per_insert * "
                f"min_size_to_sample = {offset:g}: inserts deadlock unless sampling runs concurrently with them.",
                UserWarning,
                stacklevel=2,
            )

    @property
    def error_buffer(self):
        return self._error_buffer

    def __repr__(self) -> str:
        return (
            f"SampleToInsertRatio(samples_per_insert={self._spi:g}, min_size_to_sample={self._min_size}, "
            f"error_buffer={self._error_buffer!r})"
        )


class SampleBudget(RateLimiter):
    """TorchRL's ``RateLimitedReplayBuffer`` rule: at most ``floor(inserts * samples_per_insert)`` records are
    ever sampled; inserts never wait. Used by :class:`~torchrl.data.RateLimitedReplayBuffer`.

    Args:
        samples_per_insert (float): the records each inserted item pays for (finite, ``> 0``).

    Examples:
        >>> from torchrl.data.replay_buffers.replay_buffers.rate_limiters import SampleBudget
        >>> budget = SampleBudget(1.0)
        >>> budget.sample_permitted(inserts=2, samples=0, size=2, n=2), budget.budget(inserts=2, samples=1)
        (True, 1)
    """

    blocks_inserts = False
    reads_size = False

    def __init__(self, samples_per_insert: float):
        super().__init__(samples_per_insert, 1, 0.0, _MAX_FLOAT)

    def budget(self, *, inserts: int, samples: int) -> int:
        """``floor(inserts * samples_per_insert) - samples``: the records that may still be sampled."""
        return math.floor(inserts * self._spi) - samples

    def sample_permitted(self, *, inserts: int, samples: int, size: int, n: int) -> bool:
        # budget() >= n: floor(inserts * spi) >= samples + n, which for an int samples + n is inserts * spi >= it
        return inserts * self._spi >= samples + n

    def __repr__(self) -> str:
        return f"SampleBudget(samples_per_insert={self._spi:g})"
