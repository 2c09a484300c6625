"""verify_kernel on hand-written C kernels: right ones pass with gcc and clang, wrong ones fail."""

from __future__ import annotations

import math
import shutil

import ml_dtypes
import numpy as np
import pytest

import morello_build.harness.arrays as arrays_mod
import morello_build.harness.verify as verify_mod
from morello_build.codegen.abi import GeneratedKernel, KernelABI, OperandABI
from morello_build.errors import MorelloError
from morello_build.harness.arrays import (
    bf16_bits_to_f32,
    f32_to_bf16_bits,
    from_physical,
    to_physical,
)
from morello_build.harness.compile import CompileError
from morello_build.harness.verify import IsaUnavailable, verify_kernel
from tests.support.handwritten import header, matmul_kernel, move_kernel, zero_kernel

COMPILERS = [c for c in ("gcc", "clang") if shutil.which(c)]


def test_bf16_round_trip_matches_ml_dtypes() -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [
            rng.standard_normal(4096).astype(np.float32) * 1e3,
            np.array([0.0, -0.0, np.inf, -np.inf, 1.0 + 2**-8, 1.0 + 3 * 2**-8], np.float32),
            np.array([1.0 + 2**-8 + 2**-20], np.float32),
        ]
    )
    mine = f32_to_bf16_bits(x)
    theirs = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_array_equal(
        bf16_bits_to_f32(mine), theirs.view(ml_dtypes.bfloat16).astype(np.float32)
    )
    assert np.isnan(bf16_bits_to_f32(f32_to_bf16_bits(np.array([np.nan], np.float32))))[0]


def _lowest_bit_reference(values: np.ndarray) -> int | None:
    """Per element with math.frexp: the exponent of each nonzero value's lowest set bit."""
    lows = []
    for v in values.astype(np.float64).ravel().tolist():
        if v == 0.0:
            continue
        mant, exp = math.frexp(abs(v))  # abs(v) = mant * 2^exp, mant in [0.5, 1)
        digits = int(mant * 2.0**53)  # exact: float64 has 53 significand bits
        lows.append(exp - 53 + (digits & -digits).bit_length() - 1)
    return min(lows) if lows else None


def test_lowest_bit_exponent_of_f32_and_bf16_storage() -> None:
    rng = np.random.default_rng(7)
    tiny = np.float32(2.0**-149)
    cases = [
        rng.standard_normal(513).astype(np.float32) * 1e3,
        np.array([0.0, -0.0, 3.0, -6.0, 0.75], np.float32),
        np.array([tiny, 1e-40, -3 * tiny], np.float32),  # subnormals
        np.array([2.0**100, -(2.0**-126)], np.float32),
        (rng.integers(1, 257, 64) * 2.0**-7).astype(np.float32),  # the exact run's lhs
    ]
    for x in cases:
        assert arrays_mod._lowest_bit_exponent("f32", x) == _lowest_bit_reference(x)
        bits = f32_to_bf16_bits(x)
        assert arrays_mod._lowest_bit_exponent("bf16", bits) == _lowest_bit_reference(
            bf16_bits_to_f32(bits)
        )
    assert arrays_mod._lowest_bit_exponent("f32", np.zeros(3, np.float32)) is None
    for bad in (np.inf, -np.inf, np.nan):
        with pytest.raises(ValueError):
            arrays_mod._lowest_bit_exponent("f32", np.array([1.0, bad], np.float32))


def test_physical_layout_round_trip() -> None:
    x = np.arange(24).reshape(2, 3, 4)
    phys = to_physical(x, (0, 2, 1))
    assert phys.shape == (2, 4, 3) and phys.flags.c_contiguous
    assert phys[1, 3, 2] == x[1, 2, 3]
    np.testing.assert_array_equal(from_physical(phys, (0, 2, 1)), x)


# ----------------------------------------------------------------------------- accepted


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize(
    "kernel",
    [
        matmul_kernel("mm_row", 1, 7, 13, 9),
        matmul_kernel("mm_colrhs", 2, 5, 16, 11, rhs_order=(0, 2, 1)),
        matmul_kernel("mm_acc", 1, 8, 33, 6, accumulate=True),
        matmul_kernel("mm_colall", 3, 4, 5, 6, lhs_order=(2, 0, 1), out_order=(0, 2, 1)),
        matmul_kernel("mm_bf16", 1, 6, 64, 10, in_dtype="bf16"),
        matmul_kernel("mm_u8s8", 1, 5, 300, 7, in_dtype="u8", out_dtype="s32", accumulate=True),
        zero_kernel(),
        move_kernel(),
    ],
    ids=lambda k: k.abi.name,
)
def test_correct_kernels_pass(kernel: GeneratedKernel, cc: str) -> None:
    res = verify_kernel(kernel, compiler=cc)
    assert res.ok, res.details
    assert res.compiler == cc
    assert res.max_rel_err <= res.tolerance
    if kernel.abi.op != "matmul":
        assert res.tolerance == 0.0 and res.max_abs_err == 0.0


def test_large_k_bound_is_not_too_tight() -> None:
    # Sequential f32 summation over K=2048 must fit the bound for several seeds.
    k = matmul_kernel("mm_bigk", 1, 4, 2048, 4, accumulate=True)
    for seed in range(3):
        assert verify_kernel(k, seed=seed).ok


# ----------------------------------------------------------------------------- rejected


@pytest.mark.parametrize(
    "kernel",
    [
        matmul_kernel("bad_k", 1, 7, 13, 9, bug="k_off_by_one"),
        matmul_kernel("bad_overwrite", 1, 8, 33, 6, accumulate=True, bug="overwrite"),
        matmul_kernel("bad_bf16", 1, 6, 64, 10, in_dtype="bf16", bug="swap_bf16"),
        matmul_kernel("bad_unwritten", 2, 5, 16, 11, bug="skip_last"),
        matmul_kernel("bad_int", 1, 5, 30, 7, in_dtype="u8", out_dtype="s32", bug="k_off_by_one"),
        matmul_kernel("bad_layout", 1, 8, 8, 8),  # row-major code, col-major ABI below
        zero_kernel("bad_zero", bug="skip_last"),
        move_kernel("bad_move", bug="swap_bf16"),
    ],
    ids=lambda k: k.abi.name,
)
def test_wrong_kernels_fail(kernel: GeneratedKernel) -> None:
    if kernel.abi.name == "bad_layout":
        lhs, rhs, out = kernel.abi.operands
        rhs = OperandABI(rhs.name, rhs.shape, rhs.dtype, (0, 2, 1), rhs.role)
        kernel = GeneratedKernel(
            KernelABI(
                kernel.abi.name, "matmul", (lhs, rhs, out), False, "x86-64", kernel.abi.flops
            ),
            kernel.c_source,
            kernel.header,
            kernel.spec_text,
        )
    res = verify_kernel(kernel)
    assert not res.ok
    assert "wrong" in res.details or "outside" in res.details


def test_unwritten_element_is_reported() -> None:
    res = verify_kernel(matmul_kernel("bad_unwritten2", 1, 3, 4, 5, bug="skip_last"))
    assert not res.ok and "(2, 4)" in res.details.replace("0, 2, 4", "2, 4")


def test_out_of_bounds_write_is_caught() -> None:
    k = zero_kernel("oob_zero")
    k = GeneratedKernel(k.abi, k.c_source.replace("i < 35", "i < 36"), k.header, k.spec_text)
    res = verify_kernel(k)
    assert not res.ok and "outside" in res.details


def test_isa_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_mod, "host_supports", lambda isa: False)
    with pytest.raises(IsaUnavailable) as info:
        verify_kernel(zero_kernel("isa_zero"))
    assert info.value.isa == "x86-64"
    assert isinstance(info.value, MorelloError)


def test_compile_error_carries_stderr() -> None:
    k = zero_kernel("broken")
    k = GeneratedKernel(k.abi, k.c_source.replace("0.0f;", "0.0f"), k.header, k.spec_text)
    with pytest.raises(CompileError) as info:
        verify_kernel(k)
    assert "error" in info.value.stderr
    assert "broken.c" in str(info.value)


def test_warnings_are_errors() -> None:
    k = zero_kernel("warns")
    k = GeneratedKernel(
        k.abi, k.c_source.replace("{\n", "{\n    int unused;\n", 1), k.header, k.spec_text
    )
    with pytest.raises(CompileError):
        verify_kernel(k)


# ----------------------------------------------------------------------------- isolation


def _with_source(k: GeneratedKernel, src: str) -> GeneratedKernel:
    return GeneratedKernel(k.abi, src, k.header, k.spec_text)


def test_crashing_kernel_fails_instead_of_killing_the_caller() -> None:
    k = zero_kernel("crash_zero")
    src = k.c_source.replace("out[i] = 0.0f;", "out[i - (1L << 40)] = 0.0f;")
    res = verify_kernel(_with_source(k, src))
    assert not res.ok and "SIGSEGV" in res.details


def test_hanging_kernel_is_killed() -> None:
    k = zero_kernel("hang_zero")
    src = k.c_source.replace("out[i] = 0.0f;", "{ out[i] = 0.0f; while (out[0] == 0.0f) {} }")
    src = src.replace("float *restrict out", "volatile float *restrict out")
    hdr = k.header.replace("float *restrict out", "volatile float *restrict out")
    res = verify_kernel(GeneratedKernel(k.abi, src, hdr, k.spec_text), timeout=0.5)
    assert not res.ok and "did not return" in res.details


def test_missing_symbol_and_in_process_mode() -> None:
    k = zero_kernel("named_zero")
    assert verify_kernel(k, isolate=False).ok
    src = k.c_source.replace("void named_zero(", "void other_zero(").replace(
        '#include "named_zero.h"', ""
    )
    for isolate in (True, False):
        res = verify_kernel(_with_source(k, src), isolate=isolate)
        assert not res.ok and "not exported" in res.details


# ----------------------------------------------------------------------------- AVX-512


def _dpbf16_kernel(name: str, k: int, n: int) -> GeneratedKernel:
    """bf16 [1,1,k] x bf16 [1,k,n] (column-major) -> f32 via vdpbf16ps (flushes denormals)."""
    lhs = OperandABI("lhs", (1, 1, k), "bf16", (0, 1, 2), "in")
    rhs = OperandABI("rhs", (1, k, n), "bf16", (0, 2, 1), "in")
    out = OperandABI("out", (1, 1, n), "f32", (0, 1, 2), "inout")
    abi = KernelABI(name, "matmul", (lhs, rhs, out), True, "avx512", 2 * k * n)
    src = f"""#include "{name}.h"
#include <immintrin.h>
{abi.prototype()} {{
    for (int j = 0; j < {n}; j++) {{
        __m512 acc = _mm512_setzero_ps();
        for (int p = 0; p < {k}; p += 32) {{
            __m512i a = _mm512_loadu_si512((const void *)(lhs + p));
            __m512i b = _mm512_loadu_si512((const void *)(rhs + j * {k} + p));
            acc = _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
        }}
        out[j] += _mm512_reduce_add_ps(acc);
    }}
}}
"""
    return GeneratedKernel(abi, src, header(abi), "Matmul bf16 avx512")


@pytest.mark.avx512
@pytest.mark.parametrize("cc", COMPILERS)
def test_avx512_dpbf16_kernel(cc: str) -> None:
    kernel = _dpbf16_kernel("dp_bf16", 256, 8)
    if not verify_mod.host_supports("avx512"):
        with pytest.raises(IsaUnavailable):
            verify_kernel(kernel, compiler=cc)
        return
    res = verify_kernel(kernel, compiler=cc)
    assert res.ok, res.details


def test_openmp_kernel_gets_fopenmp() -> None:
    k = matmul_kernel("mm_omp", 4, 8, 16, 8)
    src = k.c_source.replace(
        "    for (int bb = 0;", "#pragma omp parallel for\n    for (int bb = 0;", 1
    )
    omp = _with_source(k, src)
    assert verify_mod.kernel_compile_flags(omp)[-1] == "-fopenmp"
    res = verify_kernel(omp, compiler="gcc")  # clang needs libomp, which may be absent
    assert res.ok, res.details


def test_error_is_reported_in_the_units_it_was_checked_in() -> None:
    """A matmul's error is relative to |A||B|; a row operation's is a share of its own
    bound, which must not read as a 20% relative error."""
    from morello_build.api import matmul_spec_text, row_spec_text, synthesize_kernel
    from morello_build.integration.generate import _verify_summary

    def kernel(text: str, name: str) -> GeneratedKernel:
        return synthesize_kernel(text, name=name, target="x86-64", use_cache=False).kernel

    mm = kernel(matmul_spec_text(1, 4, 8, 8), "mm")
    sm = kernel(row_spec_text("softmax", 4, 64), "sm")
    r_mm, r_sm = verify_kernel(mm), verify_kernel(sm)
    assert r_mm.ok and r_sm.ok
    assert not r_mm.of_bound and r_mm.error_text().startswith("max rel err ")
    assert r_sm.of_bound and r_sm.error_text().endswith("% of its bound")
    assert 0.0 < r_sm.max_rel_err <= 1.0
    summary = _verify_summary(
        [("x86-64", r_sm), ("avx512 not verified (not supported here)", None)]
    )
    assert summary == (
        f"; verified x86-64 (worst error {r_sm.max_rel_err:.0%} of its bound)"
        "; avx512 not verified (not supported here)"
    )
