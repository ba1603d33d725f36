"""The dataset registry: load_dataset / register_dataset.

A dataset id is ``"<source>:<name>"``; ``load_dataset`` looks the source up in the registry and calls its
factory with ``name`` (positional) and the keyword arguments. A factory is a callable or a lazy
``"module:attribute"`` string imported on first use, so registering a source imports nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torchrl._phrases import TorchRLPhrase
from torchrl.data._torchrl_names import NotProvidedError

DATASET_PREFIX_REGISTERED = TorchRLPhrase(
    KeyError,
    "already registered. Pass replace=True",
    "Dataset source {prefix!r} is already registered. Pass replace=True to register_dataset to replace its "
    "factory ({current}), or choose another prefix.",
)
DATASET_ID_PREFIX = TorchRLPhrase(
    ValueError,
    "dataset_id must be prefixed with a source identifier",
    "dataset_id must be prefixed with a source identifier, as in 'minari:<name>', got {dataset_id!r}. Known "
    "sources: {sources}.",
)
DATASET_UNKNOWN_SOURCE = TorchRLPhrase(
    ValueError,
    "Unknown dataset source",
    "Unknown dataset source {prefix!r} (in dataset_id {dataset_id!r}). Known sources: {sources}; add one with "
    "register_dataset(prefix, factory).",
)

__all__ = ["load_dataset", "register_dataset"]

#: TorchRL dataset sources whose classes this package does not provide, and the TorchRL class of each.
NOT_PROVIDED_SOURCES: dict[str, str] = {
    "atari": "AtariDQNExperienceReplay",
    "atari_dqn": "AtariDQNExperienceReplay",
    "gen_dgrl": "GenDGRLExperienceReplay",
    "openml": "OpenMLExperienceReplay",
    "openx": "OpenXExperienceReplay",
    "roboset": "RobosetExperienceReplay",
    "vd4rl": "VD4RLExperienceReplay",
}


class _NotProvidedSource:
    """The factory of a TorchRL source this package does not implement: raises a clear error when called."""

    def __init__(self, prefix: str, cls_name: str):
        self.prefix, self.cls_name = prefix, cls_name

    def __call__(self, name: str, **kwargs: Any):
        raise NotProvidedError(
            f"Dataset source {self.prefix!r} ({self.cls_name} in TorchRL) is not provided by this package, which "
            f"implements the offline datasets 'minari', 'd4rl' and 'lerobot' (local files, no download). Use "
            f"TorchRL itself for {self.prefix}:{name}, or register your own factory with "
            f"register_dataset({self.prefix!r}, factory, replace=True)."
        )

    def __repr__(self) -> str:
        return f"<{self.cls_name}: not provided by this package>"


_REGISTRY: dict[str, Callable | str] = {
    "minari": "torchrl.data.datasets.minari_data:MinariExperienceReplay",
    "d4rl": "torchrl.data.datasets.d4rl:D4RLExperienceReplay",
    "lerobot": "torchrl.data.datasets.lerobot:LeRobotExperienceReplay",
    **{prefix: _NotProvidedSource(prefix, cls_name) for prefix, cls_name in NOT_PROVIDED_SOURCES.items()},
}


def _check_prefix(prefix) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"`prefix` must be a str such as 'minari', got {type(prefix).__name__} ({prefix!r}).")
    key = prefix.strip().lower()
    if not key or ":" in key:
        raise ValueError(
            f"`prefix` must be a non-empty name without ':' (the separator of '<source>:<name>'), got {prefix!r}."
        )
    return key


def _check_factory(dataset) -> Callable | str:
    if isinstance(dataset, str):
        module, sep, attribute = dataset.partition(":")
        if not sep or not module.strip() or not attribute.strip() or ":" in attribute:
            raise ValueError(
                f"A lazy dataset factory is a 'module:attribute' string such as "
                f"'my_package.datasets:MyDataset', got {dataset!r}."
            )
        return dataset
    if not callable(dataset):
        raise TypeError(
            f"`dataset` must be a callable (a dataset class or a function name -> dataset) or a "
            f"'module:attribute' string, got {type(dataset).__name__} ({dataset!r})."
        )
    return dataset


def _resolve(factory: Callable | str) -> Callable:
    if not isinstance(factory, str):
        return factory
    module, _, attribute = factory.partition(":")
    obj = importlib.import_module(module.strip())
    for part in attribute.strip().split("."):
        obj = getattr(obj, part)
    return obj


def register_dataset(prefix: str, dataset: Callable | str, *, replace: bool = False) -> None:
    """Registers a dataset source, so that ``load_dataset("<prefix>:<name>", ...)`` builds its datasets.

    Why: scripts name datasets with one string (``"minari:mujoco/hopper/expert-v0"``); registering a source
    lets your own dataset classes be named the same way, without changing the script.

    Args:
        prefix (str): the source name; stripped and lower-cased. Must be non-empty and contain no ``":"``.
        dataset (Callable or str): called as ``dataset(name, **kwargs)``: a dataset class, a function, or a lazy
            ``"module:attribute"`` string imported on the first ``load_dataset`` of this source.

    Keyword Args:
        replace (bool): replace a source already registered under ``prefix``. Defaults to ``False``.

    Examples:
        >>> from torchrl.data.datasets import load_dataset, register_dataset
        >>> register_dataset("toy", lambda name, **kw: f"toy dataset {name} {kw}", replace=True)
        >>> load_dataset("toy:small", size=3)
        "toy dataset small {'size': 3}"
    """
    key = _check_prefix(prefix)
    factory = _check_factory(dataset)
    if not isinstance(replace, bool):
        raise TypeError(f"`replace` must be a bool, got {replace!r}.")
    if key in _REGISTRY and not replace:
        raise DATASET_PREFIX_REGISTERED.error(prefix=key, current=_REGISTRY[key])
    _REGISTRY[key] = factory


def load_dataset(dataset_id: str, **kwargs: Any):
    """Builds the dataset ``"<source>:<name>"`` with the factory registered for ``source``.

    ``dataset_id`` is split on its first ``":"``: ``"minari:cartpole/random-v0"`` calls
    ``MinariExperienceReplay("cartpole/random-v0", **kwargs)``. Built-in sources: ``minari``, ``d4rl`` and
    ``lerobot``; TorchRL's other sources (``atari``, ``atari_dqn``, ``gen_dgrl``, ``openml``, ``openx``,
    ``roboset``, ``vd4rl``) are known but raise an :class:`ImportError` naming what is not provided here.

    Args:
        dataset_id (str): ``"<source>:<name>"``.
        **kwargs: passed to the factory (``batch_size``, ``root``, ...).

    Examples:
        >>> from torchrl.data.datasets import load_dataset
        >>> load_dataset("cartpole")
        Traceback (most recent call last):
        ...
        ValueError: dataset_id must be prefixed ...
    """
    if not isinstance(dataset_id, str):
        raise TypeError(f"`dataset_id` must be a str '<source>:<name>', got {type(dataset_id).__name__}.")
    sources = ", ".join(sorted(_REGISTRY))
    if ":" not in dataset_id:
        raise DATASET_ID_PREFIX.error(dataset_id=dataset_id, sources=sources)
    prefix, _, name = dataset_id.partition(":")
    key = prefix.strip().lower()
    if key not in _REGISTRY:
        raise DATASET_UNKNOWN_SOURCE.error(prefix=prefix, dataset_id=dataset_id, sources=sources)
    return _resolve(_REGISTRY[key])(name, **kwargs)
