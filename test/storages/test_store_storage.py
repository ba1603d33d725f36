"""StoreStorage against a real ``redis-server`` (started by the ``redis_server`` fixture): round trips of
TensorDicts, tensors, tensorclasses and strings, TorchRL's errors, argument checks, several storages (standing for
several processes) on one ``td_id``, state dicts, pickling and pickle-free checkpoints."""

from __future__ import annotations

import json
import pickle
import sys
import uuid

import pytest
import torch
from helpers.redis_server import free_port, redis_server  # noqa: F401 (a fixture)
from tensordict import TensorDict, tensorclass

from torchrl.data import (
    LazyTensorStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    StoreStorage,
    TensorDictReplayBuffer,
)


@tensorclass
class Step:
    obs: torch.Tensor
    reward: torch.Tensor


@pytest.fixture
def make_storage(redis_server):  # noqa: F811
    """Builds StoreStorages on the test's server, each on a new td_id unless given one; closes them after."""
    built = []

    def make(max_size=10, **kwargs):
        kwargs.setdefault("td_id", f"test-{uuid.uuid4()}")
        storage = StoreStorage(max_size, host=redis_server.host, port=redis_server.port, **kwargs)
        built.append(storage)
        return storage

    yield make
    for storage in built:
        storage.close()


def _rows(n, start=0):
    value = torch.arange(start, start + n)
    td = TensorDict(obs=value.float().unsqueeze(-1).expand(n, 3).clone(), value=value, batch_size=[n])
    td["name"] = [f"row{v}" for v in value.tolist()]
    return td


# -- data round trips ------------------------------------------------------------------------------------------------
def test_a_buffer_over_the_server_extends_and_samples_tensordicts(make_storage):
    rb = ReplayBuffer(storage=make_storage(10), batch_size=4)
    assert rb.extend(_rows(6)).tolist() == list(range(6))
    assert len(rb) == 6
    batch = rb.sample()
    assert batch.batch_size == (4,)
    assert torch.equal(batch["obs"][:, 0], batch["value"].float())
    assert batch["name"] == [f"row{v}" for v in batch["value"].tolist()]


def test_ring_writes_land_where_they_land_in_a_lazy_tensor_storage(make_storage):
    store, local = make_storage(5), LazyTensorStorage(5)
    buffers = [ReplayBuffer(storage=s, batch_size=2) for s in (store, local)]
    for chunk in (torch.arange(3), torch.arange(3, 10), torch.arange(10, 12)):
        indices = [rb.extend(chunk) for rb in buffers]
        assert indices[0].tolist() == indices[1].tolist()
    assert store[:].tolist() == local[:].tolist() == [10, 11, 7, 8, 9]
    assert len(store) == 5 and store[3].item() == 8


def test_strings_round_trip(make_storage):
    storage = make_storage(8)
    storage.set(torch.arange(4), _rows(4))
    assert storage[torch.tensor([3, 0])]["name"] == ["row3", "row0"]
    assert storage[2]["name"] == "row2"


def test_tensorclasses_come_back_as_their_class(make_storage):
    storage = make_storage(8)
    rb = ReplayBuffer(storage=storage, batch_size=3)
    rb.extend(Step(obs=torch.ones(4, 2), reward=torch.arange(4.0), batch_size=[4]))
    out = storage[torch.tensor([1, 3])]
    assert isinstance(out, Step) and out.reward.tolist() == [1.0, 3.0]
    assert isinstance(rb.sample(), Step)


def test_tensorclasses_read_by_a_storage_that_never_wrote(make_storage):
    writer = make_storage(8)
    writer.set(torch.arange(2), Step(obs=torch.zeros(2, 2), reward=torch.ones(2), batch_size=[2]))
    reader = make_storage(8, td_id=writer.state_dict()["_td_id"])
    assert isinstance(reader[0], Step)


def test_item_assignment_writes_filled_rows_without_moving_the_length(make_storage):
    storage = make_storage(6)
    storage.set(torch.arange(3), torch.zeros(3, 2))
    storage[1] = torch.ones(2)
    assert len(storage) == 3 and storage[1].tolist() == [1.0, 1.0]
    with pytest.raises(IndexError, match="hold data"):
        storage[4] = torch.ones(2)
    assert len(storage) == 3


def test_writes_at_given_positions_grow_the_length_to_cover_them(make_storage):
    storage = make_storage(10)
    storage.set(7, torch.tensor(70))
    assert len(storage) == 8 and storage[7].item() == 70
    assert 7 in storage and 8 not in storage and storage.contains(torch.tensor([0, 7]))


# -- several writers on one td_id (each StoreStorage stands for a process) ----------------------------------------------
def test_two_writers_on_one_td_id_never_overwrite_each_other(make_storage):
    first = make_storage(20)
    second = make_storage(20, td_id=first.state_dict()["_td_id"])
    rb1, rb2 = ReplayBuffer(storage=first, batch_size=2), ReplayBuffer(storage=second, batch_size=2)
    i1 = rb1.extend(torch.arange(5))
    i2 = rb2.extend(torch.arange(100, 105))  # its writer's own cursor says 0: the server says 5
    i3 = rb1.extend(torch.arange(5, 8))
    assert i1.tolist() == [0, 1, 2, 3, 4] and i2.tolist() == [5, 6, 7, 8, 9] and i3.tolist() == [10, 11, 12]
    assert first[i2].tolist() == list(range(100, 105)) and second[i3].tolist() == [5, 6, 7]
    assert len(first) == len(second) == 13


def test_the_stored_index_entry_is_where_the_item_went(make_storage):
    first = make_storage(10)
    second = make_storage(10, td_id=first.state_dict()["_td_id"])
    TensorDictReplayBuffer(storage=first, batch_size=2).extend(_rows(3))
    data = _rows(2, start=50)
    index = TensorDictReplayBuffer(storage=second, batch_size=2).extend(data)
    assert index.tolist() == [3, 4] and data["index"].tolist() == [3, 4]
    assert first[torch.tensor([3, 4])]["index"].tolist() == [3, 4]


def test_a_learner_that_never_wrote_samples_what_collectors_wrote(make_storage):
    collector = make_storage(10)
    ReplayBuffer(storage=collector, batch_size=2).extend(_rows(4))
    learner = ReplayBuffer(storage=make_storage(10, td_id=collector.state_dict()["_td_id"]), sampler=RandomSampler(),
                           batch_size=8)  # fmt: skip
    batch = learner.sample()
    assert set(batch["value"].tolist()) <= {0, 1, 2, 3} and len(learner) == 4


def test_empty_empties_the_storage_for_every_process(make_storage):
    first = make_storage(10)
    second = make_storage(10, td_id=first.state_dict()["_td_id"])
    rb = ReplayBuffer(storage=first, batch_size=2)
    rb.extend(torch.arange(4))
    rb.empty()
    assert len(first) == len(second) == 0
    assert rb.extend(torch.arange(2)).tolist() == [0, 1]  # the append position starts over too


# -- TorchRL's errors and argument checks ---------------------------------------------------------------------------------
def test_reading_before_any_write_raises_torchrl_s_runtime_error(make_storage):
    storage = make_storage(10)
    with pytest.raises(RuntimeError, match="Cannot get elements out of a non-initialized storage.") as info:
        storage[0]
    assert storage.state_dict()["_td_id"] in str(info.value)


@pytest.mark.parametrize("data", [["a", "b"], {"x": torch.zeros(2)}, 3.0])
def test_other_data_raises_torchrl_s_type_error_and_writes_nothing(make_storage, data):
    storage = make_storage(10)
    with pytest.raises(TypeError, match="StoreStorage does not support data of type"):
        storage.set(torch.arange(2), data)
    assert len(storage) == 0 and not storage.state_dict()["initialized"]


def test_a_write_of_another_kind_of_item_is_refused(make_storage):
    storage = make_storage(10)
    storage.set(torch.arange(2), _rows(2))
    with pytest.raises(TypeError, match="holds tensordict items on the server; got a tensor"):
        storage.set(torch.arange(2, 4), torch.zeros(2))
    assert len(storage) == 2


def test_more_rows_than_items_is_refused(make_storage):
    storage = make_storage(10)
    with pytest.raises(ValueError, match="3 rows were given for data of batch size \\[2\\]"):
        storage.set(torch.arange(3), torch.zeros(2, 4))
    with pytest.raises(IndexError):
        storage.set(torch.tensor([10]), torch.zeros(1, 4))
    assert len(storage) == 0


def test_missing_redis_package_raises_torchrl_s_module_not_found_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match="StoreStorage requires both the `redis` package") as info:
        StoreStorage(10)
    assert "pip install" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"max_size": 0}, ValueError, "`max_size` must be a positive int, got 0"),
        ({"max_size": "10"}, TypeError, "`max_size`"),
        ({"port": 0}, ValueError, "`port` must be a TCP port in [1, 65535]"),
        ({"port": 70000}, ValueError, "got 70000"),
        ({"port": "6379"}, TypeError, "`port` must be an int"),
        ({"port": True}, TypeError, "`port` must be an int"),
        ({"db": -1}, ValueError, "`db` must be a database number >= 0"),
        ({"db": 1.0}, TypeError, "`db` must be an int"),
        ({"host": ""}, TypeError, "`host` must be a non-empty str"),
        ({"host": 127}, TypeError, "`host` must be a non-empty str"),
        ({"backend": None}, TypeError, "`backend` must be a non-empty str"),
        ({"td_id": ""}, TypeError, "`td_id` must be a non-empty str"),
        ({"prefix": 3}, TypeError, "`prefix` must be a non-empty str"),
        ({"batch_size": [10]}, TypeError, "remove `batch_size`"),
        ({"compilable": "yes"}, TypeError, "compilable"),
    ],
)
def test_bad_arguments_are_refused_before_connecting(kwargs, error, words):
    kwargs = {"max_size": 10, "port": free_port(), **kwargs}  # nothing listens there: the check comes first
    with pytest.raises(error) as info:
        StoreStorage(**kwargs)
    assert words in str(info.value)


@pytest.mark.timeout(30)
def test_no_server_at_the_address_raises_a_connection_error_naming_it():
    port = free_port()
    with pytest.raises(ConnectionError) as info:
        StoreStorage(10, host="127.0.0.1", port=port)
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "redis-server --port" in message and "`host` and `port`" in message


@pytest.mark.timeout(30)
def test_an_unreachable_host_raises_a_connection_error_naming_it():
    with pytest.raises(ConnectionError, match="10.255.255.1:6379"):
        StoreStorage(10, host="10.255.255.1")  # not routable: refused or timed out after the connect timeout


def test_a_database_the_server_lacks_raises_a_connection_error_naming_db(redis_server):  # noqa: F811
    with pytest.raises(ConnectionError, match="refused db 99"):
        StoreStorage(10, host=redis_server.host, port=redis_server.port, db=99)


# -- state, pickling, checkpoints -------------------------------------------------------------------------------------
def test_state_dict_has_torchrl_s_keys_and_reconnects(make_storage):
    storage = make_storage(10, prefix="rb")
    storage.set(torch.arange(3), torch.arange(3))
    state = storage.state_dict()
    assert set(state) == {"initialized", "_len", "_backend", "_host", "_port", "_db", "_store_kwargs", "_td_id"}
    assert state["initialized"] and state["_len"] == 3 and state["_store_kwargs"] == {"prefix": "rb"}
    other = make_storage(10)
    other.load_state_dict(state)
    assert len(other) == 3 and other[:].tolist() == [0, 1, 2]


def test_a_pickled_copy_reads_and_writes_the_same_rows(make_storage):
    storage = make_storage(10)
    storage.set(torch.arange(2), _rows(2))
    copy = pickle.loads(pickle.dumps(storage))
    ReplayBuffer(storage=copy, batch_size=2).extend(_rows(1, start=7))
    assert len(storage) == 3 and storage[2]["name"] == "row7"
    copy.close()


def test_dumps_and_loads_restore_the_rows_without_pickle(make_storage, tmp_path):
    rb = ReplayBuffer(storage=make_storage(10), batch_size=2)
    rb.extend(_rows(12))  # wraps: rows hold 10, 11, 2, ..., 9
    path = tmp_path / "rb"
    rb.dumps(path)
    files = {p.name for p in path.rglob("*") if p.is_file()}
    assert "metadata.json" in files and not any(name.endswith((".pkl", ".pt")) for name in files)
    assert "row11" in (path / "metadata.json").read_text()  # strings are JSON
    fresh = ReplayBuffer(storage=make_storage(10), batch_size=2)
    fresh.loads(path)
    assert fresh.storage[:]["value"].tolist() == [10, 11, *range(2, 10)]
    assert fresh.storage[:]["name"] == [f"row{v}" for v in [10, 11, *range(2, 10)]]
    assert fresh.extend(_rows(1, start=99)).tolist() == [2]  # the append position came back too


def test_storage_dumps_of_tensors_and_of_an_empty_storage(make_storage, tmp_path):
    storage = make_storage(6)
    storage.set(torch.arange(4), torch.arange(8.0).reshape(4, 2))
    storage.dumps(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "metadata.json").read_text())
    assert meta["schema_version"] >= 1
    fresh = make_storage(6)
    fresh.loads(tmp_path / "s")
    assert torch.equal(fresh[:], torch.arange(8.0).reshape(4, 2))
    make_storage(6).dumps(tmp_path / "empty")
    fresh.loads(tmp_path / "empty")
    assert len(fresh) == 0


def test_loads_refuses_a_checkpoint_of_another_capacity(make_storage, tmp_path):
    storage = make_storage(6)
    storage.set(torch.arange(2), torch.zeros(2))
    storage.dumps(tmp_path / "s")
    other = make_storage(7)
    with pytest.raises(ValueError, match="max_size"):
        other.loads(tmp_path / "s")
    assert not other.state_dict()["initialized"]


def test_a_buffer_with_an_explicit_round_robin_writer_reads_its_writes_back(make_storage):
    rb = ReplayBuffer(storage=make_storage(100), sampler=RandomSampler(), writer=RoundRobinWriter(), batch_size=16)
    written = [
        rb.extend(TensorDict(obs=torch.randn(20, 64), action=torch.randn(20, 4), reward=torch.randn(20, 1),
                             batch_size=[20]))
        for _ in range(3)
    ]  # fmt: skip
    assert torch.cat(written).tolist() == list(range(60))
    assert len(rb) == 60 and rb.sample()["obs"].shape == (16, 64)


def test_load_state_dict_refuses_what_state_dict_did_not_return(make_storage):
    storage = make_storage(10)
    storage.set(torch.arange(2), torch.arange(2))
    with pytest.raises(TypeError, match="'_td_id'"):
        storage.load_state_dict({"_len": 2})
    with pytest.raises(ValueError, match="`port` must be a TCP port"):
        storage.load_state_dict({**storage.state_dict(), "_port": 0})
    assert storage[:].tolist() == [0, 1]  # still connected to its rows


def test_rb_add_from_two_writers_takes_the_server_s_next_row(make_storage):
    first = make_storage(10)
    second = make_storage(10, td_id=first.state_dict()["_td_id"])
    ReplayBuffer(storage=first, batch_size=1).add(torch.tensor(5))
    ReplayBuffer(storage=second, batch_size=1).add(torch.tensor(6))
    assert first[:].tolist() == [5, 6]
