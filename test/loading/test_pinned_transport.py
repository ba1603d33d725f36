"""Pinned transport to the device: ``loader(pin_memory=True)``, ``DataLoader(pin_memory=True)`` with
``tensordict_collate``, and ``ReplayBuffer(pin_memory=True)`` with a :class:`DeviceCastTransform`.

Pinning needs an accelerator runtime (on a CPU-only torch, ``Tensor.pin_memory()`` raises): on the CPU these tests
check that the flag reaches the DataLoader, that batches stay TensorDicts with the values of unpinned batches, and
that a device cast copies with ``non_blocking=True`` (on the ``meta`` device); ``is_pinned()`` is asserted with CUDA.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
    tensordict_collate,
)
from torchrl.data.replay_buffers.loading.pinning import pin_host_memory
from torchrl.envs.transforms import DeviceCastTransform

B = 8
N = 64
TIMEOUT = 60
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def _data(n: int = N) -> TensorDict:
    ids = torch.arange(n)
    return TensorDict({"obs": ids.float().unsqueeze(-1).expand(n, 3).clone(), "idx": ids,
                       ("next", "obs"): ids.float().unsqueeze(-1) + 0.5}, batch_size=[n])


def _buffer(seed: int = 0, cls=TensorDictReplayBuffer, **kwargs) -> ReplayBuffer:
    return make_buffer(cls=cls, capacity=N, batch_size=B, seed=seed, data=_data(), **kwargs)


def _leaves(td: TensorDict) -> list[torch.Tensor]:
    return list(td.values(include_nested=True, leaves_only=True))


def _quiet(fn):
    """``fn()`` without torch's warning that pinning is skipped when no accelerator is present."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*", category=UserWarning)
        return fn()


def assert_same_batches(pinned: list, plain: list) -> None:
    assert len(pinned) == len(plain) > 0
    for got, want in zip(pinned, plain):
        assert isinstance(got, TensorDict) and got.batch_size == want.batch_size
        assert set(got.keys(True, True)) == set(want.keys(True, True))
        assert (got == want).all()
        assert (got["obs"][:, 0] == got["idx"].float()).all() and (got["next", "obs"][:, 0] == got["idx"] + 0.5).all()
        if CUDA:
            assert all(leaf.is_pinned() for leaf in _leaves(got))


class ToCalls(TorchFunctionMode):
    """Records ``(source is pinned, target device, non_blocking)`` of every ``Tensor.to`` call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            source = args[0]
            pinned = source.device.type == "cpu" and CUDA and source.is_pinned()
            self.calls.append((pinned, kwargs.get("device"), kwargs.get("non_blocking", False)))
        return func(*args, **kwargs)


# -- rb.as_dataset(...).loader(pin_memory=True) ---------------------------------------------------------------------
def test_loader_pin_memory_reaches_the_dataloader():
    loader = _buffer().as_dataset(num_batches=2).loader(pin_memory=True)
    assert loader.pin_memory is True
    assert loader.collate_fn is tensordict_collate and loader.batch_size is None


def test_loader_pin_memory_gives_the_unpinned_batches_in_process():
    pinned = _quiet(lambda: list(_buffer(seed=3).as_dataset(num_batches=4).loader(pin_memory=True)))
    plain = list(_buffer(seed=3).as_dataset(num_batches=4).loader())
    assert_same_batches(pinned, plain)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["ring", "torch"])
def test_loader_pin_memory_gives_the_unpinned_batches_from_workers(transport):
    def run(**kwargs):
        loader = _buffer(seed=5).as_dataset(num_batches=6, transport=transport).loader(
            num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT,
            generator=torch.Generator().manual_seed(11), **kwargs)
        return list(loader)

    assert_same_batches(_quiet(lambda: run(pin_memory=True)), run())


# -- DataLoader(..., pin_memory=True, collate_fn=tensordict_collate) -----------------------------------------------
def test_dataloader_pin_memory_over_a_replay_buffer_dataset():
    def run(**kwargs):
        return list(DataLoader(_buffer(seed=1).as_dataset(num_batches=3), batch_size=None,
                               collate_fn=tensordict_collate, **kwargs))

    assert_same_batches(_quiet(lambda: run(pin_memory=True)), run())


@pytest.mark.parametrize("storage", ["lazy", "memmap"])
def test_dataloader_pin_memory_over_a_storage_dataset(storage, tmp_path):
    def run(**kwargs):
        where = tmp_path / ("pinned" if kwargs else "plain")
        store = LazyTensorStorage(N) if storage == "lazy" else LazyMemmapStorage(N, scratch_dir=where)
        store.set(torch.arange(N), _data())
        return list(DataLoader(store.as_dataset(), batch_size=B, collate_fn=tensordict_collate, **kwargs))

    pinned = _quiet(lambda: run(pin_memory=True))
    assert_same_batches(pinned, run())
    assert torch.equal(torch.cat([b["idx"] for b in pinned]), torch.arange(N))


# -- ReplayBuffer(pin_memory=True) and a device cast ---------------------------------------------------------------
# A plain ReplayBuffer of TensorDicts: a TensorDictReplayBuffer adds the sampler's info ("index") to the batch after
# the transforms, outside what the buffer pins.
def test_buffer_pin_memory_keeps_the_sampled_values():
    pinned, plain = _buffer(seed=2, cls=ReplayBuffer, pin_memory=True), _buffer(seed=2, cls=ReplayBuffer)
    assert_same_batches([pinned.sample() for _ in range(3)], [plain.sample() for _ in range(3)])


def test_buffer_device_cast_copies_non_blocking():
    """On the meta device: every sampled leaf is copied with ``non_blocking=True`` (tensordict's default for a
    TensorDict; see NOTE [non-blocking device casts] in torchrl/envs/transforms/device_cast.py)."""
    rb = _buffer(seed=4, cls=ReplayBuffer, pin_memory=True, transform=DeviceCastTransform("meta"))
    with ToCalls() as calls:
        batch = rb.sample()
    assert all(leaf.device.type == "meta" for leaf in _leaves(batch))
    to_meta = [c for c in calls.calls if c[1] == torch.device("meta")]
    assert len(to_meta) >= 3  # obs, idx, ("next", "obs")
    assert all(non_blocking for _, _, non_blocking in to_meta)


@needs_cuda
@pytest.mark.parametrize("storage", ["lazy", "memmap"])
def test_buffer_device_cast_copies_non_blocking_from_pinned_memory(storage, tmp_path):
    store = LazyTensorStorage(N) if storage == "lazy" else LazyMemmapStorage(N, scratch_dir=tmp_path / "s")
    rb = make_buffer(cls=ReplayBuffer, storage=store, batch_size=B, seed=0, data=_data(), pin_memory=True,
                     transform=DeviceCastTransform("cuda"))
    with ToCalls() as calls:
        batch = rb.sample()
    torch.cuda.synchronize()
    assert all(leaf.device.type == "cuda" for leaf in _leaves(batch))
    assert (batch["obs"][:, 0] == batch["idx"].float()).all()
    to_cuda = [c for c in calls.calls if c[1] is not None and torch.device(c[1]).type == "cuda"]
    assert to_cuda and all(pinned and non_blocking for pinned, _, non_blocking in to_cuda)


@needs_cuda
def test_buffer_pin_memory_pins_every_leaf():
    batch = _buffer(cls=ReplayBuffer, pin_memory=True).sample()
    assert all(leaf.is_pinned() for leaf in _leaves(batch))


# -- pin_host_memory: what a buffer with pin_memory=True applies to a sampled batch ------------------------------------
@pytest.mark.skipif(CUDA, reason="the CPU-only behaviour")
@pytest.mark.parametrize("make", [lambda: torch.zeros(3), _data, lambda: {"a": torch.zeros(2)}, lambda: "text"],
                         ids=["tensor", "tensordict", "dict", "str"])
def test_pin_host_memory_without_cuda_returns_the_batch_itself(make):
    batch = make()
    assert pin_host_memory(batch) is batch


@needs_cuda
def test_pin_host_memory_pins_host_leaves_and_keeps_device_leaves():
    mixed = TensorDict(host=torch.zeros(3), dev=torch.ones(3, device="cuda"), batch_size=[3])
    assert mixed.device is None
    out = pin_host_memory(mixed)
    assert out["host"].is_pinned() and out["dev"].device.type == "cuda"
    assert all(leaf.is_pinned() for leaf in _leaves(pin_host_memory(_data())))
    on_device = _data().to("cuda")
    assert pin_host_memory(on_device) is on_device
    pinned = torch.zeros(3).pin_memory()
    assert pin_host_memory(pinned).data_ptr() == pinned.data_ptr()  # pinning twice copies nothing
