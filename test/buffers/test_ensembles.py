"""Tests of StorageEnsemble, SamplerEnsemble, WriterEnsemble and ReplayBufferEnsemble."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers.assertions import CHI2_999, chi2
from helpers.factories import make_buffer
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from torchrl.data.replay_buffers.replay_buffers import ReplayBuffer, TensorDictReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.ensemble import ReplayBufferEnsemble
from torchrl.data.replay_buffers.samplers import RandomSampler, Sampler, SamplerWithoutReplacement
from torchrl.data.replay_buffers.samplers.ensemble import SamplerEnsemble
from torchrl.data.replay_buffers.storages import LazyTensorStorage, ListStorage
from torchrl.data.replay_buffers.storages.ensemble import StorageEnsemble
from torchrl.data.replay_buffers.writers import RoundRobinWriter
from torchrl.data.replay_buffers.writers.ensemble import WriterEnsemble


def _filled_storage(n: int, value: float, cls=LazyTensorStorage, capacity: int = 50):
    storage = cls(capacity)
    storage.set(torch.arange(n), TensorDict(obs=torch.full((n, 2), value), batch_size=[n]))
    return storage


def _td_buffer(n: int, origin: int, *, sampler=None, capacity: int = 100, **kwargs) -> TensorDictReplayBuffer:
    data = TensorDict(
        obs=torch.arange(n, dtype=torch.float32).unsqueeze(-1) + 1000 * origin,
        origin=torch.full((n,), origin),
        batch_size=[n],
    )
    sampler = sampler or RandomSampler()
    return make_buffer(cls=TensorDictReplayBuffer, capacity=capacity, sampler=sampler, data=data, **kwargs)


class _InfoSampler(RandomSampler):
    """A stateless sampler that reports a per-item info entry (like a prioritized sampler's weights)."""

    def sample(self, storage, batch_size):
        index, info = super().sample(storage, batch_size)
        info["weight"] = index.float() / 10
        return index, info


# -- StorageEnsemble -----------------------------------------------------------------------------------------
class TestStorageEnsemble:
    def test_get_returns_buffer_id_and_data_per_sub_batch(self):
        members = []
        for bid in range(2):
            storage = LazyTensorStorage(10)
            storage.set(torch.arange(5), TensorDict(obs=torch.arange(5.0) + 100 * bid, batch_size=[5]))
            members.append(storage)
        ensemble = StorageEnsemble(*members)
        index = TensorDict(buffer_ids=torch.tensor([1, 0, 1]), index=torch.tensor([[0, 4], [1, 2], [3, 3]]),
                           batch_size=[3])
        out = ensemble.get(index)
        assert [bid for bid, _ in out] == [1, 0, 1]
        for (bid, data), rows in zip(out, index["index"]):
            assert data.batch_size == (2,)
            assert torch.equal(data["obs"], rows.float() + 100 * bid)

    def test_member_transforms_and_list_storage_collate(self):
        def double(td):
            td["obs"] = td["obs"] * 2
            return td

        listed = ListStorage(10)
        listed.set([0, 1], [TensorDict(obs=torch.ones(2)), TensorDict(obs=torch.ones(2) * 3)])
        ensemble = StorageEnsemble(_filled_storage(3, 1.0), listed, transforms=[None, double])
        rows = torch.tensor([[0, 1], [0, 1]])
        index = TensorDict(buffer_ids=torch.tensor([0, 1]), index=rows, batch_size=[2])
        (_, a), (_, b) = ensemble.get(index)
        assert a["obs"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
        assert isinstance(b, TensorDictBase) and b["obs"][:, 0].tolist() == [2.0, 6.0]

    def test_ndim_2_member_reads_flat_positions(self):
        grid = LazyTensorStorage(12, ndim=2)
        grid.set(torch.arange(4), TensorDict(obs=torch.arange(12.0).reshape(4, 3), batch_size=[4, 3]))
        ensemble = StorageEnsemble(grid)
        index = TensorDict(buffer_ids=torch.tensor([0]), index=torch.tensor([[0, 5, 11]]), batch_size=[1])
        [(_, data)] = ensemble.get(index)
        assert data["obs"].tolist() == [0.0, 5.0, 11.0]

    def test_indexing_and_len(self):
        members = [_filled_storage(1, float(i)) for i in range(3)]
        ensemble = StorageEnsemble(*members)
        assert len(ensemble) == 3
        assert ensemble[1] is members[1] and ensemble[-1] is members[2]
        assert ensemble[torch.tensor(0)] is members[0]
        sub = ensemble[1:]
        assert isinstance(sub, StorageEnsemble) and sub.storages == members[1:]
        assert ensemble[[2, 0]].storages == [members[2], members[0]]
        assert list(ensemble) == members
        with pytest.raises(IndexError, match="out of range"):
            ensemble[3]
        with pytest.raises(TypeError, match="int"):
            ensemble["a"]

    @pytest.mark.parametrize("call", ["set", "setitem", "add", "extend", "empty"])
    def test_writes_are_refused(self, call):
        ensemble = StorageEnsemble(_filled_storage(1, 0.0))
        data = TensorDict(obs=torch.zeros(1, 2), batch_size=[1])
        calls = {
            "set": lambda: ensemble.set(torch.arange(1), data),
            "setitem": lambda: ensemble.__setitem__(0, data[0]),
            "add": lambda: ensemble.add(data[0]),
            "extend": lambda: ensemble.extend(data),
            "empty": lambda: ensemble._empty(),
        }
        with pytest.raises(RuntimeError, match="write into the member buffers"):
            calls[call]()

    def test_state_dict_round_trip(self):
        a = StorageEnsemble(_filled_storage(3, 1.0), _filled_storage(2, 2.0))
        b = StorageEnsemble(LazyTensorStorage(50), LazyTensorStorage(50))
        b.load_state_dict(a.state_dict())
        assert len(b[0]) == 3 and len(b[1]) == 2
        assert (b[1].get(torch.arange(2))["obs"] == 2).all()
        with pytest.raises(ValueError, match="same members"):
            StorageEnsemble(LazyTensorStorage(5)).load_state_dict(a.state_dict())

    @pytest.mark.parametrize(
        "args, kwargs, error, match",
        [
            ((), {}, ValueError, "at least one"),
            (("not a storage",), {}, TypeError, "Member 0.*Storage.*str"),
            ((LazyTensorStorage(2),) * 2, {"transforms": [None]}, ValueError, "`transforms`.*2"),
            ((LazyTensorStorage(2),), {"transforms": "abc"}, TypeError, "`transforms`"),
            ((LazyTensorStorage(2),), {"transforms": [3]}, TypeError, "`transform`"),
            ((LazyTensorStorage(2),), {"collate_fns": [3]}, TypeError, "`collate_fns\\[0\\]`"),
        ],
    )
    def test_bad_arguments(self, args, kwargs, error, match):
        with pytest.raises(error, match=match):
            StorageEnsemble(*args, **kwargs)

    def test_get_needs_an_ensemble_index(self):
        with pytest.raises(TypeError, match="SamplerEnsemble.sample"):
            StorageEnsemble(_filled_storage(2, 0.0)).get(torch.tensor([0, 1]))


# -- SamplerEnsemble -----------------------------------------------------------------------------------------
def _storages(n: int, size: int = 20) -> StorageEnsemble:
    return StorageEnsemble(*(_filled_storage(size, float(i)) for i in range(n)))


class TestSamplerEnsemble:
    @pytest.mark.parametrize("p", [[0.1, 0.3, 0.6], [2.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    def test_buffer_frequencies_follow_p(self, p):
        sampler = SamplerEnsemble(*(RandomSampler() for _ in range(3)), p=p, num_buffer_sampled=20)
        sampler._rng = torch.Generator().manual_seed(0)
        storage = _storages(3)
        counts = torch.zeros(3)
        for _ in range(300):
            index, info = sampler.sample(storage, 20)
            counts += torch.bincount(index["buffer_ids"], minlength=3)
        target = torch.tensor(p, dtype=torch.float64) / sum(p)
        support = target > 0
        assert counts[~support].sum() == 0
        df = int(support.sum()) - 1
        assert chi2(counts[support].double(), target[support]) < CHI2_999[df]
        # the test has power: the same counts are far from uniform over the 3 buffers
        uniform = torch.full((3,), 1.0 / 3, dtype=torch.float64)
        assert chi2(counts.double(), uniform) > 10 * CHI2_999[2]

    def test_uniform_choice_without_p(self):
        sampler = SamplerEnsemble(*(RandomSampler() for _ in range(4)), num_buffer_sampled=8)
        sampler._rng = torch.Generator().manual_seed(1)
        storage = _storages(4)
        counts = torch.zeros(4)
        for _ in range(250):
            counts += torch.bincount(sampler.sample(storage, 16)[0]["buffer_ids"], minlength=4)
        assert chi2(counts.double(), torch.full((4,), 0.25, dtype=torch.float64)) < CHI2_999[3]

    @pytest.mark.parametrize("n, batch_size", [(2, 8), (3, 9), (4, 4)])
    def test_sample_from_all_gives_each_buffer_an_equal_share(self, n, batch_size):
        sampler = SamplerEnsemble(*(RandomSampler() for _ in range(n)), sample_from_all=True)
        index, info = sampler.sample(_storages(n), batch_size)
        assert index["buffer_ids"].tolist() == list(range(n))
        assert index["index"].shape == (n, batch_size // n)
        assert info["buffer_ids"].tolist() == list(range(n))
        assert len(info["member_info"]) == n

    def test_same_generator_state_same_draw(self):
        def draw():
            sampler = SamplerEnsemble(RandomSampler(), SamplerWithoutReplacement(), p=[0.5, 0.5])
            sampler._rng = torch.Generator().manual_seed(7)
            storage = _storages(2)
            return [sampler.sample(storage, 6)[0] for _ in range(5)]

        for a, b in zip(draw(), draw()):
            assert (a == b).all()

    def test_generator_propagates_to_members_only_when_set(self):
        own = torch.Generator().manual_seed(0)
        member = RandomSampler()
        member._rng = own
        sampler = SamplerEnsemble(member, RandomSampler())
        sampler._rng = None
        assert member._rng is own
        g = torch.Generator()
        sampler._rng = g
        assert member._rng is g and sampler[1]._rng is g

    def test_requires_shared_state_when_any_member_does(self):
        assert SamplerEnsemble(RandomSampler(), RandomSampler()).requires_shared_state is False
        assert SamplerEnsemble(RandomSampler(), SamplerWithoutReplacement()).requires_shared_state is True

    def test_state_dict_holds_member_states_and_round_trips(self):
        storage = _storages(2, size=10)
        a = SamplerEnsemble(SamplerWithoutReplacement(), SamplerWithoutReplacement(), sample_from_all=True)
        a._rng = torch.Generator().manual_seed(3)
        a.sample(storage, 4)
        state = a.state_dict()
        assert set(state) == {"0", "1"} and len(state["0"]["_sample_list"]) == state["0"]["len_storage"] - 2
        b = SamplerEnsemble(SamplerWithoutReplacement(), SamplerWithoutReplacement(), sample_from_all=True)
        b.load_state_dict(pickle.loads(pickle.dumps(state)))
        for _ in range(4):  # sample_from_all draws no randomness for the choice: only member states matter
            assert (a.sample(storage, 4)[0] == b.sample(storage, 4)[0]).all()
        with pytest.raises(ValueError, match="same members"):
            SamplerEnsemble(RandomSampler()).load_state_dict(state)

    def test_ran_out_when_a_member_finishes_its_epoch(self):
        sampler = SamplerEnsemble(SamplerWithoutReplacement(), sample_from_all=True)
        storage = _storages(1, size=4)
        sampler.sample(storage, 2)
        assert not sampler.ran_out
        sampler.sample(storage, 2)
        assert sampler.ran_out
        sampler.ran_out = False
        assert not sampler.ran_out and not sampler[0].ran_out

    def test_ragged_sub_batches_give_a_lazy_index(self):
        sampler = SamplerEnsemble(SamplerWithoutReplacement(), RandomSampler(), sample_from_all=True)
        storage = StorageEnsemble(_filled_storage(5, 0.0), _filled_storage(5, 1.0))
        sampler.sample(storage, 8)  # member 0 gives 4 of its 5 items
        index, _ = sampler.sample(storage, 8)  # then the remaining 1
        assert index[0]["index"].numel() == 1 and index[1]["index"].numel() == 4
        assert [bid for bid, _ in storage.get(index)] == [0, 1]

    def test_pickling_drops_the_generator(self):
        sampler = SamplerEnsemble(RandomSampler(), RandomSampler())
        sampler._rng = torch.Generator()
        copy = pickle.loads(pickle.dumps(sampler))
        assert copy._rng is None and len(copy) == 2

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"p": [0.5, 0.5], "sample_from_all": True}, ValueError, "`p` and sample_from_all"),
            ({"p": [1.0]}, ValueError, "`p`.*one probability per member \\(2\\), got 1"),
            ({"p": [1.0, -1.0]}, ValueError, "`p`.*non-negative"),
            ({"p": [0.0, 0.0]}, ValueError, "`p`.*positive sum"),
            ({"p": [float("nan"), 1.0]}, ValueError, "`p`.*finite"),
            ({"p": "ab"}, TypeError, "`p`"),
            ({"p": 0.5}, TypeError, "`p`"),
            ({"num_buffer_sampled": 0}, ValueError, "`num_buffer_sampled`"),
            ({"num_buffer_sampled": True}, ValueError, "`num_buffer_sampled`"),
            ({"num_buffer_sampled": 3, "sample_from_all": True}, ValueError, "`num_buffer_sampled`=3"),
            ({"sample_from_all": 1}, TypeError, "`sample_from_all`"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        with pytest.raises(error, match=match):
            SamplerEnsemble(RandomSampler(), RandomSampler(), **kwargs)

    def test_bad_members(self):
        with pytest.raises(ValueError, match="at least one"):
            SamplerEnsemble()
        with pytest.raises(TypeError, match="Member 1.*Sampler"):
            SamplerEnsemble(RandomSampler(), object())

    def test_p_is_normalized(self):
        assert SamplerEnsemble(RandomSampler(), RandomSampler(), p=[1, 3]).p.tolist() == [0.25, 0.75]

    @pytest.mark.parametrize(
        "storage, batch_size, error, match",
        [
            ("ensemble", 5, ValueError, "`batch_size`=5 is not divisible by `num_buffer_sampled`=2"),
            ("ensemble", 0, ValueError, "`batch_size`"),
            ("plain", 4, TypeError, "StorageEnsemble"),
            ("short", 4, ValueError, "match one to one"),
        ],
    )
    def test_bad_sample_calls(self, storage, batch_size, error, match):
        storages = {"ensemble": _storages(2), "plain": _filled_storage(3, 0.0), "short": _storages(1)}
        with pytest.raises(error, match=match):
            SamplerEnsemble(RandomSampler(), RandomSampler()).sample(storages[storage], batch_size)

    def test_priority_updates_and_empty_go_through_members(self):
        sampler = SamplerEnsemble(RandomSampler())
        with pytest.raises(RuntimeError, match="member buffers"):
            sampler.update_priority(torch.tensor([0]), torch.tensor([1.0]))
        with pytest.raises(RuntimeError, match="member buffers"):
            sampler._empty()
        with pytest.raises(TypeError, match="int"):
            sampler["0"]


# -- WriterEnsemble ------------------------------------------------------------------------------------------
class TestWriterEnsemble:
    def test_writes_are_refused_and_state_covers_members(self):
        w0, w1 = RoundRobinWriter(), RoundRobinWriter()
        w0.register_storage(LazyTensorStorage(10))
        w0.extend(torch.arange(4))
        ensemble = WriterEnsemble(w0, w1)
        assert len(ensemble) == 2 and ensemble[0] is w0 and ensemble[-1] is w1
        assert ensemble.write_count == 4
        for call in (lambda: ensemble.add(torch.zeros(())), lambda: ensemble.extend(torch.zeros(2))):
            with pytest.raises(RuntimeError, match="write into the member buffers"):
                call()
        with pytest.raises(RuntimeError, match="empty the member buffers"):
            ensemble._empty()
        state = ensemble.state_dict()
        assert state["0"] == {"_cursor": 4, "_write_count": 4}
        copy = WriterEnsemble(RoundRobinWriter(), RoundRobinWriter())
        copy.load_state_dict(state)
        assert copy[0].cursor == 4 and copy.write_count == 4

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="at least one"):
            WriterEnsemble()
        with pytest.raises(TypeError, match="Member 0.*Writer"):
            WriterEnsemble(RandomSampler())
        with pytest.raises(ValueError, match="same members"):
            WriterEnsemble(RoundRobinWriter()).load_state_dict({"0": {}, "1": {}})
        with pytest.raises(IndexError):
            WriterEnsemble(RoundRobinWriter())[1]
        with pytest.raises(TypeError, match="int"):
            WriterEnsemble(RoundRobinWriter())[0.5]


# -- ReplayBufferEnsemble ------------------------------------------------------------------------------------
class TestReplayBufferEnsemble:
    def test_buffer_ids_and_index_match_the_origin_of_each_item(self):
        members = [_td_buffer(30, origin) for origin in range(3)]
        rb = ReplayBufferEnsemble(*members, num_buffer_sampled=4, batch_size=16,
                                  generator=torch.Generator().manual_seed(0))
        for _ in range(20):
            batch, info = rb.sample(return_info=True)
            assert batch.batch_size == (4, 4)
            assert (batch["buffer_ids"] == batch["origin"]).all()
            for row in range(4):
                bid = int(batch["buffer_ids"][row, 0])
                assert (batch["buffer_ids"][row] == bid).all()
                stored = rb[bid].storage.get(batch["index", "index"][row])
                assert torch.equal(stored["obs"], batch["obs"][row])
            assert torch.equal(info["buffer_ids"], batch["buffer_ids"][:, 0])
            assert torch.equal(batch["index", "buffer_ids"], batch["buffer_ids"])  # TorchRL's layout
            assert info["index"].batch_size == (4,)

    def test_frequencies_follow_p_through_the_buffer(self):
        p = [0.2, 0.8]
        rb = ReplayBufferEnsemble(_td_buffer(10, 0), _td_buffer(10, 1), p=p, num_buffer_sampled=10,
                                  batch_size=10, generator=torch.Generator().manual_seed(5))
        counts = torch.zeros(2)
        for _ in range(200):
            counts += torch.bincount(rb.sample()["origin"][:, 0], minlength=2)
        assert chi2(counts.double(), torch.tensor(p, dtype=torch.float64)) < CHI2_999[1]
        assert chi2(counts.double(), torch.tensor([0.5, 0.5], dtype=torch.float64)) > 10 * CHI2_999[1]

    def test_sample_from_all_gives_each_buffer_its_share(self):
        rb = ReplayBufferEnsemble(*(_td_buffer(10, i) for i in range(3)), sample_from_all=True, batch_size=12)
        batch = rb.sample()
        assert batch.batch_size == (3, 4)
        assert batch["origin"].tolist() == [[0] * 4, [1] * 4, [2] * 4]

    def test_members_with_different_keys_give_a_lazy_stack(self):
        a = _td_buffer(10, 0)
        b = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        b.extend(TensorDict(pixels=torch.ones(10, 3), batch_size=[10]))
        rb = ReplayBufferEnsemble(a, b, sample_from_all=True, batch_size=6)
        batch = rb.sample()
        assert isinstance(batch, LazyStackedTensorDict) and batch.batch_size == (2, 3)
        assert batch["buffer_ids"].tolist() == [[0, 0, 0], [1, 1, 1]]
        assert "obs" in batch[0].keys() and "pixels" in batch[1].keys()

    def test_member_info_and_transforms_are_applied(self):
        def scale(td):
            td["obs"] = td["obs"] * -1
            return td

        a = _td_buffer(10, 0, sampler=_InfoSampler(), transform=scale)
        b = _td_buffer(10, 1, sampler=_InfoSampler())
        rb = ReplayBufferEnsemble(a, b, sample_from_all=True, batch_size=8,
                                  transform=lambda td: td.set("seen", torch.ones(td.shape)))
        batch = rb.sample()
        assert torch.equal(batch["weight"], batch["index", "index"].float() / 10)
        assert (batch["obs"][0] <= 0).all() and (batch["obs"][1] >= 1000).all()
        assert (batch["seen"] == 1).all()

    def test_ragged_sub_batches_from_an_epoch_end(self):
        a = _td_buffer(5, 0, sampler=SamplerWithoutReplacement())
        rb = ReplayBufferEnsemble(a, _td_buffer(5, 1), sample_from_all=True, batch_size=8)
        rb.sample()
        batch = rb.sample()
        assert batch[0]["obs"].shape == (1, 1) and batch[1]["obs"].shape == (4, 1)
        assert batch[0]["buffer_ids"].tolist() == [0]

    def test_tensor_members_stack_and_report_buffer_ids_in_info(self):
        members = []
        for i in range(2):
            rb = ReplayBuffer(storage=LazyTensorStorage(10))
            rb.extend(torch.full((10,), i))
            members.append(rb)
        rb = ReplayBufferEnsemble(*members, num_buffer_sampled=2, batch_size=6)
        data, info = rb.sample(return_info=True)
        assert data.shape == (2, 3)
        assert torch.equal(data[:, 0], info["buffer_ids"])

    def test_list_storage_members(self):
        members = []
        for i in range(2):
            rb = ReplayBuffer(storage=ListStorage(10))
            rb.extend([TensorDict(obs=torch.tensor([float(i)])) for _ in range(5)])
            members.append(rb)
        batch = ReplayBufferEnsemble(*members, sample_from_all=True, batch_size=4).sample()
        assert batch.batch_size == (2, 2)
        assert torch.equal(batch["obs"].squeeze(-1), batch["buffer_ids"].float())

    def test_ndim_2_member_index_is_per_dim(self):
        grid = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2))
        grid.extend(TensorDict(obs=torch.arange(12.0).reshape(4, 3), batch_size=[4, 3]))
        rb = ReplayBufferEnsemble(grid, batch_size=5)
        batch = rb.sample()
        assert batch["index", "index"].shape == (1, 5, 2)
        rows, cols = batch["index", "index"][0].unbind(-1)
        assert torch.equal(batch["obs"][0], grid.storage.get((rows, cols))["obs"])

    def test_getitem_len_and_write_count(self):
        members = [_td_buffer(3, i) for i in range(3)]
        rb = ReplayBufferEnsemble(*members)
        assert len(rb) == 3 and rb[0] is members[0] and rb[-1] is members[2]
        assert rb.buffers == members
        assert rb.write_count == 9
        with pytest.raises(IndexError, match="out of range"):
            rb[3]
        with pytest.raises(TypeError, match="int"):
            rb["obs"]

    @pytest.mark.parametrize("call", ["add", "extend", "setitem", "empty", "update_priority"])
    def test_writes_name_the_member_buffers(self, call):
        rb = ReplayBufferEnsemble(_td_buffer(3, 0))
        td = TensorDict(obs=torch.zeros(2, 1), origin=torch.zeros(2, dtype=torch.long), batch_size=[2])
        calls = {
            "add": lambda: rb.add(td[0]),
            "extend": lambda: rb.extend(td),
            "setitem": lambda: rb.__setitem__(0, td[0]),
            "empty": lambda: rb.empty(),
            "update_priority": lambda: rb.update_priority(torch.tensor([0]), torch.tensor([1.0])),
        }
        with pytest.raises(RuntimeError, match="member buffers"):
            calls[call]()

    def test_requires_shared_state_follows_members(self):
        assert not ReplayBufferEnsemble(_td_buffer(3, 0), _td_buffer(3, 1)).sampler.requires_shared_state
        stateful = _td_buffer(3, 1, sampler=SamplerWithoutReplacement())
        assert ReplayBufferEnsemble(_td_buffer(3, 0), stateful).sampler.requires_shared_state

    def test_same_seed_same_batches(self):
        def batches():
            members = [_td_buffer(20, i) for i in range(3)]
            rb = ReplayBufferEnsemble(*members, p=[0.2, 0.3, 0.5], num_buffer_sampled=2, batch_size=6,
                                      generator=torch.Generator().manual_seed(11))
            return [rb.sample() for _ in range(5)]

        for a, b in zip(batches(), batches()):
            assert torch.equal(a["obs"], b["obs"]) and torch.equal(a["buffer_ids"], b["buffer_ids"])

    def test_iteration_stops_when_a_member_epoch_ends(self):
        rb = ReplayBufferEnsemble(_td_buffer(6, 0, sampler=SamplerWithoutReplacement()), batch_size=2)
        assert len(list(rb)) == 3

    def test_state_dict_round_trip(self):
        def build(filled: bool):
            members = [
                _td_buffer(10, 0, sampler=SamplerWithoutReplacement()) if filled else TensorDictReplayBuffer(
                    storage=LazyTensorStorage(100), sampler=SamplerWithoutReplacement()),
                _td_buffer(10, 1) if filled else TensorDictReplayBuffer(storage=LazyTensorStorage(100)),
            ]
            return ReplayBufferEnsemble(*members, batch_size=4, generator=torch.Generator().manual_seed(2))

        a, b = build(True), build(False)
        a.sample()
        b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
        assert len(b[0]) == 10 and b[0].write_count == 10
        for _ in range(4):
            assert torch.equal(a.sample()["obs"], b.sample()["obs"])
        with pytest.raises(ValueError, match="same members"):
            ReplayBufferEnsemble(_td_buffer(1, 0)).load_state_dict(a.state_dict())

    def test_pickling_keeps_members_wired_and_generator_state(self):
        members = [_td_buffer(10, i, sampler=SamplerWithoutReplacement()) for i in range(2)]
        rb = ReplayBufferEnsemble(*members, num_buffer_sampled=2, batch_size=4,
                                  generator=torch.Generator().manual_seed(4))
        rb.sample()
        copy = pickle.loads(pickle.dumps(rb))
        assert copy.storage[0] is copy[0].storage and copy.sampler[1] is copy[1].sampler
        assert copy.sampler[0]._rng is copy._rng
        for _ in range(3):
            assert torch.equal(rb.sample()["obs"], copy.sample()["obs"])
        new = TensorDict(obs=torch.zeros(1, 1), origin=torch.zeros(1, dtype=torch.long), batch_size=[1])
        copy[0].extend(new)
        assert len(copy[0]) == 11 and len(rb[0]) == 10

    @pytest.mark.parametrize(
        "args, kwargs, error, match",
        [
            ((), {}, ValueError, "at least one"),
            (("rb",), {}, TypeError, "Member 0.*ReplayBuffer"),
            ((None,), {"p": [1.0, 1.0]}, ValueError, "`p`"),
            ((None, None), {"p": [1, 1], "sample_from_all": True}, ValueError, "`p` and sample_from_all"),
            ((None,), {"num_buffer_sampled": -1}, ValueError, "`num_buffer_sampled`"),
            ((None,), {"batch_size": 0}, ValueError, "`batch_size`"),
            ((None,), {"collate_fn": 3}, TypeError, "`collate_fn`"),
        ],
    )
    def test_bad_arguments(self, args, kwargs, error, match):
        args = tuple(_td_buffer(2, 0) if a is None else a for a in args)
        with pytest.raises(error, match=match):
            ReplayBufferEnsemble(*args, **kwargs)

    def test_nesting_is_refused(self):
        inner = ReplayBufferEnsemble(_td_buffer(2, 0))
        with pytest.raises(TypeError, match="nesting"):
            ReplayBufferEnsemble(inner, _td_buffer(2, 1))

    def test_batch_size_must_divide(self):
        rb = ReplayBufferEnsemble(_td_buffer(5, 0), _td_buffer(5, 1))
        with pytest.raises(ValueError, match="`batch_size`=3 is not divisible"):
            rb.sample(3)


def test_member_sampler_is_a_sampler():
    assert isinstance(SamplerEnsemble(RandomSampler()), Sampler)


# -- SamplerEnsemble(p="sampleable") (issue 14): buffers weighed by the items their samplers can draw now ----------
def _ensemble_of(*lengths: int) -> StorageEnsemble:
    members = []
    for n in lengths:
        storage = LazyTensorStorage(100)
        if n:
            storage.set(torch.arange(n), torch.arange(n))
        members.append(storage)
    return StorageEnsemble(*members)


def test_buffers_are_chosen_in_proportion_to_their_items():
    storage = _ensemble_of(10, 30, 0)
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), RandomSampler(), p="sampleable", num_buffer_sampled=4)
    sampler._rng = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    for _ in range(1000):
        index, info = sampler.sample(storage, 8)
        counts.index_add_(0, info["buffer_ids"], torch.ones(4))
    assert counts[2] == 0  # an empty member is never chosen
    share = counts[1] / counts.sum()
    assert abs(float(share) - 0.75) < 0.03  # 4000 draws: 3 standard deviations ~ 0.02


def test_the_weights_follow_the_members_as_they_fill():
    storage = _ensemble_of(5, 0)
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), p="sampleable", num_buffer_sampled=2)
    assert sampler.sample(storage, 2)[1]["buffer_ids"].tolist() == [0, 0]
    storage[0].set(torch.arange(5), torch.arange(5))  # unchanged length
    storage[1].set(torch.arange(50), torch.arange(50))
    seen = {i for _ in range(50) for i in sampler.sample(storage, 2)[1]["buffer_ids"].tolist()}
    assert seen == {0, 1}


def test_a_member_sampler_with_num_sampleable_sets_its_weight():
    class HalfDrawable(RandomSampler):
        def num_sampleable(self, storage=None):
            return 0  # e.g. a consuming sampler that has consumed everything

    storage = _ensemble_of(20, 20)
    sampler = SamplerEnsemble(HalfDrawable(), RandomSampler(), p="sampleable", num_buffer_sampled=2)
    for _ in range(20):
        assert sampler.sample(storage, 4)[1]["buffer_ids"].tolist() == [1, 1]


def test_sampleable_through_a_buffer_ensemble_and_its_accessors():
    rbs = [ReplayBuffer(storage=LazyTensorStorage(10)) for _ in range(2)]
    rbs[0].extend(torch.arange(4))
    ens = ReplayBufferEnsemble(*rbs, p="sampleable", num_buffer_sampled=2, batch_size=4)
    batch = ens.sample()
    assert len(batch) == 2  # two sub-batches, both from the only non-empty member
    assert ens.sampler.p == "sampleable"
    assert "p='sampleable'" in repr(ens.sampler)
    assert pickle.loads(pickle.dumps(ens.sampler)).p == "sampleable"


def test_sampleable_errors():
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), p="sampleable")
    with pytest.raises(RuntimeError, match='p="sampleable".*nothing to draw'):
        sampler.sample(_ensemble_of(0, 0), 2)
    with pytest.raises(ValueError, match="exclusive"):
        SamplerEnsemble(RandomSampler(), p="sampleable", sample_from_all=True)
    with pytest.raises(TypeError, match='"sampleable"'):
        SamplerEnsemble(RandomSampler(), RandomSampler(), p="uniform")
