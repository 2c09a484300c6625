"""Plain CMake: morello_add_kernel / morello_add_kernels build, link, and stay incremental.

The kernels are synthesized for real (small shapes), compiled and run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

from morello_build.machine.isa import ISA_FLAGS
from tests.support.paths import BUILD_FIXTURES, REPO_ROOT

ROOT = REPO_ROOT
FIXTURES = BUILD_FIXTURES


def _cmake_dir() -> Path:
    return ROOT / "morello_build" / "cmake"


pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")

KERNEL_LINE = re.compile(r"morello: kernel (\w+)")


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["MORELLO_CACHE_DIR"] = str(cache)
    env.pop("MORELLO_NO_CACHE", None)
    return env


def _run(
    cmd: list[str], env: dict[str, str], cwd: Path, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    if ok and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _generators() -> list[str]:
    gens = ["Unix Makefiles"]
    if shutil.which("ninja"):
        gens.insert(0, "Ninja")
    return gens


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synthesis cache for the module: only the first build of a kernel is cold."""
    return tmp_path_factory.mktemp("morello-cache")


class Project:
    def __init__(self, tmp: Path, generator: str, cache: Path) -> None:
        self.src = tmp / "src"
        shutil.copytree(FIXTURES / "cmake_project", self.src)
        self.build = tmp / "build"
        self.env = _env(cache)
        self.generator = generator

    def configure(self, ok: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(
            [
                "cmake",
                "-S",
                str(self.src),
                "-B",
                str(self.build),
                "-G",
                self.generator,
                f"-DMorelloBuild_ROOT={_cmake_dir()}",
                f"-DMORELLO_PYTHON={sys.executable}",
                "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror",
            ],
            self.env,
            self.src,
            ok,
        )

    def build_(self) -> tuple[str, list[str]]:
        proc = _run(["cmake", "--build", str(self.build)], self.env, self.src)
        out = proc.stdout + proc.stderr
        return out, KERNEL_LINE.findall(out)

    def check(self) -> str:
        return _run([str(self.build / "check_kernels")], self.env, self.src).stdout


@pytest.mark.parametrize("generator", _generators())
def test_build_link_and_incremental(tmp_path: Path, generator: str, cache: Path) -> None:
    p = Project(tmp_path, generator, cache)
    conf = p.configure().stdout
    assert f"morello headers: {p.build / 'morello' / 'toml_kernels'}" in conf
    out, ran = p.build_()
    assert sorted(ran) == ["mm_multi", "mm_small", "mm_spec", "mv_bf16"], out
    assert "mm_small: " in out  # the generator's one-line summary is in the build log
    assert p.check().split() == [
        "mm_spec:",
        "ok",
        "mm_small:",
        "ok",
        "mm_multi:",
        "ok",
        "mv_bf16:",
        "ok",
    ]
    gen_dir = p.build / "morello" / "toml_kernels"
    assert {f.name for f in gen_dir.glob("mm_multi*.c")} == {
        "mm_multi.c",
        "mm_multi__avx512.c",
        "mm_multi__avx2.c",
        "mm_multi__x86_64.c",
    }
    mtimes = {f: f.stat().st_mtime_ns for f in gen_dir.iterdir() if f.is_file()}

    # No change: no synthesis, nothing rewritten.
    out, ran = p.build_()
    assert ran == [], out
    # Touching the declarations re-runs configure but no kernel.
    (p.src / "morello.toml").touch()
    out, ran = p.build_()
    assert ran == [], out
    assert {f: f.stat().st_mtime_ns for f in mtimes} == mtimes

    # Changing one kernel regenerates that kernel only.
    toml = p.src / "morello.toml"
    toml.write_text(
        toml.read_text().replace("shape = [16, 8, 12]", 'shape = [16, 8, 12]\ntarget = "x86-64"')
    )
    out, ran = p.build_()
    assert ran == ["mm_small"], out
    if generator == "Ninja":  # restat: untouched sources are not recompiled
        assert "mm_multi.c.o" not in out and "mm_spec.c.o" not in out
    assert '"isa": "x86-64"' in (gen_dir / "mm_small.json").read_text()
    assert "mm_small: ok" in p.check()
    out, ran = p.build_()
    assert ran == [], out


def test_configure_reports_bad_declaration(tmp_path: Path, cache: Path) -> None:
    p = Project(tmp_path, _generators()[0], cache)
    toml = p.src / "morello.toml"
    toml.write_text(toml.read_text().replace("shape = [16, 8, 12]", "shape = [16, 0, 12]"))
    proc = p.configure(ok=False)
    assert proc.returncode != 0
    flat = " ".join(proc.stderr.split())  # CMake wraps long messages
    assert '[kernel] "mm_small": shape: expected 3 or 4 positive integers, got [16, 0, 12]' in flat
    assert "Traceback" not in proc.stderr


def test_cmake_dir_holds_config() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "morello_build.integration", "--cmake-dir"],
        capture_output=True,
        text=True,
        check=True,
        env=_env(Path("/nonexistent")),
    )
    d = Path(proc.stdout.strip())
    assert (d / "MorelloBuildConfig.cmake").is_file()
    assert (d / "MorelloBuildConfigVersion.cmake").is_file()
    assert d == _cmake_dir().resolve()


def test_find_package_version_check(tmp_path: Path) -> None:
    src = tmp_path / "v"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.15)\nproject(v LANGUAGES NONE)\n"
        "find_package(MorelloBuild 0.1 CONFIG REQUIRED)\n"
        'message(STATUS "found=${MorelloBuild_FOUND} version=${MorelloBuild_VERSION}")\n'
        "find_package(MorelloBuild 7.0 CONFIG QUIET)\n"
    )
    proc = _run(
        [
            "cmake",
            "-S",
            str(src),
            "-B",
            str(tmp_path / "b"),
            f"-DMorelloBuild_ROOT={_cmake_dir()}",
            f"-DMORELLO_PYTHON={sys.executable}",
        ],
        _env(tmp_path / "c"),
        src,
    )
    import morello_build

    assert f"found=1 version={morello_build.__version__}" in proc.stdout


def _load_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("kmod", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_python_module_bindings(tmp_path: Path, cache: Path) -> None:
    """The generated CPython module, built by plain CMake from synthesized kernels, called
    from numpy."""
    np = pytest.importorskip("numpy")
    env = _env(cache)
    build = tmp_path / "build"
    src = FIXTURES / "pymodule_project"
    _run(
        [
            "cmake",
            "-S",
            str(src),
            "-B",
            str(build),
            f"-DMorelloBuild_ROOT={_cmake_dir()}",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror",
        ],
        env,
        tmp_path,
    )
    _run(["cmake", "--build", str(build)], env, tmp_path)
    (so,) = build.glob("kmod*.so")
    kmod = _load_module(so)
    assert kmod.__morello_kernels__ == (
        "mm_row",
        "mm_col",
        "bmm_acc",
        "mv_bf16",
        "sm_rows",
        "gelu_bf16",
        "silu_multi",
    )
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4), dtype=np.float32)
    b = rng.standard_normal((4, 5), dtype=np.float32)
    np.testing.assert_allclose(kmod.mm_row(a, b), a @ b, rtol=1e-5, atol=1e-5)

    out = kmod.mm_col(np.asfortranarray(a), np.asfortranarray(b))
    assert out.flags.f_contiguous and out.shape == (3, 5) and out.ctypes.data % 64 == 0
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="mm_col: a must be F-contiguous"):
        kmod.mm_col(a, np.asfortranarray(b))

    ba = rng.standard_normal((2, 3, 4), dtype=np.float32)
    bb = np.ascontiguousarray(rng.standard_normal((2, 5, 4), dtype=np.float32)).swapaxes(1, 2)
    acc = kmod.bmm_acc(ba, bb)  # out=None: zeros, then +=
    np.testing.assert_allclose(acc, ba @ bb, rtol=1e-5, atol=1e-5)
    again = kmod.bmm_acc(ba, bb, out=acc)
    assert again is acc
    np.testing.assert_allclose(acc, 2 * (ba @ bb), rtol=1e-5, atol=1e-5)

    bits_a = rng.integers(0x3F00, 0x3F80, (2, 8), dtype=np.uint16)
    bits_b = rng.integers(0xBF00, 0xBF80, (8, 3), dtype=np.uint16)
    f = lambda x: (x.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    np.testing.assert_allclose(kmod.mv_bf16(bits_a, bits_b), f(bits_a) @ f(bits_b), rtol=1e-5)

    with pytest.raises(
        TypeError, match=r"mm_row: b must have dtype float32, got buffer format 'd'"
    ):
        kmod.mm_row(a, b.astype(np.float64))
    with pytest.raises(ValueError, match=r"mm_row: out must have shape \(3, 5\), got \(5, 3\)"):
        kmod.mm_row(a, b, out=np.zeros((5, 3), np.float32))
    with pytest.raises(TypeError, match="mm_row: a must be a float32 array"):
        kmod.mm_row(None, b)
    with pytest.raises(TypeError):
        kmod.mm_row(a)
    assert "mm_row(a, b, out=None) -> out" in kmod.mm_row.__doc__
    assert kmod.__morello_info__["mv_bf16"]["isas"] == ("avx512", "avx2", "x86-64")

    # Row operations (issue 35): name(x, out=None) -> out, against numpy in float64.
    x = rng.standard_normal((8, 200), dtype=np.float32) * 4
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    np.testing.assert_allclose(kmod.sm_rows(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    xs = rng.standard_normal((3, 17), dtype=np.float32)
    out = np.empty((3, 17), np.float32)
    assert kmod.silu_multi(xs, out=out) is out
    np.testing.assert_allclose(out, xs / (1 + np.exp(-xs.astype(np.float64))), rtol=1e-5, atol=1e-6)
    bits = rng.integers(0x3F00, 0x3F80, (4, 40), dtype=np.uint16)  # bf16 in [0.5, 1)
    v = f(bits).astype(np.float64)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    np.testing.assert_allclose(
        kmod.gelu_bf16(bits), 0.5 * v * (1 + erf(v / math.sqrt(2))), rtol=1e-5
    )
    with pytest.raises(
        ValueError, match=r"^sm_rows: x must have shape \(8, 200\), got \(8, 100\)$"
    ):
        kmod.sm_rows(x[:, :100])
    with pytest.raises(TypeError, match=r"^gelu_bf16: x must have dtype bfloat16"):
        kmod.gelu_bf16(bits.astype(np.float32))
    assert kmod.sm_rows.__doc__.startswith("sm_rows(x, out=None) -> out")
    assert kmod.__morello_info__["sm_rows"] == {
        "op": "softmax",
        "shape": (8, 200),
        "dtype": "f32",
        "threads": 1,
        "isas": kmod.__morello_info__["mm_row"]["isas"],
    }


FAKE_CPU = """
#include <stdlib.h>
#include <string.h>
static int fake_supports(const char *f)
{
    const char *have = getenv("FAKE_CPU");
    char buf[512], *tok;
    if (!have)
        return 0;
    strncpy(buf, have, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    for (tok = strtok(buf, " "); tok; tok = strtok(NULL, " "))
        if (strcmp(tok, f) == 0)
            return 1;
    return 0;
}
#define __builtin_cpu_supports(f) fake_supports(f)
#define __builtin_cpu_init() ((void)0)
"""


@pytest.mark.parametrize("cc", [c for c in ("gcc", "clang") if shutil.which(c)])
def test_dispatcher_picks_best_supported_isa(tmp_path: Path, cc: str) -> None:
    """Runtime dispatch, with __builtin_cpu_supports replaced by a fake CPU from $FAKE_CPU."""
    from morello_build.codegen.abi import KernelABI, OperandABI
    from morello_build.integration import dispatch
    from morello_build.machine import isa

    ops = (
        OperandABI("a", (2, 3), "f32", (0, 1), "in"),
        OperandABI("b", (3, 4), "f32", (0, 1), "in"),
        OperandABI("c", (2, 4), "f32", (0, 1), "out"),
    )

    def build(isas: tuple[str, ...], exe: str) -> Path:
        variants = []
        main = ["#include <stdio.h>", '#include "mv.h"']
        for i in isas:
            abi = KernelABI(dispatch.variant_name("mv", i), "matmul", ops, False, i, 48)
            variants.append((i, abi))
            (tmp_path / f"{abi.name}.h").write_text(f"{abi.prototype()};\n")
            main.append(
                f'{abi.prototype()} {{ (void)a; (void)b; c[0] = {isas.index(i)}; puts("{i}"); }}'
            )
        (tmp_path / "mv.h").write_text(dispatch.kernel_header("mv", variants[0][1], "test"))
        (tmp_path / "mv.c").write_text(FAKE_CPU + dispatch.dispatcher_source("mv", variants))
        main.append(
            "int main(void) { float a[6] = {0}, b[12] = {0}, c[8]; mv(a, b, c); mv(a, b, c); return 0; }"
        )
        (tmp_path / f"{exe}.c").write_text("\n".join(main) + "\n")
        out = tmp_path / exe
        subprocess.run(
            [
                cc,
                "-std=gnu99",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-Wno-unused-function",
                "-I",
                str(tmp_path),
                str(tmp_path / "mv.c"),
                str(tmp_path / f"{exe}.c"),
                "-o",
                str(out),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return out

    def run(exe: Path, features: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, FAKE_CPU=" ".join(features))
        return subprocess.run([str(exe)], env=env, capture_output=True, text=True, check=False)

    exe = build(("avx512", "avx2", "x86-64"), "three")
    assert run(exe, isa.ISA["avx512"].cpu_supports).stdout.split() == ["avx512", "avx512"]
    assert run(exe, isa.ISA["avx2"].cpu_supports).stdout.split() == ["avx2", "avx2"]
    assert run(exe, ("avx2",)).stdout.split() == ["x86-64", "x86-64"]  # avx2 without fma
    assert run(exe, ()).stdout.split() == ["x86-64", "x86-64"]

    exe = build(("avx512", "avx2"), "two")
    proc = run(exe, ())
    assert proc.returncode != 0
    assert "mv: this CPU supports none of the ISAs it was built for (avx512 or avx2)" in proc.stderr


def test_generate_cli_writes_outputs_once(tmp_path: Path, cache: Path) -> None:
    """generate: sources, headers, combined header, manifest; a rerun rewrites nothing."""
    env = _env(cache)
    shutil.copy(FIXTURES / "cmake_project" / "morello.toml", tmp_path / "morello.toml")
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "morello_build.integration",
        "generate",
        "--config",
        "morello.toml",
        "--out-dir",
        str(out),
        "--no-verify",
    ]
    first = _run(cmd, env, tmp_path).stdout.splitlines()
    assert [line.split(":")[0] for line in first] == ["mm_small", "mm_multi", "mv_bf16"]
    names = {p.name for p in out.iterdir()}
    assert {
        "mm_small.c",
        "mm_small.h",
        "mm_multi.c",
        "mm_multi__x86_64.c",
        "mm_multi__avx2.h",
        "morello_kernels.h",
        "manifest.json",
    } <= names
    manifest = json.loads((out / "manifest.json").read_text())
    mv = next(k for k in manifest["kernels"] if k["name"] == "mv_bf16")
    assert mv["operands"][0]["dtype"] == "bf16" and mv["operands"][2]["role"] == "out"
    assert mv["spec"] and mv["flags"] == list(ISA_FLAGS[mv["isa"]])
    multi = next(k for k in manifest["kernels"] if k["name"] == "mm_multi")
    assert [f["isa"] for f in multi["functions"]] == ["avx512", "avx2", "x86-64"]
    assert multi["dispatcher"] == "mm_multi.c"
    mtimes = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    second = _run(cmd, env, tmp_path).stdout.splitlines()
    assert all(": cache hit," in line for line in second), second
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes


# ---------------------------------------------------------------------------------------
# Issue 30: tuning, SPEC validation, plain-CMake instructions, finding the package with an
# old cmake_minimum_required, the verification compiler, progress under Ninja.


def _project(
    src: Path, body: str, minimum: str = "3.15", files: dict[str, str] | None = None
) -> Path:
    src.mkdir(parents=True, exist_ok=True)
    (src / "CMakeLists.txt").write_text(
        f"cmake_minimum_required(VERSION {minimum})\nproject(p LANGUAGES C)\n"
        f"find_package(MorelloBuild CONFIG REQUIRED)\n{body}"
    )
    for name, text in (files or {}).items():
        (src / name).write_text(text)
    return src


def _gen_args() -> list[str]:
    return ["-G", _generators()[0]]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_cmake_builds_the_c_that_morello_synth_prints(tmp_path: Path, cache: Path) -> None:
    """Same declaration, same host: CMake's C is byte for byte `morello synth --format c`
    (the tuning included: configure records `native` as this host's tuning, and the build
    step used to build the ISA's generic tuning instead). The SPEC uses the CLI shorthand."""
    from morello_build.machine.isa import native_tune

    src = _project(
        tmp_path / "src",
        "morello_add_kernels(cfg CONFIG morello.toml NO_VERIFY)\n"
        'morello_add_kernel(spec NAME mm8_col SPEC "matmul 8x8x8 --layout-b col" NO_VERIFY)\n'
        'morello_add_kernel(tuned NAME mm8_z4 SPEC "matmul 8x8x8" TUNE zen4 NO_VERIFY)\n',
        files={
            "morello.toml": 'target = "native"\n'
            '[[kernel]]\nname = "mm8"\nshape = [8, 8, 8]\n'
            '[[kernel]]\nname = "mv"\nshape = [1, 16, 32]\n'
        },
    )
    env = _env(cache)
    build = tmp_path / "build"
    _run(
        ["cmake", "-S", str(src), "-B", str(build), *_gen_args(),
         f"-DMorelloBuild_DIR={_cmake_dir()}", f"-DMORELLO_PYTHON={sys.executable}"],
        env,
        src,
    )  # fmt: skip
    _run(["cmake", "--build", str(build)], env, src)
    cases = [
        ("cfg", "mm8", ["matmul", "8x8x8"]),
        ("cfg", "mv", ["matmul", "1x16x32"]),
        ("spec", "mm8_col", ["matmul", "8x8x8", "--layout-b", "col"]),
        ("tuned", "mm8_z4", ["matmul", "8x8x8", "--tune", "zen4"]),
    ]
    for lib, name, words in cases:
        c, h = tmp_path / f"{name}.c", tmp_path / f"{name}.h"
        _run(
            [sys.executable, "-m", "morello_build", "synth", *words, "--format", "c",
             "--name", name, "-o", str(c), "--header", str(h), "--quiet"],
            env,
            tmp_path,
        )  # fmt: skip
        gen = build / "morello" / lib
        assert (gen / f"{name}.c").read_bytes() == c.read_bytes(), name
        assert (gen / f"{name}.h").read_bytes() == h.read_bytes(), name
        tune = "zen4" if "--tune" in words else native_tune()
        assert json.loads((gen / f"{name}.json").read_text())["tune"] == tune


ROW_CHECK = r"""
/* Row-op kernels from SPEC and from morello.toml against double-precision references. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "sm_b.h"
#include "gelu_k.h"
#include "silu_d.h"
#include "bias_k.h"
#include "scale_k.h"

static float x32[32 * 2048], out[32 * 2048], bvec[96];
static uint16_t xb[32 * 2048];

static float bits_to_f32(uint16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void fill(unsigned seed, int count)
{
    int i;
    for (i = 0; i < count; i++) {
        seed = seed * 1664525u + 1013904223u;
        x32[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 12.0f;
        xb[i] = (uint16_t)(0x3e00u + (seed >> 25)); /* bf16 values in [0.125, 2) */
    }
}

static int report(const char *name, double worst)
{
    printf("%s: %s\n", name, worst <= 1e-5 ? "ok" : "FAIL");
    if (worst > 1e-5)
        fprintf(stderr, "%s: max rel err %.3g\n", name, worst);
    return worst > 1e-5;
}

static double err(double got, double ref)
{
    return fabs(got - ref) / (fabs(ref) + 1e-1); /* rel, with a floor near 0 */
}

int main(void)
{
    int r, j, i, fails = 0;
    double worst = 0.0;
    fill(1u, 32 * 2048);
    sm_b(xb, out);
    for (r = 0; r < 32; r++) {
        double m = -INFINITY, s = 0.0;
        for (j = 0; j < 2048; j++)
            m = fmax(m, bits_to_f32(xb[r * 2048 + j]));
        for (j = 0; j < 2048; j++)
            s += exp(bits_to_f32(xb[r * 2048 + j]) - m);
        for (j = 0; j < 2048; j++) {
            double ref = exp(bits_to_f32(xb[r * 2048 + j]) - m) / s;
            worst = fmax(worst, fabs(out[r * 2048 + j] - ref) / ref);
        }
    }
    fails += report("sm_b", worst);
    worst = 0.0;
    gelu_k(x32, out);
    for (i = 0; i < 16 * 256; i++)
        worst = fmax(worst, err(out[i], 0.5 * x32[i] * (1.0 + erf(x32[i] / sqrt(2.0)))));
    fails += report("gelu_k", worst);
    worst = 0.0;
    silu_d(x32, out);
    for (i = 0; i < 3 * 40; i++)
        worst = fmax(worst, err(out[i], x32[i] / (1.0 + exp(-(double)x32[i]))));
    fails += report("silu_d", worst);
    /* x + b (b[96] on every row, from SPEC "add_row") and x * b[:, None] (toml mul_col):
       one rounding each, so well inside 1e-5. */
    for (j = 0; j < 96; j++)
        bvec[j] = x32[4096 + j] * 3.0f;
    worst = 0.0;
    bias_k(x32, bvec, out);
    for (i = 0; i < 8 * 96; i++)
        worst = fmax(worst, err(out[i], (double)x32[i] + (double)bvec[i % 96]));
    fails += report("bias_k", worst);
    worst = 0.0;
    scale_k(x32, bvec, out);
    for (i = 0; i < 5 * 40; i++)
        worst = fmax(worst, err(out[i], (double)x32[i] * (double)bvec[i / 40]));
    fails += report("scale_k", worst);
    return fails != 0;
}
"""


def test_row_ops_build_link_and_run(tmp_path: Path, cache: Path) -> None:
    """Row operations through CMake (issue 35): `morello_add_kernel(... SPEC "softmax 32x2048
    --dtype bf16")` (the command line's shorthand) and `op = "gelu"` / a multi-ISA `op =
    "silu"` in a morello.toml, and the broadcast ops (`SPEC "add_row 8x96"`, `op =
    "mul_col"`: a third pointer, b), verified at build time, linked into a C program that
    checks them against libm in double; the C is byte for byte what `morello synth` prints."""
    src = _project(
        tmp_path / "src",
        'morello_add_kernel(rows NAME sm_b SPEC "softmax 32x2048 --dtype bf16")\n'
        'morello_add_kernel(bias NAME bias_k SPEC "add_row 8x96")\n'
        "morello_add_kernels(cfg CONFIG morello.toml)\n"
        "add_executable(check_rows check_rows.c)\n"
        "target_link_libraries(check_rows PRIVATE rows bias cfg m)\n",
        files={
            "morello.toml": '[[kernel]]\nname = "gelu_k"\nop = "gelu"\nshape = [16, 256]\n'
            '[[kernel]]\nname = "silu_d"\nop = "silu"\nshape = [3, 40]\n'
            'target = ["avx512", "avx2", "x86-64"]\n'
            '[[kernel]]\nname = "scale_k"\nop = "mul_col"\nshape = [5, 40]\n',
            "check_rows.c": ROW_CHECK,
        },
    )
    env = _env(cache)
    build = tmp_path / "build"
    _run(
        ["cmake", "-S", str(src), "-B", str(build), *_gen_args(),
         f"-DMorelloBuild_DIR={_cmake_dir()}", f"-DMORELLO_PYTHON={sys.executable}",
         "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror"],
        env,
        src,
    )  # fmt: skip
    out = _run(["cmake", "--build", str(build)], env, src).stdout
    names = ("sm_b", "gelu_k", "silu_d", "bias_k", "scale_k")
    for name in names:
        assert re.search(rf"^{name}: .*; verified ", out, re.M), out
    run = _run([str(build / "check_rows")], env, src)
    assert run.stdout.split() == [w for n in names for w in (f"{n}:", "ok")], run.stderr
    silu = json.loads((build / "morello" / "cfg" / "silu_d.json").read_text())
    assert silu["op"] == "silu" and silu["dispatcher"] == "silu_d.c"
    assert [f["isa"] for f in silu["functions"]] == ["avx512", "avx2", "x86-64"]
    assert [o["name"] for o in silu["operands"]] == ["x", "out"]
    scale = json.loads((build / "morello" / "cfg" / "scale_k.json").read_text())
    assert scale["op"] == "mul_col" and [o["shape"] for o in scale["operands"]] == [
        [5, 40],
        [5],
        [5, 40],
    ]
    for lib, name, words in (
        ("rows", "sm_b", ["softmax", "32x2048", "--dtype", "bf16"]),
        ("cfg", "gelu_k", ["gelu", "16x256"]),
        ("bias", "bias_k", ["add_row", "8x96"]),
    ):
        c, h = tmp_path / f"{name}.c", tmp_path / f"{name}.h"
        _run(
            [sys.executable, "-m", "morello_build", "synth", *words, "--format", "c",
             "--name", name, "-o", str(c), "--header", str(h), "--quiet"],
            env,
            tmp_path,
        )  # fmt: skip
        gen = build / "morello" / lib
        assert (gen / f"{name}.c").read_bytes() == c.read_bytes(), name
        assert (gen / f"{name}.h").read_bytes() == h.read_bytes(), name


def test_bad_row_op_declaration_fails_configure(tmp_path: Path, cache: Path) -> None:
    """A matmul-only key with a row op stops configure with the loader's one line."""
    src = _project(
        tmp_path / "src",
        "morello_add_kernels(cfg CONFIG morello.toml)\n",
        files={
            "morello.toml": '[[kernel]]\nname = "sm"\nop = "softmax"\nshape = [8, 64]\n'
            'layouts = ["row", "row", "row"]\n'
        },
    )
    proc = _run(
        ["cmake", "-S", str(src), "-B", str(tmp_path / "b"), *_gen_args(),
         f"-DMorelloBuild_DIR={_cmake_dir()}", f"-DMORELLO_PYTHON={sys.executable}"],
        _env(cache),
        src,
        ok=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert '[kernel] "sm": layouts: applies to op = "matmul" only, not to op = "softmax"' in _flat(
        proc.stderr
    ), proc.stderr
    assert "Traceback" not in proc.stderr


def _cli_error(words: list[str], env: dict[str, str], cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "morello_build", "synth", *words, "--no-cache", "--quiet"],
        env=env, cwd=cwd, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc
    return proc.stderr.strip().splitlines()[-1].split(": error: ", 1)[1]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("matmul 1x288x288 --layout-b cl", ["matmul", "1x288x288", "--layout-b", "cl"]),
        ("matmul 288x288", ["matmul", "288x288"]),
        ("Matmul(1x8x8, f32:GL:row)", ["Matmul(1x8x8, f32:GL:row)"]),
    ],
    ids=["bad-option", "bad-shape", "bad-text"],
)
def test_bad_spec_fails_configure_with_the_cli_message(
    tmp_path: Path, cache: Path, spec: str, words: list[str]
) -> None:
    env = _env(cache)
    src = _project(tmp_path / "src", f'morello_add_kernel(bad NAME bad SPEC "{spec}")\n')
    proc = _run(
        ["cmake", "-S", str(src), "-B", str(tmp_path / "b"), *_gen_args(),
         f"-DMorelloBuild_DIR={_cmake_dir()}", f"-DMORELLO_PYTHON={sys.executable}"],
        env,
        src,
        ok=False,
    )  # fmt: skip
    assert proc.returncode != 0
    want = f'morello_add_kernel(bad): SPEC "{spec}": {_cli_error(words, env, tmp_path)}'
    assert _flat(want) in _flat(proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "b").glob("morello/bad/*.c"))


def _documented_plain_cmake() -> list[str]:
    """The shell commands example_project/README.md gives for plain CMake (no pip)."""
    text = (ROOT / "example_project" / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    (block,) = [b for b in blocks if "cmake --build" in b]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv whose python imports morello-build's dependencies but not morello_build (as
    when only the dependencies are installed, or the wheel is of another checkout)."""
    d = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(d)
    py = d / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    import filelock
    import numpy
    import platformdirs

    dirs = {str(Path(m.__file__).resolve().parents[1]) for m in (numpy, platformdirs, filelock)}
    (Path(purelib) / "morello_deps.pth").write_text("\n".join(sorted(dirs)) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [str(py), "-c", "import numpy, platformdirs, filelock, morello_build"],
        cwd=d, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if "No module named 'morello_build'" not in probe.stderr:
        pytest.skip(f"morello_build is importable beside its dependencies: {probe.stderr[-200:]}")
    return py


@pytest.mark.skipif(shutil.which("ninja") is None, reason="the documented commands use Ninja")
@pytest.mark.parametrize("minimum", ["3.10", "3.15"])
def test_documented_plain_cmake_commands_work(
    tmp_path: Path, cache: Path, bare_python: Path, minimum: str
) -> None:
    """example_project/README.md's plain-CMake commands, run as written from the root of
    the checkout (pip lines left out; a one-kernel project and build directory swapped in),
    with a python that has morello-build's dependencies only: the generator must find this
    checkout at build time too, and find_package must work below cmake_minimum_required
    3.12 (where MorelloBuild_ROOT is ignored)."""
    src = _project(
        tmp_path / "proj", 'morello_add_kernel(k NAME k8 SPEC "matmul 8x8x8" NO_VERIFY)\n', minimum
    )
    build = tmp_path / "eb"
    commands = [c for c in _documented_plain_cmake() if not c.startswith("pip ")]
    assert any(c.startswith("cmake -S example_project ") for c in commands), commands
    script = "\n".join(
        c.replace("-S example_project ", f"-S {src} ").replace("/tmp/eb", str(build))
        for c in commands
    )
    env = {k: v for k, v in _env(cache).items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bare_python.parent}{os.pathsep}{env['PATH']}"
    proc = _run(["bash", "-euo", "pipefail", "-c", script], env, ROOT, ok=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "ModuleNotFoundError" not in out and "CMP0074" not in out
    assert re.search(r"^k8: (synthesized|cache hit)", out, re.M), out
    assert (build / "morello" / "k" / "k8.c").is_file()


def test_find_package_below_cmake_3_12(tmp_path: Path) -> None:
    """MorelloBuild_DIR and CMAKE_PREFIX_PATH find the package whatever the policy version;
    MorelloBuild_ROOT does not below 3.12 (CMP0074), as the docs say."""
    src = _project(tmp_path / "src", 'message(STATUS "found=${MorelloBuild_FOUND}")\n', "3.10")
    env = _env(tmp_path / "c")
    for i, how in enumerate(("MorelloBuild_DIR", "CMAKE_PREFIX_PATH", "MorelloBuild_ROOT")):
        proc = _run(
            ["cmake", "-S", str(src), "-B", str(tmp_path / f"b{i}"),
             f"-D{how}={_cmake_dir()}", f"-DMORELLO_PYTHON={sys.executable}"],
            env,
            src,
            ok=False,
        )  # fmt: skip
        if how == "MorelloBuild_ROOT":
            assert proc.returncode != 0 and "CMP0074" in proc.stderr
        else:
            assert proc.returncode == 0 and "found=1" in proc.stdout, proc.stderr


def test_verification_compiles_with_the_project_compiler(tmp_path: Path, cache: Path) -> None:
    """Build-time verification uses CMAKE_C_COMPILER, not $CC (set to nothing usable here)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not installed")
    log = tmp_path / "cc.log"
    cc = tmp_path / "bin" / "project-cc"
    cc.parent.mkdir()
    cc.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{gcc}" "$@"\n')
    cc.chmod(0o755)
    src = _project(
        tmp_path / "src",
        "morello_add_kernel(k NAME k4 TARGET_ISA x86-64\n"
        '  SPEC "Matmul(1x4x4x4, f32:GL:row, f32:GL:row, f32:GL:row, serial)")\n',
    )
    env = _env(cache)
    env["CC"] = str(tmp_path / "no-such-cc")
    build = tmp_path / "b"
    _run(
        ["cmake", "-S", str(src), "-B", str(build), *_gen_args(),
         f"-DMorelloBuild_DIR={_cmake_dir()}", f"-DMORELLO_PYTHON={sys.executable}",
         f"-DCMAKE_C_COMPILER={cc}"],
        env,
        src,
    )  # fmt: skip
    out = _run(["cmake", "--build", str(build)], env, src).stdout
    assert re.search(r"^k4: .*verified x86-64", out, re.M), out
    assert any("-shared" in line for line in log.read_text().splitlines()), log.read_text()


GATE = """
import os
import time


def hold(s):
    gate = os.environ["MORELLO_TEST_GATE"]
    deadline = time.monotonic() + 20
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    with open(gate + ".result", "w") as f:
        f.write("released" if os.path.exists(gate) else "timed out")
    return s
"""


@pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja not installed")
def test_ninja_shows_the_build_step_while_it_runs(tmp_path: Path, cache: Path) -> None:
    """Ninja holds back a job's output until it ends unless the job is in its console pool.
    The kernel's schedule waits until this test has read the line announcing the kernel:
    under a buffered job the line would only come after the wait timed out."""
    src = _project(
        tmp_path / "src",
        "morello_add_kernels(lib CONFIG morello.toml NO_VERIFY)\n",
        files={
            "morello.toml": '[[kernel]]\nname = "gated"\nshape = [4, 4, 4]\n'
            'schedule = "gate:hold"\n',
            "gate.py": GATE,
        },
    )
    env = _env(cache)
    gate = tmp_path / "gate"
    env["MORELLO_TEST_GATE"] = str(gate)
    build = tmp_path / "b"
    _run(
        ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja",
         f"-DMorelloBuild_DIR={_cmake_dir()}", f"-DMORELLO_PYTHON={sys.executable}"],
        env,
        src,
    )  # fmt: skip
    proc = subprocess.Popen(
        ["cmake", "--build", str(build)],
        env=env, cwd=src, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("morello: kernel gated"):
            gate.touch()
    assert proc.wait(timeout=120) == 0, "".join(lines)
    assert (tmp_path / "gate.result").read_text() == "released", "".join(lines)
    assert any(line.startswith("gated: ") for line in lines), "".join(lines)


def test_remote_cache_variable_reaches_the_build_step(tmp_path: Path) -> None:
    """`-DMORELLO_REMOTE_CACHE=<url>` (the cache variable; it defaults to the environment
    variable): the first build uploads what it synthesized, a second one with an empty
    local cache replays it."""
    remote = tmp_path / "remote"
    src = _project(
        tmp_path / "src",
        'morello_add_kernel(k NAME mm8 SPEC "matmul 8x8x8" TARGET_ISA avx2 NO_VERIFY)\n',
    )
    outputs = []
    for i in range(2):
        env = _env(tmp_path / f"cache{i}")
        for var in ("MORELLO_REMOTE_CACHE", "MORELLO_REMOTE_CACHE_MODE"):
            env.pop(var, None)
        build = tmp_path / f"build{i}"
        _run(
            ["cmake", "-S", str(src), "-B", str(build), *_gen_args(),
             f"-DMorelloBuild_DIR={_cmake_dir()}", f"-DMORELLO_PYTHON={sys.executable}",
             f"-DMORELLO_REMOTE_CACHE={remote.as_uri()}"],
            env,
            src,
        )  # fmt: skip
        proc = _run(["cmake", "--build", str(build)], env, src)
        outputs.append(proc.stdout + proc.stderr)
        assert len(list(remote.rglob("*.bundle"))) == 1, outputs[-1]
    assert "synthesized" in outputs[0] and "cache hit" in outputs[1], outputs


# ---------------------------------------------------------------------------------------
# Issue 36: pipelines, through morello_add_kernel(... EXPR ... INPUTS ...) and a toml's
# `expr` / `inputs`.

PIPELINE_CHECK = r"""
/* Pipelines from EXPR and from morello.toml against double-precision references. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mlp_k.h"
#include "proj_b.h"
#include "act_k.h"
#include "mlp2_k.h"

static float x[8 * 24], w[24 * 16], v[16 * 8], b[24], c[8], out[8 * 24];
static uint16_t xb[4 * 8], wb[16 * 8];

static unsigned seed = 7u;

static float next(void)
{
    seed = seed * 1664525u + 1013904223u;
    return ((float)(seed >> 8) / 16777216.0f - 0.5f) * 4.0f;
}

static uint16_t next_bf16(void)
{
    float f = next();
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16); /* truncated: exactly a bf16 value */
}

static double bf16(uint16_t bits)
{
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double relu(double t) { return t > 0.0 ? t : 0.0; }

static int report(const char *name, double worst)
{
    printf("%s: %s\n", name, worst <= 1e-5 ? "ok" : "FAIL");
    if (worst > 1e-5)
        fprintf(stderr, "%s: max rel err %.3g\n", name, worst);
    return worst > 1e-5;
}

static double err(double got, double ref)
{
    return fabs(got - ref) / (fabs(ref) + 1.0); /* rel, with a floor near 0 */
}

int main(void)
{
    int i, j, p, fails = 0;
    double worst = 0.0, s, h[16];
    for (i = 0; i < 8 * 24; i++)
        x[i] = next();
    for (i = 0; i < 24 * 16; i++)
        w[i] = next();
    for (i = 0; i < 16 * 8; i++)
        v[i] = next();
    for (i = 0; i < 24; i++)
        b[i] = next();
    for (i = 0; i < 8; i++)
        c[i] = next();
    for (i = 0; i < 4 * 8; i++)
        xb[i] = next_bf16();
    for (i = 0; i < 16 * 8; i++)
        wb[i] = next_bf16();
    /* mlp_k: relu(x @ w.T + b), x [8, 16], w [24, 16] */
    mlp_k(x, w, b, out);
    for (i = 0; i < 8; i++)
        for (j = 0; j < 24; j++) {
            for (s = b[j], p = 0; p < 16; p++)
                s += (double)x[i * 16 + p] * w[j * 16 + p];
            worst = fmax(worst, err(out[i * 24 + j], relu(s)));
        }
    fails += report("mlp_k", worst);
    /* proj_b: relu(x @ w.T + b), bf16 x [4, 8] and w [16, 8] */
    worst = 0.0;
    proj_b(xb, wb, b, out);
    for (i = 0; i < 4; i++)
        for (j = 0; j < 16; j++) {
            for (s = b[j], p = 0; p < 8; p++)
                s += bf16(xb[i * 8 + p]) * bf16(wb[j * 8 + p]);
            worst = fmax(worst, err(out[i * 16 + j], relu(s)));
        }
    fails += report("proj_b", worst);
    /* act_k: silu(x * c + b), x [8, 24], c [8, 1] */
    worst = 0.0;
    act_k(x, c, b, out);
    for (i = 0; i < 8 * 24; i++) {
        s = (double)x[i] * c[i / 24] + b[i % 24];
        worst = fmax(worst, err(out[i], s / (1.0 + exp(-s))));
    }
    fails += report("act_k", worst);
    /* mlp2_k (toml): relu(x @ w1 + b) @ w2, x [4, 8], w1 [8, 16], b [16], w2 [16, 8] */
    worst = 0.0;
    mlp2_k(x, w, b, v, out);
    for (i = 0; i < 4; i++) {
        for (j = 0; j < 16; j++) {
            for (s = b[j], p = 0; p < 8; p++)
                s += (double)x[i * 8 + p] * w[p * 16 + j];
            h[j] = relu(s);
        }
        for (j = 0; j < 8; j++) {
            for (s = 0.0, p = 0; p < 16; p++)
                s += h[p] * v[p * 8 + j];
            worst = fmax(worst, err(out[i * 8 + j], s));
        }
    }
    fails += report("mlp2_k", worst);
    return fails != 0;
}
"""


def test_pipeline_expr_builds_links_and_runs(tmp_path: Path, cache: Path) -> None:
    """`morello_add_kernel(... EXPR ... INPUTS ...)` (INPUTS as one string or as words,
    DTYPE bf16, TARGET_ISA lists) and a toml's `expr` / `inputs`: verified at build time,
    linked into a C program that checks them in double, the C byte for byte what `morello
    synth EXPR --inputs ...` prints."""
    src = _project(
        tmp_path / "src",
        'morello_add_kernel(mlp NAME mlp_k EXPR "relu(x @ w.T + b)" INPUTS x=8x16 w=24x16 b=24)\n'
        'morello_add_kernel(proj NAME proj_b EXPR "relu(x @ w.T + b)"\n'
        '                   INPUTS "x=4x8,w=16x8,b=16" DTYPE bf16 THREADS 1)\n'
        'morello_add_kernel(act NAME act_k EXPR "silu(x * c + b)" INPUTS "x=8x24,c=8x1,b=24"\n'
        "                   TARGET_ISA avx2 x86-64)\n"
        "morello_add_kernels(cfg CONFIG morello.toml)\n"
        "add_executable(check_pipes check_pipes.c)\n"
        "target_link_libraries(check_pipes PRIVATE mlp proj act cfg m)\n",
        files={
            "morello.toml": '[[kernel]]\nname = "mlp2_k"\nexpr = "relu(x @ w1 + b) @ w2"\n'
            "inputs = { x = [4, 8], w1 = [8, 16], b = [16], w2 = [16, 8] }\n",
            "check_pipes.c": PIPELINE_CHECK,
        },
    )
    env = _env(cache)
    build = tmp_path / "build"
    _run(
        ["cmake", "-S", str(src), "-B", str(build), *_gen_args(),
         f"-DMorelloBuild_DIR={_cmake_dir()}", f"-DMORELLO_PYTHON={sys.executable}",
         "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror"],
        env,
        src,
    )  # fmt: skip
    out = _run(["cmake", "--build", str(build)], env, src).stdout
    names = ("mlp_k", "proj_b", "act_k", "mlp2_k")
    for name in names:
        assert re.search(rf"^{name}: .*; verified ", out, re.M), out
    run = _run([str(build / "check_pipes")], env, src)
    assert run.stdout.split() == [w for n in names for w in (f"{n}:", "ok")], run.stderr
    proj = json.loads((build / "morello" / "proj" / "proj_b.json").read_text())
    assert proj["spec"] == (
        "Compose[Matmul,AddRow,Relu](1x4x8x16, bf16:GL:row, bf16:GL:col, f32:GL:row, "
        "f32:GL:row, serial)"
    )
    act = json.loads((build / "morello" / "act" / "act_k.json").read_text())
    assert [f["isa"] for f in act["functions"]] == ["avx2", "x86-64"]
    mlp2 = json.loads((build / "morello" / "cfg" / "mlp2_k.json").read_text())
    assert len(mlp2["operands"]) == 5 and mlp2["operands"][-1]["shape"] == [4, 8]
    c, h = tmp_path / "mlp_k.c", tmp_path / "mlp_k.h"
    _run(
        [sys.executable, "-m", "morello_build", "synth", "relu(x @ w.T + b)",
         "--inputs", "x=8x16,w=24x16,b=24", "--format", "c", "--name", "mlp_k", "-o", str(c),
         "--header", str(h), "--quiet"],
        env,
        tmp_path,
    )  # fmt: skip
    gen = build / "morello" / "mlp"
    assert (gen / "mlp_k.c").read_bytes() == c.read_bytes()
    assert (gen / "mlp_k.h").read_bytes() == h.read_bytes()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            'morello_add_kernel(bad NAME bad EXPR "gleu(x @ w + b)" INPUTS "x=8x16,w=16x24,b=24")',
            'morello_add_kernel(bad): EXPR "gleu(x @ w + b)": expr col 1: unknown function '
            "'gleu'; did you mean 'gelu'?",
        ),
        (
            'morello_add_kernel(bad NAME bad EXPR "relu(x @ w + b)" INPUTS x=8x16 w=16x24 b=23)',
            "morello_add_kernel(bad): EXPR \"relu(x @ w + b)\": expr col 14: 'b' is [23] but "
            "x @ w is 8x24; a row vector needs 24 elements",
        ),
        (
            'morello_add_kernel(bad NAME bad EXPR "relu(x @ w + b)" INPUTS "x=8x16,w=16x24,b=24"'
            " DTYPE f16)",
            'morello_add_kernel(bad): EXPR "relu(x @ w + b)": dtype: expected "f32" or "bf16" '
            '(the type of the matrix inputs; vectors and out are f32), got "f16"',
        ),
        (
            'morello_add_kernel(bad NAME bad EXPR "relu(x @ w + b)")',
            "morello_add_kernel(bad): EXPR needs INPUTS, the shape of each input in the order "
            'the kernel takes them (e.g. INPUTS "x=64x768,w=768x3072,b=3072")',
        ),
        (
            'morello_add_kernel(bad NAME bad SPEC "matmul 8x8x8" EXPR "relu(x @ w)"'
            " INPUTS x=8x8 w=8x8)",
            "morello_add_kernel(bad): give either SPEC <spec-text> or EXPR <expression>, not both",
        ),
        (
            'morello_add_kernel(bad NAME bad SPEC "matmul 8x8x8" DTYPE bf16)',
            "morello_add_kernel(bad): DTYPE applies to EXPR only (a SPEC shorthand takes "
            "--dtype and --threads)",
        ),
    ],
    ids=["misspelt-function", "bias-size", "dtype", "no-inputs", "spec-and-expr", "spec-dtype"],
)
def test_bad_pipeline_expr_fails_configure(
    tmp_path: Path, cache: Path, call: str, message: str
) -> None:
    """A bad EXPR stops configure with one line naming the function, target and EXPR;
    nothing is generated."""
    src = _project(tmp_path / "src", call + "\n")
    proc = _run(
        ["cmake", "-S", str(src), "-B", str(tmp_path / "b"), *_gen_args(),
         f"-DMorelloBuild_DIR={_cmake_dir()}", f"-DMORELLO_PYTHON={sys.executable}"],
        _env(cache),
        src,
        ok=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert _flat(message) in _flat(proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "b").glob("morello/bad/*.c"))


def test_pipeline_python_module_through_cmake(tmp_path: Path, cache: Path) -> None:
    """`morello_add_python_module` (what a pip build runs) with declared pipelines: each is
    `name(<inputs by name>, out=None) -> out`, matching numpy in float64."""
    np = pytest.importorskip("numpy")
    src = _project(
        tmp_path / "src",
        "morello_add_python_module(pipes CONFIG morello.toml)\n",
        files={
            "morello.toml": 'target = "native"\n'
            '[[kernel]]\nname = "mlp"\nexpr = "relu(x @ w + b)"\n'
            "inputs = { x = [8, 16], w = [16, 24], b = [24] }\n"
            '[[kernel]]\nname = "act"\nexpr = "silu(x * c + b)"\n'
            "inputs = { x = [8, 24], c = [8, 1], b = [24] }\n"
        },
    )
    env = _env(cache)
    build = tmp_path / "build"
    _run(
        ["cmake", "-S", str(src), "-B", str(build), *_gen_args(),
         f"-DMorelloBuild_DIR={_cmake_dir()}", f"-DPython_EXECUTABLE={sys.executable}",
         "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror"],
        env,
        src,
    )  # fmt: skip
    out = _run(["cmake", "--build", str(build)], env, src).stdout
    assert re.search(r"^mlp: .*; verified ", out, re.M), out
    (so,) = build.glob("pipes*.so")
    spec = importlib.util.spec_from_file_location("pipes", so)
    assert spec is not None and spec.loader is not None
    pipes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipes)
    assert pipes.__morello_kernels__ == ("mlp", "act")
    rng = np.random.default_rng(36)
    x, w, b = (rng.standard_normal(s, dtype=np.float32) for s in ((8, 16), (16, 24), (24,)))
    want = np.maximum(x.astype(np.float64) @ w + b, 0.0)
    np.testing.assert_allclose(pipes.mlp(x, w, b), want, rtol=1e-5, atol=1e-5)
    xa, c = rng.standard_normal((8, 24), dtype=np.float32), rng.standard_normal((8, 1), np.float32)
    v = xa.astype(np.float64) * c + b
    got = pipes.act(x=xa, c=c, b=b)
    np.testing.assert_allclose(got, v / (1.0 + np.exp(-v)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"^act: c must have shape \(8, 1\), got \(8,\)$"):
        pipes.act(xa, c[:, 0], b)
    assert pipes.mlp.__doc__.startswith("mlp(x, w, b, out=None) -> out\n\nout = relu(x @ w + b)")
