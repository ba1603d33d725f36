"""``PrioritizedSampler`` on the torch kernel: ``device=`` and ``max_pending=``, the switch to tensor trees for
compilable or accelerator storages, the same draws as the numpy kernel for the same generator, no host sync on
``mark_update``/``sample``/``update_priority``, one ``torch.compile(fullgraph=True)`` graph, and the state
(``state_dict``, pickling) shared with the numpy kernel's layout."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
import torch._dynamo.testing
from helpers.syncs import SyncCounter

from torchrl.data import LazyTensorStorage, PrioritizedSampler
from torchrl.data.replay_buffers.samplers import _tree_kernels

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def torch_kernel(monkeypatch):
    """What ``TORCHRL_SEGMENT_TREE_KERNEL=torch`` sets at import."""
    monkeypatch.setattr(_tree_kernels, "DEFAULT_KERNEL", "torch")


def _storage(n: int = 50, capacity: int = 100, **kwargs) -> LazyTensorStorage:
    storage = LazyTensorStorage(capacity, **kwargs)
    storage.set(torch.arange(n), torch.arange(n))
    return storage


def _leaves(sampler: PrioritizedSampler) -> torch.Tensor:
    return torch.as_tensor(sampler.state_dict()["_sum_tree"]["values"])


# -- arguments -------------------------------------------------------------------------------------------------
def test_device_and_max_pending_defaults_and_properties():
    sampler = PrioritizedSampler(8, 0.7, 0.5)
    assert sampler.device == torch.device("cpu") and sampler.max_pending == 64
    assert sampler.kernel in ("numpy", "numba")
    assert PrioritizedSampler(8, 0.7, 0.5, max_pending=0).max_pending == 0


def test_bad_device_and_max_pending_are_refused_naming_them():
    with pytest.raises(ValueError, match="max_pending must be greater or equal to 0"):
        PrioritizedSampler(8, 0.7, 0.5, max_pending=-1)
    with pytest.raises(TypeError, match="`max_pending` must be an int"):
        PrioritizedSampler(8, 0.7, 0.5, max_pending=2.5)
    with pytest.raises(ValueError, match="`device`='meta'"):
        PrioritizedSampler(8, 0.7, 0.5, device="meta")
    with pytest.raises(TypeError, match="`device` must be"):
        PrioritizedSampler(8, 0.7, 0.5, device=object())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_a_cuda_device_without_cuda_says_what_to_pass():
    with pytest.raises(RuntimeError, match="CUDA prioritized replay buffers require a CUDA device.*device=None"):
        PrioritizedSampler(8, 0.7, 0.5, device="cuda")


# -- which kernel ----------------------------------------------------------------------------------------------
def test_the_environment_kernel_puts_the_trees_in_tensors(torch_kernel):
    sampler = PrioritizedSampler(8, 0.7, 0.5)
    assert sampler.kernel == "torch" and sampler.device == torch.device("cpu")


@pytest.mark.parametrize("device", [None, "cpu"])
def test_a_compilable_storage_moves_the_trees_to_tensors_with_their_priorities(device):
    storage = _storage(compilable=True)
    sampler = PrioritizedSampler(100, 0.7, 0.5, device=device)
    sampler.extend(torch.arange(50))
    sampler.update_priority(torch.arange(10), torch.arange(10.0))
    before = sampler.state_dict()
    assert sampler.kernel != "torch"
    sampler.update_priority(torch.arange(3), torch.tensor([1.0, 2.0, 3.0]), storage=storage)
    assert sampler.kernel == "torch" and sampler.device == torch.device("cpu")
    after = sampler.state_dict()
    assert after["_max_priority"] == before["_max_priority"] == (9.0, 9)
    torch.testing.assert_close(after["_priority"][3:], before["_priority"][3:], equal_nan=True)


# -- the same draws as the numpy kernel ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_torch_kernel_draws_what_the_numpy_kernel_draws_for_one_generator(monkeypatch, dtype):
    storage = _storage(60, 128)
    priorities = torch.randint(0, 6, (60,)).double()  # (p + 0) ** 1: exact sums in both kernels
    runs = {}
    for kernel in ("numpy", "torch"):
        monkeypatch.setattr(_tree_kernels, "DEFAULT_KERNEL", kernel)
        sampler = PrioritizedSampler(128, alpha=1.0, beta=0.5, eps=0.0, dtype=dtype)
        assert sampler.kernel == kernel
        sampler._rng = torch.Generator().manual_seed(3)
        sampler.extend(torch.arange(60))
        sampler.update_priority(torch.arange(60), priorities)
        draws = [sampler.sample(storage, 64) for _ in range(3)]
        runs[kernel] = draws
    for (i_np, info_np), (i_t, info_t) in zip(runs["numpy"], runs["torch"]):
        assert torch.equal(i_np, i_t)
        assert info_t["priority_weight"].dtype == dtype
        torch.testing.assert_close(info_np["priority_weight"], info_t["priority_weight"])


def test_the_torch_kernel_draws_in_proportion_to_priorities(torch_kernel):
    storage = _storage(10, 16)
    sampler = PrioritizedSampler(16, alpha=1.0, beta=1.0, eps=0.0)
    sampler._rng = torch.Generator().manual_seed(0)
    priority = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 5.0, 1.0, 2.0, 3.0])
    sampler.extend(torch.arange(10))
    sampler.update_priority(torch.arange(10), priority)
    index, info = sampler.sample(storage, 42000)
    counts = torch.bincount(index, minlength=10).double()
    assert counts[0] == 0 and counts[5] == 0
    keep = priority > 0
    expected = 42000 * priority[keep].double() / priority.sum()
    chi2 = float(((counts[keep] - expected) ** 2 / expected).sum())
    assert chi2 < 35, chi2  # 7 dof: far beyond the 99.99% quantile (~26)
    torch.testing.assert_close(info["priority_weight"], (priority[index] / 1.0) ** -1.0)


# -- no host sync ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compilable", [False, True])
@pytest.mark.parametrize("within_buffer", [False, True])
def test_mark_update_sample_and_update_priority_make_no_host_sync(torch_kernel, compilable, within_buffer):
    storage = _storage(compilable=compilable)
    sampler = PrioritizedSampler(100, 0.7, 0.5, max_priority_within_buffer=within_buffer, max_pending=2)
    sampler.extend(torch.arange(50))  # first call (the kernel choice) outside the count
    with SyncCounter() as syncs:
        for _ in range(4):
            sampler.mark_update(torch.arange(20, 30), storage=storage)
            index, info = sampler.sample(storage, 32)
            sampler.update_priority(index, torch.rand(32) + 0.01, storage=storage)
            sampler.update_priority((index,), torch.rand(32, 3))  # reduced per item
            sampler.mark_update(torch.tensor([3, -1, 200]))  # skipped entries
    assert syncs.count == 0, syncs.ops


# -- torch.compile -----------------------------------------------------------------------------------------------
def test_sample_and_update_priority_compile_into_one_graph_that_stops_recompiling():
    storage = _storage(compilable=True)
    sampler = PrioritizedSampler(100, 0.7, 0.5)
    sampler.mark_update(torch.arange(50), storage=storage)
    assert sampler.kernel == "torch"
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(backend=counter, fullgraph=True)
    def step(priority):
        index, info = sampler.sample(storage, 32)
        sampler.update_priority(index, priority)
        return index, info["priority_weight"]

    frames = []
    for _ in range(50):
        index, weight = step(torch.rand(32) + 0.01)
        frames.append(counter.frame_count)
    assert frames[2] == frames[-1], frames
    assert index.shape == (32,) and bool((index < 50).all()) and bool((weight > 0).all())


def test_a_compiled_step_gives_the_eager_draws():
    storage = _storage(compilable=True)
    eager = PrioritizedSampler(100, 0.7, 0.5)
    eager.mark_update(torch.arange(50), storage=storage)
    compiled = copy.deepcopy(eager)

    def step(sampler, priority):
        index, info = sampler.sample(storage, 16)
        sampler.update_priority(index, priority)
        return index, info["priority_weight"]

    fn = torch.compile(step, backend="eager", fullgraph=True)
    priorities = [torch.rand(16) + 0.01 for _ in range(5)]
    torch.manual_seed(0)
    expected = [step(eager, p) for p in priorities]
    torch.manual_seed(0)
    got = [fn(compiled, p) for p in priorities]
    for (i_e, w_e), (i_c, w_c) in zip(expected, got):
        assert torch.equal(i_e, i_c)
        torch.testing.assert_close(w_e, w_c)


# -- max_pending -------------------------------------------------------------------------------------------------
def test_mark_update_waits_until_more_than_max_pending_calls_wait(torch_kernel):
    sampler = PrioritizedSampler(16, 1.0, 0.5, eps=0.0, max_pending=2)
    tensors = sampler._tensors
    sampler.mark_update(torch.tensor([0]))
    sampler.mark_update(torch.tensor([1]))
    assert tensors.sum_tree.query(0, 16) == 0.0  # two calls wait
    sampler.mark_update(torch.tensor([2]))  # the third one flushes
    assert tensors.sum_tree.query(0, 16) == 3.0 and not tensors.pending
    eager = PrioritizedSampler(16, 1.0, 0.5, eps=0.0, max_pending=0)
    eager.mark_update(torch.tensor([0]))
    assert eager._tensors.sum_tree.query(0, 16) == 1.0


@pytest.mark.parametrize(
    "read",
    [
        lambda s: s.sample(_storage(3, 16), 4),
        lambda s: s.update_priority(torch.tensor([5]), 1.0),
        lambda s: setattr(s, "alpha", 0.5),
        lambda s: s.state_dict(),
        lambda s: pickle.dumps(s),
    ],
    ids=["sample", "update_priority", "alpha", "state_dict", "pickle"],
)
def test_every_read_of_the_state_writes_the_waiting_calls_first(torch_kernel, read):
    sampler = PrioritizedSampler(16, 1.0, 0.5, eps=0.0)
    sampler.mark_update(torch.tensor([0, 1, 2]))
    assert sampler._tensors.pending
    read(sampler)
    assert not sampler._tensors.pending
    assert sampler._tensors.raw[:3].tolist() == [1.0, 1.0, 1.0]


def test_a_later_priority_wins_over_a_waiting_default(torch_kernel):
    sampler = PrioritizedSampler(16, 1.0, 0.5, eps=0.0)
    sampler.mark_update(torch.tensor([0, 1]))
    sampler.update_priority(torch.tensor([1]), torch.tensor([4.0]))
    sampler.mark_update(torch.tensor([2]))  # the default is now 4
    state = sampler.state_dict()
    assert torch.as_tensor(state["_priority"])[:3].tolist() == [1.0, 4.0, 4.0]
    assert state["_max_priority"] == (4.0, 1)


def test_empty_and_load_state_dict_drop_the_waiting_calls(torch_kernel):
    sampler = PrioritizedSampler(16, 1.0, 0.5)
    state = sampler.state_dict()
    sampler.mark_update(torch.tensor([0, 1]))
    sampler.load_state_dict(state)
    assert not sampler._tensors.pending and sampler.state_dict()["_max_priority"] == (None, -1)
    sampler.mark_update(torch.tensor([0, 1]))
    sampler._empty()
    assert not sampler._tensors.pending and float(_leaves(sampler).sum()) == 0.0


# -- state -------------------------------------------------------------------------------------------------------
def test_the_state_dict_moves_between_the_kernels(monkeypatch):
    storage = _storage(40, 64)
    states = {}
    samplers = {}
    for kernel in ("numpy", "torch"):
        monkeypatch.setattr(_tree_kernels, "DEFAULT_KERNEL", kernel)
        samplers[kernel] = PrioritizedSampler(64, 0.7, 0.5, dtype=torch.float64)
    source = samplers["numpy"]
    source.extend(torch.arange(40))
    source.update_priority(torch.arange(0, 40, 3), torch.arange(14.0))
    samplers["torch"].load_state_dict(source.state_dict())
    states = {k: s.state_dict() for k, s in samplers.items()}
    for key in ("_priority", "_max_priority", "_alpha"):
        a, b = states["numpy"][key], states["torch"][key]
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, equal_nan=True)
        else:
            assert a == b
    torch.testing.assert_close(states["torch"]["_sum_tree"]["values"], states["numpy"]["_sum_tree"]["values"])
    assert torch.equal(states["torch"]["_min_tree"]["values"], states["numpy"]["_min_tree"]["values"])
    back = PrioritizedSampler(64, 0.7, 0.5, dtype=torch.float64, device="cpu")
    back.load_state_dict(states["torch"])  # into numpy trees
    for s in (*samplers.values(), back):
        s._rng = torch.Generator().manual_seed(1)
    draws = [s.sample(storage, 32)[0] for s in (samplers["numpy"], samplers["torch"], back)]
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])


def test_pickling_keeps_every_leaf_and_the_kernel(torch_kernel):
    sampler = PrioritizedSampler(5, 1.0, 0.5, eps=0.0)  # trees of 8 positions
    sampler.update_priority(torch.tensor([1, 7]), torch.tensor([2.0, 3.0]))
    copy_ = pickle.loads(pickle.dumps(sampler))
    assert copy_.kernel == "torch" and float(_leaves(copy_)[7]) == 3.0 and copy_.default_priority == 3.0


def test_alpha_changes_re_express_the_tensor_priorities(monkeypatch):
    results = {}
    for kernel in ("numpy", "torch"):
        monkeypatch.setattr(_tree_kernels, "DEFAULT_KERNEL", kernel)
        sampler = PrioritizedSampler(16, 0.7, 0.5)
        sampler.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 0.0]))
        sampler.alpha = 0.3
        results[kernel] = _leaves(sampler)
    torch.testing.assert_close(results["torch"], results["numpy"])
    monkeypatch.setattr(_tree_kernels, "DEFAULT_KERNEL", "torch")
    zero = PrioritizedSampler(16, 0.0, 0.5)
    zero.update_priority(torch.arange(2), torch.tensor([1.0, 2.0]))
    with pytest.warns(UserWarning, match="away from 0"):
        zero.alpha = 0.5


def test_tensor_trees_are_not_shared_with_workers(torch_kernel):
    with pytest.raises(RuntimeError, match="not shared with worker processes.*num_workers=0"):
        PrioritizedSampler(8, 0.7, 0.5).share_memory_()


def test_a_two_dimensional_storage_takes_coordinates(torch_kernel):
    storage = LazyTensorStorage(24, ndim=2)
    storage.set(torch.arange(4), torch.zeros(4, 6))  # a [4, 6] grid of cells
    assert len(storage) == 24
    sampler = PrioritizedSampler(24, 1.0, 0.5, eps=0.0)
    sampler.mark_update(torch.arange(24), storage=storage)
    sampler.update_priority((torch.tensor([0, 3]), torch.tensor([5, 1])), torch.tensor([0.0, 7.0]), storage=storage)
    assert torch.as_tensor(sampler.state_dict()["_priority"])[[5, 19]].tolist() == [0.0, 7.0]
    index, info = sampler.sample(storage, 64)
    assert isinstance(index, tuple) and len(index) == 2
    assert not bool(((index[0] == 0) & (index[1] == 5)).any())  # priority 0: never drawn


# -- on a GPU ------------------------------------------------------------------------------------------------------
@needs_cuda
def test_a_cuda_storage_gets_cuda_trees_and_no_sync():
    storage = _storage(50, 100, device="cuda")
    sampler = PrioritizedSampler(100, 0.7, 0.5)
    sampler.mark_update(torch.arange(50, device="cuda"), storage=storage)
    assert sampler.device.type == "cuda" and sampler.kernel == "torch"
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            index, info = sampler.sample(storage, 64)
            sampler.update_priority(index, torch.rand(64, device="cuda") + 0.01)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert index.device.type == "cuda" and info["priority_weight"].device.type == "cuda"


@needs_cuda
def test_cuda_trees_over_a_cpu_storage_return_cpu_indices():
    storage = _storage(50, 100)
    sampler = PrioritizedSampler(100, 0.7, 0.5, device="cuda")
    sampler.mark_update(torch.arange(50), storage=storage)
    index, info = sampler.sample(storage, 8)
    assert sampler.device.type == "cuda" and index.device.type == "cpu"
    assert info["priority_weight"].device.type == "cpu" and np.all(index.numpy() < 50)


# -- in a buffer ---------------------------------------------------------------------------------------------------
def _buffer(compilable: bool):
    from tensordict import TensorDict

    from torchrl.data import TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(1000, compilable=compilable),
        sampler=PrioritizedSampler(1000, 0.7, 0.5),
        batch_size=256,
        compilable=compilable,
    )
    data = TensorDict({"obs": torch.randn(64, 4)}, [64])
    rb.extend(data)
    return rb, data


def test_a_compilable_buffer_extends_samples_and_updates_without_a_host_sync():
    rb, data = _buffer(compilable=True)
    assert rb.sampler.kernel == "torch"
    with SyncCounter() as syncs:
        for _ in range(3):
            rb.extend(data)
            batch = rb.sample()
            rb.update_priority(batch["index"], torch.rand(256) + 0.01)
    assert syncs.count == 0, syncs.ops


def test_a_compiled_extend_sample_and_priority_update_stops_recompiling_while_the_ring_wraps():
    rb, data = _buffer(compilable=True)
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(backend=counter, fullgraph=True)
    def step(priority):
        rb.extend(data)
        batch = rb.sample()
        rb.sampler.update_priority(batch["index"], priority)
        return batch

    frames = []
    for _ in range(40):  # 40 x 64 rows: the ring of 1000 wraps twice
        batch = step(torch.rand(256) + 0.01)
        frames.append(counter.frame_count)
    assert frames[2] == frames[-1], frames
    assert len(rb) == 1000 and batch["priority_weight"].shape == (256,)


def test_a_checkpoint_of_tensor_trees_loads_back(torch_kernel, tmp_path):
    sampler = PrioritizedSampler(32, 0.7, 0.5)
    sampler.mark_update(torch.arange(20))
    sampler.update_priority(torch.tensor([2, 5]), torch.tensor([3.0, 0.5]))
    sampler.dumps(tmp_path / "s")
    loaded = PrioritizedSampler(32, 0.7, 0.5)
    loaded.loads(tmp_path / "s")
    a, b = sampler.state_dict(), loaded.state_dict()
    assert loaded.kernel == "torch" and a["_max_priority"] == b["_max_priority"] == (3.0, 2)
    torch.testing.assert_close(a["_priority"], b["_priority"], equal_nan=True)
    torch.testing.assert_close(a["_sum_tree"]["values"], b["_sum_tree"]["values"])
