"""GRPO from a replay buffer: a rollout process writes groups of completions into a shared packed buffer, and a
learner runs group-relative policy updates on whole groups sampled from it.

1. The buffer stores each completion as one sequence, its tokens packed end to end in one arena
   (``PackedSequenceStorage``), with per-token entries (the completion mask, the log-probability each token had
   under the policy that sampled it) and fixed per-sequence entries (reward, prompt id, policy version)::

       storage = PackedSequenceStorage(max_tokens, max_sequences=..., token_keys=TOKEN_KEYS, shared_init=True)
       writer = GroupWriter(group_key="prompt_id", max_policy_lag=4, keep_if=reward_variance_above(0.0))
       rb = ReplayBuffer(storage=storage, writer=writer, sampler=GroupSampler(), batch_size=4)  # 4 groups

   The writer keeps and evicts a group whole, drops groups whose rewards are all equal (their group-relative
   advantages would be zero) and frees groups sampled by a policy more than ``max_policy_lag`` updates old.
2. A rollout process (``multiprocessing``) copies the learner's weights at the start of each round, samples
   ``group_size`` completions per prompt from a tiny randomly initialised causal LM (built here from a
   ``LlamaConfig``: nothing is downloaded), scores them, and writes each group with ``rb.extend``.
3. The learner samples ``groups_per_step`` whole groups, lays them out padded (``pad_sequences``, with an
   attention mask) or packed (``pack_sequences``: one row, ``position_ids`` restart at each sequence, which the
   model turns into a block-causal mask), computes group-relative advantages and a clipped ratio loss against
   the stored log-probabilities, and steps the optimizer.

The toy reward is the fraction of completion tokens taken from the lower quarter of the vocabulary. Each
printed line gives the batch's mean reward and the age of its oldest group in policy updates (the learner here
updates faster than the rollout process writes, so groups are replayed until ``max_policy_lag`` frees them).

Run it (seconds on a CPU)::

    python examples/llm/grpo_from_buffer.py
    python examples/llm/grpo_from_buffer.py --layout padded --steps 40
    python examples/llm/grpo_from_buffer.py --smoke          # a few updates, for CI
    python examples/llm/grpo_from_buffer.py --checkpoint /tmp/groups   # and save the buffer at the end

The last line it prints is a JSON summary (``summary: {...}``) that the tests read.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is built from a config: never touch the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from tensordict import TensorDict, lazy_stack  # noqa: E402

from torchrl.data import (  # noqa: E402
    GroupSampler,
    GroupWriter,
    PackedSequenceStorage,
    ReplayBuffer,
    pack_sequences,
    pad_sequences,
    reward_variance_above,
)

VOCAB, PAD, EOS = 64, 0, 2
LOW = VOCAB // 4  # rewarded tokens: ids 3 .. LOW - 1
TOKEN_KEYS = ("tokens", "completion_mask", "log_probs")


@dataclass
class Args:
    steps: int = 30
    groups_per_step: int = 4
    group_size: int = 8
    prompts_per_round: int = 4
    max_new_tokens: int = 24
    max_tokens: int = 8192  # the arena: about 40 groups of 8 completions here
    max_policy_lag: int = 4
    layout: str = "packed"
    lr: float = 3e-3
    clip: float = 0.2
    start_method: str = "fork"
    seed: int = 0
    log_every: int = 5
    checkpoint: str = ""  # a directory: the buffer is saved there at the end (rb.dumps)


SMOKE = {"steps": 3, "groups_per_step": 2, "prompts_per_round": 2, "max_new_tokens": 12, "log_every": 1}


def tiny_lm(seed: int):
    """A randomly initialised 2-layer Llama over a 64-token vocabulary (hidden size 32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=128, pad_token_id=PAD, bos_token_id=1, eos_token_id=EOS,
        attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def reward_of(completion: torch.Tensor) -> float:
    """The fraction of completion tokens in the rewarded range (the EOS token counts as not rewarded)."""
    return float(((completion >= 3) & (completion < LOW)).float().mean())


@torch.no_grad()
def sample_group(model, prompt: torch.Tensor, args: Args, generator: torch.Generator) -> list[TensorDict]:
    """``group_size`` completions of ``prompt``: one item per completion, with per-token log-probs."""
    size = args.group_size
    ids = prompt.repeat(size, 1)
    log_probs = torch.zeros(size, 0)
    for _ in range(args.max_new_tokens):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1].float()
        step_log_probs = torch.log_softmax(logits, -1)
        token = torch.multinomial(step_log_probs.exp(), 1, generator=generator)
        ids = torch.cat([ids, token], 1)
        log_probs = torch.cat([log_probs, step_log_probs.gather(1, token)], 1)
    # Each completion stops at its first EOS, or at a length drawn per completion (a stand-in for stop strings):
    # completions of one group differ in length, as they do with real models.
    caps = torch.randint(2, args.max_new_tokens + 1, (size,), generator=generator)
    items = []
    p = prompt.numel()
    for i in range(size):
        completion = ids[i, p:]
        eos = (completion == EOS).nonzero()
        n = min(int(caps[i]), int(eos[0]) + 1 if len(eos) else args.max_new_tokens)
        tokens = ids[i, : p + n]
        mask = torch.zeros(p + n, dtype=torch.bool)
        mask[p:] = True
        lp = torch.zeros(p + n)
        lp[p:] = log_probs[i, :n]
        items.append(TensorDict(tokens=tokens, completion_mask=mask, log_probs=lp,
                                reward=torch.tensor(reward_of(completion[:n]))))  # fmt: skip
    return items


def rollout(rb: ReplayBuffer, shared_model, weights_lock, version, stop, counts, args: Args) -> None:
    """The rollout process: rounds of ``prompts_per_round`` groups, written into the shared buffer."""
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(args.seed + 1)
    model = tiny_lm(args.seed)
    model.eval()
    prompt_id = 0
    while not stop.is_set():
        with weights_lock:  # the learner steps under the same lock: never a half-updated copy
            model.load_state_dict(shared_model.state_dict())
            policy_version = version.value
        groups = []
        for _ in range(args.prompts_per_round):
            prompt = torch.randint(3, VOCAB, (int(torch.randint(3, 7, (), generator=generator)),), generator=generator)
            for item in sample_group(model, prompt, args, generator):
                item["prompt_id"] = torch.tensor(prompt_id)
                item["policy_version"] = torch.tensor(policy_version)
                groups.append(item)
            prompt_id += 1
        slots = rb.extend(lazy_stack(groups))
        with counts.get_lock():
            counts[0] += args.prompts_per_round  # groups sampled
            counts[1] += len(slots) // args.group_size  # groups kept (the others had equal rewards)


def token_log_probs(model, batch: TensorDict, layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The log-prob of every token under ``model`` given the tokens before it, in the batch's layout.

    Returns ``(new, old, mask)`` of one shape (``[n, L]`` padded, ``[1, T]`` packed). The first token of a
    sequence has no log-prob: it is a prompt token, outside ``mask``.
    """
    tokens = batch["tokens"]
    if layout == "padded":
        logits = model(input_ids=tokens, attention_mask=batch["attention_mask"].long(), use_cache=False).logits
    else:  # no attention mask: position ids that restart at 0 make the mask block-causal, one block per sequence
        logits = model(input_ids=tokens, position_ids=batch["position_ids"], use_cache=False).logits
    new = torch.zeros(tokens.shape)
    new[:, 1:] = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return new, batch["log_probs"], batch["completion_mask"]


def per_token(values: torch.Tensor, batch: TensorDict, layout: str) -> torch.Tensor:
    """Per-sequence ``values`` ``[n]`` spread over the batch's token layout."""
    if layout == "padded":
        return values[:, None].expand(batch["tokens"].shape)
    lengths = batch["cu_seqlens"].diff().long()
    return values.repeat_interleave(lengths)[None]


def grpo_step(model, optimizer, rb: ReplayBuffer, args: Args, version: int) -> dict:
    """One update on ``groups_per_step`` whole groups sampled from the buffer."""
    # The rollout process may be evicting groups right now: draw and copy the batch under the storage's write lock
    # (a lock across processes that every write takes), so that no group is freed between the draw and the copy.
    with rb.storage.write_lock:
        sample, info = rb.sample(return_info=True)
    group = info["group"]  # the position of each sequence's group in the batch
    reward = sample["reward"].float()
    groups = int(group.max()) + 1
    sizes = torch.bincount(group, minlength=groups)
    mean = torch.zeros(groups).index_add_(0, group, reward) / sizes
    std = (torch.zeros(groups).index_add_(0, group, (reward - mean[group]) ** 2) / (sizes - 1).clamp(min=1)).sqrt()
    advantage = (reward - mean[group]) / (std[group] + 1e-4)  # group-relative: needs the whole group
    keys = list(TOKEN_KEYS)
    batch = pad_sequences(sample, keys=keys) if args.layout == "padded" else pack_sequences(sample, keys=keys)
    new, old, mask = token_log_probs(model, batch, args.layout)
    ratio = (new - old).exp()
    adv = per_token(advantage, batch, args.layout)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - args.clip, 1 + args.clip) * adv)
    loss = -(surrogate * mask).sum() / mask.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    prompt_ids = sample["prompt_id"]
    whole = all(bool((prompt_ids[group == g] == prompt_ids[group == g][0]).all()) for g in range(groups))
    return {
        "loss": float(loss.detach()), "reward": float(reward.mean()), "sequences": len(reward),
        "whole_groups": whole and bool((sizes == args.group_size).all()),
        "lag": version - int(sample["policy_version"].min()),
    }  # fmt: skip


def main(args: Args) -> dict:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = tiny_lm(args.seed)
    initial = [p.detach().clone() for p in model.parameters()]
    model.share_memory()  # the rollout process reads the current weights from here
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    storage = PackedSequenceStorage(
        args.max_tokens, max_sequences=args.max_tokens // 4, token_keys=TOKEN_KEYS, shared_init=True
    )
    writer = GroupWriter(group_key="prompt_id", max_policy_lag=args.max_policy_lag, keep_if=reward_variance_above(0.0))
    # batch_size counts groups: GroupSampler draws whole groups
    rb = ReplayBuffer(storage=storage, writer=writer, sampler=GroupSampler(), batch_size=args.groups_per_step)

    ctx = mp.get_context(args.start_method)
    weights_lock, stop = ctx.Lock(), ctx.Event()
    version, counts = ctx.Value("q", 0), ctx.Array("q", 2)
    worker = ctx.Process(target=rollout, args=(rb, model, weights_lock, version, stop, counts, args), daemon=True)
    worker.start()
    log, start = [], time.perf_counter()
    try:
        for step in range(1, args.steps + 1):
            deadline = time.monotonic() + 120
            while len(rb) < args.groups_per_step * args.group_size:  # wait for the first groups
                if not worker.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the rollout process wrote no groups (exit code {worker.exitcode})")
                time.sleep(0.05)
            with weights_lock:
                stats = grpo_step(model, optimizer, rb, args, version.value)
                version.value += 1
            log.append(stats)
            if step % args.log_every == 0 or step == args.steps:
                print(f"step {step:4d}  loss {stats['loss']:+.4f}  reward {stats['reward']:.3f}  "
                      f"buffer {len(rb):4d} sequences  sampled {counts[0]:4d} groups, kept {counts[1]:4d}  "
                      f"oldest group {stats['lag']} updates old", flush=True)  # fmt: skip
    finally:
        stop.set()
        worker.join(60)
        if worker.is_alive():
            worker.terminate()
    changed = any(not torch.equal(a, b.detach()) for a, b in zip(initial, model.parameters()))
    if args.checkpoint:  # pickle-free: memory-mapped arenas, slot table and fixed entries, plus JSON
        rb.dumps(args.checkpoint)
    summary = {
        "steps": len(log),
        "layout": args.layout,
        "losses_finite": all(math.isfinite(s["loss"]) for s in log),
        "whole_groups": all(s["whole_groups"] for s in log),
        "policy_changed": changed,
        "first_reward": log[0]["reward"],
        "last_reward": log[-1]["reward"],
        "groups_sampled": counts[0],
        "groups_kept": counts[1],
        "rollout_exit_code": worker.exitcode,
        "buffer_sequences": len(rb),
        "seconds": round(time.perf_counter() - start, 1),
    }
    print("summary: " + json.dumps(summary), flush=True)
    return summary


def parse(argv=None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Args()
    for name, value in vars(defaults).items():
        kwargs = {"choices": ("padded", "packed")} if name == "layout" else {}
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value, **kwargs)
    parser.add_argument("--smoke", action="store_true", help="a few updates, for CI")
    ns = vars(parser.parse_args(argv))
    smoke = ns.pop("smoke")
    given = {name for name, value in ns.items() if value != getattr(defaults, name)}
    if smoke:
        ns.update({name: value for name, value in SMOKE.items() if name not in given})
    args = Args(**ns)
    for name in ("steps", "groups_per_step", "group_size", "prompts_per_round", "max_new_tokens", "max_tokens"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.group_size < 2:
        parser.error(f"--group-size must be at least 2 (a group-relative advantage needs 2), got {args.group_size}")
    return args


if __name__ == "__main__":
    main(parse())
