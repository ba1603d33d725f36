"""What the ``torch.utils.data`` adapters (``StorageDataset``, ``ReplayBufferDataset``) stand on; no component here.

- ``collate``: :func:`tensordict_collate` and the stacking of sample lists;
- ``resume_state``: a reader's random stream and position, for exact resume (NOTE [ Exact resume ... ]);
- ``ranks``: which (rank, worker) reader the current process is, and its seed;
- ``worker_threads``: the check that refuses forked workers with several torch threads;
- ``worker_transport``: how workers send batches to the main process (NOTE [worker transport]);
- ``pinning``: sampled batches put in pinned host memory, for non-blocking copies to a device;
- ``sequence_items``, ``sequence_layouts``: batches of variable-length sequences, read (NOTE [sequence items]) and
  laid out padded or packed for a model (:func:`pad_sequences`, :func:`pack_sequences`).
"""

from torchrl.data.replay_buffers.loading.collate import tensordict_collate
from torchrl.data.replay_buffers.loading.sequence_layouts import pack_sequences, pad_sequences

__all__ = ["tensordict_collate", "pad_sequences", "pack_sequences"]
