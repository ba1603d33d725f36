"""Counters kept in one tensor on the data's device: :class:`TensorCounters`, the length and cursor of the storages
and writers built with ``compilable=True``.

Compiled code (``torch.compile(fullgraph=True)``) cannot read a number out of shared memory or a ``memoryview``
without a graph break, and a Python ``int`` that changes at every write makes Dynamo compile the step again. So a
compilable component keeps its counters in one int64 tensor, :attr:`TensorCounters.tensor`, on its device, and
its write and sample paths read and update that tensor in place: no host sync, one graph. Eager code that wants a
number (``len(storage)``, ``writer.cursor``, ``state_dict()``) reads it through the same interface as
:class:`~torchrl.data.replay_buffers._shared.counters.SharedCounters` (a host sync on an accelerator).

The counters are private to the process: a compilable component cannot be shared with other processes
(:meth:`TensorCounters.share_memory_` raises). Pickling copies them by value.
"""

from __future__ import annotations

import torch

from torchrl._phrases import TorchRLPhrase

# TorchRL: `LazyTensorStorage(shared_init=True, compilable=True)` raises this RuntimeError
COMPILABLE_SHARED = TorchRLPhrase(
    RuntimeError,
    "Cannot share a compilable storage between processes",
    "Cannot share a compilable storage between processes: a {what} built with compilable=True keeps its counters "
    "in a tensor on its device, private to this process. Build it with compilable=False to share it (shared=True, "
    "shared_init=True, DataLoader workers, several writer processes).",
)


class _Cells:
    """``cells[i]`` / ``cells[i] = v`` as Python ints over the counter tensor (the ``SharedCounters.cells``
    interface that eager code uses)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __getitem__(self, i: int) -> int:
        return int(self.tensor[i])

    def __setitem__(self, i: int, value: int) -> None:
        self.tensor[i] = int(value)


class TensorCounters:
    """A fixed set of named int64 counters in one tensor on ``device``.

    Args:
        names: the counter names, in order.

    Keyword Args:
        device: where the counters live (the component's data). Defaults to the CPU.
        what (str): the component, named by :meth:`share_memory_`'s error. Defaults to ``"storage"``.

    Examples:
        >>> c = TensorCounters(("rows", "cursor"))
        >>> c["rows"] = 3
        >>> c["rows"], c.tensor
        (3, tensor([3, 0]))
        >>> c.tensor[1] += 2  # what compiled code does: an in-place tensor update, no Python number
        >>> c.as_dict()
        {'rows': 3, 'cursor': 2}
    """

    __slots__ = ("_names", "_pos", "_what", "tensor", "cells")

    #: Always ``False``: the counters stay in this process (see :meth:`share_memory_`).
    is_shared = False

    def __init__(self, names: tuple[str, ...], *, device=None, what: str = "storage"):
        self._names = tuple(names)
        self._pos = {name: i for i, name in enumerate(self._names)}
        self._what = what
        self._attach(torch.zeros(len(self._names), dtype=torch.int64, device=device))

    def _attach(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.cells = _Cells(tensor)

    def to(self, device) -> TensorCounters:
        """Moves the counters to ``device`` (in place; the values are kept)."""
        if self.tensor.device != torch.device(device):
            self._attach(self.tensor.to(device))
        return self

    def share_memory_(self) -> TensorCounters:
        """Raises a ``RuntimeError``: compilable components are private to their process."""
        raise COMPILABLE_SHARED.error(what=self._what)

    def __getitem__(self, name: str) -> int:
        return int(self.tensor[self._pos[name]])

    def __setitem__(self, name: str, value: int) -> None:
        self.tensor[self._pos[name]] = int(value)

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self._names, self.tensor.tolist()))

    def position(self, name: str) -> int:
        """The index of counter ``name`` in :attr:`tensor`."""
        return self._pos[name]

    def load_dict(self, values: dict[str, int]) -> None:
        for name, value in values.items():
            self[name] = value

    def __getstate__(self):
        return {"names": self._names, "what": self._what, "values": self.tensor.tolist(),
                "device": str(self.tensor.device)}  # fmt: skip

    def __setstate__(self, state):
        self._names = tuple(state["names"])
        self._pos = {name: i for i, name in enumerate(self._names)}
        self._what = state["what"]
        self._attach(torch.tensor(state["values"], dtype=torch.int64, device=state["device"]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.as_dict()}, device={self.tensor.device})"
