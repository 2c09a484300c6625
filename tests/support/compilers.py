"""Which C compilers the tests can use on this host."""

from __future__ import annotations

import functools
import shutil

import pytest

from morello_build.codegen.abi import GeneratedKernel
from morello_build.harness.verify import IsaUnavailable, verify_kernel

COMPILERS = ("gcc", "clang")
CLANG_MISSING = "clang is not installed (`.ci/run` installs it; or `apt install clang`)"


@functools.cache
def have_compiler(cc: str) -> bool:
    return shutil.which(cc) is not None


def verify_with_each_compiler(kernel: GeneratedKernel, what: str = "") -> None:
    """Verify `kernel` with gcc and clang; skip (with the reason) when the host cannot run
    its ISA, or after gcc passed when clang is missing, so the gap shows in `-rs`."""
    for cc in COMPILERS:
        if not have_compiler(cc):
            pytest.skip(f"verified with gcc only: {CLANG_MISSING}")
        try:
            r = verify_kernel(kernel, compiler=cc)
        except IsaUnavailable as exc:
            pytest.skip(str(exc))
        assert r.ok, f"{what} ({cc}): {r.details}"
