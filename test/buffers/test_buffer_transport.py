"""``ReplayBuffer(transport=..., transport_options=...)``: TorchRL's transport keywords on a buffer of this process.

A direct buffer takes the in-process transports (``"auto"``, ``"direct"``) and no transport options, as in TorchRL.
TorchRL's tensor channels over ``torch.distributed`` (``transport="distributed"``, on gloo or NCCL) have no
counterpart here: they are refused, before anything is built, with an error naming what shares a buffer here (a
shared buffer for processes of this machine, a Ray actor across machines). No Ray is needed for these tests.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from helpers.factories import make_buffer

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)

CLASSES = {
    ReplayBuffer: {},
    TensorDictReplayBuffer: {},
    PrioritizedReplayBuffer: {"alpha": 0.7, "beta": 0.5},
    TensorDictPrioritizedReplayBuffer: {"alpha": 0.7, "beta": 0.5},
}
ALTERNATIVES = r"shared=True \(or call rb.share\(\)\).*service_backend='ray' \(transport='ray'\)"


@pytest.mark.parametrize("cls", list(CLASSES), ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("transport", ["distributed", "gloo", "nccl"])
def test_tensor_channel_transports_are_refused_naming_shared_memory_and_ray(cls, transport):
    with pytest.raises(ValueError, match=rf"`transport`='{transport}': TorchRL's transport='distributed'.*gloo or "
                                         rf"NCCL.*{cls.__name__} runs in this process.*{ALTERNATIVES}"):
        cls(**CLASSES[cls], transport=transport)


@pytest.mark.parametrize("options", [{"backend": "gloo"}, {"backend": "nccl", "world_size": 2}])
def test_transport_options_are_refused_naming_what_to_use_instead(options):
    with pytest.raises(ValueError, match=rf"`transport_options`=.*gloo / NCCL.*leave `transport_options` out\. "
                                         rf".*{ALTERNATIVES}"):
        ReplayBuffer(transport_options=options)


@pytest.mark.parametrize("transport", ["auto", "direct"])
@pytest.mark.parametrize("options", [None, {}])
def test_in_process_transports_build_a_working_buffer(transport, options):
    rb = make_buffer(kind="tensor", batch_size=2, transport=transport, transport_options=options,
                     data=torch.arange(5))
    assert type(rb) is ReplayBuffer and len(rb) == 5 and rb.sample().shape == (2,)


def test_a_refused_transport_builds_nothing():
    built = []

    def storage():
        built.append(True)
        return LazyTensorStorage(10)

    for kwargs in ({"transport": "nccl"}, {"transport_options": {"backend": "gloo"}}):
        with pytest.raises(ValueError, match="transport"):
            ReplayBuffer(storage=storage, **kwargs)
    assert built == []


def test_init_takes_the_transport_keywords_and_checks_them_for_subclasses():
    params = inspect.signature(ReplayBuffer.__init__).parameters
    assert params["transport"].default == "auto" and params["transport_options"].default is None
    assert params["transport"].kind is inspect.Parameter.KEYWORD_ONLY

    class Forwarding(ReplayBuffer):  # passes the keywords to ReplayBuffer.__init__ itself
        def __init__(self, *, channel: str, **kwargs):
            super().__init__(transport=channel, **kwargs)

    assert len(Forwarding(channel="direct", storage=LazyTensorStorage(4))) == 0
    with pytest.raises(ValueError, match=rf"`transport`='gloo'.*Forwarding runs in this process.*{ALTERNATIVES}"):
        Forwarding(channel="gloo")
