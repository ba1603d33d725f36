"""The two names TorchRL keeps at ``replay_buffers.replay_buffers.deprecated`` for old code: ``InPlaceSampler``
(removed without replacement: building one raises TorchRL's ``RuntimeError``) and ``stack_tensors``."""

from __future__ import annotations

import importlib

import pytest
import torch

RB = "torchrl.data.replay_buffers"


@pytest.mark.parametrize("path", [f"{RB}.replay_buffers.deprecated", f"{RB}.replay_buffers", "torchrl.data"])
def test_building_an_in_place_sampler_raises_torchrl_runtime_error(path):
    cls = importlib.import_module(path).InPlaceSampler
    with pytest.raises(RuntimeError, match=r"This class has been removed without replacement\. In-place sampling "
                                           r"should be avoided\.") as err:
        cls(device="cpu")
    assert "device='cpu'" in str(err.value) and "rb.sample()" in str(err.value)
    with pytest.raises(RuntimeError, match="removed without replacement"):
        cls()


def test_stack_tensors_stacks_the_tensors_at_each_position():
    from torchrl.data.replay_buffers.replay_buffers import stack_tensors

    pairs = [(torch.full((2,), float(i)), torch.tensor(i)) for i in range(3)]
    obs, action = stack_tensors(pairs)
    assert torch.equal(obs, torch.arange(3.0).unsqueeze(-1).expand(3, 2))
    assert torch.equal(action, torch.arange(3))
    assert stack_tensors(iter([iter(p) for p in pairs]))[0].shape == (3, 2)  # any iterables
    (shortest,) = stack_tensors([(torch.zeros(1), torch.zeros(1)), (torch.ones(1),)])  # zip: the shortest wins
    assert torch.equal(shortest, torch.tensor([[0.0], [1.0]]))
    assert stack_tensors([]) == ()


def test_stack_tensors_refuses_tensors_of_different_shapes_as_torch_stack_does():
    from torchrl.data.replay_buffers.replay_buffers.deprecated import stack_tensors

    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        stack_tensors([(torch.zeros(2),), (torch.zeros(3),)])


