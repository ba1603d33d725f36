"""HFRewardModelWrapper: a Hugging Face reward model run on the token ids and attention mask of a TensorDict, its
reward written in place. The models are tiny torch modules built here (and a tiny randomly initialised GPT-2
sequence classifier when ``transformers`` is installed): nothing is downloaded."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase

from torchrl.modules.llm import HFRewardModelWrapper

B, T = 3, 5


@dataclass
class Output:
    logits: torch.Tensor | None = None
    rewards: torch.Tensor | None = None


class TokenSum(torch.nn.Module):
    """One logit per sequence: a learned scale times the sum of the attended token ids."""

    def __init__(self, shape: str = "column", output: str = "logits"):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.shape, self.output = shape, output

    def forward(self, input_ids, attention_mask=None):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        score = (input_ids * mask).sum(-1).float() * self.scale
        score = {"column": score.unsqueeze(-1), "flat": score, "pair": torch.stack([score, score], -1)}[self.shape]
        if self.output == "tensor":
            return score
        if self.output == "rewards":
            return Output(rewards=score)
        return Output(logits=score) if self.output == "logits" else {"score": score}


def _td(nested: bool = True) -> TensorDict:
    tokens = torch.arange(B * T).reshape(B, T)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[:, 3:] = 0  # the last two tokens are padding
    if nested:
        return TensorDict({"tokens": {"full": tokens}, "masks": {"all_attention_mask": mask}}, batch_size=[B])
    return TensorDict(input_ids=tokens, attention_mask=mask, batch_size=[B])


def _expected() -> torch.Tensor:
    return torch.arange(B * T).reshape(B, T)[:, :3].sum(-1).float()


def test_the_reward_of_each_sequence_is_written_under_reward_key_in_place():
    scorer = HFRewardModelWrapper(TokenSum())
    td = _td()
    out = scorer(td)
    assert out is td
    assert torch.equal(td["reward"], _expected()) and td["reward"].dtype == torch.float32
    assert isinstance(scorer, TensorDictModuleBase)
    assert scorer.in_keys == [("tokens", "full"), ("masks", "all_attention_mask")] and scorer.out_keys == ["reward"]


@pytest.mark.parametrize(("shape", "output"), [("column", "logits"), ("flat", "logits"), ("column", "rewards"),
                                               ("flat", "tensor")])
def test_logits_rewards_or_a_bare_tensor_of_shape_b_or_b_1(shape, output):
    scorer = HFRewardModelWrapper(TokenSum(shape, output), token_key="input_ids", attention_mask_key="attention_mask",
                                  reward_key=("out", "score"))
    assert torch.equal(scorer(_td(nested=False))["out", "score"], _expected())


def test_without_an_attention_mask_key_the_model_sees_every_token():
    scorer = HFRewardModelWrapper(TokenSum(), token_key="input_ids", attention_mask_key=None)
    assert scorer.in_keys == ["input_ids"]
    assert torch.equal(scorer(_td(nested=False))["reward"], torch.arange(B * T).reshape(B, T).sum(-1).float())


def test_gradients_flow_unless_inference_mode():
    model = TokenSum()
    reward = HFRewardModelWrapper(model)(_td())["reward"]
    reward.sum().backward()
    assert model.scale.grad is not None
    frozen = HFRewardModelWrapper(model, inference_mode=True)(_td())["reward"]
    assert not frozen.requires_grad
    assert HFRewardModelWrapper(model).model is model


def test_a_missing_entry_is_named():
    td = _td()
    del td["masks"]
    with pytest.raises(KeyError) as err:
        HFRewardModelWrapper(TokenSum())(td)
    assert "('masks', 'all_attention_mask') (`attention_mask_key`)" in err.value.args[0]
    assert "reward" not in td.keys()


def test_an_output_without_a_reward_raises_torchrl_s_phrase():
    with pytest.raises(RuntimeError, match="could not extract reward") as err:
        HFRewardModelWrapper(TokenSum(output="dict"))(_td())
    assert "TokenSum" in str(err.value) and "logits" in str(err.value)


def test_more_than_one_score_per_sequence_raises_torchrl_s_phrase():
    with pytest.raises(RuntimeError, match="expected one scalar reward per input") as err:
        HFRewardModelWrapper(TokenSum("pair"))(_td())
    assert "[3, 2]" in str(err.value) and "num_labels=1" in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"model": "bert"}, "`model` must be a torch.nn.Module"),
     ({"token_key": 1}, "`token_key` must be a key"),
     ({"attention_mask_key": ("a", 2)}, "`attention_mask_key` must be a key .* or None"),
     ({"reward_key": None}, "`reward_key` must be a key"),
     ({"inference_mode": 1}, "`inference_mode` must be a bool")],
)
def test_bad_arguments_are_refused(kwargs, match):
    kwargs = {"model": TokenSum(), **kwargs}
    with pytest.raises(TypeError, match=match):
        HFRewardModelWrapper(**kwargs)


def test_a_tiny_hugging_face_sequence_classifier():
    transformers = require("transformers")
    config = transformers.GPT2Config(vocab_size=32, n_positions=T, n_embd=8, n_layer=1, n_head=2, num_labels=1,
                                     pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2ForSequenceClassification(config).eval()
    td = _td()
    td["tokens", "full"] = td["tokens", "full"] % 31 + 1
    reward = HFRewardModelWrapper(model, inference_mode=True)(td)["reward"]
    with torch.no_grad():
        expected = model(input_ids=td["tokens", "full"], attention_mask=td["masks", "all_attention_mask"]).logits
    assert reward.shape == (B,) and torch.allclose(reward, expected.squeeze(-1))
