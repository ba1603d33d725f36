"""Components own their persistence: the checkpoint-part protocol, its contract run over buffers of every
combination of components, ensembles and transforms (the contract of every storage, sampler and writer class alone:
test_component_contracts.py), TorchRL's storage checkpointer names, the generator-state codec and the shared
atomic-write helper."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip, assert_same_state, observable_state
from helpers.factories import rewrite_checkpoint_metadata
from tensordict import TensorDict

import torchrl.data as data
from torchrl.data import (
    ImmutableDatasetWriter,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    ReplayBufferEnsemble,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StorageEnsemble,
    TensorDictMaxValueWriter,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
)
from torchrl.data.replay_buffers import checkpointers
from torchrl.data.replay_buffers._checkpoint.generator_state import generator_from_state, generator_to_state
from torchrl.data.replay_buffers.checkpointers import (
    CheckpointError,
    ListStorageCheckpointer,
    StorageCheckpointerBase,
    StorageEnsembleCheckpointer,
    TensorStorageCheckpointer,
    dump_component,
    load_component,
    register_checkpoint_handler,
)
from torchrl.envs.transforms import Compose, Transform

N = 12


def transitions(n: int = N, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(
        {"obs": ids.float().unsqueeze(-1).expand(n, 3).clone(), "episode": ids // 4, "reward": (ids % 5).float()},
        batch_size=[n],
    )


# -- the contract, run over ensembles, transforms and buffers --------------------------------------------------------


class Scale(Transform):
    """A transform with state: a learned scale kept in a buffer, saved by ``state_dict``."""

    def __init__(self):
        super().__init__(in_keys=["obs"])
        self.register_buffer("scale", torch.ones(1))

    def _apply_transform(self, value):
        return value * self.scale


def test_storage_ensemble_round_trips(tmp_path):
    def build():
        return StorageEnsemble(LazyTensorStorage(8), LazyTensorStorage(8), transforms=[Compose(Scale()), None])

    ensemble = build()
    for i, member in enumerate(ensemble.storages):
        member.set(torch.arange(4), transitions(4, 10 * i))
    ensemble.transforms[0][0].scale.fill_(3.0)
    assert_checkpoint_round_trip(ensemble, build, tmp_path)


SAMPLERS = {
    "random": RandomSampler,
    "without_replacement": SamplerWithoutReplacement,
    "prioritized": lambda: PrioritizedSampler(16, alpha=0.7, beta=0.5),
    "slice": lambda: SliceSampler(slice_len=2, traj_key="episode"),
    "slice_without_replacement": lambda: SliceSamplerWithoutReplacement(slice_len=2, traj_key="episode"),
    "prioritized_slice": lambda: PrioritizedSliceSampler(16, 0.7, 0.5, slice_len=2, traj_key="episode"),
}


WRITERS = {
    "round_robin": RoundRobinWriter,
    "tensordict_round_robin": TensorDictRoundRobinWriter,
    "max_value": lambda: TensorDictMaxValueWriter(rank_key="reward"),
    "immutable": ImmutableDatasetWriter,
}


def test_a_transform_round_trips_through_its_state_dict(tmp_path):
    transform = Compose(Scale())
    transform[0].scale.fill_(2.5)
    assert_checkpoint_round_trip(transform, lambda: Compose(Scale()), tmp_path)


BUFFER_STORAGES = {"list": lambda: ListStorage(16), "lazy": lambda: LazyTensorStorage(16), "memmap": lambda: LazyMemmapStorage(16)}
BUFFER_SAMPLERS = {k: SAMPLERS[k] for k in ("random", "without_replacement", "prioritized", "slice")}
BUFFER_WRITERS = {k: WRITERS[k] for k in ("round_robin", "tensordict_round_robin", "max_value")}
BUFFER_KINDS = {"ReplayBuffer": ReplayBuffer, "TensorDictReplayBuffer": TensorDictReplayBuffer}


@pytest.mark.parametrize("kind", list(BUFFER_KINDS))
@pytest.mark.parametrize("writer", list(BUFFER_WRITERS))
@pytest.mark.parametrize("sampler", list(BUFFER_SAMPLERS))
@pytest.mark.parametrize("storage", list(BUFFER_STORAGES))
def test_every_buffer_combination_round_trips(tmp_path, storage, sampler, writer, kind):
    list_based = storage == "list" and sampler == "slice"  # slice samplers read TensorDicts: a lazy stack of them

    def build():
        return BUFFER_KINDS[kind](
            storage=data.LazyStackStorage(16) if list_based else BUFFER_STORAGES[storage](),
            sampler=BUFFER_SAMPLERS[sampler](),
            writer=BUFFER_WRITERS[writer](),
            batch_size=4,
            generator=torch.Generator().manual_seed(0),
        )

    rb = build()
    rb.extend(transitions())
    if sampler == "prioritized":
        rb.update_priority(torch.arange(4), torch.tensor([5.0, 0.1, 2.0, 1.0]))
    rb.sample()
    assert_checkpoint_round_trip(rb, build, tmp_path)


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer])
def test_prioritized_buffers_round_trip(tmp_path, cls):
    def build():
        return cls(alpha=0.7, beta=0.5, storage=LazyTensorStorage(16), batch_size=4)

    rb = build()
    rb.extend(transitions())
    rb.update_priority(torch.arange(N), torch.arange(N).float() + 1)
    assert_checkpoint_round_trip(rb, build, tmp_path)


def test_buffer_ensemble_round_trips(tmp_path):
    def build():
        members = [TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=SamplerWithoutReplacement())
                   for _ in range(2)]
        return ReplayBufferEnsemble(*members, batch_size=4, generator=torch.Generator().manual_seed(0))

    rb = build()
    for i, member in enumerate(rb.buffers):
        member.extend(transitions(6, 100 * i))
    rb.sample()
    assert_checkpoint_round_trip(rb, build, tmp_path)


# -- the protocol ------------------------------------------------------------------------------------------------------
class CountingSampler(RandomSampler):
    """A user's sampler with extra state, saved through ``state_dict`` only (the default part)."""

    def __init__(self):
        super().__init__()
        self.draws = torch.zeros(16, dtype=torch.long)

    def sample(self, storage, batch_size):
        index, info = super().sample(storage, batch_size)
        self.draws.index_add_(0, index, torch.ones_like(index))
        return index, info

    def state_dict(self):
        return {"draws": self.draws.clone()}

    def load_state_dict(self, state_dict):
        self.draws.copy_(state_dict["draws"])


def test_a_users_sampler_with_only_a_state_dict_is_saved_by_the_default_part(tmp_path):
    def build():
        return ReplayBuffer(storage=LazyTensorStorage(16), sampler=CountingSampler(), batch_size=4)

    rb = build()
    rb.extend(torch.arange(N))
    rb.sample()
    assert int(rb.sampler.draws.sum()) == 4
    assert_checkpoint_round_trip(rb, build, tmp_path)


def test_a_registered_handler_wins_over_the_class_methods(tmp_path):
    class Tagged(RandomSampler):
        pass

    seen = []
    register_checkpoint_handler(
        Tagged,
        dump=lambda obj, ctx: ({ctx.name("tag"): torch.ones(2)}, {"tag": 7}),
        load=lambda obj, doc, tensors, ctx: seen.append((doc["tag"], tensors[ctx.name("tag")].tolist())),
    )
    rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=Tagged())
    rb.dumps(tmp_path / "rb")
    ReplayBuffer(storage=LazyTensorStorage(8), sampler=Tagged()).loads(tmp_path / "rb")
    assert seen == [(7, [1.0, 1.0])]
    assert (tmp_path / "rb" / "sampler" / "tag.memmap").exists()


def test_a_part_whose_check_fails_leaves_every_component_unchanged(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(16), sampler=SamplerWithoutReplacement(), batch_size=4)
    rb.extend(torch.arange(N))
    rb.sample()
    rb.dumps(tmp_path / "rb")
    target = ReplayBuffer(storage=LazyTensorStorage(16), sampler=PrioritizedSampler(16, 0.7, 0.5), batch_size=2)
    target.extend(torch.arange(100, 103))
    before = str(target.state_dict())
    with pytest.raises(ValueError, match="the sampler class"):
        target.loads(tmp_path / "rb")
    assert str(target.state_dict()) == before


@pytest.mark.parametrize(
    "rng, message",
    [({"device": "no-such-device", "state": "rng/state"}, "device"), ({"device": "cpu", "state": "missing"}, "`rng`")],
    ids=["unknown-device", "missing-tensor"],
)
def test_a_malformed_saved_generator_is_refused_before_anything_is_loaded(tmp_path, rng, message):
    rb = ReplayBuffer(storage=LazyTensorStorage(16), batch_size=4, generator=torch.Generator().manual_seed(0))
    rb.extend(torch.arange(N))
    rb.dumps(tmp_path / "rb")
    rewrite_checkpoint_metadata(tmp_path / "rb", lambda doc: doc["metadata"]["component"]["doc"].update(rng=rng))
    target = ReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
    with pytest.raises(CheckpointError, match=message):
        target.loads(tmp_path / "rb")
    assert len(target) == 0 and target.batch_size == 4


# -- the layering: the format knows no component -------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2] / "torchrl"
FORMAT_MODULES = (
    "data/replay_buffers/checkpointers.py",
    "data/replay_buffers/_checkpoint/format.py",
    "data/replay_buffers/_checkpoint/io.py",
    "data/replay_buffers/_checkpoint/fs.py",
    "data/replay_buffers/_checkpoint/validate.py",
    "data/replay_buffers/_checkpoint/args.py",
    "data/replay_buffers/_checkpoint/parts.py",
    "data/replay_buffers/_checkpoint/generator_state.py",
    "data/replay_buffers/component.py",
    "_files.py",
)
BOTTOM = {
    "torchrl._files",
    "torchrl.data.replay_buffers._checkpoint.format",
    "torchrl.data.replay_buffers._checkpoint.io",
    "torchrl.data.replay_buffers._checkpoint.fs",
    "torchrl.data.replay_buffers._checkpoint.validate",
    "torchrl.data.replay_buffers._checkpoint.args",
    "torchrl.data.replay_buffers._checkpoint.parts",
    "torchrl.data.replay_buffers._checkpoint.generator_state",
    "torchrl.data.replay_buffers.checkpointers",
    "torchrl.data.replay_buffers.errors",
    # the TED layouts the Flat/Nested/H5 checkpointers write, and the entry checks they use: no component
    "torchrl.data.replay_buffers.ted",
    "torchrl.data.replay_buffers.utils",
}


@pytest.mark.parametrize("module", FORMAT_MODULES)
def test_the_checkpoint_format_and_protocol_import_no_component(module):
    tree = ast.parse((ROOT / module).read_text())
    imported = set()
    for node in ast.walk(tree):  # deferred imports included
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert {name for name in imported if name.startswith("torchrl")} <= BOTTOM


def test_the_central_registry_of_components_is_gone():
    assert not (ROOT / "data/replay_buffers/_checkpoint_components.py").exists()


# -- TorchRL's checkpointer names ------------------------------------------------------------------------------------
NAMES = ("StorageCheckpointerBase", "TensorStorageCheckpointer", "ListStorageCheckpointer", "StorageEnsembleCheckpointer")


@pytest.mark.parametrize("name", NAMES)
def test_checkpointer_names_are_importable_from_torchrl_data_and_the_checkpointers_module(name):
    assert getattr(data, name) is getattr(checkpointers, name)
    assert name in data.__all__ and name in checkpointers.__all__


@pytest.mark.parametrize(
    "storage, default",
    [
        (lambda: LazyTensorStorage(4), TensorStorageCheckpointer),
        (lambda: LazyMemmapStorage(4), TensorStorageCheckpointer),
        (lambda: ListStorage(4), ListStorageCheckpointer),
        (lambda: StorageEnsemble(ListStorage(2), ListStorage(2)), StorageEnsembleCheckpointer),
    ],
    ids=["lazy", "memmap", "list", "ensemble"],
)
def test_storage_checkpointer_defaults_by_class_and_can_be_set_and_reset(storage, default):
    storage = storage()
    assert type(storage.checkpointer) is default
    mine = default()
    storage.checkpointer = mine
    assert storage.checkpointer is mine
    storage.checkpointer = StorageCheckpointerBase()  # the generic one saves any storage
    assert type(storage.checkpointer) is StorageCheckpointerBase
    storage.checkpointer = None
    assert type(storage.checkpointer) is default


def test_a_checkpointer_of_another_storage_kind_or_another_type_is_refused():
    storage = LazyTensorStorage(4)
    with pytest.raises(TypeError, match=r"saves ListStorage.*TensorStorageCheckpointer\(\) or None"):
        storage.checkpointer = ListStorageCheckpointer()
    with pytest.raises(TypeError, match="`checkpointer` must be a StorageCheckpointerBase"):
        storage.checkpointer = "torch.save"
    assert type(storage.checkpointer) is TensorStorageCheckpointer


@pytest.mark.parametrize(
    "build, fill",
    [
        (lambda: LazyTensorStorage(8), lambda s: s.set(torch.arange(5), transitions(5))),
        (lambda: LazyMemmapStorage(8), lambda s: s.set(torch.arange(5), transitions(5))),
        (lambda: ListStorage(8), lambda s: s.set([0, 1], [torch.ones(2), torch.zeros(3)])),
    ],
    ids=["lazy", "memmap", "list"],
)
def test_dumps_and_loads_go_through_the_storage_checkpointer(tmp_path, build, fill):
    calls = []

    class Recording(StorageCheckpointerBase):
        def dumps(self, storage, path, **kwargs):
            calls.append("dumps")
            super().dumps(storage, path, **kwargs)

        def loads(self, storage, path):
            calls.append("loads")
            super().loads(storage, path)

    storage = build()
    fill(storage)
    storage.checkpointer = Recording()
    storage.dumps(tmp_path / "s")
    fresh = build()
    fresh.checkpointer = Recording()
    fresh.loads(tmp_path / "s")
    assert calls == ["dumps", "loads"]
    assert len(fresh) == len(storage)
    assert_same_state(observable_state(fresh), observable_state(storage))
    other = build()
    other.checkpointer.loads(other, tmp_path / "s")  # the default checkpointer reads the same format
    assert_same_state(observable_state(other), observable_state(storage))


def test_list_storage_checkpointer_refuses_items_that_would_need_pickle(tmp_path):
    storage = ListStorage(4)
    storage.set([0, 1], [torch.ones(1), "a label"])
    with pytest.raises(TypeError, match=r"item 1 of the ListStorage \(str\).*would need pickle"):
        ListStorageCheckpointer().dumps(storage, tmp_path / "s")
    assert os.listdir(tmp_path) == []


def test_storage_ensemble_checkpointer_refuses_transform_state_that_would_need_pickle(tmp_path):
    class Labelled(Transform):
        """Keeps an arbitrary object in its state dict (torch.save would pickle it)."""

        def get_extra_state(self):
            return {"label": object()}

        def set_extra_state(self, state):
            pass

    ensemble = StorageEnsemble(LazyTensorStorage(2), LazyTensorStorage(2), transforms=[Labelled(), None])
    with pytest.raises(TypeError, match="would need pickle"):
        StorageEnsembleCheckpointer().dumps(ensemble, tmp_path / "e")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("method", ["register_save_hook", "register_load_hook"])
def test_checkpointer_hooks_are_refused_with_the_reason(method):
    with pytest.raises(NotImplementedError, match="rewrite the saved data"):
        getattr(TensorStorageCheckpointer(), method)(lambda td, **kwargs: td)


# -- one generator-state codec ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("as_bytes", [False, True], ids=["tensor", "bytes"])
def test_generator_state_round_trips_as_a_tensor_and_as_bytes(as_bytes):
    generator = torch.Generator().manual_seed(3)
    torch.rand(5, generator=generator)
    state = generator_to_state(generator, as_bytes=as_bytes)
    assert isinstance(state["state"], bytes if as_bytes else torch.Tensor) and state["device"] == "cpu"
    copy = generator_from_state(state)
    assert torch.equal(torch.rand(4, generator=copy), torch.rand(4, generator=generator))
    assert generator_to_state(None) is None and generator_from_state(None) is None


@pytest.mark.parametrize(
    "state, match",
    [
        ({"state": torch.zeros(3)}, "keys 'state' and 'device'"),
        ({"state": torch.zeros(3), "device": "cpu"}, "1-D uint8"),
        ({"state": b"\x00" * 3, "device": "cpu"}, "3 bytes"),
        ({"state": torch.Generator().get_state(), "device": "no-such-device"}, "no-such-device"),
    ],
    ids=["no-device", "float-state", "short-state", "bad-device"],
)
def test_a_malformed_generator_state_is_refused_with_a_value_error(state, match):
    with pytest.raises(ValueError, match=match):
        generator_from_state(state)


def test_buffers_encode_their_generator_with_the_one_codec(tmp_path):
    import pickle

    def build(seed):
        rb = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=2, generator=torch.Generator().manual_seed(seed))
        rb.extend(torch.arange(8))
        return rb

    rb = build(1)
    assert_same_state(rb.state_dict()["_rng"], generator_to_state(torch.Generator().manual_seed(1)))
    assert rb.__getstate__()["_rng"] == generator_to_state(torch.Generator().manual_seed(1), as_bytes=True)
    copy = pickle.loads(pickle.dumps(rb))
    assert torch.equal(copy.sample(), rb.sample())
    ensemble = ReplayBufferEnsemble(build(2), batch_size=2, generator=torch.Generator().manual_seed(3))
    assert_same_state(ensemble.state_dict()["_rng"], generator_to_state(torch.Generator().manual_seed(3)))


# -- one atomic-write helper -------------------------------------------------------------------------------------------
def test_policy_and_buffer_checkpoints_share_the_atomic_write_helpers():
    import torchrl._files as files
    from torchrl.data.replay_buffers._checkpoint import fs as _checkpoint_fs
    from torchrl.data.replay_buffers._checkpoint import io as _checkpoint_io
    from torchrl.render import checkpoint as render_checkpoint

    assert render_checkpoint.write_file_atomically is files.write_file_atomically
    assert _checkpoint_fs.fsync_dir is files.fsync_dir
    from torchrl.data.replay_buffers._checkpoint import format as _checkpoint_format

    assert _checkpoint_format.write_new_file is files.write_new_file
    assert _checkpoint_io.create_new_file is files.create_new_file


def test_write_file_atomically_replaces_whole_or_leaves_the_old_file(tmp_path):
    from torchrl._files import write_file_atomically

    path = tmp_path / "spec.json"
    write_file_atomically(path, lambda f: f.write(b'{"v": 1}'))

    def torn(f):
        f.write(b'{"v": ')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_file_atomically(path, torn)
    assert json.loads(path.read_text()) == {"v": 1} and os.listdir(tmp_path) == ["spec.json"]
    write_file_atomically(path, lambda f: f.write(b'{"v": 2}'), fsync=False)
    assert json.loads(path.read_text()) == {"v": 2} and os.listdir(tmp_path) == ["spec.json"]


def test_write_file_atomically_never_follows_a_planted_temporary_symlink(tmp_path, monkeypatch):
    import secrets

    from torchrl._files import write_file_atomically

    monkeypatch.setattr(secrets, "token_hex", lambda n: "feed")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / ".spec.json.feed.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_file_atomically(tmp_path / "spec.json", lambda f: f.write(b"x"))
    assert victim.read_text() == "keep"


def test_dump_component_and_load_component_keep_their_signatures(tmp_path):
    import inspect

    assert list(inspect.signature(dump_component).parameters) == ["obj", "path", "fsync", "progress"]
    assert list(inspect.signature(load_component).parameters) == ["obj", "path"]
