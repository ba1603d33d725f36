"""Replay buffers: storages, samplers, writers and the buffers that combine them.

TorchRL's module paths sit at this level (``storages``, ``samplers``, ``writers``, ``replay_buffers``,
``checkpointers``, ``ray_buffer``, ``distributed``, ``utils``, ``sample_units``, ``scheduler``), beside
``training_state``, ``ted`` and ``errors`` (one public concept each) and the public concern packages ``hf`` (Hugging Face exchange),
``loading`` (what the DataLoader adapters stand on) and ``trajectories`` (episodes in a ring storage). The underscore packages (``_checkpoint``, ``_shared``,
``_ray``) are internal. ``__all__`` is the union of the public modules' ``__all__``, never retyped here.
"""

import sys

from torchrl.data._torchrl_names import REPLAY_BUFFER_NAMES, not_provided_getattr
from torchrl.data.replay_buffers import (
    checkpointers,
    distributed,
    errors,
    her,
    hf,
    loading,
    offline_to_online,
    query,
    ray_buffer,
    replay_buffers,
    sample_units,
    samplers,
    scheduler,
    storages,
    training_state,
    utils,
    writers,
)

# Imported for its at-fork handler: a forked child never waits on this process's OpenMP team (NOTE [OpenMP
# and fork] in _shared/openmp_fork.py).
from torchrl.data.replay_buffers._shared import openmp_fork as _openmp_fork  # noqa: F401
from torchrl.data.replay_buffers.checkpointers import *  # noqa: F401,F403
from torchrl.data.replay_buffers.distributed import *  # noqa: F401,F403
from torchrl.data.replay_buffers.errors import *  # noqa: F401,F403
from torchrl.data.replay_buffers.her import *  # noqa: F401,F403
from torchrl.data.replay_buffers.hf import *  # noqa: F401,F403
from torchrl.data.replay_buffers.loading import *  # noqa: F401,F403
from torchrl.data.replay_buffers.offline_to_online import *  # noqa: F401,F403
from torchrl.data.replay_buffers.query import *  # noqa: F401,F403
from torchrl.data.replay_buffers.ray_buffer import *  # noqa: F401,F403
from torchrl.data.replay_buffers.replay_buffers import *  # noqa: F401,F403
from torchrl.data.replay_buffers.sample_units import *  # noqa: F401,F403
from torchrl.data.replay_buffers.sample_units import frame_stack
from torchrl.data.replay_buffers.sample_units.frame_stack import *  # noqa: F401,F403
from torchrl.data.replay_buffers.samplers import *  # noqa: F401,F403
from torchrl.data.replay_buffers.scheduler import *  # noqa: F401,F403
from torchrl.data.replay_buffers.storages import *  # noqa: F401,F403
from torchrl.data.replay_buffers.training_state import *  # noqa: F401,F403
from torchrl.data.replay_buffers.utils import *  # noqa: F401,F403
from torchrl.data.replay_buffers.writers import *  # noqa: F401,F403

_PUBLIC_MODULES = (
    storages, samplers, writers, replay_buffers, checkpointers, sample_units, scheduler, utils, training_state,
    ray_buffer, distributed, hf, loading, errors, her, query, offline_to_online,
    frame_stack,
)  # fmt: skip
__all__ = list(dict.fromkeys(name for module in _PUBLIC_MODULES for name in module.__all__))

# FrameStack's former path `samplers.frame_stack` names the same module as `sample_units.frame_stack`, where the sample
# unit lives (samplers/ imports nothing from the sample units above it; importing the old path runs this first).
sys.modules[f"{samplers.__name__}.frame_stack"] = frame_stack
samplers.frame_stack = frame_stack

# TorchRL's replay-buffer names that this package does not implement: importing one raises an ImportError that
# says so (see torchrl.data._torchrl_names); implemented names never reach this hook.
__getattr__ = not_provided_getattr(__name__, REPLAY_BUFFER_NAMES)
