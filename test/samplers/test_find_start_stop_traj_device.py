"""``find_start_stop_traj(..., device=)``: TorchRL's keyword, where the returned start/stop/lengths tensors live."""

from __future__ import annotations

import pytest
import torch

from torchrl.data import find_start_stop_traj

END = torch.tensor([False, True, False, False, True, False])


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta"])
def test_the_results_are_on_the_requested_device(device):
    start, stop, lengths = find_start_stop_traj(end=END, at_capacity=False, device=device)
    assert {t.device for t in (start, stop, lengths)} == {torch.device(device)}
    if torch.device(device).type == "cpu":
        expected = find_start_stop_traj(end=END, at_capacity=False)
        assert all(torch.equal(a, b) for a, b in zip((start, stop, lengths), expected))


def test_without_a_device_the_results_stay_on_the_input_s_device():
    trajectory = torch.tensor([0, 0, 1, 1, 1, 2])
    start, stop, lengths = find_start_stop_traj(trajectory=trajectory, at_capacity=True, cursor=5, device=None)
    assert lengths.device == trajectory.device and lengths.tolist() == [2, 3, 1]


def test_a_bad_device_is_refused_before_anything_is_computed():
    with pytest.raises(ValueError, match=r"`device` must be a torch.device, a device string .* got 'gpu0'"):
        find_start_stop_traj(end=END, at_capacity=False, device="gpu0")
    with pytest.raises(TypeError, match="Exactly one"):  # the argument checks keep their order
        find_start_stop_traj(at_capacity=False, device="gpu0")
