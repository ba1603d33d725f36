"""BaseDatasetExperienceReplay: read-only by default, preprocess into a new memory-mapped storage, delete."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers.extras import needs
from tensordict import TensorDict

from torchrl.data import (
    ImmutableDatasetWriter,
    ListStorage,
    ReplayBuffer,
    RoundRobinWriter,
    TensorStorage,
)
from torchrl.data.datasets import BaseDatasetExperienceReplay

ROWS = 150


class Counting(BaseDatasetExperienceReplay):
    """A minimal dataset: rows 0..ROWS-1 converted once under root/counting."""

    def __init__(self, root, batch_size=4, **kwargs):
        self.root = root
        if not self._is_downloaded():
            data = TensorDict(
                obs=torch.arange(ROWS, dtype=torch.float32).unsqueeze(-1).expand(ROWS, 3).clone(),
                episode=torch.arange(ROWS) // 10,
                batch_size=[ROWS],
            )
            data.memmap_(self.data_path)
        super().__init__(
            storage=TensorStorage(TensorDict.load_memmap(self.data_path)), batch_size=batch_size, **kwargs
        )

    @property
    def data_path_root(self) -> Path:
        return self.root / "counting"

    @property
    def data_path(self) -> Path:
        return self.data_path_root

    def _is_downloaded(self) -> bool:
        return self.data_path_root.exists()


def add_features(td):
    """Per-sample preprocessing: works on one row and on a chunk of rows."""
    td = td.clone(False)
    td.set("obs_sq", td["obs"] ** 2)
    td.set(("stats", "sum"), td["obs"].sum(-1))
    return td


def not_a_tensordict(td):
    return td["obs"]


def test_read_only_by_default(tmp_path):
    ds = Counting(tmp_path)
    assert isinstance(ds.writer, ImmutableDatasetWriter)
    row = ds.storage[:2].clone()
    for write in (lambda: ds.extend(row), lambda: ds.add(row[0]), lambda: ds.empty()):
        with pytest.raises(RuntimeError, match="This dataset doesn't allow writing."):
            write()
    assert len(ds) == ROWS
    assert ds.sample()["index"].shape == torch.Size([4])  # a TensorDictReplayBuffer: samples carry "index"


def test_writer_can_be_replaced(tmp_path):
    ds = Counting(tmp_path, writer=RoundRobinWriter())
    ds.extend(ds.storage[:2].clone())
    assert isinstance(ds.writer, RoundRobinWriter)


def test_root_property(tmp_path):
    ds = Counting(str(tmp_path))
    assert ds.root == tmp_path and isinstance(ds.root, Path)
    with pytest.raises(TypeError, match="`root`"):
        ds.root = 3


def test_abstract_paths_raise():
    ds = BaseDatasetExperienceReplay(storage=TensorStorage(TensorDict(x=torch.zeros(3), batch_size=[3])))
    assert ds.root is None
    for name in ("data_path", "data_path_root"):
        with pytest.raises(NotImplementedError, match=name):
            getattr(ds, name)
    with pytest.raises(NotImplementedError, match="_is_downloaded"):
        ds._is_downloaded()


def test_preprocess_in_process_num_frames(tmp_path):
    ds = Counting(tmp_path / "root")
    storage = ds.preprocess(add_features, num_workers=0, num_frames=100, dest=tmp_path / "out", chunksize=30)
    assert isinstance(storage, TensorStorage) and len(storage) == 100
    out = storage[:]
    assert {"obs", "obs_sq", "episode", ("stats", "sum")} <= set(out.keys(True, True))
    assert torch.equal(out["obs_sq"], torch.arange(100.0).unsqueeze(-1).expand(100, 3) ** 2)
    assert torch.equal(out["stats", "sum"], torch.arange(100.0) * 3)
    assert (tmp_path / "out" / "obs_sq.memmap").exists()  # memory-mapped at dest
    assert len(ds) == ROWS and "obs_sq" not in ds.storage[:].keys()  # the dataset is unchanged
    rb = ReplayBuffer(storage=storage, batch_size=8)
    assert rb.sample()["obs_sq"].shape == torch.Size([8, 3])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_preprocess_in_worker_processes(tmp_path):
    ds = Counting(tmp_path / "root")
    storage = ds.preprocess(
        add_features, num_workers=2, num_chunks=4, dest=tmp_path / "out", generator=torch.Generator(),
        mp_start_method="fork",
    )  # fmt: skip
    assert len(storage) == ROWS
    assert torch.equal(storage[:]["stats", "sum"], torch.arange(float(ROWS)) * 3)


@needs("tqdm")
def test_preprocess_progress_bar(tmp_path, capsys):
    ds = Counting(tmp_path / "root")
    ds.preprocess(add_features, num_workers=0, chunksize=50, pbar=True, dest=tmp_path / "out")
    assert "preprocess" in capsys.readouterr().err


def test_preprocess_refusals(tmp_path):
    ds = Counting(tmp_path / "root")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "file").write_text("x")
    with pytest.raises(FileExistsError, match="`dest`"):
        ds.preprocess(add_features, num_workers=0, dest=busy)
    with pytest.raises(TypeError, match="`dest`"):
        ds.preprocess(add_features, num_workers=0, dest=None)
    with pytest.raises(TypeError, match="must return a TensorDict"):
        ds.preprocess(not_a_tensordict, num_workers=0, dest=tmp_path / "a")
    with pytest.raises(ValueError, match="`num_frames`"):
        ds.preprocess(add_features, num_workers=0, num_frames=0, dest=tmp_path / "b")
    with pytest.raises(ValueError, match="`num_workers`"):
        ds.preprocess(add_features, num_workers=-1, dest=tmp_path / "c")
    with pytest.raises(TypeError, match="`fn`"):
        ds.preprocess("double", num_workers=0, dest=tmp_path / "d")
    with pytest.raises(TypeError, match="dest"):
        ds.preprocess(add_features, num_workers=0)  # dest is required
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_preprocess_needs_a_tensor_storage():
    ds = BaseDatasetExperienceReplay(storage=ListStorage(10), writer=RoundRobinWriter())
    ds.extend(TensorDict(obs=torch.zeros(3, 2), batch_size=[3]))
    with pytest.raises(RuntimeError, match="TensorStorage"):
        ds.preprocess(add_features, num_workers=0, dest="unused")


def test_delete_removes_data_path(tmp_path):
    ds = Counting(tmp_path)
    assert ds.data_path.exists()
    ds.delete()
    assert not ds.data_path.exists() and tmp_path.exists()
    ds.delete()  # already gone: nothing to do
    assert Counting(tmp_path).storage[:]["obs"][5, 0] == 5  # converted again


def test_delete_refuses_a_symlink(tmp_path):
    ds = Counting(tmp_path / "real")
    link_root = tmp_path / "linked"
    link_root.mkdir()
    os.symlink(ds.data_path, link_root / "counting")
    linked = Counting(link_root)
    with pytest.raises(RuntimeError, match="symbolic link"):
        linked.delete()
    assert ds.data_path.exists()
