"""The shape of the tree: building blocks never import methods, and no module imports itself back.

Every ``import`` counts, including those inside functions (lazy imports still make a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import mi_core

ROOT = Path(mi_core.__file__).parent

#: The layers, bottom up: a package may import its own modules and those of lower layers only.
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer.split())
    for layer in (
        "errors tasks seeding lazy buffers",
        "naming",
        "io",
        "config",
        "devices",
        "models",
        "data testing",
        "interventions",
        "evaluation",
        "statistics analysis",
        "viz",
        "pruning training",
        "circuits",
        "methods",
        "cli",
        "__main__",
    )
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        name = _module_name(path)
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            targets.update(m for m in modules if m.startswith("mi_core.") or m == "mi_core")
        graph[name] = targets
    return graph


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(package: str) -> int:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"mi_core.{package} is in no layer; add it to LAYERS and to the docs")


def test_every_package_is_in_a_layer_and_imports_only_lower_layers():
    graph = _imports()
    back_edges = []
    for module, targets in graph.items():
        source = _package(module)
        if source == "":  # mi_core/__init__.py: the lazy facade over every layer
            continue
        for target in targets:
            other = _package(target)
            if other and other != source and _layer(other) >= _layer(source):
                back_edges.append(f"{module} -> {target}")
    assert back_edges == []


def test_no_import_cycle():
    graph = {m: {t for t in ts if t in _imports_keys} for m, ts in _imports().items()}
    # a package's __init__ re-exports its modules; a module importing its own package's
    # __init__ would close a cycle through it, which this graph sees.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert cycles == []


_imports_keys = set(_imports())


def _literal_text(node: ast.AST) -> str | None:
    """A string constant's text, or an f-string's with ``{}`` for each placeholder."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def test_hook_names_are_built_in_one_place():
    """Hook names come from ``mi_core.models.hooks.act_name`` (TransformerLens's
    ``get_act_name``): no module spells ``blocks.N.<...>hook_...`` itself (docstrings and
    messages that name a hook in prose may)."""
    import re

    pattern = re.compile(r"^blocks\.(\d+|\{\})\.(\w+\.)?hook_\w+$|^\{\}\.(\w+\.)?hook_\w+$")
    assert pattern.search("blocks.{}.attn.hook_z") and pattern.search("blocks.0.hook_resid_pre")
    assert not pattern.search("blocks.{}.attn.W_Q")
    found = []
    for path in ROOT.rglob("*.py"):
        if path.name == "hooks.py" and path.parent.name == "models":
            continue
        tree = ast.parse(path.read_text())
        inside = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            text = None if id(node) in inside else _literal_text(node)
            if text is not None and pattern.search(text):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text!r}")
    assert not found, "hook names spelt by hand:\n" + "\n".join(found)


#: The largest a module of mi_core may grow (issue #45): past it, split it by concern.
MAX_MODULE_LINES = 900
#: Where a package may reach into another's private modules: circuits/ drives the edge
#: engine's internal API (interventions/edges/_engine.py, _kernels.py).
PRIVATE_MODULE_CLIENTS = {
    "mi_core.interventions.edges._engine": "circuits",
    "mi_core.interventions.edges._kernels": "circuits",
}


def test_no_module_is_over_the_size_limit():
    sizes = {
        _module_name(p): len(p.read_text(encoding="utf-8").splitlines()) for p in ROOT.rglob("*.py")
    }
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_package_imports_another_package_s_private_names():
    """A ``_name`` is its package's own; across packages only public names travel, and a
    private module only to the package named in :data:`PRIVATE_MODULE_CLIENTS`."""
    found = []
    for path in ROOT.rglob("*.py"):
        name = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            target = node.module
            if not target.startswith("mi_core.") or _package(target) == _package(name):
                continue
            private = [a.name for a in node.names if a.name.startswith("_")]
            if private:
                found.append((name, target, private))
            if any(part.startswith("_") for part in target.split(".")[1:]):
                if PRIVATE_MODULE_CLIENTS.get(target) != _package(name):
                    found.append((name, target, "private module"))
    assert found == []


def test_the_pruning_package_exports_at_most_twenty_names():
    import mi_core.pruning as pruning

    assert len(pruning.__all__) <= 20
    for name in pruning.__all__:  # each resolves to what it names, not to a submodule
        assert not isinstance(getattr(pruning, name), type(pruning)), name
