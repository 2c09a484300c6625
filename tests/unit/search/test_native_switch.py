"""The compiled search core's runtime switch (morello_build/native.py), without a build: a
stand-in "extension" that cannot load, next to its `.py` source, shows which one is imported."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

from morello_build import native
from tests.support.paths import REPO_ROOT

#: Imports `morello_build.search.standin` from the directory in argv[1]; prints its origin.
IMPORT_STANDIN = """
import sys
import morello_build.search as pkg
from morello_build import native
pkg.__path__.insert(0, sys.argv[1])
try:
    import morello_build.search.standin as m
except ImportError as exc:
    print("ImportError", exc)
else:
    print(m.WHERE, m.__file__)
print(native.describe())
"""


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    """A directory holding `standin.py` and a `standin` "extension" that is not one."""
    (tmp_path / "standin.py").write_text("WHERE = 'source'\n")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (tmp_path / f"standin{suffix}").write_bytes(b"not a shared library")
    return tmp_path


def _run(standin: Path, pure: str | None) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("MORELLO_PURE_PYTHON", None)
    if pure is not None:
        env["MORELLO_PURE_PYTHON"] = pure
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_STANDIN, str(standin)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=standin,
    )
    return proc.stdout.splitlines()


def test_pure_python_switch_imports_the_source(standin: Path) -> None:
    lines = _run(standin, "1")
    assert lines[0] == f"source {standin / 'standin.py'}"
    assert lines[1] == "search core: pure Python, MORELLO_PURE_PYTHON=1"


@pytest.mark.parametrize("pure", [None, "", "0"])
def test_without_the_switch_the_extension_wins(standin: Path, pure: str | None) -> None:
    lines = _run(standin, pure)
    assert lines[0].startswith("ImportError"), lines  # Python tried the (broken) extension
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    built = all(
        (REPO_ROOT / (m.replace(".", "/") + suffix)).is_file() for m in native.CORE_MODULES
    )  # by `setup.py build_ext --inplace`; a plain checkout has no compiled core
    assert lines[1] == ("search core: compiled (mypyc)" if built else "search core: pure Python")


def test_finder_leaves_other_modules_alone(standin: Path) -> None:
    finder = native._SourceFinder()
    assert finder.find_spec("standin", [str(standin)]) is None  # not morello_build's
    spec = finder.find_spec("morello_build.search.standin", [str(standin)])
    assert spec is not None and spec.origin == str(standin / "standin.py")
    (standin / "standin.py").unlink()  # no source to fall back to: the extension stays
    assert finder.find_spec("morello_build.search.standin", [str(standin)]) is None


def test_core_modules_are_sources_here() -> None:
    """Each listed module exists as a `.py` file; from a source checkout none is native."""
    for mod in native.CORE_MODULES:
        assert (REPO_ROOT / (mod.replace(".", "/") + ".py")).is_file(), mod
    assert len(set(native.CORE_MODULES)) == len(native.CORE_MODULES)
    if not any(REPO_ROOT.glob("morello_build/**/*.so")):
        assert native.compiled_modules() == []
        assert not native.is_compiled("morello_build.search.dp")
