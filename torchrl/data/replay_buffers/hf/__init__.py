"""Hugging Face ``datasets`` (and LeRobot-oriented) exchange: :func:`export_hf` and :func:`import_hf`.

- ``export``: a buffer or storage written as a ``datasets`` directory, streamed and switched in atomically;
- ``importer``: a ``datasets.Dataset`` (or a saved directory) read back into a storage, validated first;
- ``columns``: stored entries <-> Arrow columns (dtypes, shapes, nested keys);
- ``layouts``: the column layouts (``"flat"``, ``"lerobot"``).

``datasets`` is imported on use only.
"""

from torchrl.data.replay_buffers.hf.export import export_hf, import_hf

__all__ = ["export_hf", "import_hf"]
