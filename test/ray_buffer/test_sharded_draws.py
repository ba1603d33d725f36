"""ShardedRayReplayBuffer on a real local Ray cluster: the two-level prioritized draw has the distribution and the
importance weights of one buffer, uniform draws follow the shards' sizes, writes and priority updates reach the
shards that own them, and clients work from other processes.

One local cluster (``ray.init(num_cpus=2, include_dashboard=False)``, usage statistics off) for the module; shard
actors reserve no CPU. The actors are the slow part (each is a process that imports torch): each buffer is built
once per module. Draws come in large batches, so the statistical tests make few actor round trips.
"""

from __future__ import annotations

import os

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before ray is imported: nothing leaves this machine

import functools
import pickle
import sys

import numpy as np
import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedReplayBuffer,
    RandomSampler,
    ReplayBuffer,
    ShardedRayReplayBuffer,
    ShardedRayReplayBufferClient,
    TensorDictPrioritizedReplayBuffer,
)

ray = require("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the Ray task below travels by value

pytestmark = [pytest.mark.extras, pytest.mark.multiprocess]

NUM_SHARDS, ROWS_PER_SHARD = 4, 25_000
ALPHA, BETA, EPS = 0.7, 0.5, 1e-8
NO_CPU = {"num_cpus": 0}


def p_value(counts: np.ndarray, probabilities: np.ndarray) -> float:
    """Pearson's chi-square test of ``counts`` against ``probabilities``: its p-value (the chi-square survival
    function through torch's regularized upper incomplete gamma; scipy is not a dependency)."""
    expected = probabilities * counts.sum()
    statistic = float(((counts - expected) ** 2 / expected).sum())
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))  # fmt: skip


def mass_bins(probabilities: np.ndarray, num_bins: int) -> np.ndarray:
    """The bin of each row: consecutive rows holding about ``1 / num_bins`` of the probability each."""
    middle = np.cumsum(probabilities) - probabilities / 2
    return np.minimum((middle * num_bins).astype(np.int64), num_bins - 1)


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def prioritized(cluster):
    """4 shards of 25k rows (``obs`` = the row's number in the order written) with random priorities; shard s's
    priorities are scaled by s + 1, so the shards' masses differ."""
    rb = ShardedRayReplayBuffer(num_shards=NUM_SHARDS, replay_buffer_cls=PrioritizedReplayBuffer, alpha=ALPHA,
                                beta=BETA, eps=EPS, storage=functools.partial(LazyTensorStorage, ROWS_PER_SHARD),
                                remote_config=NO_CPU)  # fmt: skip
    yield rb
    rb.close()


@pytest.fixture(scope="module")
def filled(prioritized):
    generator = torch.Generator().manual_seed(0)
    total = NUM_SHARDS * ROWS_PER_SHARD
    priority = torch.empty(total, dtype=torch.float64)  # by global index
    for shard in range(NUM_SHARDS):
        index = prioritized.extend(torch.arange(ROWS_PER_SHARD) + shard * ROWS_PER_SHARD, shard=shard)
        assert torch.equal(index, torch.arange(ROWS_PER_SHARD) * NUM_SHARDS + shard)
        priority[index] = torch.rand(ROWS_PER_SHARD, generator=generator, dtype=torch.float64) * (shard + 1)
    prioritized.update_priority(torch.arange(total), priority)
    prioritized.manual_seed(1)
    return prioritized, priority


def _draws(rb, total: int, batch: int = 50_000):
    index, weight = [], []
    for _ in range(total // batch):
        data, info = rb.sample(batch, return_info=True)
        index.append(info["index"])
        weight.append(info["priority_weight"])
        assert torch.equal(data, _obs_of(info["index"]))
    return torch.cat(index), torch.cat(weight)


def _obs_of(index: torch.Tensor) -> torch.Tensor:
    """What ``filled`` wrote at global indices ``index``: shard s's slot k holds s * 25k + k."""
    return (index % NUM_SHARDS) * ROWS_PER_SHARD + index // NUM_SHARDS


# -- the prioritized two-level draw ----------------------------------------------------------------------------------
@pytest.mark.timeout(600)
def test_prioritized_draws_over_shards_follow_the_single_buffer_probabilities(filled):
    rb, priority = filled
    index, _ = _draws(rb, 200_000)
    q = ((priority + EPS) ** ALPHA).float().double()  # the trees' float32 leaves
    probabilities = (q / q.sum()).numpy()
    # bins of ~1% of the mass over rows ordered shard by shard: a wrong share of a shard shows in its bins
    order = np.argsort((np.arange(len(q)) % NUM_SHARDS) * ROWS_PER_SHARD + np.arange(len(q)) // NUM_SHARDS)
    bins = np.empty(len(q), dtype=np.int64)
    bins[order] = mass_bins(probabilities[order], 100)
    expected = np.bincount(bins, weights=probabilities, minlength=100)
    counts = np.bincount(bins[index.numpy()], minlength=100)
    assert p_value(counts, expected) > 0.01
    shard_counts = np.bincount(index.numpy() % NUM_SHARDS, minlength=NUM_SHARDS)
    shard_mass = np.bincount(np.arange(len(q)) % NUM_SHARDS, weights=probabilities)
    assert p_value(shard_counts, shard_mass) > 0.01


@pytest.mark.timeout(600)
def test_importance_weights_equal_those_of_one_buffer_with_the_same_priorities(filled):
    rb, priority = filled
    total = NUM_SHARDS * ROWS_PER_SHARD
    single = PrioritizedReplayBuffer(alpha=ALPHA, beta=BETA, eps=EPS, storage=LazyTensorStorage(total))
    single.extend(torch.arange(total))
    single.update_priority(torch.arange(total), priority)
    single.set_rng(torch.Generator().manual_seed(2))
    _, info = single.sample(200_000, return_info=True)
    expected = torch.full((total,), float("nan"))
    expected[info["index"]] = info["priority_weight"]
    index, weight = _draws(rb, 100_000)
    seen = ~expected[index].isnan()
    assert seen.float().mean() > 0.5
    torch.testing.assert_close(weight[seen], expected[index][seen])
    assert weight.max() <= 1.0


@pytest.mark.timeout(600)
def test_priority_updates_reach_the_shard_that_owns_each_index(filled):
    rb, priority = filled
    chosen = torch.tensor([7, 10, 41, 99_998])  # shards 3, 2, 1, 2
    try:
        rb.update_priority(torch.arange(NUM_SHARDS * ROWS_PER_SHARD), 0.0)
        rb.update_priority(chosen, torch.tensor([1.0, 2.0, 3.0, 4.0]))
        data, info = rb.sample(4_000, return_info=True)
        assert torch.equal(data, _obs_of(info["index"]))
        counts = torch.bincount(info["index"], minlength=100_000)
        # the other rows keep q = eps ** alpha each (about 3% of the mass together)
        assert set(counts.topk(4).indices.tolist()) == set(chosen.tolist())
        assert counts[chosen].sum() > 0.9 * 4_000
        counts = counts[chosen]
        q = (torch.tensor([1.0, 2.0, 3.0, 4.0]) + EPS) ** ALPHA
        assert p_value(counts.numpy(), (q / q.sum()).numpy()) > 0.001
    finally:
        rb.update_priority(torch.arange(NUM_SHARDS * ROWS_PER_SHARD), priority)


@pytest.mark.timeout(600)
def test_a_bad_priority_update_is_refused_before_any_shard_changes(filled):
    rb, _ = filled
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="one number or one per index"):
        rb.update_priority(torch.tensor([0, 1, 2]), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="`index`"):
        rb.update_priority(torch.tensor([-1]), 1.0)


# -- uniform draws and routing ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def uniform(cluster):
    rb = ShardedRayReplayBuffer(num_shards=3, route_key="collector_id", replay_buffer_cls=ReplayBuffer,
                                sampler=RandomSampler, storage=functools.partial(LazyTensorStorage, 4_000),
                                batch_size=16, remote_config=NO_CPU)  # fmt: skip
    yield rb
    rb.close()


@pytest.fixture
def routed(uniform):
    uniform.empty()
    return uniform


def _rows(n: int, collector: int, start: int = 0) -> TensorDict:
    return TensorDict(obs=torch.arange(start, start + n), collector_id=torch.full((n,), collector), batch_size=[n])


@pytest.mark.timeout(600)
def test_rows_go_to_the_shard_their_route_key_names(routed):
    mixed = TensorDict(obs=torch.arange(10), collector_id=torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
                       batch_size=[10])  # fmt: skip
    index = routed.extend(mixed)
    assert (index % 3).tolist() == [c % 3 for c in range(10)]
    assert routed.shard_lengths() == [4, 3, 3]
    assert torch.equal(routed[index]["obs"], torch.arange(10))
    single = routed.add(TensorDict(obs=torch.tensor(100), collector_id=torch.tensor(5)))
    assert single % 3 == 2 and routed[torch.tensor([single])]["obs"].tolist() == [100]
    assert routed[single]["obs"].item() == 100 and routed[int(index[4])]["obs"].item() == 4


@pytest.mark.timeout(600)
def test_uniform_draws_follow_the_shards_sizes(routed):
    for collector, n in ((0, 500), (1, 1_500), (2, 3_000)):
        routed.extend(_rows(n, collector, start=collector * 10_000))
    routed.manual_seed(3)
    assert routed.shard_lengths() == [500, 1_500, 3_000]
    batch, info = routed.sample(50_000, return_info=True)
    assert "index" not in batch.keys()  # a ReplayBuffer's batch: the indices are in info only
    counts = np.bincount(info["index"].numpy() % 3, minlength=3)
    assert p_value(counts, np.array([500, 1_500, 3_000]) / 5_000) > 0.01
    # within shard 2, rows are uniform: 10 bins of 300 rows
    slots = (info["index"][info["index"] % 3 == 2] // 3).numpy()
    assert p_value(np.bincount(slots // 300, minlength=10), np.full(10, 0.1)) > 0.01
    assert torch.equal(batch["obs"], routed[info["index"]]["obs"])


@pytest.mark.timeout(600)
def test_round_robin_sends_each_write_whole_to_the_next_shard(cluster):
    rb = ShardedRayReplayBuffer(num_shards=2, storage=functools.partial(LazyTensorStorage, 100),
                                remote_config=NO_CPU)  # fmt: skip
    try:
        first, second, third = (rb.extend(torch.arange(4) + 10 * k) for k in range(3))
        assert len(set((first % 2).tolist())) == 1 and (second % 2)[0] != (first % 2)[0]
        assert torch.equal(third % 2, first % 2)
        assert sorted(rb.shard_lengths()) == [4, 8]
        assert torch.equal(rb[second], torch.arange(10, 14))
        assert rb.add(torch.tensor(7), shard=1) % 2 == 1
    finally:
        rb.close()


@pytest.mark.timeout(600)
def test_a_bad_write_is_refused_before_any_shard_is_written(routed):
    with pytest.raises(KeyError, match="route_key='collector_id'"):
        routed.extend(TensorDict(obs=torch.arange(3), batch_size=[3]))
    with pytest.raises(TypeError, match="needs a TensorDict"):
        routed.extend(torch.arange(3))
    with pytest.raises(ValueError, match="`shard`=3 is out of range"):
        routed.extend(_rows(2, 0), shard=3)
    with pytest.raises(TypeError, match="`shard`"):
        routed.extend(_rows(2, 0), shard="1")
    assert len(routed) == 0


@pytest.mark.timeout(600)
def test_sampling_an_empty_sharded_buffer_raises_torchrls_phrase(routed):
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage.*none of the 3 shards"):
        routed.sample()
    with pytest.raises(TypeError, match="`batch_size`"):
        routed.sample(2.5)


# -- clients ---------------------------------------------------------------------------------------------------------
def _collect(clients) -> list:
    return [client.extend(_rows(8, k, start=100 * k)).tolist() for k, client in enumerate(clients)]


@pytest.mark.timeout(600)
def test_clients_write_from_a_ray_task_and_sample_from_the_driver(routed, cluster):
    clients = [pickle.loads(pickle.dumps(c)) for c in routed.clients(3)]
    written = cluster.get(cluster.remote(num_cpus=0)(_collect).remote(clients), timeout=200)
    assert sorted(map(len, written)) == [8, 8, 8] and routed.shard_lengths() == [8, 8, 8]
    batch, info = clients[0].sample(return_info=True)
    assert batch.shape == (16,) and torch.equal(batch["obs"], routed[info["index"]]["obs"])
    assert pickle.loads(pickle.dumps(routed)).num_shards == 3  # pickling the owner gives a client
    with pytest.raises(AttributeError):
        clients[0].close  # noqa: B018 - a client has no lifecycle rights


@pytest.mark.timeout(600)
def test_tensordict_priority_updates_route_by_the_sampled_index(cluster):
    rb = ShardedRayReplayBuffer(num_shards=2, replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=1.0,
                                beta=1.0, eps=0.0, storage=functools.partial(LazyTensorStorage, 50),
                                batch_size=32, remote_config=NO_CPU)  # fmt: skip
    try:
        rb.extend(TensorDict(obs=torch.arange(20), batch_size=[20]), shard=0)
        rb.extend(TensorDict(obs=torch.arange(20, 40), batch_size=[20]), shard=1)
        batch = rb.sample()
        batch["td_error"] = (batch["obs"] == 25).float() * 2.0  # every drawn row but obs 25 gets priority 0
        rb.update_tensordict_priority(batch)
        drawn = rb.sample()
        undrawn = set(range(40)) - set(batch["obs"].tolist())  # rows not drawn keep their priority of 1
        assert set(drawn["obs"].tolist()) <= undrawn | {25}
        weights = dict(zip(drawn["obs"].tolist(), drawn["priority_weight"].tolist()))
        if 25 in weights and batch["obs"].eq(25).any():
            assert weights[25] == pytest.approx(0.5)  # (2 / 1) ** -1 with the global minimum 1
    finally:
        rb.close()


@pytest.mark.timeout(600)
def test_dataloader_workers_draw_over_all_shards(routed):
    from torch.utils.data import DataLoader

    from torchrl.data import tensordict_collate

    for collector in range(3):
        routed.extend(_rows(10, collector, start=100 * collector))
    dataset = routed.as_dataset(num_batches=4)
    assert len(dataset) == 4
    batches = list(DataLoader(dataset, batch_size=None, collate_fn=tensordict_collate))  # the main process
    assert [b.shape for b in batches] == [(16,)] * 4
    loader = DataLoader(dataset, batch_size=None, collate_fn=tensordict_collate, num_workers=1,
                        multiprocessing_context="spawn", timeout=300)  # fmt: skip
    obs = torch.cat([batch["obs"] for batch in loader])
    assert obs.shape == (64,) and set(obs.tolist()) <= {100 * c + k for c in range(3) for k in range(10)}


def test_as_dataset_needs_a_batch_size():
    client = ShardedRayReplayBufferClient(["shard-0", "shard-1"], None, None)  # checked before any call
    with pytest.raises(ValueError, match="batch_size=N"):
        client.as_dataset()


@pytest.mark.timeout(600)
def test_every_handle_draws_from_one_budget_over_all_shards(cluster):
    from torchrl.data import SampleToInsertRatio

    limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=2, error_buffer=4.0)  # diff in [-2, 6]
    rb = ShardedRayReplayBuffer(num_shards=2, storage=functools.partial(LazyTensorStorage, 100),
                                rate_limiter=limiter, remote_config=NO_CPU)  # fmt: skip
    try:
        first, second = (pickle.loads(pickle.dumps(c)) for c in rb.clients(2))
        first.extend(torch.arange(4), shard=0)
        second.extend(torch.arange(2), shard=1)  # 6 inserts: the most the error buffer allows ahead
        with pytest.raises(TimeoutError, match="insert budget for 1 rows within 0.2 seconds"):
            first.extend(torch.arange(1), timeout=0.2)
        assert first.sample(4).shape == (4,) and second.sample(4).shape == (4,)  # 8 records: the budget
        with pytest.raises(RuntimeError, match="does not currently permit this sample"):
            first.sample(1)
        stats = rb.stats()
        assert stats["write_count"] == 6 and stats["samples_returned"] == 8 and stats["shard_lengths"] == [4, 2]
        first.extend(torch.arange(1))  # sampling caught up: inserts are permitted again
        assert second.sample(1).shape == (1,)
        assert rb.stats()["samples_returned"] == 9
    finally:
        rb.close()
