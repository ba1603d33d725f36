"""What the tests share (``pythonpath = ["test"]`` in pyproject.toml makes it importable as ``helpers``).

- ``factories``: data and component factories (items that carry their id in every leaf, storages and samplers by
  name, tagged rows of several writers) and the one buffer factory, ``make_buffer`` (keywords only);
- ``assertions``: equal states, the checkpoint round trip of any component, chi-square checks;
- ``targets``: child-process targets of the spawn / fork / DataLoader-worker tests (importable by module name);
- ``resume``, ``ranks``, ``rpc``: the training-loop runs of the resume tests, the gloo ranks of the distributed
  tests and the rpc processes of the remote-buffer test.

Import the module you need, one name at a time (``from helpers.factories import make_buffer``); this package
re-exports nothing.
"""
