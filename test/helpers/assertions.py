"""Assertions shared by the tests: equal states, the checkpoint contract of any component, chi-square checks.

:func:`assert_checkpoint_round_trip` is the one save/load check of a component's state (storage, sampler,
writer, transform, buffer or ensemble): use it instead of writing ``dumps``/``loads``/compare by hand.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch
from tensordict import TensorDictBase


def assert_same_state(a, b, where: str = "state") -> None:
    """``a`` and ``b`` hold equal values: tensors (any subclass), TensorDicts, arrays, containers, scalars."""
    import numpy as np
    from tensordict import LazyStackedTensorDict, is_non_tensor, is_tensorclass

    if is_non_tensor(a) or is_non_tensor(b):  # NonTensorData / NonTensorStack: their Python values
        assert is_non_tensor(a) and is_non_tensor(b), f"{where}: {type(a)} vs {type(b)}"
        assert a.batch_size == b.batch_size, f"{where}: batch sizes {a.batch_size} vs {b.batch_size}"
        assert_same_state(a.tolist(), b.tolist(), where)
    elif isinstance(a, LazyStackedTensorDict) and isinstance(b, LazyStackedTensorDict):  # ragged: member by member
        assert a.stack_dim == b.stack_dim and len(a.tensordicts) == len(b.tensordicts), f"{where}: {a} vs {b}"
        for i, (x, y) in enumerate(zip(a.tensordicts, b.tensordicts)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, TensorDictBase) or isinstance(b, TensorDictBase):
        assert isinstance(a, TensorDictBase) and isinstance(b, TensorDictBase), f"{where}: {type(a)} vs {type(b)}"
        assert a.batch_size == b.batch_size, f"{where}: batch sizes {a.batch_size} vs {b.batch_size}"
        assert set(a.keys(True, True)) == set(b.keys(True, True)), f"{where}: keys differ"
        for key in a.keys(True, True):
            assert_same_state(a.get(key), b.get(key), f"{where}[{key!r}]")
    elif isinstance(a, (torch.Tensor, np.ndarray)):
        a, b = torch.as_tensor(a).as_subclass(torch.Tensor), torch.as_tensor(b).as_subclass(torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        assert torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                      and torch.equal(a.nan_to_num(), b.nan_to_num())), f"{where}: values differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs {b!r:.200}"
        for key in a:
            assert_same_state(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r:.200} vs {b!r:.200}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif is_tensorclass(a):
        assert_same_state(a._tensordict, b._tensordict, where)
    elif isinstance(a, float) and isinstance(b, float) and a != a:  # NaN: the same value when both are NaN
        assert b != b, f"{where}: {a!r} vs {b!r}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def observable_state(component):
    """What a round trip must preserve: the state dict, where a storage's backing (whose unwritten rows hold
    arbitrary bytes) is replaced by its length and written content."""
    if hasattr(component, "buffers") and hasattr(component, "sampler"):  # a buffer ensemble
        state = component.state_dict()
        state["_buffers"] = [observable_state(rb) for rb in component.buffers]
        return state
    if hasattr(component, "sampler") and hasattr(component, "storage"):  # a buffer
        try:
            state = component.state_dict()
        except TypeError:  # a pytree storage has no state_dict (TorchRL's rule): the other components' states
            state = {"_sampler": component.sampler.state_dict(), "_writer": component.writer.state_dict()}
        return {**state, "_storage": observable_state(component.storage)}
    if hasattr(component, "storages"):  # a storage ensemble
        return {"members": [observable_state(s) for s in component.storages],
                "transforms": [t.state_dict() for t in component.transforms]}
    if hasattr(component, "get") and hasattr(component, "max_size"):  # a storage
        try:
            state = {k: v for k, v in component.state_dict().items() if k != "_storage"}
        except TypeError:  # a pytree storage has no state_dict (TorchRL's rule)
            state = {"max_size": component.max_size, "last_row": component.last_written_row}
        return {**state, "len": len(component), "content": component.get(slice(None)) if len(component) else None}
    return component.state_dict()


def _saved_document(path) -> dict:
    """The component description of a checkpoint, with each list of leaf descriptions (``{"key": ...}``) in key
    order: a loaded item may list its entries in another order (nested ones first), which is the same content."""
    import json

    def canonical(node):
        if isinstance(node, dict):
            return {k: canonical(v) for k, v in node.items()}
        if isinstance(node, list):
            items = [canonical(v) for v in node]
            if items and all(isinstance(v, dict) and "key" in v for v in items):
                items.sort(key=lambda v: json.dumps(v["key"]))
            return items
        return node

    with open(os.path.join(path, "metadata.json")) as f:
        return canonical(json.load(f)["metadata"]["component"])


def assert_checkpoint_round_trip(component, make_fresh, tmp_path, *, draws: int = 2):
    """The checkpoint contract of ``component`` (storage, sampler, writer, transform or buffer).

    ``make_fresh()`` builds a component of the same configuration. Checked, at three points (the first load, a
    second load into the same object, a load of the re-saved checkpoint):

    - its part: every tensor is named under the part's prefix and the document is JSON, whatever the prefix;
    - ``dumps`` then ``loads`` into a fresh object gives the same state dict (and content, for a storage);
    - loading is idempotent, and re-saving the loaded object gives the same document (a fixed point);
    - a checkpoint of another class is refused with a ``ValueError`` and leaves the target unchanged;
    - for a buffer, the next ``draws`` seeded samples of the original and of the loaded copy are equal.

    Returns a component loaded from the first checkpoint that no draw touched, for the checks a test adds (the
    draws advance ``component``: pass ``draws=0`` to compare it further with the returned copy).
    """
    import json

    import pytest

    from torchrl.data.replay_buffers._checkpoint.parts import PartContext, check_part, dump_part

    for prefix in ("", "outer/"):
        tensors, wrapped = dump_part(component, PartContext(str(tmp_path / "unused"), prefix))
        assert all(name.startswith(prefix) for name in tensors), sorted(tensors)
        assert json.loads(json.dumps(wrapped)) == wrapped
        check_part(make_fresh(), wrapped, tensors, PartContext(str(tmp_path / "unused"), prefix))

    from torchrl.data.replay_buffers.checkpointers import dump_component, load_component

    def dumps(obj, path):  # transforms (nn.Modules) have no dumps/loads of their own
        obj.dumps(path) if hasattr(obj, "dumps") else dump_component(obj, path)

    def loads(obj, path):
        obj.loads(path) if hasattr(obj, "loads") else load_component(obj, path)

    first, second = tmp_path / "first", tmp_path / "second"
    dumps(component, first)
    fresh = make_fresh()
    loads(fresh, first)
    expected = observable_state(component)
    assert_same_state(observable_state(fresh), expected, "after loads")
    loads(fresh, first)
    assert_same_state(observable_state(fresh), expected, "after a second loads")
    dumps(fresh, second)
    assert _saved_document(second) == _saved_document(first)
    again = make_fresh()
    loads(again, second)
    assert_same_state(observable_state(again), expected, "after loads of the re-saved checkpoint")

    class Other:
        def state_dict(self):
            return {}

    dump_component(Other(), tmp_path / "other")
    target = make_fresh()
    loads(target, first)
    with pytest.raises(ValueError, match="class"):
        loads(target, tmp_path / "other")
    assert_same_state(observable_state(target), expected, "after a refused loads")

    if hasattr(component, "sample") and getattr(component, "batch_size", None):
        for i in range(draws):  # seeded twice: buffers without a generator draw from torch's global one (numpy's
            torch.manual_seed(1000 + i)  # for a PrioritizedSampler, as TorchRL's)
            np.random.seed(1000 + i)
            drawn = fresh.sample()
            torch.manual_seed(1000 + i)
            np.random.seed(1000 + i)
            assert_same_state(drawn, component.sample(), f"draw {i}")
    return target


# -- trajectories: slices checked against a brute-force walk of the storage ------------------------------------
def reference_runs(storage, key: str, is_done: bool) -> dict:
    """Brute-force trajectories: maps (row, col) -> (run id, position in run), walking rows in time order."""
    n = storage.rows_written()
    last = storage._counters["last_row"]
    order = list(range(last + 1, n)) + list(range(last + 1)) if storage._is_full else list(range(n))
    data = storage.get(slice(None))
    values = data.get(key)
    n_cols = 1 if storage.ndim == 1 else data.shape[1]
    values = values.reshape(n, n_cols, -1)[..., 0]
    where = {}
    run = 0
    for col in range(n_cols):
        run += 1
        pos = 0
        for i, row in enumerate(order):
            if i:
                prev = order[i - 1]
                split = bool(values[prev, col]) if is_done else bool(values[prev, col] != values[row, col])
                if split:
                    run, pos = run + 1, 0
            where[(row, col)] = (run, pos)
            pos += 1
    return where


def check_slices(index, where: dict, slice_len: int) -> None:
    """Every slice lies in one reference trajectory, in consecutive time order."""
    rows = index[0].tolist()
    cols = index[1].tolist() if len(index) > 1 else [0] * len(rows)
    assert len(rows) % slice_len == 0
    for s in range(0, len(rows), slice_len):
        cells = [where[(r, c)] for r, c in zip(rows[s : s + slice_len], cols[s : s + slice_len])]
        assert len({run for run, _ in cells}) == 1, cells
        positions = [pos for _, pos in cells]
        assert positions == list(range(positions[0], positions[0] + slice_len)), positions


# -- statistics ----------------------------------------------------------------------------------------------
#: Chi-square critical values at p = 1e-3 (``chi2.ppf(0.999, df)``; scipy is not a dependency), by degrees of
#: freedom: a correct sampler fails 1 seed in 1000, and the tests fix their seeds, so they are deterministic.
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 11: 31.264, 15: 37.697, 19: 43.820, 23: 49.728}


def chi2(counts, p) -> float:
    """Pearson's statistic of observed ``counts`` against probabilities ``p`` (tensors or arrays)."""
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def chi2_crit(df: int, z: float = 3.29) -> float:
    """The chi-square quantile at p ~ 0.9995 (Wilson-Hilferty; scipy is not a dependency)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def start_spawned(obj) -> None:
    """Start a spawned process that receives ``obj``, so that a refusal to be sent to one raises here; a process
    that did start (no refusal) is joined, never left behind."""
    import multiprocessing

    proc = multiprocessing.get_context("spawn").Process(target=len, args=(obj,), daemon=True)
    try:
        proc.start()
    finally:
        if proc.pid is not None:
            proc.join(60)
