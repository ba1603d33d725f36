"""Issue 29 item 7: a checkpoint naming a class this process does not provide is a CheckpointError.

A checkpoint of tensorclass items records the class as ``module:qualname`` and loading resolves it among the
modules already imported (it imports nothing). A crafted name that resolves to a name ``torchrl.data`` keeps
for TorchRL's other areas (``torchrl.data:Bounded``, whose lookup raises ``NotProvidedError``), to something
that is not a class, or to nothing, is refused as a bad checkpoint, with nothing loaded.
"""

from __future__ import annotations

import pytest
import torch
from helpers.factories import rewrite_checkpoint_metadata
from tensordict import tensorclass

from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.checkpointers import CheckpointError


@tensorclass
class Step:
    obs: torch.Tensor


def _rename_class(name: str):
    def mutate(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "tensorclass" and isinstance(value, str) and value.endswith(":Step"):
                    node[key] = name
                else:
                    mutate(value)
        elif isinstance(node, list):
            for value in node:
                mutate(value)

    return mutate


def _crafted(tmp_path, name: str):
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(Step(obs=torch.arange(4.0), batch_size=[4]))
    rb.dumps(tmp_path / "ckpt")
    rewrite_checkpoint_metadata(tmp_path / "ckpt", _rename_class(name))
    return tmp_path / "ckpt"


@pytest.mark.parametrize("name", ["torchrl.data:Bounded", "torchrl.data:ReplayBuffer.sample", "os:path"])
@pytest.mark.parametrize("initialised", [True, False], ids=["into-data", "into-empty"])
def test_a_checkpoint_naming_something_that_is_not_a_tensorclass_is_a_checkpoint_error(
    name, initialised, tmp_path
):
    path = _crafted(tmp_path, name)
    target = ReplayBuffer(storage=LazyTensorStorage(4))
    if initialised:
        target.extend(Step(obs=torch.zeros(2), batch_size=[2]))
    with pytest.raises(CheckpointError, match=r"not a tensorclass"):
        target.loads(path)
    assert len(target) == (2 if initialised else 0)
    if initialised:
        assert (target[:].obs == 0).all()


def test_a_class_this_process_does_not_define_loads_as_tensordicts_with_a_warning(tmp_path):
    path = _crafted(tmp_path, "nowhere:Step")
    target = ReplayBuffer(storage=LazyTensorStorage(4))
    with pytest.warns(UserWarning, match="cannot import"):
        target.loads(path)
    assert len(target) == 4 and target[:]["obs"].tolist() == [0.0, 1.0, 2.0, 3.0]
