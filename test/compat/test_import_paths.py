"""TorchRL's import paths, complete: every public name TorchRL's docs and code import, from every module path they
use, works here; ``torchrl.data``'s ``__all__`` is built from the subpackages' (issue 24).

The table lists TorchRL 0.14's names per path (``../shared/reference/torchrl_api_facts.md`` 1.2-1.3); names TorchRL
has and this package does not provide (the Redis storage) raise ``NotProvidedError``, an ``ImportError`` that says
so, and are checked apart. The wave-3 names (HER, trajectory queries, offline-to-online, rate limiting, the
replay-buffer transforms and ``torchrl.data.datasets``) follow ``torchrl_api_facts_wave3.md`` section 0.
"""

from __future__ import annotations

import importlib

import pytest

from torchrl.data._torchrl_names import NotProvidedError

STORAGES = (
    "Storage", "ListStorage", "TensorStorage", "LazyTensorStorage", "LazyMemmapStorage", "StorageEnsemble",
    "LazyStackStorage", "CompressedListStorage", "StoreStorage",
)
SAMPLERS = (
    "Sampler", "RandomSampler", "SamplerWithoutReplacement", "PrioritizedSampler", "SliceSampler",
    "SliceSamplerWithoutReplacement", "PrioritizedSliceSampler", "SamplerEnsemble", "ConsumingSampler",
    "StalenessAwareSampler", "PromptGroupSampler",
)
WRITERS = (
    "Writer", "ImmutableDatasetWriter", "RoundRobinWriter", "TensorDictRoundRobinWriter", "TensorDictMaxValueWriter",
    "WriterEnsemble",
)
BUFFERS = (
    "ReplayBuffer", "TensorDictReplayBuffer", "PrioritizedReplayBuffer", "TensorDictPrioritizedReplayBuffer",
    "ReplayBufferEnsemble", "RemoteTensorDictReplayBuffer",
)
CHECKPOINTERS = (
    "StorageCheckpointerBase", "ListStorageCheckpointer", "CompressedListStorageCheckpointer",
    "TensorStorageCheckpointer", "FlatStorageCheckpointer", "NestedStorageCheckpointer", "H5StorageCheckpointer",
    "StorageEnsembleCheckpointer",
)
TED = ("DEFAULT_DONE_KEYS", "find_start_stop_traj", "TED2Flat", "Flat2TED", "TED2Nested", "Nested2TED", "H5Split",
       "H5Combine")
SAMPLE_UNITS = ("SampleUnit", "Transition", "Sequence")
SCHEDULERS = ("ParameterScheduler", "LambdaScheduler", "LinearScheduler", "StepScheduler", "SchedulerList")
# TorchRL's 62 replay-buffer names, all provided by this package.
RB_NAMES = (
    STORAGES + SAMPLERS + WRITERS + BUFFERS + CHECKPOINTERS + TED + SAMPLE_UNITS
    + ("RayReplayBuffer", "ConditionalUpdateResult")
)
HER = ("HERReplayBuffer", "HindsightStrategy")
QUERY = ("Trajectory", "traj", "TrajectoryPredicate", "iter_trajectories", "filter_trajectories")
O2O = ("OfflineToOnlineReplayBuffer", "prefill_replay_buffer")
WAVE3 = HER + QUERY + O2O + ("RateLimitedReplayBuffer",)
DATASETS = (
    "BaseDatasetExperienceReplay", "MinariExperienceReplay", "D4RLExperienceReplay", "LeRobotExperienceReplay",
    "lerobot_columns_to_tensordict", "load_dataset", "register_dataset",
)
# Our public names beyond TorchRL's, exported from torchrl.data too.
OURS = (
    "export_hf", "import_hf", "RayReplayBufferDataset", "CheckpointError", "TornReadError", "EpochEnded",
    "StorageDataset", "ReplayBufferDataset", "DatasetStorage", "tensordict_collate", "cleanup_stale_scratch_dirs",
    "save_training_state", "load_training_state", "StreamingSliceSampler",
)

RB = "torchrl.data.replay_buffers"
PATHS = {
    "torchrl.data": RB_NAMES + SCHEDULERS + OURS + WAVE3 + ("MultiStep", "DensifyReward", "MinSize",
                                                           "SampleToInsertRatio"),
    RB: RB_NAMES + SCHEDULERS + OURS + HER + QUERY + O2O,
    f"{RB}.her": HER,
    f"{RB}.query": QUERY,
    f"{RB}.offline_to_online": O2O,
    f"{RB}.replay_buffers.rate_limited": ("RateLimitedReplayBuffer",),
    "torchrl.data.datasets": DATASETS,
    "torchrl.data.datasets.utils": ("load_dataset", "register_dataset"),
    "torchrl.envs": ("MultiStepTransform", "CatFrames", "DeviceCastTransform"),
    "torchrl.envs.transforms": ("MultiStepTransform", "NextStateReconstructor", "PolicyAgeFilter", "CatFrames",
                                "DeviceCastTransform"),
    "torchrl.envs.transforms.rb_transforms": ("MultiStepTransform", "NextStateReconstructor", "PolicyAgeFilter"),
    f"{RB}.storages": STORAGES + ("DatasetStorage", "_MEMMAP_STORAGE_REGISTRY"),
    f"{RB}.samplers": SAMPLERS + ("StreamingSliceSampler", "EpochEnded"),
    f"{RB}.writers": WRITERS,
    f"{RB}.replay_buffers": BUFFERS + ("ConditionalUpdateResult",),
    f"{RB}.checkpointers": CHECKPOINTERS + ("CheckpointError", "read_checkpoint", "write_checkpoint",
                                            "register_checkpoint_handler"),
    f"{RB}.ray_buffer": ("RayReplayBuffer", "RayReplayBufferDataset"),
    f"{RB}.utils": TED + ("INT_CLASSES", "INT_CLASSES_TYPING", "pin_memory_output", "tree_iter"),
    f"{RB}.sample_units": SAMPLE_UNITS,
    f"{RB}.scheduler": SCHEDULERS,
    f"{RB}.hf": ("export_hf", "import_hf"),
    f"{RB}.loading": ("tensordict_collate",),
    f"{RB}.errors": ("CheckpointError", "TornReadError", "EpochEnded"),
    "torchrl.data.postprocs": ("MultiStep", "DensifyReward"),
    "torchrl.data.postprocs.postprocs": ("MultiStep", "DensifyReward"),
    "torchrl.modules.llm": ("TorchRLBufferDataset",),
}
CASES = [(path, name) for path, names in PATHS.items() for name in names]


@pytest.mark.parametrize(("path", "name"), CASES, ids=[f"{p}:{n}" for p, n in CASES])
def test_every_torchrl_name_imports_from_every_torchrl_path(path, name):
    module = importlib.import_module(path)
    value = getattr(module, name)
    assert value is not None
    if path in ("torchrl.data", RB) and not name.startswith("_"):
        assert name in module.__all__, f"`from {path} import *` must bring {name}"


@pytest.mark.parametrize("name", ["Bounded", "TensorSpec"])  # TorchRL's specs: the replay-buffer names are all here
def test_torchrl_names_not_provided_say_so_on_import(name):
    module = importlib.import_module("torchrl.data")
    with pytest.raises(NotProvidedError, match=name):
        getattr(module, name)


def test_one_object_behind_each_name_whatever_the_path():
    for path, names in PATHS.items():
        module = importlib.import_module(path)
        for name in names:
            if not name.startswith("_") and name in PATHS[RB]:
                assert getattr(module, name) is getattr(importlib.import_module(RB), name), (path, name)


@pytest.mark.parametrize("sub", ["storages", "samplers", "writers", "replay_buffers", "checkpointers", "hf"])
def test_torchrl_data_all_is_built_from_the_subpackages_all(sub):
    import torchrl.data

    module = importlib.import_module(f"{RB}.{sub}")
    assert set(module.__all__) <= set(importlib.import_module(RB).__all__)
    assert set(module.__all__) <= set(torchrl.data.__all__)


def test_star_import_of_torchrl_data_gives_every_listed_name():
    namespace: dict = {}
    exec("from torchrl.data import *", namespace)
    import torchrl.data

    missing = [name for name in torchrl.data.__all__ if name not in namespace]
    assert not missing
    assert len(torchrl.data.__all__) == len(set(torchrl.data.__all__))
