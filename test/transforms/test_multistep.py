"""MultiStepTransform (issue 26 item 2): n-step returns on the write path, whatever the chunk sizes.

The reference is our :class:`~torchrl.data.MultiStep` applied to the whole rollout: the transform stores the same
steps (all but the last ``n_steps``, which it holds), for any chunking (a hypothesis property), through ``extend``
and ``add``, for ``[B, T]`` data in an ``ndim=2`` storage, across a change of ``n_steps`` and across
``dumps``/``loads``.
"""

from __future__ import annotations

import pytest
import torch
from helpers.factories import make_buffer
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, MultiStep, ReplayBuffer, TensorDictReplayBuffer
from torchrl.envs.transforms import Compose, MultiStepTransform


def rollout(length: int, batch: tuple = (), *, done_at=(), terminated_at=(), mask_off=(), seed: int = 0):
    """``length`` TED steps (time last): obs = step number (+100 per env), rewards random, flags at the given steps."""
    g = torch.Generator().manual_seed(seed)
    shape = (*batch, length)
    t = torch.arange(length).expand(shape).clone()
    if batch:
        t += 100 * torch.arange(batch[0]).unsqueeze(-1)
    done = torch.zeros(*shape, 1, dtype=torch.bool)
    terminated = torch.zeros(*shape, 1, dtype=torch.bool)
    done[..., list(done_at), :] = True
    terminated[..., list(terminated_at), :] = True
    done |= terminated
    mask = torch.ones(shape, dtype=torch.bool)
    mask[..., list(mask_off)] = False
    return TensorDict(
        {
            "obs": t.float(),
            "mask": mask,
            "next": {
                "obs": t.float() + 1,
                "reward": torch.rand(*shape, 1, generator=g),
                "done": done,
                "terminated": terminated,
            },
        },
        batch_size=shape,
    )


def reference(data: TensorDict, n: int, gamma: float) -> TensorDict:
    """MultiStep over the whole rollout, configured as the transform (mask entry ``"mask"``)."""
    module = MultiStep(gamma, n)
    module.mask_key = "mask"
    return module(data)


def through_transform(data: TensorDict, transform: MultiStepTransform, cuts) -> list:
    """The outputs of ``transform.inv`` for ``data`` cut along time at ``cuts``."""
    outs, start = [], 0
    for stop in [*cuts, data.batch_size[-1]]:
        out = transform.inv(data[..., start:stop])
        if out is not None:
            outs.append(out)
        start = stop
    return outs


def assert_same(actual: TensorDict, expected: TensorDict) -> None:
    assert actual.batch_size == expected.batch_size
    assert set(actual.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        torch.testing.assert_close(actual.get(key), expected.get(key), msg=lambda m, k=key: f"{k}: {m}")


@settings(deadline=None, max_examples=60)
@given(
    length=st.integers(2, 30),
    n=st.integers(1, 4),
    gamma=st.sampled_from([0.5, 0.9, 1.0]),
    batch=st.sampled_from([(), (2,)]),
    data=st.data(),
)
def test_equals_multistep_on_the_whole_rollout_for_any_chunking(length, n, gamma, batch, data):
    steps = range(length)
    done_at = data.draw(st.lists(st.sampled_from(steps), max_size=4, unique=True))
    terminated_at = data.draw(st.lists(st.sampled_from(steps), max_size=2, unique=True))
    mask_off = data.draw(st.lists(st.sampled_from(steps), max_size=2, unique=True))
    cuts = sorted(data.draw(st.lists(st.integers(1, length - 1), max_size=6, unique=True))) if length > 1 else []
    td = rollout(length, batch, done_at=done_at, terminated_at=terminated_at, mask_off=mask_off)
    outs = through_transform(td, MultiStepTransform(n, gamma), cuts)
    if length <= n:
        assert not outs
        return
    assert_same(torch.cat(outs, -1), reference(td, n, gamma)[..., : length - n])


def test_chunkings_of_one_stream_store_the_same_data():
    td = rollout(250, done_at=(17, 90, 91, 200))
    stored = []
    for chunk in (250, 50, 2):
        rb = ReplayBuffer(storage=LazyTensorStorage(300), transform=MultiStepTransform(3, 0.9))
        for start in range(0, 250, chunk):
            rb.extend(td[start : start + chunk])
        assert len(rb) == 247
        stored.append(rb[:])
    assert_same(stored[1], stored[0])
    assert_same(stored[2], stored[0])
    assert_same(stored[0], reference(td, 3, 0.9)[:247])


def test_add_writes_one_step_once_n_steps_are_held():
    rb = ReplayBuffer(storage=LazyTensorStorage(20), transform=MultiStepTransform(n_steps=3, gamma=0.9))
    td = rollout(10)
    td["next", "reward"] = torch.arange(10.0).unsqueeze(-1)
    indices = [rb.add(td[i]) for i in range(10)]
    assert all(i.numel() == 0 for i in indices[:3]) and indices[3:] == list(range(7))
    assert len(rb) == 7
    stored = rb[:]
    assert (stored["steps_to_next_obs"] == 3).all()
    assert torch.equal(stored["next", "original_reward"].squeeze(-1), torch.arange(7.0))
    assert_same(stored, reference(td, 3, 0.9)[:7])


def test_a_write_that_leaves_n_steps_or_fewer_held_stores_nothing():
    transform = MultiStepTransform(4, 0.9)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), transform=transform)
    td = rollout(6)
    index = rb.extend(td[:3])
    assert index.numel() == 0 and len(rb) == 0
    assert rb.extend(td[3:4]).numel() == 0 and len(rb) == 0  # 4 held: still nothing
    assert rb.extend(td[4:]).numel() == 2 and len(rb) == 2
    assert transform._buffer.batch_size == torch.Size([4])


@pytest.mark.parametrize("cls", [ReplayBuffer, TensorDictReplayBuffer])
def test_a_dropped_extend_returns_an_empty_index_of_storage_ndim_columns(cls):
    rb = cls(storage=LazyTensorStorage(20), transform=MultiStepTransform(4, 0.9))
    assert rb.extend(rollout(3)).shape == (0, 1)


def test_n_steps_may_change_between_writes():
    td = rollout(20, done_at=(11,))
    transform = MultiStepTransform(2, 0.8)
    first = transform.inv(td[:8])
    assert_same(first, reference(td, 2, 0.8)[:6])
    transform.n_steps = 4
    second = transform.inv(td[8:])  # the 2 held steps and 12 new ones: 10 stored with a look-ahead of 4
    assert_same(second, reference(td, 4, 0.8)[6:16])
    assert torch.equal(transform._buffer["obs"], td["obs"][16:])


def test_batched_environments_with_an_ndim_2_storage():
    td = rollout(12, (3,), done_at=(4,))
    rb = ReplayBuffer(storage=LazyTensorStorage(60, ndim=2), dim_extend=1, transform=MultiStepTransform(3, 0.9))
    for start, stop in ((0, 5), (5, 6), (6, 12)):
        rb.extend(td[:, start:stop])
    assert len(rb) == 9 * 3
    stored = rb[:]  # [time, env] as the storage lays it out
    assert stored.batch_size == torch.Size([9, 3])
    assert_same(stored.transpose(0, 1), reference(td, 3, 0.9)[:, :9])


def test_several_reward_keys_are_summed_over_the_same_look_ahead():
    td = rollout(12, done_at=(5,))
    td["next", "bonus"] = torch.rand(12, 1, generator=torch.Generator().manual_seed(3))
    transform = MultiStepTransform(3, 0.5, reward_keys=["reward", "bonus"])
    out = torch.cat(through_transform(td, transform, [4, 7]), -1)
    ref = reference(td, 3, 0.5)[:9]
    torch.testing.assert_close(out["next", "reward"], ref["next", "reward"])
    bonus = MultiStep(0.5, 3)
    bonus.reward_keys, bonus.mask_key = ["bonus"], "mask"
    ref_bonus = bonus(td)[:9]
    torch.testing.assert_close(out["next", "bonus"], ref_bonus["next", "bonus"])
    torch.testing.assert_close(out["next", "original_bonus"], td["next", "bonus"][:9])
    torch.testing.assert_close(out["next", "original_reward"], td["next", "reward"][:9])


def test_custom_keys():
    td = TensorDict({"next": {"agent": {"r": torch.ones(6, 1), "end": torch.zeros(6, 1, dtype=torch.bool)},
                              "obs": torch.arange(1.0, 7.0)}}, batch_size=[6])
    transform = MultiStepTransform(2, 0.5, reward_keys=("agent", "r"), done_key=("agent", "end"))
    out = transform.inv(td)
    assert torch.equal(out["next", "agent", "r"].squeeze(-1), torch.full((4,), 1.5))
    assert torch.equal(out["next", "original_reward"], torch.ones(4, 1))  # TorchRL's key for one reward key
    assert torch.equal(out["next", "obs"], torch.arange(2.0, 6.0))


def test_sampling_returns_the_stored_data_unchanged():
    rb = ReplayBuffer(storage=LazyTensorStorage(20), transform=MultiStepTransform(2, 0.9), batch_size=4)
    rb.extend(rollout(10))
    raw = rb.sample_raw()
    assert set(raw.keys(True, True)) == set(rb.sample().keys(True, True))
    assert "steps_to_next_obs" in raw.keys()


def _stream_with_checkpoint(tmp_path, held_after: int):
    td = rollout(30, done_at=(9, 20))

    def buffer():
        return make_buffer(capacity=50, transform=Compose(MultiStepTransform(3, 0.9)))

    uninterrupted = buffer()
    for start, stop in ((0, held_after), (held_after, 30)):
        uninterrupted.extend(td[start:stop])
    rb = buffer()
    rb.extend(td[:held_after])
    rb.dumps(tmp_path / "rb")
    resumed = buffer()
    resumed.loads(tmp_path / "rb")
    resumed.extend(td[held_after:])
    return resumed, uninterrupted, td


@pytest.mark.parametrize("held_after", [2, 13])
def test_held_steps_survive_dumps_and_loads(tmp_path, held_after):
    resumed, uninterrupted, td = _stream_with_checkpoint(tmp_path, held_after)
    assert len(resumed) == len(uninterrupted) == 27
    assert_same(resumed[:], uninterrupted[:])
    assert_same(resumed[:], reference(td, 3, 0.9)[:27])


def test_checkpoint_holds_no_pickle(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(50), transform=MultiStepTransform(3, 0.9))
    rb.extend(rollout(8))
    rb.dumps(tmp_path / "rb")
    files = [p for p in (tmp_path / "rb").rglob("*") if p.is_file()]
    assert files and not [p for p in files if p.suffix in (".pkl", ".pt", ".pickle")]


def test_held_steps_survive_state_dict_round_trip():
    td = rollout(16, done_at=(6,))
    rb = ReplayBuffer(storage=LazyTensorStorage(50), transform=MultiStepTransform(3, 0.9))
    rb.extend(td[:7])
    state = rb.state_dict()
    fresh = ReplayBuffer(storage=LazyTensorStorage(50), transform=MultiStepTransform(3, 0.9))
    fresh.load_state_dict(state)
    fresh.extend(td[7:])
    assert_same(fresh[:], reference(td, 3, 0.9)[:13])
    empty = MultiStepTransform(3, 0.9)
    empty.load_state_dict(MultiStepTransform(3, 0.9).state_dict())
    assert empty._buffer is None


def test_a_pickled_buffer_keeps_its_held_steps():
    import pickle

    td = rollout(10)
    rb = ReplayBuffer(storage=LazyTensorStorage(20), transform=MultiStepTransform(3, 0.9))
    rb.extend(td[:5])
    copy = pickle.loads(pickle.dumps(rb))  # what a DataLoader worker under spawn receives
    assert_same(copy.transform[0]._buffer, td[2:5])
    copy.extend(td[5:])
    assert_same(copy[:], reference(td, 3, 0.9)[:7])


def test_a_bad_extra_state_is_refused():
    transform = MultiStepTransform(3, 0.9)
    with pytest.raises(ValueError, match="state must be a dict"):
        transform.set_extra_state({"held": None})
    with pytest.raises(ValueError, match="time dim, or None"):
        transform.set_extra_state({"version": 1, "held": torch.zeros(3)})


# -- errors --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_steps", [0, -1, 1.5, "3", True, None])
def test_n_steps_must_be_a_strictly_positive_int(n_steps):
    with pytest.raises(ValueError, match="The value of n_steps must be a strictly positive integer."):
        MultiStepTransform(n_steps, 0.9)
    transform = MultiStepTransform(2, 0.9)
    with pytest.raises(ValueError, match="The value of n_steps must be a strictly positive integer."):
        transform.n_steps = n_steps
    assert transform.n_steps == 2


@pytest.mark.parametrize("gamma", [0.0, -0.5, 1.01, float("nan"), float("inf")])
def test_gamma_must_be_in_zero_one(gamma):
    with pytest.raises(ValueError, match=r"`gamma` must be in \(0, 1\]"):
        MultiStepTransform(3, gamma)


@pytest.mark.parametrize("gamma", ["0.9", None, True])
def test_gamma_must_be_a_number(gamma):
    with pytest.raises(TypeError, match="`gamma` must be a float"):
        MultiStepTransform(3, gamma)


@pytest.mark.parametrize("kwargs", [{"reward_keys": 3}, {"reward_keys": []}, {"done_key": 1}, {"mask_key": ()},
                                    {"done_keys": [1]}])
def test_keys_must_be_keys(kwargs):
    with pytest.raises(TypeError, match="must be a key"):
        MultiStepTransform(3, 0.9, **kwargs)


def test_missing_entries_hold_nothing():
    transform = MultiStepTransform(2, 0.9)
    td = rollout(5)
    with pytest.raises(KeyError, match="'next', 'reward'"):
        transform.inv(td.exclude(("next", "reward")))
    with pytest.raises(KeyError, match="'next', 'done'"):
        transform.inv(td.exclude(("next", "done")))
    assert transform._buffer is None


def test_non_tensordict_and_unbatched_data_are_refused():
    transform = MultiStepTransform(2, 0.9)
    with pytest.raises(TypeError, match="takes TensorDicts"):
        transform.inv(torch.zeros(4))
    with pytest.raises(ValueError, match="needs a time dim"):
        transform.inv(rollout(3)[0])


def test_a_write_that_does_not_fit_the_held_steps_changes_nothing():
    transform = MultiStepTransform(3, 0.9)
    transform.inv(rollout(2))
    held = transform._buffer.clone()
    with pytest.raises(ValueError, match="leading .* dims must stay the same"):
        transform.inv(rollout(4, (2,)))
    with pytest.raises(ValueError, match="same entries"):
        transform.inv(rollout(4).exclude("mask"))
    assert_same(transform._buffer, held)


def test_repr_names_the_configuration_and_the_held_steps():
    transform = MultiStepTransform(3, 0.9)
    transform.inv(rollout(2))
    assert "n_steps=3" in repr(transform) and "held=2" in repr(transform)
