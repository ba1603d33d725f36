"""What :mod:`torchrl.data.replay_buffers.ray_buffer` stands on; Ray itself is imported on use only.

- ``host``: the actor that hosts a buffer and runs its methods;
- ``runtime``: starting Ray and the actor, with timeouts;
- ``wire``: what travels between clients and the actor (raw batches, transforms);
- ``waiting``: ``sample(wait=True)`` and limited writes wait in the client, as attempts that never wait in the actor;
- ``dataset``: :class:`RayReplayBufferDataset`, DataLoader workers reading through clients of the actor
  (public through ``ray_buffer`` and ``torchrl.data``).
- ``sharded_buffer``: :class:`ShardedRayReplayBuffer` and its clients, a buffer split over several actors (public
  through ``ray_buffer`` and ``torchrl.data``), standing on ``shards`` (routing, the two-level draw, global
  indices), ``shard_host`` (a shard's actor) and ``shard_checkpoint`` (the manifest protocol).
"""
