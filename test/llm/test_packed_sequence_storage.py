"""PackedSequenceStorage: variable-length sequences packed end to end, freed whole, shared and checkpointed."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict, lazy_stack
from torch.utils.data import DataLoader

from torchrl.data import (
    GroupSampler,
    GroupWriter,
    LazyStackStorage,
    PackedSequenceStorage,
    ReplayBuffer,
    tensordict_collate,
)
from torchrl.data.replay_buffers._checkpoint import fs as _checkpoint_fs
from torchrl.data.replay_buffers.errors import CheckpointError

TOKEN_KEYS = ("tokens", "log_probs")


def seq(n: int, seed: int = 0, *, prompt_id: int = 0, version: int = 0, reward: float | None = None) -> TensorDict:
    """One sequence of ``n`` tokens whose values depend on ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        tokens=torch.randint(0, 50_000, (n,), generator=g),
        log_probs=torch.randn(n, generator=g),
        reward=torch.tensor(float(seed) if reward is None else reward),
        prompt_id=torch.tensor(prompt_id),
        policy_version=torch.tensor(version),
        meta=TensorDict(score=torch.randn(2, generator=g)),
    )


def storage(max_tokens=100, max_sequences=20, **kwargs) -> PackedSequenceStorage:
    return PackedSequenceStorage(max_tokens, max_sequences=max_sequences, token_keys=TOKEN_KEYS, **kwargs)


def assert_same_sequence(a: TensorDict, b: TensorDict) -> None:
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8)), key  # bit for bit


# -- round trips and layout -------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["list", "lazy_stack"])
def test_ragged_sequences_read_back_bit_identical(form):
    items = [seq(n, i) for i, n in enumerate([3, 17, 1, 9, 30])]
    s = storage()
    slots = s.extend_sequences(items if form == "list" else lazy_stack(items))
    assert slots.tolist() == [0, 1, 2, 3, 4]
    batch = s.get(slots)
    assert batch.batch_size == torch.Size([5])
    for item, got in zip(items, batch.tensordicts):
        assert_same_sequence(item, got)
    assert_same_sequence(items[3], s.get(3))


def test_dense_batch_of_equal_lengths_is_split_into_sequences():
    dense = TensorDict(tokens=torch.arange(12).reshape(3, 4), reward=torch.arange(3.0), batch_size=[3])
    s = PackedSequenceStorage(50, max_sequences=5)
    s.extend_sequences(dense)
    assert [t.tolist() for t in s.get([0, 1, 2]).get("tokens", as_list=True)] == dense["tokens"].tolist()


def test_reads_are_copies_that_later_writes_do_not_change():
    s = PackedSequenceStorage(8, max_sequences=4)
    s.extend_sequences([TensorDict(tokens=torch.arange(4))])
    first = s.get(0)
    s.extend_sequences([TensorDict(tokens=torch.full((8,), 7))])  # overwrites every cell
    assert first["tokens"].tolist() == [0, 1, 2, 3]


def test_tokens_take_no_padding_and_no_per_sequence_objects():
    lengths = torch.randint(16, 4097, (80,), generator=torch.Generator().manual_seed(0))
    total = int(lengths.sum())
    s = PackedSequenceStorage(total, max_sequences=80)
    s.extend_sequences(
        [TensorDict(tokens=torch.zeros(int(n), dtype=torch.int32), reward=torch.tensor(0.0)) for n in lengths]
    )
    assert len(s) == 80
    token_bytes = total * 4
    fixed_bytes = 80 * 4 + 80 * 5 * 8 + 4 * 8  # reward, slot table, counters
    assert s.token_bytes() == token_bytes
    assert s.nbytes() == token_bytes + fixed_bytes
    assert s.nbytes() <= 1.02 * token_bytes + fixed_bytes


# -- eviction ---------------------------------------------------------------------------------------------------
def test_a_write_past_the_arena_end_wraps_and_frees_whole_sequences():
    s = PackedSequenceStorage(10, max_sequences=8)
    s.extend_sequences([TensorDict(tokens=torch.full((n,), i)) for i, n in enumerate([4, 4])])
    s.extend_sequences([TensorDict(tokens=torch.full((2,), 2))])  # fills the arena exactly
    assert s.live_slots().tolist() == [0, 1, 2]
    s.extend_sequences([TensorDict(tokens=torch.full((3,), 3))])  # overwrites 3 of the 4 tokens of slot 0
    assert s.live_slots().tolist() == [1, 2, 3]
    assert [t.tolist() for t in s.get([1, 2, 3]).get("tokens", as_list=True)] == [[1] * 4, [2] * 2, [3] * 3]
    with pytest.raises(IndexError, match="hold no live sequence"):
        s.get(0)


def test_a_sequence_that_does_not_fit_before_the_end_starts_at_the_arena_start():
    s = PackedSequenceStorage(10, max_sequences=8)
    s.extend_sequences([TensorDict(tokens=torch.full((7,), 0))])
    s.extend_sequences([TensorDict(tokens=torch.full((5,), 1))])  # 3 cells left at the end: skipped
    assert s.live_slots().tolist() == [1]
    assert s.get(1)["tokens"].tolist() == [1] * 5


def test_slots_are_a_ring_in_write_order():
    s = PackedSequenceStorage(1000, max_sequences=3)
    for i in range(5):
        s.extend_sequences([TensorDict(tokens=torch.full((2,), i))])
    assert s.live_slots().tolist() == [2, 0, 1]
    assert [int(t[0]) for t in s.get(s.live_slots()).get("tokens", as_list=True)] == [2, 3, 4]


def test_a_write_larger_than_the_storage_keeps_its_last_sequences():
    s = PackedSequenceStorage(10, max_sequences=8)
    slots = s.extend_sequences([TensorDict(tokens=torch.full((4,), i)) for i in range(5)])
    live = s.live_slots()
    assert slots.tolist() == live.tolist()
    assert [int(t[0]) for t in s.get(live).get("tokens", as_list=True)] == [3, 4]


def test_free_and_empty():
    rb = make_buffer(storage=storage(), writer=GroupWriter(), sampler=GroupSampler(1), cls=ReplayBuffer)
    s = rb.storage
    s.extend_sequences([seq(3, i) for i in range(4)])
    s.free([1, 2])
    assert s.live_slots().tolist() == [0, 3] and len(s) == 2
    rb.empty()
    assert len(s) == 0 and s.live_slots().tolist() == []
    assert s.extend_sequences([seq(3)]).tolist() == [0]


# -- bad input --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_tokens": 0}, ValueError, "max_tokens"),
        ({"max_tokens": 10, "max_sequences": 0}, ValueError, "max_sequences"),
        ({"max_tokens": 10, "token_keys": ()}, ValueError, "token_keys"),
        ({"max_tokens": 10, "token_keys": ("a", "a")}, ValueError, "token_keys"),
        ({"max_tokens": 10, "token_keys": 3}, TypeError, "token_keys"),
        ({"max_tokens": 10, "shared_init": 1}, TypeError, "shared_init"),
    ],
)
def test_bad_constructor_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        PackedSequenceStorage(**kwargs)


def _bad_writes():
    ok = seq(3)
    return [
        ("not a batch", TypeError, "batch of sequences", torch.zeros(3)),
        ("one td", ValueError, "batch size \\[\\]", ok),
        ("item not td", TypeError, "item 1", [ok, torch.zeros(3)]),
        ("item with batch dims", ValueError, "batch_size", [TensorDict(tokens=torch.zeros(2, 3), batch_size=[2])]),
        ("missing token key", KeyError, "no token entry 'log_probs'", [TensorDict(tokens=torch.arange(3))]),
        ("different entries", ValueError, "same entries", [ok, ok.exclude("reward")]),
        ("scalar token entry", ValueError, "one value per token", [ok.clone().set("tokens", torch.tensor(1))]),
        ("lengths differ", ValueError, "different lengths", [ok.clone().set("log_probs", torch.zeros(4))]),
        ("too long", ValueError, "max_tokens=100", [seq(101)]),
        ("empty sequence", ValueError, "1 to max_tokens", [seq(0)]),
        ("ragged fixed entry", ValueError, "token_keys", [ok, ok.clone().set(("meta", "score"), torch.zeros(3))]),
        ("non tensor", TypeError, "non-tensor", [ok.clone().set("text", "abc")]),
    ]


@pytest.mark.parametrize("case, error, match, data", _bad_writes(), ids=[c[0] for c in _bad_writes()])
def test_bad_writes_raise_and_write_nothing(case, error, match, data):
    s = storage()
    s.extend_sequences([seq(5, 1)])
    before = (s.live_slots().clone(), s.get(0))
    with pytest.raises(error, match=match):
        s.extend_sequences(data)
    assert torch.equal(s.live_slots(), before[0])
    assert_same_sequence(s.get(0), before[1])


def test_a_write_that_does_not_match_the_stored_layout_is_refused():
    s = storage()
    s.extend_sequences([seq(5)])
    with pytest.raises(ValueError, match="fixed entries"):
        s.extend_sequences([seq(5).exclude("reward")])
    with pytest.raises(ValueError, match="shape"):
        s.extend_sequences([seq(5).set(("meta", "score"), torch.zeros(3))])
    with pytest.raises(TypeError, match="truncated"):
        s.extend_sequences([seq(5).set("tokens", torch.zeros(5))])
    assert len(s) == 1


def test_bad_group_sizes_and_slots_are_refused():
    s = storage()
    with pytest.raises(ValueError, match="group_sizes"):
        s.extend_sequences([seq(3), seq(3)], group_sizes=[1])
    with pytest.raises(ValueError, match="larger max_tokens"):
        s.extend_sequences([seq(60), seq(60)], group_sizes=[2])
    with pytest.raises(IndexError, match="max_sequences"):
        s.free([25])
    with pytest.raises(TypeError, match="rb.as_dataset"):
        s.as_dataset()
    assert len(s) == 0


# -- checkpoints ------------------------------------------------------------------------------------------------
def test_dumps_loads_round_trips_bit_for_bit(tmp_path):
    s = storage(max_tokens=60, max_sequences=10)
    for i in range(12):  # wraps several times
        s.extend_sequences([seq(3 + i % 7, i)])
    s.dumps(tmp_path / "ckpt")
    fresh = storage(max_tokens=60, max_sequences=10)
    fresh.loads(tmp_path / "ckpt")
    assert torch.equal(fresh.live_slots(), s.live_slots())
    for a, b in zip(s.get(s.live_slots()).tensordicts, fresh.get(fresh.live_slots()).tensordicts):
        assert_same_sequence(a, b)
    # the loaded storage goes on where the saved one stopped
    assert torch.equal(fresh.extend_sequences([seq(4, 99)]), s.extend_sequences([seq(4, 99)]))
    assert torch.equal(fresh.live_slots(), s.live_slots())


def test_a_buffer_with_a_group_writer_round_trips(tmp_path):
    rb = make_buffer(storage=storage(), writer=GroupWriter(), sampler=GroupSampler(2), cls=ReplayBuffer,
                     batch_size=2)
    rb.extend([seq(4, i, prompt_id=i // 3) for i in range(9)])
    rb.dumps(tmp_path / "rb")
    other = make_buffer(storage=storage(), writer=GroupWriter(), sampler=GroupSampler(2), cls=ReplayBuffer,
                        batch_size=2)
    other.loads(tmp_path / "rb")
    assert torch.equal(other.storage.live_groups()[2], rb.storage.live_groups()[2])


def test_a_checkpoint_of_another_capacity_is_refused_and_nothing_is_loaded(tmp_path):
    s = storage()
    s.extend_sequences([seq(4)])
    s.dumps(tmp_path / "ckpt")
    other = storage(max_tokens=50)
    other.extend_sequences([seq(5, 3)])
    with pytest.raises(ValueError, match="max_tokens"):
        other.loads(tmp_path / "ckpt")
    assert other.live_slots().tolist() == [0] and other.get(0)["tokens"].shape == (5,)


def test_a_corrupt_slot_table_is_refused(tmp_path):
    s = storage()
    s.extend_sequences([seq(4)])
    s._slots[0, 1] = 1000  # a length past the arena (written into the checkpoint as is)
    s.dumps(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="invalid rows"):
        storage().loads(tmp_path / "ckpt")


def _dump_and_die(path: str, s=None) -> None:
    torch.set_num_threads(1)
    if s is None:
        s = storage()
        s.extend_sequences([seq(9, 2), seq(11, 3)])
    else:  # the storage that wrote the checkpoint at `path`: an incremental dump
        s.extend_sequences([seq(9, 2), seq(11, 3)])

    def die(name: str) -> None:
        if name == "tensor_written":
            os.kill(os.getpid(), signal.SIGKILL)

    _checkpoint_fs.STEP_HOOK = die
    s.dumps(path)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks a writer and sends SIGKILL")
def test_sigkill_during_dumps_leaves_the_previous_checkpoint_loadable(tmp_path):
    path = str(tmp_path / "ckpt")
    s = storage()
    s.extend_sequences([seq(4, 0), seq(6, 1)])
    s.dumps(path)
    child = multiprocessing.get_context("fork").Process(target=_dump_and_die, args=(path,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    fresh = storage()
    fresh.loads(path)
    for a, b in zip(s.get([0, 1]).tensordicts, fresh.get([0, 1]).tensordicts):
        assert_same_sequence(a, b)



@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks a writer and sends SIGKILL")
def test_sigkill_during_an_incremental_dump_leaves_the_previous_checkpoint_loadable(tmp_path):
    path = str(tmp_path / "ckpt")
    s = storage()
    s.extend_sequences([seq(4, i) for i in range(12)])
    s.dumps(path)
    s.extend_sequences([seq(4, 20)])
    s.dumps(path)  # incremental (a patch), the previous checkpoint of the next one
    assert any("patches/" in name for name in _checkpoint_files(path))
    child = multiprocessing.get_context("fork").Process(target=_dump_and_die, args=(path, s))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    fresh = storage()
    fresh.loads(path)
    assert_same_storage(s, fresh)  # the parent's storage (private) holds what the previous checkpoint saved


def _checkpoint_files(path) -> dict:
    """``{tensor name: (inode, shape)}`` of the checkpoint at ``path``."""
    from torchrl.data.replay_buffers.checkpointers import read_checkpoint

    tensors, _ = read_checkpoint(str(path))
    return {name: (os.stat(t.filename).st_ino, tuple(t.shape)) for name, t in tensors.items()}


def assert_same_storage(a: PackedSequenceStorage, b: PackedSequenceStorage) -> None:
    assert torch.equal(a.live_slots(), b.live_slots()) and a.write_revision != -1
    for x, y in zip(a.get(a.live_slots()).tensordicts, b.get(b.live_slots()).tensordicts):
        assert_same_sequence(x, y)


def test_a_dump_onto_its_own_checkpoint_writes_only_the_rows_appended_since(tmp_path):
    path = tmp_path / "ckpt"
    s = storage(max_tokens=200, max_sequences=40)
    s.extend_sequences([seq(5 + i % 4, i) for i in range(20)])  # 125 tokens, 20 slots
    s.dumps(path)
    first = _checkpoint_files(path)
    s.extend_sequences([seq(3, 50), seq(4, 51)])  # 7 tokens, 2 slots
    s.dumps(path)
    second = _checkpoint_files(path)
    for name, (inode, shape) in first.items():
        if "tokens/" in name or "fixed/" in name:
            assert second[name] == (inode, shape)  # hard-linked: the same file
    new = {name: shape for name, (inode, shape) in second.items() if name not in first}
    assert sorted(shape[0] for name, shape in new.items() if "/tokens/" in name) == [7, 7]  # 2 token keys
    assert {shape[0] for name, shape in new.items() if "/fixed/" in name} == {2}
    fresh = storage(max_tokens=200, max_sequences=40)
    fresh.loads(path)
    assert_same_storage(s, fresh)


def test_incremental_dumps_across_wraps_load_bit_for_bit(tmp_path):
    path = tmp_path / "ckpt"
    s = storage(max_tokens=400, max_sequences=60)
    s.extend_sequences([seq(5 + i % 9, i, prompt_id=i) for i in range(40)])
    s.dumps(path)
    patched = []
    for round_ in range(12):  # about 25 tokens a round: the arena wraps; some rounds dump in full
        s.extend_sequences([seq(4 + (round_ + i) % 7, 100 * round_ + i) for i in range(3)])
        if round_ == 5:
            s.free(s.live_slots()[:2])  # frees change the slot table only
        s.dumps(path)
        patched.append(any("patches/" in name for name in _checkpoint_files(path)))
        fresh = storage(max_tokens=400, max_sequences=60)
        fresh.loads(path)
        assert_same_storage(s, fresh)
        assert torch.equal(fresh._slots, s._slots) and torch.equal(fresh._meta[:3], s._meta[:3])
    assert sum(patched) >= 8 and not all(patched)  # mostly patches; a full dump once they grow past 1/4
    assert int(s._meta[0]) > 400 and int(s._meta[1]) > 60  # both rings wrapped
    # the loaded storage goes on where the saved one stopped
    assert torch.equal(fresh.extend_sequences([seq(6, 999)]), s.extend_sequences([seq(6, 999)]))


def test_a_dump_after_empty_or_elsewhere_is_full(tmp_path):
    s = storage(max_tokens=200, max_sequences=40)
    s.extend_sequences([seq(6, i) for i in range(10)])
    s.dumps(tmp_path / "a")
    make_buffer(storage=s, sampler=GroupSampler(1), cls=ReplayBuffer).empty()
    s.extend_sequences([seq(7, 100 + i) for i in range(10)])  # past the old cursor, from row 0 again
    s.dumps(tmp_path / "a")
    files = _checkpoint_files(tmp_path / "a")
    assert not any("patches/" in name for name in files)
    fresh = storage(max_tokens=200, max_sequences=40)
    fresh.loads(tmp_path / "a")
    assert_same_storage(s, fresh)
    s.dumps(tmp_path / "b")  # another path: full
    s.extend_sequences([seq(3, 7)])
    fresh.loads(tmp_path / "a")  # a loaded storage dumps in full first
    fresh.extend_sequences([seq(3, 7)])
    fresh.dumps(tmp_path / "a")
    assert not any("patches/" in name for name in _checkpoint_files(tmp_path / "a"))


# -- sharing ----------------------------------------------------------------------------------------------------
def test_memory_mapped_storage_in_a_scratch_dir(tmp_path):
    s = storage(scratch_dir=tmp_path)
    items = [seq(5, i) for i in range(3)]
    s.extend_sequences(items)
    assert any(name.endswith(".memmap") for _, _, files in os.walk(tmp_path) for name in files)
    for a, b in zip(items, s.get([0, 1, 2]).tensordicts):
        assert_same_sequence(a, b)


def _write_from_child(shared, seeds) -> None:
    torch.set_num_threads(1)
    shared.extend_sequences([seq(7, i) for i in seeds])


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "method, shared_init",
    [("fork", False), ("fork", True),
     pytest.param("spawn", False, marks=pytest.mark.slow), pytest.param("spawn", True, marks=pytest.mark.slow)],
)
def test_a_writer_process_writes_into_the_same_storage(method, shared_init):
    s = storage(shared_init=shared_init)
    if not shared_init:
        s.extend_sequences([seq(3, 100)])
        if method == "fork":
            s.share_memory_()  # a spawned child gets it shared when the storage is sent
    child = torch.multiprocessing.get_context(method).Process(target=_write_from_child, args=(s, [1, 2]))
    child.start()
    child.join(90)
    assert child.exitcode == 0
    live = s.live_slots()
    got = s.get(live).tensordicts[-2:]
    assert_same_sequence(got[0], seq(7, 1))
    assert_same_sequence(got[1], seq(7, 2))
    s.extend_sequences([seq(2, 3)])  # the parent goes on after the child's writes
    assert len(s) == len(live) + 1


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_two_dataloader_workers_sample_whole_groups_of_the_shared_storage(method):
    rb = make_buffer(storage=storage(max_tokens=400, max_sequences=60), writer=GroupWriter(),
                     sampler=GroupSampler(2), cls=ReplayBuffer, batch_size=2)
    rb.extend([seq(3 + i % 5, i, prompt_id=i // 4) for i in range(24)])
    loader = DataLoader(rb.as_dataset(num_batches=4), batch_size=None, num_workers=2,
                        collate_fn=tensordict_collate, multiprocessing_context=method)
    stored = {int(t["reward"]): t for t in rb.storage.get(rb.storage.live_slots()).tensordicts}
    batches = list(loader)
    assert len(batches) == 4
    for batch in batches:
        rewards = [int(r) for r in batch["reward"]]
        assert len(rewards) == 8  # two groups of four
        for t in batch.tensordicts:
            assert_same_sequence(t.select(*stored[0].keys()), stored[int(t["reward"])])
        prompts = [int(p) for p in batch["prompt_id"]]
        assert prompts[:4] == [prompts[0]] * 4 and prompts[4:] == [prompts[4]] * 4


def _hammer(rb, stop, rounds: int, pause: float = 0.0) -> None:
    """Writes groups of two sequences whose tokens all equal ``1000 * prompt_id + position`` until ``stop``."""
    torch.set_num_threads(1)
    for p in range(rounds):
        if stop.is_set():
            return
        time.sleep(pause)
        rb.extend([TensorDict(tokens=torch.full((5 + (p + i) % 7,), 1000 * p + i), log_probs=torch.zeros(
            5 + (p + i) % 7), prompt_id=torch.tensor(p)) for i in range(2)])  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_samples_drawn_while_another_process_writes_are_whole_and_untorn():
    # every write of the other process overwrites the oldest groups, which the sampler also draws (about 30
    # groups live); the writer pauses a little so that 8 draws in a row are not all overwritten
    rb = make_buffer(storage=storage(max_tokens=480, max_sequences=96), writer=GroupWriter(),
                     sampler=GroupSampler(3), cls=ReplayBuffer)
    _hammer(rb, multiprocessing.get_context("fork").Event(), 40)
    rb.storage.share_memory_()
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    child = ctx.Process(target=_hammer, args=(rb, stop, 10**9, 0.001), daemon=True)
    child.start()
    try:
        for _ in range(300):
            batch, info = rb.sample(return_info=True)
            prompts = batch["prompt_id"]
            for g in range(3):
                members = prompts[info["group"] == g]
                assert len(members) == 2 and bool((members == members[0]).all())
            for i, (p, tokens) in enumerate(zip(prompts.tolist(), batch.get("tokens", as_list=True))):
                assert bool((tokens == 1000 * p + i % 2).all())  # no token of another write
            slots = rb.storage.live_slots()[:4]  # named slots: a torn read is read again
            try:
                named = rb.storage.get(slots)
            except IndexError:  # freed meanwhile
                continue
            for p, tokens in zip(named["prompt_id"].tolist(), named.get("tokens", as_list=True)):
                assert bool((tokens // 1000 == p).all())
    finally:
        stop.set()
        child.join(30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


def test_lazy_stack_storage_and_packed_storage_read_the_same_sequences():
    items = [seq(n, n) for n in (3, 8, 2)]
    lazy = LazyStackStorage(3)
    lazy.set(torch.arange(3), items)
    packed = storage()
    packed.extend_sequences(items)
    for a, b in zip(lazy.get([0, 1, 2]).tensordicts, packed.get([0, 1, 2]).tensordicts):
        assert_same_sequence(a, b)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_dataloader_workers_see_groups_written_after_they_started():
    rb = make_buffer(storage=storage(max_tokens=400, max_sequences=60), writer=GroupWriter(),
                     sampler=GroupSampler(1, strategy="recency"), cls=ReplayBuffer, batch_size=1)
    rb.extend([seq(4, i, prompt_id=0) for i in range(3)])
    loader = DataLoader(rb.as_dataset(), batch_size=None, num_workers=2, collate_fn=tensordict_collate,
                        multiprocessing_context="fork", prefetch_factor=1)
    batches = iter(loader)
    assert {int(p) for p in next(batches)["prompt_id"]} == {0}
    rb.extend([seq(6, 10 + i, prompt_id=1) for i in range(2)])
    for _ in range(50):
        batch = next(batches)
        if int(batch["prompt_id"][0]) == 1:
            break
    else:
        raise AssertionError("the workers never sampled the group written after they started")
    assert [int(r) for r in batch["reward"]] == [10, 11]  # the whole new group, in write order
    del batches


@pytest.mark.parametrize("shared", [False, True])
def test_a_pickled_copy_is_private(shared):
    import pickle

    s = storage()
    s.extend_sequences([seq(3)])
    if shared:
        s.share_memory_()
    copy = pickle.loads(pickle.dumps(s))
    copy.extend_sequences([seq(4, 1)])
    assert len(s) == 1 and len(copy) == 2 and not copy.is_shared


def test_a_checkpoint_holds_only_the_rows_written(tmp_path):
    from torchrl.data.replay_buffers.checkpointers import read_checkpoint

    s = storage(max_tokens=1000, max_sequences=50)
    s.extend_sequences([seq(7, 0), seq(5, 1)])
    s.dumps(tmp_path / "ckpt")
    tensors, _ = read_checkpoint(str(tmp_path / "ckpt"))
    shapes = sorted(tuple(t.shape) for name, t in tensors.items() if "tokens/" in name or "fixed/" in name)
    assert (12,) in shapes and all(shape[0] in (12, 2) for shape in shapes)


def test_a_round_robin_writer_appends_and_a_group_sampler_draws_single_sequences():
    rb = make_buffer(storage=storage(max_tokens=30, max_sequences=4), sampler=GroupSampler(), cls=ReplayBuffer,
                     batch_size=2)
    for i in range(6):
        rb.extend(lazy_stack([seq(4, 2 * i), seq(6, 2 * i + 1)]))
    live = rb.storage.live_slots()
    assert len(live) == 4  # the last four sequences (4 slots; 30 tokens would hold six)
    batch = rb.sample()
    assert batch.batch_size == torch.Size([2])
    assert {int(r) for r in batch["reward"]} <= {int(r) for r in rb.storage.get(live)["reward"]}
    with pytest.raises(ValueError, match="appends sequences at its own cursor"):
        rb.storage.set(torch.tensor([3]), [seq(2)])


def test_sampled_slots_read_freed_but_intact_sequences_and_refuse_overwritten_ones():
    s = PackedSequenceStorage(10, max_sequences=8)
    s.extend_sequences([TensorDict(tokens=torch.full((4,), 1)), TensorDict(tokens=torch.full((4,), 2))])
    s.free([0])  # e.g. a stale group freed between a draw and its read
    with pytest.raises(IndexError, match="no live sequence"):
        s.get(0)
    assert s.read_rows(torch.tensor([0]))["tokens"].tolist() == [[1, 1, 1, 1]]
    s.extend_sequences([TensorDict(tokens=torch.full((3,), 3))])  # wraps: slot 0's tokens are overwritten
    with pytest.raises(RuntimeError, match="overwritten"):
        s.read_rows(torch.tensor([0]))
    assert [t.tolist() for t in s.read_rows(torch.tensor([1, 2])).get("tokens", as_list=True)] == [[2] * 4, [3] * 3]


def test_a_nested_token_key():
    s = PackedSequenceStorage(50, max_sequences=5, token_keys=(("text", "ids"),))
    with pytest.raises(KeyError, match="no token entry"):
        s.extend_sequences([TensorDict(text=torch.arange(3))])
    item = TensorDict(text=TensorDict(ids=torch.arange(3)), reward=torch.tensor(1.0))
    s.extend_sequences([item, item])
    assert_same_sequence(s.get(1), item)


# -- state_dict / load_state_dict ------------------------------------------------------------------------------------
def test_load_state_dict_restores_the_sequences_into_a_new_storage():
    source = storage(64, 8)
    source.extend_sequences([seq(n, seed=n) for n in (3, 5, 7)])
    target = storage(64, 8)
    target.load_state_dict(source.state_dict())
    assert len(target) == 3
    for slot in range(3):
        assert torch.equal(target.get(slot)["tokens"], source.get(slot)["tokens"])
    target.extend_sequences([seq(2, seed=9)])  # and it goes on writing after them
    assert len(target) == 4 and torch.equal(target.get(3)["tokens"], seq(2, seed=9)["tokens"])


def test_load_state_dict_refuses_other_sizes_and_partial_states_before_changing_anything():
    source = storage(64, 8)
    source.extend_sequences([seq(4)])
    state = source.state_dict()
    other_slots = storage(64, 4)
    with pytest.raises(ValueError, match="max_sequences=4"):
        other_slots.load_state_dict(state)
    other_tokens = storage(32, 8)
    with pytest.raises(ValueError, match="max_tokens=32"):
        other_tokens.load_state_dict(state)
    assert len(other_slots) == 0 and len(other_tokens) == 0
    with pytest.raises(KeyError, match="'meta'"):
        storage(64, 8).load_state_dict({"slots": state["slots"]})
