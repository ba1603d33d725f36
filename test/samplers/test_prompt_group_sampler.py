"""PromptGroupSampler (issue 14): balanced groups of completions that share a prompt."""

from __future__ import annotations

import math
import pickle
import warnings

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip
from helpers.factories import make_buffer
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    PromptGroupSampler,
    ReplayBuffer,
    TensorDictReplayBuffer,
    tensordict_collate,
)

TIMEOUT = 60  # DataLoader timeout: a deadlock fails instead of hanging


def completions(n_prompts: int, per_prompt: int, *, start: int = 0, reward=None) -> TensorDict:
    """``per_prompt`` completions of each prompt, prompt after prompt; ``uid`` numbers them from ``start``."""
    n = n_prompts * per_prompt
    reward = torch.arange(n, dtype=torch.float32) if reward is None else torch.as_tensor(reward, dtype=torch.float32)
    return TensorDict(
        {
            "query": torch.arange(n) // per_prompt,
            "uid": torch.arange(start, start + n),
            ("next", "reward"): reward.reshape(n, 1),
        },
        batch_size=[n],
    )


def buffer(capacity=64, batch_size=8, seed=0, **kwargs) -> TensorDictReplayBuffer:
    kwargs.setdefault("samples_per_group", 4)
    sampler = PromptGroupSampler(**kwargs)
    return make_buffer(cls=TensorDictReplayBuffer, sampler=sampler, capacity=capacity, batch_size=batch_size, seed=seed)


def groups(batch, k=4) -> list[list[int]]:
    return batch["uid"].view(-1, k).tolist()


def chi_square_ok(counts: torch.Tensor) -> bool:
    """Whether counts look uniform (chi-square, p > 0.001, Wilson-Hilferty quantile of the chi-square)."""
    counts = counts.double()
    expected = counts.sum() / counts.numel()
    stat = float(((counts - expected) ** 2 / expected).sum())
    df = counts.numel() - 1
    z = 3.09  # one-sided 0.999 normal quantile
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat < critical


# -- layout and distributions ---------------------------------------------------------------------------------
def test_batches_are_distinct_groups_of_one_prompt_each():
    rb = buffer(batch_size=12)
    rb.extend(completions(8, 6))
    for _ in range(20):
        batch = rb.sample()
        query = batch["query"].view(3, 4)
        assert (query == query[:, :1]).all()  # one prompt per group
        assert query[:, 0].unique().numel() == 3  # distinct groups
        assert batch["uid"].view(3, 4).unique(dim=1).shape[1] == 4  # distinct items in a group (random)


def test_num_groups_or_samples_per_group_sets_the_layout():
    by_groups = buffer(batch_size=12, samples_per_group=None, num_groups=2)
    by_groups.extend(completions(4, 8))
    query = by_groups.sample()["query"].view(2, 6)  # 2 groups of 12 // 2 items
    assert (query == query[:, :1]).all() and query[:, 0].unique().numel() == 2
    assert by_groups.sample(16)["query"].view(2, 8)[:, 0].unique().numel() == 2


def test_random_strategy_draws_groups_and_items_uniformly():
    rb = buffer(samples_per_group=2)
    rb.extend(completions(5, 6))  # 5 groups of 6
    sampler, storage = rb.sampler, rb.storage
    group_counts = torch.zeros(5)
    item_counts = torch.zeros(30)
    for _ in range(800):
        index, _ = sampler.sample(storage, 6)  # 3 groups of 2
        group_counts.index_add_(0, index[::2] // 6, torch.ones(3))
        item_counts.index_add_(0, index, torch.ones(6))
    assert chi_square_ok(group_counts)
    assert chi_square_ok(item_counts)


@pytest.mark.parametrize("num_groups, n_groups", [(4, 200), (12, 100)])  # redraws; Floyd's algorithm
def test_few_groups_out_of_many_are_drawn_uniformly_without_replacement(num_groups, n_groups):
    rb = buffer(capacity=3 * n_groups, samples_per_group=3, batch_size=3 * num_groups)
    rb.extend(completions(n_groups, 3))
    counts = torch.zeros(n_groups)
    first = torch.zeros(n_groups)
    for _ in range(6000 // num_groups):
        index, _ = rb.sampler.sample(rb.storage, 3 * num_groups)
        chosen = index[::3] // 3
        assert chosen.unique().numel() == num_groups
        counts.index_add_(0, chosen, torch.ones(num_groups))
        first[chosen[0]] += 1  # the order of the groups is uniform too
    assert chi_square_ok(counts)
    assert chi_square_ok(first)


@pytest.mark.parametrize("strategy", ["recency", "reward", "variance", "random"])
def test_groups_chosen_row_by_row_match_the_padded_matrix(strategy, monkeypatch):
    from torchrl.data.replay_buffers.samplers import prompt_group

    sizes = [9, 5, 12, 6, 7, 20]  # unbalanced groups, all larger than a batch's 4 per group
    query = torch.cat([torch.full((size,), g) for g, size in enumerate(sizes)])
    reward = torch.randn(query.numel(), generator=torch.Generator().manual_seed(0)).round(decimals=1)
    data = TensorDict({"query": query, "uid": torch.arange(query.numel()), ("next", "reward"): reward[:, None]},
                      batch_size=[query.numel()])
    results = []
    for max_padding, slack in ((4, 65536), (0, -1)):
        monkeypatch.setattr(prompt_group, "_MAX_PADDING", max_padding)
        monkeypatch.setattr(prompt_group, "_PADDING_SLACK", slack)
        rb = buffer(capacity=100, batch_size=12, strategy=strategy)
        rb.extend(data)
        batches = [rb.sample() for _ in range(10)]
        for batch in batches:
            q = batch["query"].view(3, 4)
            assert (q == q[:, :1]).all() and batch["uid"].view(3, 4).unique(dim=1).shape[1] == 4
        results.append([b["uid"].view(3, 4).sort(1).values.tolist() for b in batches])
    if strategy != "random":  # deterministic inside a group: the same choice either way
        assert results[0] == results[1]


def test_recency_takes_the_newest_items_of_each_group():
    rb = buffer(strategy="recency", batch_size=8)
    rb.extend(completions(2, 6))  # uid 0-5 (prompt 0), 6-11 (prompt 1)
    rb.extend(completions(2, 2, start=100))  # uid 100, 101 (prompt 0), 102, 103 (prompt 1)
    batch = rb.sample()
    got = sorted(groups(batch))
    assert got == [[101, 100, 5, 4], [103, 102, 11, 10]]


def test_recency_after_a_ring_wrap_sees_the_overwrites():
    rb = buffer(capacity=12, strategy="recency", batch_size=8)
    rb.extend(completions(2, 6))  # rows 0-11
    rb.extend(completions(1, 4, start=100))  # overwrites rows 0-3 with prompt 0 again: uid 100-103
    got = sorted(groups(rb.sample()))
    assert got == [[11, 10, 9, 8], [103, 102, 101, 100]]
    # row 4, 5 (prompt 0, uid 4, 5) are now older than rows 0-3


def test_reward_takes_the_top_mean_rewards_with_ties_to_the_oldest():
    reward = torch.tensor([1.0, 5.0, 3.0, 5.0, 0.0, 2.0, 9.0, 9.0, 9.0, 1.0, 0.0, 9.0])
    rb = buffer(strategy="reward", batch_size=6, samples_per_group=3)
    rb.extend(completions(2, 6, reward=reward))
    assert sorted(groups(rb.sample(), 3)) == [[1, 3, 2], [6, 7, 8]]
    # several rewards per item are averaged
    data = completions(1, 4)
    data["next", "reward"] = torch.tensor([[0.0, 10.0], [4.0, 4.0], [9.0, 0.0], [1.0, 1.0]])
    rb = buffer(strategy="reward", batch_size=2, samples_per_group=2)
    rb.extend(data)
    assert groups(rb.sample(), 2) == [[0, 2]]  # means 5, 4, 4.5, 1


def test_variance_takes_the_most_spread_subset_with_ties_to_the_larger_total():
    rb = buffer(strategy="variance", batch_size=4, samples_per_group=4, num_groups=None)
    rb.extend(completions(1, 8, reward=[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]))
    assert groups(rb.sample()) == [[0, 1, 6, 7]]
    rb = buffer(strategy="variance", batch_size=2, samples_per_group=2)
    rb.extend(completions(1, 4, reward=[0.0, 0.0, 10.0, 10.0]))  # {0, 10} from rows (0|1, 2|3)
    assert groups(rb.sample(), 2) == [[0, 3]]
    rb = buffer(strategy="variance", batch_size=2, samples_per_group=2)
    rb.extend(completions(1, 3, reward=[1.0, 1.0, 1.0]))  # all subsets equal: the oldest items
    assert groups(rb.sample(), 2) == [[0, 1]]
    # {0, 10, 10} and {0, 0, 10} spread equally: the larger total wins, then the oldest items
    rb = buffer(strategy="variance", batch_size=3, samples_per_group=3)
    rb.extend(completions(1, 4, reward=[0.0, 0.0, 10.0, 10.0]))
    assert groups(rb.sample(), 3) == [[0, 2, 3]]


def test_token_tensor_prompts_group_by_equal_rows():
    data = TensorDict(
        query=torch.tensor([[1, 2], [3, 4], [1, 2], [3, 4], [1, 2], [3, 4]]), uid=torch.arange(6), batch_size=[6]
    )
    rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=PromptGroupSampler(num_groups=2), batch_size=6)
    rb.extend(data)
    batch = rb.sample()
    assert sorted(sorted(g) for g in batch["uid"].view(2, 3).tolist()) == [[0, 2, 4], [1, 3, 5]]


def test_small_groups_and_too_few_groups_are_completed_with_one_warning():
    rb = buffer(batch_size=12, samples_per_group=4)
    rb.extend(completions(2, 3))  # 2 groups of 3 items; a batch asks 3 groups of 4
    with pytest.warns(UserWarning, match="with replacement") as record:
        batch = rb.sample()
    assert len(record) == 1
    query = batch["query"].view(3, 4)
    assert (query == query[:, :1]).all() and set(query[:, 0].tolist()) == {0, 1}
    for group in batch["uid"].view(3, 4).tolist():
        assert len(set(group[:3])) == 3  # every item of a small group, then repeats
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.sample()  # warned once


def test_groups_follow_new_writes():
    for cache_groups in (True, False):
        rb = buffer(batch_size=8, cache_groups=cache_groups)
        rb.extend(completions(2, 4))
        assert sorted(rb.sample()["query"][::4].tolist()) == [0, 1]
        new = completions(1, 4, start=100)
        new["query"] = torch.full((4,), 7)
        rb.extend(new)
        seen = {q for _ in range(30) for q in rb.sample()["query"][::4].tolist()}
        assert seen == {0, 1, 7}


# -- contract -------------------------------------------------------------------------------------------------
def test_requires_shared_state_only_for_recency():
    for strategy in ("random", "reward", "variance"):
        assert not PromptGroupSampler(num_groups=2, strategy=strategy).requires_shared_state
        assert PromptGroupSampler(num_groups=2, strategy=strategy).state_dict() == {}
    assert PromptGroupSampler(num_groups=2, strategy="recency").requires_shared_state


def test_bad_arguments_and_uses_raise_clear_errors():
    with pytest.raises(TypeError, match="exactly one of `num_groups` and `samples_per_group`"):
        PromptGroupSampler()
    with pytest.raises(TypeError, match="exactly one"):
        PromptGroupSampler(num_groups=2, samples_per_group=2)
    with pytest.raises(ValueError, match="`num_groups`"):
        PromptGroupSampler(num_groups=0)
    with pytest.raises(ValueError, match="`strategy`"):
        PromptGroupSampler(num_groups=2, strategy="best")
    with pytest.raises(TypeError, match="`cache_groups`"):
        PromptGroupSampler(num_groups=2, cache_groups=1)
    rb = buffer()
    rb.extend(completions(2, 4))
    with pytest.raises(ValueError, match="not divisible by `samples_per_group`=4"):
        rb.sample(6)
    with pytest.raises(RuntimeError, match="empty"):
        PromptGroupSampler(num_groups=1).sample(LazyTensorStorage(4), 2)
    listed = ReplayBuffer(storage=ListStorage(8), sampler=PromptGroupSampler(num_groups=1), batch_size=2)
    listed.extend([TensorDict(query=torch.tensor(0)), TensorDict(query=torch.tensor(0))])
    with pytest.raises(TypeError, match="ListStorage"):
        listed.sample()
    grid = LazyTensorStorage(8, ndim=2)
    grid.set(torch.arange(4), TensorDict(query=torch.zeros(4, 2), batch_size=[4, 2]))
    with pytest.raises(NotImplementedError, match="ndim=2"):
        PromptGroupSampler(num_groups=1).sample(grid, 2)
    missing = buffer(group_key="prompt")
    missing.extend(completions(2, 4))
    with pytest.raises(KeyError, match="'prompt'.*`group_key`"):
        missing.sample()
    no_reward = buffer(strategy="reward", reward_key="score")
    no_reward.extend(completions(2, 4))
    with pytest.raises(KeyError, match="'score'.*`reward_key`"):
        no_reward.sample()


def test_bad_recency_state_is_refused_and_changes_nothing():
    rb = buffer(strategy="recency")
    rb.extend(completions(2, 4))
    before = rb.sampler.state_dict()
    with pytest.raises(ValueError, match="recency_clock"):
        rb.sampler.load_state_dict({"position_recency": torch.tensor([5]), "recency_clock": 2})
    with pytest.raises(ValueError, match="position_recency"):
        rb.sampler.load_state_dict({"clock": 2})
    with pytest.raises(ValueError, match="keeps no state"):
        PromptGroupSampler(num_groups=1).load_state_dict(before)
    assert rb.sampler.state_dict()["recency_clock"] == before["recency_clock"] == 8


# -- state round trips ----------------------------------------------------------------------------------------
def _continue(rb, start: int, rounds: int = 4) -> list:
    out = []
    for i in range(rounds):
        rb.extend(completions(2, 3, start=start + 6 * i))
        out.append(rb.sample()["uid"].tolist())
    return out


@pytest.mark.parametrize("strategy", ["recency", "random"])
def test_state_dict_round_trip_mid_stream_continues_identically(strategy):
    rb = buffer(capacity=16, strategy=strategy)
    rb.extend(completions(3, 4))
    rb.sample()
    twin = buffer(capacity=16, strategy=strategy)
    twin.load_state_dict(rb.state_dict())
    assert twin.sampler.state_dict().keys() == rb.sampler.state_dict().keys()
    assert _continue(twin, 100) == _continue(rb, 100)


def test_dumps_loads_mid_stream_continue_identically(tmp_path):
    rb = buffer(capacity=16, strategy="recency")
    rb.extend(completions(3, 4))
    rb.sample()
    twin = assert_checkpoint_round_trip(rb, lambda: buffer(capacity=16, strategy="recency"), tmp_path / "buffer", draws=0)
    assert twin.sampler.state_dict()["recency_clock"] == 12
    assert _continue(twin, 100) == _continue(rb, 100)
    alone = assert_checkpoint_round_trip(
        rb.sampler, lambda: PromptGroupSampler(samples_per_group=4, strategy="recency"), tmp_path / "sampler"
    )
    assert (alone.state_dict()["position_recency"] == rb.sampler.state_dict()["position_recency"]).all()


def test_pickling_drops_the_group_cache_and_continues_identically():
    rb = buffer(capacity=16, strategy="recency")
    rb.extend(completions(3, 4))
    rb.sample()
    assert rb.sampler._group_index is not None and pickle.loads(pickle.dumps(rb.sampler))._group_index is None
    twin = pickle.loads(pickle.dumps(rb))
    assert _continue(twin, 100) == _continue(rb, 100)


def test_empty_resets_the_clock():
    rb = buffer(strategy="recency")
    rb.extend(completions(2, 4))
    rb.empty()
    assert rb.sampler.state_dict()["recency_clock"] == 0


# -- DataLoader -----------------------------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_random_strategy_runs_in_dataloader_workers():
    rb = buffer(batch_size=8)
    rb.extend(completions(6, 4))
    loader = DataLoader(rb.as_dataset(num_batches=4), batch_size=None, collate_fn=tensordict_collate,
                        num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
    batches = list(loader)
    assert len(batches) == 4
    for batch in batches:
        query = batch["query"].view(2, 4)
        assert (query == query[:, :1]).all()


def _newest(batch, k=4) -> bool:
    """Whether each group of a recency batch holds the newest completions of its prompt (uid: write order)."""
    return all(sorted(g) == sorted(range(max(g) - k + 1, max(g) + 1)) for g in batch["uid"].view(-1, k).tolist())


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_recency_clock_is_shared_with_dataloader_workers(start_method):
    rb = buffer(capacity=64, batch_size=8, strategy="recency")
    for start in range(0, 24, 8):  # 2 prompts, written 4 completions at a time: uid = write order per prompt
        rb.extend(completions(2, 4, start=start).update({"query": torch.tensor([0] * 4 + [1] * 4)}))
    dataset = rb.as_dataset(num_batches=2)
    assert rb.sampler.is_shared and rb.stateful_component() is None
    loader = DataLoader(dataset, batch_size=None, collate_fn=tensordict_collate, num_workers=2,
                        multiprocessing_context=start_method, timeout=TIMEOUT, persistent_workers=True)
    first = list(loader)
    assert all(sorted(b["uid"].tolist()) == [16, 17, 18, 19, 20, 21, 22, 23] for b in first)
    rb.extend(completions(2, 4, start=100).update({"query": torch.tensor([0] * 4 + [1] * 4)}))
    second = list(loader)  # the same workers see the stamps of the write made after they started
    assert all(sorted(b["uid"].tolist()) == list(range(100, 108)) for b in second)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_recency_is_refused_by_workers_when_it_cannot_be_shared():
    rb = buffer(batch_size=8, strategy="recency")
    rb.extend(completions(6, 4))
    loader = DataLoader(rb.as_dataset(num_batches=2, share_sampler=False), batch_size=None,
                        collate_fn=tensordict_collate, num_workers=1, multiprocessing_context="fork", timeout=TIMEOUT)
    with pytest.raises(RuntimeError, match="PromptGroupSampler.*num_workers=0"):
        list(loader)
    empty = buffer(batch_size=8, strategy="recency")  # nothing written: the clock's size is unknown
    assert not empty.sampler.can_share_state
    with pytest.raises(RuntimeError, match="write data into the buffer before"):
        empty.sampler.share_memory_()
    assert PromptGroupSampler(num_groups=1).share_memory_() is not None  # stateless: nothing to share


def test_a_shared_clock_keeps_working_in_the_main_process():
    rb = buffer(capacity=16, strategy="recency")
    rb.extend(completions(2, 8))
    rb.sampler.share_memory_()
    clock = rb.sampler._clock
    rb.extend(completions(2, 4, start=100))
    assert rb.sampler._clock is clock and int(clock) == 24  # updated in place
    assert _newest(rb.sample())
    state = rb.sampler.state_dict()
    rb.sampler.load_state_dict(state)  # in place, still shared
    assert rb.sampler.is_shared and rb.sampler.state_dict()["recency_clock"] == 24
    copy = pickle.loads(pickle.dumps(rb.sampler))  # a private copy
    assert not copy.is_shared and copy.state_dict()["recency_clock"] == 24
    rb.empty()
    assert rb.sampler.is_shared and rb.sampler.state_dict()["recency_clock"] == 0


def test_groups_overwritten_by_the_ring_are_no_longer_drawn():
    rb = buffer(capacity=8, batch_size=8)
    rb.extend(completions(2, 4))  # prompts 0, 1 fill the ring
    newer = completions(1, 4, start=100)
    newer["query"] = torch.full((4,), 2)
    rb.extend(newer)  # overwrites prompt 0
    seen = {q for _ in range(20) for q in rb.sample()["query"][::4].tolist()}
    assert seen == {1, 2}


def test_string_prompts_in_a_lazy_stack_storage():
    import torchrl.data

    storage_cls = getattr(torchrl.data, "LazyStackStorage", None)
    if storage_cls is None:
        pytest.skip("LazyStackStorage is not available")
    rb = ReplayBuffer(storage=storage_cls(20), sampler=PromptGroupSampler(samples_per_group=2), batch_size=4)
    prompts = ["a", "b", "a", "b", "c", "c"]
    rb.extend([TensorDict(query=q, uid=torch.tensor(i)) for i, q in enumerate(prompts)])
    for _ in range(10):
        batch = rb.sample()
        groups_seen = [batch["query"][i] for i in range(4)]
        assert groups_seen[0] == groups_seen[1] and groups_seen[2] == groups_seen[3]
        assert groups_seen[0] != groups_seen[2]
        assert all(prompts[u] == q for u, q in zip(batch["uid"].tolist(), groups_seen))
