"""Export to and import from Hugging Face datasets: round trips, layouts, plain readers, bad input."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from helpers.extras import require
from tensordict import NonTensorData, TensorDict

require("datasets")
import datasets  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from torchrl.data import (  # noqa: E402
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    SliceSampler,
)
from torchrl.data.replay_buffers.hf.columns import MARKER, METADATA_FILE  # noqa: E402
from torchrl.data.replay_buffers.hf.export import import_hf  # noqa: E402
from torchrl.data.replay_buffers.hf.importer import HFReader, chunk_rows_for  # noqa: E402

pytestmark = pytest.mark.extras

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
          torch.float64]  # fmt: skip
HYPOTHESIS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def random_tensor(shape, dtype, generator):
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, shape, generator=generator, dtype=dtype)


def assert_bit_equal(a: TensorDict, b: TensorDict) -> None:
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    assert a.batch_size == b.batch_size
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), key


@st.composite
def leaf_specs(draw):
    """A nested layout: {key tuple: (dtype, item shape)}."""
    names = st.sampled_from(["obs", "action", "reward", "done", "pixels", "h"])
    n_leaves = draw(st.integers(1, 4))
    leaves = {}
    for _ in range(n_leaves):
        key = tuple(draw(st.lists(names, min_size=1, max_size=3)))
        if any(key[:i] in leaves for i in range(1, len(key) + 1)) or any(k[: len(key)] == key for k in leaves):
            continue
        shape = tuple(draw(st.lists(st.integers(1, 3), max_size=6)))
        if draw(st.booleans()) and shape:  # sometimes a zero-sized dim
            shape = (0,) + shape[1:]
        leaves[key] = (draw(st.sampled_from(DTYPES)), shape)
    return leaves


def make_td(leaves, n, seed):
    generator = torch.Generator().manual_seed(seed)
    td = TensorDict({}, batch_size=[n])
    for key, (dtype, shape) in leaves.items():
        td.set(key, random_tensor((n, *shape), dtype, generator))
    return td


@HYPOTHESIS
@given(leaves=leaf_specs(), n=st.integers(1, 6), seed=st.integers(0, 2**16),
       memmap=st.booleans(), chunk=st.sampled_from([1, 64, 64 << 20]))  # fmt: skip
def test_round_trip_of_random_nested_tensordicts_is_bit_exact(tmp_path_factory, leaves, n, seed, memmap, chunk):
    data = make_td(leaves, n, seed)
    rb = ReplayBuffer(storage=LazyTensorStorage(n))
    rb.extend(data)
    path = tmp_path_factory.mktemp("rt") / "export"
    ds = rb.export_hf(path, chunk_bytes=chunk, fsync=False)
    assert ds.num_rows == n
    storage = LazyMemmapStorage(n, scratch_dir=tmp_path_factory.mktemp("mm")) if memmap else LazyTensorStorage(n)
    copy = ReplayBuffer.from_hf(path, storage=storage, chunk_bytes=chunk)
    assert_bit_equal(copy[:], data)


@HYPOTHESIS
@given(n=st.integers(1, 6), seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES),
       ndim=st.integers(1, 3))  # fmt: skip
def test_round_trip_of_ragged_items_in_a_list_storage(tmp_path_factory, n, seed, dtype, ndim):
    generator = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        shape = tuple(int(d) for d in torch.randint(0, 4, (ndim,), generator=generator))
        items.append(TensorDict(obs=random_tensor(shape, dtype, generator), step=torch.tensor(i),
                                nested=TensorDict(flag=torch.tensor([i % 2 == 0]))))  # fmt: skip
    rb = ReplayBuffer(storage=ListStorage(n))
    for item in items:
        rb.add(item)
    path = tmp_path_factory.mktemp("ragged") / "export"
    rb.export_hf(path, fsync=False)
    copy = ReplayBuffer.from_hf(path)
    assert isinstance(copy.storage, ListStorage) and len(copy) == n
    for got, expected in zip(copy.storage, items):
        assert_bit_equal(got, expected)


def test_plain_tensor_items_round_trip(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(torch.arange(12, dtype=torch.int16))
    rb.export_hf(tmp_path / "export")
    copy = ReplayBuffer.from_hf(tmp_path / "export")
    assert torch.equal(copy[:], rb[:]) and copy[:].dtype == torch.int16


def test_export_is_readable_by_plain_load_from_disk(tmp_path):
    data = TensorDict(obs=torch.randn(6, 2, 3), flag=torch.rand(6) > 0.5, count=torch.arange(6, dtype=torch.uint8),
                      half=torch.randn(6, 4).half(), next=TensorDict(reward=torch.randn(6, 1), batch_size=[6]),
                      batch_size=[6])  # fmt: skip
    rb = ReplayBuffer(storage=LazyTensorStorage(6))
    rb.extend(data)
    rb.export_hf(tmp_path / "export")
    ds = datasets.load_from_disk(str(tmp_path / "export"))
    assert ds.features == datasets.Features({
        "obs": datasets.Array2D(shape=(2, 3), dtype="float32"),
        "flag": datasets.Value("bool"),
        "count": datasets.Value("uint8"),
        "half": datasets.Sequence(datasets.Value("float16"), length=4),
        "next.reward": datasets.Sequence(datasets.Value("float32"), length=1),
    })
    table = ds.data.table
    assert str(table.schema.field("half").type) == "fixed_size_list<item: halffloat>[4]"
    torch_ds = ds.with_format("torch")[:]
    assert torch.equal(torch_ds["obs"], data["obs"])
    assert torch.equal(torch_ds["flag"], data["flag"]) and torch.equal(torch_ds["count"], data["count"])
    assert torch.equal(torch.tensor(ds[:]["next.reward"]), data["next", "reward"])
    meta = json.loads((tmp_path / "export" / METADATA_FILE).read_text())
    assert meta["schema_version"] == 1 and meta["layout"] == "flat"
    assert {s["column"]: s["key"] for s in meta["columns"]}["next.reward"] == ["next", "reward"]


def test_bfloat16_is_refused_with_a_clear_error_and_nothing_is_written(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(TensorDict(x=torch.zeros(4, dtype=torch.bfloat16), y=torch.ones(4), batch_size=[4]))
    with pytest.raises(TypeError, match="'x' holds torch.bfloat16.*float32.*exclude_keys"):
        rb.export_hf(tmp_path / "export")
    assert not os.listdir(tmp_path)
    assert rb.export_hf(tmp_path / "export", exclude_keys=["x"]).column_names == ["y"]
    with pytest.raises(ValueError, match="no tensor entry"):
        rb.export_hf(tmp_path / "other", exclude_keys=["x", "y"])


def test_export_from_a_memmap_storage_in_small_chunks(tmp_path):
    data = TensorDict(pixels=torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8), batch_size=[40])
    rb = ReplayBuffer(storage=LazyMemmapStorage(40, scratch_dir=tmp_path / "scratch"))
    rb.extend(data)
    ds = rb.export_hf(tmp_path / "export", chunk_bytes=1000)
    assert ds.features["pixels"] == datasets.Array3D(shape=(3, 8, 8), dtype="uint8")
    assert_bit_equal(ReplayBuffer.from_hf(tmp_path / "export", chunk_bytes=1000)[:], data)


def test_exclude_keys_leaves_out_non_tensor_entries(tmp_path):
    data = TensorDict(x=torch.arange(3), batch_size=[3])
    data["name"] = NonTensorData("cartpole", batch_size=[3])
    rb = ReplayBuffer(storage=ListStorage(3))
    for item in data.unbind(0):
        rb.add(item)
    with pytest.raises(TypeError, match="holds NonTensorData data.*exclude_keys"):
        rb.export_hf(tmp_path / "a")
    ds = rb.export_hf(tmp_path / "b", exclude_keys=["name"])
    assert ds.column_names == ["x"]


def ted(n: int, done_at) -> TensorDict:
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[list(done_at)] = True
    return TensorDict(
        observation=torch.arange(n, dtype=torch.float32).unsqueeze(-1).expand(n, 3).clone(),
        action=torch.randn(n, 2),
        next=TensorDict(observation=torch.randn(n, 3), reward=torch.randn(n, 1), done=done, batch_size=[n]),
        batch_size=[n],
    )


def reference_episodes(done):
    episode, frame, ep, fr = [], [], 0, 0
    for d in done:
        episode.append(ep)
        frame.append(fr)
        fr += 1
        if d:
            ep, fr = ep + 1, 0
    return episode, frame


@pytest.mark.parametrize("chunk_bytes", [1, 40, 64 << 20])
def test_trajectories_layout_starts_at_the_oldest_row_and_numbers_episodes(tmp_path, chunk_bytes):
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(ted(14, done_at=[2, 6, 9]))  # wraps: the storage holds rows 4..13, oldest at position 4
    ds = rb.export_hf(tmp_path / "export", layout="trajectories", chunk_bytes=chunk_bytes).with_format("torch")[:]
    assert ds["observation"][:, 0].tolist() == list(range(4, 14))
    episode, frame = reference_episodes([r in (6, 9) for r in range(4, 14)])
    assert ds["episode_index"].tolist() == episode and ds["frame_index"].tolist() == frame
    copy = ReplayBuffer.from_hf(tmp_path / "export")
    assert set(copy[:].keys(True, True)) == set(rb[:].keys(True, True))  # derived columns are skipped
    indexed = ReplayBuffer.from_hf(tmp_path / "export", columns={"episode_index": "episode", "observation": "obs"})
    assert indexed[:]["episode"].tolist() == episode


def test_trajectory_ids_split_episodes_and_feed_a_slice_sampler(tmp_path):
    data = TensorDict(obs=torch.arange(9.0), episode=torch.tensor([0, 0, 0, 5, 5, 1, 1, 1, 1]), batch_size=[9])
    rb = ReplayBuffer(storage=LazyTensorStorage(9))
    rb.extend(data)
    ds = rb.export_hf(tmp_path / "export", layout="trajectories")[:]
    assert ds["episode_index"] == [0, 0, 0, 1, 1, 2, 2, 2, 2] and ds["frame_index"][3:5] == [0, 1]
    copy = ReplayBuffer.from_hf(tmp_path / "export", sampler=SliceSampler(slice_len=2, traj_key="episode"),
                                batch_size=4)  # fmt: skip
    batch = copy.sample()
    assert (batch["episode"][0::2] == batch["episode"][1::2]).all()


def test_trajectory_layouts_need_trajectory_metadata(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(TensorDict(obs=torch.zeros(4), batch_size=[4]))
    with pytest.raises(ValueError, match="needs trajectory metadata.*end_key"):
        rb.export_hf(tmp_path / "export", layout="trajectories")
    with pytest.raises(KeyError, match="`end_key`=\\('missing',\\) is not a key"):
        rb.export_hf(tmp_path / "export", layout="lerobot", end_key="missing")
    ds = rb.export_hf(tmp_path / "export", layout="trajectories", end_key="obs")[:]
    assert ds["episode_index"] == [0, 0, 0, 0]  # the end flag is all zeros: one episode
    assert not (tmp_path / "export" / "meta").exists()


def test_lerobot_layout_names_columns_and_writes_the_episode_table(tmp_path):
    data = ted(7, done_at=[2, 6])
    rb = ReplayBuffer(storage=LazyTensorStorage(7))
    rb.extend(data)
    with pytest.warns(UserWarning, match="drops the keys \\[\\('next', 'observation'\\)\\]"):
        ds = rb.export_hf(tmp_path / "export", layout="lerobot", fps=10)
    features, ds = ds.features, ds[:]
    assert set(ds) == {"observation.state", "action", "next.reward", "next.done", "episode_index",
                                    "frame_index", "timestamp", "index", "task_index"}  # fmt: skip
    assert features["next.done"] == datasets.Value("bool") and features["next.reward"] == datasets.Value("float32")
    assert ds["episode_index"] == [0, 0, 0, 1, 1, 1, 1] and ds["index"] == list(range(7))
    assert ds["timestamp"][:4] == pytest.approx([0.0, 0.1, 0.2, 0.0])
    episodes = [json.loads(line) for line in (tmp_path / "export" / "meta" / "episodes.jsonl").read_text().splitlines()]
    assert [(e["episode_index"], e["length"]) for e in episodes] == [(0, 3), (1, 4)]
    info = json.loads((tmp_path / "export" / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 2 and info["fps"] == 10 and info["total_frames"] == 7
    copy = ReplayBuffer.from_hf(tmp_path / "export")[:]
    expected = data.exclude(("next", "observation"))
    assert_bit_equal(copy, expected)  # every other key, with its dtype and shape ([1] flags come back)
    meta = json.loads((tmp_path / "export" / METADATA_FILE).read_text())
    assert meta["dropped_keys"] == [["next", "observation"]]


def test_foreign_dataset_columns_become_keys(tmp_path):
    ds = datasets.Dataset.from_dict({
        "observation.state": [[float(i), 2.0 * i] for i in range(5)],
        "action": [float(i) for i in range(5)],
        "next.done": [i == 4 for i in range(5)],
        "image": [[[i, i], [i, i]] for i in range(5)],
        "caption": [str(i) for i in range(5)],
    })
    with pytest.raises(TypeError, match="'caption' holds string values"):
        ReplayBuffer.from_hf(ds)
    rb = ReplayBuffer.from_hf(ds, columns=["observation.state", "action", "next.done", "image"])
    td = rb[:]
    assert td["observation", "state"].shape == (5, 2) and td["observation", "state"].dtype == torch.float64
    assert td["action"].dtype == torch.float64 and td["next", "done"].dtype == torch.bool
    assert td["image"].shape == (5, 2, 2) and td["image"].dtype == torch.int64
    renamed = ReplayBuffer.from_hf(ds, columns={"observation.state": "observation", "action": ("act", "x")})[:]
    assert set(renamed.keys(True, True)) == {"observation", ("act", "x")}
    ds.save_to_disk(str(tmp_path / "plain"))
    from_path = ReplayBuffer.from_hf(tmp_path / "plain", columns=["action"])
    assert torch.equal(from_path[:]["action"], td["action"])


def test_unknown_columns_and_conflicting_keys_are_refused():
    ds = datasets.Dataset.from_dict({"a": [1, 2], "a.b": [3, 4]})
    with pytest.raises(ValueError, match="Unknown columns \\['nope'\\].*\\['a', 'a.b'\\]"):
        ReplayBuffer.from_hf(ds, columns=["nope"])
    with pytest.raises(ValueError, match="both a tensor and the parent"):
        ReplayBuffer.from_hf(ds)
    with pytest.raises(TypeError, match="`columns` must be None"):
        ReplayBuffer.from_hf(ds, columns="a")
    with pytest.raises(ValueError, match="missing values"):
        ReplayBuffer.from_hf(datasets.Dataset.from_dict({"x": [1.0, None]}))


def test_ragged_foreign_column_needs_a_list_storage():
    ds = datasets.Dataset.from_dict({"x": [[1, 2], [3], [4, 5, 6]]})
    with pytest.raises(ValueError, match=r"Column .x. holds rows of different shapes.*Import into a ListStorage"):
        ReplayBuffer.from_hf(ds, storage=LazyTensorStorage(3))
    rb = ReplayBuffer.from_hf(ds, storage=ListStorage(3))
    assert [item["x"].tolist() for item in rb.storage] == [[1, 2], [3], [4, 5, 6]]


def exported(tmp_path, n=6):
    rb = ReplayBuffer(storage=LazyTensorStorage(n))
    rb.extend(TensorDict(obs=torch.randn(n, 3), batch_size=[n]))
    rb.export_hf(tmp_path / "export")
    return rb, tmp_path / "export"


def test_missing_metadata_file_is_a_clear_error(tmp_path):
    rb, path = exported(tmp_path)
    os.unlink(path / METADATA_FILE)
    with pytest.raises(FileNotFoundError, match="metadata file torchrl_export.json is missing"):
        ReplayBuffer.from_hf(path)
    plain = ReplayBuffer.from_hf(path, ignore_metadata=True)
    assert torch.equal(plain[:]["obs"], rb[:]["obs"])


def test_mismatched_metadata_and_shapes_are_clear_errors(tmp_path):
    _, path = exported(tmp_path)
    meta = json.loads((path / METADATA_FILE).read_text())
    meta["columns"][0]["shape"] = [4]
    (path / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not describe the columns"):
        ReplayBuffer.from_hf(path)
    ds = datasets.load_from_disk(str(path))
    ds.info.description = MARKER + json.dumps(meta)  # a Dataset object whose metadata lies about the shape
    with pytest.raises(ValueError, match="rows of shape \\[3\\].*items have shape \\[4\\]"):
        ReplayBuffer.from_hf(ds)
    meta = json.loads((path / METADATA_FILE).read_text())
    meta["columns"][0]["shape"] = [3]
    meta["num_rows"] = 99
    (path / METADATA_FILE).write_text(json.dumps(meta))
    info = json.loads((path / "dataset_info.json").read_text())
    info["description"] = MARKER + json.dumps(meta)
    (path / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match="says 99 rows, the dataset has 6"):
        ReplayBuffer.from_hf(path)
    subset = datasets.load_from_disk(str(path)).select([1, 3])  # a selection of an export's rows: fine
    assert ReplayBuffer.from_hf(subset)[:]["obs"].shape == (2, 3)


def test_bad_sources_and_storages_are_refused(tmp_path):
    _, path = exported(tmp_path)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        ReplayBuffer.from_hf(tmp_path / "nothing")
    with pytest.raises(TypeError, match="DatasetDict with splits \\['train'\\]"):
        ReplayBuffer.from_hf(datasets.DatasetDict(train=datasets.load_from_disk(str(path))))
    with pytest.raises(TypeError, match="must be a path or a datasets.Dataset"):
        ReplayBuffer.from_hf([1, 2, 3])
    with pytest.raises(ValueError, match="holds 4 items and the dataset has 6 rows"):
        ReplayBuffer.from_hf(path, storage=LazyTensorStorage(4))
    small = ReplayBuffer(storage=LazyTensorStorage(4))
    assert small.extend_from_hf(path) == 6 and len(small) == 4


def test_bad_export_arguments_are_refused(tmp_path):
    rb, _ = exported(tmp_path)
    for kwargs, match in [({"layout": "parquet"}, "`layout` must be one of"), ({"chunk_bytes": 0}, "`chunk_bytes`"),
                          ({"fps": -1}, "`fps`"), ({"shard_bytes": 1.5}, "`shard_bytes`")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            rb.export_hf(tmp_path / "other", **kwargs)
    with pytest.raises(ValueError, match="holds no items"):
        ReplayBuffer(storage=LazyTensorStorage(3)).export_hf(tmp_path / "other")
    with pytest.raises(TypeError, match="must be a ReplayBuffer or a Storage"):
        from torchrl.data.replay_buffers.hf.export import export_hf

        export_hf([1, 2], tmp_path / "other")
    dotted = ReplayBuffer(storage=LazyTensorStorage(2))
    dotted.extend(TensorDict({"a.b": torch.zeros(2)}, batch_size=[2]))
    with pytest.raises(ValueError, match="contains a '.'"):
        dotted.export_hf(tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_export_never_replaces_a_foreign_directory_or_a_file(tmp_path):
    rb, _ = exported(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not an export of this library"):
        rb.export_hf(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        rb.export_hf(tmp_path / "file")
    assert rb.export_hf(tmp_path / "new" / "parents" / "dir").num_rows == 6  # missing parents are created


def test_a_failing_export_leaves_the_previous_one_and_no_temporary_directory(tmp_path):
    from torch.utils.data import Dataset

    from torchrl.data import DatasetStorage

    class Failing(Dataset):
        fail = False

        def __len__(self):
            return 200

        def __getitem__(self, i):
            if self.fail and i >= 150:
                raise OSError("disk went away")
            return {"x": torch.full((4,), float(i))}

    dataset = Failing()
    rb = ReplayBuffer(storage=DatasetStorage(dataset))
    rb.export_hf(tmp_path / "export", chunk_bytes=160)
    before = sorted(os.listdir(tmp_path / "export"))
    dataset.fail = True
    with pytest.raises(OSError, match="disk went away"):
        rb.export_hf(tmp_path / "export", chunk_bytes=160)
    assert os.listdir(tmp_path) == ["export"] and sorted(os.listdir(tmp_path / "export")) == before
    copy = ReplayBuffer.from_hf(tmp_path / "export")
    assert torch.equal(copy[:]["x"][:, 0], torch.arange(200.0))


def test_an_export_replaces_an_earlier_one_and_shards_large_data(tmp_path):
    rb, path = exported(tmp_path, n=6)
    bigger = ReplayBuffer(storage=LazyTensorStorage(50))
    bigger.extend(TensorDict(obs=torch.randn(50, 3), batch_size=[50]))
    ds = bigger.export_hf(path, shard_bytes=200, chunk_bytes=100)
    shards = sorted(p for p in os.listdir(path) if p.endswith(".arrow"))
    assert len(shards) == 50 * 12 // 200 + 1 and ds.num_rows == 50
    assert shards[0] == f"data-00000-of-{len(shards):05d}.arrow"
    assert torch.equal(ReplayBuffer.from_hf(path)[:]["obs"], bigger[:]["obs"])


def test_export_without_a_path_and_import_from_the_dataset_object():
    rb = ReplayBuffer(storage=LazyTensorStorage(5))
    rb.extend(TensorDict(obs=torch.randn(5, 2, 2, 2), batch_size=[5]))
    ds = rb.export_hf()
    assert os.path.isfile(os.path.join(os.path.dirname(ds.cache_files[0]["filename"]), METADATA_FILE))
    chunks = list(import_hf(ds, chunk_bytes=1))
    assert [c.batch_size[0] for c in chunks] == [1] * 5
    assert len(list(import_hf(ds))) == 1
    assert torch.equal(torch.cat([c["obs"] for c in chunks]), rb[:]["obs"])


def test_two_dim_storage_exports_its_cells_row_by_row(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(8, ndim=2))
    rb.extend(TensorDict(obs=torch.arange(8.0).reshape(2, 4), batch_size=[2, 4]))
    ds = rb.export_hf(tmp_path / "export")
    assert ds.num_rows == 8
    assert torch.equal(ReplayBuffer.from_hf(tmp_path / "export")[:]["obs"], rb.storage.flatten().get(
        torch.arange(8))["obs"])  # fmt: skip
    with pytest.raises(ValueError, match="ndim=2"):
        rb.export_hf(tmp_path / "traj", layout="trajectories")


def test_item_batch_dims_survive_the_round_trip(tmp_path):
    items = [TensorDict(obs=torch.randn(3, 2), sub=TensorDict(x=torch.randn(3), batch_size=[3]), batch_size=[3])
             for _ in range(4)]  # fmt: skip
    rb = ReplayBuffer(storage=ListStorage(4))
    rb.extend(items)
    rb.export_hf(tmp_path / "export")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copy = ReplayBuffer.from_hf(tmp_path / "export")
    for got, expected in zip(copy.storage, items):
        assert got.batch_size == (3,) and got["sub"].batch_size == (3,)
        assert_bit_equal(got, expected)


@pytest.mark.timeout(300)
def test_behavior_cloning_example_exports_and_trains_from_hf(tmp_path):
    require("gymnasium")
    require("tqdm")
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "examples" / "replay-buffers" / "dataloader_behavior_cloning.py"
    spec = importlib.util.spec_from_file_location("_bc_example_hf", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    demos = tmp_path / "demos"
    common = ["--smoke", "--num-workers", "0", "--updates", "2"]
    assert module.main([*common, "--export-hf", str(demos), "--out", str(tmp_path / "a")]) == 0
    exported = ReplayBuffer.from_hf(demos)[:]
    assert {"observation", "action"} <= set(exported.keys()) and exported["observation"].shape[1:] == (4,)
    assert module.main([*common, "--from-hf", str(demos), "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b").is_dir()


CRASHING_EXPORT = """
import os, sys, torch
from tensordict import TensorDict
import torchrl.data.replay_buffers._checkpoint.fs as fs
from torchrl.data import LazyTensorStorage, ReplayBuffer

def crash(step):
    if step == sys.argv[2]:
        os._exit(17)

fs.STEP_HOOK = crash
rb = ReplayBuffer(storage=LazyTensorStorage(9))
rb.extend(TensorDict(obs=torch.full((9, 2), 7.0), batch_size=[9]))
rb.export_hf(sys.argv[1])
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("step", ["before_switch", "after_aside"])
def test_a_crash_during_export_leaves_the_previous_export_readable(tmp_path, step):
    import subprocess
    import sys

    rb, path = exported(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    if step == "after_aside":  # the two-rename switch: crash between the renames
        script = CRASHING_EXPORT.replace("fs.STEP_HOOK = crash", "fs.STEP_HOOK = crash\nfs.USE_EXCHANGE = False")
    else:
        script = CRASHING_EXPORT
    proc = subprocess.run([sys.executable, "-c", script, str(path), step], env=env, timeout=240)
    assert proc.returncode == 17
    assert any(".tmp-" in name or ".old-" in name for name in os.listdir(tmp_path))
    assert torch.equal(ReplayBuffer.from_hf(path)[:]["obs"], rb[:]["obs"])  # the previous export, complete
    rb.export_hf(path)  # the next export recovers: the stale directories go, the export is replaced
    assert sorted(os.listdir(tmp_path)) == ["export"]
    assert torch.equal(ReplayBuffer.from_hf(path)[:]["obs"], rb[:]["obs"])


@pytest.mark.parametrize("storage", ["tensor", "memmap", "list"])
def test_imported_rows_own_their_memory(tmp_path, storage):
    """An import into a tensor storage reads the dataset's memory-mapped Arrow buffers without copying them
    first; what the buffer holds must still be its own (writable, the dataset unchanged), whatever the storage."""
    data = TensorDict(obs=torch.arange(24, dtype=torch.float32).view(8, 3), done=torch.zeros(8, 1, dtype=torch.bool),
                      batch_size=[8])  # fmt: skip
    src = ReplayBuffer(storage=LazyTensorStorage(8))
    src.extend(data)
    path = str(tmp_path / "export")
    src.export_hf(path)
    target = {"tensor": LazyTensorStorage(8), "memmap": LazyMemmapStorage(8), "list": ListStorage(8)}[storage]
    rb = ReplayBuffer.from_hf(path, storage=target)
    for i in range(8):
        item = rb[i]
        item["obs"].add_(100)  # a view of a read-only mapping would crash the process here
        item["done"].fill_(True)
    if storage != "list":  # a tensor storage returns copies: write through the buffer
        rb[torch.arange(8)] = TensorDict(obs=data["obs"] + 100, done=~data["done"], batch_size=[8])
    assert (rb[:]["obs"] == data["obs"] + 100).all() and rb[:]["done"].all()
    assert torch.equal(ReplayBuffer.from_hf(path, storage=LazyTensorStorage(8))[:]["obs"], data["obs"])


def test_import_through_an_inverse_transform_gets_writable_rows(tmp_path):
    from torchrl.envs.transforms import Transform

    class AddInPlace(Transform):
        """An inverse transform that works in place on what is written."""

        def inv(self, td):
            td["obs"].add_(1)  # on a view of a read-only mapping, this would crash the process
            return td

    src = ReplayBuffer(storage=LazyTensorStorage(4))
    src.extend(TensorDict(obs=torch.zeros(4, 2), batch_size=[4]))
    path = str(tmp_path / "export")
    src.export_hf(path)
    rb = ReplayBuffer(storage=LazyTensorStorage(4), transform=AddInPlace())
    rb.extend_from_hf(path)
    assert (rb.storage[:]["obs"] == 1).all()


def test_import_cuts_chunks_at_shard_boundaries_and_stays_exact(tmp_path):
    """Each shard of an export is one Arrow chunk: an import chunk that straddles two shards is cut there (its
    columns are then converted without being concatenated), and the rows come back in order, bit for bit."""
    src = ReplayBuffer(storage=LazyTensorStorage(50))
    data = TensorDict(obs=torch.randn(50, 3), done=torch.rand(50, 1) > 0.5, batch_size=[50])
    src.extend(data)
    path = str(tmp_path / "export")
    ds = src.export_hf(path, shard_bytes=200, chunk_bytes=100)  # 13 bytes a row: shards of about 15 rows
    shard_rows = [len(chunk) for chunk in ds.data.column("obs").chunks]
    assert len(shard_rows) > 2
    rows = chunk_rows_for(HFReader(path), 13 * 20)
    assert 1 < rows < 50 and all(r % rows for r in torch.tensor(shard_rows).cumsum(0).tolist()[:-1])
    sizes = [chunk.batch_size[0] for chunk in import_hf(path, chunk_bytes=13 * 20)]
    expected = set(torch.tensor(shard_rows).cumsum(0).tolist()) | set(range(rows, 50, rows)) | {50}
    assert set(torch.tensor(sizes).cumsum(0).tolist()) == expected  # chunk ends and shard ends, nothing else
    for storage in (LazyTensorStorage(50), LazyMemmapStorage(50)):
        copy = ReplayBuffer.from_hf(path, storage=storage, chunk_bytes=13 * 20)
        assert torch.equal(copy[:]["obs"], data["obs"]) and torch.equal(copy[:]["done"], data["done"])


def test_lerobot_layout_does_not_warn_about_the_trajectory_key_it_writes_as_episode_index(tmp_path):
    n = 6
    data = TensorDict(
        {"observation": torch.randn(n, 3), "episode": torch.tensor([0, 0, 0, 1, 1, 1]),
         "frame": torch.tensor([0, 1, 2, 0, 1, 2]), "next": {"reward": torch.zeros(n, 1)}},
        batch_size=[n],
    )  # fmt: skip
    rb = ReplayBuffer(storage=LazyTensorStorage(n))
    rb.extend(data)
    with pytest.warns(UserWarning, match="drops the keys \\[\\('frame',\\)\\]") as record:
        ds = rb.export_hf(tmp_path / "export", layout="lerobot", fps=10)[:]
    assert not any("'episode'" in str(w.message).split("(next")[0] for w in record)
    assert ds["episode_index"] == [0, 0, 0, 1, 1, 1]
