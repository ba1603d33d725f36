"""torchrl.data: replay buffers and their torch.utils.data adapters.

``__all__`` is built from the subpackages' ``__all__`` (:mod:`torchrl.data.replay_buffers`,
:mod:`torchrl.data.postprocs`), never retyped here.
"""

from torchrl.data import postprocs, replay_buffers
from torchrl.data._torchrl_names import NOT_PROVIDED, not_provided_getattr
from torchrl.data.postprocs import *  # noqa: F401,F403
from torchrl.data.replay_buffers import *  # noqa: F401,F403

__all__ = list(dict.fromkeys([*replay_buffers.__all__, *postprocs.__all__]))

# TorchRL's other torchrl.data names (specs, LLM tools, maps, ...): importing one raises an ImportError that says
# it is not part of this package (see torchrl.data._torchrl_names).
__getattr__ = not_provided_getattr(__name__, NOT_PROVIDED)
