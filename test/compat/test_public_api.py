"""Every module path, public name, parameter and default of TorchRL's replay-buffer API, checked against ours.

``torchrl_public_api.json`` (beside this file) holds facts read from TorchRL's source at the revision it names:
per module, its ``__all__`` and each public name (``re-export``, ``class`` with ``init``/``methods``, or
``function`` with ``params``), each parameter with its kind (``positional``, ``keyword``, ``*args``,
``**kwargs``) and default as written in TorchRL's source. No code: names, kinds and defaults only.

The rules the walk applies:

* a module path imports; a name resolves (``getattr``); a name TorchRL lists in ``__all__`` is in ours;
* a TorchRL positional parameter is accepted at the same position under the same name; a keyword parameter is
  accepted by keyword; a default TorchRL gives is ours too (compared by value: ``torch.float`` is
  ``torch.float32``, ``float('nan')`` is any NaN);
* a TorchRL method that forwards ``*args``/``**kwargs`` (the Ray buffer's methods, ``dump``/``save``/``load``)
  is matched by var-args or by a signature equal to the method it forwards to (ours are explicit: the signature
  a user reads is the one that runs);
* a property is a property (or a plain attribute of the class).

What this package declares out of scope is listed once, in :data:`OUT_OF_SCOPE`, keyed by the row of
``docs/source/differences.rst`` ("Not implemented") that says so; a test checks each key is on that page. Anything
else missing fails.
"""

from __future__ import annotations
import __future__

import dataclasses
import importlib
import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from torchrl.data._torchrl_names import NOT_PROVIDED, NotProvidedError
from torchrl.data.datasets.utils import NOT_PROVIDED_SOURCES

FACTS = json.loads((Path(__file__).with_name("torchrl_public_api.json")).read_text())
DIFFERENCES = Path(__file__).parents[2] / "docs" / "source" / "differences.rst"

_SOURCES = ("atari_dqn", "d4rl_infos", "gen_dgrl", "openml", "openx", "roboset", "vd4rl")

#: What ``differences.rst`` declares out of scope, keyed by the words of its row; each value decides whether a
#: (module, name) pair is covered (``name`` is ``None`` for a whole module path).
OUT_OF_SCOPE = {
    # Specs, LLM data, MCTS and robot-dataset helpers: they raise NotProvidedError naming their TorchRL area.
    "The non-replay-buffer parts of ``torchrl.data``": (
        lambda module, name: name in NOT_PROVIDED
    ),
    # Dataset sources other than Minari, D4RL and LeRobot (d4rl_infos is D4RL's table of remote URLs).
    "The dataset sources of ``torchrl.data.datasets`` other than Minari, D4RL and LeRobot": (
        lambda module, name: module.rsplit(".", 1)[-1] in _SOURCES
        or (module == "torchrl.data.datasets" and name in NOT_PROVIDED_SOURCES.values())
    ),
}

#: What ``differences.rst`` ("Different on purpose") says differs in a signature, keyed by the words of its
#: paragraph; each value is the set of ``"module.Class.method: problem"`` lines it accounts for.
DIFFERENT_ON_PURPOSE = {
    # One name for the read index across the tensor storages; an override only to rename it would put one more
    # call (and file) on every sample.
    "``LazyTensorStorage.get``'s argument is named ``index``": {
        "torchrl.data.replay_buffers.storages.tensor.LazyTensorStorage.get: no parameter 'indices'",
    },
}

# TorchRL methods that forward *args/**kwargs, and the method of ours they forward to.
_FORWARDS = {"dump": "dumps", "save": "dumps", "load": "loads"}


def _out_of_scope(module: str, name: str | None) -> bool:
    return any(rule(module, name) for rule in OUT_OF_SCOPE.values())


def _modules():
    return sorted(FACTS["modules"])


def _names():
    for module in _modules():
        for name, fact in sorted(FACTS["modules"][module].get("names", {}).items()):
            yield module, name, fact


def _resolve(module: str, name: str):
    """Our object for ``module.name``, or ``None`` where it is declared out of scope (raises otherwise)."""
    if _out_of_scope(module, None):
        return None
    mod = importlib.import_module(module)
    try:
        return getattr(mod, name)
    except NotProvidedError:
        if _out_of_scope(module, name):
            return None
        raise


def _default_equal(ours, fact: str) -> bool:
    if repr(ours) == fact:
        return True
    import torchrl.data as data

    try:
        value = eval(fact, {"torch": torch, "DEFAULT_DONE_KEYS": data.DEFAULT_DONE_KEYS, "ReplayBuffer": data.ReplayBuffer})
    except Exception:  # a default TorchRL computes from its own globals: compared by text only
        return False
    if isinstance(value, float) and math.isnan(value):
        return isinstance(ours, float) and math.isnan(ours)
    return value == ours or value is ours


def _signature(obj, *, bound: bool):
    sig = inspect.signature(obj)
    params = list(sig.parameters.values())
    if bound and params and params[0].name in ("self", "cls"):
        params = params[1:]
    return params


def _param_problems(where: str, params, facts, *, forwarded=None) -> list[str]:
    problems = []
    by_name = {p.name: p for p in params}
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    fact_positional = [f["name"] for f in facts if f["kind"] == "positional"]
    for fact in facts:
        name, kind = fact["name"], fact["kind"]
        if kind in ("*args", "**kwargs"):
            has = var_pos if kind == "*args" else var_kw
            if not has and (forwarded is None or forwarded != params):
                problems.append(f"{where}: TorchRL forwards {kind}; ours neither takes it nor has the signature "
                                f"of the method it forwards to")
            continue
        ours = by_name.get(name)
        if ours is None or ours.kind is ours.POSITIONAL_ONLY:
            problems.append(f"{where}: no parameter {name!r}")
            continue
        if kind == "positional":
            at = fact_positional.index(name)
            if at >= len(positional) or positional[at] != name:
                problems.append(f"{where}: {name!r} is TorchRL's positional parameter {at}; ours: {positional}")
        if "default" in fact:
            if ours.default is ours.empty:
                problems.append(f"{where}: {name!r} is required here, TorchRL defaults it to {fact['default']}")
            elif not _default_equal(ours.default, fact["default"]):
                problems.append(f"{where}: {name!r} defaults to {ours.default!r}, TorchRL's to {fact['default']}")
    return problems


def _class_problems(module: str, name: str, cls, fact) -> list[str]:
    where = f"{module}.{name}"
    problems = []
    if "init" in fact:
        problems += _param_problems(f"{where}.__init__", _signature(cls, bound=False), fact["init"])
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for method, mfact in sorted(fact.get("methods", {}).items()):
        decorators = mfact.get("decorators", [])
        if not (hasattr(cls, method) or method in fields):
            problems.append(f"{where}.{method}: missing")
            continue
        properties = ("property", "_classproperty")
        if any(d in properties or d.endswith(".setter") for d in decorators) or method in fields:
            continue
        static = inspect.getattr_static(cls, method)
        if not callable(getattr(cls, method)):
            problems.append(f"{where}.{method}: not a method")
            continue
        bound = not isinstance(static, staticmethod)
        forwarded = None
        target = getattr(cls, "hosted_class", None)
        if target is not None and hasattr(target, method):
            forwarded = _signature(getattr(target, method), bound=True)
        elif method in _FORWARDS and hasattr(cls, _FORWARDS[method]):
            forwarded = _signature(getattr(cls, _FORWARDS[method]), bound=True)
        problems += _param_problems(
            f"{where}.{method}", _signature(getattr(cls, method), bound=bound), mfact["params"], forwarded=forwarded
        )
    return problems


@pytest.mark.parametrize("module", _modules())
def test_module_path_imports(module):
    if _out_of_scope(module, None):
        with pytest.raises(ImportError):
            importlib.import_module(module)
        return
    importlib.import_module(module)


@pytest.mark.parametrize("module", _modules())
def test_names_resolve_and_are_exported(module):
    if _out_of_scope(module, None):
        pytest.skip(f"{module} is declared out of scope in differences.rst")
    facts = FACTS["modules"][module]
    missing = []
    for name in sorted(facts.get("names", {})):
        if isinstance(getattr(__future__, name, None), __future__._Feature):
            continue  # ``from __future__ import annotations`` in TorchRL's module: not an API name
        try:
            _resolve(module, name)
        except (AttributeError, NotProvidedError) as err:
            missing.append(f"{name} ({type(err).__name__})")
    assert not missing, f"{module}: names TorchRL has and we do not: {missing}"
    ours = set(getattr(importlib.import_module(module), "__all__", ()))
    not_exported = [n for n in facts.get("all") or () if n not in ours and not _out_of_scope(module, n)]
    assert not not_exported, f"{module}.__all__ lacks TorchRL's {not_exported}"


@pytest.mark.parametrize(
    "module, name", [(m, n) for m, n, f in _names() if f["kind"] in ("class", "function")], ids=lambda x: x
)
def test_parameters_and_defaults_match(module, name):
    fact = FACTS["modules"][module]["names"][name]
    obj = _resolve(module, name)
    if obj is None:
        pytest.skip(f"{module}.{name} is declared out of scope in differences.rst")
    if fact["kind"] == "function" and isinstance(obj, classmethod):
        # TorchRL's module-level classmethod (``ray_buffer.as_remote``), attached to a class to be called
        problems = _param_problems(f"{module}.{name}", _signature(obj.__func__, bound=True), fact["params"])
    elif fact["kind"] == "function":
        problems = _param_problems(f"{module}.{name}", _signature(obj, bound=False), fact["params"])
    else:
        problems = _class_problems(module, name, obj, fact)
    declared = set().union(*DIFFERENT_ON_PURPOSE.values())
    problems = [p for p in problems if p not in declared]
    assert not problems, "\n".join(problems)


def test_every_allowed_difference_is_declared_in_differences_rst():
    text = DIFFERENCES.read_text()
    table, on_purpose = text.split("Not implemented", 1)[1].split("Different on purpose", 1)
    missing = [row for row in OUT_OF_SCOPE if row not in table]
    assert not missing, f"OUT_OF_SCOPE rows not in differences.rst's 'Not implemented' table: {missing}"
    missing = [entry for entry in DIFFERENT_ON_PURPOSE if entry not in " ".join(on_purpose.split())]
    assert not missing, f"DIFFERENT_ON_PURPOSE entries not in differences.rst's 'Different on purpose': {missing}"
    # the allow-list is no longer than the page's rows of what is missing
    assert len(OUT_OF_SCOPE) + len(DIFFERENT_ON_PURPOSE) <= table.count("   * - ") - 1


def test_the_walk_covers_the_facts_file():
    """Guard the walk itself: the facts file has the modules, classes and parameters it was read with."""
    modules = FACTS["modules"]
    names = sum(len(m.get("names", {})) for m in modules.values())
    classes = [f for _, _, f in _names() if f["kind"] == "class"]
    assert len(modules) == 57 and names == 319 and len(classes) == 79
    assert "torchrl.data.replay_buffers.replay_buffers.base" in modules


def test_the_walk_reports_each_kind_of_gap():
    """The rules above catch what they claim: a missing parameter, a moved positional, another default."""

    def ours(a, c=1, *, b=2):
        pass

    facts = [
        {"kind": "positional", "name": "a"},
        {"kind": "positional", "name": "b", "default": "2"},
        {"kind": "keyword", "name": "c", "default": "None"},
        {"kind": "keyword", "name": "d", "default": "None"},
        {"kind": "**kwargs", "name": "kwargs"},
    ]
    problems = _param_problems("f", _signature(ours, bound=False), facts)
    assert problems == [
        "f: 'b' is TorchRL's positional parameter 1; ours: ['a', 'c']",
        "f: 'c' defaults to 1, TorchRL's to None",
        "f: no parameter 'd'",
        "f: TorchRL forwards **kwargs; ours neither takes it nor has the signature of the method it forwards to",
    ]
    assert _default_equal(float("nan"), "float('nan')") and _default_equal(torch.float32, "torch.float")
    with pytest.raises(AttributeError):
        _resolve("torchrl.data", "NoSuchName")
