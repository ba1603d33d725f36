"""Prioritized buffers: PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer and a
TensorDictReplayBuffer over a PrioritizedSampler.

The invariant most tests check (:func:`_assert_priorities_follow_storage`): after any sequence of writes, the
raw priority of every stored cell equals the reduced ``priority_key`` entry of the item stored there, and both
segment trees hold ``(p + eps) ** alpha`` for it. It couples the storage layout with the sampler's positions,
so it holds whatever the write order, the ring-buffer wrap, the writer (top-k writers reject items) or the
storage layout (``ndim=2``, extended along either dim).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from helpers.assertions import CHI2_999, chi2
from helpers.factories import make_buffer, make_storage
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    RandomSampler,
    TensorDictMaxValueWriter,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    tensordict_collate,
)

BUFFERS = ("prioritized", "td_prioritized", "td_with_sampler")
TD_BUFFERS = ("td_prioritized", "td_with_sampler")
REDUCTIONS = ("max", "min", "sum", "mean", "median")


# -- factories -----------------------------------------------------------------------------------------------
def _make_buffer(kind: str, storage=None, *, alpha: float = 0.7, beta: float = 0.5, eps: float = 1e-8,
                 reduction: str = "max", priority_key="td_error", **kwargs):
    """A prioritized buffer of ``kind`` (see :data:`BUFFERS`) over ``storage`` (default: 20 lazy slots)."""
    storage = LazyTensorStorage(20) if storage is None else storage
    if kind == "prioritized":
        return make_buffer(cls=PrioritizedReplayBuffer, alpha=alpha, beta=beta, eps=eps, storage=storage, **kwargs)
    if kind == "td_prioritized":
        return make_buffer(cls=TensorDictPrioritizedReplayBuffer, alpha=alpha, beta=beta, eps=eps, reduction=reduction,
                           priority_key=priority_key, storage=storage, **kwargs)
    if kind == "td_with_sampler":
        sampler = PrioritizedSampler(storage.max_size, alpha, beta, eps=eps, reduction=reduction)
        return make_buffer(cls=TensorDictReplayBuffer, storage=storage, sampler=sampler, priority_key=priority_key,
                           **kwargs)
    raise ValueError(f"unknown buffer kind {kind!r}")


def _items(kind: str, start: int, n: int, priority=None, key="td_error"):
    """``n`` items with ids ``start ..``: a float tensor for PrioritizedReplayBuffer, else TensorDicts whose
    ``obs`` holds the id (and ``key`` the priorities, when given)."""
    ids = torch.arange(start, start + n, dtype=torch.float32)
    if kind == "prioritized":
        return ids
    td = TensorDict({"obs": ids.unsqueeze(-1)}, batch_size=[n])
    if priority is not None:
        td.set(key, torch.as_tensor(priority, dtype=torch.float32))
    return td


def _reference_reduce(p: np.ndarray, reduction: str) -> np.ndarray:
    """Independent numpy reductions of ``[N, M]`` priorities (median: the lower one, as torch.median)."""
    if reduction == "median":
        return np.sort(p, -1)[:, (p.shape[-1] - 1) // 2]
    return getattr(np, reduction)(p, -1)


def _q(p, eps: float, alpha: float) -> np.ndarray:
    return np.power(np.asarray(p, dtype=np.float64) + eps, alpha)


def _raw(rb, n: int | None = None) -> np.ndarray:
    n = len(rb) if n is None else n
    return rb.sampler._priority[:n].copy()


def _close(actual, expected) -> bool:
    """Raw priorities (float64) against values given as float32 tensors or Python floats."""
    return np.allclose(actual, np.asarray(expected, dtype=np.float32), rtol=1e-6, atol=0, equal_nan=True)


def _assert_tree_holds(rb, raw: np.ndarray) -> None:
    """Both trees hold ``(raw + eps) ** alpha`` at positions ``[0, len(raw))``."""
    sampler = rb.sampler
    expected = _q(raw, sampler.eps, sampler.alpha)
    positions = np.arange(raw.size)
    np.testing.assert_allclose(sampler._sum_tree[positions], expected, rtol=1e-6)
    np.testing.assert_allclose(sampler._min_tree[positions], expected, rtol=1e-6)


def _assert_priorities_follow_storage(rb, reduction: str = "max", key="td_error") -> None:
    """Every stored cell's priority is the reduced ``key`` entry stored with it (cells in row-major order)."""
    content = rb[:]
    n = len(rb)
    stored = content.get(key).reshape(n, -1).to(torch.float64).numpy()
    expected = _reference_reduce(stored, reduction)
    np.testing.assert_allclose(_raw(rb), expected, rtol=1e-5)
    _assert_tree_holds(rb, expected)


# -- new items get the max priority --------------------------------------------------------------------------
@pytest.mark.parametrize("storage", ["lazy", "list"])
@pytest.mark.parametrize("kind", BUFFERS)
def test_new_items_get_the_max_priority(kind, storage):
    rb = _make_buffer(kind, make_storage(storage, 20), batch_size=4)
    index = rb.extend(_items(kind, 0, 5))
    assert _close(_raw(rb), np.ones(5))  # nothing set yet: the default priority 1
    rb.update_priority(index, torch.tensor([0.5, 3.0, 1.0, 2.0, 0.1]))
    rb.extend(_items(kind, 5, 4))
    expected = np.array([0.5, 3.0, 1.0, 2.0, 0.1, 3.0, 3.0, 3.0, 3.0])
    assert _close(_raw(rb), expected)
    _assert_tree_holds(rb, expected)
    # the max is the largest ever set, even after the item holding it got a lower priority
    rb.update_priority(torch.tensor([1, 2]), torch.tensor([0.2, 7.0]))
    item = _items(kind, 9, 1)[0]
    assert rb.add(item) == 9
    rb.update_priority(2, 0.3)
    rb.extend(_items(kind, 10, 2))
    assert _close(_raw(rb)[[1, 2, 9, 10, 11]], [0.2, 0.3, 7.0, 7.0, 7.0])


@pytest.mark.parametrize("kind", BUFFERS)
def test_writes_that_bypass_the_buffer_reach_the_sampler(kind):
    """The sampler hears of writes through writer -> storage.mark_update -> buffer, not only rb.extend."""
    rb = _make_buffer(kind, batch_size=4)
    rb.extend(_items(kind, 0, 4))
    rb.update_priority(torch.arange(4), torch.tensor([0.1, 0.2, 5.0, 0.3]))
    rb.writer.extend(_items(kind, 4, 3))
    rb.writer.add(_items(kind, 7, 1)[0])
    assert _close(_raw(rb), [0.1, 0.2, 5.0, 0.3, 5.0, 5.0, 5.0, 5.0])


@pytest.mark.parametrize("kind", BUFFERS)
def test_overwritten_items_get_the_max_priority_again(kind):
    rb = _make_buffer(kind, LazyTensorStorage(6), batch_size=4)
    rb.extend(_items(kind, 0, 6))
    rb.update_priority(torch.arange(6), torch.tensor([0.1, 0.1, 0.1, 4.0, 0.1, 0.1]))
    index = rb.extend(_items(kind, 6, 3))  # wraps over slots 0, 1, 2
    assert index.tolist() == [0, 1, 2]
    assert _close(_raw(rb), [4.0, 4.0, 4.0, 4.0, 0.1, 0.1])


@pytest.mark.parametrize("kind", BUFFERS)
def test_empty_resets_priorities(kind):
    rb = _make_buffer(kind, batch_size=64, generator=torch.Generator().manual_seed(0))
    rb.extend(_items(kind, 0, 10))
    rb.update_priority(torch.arange(10), torch.arange(10.0) + 5)
    rb.empty()
    rb.extend(_items(kind, 0, 3))
    assert _close(_raw(rb, 10)[:3], np.ones(3))
    assert np.isnan(_raw(rb, 10)[3:]).all()  # nothing stale stays in the trees
    assert rb.sampler._sum_tree.query() == pytest.approx(3.0)
    _, info = rb.sample(return_info=True)
    assert info["index"].max() < 3


@pytest.mark.parametrize("kind", ["prioritized", "td_prioritized"])
def test_items_already_in_the_storage_are_sampleable(kind):
    storage = LazyTensorStorage(10)
    data = _items(kind, 0, 6)
    storage.set(torch.arange(6), data)
    rb = _make_buffer(kind, storage, batch_size=4, generator=torch.Generator().manual_seed(0))
    raw = _raw(rb, 10)
    assert np.array_equal(raw[:6], np.ones(6)) and np.isnan(raw[6:]).all()
    _, info = rb.sample(600, return_info=True)
    assert sorted(info["index"].unique().tolist()) == list(range(6))
    assert torch.equal(info["priority_weight"], torch.ones(600))


def test_default_storage_is_a_list_of_1000():
    for rb in (PrioritizedReplayBuffer(alpha=0.5, beta=0.5),
               TensorDictPrioritizedReplayBuffer(alpha=0.5, beta=0.5)):
        assert isinstance(rb.storage, ListStorage)
        assert rb.sampler.max_capacity == rb.storage.max_size == 1000


# -- priorities read from the data ---------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["td_error", ("nested", "err")], ids=["td_error", "nested"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_extend_reads_the_priority_key_and_reduces_extra_dims(kind, reduction, key):
    alpha, eps = 0.6, 1e-3
    rb = _make_buffer(kind, LazyTensorStorage(8), alpha=alpha, eps=eps, reduction=reduction,
                      priority_key=key, batch_size=4)
    g = torch.Generator().manual_seed(0)
    for start, n in ((0, 5), (5, 6)):  # the second write wraps around the ring buffer
        p = torch.rand(n, 3, 2, generator=g) * 4
        rb.extend(_items(kind, start, n, p, key=key))
        _assert_priorities_follow_storage(rb, reduction, key=key)
    last = _reference_reduce(p.reshape(6, -1).double().numpy(), reduction)
    np.testing.assert_allclose(_raw(rb)[[5, 6, 7, 0, 1, 2]], last, rtol=1e-6)
    # the tree holds (reduce(p) + eps) ** alpha, rounded to float32 (dtype=torch.float, as TorchRL's trees)
    expected = _q(_raw(rb), eps, alpha).astype(np.float32).astype(np.float64)
    np.testing.assert_array_equal(rb.sampler._sum_tree[np.arange(8)], expected)


@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_extend_reads_priorities_without_extra_dims(kind):
    rb = _make_buffer(kind, alpha=1.0, eps=0.0, batch_size=4)
    rb.extend(_items(kind, 0, 4, [0.5, 2.0, 0.0, 1.5]))
    assert _close(_raw(rb), [0.5, 2.0, 0.0, 1.5])
    rb.extend(_items(kind, 4, 1, [0.25]))
    assert _close(_raw(rb), [0.5, 2.0, 0.0, 1.5, 0.25])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_add_reads_the_priority_key(kind, reduction):
    rb = _make_buffer(kind, reduction=reduction, batch_size=4)
    p = torch.tensor([[0.5, 3.0], [1.0, 2.5], [0.0, 0.25]])
    rb.extend(_items(kind, 0, 2, torch.ones(2, 3, 2)))
    assert rb.add(_items(kind, 2, 1, p.unsqueeze(0))[0]) == 2
    _assert_priorities_follow_storage(rb, reduction)


@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_extend_with_update_priority_false_gives_the_max_priority(kind):
    rb = _make_buffer(kind, batch_size=4)
    rb.extend(_items(kind, 0, 3, [0.5, 6.0, 1.0]))
    rb.extend(_items(kind, 3, 2, [0.1, 0.2]), update_priority=False)
    assert _close(_raw(rb), [0.5, 6.0, 1.0, 6.0, 6.0])
    rb.extend(_items(kind, 5, 1, [9.0]), update_priority=True)
    assert _raw(rb)[5] == 9.0


@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_missing_priority_key_gives_the_max_priority(kind):
    rb = _make_buffer(kind, priority_key="my_error", batch_size=4)
    rb.extend(_items(kind, 0, 3, [4.0, 5.0, 6.0], key="td_error"))  # not the buffer's key: ignored
    assert _close(_raw(rb), np.ones(3))
    rb.update_priority(torch.arange(3), torch.tensor([0.5, 2.0, 1.0]))
    rb.extend(_items(kind, 3, 2, [4.0, 5.0], key="td_error"))
    assert _close(_raw(rb), [0.5, 2.0, 1.0, 2.0, 2.0])


def test_priority_key_ignored_by_a_uniform_tensordict_buffer():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=RandomSampler(), batch_size=4)
    rb.extend(_items("td_prioritized", 0, 5, torch.rand(5)))
    batch = rb.sample()
    rb.update_tensordict_priority(batch)  # a no-op, not an error
    assert "priority_weight" not in batch.keys()


@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_extend_of_items_with_a_batch_dim_reduces_their_priorities(kind):
    rb = _make_buffer(kind, LazyTensorStorage(10), batch_size=4)
    p = torch.rand(4, 3, generator=torch.Generator().manual_seed(0))
    rb.extend(TensorDict(obs=torch.zeros(4, 3), td_error=p, batch_size=[4, 3]))
    np.testing.assert_allclose(_raw(rb), p.amax(-1).double().numpy(), rtol=1e-6)


# -- sampled batches -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("kind", BUFFERS)
def test_sampled_batches_carry_index_and_importance_weights(kind, beta):
    alpha, eps = 0.7, 1e-8
    rb = _make_buffer(kind, alpha=alpha, beta=beta, eps=eps, batch_size=8,
                      generator=torch.Generator().manual_seed(0))
    rb.extend(_items(kind, 0, 8))
    p = torch.tensor([0.3, 1.0, 2.0, 0.05, 4.0, 1.5, 0.7, 2.5])
    rb.update_priority(torch.arange(8), p)
    data, info = rb.sample(4000, return_info=True)
    index, weight = info["index"], info["priority_weight"]
    if kind != "prioritized":
        assert torch.equal(data["index"], index)
        assert torch.equal(data["priority_weight"], weight)
        data = data["obs"].squeeze(-1)
    assert torch.equal(data, index.to(torch.float32))  # the batch holds the sampled items
    assert weight.dtype == torch.float32 and torch.isfinite(weight).all() and (weight <= 1).all()
    q = _q(p.numpy(), eps, alpha)
    expected = (q[index.numpy()] / q.min()) ** -beta
    np.testing.assert_allclose(weight.numpy(), expected, rtol=1e-6)
    least_likely = index == int(p.argmin())
    assert least_likely.any() and (weight[least_likely] == 1).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_priority_weights_have_the_requested_dtype(dtype):
    rb = PrioritizedReplayBuffer(alpha=0.5, beta=0.5, dtype=dtype, storage=LazyTensorStorage(10),
                                 batch_size=4)
    rb.extend(torch.arange(5.0))
    rb.update_priority(torch.arange(5), torch.arange(5.0) + 1)
    _, info = rb.sample(return_info=True)
    assert info["priority_weight"].dtype == dtype


@pytest.mark.parametrize("alpha", [0.5, 1.0])
@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_update_tensordict_priority_shapes_the_sampling_distribution(kind, alpha):
    n, eps = 16, 1e-6
    rb = _make_buffer(kind, alpha=alpha, beta=0.5, eps=eps, batch_size=n,
                      generator=torch.Generator().manual_seed(0))
    rb.extend(_items(kind, 0, n, torch.ones(n)))
    target = torch.linspace(0.1, 4.0, n)[torch.randperm(n, generator=torch.Generator().manual_seed(1))]
    # the learner's loop: sample, compute new errors, write them back (here until every item was seen)
    for _ in range(50):
        batch = rb.sample()
        batch["td_error"] = target[batch["index"]]
        rb.update_tensordict_priority(batch)
    np.testing.assert_allclose(_raw(rb), target.numpy(), rtol=1e-6)
    batch = rb.sample(100_000)
    assert torch.equal(batch["obs"].squeeze(-1), batch["index"].to(torch.float32))
    counts = np.bincount(batch["index"].numpy(), minlength=n)
    probs = _q(target.numpy(), eps, alpha)
    assert chi2(counts, probs / probs.sum()) < CHI2_999[n - 1]
    for wrong_alpha in (alpha - 0.2, alpha + 0.2):  # the test cannot pass with a wrong exponent
        wrong = _q(target.numpy(), eps, wrong_alpha)
        assert chi2(counts, wrong / wrong.sum()) > 10 * CHI2_999[n - 1]


@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_update_tensordict_priority_reduces_extra_dims_and_defaults_to_the_max(kind):
    rb = _make_buffer(kind, reduction="mean", batch_size=3, generator=torch.Generator().manual_seed(0))
    rb.extend(_items(kind, 0, 6))
    batch = rb.sample()
    batch["td_error"] = torch.tensor([[1.0, 3.0], [0.0, 1.0], [2.0, 2.0]])
    rb.update_tensordict_priority(batch)
    expected = {}
    for i, p in zip(batch["index"].tolist(), [2.0, 0.5, 2.0]):
        expected[i] = p  # the last write of a repeated index wins
    assert all(_raw(rb)[i] == p for i, p in expected.items())
    # a batch without the priority key: its items get the max priority
    del batch["td_error"]
    rb.update_priority(torch.arange(6), torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5, 9.0]))
    rb.update_tensordict_priority(batch)
    assert all(_raw(rb)[i] == 9.0 for i in batch["index"].tolist())


# -- index -1 entries ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", BUFFERS)
def test_update_priority_skips_index_minus_one(kind):
    rb = _make_buffer(kind, alpha=1.0, eps=0.0, batch_size=2)
    rb.extend(_items(kind, 0, 5))
    rb.update_priority(torch.tensor([0, -1, 2, -1]), torch.tensor([3.0, 100.0, 4.0, 200.0]))
    assert _close(_raw(rb), [3.0, 1.0, 4.0, 1.0, 1.0])
    assert rb.sampler.default_priority == 4.0  # a skipped value never becomes the max
    rb.update_priority([1, -1], [5.0, 6.0])
    rb.update_priority(torch.tensor([-1, -1]), torch.tensor([7.0, 8.0]))
    assert _close(_raw(rb), [3.0, 5.0, 4.0, 1.0, 1.0])
    assert rb.sampler._sum_tree.query(0, 5) == pytest.approx(14.0)


def test_top_k_writer_rejections_do_not_corrupt_priorities():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.8, beta=0.5, storage=LazyTensorStorage(6),
                                           writer=TensorDictMaxValueWriter(rank_key="score"), batch_size=4,
                                           generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    inserted_max = 0.0
    for step in range(8):
        n = 5
        score = torch.randn(n, generator=g) + step * 0.1
        td_error = torch.rand(n, generator=g) * 10
        data = TensorDict(obs=torch.randn(n, 2, generator=g), score=score, td_error=td_error, batch_size=[n])
        index = rb.extend(data)
        kept = index != -1
        if step:
            assert not kept.all()  # the grid does exercise rejected items
        inserted_max = max(inserted_max, float(td_error[kept].max()) if kept.any() else 0.0)
        _assert_priorities_follow_storage(rb)
        assert rb.sampler.default_priority == pytest.approx(inserted_max)
    # a rejected single item leaves everything as it was
    before = _raw(rb)
    rejected = TensorDict(obs=torch.zeros(2), score=torch.tensor(-100.0), td_error=torch.tensor(1e6))
    assert rb.add(rejected) is None
    assert _close(_raw(rb), before)
    # the learner's loop still works on the top-k content
    batch = rb.sample()
    batch["td_error"] = torch.full((4,), 0.25)
    rb.update_tensordict_priority(batch)
    _assert_tree_holds(rb, _raw(rb))
    assert all(_raw(rb)[i] == 0.25 for i in batch["index"].tolist())


# -- ndim=2 storages -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["envs_time", "time_envs"])
@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_ndim2_priorities_follow_the_stored_cells(kind, layout):
    envs = 3
    dim_extend = 1 if layout == "envs_time" else 0  # 1 is the default for ndim=2
    rb = _make_buffer(kind, LazyTensorStorage(12, ndim=2), reduction="sum", batch_size=5,
                      dim_extend=dim_extend, generator=torch.Generator().manual_seed(0))
    assert rb.dim_extend == dim_extend
    g = torch.Generator().manual_seed(1)
    for steps in (2, 3):  # 4 rows of 3 envs: the second write wraps over row 0
        shape = (envs, steps) if layout == "envs_time" else (steps, envs)
        data = TensorDict(obs=torch.randn(*shape, 2, generator=g),
                          td_error=torch.rand(*shape, 2, generator=g), batch_size=shape)
        rb.extend(data)
        assert rb.storage.shape == (4, envs)
        _assert_priorities_follow_storage(rb, "sum")
    # the cell of env 0 at the last step is the stored row 0 (2 + 3 steps written, 4 rows)
    last = data[0, -1] if layout == "envs_time" else data[-1, 0]
    assert float(rb.sampler._priority[0]) == pytest.approx(float(last["td_error"].sum()))


@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_ndim2_sampling_and_priority_updates(kind):
    rb = _make_buffer(kind, LazyTensorStorage(12, ndim=2), alpha=1.0, beta=1.0, eps=0.0, batch_size=6,
                      generator=torch.Generator().manual_seed(0))
    data = TensorDict(obs=torch.arange(12.0).reshape(3, 4), td_error=torch.ones(3, 4), batch_size=[3, 4])
    rb.extend(data)  # [envs=3, T=4] -> storage [4, 3]: cell (t, e) holds data[e, t]
    batch = rb.sample()
    assert batch["index"].shape == (6, 2) and batch.batch_size == (6,)
    t, e = batch["index"].unbind(-1)
    assert torch.equal(batch["obs"], data["obs"][e, t])
    assert torch.equal(batch["priority_weight"], torch.ones(6))
    # the learner writes new errors: the cells sampled take them, the others keep theirs
    batch["td_error"] = batch["obs"] + 1
    rb.update_tensordict_priority(batch)
    raw = _raw(rb).reshape(4, 3)
    for (ti, ei), value in zip(batch["index"].tolist(), batch["td_error"].tolist()):
        assert raw[ti, ei] == value
    untouched = np.ones((4, 3), dtype=bool)
    untouched[t.numpy(), e.numpy()] = False
    assert (raw[untouched] == 1.0).all()
    # cells of priority zero are never drawn
    rb.update_priority(torch.arange(12), torch.zeros(12))
    rb.update_priority((torch.tensor([2]), torch.tensor([1])), torch.tensor([3.0]))
    assert rb.sample(50)["index"].unique(dim=0).tolist() == [[2, 1]]


@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_ndim2_add_of_one_row_reads_its_priorities(kind):
    rb = _make_buffer(kind, LazyTensorStorage(12, ndim=2), batch_size=4)
    rb.extend(TensorDict(obs=torch.zeros(3, 2), td_error=torch.ones(3, 2), batch_size=[3, 2]))
    rb.add(TensorDict(obs=torch.zeros(3), td_error=torch.tensor([0.5, 2.0, 3.0]), batch_size=[3]))
    _assert_priorities_follow_storage(rb)


@pytest.mark.parametrize("kind", BUFFERS)
def test_ndim2_update_priority_skips_rows_with_minus_one(kind):
    rb = _make_buffer(kind, LazyTensorStorage(8, ndim=2), alpha=1.0, eps=0.0, batch_size=2, dim_extend=0)
    data = torch.zeros(2, 4)
    if kind != "prioritized":
        data = TensorDict(obs=data, batch_size=[2, 4])
    rb.extend(data)
    assert rb.storage.shape == (2, 4)
    index = torch.tensor([[0, 1], [-1, 2], [1, 3], [1, -1]])  # [N, ndim] coordinates
    rb.update_priority(index, torch.tensor([2.0, 50.0, 3.0, 60.0]))
    expected = np.ones(8)
    expected[[1, 7]] = [2.0, 3.0]
    assert _close(_raw(rb), expected)
    assert rb.sampler.default_priority == 3.0
    rb.update_priority((torch.tensor([-1, 0]), torch.tensor([0, 0])), torch.tensor([70.0, 0.5]))  # per-dim
    expected[0] = 0.5
    assert _close(_raw(rb), expected)


# -- state ---------------------------------------------------------------------------------------------------
def _filled(kind: str, generator: torch.Generator | None, **kwargs):
    rb = _make_buffer(kind, LazyTensorStorage(16), batch_size=5, generator=generator, **kwargs)
    rb.extend(_items(kind, 0, 12, None if kind == "prioritized" else torch.rand(12) + 0.1))
    rb.update_priority(torch.arange(6), torch.tensor([0.1, 4.0, 2.0, 0.5, 3.0, 1.0]))
    for _ in range(3):
        rb.sample()
    return rb


def _batches(rb, n: int = 3) -> list:
    out = []
    for _ in range(n):
        data, info = rb.sample(return_info=True)
        out.append((data, info["index"], info["priority_weight"]))
    return out


def _assert_same_batches(a: list, b: list) -> None:
    for (data_a, index_a, weight_a), (data_b, index_b, weight_b) in zip(a, b, strict=True):
        assert torch.equal(index_a, index_b) and torch.equal(weight_a, weight_b)
        assert (data_a == data_b).all()


@pytest.mark.parametrize("kind", BUFFERS)
def test_state_dict_round_trip_into_a_fresh_buffer(kind):
    rb = _filled(kind, torch.Generator().manual_seed(0))
    fresh = _make_buffer(kind, LazyTensorStorage(16), batch_size=5,
                         generator=torch.Generator().manual_seed(9))
    fresh.load_state_dict(rb.state_dict())
    assert _close(_raw(fresh), _raw(rb))
    _assert_same_batches(_batches(rb), _batches(fresh))
    # the max priority travels too: the next write gets the same priority in both
    for buffer in (rb, fresh):
        buffer.extend(_items(kind, 12, 2, None if kind == "prioritized" else torch.tensor([0.2, 0.3])))
    assert _close(_raw(fresh), _raw(rb))
    assert fresh.sampler.default_priority == rb.sampler.default_priority == 4.0


@pytest.mark.parametrize("kind", BUFFERS)
def test_pickle_round_trip(kind):
    rb = _filled(kind, torch.Generator().manual_seed(0))
    copy = pickle.loads(pickle.dumps(rb))
    assert type(copy) is type(rb) and isinstance(copy.sampler, PrioritizedSampler)
    assert _close(_raw(copy), _raw(rb))
    _assert_same_batches(_batches(rb), _batches(copy))
    copy.update_priority(torch.tensor([0]), torch.tensor([50.0]))  # the copy's sampler is its own
    assert _raw(rb)[0] == pytest.approx(0.1) and _raw(copy)[0] == 50.0
    assert copy.extend(_items(kind, 12, 1, None if kind == "prioritized" else [0.5])).tolist() == [12]


# -- prefetch and DataLoader ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", BUFFERS)
def test_prefetch_samples_and_follows_priority_updates(kind):
    prefetch = 2
    rb = _make_buffer(kind, alpha=1.0, eps=0.0, batch_size=6, prefetch=prefetch,
                      generator=torch.Generator().manual_seed(0))
    rb.extend(_items(kind, 0, 10))
    first = rb.sample(return_info=True)[1]
    assert first["index"].max() < 10 and (first["priority_weight"] <= 1).all()
    rb.update_priority(torch.arange(10), torch.tensor([0.0] * 7 + [1.0, 0.0, 2.0]))
    for _ in range(prefetch):  # batches drawn ahead before the update
        rb.sample()
    for _ in range(5):
        _, info = rb.sample(return_info=True)
        assert set(info["index"].tolist()) <= {7, 9}
        expected = torch.where(info["index"] == 7, 1.0, 0.5 ** rb.sampler.beta)
        assert torch.allclose(info["priority_weight"], expected)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("kind", ["prioritized", "td_prioritized"])
def test_dataset_of_a_prioritized_buffer_refuses_workers_when_not_shared(kind, start_method):
    rb = _make_buffer(kind, batch_size=4, generator=torch.Generator().manual_seed(0))
    rb.extend(_items(kind, 0, 8))
    loader = DataLoader(rb.as_dataset(num_batches=2, share_sampler=False), batch_size=None, num_workers=1,
                        multiprocessing_context=start_method, collate_fn=tensordict_collate, timeout=30)
    batches = None  # spawn refuses when starting the worker (iter), fork in the worker (first next)
    with pytest.raises(RuntimeError, match=r"PrioritizedSampler requires shared state.*share_sampler=False") as err:
        batches = iter(loader)
        next(batches)
    # the error's traceback holds the iterator in a reference cycle: break it so that the worker is shut down
    # here, not at a later garbage collection (which waits 5 s for it)
    err.value.__traceback__ = None
    del err, batches
    batches = list(DataLoader(rb.as_dataset(num_batches=3), batch_size=None, num_workers=0,
                              collate_fn=tensordict_collate))
    assert len(batches) == 3
    if kind != "prioritized":
        assert all((b["priority_weight"] <= 1).all() and b["index"].max() < 8 for b in batches)


# -- bad arguments -------------------------------------------------------------------------------------------
CLASSES = (PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"alpha": -0.5, "beta": 0.5}, ValueError, r"alpha must be greater or equal.*-0\.5"),
        ({"alpha": float("nan"), "beta": 0.5}, ValueError, r"`alpha`.*nan"),
        ({"alpha": 0.5, "beta": -1.0}, ValueError, r"`beta`.*-1\.0"),
        ({"alpha": "0.5", "beta": 0.5}, TypeError, r"`alpha`.*'0\.5'"),
        ({"alpha": 0.5, "beta": 0.5, "eps": -1e-3}, ValueError, r"`eps`"),
        ({"alpha": 0.5, "beta": 0.5, "sampler": RandomSampler()}, TypeError, r"its own PrioritizedSampler"),
        ({"alpha": 0.5, "beta": 0.5, "storage": [1, 2, 3]}, TypeError, r"`storage`.*list"),
        ({"alpha": 0.5, "beta": 0.5, "dtype": torch.long}, ValueError, r"`dtype`"),
    ],
    ids=["alpha<0", "alpha-nan", "beta<0", "alpha-str", "eps<0", "sampler", "storage", "dtype"],
)
def test_bad_constructor_arguments(cls, kwargs, error, match):
    with pytest.raises(error, match=match):
        cls(**kwargs)


def test_unknown_reduction():
    with pytest.raises(ValueError, match=r"`reduction`.*'norm'"):
        TensorDictPrioritizedReplayBuffer(alpha=0.5, beta=0.5, reduction="norm")


@pytest.mark.parametrize("data", [torch.arange(3.0), {"obs": torch.arange(3.0)}], ids=["tensor", "dict"])
def test_tensordict_buffer_refuses_other_data(data):
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.5, beta=0.5, storage=LazyTensorStorage(10))
    for method in (rb.extend, rb.add, rb.update_tensordict_priority):
        with pytest.raises(TypeError, match=r"takes a TensorDict"):
            method(data)
    assert len(rb) == 0


@pytest.mark.parametrize("kind", BUFFERS)
def test_bad_priority_updates(kind):
    rb = _make_buffer(kind, LazyTensorStorage(10), batch_size=2)
    rb.extend(_items(kind, 0, 4))
    before = _raw(rb, 10)
    with pytest.raises(ValueError, match=r"`priority`"):
        rb.update_priority(torch.arange(2), torch.tensor([1.0, -2.0]))
    with pytest.raises(ValueError, match=r"`priority`"):
        rb.update_priority(torch.arange(2), torch.tensor([1.0, float("inf")]))
    with pytest.raises(IndexError, match=r"never written, e\.g\. \[10\]"):
        rb.update_priority(torch.tensor([0, 10]), torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"`priority`"):
        rb.update_priority(torch.arange(3), torch.ones(2))
    np.testing.assert_array_equal(_raw(rb, 10), before)  # a refused update changes nothing


@pytest.mark.parametrize("kind", TD_BUFFERS)
def test_update_tensordict_priority_needs_the_index(kind):
    rb = _make_buffer(kind, batch_size=2)
    rb.extend(_items(kind, 0, 4, torch.ones(4)))
    batch = rb.sample()
    del batch["index"]
    with pytest.raises(KeyError, match=r"'index'"):
        rb.update_tensordict_priority(batch)
