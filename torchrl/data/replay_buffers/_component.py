"""What storages, samplers and writers share: checkpoint methods and pickling without the generator."""

from __future__ import annotations


class Component:
    """Mixin of replay-buffer components: ``dumps``/``loads`` (and their aliases) and a pickled state that
    leaves out the buffer's generator (``_rng``, re-installed by the buffer that owns the component)."""

    def dumps(self, path, **kwargs) -> None:
        """Saves this component to the checkpoint directory ``path``.

        The format is documented in :mod:`torchrl.data.replay_buffers.checkpointers`; keyword arguments
        (``fsync``, ``progress``) go to :func:`~torchrl.data.replay_buffers.checkpointers.dump_component`.
        """
        from torchrl.data.replay_buffers.checkpointers import dump_component

        dump_component(self, path, **kwargs)

    def loads(self, path) -> None:
        """Loads a checkpoint written by :meth:`dumps` into this component (validated first)."""
        from torchrl.data.replay_buffers.checkpointers import load_component

        load_component(self, path)

    dump = dumps
    save = dumps
    load = loads

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_rng", None)
        return state
