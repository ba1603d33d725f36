"""The GRPO-from-a-buffer example (examples/llm/grpo_from_buffer.py): a rollout process writes groups of
completions of a tiny randomly initialised Llama into a shared packed buffer, and the learner updates on whole
groups sampled from it.

One smoke run goes through a subprocess, as a user runs the script (the registry's smoke test runs the packed
layout; this one runs the padded layout and reads the JSON summary). The helpers are also imported and checked
in-process: the log-probs stored per token at rollout time are the learner's log-probs before any update, in
both layouts, and groups stay whole while the arena wraps.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.extras import require

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "llm" / "grpo_from_buffer.py"


@pytest.fixture(scope="module")
def example():
    """The example imported as a module; the HF offline variables it sets on import are restored after."""
    require("transformers")
    saved = {name: os.environ.get(name) for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    spec = importlib.util.spec_from_file_location("_torchrl_example_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _buffer(example, args, *, keep_all: bool = False):
    from torchrl.data import GroupSampler, GroupWriter, PackedSequenceStorage, ReplayBuffer

    storage = PackedSequenceStorage(args.max_tokens, max_sequences=args.max_tokens // 4, token_keys=example.TOKEN_KEYS)
    keep_if = None if keep_all else example.reward_variance_above(0.0)
    writer = GroupWriter(group_key="prompt_id", keep_if=keep_if)
    return ReplayBuffer(storage=storage, writer=writer, sampler=GroupSampler(), batch_size=args.groups_per_step)


def _write_groups(example, rb, model, args, *, groups: int, first_id: int = 0, seed: int = 0):
    from tensordict import lazy_stack

    generator = torch.Generator().manual_seed(seed)
    items = []
    for prompt_id in range(first_id, first_id + groups):
        prompt = torch.randint(3, example.VOCAB, (4,), generator=generator)
        for item in example.sample_group(model, prompt, args, generator):
            item["prompt_id"] = torch.tensor(prompt_id)
            item["policy_version"] = torch.tensor(0)
            items.append(item)
    return rb.extend(lazy_stack(items))


@pytest.mark.extras
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_smoke_run_trains_on_whole_groups_written_by_the_rollout_process(example, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    argv = [sys.executable, str(SCRIPT), "--smoke", "--layout", "padded", "--checkpoint", str(tmp_path / "buffer")]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("summary: "))
    assert summary["steps"] == 3 and summary["layout"] == "padded"
    assert summary["losses_finite"] and summary["whole_groups"] and summary["policy_changed"]
    assert summary["rollout_exit_code"] == 0
    assert 2 <= summary["groups_kept"] <= summary["groups_sampled"]
    # The buffer it saved holds whole groups of the rollout process's completions, with their per-token entries.
    args = example.parse(["--smoke"])
    rb = _buffer(example, args)
    rb.loads(tmp_path / "buffer")
    assert len(rb) == summary["buffer_sequences"] > 0
    live = rb.storage.get(rb.storage.live_slots())
    ids = live["prompt_id"]
    assert all(int((ids == i).sum()) == args.group_size for i in ids.unique())
    for tokens, mask, log_probs in zip(*(live.get(k, as_list=True) for k in example.TOKEN_KEYS)):
        assert tokens.shape == mask.shape == log_probs.shape and 1 <= int(mask.sum()) <= args.max_new_tokens
        assert bool((log_probs[mask] <= 0).all()) and bool((log_probs[~mask] == 0).all())


@pytest.mark.extras
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_smoke_run_sends_the_buffer_to_a_spawned_rollout_process(tmp_path):
    """The buffer (its writer's keep_if rule included) pickles into a spawned process."""
    require("transformers")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    argv = [sys.executable, str(SCRIPT), "--smoke", "--start-method", "spawn"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("summary: "))
    assert summary["rollout_exit_code"] == 0 and summary["steps"] == 3 and summary["whole_groups"]
    assert summary["groups_kept"] >= 2


@pytest.mark.extras
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_stored_log_probs_are_the_learners_before_an_update(example, layout):
    args = example.Args(group_size=4, groups_per_step=3, max_new_tokens=4, max_tokens=2048, layout=layout)
    model = example.tiny_lm(0)
    rb = _buffer(example, args, keep_all=True)
    _write_groups(example, rb, model, args, groups=3)
    sample = rb.sample()
    keys = list(example.TOKEN_KEYS)
    layout_fn = example.pad_sequences if layout == "padded" else example.pack_sequences
    with torch.no_grad():
        new, old, mask = example.token_log_probs(model, layout_fn(sample, keys=keys), layout)
    assert mask.sum() == sum(int(m.sum()) for m in sample.get("completion_mask", as_list=True))
    torch.testing.assert_close(new[mask], old[mask], atol=1e-5, rtol=1e-5)  # the ratio starts at exactly 1
    assert bool((old[~mask] == 0).all())


@pytest.mark.extras
def test_padded_and_packed_updates_give_the_same_loss(example):
    losses = {}
    for layout in ("padded", "packed"):
        args = example.Args(group_size=4, groups_per_step=2, max_new_tokens=4, max_tokens=2048, layout=layout)
        model = example.tiny_lm(0)
        rb = _buffer(example, args, keep_all=True)
        _write_groups(example, rb, model, args, groups=2)
        rb.set_rng(torch.Generator().manual_seed(0))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses[layout] = [example.grpo_step(model, optimizer, rb, args, version=0)["loss"] for _ in range(2)]
    assert losses["padded"] == pytest.approx(losses["packed"], abs=1e-5)
    assert losses["padded"][0] != losses["padded"][1]  # the first update changed the policy


def _random_groups(groups: int, group_size: int, *, first_id: int, generator: torch.Generator):
    """Items with the example's entries and random lengths (no model: only the layout matters here)."""
    from tensordict import TensorDict, lazy_stack

    items = []
    for prompt_id in range(first_id, first_id + groups):
        for _ in range(group_size):
            n = int(torch.randint(5, 13, (), generator=generator))
            mask = torch.arange(n) >= 4
            items.append(TensorDict(tokens=torch.randint(3, 64, (n,), generator=generator), completion_mask=mask,
                                    log_probs=-torch.rand(n, generator=generator) * mask, reward=torch.rand(()),
                                    prompt_id=torch.tensor(prompt_id), policy_version=torch.tensor(0)))  # fmt: skip
    return lazy_stack(items)


@pytest.mark.extras
def test_groups_stay_whole_while_the_arena_wraps(example):
    args = example.Args(group_size=4, groups_per_step=2, max_tokens=256)
    rb = _buffer(example, args, keep_all=True)
    generator = torch.Generator().manual_seed(0)
    for round_ in range(6):  # 6 x 3 groups x 4 x (5 .. 12) tokens: several times the 256-token arena
        rb.extend(_random_groups(3, args.group_size, first_id=3 * round_, generator=generator))
    live = rb.storage.get(rb.storage.live_slots())
    ids = live["prompt_id"]
    assert 0 < len(ids) < 6 * 3 * args.group_size  # something was evicted
    assert all(int((ids == i).sum()) == args.group_size for i in ids.unique())
    assert ids.unique().tolist() == list(range(int(ids.min()), 18))  # FIFO: the newest groups are the live ones
    for _ in range(5):
        batch, info = rb.sample(return_info=True)
        for g in range(args.groups_per_step):
            members = batch["prompt_id"][info["group"] == g]
            assert len(members) == args.group_size and bool((members == members[0]).all())


@pytest.mark.extras
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--smoke"], {"steps": 3, "groups_per_step": 2, "prompts_per_round": 2, "max_new_tokens": 12}),
        (["--smoke", "--steps", "7"], {"steps": 7, "groups_per_step": 2}),
        (["--layout", "padded"], {"steps": 30, "layout": "padded"}),
    ],
)
def test_smoke_lowers_only_the_sizes_not_given(example, argv, expected):
    args = example.parse(argv)
    assert {name: getattr(args, name) for name in expected} == expected


@pytest.mark.extras
@pytest.mark.parametrize(
    "argv, name",
    [(["--steps", "0"], "--steps"), (["--group-size", "1"], "--group-size"), (["--layout", "ragged"], "--layout")],
)
def test_bad_arguments_are_a_usage_error_naming_the_option(example, argv, name, capsys):
    with pytest.raises(SystemExit) as exc:
        example.parse(argv)
    assert exc.value.code == 2
    assert name in capsys.readouterr().err
