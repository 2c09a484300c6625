"""The cache's schema stamp: which code wrote a table, so stored answers are only replayed
by the code that gave them their meaning.

A stored answer is an index into a Spec's action list, a cost and memory coordinates; any
edit to the modules that enumerate actions, price them or map Specs to coordinates changes
what an index means. The stamp is a hash of the source of every `morello_build` module
the persistent memo imports, directly or not, found by scanning their `import` statements
(not a hand-kept list, which missed `ir/levels.py` and let a stale table replay the wrong
rewrite). Hashing a module too many only costs a cold cache after an unrelated edit.
"""

from __future__ import annotations

import functools
import hashlib
import re
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


#: An import statement at the start of a line (any indentation, so imports inside
#: functions and `if TYPE_CHECKING:` blocks count): `from X import NAMES` with NAMES in
#: parentheses across lines or up to the line's end, or `import A, B.C as D`. Scanning text
#: rather than parsing each module with `ast` keeps the stamp to ~15 ms instead of ~130 ms
#: per process (a warm `morello synth` took 0.47 s); a line that only looks like an import
#: (in a docstring) can add a module, never drop one, and
#: `test_the_import_scan_finds_what_ast_finds` compares the two on the package.
_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)|import[ \t]+([^\n#]*))",
    re.MULTILINE,
)


def _imported_modules(name: str, source: str, is_package: bool) -> set[str]:
    """Every `morello_build` module an import statement of `source` may load, including the
    parent packages that importing a submodule runs."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for m in _IMPORT.finditer(source):
        if m.group(3) is not None:  # import A, B.C as D
            targets = [part.split()[0] for part in m.group(3).split(",") if part.strip()]
        else:
            mod = m.group(1)
            level = len(mod) - len(mod.lstrip("."))
            if level:  # relative: `from ..x import y` drops level - 1 packages
                parts = package.split(".")
                base = parts[: len(parts) - (level - 1)]
                mod = ".".join(base + ([mod[level:]] if mod[level:] else []))
            # `from pkg import name` may name a submodule; a non-module name is dropped
            # later when no file exists for it.
            names = m.group(2).strip("() \t\n").replace("\n", " ")
            targets = [mod] + [f"{mod}.{n.split()[0]}" for n in names.split(",") if n.strip()]
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
