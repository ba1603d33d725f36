"""How raw batches travel from a :class:`~torchrl.data.RayReplayBuffer` actor to the readers of
``rb.as_dataset()``: as numpy arrays, which Ray's object store hands to the reader without a copy.

Ray serializes a torch tensor by pickling it (its bytes are copied into the pickle, then copied again when it is
read), while a numpy array travels out of band: the actor writes its bytes once into the object store, and
``ray.get`` in the reader returns an array that views the object store's shared memory. :func:`encode` turns a
batch into such arrays (a dense CPU ``TensorDict`` into its structure and its leaves, a tensor into one array;
a dtype numpy lacks, such as ``bfloat16``, travels as same-width integers and is viewed back), and
:func:`decode` rebuilds the batch around the received arrays with ``torch.from_numpy``, copying nothing.
Anything else (lazy stacks, non-tensor data, lists) travels as it is, pickled by Ray.

The decoded tensors view the object store's memory of a reply that only this reader holds: it stays alive
while a tensor of the batch does, and writing to it (an in-place transform) changes no other copy.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["decode", "decode_all", "encode", "encode_all"]

_TENSOR, _TD, _OBJECT = "tensor", "td", "object"
# Integer types of the same width, for the dtypes numpy has no equivalent of (bfloat16, float8 kinds).
_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _encode_tensor(tensor: torch.Tensor):
    """``(array, dtype_to_view_back_or_None)``, or ``None`` when the tensor cannot travel as an array."""
    if type(tensor) is not torch.Tensor or tensor.device.type != "cpu" or tensor.layout != torch.strided:
        return None
    if tensor.requires_grad or tensor.is_conj() or tensor.is_neg():
        return None
    tensor = tensor.contiguous()
    try:
        return tensor.numpy(), None
    except TypeError:  # no numpy dtype: travel as integers of the same width
        view = _VIEWS.get(tensor.element_size())
        if view is None or tensor.is_complex():
            return None
        return tensor.view(view).numpy(), tensor.dtype


def _encode_td(td):
    if type(td) is not TensorDict or (td.device is not None and td.device.type != "cpu"):
        return None
    if any(name is not None for name in td.names):
        return None
    entries = []
    for key, value in td.items():
        encoded = _encode_td(value) if isinstance(value, TensorDict) else _encode_tensor(value)
        if encoded is None:
            return None
        entries.append((key, isinstance(value, TensorDict), encoded))
    return tuple(td.batch_size), td.device, td.is_locked, entries


def encode(batch):
    """A batch as numpy arrays and their structure (see the module docstring); any other object as it is."""
    if isinstance(batch, TensorDict):
        encoded = _encode_td(batch)
        if encoded is not None:
            return (_TD, encoded)
    elif isinstance(batch, torch.Tensor):
        encoded = _encode_tensor(batch)
        if encoded is not None:
            return (_TENSOR, encoded)
    return (_OBJECT, batch)


def _decode_tensor(encoded) -> torch.Tensor:
    array, dtype = encoded
    with warnings.catch_warnings():  # the object store's arrays are flagged read-only; see the module docstring
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array) if isinstance(array, np.ndarray) else torch.as_tensor(array)
    return tensor if dtype is None else tensor.view(dtype)


def _decode_td(encoded) -> TensorDict:
    batch_size, device, locked, entries = encoded
    source = {key: _decode_td(value) if is_td else _decode_tensor(value) for key, is_td, value in entries}
    td = TensorDict(source, batch_size=batch_size, device=device)
    return td.lock_() if locked else td


def decode(encoded):
    """The batch :func:`encode` encoded, around the same arrays (no copy)."""
    kind, payload = encoded
    if kind == _TD:
        return _decode_td(payload)
    if kind == _TENSOR:
        return _decode_tensor(payload)
    return payload


def encode_all(batches: list) -> list:
    return [encode(batch) for batch in batches]


def decode_all(encoded: list) -> list:
    return [decode(item) for item in encoded]
