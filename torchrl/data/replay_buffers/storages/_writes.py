"""How a write into a tensor storage is encoded and checked against the stored entries before any row changes.

A mixin of :class:`~torchrl.data.TensorStorage` (it uses the storage's ``_storage`` backing, ``_codec``,
``_keys``, ``_extra_shape``, ``_counters`` and ``_check_entries``). Partial writes and new keys follow
:mod:`._keys`; string entries follow :mod:`._nontensor` (a private storage widens an entry too narrow for a
new string; a shared one refuses the write).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

import torchrl.data.replay_buffers.storages._keys as _keys
import torchrl.data.replay_buffers.storages._nontensor as _nt


class WriteEncoding:
    """Encoding and key checks of the writes of :class:`~torchrl.data.TensorStorage`."""

    def _encode_checked(self, data, batch: tuple[int, ...]) -> tuple[TensorDictBase, list | None]:
        """Encodes ``data`` and checks its keys, shapes and values against the backing before anything is
        written: a value the cast to the stored dtype would change (see :func:`._casts.check_cast`) is refused.
        Returns the encoded data and the keys to copy: the stored keys, or ``None`` for a TensorDict write of
        other keys (a subset, or new ones: :meth:`_grow` adds them at write time)."""
        batch_dims = len(batch) + self.ndim - 1
        try:
            td = self._codec.encode(data, batch_dims=batch_dims)
        except _nt.StringTooLong as err:
            td = self._encode_wider(data, batch_dims, err)
        except TypeError as err:
            raise TypeError(f"Cannot write this data into the storage: {err}") from None
        given = td.keys(include_nested=True, leaves_only=True)
        keys = set(given)
        expected = torch.Size([*batch, *self._extra_shape])
        if self._codec.kind == "tensordict" and keys != self._key_set:  # only the entries written (see _keys)
            shared = self._counters.is_shared
            td, updated = _keys.partial_write(self._storage, self._keys, td, expected, shared, self.ndim)
            return self._check_entries(td, batch, expected, updated), None
        if keys != self._key_set:
            missing = sorted(map(str, set(self._keys) - keys))
            extra = sorted(map(str, keys - set(self._keys)))
            raise ValueError(
                f"The data written does not have the structure of the stored data: missing keys {missing}, "
                f"unexpected keys {extra}. Write data with the keys of the first write, or empty() the buffer "
                f"and use a new storage for data of another structure."
            )
        return self._check_entries(td, batch, expected, self._keys), self._keys

    def _grow(self, td: TensorDictBase, lead: int) -> list:
        """The keys a validated write of other keys copies, after adding the new entries it brings."""
        keys, grown = _keys.add_entries(self._storage, self._keys, td, lead, self.ndim)
        if grown:  # a new list: a write checked against the old layout is checked again
            self._keys = list(self._storage.keys(include_nested=True, leaves_only=True))
            self._key_set = set(self._keys)
            self._codec.strings = _nt.string_widths(self._storage)
        return keys

    def _encode_wider(self, data, batch_dims: int, err: _nt.StringTooLong) -> TensorDictBase:
        """Encodes ``data`` after widening the string entries too narrow for it, on a private storage."""
        while True:
            fixed = self.max_string_bytes is not None
            if fixed or err.key not in self._codec.strings or not _keys.can_grow(self._storage, self.is_shared):
                raise _nt.StringTooLong(err.key, err.needed, err.width, fixed) from None
            _nt.widen(self._storage, err.key, err.needed)
            self._codec.strings = _nt.string_widths(self._storage)
            self._keys = list(self._keys)  # a new list: a write checked against the old width is checked again
            try:
                return self._codec.encode(data, batch_dims=batch_dims)
            except _nt.StringTooLong as again:
                err = again
