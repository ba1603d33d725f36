"""PrioritizedSampler behaves as TorchRL's where user code depends on it (behaviour facts §4 and §7).

Tree capacity (the next power of two above ``max_capacity``), float32 leaves, numpy's global generator without a
buffer generator, the ``alpha`` setter, ``device``, ``replacement=False``, complex priorities, and the public
``state_dict`` / ``sampler_metadata.json`` layout.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)


def _filled_rb(sampler, n: int, **kwargs) -> TensorDictReplayBuffer:
    kwargs.setdefault("storage", None)  # the buffer's default storage unless one is given
    data = TensorDict(obs=torch.arange(n), batch_size=[n])
    return make_buffer(cls=TensorDictReplayBuffer, sampler=sampler, batch_size=4, data=data, **kwargs)


# -- capacity ----------------------------------------------------------------------------------------------------
def test_writes_and_updates_past_max_capacity_are_stored_and_sampled():
    rb = _filled_rb(PrioritizedSampler(5, alpha=0.7, beta=0.5), 8)  # the default storage holds 1000
    assert rb.sampler._sum_tree.capacity == 8  # the next power of two strictly above 5
    rb.update_priority(torch.arange(8), torch.arange(8).float() + 1)
    assert rb.sampler._priority[7] == 8.0 and rb.sampler.default_priority == 8.0
    np.random.seed(0)
    batch = rb.sample(512)
    assert set(batch["index"].tolist()) == set(range(8))  # sampling covers [0, len(storage))
    counts = torch.bincount(batch["index"], minlength=8)
    assert counts[7] > counts[0]  # by priority


@pytest.mark.parametrize("max_capacity, capacity", [(1, 2), (4, 8), (5, 8), (8, 16), (149, 256)])
def test_tree_capacity_is_the_next_power_of_two_strictly_above_max_capacity(max_capacity, capacity):
    sampler = PrioritizedSampler(max_capacity, alpha=0.7, beta=0.5)
    assert sampler._sum_tree.capacity == sampler._min_tree.capacity == capacity
    assert sampler.max_capacity == max_capacity
    sampler.update_priority(capacity - 1, 2.0)  # the last position the trees hold
    with pytest.raises(IndexError, match=f"hold positions \\[0, {capacity}\\)"):
        sampler.update_priority(capacity, 2.0)


def test_prioritized_sampler_accepts_a_two_dim_storage_rounded_past_max_capacity():
    storage = LazyTensorStorage(150, ndim=2)  # as a storage whose capacity was rounded up from 149
    storage.set(torch.arange(75), torch.arange(150).reshape(75, 2))
    sampler = PrioritizedSampler(max_capacity=149, alpha=0.7, beta=0.5)
    sampler.mark_update((torch.arange(75).repeat_interleave(2), torch.arange(2).repeat(75)), storage=storage)
    sampler._rng = torch.Generator().manual_seed(0)
    rows, cols = sampler.sample(storage, 2000)[0]
    assert int((rows * 2 + cols).max()) == 149  # the cell past max_capacity has a priority and is drawn


# -- precision, generator, device ---------------------------------------------------------------------------------
def test_float_trees_hold_float32_so_the_default_priority_is_exactly_one():
    sampler = PrioritizedSampler(20, alpha=0.7, beta=0.5, dtype=torch.float)
    sampler.extend(torch.arange(10))
    assert sampler._sum_tree[0] == 1.0 and sampler._sum_tree.query(0, 10) == 10
    double = PrioritizedSampler(20, alpha=0.7, beta=0.5, dtype=torch.float64)
    double.extend(torch.arange(10))
    assert double._sum_tree[0] == (1 + 1e-8) ** 0.7 != 1.0  # float64 keeps the exact value


def test_without_a_generator_cpu_sampling_draws_from_numpy_global_rng():
    rb = _filled_rb(PrioritizedSampler(64, alpha=0.7, beta=0.5), 64)
    rb.update_priority(torch.arange(64), torch.rand(64) + 0.1)
    draws = []
    for torch_seed in (0, 1):
        np.random.seed(3)
        torch.manual_seed(torch_seed)  # torch's global generator does not matter
        draws.append(rb.sample(32)["index"])
    assert torch.equal(*draws)
    seeded = _filled_rb(
        PrioritizedSampler(64, alpha=0.7, beta=0.5), 64, generator=torch.Generator().manual_seed(0)
    )
    state = np.random.get_state()[1].copy()
    seeded.sample(32)
    assert np.array_equal(np.random.get_state()[1], state)  # with a generator, numpy's is not touched


def test_device_is_a_public_property_and_only_the_cpu_is_accepted():
    assert PrioritizedSampler(8, 0.7, 0.5).device == torch.device("cpu")
    assert PrioritizedSampler(8, 0.7, 0.5, device="cpu").device == torch.device("cpu")
    with pytest.raises(ValueError, match="`device`='meta'"):
        PrioritizedSampler(8, 0.7, 0.5, device="meta")


# -- alpha, replacement, complex priorities -----------------------------------------------------------------------
def test_alpha_setter_refuses_negative_and_warns_only_when_priorities_leave_zero():
    sampler = PrioritizedSampler(8, alpha=0.0, beta=0.5)
    with pytest.raises(ValueError, match="alpha must be greater or equal"):
        sampler.alpha = -0.5
    with pytest.raises(ValueError, match="alpha must be greater or equal"):
        PrioritizedSampler(8, alpha=-1.0, beta=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler.alpha = 0.7  # empty: no warning
    sampler.alpha = 0.0
    sampler.extend(torch.arange(4))
    sampler.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    with pytest.warns(UserWarning, match="away from 0"):
        sampler.alpha = 0.7
    assert sampler._sum_tree[:4].tolist() == [1.0] * 4  # kept until their next update
    sampler.update_priority(torch.tensor([3]), torch.tensor([4.0]))
    assert sampler._sum_tree[3] == float(np.float32((4.0 + 1e-8) ** 0.7))


def test_replacement_false_has_no_without_replacement_variant():
    with pytest.raises(TypeError, match="no without-replacement variant"):
        PrioritizedSampler(8, alpha=0.7, beta=0.5, replacement=False)
    with pytest.raises(TypeError, match="no without-replacement variant"):
        PrioritizedSliceSampler(8, alpha=0.7, beta=0.5, slice_len=2, traj_key="e", replacement=False)


@pytest.mark.parametrize("priority", [3 + 4j, np.complex128(3 + 4j), [1.0, 3 + 4j], np.array([3 + 4j, 1.0])])
def test_complex_priorities_are_refused_and_change_nothing(priority):
    sampler = PrioritizedSampler(8, alpha=0.7, beta=0.5)
    sampler.extend(torch.arange(2))
    before = sampler.state_dict()
    with pytest.raises(TypeError, match="complex"):
        sampler.update_priority(torch.arange(np.size(priority)), priority)
    assert torch.equal(sampler.state_dict()["_sum_tree"]["values"], before["_sum_tree"]["values"])


# -- state_dict layout (§7) ---------------------------------------------------------------------------------------
def _sampler_with_priorities() -> PrioritizedSampler:
    sampler = PrioritizedSampler(10, alpha=0.7, beta=0.5)
    sampler.extend(torch.arange(6))
    sampler.update_priority(torch.arange(6), torch.tensor([0.5, 4.0, 1.0, 2.0, 0.1, 3.0]))
    return sampler


def test_state_dict_has_torchrl_public_layout():
    state = _sampler_with_priorities().state_dict()
    assert {"_schema_version", "_alpha", "_beta", "_eps", "_max_priority", "_sum_tree", "_min_tree"} <= set(
        state
    )
    assert state["_schema_version"] == 1
    assert (state["_alpha"], state["_beta"], state["_eps"]) == (0.7, 0.5, 1e-8)
    assert state["_max_priority"] == (4.0, 1)  # raw domain: (value, index)


def test_load_copies_the_trees_and_leaves_the_source_intact():
    state = _sampler_with_priorities().state_dict()
    saved = {k: (v["values"].clone() if k in ("_sum_tree", "_min_tree") else v) for k, v in state.items()}
    fresh = PrioritizedSampler(10, alpha=0.1, beta=0.9)
    fresh.load_state_dict(state)
    assert torch.equal(state["_sum_tree"]["values"], saved["_sum_tree"]) and state["_max_priority"] == (
        4.0,
        1,
    )
    state["_sum_tree"]["values"].fill_(100.0)  # mutating the source later has no effect
    state["_priority"].fill_(100.0)
    assert fresh._sum_tree[1] == saved["_sum_tree"][1].item() and fresh.default_priority == 4.0
    assert (fresh.alpha, fresh.beta) == (0.7, 0.5)


def test_a_state_without_schema_version_recomputes_the_raw_max_from_the_trees():
    state = _sampler_with_priorities().state_dict()
    del state["_schema_version"], state["_priority"]
    state["_max_priority"] = (123.0, 0)  # an older layout's value: ignored
    fresh = PrioritizedSampler(10, alpha=0.7, beta=0.5)
    fresh.load_state_dict(state)
    value, index = fresh.state_dict()["_max_priority"]
    assert index == 1 and value == pytest.approx(4.0, rel=1e-5)


def test_dumps_writes_sampler_metadata_json(tmp_path):
    sampler = _sampler_with_priorities()
    sampler.dumps(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "sampler_metadata.json").read_text())
    assert meta["_schema_version"] == 1 and meta["_max_priority"] == [4.0, 1] and meta["_max_capacity"] == 10
    sampler.dumps(tmp_path / "s")  # replaced with the checkpoint
    fresh = PrioritizedSampler(10, alpha=0.7, beta=0.5)
    fresh.loads(tmp_path / "s")
    assert fresh.state_dict()["_max_priority"] == (4.0, 1)


def test_prioritized_slice_sampler_round_trips_through_the_buffer_state_dict():
    def build():
        sampler = PrioritizedSliceSampler(
            max_capacity=16, alpha=0.7, beta=0.5, slice_len=2, traj_key="episode"
        )
        return TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=sampler, batch_size=4)

    rb = build()
    rb.extend(TensorDict(obs=torch.arange(12), episode=torch.arange(12) // 4, batch_size=[12]))
    rb.update_priority(torch.arange(12), torch.arange(12).float() + 1)
    fresh = build()
    fresh.load_state_dict(rb.state_dict())
    assert (
        fresh.sampler.state_dict()["_max_priority"] == rb.sampler.state_dict()["_max_priority"] == (12.0, 11)
    )
    assert torch.equal(
        fresh.sampler.state_dict()["_sum_tree"]["values"], rb.sampler.state_dict()["_sum_tree"]["values"]
    )


# -- exponents, capacity, trajectory items (from the behaviours TorchRL code relies on, issue 12) --------------------
def test_prioritized_sampler_takes_zero_dim_tensor_exponents():
    sampler = PrioritizedSampler(10, alpha=torch.tensor(0.5), beta=torch.tensor(0.4))
    assert (sampler.alpha, sampler.beta) == (0.5, pytest.approx(0.4))
    sampler.alpha = torch.tensor(0.7)  # what a parameter scheduler sets
    sampler.beta = torch.tensor(1.0)
    assert isinstance(sampler.alpha, float) and sampler.beta == 1.0


def test_prioritized_sampler_warns_when_alpha_leaves_zero():
    sampler = PrioritizedSampler(10, alpha=0.0, beta=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler.alpha = 0.7  # no priority stored yet: nothing to warn about (as TorchRL)
    sampler.alpha = 0.0
    sampler.extend(torch.arange(3))
    with pytest.warns(UserWarning, match="away from 0"):
        sampler.alpha = 0.7
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler.alpha = 0.9  # not from 0: no warning


def test_prioritized_sampler_accepts_a_storage_larger_than_max_capacity():
    rb = ReplayBuffer(storage=LazyTensorStorage(12), sampler=PrioritizedSampler(4, alpha=0.7, beta=0.5))
    rb.extend(torch.arange(10))  # the trees hold 8 positions (TorchRL's capacity): items 8 and 9 get no priority
    _, info = rb.sample(256, return_info=True)
    assert info["index"].max() == 7 and info["priority_weight"].shape == (256,)


def test_priority_weight_has_the_full_batch_shape_of_trajectory_items():
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0, storage=ListStorage(10))
    rb.extend(TensorDict(obs=torch.zeros(10, 4), batch_size=[10, 4]))  # 10 items of 4 steps
    batch = rb.sample(3)
    assert batch.batch_size == (3, 4)
    assert batch["priority_weight"].shape == (3, 4) and batch["index"].shape == (3, 4)
    batch["td_error"] = torch.rand(3, 4) + 1.0
    rb.update_tensordict_priority(batch)  # one priority per item: the max over its steps
    for row in range(3):
        assert rb.sampler._priority[int(batch["index"][row, 0])] == pytest.approx(
            float(batch["td_error"][batch["index"][:, 0] == batch["index"][row, 0]].amax(-1)[-1])
        )
