"""The layering rules of ``design.md``, checked on the source (only the base-class check imports ``torchrl.data``).

- No import cycle inside ``torchrl``, deferred imports (inside functions) included; and no import that climbs a
  layer: :data:`LAYERS` gives the order, bottom first, and every import (deferred ones included) points to its
  own layer or a lower one.
- No module reads or writes another module's classes' private state: an attribute access ``obj._name`` on
  anything but ``self``/``cls`` (and a few listed exceptions) is refused outside the module that defines
  ``_name`` (defines: a function, class, module- or class-level name, or a ``self._name``/``cls._name`` store;
  writing ``other._name`` defines nothing); and a method's ``self._name`` must be defined by its own class's
  file or an ancestor's (what a mixin that reads the state of the class it is mixed into breaks).
- A class lives whole in its own file: no mixin classes.
- The package layout (issue 24): TorchRL's module paths and one-concept modules at the root of
  ``torchrl/data/replay_buffers`` and nothing private there; an underscore package exports nothing; the bottom
  packages (``_checkpoint``, ``_shared``, ``loading``) import no component; exception classes are defined in
  ``errors.py`` (and ``NotProvidedError`` in ``torchrl/data/_torchrl_names.py``), which holds nothing else.
- The buffer's code is its own (issue 38): at most one private module of ``replay_buffers/replay_buffers/`` has a
  single user.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "torchrl"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """The ``torchrl`` modules that ``name`` imports, at module level or inside a function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_a_deferred_import_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_torchrl_deferred_imports_included():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles (each list imports itself in a circle):\n" + "\n".join(map(str, cycles))


# ``obj._name`` accesses allowed outside the defining module, each with the reason.
ALLOWED_PRIVATE = {
    "_tensordict",  # tensordict's tensorclass API: the TensorDict behind a tensorclass instance
    "_from_tensordict",  # tensordict's tensorclass API: rebuild an instance from its TensorDict
    "_replace",  # collections.namedtuple's public method
    "_asdict",  # collections.namedtuple's public method
    "_fields",  # collections.namedtuple's public attribute
    "_assert_async",  # torch's asynchronous assert: checks a device value without a host sync (compiled draws)
    # TorchRL contract names: TorchRL's writers and buffers call these on a storage/sampler/writer, and user
    # subclasses written for TorchRL implement them under these names, so they keep them here too.
    "_empty",  # TorchRL contract: empty a storage, sampler or writer (rb.empty() calls it on each)
    "_is_full",  # TorchRL contract: whether a storage holds max_size items (ring-buffer wrap)
    "_max_size_along_dim0",  # TorchRL contract: the rows a writer cycles over in a storage
    "_cursor",  # TorchRL contract: a writer's next row, read and set by TorchRL user code (alias of `cursor`)
    "_sample_data_parallel",  # TorchRL contract: the owner-side draw a DataParallelReplayBufferClient calls
}


def _own_names(tree: ast.Module | ast.ClassDef) -> set[str]:
    """The names a module (or a class) defines itself: its functions and classes (methods included), its module-level
    and class-level names, and the attributes its methods store on ``self``/``cls``. A store into another object's
    attribute (``other._x = ...``) or a local variable defines nothing."""
    defined: set[str] = set()

    def body_names(body: list[ast.stmt]) -> None:
        for stmt in body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            for target in targets:
                for sub in ast.walk(target) if target is not None else ():
                    if isinstance(sub, ast.Name):
                        defined.add(sub.id)
            if isinstance(stmt, ast.ClassDef):
                body_names(stmt.body)

    body_names(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, (ast.Store, ast.Del))
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            defined.add(node.attr)
    return defined


def _private_accesses_in(tree: ast.Module) -> list[tuple[int, str]]:
    defined = _own_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__") or attr in ALLOWED_PRIVATE:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "super"):
            continue
        if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == "super":
            continue
        if attr in defined:  # the module's own private state, on another instance of its own classes
            continue
        found.append((node.lineno, attr))
    return found


def _private_accesses(path: Path) -> list[tuple[int, str]]:
    return _private_accesses_in(ast.parse(path.read_text(encoding="utf-8")))


def test_the_private_access_check_catches_a_write_into_another_object():
    """Writing ``other._x`` does not make ``_x`` the module's own: the write and the read are both caught."""
    source = (
        "class Own:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def peek(self, other, buffer):\n"
        "        _local = other._mine\n"
        "        buffer._secret = 2\n"
        "        return buffer._secret, _local\n"
    )
    assert _private_accesses_in(ast.parse(source)) == [(6, "_secret"), (7, "_secret")]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_touches_the_private_state_of_another_modules_classes(name):
    found = _private_accesses(MODULES[name])
    assert not found, f"{name} reads or writes private attributes defined elsewhere: {found}"


# -- a class lives whole in its own file -------------------------------------------------------------------------------
def _class_defs() -> dict[tuple[str, str], ast.ClassDef]:
    out = {}
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                out[(name, node.name)] = node
    return out


CLASSES = _class_defs()


def _imported_names(name: str) -> dict[str, str]:
    """``{local name: module it is imported from}`` for the ``from X import Y`` statements of module ``name``."""
    out = {}
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchrl"):
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
    return out


def _resolve_class(module: str, name: str, hops: int = 6) -> tuple[str, str] | None:
    """Where class ``name`` seen from ``module`` is defined, following re-exports; ``None`` outside torchrl."""
    for _ in range(hops):
        if (module, name) in CLASSES:
            return module, name
        source = _imported_names(module).get(name) if module in MODULES else None
        if source is None:
            return None
        module = source
    return None


def _ancestors(key: tuple[str, str]) -> list[tuple[str, str]]:
    """``key`` and the torchrl classes it derives from, transitively."""
    seen, todo = [], [key]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.append(current)
        for base in CLASSES[current].bases:
            if isinstance(base, ast.Name):
                found = _resolve_class(current[0], base.id)
                if found is not None:
                    todo.append(found)
    return seen


def _foreign_self_reads(key: tuple[str, str]) -> list[tuple[int, str]]:
    own_file = ast.parse(MODULES[key[0]].read_text(encoding="utf-8")) if key[0] in MODULES else CLASSES[key]
    allowed = _own_names(own_file).union(*(_own_names(CLASSES[k]) for k in _ancestors(key)))
    found = []
    for sub in ast.walk(CLASSES[key]):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
            attr = sub.attr
            if attr.startswith("_") and not attr.startswith("__") and attr not in allowed | ALLOWED_PRIVATE:
                found.append((sub.lineno, attr))
    return found


@pytest.mark.parametrize("key", sorted(CLASSES), ids=[f"{m}.{c}" for m, c in sorted(CLASSES)])
def test_a_method_reads_only_private_state_its_class_or_an_ancestor_defines(key):
    found = _foreign_self_reads(key)
    assert not found, (
        f"{key[0]}.{key[1]} reads self-attributes that neither its file nor its ancestors define (a mixin?): {found}"
    )


def test_no_mixin_classes():
    mixins = [f"{m}.{c}" for m, c in CLASSES if c.endswith("Mixin")]
    assert not mixins, f"a class lives whole in its own file; fold these into the class they serve: {mixins}"


_NOT_A_BASE = {"ABC", "abc.ABC", "object", "Generic", "Protocol"}


def test_a_class_with_several_bases_combines_public_classes_only():
    """Multiple inheritance joins real classes (``PrioritizedSliceSampler(SliceSampler, PrioritizedSampler)``, as in
    TorchRL), never a private helper class mixed in for its methods (this check imports ``torchrl.data``)."""
    import torchrl.data

    public = set(torchrl.data.__all__)
    offenders = []
    for (module, cls), node in CLASSES.items():
        bases = [b for b in node.bases if ast.unparse(b).split("[")[0] not in _NOT_A_BASE]
        if len(bases) < 2:
            continue
        for base in bases:
            found = _resolve_class(module, base.id) if isinstance(base, ast.Name) else None
            if found is not None and found[1] not in public:
                offenders.append(f"{module}.{cls} <- {found[0]}.{found[1]}")
    assert not offenders, f"mixed-in helper classes (fold them into the class, or make them functions): {offenders}"


def test_the_private_self_check_catches_a_mixin():
    tree = ast.parse("class M:\n    def f(self):\n        return self._storage\n")
    CLASSES[("fake", "M")] = tree.body[0]
    try:
        assert _foreign_self_reads(("fake", "M")) == [(3, "_storage")]
    finally:
        del CLASSES[("fake", "M")]


# -- the package layout -------------------------------------------------------------------------------------------------
RB = ROOT / "data" / "replay_buffers"
#: TorchRL's module paths and the modules that hold one public concept each (design.md, "Layout").
ROOT_MODULES = {
    "__init__.py", "checkpointers.py", "ray_buffer.py", "utils.py", "scheduler.py",
    "training_state.py", "ted.py", "errors.py", "component.py", "her.py", "offline_to_online.py", "query.py",
    "distributed.py",
}


def test_the_replay_buffer_root_holds_only_torchrl_paths_and_one_concept_modules():
    loose = {p.name for p in RB.glob("*.py")}
    assert not {n for n in loose if n.startswith("_") and n != "__init__.py"}, "private modules go in a package"
    assert loose <= ROOT_MODULES, f"new loose modules: {sorted(loose - ROOT_MODULES)}; put them in a package"
    assert len(loose - {"__init__.py"}) <= 12


def _underscore_packages() -> list[Path]:
    return sorted(p for p in ROOT.rglob("__init__.py") if p.parent.name.startswith("_"))


@pytest.mark.parametrize("init", _underscore_packages(), ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_an_underscore_package_exports_nothing(init):
    tree = ast.parse(init.read_text(encoding="utf-8"))
    assert ast.get_docstring(tree), "say in a few lines what the package owns"
    statements = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    assert not statements, f"{init}: an underscore package's __init__ holds its docstring only"


BOTTOM_PACKAGES = ("torchrl.data.replay_buffers._checkpoint", "torchrl.data.replay_buffers._shared",
                   "torchrl.data.replay_buffers.loading")
#: What the bottom packages may import from torchrl: each other, the shared checks and the exception classes.
BOTTOM_ALLOWED = BOTTOM_PACKAGES + (
    "torchrl._validation", "torchrl._files", "torchrl._phrases", "torchrl.data.replay_buffers.errors",
)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(BOTTOM_PACKAGES)))
def test_the_bottom_packages_import_no_component(name):
    found = {m for m in _imports(name, MODULES[name]) if not m.startswith(BOTTOM_ALLOWED)}
    assert not found, f"{name} imports {sorted(found)}: the format engine and primitives know no component"


def test_exception_classes_are_defined_in_errors_py():
    builtin = {"Exception", "ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError", "ImportError",
               "FileExistsError", "OSError", "AttributeError", "BaseException"}
    homes = {"torchrl.data.replay_buffers.errors", "torchrl.data._torchrl_names"}
    data = [(m, c) for (m, c) in CLASSES if m.startswith("torchrl.data")]

    def is_exception(key, depth=0):
        for base in CLASSES[key].bases:
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            if name in builtin:
                return True
            found = _resolve_class(key[0], name) if isinstance(base, ast.Name) else None
            if found is not None and depth < 8 and is_exception(found, depth + 1):
                return True
        return False

    misplaced = [f"{m}.{c}" for m, c in data if is_exception((m, c)) and m not in homes]
    assert not misplaced, f"define exception classes in torchrl/data/replay_buffers/errors.py: {misplaced}"


ERRORS = ROOT / "data" / "replay_buffers" / "errors.py"


def test_errors_py_holds_the_exception_classes_only():
    """Messages live beside the code that raises them (``TorchRLPhrase`` constants); ``errors.py`` keeps the
    exception classes."""
    text = ERRORS.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= 250, f"errors.py has {lines} lines (at most 250): move messages next to their raise sites"
    other = [
        f"line {node.lineno}: {type(node).__name__}"
        for node in ast.parse(text).body
        if not isinstance(node, (ast.ClassDef, ast.Expr, ast.ImportFrom))  # classes, docstring, __future__
        and not (isinstance(node, (ast.Assign, ast.AnnAssign)) and "__all__" in ast.unparse(node).split("=")[0])
    ]
    assert not other, f"errors.py holds exception classes (and __all__) only: {other}"


# -- no import climbs a layer -------------------------------------------------------------------------------------------
_RB = "torchrl.data.replay_buffers"
#: The layers of torchrl, bottom first: each a set of module prefixes (a module belongs to the layer of its longest
#: matching prefix, so ``torchrl.envs.transforms.transforms``, the ``Transform`` base the storages and buffers use,
#: sits below the concrete transforms of ``torchrl.envs.transforms``). Every import, deferred ones included, points
#: to the importer's layer or a lower one.
LAYERS: list[set[str]] = [
    # shared checks, file helpers, the TorchRL-phrase mechanism, the names TorchRL has and we do not
    {"torchrl._validation", "torchrl._files", "torchrl._phrases", "torchrl.data._torchrl_names"},
    # the exception classes, the on-disk format engine, shared-memory primitives, loader plumbing, data formats,
    # the component protocol and the Transform base class
    {f"{_RB}.errors", f"{_RB}._checkpoint", f"{_RB}._shared", f"{_RB}.loading", f"{_RB}.ted", f"{_RB}.scheduler",
     f"{_RB}.component", "torchrl.envs.transforms.transforms"},
    # checkpointers (the format's public face), buffer utilities, post-processing modules
    {f"{_RB}.utils", f"{_RB}.checkpointers", "torchrl.data.postprocs"},
    {f"{_RB}.storages"},
    {f"{_RB}.writers"},
    {f"{_RB}.trajectories"},
    {f"{_RB}.samplers"},
    {f"{_RB}.sample_units"},
    # the concrete transforms (CatFrames builds a SliceSampler; MultiStepTransform uses MultiStep)
    {"torchrl.envs.transforms"},
    # what a buffer delegates to: trajectory queries, the Hugging Face / LeRobot exchange
    {f"{_RB}.query", f"{_RB}.hf"},
    {f"{_RB}.replay_buffers"},
    # buffers built on ReplayBuffer, the training state, Ray hosting, offline datasets
    {f"{_RB}.her", f"{_RB}.training_state", f"{_RB}._ray", f"{_RB}.ray_buffer", f"{_RB}.distributed",
     "torchrl.data.datasets"},
    # offline-to-online mixing (builds a dataset by id)
    {f"{_RB}.offline_to_online"},
    # the package entry points and the users of the data module
    {_RB, "torchrl.data", "torchrl.envs", "torchrl.modules", "torchrl.render", "torchrl.objectives", "torchrl"},
]


def _layer(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module`` (longest matching prefix), ``None`` if no prefix matches."""
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def _climbing_imports(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if _layer(target) is not None and _layer(target) > _layer(name):  # unplaced: the test below says it
                out.append(f"{name} (layer {_layer(name)}) -> {target} (layer {_layer(target)})")
    return out


def test_every_module_has_a_layer():  # (the check below skips a module that has none)
    unplaced = sorted(name for name in MODULES if _layer(name) is None)
    assert not unplaced, f"add these modules to a layer of LAYERS: {unplaced}"


def test_the_layer_check_catches_a_deferred_import_that_climbs():
    graph = {f"{_RB}.storages.tensor": {f"{_RB}.hf.lerobot"}, f"{_RB}.hf.lerobot": {f"{_RB}.storages.base"}}
    assert _climbing_imports(graph) == [
        f"{_RB}.storages.tensor (layer 3) -> {_RB}.hf.lerobot (layer {_layer(_RB + '.hf')})"
    ]


def test_no_import_climbs_a_layer_deferred_imports_included():
    graph = {name: _imports(name, path) for name, path in MODULES.items() if _layer(name) is not None}
    found = _climbing_imports(graph)
    assert not found, "imports that climb a layer (move the shared piece down, or the module up):\n" + "\n".join(found)


# -- the buffer's code is its own ---------------------------------------------------------------------------------------
BUFFER_PACKAGE = f"{_RB}.replay_buffers"


def _private_module_users() -> dict[str, list[str]]:
    """``{private module of replay_buffers/replay_buffers: the torchrl modules that import it}``."""
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    private = sorted(n for n in MODULES if n.startswith(BUFFER_PACKAGE + "._"))
    return {m: sorted(n for n, targets in graph.items() if m in targets and n != m) for m in private}


def test_at_most_one_private_buffer_module_has_a_single_user():
    """A module only one class file uses is that class's own code: it goes back into the class file."""
    single = {m.rpartition(".")[2]: users[0] for m, users in _private_module_users().items() if len(users) == 1}
    assert len(single) <= 1, f"private modules of replay_buffers/replay_buffers/ with a single user: {single}"
