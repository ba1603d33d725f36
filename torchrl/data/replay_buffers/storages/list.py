"""The list storages, at TorchRL's module path ``storages.list``: :class:`ListStorage` (a Python list of items,
:mod:`.list_storage`), :class:`LazyStackStorage` (read back as a lazy stack, :mod:`.stack`) and
:class:`CompressedListStorage` (each item compressed, :mod:`.compressed`).

Each class has its own file; the last two derive from :class:`ListStorage`, so its file cannot import them back,
and this module gathers the family under the path TorchRL users import it from.
"""

from torchrl.data.replay_buffers.storages.compressed import CompressedListStorage
from torchrl.data.replay_buffers.storages.list_storage import ListStorage
from torchrl.data.replay_buffers.storages.stack import LazyStackStorage

__all__ = ["ListStorage", "LazyStackStorage", "CompressedListStorage"]
