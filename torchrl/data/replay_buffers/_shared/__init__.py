"""Shared-memory primitives that storages, samplers and writers build on; they know no component.

- ``counters``: :class:`SharedCounters` (length, cursor, write counts) and ``is_spawning``;
- ``lock``: the cross-process write lock (``ProcessLock``, ``NULL_LOCK``): NOTE [write lock and versions];
- ``row_versions``: per-row write versions, the seqlock readers check;
- ``arrays``: ``SharedArray`` and ``StateGuard``, a sampler's state in shared memory;
- ``cleanup``: ownership of scratch files and directories, removed at exit, on SIGTERM and by
  ``cleanup_stale_scratch_dirs``.
"""
