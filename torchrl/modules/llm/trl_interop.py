"""Feed replay buffers to Hugging Face / TRL trainers (:class:`TorchRLBufferDataset`), and score token sequences
with a Hugging Face reward model inside TensorDict pipelines (:class:`HFRewardModelWrapper`).

Trainers of ``transformers`` and ``trl`` consume datasets whose items are flat ``dict[str, Any]`` samples.
:class:`TorchRLBufferDataset` is a :class:`~torchrl.data.ReplayBufferDataset` that draws ``batch_size`` items
per sampling call and yields them one at a time as such dicts; :meth:`TorchRLBufferDataset.as_hf_dataset`
wraps it in a ``datasets.IterableDataset`` for trainers that want one.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from torchrl._phrases import TorchRLPhrase
from torchrl.data import GroupSampler, ReplayBufferDataset
from torchrl.data.replay_buffers.replay_buffers import ReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.dataset import SHAREABLE_SAMPLERS

__all__ = ["HFRewardModelWrapper", "TorchRLBufferDataset"]

REWARD_NOT_FOUND = TorchRLPhrase(
    RuntimeError,
    "could not extract reward",
    "HFRewardModelWrapper could not extract reward from the output of {model} ({output}): the model must return "
    "an object with `logits` (a sequence-classification model with num_labels=1) or `rewards`, or a tensor.",
)
REWARD_SHAPE = TorchRLPhrase(
    RuntimeError,
    "expected one scalar reward per input",
    "HFRewardModelWrapper expected one scalar reward per input: {batch} token sequences, and the model returned "
    "rewards of shape {shape}. Use a reward model with a single output (num_labels=1).",
)


def _flat_name(key) -> str:
    return ".".join(key) if isinstance(key, tuple) else key


def _is_leaf(cls: type) -> bool:
    """Tensors and non-tensor entries are leaves; nested TensorDicts are not."""
    return not issubclass(cls, TensorDictBase) or issubclass(cls, (NonTensorData, NonTensorStack))


def _leaf_keys(batch: TensorDictBase) -> list:
    return list(batch.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf))


def _column(batch: TensorDictBase, key):
    """The entry ``key`` of every item: a batched tensor, or a list of tensors for ragged lazy stacks."""
    try:
        return batch.get(key)
    except RuntimeError:  # a lazy stack of items whose tensors differ in shape
        return batch.get(key, as_list=True)


def _unwrap(value) -> Any:
    if isinstance(value, NonTensorData):
        return value.data
    if isinstance(value, NonTensorStack):
        return value.tolist()
    return value


class TorchRLBufferDataset(ReplayBufferDataset):
    """An iterable dataset of flat ``dict`` samples drawn from a replay buffer, for HF / TRL trainers.

    Each sampling call draws ``batch_size`` items with ``replay_buffer.sample(batch_size)`` and yields them
    one by one as ``dict[str, Any]`` without a batch dim: nested keys are joined with ``"."``
    (``("tokens", "full")`` -> ``"tokens.full"``) and non-tensor entries (strings) are unwrapped to Python
    values.

    It is built on the public hooks of :class:`~torchrl.data.ReplayBufferDataset`: :meth:`draw` samples
    ``batch_size`` items, :meth:`items` splits them into dicts, and ``refuse_stateful = False``. Under DataLoader
    workers it behaves like its base: the buffer's worker copy is readied and reseeded per worker, the
    ``num_batches`` sampling calls are split across workers, and a stateful sampler that can share its state
    (``can_share_state``: prioritized samplers, samplers without replacement) is moved to shared memory when the
    dataset is built, so that every worker samples from and updates one copy. Only a buffer whose sampler (or
    storage) requires shared state but cannot share it differs: it is not refused yet, building the dataset
    emits a ``FutureWarning`` (refused with workers from v0.17), and each worker then samples from its own copy.

    Strings are yielded as Python strings whatever the storage: a :class:`~torchrl.data.ListStorage` keeps
    them as written, the tensor storages as UTF-8 bytes that every worker reads from the shared storage.

    Groups of completions (language-model rollouts): over a :class:`~torchrl.data.PackedSequenceStorage`
    sampled by a :class:`~torchrl.data.GroupSampler`, ``batch_size`` counts groups, as ``rb.sample(batch_size)``
    does, and each sampling call yields the sequences of whole groups, one group after the other, each in write
    order: a consumer that takes ``G`` consecutive items per prompt (GRPO's group-relative advantage) sees
    every group whole. Each item holds its own tokens (``[L_i]``, no padding) and its fixed entries as
    0-d tensors; an item stored with ``input_ids`` and ``completion_mask`` is what TRL's ``SFTTrainer`` trains
    on with ``completion_only_loss=True``. Such a dataset has no length (the group sizes decide how many items
    a call yields): bound the stream with the trainer's ``max_steps``. Each DataLoader worker yields whole
    groups, but the loader takes one item from each worker in turn: read with ``num_workers=0`` where the
    items of a group must come next to each other.

    Args:
        replay_buffer (ReplayBuffer): the buffer to sample; its data must be TensorDicts.
        batch_size (int): the number of items each sampling call draws.

    Keyword Args:
        keys (list of NestedKey, optional): keep only these entries. A key missing from the sampled data
            raises a ``KeyError``. Defaults to ``None`` (every leaf entry).
        device (torch.device or str, optional): move tensors there. Defaults to ``None`` (no move).
        num_batches (int, optional): sampling calls per iteration, in total over all DataLoader workers.
            ``None`` is an unbounded stream: the consumer must impose its own step limit (e.g. a trainer's
            ``max_steps``). Defaults to ``1``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import ListStorage, ReplayBuffer
        >>> from torchrl.modules.llm import TorchRLBufferDataset
        >>> rb = ReplayBuffer(storage=ListStorage(100), batch_size=4)
        >>> for _ in range(10):
        ...     _ = rb.add(TensorDict(input_ids=torch.randint(0, 100, (8,)), attention_mask=torch.ones(8)))
        >>> dataset = TorchRLBufferDataset(rb, batch_size=4)
        >>> next(iter(dataset))["input_ids"].shape
        torch.Size([8])
        >>> len(list(dataset))
        4
    """

    refuse_stateful = False

    def __init__(self, replay_buffer: ReplayBuffer, batch_size: int, *, keys=None, device=None,
                 num_batches: int | None = 1):
        if not issubclass(type(replay_buffer), ReplayBuffer):  # a RayReplayBuffer passes isinstance only
            raise TypeError(
                f"`replay_buffer` must be a torchrl ReplayBuffer in this process, got {type(replay_buffer).__name__}"
                f" (a RayReplayBuffer is read through rb.as_dataset())."
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"`batch_size` must be a positive integer, got {batch_size!r}.")
        self.batch_size = batch_size
        self.keys = None if keys is None else [k if isinstance(k, (str, tuple)) else str(k) for k in keys]
        self.device = None if device is None else torch.device(device)
        super().__init__(replay_buffer, num_batches=num_batches)
        stateful = replay_buffer.stateful_component()
        if stateful is not None:
            name, component = stateful
            warnings.warn(
                f"The buffer's {name} {type(component).__name__} requires shared state and cannot put it in "
                f"shared memory: with DataLoader workers each worker would hold its own copy of it. "
                f"TorchRLBufferDataset will refuse such a buffer with workers from v0.17 (as ReplayBufferDataset "
                f"does); use num_workers=0, a stateless sampler (RandomSampler, SliceSampler) or one that shares "
                f"its state with the workers ({SHAREABLE_SAMPLERS}).",
                FutureWarning,
                stacklevel=2,
            )

    def __len__(self) -> int:
        """The number of items (``num_batches * batch_size``); a ``TypeError`` for an endless dataset, and for a
        buffer whose sampler draws whole groups (a :class:`~torchrl.data.GroupSampler`: the number of items then
        depends on the sizes of the groups drawn)."""
        if isinstance(self.replay_buffer.sampler, GroupSampler):
            raise TypeError(
                "This TorchRLBufferDataset draws whole groups (GroupSampler): the number of items it yields depends "
                "on the sizes of the groups drawn, so it has no length. Bound the stream with the trainer's "
                "max_steps."
            )
        return super().__len__() * self.batch_size

    def draw(self) -> TensorDictBase:
        """Samples ``batch_size`` items; a ``TypeError`` if the buffer's data are not TensorDicts."""
        batch = self.replay_buffer.sample(self.batch_size)
        if not isinstance(batch, TensorDictBase):
            raise TypeError(
                f"TorchRLBufferDataset yields dicts of the entries of TensorDict samples; the buffer returned "
                f"{type(batch).__name__}. Store TensorDicts in the buffer."
            )
        return batch

    def _selected_keys(self, batch: TensorDictBase) -> list:
        if self.keys is None:
            return _leaf_keys(batch)
        present = set(batch.keys(include_nested=True))
        missing = [k for k in self.keys if k not in present]
        if missing:
            raise KeyError(
                f"`keys` asks for {missing}, which the sampled data does not hold; it holds "
                f"{sorted(map(_flat_name, _leaf_keys(batch)))}."
            )
        return self.keys

    def items(self, batch: TensorDictBase):
        """Yields each item of ``batch`` as a flat dict (``keys`` selected, moved to ``device``)."""
        keys = self._selected_keys(batch)
        columns = {}
        for key in keys:
            value = _column(batch, key)
            if isinstance(value, (NonTensorData, NonTensorStack)):
                value = _unwrap(value)
                if not isinstance(value, list):
                    value = [value] * batch.batch_size[0]
            elif self.device is not None:
                value = [v.to(self.device) for v in value] if isinstance(value, list) else value.to(self.device)
            columns[_flat_name(key)] = value
        for i in range(batch.batch_size[0]):
            yield {name: column[i] for name, column in columns.items()}

    def as_hf_dataset(self):
        """This dataset as a ``datasets.IterableDataset`` (needs the ``datasets`` package).

        Examples:
            >>> ds = dataset.as_hf_dataset()  # doctest: +SKIP
            >>> next(iter(ds))["input_ids"]  # doctest: +SKIP
        """
        try:
            import datasets
        except ImportError as err:
            raise ImportError(
                "as_hf_dataset() needs the `datasets` package: pip install datasets (or torchrl[hf])."
            ) from err
        # ``IterableDataset.from_generator`` would pickle the whole buffer to fingerprint it (a full copy, and
        # an error for shared-memory data): build the iterable directly instead.
        from datasets.iterable_dataset import ExamplesIterable

        return datasets.IterableDataset(ExamplesIterable(_generate_examples, {"dataset": self}))

    def __repr__(self) -> str:
        keys = "<all>" if self.keys is None else self.keys
        return (
            f"TorchRLBufferDataset(replay_buffer={type(self.replay_buffer).__name__}, batch_size={self.batch_size}, "
            f"keys={keys}, device={self.device}, num_batches={self.num_batches})"
        )


def _generate_examples(dataset: TorchRLBufferDataset):
    yield from enumerate(dataset)


def _check_nested_key(name: str, key, *, optional: bool = False):
    if optional and key is None:
        return None
    if isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key)):
        return key
    none = " or None (no attention mask)" if optional else ""
    raise TypeError(f"`{name}` must be a key (a str or a tuple of str){none}, got {key!r}.")


class HFRewardModelWrapper(TensorDictModuleBase):
    """Runs a Hugging Face reward model on token ids and writes one scalar reward per sequence.

    Why: RLHF pipelines keep token ids and attention masks in TensorDicts (replay buffers, collectors); this
    module scores them with a reward model (e.g. ``AutoModelForSequenceClassification`` with ``num_labels=1``)
    where TensorDict modules are expected, e.g. as a buffer or environment transform.

    ``forward(td)`` calls ``model(input_ids=td[token_key], attention_mask=td[attention_mask_key])`` and writes
    the reward (``float32``, shape ``[B]``) into ``td[reward_key]`` in place. The reward is the output's
    ``logits``, else its ``rewards``, else the output itself when it is a tensor; an output of shape ``[B, 1]`` is
    squeezed to ``[B]``.

    Args:
        model (torch.nn.Module): the reward model, called with the keywords ``input_ids`` and ``attention_mask``.

    Keyword Args:
        token_key (NestedKey): the token ids, ``[B, T]`` integers. Defaults to ``("tokens", "full")``.
        attention_mask_key (NestedKey, optional): the attention mask, ``[B, T]``; ``None`` calls the model without
            one. Defaults to ``("masks", "all_attention_mask")``.
        reward_key (NestedKey): where the reward is written. Defaults to ``"reward"``.
        inference_mode (bool): run the model without building an autograd graph (``torch.no_grad``), for
            scoring only. Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules.llm.trl_interop import HFRewardModelWrapper
        >>> class LengthReward(torch.nn.Module):  # stands for a reward model: one logit per sequence
        ...     def forward(self, input_ids, attention_mask):
        ...         return attention_mask.sum(-1, keepdim=True).float()
        >>> scorer = HFRewardModelWrapper(LengthReward(), token_key="input_ids", attention_mask_key="attention_mask")
        >>> td = TensorDict(input_ids=torch.ones(2, 4, dtype=torch.long),
        ...                 attention_mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]), batch_size=[2])
        >>> scorer(td)["reward"]
        tensor([2., 4.])
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        token_key=("tokens", "full"),
        attention_mask_key=("masks", "all_attention_mask"),
        reward_key="reward",
        inference_mode: bool = False,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"`model` must be a torch.nn.Module (e.g. AutoModelForSequenceClassification.from_pretrained(..., "
                f"num_labels=1)), got {type(model).__name__}."
            )
        token_key = _check_nested_key("token_key", token_key)
        attention_mask_key = _check_nested_key("attention_mask_key", attention_mask_key, optional=True)
        reward_key = _check_nested_key("reward_key", reward_key)
        if not isinstance(inference_mode, bool):
            raise TypeError(f"`inference_mode` must be a bool, got {inference_mode!r}.")
        super().__init__()
        self._model = model
        self.token_key = token_key
        self.attention_mask_key = attention_mask_key
        self.reward_key = reward_key
        self.inference_mode = inference_mode
        self.in_keys = [token_key] if attention_mask_key is None else [token_key, attention_mask_key]
        self.out_keys = [reward_key]

    @property
    def model(self) -> torch.nn.Module:
        """The wrapped reward model."""
        return self._model

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Scores the sequences of ``tensordict`` and writes ``tensordict[reward_key]`` (returns ``tensordict``)."""
        keys = [("token_key", self.token_key)]
        if self.attention_mask_key is not None:
            keys.append(("attention_mask_key", self.attention_mask_key))
        inputs = {}
        for name, key in keys:
            value = tensordict.get(key, None)
            if value is None:
                raise KeyError(
                    f"HFRewardModelWrapper reads {key!r} (`{name}`), which the TensorDict does not hold; its keys: "
                    f"{sorted(map(str, tensordict.keys(include_nested=True, leaves_only=True)))}. Pass `{name}` "
                    f"naming the entry."
                )
            inputs["input_ids" if name == "token_key" else "attention_mask"] = value
        context = torch.no_grad() if self.inference_mode else contextlib.nullcontext()
        with context:
            output = self._model(**inputs)
        reward = _reward_of(output, self._model)
        batch = inputs["input_ids"].shape[0] if inputs["input_ids"].ndim else 0
        if reward.ndim == 2 and reward.shape[-1] == 1:
            reward = reward.squeeze(-1)
        if reward.ndim != 1 or reward.shape[0] != batch:
            raise REWARD_SHAPE.error(batch=batch, shape=list(reward.shape))
        tensordict.set(self.reward_key, reward.float())
        return tensordict


def _reward_of(output, model: torch.nn.Module) -> torch.Tensor:
    """The reward tensor of a reward model's ``output``: its ``logits``, else its ``rewards``, else the tensor."""
    for name in ("logits", "rewards"):
        value = getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, torch.Tensor):
        return output
    raise REWARD_NOT_FOUND.error(model=type(model).__name__, output=type(output).__name__)
