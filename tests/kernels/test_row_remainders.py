"""The masked remainder of a row function, on inputs chosen to catch each way it can go wrong.

A row of 77 values is 4 vectors + 13 on AVX-512 and 9 vectors + 5 on AVX2: the last values go
through the vector code once more under a lane mask (docs/softmax.md, "Kernels"). The random
inputs of `verify` may not put a NaN or a row's maximum among those last values; these
tests do, and they read the rows that follow in memory, so a lane the mask should have
dropped shows up as a wrong value or a clobbered sentinel.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from morello_build.api import row_spec_text, synthesize_kernel
from morello_build.harness.arrays import bf16_bits_to_f32, f32_to_bf16_bits
from morello_build.harness.compile import find_compiler
from morello_build.harness.row_peers import ctypes_kernel
from morello_build.machine.isa import host_supports
from tests.support.compilers import COMPILERS, have_compiler

N = 77
ROWS = 3
#: The masked form per (isa, dtype): the intrinsic that must appear in the kernel's C.
MASKED = {
    ("avx2", "f32"): "_mm256_maskload_ps",
    ("avx512", "f32"): "_mm512_maskz_loadu_ps",
    ("avx512", "bf16"): "_mm256_maskz_loadu_epi16",
}
SENTINEL = 12345.0


def _run(op: str, isa: str, dtype: str, cc: str, x: np.ndarray, tmp_path: Path) -> np.ndarray:
    """Call the synthesized kernel on `x` ([ROWS, N] f32 values, exact in `dtype`); its output,
    after checking that nothing was written past the output's end."""
    if not host_supports(isa):
        pytest.skip(f"this host cannot run {isa} code")
    if not have_compiler(cc):
        pytest.skip(f"{cc} is not installed")
    k = synthesize_kernel(
        row_spec_text(op, ROWS, N, dtype=dtype), name="mb_tail", target=isa, use_cache=False
    ).kernel
    assert MASKED[isa, dtype] in k.c_source, "expected a masked remainder"
    stored = x if dtype == "f32" else f32_to_bf16_bits(x)
    out_shape = (ROWS,) if op in ("max", "sum") else (ROWS, N)
    size = int(np.prod(out_shape))
    backing = np.full(size + 32, SENTINEL, dtype=np.float32)
    out = backing[:size].reshape(out_shape)
    impl = ctypes_kernel(k, find_compiler(cc), tmp_path / cc, np.ascontiguousarray(stored), out)
    impl.run()
    assert (backing[size:] == SENTINEL).all(), "the kernel wrote past its output"
    return out.copy()


def _rows(rng: np.random.Generator, dtype: str) -> np.ndarray:
    x = rng.uniform(-8.0, 8.0, size=(ROWS, N)).astype(np.float32)
    return x if dtype == "f32" else bf16_bits_to_f32(f32_to_bf16_bits(x))


CASES = sorted(MASKED)


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize(("isa", "dtype"), CASES)
def test_max_sees_the_remainder_and_not_past_it(
    isa: str, dtype: str, cc: str, tmp_path: Path
) -> None:
    """All-negative rows whose largest value is the row's last: a remainder filled with 0
    (not -inf) or one that misses the last lane gives a wrong max. Row 1 has a NaN in its
    remainder, which must come out NaN; the rows after row 0 start with large values a lane
    past the mask would pick up."""
    x = -np.abs(_rows(np.random.default_rng(1), dtype)) - 1.0
    x[:, -1] = -0.5
    x[1, N - 3] = np.nan
    x[1:, 0] = 1000.0
    got = _run("max", isa, dtype, cc, x, tmp_path)
    assert got[0] == -0.5 and np.isnan(got[1]) and got[2] == 1000.0, got


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize(("isa", "dtype"), CASES)
def test_sum_counts_each_remainder_value_once(
    isa: str, dtype: str, cc: str, tmp_path: Path
) -> None:
    """Each row's sum, where the next row's first values are large (a lane past the mask
    would add them)."""
    x = _rows(np.random.default_rng(2), dtype)
    x[1:, :16] = 1024.0  # exact in bf16 too
    got = _run("sum", isa, dtype, cc, x, tmp_path)
    want = x.astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize(("isa", "dtype"), CASES)
@pytest.mark.parametrize("op", ["softmax", "gelu_erf", "relu"])
def test_row_outputs_end_at_the_row(op: str, isa: str, dtype: str, cc: str, tmp_path: Path) -> None:
    """Softmax and activations: every value of the remainder right, nothing written after
    the last row (a sentinel follows the output). Softmax's last row peaks in its
    remainder."""
    x = _rows(np.random.default_rng(3), dtype)
    x[-1, -1] = 30.0
    got = _run(op, isa, dtype, cc, x, tmp_path)
    v = x.astype(np.float64)
    if op == "softmax":
        e = np.exp(v - v.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    elif op == "relu":
        want = np.maximum(v, 0.0)
    else:
        want = 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0)))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
