"""Property tests of :class:`~torchrl.data.Sequence` windows (issue 14), on random episodes, ring wraps and
arguments. The worked examples of each argument live in ``test_compat_names.py``; these tests check the
invariants on every input hypothesis draws."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, Sequence, TensorDictReplayBuffer


@st.composite
def streams(draw):
    """A storage written with a stream of steps (``obs`` = the step's time), maybe wrapped, and a unit."""
    written = draw(st.integers(1, 40))
    capacity = draw(st.integers(1, 40))
    done = draw(st.lists(st.booleans(), min_size=written, max_size=written))
    chunk = draw(st.integers(1, 12))
    unit = Sequence(
        draw(st.integers(1, 5)),
        episode_boundary=draw(st.sampled_from(["pad", "stop", "include_reset"])),
        burn_in=draw(st.integers(0, 3)),
        bootstrap=draw(st.integers(0, 3)),
        dilation=draw(st.integers(1, 3)),
    )
    anchors = draw(st.lists(st.integers(0, min(written, capacity) - 1), min_size=1, max_size=8))
    return written, capacity, done, chunk, unit, anchors


def _write(written: int, capacity: int, done: list[bool], chunk: int):
    storage = LazyTensorStorage(capacity)
    rb = TensorDictReplayBuffer(storage=storage)
    for start in range(0, written, chunk):
        stop = min(start + chunk, written)
        flags = torch.tensor(done[start:stop]).unsqueeze(-1)
        rb.extend(
            TensorDict({"obs": torch.arange(start, stop), ("next", "done"): flags}, batch_size=[stop - start])
        )
    return rb, storage


def _episode_of(written: int, capacity: int, done: list[bool]) -> dict[int, int]:
    """Episode number of every stored time step: the oldest stored step starts one, a done step ends one."""
    kept = range(max(0, written - capacity), written)
    episode, out = 0, {}
    for t in kept:
        out[t] = episode
        episode += done[t]
    return out


@settings(max_examples=150, deadline=None)
@given(streams())
def test_sequence_windows_keep_their_invariants(case):
    written, capacity, done, chunk, unit, anchors = case
    rb, storage = _write(written, capacity, done, chunk)
    episode = _episode_of(written, capacity, done)
    oldest, newest = min(episode), max(episode)
    obs = storage.get(torch.arange(len(storage)))["obs"]
    anchor_rows = torch.tensor(anchors)
    index, info = unit.expand(anchor_rows, {"w": torch.arange(len(anchors))}, storage)
    b, w = len(anchors), unit.window
    flat = torch.Size([b * w])  # TorchRL's layout: B * W records, window-major
    assert index.shape == flat == info["validity_mask"].shape == info["learning_mask"].shape
    assert int(index.min()) >= 0 and int(index.max()) < len(storage)  # never outside the written data
    assert info["w"].tolist() == [i for i in range(b) for _ in range(w)]  # the sampler's info per record
    assert info["sequence_id"].tolist() == [i for i in range(b) for _ in range(w)]
    assert info["step_in_sequence"].tolist() == list(range(w)) * b
    assert info["anchor_index"].tolist() == [a for a in anchors for _ in range(w)]  # the drawn anchors
    time = obs[index].view(b, w)  # the time step each window position reads
    valid, learning = info["validity_mask"].view(b, w), info["learning_mask"].view(b, w)
    learn_slots = torch.zeros(w, dtype=torch.bool)
    learn_slots[unit.burn_in : unit.burn_in + unit.length] = True
    assert (learning == learn_slots).all()  # positional: [burn_in, burn_in + length) of every window
    for i, drawn in enumerate(obs[anchor_rows].tolist()):
        t, v = time[i].tolist(), valid[i].tolist()
        assert t == sorted(t)  # time runs forward in a window
        assert all(oldest <= s <= newest for s in t)
        assert drawn in [s for s, ok in zip(t, v) if ok]  # the drawn anchor is read, and valid
        anchor = t[unit.burn_in]  # the window's anchor step (moved back from the drawn one by "stop")
        assert v[unit.burn_in]  # ... is valid
        for j in range(w):  # valid steps are exactly `dilation` apart from the anchor
            if v[j]:
                assert t[j] == anchor + (j - unit.burn_in) * unit.dilation
        if unit.episode_boundary == "include_reset":
            assert anchor == drawn
            assert all(
                v[j] == (oldest <= anchor + (j - unit.burn_in) * unit.dilation <= newest) for j in range(w)
            )
            continue
        assert all(episode[s] == episode[drawn] for s in t)  # pad and stop read the anchor's episode only
        ends = [s for s in episode if episode[s] == episode[drawn]]
        first, last = min(ends), max(ends)
        for j in range(w):  # valid exactly where the ideal step lies inside the episode
            ideal = anchor + (j - unit.burn_in) * unit.dilation
            assert v[j] == (first <= ideal <= last)
        if unit.episode_boundary == "pad":
            assert anchor == drawn
        else:  # stop: moved back (never before the episode start) so as not to run past the episode end
            assert first <= anchor <= drawn
            ideal_end = anchor + (w - 1 - unit.burn_in) * unit.dilation
            assert ideal_end <= last or anchor - first < unit.dilation
            assert (drawn - anchor) % unit.dilation == 0
            if anchor < drawn:  # moved no further than needed
                assert ideal_end + unit.dilation > last


@settings(max_examples=40, deadline=None)
@given(streams())
def test_sequence_batches_through_a_buffer_match_the_expanded_index(case):
    written, capacity, done, chunk, unit, _ = case
    rb, storage = _write(written, capacity, done, chunk)
    seq_rb = TensorDictReplayBuffer(storage=storage, sample_unit=unit, batch_size=4)
    seq_rb.set_rng(torch.Generator().manual_seed(0))
    batch = seq_rb.sample()
    assert batch.batch_size == torch.Size([4 * unit.window])
    assert (batch["obs"] == storage.get(batch["index"])["obs"]).all()
    assert batch["sequence_id"].tolist() == [i for i in range(4) for _ in range(unit.window)]
    assert (batch["validity_mask"].view(4, -1).any(-1)).all()
