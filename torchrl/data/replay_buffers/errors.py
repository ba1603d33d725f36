"""Every exception class of the replay-buffer package, in one place.

Each is re-exported where TorchRL or our docs name it (``EpochEnded`` from ``samplers``, ``CheckpointError`` from
``checkpointers``, ``TornReadError`` from ``torchrl.data``). ``TypeRuntimeError``, ``ValueRuntimeError`` and
``FileExistsRuntimeError`` are our precise type and the ``RuntimeError`` TorchRL raises in the same case: code
written for TorchRL catches ``RuntimeError``, code written for us the precise type, and the messages stay ours.
(TorchRL names this package does not provide raise ``torchrl.data._torchrl_names.NotProvidedError``.)
Messages live beside the code that raises them; those that carry a phrase code written for TorchRL matches
are :class:`torchrl._phrases.TorchRLPhrase` constants of the raising module.
"""

from __future__ import annotations

#: Exported from ``torchrl.data``; the others are raised as (and caught by) their built-in bases.
__all__ = ["CheckpointError", "TornReadError", "EpochEnded"]


class TypeRuntimeError(TypeError, RuntimeError):
    """A :class:`TypeError` that TorchRL raises as a :class:`RuntimeError`."""


class ValueRuntimeError(ValueError, RuntimeError):
    """A :class:`ValueError` that TorchRL raises as a :class:`RuntimeError`."""


class IndexRuntimeError(IndexError, RuntimeError):
    """An ``IndexError`` that is also the ``RuntimeError`` TorchRL raises (a list-storage write out of range)."""


class FileExistsRuntimeError(FileExistsError, RuntimeError):
    """A :class:`FileExistsError` that TorchRL raises as a :class:`RuntimeError`."""


class TornReadError(RuntimeError):
    """Raised by a read of a shared storage when rows stayed mid-write longer than a reader waits (2 s).

    Their writer most likely died while writing them; the next write at the writer's cursor completes them.
    ``storage.consistent_reads = False`` reads them anyway (possibly mixing two writes).
    """


class DrawOverwrittenError(TornReadError):
    """Raised by ``storage.read_rows`` when another process's write overwrote items between their draw and the
    read (a :class:`~torchrl.data.PackedSequenceStorage`): a buffer's ``sample`` draws again (a few times)."""


class CheckpointError(ValueError):
    """A checkpoint on disk is incomplete, corrupted, unsafe or of an unknown schema version.

    The message says what is wrong and in which file. Raised by
    :func:`~torchrl.data.replay_buffers.checkpointers.read_checkpoint` (and by ``loads``) before any data is
    returned or any object is modified.
    """


class StringTooLong(ValueError):
    """A string longer than the width its stored entry was allocated with."""

    def __init__(self, key: tuple, needed: int, width: int, fixed: bool):
        self.key, self.needed, self.width = key, needed, width
        why = (
            "the storage was built with this `max_string_bytes`"
            if fixed
            else "the storage is shared with other processes or memory-mapped: its entries cannot be resized"
        )
        shown = key[0] if len(key) == 1 else key
        suggested = 1 << max(0, needed - 1).bit_length()  # the next power of two
        super().__init__(
            f"Entry {shown!r} of the data written holds a string of {needed} UTF-8 bytes; the storage keeps "
            f"this entry {width} bytes wide ({why}). Build the storage with a larger `max_string_bytes` (e.g. "
            f"max_string_bytes={suggested}), or shorten the strings. Nothing was written."
        )


class EpochEnded(Exception):
    """Raised by ``sample()`` of a sampler pinned to an epoch (:meth:`Sampler.pin_epoch`) once that epoch ended.

    Nothing was drawn. :class:`~torchrl.data.ReplayBufferDataset` catches it to end a DataLoader epoch at the
    sampler's epoch boundary in every worker.
    """


class RingGoneError(RuntimeError):
    """A ring message arrived after the worker that wrote it exited (before this process mapped its ring)."""
