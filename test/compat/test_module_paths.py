"""TorchRL's module paths inside the replay-buffer packages, and the names each one holds.

TorchRL splits its flat modules into packages of one module per family (``storages.tensor`` holds the three tensor
storages, ``samplers.random`` the uniform samplers, ...). Here the storages and samplers live one per file and those
paths gather the family; the two small writers TorchRL keeps beside their base class live there too
(``writers.base``, ``writers.round_robin``). Whatever the path, it is the same class object as the package's and
``torchrl.data``'s. Also the small
modules TorchRL keeps at such paths: ``storages.store`` (``StoreStorage``) and ``utils``'s
``unravel_index`` (the deprecated buffer names and the collate helpers of ``storages.utils`` are tested in their
areas: ``buffers/test_deprecated_buffer_names.py``, ``storages/test_default_collate_helpers.py``).
"""

from __future__ import annotations

import importlib

import pytest
import torch

import torchrl.data
from torchrl.data import (
    LazyTensorStorage,
    RandomSampler,
    SamplerWithoutReplacement,
)

RB = "torchrl.data.replay_buffers"

#: TorchRL's module path -> the names it holds there (the facts of torchrl_public_api.json).
FAMILIES = {
    f"{RB}.storages.tensor": ("TensorStorage", "LazyTensorStorage", "LazyMemmapStorage"),
    f"{RB}.storages.list": ("ListStorage", "LazyStackStorage", "CompressedListStorage"),
    f"{RB}.samplers.random": ("RandomSampler", "SamplerWithoutReplacement", "ConsumingSampler"),
    f"{RB}.samplers.llm": ("PromptGroupSampler",),
    f"{RB}.writers.base": ("Writer", "ImmutableDatasetWriter"),
    f"{RB}.writers.round_robin": ("RoundRobinWriter", "TensorDictRoundRobinWriter"),
    f"{RB}.replay_buffers.prioritized_tensordict": ("TensorDictPrioritizedReplayBuffer",),
}
CASES = [(path, name) for path, names in FAMILIES.items() for name in names]


@pytest.mark.parametrize(("path", "name"), CASES, ids=[f"{p.removeprefix(RB + '.')}:{n}" for p, n in CASES])
def test_a_torchrl_module_path_gives_the_same_class_as_torchrl_data(path, name):
    namespace: dict = {}
    exec(f"from {path} import {name}", namespace)
    assert namespace[name] is getattr(torchrl.data, name)


@pytest.mark.parametrize("path", [p for p in FAMILIES if not p.endswith(("writers.base", "writers.round_robin"))])
def test_a_family_module_star_import_brings_its_family(path):
    namespace: dict = {}
    exec(f"from {path} import *", namespace)
    assert set(FAMILIES[path]) <= set(namespace)


def test_random_sampler_without_replacement_still_builds_the_sampler_without_replacement():
    """The ``replacement=False`` pair is registered in ``samplers/random.py`` (so ``samplers.random`` can name
    SamplerWithoutReplacement without an import cycle): the dispatch works as before."""
    sampler = RandomSampler(replacement=False, drop_last=True)
    assert type(sampler) is SamplerWithoutReplacement and sampler.drop_last
    storage = LazyTensorStorage(6)
    storage.set(torch.arange(6), torch.arange(6))
    drawn = torch.cat([sampler.sample(storage, 3)[0] for _ in range(2)])
    assert sorted(drawn.tolist()) == list(range(6))  # one epoch: every item once


# -- storages.store: StoreStorage ------------------------------------------------------------------------------------
def test_the_store_module_holds_the_package_s_store_storage():
    store = importlib.import_module(f"{RB}.storages.store")
    assert store.StoreStorage is torchrl.data.StoreStorage
    assert store.__all__ == ["StoreStorage"] and "StoreStorage" in dir(store)


# -- utils.unravel_index --------------------------------------------------------------------------------------------
def test_unravel_index_gives_the_coordinates_of_flat_indices():
    from torchrl.data.replay_buffers.utils import unravel_index

    flat = torch.tensor([[0, 5], [7, 2]])
    rows, cols = unravel_index(flat, (2, 4))
    assert torch.equal(rows, torch.tensor([[0, 1], [1, 0]])) and torch.equal(cols, torch.tensor([[0, 1], [3, 2]]))
    assert all(torch.equal(a, b) for a, b in zip(unravel_index(flat, torch.Size([2, 4])), (rows, cols)))
