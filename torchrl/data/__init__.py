"""torchrl.data: replay buffers and their torch.utils.data adapters."""

from torchrl.data.postprocs import MultiStep
from torchrl.data.replay_buffers import *  # noqa: F401,F403
from torchrl.data.replay_buffers import __all__ as _rb_all

__all__ = list(_rb_all) + ["MultiStep"]
