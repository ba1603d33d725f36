"""Optional extras in tests: a test that needs one skips, naming the extra, where it is not installed.

The README's test command installs every extra the tests use (``.[tests]`` pulls them in), so they all run there
and in CI. On a machine with fewer packages, ``require("h5py")`` skips the test with the reason
``needs the optional extra 'h5' (pip install -e '.[h5]'): h5py is not installed`` instead of failing it.

``TORCHRL_TEST_WITHOUT_EXTRAS=h5,hf`` (read by ``test/conftest.py``) hides the packages of those extras from
imports, so the skips can be checked on a machine that has everything (test/project/test_extras_skip.py).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from types import ModuleType

import pytest

#: The top-level packages each extra of pyproject.toml installs (the ones tests import).
EXTRA_PACKAGES: dict[str, tuple[str, ...]] = {
    "h5": ("h5py",),
    "hf": ("datasets", "transformers", "accelerate", "tokenizers"),
    "trl": ("trl",),
    "ray": ("ray",),
    "torchdata": ("torchdata",),
    "zstd": ("zstandard",),
    "gym": ("gymnasium", "pygame", "PIL"),
    "progress": ("tqdm",),
    "docs": ("sphinx",),
    "minari": ("minari",),
    "numba": ("numba",),
    "video": ("av",),
    "redis": ("redis",),
}


def extra_of(module: str) -> str:
    """The extra that installs ``module`` (a dotted name: its top-level package decides)."""
    top = module.split(".")[0]
    for extra, packages in EXTRA_PACKAGES.items():
        if top in packages:
            return extra
    raise KeyError(
        f"{module!r} belongs to no optional extra; add its package to EXTRA_PACKAGES in {__name__}"
    )


def require(module: str) -> ModuleType:
    """Imports ``module``, or skips the calling test naming the optional extra that installs it."""
    extra = extra_of(module)
    try:
        return importlib.import_module(module)
    except ImportError as err:
        pytest.skip(
            f"needs the optional extra {extra!r} (pip install -e '.[{extra}]'): {module} is not installed ({err})",
            allow_module_level=True,
        )


def needs(module: str):
    """A ``pytest.mark.skipif`` for a parameter or a test that needs ``module`` (named with its extra)."""
    extra = extra_of(module)
    try:
        importlib.import_module(module)
        missing = False
    except ImportError:
        missing = True
    return pytest.mark.skipif(
        missing,
        reason=f"needs the optional extra {extra!r} (pip install -e '.[{extra}]'): {module} is not installed",
    )


class HiddenPackages:
    """A ``sys.meta_path`` finder that makes the packages of some extras unimportable (as if not installed)."""

    def __init__(self, extras: list[str]):
        unknown = sorted(set(extras) - set(EXTRA_PACKAGES))
        if unknown:
            raise ValueError(
                f"TORCHRL_TEST_WITHOUT_EXTRAS names unknown extras {unknown}; known: {sorted(EXTRA_PACKAGES)}"
            )
        self.packages = {p for e in extras for p in EXTRA_PACKAGES[e]}

    def find_spec(self, name, path=None, target=None):
        # a spec whose loader refuses: `import x` raises ModuleNotFoundError, while importlib.util.find_spec
        # (which torch probes optional packages with, expecting no exception) still answers
        if name.split(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        raise ModuleNotFoundError(
            f"No module named {spec.name!r} (hidden by TORCHRL_TEST_WITHOUT_EXTRAS)", name=spec.name
        )

    def exec_module(self, module):  # pragma: no cover - create_module always raises
        raise ModuleNotFoundError(module.__name__)

    def install(self) -> None:
        for name in list(sys.modules):
            if name.split(".")[0] in self.packages:
                del sys.modules[name]
        sys.meta_path.insert(0, self)
