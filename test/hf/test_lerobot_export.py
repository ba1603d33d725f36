"""``export_hf(path, layout="lerobot")``: the LeRobot v3.0 file set, checked field by field against a dataset that
LeRobot 0.6.1 wrote itself (test/datasets/data/lerobot_v30_cartpole_like: 3 episodes x 50 frames, 2 tasks).

The fixture is read into a buffer and exported again: every file LeRobot wrote must come back with the same
schema (column names, Arrow types, parquet ``huggingface`` / ``pandas`` metadata), ``info.json`` must be equal key
for key (values and value types), the frames bit for bit; the statistics equal LeRobot's except the quantiles
(LeRobot approximates them from histograms, the export computes them exactly).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.extras import require
from tensordict import NonTensorStack, TensorDict

require("datasets")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from torchrl.data import LazyTensorStorage, ListStorage, ReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.hf.columns import METADATA_FILE  # noqa: E402

pytestmark = pytest.mark.extras

FIXTURE = Path(__file__).resolve().parents[1] / "datasets" / "data" / "lerobot_v30_cartpole_like"
TABLES = ["meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet", "data/chunk-000/file-000.parquet"]
EXACT_STATS = ("min", "max", "mean", "std", "count")
NAMES = {"observation.state": ["x0", "x1", "x2", "x3"], "action": ["a0", "a1"]}


def export_quietly(rb, path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the dropped derived keys
        return rb.export_hf(path, layout="lerobot", **kwargs)


@pytest.fixture(scope="module")
def reexport(tmp_path_factory):
    """The fixture read with ``from_hf`` and exported again with LeRobot's settings."""
    path = tmp_path_factory.mktemp("lerobot") / "export"
    rb = ReplayBuffer.from_hf(FIXTURE)
    export_quietly(rb, path, fps=10, names=NAMES)
    return path


def ted(n: int, done_at, **extra) -> TensorDict:
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[list(done_at)] = True
    return TensorDict(
        observation=torch.randn(n, 3), action=torch.randn(n, 2),
        next=TensorDict(observation=torch.randn(n, 3), reward=torch.randn(n, 1), done=done, batch_size=[n]),
        batch_size=[n], **extra,
    )  # fmt: skip


def files_of(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_the_export_has_every_file_lerobot_writes(reexport):
    assert files_of(FIXTURE) <= files_of(reexport)
    # beside them: this library's metadata, the switch marker and the v2.1 episode list (LeRobot 0.6 ignores them)
    assert files_of(reexport) - files_of(FIXTURE) == {METADATA_FILE, "COMPLETE", "meta/episodes.jsonl"}


def test_info_json_equals_lerobots_key_for_key(reexport):
    ours = json.loads((reexport / "meta/info.json").read_text())
    theirs = json.loads((FIXTURE / "meta/info.json").read_text())
    assert list(ours) == list(theirs)
    for key in theirs:
        assert ours[key] == theirs[key], key
        assert type(ours[key]) is type(theirs[key]), key  # fps an int, video_path / robot_type null, ...
    assert ours["codebase_version"] == "v3.0" and "total_chunks" not in ours


@pytest.mark.parametrize("table", TABLES)
def test_parquet_tables_have_lerobots_schema(reexport, table):
    ours, theirs = pq.read_table(reexport / table), pq.read_table(FIXTURE / table)
    assert ours.column_names == theirs.column_names
    for a, b in zip(ours.schema, theirs.schema):
        assert a.type == b.type, a.name  # child names included (fixed_size_list<element: float>[4], ...)
    ours_meta, theirs_meta = ours.schema.metadata or {}, theirs.schema.metadata or {}
    for meta in (b"huggingface", b"pandas"):
        assert (meta in ours_meta) == (meta in theirs_meta), meta
    if b"huggingface" in theirs_meta:
        info = json.loads(ours.schema.metadata[b"huggingface"])["info"]
        assert info == json.loads(theirs.schema.metadata[b"huggingface"])["info"]
    if b"pandas" in theirs_meta:
        ours_pd = json.loads(ours.schema.metadata[b"pandas"])
        theirs_pd = json.loads(theirs.schema.metadata[b"pandas"])
        for key in ("index_columns", "column_indexes", "columns"):
            assert ours_pd[key] == theirs_pd[key], key


def test_frames_are_bit_identical_to_lerobots(reexport):
    ours = pq.read_table(reexport / TABLES[2])
    theirs = pq.read_table(FIXTURE / TABLES[2])
    assert ours.equals(theirs)


def test_tasks_table_reads_with_pandas_as_lerobot_reads_it(reexport):
    pd = pytest.importorskip("pandas")
    tasks = pd.read_parquet(reexport / "meta/tasks.parquet")
    assert tasks.index.name == "task"
    assert list(tasks.index) == ["push the cube", "pull the cube"] and list(tasks["task_index"]) == [0, 1]
    assert tasks.iloc[1].name == "pull the cube"  # how LeRobot turns a frame's task_index into its text


def test_episode_table_equals_lerobots(reexport):
    ours = pq.read_table(reexport / TABLES[1]).to_pydict()
    theirs = pq.read_table(FIXTURE / TABLES[1]).to_pydict()
    for column, values in theirs.items():
        if not column.startswith("stats/"):
            assert ours[column] == values, column
        elif column.rsplit("/", 1)[1] in EXACT_STATS:
            np.testing.assert_allclose(np.array(ours[column], float), np.array(values, float), rtol=1e-6,
                                       atol=1e-7, err_msg=column)  # fmt: skip
    assert ours["dataset_from_index"] == [0, 50, 100] and ours["dataset_to_index"] == [50, 100, 150]


def test_quantiles_are_exact_per_episode(reexport):
    episodes = pq.read_table(reexport / TABLES[1]).to_pydict()
    frames = pq.read_table(FIXTURE / TABLES[2]).to_pydict()
    state = np.array(frames["observation.state"], dtype=np.float64)
    for e, (lo, hi) in enumerate(zip(episodes["dataset_from_index"], episodes["dataset_to_index"])):
        for name, q in (("q01", 0.01), ("q50", 0.5), ("q99", 0.99)):
            expected = np.quantile(state[lo:hi], q, axis=0)
            np.testing.assert_allclose(episodes[f"stats/observation.state/{name}"][e], expected, rtol=1e-12)


def test_stats_json_has_lerobots_keys_and_aggregates(reexport):
    ours = json.loads((reexport / "meta/stats.json").read_text())
    theirs = json.loads((FIXTURE / "meta/stats.json").read_text())
    assert set(ours) == set(theirs)
    for feature in theirs:
        assert list(ours[feature]) == list(theirs[feature]), feature
        for stat in EXACT_STATS:
            np.testing.assert_allclose(ours[feature][stat], theirs[feature][stat], rtol=1e-6, atol=1e-7,
                                       err_msg=f"{feature}/{stat}")  # fmt: skip


def test_task_text_from_a_string_entry(tmp_path):
    data = ted(6, done_at=[2, 5])
    data.set("language_instruction", NonTensorStack.from_list(["open", "open", "open", "close", "close", "open"]))
    rb = ReplayBuffer(storage=LazyTensorStorage(6))
    rb.extend(data)
    export_quietly(rb, tmp_path / "x", fps=5)
    tasks = pq.read_table(tmp_path / "x" / "meta/tasks.parquet").to_pydict()
    assert tasks == {"task_index": [0, 1], "task": ["open", "close"]}
    assert pq.read_table(tmp_path / "x" / TABLES[2]).column("task_index").to_pylist() == [0, 0, 0, 1, 1, 0]
    episodes = pq.read_table(tmp_path / "x" / TABLES[1]).to_pydict()
    assert episodes["tasks"] == [["open"], ["close", "open"]]
    info = json.loads((tmp_path / "x" / "meta/info.json").read_text())
    assert info["total_tasks"] == 2 and info["fps"] == 5 and "language_instruction" not in info["features"]
    copy = ReplayBuffer.from_hf(tmp_path / "x")[:]  # our own export: the stored keys come back, the text too
    assert copy["language_instruction"].tolist() == data["language_instruction"].tolist()
    assert torch.equal(copy["observation"], data["observation"])
    assert copy["next", "done"].shape == (6, 1)


def test_task_argument_gives_every_frame_one_task(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(ted(4, done_at=[3]))
    export_quietly(rb, tmp_path / "x", task="stack the blocks", robot_type="so100")
    assert pq.read_table(tmp_path / "x" / "meta/tasks.parquet").to_pydict()["task"] == ["stack the blocks"]
    info = json.loads((tmp_path / "x" / "meta/info.json").read_text())
    assert info["robot_type"] == "so100" and info["total_tasks"] == 1 and info["fps"] == 1
    imported = ReplayBuffer.from_hf(tmp_path / "x", ignore_metadata=True)[:]  # as any LeRobot dataset
    assert imported["language_instruction"].tolist() == ["stack the blocks"] * 4


def test_without_a_task_every_frame_gets_the_empty_task(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(ted(4, done_at=[3]))
    export_quietly(rb, tmp_path / "x")
    assert pq.read_table(tmp_path / "x" / "meta/tasks.parquet").to_pydict() == {"task_index": [0], "task": [""]}


def test_feature_names_and_image_axes(tmp_path):
    data = ted(4, done_at=[3])
    data.set("pixels", torch.randint(0, 255, (4, 3, 8, 6), dtype=torch.uint8))
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(data)
    export_quietly(rb, tmp_path / "x", names={"action": ["left", "right"], ("observation",): list("abc")})
    features = json.loads((tmp_path / "x" / "meta/info.json").read_text())["features"]
    assert features["action"] == {"dtype": "float32", "shape": [2], "names": ["left", "right"]}
    assert features["observation.state"]["names"] == ["a", "b", "c"]
    assert features["observation.image"] == {"dtype": "uint8", "shape": [3, 8, 6],
                                             "names": ["channels", "height", "width"]}  # fmt: skip
    assert features["next.reward"] == {"dtype": "float32", "shape": [1], "names": None}
    schema = pq.read_schema(tmp_path / "x" / TABLES[2])
    hf = json.loads(schema.metadata[b"huggingface"])["info"]["features"]
    assert hf["observation.image"] == {"shape": [3, 8, 6], "dtype": "uint8", "_type": "Array3D"}
    stats = pq.read_table(tmp_path / "x" / TABLES[1]).to_pydict()
    assert np.array(stats["stats/observation.image/mean"][0]).shape == (3, 8, 6)
    copy = ReplayBuffer.from_hf(tmp_path / "x")[:]
    assert torch.equal(copy["pixels"], data["pixels"])


def test_data_files_split_by_size_keep_episodes_whole(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(40))
    data = ted(40, done_at=range(4, 40, 5))  # 8 episodes of 5 frames
    rb.extend(data)
    export_quietly(rb, tmp_path / "x", shard_bytes=300, chunk_bytes=200)
    files = sorted(str(p.relative_to(tmp_path / "x")) for p in (tmp_path / "x" / "data").rglob("*.parquet"))
    assert len(files) > 1 and files[0] == "data/chunk-000/file-000.parquet"
    assert files == [f"data/chunk-000/file-{i:03d}.parquet" for i in range(len(files))]
    episodes = pq.read_table(tmp_path / "x" / TABLES[1]).to_pydict()
    for lo, hi, f in zip(episodes["dataset_from_index"], episodes["dataset_to_index"], episodes["data/file_index"]):
        index = pq.read_table(tmp_path / "x" / f"data/chunk-000/file-{f:03d}.parquet").column("index").to_pylist()
        assert list(range(lo, hi)) == [i for i in index if lo <= i < hi]  # the whole episode in that file
        assert hi - lo == 5
    info = json.loads((tmp_path / "x" / "meta/info.json").read_text())
    assert info["data_files_size_in_mb"] == 1 and info["total_episodes"] == 8
    copy = ReplayBuffer.from_hf(tmp_path / "x")[:]
    assert torch.equal(copy["observation"], data["observation"])


def test_every_feature_of_shape_1_is_a_scalar_column(tmp_path):
    data = ted(4, done_at=[3])
    data.set("velocity", torch.randn(4, 1))
    data.set("gripper", torch.randn(4))  # shape [] items: a feature of shape [1] too
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(data)
    export_quietly(rb, tmp_path / "x")
    schema = pq.read_schema(tmp_path / "x" / TABLES[2])
    features = json.loads((tmp_path / "x" / "meta/info.json").read_text())["features"]
    for column in ("velocity", "gripper", "next.reward", "next.done"):
        assert not pa.types.is_list(schema.field(column).type) and features[column]["shape"] == [1], column
    copy = ReplayBuffer.from_hf(tmp_path / "x")[:]
    assert copy["velocity"].shape == (4, 1) and copy["gripper"].shape == (4,)
    assert torch.equal(copy["velocity"], data["velocity"]) and torch.equal(copy["gripper"], data["gripper"])


def test_a_wrapped_ring_buffer_exports_from_its_oldest_row(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    data = ted(14, done_at=[3, 8, 13])
    rb.extend(data)  # rows 4..13 remain, oldest at position 4
    export_quietly(rb, tmp_path / "x")
    frames = pq.read_table(tmp_path / "x" / TABLES[2]).to_pydict()
    np.testing.assert_array_equal(np.array(frames["observation.state"], np.float32), data["observation"][4:].numpy())
    assert frames["episode_index"] == [0] * 5 + [1] * 5 and frames["index"] == list(range(10))


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(ted(4, done_at=[3]))
    target = tmp_path / "x"
    with pytest.raises(ValueError, match="`fps` must be a whole number"):
        rb.export_hf(target, layout="lerobot", fps=7.5)
    with pytest.raises(ValueError, match="not both"):
        rb.export_hf(target, layout="lerobot", task="a", task_key="b")
    with pytest.raises(TypeError, match="`task` must be a str"):
        rb.export_hf(target, layout="lerobot", task=3)
    with pytest.raises(KeyError, match="`task_key`=\\('nope',\\) is not a string entry"):
        rb.export_hf(target, layout="lerobot", task_key="nope")
    with pytest.raises(TypeError, match="`names\\['action'\\]` must be a list of str"):
        rb.export_hf(target, layout="lerobot", names={"action": "ab"})
    with pytest.raises(KeyError, match="`names` has the key \\('nope',\\)"):
        rb.export_hf(target, layout="lerobot", names={"nope": ["a"]})
    with pytest.raises(TypeError, match="`robot_type` must be a str"):
        rb.export_hf(target, layout="lerobot", robot_type=1)
    with pytest.raises(ValueError, match="describe a LeRobot dataset: pass them with layout='lerobot'"):
        rb.export_hf(target, layout="flat", task="a")
    assert not target.exists()


def test_entries_lerobot_cannot_hold_are_refused(tmp_path):
    rb = ReplayBuffer(storage=ListStorage(4))
    for i in range(4):
        rb.add(TensorDict(obs=torch.zeros(i + 1), next=TensorDict(done=torch.tensor([i == 3]), batch_size=[]),
                          batch_size=[]))  # fmt: skip
    with pytest.raises(ValueError, match="\\('obs',\\) holds items of different shapes.*exclude_keys"):
        rb.export_hf(tmp_path / "x", layout="lerobot")
    data = ted(2, done_at=[1])
    data.set("big", torch.zeros(2, 1, 1, 1, 1, 1, 2))
    rb = ReplayBuffer(storage=LazyTensorStorage(2))
    rb.extend(data)
    with pytest.raises(ValueError, match="\\('big',\\) holds items of shape"):
        rb.export_hf(tmp_path / "x", layout="lerobot")
    data = ted(2, done_at=[1])
    data.set("task", NonTensorStack.from_list(["a", None]))
    rb = ReplayBuffer(storage=LazyTensorStorage(2))
    rb.extend(data)
    with pytest.raises(TypeError, match="must hold one str per frame"):
        export_quietly(rb, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_lerobot_export_replaces_an_earlier_one(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(6))
    rb.extend(ted(6, done_at=[2, 5]))
    export_quietly(rb, tmp_path / "x", task="a")
    export_quietly(rb, tmp_path / "x", task="b")
    assert pq.read_table(tmp_path / "x" / "meta/tasks.parquet").to_pydict()["task"] == ["b"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not an export of this library"):
        export_quietly(rb, tmp_path / "other")
    assert os.listdir(tmp_path / "other") == ["keep.txt"]


def test_the_returned_dataset_holds_the_frames(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(6))
    data = ted(6, done_at=[2, 5])
    rb.extend(data)
    ds = export_quietly(rb, tmp_path / "x", task="go")
    assert ds.num_rows == 6 and ds.column_names[-5:] == ["timestamp", "frame_index", "episode_index", "index",
                                                         "task_index"]  # fmt: skip
    copy = ReplayBuffer.from_hf(ds)[:]  # a Dataset object carries the export's metadata too
    assert torch.equal(copy["observation"], data["observation"]) and copy["next", "reward"].shape == (6, 1)
