"""PrioritizedSampler: sampling follows p ** alpha, weights, max priority for new items, state and errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from helpers.assertions import CHI2_999, chi2

from torchrl.data.replay_buffers.samplers.prioritized import PrioritizedSampler, reduce_priority
from torchrl.data.replay_buffers.samplers.random import RandomSampler
from torchrl.data.replay_buffers.storages import LazyTensorStorage


def _storage(n: int, ndim: int = 1, max_size: int | None = None):
    """A LazyTensorStorage holding ``n`` items (cells); for ndim=2 rows of 4 environments."""
    if ndim == 1:
        storage = LazyTensorStorage(max_size or n)
        storage.set(torch.arange(n), torch.arange(n, dtype=torch.float32))
    else:
        assert n % 4 == 0
        storage = LazyTensorStorage(max_size or n, ndim=2)
        storage.set(torch.arange(n // 4), torch.arange(n, dtype=torch.float32).reshape(n // 4, 4))
    assert len(storage) == n
    return storage


def _flat(index, storage) -> torch.Tensor:
    if storage.ndim == 1:
        return index
    return torch.stack(index, -1) @ torch.tensor([storage.shape[1], 1])


def _q(sampler: PrioritizedSampler, p: float) -> float:
    """What the trees hold for the raw priority ``p``: ``(p + eps) ** alpha`` at the precision of the leaves
    (float32 for the default ``dtype=torch.float``, as TorchRL's float32 trees)."""
    q = (p + sampler.eps) ** sampler.alpha
    return q if sampler.dtype is torch.float64 else float(np.float32(q))


def _sampler(capacity: int, *, seed: int = 0, **kwargs) -> PrioritizedSampler:
    kwargs = {"alpha": 0.7, "beta": 0.5, **kwargs}
    sampler = PrioritizedSampler(capacity, **kwargs)
    sampler._rng = torch.Generator().manual_seed(seed)
    return sampler


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_sampling_frequencies_match_priorities_to_the_alpha(alpha, ndim):
    n = 20 if ndim == 1 else 24
    storage = _storage(n, ndim)
    sampler = _sampler(n, alpha=alpha, eps=1e-3)
    priority = torch.rand(n, generator=torch.Generator().manual_seed(1)) * 5
    sampler.update_priority(torch.arange(n), priority)
    draws = 200_000
    index, info = sampler.sample(storage, draws)
    counts = np.bincount(_flat(index, storage).numpy(), minlength=n)
    q = (priority.double().numpy() + 1e-3) ** alpha
    statistic = chi2(counts, q / q.sum())
    assert statistic < CHI2_999[n - 1]
    # the same test rejects a distribution that is only slightly wrong (another alpha), so it has power
    q_wrong = (priority.double().numpy() + 1e-3) ** (alpha + 0.1)
    assert chi2(counts, q_wrong / q_wrong.sum()) > 3 * CHI2_999[n - 1]
    assert info["priority_weight"].shape == (draws,)


def test_zero_priority_items_and_items_past_the_storage_length_are_never_sampled():
    capacity, n = 64, 40
    storage = _storage(n, max_size=capacity)
    sampler = _sampler(capacity, alpha=1.0, eps=0.0)
    sampler.extend(torch.arange(n))
    sampler.update_priority(torch.arange(0, n, 3), 0.0)
    sampler.update_priority(torch.arange(n, capacity), 100.0)  # priorities of empty slots: never drawn
    index, info = sampler.sample(storage, 50_000)
    assert index.min() >= 0 and index.max() < n
    assert (index % 3 != 0).all()
    assert torch.isfinite(info["priority_weight"]).all()


def test_priorities_past_the_storage_length_stay_unsampled_after_growth_and_reload():
    # Sampling skips range queries while no priority lies past len(storage); a priority set there (directly
    # or by a loaded state) must switch back to them, also for the weights' minimum.
    capacity = 32
    storage, sampler = _storage(8, max_size=capacity), _sampler(capacity, alpha=1.0, eps=0.0)
    sampler.extend(torch.arange(8))
    index, _ = sampler.sample(storage, 2000)
    assert index.max() < 8
    sampler.update_priority(torch.tensor([20]), 1e6)
    sampler.update_priority(torch.tensor([21]), 1e-6)  # smaller than any stored priority
    index, info = sampler.sample(storage, 2000)
    assert index.max() < 8 and (info["priority_weight"] == 1).all()
    clone = _sampler(capacity, alpha=1.0, eps=0.0)
    clone.load_state_dict(sampler.state_dict())
    index, info = clone.sample(storage, 2000)
    assert index.max() < 8 and (info["priority_weight"] == 1).all()
    storage.set(torch.arange(8, 24), torch.arange(8, 24).float())  # now position 20 is stored: it dominates
    index, _ = clone.sample(storage, 2000)
    assert (index == 20).float().mean() > 0.99


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0, 3.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_weights_are_normalized_importance_weights(beta, dtype):
    n = 16
    storage = _storage(n)
    sampler = _sampler(n, alpha=0.8, beta=beta, dtype=dtype)
    priority = torch.linspace(0.1, 4.0, n)
    sampler.update_priority(torch.arange(n), priority)
    index, info = sampler.sample(storage, 20_000)
    weight = info["priority_weight"]
    assert weight.dtype == dtype and torch.isfinite(weight).all()
    assert (weight > 0).all() and (weight <= 1).all()
    q = (priority.double() + sampler.eps) ** 0.8
    expected = (q[index] / q.min()) ** -beta
    rtol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(weight.double(), expected, rtol=rtol, atol=0)
    assert (index == 0).any() and (weight[index == 0] == 1).all()  # the least likely item has weight 1


def test_new_items_get_the_largest_priority_seen():
    sampler = _sampler(10)
    assert sampler.default_priority == 1.0
    sampler.extend(torch.arange(3))
    sampler.update_priority(torch.arange(3), [0.5, 5.0, 2.0])
    sampler.update_priority(1, 0.1)  # lowering the max item does not lower the default
    assert sampler.default_priority == 5.0
    sampler.extend(torch.tensor([3, 4]))
    sampler.add(5)
    sampler.mark_update(torch.tensor([6]), storage=_storage(10))
    expected = _q(sampler, 5.0)
    assert sampler._sum_tree[torch.arange(3, 7)].tolist() == [expected] * 4
    assert sampler._sum_tree[7] == 0.0


def test_max_priority_within_buffer_forgets_overwritten_items():
    sampler = _sampler(10, max_priority_within_buffer=True)
    sampler.extend(torch.arange(4))
    sampler.update_priority(torch.arange(4), [0.5, 5.0, 2.0, 1.5])
    assert sampler.default_priority == 5.0
    sampler.extend(torch.tensor([1]))  # overwrites the item holding 5.0: the max left is 2.0
    assert sampler.default_priority == 2.0
    assert sampler._sum_tree[1] == _q(sampler, 2.0)
    sampler.extend(torch.tensor([1]))  # a second notice of the same write changes nothing
    assert sampler.default_priority == 2.0
    sampler.update_priority(2, 0.1)  # lowering the max item lowers the default to the next largest
    assert sampler.default_priority == 2.0  # item 1 holds 2.0 now
    sampler.update_priority(1, 0.2)
    assert sampler.default_priority == 1.5


def test_index_minus_one_entries_are_ignored():
    sampler = _sampler(8)
    sampler.extend(torch.arange(4))
    before = sampler._sum_tree[:].copy()
    sampler.update_priority(torch.tensor([-1, 2, -1]), torch.tensor([9.0, 3.0, 9.0]))
    after = sampler._sum_tree[:]
    assert after[2] == _q(sampler, 3.0)
    np.testing.assert_array_equal(np.delete(after, 2), np.delete(before, 2))
    assert sampler.default_priority == 3.0  # the 9.0 at -1 was not seen
    sampler.update_priority(torch.tensor([-1, -1]), 50.0)
    sampler.mark_update(torch.tensor([-1]))
    np.testing.assert_array_equal(sampler._sum_tree[:], after)
    storage = _storage(8, ndim=2)
    sampler.update_priority(torch.tensor([[-1, -1], [1, 3]]), [60.0, 4.0], storage=storage)
    assert sampler._priority[7] == 4.0 and sampler.default_priority == 4.0


def test_repeated_index_takes_the_last_priority():
    sampler = _sampler(4)
    sampler.update_priority(torch.tensor([1, 1, 2, 1]), torch.tensor([7.0, 1.0, 3.0, 2.0]))
    assert sampler._priority[1] == 2.0 and sampler._sum_tree[1] == _q(sampler, 2.0)


@pytest.mark.parametrize(
    "priority",
    [
        torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16),
        torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16),
        torch.tensor([1.0, 2.0, 3.0], dtype=torch.float32),
        torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64),
        torch.tensor([1, 2, 3]),
        torch.tensor([[1.0], [2.0], [3.0]]),
        np.array([1.0, 2.0, 3.0], dtype=np.float32),
        [1.0, 2.0, 3.0],
        (1, 2, 3),
    ],
    ids=lambda p: f"{type(p).__name__}-{getattr(p, 'dtype', '')}",
)
def test_priorities_of_any_real_type_are_accepted(priority):
    sampler = _sampler(5)
    sampler.update_priority(torch.tensor([0, 2, 4]), priority)
    assert sampler._priority[[0, 2, 4]].tolist() == [1.0, 2.0, 3.0]
    sampler.update_priority([1, 3], 0.25)  # a Python scalar for every index
    assert sampler._priority[[1, 3]].tolist() == [0.25, 0.25]


@pytest.mark.parametrize("reduction", ["max", "min", "sum", "mean", "median"])
def test_multi_dim_priority_is_reduced_per_item(reduction):
    priority = torch.tensor([[1.0, 4.0, 2.0], [0.5, 0.5, 3.0]])
    sampler = _sampler(4, reduction=reduction)
    sampler.update_priority(torch.tensor([1, 3]), priority)
    expected = reduce_priority(priority, reduction).double().numpy()
    np.testing.assert_allclose(sampler._priority[[1, 3]], expected)
    by_hand = {"max": [4, 3], "min": [1, 0.5], "sum": [7, 4], "mean": [7 / 3, 4 / 3], "median": [2, 0.5]}
    np.testing.assert_allclose(expected, by_hand[reduction])


def test_reduce_priority_shapes_and_dtypes():
    assert reduce_priority(torch.tensor([1.0, 2.0]), "sum").tolist() == [1.0, 2.0]  # nothing to reduce
    reduced = reduce_priority(torch.arange(24).reshape(2, 3, 4), "mean", batch_dims=2)
    assert reduced.shape == (2, 3) and reduced.dtype == torch.float64
    assert reduce_priority([[1, 5], [2, 2]], "max").tolist() == [5.0, 2.0]
    with pytest.raises(ValueError, match="`reduction`"):
        reduce_priority(torch.ones(2, 2), "prod")
    with pytest.raises(ValueError, match="`batch_dims`"):
        reduce_priority(torch.ones(2, 2), "max", batch_dims=-1)


def test_all_index_forms_address_the_same_cells():
    storage = _storage(12, ndim=2)  # shape [3, 4]
    rows, cols = torch.tensor([0, 1, 2]), torch.tensor([3, 0, 2])
    flat = (rows * 4 + cols).numpy()
    forms = [(rows, cols), torch.stack([rows, cols], -1), torch.stack([rows, cols], -1).numpy()]
    for i, form in enumerate(forms):
        sampler = _sampler(12)
        sampler.update_priority(form, [float(i + 1)] * 3, storage=storage)
        assert np.flatnonzero(~np.isnan(sampler._priority)).tolist() == sorted(flat.tolist())
    sampler = _sampler(12)
    sampler.mark_update(torch.stack([rows, cols], -1), storage=storage)
    sampler.extend((rows, cols))  # no storage: the shape seen before is remembered
    assert np.flatnonzero(~np.isnan(sampler._priority)).tolist() == sorted(flat.tolist())
    one_d = _sampler(6)
    one_d.update_priority((torch.tensor([1, 4]),), 2.0)  # a slice-sampler style 1-tuple on a 1-D storage
    one_d.update_priority(torch.tensor([[5]]), 3.0)  # [N, 1]
    assert np.flatnonzero(~np.isnan(one_d._priority)).tolist() == [1, 4, 5]


@pytest.mark.parametrize("ndim", [1, 2])
def test_sample_returns_indices_the_storage_reads(ndim):
    storage = _storage(16, ndim)
    sampler = _sampler(16)
    sampler.extend(torch.arange(16))
    index, info = sampler.sample(storage, 32)
    if ndim == 1:
        assert isinstance(index, torch.Tensor) and index.dtype == torch.long and index.shape == (32,)
    else:
        assert isinstance(index, tuple) and len(index) == 2 and all(i.shape == (32,) for i in index)
    values = storage.get(index)
    assert values.tolist() == _flat(index, storage).float().tolist()


def test_state_dict_round_trip_gives_the_same_next_samples():
    storage = _storage(50)
    sampler = _sampler(50, max_priority_within_buffer=True)
    sampler.extend(torch.arange(50))
    sampler.update_priority(torch.arange(50), torch.rand(50, generator=torch.Generator().manual_seed(3)))
    state, blob = sampler.state_dict(), pickle.dumps(sampler)

    def restored():
        clone = PrioritizedSampler(50, alpha=0.1, beta=0.9, eps=0.5)  # the config comes from the state
        clone.load_state_dict(state)
        return clone

    clone = restored()
    assert (clone.alpha, clone.beta, clone.eps) == (sampler.alpha, sampler.beta, sampler.eps)
    assert clone.default_priority == sampler.default_priority
    for first, second in ((sampler, clone), (restored(), pickle.loads(blob))):
        first._rng = torch.Generator().manual_seed(7)
        second._rng = torch.Generator().manual_seed(7)
        for _ in range(3):
            a, info_a = first.sample(storage, 64)
            b, info_b = second.sample(storage, 64)
            assert torch.equal(a, b) and torch.equal(info_a["priority_weight"], info_b["priority_weight"])
            first.update_priority(a, torch.arange(64) / 10)
            second.update_priority(b, torch.arange(64) / 10)
            first.extend(torch.tensor([0]))
            second.extend(torch.tensor([0]))
        assert first.default_priority == second.default_priority


@pytest.mark.parametrize(
    "change, match",
    [
        ({"_max_capacity": 51}, "max_capacity=51"),
        ({"_alpha": -1.0}, "alpha must be greater or equal"),
        ({"_priority": torch.zeros(3)}, "3 raw priorities"),
        ({"_sum_tree": {"capacity": 64, "values": -torch.ones(64)}}, ">= 0"),
        ({"_sum_tree": {"capacity": 64, "values": torch.ones(64)}}, "min tree"),
        ({"_max_priority": (-1.0, 0)}, "`max_priority`"),
        ({"_max_priority": (2.0, 64)}, "index of the max priority"),
        ({"_schema_version": 2}, "schema 1"),
    ],
)
def test_bad_state_dict_raises_and_leaves_the_sampler_unchanged(change, match):
    sampler = _sampler(50)
    sampler.update_priority(torch.arange(10), 2.0)
    state = {**sampler.state_dict(), **change}
    snapshot = sampler.state_dict()
    with pytest.raises(ValueError, match=match):
        sampler.load_state_dict(state)
    assert torch.equal(sampler.state_dict()["_sum_tree"]["values"], snapshot["_sum_tree"]["values"])
    assert sampler.alpha == snapshot["_alpha"] and sampler.state_dict()["_max_priority"] == snapshot["_max_priority"]
    missing = sampler.state_dict()
    del missing["_sum_tree"]
    with pytest.raises(ValueError, match="missing"):
        sampler.load_state_dict(missing)
    with pytest.raises(TypeError, match="`state_dict`"):
        sampler.load_state_dict([("alpha", 1.0)])


def test_alpha_setter_re_expresses_stored_priorities_and_beta_setter_changes_weights():
    storage = _storage(8)
    sampler = _sampler(8, alpha=0.0, eps=0.0)
    sampler.update_priority(torch.arange(8), torch.arange(1, 9).double())
    assert sampler._sum_tree.query() == 8.0  # alpha = 0: uniform
    with pytest.warns(UserWarning, match="away from 0"):  # as TorchRL: the entries keep 1.0 until updated
        sampler.alpha = 1.0
    assert sampler._sum_tree.query() == 8.0
    sampler.alpha = 2.0  # from a non-zero alpha: the stored priorities are re-expressed
    assert sampler._sum_tree[:8].tolist() == [float(i * i) for i in range(1, 9)]
    assert sampler._min_tree.query() == 1.0
    sampler.beta = 0.0
    assert (sampler.sample(storage, 100)[1]["priority_weight"] == 1).all()
    sampler.beta = 1.0
    index, info = sampler.sample(storage, 100)
    torch.testing.assert_close(info["priority_weight"], 1.0 / (index.float() + 1) ** 2)


def test_empty_resets_priorities():
    storage = _storage(4)
    sampler = _sampler(4)
    sampler.update_priority(torch.arange(4), 3.0)
    sampler._empty()
    assert sampler.default_priority == 1.0 and sampler._sum_tree.query() == 0.0
    with pytest.raises(RuntimeError, match="priority zero"):
        sampler.sample(storage, 2)
    sampler.extend(torch.arange(4))
    assert sampler.sample(storage, 2)[0].shape == (2,)


def test_uses_the_generator_or_else_numpy_global_rng_never_torch_global_rng():
    storage = _storage(30)
    sampler = PrioritizedSampler(30, alpha=0.9, beta=0.4)
    sampler.update_priority(torch.arange(30), torch.arange(30) + 1.0)
    results = []
    for torch_seed in (0, 1):  # without a generator, as TorchRL: numpy's global generator
        np.random.seed(5)
        torch.manual_seed(torch_seed)
        results.append(sampler.sample(storage, 100)[0])
    assert torch.equal(*results)
    np.random.seed(6)
    assert not torch.equal(sampler.sample(storage, 100)[0], results[0])
    np.random.seed(123)
    numpy_state = np.random.get_state()[1].copy()
    sampler._rng = torch.Generator().manual_seed(0)
    sampler.sample(storage, 100)
    assert np.array_equal(np.random.get_state()[1], numpy_state)


def test_is_stateful_for_dataloader_workers():
    assert PrioritizedSampler.requires_shared_state is True
    assert RandomSampler.requires_shared_state is False


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"alpha": -0.1}, ValueError, "alpha must be greater or equal"),
        ({"beta": -1}, ValueError, "`beta`"),
        ({"alpha": float("nan")}, ValueError, "`alpha`"),
        ({"alpha": "1"}, TypeError, "`alpha`"),
        ({"beta": True}, TypeError, "`beta`"),
        ({"max_capacity": 0}, ValueError, "`max_capacity`"),
        ({"max_capacity": -5}, ValueError, "`max_capacity`"),
        ({"max_capacity": 10.0}, TypeError, "`max_capacity`"),
        ({"eps": -1e-3}, ValueError, "`eps`"),
        ({"reduction": "prod"}, ValueError, "`reduction`"),
        ({"dtype": torch.int64}, ValueError, "`dtype`"),
        ({"dtype": "float32"}, TypeError, "`dtype`"),
    ],
)
def test_bad_constructor_argument_raises(kwargs, error, match):
    kwargs = {"max_capacity": 10, "alpha": 0.5, "beta": 0.5, **kwargs}
    with pytest.raises(error, match=match):
        PrioritizedSampler(**kwargs)


def test_bad_setter_values_raise_and_keep_the_old_value():
    sampler = _sampler(4)
    for name, bad in (("alpha", -1.0), ("beta", -1.0), ("reduction", "prod")):
        old = getattr(sampler, name)
        with pytest.raises(ValueError, match=f"`{name}`" if name != "alpha" else "alpha must be greater or equal"):
            setattr(sampler, name, bad)
        assert getattr(sampler, name) == old
    sampler.reduction = "mean"
    assert "reduction='mean'" in repr(sampler) and "max_capacity=4" in repr(sampler)


def test_rounding_overshoots_are_repaired_to_the_closest_positive_item_before():
    storage = _storage(6, max_size=8)
    sampler = _sampler(8, alpha=1.0, eps=0.0)
    sampler.update_priority(torch.arange(8), torch.tensor([1.0, 2.0, 0.0, 3.0, 0.0, 0.0, 5.0, 5.0]))
    # what partial sums rounded past the end would give: a zero-priority item, items past len(storage)
    sampler._sum_tree._scan = lambda v, prefix=None: np.resize(np.array([2, 4, 5, 6, 7, 1]), v.size)
    index, info = sampler.sample(storage, 6)
    assert index.tolist() == [1, 3, 3, 3, 3, 1]
    assert torch.isfinite(info["priority_weight"]).all() and (info["priority_weight"] <= 1).all()


@pytest.mark.parametrize(
    "index, priority, error, match",
    [
        (torch.tensor([16]), 1.0, IndexError, "out of range"),  # the trees of max_capacity=10 hold 16
        (torch.tensor([-2]), 1.0, IndexError, "out of range"),
        (torch.tensor([0, 1]), [1.0, -1.0], ValueError, ">= 0"),
        (torch.tensor([0]), float("nan"), ValueError, ">= 0"),
        (torch.tensor([0]), float("inf"), ValueError, "finite"),
        (torch.tensor([0, 1]), [1.0, 2.0, 3.0], ValueError, "one value per index"),
        (torch.tensor([0, 1]), torch.ones(3, 2), ValueError, "does not match"),
        (torch.tensor([0.5]), 1.0, TypeError, "integer"),
        ((torch.tensor([0]), torch.tensor([1])), 1.0, ValueError, "storage="),
        (torch.tensor([[0, 1]]), 1.0, ValueError, "storage="),
    ],
)
def test_bad_update_priority_raises_and_changes_nothing(index, priority, error, match):
    sampler = _sampler(10)
    sampler.update_priority(torch.arange(3), 2.0)
    snapshot = sampler._sum_tree[:].copy()
    with pytest.raises(error, match=match):
        sampler.update_priority(index, priority)
    np.testing.assert_array_equal(sampler._sum_tree[:], snapshot)


def test_per_dimension_index_out_of_the_storage_shape_raises():
    storage = _storage(8, ndim=2)
    sampler = _sampler(8)
    with pytest.raises(IndexError, match="shape"):
        sampler.update_priority((torch.tensor([0]), torch.tensor([4])), 1.0, storage=storage)
    with pytest.raises(ValueError, match="differ in length"):
        sampler.update_priority((torch.tensor([0, 1]), torch.tensor([1])), 1.0, storage=storage)


def test_sampling_errors():
    sampler = _sampler(8)
    with pytest.raises(RuntimeError, match="empty storage"):
        sampler.sample(LazyTensorStorage(8), 4)
    storage = _storage(8)
    with pytest.raises(RuntimeError, match="priority zero"):
        sampler.sample(storage, 4)  # nothing told the sampler about the written items
    sampler.extend(torch.arange(8))
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="`batch_size`"):
            sampler.sample(storage, bad)
