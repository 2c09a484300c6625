"""Builds the optional compiled search core: mypyc compiles morello_build.native.CORE_MODULES
to C extensions (the metadata lives in pyproject.toml; see docs/internals.md, "Compiled search
core").

The wheel falls back to pure Python, and the build still succeeds, when mypyc is missing, when
MORELLO_BUILD_PURE=1 is set, when mypyc rejects the code, or when the C compile fails. Editable
installs are always pure: compiled modules in the source tree would shadow later edits of
their `.py` files.
"""

from __future__ import annotations

import heapq
import importlib.util
import itertools
import json
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, CancelledError, Future, ThreadPoolExecutor, wait

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


#: The Extension attributes mypycify sets, carried from the child process as JSON.
EXTENSION_FIELDS = ("name", "sources", "include_dirs", "depends", "extra_compile_args")


def mypycify_in_child(
    paths: list[str], options: dict[str, object]
) -> tuple[list[dict[str, object]], str | None]:
    """Run mypyc (type check and C generation) in a forked child that ends with os._exit.

    mypyc leaves millions of objects behind; freeing them when the build's process exits took
    1-3 s of every `pip wheel` (docs/internals.md, "Compiled search core"). The child writes
    the C files and sends back the extensions' fields, or why mypyc failed.
    """
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: whatever happens, it ends here with os._exit
        code = 1
        try:
            os.close(read_end)
            reply: dict[str, object]
            try:
                from mypyc.build import mypycify

                try:
                    exts = mypycify(paths, group_name="morello_build_core", **options)
                except TypeError:  # older mypy (1.13) has no group_name: the library gets a hash
                    exts = mypycify(paths, **options)
                fields = [{k: getattr(e, k) for k in EXTENSION_FIELDS} for e in exts]
                reply = {"extensions": fields}
            except (Exception, SystemExit) as exc:  # mypyc exits on type errors
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            with os.fdopen(write_end, "w") as pipe:
                json.dump(reply, pipe)
            code = 0
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    try:
        reply = json.loads(text)
    except ValueError:
        return [], f"the mypyc process ended with status {status} and no answer"
    if "error" in reply:
        return [], str(reply["error"])
    return list(reply["extensions"]), None


def core_extensions() -> list[Extension]:
    commands = set(sys.argv[1:])
    if commands & EDITABLE_COMMANDS:
        return skipped("editable install")
    if not commands & BUILD_COMMANDS:
        return []  # metadata or sdist: nothing to compile
    if os.environ.get("MORELLO_BUILD_PURE", "").strip() not in ("", "0"):
        return skipped("MORELLO_BUILD_PURE is set")
    try:
        if importlib.util.find_spec("mypyc.build") is None:
            return skipped("mypyc not available")
    except ImportError as exc:  # mypyc's parent package is missing
        return skipped(f"mypyc not available: {exc}")
    paths = [os.path.join(*m.split(".")) + ".py" for m in core_modules()]
    # -O1, no debug info, one C file per module (compiled in parallel by BuildCore): the
    # compile went from 64 s to 32 s on 2 cores with the same search speed as -O3 in one
    # file (docs/internals.md, "Compiled search core").
    options = {"opt_level": "1", "debug_level": "0", "multi_file": True}
    fields, error = mypycify_in_child(paths, options)
    if error is not None:
        return skipped(f"mypyc failed: {error}")
    exts = [Extension(**f) for f in fields]
    for ext in exts:
        ext.optional = True  # a failing C compile leaves the pure-Python modules in charge
    return exts


class LargestFirst:
    """Runs C compiles on `jobs` threads, the largest source file first: the build ends when
    its last compile does, so the long ones must not be left for the end."""

    def __init__(self, jobs: int) -> None:
        self._queue: list[tuple[int, int, Callable[[], list[str]], Future[list[str]]]] = []
        self._order = itertools.count()  # ties keep submission order
        self._ready = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(jobs)]
        for thread in self._threads:
            thread.start()

    def submit(self, source: str, compile_it: Callable[[], list[str]]) -> Future[list[str]]:
        done: Future[list[str]] = Future()
        with self._ready:
            size = os.path.getsize(source) if os.path.exists(source) else 0
            heapq.heappush(self._queue, (-size, next(self._order), compile_it, done))
            self._ready.notify()
        return done

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if not self._queue:
                    return
                _, _, compile_it, done = heapq.heappop(self._queue)
            try:
                done.set_result(compile_it())
            except BaseException as exc:  # the extension's own thread raises it
                done.set_exception(exc)

    def close(self) -> None:
        """Stop the threads; compiles still queued (only after a failure) are cancelled."""
        with self._ready:
            self._closed = True
            for *_, queued in self._queue:
                queued.cancel()
            self._queue.clear()
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()


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
        # Every extension (the shared library, a C file per module, and the small per-module
        # shims) is built on its own thread at once; their C files share one pool that runs
        # at most `jobs` compilers, largest file first, so the 20 shims no longer compile one
        # after another at the end (docs/internals.md, "Compiled search core").
        files = LargestFirst(max(1, os.cpu_count() or 1))
        compile_one = self.compiler.compile

        def compile_in_parallel(sources: list[str], *args: object, **kwargs: object) -> list[str]:
            def compile_it(src: str) -> Callable[[], list[str]]:
                return lambda: compile_one([src], *args, **kwargs)

            done = [files.submit(src, compile_it(src)) for src in sources]
            return [obj for future in done for obj in future.result()]

        self.compiler.compile = compile_in_parallel  # type: ignore[method-assign]
        try:
            with ThreadPoolExecutor(max(1, len(self.extensions))) as pool:
                builds = [pool.submit(self.build_extension, ext) for ext in self.extensions]
                wait(builds, return_when=FIRST_EXCEPTION)
                files.close()  # fail fast: the other extensions' queued compiles are dropped
            failures = [exc for b in builds if (exc := b.exception()) is not None]
            if failures:  # the first real one, not a compile cancelled because of it
                raise next((e for e in failures if not isinstance(e, CancelledError)), failures[0])
        except (CCompilerError, BaseError, OSError) as exc:
            if not all(getattr(ext, "optional", False) for ext in self.extensions):
                raise
            for ext in self.extensions:
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            skipped(f"C compile failed: {exc}")
        finally:
            files.close()


setup(ext_modules=core_extensions(), cmdclass={"build_ext": BuildCore})
