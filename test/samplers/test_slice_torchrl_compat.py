"""TorchRL behaviours of the slice samplers: the info keys are siblings of ``truncated_key``, the errors TorchRL
code matches (plain ListStorage, several flags per step, exclusive arguments, ``find_start_stop_traj``), and
right spans on a wrapped ring."""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StreamingSliceSampler,
    TensorDictReplayBuffer,
    find_start_stop_traj,
)


def _steps(lengths, prefix: tuple, *, done: bool = True, terminated: bool = True) -> TensorDict:
    """Trajectories of ``lengths`` steps, their flags stored under ``prefix + ("done",)`` etc.

    ``done`` is set at each trajectory's last step, ``terminated`` at the last step of even trajectories.
    """
    lengths = torch.as_tensor(lengths)
    n = int(lengths.sum())
    episode = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    last = torch.zeros(n, 1, dtype=torch.bool)
    last[lengths.cumsum(0) - 1] = True
    td = TensorDict(episode=episode, t=torch.arange(n), batch_size=[n])
    if done:
        td[prefix + ("done",)] = last
    if terminated:
        td[prefix + ("terminated",)] = last & (episode % 2 == 0).unsqueeze(-1)
    return td


def _key(prefix: tuple, name: str):
    return name if not prefix else prefix + (name,)


_PREFIXES = {"default": ("next",), "top": (), "nested": ("some",)}
_SAMPLERS = {
    "slice": lambda **kw: SliceSampler(**kw),
    "without": lambda **kw: SliceSamplerWithoutReplacement(**kw),
    "prioritized": lambda **kw: PrioritizedSliceSampler(64, 0.7, 0.5, **kw),
    "streaming": lambda **kw: StreamingSliceSampler(**kw),
}


# -- info keys -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler", list(_SAMPLERS))
@pytest.mark.parametrize("prefix", list(_PREFIXES))
def test_info_keys_are_the_siblings_of_truncated_key(sampler, prefix):
    prefix = _PREFIXES[prefix]
    trunc = _key(prefix, "truncated")
    kwargs = {} if prefix == ("next",) else {"truncated_key": trunc}
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64),
        sampler=_SAMPLERS[sampler](slice_len=4, traj_key="episode", **kwargs),
        batch_size=8,
    )
    data = _steps([8, 8, 8, 8], prefix)
    rb.extend(data)
    for _ in range(5):
        batch = rb.sample()
        done, term = batch[_key(prefix, "done")], batch[_key(prefix, "terminated")]
        truncated = batch[trunc]
        assert truncated.shape == done.shape == term.shape == (8, 1)
        assert truncated.view(2, 4)[:, -1].all() and not truncated.view(2, 4)[:, :-1].any()
        stored = data[batch["t"]]
        assert torch.equal(done, stored[_key(prefix, "done")] | truncated)
        assert torch.equal(term, stored[_key(prefix, "terminated")])
    if prefix != ("next",):  # nothing under the default keys
        assert ("next", "done") not in batch.keys(True) and ("next", "terminated") not in batch.keys(True)


@pytest.mark.parametrize("sampler", list(_SAMPLERS))
def test_done_is_just_truncated_and_terminated_zeros_when_the_siblings_are_not_stored(sampler):
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64),
        sampler=_SAMPLERS[sampler](slice_len=4, end_key="end", truncated_key="truncated"),
        batch_size=8,
    )
    data = _steps([8, 8, 8], ("next",), done=False, terminated=False)
    data["end"] = (data["t"] % 8 == 7).unsqueeze(-1)  # the trajectories come from another key
    rb.extend(data)
    batch = rb.sample()
    assert torch.equal(batch["done"], batch["truncated"])
    assert batch["terminated"].dtype == torch.bool and not batch["terminated"].any()


def test_sampler_info_holds_exactly_the_three_sibling_keys():
    storage = LazyTensorStorage(32)
    storage.set(torch.arange(16), _steps([8, 8], ()))
    _, info = SliceSampler(slice_len=4, traj_key="episode", truncated_key="truncated").sample(storage, 8)
    assert sorted(info) == ["done", "terminated", "truncated"]
    _, info = SliceSampler(slice_len=4, traj_key="episode", truncated_key=("a", "b", "cut")).sample(
        storage, 8
    )
    assert sorted(info) == [("a", "b", "cut"), ("a", "b", "done"), ("a", "b", "terminated")]


# -- errors ----------------------------------------------------------------------------------------------------
def test_several_done_flags_per_step_raise_a_runtime_error():
    storage = LazyTensorStorage(20)
    data = TensorDict(t=torch.arange(10), batch_size=[10])
    data["next", "done"] = torch.zeros(10, 5, 1, dtype=torch.bool)
    storage.set(torch.arange(10), data)
    for exc in (RuntimeError, ValueError):
        with pytest.raises(
            exc, match=r"Expected the end-of-trajectory signal to be 1-dimensional.*\[10, 5, 1\]"
        ):
            SliceSampler(slice_len=2, end_key=("next", "done")).sample(storage, 4)


def test_a_plain_list_storage_is_refused_and_a_lazy_stack_storage_sampled():
    data = _steps([5, 5], ("next",))
    phrase = "Could not get a tensordict out of the storage, which is required for SliceSampler to compute"
    for name, make in _SAMPLERS.items():
        listed = TensorDictReplayBuffer(storage=ListStorage(20), sampler=make(slice_len=2), batch_size=4)
        listed.extend(data)
        with pytest.raises(RuntimeError, match=phrase + ".*got a ListStorage"):
            listed.sample()
        stacked = TensorDictReplayBuffer(
            storage=LazyStackStorage(20), sampler=make(slice_len=2), batch_size=4
        )
        stacked.extend(data)
        batch = stacked.sample()
        assert batch["episode"].view(2, 2).unique(dim=1).shape == (2, 1), name
    # static ends do not read the storage: any storage is sampled
    storage = ListStorage(10)
    storage.set(list(range(6)), [torch.tensor(i) for i in range(6)])
    ends = torch.tensor([False, False, True, False, False, True])
    index, _ = SliceSampler(slice_len=3, ends=ends, cache_values=True).sample(storage, 6)
    assert all(piece in ([0, 1, 2], [3, 4, 5]) for piece in index[0].view(2, 3).tolist())


def test_constructor_refusals_carry_torchrl_phrases():
    with pytest.raises(ValueError, match="pad_output=True is incompatible with strict_length=True"):
        SliceSampler(slice_len=2, pad_output=True, strict_length=True)
    for exc in (RuntimeError, ValueError):
        with pytest.raises(exc, match=r"exclusive.*end_key='a', end_keys=\['b'\]"):
            SliceSampler(slice_len=2, end_key="a", end_keys=["b"])


def test_find_start_stop_traj_refusals_carry_torchrl_phrases():
    end = torch.tensor([False, True, False])
    with pytest.raises(TypeError, match="Exactly one.*got neither"):
        find_start_stop_traj(at_capacity=False)
    with pytest.raises(TypeError, match="Exactly one.*got both"):
        find_start_stop_traj(trajectory=torch.tensor([0, 0, 1]), end=end, at_capacity=False)
    for cursor in (torch.tensor([]), range(0), torch.tensor([], dtype=torch.long)):
        for at_capacity in (True, False):
            with pytest.raises(RuntimeError, match="cursor must not be"):
                find_start_stop_traj(end=end, at_capacity=at_capacity, cursor=cursor)
    for kwargs in ({"end": torch.zeros(0, dtype=torch.bool)}, {"trajectory": torch.zeros(0, 2)}):
        with pytest.raises(RuntimeError, match="empty"):
            find_start_stop_traj(at_capacity=True, **kwargs)
    assert find_start_stop_traj(end=end, at_capacity=True, cursor=torch.tensor([0]))[2].tolist() == [2, 1]


# -- right spans of PrioritizedSliceSampler on a wrapped ring ------------------------------------------------------
def _five_trajectories() -> TensorDict:
    """Trajectories 0..4 of 3, 6, 9, 12 and 15 steps (45 in all), trajectory 0 with the largest priority."""
    parts = []
    for t in range(5):
        n = 3 * (t + 1)
        done = torch.zeros(n, 1, dtype=torch.bool)
        done[-1] = True
        priority = torch.full((n,), 10.0 if t == 0 else 1.0)
        parts.append(
            TensorDict(traj=torch.full((n,), t), step_count=torch.arange(n), done=done, priority=priority)
        )
    return torch.cat([part.auto_batch_size_(batch_dims=1) for part in parts])


@pytest.mark.parametrize("strict_length", [True, False])
@pytest.mark.parametrize("span", [3, [False, True], [False, 3]])
def test_right_span_truncates_the_newest_trajectory_after_a_wrap(span, strict_length):
    torch.manual_seed(0)
    data = _five_trajectories()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # span=3: its left part is ignored with a warning
        sampler = PrioritizedSliceSampler(
            45, alpha=1.0, beta=1.0, end_key="done", slice_len=5, strict_length=strict_length, cache_values=True,
            span=span,
        )  # fmt: skip
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(45), sampler=sampler, batch_size=5)
    rb.extend(data[:15])
    index = rb.extend(data)  # trajectory 4 lands in slots 0..14, just before the write cursor
    assert rb.writer.cursor == 15 and (rb.storage.get(torch.arange(15))["traj"] == 4).all()
    rb.update_priority(index, data["priority"])
    truncated_right = set()
    for _ in range(40):
        batch = rb.sample(200)  # 40 slices, cut after their last step (marked truncated)
        ends = batch["next", "truncated"].squeeze(-1).nonzero().squeeze(-1)
        assert ends.numel() == 40 and ends[-1] == batch.numel() - 1
        for piece in torch.tensor_split(batch, (ends[:-1] + 1).tolist()):
            assert piece["traj"].unique().numel() == 1  # inside one trajectory
            if int(piece["traj"][0]) == 4 and piece.numel() < 5 and int(piece["step_count"][0]) > 10:
                truncated_right.add(tuple(piece["step_count"].tolist()))
    right = 4 if span == [False, True] else 3
    assert truncated_right == {tuple(range(start, 15)) for start in range(11, 15 - 5 + 1 + right)}
    assert not sampler.span[0]


# -- probed keys, padding, end signals (from the behaviours TorchRL code relies on, issue 12) ------------------------
DONE = ("next", "done")


TRUNC = ("next", "truncated")


TERM = ("next", "terminated")


MASK = ("collector", "mask")


def _episodes(lengths, key="episode") -> LazyTensorStorage:
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    data = TensorDict({"obs": torch.arange(ids.numel())}, batch_size=[ids.numel()])
    data.set(key, ids)
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(ids.numel()), data)
    return storage


@pytest.mark.parametrize("key", ["episode", ("collector", "traj_ids")])
def test_slice_sampler_exposes_the_probed_traj_key(key):
    sampler = SliceSampler(slice_len=5)
    assert sampler.traj_key is None
    _, info = sampler.sample(_episodes([10, 10], key), 10)
    assert sampler.traj_key == key
    assert {DONE, TRUNC, TERM} <= set(info)


def test_pad_output_mask_only_when_padded_and_last_real_step_truncated():
    sampler = SliceSampler(slice_len=4, strict_length=False, pad_output=True, traj_key="episode")
    _, info = sampler.sample(_episodes([10, 10]), 8)  # every trajectory holds a full slice
    assert MASK not in info
    _, info = sampler.sample(_episodes([2]), 8)  # one trajectory of 2 steps: 2 padded steps per slice
    assert info[MASK].view(2, 4).tolist() == [[True, True, False, False]] * 2
    assert info[TRUNC].view(2, 4).tolist() == [[False, True, False, False]] * 2


def test_end_key_with_end_keys_is_value_and_runtime_error():
    for exc in (ValueError, RuntimeError):
        with pytest.raises(exc, match="end_keys"):
            SliceSampler(slice_len=2, end_key=DONE, end_keys=[TERM])


@pytest.mark.parametrize("end_keys", [None, [DONE, TERM]])
def test_slice_sampler_refuses_a_2d_end_signal(end_keys):
    data = TensorDict({DONE: torch.zeros(20, 2, dtype=torch.bool), TERM: torch.zeros(20, 1, dtype=torch.bool)},
                      batch_size=[20])
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(20), data)
    sampler = SliceSampler(slice_len=4, end_key=None if end_keys else DONE, end_keys=end_keys)
    with pytest.raises(ValueError, match="one done flag per step"):
        sampler.sample(storage, 8)
