"""What the ``torch.utils.data`` adapters (``StorageDataset``, ``ReplayBufferDataset``) stand on; no component here.

- ``collate``: :func:`tensordict_collate` and the stacking of sample lists;
- ``resume_state``: a reader's random stream and position, for exact resume (NOTE [ Exact resume ... ]);
- ``ranks``: which (rank, worker) reader the current process is, and its seed;
- ``worker_threads``: the check that refuses forked workers with several torch threads;
- ``worker_transport``: how workers send batches to the main process (NOTE [worker transport]);
- ``pinning``: sampled batches put in pinned host memory, for non-blocking copies to a device.
"""

from torchrl.data.replay_buffers.loading.collate import tensordict_collate

__all__ = ["tensordict_collate"]
