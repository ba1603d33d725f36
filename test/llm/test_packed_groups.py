"""Groups of completions over a PackedSequenceStorage: written whole (GroupWriter), evicted whole, sampled whole
(GroupSampler), laid out padded or packed (pad_sequences, pack_sequences)."""

from __future__ import annotations

import functools
import pickle

import pytest
import torch
from helpers.factories import make_buffer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, lazy_stack

from torchrl.data import (
    GroupSampler,
    GroupWriter,
    LazyTensorStorage,
    PackedSequenceStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
    pack_sequences,
    pad_sequences,
    reward_variance_above,
)


def group(prompt_id: int, lengths, *, version: int = 0, rewards=None, first_id: int = 0) -> list[TensorDict]:
    """The completions of one prompt; ``uid`` numbers them (``first_id`` + position) so tests can check order."""
    rewards = [float(i % 2) for i in range(len(lengths))] if rewards is None else rewards
    return [
        TensorDict(
            tokens=torch.full((n,), prompt_id * 1000 + i),
            mask=torch.ones(n, dtype=torch.bool),
            prompt_id=torch.tensor(prompt_id),
            uid=torch.tensor(first_id + i),
            reward=torch.tensor(r),
            policy_version=torch.tensor(version),
        )
        for i, (n, r) in enumerate(zip(lengths, rewards))
    ]


def buffer(max_tokens=200, max_sequences=50, *, writer=None, sampler=None, **kwargs) -> ReplayBuffer:
    return make_buffer(
        storage=PackedSequenceStorage(max_tokens, max_sequences=max_sequences, token_keys=("tokens", "mask")),
        writer=GroupWriter(**kwargs) if writer is None else writer,
        sampler=GroupSampler(1) if sampler is None else sampler,
        cls=ReplayBuffer,
        batch_size=1,
    )


def live_groups(rb) -> list[list[int]]:
    """The ``uid`` of each live sequence, per live group, oldest group first."""
    s = rb.storage
    slots, starts, sizes = s.live_groups()
    uids = s.fixed_entry("uid", slots).tolist()
    return [uids[a : a + n] for a, n in zip(starts.tolist(), sizes.tolist())]


def live_prompts(rb) -> list[int]:
    s = rb.storage
    slots, starts, _ = s.live_groups()
    return s.fixed_entry("prompt_id", slots[starts]).tolist()


# -- writing ----------------------------------------------------------------------------------------------------
def test_reward_variance_rule_pickles_with_its_writer():
    rule = pickle.loads(pickle.dumps(reward_variance_above(0.25, reward_key="reward")))
    assert rule(lazy_stack(group(1, [2, 2], rewards=[0.0, 2.0])))  # variance 1.0
    assert not rule(lazy_stack(group(1, [2, 2], rewards=[0.0, 0.5])))  # variance 0.0625
    writer = pickle.loads(pickle.dumps(GroupWriter(keep_if=reward_variance_above(0.0))))
    assert "reward_variance_above(threshold=0.0, reward_key='reward')" in repr(writer)
    rb = buffer(writer=writer)
    assert rb.extend(group(1, [2, 2], rewards=[1.0, 1.0]) + group(2, [2, 2], rewards=[0.0, 1.0])).numel() == 2


def test_a_batch_of_interleaved_groups_is_written_group_after_group():
    rb = buffer()
    a, b = group(1, [3, 4, 5], first_id=0), group(2, [2, 2], first_id=10)
    slots = rb.extend([a[0], b[0], a[1], b[1], a[2]])
    assert slots.tolist() == [0, 1, 2, 3, 4]
    assert live_groups(rb) == [[0, 1, 2], [10, 11]]
    assert rb.writer.write_count == 5


def test_eviction_by_tokens_frees_whole_groups_oldest_first():
    rb = buffer(max_tokens=30)
    rb.extend(group(1, [5, 5], first_id=0))
    rb.extend(group(2, [5, 5], first_id=10))
    rb.extend(group(3, [4, 4], first_id=20))  # 28 tokens
    rb.extend(group(4, [3, 3], first_id=30))  # needs 4 more: overwrites part of group 1's first sequence
    assert live_groups(rb) == [[10, 11], [20, 21], [30, 31]]


def test_eviction_by_slots_frees_whole_groups():
    rb = buffer(max_tokens=1000, max_sequences=5)
    rb.extend(group(1, [2, 2, 2], first_id=0))
    rb.extend(group(2, [2, 2], first_id=10))
    rb.extend(group(3, [2], first_id=20))  # reuses slot 0 only: group 1 goes whole
    assert live_groups(rb) == [[10, 11], [20]]


def test_max_groups_keeps_the_newest_groups():
    rb = buffer(max_groups=2)
    for p in range(5):
        rb.extend(group(p, [2, 3]))
    assert live_prompts(rb) == [3, 4]
    rb.extend(group(7, [1]) + group(8, [1]) + group(9, [1]))  # more groups than max_groups in one write
    assert live_prompts(rb) == [8, 9]


def test_max_policy_lag_frees_stale_groups_first():
    rb = buffer(max_policy_lag=1)
    rb.extend(group(1, [2, 2], version=0))
    rb.extend(group(2, [2, 2], version=1))
    assert live_prompts(rb) == [1, 2]
    rb.extend(group(3, [2, 2], version=2))  # version 0 lags by 2 > 1
    assert live_prompts(rb) == [2, 3]
    written = rb.extend(group(4, [2], version=0) + group(5, [2], version=3))  # group 4 is stale on arrival
    assert live_prompts(rb) == [3, 5]
    assert written.numel() == 1


def test_keep_if_drops_groups_at_write_time():
    rb = buffer(keep_if=reward_variance_above(0.0))
    written = rb.extend(group(1, [2, 2], rewards=[1.0, 1.0]) + group(2, [2, 2], rewards=[0.0, 1.0]))
    assert live_prompts(rb) == [2] and written.numel() == 2
    assert rb.extend(group(3, [2, 2], rewards=[0.5, 0.5])).numel() == 0
    calls = []
    rb = buffer(keep_if=lambda g: calls.append(g["uid"].tolist()) or True)
    rb.extend(group(1, [2, 2], first_id=5))
    assert calls == [[5, 6]]


def test_a_group_laid_out_across_the_arena_end_is_kept_whole():
    rb = buffer(max_tokens=20)
    rb.extend(group(1, [7]))  # cursor at 7
    rb.extend(group(2, [6, 6, 8]))  # 20 tokens: fits only from the arena start
    assert live_prompts(rb) == [2]
    assert [len(t) for t in rb.storage.get(rb.storage.live_slots()).get("tokens", as_list=True)] == [6, 6, 8]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_groups": 0}, ValueError, "max_groups"),
        ({"max_policy_lag": -1}, ValueError, "max_policy_lag"),
        ({"max_policy_lag": 1.5}, ValueError, "max_policy_lag"),
        ({"keep_if": 3}, TypeError, "keep_if"),
    ],
)
def test_bad_writer_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        GroupWriter(**kwargs)


def test_bad_group_writes_raise_and_write_nothing():
    rb = buffer(max_tokens=20, max_sequences=4, max_policy_lag=2)
    rb.extend(group(1, [2, 2]))
    before = live_groups(rb)
    cases = [
        (KeyError, "group_key='prompt_id'", [g.exclude("prompt_id") for g in group(2, [2])]),
        (KeyError, "policy_version_key", [g.exclude("policy_version") for g in group(2, [2])]),
        (ValueError, "larger max_tokens", group(2, [8, 8, 8])),
        (ValueError, "larger max_sequences", group(2, [1] * 5)),
        (TypeError, "batch of sequences", torch.zeros(3)),
    ]
    for error, match, data in cases:
        with pytest.raises(error, match=match):
            rb.extend(data)
        assert live_groups(rb) == before
    rb_rule = buffer(keep_if=lambda g: None)
    with pytest.raises(TypeError, match="must return a bool"):
        rb_rule.extend(group(2, [2]))
    assert len(rb_rule) == 0
    with pytest.raises(TypeError, match="extend"):
        rb.add(group(3, [2])[0])
    with pytest.raises(TypeError, match="PackedSequenceStorage"):
        make_buffer(storage=LazyTensorStorage(10), writer=GroupWriter(), cls=ReplayBuffer)


# -- the invariant, for any sequence of writes -------------------------------------------------------------------
_writes = st.lists(
    st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=6), min_size=1, max_size=3),  # groups of a write
    min_size=1,
    max_size=25,
)


@pytest.mark.filterwarnings("ignore:GroupSampler. the storage holds")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    writes=_writes,
    max_tokens=st.integers(12, 80),
    max_sequences=st.integers(6, 30),
    max_groups=st.one_of(st.none(), st.integers(1, 6)),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_no_eviction_ever_splits_a_group_and_samples_are_whole_groups_in_write_order(
    writes, max_tokens, max_sequences, max_groups, k, seed
):
    rb = buffer(max_tokens, max_sequences, max_groups=max_groups, sampler=GroupSampler(k))
    rb.set_rng(torch.Generator().manual_seed(seed))
    sizes: dict[int, int] = {}
    next_id = prompt = 0
    for write in writes:
        data = []
        for lengths in write:
            if len(lengths) > max_sequences or sum(lengths) > max_tokens:
                continue  # a group larger than the storage is refused (tested above)
            data += group(prompt, lengths, first_id=next_id)
            sizes[prompt] = len(lengths)
            next_id += len(lengths)
            prompt += 1
        if not data:
            continue
        rb.extend(data)
        groups = live_groups(rb)
        # every live group is whole (all its sequences) and in write order (consecutive uids)
        prompts = live_prompts(rb)
        for p, uids in zip(prompts, groups):
            assert len(uids) == sizes[p]
            assert uids == list(range(uids[0], uids[0] + len(uids)))
        assert prompts == sorted(prompts)  # FIFO by group
        if max_groups is not None:
            assert len(groups) <= max_groups
        # the newest group written is always live
        assert prompts[-1] == prompt - 1
        batch, info = rb.sample(return_info=True)
        uids, which = batch["uid"].tolist(), info["group"].tolist()
        sampled_prompts = batch["prompt_id"].tolist()
        for g in range(k):
            members = [u for u, w in zip(uids, which) if w == g]
            ps = {p for p, w in zip(sampled_prompts, which) if w == g}
            assert len(ps) == 1
            assert len(members) == sizes[ps.pop()]
            assert members == list(range(members[0], members[0] + len(members)))


# -- sampling ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "strategy, expected",
    [("recency", [3, 4]), ("reward", [4, 2]), ("variance", [3, 1])],
)
def test_group_strategies_choose_whole_groups(strategy, expected):
    rb = buffer(sampler=GroupSampler(2, strategy=strategy))
    rewards = {0: [0.0, 0.0], 1: [0.0, 1.0], 2: [2.0, 2.0], 3: [-3.0, 3.0], 4: [5.0, 5.0]}
    for p, r in rewards.items():
        rb.extend(group(p, [2, 3], rewards=r))
    batch, info = rb.sample(return_info=True)
    prompts = batch["prompt_id"].tolist()
    assert [prompts[0], prompts[2]] == expected
    assert info["group"].tolist() == [0, 0, 1, 1]
    assert [len(t) for t in batch.get("tokens", as_list=True)] == [2, 3, 2, 3]


def test_random_groups_are_distinct_within_a_batch_and_cover_the_storage():
    rb = buffer(sampler=GroupSampler(3))
    for p in range(6):
        rb.extend(group(p, [1, 2]))
    seen = set()
    for _ in range(30):
        batch = rb.sample()
        prompts = batch["prompt_id"].tolist()[::2]
        assert len(set(prompts)) == 3
        seen.update(prompts)
    assert seen == set(range(6))


def test_batch_size_counts_groups_without_num_groups():
    rb = buffer(sampler=GroupSampler())
    for p in range(4):
        rb.extend(group(p, [2, 2]))
    assert rb.sample(3).batch_size == torch.Size([6])


def test_num_groups_samples_without_a_buffer_batch_size():
    rb = make_buffer(storage=PackedSequenceStorage(200, max_sequences=50, token_keys=("tokens", "mask")),
                     writer=GroupWriter(), sampler=GroupSampler(2), cls=ReplayBuffer)
    for p in range(4):
        rb.extend(group(p, [2, 3]))
    assert rb.can_sample()
    batch, info = rb.sample(return_info=True)
    assert batch.batch_size == torch.Size([4]) and info["group"].tolist() == [0, 0, 1, 1]
    assert rb.sample(3).batch_size == torch.Size([4])  # num_groups fixes the count
    without = make_buffer(storage=PackedSequenceStorage(200, max_sequences=50, token_keys=("tokens", "mask")),
                          writer=GroupWriter(), sampler=GroupSampler(), cls=ReplayBuffer)
    without.extend(group(0, [2, 3]))
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        without.sample()


def test_fewer_groups_than_asked_warns_and_repeats_whole_groups():
    rb = buffer(sampler=GroupSampler(3))
    rb.extend(group(0, [2, 2, 2]))
    with pytest.warns(UserWarning, match="fewer than the 3"):
        batch = rb.sample()
    assert batch["prompt_id"].tolist() == [0] * 9


def test_group_sampler_refuses_other_storages_and_empty_ones():
    rb = make_buffer(storage=LazyTensorStorage(10), sampler=GroupSampler(1), cls=ReplayBuffer, batch_size=1)
    rb.extend(torch.arange(3))
    with pytest.raises(TypeError, match="PackedSequenceStorage"):
        rb.sample()
    with pytest.raises(RuntimeError, match="add data first"):
        buffer().sample()
    with pytest.raises(ValueError, match="strategy"):
        GroupSampler(2, strategy="best")
    with pytest.raises(ValueError, match="num_groups"):
        GroupSampler(0)


def test_a_tensordict_buffer_writes_the_index_and_group_into_the_sample():
    rb = make_buffer(storage=PackedSequenceStorage(100, max_sequences=20, token_keys=("tokens", "mask")),
                     writer=GroupWriter(), sampler=GroupSampler(1), cls=TensorDictReplayBuffer, batch_size=1)
    slots = rb.extend(lazy_stack(group(0, [3, 4])))
    batch = rb.sample()
    assert batch["index"].tolist() == slots.tolist() and batch["group"].tolist() == [0, 0]


# -- layouts ----------------------------------------------------------------------------------------------------
def three_sequences():
    return lazy_stack(group(1, [3, 1, 2], rewards=[1.0, 2.0, 3.0]))


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_layout(side):
    out = pad_sequences(three_sequences(), keys=("tokens", "mask"), side=side, pad_value=-1)
    assert out.batch_size == torch.Size([3])
    rows = [[1000, 1000, 1000], [1001, -1, -1], [1002, 1002, -1]]
    mask = [[True] * 3, [True, False, False], [True, True, False]]
    if side == "left":
        rows = [[1000, 1000, 1000], [-1, -1, 1001], [-1, 1002, 1002]]
        mask = [[True] * 3, [False, False, True], [False, True, True]]
    assert out["tokens"].tolist() == rows
    assert out["attention_mask"].tolist() == mask
    zero_padded = pad_sequences(three_sequences(), keys=("tokens", "mask"), side=side)
    assert zero_padded["mask"].tolist() == mask  # a per-token bool entry padded with False
    assert out["reward"].tolist() == [1.0, 2.0, 3.0]


def test_padded_layout_picks_the_ragged_entries_by_default():
    out = pad_sequences(three_sequences())
    assert set(out.keys()) >= {"tokens", "mask", "attention_mask", "reward"}
    assert out["tokens"].shape == (3, 3) and out["reward"].shape == (3,)


def test_packed_layout():
    out = pack_sequences(three_sequences(), keys=("tokens", "mask"))
    assert out["tokens"].tolist() == [[1000, 1000, 1000, 1001, 1002, 1002]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1]]
    assert out["cu_seqlens"].dtype == torch.int32 and out["cu_seqlens"].tolist() == [0, 3, 4, 6]
    assert int(out["max_seqlen"]) == 3
    assert out["reward"].tolist() == [1.0, 2.0, 3.0]


def test_layouts_as_a_buffer_collate_fn():
    rb = make_buffer(
        storage=PackedSequenceStorage(100, max_sequences=20, token_keys=("tokens", "mask")), writer=GroupWriter(),
        sampler=GroupSampler(2), cls=ReplayBuffer, batch_size=2,
        collate_fn=functools.partial(pad_sequences, keys=("tokens", "mask"), side="left"),
    )
    rb.extend(group(0, [3, 1]) + group(1, [2, 5]))
    batch = rb.sample()
    assert batch["tokens"].shape == (4, 5)
    assert batch["attention_mask"].sum(-1).tolist() in ([3, 1, 2, 5], [2, 5, 3, 1])
    rb.set_storage(rb.storage, collate_fn=functools.partial(pack_sequences, keys=("tokens", "mask")))
    packed = rb.sample()
    assert int(packed["cu_seqlens"][-1]) == 11


def test_bad_layout_arguments_are_refused():
    with pytest.raises(ValueError, match="side"):
        pad_sequences(three_sequences(), side="middle")
    with pytest.raises(KeyError, match="keys"):
        pack_sequences(three_sequences(), keys=("nope",))
    with pytest.raises(ValueError, match="keys=None"):
        pad_sequences(lazy_stack(group(1, [2, 2])))
    with pytest.raises(ValueError, match="no sequence"):
        pack_sequences([])
    bad = group(1, [2])
    bad[0].set("mask", torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="different lengths"):
        pad_sequences(bad, keys=("tokens", "mask"))
