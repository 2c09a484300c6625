"""Unit tests of the C emitter: address arithmetic, the ABI, hand-built trees, options."""

from __future__ import annotations

import random
import re
import shutil
import subprocess

import pytest

from morello_build.actions.tile import shrink
from morello_build.codegen.emit import K_UNROLL, CodegenError, generate_c, kernel_abi
from morello_build.codegen.views import (
    MEM,
    VRF,
    Addr,
    AddressMap,
    Affine,
    Buffer,
    View,
    coords,
)
from morello_build.harness.compile import CompileError
from morello_build.harness.verify import IsaUnavailable, VerifyResult, verify_kernel
from morello_build.impl.nodes import Alloc, Hole, Impl, Loop
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.spec import MATMUL, MOVE, LogicalSpec, canonical
from morello_build.ir.tensorspec import make_tensor
from morello_build.ir.text import parse_spec
from morello_build.machine.isa import ISA, host_supports
from morello_build.machine.target import get_target
from morello_build.schedule import Schedule
from tests.support.compilers import CLANG_MISSING, have_compiler
from tests.support.shared_search import synthesize_impl

_SYNTH: dict[tuple[str, LogicalSpec], Impl] = {}


def synth(ls: LogicalSpec, isa: str) -> Impl:
    """Synthesize once per session (the search is the slow part of these tests)."""
    key = (isa, ls)
    if key not in _SYNTH:
        _SYNTH[key] = synthesize_impl(ls, isa)
    return _SYNTH[key]


def check(impl: Impl, isa: str, compiler: str = "gcc") -> VerifyResult:
    g = generate_c(impl, "mb_test_kernel", isa)
    try:
        r = verify_kernel(g, compiler=compiler)
    except IsaUnavailable:
        pytest.skip(f"host cannot run {isa}")
    assert r.ok, r.details + "\n" + g.c_source
    return r


# --------------------------------------------------------------------------- addresses


def _eval(addr: Addr, values: dict[int, int]) -> int:
    """Evaluate an address the way C would (non-negative ints: / and % match // and %)."""
    text = addr.c().replace("/", "//")
    env = {f"i{v}": x for v, x in values.items()}
    return int(eval(text, {}, env))  # noqa: S307 - our own arithmetic expressions


LAYOUTS = ["row", "col", "[0,1,2,2p4]", "[0,2,1,2p4]", "[0,2,1,1p2]", "[0,1,2,2oe8]", "[0,2oe16,1]"]


@pytest.mark.parametrize("layout_text", LAYOUTS)
def test_addresses_match_buffer_offset(layout_text: str) -> None:
    """Every (offset, loop value, element) address equals `layout.buffer_offset`."""
    shape = (1, 8, 16)
    layout = lay.parse_layout(layout_text, shape)
    buf = Buffer("b", Dtype.F32, shape, layout, MEM)
    rng = random.Random(0)
    for _ in range(60):
        tile = (1, rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4, 8, 16]))
        steps = (1, shape[1] // tile[1], shape[2] // tile[2])
        amap = AddressMap()
        amap.extent = {0: steps[1], 1: steps[2]}
        offset = (
            Affine(0),
            Affine(0).plus_var(0, tile[1]),
            Affine(0).plus_var(1, tile[2]),
        )
        sub_shape = (1, rng.randint(1, tile[1]), rng.randint(1, tile[2]))
        view = View(buf, offset, sub_shape)
        for _ in range(4):
            values = {0: rng.randrange(steps[1]), 1: rng.randrange(steps[2])}
            for p in coords(sub_shape):
                addr = amap.loc(view, p).addr
                assert addr is not None
                q = (0, values[0] * tile[1] + p[1], values[1] * tile[2] + p[2])
                assert _eval(addr, values) == lay.buffer_offset(layout, shape, q), (
                    layout_text,
                    tile,
                    p,
                    addr.c(),
                )


def test_row_major_tiles_fold_to_affine() -> None:
    """Plain tiles need no division or modulo in the generated index."""
    shape = (1, 8, 16)
    buf = Buffer("b", Dtype.F32, shape, lay.row_major(shape), MEM)
    amap = AddressMap()
    amap.extent = {0: 4, 1: 2}
    view = View(buf, (Affine(0), Affine(0).plus_var(0, 2), Affine(0).plus_var(1, 8)), (1, 2, 8))
    addr = amap.loc(view, (0, 1, 3)).addr
    assert addr is not None and not addr.opaque
    assert addr.c() == "i0 * 32 + i1 * 8 + 19"


def test_vector_register_lanes() -> None:
    shape = (1, 2, 16)
    buf = Buffer("v", Dtype.F32, shape, lay.row_major(shape), VRF, 8)
    loc = AddressMap().loc(View.whole(buf), (0, 1, 11))
    assert (loc.index, loc.lane) == (3, 3)
    assert loc.ref() == "v_3[3]"


# --------------------------------------------------------------------------- ABI


def test_abi_orders_and_roles() -> None:
    ls = parse_spec("MatmulAccum(1x4x8x16, f32:GL:row, f32:GL:col, f32:GL:row, serial)")
    abi = kernel_abi(ls, "k", "avx2")
    assert [o.name for o in abi.operands] == ["lhs", "rhs", "out"]
    assert [o.order for o in abi.operands] == [(0, 1, 2), (0, 2, 1), (0, 1, 2)]
    assert [o.role for o in abi.operands] == ["in", "in", "inout"]
    assert abi.accumulate and abi.flops == 2 * 4 * 8 * 16
    move = kernel_abi(parse_spec("Move(5x7, f32:GL:row, f32:GL:col)"), "m", "x86-64")
    assert [(o.name, o.order, o.role) for o in move.operands] == [
        ("src", (0, 1), "in"),
        ("dst", (1, 0), "out"),
    ]


def test_packed_root_operand_is_rejected() -> None:
    ls = parse_spec("Move(8x32, f32:GL:row, f32:GL:[1,0,1p16])")
    with pytest.raises(CodegenError, match="packed"):
        kernel_abi(ls, "k", "avx512")


def test_hole_is_rejected() -> None:
    ls = parse_spec("Matmul(1x2x2x2, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    with pytest.raises(CodegenError, match="hole"):
        generate_c(Hole(ls), "k", "avx2")


def test_bad_name_is_rejected() -> None:
    ls = parse_spec("Zero(4x4, f32:GL:row)")
    with pytest.raises(CodegenError, match="identifier"):
        generate_c(synth(ls, "avx2"), "not-a-name", "avx2")


# --------------------------------------------------------------------------- output form

_MM8 = "Matmul(1x8x8x8, f32:GL:row, f32:GL:row, f32:GL:row, serial)"


def test_deterministic_and_annotated() -> None:
    impl = synth(parse_spec(_MM8), "avx512")
    a = generate_c(impl, "k", "avx512")
    b = generate_c(impl, "k", "avx512")
    assert a == b
    ann = generate_c(impl, "k", "avx512", annotate=True)
    assert f"/* {_MM8} */" in ann.c_source.split("{", 1)[1]
    assert ann.c_source.count("/* ") > a.c_source.count("/* ")


def test_header_contract() -> None:
    g = generate_c(synth(parse_spec(_MM8), "avx2"), "mm8", "avx2")
    assert g.header.startswith("#pragma once\n#ifndef MORELLO_KERNEL_mm8_H\n")
    assert "#include <stdint.h>" in g.header
    assert g.abi.prototype().replace(" *restrict ", " *MORELLO_RESTRICT ") + ";" in g.header
    assert 'extern "C"' in g.header  # usable from C++
    assert "out = lhs @ rhs" in g.header
    assert '#include "mm8.h"' in g.c_source
    assert "immintrin.h" not in g.c_source  # vector extensions only


def test_scalar_target_uses_no_vector_types() -> None:
    g = generate_c(synth(parse_spec(_MM8), "x86-64"), "k", "x86-64")
    assert "vector_size" not in g.c_source
    assert "immintrin" not in g.c_source


def test_vdpbf16ps_kernel() -> None:
    """bf16 dot products on AVX-512 use vdpbf16ps and accumulate (c +=)."""
    ls = parse_spec("Matmul(1x1x64x1, bf16:GL:row, bf16:GL:col, f32:GL:row, serial)")
    impl = synth(ls, "avx512")
    g = generate_c(impl, "k", "avx512")
    if "_mm512_dpbf16_ps" not in g.c_source:
        pytest.skip("search did not pick vdpbf16ps for this Spec")
    assert "#include <immintrin.h>" in g.c_source
    assert re.search(r"\+= _mm512_reduce_add_ps", g.c_source)
    check(impl, "avx512")


# --------------------------------------------------------------------------- hand-built trees


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_parallel_loop_uses_openmp(compiler: str) -> None:
    """A parallel tile loop becomes `#pragma omp parallel for` and still verifies."""
    ls = parse_spec("Matmul(1x8x8x16, f32:GL:row, f32:GL:row, f32:GL:row)")
    body_spec = shrink(ls, (1, 4, 8, 8), True, get_target("avx2"))
    assert body_spec is not None
    body = synth(body_spec, "avx2")
    loop = Loop(ls, (body,), (1, 4, 8, 8), True, ())
    g = generate_c(loop, "k", "avx2")
    assert "#pragma omp parallel for collapse(2)" in g.c_source
    # The body is its own function taking the kernel's restrict pointers (see Ctx.outline).
    assert re.search(
        r"static void k_par0\(const float \*restrict lhs, const float \*restrict rhs, "
        r"float \*restrict out, int i\d+, int i\d+\) \{",
        g.c_source,
    ), g.c_source
    assert re.search(r"collapse\(2\)\n.*\n.*\n +k_par0\(lhs, rhs, out, i\d+, i\d+\);", g.c_source)
    _check_openmp(loop, compiler)


def _check_openmp(impl: Impl, compiler: str) -> None:
    try:
        check(impl, "avx2", compiler)
    except CompileError as e:
        if "omp" in e.stderr and "cannot find" in e.stderr:
            pytest.skip(f"{compiler} has no OpenMP runtime on this host")
        raise


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_parallel_loops_inside_a_serial_loop_share_a_buffer(compiler: str) -> None:
    """B packed once per k block by both threads (a parallel loop over its rows), then a
    parallel loop over C's rows reading it: the outlined bodies take the enclosing k loop's
    variable and the shared buffer as parameters, and the kernel stays exact."""
    ls = parse_spec("Matmul(1x16x256x64, f32:GL:row, f32:GL:row, f32:GL:row)")
    s = Schedule.for_spec(ls, get_target("avx2", 2)).to_accum().split(128)
    s = s.move(1, "GL", layout="[2,1,2p16]")
    s = s.at([1, 0], lambda pack: pack.tile_out(1, 64, 64, parallel=True))
    impl = s.tile_out(1, 8, 64, parallel=True).synthesize_rest().impl
    g = generate_c(impl, "k", "avx2")
    assert g.c_source.count("#pragma omp parallel for") == 2, g.c_source  # pack, compute
    pack = re.search(r"static void k_par0\(([^)]*)\)", g.c_source)
    compute = re.search(r"static void k_par1\(([^)]*)\)", g.c_source)
    assert pack and compute, g.c_source
    assert re.fullmatch(
        r"const float \*restrict rhs, int i(\d+), float \*restrict buf\d+, int i\d+", pack[1]
    )
    assert re.search(r"float \*restrict buf\d+", compute[1]) and "lhs" in compute[1]
    _check_openmp(impl, compiler)


def test_packed_scratch_buffer() -> None:
    """Packing rhs into panels of 4 columns (a GL scratch buffer) and computing from it."""
    ls = parse_spec("Matmul(1x8x8x16, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    rhs = ls.operands[1]
    layout = lay.packed((0, 1, 2), 2, 4, rhs.shape)
    packed = make_tensor(rhs.shape, rhs.dtype, Level.GL, layout, None)
    assert packed is not None
    pro_spec = canonical(MOVE, False, rhs.shape, (rhs, packed), True)
    body_spec = canonical(MATMUL, False, ls.shape, (ls.operands[0], packed, ls.operands[2]), True)
    for isa in ("avx2", "x86-64"):
        tree = Alloc(
            ls, (synth(pro_spec, isa), synth(body_spec, isa)), 1, packed, False, True, False
        )
        g = generate_c(tree, "k", isa)
        assert re.search(r"float buf\d+\[\d+\] __attribute__\(\(aligned\(64\)\)\);", g.c_source)
        check(tree, isa)


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_heap_workspace_is_taken_once_per_call_or_thread(threads: int) -> None:
    """A packed B block too big for the stack, inside the k loop: taken once, before any
    loop of the function (serial) or of the parallel loop's body, parked once at the end,
    and the kernel stays exact. (Allocated per k block, a buffer big enough to be served by
    mmap was mapped, faulted in and unmapped again on every iteration.)"""
    serial = ", serial" if threads == 1 else ""
    ls = parse_spec(f"Matmul(1x16x256x64, f32:GL:row, f32:GL:row, f32:GL:row{serial})")
    s = Schedule.for_spec(ls, get_target("avx2"))
    if threads > 1:
        s = s.tile_out(1, 8, 64, parallel=True)
    s = s.to_accum().at(1, lambda h: h.split(128).move(1, "GL", layout="[2,1,2p16]"))
    impl = s.synthesize_rest().impl
    g = generate_c(impl, "k", "avx2")
    # The thread's code: the kernel (serial) or the outlined parallel-loop body.
    fn = "void k(" if threads == 1 else "static void k_par0("
    lines = g.c_source.split(fn, 1)[1].split("\n}\n", 1)[0].splitlines()
    take = [i for i, x in enumerate(lines) if "mb_ws_take(" in x]
    park = [i for i, x in enumerate(lines) if x.strip().startswith("mb_ws_park(")]
    loops = [i for i, x in enumerate(lines) if x.strip().startswith("for (")]
    assert len(take) == 1 and len(park) == 1, g.c_source
    assert g.c_source.count("= (float *)mb_ws_take(") == 1, g.c_source
    assert all(i > take[0] for i in loops) and park[0] > loops[-1], g.c_source
    assert g.abi.workspace_bytes == 128 * 64 * 4
    check(impl, "avx2")


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_header_compiles_and_links_from_cpp(tmp_path) -> None:
    g = generate_c(synth(parse_spec(_MM8), "avx2"), "mm8", "avx2")
    (tmp_path / "mm8.h").write_text(g.header)
    (tmp_path / "mm8.c").write_text(g.c_source)
    (tmp_path / "main.cpp").write_text(
        '#include "mm8.h"\n'
        "int main() { float a[64], b[64], c[64];\n"
        "  for (int i = 0; i < 64; i++) { a[i] = 1.0f; b[i] = 2.0f; }\n"
        "  mm8(a, b, c); return c[0] == 16.0f && c[63] == 16.0f ? 0 : 1; }\n"
    )
    subprocess.run(["gcc", "-O2", "-mavx2", "-mfma", "-c", "mm8.c"], cwd=tmp_path, check=True)
    subprocess.run(
        ["g++", "-Wall", "-Wextra", "-Werror", "main.cpp", "mm8.o", "-o", "main"],
        cwd=tmp_path,
        check=True,
    )
    if host_supports("avx2"):
        assert subprocess.run([str(tmp_path / "main")]).returncode == 0


# --------------------------------------------------------------------------- code shape


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("k", [16, 18, 3])
def test_register_tile_reduction_loops_are_unrolled_by_four_and_still_correct(
    isa: str, k: int
) -> None:
    """The k loop around a register tile's FMAs is unrolled K_UNROLL times: by the
    compiler (`#pragma GCC unroll`) with 16 vector registers, written out in C with 32
    when K_UNROLL divides the trip count (else it stays rolled: written out with a
    leftover step it ran slower). Either way the result stays exact. (On AVX-512 B is 64
    wide so that the tile loads it a row per k step: 16 rows of a 16-wide B fit the
    registers whole, and the DP then keeps them there with no k loop at all.)"""
    m, n = (16, 16) if isa == "avx2" else (12, 64)
    ls = parse_spec(f"Matmul(1x{m}x{k}x{n}, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    impl = synth(ls, isa)
    lines = generate_c(impl, "k", isa).c_source.splitlines()
    loop = re.compile(r"\s*for \(int i\d+ = 0; i\d+ < (\d+); i\d+\+\+\) \{")
    trips = {i: int(m.group(1)) for i, x in enumerate(lines) if (m := loop.fullmatch(x))}
    pragmas = {i + 1 for i, x in enumerate(lines) if x.strip() == f"#pragma GCC unroll {K_UNROLL}"}
    k_loops = [i for i, n in trips.items() if n == k]
    if ISA[isa].vector_registers < 32:
        assert set(k_loops) <= pragmas, "\n".join(lines)
        assert k_loops or k < K_UNROLL, "\n".join(lines)
    elif k % K_UNROLL:
        assert not pragmas and (k_loops or k < K_UNROLL), "\n".join(lines)  # stays rolled
    else:
        assert not pragmas and not k_loops, "\n".join(lines)  # no rolled k loop is left
        assert k // K_UNROLL in trips.values(), "\n".join(lines)
    check(impl, isa)
    if not have_compiler("clang"):
        pytest.skip(f"verified with gcc only: {CLANG_MISSING}")
    check(impl, isa, "clang")


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_kernel_entry_is_cache_line_aligned(compiler: str, tmp_path) -> None:
    """The exported function starts on a 64-byte boundary whatever the build's flags."""
    if shutil.which(compiler) is None:
        pytest.skip(f"no {compiler}")
    g = generate_c(synth(parse_spec(_MM8), "x86-64"), "mb_aligned", "x86-64")
    (tmp_path / "mb_aligned.h").write_text(g.header)
    (tmp_path / "mb_aligned.c").write_text(g.c_source)
    # A 1-byte function placed first would put the kernel at offset 16 without the attribute.
    (tmp_path / "pad.c").write_text("void mb_pad(void);\nvoid mb_pad(void) {}\n")
    lib = tmp_path / "libk.so"
    subprocess.run(
        [
            compiler,
            "-O2",
            "-shared",
            "-fPIC",
            "-falign-functions=1",
            "-o",
            str(lib),
            str(tmp_path / "pad.c"),
            str(tmp_path / "mb_aligned.c"),
        ],
        check=True,
        capture_output=True,
    )
    import ctypes

    fn = ctypes.CDLL(str(lib)).mb_aligned
    address = ctypes.cast(fn, ctypes.c_void_p).value
    assert address is not None and address % 64 == 0, hex(address or 0)
