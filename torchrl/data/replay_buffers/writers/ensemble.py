"""The writer of an ensemble of buffers: :class:`WriterEnsemble`, which refuses writes."""

from __future__ import annotations

from typing import Any

from torchrl._validation import check_member_states, check_members, is_int, member_at
from torchrl.data.replay_buffers.storages.ensemble import selected_members
from torchrl.data.replay_buffers.writers.writer import Writer


def _refuse(what: str):
    raise RuntimeError(
        f"A WriterEnsemble does not {what}: write into the member buffers instead, e.g. "
        f"rb_ensemble[i].extend(data) (or writer_ensemble[i].extend(data) with its own storage)."
    )


class WriterEnsemble(Writer):
    """Groups the writers of the member buffers of a :class:`~torchrl.data.ReplayBufferEnsemble`.

    An ensemble of buffers is read-only: each member decides where its own data goes, so ``add``/``extend``
    raise and say to write into the member buffers. The ensemble exists so that the ensemble buffer has a
    writer whose state (``state_dict()``: the members' states keyed by ``str(i)``) and write count (the sum
    of the members') cover all members. Registering a storage (the buffer does it with its
    :class:`~torchrl.data.StorageEnsemble`) does not touch the members, which keep their own storages.

    Args:
        *writers (Writer): the member writers.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, RoundRobinWriter, WriterEnsemble
        >>> w0, w1 = RoundRobinWriter(), RoundRobinWriter()
        >>> w0.register_storage(LazyTensorStorage(10))
        >>> _ = w0.extend(torch.arange(3))
        >>> ensemble = WriterEnsemble(w0, w1)
        >>> len(ensemble), ensemble.write_count, ensemble[0] is w0
        (2, 3, True)
        >>> ensemble.extend(torch.arange(3))
        Traceback (most recent call last):
        ...
        RuntimeError: A WriterEnsemble does not write: write into the member buffers instead, ...
    """

    def __init__(self, *writers: Writer) -> None:
        self._writers = check_members("WriterEnsemble", writers, Writer)

    @property
    def writers(self) -> list[Writer]:
        """The member writers (a new list)."""
        return list(self._writers)

    @property
    def write_count(self) -> int:
        """The sum of the members' write counts."""
        return sum(w.write_count for w in self._writers)

    def __len__(self) -> int:
        return len(self._writers)

    def __getitem__(self, item) -> Writer | WriterEnsemble:
        """The ``item``-th writer (int), or a sub-ensemble (slice or list of ints)."""
        if is_int(item):
            return member_at("WriterEnsemble", self._writers, item)
        return type(self)(
            *(self._writers[i] for i in selected_members("WriterEnsemble", item, len(self._writers)))
        )

    def add(self, data) -> Any:
        _refuse("write")

    def extend(self, data) -> Any:
        _refuse("write")

    def _empty(self, empty_write_count: bool = True) -> None:
        raise RuntimeError(
            "A WriterEnsemble cannot be emptied: empty the member buffers instead (rb_ensemble[i].empty())."
        )

    def state_dict(self) -> dict[str, Any]:
        return {str(i): w.state_dict() for i, w in enumerate(self._writers)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_member_states("WriterEnsemble", state_dict, len(self._writers))
        for i, writer in enumerate(self._writers):
            writer.load_state_dict(state_dict[str(i)])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._writers))})"
