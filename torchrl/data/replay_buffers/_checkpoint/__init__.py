"""The on-disk checkpoint format engine, apart from the components it saves.

- ``io``: tensor files (memory-mapped reads and writes, checksums) and the metadata document;
- ``fs``: the crash-safe directory switch (``replace_dir``) and leftover recovery;
- ``validate``: checks of what a checkpoint on disk claims, before anything is read or changed;
- ``args``: checks of the ``dumps``/``loads`` arguments;
- ``parts``: the checkpoint-part protocol each component implements in its own class file;
- ``format``: ``write_checkpoint``/``read_checkpoint`` and ``dump_component``/``load_component``
  (public through :mod:`torchrl.data.replay_buffers.checkpointers`);
- ``generator_state``: the codec of a ``torch.Generator`` state.

Nothing here knows a storage, sampler, writer or buffer class.
"""
