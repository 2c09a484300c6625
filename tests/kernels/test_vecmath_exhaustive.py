"""Every f32 bit pattern through the vector math helpers at 8 and 16 lanes (slow).

The sample in test_vecmath.py covers 2^22 patterns; this runs all 2^32 (or every STRIDE-th
where noted) against double-precision libm, on two OpenMP threads, and prints one line per
function and width, e.g. `exp: max 0.83 ulp at x=0x1.7926c4p+2 (8 lanes)`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from morello_build.kernels import vecmath
from tests.kernels.test_vecmath import MAX_ULP, build_and_run, check_rows, driver_source

#: Patterns per function: 1 = all 2^32. Every function runs exhaustively here.
STRIDE: dict[str, int] = {"exp": 1, "expm": 1, "tanh": 1, "erf": 1}
WIDTHS = (8, 16)


@pytest.mark.slow
@pytest.mark.parametrize("fn", vecmath.FUNCTIONS)
def test_vecmath_every_f32_within_2ulp(
    fn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "2"))
    src = driver_source((fn,), WIDTHS, sample=False, stride=STRIDE[fn])
    rows, out = build_and_run(tmp_path, "gcc", src, timeout=600)
    which = "all 2^32 patterns" if STRIDE[fn] == 1 else f"every {STRIDE[fn]}th pattern"
    for row in rows:
        print(f"{row.fn}: max {row.max_ulp:.2f} ulp at x={row.at} ({row.lanes} lanes, {which})")
        print(f"{row.fn}: NaN mismatches {row.nan_bad} ({row.lanes} lanes)")
    check_rows(rows, out, (fn,), len(WIDTHS))
    assert all(row.max_ulp <= MAX_ULP for row in rows)
