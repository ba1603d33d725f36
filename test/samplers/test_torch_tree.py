"""Segment trees as torch tensors (the ``torch`` kernel) and TorchRL's tree names: the same leaves as the numpy
kernel for the same masses, range queries equal to numpy's, batched writes where the last value wins, no host
sync on tensor arguments, TorchRL's documented API and probes, and the kernel's environment variable."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.syncs import SyncCounter

from torchrl.data.replay_buffers import samplers
from torchrl.data.replay_buffers.samplers import _tree_kernels, prioritized
from torchrl.data.replay_buffers.samplers.segment_tree import MinSegmentTree, SumSegmentTree
from torchrl.data.replay_buffers.samplers.tensor_segment_tree import (
    TensorMinSegmentTree,
    TensorSumSegmentTree,
)

DTYPES = [torch.float32, torch.float64]
TREE_NAMES = [
    "SumSegmentTreeFp32",
    "SumSegmentTreeFp64",
    "MinSegmentTreeFp32",
    "MinSegmentTreeFp64",
    "CudaSumSegmentTreeFp32",
    "CudaSumSegmentTreeFp64",
    "CudaMinSegmentTreeFp32",
    "CudaMinSegmentTreeFp64",
]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _pair(size: int, leaves: np.ndarray, dtype: torch.dtype):
    """A numpy sum tree and a torch one holding ``leaves`` (one per leaf of the torch tree's capacity)."""
    tensor_tree = TensorSumSegmentTree(size, dtype=dtype)
    numpy_tree = SumSegmentTree(tensor_tree.capacity, kernel="numpy")
    numpy_tree.set_all(leaves)
    tensor_tree.set_all(torch.from_numpy(leaves))
    return numpy_tree, tensor_tree


# -- the same leaves as the numpy kernel -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [5, 300, 5000])
def test_the_descent_finds_the_numpy_leaves_for_the_same_uniforms(dtype, size):
    rng = np.random.default_rng(size)
    capacity = TensorSumSegmentTree(size).capacity
    leaves = rng.integers(0, 10, capacity).astype(np.float64)  # exact sums in float32 and float64
    leaves[rng.random(capacity) < 0.3] = 0.0
    numpy_tree, tensor_tree = _pair(size, leaves, dtype)
    uniform = rng.random(2000)
    total = tensor_tree.query(0, size)
    mass = torch.from_numpy((1.0 - uniform) * total).to(dtype)  # float32 trees search float32 masses
    found = tensor_tree.scan_lower_bound(mass)
    np.testing.assert_array_equal(found.numpy(), numpy_tree.scan_lower_bound(mass.double().numpy()))
    if dtype is torch.float64:  # the numpy kernel's own draw computes the same masses
        np.testing.assert_array_equal(found.numpy(), numpy_tree.draw(uniform)[0])
    assert (leaves[found.numpy()] > 0).all()
    brute = np.searchsorted(np.cumsum(leaves), mass.double().numpy(), side="left")
    np.testing.assert_array_equal(found.numpy(), brute)


def test_random_float_leaves_give_the_numpy_leaves_but_for_rounding_ties():
    rng = np.random.default_rng(1)
    leaves = rng.random(1 << 14) + 1e-3
    numpy_tree, tensor_tree = _pair((1 << 14) - 1, leaves, torch.float64)
    uniform = rng.random(20000)
    expected = numpy_tree.draw(uniform)[0]
    found = tensor_tree.scan_lower_bound(torch.from_numpy((1.0 - uniform) * numpy_tree.query()))
    assert (found.numpy() == expected).mean() > 0.999


def test_draws_follow_the_leaf_proportions():
    # chi-square of 40000 draws against leaf / total (20 cells, 19 dof: 99.99% quantile ~ 52)
    rng = np.random.default_rng(2)
    leaves = np.zeros(32)
    leaves[:20] = rng.random(20) * 5 + 0.1
    tree = TensorSumSegmentTree(31, dtype=torch.float32)
    tree.set_all(torch.from_numpy(leaves))
    generator = torch.Generator().manual_seed(0)
    mass = (1.0 - torch.rand(40000, generator=generator, dtype=torch.float64)) * tree.query(0, 31)
    counts = np.bincount(tree.scan_lower_bound(mass.float()).numpy(), minlength=32)
    assert counts[20:].sum() == 0
    expected = 40000 * leaves[:20] / leaves.sum()
    chi2 = ((counts[:20] - expected) ** 2 / expected).sum()
    assert chi2 < 52, chi2


# -- range queries -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_range_sums_and_minimums_equal_numpy_s(dtype):
    rng = np.random.default_rng(3)
    size = 1000
    sums, mins = TensorSumSegmentTree(size, dtype=dtype), TensorMinSegmentTree(size, dtype=dtype)
    numpy_sums, numpy_mins = SumSegmentTree(sums.capacity), MinSegmentTree(mins.capacity)
    index = rng.integers(0, size, 700)
    value = rng.integers(1, 50, 700).astype(np.float64)
    for tree in (sums, mins):
        tree.update(torch.from_numpy(index), torch.from_numpy(value).to(dtype))
    numpy_sums.update(index, value)
    numpy_mins.update(index, value)
    starts = rng.integers(0, size, 200)
    ends = np.minimum(starts + rng.integers(0, size, 200), size - 1)  # end < size: a range, not the root
    got_sums = sums.query(torch.from_numpy(starts), torch.from_numpy(ends))
    got_mins = mins.query(torch.from_numpy(starts), torch.from_numpy(ends))
    for k, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        assert float(got_sums[k]) == numpy_sums.query(a, b) == sums.query(a, b)
        expected_min = numpy_mins.query(a, b)
        if expected_min == np.inf:  # an empty range or unwritten leaves: the identity
            assert float(got_mins[k]) == mins.identity_element
        else:
            assert float(got_mins[k]) == expected_min == mins.query(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_batch_of_writes_keeps_the_last_value_of_a_repeated_position(dtype):
    batched, one_by_one = TensorSumSegmentTree(20, dtype=dtype), TensorSumSegmentTree(20, dtype=dtype)
    index = torch.tensor([3, 7, 3, 0, 7, 7, 19, 3])
    value = torch.arange(1.0, 9.0, dtype=dtype)
    batched.update(index, value)
    for i, v in zip(index.tolist(), value.tolist()):
        one_by_one.update(i, v)
    assert torch.equal(batched.leaves, one_by_one.leaves)
    assert batched.query(0, 20) == 8.0 + 6.0 + 4.0 + 7.0
    mins = TensorMinSegmentTree(20, dtype=dtype)
    mins.update(index, value)
    assert mins.query(0, 20) == 4.0 and mins.at(3) == 8.0


def test_tensor_arguments_make_no_host_sync():
    sums, mins = TensorSumSegmentTree(1000), TensorMinSegmentTree(1000)
    index = torch.randint(0, 1000, (256,))
    value = torch.rand(256) + 0.1
    with SyncCounter() as syncs:
        sums.update(index, value)
        mins.update(index, value)
        total = sums.query(torch.tensor(0), torch.tensor(600))
        sums.scan_lower_bound(torch.rand(256) * total)
        mins.query(torch.tensor([0, 10]), torch.tensor([1000, 500]))
        sums.at(index)
    assert syncs.count == 0, syncs.ops


# -- TorchRL's API and probes (facts wave 4, section 2) ------------------------------------------------------
def test_the_eight_names_are_exported_where_torchrl_has_them():
    for name in TREE_NAMES:
        assert name in samplers.__all__ and name in prioritized.__all__
        assert getattr(samplers, name) is getattr(prioritized, name)


@pytest.mark.parametrize("name", ["SumSegmentTreeFp32", "SumSegmentTreeFp64", "MinSegmentTreeFp32", "MinSegmentTreeFp64"])
def test_cpu_trees_have_torchrl_s_properties(name):
    cls = getattr(samplers, name)
    tree = cls(5)
    assert (tree.size, tree.capacity, len(tree)) == (5, 8, 5)
    assert cls(16).capacity == 32
    if name.startswith("Sum"):
        assert tree.identity_element == 0.0
    else:
        dtype = torch.float32 if name.endswith("32") else torch.float64
        assert tree.identity_element == torch.finfo(dtype).max
        assert tree.query(0, 5) == torch.finfo(dtype).max  # an unwritten min tree queries to the dtype's max


def test_scan_lower_bound_answers_torchrl_s_probe():
    tree = samplers.SumSegmentTreeFp64(5)
    tree.update(torch.arange(5), torch.arange(1.0, 6.0, dtype=torch.float64))
    probes = [0, 1, 1.0001, 3, 3.5, 15, 15.0001]
    assert [tree.scan_lower_bound(v) for v in probes] == [0, 0, 1, 1, 2, 4, 5]
    as_tensor = tree.scan_lower_bound(torch.tensor(probes, dtype=torch.float64).reshape(7, 1))
    assert as_tensor.dtype == torch.long and as_tensor.shape == (7, 1)
    as_array = tree.scan_lower_bound(np.array(probes))
    assert isinstance(as_array, np.ndarray) and as_array.tolist() == [0, 0, 1, 1, 2, 4, 5]


def test_reads_and_writes_take_ints_tensors_and_arrays_like_torchrl():
    tree = samplers.SumSegmentTreeFp32(5)
    tree[1] = 2.0
    tree.update(np.array([2, 3]), 1.5)
    tree.update(torch.tensor([4]), torch.tensor([0.5]))
    assert isinstance(tree[1], float) and tree.at(1) == 2.0
    at = tree[torch.tensor([[1, 2], [3, 4]])]
    assert at.shape == (2, 2) and at.dtype == torch.float32 and at.tolist() == [[2.0, 1.5], [1.5, 0.5]]
    assert isinstance(tree[np.array([1, 4])], np.ndarray)
    assert tree.query(1, 3) == 3.5 and tree.query(0, 5) == 5.5
    assert tree.query(np.array([0, 1]), np.array([2, 3])).tolist() == [2.0, 3.5]
    with pytest.raises(RuntimeError, match="expected scalar type Float but found Double"):
        tree.update(torch.tensor([1]), torch.tensor([1.0], dtype=torch.float64))
    with pytest.raises(RuntimeError, match="index must be an int64 tensor"):
        tree.at(torch.tensor([1.0]))


def test_positions_past_size_are_leaves_and_past_capacity_alias_like_torchrl():
    tree = samplers.SumSegmentTreeFp32(5)
    tree[6] = 1.0  # in [size, capacity): a real leaf, in the root
    assert tree.query(0, 5) == 1.0 and tree.query(1, 4) == 0.0  # l <= 0 and r >= size: the root
    tree[8] = 3.0  # capacity + 0: leaf 0
    assert tree[0] == 3.0 and tree.query(0, 5) == 4.0


def test_pickling_keeps_the_first_size_leaves_like_torchrl():
    tree = samplers.MinSegmentTreeFp64(5)
    tree.update(torch.tensor([0, 4, 6]), torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))
    copy = pickle.loads(pickle.dumps(tree))
    assert copy.size == 5 and copy.device == torch.device("cpu")
    assert copy[0] == 3.0 and copy[4] == 2.0 and copy[6] == copy.identity_element  # leaf 6 is lost (TorchRL)
    assert copy.query(0, 5) == 2.0


def test_bad_sizes_dtypes_and_leaf_counts_are_refused():
    with pytest.raises(ValueError, match="size"):
        samplers.SumSegmentTreeFp32(0)
    with pytest.raises(TypeError, match="size"):
        samplers.SumSegmentTreeFp32(2.5)
    with pytest.raises(NotImplementedError, match="dtype"):
        TensorSumSegmentTree(4, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"shape \[8\]"):
        TensorSumSegmentTree(4).set_all(torch.zeros(4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
@pytest.mark.parametrize("name", [n for n in TREE_NAMES if n.startswith("Cuda")])
def test_cuda_trees_without_cuda_say_what_to_use_instead(name):
    with pytest.raises(RuntimeError, match="use the CPU classes.*CUDA build of torch"):
        getattr(samplers, name)(8)


@needs_cuda
def test_cuda_trees_answer_as_the_cpu_trees_without_a_sync():
    cpu, cuda = samplers.SumSegmentTreeFp32(100), samplers.CudaSumSegmentTreeFp32(100)
    index = torch.randint(0, 100, (64,))
    value = torch.rand(64)
    cpu.update(index, value)
    cuda.update(index.cuda(), value.cuda())
    assert cuda.device.type == "cuda"
    mass = torch.rand(32) * cpu.query(0, 100)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        found = cuda.scan_lower_bound(mass.cuda())
        total = cuda.query(torch.tensor(0, device="cuda"), torch.tensor(100, device="cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(found.cpu(), cpu.scan_lower_bound(mass))
    assert abs(float(total) - cpu.query(0, 100)) < 1e-3
    assert pickle.loads(pickle.dumps(cuda)).device.type == "cuda"


# -- the kernel choice -----------------------------------------------------------------------------------------
def test_torch_is_a_kernel_choice_of_the_environment_variable():
    assert "torch" in _tree_kernels.ENV_CHOICES


def test_an_unknown_environment_value_raises_naming_the_variable_and_the_choices():
    code = (
        "import torchrl.data\n"  # importing never raises
        "from torchrl.data import PrioritizedSampler\n"
        "try:\n"
        "    PrioritizedSampler(8, 0.7, 0.5)\n"
        "except ValueError as err:\n"
        "    print(err)\n"
    )
    env = {**os.environ, _tree_kernels.KERNEL_ENV: "cuda-please"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "TORCHRL_SEGMENT_TREE_KERNEL='cuda-please'" in out.stdout
    assert "['auto', 'numba', 'numpy', 'torch']" in out.stdout


def test_default_kernel_raises_for_an_unknown_value(monkeypatch):
    monkeypatch.setattr(_tree_kernels, "DEFAULT_KERNEL", None)
    monkeypatch.setattr(_tree_kernels, "_ENV_VALUE", "gpu")
    with pytest.raises(ValueError, match=r"TORCHRL_SEGMENT_TREE_KERNEL='gpu'.*'torch'\]"):
        SumSegmentTree(4)


def test_the_torch_default_leaves_numpy_array_trees_on_their_loops(monkeypatch):
    monkeypatch.setattr(_tree_kernels, "DEFAULT_KERNEL", "torch")
    assert SumSegmentTree(4).kernel in ("numpy", "numba")
    with pytest.raises(ValueError, match=r"`kernel` must be one of \['auto', 'numba', 'numpy'\]"):
        SumSegmentTree(4, kernel="torch")
