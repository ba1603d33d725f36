"""Interop with Hugging Face / TRL trainers.

Names are resolved lazily, so importing ``torchrl.modules.llm`` needs neither ``transformers``, ``trl`` nor
``datasets``.
"""

from __future__ import annotations

__all__ = ["HFRewardModelWrapper", "TorchRLBufferDataset"]


def __getattr__(name: str):
    if name in __all__:
        from torchrl.modules.llm import trl_interop

        return getattr(trl_interop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
