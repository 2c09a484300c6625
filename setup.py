"""Builds the optional compiled search core: mypyc compiles morello_build.native.CORE_MODULES
to C extensions (the metadata lives in pyproject.toml; see docs/internals.md, "Compiled search
core").

The wheel falls back to pure Python, and the build still succeeds, when mypyc is missing, when
MORELLO_BUILD_PURE=1 is set, when mypyc rejects the code, or when the C compile fails. Editable
installs are always pure: compiled modules in the source tree would shadow later edits of
their `.py` files.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import BaseError, CCompilerError

ROOT = os.path.dirname(os.path.abspath(__file__))
#: setup.py commands that build extension modules (`pip wheel`/`pip install .` run
#: bdist_wheel). Metadata commands (egg_info, dist_info), sdist and editable builds
#: (editable_wheel, PEP 660; develop, legacy) get no extensions.
BUILD_COMMANDS = {"bdist_wheel", "build", "build_ext", "install", "bdist", "bdist_egg"}
EDITABLE_COMMANDS = {"editable_wheel", "develop"}


def say(msg: str) -> None:
    print(f"morello-build: {msg}", file=sys.stderr, flush=True)


def skipped(why: str) -> list[Extension]:
    say(f"compiled search core skipped ({why}); building pure Python")
    return []


def core_modules() -> tuple[str, ...]:
    """morello_build.native.CORE_MODULES, read without importing the package."""
    path = os.path.join(ROOT, "morello_build", "native.py")
    spec = importlib.util.spec_from_file_location("_morello_native", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return tuple(mod.CORE_MODULES)


def core_extensions() -> list[Extension]:
    commands = set(sys.argv[1:])
    if commands & EDITABLE_COMMANDS:
        return skipped("editable install")
    if not commands & BUILD_COMMANDS:
        return []  # metadata or sdist: nothing to compile
    if os.environ.get("MORELLO_BUILD_PURE", "").strip() not in ("", "0"):
        return skipped("MORELLO_BUILD_PURE is set")
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        return skipped(f"mypyc not available: {exc}")
    paths = [os.path.join(*m.split(".")) + ".py" for m in core_modules()]
    # -O1, no debug info, one C file per module (compiled in parallel by BuildCore): the
    # compile went from 64 s to 32 s on 2 cores with the same search speed as -O3 in one
    # file (docs/internals.md, "Compiled search core").
    options = {"opt_level": "1", "debug_level": "0", "multi_file": True}
    try:
        try:
            exts = mypycify(paths, group_name="morello_build_core", **options)
        except TypeError:  # older mypy (1.13) has no group_name: the library gets a hash
            exts = mypycify(paths, **options)
    except (Exception, SystemExit) as exc:  # mypyc exits on type errors
        return skipped(f"mypyc failed: {type(exc).__name__}: {exc}")
    for ext in exts:
        ext.optional = True  # a failing C compile leaves the pure-Python modules in charge
    return exts


class BuildCore(build_ext):
    """build_ext for the core: builds the extensions in parallel, all of the core or none of
    it (a module's shim does not import without the shared library), and nothing at all for
    editable installs."""

    def run(self) -> None:
        if self.extensions and getattr(self, "editable_mode", False):
            skipped("editable install")
            self.extensions = []
        super().run()

    def build_extensions(self) -> None:
        self.check_extensions_list(self.extensions)
        # The shared library (a C file per module) and the small per-module shims, side by
        # side; every C file goes through one pool, so at most `jobs` compilers run at once.
        jobs = max(1, os.cpu_count() or 1)
        compile_one_by_one = self.compiler.compile
        files = ThreadPoolExecutor(jobs)

        def compile_in_parallel(sources: list[str], *args: object, **kwargs: object) -> list[str]:
            done = files.map(lambda src: compile_one_by_one([src], *args, **kwargs), sources)
            return [obj for objs in done for obj in objs]

        self.compiler.compile = compile_in_parallel  # type: ignore[method-assign]
        try:
            with files, ThreadPoolExecutor(jobs) as pool:
                list(pool.map(self.build_extension, self.extensions))
        except (CCompilerError, BaseError, OSError) as exc:
            if not all(getattr(ext, "optional", False) for ext in self.extensions):
                raise
            for ext in self.extensions:
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            skipped(f"C compile failed: {exc}")


setup(ext_modules=core_extensions(), cmdclass={"build_ext": BuildCore})
