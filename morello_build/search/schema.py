"""The cache's schema stamp: which code wrote a table, so stored answers are only replayed
by the code that gave them their meaning.

A stored answer is an index into a Spec's action list, a cost and memory coordinates; any
edit to the modules that enumerate actions, price them or map Specs to coordinates changes
what an index means. The stamp is a hash of the source of every `morello_build` module
the persistent memo imports, directly or not, found by reading their `import` statements
(not a hand-kept list, which missed `ir/levels.py` and let a stale table replay the wrong
rewrite). Hashing a module too many only costs a cold cache after an unrelated edit.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

#: Bump by hand on a semantic change that no source edit shows (none so far).
SCHEMA_VERSION = 2

#: The modules whose imports, followed transitively, reach everything a replay depends on.
SCHEMA_ROOTS = ("morello_build.search.persistent", "morello_build.actions.enumerate")

PACKAGE = "morello_build"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def _module_file(name: str, root: Path) -> Path | None:
    """The source file of module `name` (`morello_build.x.y`) under package dir `root`."""
    parts = name.split(".")[1:]
    base = root.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(name: str, source: str, is_package: bool) -> set[str]:
    """Every `morello_build` module an import statement of `source` may load, including the
    parent packages that importing a submodule runs."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: `from ..x import y` drops level - 1 packages
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import name` may name a submodule; a non-module name is dropped
            # below when no file exists for it.
            targets = [mod] + [f"{mod}.{alias.name}" for alias in node.names]
        for t in targets:
            if t == PACKAGE or t.startswith(PACKAGE + "."):
                parts = t.split(".")
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return found


def schema_sources(root: Path = PACKAGE_ROOT) -> list[Path]:
    """The source files the stamp covers: the import closure of `SCHEMA_ROOTS`, sorted."""
    seen: dict[str, Path] = {}
    todo = list(SCHEMA_ROOTS)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name, root)
        if path is None:
            continue  # a name imported from a module, not a module
        seen[name] = path
        todo.extend(_imported_modules(name, path.read_text("utf-8"), path.name == "__init__.py"))
    return sorted(seen.values())


@functools.cache
def schema_stamp() -> str:
    """This code's stamp, `v<version>-<hash>`: part of every cache path and page header."""
    return stamp_of(PACKAGE_ROOT)


def stamp_of(root: Path) -> str:
    """The stamp of the package source under `root` (a checkout or an installed copy)."""
    h = hashlib.sha256(str(SCHEMA_VERSION).encode())
    for path in schema_sources(root):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return f"v{SCHEMA_VERSION}-{h.hexdigest()[:12]}"
