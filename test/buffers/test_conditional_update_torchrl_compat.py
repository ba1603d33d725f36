"""TorchRL compatibility of ``update_if_present`` (facts file §1): dict patches, reshaping, validation before any
write, liveness, versions, duplicates, checkpoints, concurrency, unsupported storages and writers."""

from __future__ import annotations

import re
import threading

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
)
from torchrl.data.replay_buffers.replay_buffers.conditional_update import (
    CONDITIONAL_DOTTED_KEY,
    CONDITIONAL_VERSION_IN_PATCH,
    ConditionalUpdateResult,
)


def _buffer(capacity: int = 6, storage=None, **kwargs) -> TensorDictReplayBuffer:
    storage = LazyTensorStorage(capacity, **kwargs) if storage is None else storage
    return make_buffer(
        cls=TensorDictReplayBuffer, storage=storage, writer=TensorDictRoundRobinWriter(track_generations=True)
    )


def _rows(n: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(
        obs=torch.stack([ids.float()] * 3, -1),
        v=torch.zeros(n, dtype=torch.long),
        v2=torch.zeros(n, 1),
        nested=TensorDict(version=torch.zeros(n, dtype=torch.long), x=ids.float(), batch_size=[n]),
        batch_size=[n],
    )


def _filled(n: int = 4, capacity: int = 6, **kwargs):
    rb = _buffer(capacity, **kwargs)
    index = rb.extend(_rows(n))
    return rb, index, rb.writer.generations_of(index)


def _snapshot(rb) -> tuple:
    content = rb.storage.get(torch.arange(rb.storage.rows_written())).clone() if len(rb) else None
    generations = rb.writer.generations_of(torch.arange(rb.storage.rows_written()))
    return len(rb), rb.writer.cursor, generations.tolist(), content


def _assert_unchanged(rb, before) -> None:
    after = _snapshot(rb)
    assert after[:3] == before[:3]
    if before[3] is not None:
        assert (after[3] == before[3]).all()


# -- patches -----------------------------------------------------------------------------------------------------
def test_a_plain_dict_patch_with_str_and_tuple_keys_is_written():
    rb, index, generation = _filled()
    patch = {"obs": torch.full((4, 3), -1.0), ("nested", "x"): torch.tensor([10.0, 11.0, 12.0, 13.0])}
    result = rb.update_if_present(index=index, generation=generation, patch=patch)
    assert isinstance(result, ConditionalUpdateResult)
    assert result.updated.tolist() == [True] * 4 and result.updated_count == 4 and result.stale_count == 0
    assert result.version_rejected is None and result.version_rejected_count == 0
    stored = rb[:4]
    assert (stored["obs"] == -1).all() and stored["nested", "x"].tolist() == [10.0, 11.0, 12.0, 13.0]
    assert stored["v"].tolist() == [0, 0, 0, 0]  # entries not in the patch are kept


def test_a_nested_dict_and_a_tensordict_patch_are_written():
    rb, index, generation = _filled(2)
    rb.update_if_present(
        index=index, generation=generation, patch={"nested": {"x": torch.tensor([5.0, 6.0])}}
    )
    assert rb[:2]["nested", "x"].tolist() == [5.0, 6.0]
    patch = TensorDict(obs=torch.zeros(2, 3), batch_size=[2])
    assert rb.update_if_present(index=index, generation=generation, patch=patch).updated_count == 2
    assert (rb[:2]["obs"] == 0).all()


def test_each_patch_value_is_reshaped_to_the_records_and_their_stored_shape():
    rb, index, generation = _filled(2)
    rb.update_if_present(
        index=index, generation=generation, patch={"obs": torch.arange(6.0)}
    )  # [6] -> [2, 3]
    assert rb[:2]["obs"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    one = rb.update_if_present(index=1, generation=generation[1], patch={"obs": torch.ones(1, 3)})
    assert one.updated.tolist() == [True] and rb[1]["obs"].tolist() == [1.0, 1.0, 1.0]


def test_on_an_ndim2_storage_a_patch_shaped_like_the_written_data_is_valid():
    rb = _buffer(12, ndim=2)
    written = TensorDict(obs=torch.zeros(2, 3), v=torch.zeros(2, 3, dtype=torch.long), batch_size=[2, 3])
    index = rb.extend(written)  # [6, 2] cell coordinates
    generation = rb.writer.generations_of(index)
    patch = {"obs": torch.arange(6.0).reshape(2, 3)}
    result = rb.update_if_present(index=index, generation=generation, patch=patch)
    assert result.updated.shape == (6,) and result.updated_count == 6
    cells = rb.storage.get(tuple(index.unbind(-1)))
    assert cells["obs"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    result = rb.update_if_present(
        index=index[:2], generation=generation[:2], patch={"obs": torch.tensor([7.0, 8.0])},
        version_key="v", version=torch.tensor([1, 1]),
    )  # fmt: skip
    cells = rb.storage.get(tuple(index.unbind(-1)))
    assert cells["obs"].tolist() == [7.0, 8.0, 2.0, 3.0, 4.0, 5.0]
    assert cells["v"].tolist() == [1, 1, 0, 0, 0, 0]


def test_sampled_ndim2_cells_can_be_patched_with_their_info():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(12, ndim=2),
        writer=TensorDictRoundRobinWriter(track_generations=True),
        batch_size=4,
    )
    rb.extend(TensorDict(obs=torch.zeros(2, 3), batch_size=[2, 3]))
    batch = rb.sample()
    result = rb.update_if_present(
        index=batch["index"], generation=batch["index_generation"], patch={"obs": torch.ones(4)}
    )
    assert result.updated.tolist() == [True] * 4 and result.stale_count == 0
    assert (rb.storage.get(tuple(batch["index"].unbind(-1)))["obs"] == 1).all()


# -- validation before any write ---------------------------------------------------------------------------------
REFUSALS = [
    ({"patch": {"obs": torch.zeros(4, 3, dtype=torch.float64)}}, ValueError, "dtype torch.float64"),
    ({"patch": {"v": torch.zeros(4)}}, ValueError, "dtype torch.float32.*torch.int64"),
    ({"patch": {"obs": torch.zeros(4, 2)}}, ValueError, r"shape \[4, 2\].*need \[4, 3\]"),
    ({"patch": {"obs": torch.zeros(5, 3)}}, ValueError, "4 records"),
    ({"patch": {"missing": torch.zeros(4)}}, KeyError, "missing"),
    ({"patch": {("nested", "nope"): torch.zeros(4)}}, KeyError, "nope"),
    ({"version_key": "missing", "version": 1}, KeyError, "missing"),
    ({"version_key": "v"}, ValueError, "`version_key` without `version`"),
    ({"version": 1}, ValueError, "`version` without `version_key`"),
    ({"patch": {("nested", "x"): torch.ones(4)}, "version_key": "obs", "version": 1}, ValueError,
     r"shape \[3\] per record"),
    ({"version_key": "v", "version": torch.ones(4, 2, dtype=torch.long)}, ValueError, r"\[4\] or \[4, 1\]"),
    ({"version_key": "v", "version": torch.tensor(1.5)}, ValueError, "cannot hold"),
    ({"generation": torch.zeros(3, dtype=torch.long)}, ValueError, "3 values for 4 records"),
    ({"patch": {"v": torch.ones(4, dtype=torch.long)}, "version_key": "v", "version": 1}, ValueError,
     re.escape(CONDITIONAL_VERSION_IN_PATCH.phrase)),
    ({"patch": {("v",): torch.ones(4, dtype=torch.long)}, "version_key": "v", "version": 1}, ValueError,
     "may not appear in patch"),
    ({"patch": {("nested", "version"): torch.ones(4, dtype=torch.long)}, "version_key": ("nested", "version"),
      "version": 1}, ValueError, "may not appear in patch"),
    ({"version_key": "nested.version", "version": 1}, ValueError,
     re.escape(CONDITIONAL_DOTTED_KEY.phrase)),
    ({"patch": [1, 2]}, TypeError, "`patch` must be a dict"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "error", "match"), REFUSALS)
def test_a_refused_update_leaves_the_storage_unchanged(kwargs, error, match):
    rb, index, generation = _filled()
    arguments = {"index": index, "generation": generation, "patch": {"obs": torch.ones(4, 3)}, **kwargs}
    before = _snapshot(rb)
    with pytest.raises(error, match=match):
        rb.update_if_present(**arguments)
    _assert_unchanged(rb, before)


def test_a_dotted_version_key_says_to_pass_a_tuple_which_works():
    rb, index, generation = _filled(2)
    with pytest.raises(ValueError, match=r"Dotted-string.*\('nested', 'version'\)"):
        rb.update_if_present(
            index=index, generation=generation, patch={}, version_key="nested.version", version=1
        )
    result = rb.update_if_present(
        index=index, generation=generation, patch={"obs": torch.ones(2, 3)}, version_key=("nested", "version"),
        version=3,
    )  # fmt: skip
    assert result.updated_count == 2 and rb[:2]["nested", "version"].tolist() == [3, 3]


# -- liveness ----------------------------------------------------------------------------------------------------
def test_overwritten_and_never_written_slots_are_stale():
    rb, index, generation = _filled(4, capacity=6)
    rb.extend(_rows(3, start=100))  # slots 4, 5, 0: slot 0 is overwritten
    index = torch.tensor([0, 1, 2, 3])
    result = rb.update_if_present(index=index, generation=generation, patch={"v": torch.full((4,), 9)})
    assert result.updated.tolist() == [False, True, True, True] and result.stale_count == 1
    assert rb[:4]["v"].tolist() == [0, 9, 9, 9]
    fresh = _buffer(6)
    fresh.extend(_rows(2))
    never = fresh.update_if_present(
        index=torch.tensor([1, 4, 5]),
        generation=torch.tensor([0, -1, 0]),
        patch={"v": torch.ones(3, dtype=torch.long)},
    )
    assert never.updated.tolist() == [True, False, False] and never.stale_count == 2 and len(fresh) == 2


def test_emptied_slots_are_stale():
    rb, index, generation = _filled(3)
    rb.empty()
    result = rb.update_if_present(
        index=index, generation=generation, patch={"v": torch.ones(3, dtype=torch.long)}
    )
    assert result.updated_count == 0 and result.stale_count == 3 and len(rb) == 0


# -- versions ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "version", [torch.tensor(2), torch.tensor([2, 2, 2, 2]), torch.tensor([[2], [2], [2], [2]]), 2]
)
def test_version_may_be_scalar_n_or_n_by_1(version):
    rb, index, generation = _filled()
    result = rb.update_if_present(
        index=index, generation=generation, patch={"obs": torch.ones(4, 3)}, version_key="v", version=version
    )
    assert result.updated_count == 4 and result.version_rejected.tolist() == [False] * 4
    assert rb[:4]["v"].tolist() == [2, 2, 2, 2]


def test_a_stored_n_by_1_version_counts_as_scalar():
    rb, index, generation = _filled(2)
    result = rb.update_if_present(
        index=index, generation=generation, patch={"obs": torch.ones(2, 3)}, version_key="v2",
        version=torch.tensor([1.0, 0.0]),
    )  # fmt: skip
    assert result.updated_count == 2 and rb[:2]["v2"].tolist() == [[1.0], [0.0]]


@pytest.mark.parametrize(
    ("require_newer", "expected"), [(False, [True, True, False]), (True, [True, False, False])]
)
def test_require_newer_rejects_equal_versions(require_newer, expected):
    rb, index, generation = _filled(3)
    rb.update_if_present(
        index=index, generation=generation, patch={}, version_key="v", version=torch.tensor([1, 1, 1])
    )
    result = rb.update_if_present(
        index=index, generation=generation, patch={"obs": torch.full((3, 3), 5.0)}, version_key="v",
        version=torch.tensor([2, 1, 0]), require_newer=require_newer,
    )  # fmt: skip
    assert result.updated.tolist() == expected
    assert result.version_rejected.tolist() == [not e for e in expected]
    assert result.version_rejected_count == expected.count(False) and result.stale_count == 0
    assert (rb[:3]["obs"][:, 0] == 5.0).tolist() == expected


def test_a_slot_addressed_twice_takes_the_highest_version_last_on_ties():
    rb, _, _ = _filled(3)
    index = torch.tensor([0, 0, 1, 1, 2, 2, 0])
    generation = torch.zeros(7, dtype=torch.long)
    patch = {"obs": torch.arange(7.0).repeat_interleave(3).reshape(7, 3)}
    result = rb.update_if_present(
        index=index,
        generation=generation,
        patch=patch,
        version_key="v",
        version=torch.tensor([3, 5, 2, 2, 4, 1, 5]),
    )
    # slot 0: versions 3, 5, 5 -> the last 5 (row 6); slot 1: 2, 2 -> row 3; slot 2: 4, 1 -> row 4
    assert result.updated.tolist() == [False, False, False, True, True, False, True]
    assert result.version_rejected.tolist() == [True, True, True, False, False, True, False]
    assert rb[:3]["obs"][:, 0].tolist() == [6.0, 3.0, 4.0] and rb[:3]["v"].tolist() == [5, 2, 4]
    retry = rb.update_if_present(
        index=torch.tensor([0]), generation=torch.zeros(1, dtype=torch.long), patch={"obs": torch.zeros(1, 3)},
        version_key="v", version=3,
    )  # fmt: skip
    assert retry.version_rejected.tolist() == [True] and rb[0]["obs"].tolist() == [6.0, 6.0, 6.0]


def test_without_versions_the_last_duplicate_applies():
    rb, _, _ = _filled(2)
    result = rb.update_if_present(
        index=torch.tensor([1, 1]), generation=torch.zeros(2, dtype=torch.long),
        patch={"v": torch.tensor([7, 8])},
    )  # fmt: skip
    assert result.updated.tolist() == [True, True] and rb[1]["v"].item() == 8


# -- checkpoints and concurrency ---------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", ["lazy", "memmap"])
def test_update_works_after_load_state_dict_into_a_fresh_buffer(storage, tmp_path):
    def make(path):
        if storage == "lazy":
            return _buffer(4)
        return _buffer(storage=LazyMemmapStorage(4, scratch_dir=path))

    rb = make(tmp_path / "a")
    rb.extend(_rows(6))  # slots 0, 1 written twice
    generation = rb.writer.generations_of(torch.arange(4))
    fresh = make(tmp_path / "b")
    fresh.load_state_dict(rb.state_dict())
    assert fresh.writer.generations_of(torch.arange(4)).tolist() == generation.tolist() == [1, 1, 0, 0]
    result = fresh.update_if_present(
        index=torch.arange(4), generation=torch.tensor([1, 0, 0, 0]), patch={"v": torch.full((4,), 3)}
    )
    assert result.updated.tolist() == [True, False, True, True] and fresh[:]["v"].tolist() == [3, 0, 3, 3]


def test_a_concurrent_extend_never_tears_records():
    rb = _buffer(32)
    rb.extend(_rows(32))
    stop = threading.Event()
    errors = []

    def writer():
        start = 1000
        try:
            while not stop.is_set():
                rb.extend(_rows(8, start))  # every entry of a row holds the row's id
                start += 8
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            index = torch.randint(0, 32, (8,)).unique()
            generation = rb.writer.generations_of(index)
            current = rb.storage.get(index)["nested", "x"]
            patch = {"obs": current.unsqueeze(-1).expand(-1, 3).clone(), "v": current.long()}
            rb.update_if_present(index=index, generation=generation, patch=patch)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive() and not errors
    data = rb[:]
    ids = data["nested", "x"]
    assert (data["obs"] == ids.unsqueeze(-1)).all()  # a patch never lands on a row another write replaced
    assert ((data["v"] == 0) | (data["v"] == ids.long())).all()


# -- unsupported storages and writers ----------------------------------------------------------------------------
def _request(n: int = 2):
    return {
        "index": torch.arange(n),
        "generation": torch.zeros(n, dtype=torch.long),
        "patch": {"v": torch.ones(n)},
    }


def test_a_list_storage_is_refused_with_conditional_in_the_message():
    rb = TensorDictReplayBuffer(
        storage=ListStorage(4), writer=TensorDictRoundRobinWriter(track_generations=True)
    )
    rb.extend(_rows(2))
    before = [td.clone() for td in rb.storage[:]]
    with pytest.raises(RuntimeError, match="(?i)conditional") as info:
        rb.update_if_present(**_request())
    assert "ListStorage" in str(info.value) and "LazyTensorStorage" in str(info.value)
    assert all((a == b).all() for a, b in zip(rb.storage[:], before))


@pytest.mark.parametrize("writer", [TensorDictRoundRobinWriter, RoundRobinWriter])
def test_a_writer_without_generations_is_refused_with_conditional_in_the_message(writer):
    rb = ReplayBuffer(storage=LazyTensorStorage(4), writer=writer())
    rb.extend(_rows(2))
    before = rb[:].clone()
    with pytest.raises(RuntimeError, match="(?i)conditional.*track_generations=True"):
        rb.update_if_present(**_request())
    assert (rb[:] == before).all()


def test_a_storage_of_plain_tensors_is_refused():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter(track_generations=True))
    rb.extend(torch.arange(3))
    with pytest.raises(RuntimeError, match="(?i)conditional.*TensorDicts"):
        rb.update_if_present(**_request())
    assert rb[:].tolist() == [0, 1, 2]
