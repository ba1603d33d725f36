"""TorchRL's storage-level API: ``Storage(max_size, checkpointer=None, compilable=False)``, the save hooks registered
on a storage (``register_save_hook``, run by ``storage.dumps`` and by the buffer's ``dumps``; ``register_load_hook``
refused), the ``dump``/``save``/``load`` aliases with TorchRL's ``*args, **kwargs``, and the refusals that keep a
:class:`ListStorage` in one process: a buffer over it cannot be shared (``shared=True``/``share()``), and a process
forked with a copy of it can read the copy but not write it (TorchRL's "Cannot share a storage of type" error)."""

from __future__ import annotations

import inspect
import multiprocessing as mp
import pickle

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    StorageCheckpointerBase,
    StorageEnsemble,
)
from torchrl.data.replay_buffers.storages.base import Storage
from torchrl.data.replay_buffers.storages.list_storage import STORAGE_FORKED_LIST, STORAGE_SHARE_LIST

PHRASE = "Cannot share a storage of type"
assert STORAGE_SHARE_LIST.phrase == STORAGE_FORKED_LIST.phrase == PHRASE


class _Rows(Storage):
    """A minimal storage subclass, built through ``Storage.__init__`` as user code does."""

    def __init__(self, max_size, checkpointer=None, compilable=False):
        super().__init__(max_size, checkpointer, compilable)
        self._items = {}

    def set(self, cursor, data, *, set_cursor=True):
        self._items[int(cursor)] = data

    def get(self, index):
        return self._items[int(index)]

    def __len__(self):
        return len(self._items)

    def _empty(self):
        self._items = {}

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        pass


# -- Storage(checkpointer=) ---------------------------------------------------------------------------------------
def test_storage_takes_torchrl_s_checkpointer_and_compilable_arguments():
    params = list(inspect.signature(Storage.__init__).parameters.values())[1:]
    assert [(p.name, p.default) for p in params] == [
        ("max_size", inspect.Parameter.empty),
        ("checkpointer", None),
        ("compilable", False),
    ]
    checkpointer = StorageCheckpointerBase()
    storage = _Rows(4, checkpointer, True)
    assert storage.checkpointer is checkpointer and storage.compilable is True
    assert (
        type(_Rows(4).checkpointer) is StorageCheckpointerBase and _Rows(4).checkpointer is not checkpointer
    )


def test_storage_refuses_a_checkpointer_that_is_not_one():
    with pytest.raises(TypeError, match="`checkpointer` must be a StorageCheckpointerBase"):
        _Rows(4, checkpointer="flat")


# -- save hooks on the storage ------------------------------------------------------------------------------------
class _Hook:
    def __init__(self, offset=0):
        self.shift = self.is_full = None
        self.offset = offset

    def __call__(self, data, path=None):
        return data.apply(lambda x: x + self.offset)


def _rows(values) -> TensorDict:
    values = torch.as_tensor(values)
    return TensorDict(x=values, batch_size=values.shape[:1])


def test_a_storage_save_hook_rewrites_what_storage_dumps_saves_and_not_the_storage(tmp_path):
    storage = LazyTensorStorage(4)
    storage.set(torch.arange(3), _rows(torch.arange(3)))
    hook = _Hook(offset=10)
    storage.register_save_hook(hook)
    storage.register_save_hook(lambda data, path=None: data * 2)  # run in order, on the previous result
    storage.dumps(tmp_path / "s")
    assert (hook.shift, hook.is_full) == (3, False)
    fresh = LazyTensorStorage(4)
    fresh.loads(tmp_path / "s")
    assert fresh.get(torch.arange(3))["x"].tolist() == [20, 22, 24]
    assert storage.get(torch.arange(3))["x"].tolist() == [0, 1, 2]


def test_a_buffer_s_save_hook_lives_on_its_storage(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(6))
    rb.extend(_rows(torch.arange(6)))
    hook = _Hook(offset=1)
    rb.register_save_hook(hook)
    rb.storage.dumps(tmp_path / "storage")  # the storage's own save runs the buffer's hook
    assert hook.is_full is True
    fresh = LazyMemmapStorage(6)
    fresh.loads(tmp_path / "storage")
    assert fresh.get(torch.arange(6))["x"].tolist() == [1, 2, 3, 4, 5, 6]
    rb.set_storage(LazyTensorStorage(6))  # a new storage has no hooks
    rb.empty()
    rb.extend(_rows(torch.arange(2)))
    rb.dumps(tmp_path / "rb")
    copy = ReplayBuffer(storage=LazyTensorStorage(6))
    copy.loads(tmp_path / "rb")
    assert copy[:]["x"].tolist() == [0, 1]


def test_a_save_hook_works_on_a_list_storage(tmp_path):
    storage = ListStorage(4)
    storage.set([0, 1], [torch.zeros(2), torch.ones(2)])
    storage.register_save_hook(lambda data, path=None: [item + 5 for item in data])
    storage.dumps(tmp_path / "s")
    fresh = ListStorage(4)
    fresh.loads(tmp_path / "s")
    assert [item.tolist() for item in fresh.get([0, 1])] == [[5.0, 5.0], [6.0, 6.0]]
    assert [item.tolist() for item in storage.get([0, 1])] == [[0.0, 0.0], [1.0, 1.0]]


def test_a_save_hook_that_changes_the_layout_saves_nothing(tmp_path):
    storage = LazyTensorStorage(4)
    storage.set(torch.arange(3), torch.arange(3))
    storage.register_save_hook(lambda data, path=None: torch.zeros(2, 7))
    with pytest.raises(ValueError, match="stored layout"):
        storage.dumps(tmp_path / "s")
    assert not (tmp_path / "s").exists() and storage.get(torch.arange(3)).tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "storage, hook, error, match",
    [
        (lambda: LazyTensorStorage(2), 3, TypeError, "save hook must be a callable"),
        (
            lambda: StorageEnsemble(LazyTensorStorage(2), LazyTensorStorage(2)),
            lambda d, path=None: d,
            TypeError,
            "member storages",
        ),
    ],
    ids=["not-callable", "ensemble"],
)
def test_save_hooks_refused_with_the_reason(storage, hook, error, match):
    with pytest.raises(error, match=match):
        storage().register_save_hook(hook)


def test_a_storage_load_hook_is_refused_like_the_checkpointer_s():
    with pytest.raises(NotImplementedError, match="rewrite the saved data"):
        LazyTensorStorage(2).register_load_hook(lambda data, path=None: data)


def test_save_hooks_are_not_pickled():
    storage = LazyTensorStorage(4)
    storage.set(torch.arange(2), torch.arange(2))
    storage.register_save_hook(lambda data, path=None: data)  # a lambda: it could not be pickled
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.get(torch.arange(2)).tolist() == [0, 1]


# -- dump / save / load: TorchRL's aliases --------------------------------------------------------------------------
@pytest.mark.parametrize("alias", ["dump", "save"])
def test_storage_dump_and_save_forward_every_argument_to_dumps(tmp_path, alias):
    assert [p.kind for p in inspect.signature(getattr(LazyTensorStorage, alias)).parameters.values()][1:] == [
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.VAR_KEYWORD,
    ]
    storage = LazyTensorStorage(4)
    storage.set(torch.arange(3), _rows(torch.arange(3)))
    getattr(storage, alias)(tmp_path / "s", fsync=False)
    fresh = LazyTensorStorage(4)
    fresh.load(tmp_path / "s")
    assert fresh.get(torch.arange(3))["x"].tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="unexpected keyword"):
        getattr(storage, alias)(tmp_path / "t", nonsense=True)


# -- a list storage stays in its process ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [ListStorage, LazyStackStorage])
def test_a_buffer_over_a_list_storage_cannot_be_shared(cls):
    with pytest.raises(RuntimeError, match=f"{PHRASE} {cls.__name__} between processes.*shared=False"):
        ReplayBuffer(storage=cls(4), shared=True)
    with pytest.raises(RuntimeError, match=PHRASE):
        ReplayBuffer(shared=True)  # the default storage is a ListStorage


def test_share_of_a_list_storage_buffer_is_refused_before_anything_changes():
    rb = ReplayBuffer(storage=ListStorage(4))
    rb.extend([torch.zeros(1), torch.ones(1)])
    with pytest.raises(RuntimeError, match=PHRASE):
        rb.share()
    assert not rb.storage.is_shared and not rb.writer._counters.is_shared
    rb.extend([torch.ones(1)])  # still a working private buffer
    assert len(rb) == 3


def _child_write(rb, queue) -> None:
    try:
        rb.extend([torch.ones(1)])
        queue.put("written")
    except RuntimeError as err:
        queue.put(str(err))


def _child_read(rb, queue) -> None:
    queue.put([item.tolist() for item in rb.storage.get([0, 1])])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_forked_copy_of_a_list_storage_can_be_read_not_written():
    ctx = mp.get_context("fork")
    rb = ReplayBuffer(storage=ListStorage(4))
    rb.extend([torch.zeros(1), torch.ones(1)])
    queue = ctx.Queue()
    for target in (_child_write, _child_read):
        proc = ctx.Process(target=target, args=(rb, queue))
        proc.start()
        try:
            got = queue.get(timeout=60)
        finally:
            proc.join(60)
        if target is _child_write:
            assert f"{PHRASE} ListStorage between processes" in got and "forked" in got
        else:
            assert got == [[0.0], [1.0]]  # the snapshot
    rb.extend([torch.full((1,), 2.0)])  # the parent's storage is untouched and writable
    assert len(rb) == 3


def _child_builds_its_own(queue) -> None:
    rb = ReplayBuffer(storage=ListStorage(4))
    rb.extend([torch.zeros(1)])
    copy = pickle.loads(pickle.dumps(_FORKED["rb"]))  # a copy by value, as pickle.loads gives in one process
    copy.extend([torch.zeros(1)])
    queue.put((len(rb), len(copy)))


_FORKED = {}


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_forked_process_writes_list_storages_it_built_or_unpickled():
    ctx = mp.get_context("fork")
    _FORKED["rb"] = ReplayBuffer(storage=ListStorage(4))
    _FORKED["rb"].extend([torch.zeros(1)])
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_builds_its_own, args=(queue,))
    proc.start()
    try:
        assert queue.get(timeout=60) == (1, 2)
    finally:
        proc.join(60)
        _FORKED.clear()


def test_a_list_storage_pickled_in_one_process_stays_writable():
    storage = ListStorage(4)
    storage.set(0, TensorDict(a=torch.zeros(1)))
    copy = pickle.loads(pickle.dumps(storage))
    copy.set(1, TensorDict(a=torch.ones(1)))
    assert len(copy) == 2 and len(storage) == 1
