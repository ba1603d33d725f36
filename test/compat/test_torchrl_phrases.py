"""Issue 25: every TorchRL error and warning phrase that user code matches, one situation at a time.

The table of ``../shared/reference/torchrl_behaviour_facts.md`` §9 lists each situation, the type TorchRL raises
and the phrase its message contains. Here each situation is provoked for real (a real buffer, storage, sampler
or spawned process) and the error is checked with ``pytest.raises(TorchRLType, match=phrase)``, as TorchRL's own
code matches it. Our messages keep their own wording: the phrase is part of a message that also says what was
received and what to do. Each situation is one :class:`torchrl._phrases.TorchRLPhrase` constant, defined at module
level in the module that raises it (issue 38); this file collects them module by module, checks each phrase against
its message, that each constant is raised somewhere and that no raise site writes a phrase itself.
"""

from __future__ import annotations

import ast
import importlib
import multiprocessing as mp
import pathlib
import pkgutil
import re
import string

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

import torchrl
from torchrl._phrases import TorchRLPhrase
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    PromptGroupSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
    TensorStorage,
)
from torchrl.data.replay_buffers.sample_units import Sequence
from torchrl.data.replay_buffers.samplers import ConsumingSampler
from torchrl.data.replay_buffers.utils import find_start_stop_traj
from torchrl.envs.transforms import Transform

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "torchrl"
REPO = PACKAGE.parent
#: The situations covered when the catalogue became module constants (issue 38: the 86 entries of
#: ``TORCHRL_PHRASES``); a later change may add situations, never drop one.
SITUATIONS_COVERED = 86


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {_module_name(p): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))}


def _is_phrase_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "TorchRLPhrase"


def _definitions() -> dict[str, ast.Assign]:
    """``{"module.NAME": node}`` for each module-level ``NAME = TorchRLPhrase(...)`` of torchrl's sources."""
    out = {}
    for module, tree in SOURCES.items():
        for node in tree.body:
            if isinstance(node, ast.Assign) and _is_phrase_call(node.value) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    out[f"{module}.{target.id}"] = node
    return out


DEFINITIONS = _definitions()


def _collect() -> dict[str, TorchRLPhrase]:
    """Imports every torchrl module and gathers the phrase constants each one defines (not those it imports)."""
    for info in pkgutil.walk_packages(torchrl.__path__, "torchrl."):
        importlib.import_module(info.name)
    out = {}
    for qualified in DEFINITIONS:
        module, _, name = qualified.rpartition(".")
        out[qualified] = getattr(importlib.import_module(module), name)
    return out


PHRASES = _collect()


def _fields(template: str) -> dict:
    return {name: "x" for _, name, _, _ in string.Formatter().parse(template) if name}


@pytest.mark.parametrize("qualified", sorted(PHRASES))
def test_each_message_contains_its_phrase(qualified):
    entry = PHRASES[qualified]
    assert isinstance(entry, TorchRLPhrase), qualified
    assert qualified.rpartition(".")[2].isupper(), f"{qualified}: a phrase constant has an UPPER_CASE name"
    fields = _fields(entry.message)
    assert re.search(entry.phrase.format(**fields), entry.format(**fields)), qualified
    assert issubclass(entry.type, (Exception, Warning))


def test_the_situations_covered_stay_covered():
    assert len(PHRASES) >= SITUATIONS_COVERED, f"{len(PHRASES)} phrase constants, {SITUATIONS_COVERED} before"


def test_a_phrase_is_a_module_constant_and_the_only_one_of_its_message():
    """No ``TorchRLPhrase(...)`` outside a module-level constant; no phrase object a module builds another way."""
    stray = []
    for module, tree in SOURCES.items():
        top = {id(node.value) for node in tree.body if isinstance(node, ast.Assign)}
        stray += [f"{module}:{n.lineno}" for n in ast.walk(tree) if _is_phrase_call(n) and id(n) not in top]
    assert not stray, f"define each phrase as a module-level constant: {stray}"
    known = {id(p) for p in PHRASES.values()}
    built = [
        f"{info.name}.{name}"
        for info in pkgutil.walk_packages(torchrl.__path__, "torchrl.")
        for name, value in vars(importlib.import_module(info.name)).items()
        if isinstance(value, TorchRLPhrase) and id(value) not in known
    ]
    assert not built, f"phrase objects that no module defines as a constant: {built}"
    situations = [(p.type, p.message) for p in PHRASES.values()]
    assert len(set(situations)) == len(situations), "a situation is defined twice: import it from the lowest module"


def _imported_from(tree: ast.AST, module: str, name: str) -> bool:
    return any(
        isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == name for a in n.names)
        for n in ast.walk(tree)
    )


def _raises(tree: ast.AST, name: str) -> bool:
    """Whether ``tree`` calls ``NAME.error(...)``/``NAME.warn(...)``, or reads ``NAME`` (a table of situations) and
    calls ``.error``/``.warn`` on a variable holding one."""
    calls = [
        n.func.value.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("error", "warn")
        and isinstance(n.func.value, ast.Name)
    ]
    if name in calls:
        return True
    read = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(tree))
    return read and any(not called.isupper() for called in calls)


def test_every_phrase_constant_is_raised_somewhere():
    unused = []
    for qualified in PHRASES:
        module, _, name = qualified.rpartition(".")
        users = [m for m, tree in SOURCES.items() if m == module or _imported_from(tree, module, name)]
        if not any(_raises(SOURCES[m], name) for m in users):
            unused.append(qualified)
    assert not unused, f"phrase constants no raise site uses (raise NAME.error(...) / NAME.warn(...)): {unused}"


def test_the_string_keyed_catalogue_is_gone():
    """Messages live beside the code that raises them: the old catalogue and its helpers are used nowhere."""
    names = ("TORCHRL" + "_PHRASES", "torchrl" + "_error", "torchrl" + "_warning")
    offenders = []
    for folder in ("torchrl", "test", "docs", "benchmarks", "examples"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".py", ".rst", ".md") or path == pathlib.Path(__file__).resolve():
                continue
            text = path.read_text(encoding="utf-8")
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if re.search(rf"\b{n}\b", text)]
    assert not offenders, "use the phrase constants (raise NAME.error(...)):\n" + "\n".join(offenders)


def _literal_phrases() -> list[str]:
    """The phrases long enough to be recognised at a raise site (a single word like "empty" is not)."""
    out = []
    for entry in PHRASES.values():
        if "{" in entry.phrase or "(?i)" in entry.phrase:
            continue
        for part in re.split(r"\.\*|\\", entry.phrase):
            if len(part) >= 18:
                out.append(part)
    return out


def test_no_raise_site_writes_a_torchrl_phrase_itself():
    offenders = []
    phrases = _literal_phrases()
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "_phrases.py":  # the mechanism; its example is no raise site
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.parse(text).body:  # the constants themselves hold their phrase
            if isinstance(node, ast.Assign) and _is_phrase_call(node.value):
                lines[node.lineno - 1 : node.end_lineno] = [""] * (node.end_lineno - node.lineno + 1)
        text = "\n".join(lines)
        offenders += [f"{path.relative_to(PACKAGE)}: {p!r}" for p in phrases if p in text]
    assert not offenders, "raise the module's phrase constant (NAME.error(...)) instead:\n" + "\n".join(offenders)


# -- the situations, one test each (§9, in its order) ----------------------------------------------------------
def _td(n: int, **extra) -> TensorDict:
    return TensorDict({"obs": torch.arange(n, dtype=torch.float32), **extra}, [n])


def _noop(*args) -> None:
    pass


def _spawn_with(obj) -> None:
    """Starts a spawned process that receives ``obj`` (pickled by ``Process.start``) and waits for it."""
    p = mp.get_context("spawn").Process(target=_noop, args=(obj,))
    try:
        p.start()
    finally:
        if p.pid is not None:
            p.join(60)


@pytest.mark.parametrize(
    "storage", [lambda: LazyTensorStorage(5), lambda: ListStorage(5)], ids=["lazy", "list"]
)
@pytest.mark.parametrize("how", ["add", "extend", "writer.extend"])
@pytest.mark.parametrize("buffer", [ReplayBuffer, TensorDictReplayBuffer])
def test_max_value_writer_given_non_tensor_collection_data(buffer, storage, how):
    rb = buffer(storage=storage(), writer=TensorDictMaxValueWriter(rank_key="r"))
    data = torch.ones(3)
    with pytest.raises(RuntimeError, match="expects data to be a tensor collection"):
        if how == "add":
            rb.add(data[0])
        elif how == "extend":
            rb.extend(data)
        else:
            rb.writer.extend(data)
    assert len(rb) == 0


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_max_value_writer_pickled_for_spawn():
    with pytest.raises(RuntimeError, match="cannot be shared between processes"):
        _spawn_with(TensorDictMaxValueWriter(rank_key="r"))


def test_drop_last_sampler_without_batch_size():
    with pytest.raises(
        ValueError, match="Samplers with drop_last=True must work with a predictable batch-size"
    ):
        ReplayBuffer(sampler=SamplerWithoutReplacement(drop_last=True))


def test_iterating_without_batch_size():
    rb = ReplayBuffer(storage=LazyTensorStorage(5))
    rb.extend(torch.arange(5))
    with pytest.raises(
        RuntimeError, match="Cannot iterate over the replay buffer. Batch_size was not specified"
    ):
        next(iter(rb))


def test_sample_without_batch_size():
    rb = ReplayBuffer(storage=LazyTensorStorage(5))
    rb.extend(torch.arange(5))
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        rb.sample()


def test_prefetch_and_shared():
    with pytest.raises(ValueError, match="Cannot share prefetched replay buffers.*prefetch=0.*shared=False"):
        ReplayBuffer(storage=LazyTensorStorage(5), prefetch=1, shared=True)


def test_loading_a_prefetch_queue_of_another_capacity():
    source = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=2)
    source.extend(torch.arange(10))
    source.sample()
    target = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=1)
    with pytest.raises(RuntimeError, match="prefetch queue with capacity 2"):
        target.load_state_dict(source.state_dict())


class _WriteStateTransform(Transform):
    requires_shared_write_state = True


def test_a_transform_with_an_unshareable_write_state():
    rb = ReplayBuffer(storage=LazyTensorStorage(5), shared=True)
    with pytest.raises(RuntimeError, match="write state"):
        rb.append_transform(_WriteStateTransform())


def test_add_of_a_batched_tensordict():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(5))
    with pytest.warns(UserWarning, match=r"Using `add\(\)` with a TensorDict that has batch_size"):
        rb.add(TensorDict({"a": torch.zeros(1)}, batch_size=[1]))


def _tracked(storage) -> ReplayBuffer:
    return ReplayBuffer(storage=storage, writer=RoundRobinWriter(track_generations=True))


def test_conditional_update_on_an_unsupported_buffer():
    rb = ReplayBuffer(storage=LazyTensorStorage(5))  # a writer without track_generations
    index = rb.extend(_td(3))
    with pytest.raises(RuntimeError, match="(?i)conditional"):
        rb.update_if_present(
            index=index, generation=torch.zeros(3, dtype=torch.long), patch={"obs": torch.ones(3)}
        )


def test_conditional_update_with_a_dotted_version_key():
    rb = _tracked(LazyTensorStorage(5))
    index = rb.extend(_td(3, nested=TensorDict({"version": torch.zeros(3)}, [3])))
    generation = rb.writer.generations_of(index)
    with pytest.raises(ValueError, match="Dotted-string"):
        rb.update_if_present(index=index, generation=generation, patch={"obs": torch.ones(3)},
                             version_key="nested.version", version=1)  # fmt: skip


def test_conditional_update_with_the_version_key_in_the_patch():
    rb = _tracked(LazyTensorStorage(5))
    index = rb.extend(_td(3, version=torch.zeros(3)))
    generation = rb.writer.generations_of(index)
    with pytest.raises(ValueError, match="may not appear in patch"):
        rb.update_if_present(index=index, generation=generation, patch={"version": torch.ones(3)},
                             version_key="version", version=1)  # fmt: skip


def test_sampling_once_everything_is_consumed():
    rb = ReplayBuffer(storage=ListStorage(5), batch_size=3, consume_after_n_samples=1)
    rb.extend(list(range(5)))
    rb.sample(3)
    rb.sample(2)
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        rb.sample()


def test_consumption_with_prefetch():
    with pytest.raises(ValueError, match="Prefetching is not supported"):
        ReplayBuffer(storage=LazyTensorStorage(5), batch_size=2, consume_after_n_samples=1, prefetch=2)


@pytest.mark.parametrize("sampler", [SamplerWithoutReplacement, lambda: PrioritizedSampler(5, 0.7, 0.5)])
def test_consumption_with_another_sampler(sampler):
    with pytest.raises(ValueError, match="only supports the default RandomSampler"):
        ReplayBuffer(storage=LazyTensorStorage(5), sampler=sampler(), consume_after_n_samples=1)


def test_consuming_sampler_on_a_2d_storage():
    with pytest.raises(ValueError, match="1-dimensional storages"):
        ReplayBuffer(storage=LazyTensorStorage(10, ndim=2), sampler=ConsumingSampler(1))


class _NoWriteAt(RoundRobinWriter):
    write_at = None


def test_consuming_sampler_with_a_writer_without_write_at():
    with pytest.raises(TypeError, match="requires a writer with a callable"):
        ReplayBuffer(storage=LazyTensorStorage(5), sampler=ConsumingSampler(1), writer=_NoWriteAt())


def test_without_replacement_batch_larger_than_the_storage():
    storage = LazyTensorStorage(20)
    storage.set(range(10), torch.arange(10))
    with pytest.raises(ValueError, match="The batch size .* is greater than the storage capacity"):
        SamplerWithoutReplacement(drop_last=True).sample(storage, 11)


def test_negative_alpha():
    sampler = PrioritizedSampler(10, alpha=0.7, beta=0.5)
    with pytest.raises(ValueError, match="alpha must be greater or equal"):
        sampler.alpha = -1.0


def test_alpha_leaving_zero_with_priorities():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=PrioritizedSampler(10, alpha=0.0, beta=0.5))
    rb.extend(torch.arange(5))
    with pytest.warns(UserWarning, match="away from 0"):
        rb.sampler.alpha = 0.6


def test_prioritized_sampler_without_replacement():
    with pytest.raises(TypeError, match="no without-replacement variant"):
        PrioritizedSampler(10, alpha=0.7, beta=0.5, replacement=False)


def _episodes(n: int, done_shape=()) -> TensorDict:
    done = torch.zeros(n, *done_shape, dtype=torch.bool)
    done[4::5] = True
    return TensorDict({"obs": torch.arange(n), ("next", "done"): done}, [n])


def test_slice_sampler_with_a_2d_done():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(20), sampler=SliceSampler(num_slices=2), batch_size=4
    )
    rb.extend(_episodes(20, (5, 1)))
    with pytest.raises(RuntimeError, match="Expected the end-of-trajectory signal to be 1-dimensional"):
        rb.sample()


def test_slice_sampler_on_a_list_storage():
    rb = ReplayBuffer(storage=ListStorage(20), sampler=SliceSampler(num_slices=2), batch_size=4)
    rb.extend(list(_episodes(20).unbind(0)))
    with pytest.raises(
        RuntimeError,
        match="Could not get a tensordict out of the storage, which is required for SliceSampler to compute the "
        r"trajectories\.",
    ):
        rb.sample()


def test_slice_sampler_pad_output_and_strict_length():
    with pytest.raises(ValueError, match="pad_output=True is incompatible"):
        SliceSampler(num_slices=2, strict_length=True, pad_output=True)


def test_slice_sampler_end_key_and_end_keys():
    with pytest.raises(RuntimeError, match="exclusive"):
        SliceSampler(num_slices=2, end_key=("next", "done"), end_keys=[("next", "done")])


def test_find_start_stop_traj_needs_exactly_one_input():
    with pytest.raises(TypeError, match="Exactly one"):
        find_start_stop_traj(at_capacity=False)


@pytest.mark.parametrize("cursor", [torch.tensor([], dtype=torch.long), range(0)], ids=["tensor", "range"])
def test_find_start_stop_traj_with_an_empty_cursor(cursor):
    with pytest.raises(RuntimeError, match="cursor must not be"):
        find_start_stop_traj(end=torch.zeros(5, dtype=torch.bool), at_capacity=True, cursor=cursor)


def test_find_start_stop_traj_with_no_steps():
    with pytest.raises(RuntimeError, match="empty"):
        find_start_stop_traj(end=torch.zeros(0, dtype=torch.bool), at_capacity=False)


def test_prompt_group_sampler_on_a_list_storage():
    rb = ReplayBuffer(storage=ListStorage(8), sampler=PromptGroupSampler(num_groups=2), batch_size=4)
    rb.extend([TensorDict(query=torch.tensor(i % 2)) for i in range(8)])
    with pytest.raises(TypeError, match="Plain ListStorage is not supported"):
        rb.sample()


def test_prompt_group_sampler_with_a_non_tensor_reward():
    sampler = PromptGroupSampler(num_groups=2, strategy="reward", reward_key="reward")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=sampler, batch_size=4)
    rewards = NonTensorStack(*[f"r{i}" for i in range(8)])
    rb.extend(TensorDict({"query": torch.arange(8) % 2, "reward": rewards}, [8]))
    with pytest.raises(TypeError, match="requires reward_key"):
        rb.sample()


def test_sequence_on_a_list_storage():
    storage = ListStorage(10)
    storage.set(range(10), list(_episodes(10).unbind(0)))
    with pytest.raises(TypeError, match="TensorStorage"):
        Sequence(3).expand(torch.tensor([0]), {}, storage)


def test_sequence_on_a_plain_tensor_storage():
    storage = LazyTensorStorage(10)
    storage.set(range(10), torch.arange(10))
    with pytest.raises(TypeError, match="TensorDict"):
        Sequence(3).expand(torch.tensor([0]), {}, storage)


def test_tensor_storage_of_none():
    with pytest.raises(ValueError, match="Expected storage to be non-null"):
        TensorStorage(None)


def test_tensor_storage_max_size_mismatch():
    with pytest.raises(ValueError, match="The max-size and the storage shape mismatch"):
        TensorStorage(torch.randn(3), max_size=4)


def test_extend_with_a_list_of_unstackable_items():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.raises(RuntimeError, match="Stacking the elements of the list resulted in an error"):
        rb.extend([torch.zeros(3), torch.zeros(4)])
    assert len(rb) == 0


def test_state_dict_of_a_pytree_storage():
    storage = TensorStorage({"a": torch.zeros(4), "b": (torch.ones(4), torch.ones(4, 2))})
    with pytest.raises(TypeError, match="are not supported by"):
        storage.state_dict()


@pytest.mark.parametrize("data", [torch.arange(4.0), {"a": torch.arange(4.0)}], ids=["tensor", "pytree"])
def test_loads_of_tensor_data_into_a_non_initialized_storage(data, tmp_path):
    from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer

    source = LazyTensorStorage(4)
    source.set(range(4), data)
    source.dumps(tmp_path / "s")
    with pytest.raises(RuntimeError, match="Cannot fill a non-initialized pytree-based TensorStorage"):
        TensorStorageCheckpointer().loads(LazyTensorStorage(4), tmp_path / "s")


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_list_storage_pickled_for_spawn():
    with pytest.raises(RuntimeError, match="Cannot share a storage of type"):
        _spawn_with(ListStorage(5))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_uninitialized_storage_pickled_for_spawn(tmp_path):
    with pytest.raises(RuntimeError, match="it has not been initialized yet"):
        _spawn_with(LazyMemmapStorage(5, scratch_dir=tmp_path / "s"))


def test_shared_init_on_a_non_cpu_device():
    storage = LazyTensorStorage(8, device="meta", shared_init=True)
    rb = ReplayBuffer(storage=storage, batch_size=2)
    with pytest.warns(UserWarning, match="cannot be honored"):
        rb.extend(torch.arange(4))
    assert storage.device == torch.device("cpu") and rb.sample().device.type == "cpu"
