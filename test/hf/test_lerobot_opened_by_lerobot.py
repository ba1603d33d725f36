"""Our LeRobot v3.0 export, opened by LeRobot itself (issue 28).

LeRobot needs Python >= 3.12 and torch < 2.12, so it is no dependency of ours and cannot share this environment.
Point ``TORCHRL_LEROBOT_PYTHON`` at the interpreter of a separate environment that has it, e.g.::

    python3.12 -m venv /tmp/lerobot_venv && /tmp/lerobot_venv/bin/pip install 'lerobot[dataset]==0.6.1'
    TORCHRL_LEROBOT_PYTHON=/tmp/lerobot_venv/bin/python python -m pytest test/hf/test_lerobot_opened_by_lerobot.py

The test exports a buffer with ``layout="lerobot"``, opens the directory with ``LeRobotDataset(repo_id,
root=path)`` in that interpreter (offline) and checks every frame's values against the buffer's, bit for bit; the
video tests export an :class:`~torchrl.data.EncodedFrameStorage` (its pixels as LeRobot video files) and check the
frames LeRobot decodes within the codec's tolerance. Without the variable they skip, naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings

import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, ReplayBuffer

LEROBOT_PYTHON = os.environ.get("TORCHRL_LEROBOT_PYTHON")

READER = """
import json, sys
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
ds = LeRobotDataset("local/check", root=sys.argv[1])
frames = [ds[i] for i in range(len(ds))]
out = {key: torch.stack([f[key] for f in frames]).tolist()
       for key in ("observation.state", "action", "next.reward", "next.done", "episode_index", "frame_index")}
out["task"] = sorted({f["task"] for f in frames})
out["num_episodes"] = ds.num_episodes
print("RESULT " + json.dumps(out))
"""


@pytest.mark.skipif(LEROBOT_PYTHON is None, reason="set TORCHRL_LEROBOT_PYTHON to a Python with lerobot installed")
@pytest.mark.timeout(600)
def test_lerobot_opens_our_export_with_identical_frames(tmp_path):
    n, length = 60, 20
    step = torch.arange(n) % length
    td = TensorDict(
        {
            "observation": {"state": torch.randn(n, 4)},
            "action": torch.randn(n, 2),
            "episode": torch.arange(n) // length,
            "next": {"reward": torch.randn(n, 1), "done": (step == length - 1).unsqueeze(-1)},
        },
        batch_size=[n],
    )
    rb = ReplayBuffer(storage=LazyTensorStorage(n))
    rb.extend(td)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the traj key "episode" becomes episode_index: nothing is dropped
        rb.export_hf(tmp_path / "export", layout="lerobot", fps=10, task="balance the pole")
    script = tmp_path / "read.py"
    script.write_text(READER)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [LEROBOT_PYTHON, str(script), str(tmp_path / "export")], capture_output=True, text=True, env=env,
        timeout=500, check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    got = json.loads(lines[0][len("RESULT "):])
    assert got["num_episodes"] == 3 and got["task"] == ["balance the pole"]
    assert torch.equal(torch.tensor(got["observation.state"]), td["observation", "state"])
    assert torch.equal(torch.tensor(got["action"]), td["action"])
    assert torch.equal(torch.tensor(got["next.reward"]), td["next", "reward"].reshape(-1))
    assert torch.equal(torch.tensor(got["next.done"]), td["next", "done"].reshape(-1))
    assert got["episode_index"] == td["episode"].tolist() and got["frame_index"] == step.tolist()


VIDEO_READER = """
import json, sys
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
ds = LeRobotDataset("local/check", root=sys.argv[1])
frames = [ds[i] for i in range(len(ds))]
torch.save(torch.stack([f["observation.image"] for f in frames]), sys.argv[2])
out = {"episode_index": [int(f["episode_index"]) for f in frames], "num_episodes": ds.num_episodes,
       "video_keys": ds.meta.video_keys, "action": torch.stack([f["action"] for f in frames]).tolist()}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.skipif(LEROBOT_PYTHON is None, reason="set TORCHRL_LEROBOT_PYTHON to a Python with lerobot installed")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("codec", ["h264", "ffv1"])  # segments copied as they are / re-encoded (H.264)
def test_lerobot_opens_our_video_export_within_codec_tolerance(tmp_path, codec):
    require("av")
    from helpers.frames import moving_frames, psnr

    from torchrl.data import EncodedFrameStorage

    n, length, fps = 60, 20, 10
    step = torch.arange(n)
    td = TensorDict(
        {
            "pixels": moving_frames(n, 64, 64),
            "observation": {"state": torch.randn(n, 4)},
            "action": torch.randn(n, 2),
            "episode": step // length,
            "next": {"done": (step % length == length - 1).unsqueeze(-1)},
        },
        batch_size=[n],
    )
    rb = ReplayBuffer(storage=EncodedFrameStorage(n, codec=codec, segment_frames=8, fps=fps))
    rb.extend(td)
    stored = rb[:]["pixels"]
    rb.export_hf(tmp_path / "export", layout="lerobot", fps=fps, task="look around")
    script = tmp_path / "read_video.py"
    script.write_text(VIDEO_READER)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [LEROBOT_PYTHON, str(script), str(tmp_path / "export"), str(tmp_path / "frames.pt")], capture_output=True,
        text=True, env=env, timeout=500, check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    got = json.loads(lines[0][len("RESULT "):])
    assert got["num_episodes"] == 3 and got["video_keys"] == ["observation.image"]
    assert got["episode_index"] == td["episode"].tolist()
    assert torch.equal(torch.tensor(got["action"]), td["action"])
    frames = torch.load(tmp_path / "frames.pt")  # LeRobot's float frames in [0, 1], [C, H, W]
    assert frames.shape == (n, 3, 64, 64)
    frames = (frames * 255).round().to(torch.uint8)
    assert psnr(frames, td["pixels"]) > 35  # what was written, within the codec's tolerance
    if codec == "h264":  # the segments' packets, copied: the frames our storage decodes
        assert psnr(frames, stored) > 50
