"""DataParallelReplayBufferClient: data-parallel ranks drawing their shares of global batches from one buffer.

- Over a Ray-hosted buffer, with two gloo ranks on localhost (forkserver processes that join the test's Ray
  cluster through the clients they receive): each rank gets ``B / W`` items per step, the ranks' draws of one
  epoch of a sampler without replacement are disjoint and cover the buffer (one global draw), and priority
  updates made by ranks reach the owner and shape every rank's next draws.
- In this process, over a local ReplayBuffer (TorchRL's class wraps any client with the buffer's methods) and over
  a Ray client: the split, the forwarding, the hidden names, pickling, the owner's prefetch refusal, waiting, and
  every argument error.

One local Ray cluster (``ray.init(num_cpus=2, include_dashboard=False)``, usage statistics off) serves the module;
its actors ask for no CPU so that they never wait for one another.
"""

from __future__ import annotations

import os

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before ray is imported: nothing leaves this machine

import copy
import functools
import pickle
import threading

import pytest
import torch
import torch.distributed as dist
from helpers.data_parallel_ranks import GLOBAL_BATCH, HOT_PRIORITY, ITEMS, PRIORITY_DRAWS, STEPS, rank_main
from helpers.extras import require
from helpers.factories import make_buffer

from torchrl.data import (
    DataParallelReplayBufferClient,
    LazyTensorStorage,
    PrioritizedReplayBuffer,
    RayReplayBuffer,
    ReplayBuffer,
    SamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.distributed import (
    DATA_PARALLEL_INDIVISIBLE,
    DATA_PARALLEL_ITERATION,
    DATA_PARALLEL_NO_BATCH_SIZE,
)
from torchrl.data.replay_buffers.replay_buffers._checks import DATA_PARALLEL_PREFETCH

pytestmark = [pytest.mark.extras, pytest.mark.multiprocess]

WORLD_SIZE = 2
NO_CPU = {"num_cpus": 0}


@pytest.fixture(scope="module")
def ray_module():
    ray = require("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def make_rb(ray_module):
    """Builds RayReplayBuffers and closes them at the end of the test, whatever happens."""
    made = []

    def make(**kwargs):
        rb = RayReplayBuffer(remote_config=NO_CPU, **kwargs)
        made.append(rb)
        return rb

    yield make
    for rb in made:
        rb.close()


def local_buffer(**kwargs) -> ReplayBuffer:
    """A local buffer of ``ITEMS`` items whose values are their indices."""
    kwargs.setdefault("batch_size", GLOBAL_BATCH)
    return make_buffer(cls=ReplayBuffer, capacity=ITEMS, kind="tensor", data=torch.arange(ITEMS), **kwargs)


# -- gloo ranks over a Ray-hosted buffer ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rank_results(ray_module, tmp_path_factory):
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs torch.distributed gloo")
    root = tmp_path_factory.mktemp("data_parallel")
    epoch_rb = RayReplayBuffer(storage=functools.partial(LazyTensorStorage, ITEMS), sampler=SamplerWithoutReplacement,
                               batch_size=GLOBAL_BATCH, remote_config=NO_CPU)  # fmt: skip
    priority_rb = RayReplayBuffer(storage=functools.partial(LazyTensorStorage, ITEMS), alpha=1.0, beta=1.0,
                                  replay_buffer_cls=PrioritizedReplayBuffer, remote_config=NO_CPU)  # fmt: skip
    try:
        epoch_rb.extend(torch.arange(ITEMS))
        priority_rb.extend(torch.arange(ITEMS))
        epoch_clients = [epoch_rb.data_parallel(rank=r, world_size=WORLD_SIZE) for r in range(WORLD_SIZE)]
        context = torch.multiprocessing.start_processes(
            rank_main,
            # Ray's auth mode of this cluster (ray.init sets RAY_AUTH_MODE here): a forkserver started by an
            # earlier test, before ray.init, would hand the ranks an environment without it
            args=(WORLD_SIZE, str(root / "init"), epoch_clients, priority_rb.client(), str(root),
                  os.environ.get("RAY_AUTH_MODE")),
            nprocs=WORLD_SIZE,
            join=False,
            start_method="forkserver",
        )
        try:
            for _ in range(30):  # at most 5 minutes; a dead rank raises at once
                if context.join(timeout=10):
                    break
            else:
                raise TimeoutError("the gloo ranks did not finish within 5 minutes")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        results = [torch.load(root / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD_SIZE)]
        owner_draw = priority_rb.sample(PRIORITY_DRAWS)  # the owner's own view of the ranks' updates
        yield results, owner_draw
    finally:
        epoch_rb.close()
        priority_rb.close()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ranks_draw_disjoint_shares_that_cover_one_epoch_of_the_owner(rank_results):
    results, _ = rank_results
    share = GLOBAL_BATCH // WORLD_SIZE
    for rank, result in enumerate(results):
        assert result["identity"] == (rank, WORLD_SIZE, GLOBAL_BATCH, ITEMS)  # a pickled client, global len()
        assert result["epoch"].shape == (STEPS, share)  # B / W items per step
    everything = torch.cat([r["epoch"].flatten() for r in results])
    assert torch.equal(everything.sort().values, torch.arange(ITEMS))  # disjoint, complete: one global epoch
    for result in results:  # the gloo collective saw the same epoch on every rank
        assert torch.equal(result["gathered"], torch.stack([r["epoch"] for r in results]))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_priority_updates_from_ranks_reach_the_owner_and_every_rank(rank_results):
    results, owner_draw = rank_results
    hot = {0, 1}  # rank r gave item r the priority HOT_PRIORITY; the other 22 items keep priority 1
    assert HOT_PRIORITY > 1e6
    for result in results:
        assert result["priority_draw"].shape == (PRIORITY_DRAWS // WORLD_SIZE,)
        assert torch.equal(result["priority_draw"], result["priority_index"])  # values are their indices
    ranks_drew = set(torch.cat([r["priority_draw"] for r in results]).tolist())
    assert ranks_drew == hot  # both updates shape every rank's draws (either alone would leave the other item out)
    assert set(owner_draw.tolist()) == hot


# -- in this process: a local ReplayBuffer as the client ----------------------------------------------------------
def test_ranks_over_a_local_buffer_split_one_global_epoch():
    rb = local_buffer(sampler=SamplerWithoutReplacement())
    ranks = [DataParallelReplayBufferClient(rb, rank=r, world_size=4) for r in range(4)]
    draws = [rank.sample() for _ in range(STEPS) for rank in ranks]
    assert {d.numel() for d in draws} == {GLOBAL_BATCH // 4}
    assert torch.equal(torch.cat(draws).sort().values, torch.arange(ITEMS))
    batch, info = ranks[1].sample(16, return_info=True)  # a global batch passed to sample(), and the owner's info
    assert batch.numel() == 4 and torch.equal(batch, info["index"])


def test_a_uniform_owner_gives_each_rank_its_share_of_the_global_distribution():
    rb = local_buffer()  # RandomSampler: uniform over the items
    torch.manual_seed(0)
    rank = DataParallelReplayBufferClient(rb, rank=1, world_size=2)
    counts = torch.bincount(torch.cat([rank.sample(64) for _ in range(150)]), minlength=ITEMS).float()
    assert counts.sum() == 150 * 32
    expected = counts.sum() / ITEMS
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 60  # 23 degrees of freedom: p < 1e-4 above this


def test_properties_and_the_global_batch_size_read_once():
    rb = local_buffer()
    dp = DataParallelReplayBufferClient(rb, rank=1, world_size=2)
    assert (dp.rank, dp.world_size, dp.batch_size) == (1, 2, GLOBAL_BATCH)
    with pytest.raises(AttributeError):
        dp.rank = 0  # properties, not settable
    assert dp.sample().numel() == GLOBAL_BATCH // 2


def test_writes_priorities_indexing_and_len_go_to_the_owner():
    rb = make_buffer(cls=PrioritizedReplayBuffer, capacity=ITEMS, kind="tensor", alpha=1.0, beta=1.0, batch_size=4)
    dp = DataParallelReplayBufferClient(rb, rank=0, world_size=2)
    index = dp.extend(torch.arange(10))
    assert torch.equal(index, torch.arange(10)) and len(rb) == len(dp) == 10
    assert dp.add(torch.tensor(10)) == 10 and len(rb) == 11
    dp[3] = torch.tensor(33)
    assert rb[3] == 33 and dp[3] == 33
    dp.update_priority(torch.arange(11), torch.tensor([1e9] + [1e-9] * 10))
    assert set(rb.sample(32).tolist()) == {0}  # the owner's sampler holds the rank's priorities
    assert dp.write_count == rb.write_count == 11  # other public names: the client's
    assert dp.stats()["size"] == 11


def test_next_and_iteration_are_refused_with_the_torchrl_phrase():
    dp = DataParallelReplayBufferClient(local_buffer(), rank=0, world_size=2)
    with pytest.raises(DATA_PARALLEL_ITERATION.type, match=DATA_PARALLEL_ITERATION.phrase):
        dp.next()
    with pytest.raises(RuntimeError, match=r"does not support shared next\(\) or iteration"):
        iter(dp)
    with pytest.raises(RuntimeError, match=r"Call sample\(\) explicitly on every rank"):
        for _ in dp:
            pass


@pytest.mark.parametrize("name", ["client", "close", "shutdown", "start"])
def test_the_wrapped_client_and_the_lifecycle_are_hidden(name):
    dp = DataParallelReplayBufferClient(local_buffer(), rank=0, world_size=2)
    assert not hasattr(dp, name)
    with pytest.raises(AttributeError, match=rf"no attribute '{name}': a rank has no lifecycle rights"):
        getattr(dp, name)


@pytest.mark.parametrize("name", ["__deepcopy__", "_storage", "_sample"])
def test_private_names_are_not_forwarded(name):
    dp = DataParallelReplayBufferClient(local_buffer(), rank=0, world_size=2)
    with pytest.raises(AttributeError, match=rf"has no attribute '{name}'"):
        getattr(dp, name)


def test_a_rank_client_pickles_and_copies_with_its_client():
    dp = DataParallelReplayBufferClient(local_buffer(sampler=SamplerWithoutReplacement()), rank=1, world_size=2)
    for other in (pickle.loads(pickle.dumps(dp)), copy.deepcopy(dp)):
        assert (other.rank, other.world_size, other.batch_size, len(other)) == (1, 2, GLOBAL_BATCH, ITEMS)
        assert other.sample().numel() == GLOBAL_BATCH // 2


# -- argument errors: each before anything is drawn ---------------------------------------------------------------
@pytest.mark.parametrize(
    "rank, world_size, error, match",
    [
        (True, 2, TypeError, r"`rank` must be an int \(not a bool\), got True"),
        (0.0, 2, TypeError, r"`rank` must be an int \(not a bool\), got 0.0 \(float\)"),
        (0, False, TypeError, r"`world_size` must be an int \(not a bool\), got False"),
        (0, "2", TypeError, r"`world_size` must be an int \(not a bool\), got '2' \(str\)"),
        (0, 0, ValueError, r"`world_size` must be a positive int .*got 0"),
        (0, -2, ValueError, r"`world_size` must be a positive int .*got -2"),
        (2, 2, ValueError, r"`rank` must be in \[0, world_size\) = \[0, 2\), got rank=2"),
        (-1, 2, ValueError, r"`rank` must be in \[0, world_size\) = \[0, 2\), got rank=-1"),
    ],
)
def test_rank_and_world_size_are_checked(rank, world_size, error, match):
    with pytest.raises(error, match=match):
        DataParallelReplayBufferClient(local_buffer(), rank=rank, world_size=world_size)


def test_rank_and_world_size_are_keyword_only():
    with pytest.raises(TypeError):
        DataParallelReplayBufferClient(local_buffer(), 0, 2)


def test_no_batch_size_anywhere_raises_the_torchrl_phrase():
    dp = DataParallelReplayBufferClient(local_buffer(batch_size=None), rank=0, world_size=2)
    assert dp.batch_size is None
    with pytest.raises(DATA_PARALLEL_NO_BATCH_SIZE.type, match="batch_size not specified"):
        dp.sample()
    assert dp.sample(4).numel() == 2  # a global batch size passed to sample() is enough


@pytest.mark.parametrize("batch_size, world_size", [(5, 2), (9, 4), (2, 3)])
def test_a_global_batch_size_not_divisible_by_world_size_is_refused_verbatim(batch_size, world_size):
    rb = local_buffer()
    dp = DataParallelReplayBufferClient(rb, rank=0, world_size=world_size)
    before = rb.stats()["sample_calls"]
    message = (f"The global batch size must be divisible by world_size, got batch_size={batch_size} and "
               f"world_size={world_size}.")  # fmt: skip
    with pytest.raises(DATA_PARALLEL_INDIVISIBLE.type) as err:
        dp.sample(batch_size)
    assert message in str(err.value)
    assert rb.stats()["sample_calls"] == before  # nothing drawn


def test_a_default_batch_size_not_divisible_by_world_size_is_refused():
    dp = DataParallelReplayBufferClient(local_buffer(batch_size=6), rank=0, world_size=4)
    with pytest.raises(ValueError, match=r"got batch_size=6 and world_size=4\."):
        dp.sample()


@pytest.mark.parametrize(
    "batch_size, error, match",
    [
        (True, TypeError, r"`batch_size` must be a positive int, got True"),
        (4.0, TypeError, r"`batch_size` must be a positive int, got 4.0"),
        (0, ValueError, r"`batch_size` must be a positive int, got 0"),
        (-4, ValueError, r"`batch_size` must be a positive int, got -4"),
    ],
)
def test_a_bad_global_batch_size_is_refused(batch_size, error, match):
    dp = DataParallelReplayBufferClient(local_buffer(), rank=0, world_size=2)
    with pytest.raises(error, match=match):
        dp.sample(batch_size)


def test_an_owner_that_prefetches_refuses_data_parallel_draws():
    rb = local_buffer(prefetch=2)
    dp = DataParallelReplayBufferClient(rb, rank=0, world_size=2)
    with pytest.raises(DATA_PARALLEL_PREFETCH.type, match=DATA_PARALLEL_PREFETCH.phrase) as err:
        dp.sample()
    assert "prefetch=2" in str(err.value)
    assert rb.sample().numel() == GLOBAL_BATCH  # the buffer itself still prefetches and samples


# -- in this process: a Ray client ----------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_ray_buffer_and_client_data_parallel_wrap_a_client_without_lifecycle_rights(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, ITEMS), sampler=SamplerWithoutReplacement,
                 batch_size=GLOBAL_BATCH)  # fmt: skip
    rb.extend(torch.arange(ITEMS))
    ranks = [rb.data_parallel(rank=0, world_size=2), rb.client().data_parallel(rank=1, world_size=2)]
    assert all(isinstance(r, DataParallelReplayBufferClient) for r in ranks)
    assert [(r.rank, r.world_size, r.batch_size, len(r)) for r in ranks] == [(0, 2, 8, ITEMS), (1, 2, 8, ITEMS)]
    draws = [rank.sample() for _ in range(STEPS) for rank in ranks]
    assert torch.equal(torch.cat(draws).sort().values, torch.arange(ITEMS))
    assert not hasattr(ranks[0], "close")
    copied = pickle.loads(pickle.dumps(ranks[0]))
    assert copied.rank == 0 and len(copied) == ITEMS
    assert rb.is_alive  # nothing a rank did closed the owner


@pytest.mark.timeout(180)
def test_a_ray_owner_that_prefetches_refuses_data_parallel_draws(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, ITEMS), batch_size=4, prefetch=2)
    rb.extend(torch.arange(ITEMS))
    dp = rb.data_parallel(rank=0, world_size=2)
    with pytest.raises(RuntimeError, match=DATA_PARALLEL_PREFETCH.phrase):
        dp.sample()


@pytest.mark.timeout(180)
def test_a_ray_rank_waits_in_its_own_process_for_data(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, ITEMS), batch_size=4)
    dp = rb.data_parallel(rank=1, world_size=2)
    with pytest.raises(TimeoutError):
        dp.sample(wait=True, timeout=0.2)
    writer = threading.Timer(0.2, rb.extend, args=(torch.arange(4),))
    writer.start()
    try:
        batch, info = dp.sample(8, True, wait=True, timeout=60.0)  # the owner's sample arguments pass through
    finally:
        writer.join()
    assert batch.numel() == 4 and torch.equal(batch, info["index"])
    cancel = threading.Event()
    cancel.set()
    rb.empty()
    with pytest.raises(RuntimeError):
        dp.sample(wait=True, cancel_event=cancel)
