"""The TED layouts' TorchRL keywords: ``TED2Flat(done_key=("next", "done"))`` (TorchRL's default: the full key in TED
data; a bare name is read under ``"next"`` too), the ``shift`` / ``is_full`` properties a storage checkpointer sets
before each save, and ``TED2Nested(*args, **kwargs)`` (TorchRL's signature, forwarded to TED2Flat)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    Flat2TED,
    FlatStorageCheckpointer,
    LazyMemmapStorage,
    Nested2TED,
    TED2Flat,
    TED2Nested,
    TensorDictReplayBuffer,
)


def _ted(done, terminated=None):
    """One stream of steps with observation ``t`` and next observation ``t + 1`` (chained within a trajectory)."""
    n = len(done)
    nxt = {"obs": torch.arange(1.0, n + 1), "done": torch.tensor(done), "reward": torch.ones(n)}
    if terminated is not None:
        nxt["terminated"] = torch.tensor(terminated)
    root = {"obs": torch.arange(float(n)), "done": torch.zeros(n, dtype=torch.bool)}
    if terminated is not None:
        root["terminated"] = torch.zeros(n, dtype=torch.bool)
    return TensorDict({**root, "next": nxt}, batch_size=[n])


def test_ted2flat_reads_the_done_flags_at_torchrl_s_default_key():
    hook = TED2Flat()
    assert hook.done_key == ("next", "done")
    flat = hook(_ted([False, True, False]))
    assert flat["obs"].tolist() == [0.0, 1.0, 2.0, 2.0, 3.0]  # two trajectories, each with its last next obs


@pytest.mark.parametrize("done_key", ["done", ("done",), ("next", "done")])
def test_a_bare_done_name_and_the_full_key_read_the_same_flags(done_key):
    ted = _ted([True, False, False, True, False])
    assert (TED2Flat(done_key)(ted) == TED2Flat()(ted)).all()


def test_another_done_key_ends_trajectories_at_its_own_flags():
    ted = _ted([False, False, False, False], terminated=[False, True, False, False])
    flat = TED2Flat(done_key=("next", "terminated"))(ted)
    assert flat["obs"].shape == (6,)  # steps 0-1 and 2-3: two trajectories, so two extra observations
    assert flat["obs"].shape != TED2Flat()(ted)["obs"].shape
    nested = TED2Nested(("next", "terminated"))(ted)
    assert nested.batch_size == (2,)
    assert (Nested2TED(done_key="terminated")(nested) == ted).all()


def test_a_missing_done_entry_is_named_in_the_error():
    with pytest.raises(KeyError, match=r"\('next', 'truncated'\)"):
        TED2Flat(done_key=("next", "truncated"))(_ted([False, True]))


def test_shift_and_is_full_are_properties_with_checked_setters():
    hook = TED2Flat()
    assert hook.shift is None and hook.is_full is False
    hook.shift, hook.is_full = 3, True
    assert hook.shift == 3 and hook.is_full is True
    hook.is_full = torch.tensor(False)
    hook.shift = None
    assert hook.shift is None and hook.is_full is False
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="`shift` must be None or a non-negative int"):
            hook.shift = bad
    with pytest.raises(TypeError, match="`is_full` must be a bool, got 1"):
        hook.is_full = 1
    assert hook.shift is None and hook.is_full is False  # refused values leave them as they were
    assert isinstance(TED2Flat.shift, property) and isinstance(TED2Flat.is_full, property)


def test_shift_and_is_full_put_a_full_ring_back_in_time_order():
    ted = _ted([False, True, False, True])
    ring = torch.cat([ted[2:], ted[:2]])  # the oldest step sits at row 2
    hook = TED2Flat()
    hook.shift, hook.is_full = 2, True
    flat = hook(ring)
    assert (Flat2TED()(flat) == ring).all()  # Flat2TED reads shift/is_full from the flat data


def test_ted2nested_takes_ted2flat_s_arguments_positionally_and_by_keyword():
    ted = _ted([False, True, False])
    positional = TED2Nested(("next", "done"), "my_shift", "my_is_full", ("done",), ("reward",))
    keywords = TED2Nested(done_key=("next", "done"), shift_key="my_shift", is_full_key="my_is_full",
                          done_keys=("done",), reward_keys=("reward",))
    assert positional.shift_key == keywords.shift_key == ("my_shift",)
    assert (positional(ted)["obs"].unbind()[1] == keywords(ted)["obs"].unbind()[1]).all()
    with pytest.raises(TypeError):
        TED2Nested(("next", "done"), bogus=1)


def _flat_buffer():
    storage = LazyMemmapStorage(4)
    storage.checkpointer = FlatStorageCheckpointer()  # saves through TED2Flat, setting its shift and is_full
    return TensorDictReplayBuffer(storage=storage)


def test_the_flat_checkpointer_round_trips_a_full_ring(tmp_path):
    rb = _flat_buffer()
    steps = _ted([False, True, False, True, False, True])
    rb.extend(steps[:4])
    rb.extend(steps[4:])  # the ring wrapped: the oldest step is at row 2
    rb.dumps(tmp_path)
    fresh = _flat_buffer()
    fresh.loads(tmp_path)
    assert (fresh[:] == rb[:]).all()
