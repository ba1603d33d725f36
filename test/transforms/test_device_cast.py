"""DeviceCastTransform: whole batches or some entries moved to ``device`` (forward) and to ``orig_device`` (inv).

The CPU tests move data to the ``meta`` device (a device other than the CPU that needs no accelerator).
"""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer
from torchrl.envs import DeviceCastTransform as FromEnvs
from torchrl.envs.transforms import Compose, DeviceCastTransform

META = torch.device("meta")
CPU = torch.device("cpu")


def _td(device=None) -> TensorDict:
    return TensorDict({"obs": torch.arange(6.0).view(3, 2), "a": torch.arange(3), ("next", "obs"): torch.ones(3, 2)},
                      batch_size=[3], device=device)


def _devices(td) -> dict:
    return {key: value.device for key, value in td.items(include_nested=True, leaves_only=True)}


def test_importable_from_torchrl_envs_as_in_torchrl():
    assert FromEnvs is DeviceCastTransform


def test_forward_moves_the_whole_tensordict():
    out = DeviceCastTransform("meta")(_td())
    assert set(_devices(out).values()) == {META}
    assert out.batch_size == torch.Size([3])


def test_forward_moves_a_tensor():
    assert DeviceCastTransform("meta")(torch.zeros(2)).device == META


def test_forward_moves_only_the_in_keys_into_out_keys():
    td = _td(device="cpu")
    out = DeviceCastTransform("meta", in_keys=["obs", ("next", "obs")], out_keys=["obs_m", ("next", "obs")])(td)
    devices = _devices(out)
    assert devices["obs_m"] == META and devices[("next", "obs")] == META
    assert devices["obs"] == CPU and devices["a"] == CPU
    assert out.device is None  # a device-bound TensorDict would cast the moved entries back
    assert td.device == CPU and _devices(td)[("next", "obs")] == CPU  # the input keeps its device and entries


def test_missing_in_keys_are_skipped():
    out = DeviceCastTransform("meta", in_keys=["absent"])(_td())
    assert set(_devices(out).values()) == {CPU}


def test_inv_without_orig_device_leaves_data_unchanged():
    td = _td()
    assert DeviceCastTransform("meta").inv(td) is td


def test_inv_moves_to_orig_device():
    td = _td()
    assert set(_devices(DeviceCastTransform("cpu", "meta").inv(td)).values()) == {META}
    out = DeviceCastTransform("cpu", "meta", in_keys_inv=["a"]).inv(_td())
    assert _devices(out)["a"] == META and _devices(out)["obs"] == CPU


def test_in_keys_only_inv_leaves_data_unchanged():
    td = _td()
    assert DeviceCastTransform("meta", "cpu", in_keys=["obs"]).inv(td) is td


def test_values_are_kept_through_a_buffer_and_back():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=4, generator=torch.Generator().manual_seed(0),
                                transform=Compose(DeviceCastTransform("cpu")))
    rb.extend(_td())
    batch = rb.sample()
    assert (batch["obs"][:, 0] == 2 * batch["a"]).all()


def test_written_data_is_moved_by_inv():
    rb = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=2, transform=DeviceCastTransform("cpu", "cpu"))
    rb.extend(_td())
    assert len(rb) == 3 and (rb[:]["obs"] == _td()["obs"]).all()


@pytest.mark.parametrize("device", [1.5, True, None, object()])
def test_device_of_the_wrong_type_is_refused(device):
    with pytest.raises(TypeError, match=r"`device` must be a torch.device, a device string"):
        DeviceCastTransform(device)


def test_unknown_device_string_is_refused():
    with pytest.raises(ValueError, match=r"`device` must name a device, such as 'cuda'.*got 'gpu0'"):
        DeviceCastTransform("gpu0")
    with pytest.raises(TypeError, match=r"`orig_device` must be a torch.device"):
        DeviceCastTransform("cpu", orig_device=2.0)


def test_in_keys_inv_without_orig_device_is_refused():
    with pytest.raises(ValueError, match=r"`in_keys_inv`=\['a'\] needs `orig_device`"):
        DeviceCastTransform("cpu", in_keys_inv=["a"])


def test_stateless_and_picklable():
    t = DeviceCastTransform("meta", "cpu", in_keys=["obs"])
    assert t.state_dict() == {}
    copy = pickle.loads(pickle.dumps(t))
    assert (copy.device, copy.orig_device, copy.in_keys) == (META, CPU, ["obs"])
    assert repr(copy) == "DeviceCastTransform(device=meta, orig_device=cpu, in_keys=['obs'])"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_round_trip_keeps_values():
    td = _td()
    on_cuda = DeviceCastTransform("cuda")(td.clone())
    back = DeviceCastTransform("cuda", "cpu").inv(on_cuda)
    assert set(_devices(on_cuda).values()) == {torch.device("cuda", torch.cuda.current_device())}
    assert (back == td).all()
