"""Every exception class of the replay-buffer package, in one place.

Each is re-exported where TorchRL or our docs name it (``EpochEnded`` from ``samplers``, ``CheckpointError`` from
``checkpointers``, ``TornReadError`` from ``torchrl.data``). ``TypeRuntimeError``, ``ValueRuntimeError`` and
``FileExistsRuntimeError`` are our precise type and the ``RuntimeError`` TorchRL raises in the same case: code
written for TorchRL catches ``RuntimeError``, code written for us the precise type, and the messages stay ours.
(TorchRL names this package does not provide raise ``torchrl.data._torchrl_names.NotProvidedError``.)
"""

from __future__ import annotations

#: Exported from ``torchrl.data``; the others are raised as (and caught by) their built-in bases.
__all__ = ["CheckpointError", "TornReadError", "EpochEnded"]


class TypeRuntimeError(TypeError, RuntimeError):
    """A :class:`TypeError` that TorchRL raises as a :class:`RuntimeError`."""


class ValueRuntimeError(ValueError, RuntimeError):
    """A :class:`ValueError` that TorchRL raises as a :class:`RuntimeError`."""


class IndexRuntimeError(IndexError, RuntimeError):
    """An ``IndexError`` that is also the ``RuntimeError`` TorchRL raises (a list-storage write out of range)."""


class FileExistsRuntimeError(FileExistsError, RuntimeError):
    """A :class:`FileExistsError` that TorchRL raises as a :class:`RuntimeError`."""


class TornReadError(RuntimeError):
    """Raised by a read of a shared storage when rows stayed mid-write longer than a reader waits (2 s).

    Their writer most likely died while writing them; the next write at the writer's cursor completes them.
    ``storage.consistent_reads = False`` reads them anyway (possibly mixing two writes).
    """


class CheckpointError(ValueError):
    """A checkpoint on disk is incomplete, corrupted, unsafe or of an unknown schema version.

    The message says what is wrong and in which file. Raised by
    :func:`~torchrl.data.replay_buffers.checkpointers.read_checkpoint` (and by ``loads``) before any data is
    returned or any object is modified.
    """


class StringTooLong(ValueError):
    """A string longer than the width its stored entry was allocated with."""

    def __init__(self, key: tuple, needed: int, width: int, fixed: bool):
        self.key, self.needed, self.width = key, needed, width
        why = (
            "the storage was built with this `max_string_bytes`"
            if fixed
            else "the storage is shared with other processes or memory-mapped: its entries cannot be resized"
        )
        shown = key[0] if len(key) == 1 else key
        suggested = 1 << max(0, needed - 1).bit_length()  # the next power of two
        super().__init__(
            f"Entry {shown!r} of the data written holds a string of {needed} UTF-8 bytes; the storage keeps "
            f"this entry {width} bytes wide ({why}). Build the storage with a larger `max_string_bytes` (e.g. "
            f"max_string_bytes={suggested}), or shorten the strings. Nothing was written."
        )


class EpochEnded(Exception):
    """Raised by ``sample()`` of a sampler pinned to an epoch (:meth:`Sampler.pin_epoch`) once that epoch ended.

    Nothing was drawn. :class:`~torchrl.data.ReplayBufferDataset` catches it to end a DataLoader epoch at the
    sampler's epoch boundary in every worker.
    """


class RingGoneError(RuntimeError):
    """A ring message arrived after the worker that wrote it exited (before this process mapped its ring)."""


# --- TorchRL's phrases -------------------------------------------------------------------------------------------
# Code written for TorchRL matches some of its error and warning texts with ``re.search`` (``pytest.raises(match=)``,
# ``except ... if "..." in str(err)``). Our messages keep their own wording, which says what was received and what
# to do, and contain TorchRL's phrase verbatim. Each situation is one entry below: the phrase, the type TorchRL
# raises (ours may subclass it) and the whole message, so no phrase or advice is written twice.


class TorchRLPhrase:
    """One situation in which TorchRL's message carries a phrase user code matches.

    Args:
        type: the exception (or warning) class raised; TorchRL's type or a subclass of it.
        phrase: the regular expression TorchRL's message matches (``re.search``), as TorchRL's tests write it.
        message: our message, a :meth:`str.format` template that contains ``phrase``; its fields are the situation's
            details (what was received), passed to :func:`torchrl_error` / :func:`torchrl_warning`.
    """

    __slots__ = ("type", "phrase", "message")

    def __init__(self, type: type, phrase: str, message: str):
        self.type, self.phrase, self.message = type, phrase, message

    def format(self, **fields) -> str:
        """The message with ``fields`` filled in."""
        return self.message.format(**fields)

    def __repr__(self) -> str:
        return f"TorchRLPhrase({self.type.__name__}, {self.phrase!r})"


#: Every situation whose message carries a TorchRL phrase, by key. Tests check each phrase against its message and
#: trigger each situation (test/compat/test_torchrl_phrases.py).
TORCHRL_PHRASES: dict[str, TorchRLPhrase] = {
    # writers
    "max_value_writer_data": TorchRLPhrase(
        TypeRuntimeError,
        "expects data to be a tensor collection",
        "{cls} expects data to be a tensor collection (a TensorDict or a tensorclass holding the rank key), got "
        "{got}. Wrap the data in a TensorDict with the rank entry, or use a RoundRobinWriter for tensors and "
        "pytrees.",
    ),
    "max_value_writer_spawn": TorchRLPhrase(
        RuntimeError,
        "cannot be shared between processes",
        "A {cls} cannot be shared between processes: its top-k decisions are not synchronized across processes. "
        "Write from one process: use num_workers=0, or the 'fork' start method for DataLoader workers that only "
        "sample, or a RoundRobinWriter.",
    ),
    # buffers
    "drop_last_batch_size": TorchRLPhrase(
        ValueError,
        "Samplers with drop_last=True must work with a predictable batch-size",
        "Samplers with drop_last=True must work with a predictable batch-size: {sampler} drops the last "
        "incomplete batch, which needs the batch size when the buffer is built. Pass batch_size=... to the "
        "buffer, or build the sampler with drop_last=False.",
    ),
    "iterate_without_batch_size": TorchRLPhrase(
        RuntimeError,
        "Cannot iterate over the replay buffer. Batch_size was not specified",
        "Cannot iterate over the replay buffer. Batch_size was not specified when the buffer was built, so an "
        "iteration does not know how much to draw. Build the buffer with batch_size=..., or call "
        "rb.sample(batch_size) in a loop.",
    ),
    "sample_without_batch_size": TorchRLPhrase(
        RuntimeError,
        "batch_size not specified",
        "batch_size not specified: neither sample() nor the buffer got one. Call rb.sample(batch_size), or build "
        "the buffer with batch_size=...",
    ),
    "prefetch_shared": TorchRLPhrase(
        ValueError,
        "Cannot share prefetched replay buffers.*prefetch=0.*shared=False",
        "Cannot share prefetched replay buffers (got prefetch={prefetch}, shared=True): prefetched batches are "
        "drawn in one process and cannot be split between processes. Pass prefetch=0 to share the buffer, or "
        "shared=False to prefetch.",
    ),
    "prefetch_capacity": TorchRLPhrase(
        ValueRuntimeError,
        "prefetch queue with capacity {saved}",
        "The state holds a prefetch queue with capacity {saved}; this buffer prefetches {ours}. Build the buffer "
        "with prefetch={saved} to load it. Nothing was loaded.",
    ),
    "transform_write_state": TorchRLPhrase(
        RuntimeError,
        "write state",
        "{cls} keeps a write state (requires_shared_write_state=True) but has no share_memory_() method, so "
        "processes sharing this buffer would each update a private copy. Give the transform a share_memory_() "
        "method that moves its write state to shared memory, or use the buffer in one process (shared=False).",
    ),
    "add_batched": TorchRLPhrase(
        UserWarning,
        r"Using `add\(\)` with a TensorDict that has batch_size",
        "Using `add()` with a TensorDict that has batch_size {batch_size}: the whole TensorDict is stored as one "
        "item. Use `extend()` to store its {n} elements as separate items.",
    ),
    # update_if_present
    "conditional_unsupported": TorchRLPhrase(
        RuntimeError,
        "(?i)conditional",
        "update_if_present (a conditional update) needs {needs}; {got}. {fix}",
    ),
    "conditional_dotted_key": TorchRLPhrase(
        ValueError,
        "Dotted-string",
        "Dotted-string keys are not nested keys: version_key={key!r}. Pass the nested key as a tuple, e.g. "
        "{suggested!r}.",
    ),
    "conditional_version_in_patch": TorchRLPhrase(
        ValueError,
        "may not appear in patch",
        "version_key={key!r} may not appear in patch: update_if_present writes the version itself. Remove it "
        "from patch and pass the new version with version=...",
    ),
    # consuming sampler
    "consumed_empty": TorchRLPhrase(
        RuntimeError,
        "Cannot sample from an empty storage",
        "Cannot sample from an empty storage: {why}.",
    ),
    "consuming_prefetch": TorchRLPhrase(
        ValueError,
        "Prefetching is not supported",
        "Prefetching is not supported with consumption (consume_after_n_samples or a ConsumingSampler; got "
        "prefetch={prefetch}): a batch sampled ahead consumes its items before anyone receives it, and they are "
        "lost with the queue. Pass prefetch=0 (or leave it out), or sample without consumption.",
    ),
    "consuming_sampler": TorchRLPhrase(
        ValueError,
        "only supports the default RandomSampler",
        "consume_after_n_samples only supports the default RandomSampler, got {sampler}: consumption draws "
        "uniformly among the items left (priorities and epochs do not model items leaving the draw). Leave "
        "`sampler` out (ConsumingSampler({n}) is built for you), or drop consume_after_n_samples.",
    ),
    "consuming_ndim": TorchRLPhrase(
        ValueError,
        "1-dimensional storages",
        "{cls} works on 1-dimensional storages, got a storage with ndim={ndim}. Use a storage built with ndim=1.",
    ),
    "consuming_writer": TorchRLPhrase(
        TypeRuntimeError,
        "requires a writer with a callable",
        "{cls} requires a writer with a callable `write_at(index, data)` to refill consumed slots, got {writer}. "
        "Use a RoundRobinWriter (the default).",
    ),
    # other samplers
    "without_replacement_batch": TorchRLPhrase(
        ValueError,
        "The batch size .* is greater than the storage capacity",
        "The batch size {batch_size} is greater than the storage capacity {size} and drop_last=True, so no batch "
        "can be drawn. Sample at most {size} items, extend the buffer, or build the sampler with drop_last=False.",
    ),
    "alpha_negative": TorchRLPhrase(
        ValueError,
        "alpha must be greater or equal",
        "alpha must be greater or equal to 0, got alpha={alpha!r}. Pass 0 for uniform sampling or a positive "
        "exponent (0.6 or 0.7 are common).",
    ),
    "alpha_leaves_zero": TorchRLPhrase(
        UserWarning,
        "away from 0",
        "alpha moves away from 0 (to {alpha!r}) while the sampler holds priorities: they were stored as 1.0 "
        "under alpha=0 and stay 1.0 until their next update_priority().",
    ),
    "prioritized_without_replacement": TorchRLPhrase(
        TypeError,
        "no without-replacement variant",
        "{cls} has no without-replacement variant (got replacement={replacement!r}): its draws are always with "
        "replacement. Drop the argument, or use a sampler without replacement ({choices}).",
    ),
    # slice samplers
    "slice_done_ndim": TorchRLPhrase(
        ValueRuntimeError,
        "Expected the end-of-trajectory signal to be 1-dimensional",
        "Expected the end-of-trajectory signal to be 1-dimensional once its trailing singleton dims are "
        "squeezed, got entry {key!r} of shape {shape}: slice samplers need one done flag per step ({per_step}). "
        "Reduce it to one flag per step first, e.g. data[{key!r}] = data[{key!r}].any(-1, keepdim=True), or pass "
        "`traj_key`.",
    ),
    "slice_list_storage": TorchRLPhrase(
        TypeRuntimeError,
        "Could not get a tensordict out of the storage, which is required for SliceSampler to compute the "
        r"trajectories\.",
        "Could not get a tensordict out of the storage, which is required for SliceSampler to compute the "
        "trajectories. {cls} got a {storage}; use a LazyTensorStorage, LazyMemmapStorage or LazyStackStorage of "
        "TensorDicts.",
    ),
    "slice_pad_strict": TorchRLPhrase(
        ValueError,
        "pad_output=True is incompatible",
        "pad_output=True is incompatible with strict_length=True: padding keeps short trajectories, strict length "
        "drops them. Pass strict_length=False to pad, or pad_output=False to drop them.",
    ),
    "slice_end_keys": TorchRLPhrase(
        ValueRuntimeError,
        "exclusive",
        "end_key and end_keys are mutually exclusive (got end_key={end_key!r}, end_keys={end_keys!r}). Pass one "
        "key with end_key, or several with end_keys.",
    ),
    "traj_exactly_one": TorchRLPhrase(
        TypeError,
        "Exactly one",
        "Exactly one of `trajectory` and `end` must be given, got {got}.",
    ),
    "traj_cursor_empty": TorchRLPhrase(
        ValueRuntimeError,
        "cursor must not be",
        "The cursor must not be empty (got {cursor!r}): pass the storage's write cursor as an int or a non-empty "
        "tensor of positions.",
    ),
    "traj_empty": TorchRLPhrase(
        ValueRuntimeError,
        "empty",
        "The {name} input is empty (T=0): there is no trajectory to find. Pass at least one step.",
    ),
    # prompt groups and sequences
    "prompt_group_list_storage": TorchRLPhrase(
        TypeError,
        "Plain ListStorage is not supported",
        "Plain ListStorage is not supported by {cls}: it groups items by a stored entry, which needs a storage "
        "that returns its items as one TensorDict: a TensorStorage (LazyTensorStorage or LazyMemmapStorage) or a "
        "LazyStackStorage.",
    ),
    "prompt_group_reward": TorchRLPhrase(
        TypeError,
        "requires reward_key",
        "strategy={strategy!r} requires reward_key={key!r} to name a tensor entry, got {got}. Store rewards as "
        "tensors, or use strategy='random'.",
    ),
    "sequence_list_storage": TorchRLPhrase(
        TypeError,
        "TensorStorage",
        "Sequence reads done flags from a TensorStorage (LazyTensorStorage or LazyMemmapStorage), got {storage}.",
    ),
    "sequence_plain_tensor": TorchRLPhrase(
        TypeError,
        "TensorDict",
        "Sequence reads its done flags ({key!r}) from a TensorDict storage; this storage holds {got}. Store "
        "TensorDicts with a done entry, or pass done_key=None to treat the written span as one trajectory.",
    ),
    # storages
    "storage_none": TorchRLPhrase(
        ValueError,
        "Expected storage to be non-null",
        "Expected storage to be non-null: TensorStorage(storage=None). Pass a tensor, a TensorDict or a "
        "tensorclass to wrap, or use LazyTensorStorage(max_size) to allocate on the first write.",
    ),
    "storage_max_size": TorchRLPhrase(
        ValueError,
        "The max-size and the storage shape mismatch",
        "The max-size and the storage shape mismatch: max_size={max_size} but the storage holds {rows} rows along "
        "its first dim. Pass max_size={rows}, or leave it out.",
    ),
    "storage_unstackable_list": TorchRLPhrase(
        ValueRuntimeError,
        "Stacking the elements of the list resulted in an error",
        "Stacking the elements of the list resulted in an error: a list passed to extend() is a list of items, "
        "which must share their structure and shapes ({detail}). Pass items of one structure, or a TensorDict "
        "with a batch dimension.",
    ),
    "storage_pytree_state_dict": TorchRLPhrase(
        TypeError,
        "are not supported by",
        "Pytree contents are not supported by {cls}.state_dict() (which holds tensors, TensorDicts and "
        "tensorclasses); got {got}. Save it with storage.dumps(path) or rb.dumps(path), or store TensorDicts.",
    ),
    "storage_fill_uninitialized": TorchRLPhrase(
        RuntimeError,
        "Cannot fill a non-initialized pytree-based TensorStorage",
        "Cannot fill a non-initialized pytree-based TensorStorage: the checkpoint holds {got}, and {cls}.loads "
        "(and its checkpointer's loads) fills a storage that already holds data of that layout. Write one item "
        "first, then load; or load the whole buffer with rb.loads(path), which rebuilds the layout.",
    ),
    "storage_spawn_list": TorchRLPhrase(
        RuntimeError,
        "Cannot share a storage of type",
        "Cannot share a storage of type {cls} between processes. It lives in one process's memory and cannot be "
        "shared with a spawned process. Use LazyTensorStorage or LazyMemmapStorage (shared with workers), or use "
        "the 'fork' start method (workers then see a snapshot), or num_workers=0.",
    ),
    "storage_spawn_uninitialized": TorchRLPhrase(
        RuntimeError,
        "it has not been initialized yet",
        "{cls} cannot be shared with a spawned process: it has not been initialized yet, so each process would "
        "allocate its own memory. Write one batch before starting processes, or build it with shared_init=True.",
    ),
    "shared_init_device": TorchRLPhrase(
        UserWarning,
        "cannot be honored",
        "shared_init=True with device={device!r} cannot be honored: shared memory lives on the CPU. The storage "
        "is allocated on the CPU, and samples come back on the CPU.",
    ),
    # offline datasets (torchrl.data.datasets: registry, Minari, D4RL)
    "dataset_prefix_registered": TorchRLPhrase(
        KeyError,
        "already registered. Pass replace=True",
        "Dataset source {prefix!r} is already registered. Pass replace=True to register_dataset to replace its "
        "factory ({current}), or choose another prefix.",
    ),
    "dataset_id_prefix": TorchRLPhrase(
        ValueError,
        "dataset_id must be prefixed with a source identifier",
        "dataset_id must be prefixed with a source identifier, as in 'minari:<name>', got {dataset_id!r}. Known "
        "sources: {sources}.",
    ),
    "dataset_unknown_source": TorchRLPhrase(
        ValueError,
        "Unknown dataset source",
        "Unknown dataset source {prefix!r} (in dataset_id {dataset_id!r}). Known sources: {sources}; add one with "
        "register_dataset(prefix, factory).",
    ),
    "minari_local_missing": TorchRLPhrase(
        FileNotFoundError,
        "does not exist in local Minari cache!",
        "Dataset {dataset_id!r} does not exist in local Minari cache! Looked in {path} (the directory "
        "$MINARI_DATASETS_PATH names, else ~/.minari/datasets). Point MINARI_DATASETS_PATH at the directory that "
        "holds <namespace>/<name>/data/, or pass the right dataset_id.",
    ),
    "minari_mismatching_steps": TorchRLPhrase(
        RuntimeError,
        "Mismatching number of steps for key",
        "Mismatching number of steps for key {key!r} in episode {episode} of {source}: {got} entries, expected "
        "{expected} (one per step, or one more for observations and infos). The dataset file is inconsistent.",
    ),
    "d4rl_not_found": TorchRLPhrase(
        RuntimeError,
        "The dataset could not be found in",
        "The dataset could not be found in {path} and download=False. Put the D4RL HDF5 file at {file} (or pass "
        "path=<file>), or pass download=True to convert a file given with path=.",
    ),
    "dataset_read_only": TorchRLPhrase(
        RuntimeError,
        "This dataset doesn't allow writing.",
        "This dataset doesn't allow writing. The buffer is read-only ({cls}): it does not accept "
        "add/extend/empty. Build the buffer with writer=RoundRobinWriter() to write data.",
    ),
    "d4rl_import": TorchRLPhrase(
        ImportError,
        "Could not import d4rl",
        "Could not import d4rl, which {why} needs. This package reads D4RL's HDF5 files without d4rl: pass "
        "path=<file.hdf5> (or put the file at root/<dataset_id>.hdf5) and from_env=False.",
    ),
    # offline-to-online mixing (OfflineToOnlineReplayBuffer, MixedReplayBuffer)
    "o2o_both_online": TorchRLPhrase(
        ValueError,
        "not both.",
        "Pass online_storage or online_capacity, not both. Got online_storage={storage} and "
        "online_capacity={capacity!r}: keep online_storage to use that storage, or online_capacity=N for a "
        "LazyTensorStorage(N).",
    ),
    "o2o_no_online": TorchRLPhrase(
        ValueError,
        "Provide one of",
        "Provide one of online_storage (a Storage for the online data) or online_capacity (an int: a "
        "LazyTensorStorage of that size is built); got neither.",
    ),
    "o2o_string_batch_size": TorchRLPhrase(
        ValueError,
        "batch_size must be provided when offline_dataset is a string",
        "batch_size must be provided when offline_dataset is a string (got offline_dataset={dataset!r}): the "
        "dataset is built by load_dataset(offline_dataset, batch_size=batch_size, **dataset_kwargs). Pass "
        "batch_size=N.",
    ),
    "o2o_dataset_kwargs": TorchRLPhrase(
        ValueError,
        "dataset_kwargs are only forwarded when offline_dataset is a string",
        "dataset_kwargs are only forwarded when offline_dataset is a string (a dataset id for load_dataset); got "
        "{kwargs} with a {cls}. Build that dataset with these arguments yourself, or pass its id string.",
    ),
    "o2o_sample_batch_size": TorchRLPhrase(
        ValueError,
        r"batch_size must be provided either in __init__ or sample\(\)",
        "batch_size must be provided either in __init__ or sample(): this {cls} was built without a batch_size "
        "and sample() got none. Call sample(batch_size) or build it with batch_size=N.",
    ),
    # hindsight relabelling and trajectory queries (HERReplayBuffer, query.py)
    "her_ratio_range": TorchRLPhrase(
        ValueError,
        r"her_ratio must be in \[0, 1\]",
        "her_ratio must be in [0, 1] (the fraction of each batch relabelled), got {got}. Pass e.g. her_ratio=0.8, "
        "or 0 to sample without relabelling.",
    ),
    "her_missing_keys": TorchRLPhrase(
        KeyError,
        "The following keys are not present in storage",
        "The following keys are not present in storage: {missing}. HERReplayBuffer reads the goal and the "
        "achieved goal of every stored step: store both entries, or pass the keys that hold them "
        "(goal_key=..., achieved_goal_key=...).",
    ),
    "her_1d_storage": TorchRLPhrase(
        NotImplementedError,
        "only supports 1D storages",
        "HERReplayBuffer only supports 1D storages (episodes along one time dim); got a storage with ndim={ndim}. "
        "Store transitions in a 1-D storage (e.g. LazyTensorStorage(n), written with rb.extend(td.reshape(-1)) "
        "after splitting episodes per env), or use storage.flatten().",
    ),
    "query_unreduced": TorchRLPhrase(
        TypeError,
        r"Call \.any\(\) or \.all\(\)",
        "{expr} compares each step, not a trajectory: it has one value per step. Call .any() or .all() to "
        "reduce it to one bool per trajectory, e.g. ({expr}).any().",
    ),
    "query_not_tensordict": TorchRLPhrase(
        TypeError,
        "expects a TensorDictBase",
        "{func} expects a TensorDictBase of transitions (one batch dim = time), got {got}. Wrap the data in a "
        "TensorDict, or query the buffer with rb.query(...).",
    ),
    "query_batch_dims": TorchRLPhrase(
        ValueError,
        "single batch dimension",
        "{what} needs data with a single batch dimension (time), got batch_size={batch_size}. Index one "
        "environment (data[:, i]) or flatten it (data.reshape(-1)) first.",
    ),
    "query_no_signal": TorchRLPhrase(
        KeyError,
        "Cannot split data into trajectories",
        "Cannot split data into trajectories: the data has no trajectory id entry ({ids}) and no end-of-episode "
        "flag ({flags}). Pass trajectory_key= naming the entry that holds trajectory ids, or store done flags.",
    ),
    "query_end_flags": TorchRLPhrase(
        UserWarning,
        "No trajectory id entry was found; splitting on the end-of-episode flags",
        "No trajectory id entry was found; splitting on the end-of-episode flags {flags}. Pass trajectory_key= "
        "(e.g. ('collector', 'traj_ids')) to split on trajectory ids.",
    ),
    "query_list_storage_type": TorchRLPhrase(
        TypeError,
        "requires a tensordict-backed storage",
        "ReplayBuffer.query() requires a tensordict-backed storage or a ListStorage of TensorDicts; the stored "
        "items are {got}. Store TensorDicts (e.g. TensorDictReplayBuffer with LazyTensorStorage).",
    ),
    "query_list_storage_batched": TorchRLPhrase(
        TypeError,
        r"expects single-transition \(scalar\) items",
        "ReplayBuffer.query() on a ListStorage expects single-transition (scalar) items, got an item with "
        "batch_size={batch_size}. Write transitions with rb.extend(td) (one item per step), not whole rollouts "
        "with rb.add(td).",
    ),
    # readiness and rate limiting (issue 27: sample(wait=True), RateLimitedReplayBuffer)
    "rate_spi_type": TorchRLPhrase(
        TypeError,
        "samples_per_insert must be a finite positive number.",
        "samples_per_insert must be a finite positive number. Got {got}: pass a float > 0 (e.g. 1.0 for one "
        "sampled record per inserted item).",
    ),
    "rate_spi_value": TorchRLPhrase(
        ValueError,
        "samples_per_insert must be a finite positive number.",
        "samples_per_insert must be a finite positive number. Got {got}: pass a float > 0 (e.g. 1.0 for one "
        "sampled record per inserted item).",
    ),
    "rate_service_backend": TorchRLPhrase(
        ValueError,
        "does not support service_backend=",
        "{cls} does not support service_backend={backend!r}: its sample budget is reserved where the buffer lives, "
        "and only the 'direct' and 'ray' backends forward sample(wait=...) and can_sample. Use "
        "service_backend='direct' (share the buffer: rb.share(), or rb.as_dataset() for DataLoader workers) or "
        "service_backend='ray'.",
    ),
    "rate_shut_down": TorchRLPhrase(
        RuntimeError,
        "A shut down replay buffer cannot be sampled.",
        "A shut down replay buffer cannot be sampled. shutdown() ended the wait; build a new buffer (or load a "
        "checkpoint into one) to sample again.",
    ),
    "rate_cancelled": TorchRLPhrase(
        RuntimeError,
        "Replay-buffer sampling was cancelled.",
        "Replay-buffer sampling was cancelled. The `cancel_event` passed to sample() was set; clear it (or pass "
        "another one) to sample again.",
    ),
    "rate_not_permitted": TorchRLPhrase(
        RuntimeError,
        "Replay readiness or the sample-to-insert ratio does not currently permit this sample. Pass wait=True to "
        "wait.",
        "Replay readiness or the sample-to-insert ratio does not currently permit this sample. Pass wait=True to "
        "wait. ({detail})",
    ),
    "rate_budget_timeout": TorchRLPhrase(
        TimeoutError,
        "Replay buffer did not obtain sample-ratio budget within {timeout} seconds.",
        "Replay buffer did not obtain sample-ratio budget within {timeout} seconds. The sample side waited; "
        "{detail}. Write more data (each inserted item pays for samples_per_insert records), pass a larger "
        "timeout, or timeout=None to wait as long as it takes.",
    ),
    # CatFrames (issue 26 item 4: frame stacks rebuilt at sample time)
    "catframes_dim": TorchRLPhrase(
        ValueError,
        "dim must be < 0",
        "dim must be < 0: CatFrames concatenates frames along a dim of each frame, counted from its end (e.g. "
        "dim=-3 for [C, H, W] images, dim=-1 for vectors); got dim={dim}.",
    ),
    "catframes_unfolding_done": TorchRLPhrase(
        KeyError,
        "CatFrames.unfolding requires",
        "CatFrames.unfolding requires the done entry {key!r} to tell where trajectories start in a batch of "
        "consecutive steps; the data holds {keys}. Store it, pass `done_key` naming the stored done entry (read "
        "under 'next'), or pass future=True.",
    ),
    # replay-buffer transforms and DensifyReward (issue 26 item 2)
    "multistep_n_steps": TorchRLPhrase(
        ValueError,
        "The value of n_steps must be a strictly positive integer.",
        "The value of n_steps must be a strictly positive integer. Got n_steps={value!r} ({cls}): pass an int >= 1 "
        "(the number of steps each transition looks ahead; 1 leaves one-step transitions).",
    ),
    "next_state_fill_dtype": TorchRLPhrase(
        TypeError,
        "non-floating dtype",
        "NextStateReconstructor cannot fill ('next', {key!r}), of non-floating dtype {dtype}, with "
        "fill_value={fill}: pass an integer fill_value (e.g. fill_value=0) for integer entries such as uint8 frames.",
    ),
    "next_state_traj_key_missing": TorchRLPhrase(
        KeyError,
        "trajectory key",
        "NextStateReconstructor: the trajectory key {key!r} (`{name}`) is not in the sampled batch. Store the "
        "trajectory ids there, pass the stored key with `{name}=`, `{name}=None` to skip this check, or "
        "strict=False to skip it when absent.",
    ),
    "next_state_done_key_missing": TorchRLPhrase(
        KeyError,
        "done key",
        "NextStateReconstructor: the done key {key!r} (`{name}`) is not in the sampled batch. Pass the stored done "
        "entry with `{name}=` (a full key, e.g. ('next', 'done')), `{name}=None` to skip this check, or "
        "strict=False to skip it when absent.",
    ),
    "next_state_step_count_key_missing": TorchRLPhrase(
        KeyError,
        "step-count key",
        "NextStateReconstructor: the step-count key {key!r} (`{name}`) is not in the sampled batch. Pass the stored "
        "step counter with `{name}=`, `{name}=None` to skip this check, or strict=False to skip it when absent.",
    ),
    "policy_lag_negative": TorchRLPhrase(
        ValueError,
        "max_policy_lag must be non-negative",
        "max_policy_lag must be non-negative, got {value!r}: pass 0 to keep the current policy's data only, or the "
        "largest number of policy versions a row may lag.",
    ),
    "policy_version_missing": TorchRLPhrase(
        KeyError,
        "PolicyAgeFilter:",
        "PolicyAgeFilter: the data has no {key!r} entry (strict=True). Write each row's policy version there, "
        "pass the key that holds it with `policy_version_key=`, or strict=False to let such data through.",
    ),
    "densify_shapes": TorchRLPhrase(
        RuntimeError,
        "reward and done state are expected to have the same shape",
        "reward and done state are expected to have the same shape, got reward {reward} and done {done}: store "
        "both as [..., T, 1] (e.g. done.unsqueeze(-1)), or pass the matching entries with `reward_key=`/`done_key=`.",
    ),
    # LeRobot datasets (torchrl.data.datasets.lerobot)
    "lerobot_slices_both": TorchRLPhrase(
        ValueError,
        "num_slices or slice_len can be passed, but not both.",
        "num_slices or slice_len can be passed, but not both. Got num_slices={num_slices!r} and "
        "slice_len={slice_len!r}: pass the number of slices per batch or the length of each slice.",
    ),
    "lerobot_not_found": TorchRLPhrase(
        RuntimeError,
        "Dataset .* not found at",
        "Dataset {repo_id!r} not found at {path} and download=False. Pass download=True to convert it (from the "
        "Hub, or from a local LeRobot directory with LeRobotExperienceReplay.from_local(path)).",
    ),
    "lerobot_mixed_strings": TorchRLPhrase(
        ValueError,
        "mixes strings",
        "Column {column!r} mixes strings and other values: a column holds one kind of value per frame (all str "
        "for text, all numbers otherwise).",
    ),
    # MultiStep post-processing (issue 26 item 2: TorchRL's MultiStep semantics)
    "multistep_postproc_n_steps": TorchRLPhrase(
        ValueError,
        "n_steps must be a non-negative integer.",
        "n_steps must be a non-negative integer. Got n_steps={value!r} ({cls}): pass an int >= 1 (the number of "
        "steps each transition looks ahead; 1 leaves one-step transitions).",
    ),
    "multistep_postproc_gamma": TorchRLPhrase(
        ValueError,
        "got out-of-bounds gamma decay",
        "MultiStep got out-of-bounds gamma decay: gamma={value!r}. Pass the discount of one step, a float in "
        "(0, 1] (e.g. gamma=0.99).",
    ),
    "multistep_done_shape": TorchRLPhrase(
        RuntimeError,
        r"tensordict shape must be compatible with the done's shape \(trailing singleton dimension excluded\).",
        "tensordict shape must be compatible with the done's shape (trailing singleton dimension excluded). Got "
        "done {done} for a batch of size {batch}: store done as [*B, T] or [*B, T, 1], or give every entry the "
        "leading dims of done.",
    ),
}


def torchrl_error(key: str, /, **fields) -> BaseException:
    """The exception for situation ``key`` of :data:`TORCHRL_PHRASES`, its message filled with ``fields``.

    Examples:
        >>> err = torchrl_error("alpha_negative", alpha=-1.0)
        >>> type(err).__name__, "alpha must be greater or equal" in str(err)
        ('ValueError', True)
    """
    entry = TORCHRL_PHRASES[key]
    return entry.type(entry.format(**fields))


def torchrl_warning(key: str, /, *, stacklevel: int = 3, **fields) -> None:
    """Warn with situation ``key`` of :data:`TORCHRL_PHRASES` (a warning class), its message filled with ``fields``."""
    import warnings

    entry = TORCHRL_PHRASES[key]
    warnings.warn(entry.format(**fields), entry.type, stacklevel=stacklevel)
