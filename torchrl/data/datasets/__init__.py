"""Offline datasets as read-only replay buffers (TorchRL's ``torchrl.data.datasets``).

``__all__`` is the union of the modules' ``__all__``. ``load_dataset`` / ``register_dataset`` live here (and in
``torchrl.data.datasets.utils``), not in ``torchrl.data``, as in TorchRL. TorchRL's dataset classes that this
package does not provide (Atari DQN, GenDGRL, OpenML, OpenX, Roboset, V-D4RL) raise
:class:`~torchrl.data._torchrl_names.NotProvidedError` (an ``ImportError``) when imported from here.
"""

from torchrl.data.datasets import common, d4rl, lerobot, minari_data, utils
from torchrl.data.datasets.common import *  # noqa: F401,F403
from torchrl.data.datasets.d4rl import *  # noqa: F401,F403
from torchrl.data.datasets.lerobot import *  # noqa: F401,F403
from torchrl.data.datasets.minari_data import *  # noqa: F401,F403
from torchrl.data.datasets.utils import *  # noqa: F401,F403

__all__ = list(dict.fromkeys(name for m in (common, utils, minari_data, d4rl, lerobot) for name in m.__all__))

_NOT_PROVIDED_CLASSES = frozenset(utils.NOT_PROVIDED_SOURCES.values())


def __getattr__(name: str):
    if name in _NOT_PROVIDED_CLASSES:
        from torchrl.data._torchrl_names import NotProvidedError

        raise NotProvidedError(
            f"{name!r} is a TorchRL dataset class that this package does not provide (it implements "
            f"MinariExperienceReplay, D4RLExperienceReplay and LeRobotExperienceReplay over local files). Use "
            f"TorchRL itself for {name}.",
            name=__name__,
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
