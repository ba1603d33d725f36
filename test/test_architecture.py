"""The layering rules of ``design.md``, checked on the source (nothing is imported or run).

- No import cycle inside ``torchrl``, deferred imports (inside functions) included.
- No module reads or writes another module's classes' private state: an attribute access ``obj._name`` on
  anything but ``self``/``cls`` (and a few listed exceptions) is refused outside the module that defines
  ``_name``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "torchrl"


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
    # TorchRL contract names: TorchRL's writers and buffers call these on a storage/sampler/writer, and user
    # subclasses written for TorchRL implement them under these names, so they keep them here too.
    "_empty",  # TorchRL contract: empty a storage, sampler or writer (rb.empty() calls it on each)
    "_is_full",  # TorchRL contract: whether a storage holds max_size items (ring-buffer wrap)
    "_max_size_along_dim0",  # TorchRL contract: the rows a writer cycles over in a storage
    "_cursor",  # TorchRL contract: a writer's next row, read and set by TorchRL user code (alias of `cursor`)
}


def _private_accesses(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            defined.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
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


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_touches_the_private_state_of_another_modules_classes(name):
    found = _private_accesses(MODULES[name])
    assert not found, f"{name} reads or writes private attributes defined elsewhere: {found}"
