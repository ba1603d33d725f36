"""TorchRL names this package does not provide, and the error their import raises.

This package is TorchRL's replay-buffer data module: ``torchrl.data`` here has TorchRL's replay buffers,
storages, samplers, writers and their helpers, under TorchRL's names. TorchRL's ``torchrl.data`` also exports
environment specs, LLM data tools, tensor maps and MCTS trees, robot-dataset helpers, and a few replay-buffer
extras that are not implemented here. Code written for TorchRL that imports one of those names gets, instead of
Python's bare "cannot import name", an :class:`NotProvidedError` that says what the name is and where it lives.

How: a module lists the names (:data:`NOT_PROVIDED`) and defines ``__getattr__ = not_provided_getattr(__name__,
names)`` (PEP 562). Python calls it only for names the module does not define, so a name that gets implemented
later simply stops reaching it. The error subclasses :class:`ImportError`: ``from torchrl.data import Bounded``
raises it with its message (Python replaces the message of an ``AttributeError`` there by its own). The
consequence: ``torchrl.data.Bounded``, ``hasattr(torchrl.data, "Bounded")`` and ``getattr(torchrl.data,
"Bounded", None)`` raise it too, instead of answering ``False``/``None``. These names are absent from
``__all__`` and ``dir()``, so star-imports, tab completion and tools that walk a module's members never meet
them; every other missing name raises the usual ``AttributeError``.

This module imports nothing from torchrl.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["NotProvidedError", "NOT_PROVIDED", "not_provided_getattr"]

_SPECS = "environment specs (TorchRL's torchrl.data.tensor_specs)"
_LLM = "LLM data tools (TorchRL's torchrl.data.llm and torchrl.data.rlhf)"
_MAPS = "tensor maps and MCTS trees (TorchRL's torchrl.data.map)"
_ROBOT = "robot / vision-language-action dataset helpers (TorchRL's torchrl.data.datasets)"
_RB = "replay-buffer extras that this package does not implement"

_AREAS: dict[str, tuple[str, ...]] = {
    _SPECS: (
        "Binary", "Bounded", "BoundedContinuous", "Categorical", "Choice", "Composite", "DEVICE_TYPING",
        "MultiCategorical", "MultiOneHot", "NonTensor", "OneHot", "Stacked", "StackedComposite", "TensorSpec",
        "Unbounded", "UnboundedContinuous", "UnboundedDiscrete", "check_no_exclusive_keys", "consolidate_spec",
        "contains_lazy_spec",
    ),
    _LLM: (
        "AdaptiveKLController", "ConstantKLController", "ContentBase", "History",
        "PairwiseDataset", "PromptData", "PromptTensorDictTokenizer", "RewardData", "RolloutFromModel",
        "TensorDictTokenizer", "TokenizedDatasetLoader", "TopKRewardSelector", "create_infinite_iterator",
        "get_dataloader",
    ),
    _MAPS: (
        "BinaryToDecimal", "HashToInt", "MCTSForest", "QueryModule", "RandomProjectionHash", "SipHash",
        "TensorDictMap", "TensorMap", "Tree",
    ),
    _ROBOT: (
        "ActionTokenizerBase", "RobotDatasetMetadata", "UniformActionTokenizer", "VideoClipRef",
        "VocabTailActionTokenizer", "clear_video_decoder_cache", "set_video_decoder_cache_size",
        "validate_vla_tensordict",
    ),
    _RB: (),
}  # fmt: skip

#: Each TorchRL ``torchrl.data`` name this package does not provide, and what it is in TorchRL.
NOT_PROVIDED: dict[str, str] = {name: area for area, names in _AREAS.items() for name in names}

#: The replay-buffer names among them (those ``torchrl.data.replay_buffers`` exports in TorchRL).
REPLAY_BUFFER_NAMES: frozenset[str] = frozenset(_AREAS[_RB])


class NotProvidedError(ImportError):
    """A TorchRL name that this package does not provide was imported or accessed.

    An :class:`ImportError`, so ``try: from torchrl.data import X`` / ``except ImportError`` works as for any
    missing optional feature. The message names the TorchRL area the name belongs to.
    """


def _message(module: str, name: str) -> str:
    area = NOT_PROVIDED[name]
    if area == _RB:
        return (
            f"{name!r} is a TorchRL replay-buffer name that this package does not implement (imported from "
            f"{module!r}). This package provides TorchRL's replay buffers, storages, samplers and writers; its "
            f"'Differences from TorchRL' page lists what is missing and why. Use TorchRL itself for {name}."
        )
    return (
        f"{name!r} belongs to TorchRL's {area}, which is not part of this package (imported from {module!r}). "
        f"This package is TorchRL's data module for replay buffers only (buffers, storages, samplers, writers "
        f"and their DataLoader adapters). Use TorchRL itself for {name}."
    )


def not_provided_getattr(module: str, names: Iterable[str]) -> Callable[[str], object]:
    """A module ``__getattr__`` that raises :class:`NotProvidedError` for ``names`` (TorchRL names listed in
    :data:`NOT_PROVIDED`) and the usual ``AttributeError`` for any other name."""
    refused = frozenset(names)
    unknown = refused - NOT_PROVIDED.keys()
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not listed in NOT_PROVIDED.")

    def __getattr__(name: str):
        if name in refused:
            raise NotProvidedError(_message(module, name), name=module)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
