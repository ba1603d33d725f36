"""Validation of constructor keywords that TorchRL's storages take and that we accept for compatibility."""

from __future__ import annotations

from torchrl._validation import check_bool


def check_auto_cleanup(auto_cleanup, scratch_dir) -> bool:
    """``auto_cleanup`` as a bool: ``None`` means ``True`` without ``scratch_dir`` and ``False`` with one."""
    if auto_cleanup is None:
        return scratch_dir is None
    return check_bool("auto_cleanup", auto_cleanup)
