"""ReplayBufferEnsemble built from components, routed writes (routing_key / routing_dim), the routing metadata, the
ensemble's conditional updates, p="sampleable" readiness and sharing (TorchRL's routed ensemble writes)."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import (
    ConditionalUpdateResult,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    ReplayBufferEnsemble,
    RoundRobinWriter,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    StorageEnsemble,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
    WriterEnsemble,
)
from torchrl.envs.transforms import Transform


def _records(tasks, start: float = 0.0) -> TensorDict:
    tasks = torch.as_tensor(tasks)
    n = tasks.numel()
    return TensorDict(task=tasks, obs=torch.arange(n, dtype=torch.float32) + start, batch_size=[n])


def _routed(n: int = 3, capacity: int = 10, *, track: bool = False, **kwargs) -> ReplayBufferEnsemble:
    writers = [RoundRobinWriter(track_generations=True) for _ in range(n)] if track else None
    kwargs.setdefault("routing_key", "task")
    return ReplayBufferEnsemble(
        storages=[LazyTensorStorage(capacity) for _ in range(n)], writers=writers, **kwargs
    )


class _CountingInverse(Transform):
    """Records the batch size of every write it sees (a member's inverse transform)."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def inv(self, data):
        self.writes.append(data.batch_size[0])
        return data


class _TaskFromObs(Transform):
    """An ensemble-level inverse transform that computes the routing entry from the data."""

    def inv(self, data):
        data = data.clone(False)
        data.set("task", (data.get("obs") >= 10).long())
        return data


# -- the components form ---------------------------------------------------------------------------------------
class TestComponentsForm:
    def test_one_member_buffer_per_storage(self):
        storages = [LazyTensorStorage(5), ListStorage(5)]
        samplers = [SamplerWithoutReplacement(), RandomSampler()]
        writers = [RoundRobinWriter(), RoundRobinWriter()]
        rb = ReplayBufferEnsemble(storages=storages, samplers=samplers, writers=writers, batch_size=4)
        assert len(rb) == 2
        for i in range(2):
            member = rb[i]
            assert type(member) is ReplayBuffer
            assert (
                member.storage is storages[i]
                and member.sampler is samplers[i]
                and member.writer is writers[i]
            )
            assert (
                rb.storage[i] is storages[i] and rb.sampler[i] is samplers[i] and rb.writer[i] is writers[i]
            )
        rb[0].extend(torch.zeros(5))
        rb[1].extend([torch.ones(()) for _ in range(5)])
        batch = rb.sample()
        assert batch.shape == (2, 2)

    def test_ensembles_as_components_keep_their_configuration(self):
        def double(td):
            return td.set("obs", td.get("obs") * 2)

        storages = StorageEnsemble(LazyTensorStorage(5), LazyTensorStorage(5), transforms=[None, double])
        samplers = SamplerEnsemble(RandomSampler(), RandomSampler(), sample_from_all=True)
        writers = WriterEnsemble(RoundRobinWriter(), RoundRobinWriter())
        rb = ReplayBufferEnsemble(storages=storages, samplers=samplers, writers=writers, batch_size=4)
        assert rb.sampler.sample_from_all and rb[1].writer is writers[1]
        for i in range(2):
            rb[i].extend(TensorDict(obs=torch.ones(3), batch_size=[3]))
        batch = rb.sample()
        assert batch["obs"].tolist() == [[1.0, 1.0], [2.0, 2.0]]  # member 1's transform is its buffer's

    def test_a_sampler_ensemble_brings_its_choice_rule(self):
        samplers = SamplerEnsemble(RandomSampler(), RandomSampler(), p=[1.0, 0.0])
        rb = ReplayBufferEnsemble(storages=[LazyTensorStorage(5), LazyTensorStorage(5)], samplers=samplers)
        assert rb.sampler.p.tolist() == [1.0, 0.0]
        with pytest.raises(ValueError, match="SamplerEnsemble, which sets p"):
            ReplayBufferEnsemble(storages=[LazyTensorStorage(5)] * 2, samplers=samplers, p=[0.5, 0.5])

    def test_collate_fns_per_member(self):
        seen = []

        def tag(i):
            def collate(data):
                seen.append(i)
                return data

            return collate

        members = [
            make_buffer(capacity=5, data=TensorDict(obs=torch.zeros(5), batch_size=[5])) for _ in range(2)
        ]
        rb = ReplayBufferEnsemble(*members, collate_fns=[tag(0), tag(1)], sample_from_all=True, batch_size=2)
        rb.sample()
        assert seen == [0, 1]
        assert members[0].collate_fn is not rb.storage.collate_fns[0]  # the members keep their own
        seen.clear()
        rb = ReplayBufferEnsemble(storages=[LazyTensorStorage(5)], collate_fns=[tag(7)], batch_size=2)
        rb[0].extend(torch.zeros(3))
        rb.sample()
        assert seen == [7] and rb[0].collate_fn is rb.storage.collate_fns[0]

    def test_default_collate_of_each_storage(self):
        rb = ReplayBufferEnsemble(
            storages=[LazyTensorStorage(5), ListStorage(5)], sample_from_all=True, batch_size=4
        )
        rb[0].extend(torch.arange(5))
        rb[1].extend([torch.tensor(7), torch.tensor(8)])
        batch = rb.sample()
        assert batch.shape == (2, 2) and set(batch[1].tolist()) <= {7, 8}

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"storages": [LazyTensorStorage(2)]}, RuntimeError, "member buffers or components, not both"),
            ({"writers": [RoundRobinWriter()]}, RuntimeError, "`writers`"),
        ],
    )
    def test_buffers_and_components_are_exclusive(self, kwargs, error, match):
        with pytest.raises(error, match=match):
            ReplayBufferEnsemble(make_buffer(capacity=2), **kwargs)

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({}, ValueError, "at least one"),
            ({"samplers": [RandomSampler()]}, ValueError, "without `storages`"),
            ({"storages": []}, ValueError, "at least one"),
            ({"storages": [RandomSampler()]}, TypeError, "Member 0.*Storage"),
            ({"storages": LazyTensorStorage(2)}, TypeError, "`storages` must be a list"),
            (
                {"storages": [LazyTensorStorage(2)] * 2, "samplers": [RandomSampler()]},
                ValueError,
                "`samplers`.*2",
            ),
            (
                {"storages": [LazyTensorStorage(2)], "writers": [RoundRobinWriter()] * 2},
                ValueError,
                "`writers`.*1",
            ),
            ({"storages": [LazyTensorStorage(2)], "collate_fns": [3]}, TypeError, "`collate_fns\\[0\\]`"),
            (
                {"storages": [LazyTensorStorage(2)], "storage": LazyTensorStorage(2)},
                TypeError,
                "`storage` is not",
            ),
            ({"storages": [LazyTensorStorage(2)], "dim_extend": 1}, TypeError, "`dim_extend`"),
        ],
    )
    def test_bad_components(self, kwargs, error, match):
        with pytest.raises(error, match=match):
            ReplayBufferEnsemble(**kwargs)

    def test_other_buffer_keywords_reach_the_ensemble(self):
        rb = ReplayBufferEnsemble(storages=[LazyTensorStorage(10)], batch_size=2, prefetch=2)
        rb[0].extend(torch.arange(10))
        assert rb.sample().shape == (1, 2)
        with pytest.raises(TypeError, match="unknown_keyword"):
            ReplayBufferEnsemble(storages=[LazyTensorStorage(10)], unknown_keyword=1)


# -- routed writes --------------------------------------------------------------------------------------------
class TestRoutedExtend:
    def test_records_go_to_their_member_in_order_and_metadata_aligns(self):
        rb = _routed(3)
        data = _records([2, 0, 2, 1, 0, 2])
        meta = rb.extend(data)
        assert meta.batch_size == (6,)
        assert meta["buffer_ids"].tolist() == [2, 0, 2, 1, 0, 2]
        assert meta["index"].tolist() == [0, 0, 1, 0, 1, 2]
        assert "index_generation" not in meta.keys()
        assert rb[0][:]["obs"].tolist() == [1.0, 4.0]  # original order kept within a member
        assert rb[2][:]["obs"].tolist() == [0.0, 2.0, 5.0]
        for row in range(6):
            stored = rb[int(meta["buffer_ids"][row])].storage.get(meta["index"][row : row + 1])
            assert stored["obs"].item() == data["obs"][row].item()

    def test_each_member_gets_one_extend(self):
        counters = [_CountingInverse() for _ in range(3)]
        members = [TensorDictReplayBuffer(storage=LazyTensorStorage(10), transform=c) for c in counters]
        rb = ReplayBufferEnsemble(*members, routing_key="task")
        rb.extend(_records([1, 0, 1, 1, 0]))
        assert [c.writes for c in counters] == [[2], [3], []]

    def test_a_batched_input_is_flattened(self):
        rb = _routed(2)
        data = TensorDict(
            task=torch.tensor([[0, 1], [1, 1]]), obs=torch.arange(4.0).reshape(2, 2), batch_size=[2, 2]
        )
        meta = rb.extend(data)
        assert meta["buffer_ids"].tolist() == [0, 1, 1, 1]
        assert rb[1][:]["obs"].tolist() == [1.0, 2.0, 3.0]

    def test_routing_key_with_trailing_unit_dims_and_nested_key(self):
        rb = ReplayBufferEnsemble(
            storages=[LazyTensorStorage(5), LazyTensorStorage(5)], routing_key=("meta", "task")
        )
        data = TensorDict(meta=TensorDict(task=torch.tensor([[1], [0]]), batch_size=[2]), obs=torch.ones(2),
                          batch_size=[2])  # fmt: skip
        assert rb.extend(data)["buffer_ids"].tolist() == [1, 0]
        assert len(rb[0]) == len(rb[1]) == 1

    def test_routing_dim(self):
        rb = ReplayBufferEnsemble(storages=[LazyTensorStorage(10) for _ in range(3)], routing_dim=0)
        data = TensorDict(obs=torch.arange(6.0).reshape(3, 2), batch_size=[3, 2])
        meta = rb.extend(data)
        assert meta["buffer_ids"].tolist() == [0, 0, 1, 1, 2, 2]
        assert rb[1][:]["obs"].tolist() == [2.0, 3.0]
        last = ReplayBufferEnsemble(storages=[LazyTensorStorage(10) for _ in range(2)], routing_dim=-1)
        assert (
            last.extend(TensorDict(obs=torch.zeros(3, 2), batch_size=[3, 2]))["buffer_ids"].tolist()
            == [0, 1] * 3
        )

    def test_the_ensemble_transform_runs_before_routing(self):
        rb = _routed(2, transform=_TaskFromObs())
        meta = rb.extend(TensorDict(obs=torch.tensor([3.0, 12.0, 1.0]), batch_size=[3]))
        assert meta["buffer_ids"].tolist() == [0, 1, 0]
        assert rb[1][:]["obs"].tolist() == [12.0]

    def test_generations_of_each_record_and_rows_written_twice(self):
        rb = _routed(2, capacity=2, track=True)
        meta = rb.extend(_records([0, 0, 0, 1]))  # member 0: rows 0, 1, then 0 again
        assert meta["index"].tolist() == [0, 1, 0, 0]
        assert meta["index_generation"].tolist() == [0, 0, 1, 0]  # the first record was overwritten
        result = rb.update_if_present(index=meta, generation=meta["index_generation"],
                                      patch={"obs": torch.full((4,), -1.0)})  # fmt: skip
        assert result.updated.tolist() == [False, True, True, True] and result.stale_count == 1
        assert rb[0][:]["obs"].tolist() == [-1.0, -1.0]

    def test_a_rejected_record_has_index_minus_one(self):
        members = [
            TensorDictReplayBuffer(
                storage=LazyTensorStorage(1), writer=TensorDictMaxValueWriter(rank_key="obs")
            ),
            TensorDictReplayBuffer(storage=LazyTensorStorage(4)),
        ]
        rb = ReplayBufferEnsemble(*members, routing_key="task")
        meta = rb.extend(_records([0, 0, 1], start=1.0))
        assert meta["index"].tolist() == [-1, 0, 0] and rb[0][:]["obs"].tolist() == [2.0]

    def test_empty_input_gives_empty_metadata(self):
        rb = _routed(2, track=True)
        meta = rb.extend(_records(torch.zeros(0, dtype=torch.long)))
        assert meta.batch_size == (0,) and set(meta.keys()) == {"buffer_ids", "index", "index_generation"}
        assert len(rb[0]) == len(rb[1]) == 0

    def test_add_routes_one_record_and_returns_its_row(self):
        rb = _routed(2, track=True)
        row = rb.add(TensorDict(task=torch.tensor(1), obs=torch.tensor(5.0)))
        assert row.batch_size == () and row["buffer_ids"].item() == 1 and row["index"].item() == 0
        assert row["index_generation"].item() == 0
        assert rb[1][:]["obs"].tolist() == [5.0]

    def test_sampling_after_routed_writes(self):
        rb = _routed(2, sample_from_all=True, batch_size=4)
        rb.extend(_records([0, 1, 0, 1]))
        batch = rb.sample()
        assert (batch["task"] == batch["buffer_ids"]).all()

    def test_routing_survives_pickling(self):
        rb = _routed(2)
        rb.extend(_records([0, 1]))
        copy = pickle.loads(pickle.dumps(rb))
        assert copy.routing_key == "task" and copy.extend(_records([1]))["index"].tolist() == [1]
        assert len(copy[1]) == 2 and len(rb[1]) == 1

    def test_checkpoint_round_trip_of_a_components_ensemble(self, tmp_path):
        rb = _routed(2, track=True)
        rb.extend(_records([0, 1, 1]))
        rb.dumps(tmp_path)
        copy = _routed(2, track=True)
        copy.loads(tmp_path)
        assert copy[1][:]["obs"].tolist() == [1.0, 2.0]
        meta = copy.extend(_records([1], start=9.0))
        assert meta["index"].tolist() == [2] and meta["index_generation"].tolist() == [0]

    def test_repr_names_the_routing(self):
        assert "routing_key='task'" in repr(_routed(1))
        assert "routing_dim=0" in repr(ReplayBufferEnsemble(storages=[LazyTensorStorage(2)], routing_dim=0))


class TestRoutedWriteErrors:
    def test_routing_keywords_are_exclusive(self):
        with pytest.raises(ValueError, match="routing_key and routing_dim are mutually exclusive."):
            ReplayBufferEnsemble(storages=[LazyTensorStorage(2)], routing_key="task", routing_dim=0)

    @pytest.mark.parametrize("kwargs", [{"routing_dim": 0.0}, {"routing_dim": True}, {"routing_key": 3}])
    def test_bad_routing_keywords(self, kwargs):
        with pytest.raises(TypeError, match="`routing_(dim|key)`"):
            ReplayBufferEnsemble(storages=[LazyTensorStorage(2)], **kwargs)

    @pytest.mark.parametrize("call", ["extend", "add"])
    def test_without_routing_writes_are_disabled(self, call):
        rb = ReplayBufferEnsemble(storages=[LazyTensorStorage(2)])
        data = _records([0])
        with pytest.raises(
            RuntimeError,
            match="ReplayBufferEnsemble writes are disabled. Configure routing_key or routing_dim to enable routed "
            "writes.",
        ):
            rb.extend(data) if call == "extend" else rb.add(data[0])
        assert len(rb[0]) == 0

    @pytest.mark.parametrize("call", ["extend", "add"])
    def test_routed_writes_need_a_tensordict(self, call):
        rb = _routed(2)
        with pytest.raises(TypeError, match="Routed replay writes require a TensorDict input."):
            rb.extend(torch.zeros(3)) if call == "extend" else rb.add(torch.zeros(()))

    def test_add_with_routing_dim(self):
        rb = ReplayBufferEnsemble(storages=[LazyTensorStorage(2)], routing_dim=0)
        with pytest.raises(RuntimeError, match=r"Use extend\(\) for routing_dim writes\."):
            rb.add(TensorDict(obs=torch.zeros(())))

    def test_add_of_a_batch(self):
        with pytest.raises(ValueError, match="one record.*batch_size=\\[2\\]"):
            _routed(2).add(_records([0, 1]))

    def test_update_priority_is_not_routed(self):
        with pytest.raises(NotImplementedError, match="update_priority"):
            _routed(2).extend(_records([0]), update_priority=True)

    @pytest.mark.parametrize(
        "tasks, error, match",
        [
            (torch.tensor([0.0, 1.0]), TypeError, "member ids must be integers"),
            (torch.tensor([True, False]), TypeError, "member ids must be integers"),
            (torch.tensor([0, 2]), ValueError, "\\[0, 1\\].*\\[2\\]"),
            (torch.tensor([-1, 0]), ValueError, "\\[0, 1\\].*\\[-1\\]"),
            (torch.tensor([[0, 1], [1, 0]]), ValueError, "one member id per record"),
        ],
    )
    def test_bad_member_ids_write_nothing(self, tasks, error, match):
        rb = _routed(2)
        data = TensorDict(task=tasks, obs=torch.zeros(2), batch_size=[2])
        with pytest.raises(error, match=match):
            rb.extend(data)
        assert len(rb[0]) == len(rb[1]) == 0

    def test_missing_routing_key(self):
        rb = _routed(2)
        with pytest.raises(KeyError, match="routing_key='task'"):
            rb.extend(TensorDict(obs=torch.zeros(2), batch_size=[2]))

    @pytest.mark.parametrize(
        "shape, match", [((2, 3), "dim 0, which has size 2"), ((), "batch_size=\\[\\]"), ((3,), None)]
    )
    def test_routing_dim_of_the_wrong_size(self, shape, match):
        rb = ReplayBufferEnsemble(
            storages=[LazyTensorStorage(5) for _ in range(3)], routing_dim=0 if shape else 0
        )
        data = TensorDict(obs=torch.zeros(shape), batch_size=list(shape))
        if match is None:  # the right size: written
            assert rb.extend(data)["buffer_ids"].tolist() == [0, 1, 2]
            return
        with pytest.raises(ValueError, match=match):
            rb.extend(data)
        assert all(len(m) == 0 for m in rb.buffers)

    def test_routing_dim_out_of_range(self):
        rb = ReplayBufferEnsemble(storages=[LazyTensorStorage(5)] * 1, routing_dim=2)
        with pytest.raises(ValueError, match="routing_dim=2 is out of range"):
            rb.extend(TensorDict(obs=torch.zeros(1), batch_size=[1]))

    def test_a_record_one_member_refuses_writes_nothing_anywhere(self):
        rb = _routed(2)
        rb[1].extend(TensorDict(task=torch.ones(2, dtype=torch.long), obs=torch.zeros(2, 3), batch_size=[2]))
        with pytest.raises(ValueError, match="Nothing was written"):
            rb.extend(_records([0, 1]))  # member 1 holds obs of shape [3] per record, the records have []
        assert len(rb[0]) == 0 and rb[0].write_count == 0 and len(rb[1]) == 2

    def test_a_member_with_a_grid_storage_is_refused_before_any_write(self):
        members = [make_buffer(capacity=4), TensorDictReplayBuffer(storage=LazyTensorStorage(8, ndim=2))]
        rb = ReplayBufferEnsemble(*members, routing_key="task")
        with pytest.raises(RuntimeError, match="member 1's storage has ndim=2.*Nothing was written"):
            rb.extend(_records([0, 1]))
        assert len(rb[0]) == 0


# -- conditional updates ------------------------------------------------------------------------------------
class TestEnsembleConditionalUpdate:
    def test_updates_land_in_each_member(self):
        rb = _routed(3, track=True)
        meta = rb.extend(_records([2, 0, 1, 2]))
        result = rb.update_if_present(index=meta, generation=meta["index_generation"],
                                      patch={"obs": torch.tensor([10.0, 11.0, 12.0, 13.0])})  # fmt: skip
        assert isinstance(result, ConditionalUpdateResult)
        assert (
            result.updated.tolist() == [True] * 4
            and result.updated_count == 4
            and result.version_rejected is None
        )
        assert rb[0][:]["obs"].tolist() == [11.0] and rb[1][:]["obs"].tolist() == [12.0]
        assert rb[2][:]["obs"].tolist() == [10.0, 13.0]

    def test_stale_records_are_left_alone(self):
        rb = _routed(2, capacity=2, track=True)
        meta = rb.extend(_records([0, 1]))
        rb.extend(_records([0, 0], start=50.0))  # member 0's row 0 is overwritten
        result = rb.update_if_present(index=meta, generation=meta["index_generation"],
                                      patch={"obs": torch.full((2,), -1.0)})  # fmt: skip
        assert result.updated.tolist() == [False, True] and result.stale_count == 1
        assert sorted(rb[0][:]["obs"].tolist()) == [50.0, 51.0] and rb[1][:]["obs"].tolist() == [-1.0]

    def test_versions(self):
        rb = _routed(2, track=True)
        data = _records([0, 1])
        data["v"] = torch.tensor([5, 5])
        meta = rb.extend(data)
        result = rb.update_if_present(index=meta, generation=meta["index_generation"],
                                      patch={"obs": torch.tensor([7.0, 8.0])}, version_key="v",
                                      version=torch.tensor([6, 4]))  # fmt: skip
        assert result.updated.tolist() == [True, False] and result.version_rejected.tolist() == [False, True]
        assert result.version_rejected_count == 1 and rb[0][:]["v"].tolist() == [6]

    def test_a_sample_index_with_its_batch_shape(self):
        rb = _routed(2, track=True, sample_from_all=True, batch_size=4)
        rb.extend(_records([0, 1, 0, 1]))
        batch = rb.sample()
        generation = torch.zeros(batch.shape, dtype=torch.long)
        result = rb.update_if_present(index=batch["index"], generation=generation,
                                      patch={"obs": torch.full(batch.shape, 9.0)})  # fmt: skip
        assert result.updated.shape == (2, 2) and result.updated.all()
        assert rb[0][:]["obs"].eq(9).any() and rb[1][:]["obs"].eq(9).any()

    def test_a_refused_update_writes_no_member(self):
        rb = _routed(2, track=True)
        meta = rb.extend(_records([0, 1]))
        rb[0].extend(TensorDict(task=torch.zeros(1, dtype=torch.long), obs=torch.ones(1), extra=torch.ones(1),
                                batch_size=[1]))  # fmt: skip
        generation = meta["index_generation"]
        with pytest.raises(KeyError, match="extra"):  # member 1 does not hold "extra"; member 0 would take it
            rb.update_if_present(index=meta, generation=generation,
                                 patch={"obs": torch.full((2,), 3.0), "extra": torch.zeros(2)})  # fmt: skip
        assert rb[0][:]["obs"].tolist() == [0.0, 1.0] and rb[1][:]["obs"].tolist() == [1.0]

    def test_unsupported_members(self):
        members = [
            ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter(track_generations=True)),
            ReplayBuffer(storage=LazyTensorStorage(4)),
        ]
        rb = ReplayBufferEnsemble(*members, routing_key="task")
        meta = rb.extend(_records([0, 1]))
        assert "index_generation" not in meta.keys()  # not every member tracks generations
        with pytest.raises(RuntimeError, match="(?i)conditional.*member 1"):
            rb.update_if_present(index=meta, generation=torch.zeros(2, dtype=torch.long),
                                 patch={"obs": torch.ones(2)})  # fmt: skip
        assert rb[0][:]["obs"].tolist() == [0.0]

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"index": torch.arange(2)}, TypeError, "'buffer_ids' and 'index'"),
            ({"version_key": "v"}, ValueError, "`version_key` without `version`"),
            ({"version": 1}, ValueError, "`version` without `version_key`"),
            ({"patch": {"obs": torch.ones(3)}}, ValueError, "patch value of 'obs'"),
            ({"generation": torch.zeros(3, dtype=torch.long)}, ValueError, "generation"),
            ({"patch": [1.0]}, TypeError, "`patch` must be a dict"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        rb = _routed(2, track=True)
        meta = rb.extend(_records([0, 1]))
        call = {
            "index": meta,
            "generation": meta["index_generation"],
            "patch": {"obs": torch.ones(2)},
            **kwargs,
        }
        with pytest.raises(error, match=match):
            rb.update_if_present(**call)
        assert rb[0][:]["obs"].tolist() == [0.0] and rb[1][:]["obs"].tolist() == [1.0]


# -- p="sampleable" -------------------------------------------------------------------------------------------
def test_sampleable_skips_members_that_are_not_ready():
    rb = ReplayBufferEnsemble(
        storages=[LazyTensorStorage(20), LazyTensorStorage(20)],
        samplers=[SamplerWithoutReplacement(drop_last=True), RandomSampler()],
        p="sampleable", num_buffer_sampled=2, batch_size=8, routing_key="task",
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    rb.extend(_records([0, 0, 0] + [1] * 5))  # member 0 holds 3 items: fewer than a sub-batch of 4
    for _ in range(20):
        assert rb.sample()["buffer_ids"].unique().tolist() == [1]


# -- sharing --------------------------------------------------------------------------------------------------
def _write_routed_in_child(rb: ReplayBufferEnsemble) -> None:
    rb.extend(_records([1, 0, 1], start=100.0))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_shared_ensemble_receives_routed_writes_of_another_process():
    rb = _routed(2, shared=True)
    assert all(member.storage.is_shared for member in rb.buffers)
    rb.extend(_records([0, 1]))  # the lazy storages are built (in shared memory) before the child starts
    child = mp.get_context("fork").Process(target=_write_routed_in_child, args=(rb,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert rb[0][:]["obs"].tolist() == [0.0, 101.0]
    assert rb[1][:]["obs"].tolist() == [1.0, 100.0, 102.0]


# -- sub-ensembles ------------------------------------------------------------------------------------------
class TestSubEnsembles:
    def test_a_slice_of_a_buffer_ensemble_keeps_its_configuration(self):
        rb = _routed(3, p=[0.0, 1.0, 3.0], num_buffer_sampled=2, batch_size=4)
        rb.extend(_records([0, 1, 2, 1, 2]))
        sub = rb[1:]
        assert isinstance(sub, ReplayBufferEnsemble) and sub.buffers == rb.buffers[1:]
        assert sub.sampler.p.tolist() == [0.25, 0.75] and sub.routing_key == "task" and sub.batch_size == 4
        assert set(sub.sample()["buffer_ids"].unique().tolist()) <= {0, 1}
        meta = sub.extend(_records([1, 0]))  # routed within the sub-ensemble: its member 1 is rb[2]
        assert meta["index"].tolist() == [2, 2] and len(rb[2]) == 3 and len(rb[1]) == 3
        assert rb[[2, 0]].buffers == [rb[2], rb[0]]

    def test_sampleable_is_kept_and_tuples_read_a_member(self):
        rb = _routed(2, p="sampleable")
        rb.extend(_records([0, 1, 1]))
        assert rb[:1].sampler.p == "sampleable"
        assert rb[1, 1]["obs"].item() == 2.0 and rb[(0,)] is rb[0]

    def test_sampler_and_writer_ensembles_slice_too(self):
        samplers = SamplerEnsemble(RandomSampler(), RandomSampler(), RandomSampler(), p=[1.0, 1.0, 2.0])
        sub = samplers[torch.tensor([0, 2])]
        assert isinstance(sub, SamplerEnsemble) and sub.p.tolist() == [1 / 3, 2 / 3] and sub[1] is samplers[2]
        everything = SamplerEnsemble(RandomSampler(), RandomSampler(), sample_from_all=True)
        assert everything[:1].sample_from_all and len(everything[:1]) == 1
        writers = WriterEnsemble(RoundRobinWriter(), RoundRobinWriter())
        assert isinstance(writers[1:], WriterEnsemble) and writers[1:][0] is writers[1]

    @pytest.mark.parametrize("item", ["a", 0.5, [0.5], (slice(None), 0)])
    def test_bad_selections(self, item):
        with pytest.raises(TypeError):
            _routed(2)[item]
