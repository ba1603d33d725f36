"""Issue 29: a refused Hugging Face import changes nothing, and edited metadata cannot change values silently.

``rb.extend_from_hf`` and ``ReplayBuffer.from_hf`` decode every chunk before the first is written: a null, a
non-numeric value or a row of another shape anywhere in the dataset refuses the import with the column and the
rows, and the buffer keeps exactly what it held. An export's column whose Arrow dtype differs from the dtype its
metadata says (edited in both copies) is refused instead of cast.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers.extras import require
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
)

datasets = require("datasets")
pytestmark = pytest.mark.extras


def _buffer(storage) -> ReplayBuffer:
    return make_buffer(storage=storage, data=TensorDict(obs=torch.arange(15.0).reshape(5, 3), batch_size=[5]))


def _snapshot(rb: ReplayBuffer):
    return len(rb), rb.write_count, rb[:].clone() if len(rb) else None


GOOD = [[0.0, 1.0, 2.0]]


@pytest.mark.parametrize(
    "bad, why",
    [
        (None, "missing values"),  # a null row
        ([1.0, 2.0], "different shapes"),  # a ragged row
        ([1.0, None, 2.0], "missing values"),  # a null inside a row
    ],
    ids=["null-row", "ragged-row", "null-value"],
)
@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_a_bad_row_in_a_later_chunk_refuses_the_whole_import(bad, why, storage, tmp_path):
    ds = datasets.Dataset.from_dict({"obs": GOOD * 200 + [bad] + GOOD * 10})
    kwargs = {"scratch_dir": tmp_path / "s"} if storage is LazyMemmapStorage else {}
    rb = _buffer(storage(1000, **kwargs))
    before = _snapshot(rb)
    with pytest.raises(ValueError, match=why) as err:
        rb.extend_from_hf(ds, chunk_bytes=24 * 10)  # 10 rows a chunk: the bad row is in the 21st
    assert "'obs'" in str(err.value) and "200" in str(err.value) and "nothing was written" in str(err.value)
    after = _snapshot(rb)
    assert after[:2] == before[:2] == (5, 5)
    assert (after[2] == before[2]).all()


def test_a_refused_from_hf_builds_no_buffer():
    ds = datasets.Dataset.from_dict({"obs": [1.0] * 100 + [None]})
    with pytest.raises(ValueError, match=r"'obs'.*missing values.*rows 100\.\.100"):
        TensorDictReplayBuffer.from_hf(ds, chunk_bytes=80)


def test_ragged_rows_still_import_into_a_list_storage():
    ds = datasets.Dataset.from_dict({"obs": GOOD * 20 + [[1.0, 2.0]]})
    rb = ReplayBuffer(storage=ListStorage(100))
    assert rb.extend_from_hf(ds, chunk_bytes=24 * 10) == 21
    assert len(rb) == 21 and rb[20]["obs"].tolist() == [1.0, 2.0]


def test_a_valid_import_is_unchanged_by_the_check():
    ds = datasets.Dataset.from_dict({"obs": [[float(i)] * 3 for i in range(50)], "act": list(range(50))})
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    assert rb.extend_from_hf(ds, chunk_bytes=64) == 50
    assert rb[:]["obs"][:, 0].tolist() == [float(i) for i in range(50)] and rb[:]["act"].dtype == torch.int64


def _edit_dtype(path, column: str, dtype: str) -> None:
    """Edits the dtype of ``column`` in both copies of an export's metadata (the file and the dataset info)."""
    meta_file = path / "torchrl_export.json"
    meta = json.loads(meta_file.read_text())
    for spec in meta["columns"]:
        if spec["column"] == column:
            spec["dtype"] = dtype
    meta_file.write_text(json.dumps(meta))
    info_file = path / "dataset_info.json"
    info = json.loads(info_file.read_text())
    marker = "torchrl.hf_export "
    assert info["description"].startswith(marker)
    embedded = json.loads(info["description"][len(marker) :])
    embedded["columns"] = meta["columns"]
    info["description"] = marker + json.dumps(embedded)
    info_file.write_text(json.dumps(info))


def test_a_dtype_edited_in_both_metadata_copies_is_refused_not_cast(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TensorDict(obs=torch.full((8, 2), 0.75), batch_size=[8]))
    path = tmp_path / "export"
    rb.export_hf(path)
    _edit_dtype(path, "obs", "int64")
    target = ReplayBuffer(storage=LazyTensorStorage(8))
    with pytest.raises(
        ValueError, match=r"'obs' holds float32 values, but the export's metadata says.*int64"
    ):
        target.extend_from_hf(path)
    assert len(target) == 0
    # without the metadata the column's own dtype is read: the values are intact
    plain = ReplayBuffer(storage=LazyTensorStorage(8))
    plain.extend_from_hf(path, ignore_metadata=True)
    assert plain[:]["obs"].dtype == torch.float32 and (plain[:]["obs"] == 0.75).all()
