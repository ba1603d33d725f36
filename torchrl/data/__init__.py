"""torchrl.data: replay buffers and their torch.utils.data adapters."""

from torchrl.data._torchrl_names import NOT_PROVIDED, not_provided_getattr
from torchrl.data.postprocs import MultiStep
from torchrl.data.replay_buffers import *  # noqa: F401,F403
from torchrl.data.replay_buffers import __all__ as _rb_all

__all__ = list(_rb_all) + ["MultiStep"]

# TorchRL's other torchrl.data names (specs, LLM tools, maps, ...): importing one raises an ImportError that says
# it is not part of this package (see torchrl.data._torchrl_names).
__getattr__ = not_provided_getattr(__name__, NOT_PROVIDED)
