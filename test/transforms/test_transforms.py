"""Transforms on the replay-buffer paths: forward on samples, inv on writes; Compose, Resize, state."""

from __future__ import annotations

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict
from torch import nn

from torchrl.data import LazyTensorStorage, ListStorage, ReplayBuffer, TensorDictReplayBuffer
from torchrl.envs.transforms import Compose, Resize, Transform


class AddOne(Transform):
    """forward: +1 on ``in_keys``; inv: -1 on ``in_keys_inv``."""

    def _apply_transform(self, value):
        return value + 1

    def _inv_apply_transform(self, value):
        return value - 1


class TimesTen(Transform):
    """forward: x10 on ``in_keys``; inv: /10 on ``in_keys_inv``."""

    def _apply_transform(self, value):
        return value * 10

    def _inv_apply_transform(self, value):
        return value / 10


class Affine(Transform):
    """A stateful transform: ``x * scale + loc``, with ``scale`` a parameter and ``loc`` a buffer."""

    def __init__(self, in_keys):
        super().__init__(in_keys=in_keys)
        self.scale = nn.Parameter(torch.ones(()))
        self.register_buffer("loc", torch.zeros(()))

    def _apply_transform(self, value):
        return value * self.scale + self.loc


def _td(value: float, n: int = 2) -> TensorDict:
    return TensorDict(obs=torch.full((n, 1), float(value)), batch_size=[n])


def _buffer(**kwargs) -> TensorDictReplayBuffer:
    return make_buffer(cls=TensorDictReplayBuffer, capacity=10, batch_size=2, **kwargs)


# -- Compose --------------------------------------------------------------------------------------------------


def test_compose_forward_runs_in_order_and_inv_in_reverse():
    t = Compose(AddOne(in_keys=["obs"], in_keys_inv=["obs"]), TimesTen(in_keys=["obs"], in_keys_inv=["obs"]))
    assert t(_td(1.0))["obs"][0].item() == 20.0  # (1 + 1) * 10
    assert t.inv(_td(20.0))["obs"][0].item() == 1.0  # 20 / 10 - 1
    assert len(t) == 2 and isinstance(t[0], AddOne)


def test_compose_wraps_callables():
    t = Compose(lambda td: td.set("obs", td["obs"] + 1), lambda td: td.set("obs", td["obs"] * 10))
    assert t(_td(0.0))["obs"][0].item() == 10.0
    t.append(lambda td: td.set("obs", -td["obs"]))
    t.insert(0, lambda td: td.set("obs", td["obs"] * 0))
    assert t(_td(5.0))["obs"][0].item() == -10.0


def test_compose_inv_stops_when_a_transform_drops_the_data():
    seen = []

    class Drop(Transform):
        def inv(self, td):
            return None

    class Spy(Transform):
        def inv(self, td):
            seen.append(True)
            return td

    assert Compose(Spy(), Drop()).inv(_td(0.0)) is None
    assert seen == []  # Spy comes first in forward order, so its inv would run after Drop's


def test_buffer_skips_a_write_dropped_by_an_inverse_transform():
    class Drop(Transform):
        def inv(self, td):
            return None

    rb = _buffer(transform=Drop())
    assert rb.extend(_td(1.0)).numel() == 0
    assert len(rb) == 0


@pytest.mark.parametrize("bad", [3, "obs", object()], ids=["int", "str", "object"])
def test_non_callable_transforms_are_a_type_error(bad):
    with pytest.raises(TypeError, match="`transform` must be a Transform or a callable"):
        Compose(bad)


def test_mismatched_out_keys_are_refused():
    with pytest.raises(ValueError, match="`out_keys` must have as many keys"):
        AddOne(in_keys=["a", "b"], out_keys=["c"])
    with pytest.raises(ValueError, match="`out_keys_inv` must have as many keys"):
        AddOne(in_keys_inv=["a"], out_keys_inv=["b", "c"])


def test_out_keys_write_next_to_the_input():
    td = AddOne(in_keys=["obs"], out_keys=["obs_plus"])(_td(1.0))
    assert td["obs"][0].item() == 1.0 and td["obs_plus"][0].item() == 2.0


# -- transforms on a buffer ---------------------------------------------------------------------------------


def test_buffer_runs_inv_on_writes_and_forward_on_samples():
    rb = _buffer(transform=AddOne(in_keys=["obs"], in_keys_inv=["obs"]))
    rb.extend(_td(5.0))
    assert rb.storage[:]["obs"].flatten().tolist() == [4.0, 4.0]  # stored after inv
    assert rb.sample()["obs"].flatten().tolist() == [5.0, 5.0]  # forward undoes it
    assert rb[0]["obs"].item() == 5.0
    assert rb.storage[:]["obs"].flatten().tolist() == [4.0, 4.0]  # reads do not change the storage


def test_extend_with_an_inverse_transform_leaves_the_callers_data_alone():
    rb = _buffer(transform=AddOne(in_keys_inv=["obs"]))
    td = _td(5.0)
    rb.extend(td)
    assert td["obs"].flatten().tolist() == [5.0, 5.0]


def test_append_and_insert_transform_set_the_sample_order():
    rb = _buffer()
    rb.extend(_td(1.0))
    rb.append_transform(TimesTen(in_keys=["obs"]))
    rb.append_transform(lambda td: td.set("obs", td["obs"] - 3))
    rb.insert_transform(0, AddOne(in_keys=["obs"]))
    assert rb.sample()["obs"].flatten().tolist() == [17.0, 17.0]  # ((1 + 1) * 10) - 3
    assert len(rb.transform) == 3


def test_append_transform_with_invert_swaps_the_paths():
    rb = _buffer()
    rb.append_transform(AddOne(in_keys=["obs"], in_keys_inv=["obs"]), invert=True)
    rb.extend(_td(5.0))  # the write path runs forward: +1
    assert rb.storage[:]["obs"].flatten().tolist() == [6.0, 6.0]
    assert rb.sample()["obs"].flatten().tolist() == [5.0, 5.0]  # the sample path runs inv: -1


def test_callable_transform_on_a_tensor_buffer():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=3, transform=lambda x: x * 2)
    rb.extend(torch.arange(4))
    assert set(rb.sample().tolist()) <= {0, 2, 4, 6}
    assert rb[torch.tensor([3])].tolist() == [6]


def test_transform_on_a_list_storage_sees_the_collated_batch():
    shapes = []

    def record(td):
        shapes.append(td.batch_size)
        return td

    rb = TensorDictReplayBuffer(storage=ListStorage(10), batch_size=3, transform=record)
    rb.extend(_td(1.0, n=4))
    rb.sample()
    assert shapes == [torch.Size([3])]


# -- state ----------------------------------------------------------------------------------------------------


def test_stateful_transform_state_travels_with_the_buffer_state_dict():
    rb = _buffer(transform=Affine(in_keys=["obs"]))
    rb.extend(_td(2.0))
    with torch.no_grad():
        rb.transform[0].scale.fill_(3.0)
    rb.transform[0].loc.fill_(0.5)
    state = rb.state_dict()
    assert {"transforms.0.scale", "transforms.0.loc"} <= set(state["_transforms"])
    fresh = _buffer(transform=Affine(in_keys=["obs"]))
    fresh.load_state_dict(state)
    assert fresh.transform[0].scale.item() == 3.0 and fresh.transform[0].loc.item() == 0.5
    assert fresh.sample()["obs"].flatten().tolist() == [6.5, 6.5]


# -- Resize ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("lead", [(), (4,), (2, 3)])
def test_resize_keeps_dtype_and_leading_dims(dtype, lead):
    pixels = (torch.rand(*lead, 3, 16, 12) * 255).to(dtype)
    td = TensorDict(pixels=pixels, batch_size=lead)
    out = Resize(8, 6)(td)["pixels"]
    assert out.shape == (*lead, 3, 6, 8) and out.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic", "area"])
def test_resize_of_a_constant_image_is_constant(dtype, mode):
    td = TensorDict(pixels=torch.full((2, 3, 10, 10), 200, dtype=dtype), batch_size=[2])
    out = Resize(4, interpolation=mode)(td)["pixels"]
    assert out.shape == (2, 3, 4, 4)
    assert (out == 200).all()


def test_resize_nearest_upscale_repeats_pixels():
    img = torch.tensor([[[0, 255], [100, 50]]], dtype=torch.uint8)  # [C=1, 2, 2]
    out = Resize(4, interpolation="nearest")(TensorDict(pixels=img))["pixels"]
    assert out.tolist() == [[[0, 0, 255, 255], [0, 0, 255, 255], [100, 100, 50, 50], [100, 100, 50, 50]]]


def test_resize_in_a_buffer_with_custom_keys():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2)
    rb.append_transform(Resize(32, in_keys=["frames"], out_keys=["small"]))
    rb.extend(TensorDict(frames=torch.zeros(4, 3, 96, 96, dtype=torch.uint8), batch_size=[4]))
    batch = rb.sample()
    assert batch["small"].shape == (2, 3, 32, 32) and batch["frames"].shape == (2, 3, 96, 96)


@pytest.mark.parametrize(
    "kwargs,name",
    [({"w": 0}, "w"), ({"w": 4, "h": -1}, "h"), ({"w": 4.0}, "w"), ({"w": 4, "interpolation": "linear"}, "interpolation")],
)
def test_resize_refuses_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}` must be"):
        Resize(**kwargs)


def test_resize_refuses_non_images():
    with pytest.raises(ValueError, match=r"expects images \[..., C, H, W\]"):
        Resize(4)(TensorDict(pixels=torch.zeros(5, 5)))
