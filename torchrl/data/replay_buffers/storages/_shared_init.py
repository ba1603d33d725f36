"""``shared_init=True``: the first write of a lazy storage may come from any process that shares it.

A lazy storage allocates its tensors at its first write, shaped like that data. Without ``shared_init``, a
storage shared before that write must receive it from the process that shared it (each process would
otherwise allocate tensors of its own). With ``shared_init=True`` (TorchRL's keyword), the storage is shared
from construction (row counters, write lock, row versions) and owns a directory known to every copy. The
first writer, whichever process it is, allocates memory-mapped files in that directory under the write
lock and, once its write is complete (still under the lock), publishes their layout: ``layout.json`` (batch
size, data codec, and per leaf its key, file, dtype and shape), written atomically, then a flag in shared
memory. Every other copy maps the same files the
first time it needs them (a read, a write, ``shape``...); a read of a storage that no process has written
yet waits for the first write, up to ``wait_s`` seconds.
"""

from __future__ import annotations

import json
import os
import time

from tensordict import MemoryMappedTensor, TensorDict, TensorDictBase

import torchrl.data.replay_buffers._checkpoint.io as _io
from torchrl._files import write_file_atomically
from torchrl.data.replay_buffers._shared.counters import SharedCounters
from torchrl.data.replay_buffers.storages._codec import DataCodec

_LAYOUT = "layout.json"


class SharedInit:
    """The directory and the shared flag through which a ``shared_init`` storage publishes its allocation.

    Args:
        directory (str): where the first writer allocates the memory-mapped files.

    Attributes:
        wait_s (float): how long a read waits for the first write before raising ``TimeoutError``.
            Defaults to ``300.0``.
    """

    wait_s = 300.0

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self._flag = SharedCounters(("ready",), shared=True)

    @property
    def ready(self) -> bool:
        """Whether some process allocated the storage and published its layout."""
        return self._flag["ready"] == 1

    def publish(self, backing: TensorDictBase, codec: DataCodec) -> None:
        """Records the layout of ``backing`` (memory-mapped files in :attr:`directory`) for the other copies."""
        leaves = []
        for key, leaf in backing.items(include_nested=True, leaves_only=True):
            filename = getattr(leaf, "filename", None)
            if filename is None:
                raise RuntimeError(f"Entry {key!r} of a shared_init storage is not a memory-mapped file.")
            leaves.append({
                "key": list(key) if isinstance(key, tuple) else [key],
                "file": os.path.relpath(filename, self.directory),
                "dtype": _io.dtype_name(leaf.dtype),
                "shape": list(leaf.shape),
            })
        layout = {"batch_size": list(backing.batch_size), "codec": codec.to_json(), "leaves": leaves}
        data = json.dumps(layout).encode()
        write_file_atomically(os.path.join(self.directory, _LAYOUT), lambda f: f.write(data), fsync=False)
        self._flag["ready"] = 1

    def open(self) -> tuple[TensorDictBase, DataCodec]:
        """Maps the files the first writer published (read-write) and returns ``(backing, codec)``."""
        with open(os.path.join(self.directory, _LAYOUT), encoding="utf-8") as f:
            layout = json.load(f)
        backing = TensorDict(batch_size=layout["batch_size"])
        for leaf in layout["leaves"]:
            path = os.path.join(self.directory, leaf["file"])
            tensor = MemoryMappedTensor.from_filename(path, _io.DTYPES[leaf["dtype"]], leaf["shape"], mode="r+")
            backing.set(tuple(leaf["key"]), tensor)
        return backing, DataCodec.from_json(layout["codec"])

    def wait(self, owner: str) -> None:
        """Waits until :attr:`ready`; ``TimeoutError`` after :attr:`wait_s` seconds."""
        started, delay = time.monotonic(), 1e-4
        while not self.ready:
            if time.monotonic() - started > self.wait_s:
                raise TimeoutError(
                    f"{owner}(shared_init=True) holds no data after {self.wait_s} s: no process sharing it wrote "
                    f"a first batch. Write one (rb.extend) before reading, or raise `wait_s` of "
                    f"`storage.shared_init_state`."
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(directory={self.directory!r}, ready={self.ready})"
