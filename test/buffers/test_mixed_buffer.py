"""MixedReplayBuffer: N buffers in exact per-batch proportions (issue 27 item 3, beyond TorchRL).

Invariants checked batch by batch: the rows of member ``i`` (counted by a source tag) are exactly the
largest-remainder split of the batch; proportions set between batches are followed, also by DataLoader workers;
state_dict and checkpoints keep the proportions and every member's state.
"""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    MixedReplayBuffer,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    largest_remainder_counts,
)


def _rows(n: int, member: int) -> TensorDict:
    return TensorDict(obs=torch.arange(n) + 1000 * member, batch_size=[n])


def _members(sizes=(30, 30, 30), cls=ReplayBuffer, **kwargs) -> list:
    out = []
    for i, n in enumerate(sizes):
        rb = cls(storage=LazyTensorStorage(50), **kwargs)
        if n:
            rb.extend(_rows(n, i))
        out.append(rb)
    return out


def _origin(batch) -> list[int]:
    return (batch["obs"] // 1000).tolist()


# -- largest remainder ---------------------------------------------------------------------------------------------
def _reference(weights, total):
    """Hamilton's method, written independently: quotas, floors, then the largest remainders (ties: lower index)."""
    s = sum(Fraction(w) for w in weights)
    quotas = [Fraction(w) * total / s for w in weights]
    floors = [int(q) for q in quotas]
    rest = sorted(range(len(weights)), key=lambda i: (floors[i] - quotas[i], i))
    for i in rest[: total - sum(floors)]:
        floors[i] += 1
    return floors


def test_largest_remainder_matches_hamilton_on_random_inputs():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 6)
        weights = [rng.choice([0.0, rng.random(), rng.randint(1, 5)]) for _ in range(n)]
        if sum(weights) == 0:
            weights[0] = 1.0
        total = rng.randint(0, 40)
        counts = largest_remainder_counts(weights, total)
        assert counts == _reference(weights, total)
        assert sum(counts) == total
        s = sum(weights)
        for w, c in zip(weights, counts):
            assert abs(c - w * total / s) < 1 + 1e-9
            if w == 0:
                assert c == 0


def test_largest_remainder_examples_and_ties():
    assert largest_remainder_counts([1, 1, 1], 10) == [4, 3, 3]
    assert largest_remainder_counts([1, 1], 5) == [3, 2]  # a tie goes to the lower index
    assert largest_remainder_counts([0.5, 0.3, 0.2], 7) == [4, 2, 1]
    assert largest_remainder_counts([0.1, 0.2, 0.7], 10) == [1, 2, 7]  # no float error moves a row
    assert largest_remainder_counts([0, 1], 3) == [0, 3]


@pytest.mark.parametrize(
    "weights,total,error",
    [([], 3, ValueError), ([0, 0], 3, ValueError), ([-1, 2], 3, ValueError), ([1, float("nan")], 3, ValueError),
     ([1, True], 3, TypeError), ("ab", 3, TypeError), ([1, 1], -1, ValueError), ([1, 1], 1.5, TypeError)],
)  # fmt: skip
def test_largest_remainder_rejects_bad_input(weights, total, error):
    with pytest.raises(error):
        largest_remainder_counts(weights, total)


# -- exact batches ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [ReplayBuffer, TensorDictReplayBuffer])
def test_every_batch_has_the_exact_counts(cls):
    mixer = MixedReplayBuffer(_members(cls=cls), [0.5, 0.3, 0.2], batch_size=7, source_key="source")
    for _ in range(50):
        batch = mixer.sample()
        assert batch["source"].tolist() == [0] * 4 + [1] * 2 + [2] * 1
        assert _origin(batch) == batch["source"].tolist()  # the tag says where each row comes from
    for batch_size in range(1, 20):
        counts = largest_remainder_counts([0.5, 0.3, 0.2], batch_size)
        batch = mixer.sample(batch_size)
        assert [_origin(batch).count(i) for i in range(3)] == counts == mixer.counts(batch_size)


def test_set_proportions_between_batches_is_followed():
    mixer = MixedReplayBuffer(_members(), batch_size=10, source_key="source")
    schedule = [[1, 1, 1], [0, 1, 0], [0.7, 0.2, 0.1], [5, 0, 5], [1e-9, 1, 1]]
    for proportions in schedule:
        mixer.set_proportions(proportions)
        expected = largest_remainder_counts(proportions, 10)
        for _ in range(3):
            assert torch.bincount(mixer.sample()["source"], minlength=3).tolist() == expected
    total = sum(schedule[-1])
    assert mixer.proportions == pytest.approx([w / total for w in schedule[-1]])


def test_set_proportions_validates_before_changing():
    mixer = MixedReplayBuffer(_members(), [1, 2, 1])
    before = mixer.proportions
    for bad in ([1, 2], [0, 0, 0], [1, -1, 1], [1, float("inf"), 1], "abc", {0: 1}):
        with pytest.raises((ValueError, TypeError)):
            mixer.set_proportions(bad)
    assert mixer.proportions == before


def test_an_empty_member_gives_its_share_to_the_others():
    mixer = MixedReplayBuffer(_members((30, 0, 30)), [0.5, 0.25, 0.25], batch_size=8, source_key="source")
    assert mixer.counts() == largest_remainder_counts([0.5, 0, 0.25], 8) == [5, 0, 3]
    assert torch.bincount(mixer.sample()["source"], minlength=3).tolist() == [5, 0, 3]
    mixer.buffers[1].extend(_rows(4, 1))
    assert mixer.counts() == [4, 2, 2]


def test_skip_empty_false_raises_for_an_empty_member():
    mixer = MixedReplayBuffer(_members((30, 0)), batch_size=4, skip_empty=False)
    with pytest.raises(RuntimeError, match="member 1 .* is empty"):
        mixer.sample()


def test_everything_empty_raises():
    mixer = MixedReplayBuffer(_members((0, 30)), [1, 0], batch_size=4)
    with pytest.raises(RuntimeError, match="every member with a positive proportion is empty"):
        mixer.sample()


def test_index_is_dropped_and_return_info_gives_the_positions():
    members = [_members((30,), cls=TensorDictReplayBuffer)[0], _members((0, 30))[1]]
    mixer = MixedReplayBuffer(members, [0.5, 0.5], batch_size=6)
    batch, info = mixer.sample(return_info=True)
    assert "index" not in batch.keys()
    assert info["counts"] == [3, 3] and info["source"].tolist() == [0, 0, 0, 1, 1, 1]
    assert torch.equal(members[0].storage[info["index"][0]]["obs"], batch["obs"][:3])
    assert torch.equal(members[1].storage[info["index"][1]]["obs"], batch["obs"][3:])


def test_tensor_members_concatenate():
    a, b = ReplayBuffer(storage=LazyTensorStorage(10)), ReplayBuffer(storage=LazyTensorStorage(10))
    a.extend(torch.zeros(10, 2))
    b.extend(torch.ones(10, 2))
    batch = MixedReplayBuffer([a, b], [1, 3], batch_size=4).sample()
    assert batch[:, 0].tolist() == [0.0, 1.0, 1.0, 1.0]


def test_members_with_different_entries_raise_a_key_error():
    a, b = _members((10,))[0], ReplayBuffer(storage=LazyTensorStorage(10))
    b.extend(TensorDict(obs=torch.zeros(3, dtype=torch.long), other=torch.zeros(3), batch_size=[3]))
    with pytest.raises(KeyError, match="same entries"):
        MixedReplayBuffer([a, b], batch_size=4).sample()


def test_source_key_needs_tensordict_batches():
    a = ReplayBuffer(storage=LazyTensorStorage(10))
    a.extend(torch.zeros(10))
    with pytest.raises(TypeError, match="source_key"):
        MixedReplayBuffer([a], batch_size=2, source_key="source").sample()


def test_sample_counts_validates():
    mixer = MixedReplayBuffer(_members((10, 0)), batch_size=4)
    for bad, error in (([1], ValueError), ([0, 0], ValueError), ([-1, 2], ValueError), ([1.5, 1], TypeError),
                       (3, TypeError)):  # fmt: skip
        with pytest.raises(error):
            mixer.sample_counts(bad)
    with pytest.raises(RuntimeError, match="empty"):
        mixer.sample_counts([2, 2])
    assert mixer.sample_counts([3, 0]).shape == torch.Size([3])


def test_without_batch_size():
    mixer = MixedReplayBuffer(_members((10,)))
    with pytest.raises(ValueError, match=r"batch_size must be provided either in __init__ or sample\(\)"):
        mixer.sample()
    assert mixer.sample(3).shape == torch.Size([3])


@pytest.mark.parametrize(
    "args,kwargs,error",
    [
        ((), {}, TypeError),
        (([],), {}, ValueError),
        (("ab",), {}, TypeError),
        (([object()],), {}, TypeError),
        (("dup",), {}, ValueError),
        (("two", [1]), {}, ValueError),
        (("two", [1, -1]), {}, ValueError),
        (("two",), {"batch_size": 0}, ValueError),
        (("two",), {"source_key": 3}, TypeError),
        (("two",), {"skip_empty": 1}, TypeError),
        (("two",), {"transform": 3}, TypeError),
    ],
)
def test_constructor_errors(args, kwargs, error):
    rb = _members((3,))[0]
    mapping = {"dup": [rb, rb], "two": _members((3, 3))}
    args = tuple(mapping.get(a, a) if isinstance(a, str) else a for a in args)
    with pytest.raises(error):
        MixedReplayBuffer(*args, **kwargs)


def test_transform_runs_once_on_the_mixed_batch():
    seen = []
    mixer = MixedReplayBuffer(_members((5, 5)), batch_size=4, transform=lambda b: seen.append(_origin(b)) or b)
    mixer.sample()
    assert seen == [[0, 0, 1, 1]]


def test_repr_len_and_properties():
    members = _members((3, 5))
    mixer = MixedReplayBuffer(members, [1, 3], batch_size=4, source_key=("info", "src"))
    assert len(mixer) == 8 and mixer.num_members == 2 and mixer.buffers == members
    assert mixer.proportions == (0.25, 0.75) and mixer.batch_size == 4 and mixer.source_key == ("info", "src")
    assert repr(mixer) == (
        "MixedReplayBuffer(buffers=[ReplayBuffer, ReplayBuffer], proportions=[0.250, 0.750], batch_size=4, "
        "sizes=[3, 5])"
    )
    assert mixer.sample()["info", "src"].tolist() == [0, 1, 1, 1]


# -- state and checkpoints -------------------------------------------------------------------------------------------
def _seeded_mixer(fill: bool = True, sizes=(20, 20, 20)) -> MixedReplayBuffer:
    members = []
    for i, n in enumerate(sizes):
        rb = ReplayBuffer(storage=LazyTensorStorage(50), generator=torch.Generator().manual_seed(10 + i))
        if fill and n:
            rb.extend(_rows(n, i))
        members.append(rb)
    return MixedReplayBuffer(members, batch_size=6, source_key="source")


def test_state_dict_round_trip_keeps_proportions_contents_and_streams():
    mixer = _seeded_mixer()
    mixer.set_proportions([0.6, 0.3, 0.1])
    mixer.sample()
    fresh = _seeded_mixer(fill=False)
    fresh.load_state_dict(mixer.state_dict())
    assert fresh.proportions == mixer.proportions and len(fresh) == len(mixer)
    for _ in range(3):
        assert torch.equal(fresh.sample()["obs"], mixer.sample()["obs"])


def test_load_state_dict_refuses_a_mismatch_and_changes_nothing():
    mixer = _seeded_mixer()
    state = mixer.state_dict()
    other = _seeded_mixer(fill=False, sizes=(1, 1))
    for bad in ({**state, "version": 9}, {**state, "proportions": [1, -1, 0]}, "x"):
        with pytest.raises(ValueError):
            _seeded_mixer(fill=False).load_state_dict(bad)
    with pytest.raises(ValueError, match="members"):
        other.load_state_dict(state)
    assert len(other) == 0 and other.proportions == (0.5, 0.5)


def test_dumps_loads_round_trip(tmp_path):
    members = [TensorDictReplayBuffer(storage=LazyMemmapStorage(20, scratch_dir=tmp_path / f"m{i}"),
                                      generator=torch.Generator().manual_seed(i)) for i in range(2)]  # fmt: skip
    for i, rb in enumerate(members):
        rb.extend(_rows(20, i))
    mixer = MixedReplayBuffer(members, [0.2, 0.8], batch_size=5, source_key="source")
    mixer.sample()
    mixer.dumps(tmp_path / "ckpt")
    fresh_members = [TensorDictReplayBuffer(storage=LazyMemmapStorage(20, scratch_dir=tmp_path / f"f{i}"),
                                            generator=torch.Generator()) for i in range(2)]  # fmt: skip
    fresh = MixedReplayBuffer(fresh_members, batch_size=5, source_key="source")
    fresh.loads(tmp_path / "ckpt")
    assert fresh.proportions == (0.2, 0.8)
    assert torch.equal(fresh_members[1][:]["obs"], members[1][:]["obs"])
    for _ in range(3):
        assert torch.equal(fresh.sample()["obs"], mixer.sample()["obs"])


def test_loads_refuses_another_member_count_and_changes_nothing(tmp_path):
    mixer = _seeded_mixer()
    mixer.dumps(tmp_path / "ckpt")
    other = _seeded_mixer(fill=False, sizes=(0, 0))
    with pytest.raises(ValueError, match="members"):
        other.loads(tmp_path / "ckpt")
    assert len(other) == 0


def test_loads_checks_every_member_before_loading_any(tmp_path):
    mixer = _seeded_mixer()
    mixer.dumps(tmp_path / "ckpt")
    members = [ReplayBuffer(storage=LazyTensorStorage(50)), ReplayBuffer(storage=LazyTensorStorage(50)),
               ReplayBuffer(storage=LazyTensorStorage(7))]  # fmt: skip   the last one's capacity differs
    target = MixedReplayBuffer(members)
    with pytest.raises(ValueError):
        target.loads(tmp_path / "ckpt")
    assert [len(m) for m in members] == [0, 0, 0] and target.proportions == pytest.approx((1 / 3,) * 3)


# -- nesting and ensembles of samplers -------------------------------------------------------------------------------
def test_a_mixer_member_of_a_mixer():
    inner = MixedReplayBuffer(_members((10, 10)), [1, 1])
    outer = MixedReplayBuffer([inner, _members((0, 0, 10))[2]], [0.5, 0.5], batch_size=8)
    assert sorted(itertools.chain(_origin(outer.sample()))) == [0, 0, 1, 1, 2, 2, 2, 2]


def test_stateful_member_sampler_is_named():
    members = _members((10, 10))
    members[1] = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement())
    mixer = MixedReplayBuffer(members)
    name, component = mixer.stateful_component()
    assert name == "member 1's sampler" and isinstance(component, SamplerWithoutReplacement)
    assert MixedReplayBuffer(_members((1, 1))).stateful_component() is None


def test_tuple_batches_of_dataset_storages_concatenate_element_wise():
    from torch.utils.data import TensorDataset

    from torchrl.data import DatasetStorage

    members = [ReplayBuffer(storage=DatasetStorage(TensorDataset(torch.full((10,), float(i)), torch.arange(10))))
               for i in range(2)]  # fmt: skip
    obs, label = MixedReplayBuffer(members, [1, 3], batch_size=4).sample()
    assert obs.tolist() == [0.0, 1.0, 1.0, 1.0] and label.shape == torch.Size([4])


def test_a_pickled_mixer_keeps_members_and_proportions():
    import pickle

    mixer = _seeded_mixer()
    mixer.set_proportions([1, 0, 1])
    copy = pickle.loads(pickle.dumps(mixer))
    assert copy.proportions == (0.5, 0.0, 0.5) and [len(b) for b in copy.buffers] == [20, 20, 20]
    assert torch.bincount(copy.sample()["source"], minlength=3).tolist() == [3, 0, 3]
    dataset = pickle.loads(pickle.dumps(mixer.as_dataset(num_batches=2)))  # what a spawned worker receives
    assert [b.batch_size[0] for b in dataset] == [6, 6]
