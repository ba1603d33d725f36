"""TorchRL's keywords of the three slice samplers: signatures and defaults, ``compile``/``use_gpu``, ``end_keys``,
``is_init``, ``replacement=``, pickling and copies with them."""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch
from helpers.factories import DONE, TERM, TRUNC, episodes
from tensordict import TensorDict

from torchrl.data import LazyStackStorage, LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers.prioritized_slice import PrioritizedSliceSampler
from torchrl.data.replay_buffers.samplers.slice import SliceSampler
from torchrl.data.replay_buffers.samplers.slice_without_replacement import SliceSamplerWithoutReplacement

# -- TorchRL-compatible signatures ---------------------------------------------------------------------------
SLICE_CLASSES = [SliceSampler, SliceSamplerWithoutReplacement, PrioritizedSliceSampler]
_SLICE_DEFAULTS = {
    "num_slices": None,
    "slice_len": None,
    "drop_last": False,
    "end_key": None,
    "end_keys": None,
    "traj_key": None,
    "step_key": "step_count",  # TorchRL main (fragmented trajectories), on every slice sampler here
    "fragmented": False,
    "ends": None,
    "trajectories": None,
    "cache_values": False,
    "truncated_key": ("next", "truncated"),
    "strict_length": True,
    "pad_output": False,
    "shuffle": True,
    "compile": False,
    "span": False,
    "use_gpu": False,
    "max_priority_within_buffer": False,
}


@pytest.mark.parametrize(
    "cls, positional, keywords",
    [
        (
            SliceSampler,
            [],
            "num_slices slice_len end_key end_keys traj_key step_key fragmented ends trajectories cache_values "
            "truncated_key strict_length pad_output compile span use_gpu",
        ),
        (
            SliceSamplerWithoutReplacement,
            [],
            "num_slices slice_len drop_last end_key end_keys traj_key step_key fragmented ends trajectories "
            "truncated_key strict_length shuffle compile use_gpu",
        ),
        (
            PrioritizedSliceSampler,
            [(name, inspect.Parameter.empty) for name in ("max_capacity", "alpha", "beta")]
            + [("eps", 1e-8), ("dtype", torch.float), ("reduction", "max")],
            "num_slices slice_len end_key end_keys traj_key step_key fragmented ends trajectories cache_values "
            "truncated_key strict_length compile span max_priority_within_buffer",
        ),
    ],
)
def test_signatures_match_torchrl_order_and_defaults(cls, positional, keywords):
    params = list(inspect.signature(cls).parameters.values())
    head, tail = params[: len(positional)], params[len(positional) :]
    assert [(p.name, p.default) for p in head] == positional
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in head)
    assert [p.name for p in tail] == keywords.split()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in tail)
    assert {p.name: p.default for p in tail} == {name: _SLICE_DEFAULTS[name] for name in keywords.split()}


def _slice_sampler(cls, storage, seed: int = 0, **kwargs):
    """A slice sampler of class ``cls`` seeded with ``seed``, told about the writes when prioritized."""
    if cls is PrioritizedSliceSampler:
        sampler = cls(storage.max_size, 1.0, 1.0, **kwargs)
        sampler.extend(torch.arange(len(storage)))
    else:
        sampler = cls(**kwargs)
    sampler._rng = torch.Generator().manual_seed(seed)
    return sampler


# -- compile / use_gpu ---------------------------------------------------------------------------------------
_HINTS = [{"compile": True}, {"compile": {"mode": "reduce-overhead"}}, {"use_gpu": True}, {"use_gpu": "cpu"}]


@pytest.mark.parametrize(
    "cls, hints",
    [(cls, hints) for cls in (SliceSampler, SliceSamplerWithoutReplacement) for hints in _HINTS]
    # TorchRL's PrioritizedSliceSampler has no use_gpu argument
    + [(PrioritizedSliceSampler, hints) for hints in _HINTS if "compile" in hints],
)
def test_compile_and_use_gpu_are_accepted_and_change_nothing(cls, hints):
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(60), episodes([6, 12, 30, 12]))
    plain = _slice_sampler(cls, storage, num_slices=3, traj_key="episode")
    hinted = _slice_sampler(cls, storage, num_slices=3, traj_key="episode", **hints)
    for _ in range(3):
        (index_a, info_a), (index_b, info_b) = plain.sample(storage, 15), hinted.sample(storage, 15)
        assert torch.equal(index_a[0], index_b[0])
        assert info_a.keys() == info_b.keys() and all(torch.equal(info_a[k], info_b[k]) for k in info_a)
    name, value = next(iter(hints.items()))
    assert f"{name}=" in repr(hinted) and f"{name}=" not in repr(plain)
    assert getattr(hinted, name) == (torch.device(value) if isinstance(value, str) else value)


# -- end_keys ------------------------------------------------------------------------------------------------
def _flagged_steps(n: int = 40) -> TensorDict:
    """Steps ended by terminated (rows 9, 24) or truncated (rows 4, 16, 31) flags; no ("next", "done")."""
    terminated = torch.zeros(n, 1, dtype=torch.bool)
    truncated = torch.zeros(n, 1, dtype=torch.bool)
    terminated[[9, 24]] = True
    truncated[[4, 16, 31]] = True
    return TensorDict({"t": torch.arange(n), TERM: terminated, TRUNC: truncated}, [n])


@pytest.mark.parametrize("cls", SLICE_CLASSES)
@pytest.mark.parametrize(
    "kwargs, lengths",
    [
        ({"end_keys": [TERM, TRUNC]}, [5, 5, 7, 8, 7, 8]),
        ({"end_keys": [TERM, "not_stored", TRUNC]}, [5, 5, 7, 8, 7, 8]),
        ({"end_keys": [TERM, "not_stored"]}, [10, 15, 15]),
        ({"end_keys": (TERM,)}, [10, 15, 15]),
        ({"end_key": TERM}, [10, 15, 15]),
    ],
)
def test_end_keys_are_or_ed_and_missing_ones_skipped(cls, kwargs, lengths):
    storage = LazyTensorStorage(50)
    data = _flagged_steps()
    storage.set(torch.arange(40), data)
    sampler = _slice_sampler(cls, storage, num_slices=4, **kwargs)
    assert sampler._boundaries(storage).index.lengths.tolist() == lengths
    ends = torch.tensor(lengths).cumsum(0) - 1
    segment = torch.bucketize(torch.arange(40), ends)  # trajectory of each step
    for _ in range(5):
        index, info = sampler.sample(storage, 20)
        seg = segment[index[0]].view(-1, 5)
        assert (seg == seg[:, :1]).all()
        assert (data["t"][index[0]].view(-1, 5).diff(dim=1) == 1).all()
        stored = torch.zeros(40, 1, dtype=torch.bool)
        stored[ends] = True  # ("next", "done") is not stored: the done info is the end flags used
        assert torch.equal(info[DONE], stored[index[0]] | info[TRUNC])


@pytest.mark.parametrize(
    "kwargs, entries, lengths",
    [
        ({"end_keys": ["a", "b"]}, {"episode": torch.arange(20) // 4}, [4] * 5),
        ({"end_keys": ["a"], "traj_key": "episode"}, {"episode": torch.arange(20) // 10}, [10, 10]),
        ({"end_key": "a"}, {("collector", "traj_ids"): torch.arange(20) // 5}, [5] * 4),
        ({"traj_key": "missing"}, {DONE: (torch.arange(20) % 10 == 9).unsqueeze(-1)}, [10, 10]),
    ],
    ids=["end_keys->episode", "end_keys->traj_key", "end_key->collector", "traj_key->done"],
)
@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyStackStorage])
def test_missing_keys_fall_back_to_the_other_kind(kwargs, entries, lengths, storage_cls):
    storage = storage_cls(20)
    rows = torch.arange(20) if storage_cls is LazyTensorStorage else list(range(20))
    storage.set(rows, TensorDict(entries, [20]))
    sampler = SliceSampler(slice_len=2, **kwargs)
    assert sampler._boundaries(storage).index.lengths.tolist() == lengths


def test_no_stored_end_key_nor_trajectory_id_names_every_key_tried():
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(4), TensorDict(obs=torch.zeros(4, 1), batch_size=[4]))
    tried = r"\['a', 'b', \('collector', 'traj_ids'\), 'episode'\]"
    with pytest.raises(RuntimeError, match=tried + r" \(from end_keys=\('a', 'b'\)\)"):
        SliceSampler(slice_len=2, end_keys=["a", "b"]).sample(storage, 4)


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyStackStorage])
def test_an_end_key_naming_a_group_of_entries_says_to_pass_a_list(storage_cls):
    storage = storage_cls(20)
    data = episodes([10, 10])
    storage.set(torch.arange(20) if storage_cls is LazyTensorStorage else list(range(20)), data)
    sampler = SliceSampler(slice_len=2, end_keys=("next", "done"))  # two keys, "next" and "done"
    with pytest.raises(ValueError, match=r"'next' is a group of entries.*end_keys=\[\('next', 'done'\)"):
        sampler.sample(storage, 4)


# -- is_init -------------------------------------------------------------------------------------------------
_IS_INIT_MODES = {
    "strict": {},
    "span": {"span": (0, 2)},
    "left_span": {"span": True},
    "pad": {"strict_length": False, "pad_output": True, "span": True},
    "drop": {"strict_length": False, "span": (2, 1)},
    "non_strict": {"strict_length": False},  # short trajectories give short slices
}


def _with_is_init(lengths, extra_every: int = 7) -> TensorDict:
    """``episodes(lengths)`` plus a stored ``is_init``: True at each trajectory start and every few steps."""
    data = episodes(lengths)
    n = data.shape[0]
    is_init = torch.zeros(n, 1, dtype=torch.bool)
    is_init[torch.as_tensor(lengths).cumsum(0) - torch.as_tensor(lengths)] = True
    is_init[::extra_every] = True
    data["is_init"] = is_init
    return data


def _slice_firsts(info, slice_len: int, dropped: bool) -> torch.Tensor:
    """The first step of each slice: position 0 of each, or (short slices) the step after a slice's last."""
    truncated = info[TRUNC].view(-1)
    if not dropped:
        return (torch.arange(truncated.numel()) % slice_len == 0).unsqueeze(-1)
    return torch.cat([torch.ones(1, dtype=torch.bool), truncated[:-1]]).unsqueeze(-1)


@pytest.mark.parametrize(
    "cls, mode",
    [(SliceSampler, mode) for mode in _IS_INIT_MODES]
    + [(SliceSamplerWithoutReplacement, "strict"), (SliceSamplerWithoutReplacement, "non_strict")]
    + [(PrioritizedSliceSampler, mode) for mode in ("strict", "span", "non_strict")],
)
def test_is_init_marks_slice_starts_and_stored_init_steps(cls, mode):
    kwargs = dict(_IS_INIT_MODES[mode])
    storage = LazyTensorStorage(100)
    data = _with_is_init([3, 8, 12, 2, 9])
    storage.set(torch.arange(34), data)
    sampler = _slice_sampler(cls, storage, num_slices=5, traj_key="episode", **kwargs)
    for _ in range(10):
        index, info = sampler.sample(storage, 20)
        is_init = info["is_init"]
        assert is_init.dtype == torch.bool and is_init.shape == (index[0].numel(), 1)
        # PrioritizedSliceSampler stops a spanned slice at its trajectory's end (as TorchRL) instead of clamping
        dropped = mode in ("drop", "non_strict") or (cls is PrioritizedSliceSampler and mode == "span")
        expected = _slice_firsts(info, 4, dropped=dropped) | data["is_init"][index[0]]
        assert torch.equal(is_init, expected)


@pytest.mark.parametrize("cls", SLICE_CLASSES)
def test_is_init_only_when_stored_and_independent_of_truncated_key(cls):
    storage = LazyTensorStorage(40)
    storage.set(torch.arange(40), episodes([10] * 4))
    assert "is_init" not in _slice_sampler(cls, storage, slice_len=5).sample(storage, 10)[1]
    storage = LazyTensorStorage(40)
    storage.set(torch.arange(40), _with_is_init([10] * 4))
    _, info = _slice_sampler(cls, storage, slice_len=5, truncated_key=None).sample(storage, 10)
    expected = {"is_init", "priority_weight"} if cls is PrioritizedSliceSampler else {"is_init"}
    assert set(info) == expected
    assert info["is_init"].view(-1, 5)[:, 0].all()


def test_is_init_on_ndim2_storage_and_through_a_buffer():
    data = torch.stack([_with_is_init([6, 6], extra_every=5), _with_is_init([4, 8], extra_every=3)], 1)
    storage = LazyTensorStorage(24, ndim=2)
    storage.set(torch.arange(12), data)
    sampler = SliceSampler(slice_len=3, traj_key="episode")
    index, info = sampler.sample(storage, 30)
    first = (torch.arange(30) % 3 == 0).unsqueeze(-1)
    assert torch.equal(info["is_init"], first | data["is_init"][index])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler, batch_size=12)
    rb.extend(_with_is_init([10, 10], extra_every=50))  # stored True only at trajectory starts
    batch = rb.sample()
    assert batch["is_init"].view(4, 3)[:, 0].all()
    assert torch.equal(batch["is_init"].view(4, 3)[:, 1:], (batch["t"].view(4, 3) % 10 == 0)[:, 1:])


# -- replacement= --------------------------------------------------------------------------------------------
def test_slice_sampler_replacement_false_builds_slice_sampler_without_replacement():
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(60), episodes([10] * 6))
    sampler = SliceSampler(
        num_slices=2, end_keys=[DONE], strict_length=False, compile=True, replacement=False, shuffle=False
    )
    assert type(sampler) is SliceSamplerWithoutReplacement
    assert sampler.end_keys == (DONE,) and sampler.strict_length is False and sampler.compile is True
    assert sampler.shuffle is False and sampler.drop_last is False
    seen = []
    while not sampler.ran_out:
        index, _ = sampler.sample(storage, 10)
        seen += storage.get(index)["episode"][::5].tolist()
    assert seen == list(range(6))


@pytest.mark.parametrize(
    "name, value", [("cache_values", True), ("cache_values", False), ("pad_output", True)]
)
def test_slice_sampler_replacement_false_refuses_what_the_class_without_replacement_lacks(name, value):
    kwargs = {name: value, "strict_length": not (name == "pad_output")}
    with pytest.raises(TypeError, match=rf"SliceSamplerWithoutReplacement, which does not take `{name}`"):
        SliceSampler(slice_len=2, replacement=False, **kwargs)
    with pytest.raises(TypeError, match=r"`span`.*\(got span=2\).*SliceSampler without `replacement`"):
        SliceSampler(slice_len=2, replacement=False, span=2)


def _without(**kwargs):
    return SliceSamplerWithoutReplacement(num_slices=2, **kwargs)


def _prioritized_slices(**kwargs):
    return PrioritizedSliceSampler(10, 1.0, 1.0, num_slices=2, **kwargs)


@pytest.mark.parametrize(
    "build, replacement, expected",
    [
        (lambda **kw: SliceSampler(slice_len=2, **kw), True, SliceSampler),
        (_without, False, SliceSamplerWithoutReplacement),
        (_prioritized_slices, True, PrioritizedSliceSampler),
        (_without, True, r"SliceSamplerWithoutReplacement samples without replacement.*Use SliceSampler"),
        (_prioritized_slices, False, "PrioritizedSliceSampler has no without-replacement variant"),
    ],
    ids=["slice-true", "without-false", "prioritized-true", "without-true", "prioritized-false"],
)
def test_replacement_on_each_slice_sampler(build, replacement, expected):
    if isinstance(expected, str):
        with pytest.raises(TypeError, match=expected):
            build(replacement=replacement)
        return
    sampler = build(replacement=replacement)
    assert type(sampler) is expected and repr(sampler) == repr(build())


@pytest.mark.parametrize(
    "round_trip", [lambda obj: pickle.loads(pickle.dumps(obj)), copy.deepcopy], ids=["pickle", "deepcopy"]
)
@pytest.mark.parametrize(
    "build",
    [
        lambda: SliceSampler(
            num_slices=3, end_keys=[DONE, TERM], cache_values=True, compile={"mode": "default"}, use_gpu=True
        ),
        lambda: SliceSampler(num_slices=3, traj_key="episode", replacement=False, drop_last=True),
        lambda: PrioritizedSliceSampler(60, 0.8, 0.5, num_slices=3, end_keys=[DONE], compile=True),
    ],
    ids=["slice", "without_replacement", "prioritized"],
)
def test_slice_samplers_pickle_and_copy_with_their_new_arguments(build, round_trip):
    storage = LazyTensorStorage(60)
    storage.set(torch.arange(60), _with_is_init([10, 12, 8, 14, 16]))
    sampler = build()
    sampler.extend(torch.arange(60))
    if isinstance(sampler, PrioritizedSliceSampler):
        sampler.update_priority(torch.arange(60), torch.rand(60, generator=torch.Generator().manual_seed(0)))
    sampler.sample(storage, 12)  # fills caches, moves an epoch forward
    clone = round_trip(sampler)
    assert type(clone) is type(sampler) and repr(clone) == repr(sampler)
    for s in (sampler, clone):
        s._rng = torch.Generator().manual_seed(7)
    (index_a, info_a), (index_b, info_b) = sampler.sample(storage, 12), clone.sample(storage, 12)
    assert torch.equal(index_a[0], index_b[0])
    assert info_a.keys() == info_b.keys() and all(torch.equal(info_a[k], info_b[k]) for k in info_a)
