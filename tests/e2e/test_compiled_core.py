"""The compiled search core (mypyc, setup.py) gives the same answers as the pure-Python one.

A wheel of this checkout is built as pip builds it (compiled), installed into a fresh venv,
checked to really hold native modules, then the same syntheses run there twice, natively and
with MORELLO_PURE_PYTHON=1: the C of each kernel and the number of Specs each search solved
must be identical. When mypyc rejects the code or the C compile fails, the build still
succeeds with a pure-Python wheel that works. Slow (minutes): the wheel's C compile and the
pure-Python searches.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from morello_build.native import CORE_MODULES
from tests.support.builds import checkout_copy, clean_env, fresh_venv, run

pytestmark = pytest.mark.slow

#: (target, matmul b, m, k, n, dtype): odd and even shapes, f32 and bf16, each target.
CASES = [
    ("avx2", 1, 24, 40, 56, "f32"),
    ("avx512", 1, 64, 64, 64, "f32"),
    ("avx2", 1, 32, 32, 32, "bf16"),
    ("x86-64", 1, 17, 5, 33, "f32"),
]

#: Run inside the venv: which modules are native, then each case's C and Specs solved.
PROBE = """
import json, sys
from morello_build import native
from morello_build.api import matmul_spec_text, synthesize, synthesize_kernel
files = {m: __import__(m, fromlist=["_"]).__file__ for m in native.CORE_MODULES}
out = {"describe": native.describe(), "compiled": native.compiled_modules(), "files": files,
       "cases": []}
for isa, b, m, k, n, dt in json.loads(sys.argv[1]):
    spec = matmul_spec_text(b, m, k, n, dtype=dt)
    syn = synthesize(spec, isa, use_cache=False)
    res = synthesize_kernel(spec, name="k", target=isa, use_cache=False)
    out["cases"].append({"solved": syn.solved, "kernel_solved": res.solved,
                         "c": res.kernel.c_source})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str], Path]:
    """A fresh venv with this checkout's wheel (built compiled) installed: python, env, wheel."""
    tmp = tmp_path_factory.mktemp("compiled-core")
    env = clean_env(tmp / "cache")
    env.pop("MORELLO_BUILD_PURE", None)
    env.pop("MORELLO_PURE_PYTHON", None)
    py = fresh_venv(tmp / "venv")
    src = checkout_copy(tmp / "morello-build")
    dist = tmp / "dist"
    log, _ = run([py, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(dist), str(src)], env, tmp)
    assert "compiled search core skipped" not in log, log[-5000:]
    (wheel,) = dist.glob("morello_build-*.whl")
    run([py, "-m", "pip", "install", "-q", str(wheel)], env, tmp)
    return py, env, wheel


def _probe(py: str, env: dict[str, str], cwd: Path, pure: bool) -> dict:  # type: ignore[type-arg]
    env = dict(env)
    if pure:
        env["MORELLO_PURE_PYTHON"] = "1"
    out, _ = run([py, "-c", PROBE, json.dumps(CASES)], env, cwd)
    return json.loads(out.splitlines()[-1])  # type: ignore[no-any-return]


def test_wheel_holds_native_core(wheel_venv: tuple[str, dict[str, str], Path]) -> None:
    _, _, wheel = wheel_venv
    names = zipfile.ZipFile(wheel).namelist()
    for mod in CORE_MODULES:
        stem = mod.replace(".", "/")
        assert any(n.startswith(stem + ".") and n.endswith(".so") for n in names), mod
        assert stem + ".py" in names, mod  # the fallback ships too


def test_compiled_and_pure_python_agree(
    wheel_venv: tuple[str, dict[str, str], Path], tmp_path: Path
) -> None:
    py, env, _ = wheel_venv
    native = _probe(py, env, tmp_path, pure=False)
    pure = _probe(py, env, tmp_path, pure=True)

    assert native["describe"] == "search core: compiled (mypyc)"
    assert native["compiled"] == list(CORE_MODULES)
    for mod, path in native["files"].items():
        assert path.endswith(".so") and "site-packages" in path, (mod, path)
    assert pure["describe"] == "search core: pure Python, MORELLO_PURE_PYTHON=1"
    assert pure["compiled"] == []
    for mod, path in pure["files"].items():
        assert path.endswith(".py") and "site-packages" in path, (mod, path)

    assert len(native["cases"]) == len(pure["cases"]) == len(CASES)
    for case, a, b in zip(CASES, native["cases"], pure["cases"]):
        assert a["solved"] > 0 and a["kernel_solved"] > 0, case
        assert (a["solved"], a["kernel_solved"]) == (b["solved"], b["kernel_solved"]), case
        assert a["c"] == b["c"], f"{case}: the compiled and pure-Python searches wrote different C"


#: Run with a wheel unpacked first on sys.path: which core runs, and a synthesis it makes.
PURE_PROBE = """
from morello_build import native
from morello_build.api import matmul_spec_text, synthesize_kernel
res = synthesize_kernel(matmul_spec_text(1, 8, 8, 8), name="k", target="avx2", use_cache=False)
print(native.describe(), native.compiled_modules(), "void k(" in res.kernel.c_source)
"""


@pytest.mark.parametrize("failure", ["mypyc rejects the code", "the C compile fails"])
def test_a_failed_core_build_still_builds_a_working_pure_wheel(
    wheel_venv: tuple[str, dict[str, str], Path], tmp_path: Path, failure: str
) -> None:
    py, env, _ = wheel_venv
    env = dict(env)
    src = checkout_copy(tmp_path / "morello-build")
    if failure == "mypyc rejects the code":
        with open(src / "morello_build" / "search" / "coords.py", "a") as f:
            f.write('\nNOT_AN_INT: int = "a type error mypy reports"\n')
        expected = "compiled search core skipped (mypyc failed: SystemExit"
    else:
        env["CFLAGS"] = "-include /nonexistent/morello-build-test.h"  # every gcc call fails
        expected = "compiled search core skipped (C compile failed: "
    dist = tmp_path / "dist"
    log, _ = run(
        [py, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(dist), str(src)], env, tmp_path
    )
    assert expected in log, log[-5000:]
    (wheel,) = dist.glob("morello_build-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".so")], names
    assert "morello_build/search/dp.py" in names

    site = tmp_path / "site"
    run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        env,
        tmp_path,
    )
    env["PYTHONPATH"] = str(site)  # ahead of the venv's compiled install
    out, _ = run([py, "-c", PURE_PROBE], env, tmp_path)
    assert out.splitlines()[-1] == "search core: pure Python [] True", out
