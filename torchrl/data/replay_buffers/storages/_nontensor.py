"""Non-tensor entries of tensor storages: strings kept as UTF-8 bytes in tensor leaves of the backing.

NOTE [strings in tensor storages]. As in TorchRL, a TensorDict written into a tensor storage may carry
non-tensor entries (:class:`~tensordict.NonTensorData` for one value, :class:`~tensordict.NonTensorStack` for
one value per item), e.g. a ``"text"`` or ``"query"`` entry of Python strings; reads return a
``NonTensorStack`` for a batch and a ``NonTensorData`` for one item. Python objects cannot live in a tensor,
and a copy of a Python list in another process would not see later writes, so a string entry ``key`` is kept
as two tensor leaves of the backing TensorDict, under the reserved top-level key :data:`STRINGS_KEY`:

- ``(STRINGS_KEY, *key, "utf8")``: ``uint8`` of shape ``[*grid, width]``, each string's UTF-8 bytes, zero-padded;
- ``(STRINGS_KEY, *key, "length")``: ``int32`` of shape ``[*grid]``, the byte count, ``-1`` for ``None``.

Being tensors, they travel every tensor path unchanged: shared memory and memory-mapped files (DataLoader
workers see strings written after they started), one ``index_select`` per batch read, the row versions of
consistent reads, ``state_dict`` and the pickle-free checkpoint (byte tensors, no pickle, no JSON per item).
A storage that holds no string entry has no such leaf and pays nothing: writes check for non-tensor entries
in one pass over the TensorDict's values (about a microsecond), as they did before to refuse them.

Width. The first write of an entry sets its width: ``max_string_bytes`` when the storage was given one,
else the smallest power of two that holds the longest string, at least :data:`MIN_WIDTH` bytes. A longer
string later widens the entry of a private storage (a copy of that entry); a storage shared with other
processes (``share_memory_()``, memory-mapped, ``shared_init``) or given ``max_string_bytes`` cannot resize
what other processes have mapped, and refuses it with :class:`StringTooLong` (a ``ValueError``) before
anything is written. Only ``str`` and ``None`` values are stored; any other object raises ``TypeError``
naming :class:`~torchrl.data.ListStorage`, which holds any Python object.
"""

from __future__ import annotations

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from torchrl.data.replay_buffers.errors import StringTooLong

__all__ = [
    "MIN_WIDTH",
    "STRINGS_KEY",
    "StringTooLong",
    "decode_strings",
    "encode_strings",
    "from_stored",
    "initial_width",
    "string_widths",
    "to_stored",
    "widen",
]

STRINGS_KEY = "_utf8"
"""The reserved top-level key under which a tensor storage keeps its string entries."""

MIN_WIDTH = 256
"""The smallest width (bytes per string) an entry gets when the storage was given no ``max_string_bytes``."""

_NON_TENSOR = (NonTensorData, NonTensorStack)


def _show(key: tuple):
    return key[0] if len(key) == 1 else key


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def initial_width(longest: int, fixed: int | None) -> int:
    """The width of a new entry whose longest string has ``longest`` bytes (``fixed``: ``max_string_bytes``)."""
    return fixed if fixed is not None else max(MIN_WIDTH, _pow2(longest))


def _nontensor_keys(td: TensorDictBase, prefix: tuple = ()) -> list[tuple]:
    keys = []
    for key, value in td.items():
        if isinstance(value, _NON_TENSOR):
            keys.append((*prefix, key))
        elif isinstance(value, TensorDictBase) and not isinstance(value, torch.Tensor):
            keys.extend(_nontensor_keys(value, (*prefix, key)))
    return keys


def _flat_values(value, key: tuple) -> tuple[list, torch.Size]:
    """The values of a non-tensor entry, flattened over its batch shape, and that shape."""
    shape = value.batch_size
    if isinstance(value, NonTensorData):
        return [value.data] * shape.numel(), shape
    values = value.tolist()
    for _ in range(len(shape) - 1):
        values = [v for row in values for v in row]
    return values, shape


def _encode_values(values: list, key: tuple) -> list:
    out = []
    for i, value in enumerate(values):
        if value is None:
            out.append(None)
        elif isinstance(value, str):
            try:
                out.append(value.encode("utf-8"))
            except UnicodeEncodeError as err:  # a lone surrogate (e.g. a file name decoded with surrogateescape)
                shown = repr(value[max(err.start - 10, 0) : err.end + 10])
                raise ValueError(
                    f"Entry {_show(key)!r} of the data written holds a string that is not valid Unicode at item "
                    f"{i}: {value[err.start:err.end]!r} at character {err.start} (in {shown}) is a lone surrogate, "
                    f"which UTF-8 cannot store. Write valid strings, e.g. s.encode('utf-8', 'surrogateescape')"
                    f".decode('utf-8', 'replace') for names decoded from bytes, or s.encode('utf-8', "
                    f"'surrogatepass') into a tensor for the raw code points. Nothing was written."
                ) from None
        else:
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise TypeError(
                f"Entry {_show(key)!r} of the data written holds a {type(value).__name__} ({shown}) at item {i}: "
                f"tensor storages keep non-tensor entries that are strings (or None). Use ListStorage for other "
                f"Python objects, or convert them (json.dumps for dicts and lists, torch.tensor for numbers). "
                f"Nothing was written."
            )
    return out


def encode_strings(values: list, shape: torch.Size, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(utf8, length)`` tensors for encoded values (``bytes`` or ``None``) laid out over ``shape``."""
    n = len(values)
    buf = bytearray(n * width)
    lengths = []
    for i, value in enumerate(values):
        if value is None:
            lengths.append(-1)
        else:
            buf[i * width : i * width + len(value)] = value
            lengths.append(len(value))
    utf8 = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.zeros(0, dtype=torch.uint8)
    return utf8.view(*shape, width), torch.tensor(lengths, dtype=torch.int32).view(shape)


def decode_strings(utf8: torch.Tensor, length: torch.Tensor):
    """The values stored in ``(utf8, length)``: a ``NonTensorStack`` (or ``NonTensorData`` for one item)."""
    shape, width = length.shape, utf8.shape[-1]
    buf = utf8.reshape(-1).cpu().numpy().tobytes()
    values = [
        None if n < 0 else buf[i * width : i * width + n].decode("utf-8")
        for i, n in enumerate(length.reshape(-1).tolist())
    ]
    if not shape:
        return NonTensorData(values[0])
    for size in reversed(shape[1:]):
        values = [values[i : i + size] for i in range(0, len(values), size)]
    return NonTensorStack.from_list(values)


def to_stored(td: TensorDictBase, widths: dict, fixed: int | None) -> TensorDictBase:
    """``td`` with its non-tensor entries replaced by their UTF-8 leaves (``td`` itself when it has none).

    ``widths`` maps the stored string entries to their width; a new entry gets :func:`initial_width`.
    Raises :class:`StringTooLong` for a string wider than its stored entry, ``TypeError`` for a value that is
    not a str (or None), ``ValueError`` when ``td`` uses :data:`STRINGS_KEY` itself.
    """
    if STRINGS_KEY in td.keys():
        raise ValueError(
            f"The key {STRINGS_KEY!r} is reserved by tensor storages for their string entries; rename the entry "
            f"{STRINGS_KEY!r} of the data written."
        )
    keys = _nontensor_keys(td)
    if not keys:
        return td
    out = td.exclude(*keys)
    for key in keys:
        values, shape = _flat_values(td.get(key), key)
        encoded = _encode_values(values, key)
        longest = max((len(e) for e in encoded if e is not None), default=0)
        width = widths.get(key)
        if width is None:
            width = max(initial_width(longest, fixed), longest if fixed is None else 0)
            if longest > width:
                raise StringTooLong(key, longest, width, True)
        elif longest > width:
            raise StringTooLong(key, longest, width, fixed is not None)
        utf8, length = encode_strings(encoded, shape, width)
        out.set((STRINGS_KEY, *key, "utf8"), utf8.to(td.device) if td.device is not None else utf8)
        out.set((STRINGS_KEY, *key, "length"), length.to(td.device) if td.device is not None else length)
    return out


def from_stored(td: TensorDictBase, keys: list[tuple]) -> TensorDictBase:
    """``td`` (read from the backing) with its UTF-8 leaves turned back into non-tensor entries."""
    hidden = td.get(STRINGS_KEY, None)
    if hidden is None:
        return td
    out = td.exclude(STRINGS_KEY)
    for key in keys:
        out.set(key, decode_strings(hidden.get((*key, "utf8")), hidden.get((*key, "length"))))
    return out


def string_widths(backing: TensorDictBase) -> dict[tuple, int]:
    """The string entries a backing holds, with their widths (empty for a backing without strings)."""
    hidden = backing.get(STRINGS_KEY, None)
    if hidden is None:
        return {}
    widths = {}
    for key in hidden.keys(include_nested=True, leaves_only=True):
        key = key if isinstance(key, tuple) else (key,)
        if key[-1] == "utf8":
            widths[key[:-1]] = hidden.get(key).shape[-1]
    return widths


def widen(backing: TensorDictBase, key: tuple, needed: int) -> None:
    """Replaces the UTF-8 leaf of entry ``key`` of a private ``backing`` by one wide enough for ``needed`` bytes."""
    leaf = (STRINGS_KEY, *key, "utf8")
    old = backing.get(leaf)
    wider = torch.zeros((*old.shape[:-1], _pow2(needed)), dtype=old.dtype, device=old.device)
    wider[..., : old.shape[-1]] = old
    backing.set(leaf, wider)

