"""Runtime ISA dispatch (`integration/dispatch.py`, `machine.isa.runtime_condition`) on the
real CPU: the build step's own output for a multi-ISA kernel (`generate.produce`), compiled
as CMake compiles it (each variant with its ISA's flags, the dispatcher with none), must
call the best variant this host can run and compute the product.

The dispatcher keeps its choice in a static function pointer, so no symbol exposes it. The
tests observe it by compiling the dispatcher with each variant's name defined to a traced
wrapper (`-D<variant>=traced_<variant>`): the wrapper records its ISA and calls the real
variant, whose code is unchanged."""

from __future__ import annotations

import ctypes
import functools
import platform
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from morello_build.integration.dispatch import variant_name
from morello_build.integration.generate import KernelOutput, KernelRequest, produce, source_files
from morello_build.machine.isa import host_supports, runtime_condition

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="runtime ISA dispatch is x86-64 code",
)

NAME = "mmd"
# 12 columns: a partly filled vector on every vector width (3 rows, k = 4: fast to solve).
SHAPE = (3, 4, 12)
SPEC = "Matmul(1x3x4x12, f32:GL:row, f32:GL:row, f32:GL:row, serial)"
FLAGS = ("-O2", "-std=gnu99", "-Wall", "-Wextra", "-Werror", "-fPIC")


#: A row op dispatches the same way (issue 35): softmax over rows of 21 (a partial vector).
ROW_NAME = "smd"
ROW_SPEC = "Softmax(5x21, f32:GL:row, f32:GL:row, serial)"


@functools.cache
def _generate(isas: tuple[str, ...], name: str = NAME, spec: str = SPEC) -> KernelOutput:
    return produce(KernelRequest(name, isas, spec=spec), verify=False)


def _expected(isas: tuple[str, ...]) -> str | None:
    """The best of `isas` this host runs (from /proc/cpuinfo, not `__builtin_cpu_supports`)."""
    return next((i for i in isas if host_supports(i)), None)


def _compiler(cc: str) -> str:
    path = shutil.which(cc)
    if path is None:
        pytest.skip(f"{cc} is not installed (`.ci/run` installs it; or `apt install {cc}`)")
    return path


def _traced_wrappers(out: KernelOutput, isas: tuple[str, ...], name: str = NAME) -> str:
    """C defining `traced_<variant>` for each variant: record the ISA, call the variant."""
    files = dict(out.contents)
    args = ", ".join(o["name"] for o in out.manifest["operands"])
    lines = [f'#include "{variant_name(name, i)}.h"' for i in isas] + [
        "const char *morello_test_chosen;",
        "int morello_test_calls;",
    ]
    for isa in isas:
        fn = variant_name(name, isa)
        m = re.search(rf"^void {fn}\((.*)\);$", files[f"{fn}.h"], flags=re.M)
        assert m, f"no prototype of {fn} in its header"
        lines += [
            f"void traced_{fn}({m.group(1)})",
            "{",
            f'    morello_test_chosen = "{isa}";',
            "    morello_test_calls++;",
            f"    {fn}({args});",
            "}",
        ]
    return "\n".join(lines) + "\n"


def _objects(
    tmp: Path, cc: str, isas: tuple[str, ...], name: str = NAME, spec: str = SPEC
) -> list[Path]:
    """The kernel's files written out and compiled the way the CMake functions do, plus the
    traced wrappers."""
    out = _generate(isas, name, spec)
    for fname, text in out.contents:
        (tmp / fname).write_text(text)
    (tmp / "traced.c").write_text(_traced_wrappers(out, isas, name))
    renames = [f"-D{variant_name(name, i)}=traced_{variant_name(name, i)}" for i in isas]
    jobs = [
        (f.name, (*f.flags, *(renames if f.isa is None else ()))) for f in source_files(name, isas)
    ]
    jobs.append(("traced.c", ()))
    objects = []
    for source, flags in jobs:
        obj = tmp / (source + ".o")
        subprocess.run(
            [cc, *FLAGS, *flags, "-I", str(tmp), "-c", str(tmp / source), "-o", str(obj)],
            check=True,
            capture_output=True,
            text=True,
        )
        objects.append(obj)
    return objects


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize(
    "isas",
    [("avx512", "avx2", "x86-64"), ("avx512", "x86-64")],
    ids=["avx512-avx2-x86_64", "avx512-x86_64"],
)
def test_dispatcher_calls_best_supported_variant(
    tmp_path: Path, cc: str, isas: tuple[str, ...]
) -> None:
    """On an AVX2 host without AVX-512 (Zen 3) this picks avx2 from the first list and
    x86-64 from the second; elsewhere, whatever the host's best is."""
    compiler = _compiler(cc)
    so = tmp_path / f"lib{NAME}.so"
    subprocess.run(
        [compiler, "-shared", *map(str, _objects(tmp_path, compiler, isas)), "-o", str(so)],
        check=True,
        capture_output=True,
        text=True,
    )
    lib = ctypes.CDLL(str(so))
    lib.mmd.argtypes = [ctypes.c_void_p] * 3
    lib.mmd.restype = None
    m, k, n = SHAPE
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    for call in (1, 2):  # the second call takes the cached pointer
        c = np.full((m, n), np.nan, dtype=np.float32)
        lib.mmd(a.ctypes.data, b.ctypes.data, c.ctypes.data)
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
        assert ctypes.c_int.in_dll(lib, "morello_test_calls").value == call
    chosen = ctypes.c_char_p.in_dll(lib, "morello_test_chosen").value
    assert chosen is not None and chosen.decode() == _expected(isas)


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_row_op_dispatcher_calls_best_supported_variant(tmp_path: Path, cc: str) -> None:
    """A multi-ISA softmax: the dispatcher has the row op's `(x, out)` signature, picks the
    best variant this host runs, and the result is numpy's softmax."""
    compiler = _compiler(cc)
    isas = ("avx512", "avx2", "x86-64")
    so = tmp_path / f"lib{ROW_NAME}.so"
    objects = _objects(tmp_path, compiler, isas, ROW_NAME, ROW_SPEC)
    # -lm: the build links the kernel library into a host that has libm (Python here).
    subprocess.run(
        [compiler, "-shared", *map(str, objects), "-o", str(so), "-lm"],
        check=True,
        capture_output=True,
        text=True,
    )
    header = (tmp_path / f"{ROW_NAME}.h").read_text()
    assert f"void {ROW_NAME}(const float *restrict x, float *restrict out);" in header
    lib = ctypes.CDLL(str(so))
    fn = getattr(lib, ROW_NAME)
    fn.argtypes = [ctypes.c_void_p] * 2
    fn.restype = None
    x = np.random.default_rng(3).standard_normal((5, 21), dtype=np.float32) * 4
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    for call in (1, 2):
        out = np.full_like(x, np.nan)
        fn(x.ctypes.data, out.ctypes.data)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=0)
        assert ctypes.c_int.in_dll(lib, "morello_test_calls").value == call
    chosen = ctypes.c_char_p.in_dll(lib, "morello_test_chosen").value
    assert chosen is not None and chosen.decode() == _expected(isas)


#: A broadcast op (x * b, b one value per row) has a third pointer: a bf16 x, an f32 b.
BCAST_NAME = "mcd"
BCAST_SPEC = "MulCol(5x21, bf16:GL:row, f32:GL:row, f32:GL:row, serial)"


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_broadcast_op_dispatcher_calls_best_supported_variant(tmp_path: Path, cc: str) -> None:
    """A multi-ISA mul_col: the dispatcher has the `(x, b, out)` signature, picks the best
    variant this host runs, and each row of x is multiplied by its b (one rounding)."""
    compiler = _compiler(cc)
    isas = ("avx512", "avx2", "x86-64")
    so = tmp_path / f"lib{BCAST_NAME}.so"
    objects = _objects(tmp_path, compiler, isas, BCAST_NAME, BCAST_SPEC)
    subprocess.run(
        [compiler, "-shared", *map(str, objects), "-o", str(so), "-lm"],
        check=True,
        capture_output=True,
        text=True,
    )
    header = (tmp_path / f"{BCAST_NAME}.h").read_text()
    assert (
        f"void {BCAST_NAME}(const uint16_t *restrict x, const float *restrict b, "
        "float *restrict out);" in header
    )
    lib = ctypes.CDLL(str(so))
    fn = getattr(lib, BCAST_NAME)
    fn.argtypes = [ctypes.c_void_p] * 3
    fn.restype = None
    rng = np.random.default_rng(4)
    bits = rng.integers(0x3E00, 0x4100, (5, 21), dtype=np.uint16)  # bf16 in [0.125, 8)
    x64 = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    b = rng.standard_normal(5, dtype=np.float32)
    for call in (1, 2):
        out = np.full((5, 21), np.nan, np.float32)
        fn(bits.ctypes.data, b.ctypes.data, out.ctypes.data)
        np.testing.assert_allclose(out, x64 * b.astype(np.float64)[:, None], rtol=1e-6, atol=0)
        assert ctypes.c_int.in_dll(lib, "morello_test_calls").value == call
    chosen = ctypes.c_char_p.in_dll(lib, "morello_test_chosen").value
    assert chosen is not None and chosen.decode() == _expected(isas)


MAIN = """\
#include <stdio.h>
#include "mmd.h"
extern const char *morello_test_chosen;
static float a[12], b[48], c[36];
int main(void)
{
    mmd(a, b, c);
    puts(morello_test_chosen);
    return 0;
}
"""


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_dispatcher_without_runnable_variant_aborts(tmp_path: Path, cc: str) -> None:
    """amx and avx512 only, with the AMX check's cpuid/arch_prctl helper: on a host that
    runs neither, the first call says so on stderr and aborts."""
    compiler = _compiler(cc)
    isas = ("amx", "avx512")
    (tmp_path / "main.c").write_text(MAIN)
    exe = tmp_path / "main"
    objects = _objects(tmp_path, compiler, isas)
    subprocess.run(
        [compiler, *FLAGS, "-I", str(tmp_path), str(tmp_path / "main.c"), *map(str, objects)]
        + ["-o", str(exe)],
        check=True,
        capture_output=True,
        text=True,
    )
    proc = subprocess.run([str(exe)], capture_output=True, text=True, check=False)
    expected = _expected(isas)
    if expected is None:
        assert proc.returncode != 0
        assert proc.stderr == (
            "mmd: this CPU supports none of the ISAs it was built for (amx or avx512)\n"
        )
        assert proc.stdout == ""
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [expected]


def test_dispatcher_source_tests_variants_best_first() -> None:
    """The generated selection: one `runtime_condition` test per variant in the declared
    order, the baseline returned unconditionally; without a baseline, an abort."""
    src = dict(_generate(("avx512", "avx2", "x86-64")).contents)[f"{NAME}.c"]
    body = src[src.index("static mmd_fn mmd_select(void)") :]
    body = body[: body.index("\n}\n")]
    assert body.splitlines()[2:] == [
        "    __builtin_cpu_init();",
        f"    if ({runtime_condition('avx512')})",
        "        return mmd__avx512;",
        f"    if ({runtime_condition('avx2')})",
        "        return mmd__avx2;",
        "    return mmd__x86_64;",
    ]
    assert runtime_condition("avx2") == (
        '__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")'
    )
    assert runtime_condition("x86-64") == "1"
    for header in ("mmd.h", "mmd__avx512.h", "mmd__avx2.h", "mmd__x86_64.h"):
        assert f'#include "{header}"' in src

    amx = dict(_generate(("amx", "avx512")).contents)[f"{NAME}.c"]
    assert "static int morello_cpu_has_amx(void)" in amx
    assert f"if ({runtime_condition('amx')})" in amx
    assert runtime_condition("amx").endswith("&& morello_cpu_has_amx()")
    assert "return mmd__x86_64" not in amx
    assert "    abort();" in amx
