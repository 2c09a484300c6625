"""The compiled search core: which modules mypyc compiles, and the switch back to Python.

A wheel built with mypyc (setup.py) holds each module of `CORE_MODULES` twice: as a native
extension (`.so`/`.pyd`) and as its `.py` source, which Python's import system shadows. The
results are identical either way; only the speed differs (docs/internals.md, "Compiled search
core"). `MORELLO_PURE_PYTHON=1` in the environment makes `install()` (run first thing by
`morello_build/__init__.py`) import the `.py` sources instead. Standard library only: setup.py
reads `CORE_MODULES` from this file without importing the package.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

#: The modules mypyc compiles, the hot loop of a synthesis and what it calls per Spec;
#: nothing that emits C, parses text or does I/O (they would only lengthen the build).
CORE_MODULES: tuple[str, ...] = (
    # The DP loop and the in-run memo: most of a cold synthesis's time.
    "morello_build.search.dp",
    "morello_build.search.memo_protocol",
    # The least limits per Spec, which rule out the limits where nothing fits.
    "morello_build.search.needs",
    # The persistent memo's read-through (every lookup of a cached synthesis) and its
    # Spec <-> table coordinates; PersistentMemo also subclasses the compiled DictMemo.
    "morello_build.search.persistent",
    "morello_build.search.coords",
    # The box memo's pages and table: a cached synthesis merges every answer into them.
    "morello_build.memo.boxes",
    "morello_build.memo.table",
    # Action enumeration and the plans it builds, once per Spec solved.
    "morello_build.actions.base",
    "morello_build.actions.enumerate",
    "morello_build.actions.tile",
    "morello_build.actions.move",
    "morello_build.actions.select",
    "morello_build.actions.accum",
    # Spec values: built, hashed and compared by every action (interned Specs, limits).
    "morello_build.ir.spec",
    "morello_build.ir.tensorspec",
    "morello_build.ir.layout",
    "morello_build.ir.limits",
    "morello_build.impl.cost",
    "morello_build.machine.target",
)

#: The environment variable that makes the package import the `.py` sources.
PURE_ENV = "MORELLO_PURE_PYTHON"
_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def pure_requested() -> bool:
    return os.environ.get(PURE_ENV, "").strip() not in ("", "0")


class _SourceFinder:
    """A `sys.meta_path` finder: a morello_build module found as an extension module loads
    from the `.py` file next to it instead."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("morello_build."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return None
        assert spec.origin is not None
        source = os.path.join(os.path.dirname(spec.origin), fullname.rpartition(".")[2] + ".py")
        if not os.path.isfile(source):
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def install() -> None:
    """With MORELLO_PURE_PYTHON set, put the source finder first on `sys.meta_path` (once)."""
    if pure_requested() and not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())


def is_compiled(module: str) -> bool:
    """Whether `module` is (or, not yet imported, would be) loaded from an extension. Looks
    at files only: imports nothing."""
    mod = sys.modules.get(module)
    if mod is not None:
        return (getattr(mod, "__file__", None) or "").endswith(_SUFFIXES)
    if pure_requested() or not module.startswith("morello_build."):
        return False
    base = os.path.join(os.path.dirname(os.path.abspath(__file__)), *module.split(".")[1:])
    return any(os.path.isfile(base + suffix) for suffix in _SUFFIXES)


def compiled_modules() -> list[str]:
    """The modules of `CORE_MODULES` that are native in this process."""
    return [m for m in CORE_MODULES if is_compiled(m)]


def describe() -> str:
    """One line for `morello --version`: compiled (mypyc) or pure Python, and why."""
    n = len(compiled_modules())
    if n == len(CORE_MODULES):
        return "search core: compiled (mypyc)"
    if n:
        return f"search core: partly compiled ({n} of {len(CORE_MODULES)} modules, mypyc)"
    why = f", {PURE_ENV}=1" if pure_requested() else ""
    return f"search core: pure Python{why}"
