"""TorchRL constructor keywords and buffer methods that TorchRL code relies on (issue 12, "Keywords every
constructor of TorchRL takes"): ``compilable``, ``shared_init``, ``auto_cleanup``, ``track_generations``, the
buffer keywords and methods, ``writer._cursor`` and ``SamplerWithoutReplacement._sample_list``.

Expected values are computed by hand from TorchRL's documented behaviour.
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    Sequence,
    TensorDictMaxValueWriter,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
    TensorStorage,
)
from torchrl.data.replay_buffers._shared.cleanup import remove_owned_path
from torchrl.data.replay_buffers.storages._registry import _MEMMAP_STORAGE_REGISTRY


def _td(n, start=0):
    return TensorDict(obs=torch.arange(start, start + n), batch_size=[n])


# -- compilable ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compilable", [False, True])
@pytest.mark.parametrize(
    "make",
    [
        lambda c: ListStorage(10, compilable=c),
        lambda c: TensorStorage(torch.zeros(4), compilable=c),
        lambda c: LazyTensorStorage(10, compilable=c),
        lambda c: LazyMemmapStorage(10, compilable=c),
        lambda c: RoundRobinWriter(compilable=c),
        lambda c: RoundRobinWriter(c),
        lambda c: TensorDictRoundRobinWriter(compilable=c),
        lambda c: TensorDictMaxValueWriter(compilable=c),
    ],
)
def test_compilable_is_accepted_and_kept(make, compilable):
    assert make(compilable)._compilable is compilable


def test_compilable_must_be_a_bool():
    with pytest.raises(TypeError, match="compilable"):
        LazyTensorStorage(10, compilable="yes")


def test_buffer_compilable_reaches_its_default_storage_and_writer():
    rb = ReplayBuffer(compilable=True)
    assert rb._compilable and rb.storage._compilable and rb.writer._compilable
    td_rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), compilable=True)
    assert td_rb.writer._compilable and not td_rb.storage._compilable  # a storage passed in is left alone
    assert not ReplayBuffer()._compilable


def test_torch_compile_of_storage_get_and_set_with_compilable_true():
    storage = LazyTensorStorage(10, compilable=True)
    storage.set(torch.arange(4), TensorDict(obs=torch.arange(4.0), batch_size=[4]))

    def read(index):
        return storage.get(index)["obs"] * 2

    def write(index, value):
        storage.set(index, TensorDict(obs=value, batch_size=[2]), set_cursor=False)
        return storage.get(index)["obs"]

    try:
        out = torch.compile(read, backend="eager")(torch.tensor([1, 3]))
    except (RuntimeError, ImportError) as err:  # pragma: no cover - a torch build without dynamo support
        pytest.skip(f"torch.compile is not usable in this torch build: {err}")
    assert out.tolist() == [2.0, 6.0]
    assert torch.compile(write, backend="eager")(torch.tensor([0, 1]), torch.tensor([7.0, 8.0])).tolist() == [7, 8]
    assert storage.get(torch.arange(4))["obs"].tolist() == [7.0, 8.0, 2.0, 3.0]


# -- shared_init, auto_cleanup ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [LazyTensorStorage, LazyMemmapStorage])
def test_shared_init_is_a_checked_bool(cls):  # behaviour: test/storages/test_nontensor_storage.py (shared_init section)
    assert cls(4, shared_init=False).shared_init is False
    assert cls(4, shared_init=True).shared_init is True
    with pytest.raises(TypeError, match="shared_init"):
        cls(4, shared_init="yes")


def test_auto_cleanup_defaults_to_true_without_scratch_dir_and_false_with_one(tmp_path):
    assert LazyMemmapStorage(4).auto_cleanup is True
    assert LazyMemmapStorage(4, scratch_dir=tmp_path / "s").auto_cleanup is False
    assert LazyMemmapStorage(4, scratch_dir=tmp_path / "t", auto_cleanup=True).auto_cleanup is True  # TorchRL allows it


def test_auto_cleanup_false_keeps_the_temporary_directory():
    kept = LazyMemmapStorage(4, auto_cleanup=False)
    kept.set(torch.arange(2), torch.ones(2))
    kept_dir = kept.memmap_dir
    removed = LazyMemmapStorage(4)
    removed.set(torch.arange(2), torch.ones(2))
    removed_dir = removed.memmap_dir
    assert removed in _MEMMAP_STORAGE_REGISTRY and kept not in _MEMMAP_STORAGE_REGISTRY
    del kept, removed
    gc.collect()
    try:
        assert os.path.isdir(kept_dir)
        assert not os.path.exists(removed_dir)
    finally:
        shutil.rmtree(kept_dir, ignore_errors=True)
        remove_owned_path(kept_dir)


# -- generations ------------------------------------------------------------------------------------------------
def test_track_generations_counts_the_writes_of_each_slot():
    writer = RoundRobinWriter(track_generations=True)
    assert writer.tracks_generations and not RoundRobinWriter().tracks_generations
    assert not TensorDictMaxValueWriter().tracks_generations
    writer.register_storage(LazyTensorStorage(3))
    assert writer.generations_of(torch.tensor([0, 1, 2])).tolist() == [-1, -1, -1]
    writer.extend(torch.arange(2))
    assert writer.generations_of(torch.tensor([0, 1, 2])).tolist() == [0, 0, -1]
    writer.extend(torch.arange(2))  # slots 2, 0
    writer.add(torch.tensor(5))  # slot 1
    assert writer.generations_of(torch.tensor([0, 1, 2])).tolist() == [1, 1, 0]
    assert writer.generations_of(1).item() == 1 and writer.generations_of((torch.tensor([2]),)).tolist() == [0]
    writer._empty()
    assert writer.generations_of(torch.tensor([0, 1, 2])).tolist() == [2, 2, 1]
    state = writer.state_dict()
    fresh = RoundRobinWriter(track_generations=True)
    fresh.register_storage(LazyTensorStorage(3))
    fresh.load_state_dict(state)
    assert fresh.generations_of(torch.tensor([0, 1, 2])).tolist() == [2, 2, 1]
    assert RoundRobinWriter().generations_of(torch.tensor([0, 1])).tolist() == [-1, -1]


def test_track_generations_survives_a_checkpoint(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter(track_generations=True))
    rb.extend(torch.arange(4))
    rb.extend(torch.arange(2))
    fresh = assert_checkpoint_round_trip(rb, lambda: ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter(track_generations=True)), tmp_path)
    assert fresh.writer.generations_of(torch.arange(4)).tolist() == [1, 1, 0, 0]


def test_samples_carry_index_generation_and_update_if_present_skips_overwritten_rows():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4), writer=TensorDictRoundRobinWriter(track_generations=True), batch_size=4
    )
    rb.extend(TensorDict(obs=torch.arange(4), v=torch.zeros(4, dtype=torch.long), batch_size=[4]))
    batch = rb.sample()
    assert batch["index_generation"].tolist() == [0, 0, 0, 0]
    rb.extend(TensorDict(obs=torch.tensor([10]), v=torch.zeros(1, dtype=torch.long), batch_size=[1]))  # slot 0
    index, generation = torch.arange(4), torch.zeros(4, dtype=torch.long)
    patch = TensorDict(obs=torch.full((4,), -1), batch_size=[4])
    result = rb.update_if_present(index=index, generation=generation, patch=patch)
    assert result.updated.tolist() == [False, True, True, True] and result.stale_count == 1
    assert rb[:]["obs"].tolist() == [10, -1, -1, -1]
    result = rb.update_if_present(
        index=torch.tensor([1, 2]), generation=torch.zeros(2, dtype=torch.long),
        patch=TensorDict(obs=torch.tensor([5, 6]), batch_size=[2]), version_key="v", version=torch.tensor([1, -1]),
    )  # fmt: skip
    assert result.updated.tolist() == [True, False] and result.version_rejected_count == 1
    assert rb[:]["obs"].tolist() == [10, 5, -1, -1] and rb[:]["v"].tolist() == [0, 1, 0, 0]
    with pytest.raises(RuntimeError, match="track_generations=True"):
        TensorDictReplayBuffer(storage=LazyTensorStorage(4)).update_if_present(
            index=index, generation=generation, patch=patch
        )


# -- cursor aliases ---------------------------------------------------------------------------------------------
def test_writer_cursor_alias_reads_and_sets_the_public_cursor():
    rb = ReplayBuffer(storage=LazyTensorStorage(5))
    rb.extend(torch.arange(3))
    assert rb.writer._cursor == rb.writer.cursor == 3
    rb.writer._cursor = 1
    assert rb.writer.cursor == 1
    assert rb.extend(torch.arange(2)).tolist() == [1, 2]


def test_max_value_writer_cursor_counts_filled_slots_then_stays_at_capacity():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(3), writer=TensorDictMaxValueWriter(rank_key="r"))
    seen = []
    for r in [1.0, 5.0, 3.0, 4.0, 0.0]:
        rb.add(TensorDict(r=torch.tensor(r)))
        seen.append((rb.writer.cursor, rb.writer._cursor))
    assert seen == [(1, 1), (2, 2), (3, 0), (3, 0), (3, 0)]  # `_cursor` is TorchRL's: 0 once full


def test_sampler_without_replacement_sample_list_is_the_rest_of_the_epoch():
    sampler = SamplerWithoutReplacement(shuffle=False)
    rb = ReplayBuffer(storage=LazyTensorStorage(6), sampler=sampler, batch_size=2)
    rb.extend(torch.arange(6))
    assert sampler._sample_list is None
    assert rb.sample().tolist() == [0, 1]
    assert sampler._sample_list.tolist() == [2, 3, 4, 5]
    sampler._sample_list = torch.tensor([5, 4])
    assert rb.sample().tolist() == [5, 4] and sampler.ran_out


# -- buffer keywords --------------------------------------------------------------------------------------------
def test_transform_factory_builds_the_transform_and_excludes_transform():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), transform_factory=lambda: (lambda x: x * 10), batch_size=2)
    rb.extend(torch.ones(2))
    assert rb.sample().tolist() == [10.0, 10.0]
    with pytest.raises(TypeError, match="transform_factory"):
        ReplayBuffer(transform=lambda x: x, transform_factory=lambda: (lambda x: x))


def test_delayed_init_true_builds_the_buffer_at_its_first_write():
    # the delayed init itself: test/buffers/test_buffer_torchrl_compat.py
    for value in (None, False):
        assert ReplayBuffer(storage=LazyTensorStorage(4), delayed_init=value).initialized
    rb = ReplayBuffer(storage=LazyTensorStorage(4), delayed_init=True)
    assert not rb.initialized
    rb.extend(torch.arange(2))
    assert rb.initialized and len(rb) == 2


def test_consume_after_n_samples_is_validated_and_builds_a_consuming_sampler():
    # behaviour: test/samplers/test_consuming_sampler.py
    assert ReplayBuffer(consume_after_n_samples=2).sampler.max_sample_count == 2
    with pytest.raises((TypeError, ValueError)):
        ReplayBuffer(consume_after_n_samples=0)


def test_sample_unit_reads_sequences_through_the_buffer():
    n = 8
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[3] = done[7] = True
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n), sample_unit=Sequence(2), batch_size=3)
    rb.extend(TensorDict({"obs": torch.arange(n), ("next", "done"): done}, batch_size=[n]))
    assert isinstance(rb.sample_unit, Sequence) and ReplayBuffer().sample_unit is None
    batch = rb.sample()
    assert batch.batch_size == torch.Size([6])  # 3 windows of 2 records, flat
    assert (batch["obs"] == batch["index"]).all()


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer])
def test_prioritized_buffers_accept_sampler_device_and_sync(cls):
    for sync in (True, False):
        cls(alpha=0.7, beta=0.5, storage=LazyTensorStorage(4), sampler_device="cpu", sync=sync)
    cls(alpha=0.7, beta=0.5, storage=LazyTensorStorage(4), sampler_device=None)
    with pytest.raises(ValueError, match="`sampler_device`='meta' holds no data"):
        cls(alpha=0.7, beta=0.5, storage=LazyTensorStorage(4), sampler_device="meta")
    if not torch.cuda.is_available():  # TorchRL's phrase for a CUDA tree without CUDA
        with pytest.raises(RuntimeError, match="CUDA prioritized replay buffers require"):
            cls(alpha=0.7, beta=0.5, storage=LazyTensorStorage(4), sampler_device="cuda")


# -- buffer methods ---------------------------------------------------------------------------------------------
def test_stats():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(torch.arange(2))
    assert rb.stats() == {
        "size": 2, "write_count": 2, "prefetch_queue_size": 0, "initialized": True, "capacity": 8,
        "utilization": 0.25, "sample_calls": 0, "samples_returned": 0, "sampleable_size": 2,
    }  # fmt: skip
    assert "capacity" not in ReplayBuffer(storage=ListStorage()).stats()


def test_in_place_edits_of_stored_tensordicts():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(5))
    rb.extend(TensorDict(obs=torch.arange(3), r=torch.zeros(3), batch_size=[3]))
    rb.set_("r", torch.ones(3))
    assert rb[:]["r"].tolist() == [1.0, 1.0, 1.0]
    rb.set_at_("r", torch.tensor([7.0]), torch.tensor([1]))
    assert rb[:]["r"].tolist() == [1.0, 7.0, 1.0]
    rb.update_(TensorDict(obs=torch.tensor([9, 8, 7]), r=torch.zeros(3), batch_size=[3]), keys_to_update=["obs"])
    assert rb[:]["obs"].tolist() == [9, 8, 7] and rb[:]["r"].tolist() == [1.0, 7.0, 1.0]
    assert len(rb) == 3 and rb.read_all_in_order()["obs"].tolist() == [9, 8, 7]
    assert rb.read_all_in_order(2)["obs"].tolist() == [9, 8]
    with pytest.raises(TypeError, match="TensorDicts"):
        plain = ReplayBuffer(storage=LazyTensorStorage(3))
        plain.extend(torch.arange(2))
        plain.set_("x", torch.zeros(2))


def test_next_walks_an_epoch_then_returns_none_and_starts_again():
    rb = ReplayBuffer(
        storage=LazyTensorStorage(4), sampler=SamplerWithoutReplacement(shuffle=False), batch_size=2
    )
    rb.extend(torch.arange(4))
    assert rb.next().tolist() == [0, 1] and rb.next().tolist() == [2, 3]
    assert rb.next() is None
    assert rb.next().tolist() == [0, 1]
    pickle.loads(pickle.dumps(rb))  # the iterator is not part of the buffer's state


def test_save_hooks_are_accepted_and_load_hooks_refused_clearly():
    # what a save hook does: test/buffers/test_buffer_torchrl_compat.py
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.register_save_hook(lambda data, path=None: data)
    with pytest.raises(TypeError, match="save hook must be a callable"):
        rb.register_save_hook(3)
    with pytest.raises(NotImplementedError, match="hook"):
        rb.register_load_hook(lambda *a: None)


def test_buffer_checkpointer_keyword_sets_the_storage_layout(tmp_path):
    from torchrl.data import NestedStorageCheckpointer

    checkpointer = NestedStorageCheckpointer()
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), checkpointer=checkpointer, batch_size=2)
    assert rb.storage.checkpointer is checkpointer
    data = TensorDict(
        obs=torch.randn(4, 2), done=torch.zeros(4, 1, dtype=torch.bool),
        next=TensorDict(obs=torch.randn(4, 2), done=torch.zeros(4, 1, dtype=torch.bool), batch_size=[4]),
        batch_size=[4],
    )
    rb.extend(data)
    rb.dumps(tmp_path / "ck")
    restored = TensorDictReplayBuffer(storage=LazyTensorStorage(10), checkpointer=NestedStorageCheckpointer())
    restored.loads(tmp_path / "ck")
    assert torch.equal(restored[:4]["obs"], data["obs"])


def test_buffer_checkpointer_keyword_refuses_a_non_checkpointer():
    with pytest.raises(TypeError, match="`checkpointer` must be a StorageCheckpointerBase"):
        ReplayBuffer(checkpointer="flat")
