"""Trajectories: the data model of episodes in a ring storage, shared by everything that reads episodes.

- Episodes in a ring storage: a storage of ``n`` filled rows holds the newest step at its last written row; once
  full, the next row holds the oldest step, so time runs oldest first from there (``layout``: the one ring order,
  list storages included). An ``ndim=2`` storage (``[time, envs]``) holds one stream per env column.
- Trajectory keys: the stored entries that say where episodes are, probed in one order (``keys``).
- Episode ends: a step flagged done, a change of trajectory id, the newest step of each stream (the write seam),
  the last row of each env column (``ends``, the one finder; ``columns`` reads the flags or ids it scans).
- Splitting a batch of transitions by its own signal (ids, else flags), for trajectory queries (``split``).
- The live index: the ends kept up to date on each append (``live_index``) and caught up with the storage's shared
  append counters (``sync``).
- The dense index: the trajectories of a storage on an accelerator as fixed-shape tensors, found after a write
  without reading a number back (``dense_index``).
- The interleaved index: trajectories whose steps are interleaved with others' (several envs or collectors writing
  step by step), found by trajectory id and step counter as runs of consecutive steps (``interleaved``).

Slice samplers, the ``Sequence`` and ``FrameStack`` sample units, HER, trajectory queries and the HF layouts stand
on it; it imports storages and the bottom packages only.
"""
