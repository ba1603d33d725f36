"""Shared-memory counters: :class:`SharedCounters` (a storage's length and cursor, a writer's write count).

The counters are shared between processes exactly when the storage content is (``share_memory_()``,
memory-mapped files), so a copy of the object in a DataLoader worker (fork, spawn or forkserver) observes writes
made by the parent after the worker started, while a forked copy of a private storage stays private: its writes
never move the parent's length.

Picklers:

- ``multiprocessing`` (DataLoader workers, ``mp.Process`` arguments): shared counters travel as a handle to
  the same memory; private counters travel by value;
- ``pickle``/``torch.save``/``copy.deepcopy``: the counters travel by value and the copy is private.
"""

from __future__ import annotations

import multiprocessing

import torch


class SharedCounters:
    """A fixed set of named int64 counters, in private or shared memory.

    Args:
        names: the counter names, in order.

    Keyword Args:
        shared (bool): allocate the counters in shared memory. Defaults to ``False``; see
            :meth:`share_memory_`.

    Examples:
        >>> c = SharedCounters(("length", "cursor"))
        >>> c["length"] = 3
        >>> c["length"]
        3
        >>> c.as_dict()
        {'length': 3, 'cursor': 0}
        >>> c.is_shared
        False
    """

    #: ``is_shared`` (bool): whether the counters live in shared memory; ``values``: the counters as a numpy
    #: int64 view of their memory; ``cells``: the same memory as a memoryview whose int64 items read and write as
    #: Python ints, the cheapest access for hot paths. Both in the order of the names, for hot paths that update
    #: several at once (the caller orders concurrent updates); new views after :meth:`share_memory_`. Plain
    #: attributes: reading them runs no code.
    __slots__ = ("_names", "_pos", "_tensor", "values", "cells", "is_shared")

    def __init__(self, names: tuple[str, ...], *, shared: bool = False):
        self._names = tuple(names)
        self._pos = {name: i for i, name in enumerate(self._names)}
        tensor = torch.zeros(len(self._names), dtype=torch.int64)
        self._attach(tensor.share_memory_() if shared else tensor)

    def _attach(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        # a numpy view of the same memory: reads and writes cost ~0.1 us instead of a tensor op's ~3 us; and a
        # memoryview of it, whose items read and write as Python ints without a numpy scalar in between
        self.values = tensor.numpy()
        self.cells = memoryview(self.values)
        self.is_shared = tensor.is_shared()

    def share_memory_(self) -> SharedCounters:
        """Moves the counters to shared memory (in place; a no-op when they already are)."""
        if not self.is_shared:
            self._attach(self._tensor.clone().share_memory_())
        return self

    def __getitem__(self, name: str) -> int:
        return self.cells[self._pos[name]]

    def __setitem__(self, name: str, value: int) -> None:
        self.cells[self._pos[name]] = int(value)

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self._names, self.cells.tolist()))

    def position(self, name: str) -> int:
        """The index of counter ``name`` in :attr:`values`."""
        return self._pos[name]

    def load_dict(self, values: dict[str, int]) -> None:
        for name, value in values.items():
            self[name] = value

    def __getstate__(self):
        if self.is_shared:
            return {"names": self._names, "tensor": self._tensor}
        # by value: torch's multiprocessing reducer would move a private tensor to shared memory in place,
        # behind the numpy view, and make a forked-style private copy silently shared
        return {"names": self._names, "values": self.values.tolist()}

    def __setstate__(self, state):
        self._names = tuple(state["names"])
        self._pos = {name: i for i, name in enumerate(self._names)}
        if "values" in state:
            self._attach(torch.tensor(state["values"], dtype=torch.int64))
        else:
            # a shared tensor arrives shared through multiprocessing, by value through pickle: then private
            self._attach(state["tensor"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.as_dict()})"


def is_spawning() -> bool:
    """True while multiprocessing pickles the arguments of a process it is starting (spawn/forkserver)."""
    return multiprocessing.context.get_spawning_popen() is not None
