"""The dataset registry: register_dataset / load_dataset, with TorchRL's errors and built-in sources."""

from __future__ import annotations

import pytest

import torchrl.data
from torchrl.data.datasets import load_dataset, register_dataset
from torchrl.data.datasets import utils as dataset_utils


def _factory(name, **kwargs):
    return ("built", name, kwargs)


def test_import_paths():
    assert dataset_utils.load_dataset is load_dataset and dataset_utils.register_dataset is register_dataset
    assert not hasattr(torchrl.data, "load_dataset")  # as in TorchRL: not exported by torchrl.data
    assert {"load_dataset", "register_dataset", "MinariExperienceReplay", "D4RLExperienceReplay",
            "BaseDatasetExperienceReplay"} <= set(torchrl.data.datasets.__all__)  # fmt: skip


def test_register_and_load_with_name_positional_and_kwargs():
    register_dataset("  RegToy ", _factory, replace=True)  # stripped, lower-cased
    assert load_dataset("regtoy:a/b:c", batch_size=3) == ("built", "a/b:c", {"batch_size": 3})
    assert load_dataset("REGTOY:x") == ("built", "x", {})


def test_lazy_string_factory_is_imported_on_first_use():
    register_dataset("reglazy", "os.path:basename", replace=True)
    assert load_dataset("reglazy:a/b") == "b"
    register_dataset(
        "reglazymissing", "no_such_module_for_this_test:Factory", replace=True
    )  # not imported yet
    with pytest.raises(ModuleNotFoundError, match="no_such_module_for_this_test"):
        load_dataset("reglazymissing:x")


def test_duplicate_prefix():
    register_dataset("regdup", _factory, replace=True)
    with pytest.raises(KeyError, match="already registered. Pass replace=True"):
        register_dataset("regdup", _factory)
    for builtin in ("minari", "d4rl", "lerobot", "openx"):
        with pytest.raises(KeyError, match="already registered"):
            register_dataset(builtin, _factory)


@pytest.mark.parametrize("prefix", ["", "   ", "a:b"])
def test_bad_prefix(prefix):
    with pytest.raises(ValueError, match="`prefix`"):
        register_dataset(prefix, _factory)


def test_prefix_must_be_a_string():
    with pytest.raises(TypeError, match="`prefix`"):
        register_dataset(3, _factory)


@pytest.mark.parametrize("factory", [3, None, object()])
def test_factory_must_be_callable_or_string(factory):
    with pytest.raises(TypeError, match="`dataset`"):
        register_dataset("regbad", factory)


@pytest.mark.parametrize("factory", ["no_colon", ":attr", "module:", "a:b:c"])
def test_malformed_lazy_string(factory):
    with pytest.raises(ValueError, match="module:attribute"):
        register_dataset("regbad", factory)


def test_load_dataset_errors():
    with pytest.raises(ValueError, match="dataset_id must be prefixed with a source identifier"):
        load_dataset("cartpole")
    with pytest.raises(ValueError, match="Unknown dataset source") as err:
        load_dataset("nosuchsource:x")
    assert "minari" in str(err.value) and "register_dataset" in str(err.value)
    with pytest.raises(TypeError, match="`dataset_id`"):
        load_dataset(3)


@pytest.mark.parametrize("prefix", ["atari", "atari_dqn", "gen_dgrl", "openml", "openx", "roboset", "vd4rl"])
def test_torchrl_sources_not_provided_here(prefix):
    with pytest.raises(ImportError, match="not provided by this package") as err:
        load_dataset(f"{prefix}:something", batch_size=2)
    assert "ExperienceReplay" in str(err.value)


def test_replace_true_replaces():
    register_dataset("regrepl", _factory, replace=True)
    register_dataset("regrepl", lambda name, **kw: name.upper(), replace=True)
    assert load_dataset("regrepl:abc") == "ABC"


@pytest.mark.parametrize(
    "name", ["OpenXExperienceReplay", "AtariDQNExperienceReplay", "VD4RLExperienceReplay"]
)
def test_torchrl_classes_not_provided_raise_import_error(name):
    with pytest.raises(ImportError, match="does not provide"):
        exec(f"from torchrl.data.datasets import {name}", {})
    assert name not in torchrl.data.datasets.__all__


def test_unknown_attribute_is_an_attribute_error():
    assert not hasattr(torchrl.data.datasets, "NoSuchDatasetClass")
