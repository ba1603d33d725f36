"""Interop with Hugging Face / TRL trainers.

Names are resolved lazily, so importing ``torchrl.modules.llm`` needs neither ``transformers``, ``trl`` nor
``datasets``.
"""

from __future__ import annotations

__all__ = ["TorchRLBufferDataset"]


def __getattr__(name: str):
    if name == "TorchRLBufferDataset":
        from torchrl.modules.llm.trl_interop import TorchRLBufferDataset

        return TorchRLBufferDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
