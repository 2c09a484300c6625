"""The package's import graph: no cycles (function-level imports included) and the layers
of docs/internals.md ("Import layering") point one way."""

from __future__ import annotations

import ast
from pathlib import Path

import morello_build

PACKAGE = Path(morello_build.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def _resolve(name: str) -> str | None:
    """The package module an import of `name` loads (a name inside a module: the module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):  # every import, at any depth
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name) if name.startswith("morello_build") else None
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_the_package() -> None:
    assert "morello_build.search.dp" in GRAPH["morello_build.api"]
    assert "morello_build.memo.value" in GRAPH["morello_build.memo.boxes"]  # relative import
    assert len(MODULES) > 60


def test_no_import_cycles() -> None:
    assert _cycles() == []


def _layer_imports(prefix: str) -> set[str]:
    return {t for m, ts in GRAPH.items() if m.startswith(prefix) for t in ts}


def _outside(imports: set[str], *allowed: str) -> set[str]:
    return {t for t in imports if not t.startswith(tuple(f"morello_build.{a}" for a in allowed))}


def test_layers_point_down() -> None:
    # The generic memo knows nothing of Specs, the search or the code generator.
    assert _outside(_layer_imports("morello_build.memo"), "memo") == set()
    assert _outside(_layer_imports("morello_build.ir."), "ir", "errors") == set()
    assert _outside(_layer_imports("morello_build.machine"), "ir", "machine", "errors") == set()
    # Microkernels: the machine model plus the C-emission primitives, not the tree walker.
    kernels = _layer_imports("morello_build.kernels")
    assert _outside(kernels, "ir", "machine", "kernels", "errors", "codegen") == set()
    assert "morello_build.codegen.emit" not in kernels
    below_search = ("ir", "machine", "kernels", "impl", "actions", "codegen", "errors")
    assert _outside(_layer_imports("morello_build.actions"), *below_search) == set()
    assert _outside(_layer_imports("morello_build.search"), *below_search, "search", "memo") == (
        set()
    )
    # Nothing below the command line imports it.
    assert not any(
        "morello_build.cli" in ts for m, ts in GRAPH.items() if m != "morello_build.__main__"
    )
