"""``RemoteTensorDictReplayBuffer(*args, **kwargs)``: TorchRL's signature. The buffer takes
TensorDictReplayBuffer's arguments, all by keyword; a positional argument is refused with a message that says so."""

from __future__ import annotations

import inspect

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, RemoteTensorDictReplayBuffer


def test_keyword_arguments_build_a_working_buffer():
    rb = RemoteTensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2, priority_key="p")
    rb.extend(TensorDict(obs=torch.arange(4), batch_size=[4]))
    assert len(rb) == 4 and rb.sample()["obs"].shape == (2,)
    assert rb.priority_key == "p"


def test_a_positional_argument_is_refused_with_the_keyword_form():
    with pytest.raises(TypeError, match=r"by keyword only \(e.g. storage=LazyTensorStorage\(100\).*got 1 positional "
                                        r"argument\(s\): LazyTensorStorage"):
        RemoteTensorDictReplayBuffer(LazyTensorStorage(8))


def test_the_signature_is_torchrl_s():
    kinds = {p.kind for p in inspect.signature(RemoteTensorDictReplayBuffer).parameters.values()}
    assert {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds


def test_sample_takes_include_info_before_return_info_as_in_torchrl():
    rb = RemoteTensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2)
    rb.extend(TensorDict(obs=torch.arange(4), batch_size=[4]))
    batch, info = rb.sample(3, None, True)  # batch_size, include_info, return_info
    assert batch.batch_size == (3,) and torch.equal(info["index"], batch["index"])
    with pytest.warns(UserWarning, match="`include_info` is deprecated"):  # the second one is include_info
        assert rb.sample(3, False).batch_size == (3,)
    assert list(inspect.signature(RemoteTensorDictReplayBuffer.sample).parameters)[1:4] == [
        "batch_size", "include_info", "return_info"
    ]
