"""Where one reader of a :class:`~torchrl.data.ReplayBufferDataset` is: its random stream and its position.

NOTE [ Exact resume of a replay-buffer DataLoader ]

torchdata's ``StatefulDataLoader`` asks the dataset for ``state_dict()`` in the process that iterates it (each
worker after each batch it produces, or the main process when ``num_workers=0``) and, on resume, calls
``load_state_dict(state)`` in that same process *before* iterating. A reader (one worker of one rank, see
``_ranks.py``) is at an exact point of its share of the epoch when we know:

- ``draws``: how many sampling calls of its quota it completed this epoch;
- its random stream: the generator the buffer draws through in this reader, plus torch's global generator in
  a worker (transforms draw from it). In a worker and in a multi-rank main process the dataset owns that
  generator (:meth:`ReaderPosition.begin_epoch` gives the buffer copy one); in the main process of a single
  rank the buffer draws as ``rb.sample()`` does, and its generator is restored with the buffer's checkpoint
  (``load_training_state``);
- for a subclass whose ``items()`` splits a draw into several items: the items of the current draw already
  yielded, and the stream *before* that draw, so that a resume redraws it and skips them;
- ``iterations``: how many iterations this reader began (a persistent worker iterates once per DataLoader
  iteration). A sampler that draws by number (NOTE [planned epochs] in ``samplers/_shared_epoch.py``) keys an
  iteration by torch's base seed and this count, and numbers the reader's draws from ``draws``: so the
  restored position is all a worker needs to redraw its next batches, wherever the other workers are.

A reader begins an iteration when ``iter(dataset)`` is called, not at its first batch: a worker calls it when
it starts or restarts an iteration, and torchdata snapshots a persistent worker's state right then, at each new
iteration; a worker that has not produced a batch of the new iteration when a checkpoint is taken must be saved
as "iteration i + 1, no draw yet", not "iteration i, finished" (which is what a worker that finished its share of
iteration i mid-iteration is saved as).

The per-worker reseed at worker start (``prepare_worker_copy(seed)``) runs before
:meth:`ReaderPosition.begin_epoch`, which then applies a restored state over it: a restored stream always
wins over the fresh seed. A position never travels in a pickle (a worker copy starts fresh): the state
travels separately, through ``state_dict()``.

A shared-state sampler (one copy of its state for all readers) is not part of a reader's state: it is saved
once, with the buffer. The reader's state names it (class, shared or not) so that a mismatch is caught.
"""

from __future__ import annotations

from typing import Any

import torch

from torchrl.data.replay_buffers._checkpoint.generator_state import generator_from_state, generator_to_state
from torchrl.data.replay_buffers.loading.ranks import Reader, reader_seed

__all__ = ["STATE_FORMAT", "STATE_VERSION", "ReaderPosition", "check_reader_state"]

STATE_FORMAT = "torchrl-reader-state"
STATE_VERSION = 1


def _stream_state(generator: torch.Generator | None, in_worker: bool) -> dict[str, Any]:
    return {
        "generator": generator_to_state(generator, as_bytes=True),
        "global": torch.get_rng_state().numpy().tobytes() if in_worker else None,
    }


def _set_stream_state(generator: torch.Generator | None, state: dict[str, Any]) -> None:
    saved = generator_from_state(state["generator"])
    if generator is not None and saved is not None:
        generator.set_state(saved.get_state())
    if state["global"] is not None:
        torch.set_rng_state(torch.frombuffer(bytearray(state["global"]), dtype=torch.uint8))


class ReaderPosition:
    """The stream and the position of the reader that iterates a dataset in this process."""

    def __init__(self):
        self.reader: Reader | None = None
        self.generator: torch.Generator | None = None
        self.draws = 0
        self.iterations = 0
        self.items_done = 0
        self.before_draw: dict[str, Any] | None = None
        self.restored: dict[str, Any] | None = None

    def __reduce__(self):  # a copy sent to a worker (or deep-copied) starts fresh
        return (type(self), ())

    @property
    def started(self) -> bool:
        return self.reader is not None

    @property
    def in_worker(self) -> bool:
        return self.reader is not None and self.reader.worker is not None

    # -- iteration ---------------------------------------------------------------------------------------------
    def begin_epoch(self, buffer, reader: Reader) -> None:
        """Called when this process starts iterating: the first time, sets up the reader's stream; then applies
        a restored state, or starts the epoch from draw 0."""
        if self.reader is None:
            self.reader = reader
            if reader.worker is not None:
                seed = reader_seed(reader.worker_seed, reader.rank, reader.world_size)
                self.generator = torch.Generator().manual_seed(seed)
                buffer.set_rng(self.generator)  # the worker's private copy: the dataset owns its stream
                if reader.world_size > 1:
                    # the worker's own global generator (transforms), distinct per rank
                    torch.manual_seed(seed)
            elif reader.world_size > 1:
                seed = reader_seed(torch.initial_seed(), reader.rank, reader.world_size)
                self.generator = torch.Generator().manual_seed(seed)
                buffer.set_rng(self.generator)
        restored, self.restored = self.restored, None
        if restored is None:
            self.draws, self.items_done, self.before_draw = 0, 0, None
            self.iterations += 1
            return
        self.draws, self.items_done = restored["draws"], restored["items_done"]
        self.iterations = restored.get("iterations", 1)
        self.before_draw = restored["before_draw"]
        _set_stream_state(self.generator, restored["stream"])

    def start_draw(self) -> int:
        """Before a draw: returns how many of its items were already yielded (a restored mid-draw position,
        whose stream is rewound to before the draw), and records the stream for a later mid-draw state."""
        skip = self.items_done
        if skip and self.before_draw is not None:
            _set_stream_state(self.generator, self.before_draw)
        elif skip:  # the main process of a single rank has no stream of its own to rewind
            skip = self.items_done = 0
        self.before_draw = (
            _stream_state(self.generator, self.in_worker) if self.generator is not None else None
        )
        return skip

    def item_yielded(self, index: int, count: int) -> None:
        """Records that item ``index`` of ``count`` of the current draw is about to be yielded."""
        if index + 1 >= count:
            self.draws += 1
            self.items_done, self.before_draw = 0, None
        else:
            self.items_done = index + 1

    def draw_was_empty(self) -> None:
        self.draws += 1
        self.items_done, self.before_draw = 0, None

    # -- state -------------------------------------------------------------------------------------------------
    def state_dict(self, reader: Reader, config: dict[str, Any]) -> dict[str, Any]:
        """This reader's state; ``reader`` is the current process's (the position's own once started)."""
        started = self.started
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "reader": (self.reader if started else reader).describe(),
            **config,
            "started": started,
            "draws": self.draws if started else 0,
            "iterations": self.iterations if started else 0,
            "items_done": self.items_done if started else 0,
            "stream": _stream_state(self.generator, self.in_worker) if started else None,
            "before_draw": self.before_draw if started and self.items_done else None,
        }

    def load_state_dict(self, state: dict[str, Any], reader: Reader, config: dict[str, Any]) -> None:
        """Validates ``state`` against this reader and dataset (``config``); it is applied when the next
        iteration begins. A state saved before its reader started leaves the next epoch fresh."""
        check_reader_state(state, reader, config)
        self.restored = state if state["started"] else None


def _mismatch(what: str, saved, here, fix: str) -> ValueError:
    return ValueError(
        f"Cannot resume this ReplayBufferDataset: the loader state was saved with {what} {saved!r}, and this "
        f"run has {here!r}. {fix}"
    )


def check_reader_state(state, reader: Reader, config: dict[str, Any]) -> None:
    """Raises a ``ValueError`` naming the first difference between a saved reader state and this reader and
    dataset (workers, ranks, batch size, number of batches, buffer length, sampler), or the first field of its
    position that cannot be applied (counts, random streams)."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"`state_dict` is not a ReplayBufferDataset reader state (a dict with format {STATE_FORMAT!r}); got "
            f"{state!r:.200}. Pass what ReplayBufferDataset.state_dict() returned (StatefulDataLoader does)."
        )
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"This reader state has version {state.get('version')!r}; this version of torchrl reads version "
            f"{STATE_VERSION}."
        )
    saved_reader, here = state["reader"], reader.describe()
    if saved_reader["num_workers"] != here["num_workers"]:
        raise _mismatch(
            "num_workers",
            saved_reader["num_workers"],
            here["num_workers"],
            "Build the DataLoader with the saved number of workers.",
        )
    if saved_reader["world_size"] != here["world_size"]:
        raise _mismatch(
            "world_size",
            saved_reader["world_size"],
            here["world_size"],
            "Resume with the saved number of ranks.",
        )
    if saved_reader["rank"] != here["rank"] or saved_reader["worker"] != here["worker"]:
        raise _mismatch(
            "(rank, worker)",
            (saved_reader["rank"], saved_reader["worker"]),
            (here["rank"], here["worker"]),
            "Load each rank's own loader state in that rank.",
        )
    for key, fix in (
        ("batch_size", "Build the buffer with the saved batch_size."),
        ("num_batches", "Build the dataset with the saved num_batches: rb.as_dataset(num_batches=...)."),
        ("sampler", "Build the buffer with the saved sampler."),
    ):
        if state.get(key) != config[key]:
            raise _mismatch(key, state.get(key), config[key], fix)
    if state["buffer_length"] > config["buffer_length"]:
        raise _mismatch(
            "a buffer of length",
            state["buffer_length"],
            config["buffer_length"],
            "Load the buffer saved with this state first (torchrl.data.load_training_state does both): the "
            "resumed draws would otherwise come from other data.",
        )
    _check_position(state)


def _bad_position(field: str, value, expected: str) -> ValueError:
    return ValueError(
        f"This reader state is malformed: `{field}` is {value!r:.200}, expected {expected}. Pass what "
        f"ReplayBufferDataset.state_dict() returned (StatefulDataLoader does), unmodified."
    )


def _check_stream(field: str, stream) -> None:
    """Raises a ``ValueError`` unless ``stream`` is a state that :func:`_set_stream_state` can apply."""
    if not isinstance(stream, dict) or stream.keys() != {"generator", "global"}:
        raise _bad_position(field, stream, "a dict with keys 'generator' and 'global'")
    try:
        generator_from_state(stream["generator"])  # a new generator: nothing of this process is touched
    except ValueError as err:
        raise _bad_position(
            f"{field}['generator']", stream["generator"], f"a generator state ({err})"
        ) from None
    raw = stream["global"]
    if raw is None:
        return
    if not isinstance(raw, (bytes, bytearray)):
        raise _bad_position(f"{field}['global']", raw, "None or the bytes of torch.get_rng_state()")
    try:
        torch.Generator().set_state(
            torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)
        )
    except (RuntimeError, TypeError, ValueError):
        raise _bad_position(
            f"{field}['global']",
            f"<{len(raw)} bytes>",
            f"the {torch.get_rng_state().numel()} bytes of torch.get_rng_state()",
        ) from None


def _check_position(state: dict) -> None:
    """Raises a ``ValueError`` naming the first field of a reader's position that :meth:`ReaderPosition.
    begin_epoch` could not apply: counts that are not non-negative ints, random streams a generator refuses."""
    started = state.get("started")
    if not isinstance(started, bool):
        raise _bad_position("started", started, "True or False")
    for field in ("draws", "iterations", "items_done"):
        value = state.get(field)
        if field == "iterations" and field not in state:  # optional: begin_epoch counts 1
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _bad_position(field, value, "an int >= 0")
    if not started:
        return
    _check_stream("stream", state.get("stream"))
    if state.get("before_draw") is not None:
        _check_stream("before_draw", state["before_draw"])


# -- a StatefulDataLoader's state, seen from the main process ------------------------------------------------------
def _dataset_states(loader_state: dict) -> tuple[int, list[tuple[int | None, Any]]]:
    """``(num_workers, [(worker, dataset state), ...])`` found in a ``StatefulDataLoader.state_dict()``."""
    snapshot = loader_state.get("_snapshot")
    if snapshot is None:  # single process
        return 0, [(None, loader_state.get("dataset_state"))]
    num_workers = snapshot["_main_snapshot"]["_num_workers"]
    workers = snapshot.get("_worker_snapshots", {})
    return num_workers, [
        (i, (workers.get(f"worker_{i}") or {}).get("dataset_state")) for i in range(num_workers)
    ]


def check_loader_state(loader, loader_state, buffer_length: int | None) -> None:
    """Raises a ``ValueError`` naming the difference when ``loader_state`` (a ``StatefulDataLoader`` state)
    cannot resume ``loader``: another number of workers, or a worker state its dataset refuses
    (``dataset.check_state_dict``). ``buffer_length`` is the length the buffer will have once loaded."""
    if not isinstance(loader_state, dict):
        raise ValueError(f"The saved loader state is not a dict: {loader_state!r:.200}.")
    saved_workers, states = _dataset_states(loader_state)
    here = getattr(loader, "num_workers", None)
    if here is not None and saved_workers != here:
        raise ValueError(
            f"Cannot resume this loader: its state was saved with num_workers={saved_workers}, and this loader "
            f"has num_workers={here}. Build the loader with num_workers={saved_workers}."
        )
    check = getattr(getattr(loader, "dataset", None), "check_state_dict", None)
    if check is None:
        return
    for worker, state in states:
        if state is not None:
            check(state, worker=worker, num_workers=saved_workers, buffer_length=buffer_length)
