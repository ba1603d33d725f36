"""A storage on a Redis-compatible key-value server: :class:`StoreStorage` (TorchRL's module path).

The rows live on the server, in a :class:`tensordict.store.TensorDictStore` of batch size ``[max_size]`` named
by ``td_id`` (each entry one string of raw bytes; reads and writes are byte ranges of it). Any process, on any
machine that reaches the server, that builds a ``StoreStorage`` with the same server and ``td_id`` sees the
same rows: collectors write, a learner samples.

NOTE [store counters]. Beside the store's keys, the server holds the storage's own state in one hash,
``<prefix>:{<td_id>}:__storage__``: ``length`` (the rows that hold data, what ``len()`` returns in every
process), ``writes`` (the rows appended since the last ``empty()``; an append goes at ``writes % max_size``)
and ``kind`` (what the items are: ``"tensordict"``, ``"tensor"`` or ``"tensorclass"``). Every write takes a
lock on the server (``<prefix>:{<td_id>}:__storage_lock__``), so the writes of several processes are
serialized as a shared storage's writes are on one machine: an append reserves its rows with ``HINCRBY
writes n``, writes them, then publishes the new length, so a reader never counts a row whose data has not
landed, and two writers never take the same rows. A ring writer's rows (:class:`~torchrl.data.RoundRobinWriter`)
are therefore the server's, not the writer's local cursor: the storage writes them into the index the writer
passed, so ``extend`` returns where the items went, in every process. The data of one write lands in one
``MULTI``/``EXEC`` transaction (tensordict's pipelines), so a read never sees half a batch.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import threading
import uuid
import weakref
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase, is_tensorclass

import torchrl.data.replay_buffers.storages._ragged as _ragged
from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers._checkpoint import io as _io
from torchrl.data.replay_buffers._checkpoint.parts import PartContext, check_class, mismatch, qualname
from torchrl.data.replay_buffers._checkpoint.validate import check_int_field
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.storages._index import as_index_tensor, check_bounds, check_int, is_int
from torchrl.data.replay_buffers.storages.base import Storage

__all__ = ["StoreStorage"]

STORE_MISSING = TorchRLPhrase(
    ModuleNotFoundError,
    "StoreStorage requires both the `redis` package and a version of tensordict that includes `tensordict.store`",
    "StoreStorage requires both the `redis` package and a version of tensordict that includes `tensordict.store` "
    "(missing here: {missing}). Install them with `pip install 'torchrl[redis]'` (or `pip install redis "
    "tensordict>=0.15`), or use LazyTensorStorage / LazyMemmapStorage for a buffer on this machine.",
)
STORE_DATA_TYPE = TorchRLPhrase(
    TypeError,
    "StoreStorage does not support data of type",
    "StoreStorage does not support data of type {cls}: it holds TensorDicts, tensorclasses or tensors. Wrap the "
    "data (e.g. TensorDict(obs=...)), or use ListStorage for other Python objects. Nothing was written.",
)
STORE_NOT_INITIALIZED = TorchRLPhrase(
    RuntimeError,
    "Cannot get elements out of a non-initialized storage.",
    "Cannot get elements out of a non-initialized storage. Nothing was written under td_id={td_id!r} on the "
    "server at {server} yet: write first (rb.extend(...)), or build the storage with the td_id its writers use.",
)

_TD_KINDS = ("tensordict", "tensorclass")
_KINDS = (*_TD_KINDS, "tensor")
_TENSOR_KEY = "_tensor"  # the one entry of a storage of plain tensors (TorchRL's name)
#: TensorDictStore keywords that this class sets itself or reads (the rest of ``store_kwargs`` go to the client).
_STORE_OWN = ("unix_socket_path", "prefix", "device", "client", "td_id", "cache_metadata")
_CONNECT_TIMEOUT = 2.0  # seconds, unless store_kwargs sets socket_connect_timeout
_COMMAND_TIMEOUT = 3.0  # seconds, for the counters' client (unless store_kwargs sets socket_timeout)
_LOCK_EXPIRY = 60.0  # seconds: a writer that died holding the lock frees it after this
_PUBLISH = """
local old = tonumber(redis.call('HGET', KEYS[1], 'length') or '0')
local new = math.max(old, tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'length', new)
if ARGV[4] == '1' then
  local writes = tonumber(redis.call('HGET', KEYS[1], 'writes') or '0')
  if tonumber(ARGV[1]) > writes then redis.call('HSET', KEYS[1], 'writes', ARGV[1]) end
end
if ARGV[2] ~= '' then redis.call('HSETNX', KEYS[1], 'kind', ARGV[2]) end
if ARGV[3] ~= '' then redis.call('HSETNX', KEYS[1], 'tensorclass', ARGV[3]) end
return new
"""

# NOTE [store storages after a fork]: a forked child inherits the parent's TensorDictStore, whose event-loop
# thread does not exist in the child (a call would wait forever) and whose sockets the parent uses. The at-fork
# hook drops both in the child; the next call reconnects.
_LIVE: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for storage in list(_LIVE):
        storage._disconnect(close=False)


def _close_all() -> None:
    for storage in list(_LIVE):
        storage._disconnect()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all)  # before the interpreter tears the stores' event loops down


def _check_text(name: str, value, hint: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"`{name}` must be a non-empty str, got {value!r} ({type(value).__name__}). {hint}")
    return value


def _check_port(port) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(
            f"`port` must be an int (the server's TCP port, e.g. 6379), got {port!r} ({type(port).__name__})."
        )
    if not 1 <= port <= 65535:
        raise ValueError(f"`port` must be a TCP port in [1, 65535] (Redis listens on 6379 by default), got {port}.")
    return int(port)


def _check_db(db) -> int:
    if isinstance(db, bool) or not isinstance(db, int):
        raise TypeError(f"`db` must be an int (the database number, 0 by default), got {db!r} ({type(db).__name__}).")
    if db < 0:
        raise ValueError(f"`db` must be a database number >= 0 (Redis has 0..15 by default), got {db}.")
    return int(db)


def _check_store_kwargs(store_kwargs: dict) -> dict:
    if "batch_size" in store_kwargs:
        raise TypeError(
            "StoreStorage sets the store's batch_size itself ([max_size]); remove `batch_size` from the keyword "
            "arguments and pass the capacity as `max_size`."
        )
    td_id = store_kwargs.get("td_id")
    if td_id is not None:
        _check_text("td_id", td_id, "It names the storage on the server: processes that pass the same td_id share it.")
    prefix = store_kwargs.get("prefix", "tensordict")
    _check_text("prefix", prefix, "It is the namespace of the storage's keys on the server (default 'tensordict').")
    return dict(store_kwargs)


def _missing_modules() -> list[str]:
    missing = []
    if importlib.util.find_spec("redis") is None:
        missing.append("the `redis` package")
    try:
        found = importlib.util.find_spec("tensordict.store") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        missing.append("`tensordict.store`")
    return missing


def _kind_of(data) -> str:
    if is_tensorclass(data):
        return "tensorclass"
    if isinstance(data, TensorDictBase):
        return "tensordict"
    if isinstance(data, torch.Tensor):
        return "tensor"
    raise STORE_DATA_TYPE.error(cls=type(data).__name__)


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class StoreStorage(Storage):
    """A storage whose rows live on a Redis-compatible server (Redis, Dragonfly, KeyDB, ...), shared by every
    process that connects to it with the same ``td_id``.

    The data goes through :class:`tensordict.store.TensorDictStore`: one store of batch size ``[max_size]`` per
    storage, created at the first write from its first item (TensorDicts and tensorclasses register their keys
    as they are written; plain tensors go to one entry ``"_tensor"``). Reads fetch only the rows asked for. Several
    collector processes can write into one storage and a learner can sample from it: the length and the append
    position are counters on the server, and writes are serialized by a lock there, so writers never overwrite
    each other's new rows (see the "Many machines writing into one Redis server" section of the distributed docs
    page, and NOTE [store counters] in this module).

    Args:
        max_size (int): the capacity, in items.

    Keyword Args:
        backend (str): the kind of server, a label (``"redis"``, ``"dragonfly"``, ``"keydb"``): every such server
            speaks the same protocol. Defaults to ``"redis"``.
        host (str): the server's host name. Defaults to ``"localhost"``.
        port (int): the server's TCP port. Defaults to ``6379``.
        db (int): the database number on the server. Defaults to ``0``.
        compilable (bool): accepted for TorchRL compatibility; every read and write is a network call, which
            ``torch.compile`` does not trace. Defaults to ``False``.
        **store_kwargs: go to :class:`~tensordict.store.TensorDictStore` (``td_id``: the storage's name on the
            server, shared by the processes that pass it, a new UUID by default; ``prefix``, ``unix_socket_path``,
            ``device``, ``cache_metadata``) and to the ``redis`` client (``password``, ``username``, ``ssl``,
            ``socket_connect_timeout``, which defaults to 2 seconds here).

    Raises:
        ModuleNotFoundError: without the ``redis`` package or ``tensordict.store`` (TorchRL's message).
        ConnectionError: when no server answers at ``host``:``port`` (or the socket path), within the connect
            timeout; the message names the address and how to start a server.
        TypeError, ValueError: for arguments of the wrong type or range (``max_size``, ``port``, ``db``, ...).

    .. note:: The server keeps the rows after the storage is gone (until it is restarted or the keys deleted):
        another process, or a later run, reconnects to them by ``td_id``. ``empty()`` resets the length and the
        append position for every process; the bytes stay until overwritten.

    .. note:: Each process has its own sampler: a learner's sampler is not told of the rows other processes
        write (only the length changes), so use a sampler that draws from the length (:class:`RandomSampler`,
        :class:`SliceSampler`); a prioritized sampler sees only the writes of its own process.

    Examples:
        The example needs a server: ``redis-server --port 6379`` (or ``docker run -p 6379:6379 redis``).

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import ReplayBuffer, StoreStorage
        >>> storage = StoreStorage(1000, host="localhost", port=6379, td_id="my-buffer")  # doctest: +SKIP
        >>> rb = ReplayBuffer(storage=storage, batch_size=4)  # doctest: +SKIP
        >>> rb.extend(TensorDict(obs=torch.randn(10, 3), batch_size=[10]))  # doctest: +SKIP
        tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
        >>> learner = StoreStorage(1000, td_id="my-buffer")  # another process, another machine  # doctest: +SKIP
        >>> len(learner), learner[torch.tensor([0, 9])]["obs"].shape  # doctest: +SKIP
        (10, torch.Size([2, 3]))
    """

    def __init__(
        self,
        max_size: int,
        *,
        backend: str = "redis",
        host: str = "localhost",
        port: int = 6379,
        db: int = 0,
        compilable: bool = False,
        **store_kwargs,
    ):
        super().__init__(max_size, compilable=compilable)  # checks max_size and compilable
        self._backend = _check_text("backend", backend, "It names the kind of server, e.g. 'redis' or 'dragonfly'.")
        self._host = _check_text("host", host, "Pass the server's host name or address, e.g. 'localhost'.")
        self._port = _check_port(port)
        self._db = _check_db(db)
        store_kwargs = _check_store_kwargs(store_kwargs)
        missing = _missing_modules()
        if missing:
            raise STORE_MISSING.error(missing=" and ".join(missing))
        self._td_id: str = store_kwargs.pop("td_id", None) or str(uuid.uuid4())
        self._store_kwargs = store_kwargs
        self._init_local()
        _LIVE.add(self)
        self._server()  # connects now: a wrong address fails here, with its fix

    # -- connection ---------------------------------------------------------------------------------------------
    def _init_local(self) -> None:
        """The process-local state: the clients (opened on use) and the items' type seen here."""
        self._client = None  # a redis.Redis for the counters and the lock
        self._store = None  # the TensorDictStore, opened at the first write or read
        self._publish = None
        self._tensorclass: type | None = None
        self._item_kind: str | None = None  # "tensordict", "tensor" or "tensorclass", once known here
        self._writer_index = None  # during write_rows: the writer's whole index of the write
        self._local_lock = threading.RLock()

    @property
    def _address(self) -> str:
        path = self._store_kwargs.get("unix_socket_path")
        return f"unix socket {path}" if path else f"{self._host}:{self._port}"

    def _redis_options(self) -> dict[str, Any]:
        options = {k: v for k, v in self._store_kwargs.items() if k not in _STORE_OWN}
        options.setdefault("socket_connect_timeout", _CONNECT_TIMEOUT)
        return options

    def _key(self, suffix: str) -> str:
        """A server key of this storage, under the store's hash tag (one Redis Cluster slot for all of them)."""
        return f"{self._store_kwargs.get('prefix', 'tensordict')}:{{{self._td_id}}}:{suffix}"

    def _server(self):
        """The synchronous client of the counters and the lock, connected (and pinged) on first use."""
        client = self._client
        if client is not None:
            return client
        import redis

        path = self._store_kwargs.get("unix_socket_path")
        where = {"unix_socket_path": path} if path else {"host": self._host, "port": self._port}
        options = self._redis_options()
        options.setdefault("socket_timeout", _COMMAND_TIMEOUT)  # small commands only: a silent peer fails fast
        client = redis.Redis(db=self._db, **where, **options)
        probe = redis.Redis(db=self._db, **where, **{**options, "retry": None})  # one try: fails fast
        try:
            probe.ping()
        except redis.exceptions.ResponseError as err:
            client.close()
            raise ConnectionError(
                f"The {self._backend} server at {self._address} refused db {self._db} ({err}): pass a `db` the "
                f"server has (0..15 by default) and its credentials (`password=`, `username=`) if it needs them."
            ) from err
        except (redis.exceptions.RedisError, OSError) as err:  # refused, timed out, not a Redis server
            client.close()
            raise ConnectionError(
                f"StoreStorage cannot reach a {self._backend} server at {self._address} (db {self._db}): {err}. "
                f"Start one (e.g. `redis-server --port {self._port}`) or pass the `host` and `port` of a running "
                f"server (and its `password=` if it needs one)."
            ) from err
        finally:
            probe.close()
        self._client = client
        self._publish = client.register_script(_PUBLISH)
        return client

    def _open_store(self):
        """The TensorDictStore of the rows (the same keys in every process that uses this ``td_id``)."""
        if self._store is None:
            from tensordict.store import TensorDictStore

            kwargs = dict(self._store_kwargs)
            kwargs.setdefault("socket_connect_timeout", _CONNECT_TIMEOUT)
            self._store = TensorDictStore(
                batch_size=[self.max_size], backend=self._backend, host=self._host, port=self._port, db=self._db,
                td_id=self._td_id, **kwargs,
            )  # fmt: skip
        return self._store

    def _disconnect(self, close: bool = True) -> None:
        store, client = self._store, self._client
        self._store = self._client = self._publish = None
        if close:
            if store is not None:
                store.close()
            if client is not None:
                client.close()

    def close(self) -> None:
        """Closes this process's connections to the server (the rows stay there); the next call reconnects."""
        self._disconnect()

    def _state(self) -> dict[str, str]:
        raw = self._server().hgetall(self._key("__storage__"))
        return {_text(k): _text(v) for k, v in raw.items()}

    def _server_lock(self):
        return self._server().lock(
            self._key("__storage_lock__"), timeout=_LOCK_EXPIRY, sleep=0.001, blocking_timeout=_LOCK_EXPIRY
        )

    # -- writes ---------------------------------------------------------------------------------------------------
    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Writes one item at an int ``cursor``, or a batch at a 1-D index (tensor, list, range, slice).

        With ``set_cursor`` (the default), the length grows to cover the rows written; ``set_cursor=False``
        (``storage[index] = value``) writes rows that hold data already and moves nothing.
        """
        self._write(cursor, data, set_cursor, reserve=False)

    def write_rows(self, rows, data, *, counted=None, **kwargs):
        """A writer's write (see :meth:`Storage.write_rows`); a ring writer's append goes at the rows the server
        reserves, which replace the writer's in ``counted`` (NOTE [store counters])."""
        self._writer_index = counted
        try:
            super().write_rows(rows, data, counted=counted, **kwargs)
        finally:
            self._writer_index = None

    def _write_rows(self, rows, data, set_cursor: bool, ring) -> None:
        reserve = set_cursor and (ring is not None or is_int(rows))
        self._write(rows, data, set_cursor, reserve=reserve, whole=self._writer_index)

    def _write(self, cursor, data, set_cursor: bool, reserve: bool, whole=None) -> None:
        kind = _kind_of(data)
        single = is_int(cursor)
        if single:
            rows = torch.tensor([int(cursor)])
        else:
            if isinstance(cursor, slice):
                cursor = range(*cursor.indices(self.max_size))
            rows = as_index_tensor(cursor)
        n = rows.numel()
        td = self._as_td(data, kind, single, n)
        if not reserve:
            rows = check_bounds(rows.clone(), self.max_size, "cursor")
        with self._local_lock, self._server_lock():
            state = self._state()
            saved = state.get("kind")
            if saved is not None and saved != kind:
                raise TypeError(
                    f"This StoreStorage (td_id={self._td_id!r}) holds {saved} items on the server; got a {kind}. "
                    f"Write {saved} items, or use another td_id. Nothing was written."
                )
            if not set_cursor and n:
                filled = int(state.get("length", 0))
                if int(rows.max()) >= filled:
                    raise IndexError(
                        f"Item assignment writes rows that hold data (0 to {filled - 1}); got rows up to "
                        f"{int(rows.max())}. Use set() or a buffer's extend() to write new rows. Nothing was written."
                    )
            if reserve and n:
                # a write larger than the storage keeps its last rows: the whole index counts
                total = whole.numel() if isinstance(whole, torch.Tensor) and whole.numel() >= n else n
                start = self._server().hincrby(self._key("__storage__"), "writes", total) - total
                every = (torch.arange(start, start + total) % self.max_size).to(rows.dtype)
                placed = every[total - n :]
                if not torch.equal(rows, placed):
                    self._place(whole if total > n else cursor, every, rows, placed, data)
                rows, reached = placed, min(start + total, self.max_size)
            else:
                reached = int(rows.max()) + 1 if n else 0
            if n:
                self._open_store()[rows] = td
            self._item_kind = kind
            if kind == "tensorclass":
                self._tensorclass = type(data)
            if set_cursor and n:
                tc = self._tensorclass
                self._publish(
                    keys=[self._key("__storage__")],
                    args=[reached, kind, "" if tc is None else f"{tc.__module__}.{tc.__qualname__}",
                          "0" if reserve else "1"],  # a write at given rows moves the append position past them
                )

    @staticmethod
    def _place(index, every, rows, placed, data) -> None:
        """Hands the rows the server reserved to the writer: into the index it passed (so that it returns them and
        tells its sampler), and into the ``"index"`` entry that a TensorDict writer stored in the data."""
        if isinstance(data, TensorDictBase) and "index" in data.keys():  # first: `rows` may be `index`
            entry = data.get("index")
            if isinstance(entry, torch.Tensor) and entry.shape[:1] == rows.shape:
                view = rows.reshape(-1, *[1] * (entry.ndim - 1))
                if torch.equal(entry, view.expand_as(entry)):
                    entry.copy_(placed.reshape(view.shape).expand_as(entry))
        if isinstance(index, torch.Tensor) and index.shape == every.shape:
            index.copy_(every)

    def _as_td(self, data, kind: str, single: bool, n: int) -> TensorDictBase:
        """The data as a TensorDict of batch size ``[n]`` (the form the store writes)."""
        if kind == "tensor":
            td = TensorDict({_TENSOR_KEY: data}, batch_size=[])
            td.batch_size = data.shape[:1] if not single else []
        else:
            td = data.to_tensordict() if kind == "tensorclass" else data
        if single:
            td = td.unsqueeze(0)
        if not td.batch_size or td.batch_size[0] != n:
            raise ValueError(
                f"{n} rows were given for data of batch size {list(td.batch_size)}: pass as many rows as items "
                f"(the first dim of the data). Nothing was written."
            )
        return td

    # -- reads ------------------------------------------------------------------------------------------------------
    def _reader(self):
        """The store, opened from the server when this process has not written (a learner)."""
        if self._store is not None and self._item_kind is not None:
            return self._store
        state = self._state()
        if "kind" not in state:
            raise STORE_NOT_INITIALIZED.error(td_id=self._td_id, server=self._address)
        self._item_kind = state["kind"]
        if state["kind"] == "tensorclass" and self._tensorclass is None:
            self._tensorclass = _import_class(state.get("tensorclass"))
        return self._open_store()

    def get(self, index):
        """The item at an int, or the items at a slice or a 1-D index, read from the server."""
        if isinstance(index, tuple):
            if len(index) != 1:
                raise IndexError(f"A StoreStorage is indexed along one dimension; got a tuple of {len(index)}.")
            index = index[0]
        store = self._reader()
        n = len(self)
        if is_int(index):
            return self._read(store, torch.tensor([check_int(index, n)]), single=True)
        if isinstance(index, slice):
            index = range(*index.indices(n))
        return self._read(store, check_bounds(as_index_tensor(index), n), single=False)

    def read_rows(self, index):
        """:meth:`get` of rows drawn by a sampler (in bounds): no length read from the server."""
        if is_int(index):
            return self.get(index)
        return self._read(self._reader(), as_index_tensor(index), single=False)

    def _read(self, store, rows: torch.Tensor, single: bool):
        td = store[rows]
        if self._item_kind == "tensor":
            out = td.get(_TENSOR_KEY)
            return out[0] if single else out
        if single:
            td = td[0]
        if self._tensorclass is not None:
            return self._tensorclass.from_tensordict(td)
        return td

    def __len__(self) -> int:
        return int(self._server().hget(self._key("__storage__"), "length") or 0)

    def _empty(self) -> None:
        """Resets the length and the append position on the server, for every process (the bytes stay)."""
        with self._local_lock, self._server_lock():
            self._server().hset(self._key("__storage__"), mapping={"length": 0, "writes": 0})

    # -- state ------------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """TorchRL's keys: where the rows are (server, ``td_id``) and their count; not the rows (see :meth:`dumps`)."""
        state = self._state()
        return {
            "initialized": "kind" in state,
            "_len": int(state.get("length", 0)),
            "_backend": self._backend,
            "_host": self._host,
            "_port": self._port,
            "_db": self._db,
            "_store_kwargs": dict(self._store_kwargs),
            "_td_id": self._td_id,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Connects this storage to the server and ``td_id`` of ``state_dict`` (the rows stay where they are; a
        server that lost them gets the saved length back, and reads fail until rows are written)."""
        if not isinstance(state_dict, dict) or "_td_id" not in state_dict:
            raise TypeError(
                f"A StoreStorage state dict is what state_dict() returns (with '_td_id', '_host', '_port', ...); "
                f"got {type(state_dict).__name__}."
            )
        backend = _check_text("_backend", state_dict.get("_backend", self._backend), "")
        host = _check_text("_host", state_dict.get("_host", self._host), "")
        port = _check_port(state_dict.get("_port", self._port))
        db = _check_db(state_dict.get("_db", self._db))
        kwargs = _check_store_kwargs(dict(state_dict.get("_store_kwargs") or {}))
        td_id = _check_text("_td_id", state_dict["_td_id"], "")
        length = check_int_field(state_dict.get("_len", 0), "_len", "The StoreStorage state", 0, self.max_size)
        self._disconnect()
        self._backend, self._host, self._port, self._db = backend, host, port, db
        self._store_kwargs, self._td_id = kwargs, td_id
        self._item_kind = self._tensorclass = None
        key = self._key("__storage__")
        if state_dict.get("initialized") and not self._server().exists(key):
            self._server().hset(key, mapping={"length": length, "writes": length})

    # -- checkpoint part (the protocol of torchrl.data.replay_buffers._checkpoint.parts) ------------------------------
    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        """The rows ``0 .. len - 1`` read from the server: tensor leaves as tensors, non-tensor entries (str, int,
        float, bool, None) as JSON lists; the server's address is not saved (a checkpoint loads anywhere)."""
        state = self._state()
        doc: dict[str, Any] = {"class": qualname(self), "max_size": self.max_size, "initialized": "kind" in state}
        if "kind" not in state:
            return {}, doc
        n = int(state.get("length", 0))
        td = self._reader()[torch.arange(n)] if n else TensorDict(batch_size=[0])
        where = f"the StoreStorage {self._td_id!r}"
        leaves, tensors, keys = [], {}, []
        for key, value in _ragged.td_leaves(td):
            if _ragged.is_json_leaf(value):
                values = _ragged.non_tensor_value(value, key, where)
                values = values["stack"] if isinstance(values, dict) and "stack" in values else [values] * n
                leaves.append({"key": list(key), "kind": "json", "values": values})
            else:
                keys.append(key)
                leaves.append({"key": list(key), "dtype": _io.dtype_name(value.dtype), "shape": list(value.shape)})
        names = iter(_io.leaf_names(keys))
        for leaf in leaves:
            if leaf.get("kind") != "json":
                leaf["tensor"] = ctx.name(f"storage/{next(names)}")
                tensors[leaf["tensor"]] = td.get(tuple(leaf["key"]))
        doc.update(kind=state["kind"], tensorclass=state.get("tensorclass"), rows=n, writes=int(state.get("writes", n)),
                   leaves=leaves)  # fmt: skip
        return tensors, doc

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        check_class(self, doc, "storage")
        if doc.get("max_size") != self.max_size:
            raise mismatch("the storage max_size", doc.get("max_size"), self.max_size, "Use the same max_size.")
        ctx.facts["storage_rows"] = self.max_size
        if not doc.get("initialized"):
            return
        where = f"The StoreStorage description in the checkpoint {ctx.path!r}"
        n = check_int_field(doc.get("rows"), "rows", where, 0, self.max_size, fix="It counts the rows saved.")
        check_int_field(doc.get("writes"), "writes", where, 0, fix="It counts the rows appended.")
        if doc.get("kind") not in _KINDS:
            raise CheckpointError(f"{where}: `kind` is {doc.get('kind')!r:.80}, not one of {_KINDS}. Nothing was loaded.")
        leaves = doc.get("leaves")
        if not isinstance(leaves, list):
            raise CheckpointError(f"{where}: `leaves` must be a list. Nothing was loaded.")
        for leaf in leaves:
            key = leaf.get("key") if isinstance(leaf, dict) else None
            if not (isinstance(key, list) and key and all(isinstance(k, str) for k in key)):
                raise CheckpointError(f"{where}: a leaf has no valid `key` ({leaf!r:.80}). Nothing was loaded.")
            if leaf.get("kind") == "json":
                _ragged.check_json_leaf(leaf, n, where)
                continue
            name = leaf.get("tensor")
            tensor = tensors.get(name) if isinstance(name, str) else None
            if tensor is None or list(tensor.shape) != leaf.get("shape") or not tensor.shape or tensor.shape[0] != n:
                raise CheckpointError(
                    f"{where}: the leaf {key} has no tensor of {n} rows with its saved shape {leaf.get('shape')!r:.80}. "
                    f"Nothing was loaded."
                )

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        """Writes the saved rows to the server under this storage's ``td_id`` (for every process using it)."""
        if not doc.get("initialized"):
            self._empty()
            return
        n = doc["rows"]
        td = TensorDict(batch_size=[n])
        for leaf in doc["leaves"]:
            key = tuple(leaf["key"])
            if leaf.get("kind") == "json":
                values = NonTensorStack.from_list([_ragged.from_json_value(v) for v in leaf["values"]])
                _ragged.set_json_leaf(td, key, values)
            else:
                td.set(key, tensors[leaf["tensor"]].as_subclass(torch.Tensor).clone())
        kind = doc["kind"]
        tc = _import_class(doc.get("tensorclass")) if kind == "tensorclass" else None
        with self._local_lock, self._server_lock():
            if n:
                self._open_store()[torch.arange(n)] = td
            key = self._key("__storage__")
            self._server().hset(key, mapping={"length": n, "writes": doc["writes"], "kind": kind})
            if tc is not None:
                self._server().hset(key, "tensorclass", doc["tensorclass"])
        self._tensorclass, self._item_kind = tc, kind

    # -- pickling ---------------------------------------------------------------------------------------------------
    def __getstate__(self):
        state = super().__getstate__()
        for name in ("_client", "_store", "_publish", "_local_lock", "_writer_index"):
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        tensorclass = state.get("_tensorclass")
        super().__setstate__(state)
        self._init_local()  # connects on first use
        self._tensorclass = tensorclass
        _LIVE.add(self)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_size={self.max_size}, backend={self._backend!r}, server={self._address!r}, "
            f"db={self._db}, td_id={self._td_id!r})"
        )


def _import_class(path: str | None) -> type | None:
    """The tensorclass named ``module.qualname`` (imported), or ``None`` when it cannot be found here (items are
    then read as TensorDicts)."""
    if not path or "." not in path:
        return None
    module, _, name = path.rpartition(".")
    while module:
        try:
            obj = importlib.import_module(module)
        except ImportError:
            module, _, head = module.rpartition(".")
            name = f"{head}.{name}"
            continue
        for part in name.split("."):
            obj = getattr(obj, part, None)
        return obj if isinstance(obj, type) else None
    return None
