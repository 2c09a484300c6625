"""End to end: synthesize, emit C, compile with gcc and clang, run, compare with numpy.

Each (target, Spec) is synthesized and emitted once per session; both compilers then
build and verify the same C. AVX-512 cases skip when the host cannot execute them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path

import pytest

from morello_build.codegen.abi import GeneratedKernel
from morello_build.codegen.emit import generate_c
from morello_build.harness.verify import IsaUnavailable, verify_kernel
from morello_build.impl.nodes import Impl
from morello_build.ir.text import parse_spec
from tests.support.shared_search import synthesize_impl

R, C = "f32:GL:row", "f32:GL:col"
B = "bf16:GL:row"


def mm(shape: str, lhs: str = R, rhs: str = R, out: str = R, accum: bool = False) -> str:
    name = "MatmulAccum" if accum else "Matmul"
    return f"{name}({shape}, {lhs}, {rhs}, {out}, serial)"


_VECTOR = [
    mm("1x1x1x1"),
    mm("1x3x5x7"),
    mm("1x10x10x10"),
    mm("1x16x16x16"),
    mm("1x1x32x16"),
    mm("2x4x4x4"),
    mm("1x8x8x8", rhs=C),
    mm("1x3x5x7", rhs=C),
    mm("1x1x64x1", rhs=C),
    mm("1x8x8x8", accum=True),
    mm("1x3x5x7", C, C, C, accum=True),
    mm("1x1x64x32", B, B),
    mm("1x4x32x1", B, "bf16:GL:col"),
    "Zero(8x8, f32:GL:row)",
    "Zero(5x7, f32:GL:col)",
    "Move(8x8, f32:GL:row, f32:GL:col)",
    "Move(5x7, f32:GL:row, f32:GL:col)",
    "Move(8x16, bf16:GL:row, f32:GL:row)",
]
_SCALAR = [
    mm("1x1x1x1"),
    mm("1x3x5x7"),
    mm("1x8x8x8", rhs=C),
    mm("1x10x10x10", accum=True),
    mm("1x1x16x8", B, B),
    "Zero(5x7, f32:GL:row)",
    "Move(5x7, f32:GL:row, f32:GL:col)",
]

CASES: list[tuple[str, str]] = (
    [("avx512", s) for s in _VECTOR]
    + [("avx512", mm("1x32x32x32"))]
    + [("avx2", s) for s in _VECTOR]
    + [("avx2", mm("1x32x32x32", rhs=C))]
    + [("x86-64", s) for s in _SCALAR]
)
SLOW_CASES: list[tuple[str, str]] = [
    ("avx512", mm("1x64x64x64")),
    ("avx512", mm("1x100x37x250")),
    ("avx512", mm("1x1x2048x1024")),
    ("avx512", mm("1x1x2048x1024", B, B)),
    ("avx512", "Matmul(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row)"),
    ("avx2", mm("1x64x64x64")),
]

_IMPLS: dict[tuple[str, str], Impl] = {}
_KERNELS: dict[tuple[str, str], GeneratedKernel] = {}


def _name(spec_text: str) -> str:
    return "mb_" + "".join(ch if ch.isalnum() else "_" for ch in spec_text.split("(")[0]).lower()


def synthesize(isa: str, spec_text: str) -> Impl:
    key = (isa, spec_text)
    if key not in _IMPLS:
        _IMPLS[key] = synthesize_impl(parse_spec(spec_text), isa)
    return _IMPLS[key]


def kernel(isa: str, spec_text: str) -> GeneratedKernel:
    key = (isa, spec_text)
    if key not in _KERNELS:
        _KERNELS[key] = generate_c(synthesize(isa, spec_text), _name(spec_text), isa)
    return _KERNELS[key]


def _run(isa: str, spec_text: str, compiler: str) -> None:
    g = kernel(isa, spec_text)
    try:
        r = verify_kernel(g, compiler=compiler)
    except IsaUnavailable:
        pytest.skip(f"host cannot execute {isa}")
    assert r.ok, f"{spec_text} on {isa} with {compiler}: {r.details}\n{g.c_source}"


def _id(case: tuple[str, str]) -> str:
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_battery(case: tuple[str, str], compiler: str) -> None:
    _run(*case, compiler)


@pytest.mark.slow
@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize("case", SLOW_CASES, ids=_id)
def test_battery_slow(case: tuple[str, str], compiler: str) -> None:
    g = kernel(*case)
    if "#pragma omp" in g.c_source and compiler == "clang":
        pytest.skip("clang's OpenMP runtime may be missing; gcc covers this case")
    _run(*case, compiler)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_deterministic(case: tuple[str, str]) -> None:
    """The same tree always gives byte-identical files."""
    impl = synthesize(*case)
    a = generate_c(impl, "k", case[0], annotate=True)
    b = generate_c(impl, "k", case[0], annotate=True)
    assert a.c_source == b.c_source and a.header == b.header


GOLDEN = Path(__file__).with_name("c_golden.json")


@functools.cache
def _golden() -> dict[str, str]:
    return json.loads(GOLDEN.read_text())


def digest(g: GeneratedKernel) -> str:
    return hashlib.sha256((g.c_source + "\0" + g.header).encode()).hexdigest()[:20]


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_same_c_as_recorded(case: tuple[str, str]) -> None:
    """The battery's C is what `c_golden.json` recorded: a refactoring or a faster search
    must not change a byte. A deliberate change to the code generator or the cost model
    rewrites the file: `python -m tests.kernels.test_codegen_battery --write-golden`."""
    recorded = _golden()
    assert digest(kernel(*case)) == recorded.get(_id(case)), (
        f"generated C of {_id(case)} differs from {GOLDEN.name}; if intended, rewrite it "
        "with `python -m tests.kernels.test_codegen_battery --write-golden`"
    )


def test_battery_size() -> None:
    assert len(CASES) >= 40


if __name__ == "__main__" and sys.argv[1:] == ["--write-golden"]:
    digests = {_id(case): digest(kernel(*case)) for case in CASES}
    GOLDEN.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"{GOLDEN}: {len(digests)} digests")
