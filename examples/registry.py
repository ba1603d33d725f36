"""The list of every example script, with the arguments of its smoke run (walked by test/project/test_examples.py).

Every ``examples/**/*.py`` file is either in :data:`EXAMPLES` (CI runs it with its smoke arguments in a
subprocess and expects exit code 0 within the timeout) or in :data:`EXCLUDED` with the reason it is not run.
A file in neither list fails CI, and so does an entry whose file no longer exists: a new example is
registered in the same change that adds it.

Smoke arguments may contain ``{tmp}``, replaced by a fresh temporary directory (for outputs such as
checkpoints), so that a smoke run never writes into the repository.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """An example script and how CI runs it.

    Attributes:
        path (str): the script, relative to ``examples/`` (with ``/`` separators).
        smoke_args (tuple of str): the arguments of a short run (a few updates on little data).
        requires (tuple of str): modules the script imports beyond the core dependencies; the smoke test is
            marked ``extras`` and skipped when one is missing.
        timeout (float): seconds the smoke run may take, startup included, on a loaded 2-core machine.
    """

    path: str
    smoke_args: tuple[str, ...]
    requires: tuple[str, ...] = ()
    timeout: float = 180.0


@dataclass(frozen=True)
class Excluded:
    """A ``.py`` file under ``examples/`` that is not an example run by CI, and why."""

    path: str
    reason: str


EXAMPLES: tuple[Example, ...] = (
    Example(
        "replay-buffers/dataloader_behavior_cloning.py",
        smoke_args=("--smoke", "--out", "{tmp}/bc_cartpole"),
        requires=("gymnasium", "tqdm"),
    ),
    Example(
        "replay-buffers/resume_training.py",
        smoke_args=("--smoke", "--out", "{tmp}/resume"),
        requires=("torchdata",),
        timeout=480.0,
    ),
    Example("replay-buffers/prioritized_dataloader.py", smoke_args=("--smoke",)),
    Example("replay-buffers/her_goal_reaching.py", smoke_args=("--smoke",)),
    Example("replay-buffers/collectors_and_learner.py", smoke_args=("--smoke",), timeout=300.0),
    Example("llm/grpo_from_buffer.py", smoke_args=("--smoke",), requires=("transformers",)),
)

EXCLUDED: tuple[Excluded, ...] = (
    Excluded("registry.py", "this list of the examples, not an example"),
)
