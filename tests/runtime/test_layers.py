"""The runtime's layers (runtime/__init__.py): each subpackage imports only the layers below it,
no module imports codegen, and the module import graph has no cycle (lazy imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
# Lower number = lower layer. Top-level façade modules (__init__, __main__, command) may import any.
LAYERS = {"errors": 0, "vulkan": 1, "families": 2, "reference": 2, "ops": 3, "pytorch": 4, "programs": 5,
          "tools": 6}
FACADE = {"runtime", "runtime.__main__", "runtime.command"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(RUNTIME.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


MODULES = {_module_name(p): p for p in RUNTIME.rglob("*.py") if "_generated" not in p.parts}
GRAPH = {name: {i for i in _imports(path) if i in MODULES and i != name} for name, path in MODULES.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_every_subpackage_has_a_layer():
    assert {_layer(m) for m in MODULES if m not in FACADE} <= set(LAYERS.values())
    assert None not in {_layer(m) for m in MODULES if m not in FACADE}


def test_imports_go_down_only():
    upward = [f"{module} imports {target}" for module, targets in GRAPH.items() if module not in FACADE
              for target in targets if target not in FACADE and _layer(target) > _layer(module)]
    assert not upward


def test_no_runtime_module_imports_codegen():
    assert not [m for m, p in MODULES.items() if any(i.split(".")[0] == "codegen" for i in _imports(p))]


def test_no_import_cycles():
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(GRAPH[module]):
            if state.get(target) == "open":
                return [*path, target]
            if target not in state and (cycle := visit(target, [*path, target])):
                return cycle
        state[module] = "done"
        return None

    for module in sorted(GRAPH):
        if module not in state and module not in FACADE:
            cycle = visit(module, [module])
            assert cycle is None, " -> ".join(cycle)
