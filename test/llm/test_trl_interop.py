"""TorchRLBufferDataset: replay buffers fed to Hugging Face / TRL trainers (issue 6).

The unit tests need no extra. The tests marked ``extras`` drive the real clients (``datasets``,
``transformers.Trainer``, TRL's ``SFTTrainer`` and ``GRPOTrainer``) with a tiny randomly initialised GPT-2 and
a word-level tokenizer built in the test: nothing is downloaded, and each is skipped when its package is
missing.

Every item written by :func:`id_buffer` carries its id in every leaf (``input_ids`` is ``[id] * 8``,
``meta.id`` is ``id``, ``prompt`` is ``f"p{id}"``), so a test can check that the entries of a yielded dict
belong to the same item.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers.extras import require
from helpers.factories import make_buffer, make_storage
from tensordict import TensorDict
from torch.utils.data import DataLoader, IterableDataset

from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    ReplayBufferDataset,
    SamplerWithoutReplacement,
)
from torchrl.modules.llm import TorchRLBufferDataset

SEQ = 8
VOCAB = 64
TIMEOUT = 60  # DataLoader timeout: a deadlock fails instead of hanging
REPO_ROOT = Path(__file__).resolve().parents[2]
STORAGES = ["list", "lazy", "memmap"]


def id_item(i: int, *, prompt: bool = False) -> TensorDict:
    """One item with id ``i``: ``input_ids`` = ``[i] * SEQ``, ``attention_mask``, ``("meta", "id")`` (+ ``prompt``)."""
    item = TensorDict(
        {
            "input_ids": torch.full((SEQ,), i, dtype=torch.long),
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            ("meta", "id"): torch.tensor(i),
        }
    )
    if prompt:
        item["prompt"] = f"p{i}"
    return item


def id_buffer(storage: str = "list", n: int = 16, *, prompt: bool = False, sampler=None,
                generator: torch.Generator | None = None) -> ReplayBuffer:
    """A buffer of ``n`` items with ids ``0 .. n - 1`` (added one by one for a list storage, extended otherwise)."""
    rb = make_buffer(storage=make_storage(storage, 64), sampler=sampler, batch_size=4, generator=generator)
    if storage == "list":
        for i in range(n):
            rb.add(id_item(i, prompt=prompt))
    else:
        rb.extend(torch.stack([id_item(i, prompt=prompt) for i in range(n)]))
    return rb


def item_id(item: dict) -> int:
    """The id of a yielded item, after checking that all its entries belong to that item."""
    i = int(item["meta.id"])
    assert torch.equal(item["input_ids"], torch.full((SEQ,), i))
    if "prompt" in item:
        assert item["prompt"] == f"p{i}"
    return i


# -- the documented example and the shape of the items ----------------------------------------------------------
def test_documented_example_works_as_written():
    rb = ReplayBuffer(storage=ListStorage(100), batch_size=4)
    for _ in range(10):
        rb.add(TensorDict(input_ids=torch.randint(0, 100, (8,)), attention_mask=torch.ones(8)))
    dataset = TorchRLBufferDataset(rb, batch_size=4)

    item = next(iter(dataset))
    assert item["input_ids"].shape == torch.Size([8])
    assert item["attention_mask"].shape == torch.Size([8])
    assert len(list(dataset)) == 4
    assert isinstance(dataset, IterableDataset)
    assert isinstance(dataset, ReplayBufferDataset)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_items_are_flat_dicts_of_one_item_each(storage, batch_size):
    rb = id_buffer(storage)
    items = list(TorchRLBufferDataset(rb, batch_size))

    assert len(items) == batch_size
    for item in items:
        assert type(item) is dict
        assert set(item) == {"input_ids", "attention_mask", "meta.id"}
        assert item["input_ids"].shape == torch.Size([SEQ])  # no leading batch dim
        assert item["attention_mask"].shape == torch.Size([SEQ])
        assert item["meta.id"].shape == torch.Size([])
        assert 0 <= item_id(item) < len(rb)


# -- num_batches --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_batches", [1, 2, 5])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_num_batches_sampling_calls_per_iterator(num_batches, batch_size):
    dataset = TorchRLBufferDataset(id_buffer(), batch_size, num_batches=num_batches)
    # every new iterator yields num_batches * batch_size items again
    for _ in range(2):
        assert len(list(dataset)) == num_batches * batch_size


def test_num_batches_defaults_to_one_sampling_call():
    dataset = TorchRLBufferDataset(id_buffer(), 5)
    assert dataset.num_batches == 1
    assert len(list(dataset)) == 5


def test_num_batches_none_is_an_unbounded_stream():
    rb = id_buffer(n=16)
    dataset = TorchRLBufferDataset(rb, 4, num_batches=None)
    # far more items than the buffer holds or one sampling call draws: the stream does not end
    items = list(itertools.islice(dataset, 101))
    assert len(items) == 101
    assert all(0 <= item_id(item) < 16 for item in items)
    with pytest.raises(TypeError, match="endless"):
        len(dataset)


@pytest.mark.parametrize("num_batches,batch_size", [(2, 4), (3, 2)])
def test_len_is_the_number_of_items_yielded(num_batches, batch_size):
    dataset = TorchRLBufferDataset(id_buffer(), batch_size, num_batches=num_batches)
    assert len(dataset) == len(list(dataset)) == num_batches * batch_size
    loader = DataLoader(dataset, batch_size=batch_size)
    assert len(loader) == len(list(loader)) == num_batches


# -- keys -----------------------------------------------------------------------------------------------------------
def test_nested_keys_are_joined_with_a_dot():
    rb = ReplayBuffer(storage=ListStorage(8), batch_size=2)
    for i in range(4):
        rb.add(TensorDict({("tokens", "full"): torch.full((3,), i), ("a", "b", "c"): torch.tensor(float(i))}))
    item = next(iter(TorchRLBufferDataset(rb, 2)))
    assert set(item) == {"tokens.full", "a.b.c"}
    assert float(item["a.b.c"]) == float(item["tokens.full"][0])


@pytest.mark.parametrize("keys,expected", [
    (["input_ids"], {"input_ids"}),
    ([("meta", "id")], {"meta.id"}),
    (["input_ids", ("meta", "id")], {"input_ids", "meta.id"}),
    (["prompt", "attention_mask"], {"prompt", "attention_mask"}),
])
def test_keys_keeps_only_the_named_entries(keys, expected):
    dataset = TorchRLBufferDataset(id_buffer(prompt=True), 4, keys=keys)
    items = list(dataset)
    assert len(items) == 4
    assert all(set(item) == expected for item in items)


@pytest.mark.parametrize("missing", ["labels", ("meta", "nope")])
def test_a_missing_key_raises_a_key_error_naming_it(missing):
    dataset = TorchRLBufferDataset(id_buffer(), 4, keys=["input_ids", missing])
    with pytest.raises(KeyError, match="labels" if missing == "labels" else "nope"):
        next(iter(dataset))


# -- values: non-tensor entries, device ---------------------------------------------------------------------------
def test_string_entries_are_unwrapped_to_python_values():
    items = list(TorchRLBufferDataset(id_buffer("list", prompt=True), 8, num_batches=2))
    assert len(items) == 16
    for item in items:
        assert type(item["prompt"]) is str
        item_id(item)  # the prompt belongs to the same item as the tensors


@pytest.mark.parametrize("storage", ["lazy", "memmap"])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_string_entries_of_tensor_storages_come_out_as_python_strings(storage, batch_size):
    # tensor storages keep string entries as UTF-8 bytes (NOTE [strings in tensor storages]); the dataset
    # yields them as the Python strings that were written, each with the tensors of its own item
    rb = id_buffer(storage, prompt=True)
    items = list(TorchRLBufferDataset(rb, batch_size, num_batches=2))
    assert len(items) == 2 * batch_size
    for item in items:
        assert type(item["prompt"]) is str
        assert item["prompt"] == f"p{item_id(item)}"


@pytest.mark.parametrize("storage", ["lazy", "memmap"])
def test_missing_strings_of_tensor_storages_come_out_as_none(storage):
    rb = ReplayBuffer(storage=make_storage(storage, 8), batch_size=4)
    rb.extend(TensorDict(input_ids=torch.arange(4)[:, None], prompt=["a", None, "é", None], batch_size=[4]))
    items = list(TorchRLBufferDataset(rb, 4, keys=["input_ids", "prompt"], num_batches=3))
    expected = {0: "a", 1: None, 2: "é", 3: None}
    assert all(item["prompt"] == expected[int(item["input_ids"])] for item in items)


def test_variable_length_items_are_yielded_each_with_its_own_length():
    rb = ReplayBuffer(storage=ListStorage(16), batch_size=4)
    for i in range(10):
        rb.add(TensorDict(input_ids=torch.full((3 + i % 4,), i), prompt=f"p{i}"))
    items = list(TorchRLBufferDataset(rb, 4, num_batches=3))
    assert len(items) == 12
    for item in items:
        i = int(item["input_ids"][0])
        assert item["input_ids"].shape == torch.Size([3 + i % 4])
        assert item["prompt"] == f"p{i}"


def completion_groups(groups: int, group_size: int = 3, *, first: int = 0, prompt_len: int = 2) -> list[TensorDict]:
    """``groups`` groups of completions: item ``j`` of prompt ``g`` has ``prompt_len + 1 + (g + j) % 4`` tokens,
    all equal to ``10 * g + j``, a ``completion_mask`` after the prompt, and ``reward = j``."""
    items = []
    for g in range(first, first + groups):
        for j in range(group_size):
            n = prompt_len + 1 + (g + j) % 4
            items.append(TensorDict(input_ids=torch.full((n,), 10 * g + j), completion_mask=torch.arange(n) >= prompt_len,
                                    reward=torch.tensor(float(j)), prompt_id=torch.tensor(g)))  # fmt: skip
    return items


def group_buffer(groups: int = 5, group_size: int = 3, *, groups_per_draw: int = 2) -> ReplayBuffer:
    """A packed buffer of completion groups, sampled whole (``groups_per_draw`` groups per ``rb.sample()``)."""
    from torchrl.data import GroupSampler, GroupWriter, PackedSequenceStorage

    storage = PackedSequenceStorage(1000, max_sequences=100, token_keys=("input_ids", "completion_mask"))
    rb = ReplayBuffer(storage=storage, writer=GroupWriter(group_key="prompt_id"), sampler=GroupSampler(),
                      batch_size=groups_per_draw)  # fmt: skip
    rb.extend(completion_groups(groups, group_size))
    return rb


@pytest.mark.parametrize("groups_per_draw, num_batches", [(1, 3), (2, 2), (4, 1)])
def test_a_packed_buffer_yields_whole_groups_one_after_the_other(groups_per_draw, num_batches):
    group_size = 3
    rb = group_buffer(group_size=group_size, groups_per_draw=groups_per_draw)
    items = list(TorchRLBufferDataset(rb, groups_per_draw, num_batches=num_batches))

    assert len(items) == num_batches * groups_per_draw * group_size  # batch_size counts groups
    for start in range(0, len(items), group_size):
        group = items[start : start + group_size]
        g = int(group[0]["prompt_id"])
        for j, item in enumerate(group):  # the whole group, in write order
            assert int(item["prompt_id"]) == g and float(item["reward"]) == j
            n = 3 + (g + j) % 4
            assert torch.equal(item["input_ids"], torch.full((n,), 10 * g + j))  # its own length, no padding
            assert item["completion_mask"].tolist() == [False, False] + [True] * (n - 2)
            assert item["reward"].shape == torch.Size([])


def test_a_dataset_of_whole_groups_has_no_length():
    dataset = TorchRLBufferDataset(group_buffer(), 2, num_batches=3)
    with pytest.raises(TypeError, match="GroupSampler.*max_steps"):
        len(dataset)
    assert len(list(dataset)) == 3 * 2 * 3


def test_a_packed_buffer_keeps_only_the_named_entries():
    items = list(TorchRLBufferDataset(group_buffer(), 2, keys=["input_ids", "prompt_id"]))
    assert len(items) == 6 and all(set(item) == {"input_ids", "prompt_id"} for item in items)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_device_moves_tensors(device):
    dataset = TorchRLBufferDataset(id_buffer(prompt=True), 4, device=device)
    assert dataset.device == torch.device("cpu")
    for item in dataset:
        assert item["input_ids"].device == torch.device("cpu")
        assert item["meta.id"].device == torch.device("cpu")
        assert type(item["prompt"]) is str


def test_a_buffer_of_plain_tensors_is_refused_when_iterated():
    rb = ReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
    rb.extend(torch.arange(16))
    dataset = TorchRLBufferDataset(rb, 4)
    with pytest.raises(TypeError, match="TensorDict"):
        next(iter(dataset))


# -- arguments and repr -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("not_a_buffer", [None, [id_item(0)], ListStorage(4), "rb"])
def test_not_a_replay_buffer_is_a_type_error(not_a_buffer):
    with pytest.raises(TypeError, match="ReplayBuffer"):
        TorchRLBufferDataset(not_a_buffer, 4)


@pytest.mark.parametrize("batch_size", [0, -1, 2.0, "4", None, True])
def test_batch_size_must_be_a_positive_integer(batch_size):
    with pytest.raises(ValueError, match="positive integer") as info:
        TorchRLBufferDataset(id_buffer(), batch_size)
    assert "`batch_size`" in str(info.value)
    assert repr(batch_size) in str(info.value)


@pytest.mark.parametrize("num_batches", [0, -2, 1.5, False])
def test_num_batches_must_be_positive_or_none(num_batches):
    with pytest.raises(ValueError, match="num_batches") as info:
        TorchRLBufferDataset(id_buffer(), 4, num_batches=num_batches)
    assert repr(num_batches) in str(info.value)


def test_repr_shows_the_configuration():
    text = repr(TorchRLBufferDataset(id_buffer(), 4, keys=["input_ids"], num_batches=3, device="cpu"))
    assert text.startswith("TorchRLBufferDataset(")
    for part in ("ReplayBuffer", "batch_size=4", "num_batches=3", "input_ids", "cpu"):
        assert part in text
    assert "num_batches=None" in repr(TorchRLBufferDataset(id_buffer(), 2, num_batches=None))


# -- stateful samplers and DataLoader workers ---------------------------------------------------------------------
class PrivateStateSampler(RandomSampler):
    """A stateful sampler that cannot share its state with DataLoader workers (``can_share_state=False``)."""

    requires_shared_state = True


def test_a_stateful_sampler_that_cannot_share_warns_at_construction():
    rb = id_buffer(sampler=PrivateStateSampler())
    with pytest.warns(FutureWarning, match="v0.17") as record:
        TorchRLBufferDataset(rb, 4)
    assert "PrivateStateSampler" in str(record[0].message)
    assert record[0].filename == __file__  # attributed to the caller, not to the library


def test_a_stateless_sampler_does_not_warn():
    rb = id_buffer(sampler=RandomSampler())
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        items = list(TorchRLBufferDataset(rb, 4))
    assert len(items) == 4


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_shareable_stateful_sampler_is_shared_with_the_workers_without_a_warning():
    rb = id_buffer("lazy", n=16, sampler=SamplerWithoutReplacement())
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        dataset = TorchRLBufferDataset(rb, 4, num_batches=4)
    assert rb.sampler.is_shared
    loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
    batches = list(loader)
    assert len(batches) == 4
    ids = torch.cat([batch["meta.id"] for batch in batches])
    # the workers share one epoch without replacement: it covers every item once
    assert sorted(ids.tolist()) == list(range(16))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("storage", ["list", "lazy"])
@pytest.mark.parametrize("num_batches", [2, 3, 4])
def test_workers_split_the_sampling_calls(storage, num_batches):
    dataset = TorchRLBufferDataset(id_buffer(storage, prompt=True), 4, num_batches=num_batches)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
    batches = list(loader)
    assert len(batches) == num_batches  # num_batches is a total over the workers, not per worker
    for batch in batches:  # torch's default collate stacks the dicts' tensors and lists their strings
        assert batch["input_ids"].shape == torch.Size([4, SEQ])
        assert batch["attention_mask"].shape == torch.Size([4, SEQ])
        assert torch.equal(batch["input_ids"][:, 0], batch["meta.id"])
        # strings of a lazy storage live in its shared memory, read by the workers like its tensors
        assert batch["prompt"] == [f"p{i}" for i in batch["meta.id"].tolist()]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_workers_yield_whole_groups_of_a_packed_buffer_written_after_they_started(start_method):
    group_size = 3
    rb = group_buffer(groups=2, group_size=group_size, groups_per_draw=1)
    rb.storage.share_memory_()
    dataset = TorchRLBufferDataset(rb, 1, keys=["input_ids", "prompt_id", "reward"], num_batches=None)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=start_method,
                        timeout=TIMEOUT)  # fmt: skip
    items = iter(loader)
    stream = [next(items) for _ in range(2 * 2 * group_size)]  # the workers are running
    rb.extend(completion_groups(6, group_size, first=2))  # groups 2 .. 7, written by the main process
    stream += [next(items) for _ in range(2 * 20 * group_size)]
    # The loader takes one item from each worker in turn; each worker's own items are whole groups in write order.
    for worker in (0, 1):
        own = stream[worker::2]
        for start in range(0, len(own), group_size):
            group = own[start : start + group_size]
            g = int(group[0]["prompt_id"])
            assert [int(item["prompt_id"]) for item in group] == [g] * group_size
            assert [float(item["reward"]) for item in group] == [float(j) for j in range(group_size)]
            assert [int(item["input_ids"][0]) for item in group] == [10 * g + j for j in range(group_size)]
    assert {int(item["prompt_id"]) for item in stream} & set(range(2, 8))  # groups written after the start


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_each_worker_reseeds_the_buffer_generator():
    generator = torch.Generator().manual_seed(0)
    rb = id_buffer("lazy", n=64, generator=generator)
    dataset = TorchRLBufferDataset(rb, 16, num_batches=2)
    # DataLoader batches of 16 = one sampling call each; worker 0 yields the first, worker 1 the second
    loader = DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT,
                        generator=torch.Generator().manual_seed(1))
    first, second = (batch["meta.id"].tolist() for batch in loader)
    # forked copies of an un-reseeded generator would draw the same 16 ids (1 chance in 64**16 by accident)
    assert first != second
    # a DataLoader with the same seed reproduces the same stream
    again = DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT,
                       generator=torch.Generator().manual_seed(1))
    assert [batch["meta.id"].tolist() for batch in again] == [first, second]


# -- imports ---------------------------------------------------------------------------------------------------------
def test_importing_the_module_does_not_import_the_hf_stack():
    code = (
        "import sys\n"
        "import torchrl.modules.llm as llm\n"
        "heavy = ('transformers', 'trl', 'datasets')\n"
        "assert not [m for m in heavy if m in sys.modules], [m for m in heavy if m in sys.modules]\n"
        "llm.TorchRLBufferDataset\n"
        "import torchrl.modules.llm.trl_interop\n"
        "assert not [m for m in heavy if m in sys.modules], [m for m in heavy if m in sys.modules]\n"
        "print('clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


def test_the_lazy_name_is_the_module_class():
    import torchrl.modules.llm as llm
    from torchrl.modules.llm import trl_interop

    assert llm.TorchRLBufferDataset is trl_interop.TorchRLBufferDataset
    assert "TorchRLBufferDataset" in llm.__all__
    with pytest.raises(AttributeError, match="NoSuchName"):
        llm.NoSuchName  # noqa: B018


def test_as_hf_dataset_without_datasets_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    dataset = TorchRLBufferDataset(id_buffer(), 4)
    with pytest.raises(ImportError, match="pip install datasets"):
        dataset.as_hf_dataset()


# -- real clients (extras) ------------------------------------------------------------------------------------------
@pytest.fixture
def offline(monkeypatch):
    """No Hugging Face library touches the network during the test."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")


def tiny_lm(n_positions: int = 16):
    """A randomly initialised one-layer GPT-2 over the tokenizer's vocabulary (no download)."""
    transformers = require("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=n_positions,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=1)
    return transformers.GPT2LMHeadModel(config)


def tiny_tokenizer():
    """A word-level tokenizer over ``<pad> <eos> <unk> w0 .. w60`` (ids 0 .. 63), built in memory."""
    tokenizers = require("tokenizers")
    transformers = require("transformers")
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(VOCAB - 3)}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                                unk_token="<unk>")


def token_buffer(n: int = 32, *, ragged: bool = False) -> ReplayBuffer:
    """Random token sequences (lengths 4 .. 8 when ``ragged``, else 8) with their attention masks."""
    gen = torch.Generator().manual_seed(0)
    rb = make_buffer(storage=ListStorage(n), batch_size=4)
    for i in range(n):
        length = 4 + i % 5 if ragged else SEQ
        rb.add(TensorDict(input_ids=torch.randint(3, VOCAB, (length,), generator=gen),
                          attention_mask=torch.ones(length, dtype=torch.long)))
    return rb


def stack_collator(items: list[dict]) -> dict:
    """Stacks equal-length items; the labels are the inputs (the model shifts them)."""
    input_ids = torch.stack([item["input_ids"] for item in items])
    return {"input_ids": input_ids, "attention_mask": torch.stack([item["attention_mask"] for item in items]),
            "labels": input_ids.clone()}


def padding_collator(tokenizer):
    """``DataCollatorWithPadding`` plus labels that ignore the padding."""
    from transformers import DataCollatorWithPadding

    pad = DataCollatorWithPadding(tokenizer)

    def collate(items: list[dict]) -> dict:
        batch = pad([{"input_ids": item["input_ids"].tolist()} for item in items])
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return batch

    return collate


def train_args(cls, tmp_path, **kwargs):
    return cls(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", logging_steps=1,
               disable_tqdm=True, seed=0, **kwargs)


@pytest.mark.extras
def test_as_hf_dataset_is_a_datasets_iterable_dataset():
    datasets = require("datasets")
    rb = id_buffer("list", prompt=True)
    hf = TorchRLBufferDataset(rb, 4, num_batches=2).as_hf_dataset()

    assert isinstance(hf, datasets.IterableDataset)
    first = next(iter(hf))
    assert set(first) == {"input_ids", "attention_mask", "meta.id", "prompt"}
    assert type(first["prompt"]) is str
    items = list(hf)
    assert len(items) == 8
    for item in items:
        assert int(item["input_ids"][0]) == int(item["meta.id"])
        assert item["prompt"] == f"p{int(item['meta.id'])}"


@pytest.mark.extras
def test_as_hf_dataset_of_a_buffer_holding_shared_memory_data():
    require("datasets")
    rb = ReplayBuffer(storage=ListStorage(8), batch_size=2)
    for i in range(4):
        rb.add(id_item(i, prompt=True).share_memory_())
    hf = TorchRLBufferDataset(rb, 2).as_hf_dataset()
    item = next(iter(hf))
    assert item["prompt"] == f"p{int(item['meta.id'])}"


@pytest.mark.extras
@pytest.mark.timeout(120)
@pytest.mark.parametrize("collator", [
    "stack",
    "padding",
])
def test_transformers_trainer_trains_a_tiny_lm_from_the_dataset(collator, tmp_path, offline):
    transformers = require("transformers")
    require("accelerate")
    tokenizer = tiny_tokenizer()
    rb = token_buffer(ragged=collator == "padding")
    dataset = TorchRLBufferDataset(rb, 4, num_batches=None)  # the trainer's max_steps bounds the stream
    args = train_args(transformers.TrainingArguments, tmp_path, max_steps=3, per_device_train_batch_size=4,
                      learning_rate=1e-3)
    trainer = transformers.Trainer(
        model=tiny_lm(), args=args, train_dataset=dataset,
        data_collator=stack_collator if collator == "stack" else padding_collator(tokenizer),
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]

    result = trainer.train()

    assert trainer.state.global_step == 3
    assert math.isfinite(result.training_loss)
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters()))


@pytest.mark.extras
@pytest.mark.timeout(120)
def test_trl_sft_trainer_trains_from_as_hf_dataset(tmp_path, offline):
    require("datasets")
    trl = require("trl")
    # already tokenized items: SFTTrainer sees `input_ids` and skips tokenization (it only adds labels)
    hf = TorchRLBufferDataset(token_buffer(), 4, num_batches=None).as_hf_dataset()
    args = train_args(trl.SFTConfig, tmp_path, max_steps=2, per_device_train_batch_size=4, max_length=16,
                      learning_rate=1e-3)
    trainer = trl.SFTTrainer(model=tiny_lm(), args=args, train_dataset=hf, processing_class=tiny_tokenizer())

    result = trainer.train()

    assert trainer.state.global_step == 2
    assert math.isfinite(result.training_loss)


@pytest.mark.extras
@pytest.mark.timeout(120)
def test_trl_grpo_trainer_trains_on_string_prompts_from_as_hf_dataset(tmp_path, offline):
    require("datasets")
    trl = require("trl")
    rb = ReplayBuffer(storage=ListStorage(16), batch_size=4)
    for i in range(16):
        rb.add(TensorDict(prompt=" ".join(f"w{(i + j) % (VOCAB - 3)}" for j in range(4))))
    hf = TorchRLBufferDataset(rb, 4, num_batches=None).as_hf_dataset()
    seen_prompts = []

    def reward_length(prompts, completions, **kwargs):
        seen_prompts.extend(prompts)
        return [float(len(completion)) for completion in completions]

    args = train_args(trl.GRPOConfig, tmp_path, max_steps=1, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=4)
    trainer = trl.GRPOTrainer(model=tiny_lm(n_positions=32), reward_funcs=reward_length, args=args,
                              train_dataset=hf, processing_class=tiny_tokenizer())

    result = trainer.train()

    assert trainer.state.global_step == 1
    assert math.isfinite(result.training_loss)
    stored = {f"{' '.join(f'w{(i + j) % (VOCAB - 3)}' for j in range(4))}" for i in range(16)}
    assert seen_prompts and set(seen_prompts) <= stored  # the rewards saw the buffer's prompts as strings


@pytest.mark.extras
@pytest.mark.timeout(120)
def test_trl_sft_trainer_trains_on_the_completions_of_a_packed_buffer(tmp_path, offline):
    require("datasets")
    trl = require("trl")
    rb = group_buffer(groups=6, group_size=4)
    hf = TorchRLBufferDataset(rb, 1, keys=["input_ids", "completion_mask"], num_batches=None).as_hf_dataset()
    args = train_args(trl.SFTConfig, tmp_path, max_steps=2, per_device_train_batch_size=4, max_length=16,
                      learning_rate=1e-3, completion_only_loss=True)
    trainer = trl.SFTTrainer(model=tiny_lm(), args=args, train_dataset=hf, processing_class=tiny_tokenizer())

    example = next(iter(trainer.train_dataset))  # the labels TRL built from the stored completion mask
    labels, input_ids = list(example["labels"]), list(example["input_ids"])
    assert labels[:2] == [-100, -100] and labels[2:] == input_ids[2:]  # the loss is on the completion only
    result = trainer.train()

    assert trainer.state.global_step == 2
    assert math.isfinite(result.training_loss)


def rollout_from_buffer(rb: ReplayBuffer, group_size: int):
    """A ``rollout_func`` for TRL's GRPOTrainer that serves whole groups of a packed buffer instead of generating:
    ``len(prompts) // group_size`` groups, their prompt / completion ids and per-token log-probs, and their stored
    rewards (an extra field, forwarded to the reward functions)."""

    def rollout(prompts: list, trainer) -> dict:
        batch = rb.sample(len(prompts) // group_size)
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "stored_reward": batch["reward"].tolist()}
        for ids, mask, log_probs in zip(*(batch.get(k, as_list=True) for k in ("input_ids", "completion_mask",
                                                                                "log_probs"))):  # fmt: skip
            out["prompt_ids"].append(ids[~mask].tolist())
            out["completion_ids"].append(ids[mask].tolist())
            out["logprobs"].append(log_probs[mask].tolist())
        return out

    return rollout


@pytest.mark.extras
@pytest.mark.timeout(120)
def test_trl_grpo_trainer_trains_on_whole_groups_served_by_a_packed_buffer(tmp_path, offline, monkeypatch):
    require("datasets")
    trl = require("trl")
    from torchrl.data import GroupSampler, GroupWriter, PackedSequenceStorage

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL
    group_size, gen = 2, torch.Generator().manual_seed(0)
    storage = PackedSequenceStorage(2000, max_sequences=200, token_keys=("input_ids", "completion_mask", "log_probs"))
    rb = ReplayBuffer(storage=storage, writer=GroupWriter(group_key="prompt_id"), sampler=GroupSampler(),
                      batch_size=2)  # fmt: skip
    items = []
    for prompt_id in range(8):  # completion j of a group: 2 + j tokens after a 3-token prompt, reward j
        prompt = torch.randint(3, VOCAB, (3,), generator=gen)
        for j in range(group_size):
            ids = torch.cat([prompt, torch.randint(3, VOCAB, (2 + j,), generator=gen)])
            mask = torch.arange(len(ids)) >= 3
            items.append(TensorDict(input_ids=ids, completion_mask=mask, log_probs=-torch.rand(len(ids)) * mask,
                                    reward=torch.tensor(float(j)), prompt_id=torch.tensor(prompt_id)))  # fmt: skip
    rb.extend(items)
    seen = []

    def stored_reward(prompts, completions, completion_ids, stored_reward, **kwargs):
        seen.extend(zip(map(len, completion_ids), stored_reward))
        return stored_reward

    # TRL's prompts only set how many groups a step takes (per_device_train_batch_size // num_generations)
    placeholder_prompts = require("datasets").Dataset.from_dict({"prompt": ["w1 w2"] * 8})
    args = train_args(trl.GRPOConfig, tmp_path, max_steps=2, per_device_train_batch_size=4,
                      num_generations=group_size, max_completion_length=4)  # fmt: skip
    trainer = trl.GRPOTrainer(model=tiny_lm(n_positions=32), reward_funcs=stored_reward, args=args,
                              train_dataset=placeholder_prompts, processing_class=tiny_tokenizer(),
                              rollout_func=rollout_from_buffer(rb, group_size))  # fmt: skip

    result = trainer.train()

    assert trainer.state.global_step == 2
    assert math.isfinite(result.training_loss)
    # TRL saw whole groups, in write order: (completion length, stored reward) = (2, 0.0), (3, 1.0) per group
    assert len(seen) == 2 * 4 and seen == [(2, 0.0), (3, 1.0)] * 4
