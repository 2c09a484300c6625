"""Big shapes (issue 31, items 1 and 2): indices wide enough for every offset, upper bounds
on shapes wherever a shape enters (docs/limits.md), and verification skipped with a message
when its operands would not fit in memory."""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from morello_build.api import matmul_spec_text, synthesize_kernel
from morello_build.errors import SpecError
from morello_build.harness import verify
from morello_build.harness.compile import build_shared_library, find_compiler, kernel_files
from morello_build.harness.verify import TooBigToVerify, kernel_compile_flags
from morello_build.integration import generate
from morello_build.integration.config import ConfigError, load_config, parse_config
from morello_build.integration.shorthand import expand_spec
from morello_build.ir.sizes import MAX_DIM, MAX_MATMUL_MACS, MAX_OPERAND_BYTES
from morello_build.ir.text import parse_spec
from morello_build.machine.isa import host_supports

GL3 = "f32:GL:row, f32:GL:row, f32:GL:row"

# --------------------------------------------------------------------------- item 1: indices


def _loop_types(c: str) -> set[str]:
    return set(re.findall(r"for \((\w+) \w+ = 0;", c))


def test_index_type_is_int_up_to_int_max_elements() -> None:
    """46340^2 elements fit an int offset and keep `int` (so existing kernels' C is
    unchanged); 46341^2 > INT_MAX elements index with int64_t, loops and the outlined
    helpers alike, and the C compiles warning-free."""
    small = synthesize_kernel("Move(46340x46340, f32:GL:row, f32:GL:col)", name="t", target="avx2")
    big = synthesize_kernel("Move(46341x46341, f32:GL:row, f32:GL:col)", name="t", target="avx2")
    assert _loop_types(small.kernel.c_source) == {"int"}
    assert "int64_t" not in small.kernel.c_source
    assert _loop_types(big.kernel.c_source) == {"int64_t"}, big.kernel.c_source
    with tempfile.TemporaryDirectory() as tmp:
        build_shared_library(
            find_compiler(None),
            Path(tmp),
            kernel_files(big.kernel),
            "t",
            flags=kernel_compile_flags(big.kernel),
        )


# A matrix-vector product over a B of 65536 x 32784 = 2^31 + 2^20 f32 elements (8 GiB):
# `rhs[i0 * 16384 + i1 * 262272]` passes INT_MAX from i1 = 8188 on.
MV_K, MV_N = 65536, 32784
#: Rows of B that hold data (the rest are zero pages): the first, one in the middle, the
#: row that straddles element 2^31, the rows after it and the last.
MV_ROWS = (0, 3, 32768, 65504, 65505, 65535)
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value


def _anonymous(nbytes: int, *, shared: bool) -> mmap.mmap:
    if shared:  # the forked kernel call writes it and the parent reads it
        return mmap.mmap(-1, nbytes)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
    return mmap.mmap(-1, nbytes, flags=flags)


@pytest.mark.skipif(sys.platform != "linux", reason="sparse anonymous mappings and fork: Linux")
def test_matvec_past_2_31_elements_runs_and_matches_numpy() -> None:
    """Build and run the kernel on a sparse B (private anonymous mapping: unwritten pages
    read as the shared zero page, so 8 GiB of B costs a few MB) and compare the output
    with numpy on the rows that hold data, bit for bit (dyadic values, exact sums)."""
    if not host_supports("avx2"):
        pytest.skip("this host cannot run avx2 code")
    nbytes = MV_K * MV_N * 4
    assert MV_K * MV_N > 2**31
    try:
        bmap = _anonymous(nbytes, shared=False)
    except (OSError, OverflowError) as exc:
        pytest.skip(f"cannot map {nbytes / 2**30:.0f} GiB of address space for B: {exc}")
    if hasattr(mmap, "MADV_HUGEPAGE"):  # fewer faults (the huge zero page), if allowed
        with contextlib.suppress(OSError):
            bmap.madvise(mmap.MADV_HUGEPAGE)
    res = synthesize_kernel(
        matmul_spec_text(1, 1, MV_K, MV_N), name="mv", target="avx2", tune="generic"
    )
    src = res.kernel.c_source
    assert "int64_t" in src and "for (int " not in src, src
    rng = np.random.default_rng(7)
    a = (rng.integers(1, 64, MV_K) * rng.choice([-1, 1], MV_K) * 2.0**-7).astype(np.float32)
    b = np.frombuffer(bmap, dtype=np.float32, count=MV_K * MV_N).reshape(MV_K, MV_N)
    rows = np.array(MV_ROWS)
    values = (rng.integers(-256, 257, (len(rows), MV_N)) * 2.0**-3).astype(np.float32)
    b[rows] = values
    omap = _anonymous(MV_N * 4, shared=True)
    out = np.frombuffer(omap, dtype=np.float32)
    expected = a[rows].astype(np.float64) @ values.astype(np.float64)
    # -O2 as builds compile it (gcc refused the int-indexed C there: "iteration 8189
    # invokes undefined behavior"), -O0 where an overflowing int offset really wraps.
    for opt in ("-O2", "-O0"):
        out[:] = np.nan
        with tempfile.TemporaryDirectory() as tmp:
            lib = build_shared_library(
                find_compiler(None),
                Path(tmp),
                kernel_files(res.kernel),
                "mv",
                flags=kernel_compile_flags(res.kernel, opt),
            )
            pointers = [a.ctypes.data, b.ctypes.data, out.ctypes.data]
            why = verify._call_isolated(lib, "mv", pointers, timeout=120.0)
        assert not why, f"{opt}: {why}"
        assert np.array_equal(out.astype(np.float64), expected), (
            f"{opt}: first mismatch at column {int(np.argmax(out != expected))}"
        )
    del b
    bmap.close()


# --------------------------------------------------------------------------- item 2: limits


BAD_DIMS = {
    "99999999999": "over the limit of 2147483647",
    "9223372036854775807": "over the limit of 2147483647",
    "9" * 5000: "(5000 digits) is over the limit",
    str(2**40): "over the limit of 2147483647",
}


@pytest.mark.parametrize("dim", list(BAD_DIMS), ids=lambda d: d if len(d) < 30 else "5000-digits")
def test_spec_text_rejects_huge_dims(dim: str) -> None:
    with pytest.raises(SpecError, match=re.escape(BAD_DIMS[dim])) as info:
        parse_spec(f"Matmul(1x{dim}x1x1, {GL3})")
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 300 and "docs/limits.md" in msg


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (f"Matmul(1x1000000x1000000x1000000, {GL3})", "multiply-adds"),
        (f"Matmul(1x65536x65536x65537, {GL3})", "multiply-adds"),
        (f"Matmul(1x2147483647x2147483647x1, {GL3})", "2^47 bytes"),
        ("Zero(2147483647x65536, f32:GL:row)", "2^47 bytes"),
        ("Move(8388608x8388608, bf16:GL:row, f32:GL:row)", "2^47 bytes"),
    ],
)
def test_spec_text_rejects_oversized_kernels(text: str, match: str) -> None:
    with pytest.raises(SpecError, match=re.escape(match)):
        parse_spec(text)


def test_limits_themselves_are_accepted() -> None:
    parse_spec(f"Matmul(1x65536x65536x65536, {GL3})")  # exactly MAX_MATMUL_MACS
    parse_spec(f"Matmul(1x{MAX_DIM}x1x1, {GL3})")
    parse_spec("Zero(2147483647x16384, f32:GL:row)")  # 2^47 - 2^16 bytes
    assert MAX_MATMUL_MACS == 65536**3 and MAX_OPERAND_BYTES == 2**47


def test_matmul_spec_text_and_shorthand_reject() -> None:
    with pytest.raises(SpecError, match="over the limit of 2147483647"):
        matmul_spec_text(1, 10**5000, 1, 1)
    with pytest.raises(SpecError, match="multiply-adds"):
        matmul_spec_text(1, 10**6, 10**6, 10**6)
    with pytest.raises(SpecError, match="2^47 bytes".replace("^", r"\^")):
        matmul_spec_text(1, 1, 2**30, 2**16, dtype="bf16")
    matmul_spec_text(1, 1, 2**30, 2**15, dtype="bf16")  # 2^46 bytes of B: fine
    with pytest.raises(SpecError, match="over the limit of 2147483647"):
        expand_spec("matmul 1099511627776x1x1")
    with pytest.raises(SpecError, match="multiply-adds"):
        expand_spec("matmul 1000000x1000000x1000000 --dtype bf16")


def _kernel_table(shape: object) -> dict[str, object]:
    return {"tool": {"morello": {"kernel": [{"name": "big", "shape": shape}]}}}


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ([1000000, 1000000, 1000000], "multiply-adds"),
        ([9223372036854775807, 1, 1], "dimension 9223372036854775807 is over"),
        ([2**40, 1, 1], "over the limit of 2147483647"),
        ([10**5000, 1, 1], "dimension ~2^16609 is over"),
        ([1, 2147483647, 65536], "2^47 bytes"),
    ],
    ids=["1e6^3", "int64-max", "2^40-rows", "5000-digits", "512TiB"],
)
def test_declarations_reject_with_file_kernel_and_key(shape: list[int], match: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_kernel_table(shape), path=Path("pyproject.toml"))
    msg = str(info.value)
    assert msg.startswith('pyproject.toml: [tool.morello.kernel] "big": shape: '), msg
    assert match in msg and "docs/limits.md" in msg and "\n" not in msg and len(msg) < 400


def test_toml_number_too_long_to_read_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "morello.toml"
    p.write_text(f'target = "avx2"\n[[kernel]]\nname = "big"\nshape = [{"9" * 5000}, 1, 1]\n')
    with pytest.raises(ConfigError, match=r"morello.toml: line 4: a 5000-digit number"):
        load_config(p)


def _morello(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "morello_build", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        env={**os.environ, "MORELLO_NO_CACHE": "1"},
    )


def test_cli_rejects_at_parse_time_in_one_line(tmp_path: Path) -> None:
    """The shorthand, the text form and a declaration: one line, exit 2, nothing written,
    well before the synthesis that used to run for minutes."""
    (tmp_path / "morello.toml").write_text(
        '[[kernel]]\nname = "big"\nshape = [1000000, 1000000, 1000000]\n'
    )
    runs = [
        ("synth", "matmul", "99999999999x4x4"),
        ("synth", "matmul", "1000000x1000000x1000000"),
        ("synth", f"Matmul(1x{2**40}x1x1, {GL3})"),
        ("generate", "--config", "morello.toml", "--out-dir", "gen"),
    ]
    for args in runs:
        start = time.monotonic()
        r = _morello(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "docs/limits.md" in lines[0], (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == ""
        assert time.monotonic() - start < 30
    assert not (tmp_path / "gen").exists()


# --------------------------------------------------------------------------- verification


def test_verify_refuses_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    res = synthesize_kernel(matmul_spec_text(1, 4, 8, 8), name="small", target="x86-64")
    need = verify.verification_memory(res.kernel.abi)
    assert 0 < need < 2**20
    monkeypatch.setattr(verify, "memory_budget", lambda: need - 1)
    with pytest.raises(TooBigToVerify, match="small: not verified: checking it against numpy"):
        verify.verify_kernel(res.kernel)


def test_build_skips_verification_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "memory_budget", lambda: 1000)
    req = generate.KernelRequest(name="small", isas=("x86-64",), spec=matmul_spec_text(1, 4, 8, 8))
    out = generate.produce(req, verify=True, use_cache=False)
    assert "x86-64 not verified (checking it against numpy needs about" in out.summary
    assert "half of this machine's memory" in out.summary


def test_cli_verify_refuses_without_synthesizing() -> None:
    """2^44 elements of B need petabytes to check: refused at once, in one line."""
    start = time.monotonic()
    r = _morello("verify", "matmul", "1x1073741824x16384", "--target", "x86-64")
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "not verified: checking it against numpy needs about" in r.stderr
    assert time.monotonic() - start < 20
