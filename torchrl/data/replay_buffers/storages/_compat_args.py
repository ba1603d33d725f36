"""Validation of constructor keywords that TorchRL's storages take and that we accept for compatibility.

``shared_init=True`` (TorchRL: the first write of a lazy storage may come from any process sharing it) is not
supported: a lazy storage shared before its first write refuses a first write from another process (see
``TensorStorage._write``), so accepting ``True`` silently would break at that write instead of here.
"""

from __future__ import annotations

from torchrl._validation import check_bool


def check_shared_init(shared_init, owner: str) -> bool:
    """``shared_init`` as a bool; ``NotImplementedError`` for ``True``, which is not supported."""
    value = check_bool("shared_init", shared_init)
    if value:
        raise NotImplementedError(
            f"{owner}(shared_init=True) is not supported: the first write of a lazy storage must come from the "
            f"process that shares it. Write a first batch (rb.extend) before starting the other processes, and "
            f"pass shared_init=False."
        )
    return value


def check_auto_cleanup(auto_cleanup, scratch_dir) -> bool:
    """``auto_cleanup`` as a bool: ``None`` means ``True`` without ``scratch_dir`` and ``False`` with one."""
    if auto_cleanup is None:
        return scratch_dir is None
    return check_bool("auto_cleanup", auto_cleanup)
