"""Hugging Face ``datasets`` (and LeRobot-oriented) exchange: :func:`export_hf` and :func:`import_hf`.

- ``export``: a buffer or storage written as a ``datasets`` directory, streamed and switched in atomically;
- ``importer``: a ``datasets.Dataset`` (or a saved directory) read back into a storage, validated first;
- ``columns``: stored entries <-> Arrow columns (dtypes, shapes, nested keys);
- ``layouts``: the column layouts (``"flat"``, ``"trajectories"``, ``"lerobot"``);
- ``reader``: the plan of an import (which column becomes which key), for exports, LeRobot and other datasets;
- ``lerobot`` / ``lerobot_reader`` / ``lerobot_frames``: the LeRobot v3.0 file set written, read, and served
  frame by frame (:class:`~torchrl.data.DatasetStorage` over a LeRobot directory: ``lerobot_frames`` registers
  the directory opener with ``storages/dataset_storage.py``, which imports nothing from here).

``datasets`` is imported on use only.
"""

from torchrl.data.replay_buffers.hf import lerobot_frames  # noqa: F401  (DatasetStorage opens LeRobot directories)
from torchrl.data.replay_buffers.hf.export import export_hf, import_hf

__all__ = ["export_hf", "import_hf"]
