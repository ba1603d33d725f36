"""Offline datasets as read-only replay buffers (TorchRL's ``torchrl.data.datasets``).

``__all__`` is the union of the modules' ``__all__``. ``load_dataset`` / ``register_dataset`` live here (and in
``torchrl.data.datasets.utils``), not in ``torchrl.data``, as in TorchRL.
"""

from torchrl.data.datasets import common, d4rl, lerobot, minari_data, utils
from torchrl.data.datasets.common import *  # noqa: F401,F403
from torchrl.data.datasets.d4rl import *  # noqa: F401,F403
from torchrl.data.datasets.lerobot import *  # noqa: F401,F403
from torchrl.data.datasets.minari_data import *  # noqa: F401,F403
from torchrl.data.datasets.utils import *  # noqa: F401,F403

__all__ = list(dict.fromkeys(name for m in (common, utils, minari_data, d4rl, lerobot) for name in m.__all__))
