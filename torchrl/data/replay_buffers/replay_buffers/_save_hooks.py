"""TorchRL's save hooks of a buffer (``rb.register_save_hook(hook)``), run by ``rb.dumps(path)``.

A save hook is a callable ``hook(data, path=path)`` returning the data to save in place of the stored items.
Before it is called, a hook that has the attributes ``shift`` and ``is_full`` gets them set, as TorchRL does:
``shift`` is the row after the last one written, ``is_full`` whether the storage is full. The checkpoint format
stays this package's (tensor files and JSON, no pickle): the hooks' result is written into the storage for the
time of the dump (it must have the stored items' layout), and the stored items are put back afterwards, so the
buffer is unchanged and the checkpoint holds what the hooks returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def check_save_hook(hook, storage) -> None:
    """``TypeError`` unless ``hook`` is callable and ``storage`` holds tensors (a TensorStorage)."""
    if not callable(hook):
        raise TypeError(f"A save hook must be a callable hook(data, path=path), got {type(hook).__name__}.")
    if not callable(getattr(storage, "set", None)) or not hasattr(storage, "last_written_row"):
        raise TypeError(
            f"Save hooks rewrite the stored items of a tensor storage (LazyTensorStorage, LazyMemmapStorage); "
            f"this buffer's storage is a {type(storage).__name__}. Transform the data before writing it instead."
        )


def _row_after_last(storage) -> int:
    last = storage.last_written_row
    return last + 1 if isinstance(last, int) and last >= 0 else len(storage)


def dump_with_save_hooks(storage, hooks: Sequence[Callable], path, dump: Callable[[], None]) -> None:
    """Runs ``hooks`` on the stored items and calls ``dump()`` while the storage holds their result.

    Call it holding the buffer's locks (nothing may write meanwhile). A result that cannot be written in the
    stored items' place raises before the dump, with the storage unchanged.
    """
    rows = storage.rows_written()
    if not rows:
        dump()
        return
    index = torch.arange(rows)
    stored = storage[:rows]
    data = stored
    for hook in hooks:
        if hasattr(hook, "shift"):
            hook.shift = _row_after_last(storage)
        if hasattr(hook, "is_full"):
            hook.is_full = len(storage) >= storage.max_size
        data = hook(data, path=path)
    if data is stored:
        dump()
        return
    kept = stored.clone()
    try:
        storage.set(index, data, set_cursor=False)  # validated before anything is written
    except Exception as err:
        raise ValueError(
            f"The save hooks returned data that cannot be saved in place of the stored items ({err}). A save hook "
            f"must return the items with their stored layout. Nothing was saved."
        ) from err
    try:
        dump()
    finally:
        storage.set(index, kept, set_cursor=False)
