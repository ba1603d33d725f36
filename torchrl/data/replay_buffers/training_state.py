"""A run checkpoint: the replay buffer, the DataLoader's position and the random state, saved together.

:func:`save_training_state` writes one checkpoint directory in the replay-buffer format
(:mod:`torchrl.data.replay_buffers.checkpointers`: tensor files plus JSON, no pickle, a schema version, written
aside and switched in atomically), and :func:`load_training_state` restores all of it. The buffer is saved
exactly as ``rb.dumps(path)`` saves it, so ``rb.loads(path)`` also reads such a checkpoint. Its metadata adds::

    "training_state": {"version": 1, "buffer_length": ..., "loader": {"class": ..., "num_workers": ...,
                       "state": <the loader's state_dict, encoded>} | null,
                       "rng": <torch's global generator state>, "loader_generator": ... | null,
                       "numpy_rng": {"keys": <int64 [624]>, "pos": int, "has_gauss": int,
                                     "cached_gaussian": float} (numpy's global MT19937 state),
                       "extra": <the caller's state, encoded> | null}

where an encoded state is the JSON tree of :mod:`torchrl.data.replay_buffers._checkpoint.parts` (its tensors are
files under ``training/``) and ``bytes`` become uint8 tensors.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import torchrl.data.replay_buffers._checkpoint.parts as _persistence
from torchrl.data.replay_buffers._checkpoint.args import check_path
from torchrl.data.replay_buffers._checkpoint.format import dump_parts, load_context
from torchrl.data.replay_buffers.checkpointers import read_checkpoint
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.loading.resume_state import check_loader_state

__all__ = ["load_training_state", "save_training_state"]

TRAINING_STATE_VERSION = 1
_BYTES = "torchrl.bytes"  # marks a bytes value turned into a uint8 tensor


def _bytes_to_tensors(value):
    if isinstance(value, (bytes, bytearray)):
        return {
            _BYTES: torch.frombuffer(bytearray(value), dtype=torch.uint8)
            if value
            else torch.zeros(0, dtype=torch.uint8)
        }
    if isinstance(value, Mapping) and not isinstance(value, torch.Tensor):
        return {k: _bytes_to_tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        items = [_bytes_to_tensors(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _tensors_to_bytes(value):
    if isinstance(value, dict):
        if value.keys() == {_BYTES} and isinstance(value[_BYTES], torch.Tensor):
            return value[_BYTES].numpy().tobytes()
        return {k: _tensors_to_bytes(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_tensors_to_bytes(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _encode(value, tensors: dict, prefix: str, where: str):
    return _persistence.encode_state(_bytes_to_tensors(value), tensors, prefix, where)


def _decode(node, tensors: Mapping):
    return _tensors_to_bytes(_persistence.decode_state(node, tensors))


def _check_loader(loader) -> None:
    if loader is None:
        return
    if not (
        callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))
    ):
        raise TypeError(
            f"`loader` must have state_dict() and load_state_dict() (torchdata's StatefulDataLoader); got a "
            f"{type(loader).__name__}. A torch.utils.data.DataLoader has no state to save: use "
            f"torchdata.stateful_dataloader.StatefulDataLoader (same arguments), or save at an epoch boundary "
            f"without `loader` (the buffer and the random state then give the same next epochs)."
        )


def _check_buffer(rb) -> None:
    if rb is not None and not (callable(getattr(rb, "loads", None)) and hasattr(rb, "write_lock")):
        raise TypeError(
            f"`rb` must be a replay buffer or a storage (with write_lock and loads()); got a {type(rb).__name__}."
        )


def _length(rb) -> int:
    storage = getattr(rb, "storage", rb)  # a buffer, or a storage read through storage.as_dataset()
    return len(storage)


def _check_buffer_length(path: str, length, rb) -> None:
    """Raises a ``CheckpointError`` unless the saved ``buffer_length`` is an int that the storage of ``rb`` (whose
    capacity the buffer's own check matched against the checkpoint's) can hold: the loader's readers are checked
    against it, so a crafted length would let a reader state of more items than the buffer holds through."""
    capacity = getattr(getattr(rb, "storage", rb), "max_size", None)
    if isinstance(length, int) and not isinstance(length, bool) and length >= 0:
        if not isinstance(capacity, int) or length <= capacity:
            return
    raise CheckpointError(
        f"The training state at {os.fspath(path)!r} has `buffer_length` {length!r:.80}, expected an int in "
        f"[0, {capacity}] (the length of the saved buffer, at most its storage's max_size). Save the run again "
        f"with save_training_state. Nothing was loaded."
    )


def _warn_if_inexact(rb, loader) -> None:
    """Warns when the resume cannot be exact: a shared sampler state that workers change as they draw ahead.

    A sampler without replacement draws by number in the workers (``planned_draw``, NOTE [planned epochs] in
    ``samplers/_shared_epoch.py``): its shared state only records the iteration's plan, which the workers do not
    move, so the saved state and the loader's positions agree. A prioritized sampler cannot: its priorities
    change with ``update_priority`` from the training loop while the workers draw the next batches from them
    (prefetching ``prefetch_factor`` batches each), so which priorities a drawn-ahead batch saw depends on
    timing, and a resumed run redraws those batches from the saved priorities.
    """
    sampler = getattr(rb, "sampler", None)
    reads_the_sampler = hasattr(getattr(loader, "dataset", None), "replay_buffer")  # not a StorageDataset
    if not (
        getattr(sampler, "requires_shared_state", False)
        and getattr(loader, "num_workers", 0)
        and reads_the_sampler
    ):
        return
    if callable(getattr(sampler, "planned_draw", None)):
        return
    warnings.warn(
        f"save_training_state: the buffer's sampler {type(sampler).__name__} keeps one state shared by the "
        f"DataLoader workers, which draw batches ahead of the training loop from the state as it is then (e.g. "
        f"priorities updated by the training loop meanwhile). The resumed run redraws the batches drawn ahead "
        f"and not yet yielded from the saved state, so they may differ from the uninterrupted run's. Exact "
        f"resume needs num_workers=0, a stateless sampler (RandomSampler, SliceSampler) or a sampler without "
        f"replacement.",
        UserWarning,
        stacklevel=3,
    )


def save_training_state(
    path, *, rb=None, loader=None, extra: Mapping | None = None, fsync: bool = True
) -> None:
    """Saves a training run's data state to the directory ``path``, atomically: the replay buffer, the
    DataLoader's position and random streams, torch's global random state and ``extra``.

    Call it between two training steps (after the step that used the last batch): a run resumed with
    :func:`load_training_state` then yields exactly the batches the uninterrupted run yields next, across
    epoch boundaries, with any number of workers (see :ref:`resuming-training` for the conditions). The
    format is the buffer checkpoint format: tensor files and JSON, never pickle, written aside and switched in
    atomically, so a crash during the save leaves the previous checkpoint at ``path`` loadable.

    Args:
        path (str or path-like): the checkpoint directory; a previous checkpoint there is replaced.

    Keyword Args:
        rb (ReplayBuffer, optional): the buffer: content, sampler, writer, transforms, generator. Saved as
            ``rb.dumps(path)`` would. A storage read through ``storage.as_dataset()`` may be passed instead.
            Defaults to ``None``.
        loader (StatefulDataLoader, optional): torchdata's ``StatefulDataLoader`` reading the buffer (or a
            storage); its ``state_dict()`` holds each worker's position and stream. Defaults to ``None``.
        extra (mapping, optional): more state to keep with it (a step count, ``model.state_dict()``,
            ``optimizer.state_dict()``...): tensors, numbers, strings, ``bytes``, ``None`` and lists, tuples and
            dicts of those; returned by :func:`load_training_state`. Defaults to ``None``.
        fsync (bool): flush to the disk before and after the switch (see
            :func:`~torchrl.data.replay_buffers.checkpointers.write_checkpoint`). Defaults to ``True``.

    Raises:
        TypeError: if ``loader`` has no state API (a plain ``DataLoader``), ``rb`` is not a buffer, or ``extra``
            holds something that would need pickle.

    Examples:
        >>> import os, tempfile, torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, load_training_state, save_training_state
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(16), batch_size=4, generator=torch.Generator())
        >>> _ = rb.extend(torch.arange(16))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     save_training_state(os.path.join(d, "run"), rb=rb, extra={"step": 10})
        ...     expected = rb.sample()
        ...     fresh = ReplayBuffer(storage=LazyTensorStorage(16), batch_size=4, generator=torch.Generator())
        ...     extra = load_training_state(os.path.join(d, "run"), rb=fresh)
        >>> extra["step"], torch.equal(fresh.sample(), expected)
        (10, True)
    """
    path = check_path(path)
    _check_buffer(rb)
    _check_loader(loader)
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"`extra` must be a mapping (e.g. a dict) or None; got a {type(extra).__name__}.")
    if not isinstance(fsync, bool):
        raise TypeError(f"`fsync` must be a bool; got {fsync!r}.")
    _warn_if_inexact(rb, loader)
    tensors: dict[str, torch.Tensor] = {}
    metadata: dict[str, Any] = {}
    lock = contextlib.nullcontext() if rb is None else rb.write_lock
    loader_doc = None
    if loader is not None:
        loader_doc = {
            "class": _persistence.qualname(loader),
            "num_workers": getattr(loader, "num_workers", None),
            "state": _encode(loader.state_dict(), tensors, "training/loader/", "loader.state_dict()"),
        }
    generator = getattr(loader, "generator", None)
    metadata["training_state"] = {
        "version": TRAINING_STATE_VERSION,
        "buffer_length": None,
        "loader": loader_doc,
        "rng": _encode(torch.get_rng_state(), tensors, "training/rng/", "torch.get_rng_state()"),
        "loader_generator": None
        if generator is None
        else _encode(generator.get_state(), tensors, "training/loader_generator/", "loader.generator"),
        "extra": None if extra is None else _encode(dict(extra), tensors, "training/extra/", "extra"),
        "numpy_rng": _numpy_state_doc(tensors),
    }

    def build(ctx):  # may run twice (a full dump after an incremental one found a file gone): copies each time
        built_tensors, built = dict(tensors), dict(metadata)
        if rb is not None:
            buffer_tensors, built["component"] = _persistence.dump_part(rb, ctx)
            built["training_state"] = {**metadata["training_state"], "buffer_length": _length(rb)}
            built_tensors.update(buffer_tensors)
        return built_tensors, built

    with lock:  # writers of a shared storage (other processes too) wait until the buffer's files are written
        dump_parts(path, build, fsync=fsync)  # onto an earlier state of this buffer: only the rows written since


def _training_doc(path: str, metadata: dict) -> dict:
    doc = metadata.get("training_state")
    if not isinstance(doc, dict):
        raise CheckpointError(
            f"The checkpoint at {path!r} holds no training state: it was not written by save_training_state "
            f"(a buffer saved with rb.dumps loads with rb.loads)."
        )
    if doc.get("version") != TRAINING_STATE_VERSION:
        raise CheckpointError(
            f"The training state at {path!r} has version {doc.get('version')!r}; this version of torchrl reads "
            f"version {TRAINING_STATE_VERSION}."
        )
    return doc


def _numpy_state_doc(tensors: dict) -> dict:
    """numpy's global generator state (a prioritized sampler without a generator draws from it, as TorchRL's)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["training/numpy_rng/keys"] = torch.from_numpy(keys.astype(np.int64))
    return {"kind": kind, "keys": "training/numpy_rng/keys", "pos": int(pos), "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached)}  # fmt: skip


def _numpy_state(path: str, doc, tensors: dict):
    """The state for ``np.random.set_state`` saved as ``doc`` (None for a checkpoint saved without it); a
    ``CheckpointError`` when a generator would refuse it or it is not MT19937's 624 words and position."""
    if doc is None:
        return None
    problem = None
    try:
        keys = tensors[doc["keys"]]
        state = (doc["kind"], keys.numpy().astype(np.uint32), doc["pos"], doc["has_gauss"], doc["cached_gaussian"])
        ints = (doc["pos"], doc["has_gauss"])
        if doc["kind"] != "MT19937" or keys.dtype != torch.int64 or list(keys.shape) != [624]:
            problem = f"it must be MT19937's 624 words, got {doc['kind']!r} with {keys.dtype} {list(keys.shape)}"
        elif keys.min() < 0 or keys.max() >= 1 << 32:
            problem = "its words must be 32-bit unsigned values"
        elif not all(isinstance(v, int) and not isinstance(v, bool) for v in ints) or not 0 <= doc["pos"] <= 624:
            problem = f"its position must be an int in [0, 624], got {doc['pos']!r}"
        else:
            np.random.RandomState().set_state(state)  # a scratch generator: raises if numpy refuses it
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        problem = f"numpy refuses it ({type(err).__name__}: {err})"
    if problem is not None:
        raise CheckpointError(
            f"The training state at {os.fspath(path)!r} holds an invalid random state `numpy_rng`: {problem}. Save "
            f"the run again with save_training_state, or pass restore_rng=False to load the rest. Nothing was loaded."
        )
    return state


def _check_generator_state(path: str, field: str, state, scratch: torch.Generator) -> None:
    """Raises a ``CheckpointError`` unless ``state`` can be set on a generator like ``scratch`` (a new one)."""
    problem = None
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.dim() != 1:
        found = (
            f"a {state.dtype} tensor of shape {list(state.shape)}"
            if isinstance(state, torch.Tensor)
            else f"a {type(state).__name__}: {state!r:.80}"
        )
        problem = f"it must be a 1-D uint8 tensor (torch.get_rng_state()), got {found}"
    else:
        try:
            scratch.set_state(state.as_subclass(torch.Tensor).detach().cpu().clone())
        except (RuntimeError, TypeError, ValueError) as err:
            problem = f"a {scratch.device} generator refuses its {state.numel()} bytes ({err})"
    if problem is not None:
        raise CheckpointError(
            f"The training state at {os.fspath(path)!r} holds an invalid random state `{field}`: {problem}. Save the "
            f"run again with save_training_state, or pass restore_rng=False to load the rest. Nothing was loaded."
        )


def load_training_state(path, *, rb=None, loader=None, restore_rng: bool = True) -> dict[str, Any]:
    """Restores what :func:`save_training_state` saved at ``path`` into ``rb`` and ``loader``; returns ``extra``.

    Everything is checked before anything is changed: the checkpoint (complete, uncorrupted, of a known
    version), the buffer (built with the saved configuration), and the loader (the saved number of workers;
    for each worker, the dataset's batch size, ``num_batches``, ranks, sampler and position), and the random
    states (each is set on a new generator first). Then the buffer is loaded,
    the loader's state is set and its iterator created (its workers start now), and torch's global random
    state (and the loader's ``generator``, if it has one) are restored, so that the next batches and the
    next epochs are those of the uninterrupted run.

    Args:
        path (str or path-like): a directory written by :func:`save_training_state`.

    Keyword Args:
        rb (ReplayBuffer, optional): the buffer to load, built as the saved one was. Defaults to ``None``.
        loader (StatefulDataLoader, optional): the loader to resume, built as the saved one was, over a
            dataset of ``rb`` (or of its storage). Defaults to ``None``.
        restore_rng (bool): restore torch's and numpy's global random states (and ``loader.generator``). Defaults to
            ``True``.

    Returns:
        the ``extra`` mapping given to :func:`save_training_state` (an empty dict if none was).

    Raises:
        FileNotFoundError: if there is no checkpoint at ``path``.
        CheckpointError: if the checkpoint is incomplete, corrupted, of an unknown version, lacks the part
            asked for (a buffer, a loader state), or holds a random state that a generator refuses (checked
            only with ``restore_rng=True``). Nothing is changed then.
        ValueError: if the buffer or the loader does not fit the saved state (the message names the
            difference: workers, batch size, ``num_batches``, buffer length...). Nothing is changed then.
        TypeError: if ``loader`` has no state API.

    Examples:
        >>> import os, tempfile, torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, load_training_state, save_training_state
        >>> with tempfile.TemporaryDirectory() as d:
        ...     save_training_state(os.path.join(d, "run"), extra={"step": 3, "weights": torch.ones(2)})
        ...     extra = load_training_state(os.path.join(d, "run"))
        >>> extra["step"], extra["weights"].tolist()
        (3, [1.0, 1.0])
    """
    path = check_path(path)
    _check_buffer(rb)
    _check_loader(loader)
    if not isinstance(restore_rng, bool):
        raise TypeError(f"`restore_rng` must be a bool; got {restore_rng!r}.")
    tensors, metadata = read_checkpoint(path)
    doc = _training_doc(path, metadata)
    ctx = load_context(path, metadata)
    try:
        if rb is not None:
            if not isinstance(metadata.get("component"), dict):
                raise CheckpointError(f"The training state at {path!r} holds no replay buffer; pass rb=None.")
            _persistence.check_part(rb, metadata["component"], tensors, ctx)
            _check_buffer_length(path, doc.get("buffer_length"), rb)
        loader_state = None
        if loader is not None:
            if doc.get("loader") is None:
                raise CheckpointError(
                    f"The training state at {path!r} holds no loader state; pass loader=None."
                )
            loader_state = _decode(doc["loader"]["state"], tensors)
            check_loader_state(loader, loader_state, doc.get("buffer_length") if rb is not None else None)
        extra = {} if doc.get("extra") is None else _decode(doc["extra"], tensors)
        rng = _decode(doc["rng"], tensors)
        loader_generator = (
            None if doc.get("loader_generator") is None else _decode(doc["loader_generator"], tensors)
        )
    except (KeyError, IndexError, AttributeError) as err:
        raise CheckpointError(
            f"The training state in the checkpoint at {os.fspath(path)!r} is malformed: {type(err).__name__}: {err}."
        ) from None
    numpy_rng = None
    if restore_rng:  # checked on scratch generators: the global one and the loader's are set last
        _check_generator_state(path, "rng", rng, torch.Generator())
        numpy_rng = _numpy_state(path, doc.get("numpy_rng"), tensors)
        generator = getattr(loader, "generator", None)
        if generator is not None and loader_generator is not None:
            _check_generator_state(
                path, "loader_generator", loader_generator, torch.Generator(device=generator.device)
            )
    # nothing was changed so far; from here on, every part has been checked
    if rb is not None:
        rb.loads(path)  # under the buffer's locks; validates the same checkpoint again
    if loader is not None:
        loader.load_state_dict(loader_state)
        loader.state_dict()  # creates the resumed iterator now: its seed draws happen before the RNG is restored
    if restore_rng:
        torch.set_rng_state(rng)
        if numpy_rng is not None:
            np.random.set_state(numpy_rng)
        generator = getattr(loader, "generator", None)
        if generator is not None and loader_generator is not None:
            generator.set_state(loader_generator)
    return extra
