"""The LLM samplers, at TorchRL's module path ``samplers.llm``: :class:`PromptGroupSampler` (batches of
completions grouped by prompt, for GRPO-style training), which lives in :mod:`.prompt_group`."""

from torchrl.data.replay_buffers.samplers.prompt_group import PromptGroupSampler

__all__ = ["PromptGroupSampler"]
