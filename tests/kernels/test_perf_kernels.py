"""Kernels added for speed: applicability, cost, search choices and verified C.

Speed itself is never asserted here (see benchmarks/); these tests pin down that the fast
kernels apply where intended, cost what the model says, are chosen by the search for the
shapes they exist for, and compute the right answer (compiled with gcc and clang, run,
compared with numpy).
"""

from __future__ import annotations

import functools
import re

import pytest

from morello_build.actions.enumerate import enumerate_actions
from morello_build.actions.move import Move
from morello_build.actions.select import takes
from morello_build.codegen.emit import generate_c
from morello_build.harness.verify import IsaUnavailable, verify_kernel
from morello_build.impl.nodes import Alloc, Block, Impl, Kernel, Loop
from morello_build.impl.printer import iter_nodes
from morello_build.ir.levels import Level
from morello_build.ir.text import parse_spec
from morello_build.kernels.matvec_stream import (
    STREAM_LINE_COST,
    STREAM_PREFETCH_AHEAD,
    STREAM_RUN_COST,
)
from morello_build.kernels.registry import KERNELS_BY_NAME
from morello_build.machine.target import get_target
from tests.support.shared_search import synthesize_impl

ROWS_F32 = KERNELS_BY_NAME["VecMatRowsF32"]
ROWS_BF16 = KERNELS_BY_NAME["VecMatRowsBf16F32"]


def _kernels(impl: Impl) -> list[str]:
    return [n.name for n in iter_nodes(impl) if isinstance(n, Kernel)]


def _synth(text: str, isa: str) -> Impl:
    return synthesize_impl(parse_spec(text), isa)


def _verify(impl: Impl, isa: str, compiler: str) -> None:
    g = generate_c(impl, "mb_perf_kernel", isa)
    try:
        r = verify_kernel(g, compiler=compiler)
    except IsaUnavailable:
        pytest.skip(f"host cannot run {isa}")
    assert r.ok, r.details + "\n" + g.c_source


# --------------------------------------------------------------------------- VecMatRows


def test_rows_take_row_major_rows_in_memory() -> None:
    t = get_target("avx512")
    ok = parse_spec("MatmulAccum(1x1x8x64, f32:GL:row, f32:GL:[1,2]c1, f32:L1:row)")
    assert takes(ROWS_F32, ok, t)
    assert takes(ROWS_F32, ok, get_target("avx2"))
    assert not takes(ROWS_F32, ok, get_target("x86-64"))  # no vectors
    for bad in (
        "MatmulAccum(1x2x8x64, f32:GL:row, f32:GL:row, f32:L1:row)",  # m > 1
        "MatmulAccum(1x1x16x64, f32:GL:row, f32:GL:row, f32:L1:row)",  # too many rows
        "MatmulAccum(1x1x8x24, f32:GL:row, f32:GL:row, f32:L1:row)",  # n not whole vectors
        "MatmulAccum(1x1x8x64, f32:GL:row, f32:GL:col, f32:L1:row)",  # rows not contiguous
        "MatmulAccum(1x1x8x64, f32:GL:row, f32:L1:row, f32:L1:row)",  # B not streamed
        "MatmulAccum(1x1x8x64, f32:GL:row, f32:GL:row, f32:GL:row)",  # out not in L1
        "Matmul(1x1x8x64, f32:GL:row, f32:GL:row, f32:L1:row)",  # not accumulating
        "MatmulAccum(1x1x8x64, bf16:GL:row, bf16:GL:row, f32:L1:row)",  # bf16 variant's
    ):
        assert not takes(ROWS_F32, parse_spec(bad), t), bad
    b16 = parse_spec("MatmulAccum(1x1x3x32, bf16:L1:row, bf16:GL:row, f32:L1:row)")
    assert takes(ROWS_BF16, b16, t) and not takes(ROWS_F32, b16, t)


def test_rows_cost_and_registers() -> None:
    t = get_target("avx512")
    s = parse_spec("MatmulAccum(1x1x8x64, f32:L1:row, f32:GL:[1,2]c1, f32:L1:row)")
    # 8 rows x 4 vectors x 2, 8 x 4 B lines streamed, 8 runs, 4 vectors in and out, lhs line.
    assert ROWS_F32.cost(s, t) == 64 + 32 * STREAM_LINE_COST + 8 * STREAM_RUN_COST + 8 + 1
    assert ROWS_F32.memory(s, t) == (0, 8 + 4 + 1, 0, 0, 0)
    b = parse_spec("MatmulAccum(1x1x8x64, bf16:L1:row, bf16:GL:[1,2]c1, f32:L1:row)")
    # bf16: 3 per vector (widen + FMA), half the B lines.
    assert ROWS_BF16.cost(b, t) == 96 + 16 * STREAM_LINE_COST + 8 * STREAM_RUN_COST + 8 + 1


@pytest.mark.parametrize(
    ("lhs", "rhs", "want"),
    [
        ("f32", "f32", "VecMatRowsF32"),
        ("bf16", "bf16", "VecMatRowsBf16F32"),
        ("f32", "bf16", "VecMatRowsF32Bf16"),
    ],
)
def test_search_streams_matrix_vector_rows(lhs: str, rhs: str, want: str) -> None:
    """M=1 with a row-major B: the search splits k and streams rows (no panels)."""
    text = f"Matmul(1x1x256x512, {lhs}:GL:row, {rhs}:GL:row, f32:GL:row, serial)"
    impl = _synth(text, "avx512")
    assert want in _kernels(impl)


def test_single_use_inputs_are_not_copied() -> None:
    """The rhs of an M=1 Spec gets no relayout/widening copy (it is read only once)."""
    t = get_target("avx512")
    s = parse_spec("MatmulAccum(1x1x64x64, bf16:GL:row, bf16:GL:row, f32:GL:row)")
    copies = [
        a
        for a in enumerate_actions(s, t)
        if isinstance(a, Move) and a.operand == 1 and a.level in (Level.GL, Level.L1)
    ]
    # Only the L1 cache view remains.
    assert [(a.level, a.dtype.value) for a in copies] == [(Level.L1, "bf16")]
    s2 = parse_spec("MatmulAccum(1x4x64x64, bf16:GL:row, bf16:GL:row, f32:GL:row)")
    assert any(
        isinstance(a, Move) and a.operand == 1 and a.level is Level.GL
        for a in enumerate_actions(s2, t)
    )


def test_widening_copies_go_to_main_memory_only_when_l1_cannot_hold_them() -> None:
    """A bf16 Matmul input is widened into an f32 copy in L1 when the copy fits there;
    a copy in main memory is offered only for bigger tiles (it spawned most of the mixed
    bf16/f32 Specs of the bf16 search without ever being chosen for small ones)."""
    t = get_target("avx512")

    def widenings(text: str) -> list[tuple[int, Level]]:
        spec = parse_spec(text)
        return [
            (a.operand, a.level)
            for a in enumerate_actions(spec, t)
            if isinstance(a, Move)
            and a.level in (Level.GL, Level.L1)
            and a.dtype != spec.operands[a.operand].dtype
        ]

    # 64x64 f32 copies are 256 lines (L1 holds 1024): L1 only.
    small = "MatmulAccum(1x64x64x64, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)"
    assert widenings(small) == [(0, Level.L1), (1, Level.L1)]
    # 256x256 f32 copies are 4096 lines: main memory too.
    big = "MatmulAccum(1x256x256x256, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)"
    assert set(widenings(big)) == {(0, Level.GL), (0, Level.L1), (1, Level.GL), (1, Level.L1)}


def _rows_tree(text: str, kernel: str) -> Impl:
    """Zero the output, view it in L1, run one VecMatRows call on the whole Spec."""
    ls = parse_spec(text)
    acc = ls._replace(accum=True)
    out = acc.operands[2]
    l1 = out._replace(level=Level.L1)
    body = acc._replace(operands=(acc.operands[0], acc.operands[1], l1))
    zero_spec = parse_spec(f"Zero({'x'.join(map(str, out.shape))}, f32:GL:row, serial)")
    zero = Kernel(zero_spec, "MemsetZero")
    view = Alloc(acc, (Kernel(body, kernel),), 2, l1, True, False, False)
    return Block(ls, (zero, view))


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize(
    ("isa", "text", "kernel"),
    [
        # 3 rows, 5 vectors: one full step of 4 plus a 1-vector tail.
        ("avx512", "Matmul(1x1x3x80, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "VecMatRowsF32"),
        ("avx2", "Matmul(1x1x8x56, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "VecMatRowsF32"),
        (
            "avx512",
            "Matmul(1x1x5x144, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)",
            "VecMatRowsBf16F32",
        ),
        (
            "avx2",
            "Matmul(1x1x2x40, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)",
            "VecMatRowsBf16F32",
        ),
        # The running f32 value times a bf16 matrix (a pipeline's later product).
        (
            "avx512",
            "Matmul(1x1x7x176, f32:GL:row, bf16:GL:row, f32:GL:row, serial)",
            "VecMatRowsF32Bf16",
        ),
        (
            "avx2",
            "Matmul(1x1x3x40, f32:GL:row, bf16:GL:row, f32:GL:row, serial)",
            "VecMatRowsF32Bf16",
        ),
        # Columns of a w.T (stored [n, k]) streamed side by side: 1, 5 and 8 of them.
        ("avx512", "Matmul(1x1x48x5, f32:GL:row, f32:GL:col, f32:GL:row, serial)", "DotRowsF32"),
        ("avx2", "Matmul(1x1x24x8, f32:GL:row, f32:GL:col, f32:GL:row, serial)", "DotRowsF32"),
        (
            "avx512",
            "Matmul(1x1x64x1, bf16:GL:row, bf16:GL:col, f32:GL:row, serial)",
            "DotRowsBf16F32",
        ),
        (
            "avx2",
            "Matmul(1x1x40x7, f32:GL:row, bf16:GL:col, f32:GL:row, serial)",
            "DotRowsF32Bf16",
        ),
    ],
)
def test_rows_kernel_verifies(isa: str, text: str, kernel: str, compiler: str) -> None:
    _verify(_rows_tree(text, kernel), isa, compiler)


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize(
    ("isa", "text"),
    [
        ("avx512", "Matmul(1x1x100x512, f32:GL:row, f32:GL:row, f32:GL:row, serial)"),
        ("avx512", "Matmul(1x1x64x256, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)"),
        ("avx2", "Matmul(1x1x64x200, f32:GL:row, f32:GL:row, f32:GL:row, serial)"),
        ("avx2", "MatmulAccum(1x1x36x512, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)"),
    ],
)
def test_synthesized_matrix_vector_verifies(isa: str, text: str, compiler: str) -> None:
    impl = _synth(text, isa)
    assert any(k.startswith("VecMatRows") for k in _kernels(impl))
    _verify(impl, isa, compiler)


@pytest.mark.parametrize(
    ("isa", "text", "kernel", "lines_per_row"),
    [
        # 129 zmm of bf16 widened to f32: 32 loop steps of 4 (128 bytes, 2 lines of each
        # row) and a 1-zmm tail.
        ("avx512", "Matmul(1x1x5x2064, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)", "bf16", 2),
        # 4 ymm of f32 per step: 128 bytes of each row, 2 lines.
        ("avx2", "Matmul(1x1x3x2048, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "f32", 2),
        ("avx2", "Matmul(1x1x2x2048, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)", "bf16", 1),
        # 4 zmm of f32: 256 bytes of each row per step, which the hardware streams better.
        ("avx512", "Matmul(1x1x3x2064, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "f32", 0),
        # Rows shorter than STREAM_PREFETCH_MIN_ROW.
        ("avx2", "Matmul(1x1x3x1024, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "f32", 0),
    ],
)
def test_rows_loop_prefetches_every_row_ahead(
    isa: str, text: str, kernel: str, lines_per_row: int
) -> None:
    """Each step of the streaming loop prefetches the lines of every B row it will read
    `STREAM_PREFETCH_AHEAD` elements later (when a step reads at most
    `STREAM_PREFETCH_MAX_STEP_BYTES` of a row, and rows are long); a tail step outside the
    loop prefetches nothing. The kernel stays exact."""
    tree = _rows_tree(text, "VecMatRowsF32" if kernel == "f32" else "VecMatRowsBf16F32")
    src = generate_c(tree, "k", isa).c_source
    rows = parse_spec(text).shape[2]
    ahead = STREAM_PREFETCH_AHEAD * (2 if kernel == "bf16" else 4)
    got = re.findall(r"__builtin_prefetch\(.*b\d+_(\d+) \+ j\d+\) \+ (\d+)\), 0, 3\);", src)
    want = [(str(r), str(ahead + 64 * i)) for r in range(rows) for i in range(lines_per_row)]
    assert sorted(got) == sorted(want), src
    assert src.count("__builtin_prefetch") == len(want), src
    assert "for (int j" in src
    _verify(tree, isa, "gcc")


def test_rows_loop_structure() -> None:
    """The k split is the outer loop; the kernel itself walks n (no tiling of n)."""
    impl = _synth("Matmul(1x1x64x1024, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512")
    loops = []

    def walk(n: Impl) -> None:
        if isinstance(n, Loop):
            loops.append(n.tile_shape)
        for c in n.children:
            walk(c)

    walk(impl)
    assert loops and all(shape[3] == 1024 for shape in loops)


# --------------------------------------------------------------------------- register rows


def _vrf_outputs(impl: Impl) -> list[tuple[int, ...]]:
    """Shapes of the output tiles moved into vector registers (the register tiles)."""
    return [
        n.tensor.shape
        for n in iter_nodes(impl)
        if isinstance(n, Alloc) and n.tensor.level is Level.VRF and n.operand == 2
    ]


def test_register_rows_tile_only_the_m_dim() -> None:
    spec = parse_spec("Matmul(1x64x64x64, f32:L1:row, f32:L1:row, f32:L1:row, serial)")
    avx2 = {a.shape for a in enumerate_actions(spec, get_target("avx2")) if hasattr(a, "shape")}
    assert (1, 6, 64, 64) in avx2
    assert (1, 64, 64, 6) not in avx2 and (6, 64, 64, 64) not in avx2
    avx512 = {a.shape for a in enumerate_actions(spec, get_target("avx512")) if hasattr(a, "shape")}
    assert (1, 12, 64, 64) in avx512 and (1, 6, 64, 64) not in avx512
    assert (1, 64, 64, 12) not in avx512


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_avx2_gemm_fills_the_register_file_with_6x16_tiles(compiler: str) -> None:
    """64 rows = 10 tiles of 6 plus a 4-row remainder; the main tile holds 12 ymm sums."""
    impl = _synth("Matmul(1x64x32x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx2")
    tiles = _vrf_outputs(impl)
    assert (1, 6, 16) in tiles, tiles
    _verify(impl, "avx2", compiler)


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_avx512_gemm_uses_12x32_tiles(compiler: str) -> None:
    """24 zmm sums (12 rows x 2 vectors) leave both FMA ports busy between broadcasts."""
    impl = _synth("Matmul(1x48x32x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512")
    tiles = _vrf_outputs(impl)
    assert (1, 12, 32) in tiles, tiles
    _verify(impl, "avx512", compiler)


def test_a_zero_outside_parallel_loops_costs_main_memory_stores() -> None:
    """A zero that runs on one thread while the others wait is priced like GL stores; a
    zero inside a thread (a serial Spec) stays one unit per line."""
    memset = KERNELS_BY_NAME["MemsetZero"]
    for isa in ("avx2", "avx512"):
        t = get_target(isa, 2)
        shared = parse_spec("Zero(512x512, f32:GL:row)")
        own = parse_spec("Zero(256x512, f32:GL:row, serial)")
        assert not shared.serial and own.serial
        assert memset.cost(shared, t) == (16384 + 1) * 20  # one run; may straddle a line
        assert memset.cost(own, t) == 8192


# --------------------------------------------------------------------------- L2 views


def _l2_views(impl: Impl) -> list[Alloc]:
    return [n for n in iter_nodes(impl) if isinstance(n, Alloc) and n.tensor.level is Level.L2]


def _l2_moves(spec_text: str, isa: str) -> list[Move]:
    spec = parse_spec(spec_text)
    return [
        a
        for a in enumerate_actions(spec, get_target(isa))
        if isinstance(a, Move) and a.level is Level.L2
    ]


def test_l2_views_are_offered_for_contiguous_tiles_larger_than_l1() -> None:
    """An L2 move is a view (same layout and dtype, no copy) of a contiguous tile that does
    not fit L1 but fits L2; a tile that fits L1 moves there directly."""
    big = parse_spec("Matmul(1x512x512x512, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    l2 = _l2_moves(big.text(), "avx512")
    assert {a.operand for a in l2} == {0, 1, 2}
    for a in l2:
        found = a.new_tensor(big)
        assert found is not None
        new, view = found
        assert view and new == big.operands[a.operand]._replace(level=Level.L2)
    assert not _l2_moves("Matmul(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row)", "avx512")
    # 128 x 128 f32 (64 KiB) is all of the model's L1: read from L2, not staged in L1
    l2_128 = _l2_moves("Matmul(1x128x128x128, f32:GL:row, f32:GL:row, f32:GL:row)", "avx512")
    assert {a.operand for a in l2_128} == {0, 1, 2}
    assert not _l2_moves("Matmul(1x64x128x64, f32:GL:row, f32:GL:row, f32:GL:row)", "avx512")
    # B, 2048 x 1024 f32 (8 MiB), does not fit a 1 MiB L2 (A, 8 x 2048, is as big as L1)
    wide_b = _l2_moves("Matmul(1x8x2048x1024, f32:GL:row, f32:GL:row, f32:GL:row)", "avx512")
    assert {a.operand for a in wide_b} == {0}
    # AVX2 has no L2 level (see `machine.target`)
    assert not _l2_moves(big.text(), "avx2")


def test_l2_tensors_are_contiguous_runs_or_strips_of_narrow_rows() -> None:
    """A strided tile of an L2 view is refused when the rows are 2 KiB apart (a 32-column
    strip of a 512x512 B) and kept when they are at most 512 bytes apart (of a 128x128 B),
    one level deep, and is never moved or copied as a whole (its rows are); whole rows and
    packed panels are kept."""
    from morello_build.ir.layout import row_major
    from morello_build.ir.tensorspec import tile_tensor

    b = parse_spec("Matmul(1x512x512x512, f32:GL:row, f32:L2:row, f32:GL:row)").operands[1]
    assert tile_tensor(b, (1, 512, 32)) is None
    rows = tile_tensor(b, (1, 64, 512))
    assert rows is not None and rows.is_contiguous
    packed = parse_spec(
        "Matmul(1x512x512x512, f32:GL:row, f32:L2:[2,1,2p32], f32:GL:row)"
    ).operands[1]
    panel = tile_tensor(packed, (1, 512, 32))
    assert panel is not None and panel.is_contiguous

    narrow = parse_spec("Matmul(1x12x128x128, f32:L1:row, f32:L2:row, f32:L1:row)")
    strip = tile_tensor(narrow.operands[1], (1, 128, 32))
    assert strip is not None and strip.level is Level.L2 and not strip.is_contiguous
    assert tile_tensor(strip, (1, 64, 32)) is None  # a tile of a strip
    one_row = tile_tensor(strip, (1, 1, 32))
    assert one_row is not None and one_row.is_contiguous
    # bf16 rows of 256 elements are 512 bytes too; f32 rows of 256 are not
    bf16 = parse_spec("Matmul(1x8x64x256, bf16:L1:row, bf16:L2:row, f32:L1:row)").operands[1]
    assert tile_tensor(bf16, (1, 64, 32)) is not None
    wide = parse_spec("Matmul(1x8x64x256, f32:L1:row, f32:L2:row, f32:L1:row)").operands[1]
    assert tile_tensor(wide, (1, 64, 32)) is None

    on_strip = parse_spec("Matmul(1x12x128x32, f32:L1:row, f32:L2:[1,2]c1, f32:L1:row)")
    view = Move(1, Level.L1, on_strip.operands[1].layout, None, on_strip.operands[1].dtype)
    assert view.new_tensor(on_strip) is None
    dense = Move(1, Level.L1, row_major((1, 128, 32)), None, on_strip.operands[1].dtype)
    assert dense.new_tensor(on_strip) is None  # nor copied as a whole
    assert not any(
        isinstance(a, Move) and a.operand == 1 and a.level is Level.L1 and a.layout == view.layout
        for a in enumerate_actions(on_strip, get_target("avx512"))
    )


def test_l2_hits_are_cheaper_than_main_memory_and_dearer_than_l1() -> None:
    t = get_target("avx512")
    assert t.hit_cost[Level.L1] < t.hit_cost[Level.L2] < t.hit_cost[Level.GL]
    assert t.max_limits[Level.L2] == 16384  # 1 MiB
    assert get_target("amx").max_limits == t.max_limits
    assert get_target("avx2").max_limits[Level.L2] == 0


def test_serial_matmuls_may_pack_b_above_the_zero() -> None:
    """A one-thread Matmul may pack B into panels before it splits into zero + accumulate,
    so whole-k register tiles can zero C in registers; a Spec that may still run threads
    keeps views only (one thread packing while the other waits measured 0.88-0.91x)."""

    def packs(text: str) -> bool:
        spec = parse_spec(text)
        return any(
            isinstance(a, Move) and a.operand == 1 and a.level is Level.GL
            for a in enumerate_actions(spec, get_target("avx512", 2))
        )

    assert packs("Matmul(1x512x512x512, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    assert not packs("Matmul(1x512x512x512, f32:GL:row, f32:GL:row, f32:GL:row)")


def test_serial_matmuls_may_copy_row_major_b_into_l1_above_the_zero() -> None:
    """Row-major B, too, may be copied into L1 before the zero-then-accumulate split (it
    was views only): otherwise a strip of C is zeroed in memory and reloaded under an L1
    copy of B (2048x128x2048 ran at 0.50-0.60x MKL that way, 0.83x with the copy above).
    A Spec that may still run threads keeps views only."""
    target = get_target("avx512", 2)

    def l1_copies(text: str) -> list[Move]:
        spec = parse_spec(text)
        out = []
        for a in enumerate_actions(spec, target):
            if isinstance(a, Move) and a.operand == 1 and a.level is Level.L1:
                found = a.new_tensor(spec)
                if found is not None and not found[1]:  # a copy, not a cache view
                    out.append(a)
        return out

    strip = "Matmul(1x2048x128x64, f32:L2:row, f32:GL:row, f32:GL:row{})"
    assert l1_copies(strip.format(", serial"))
    assert not l1_copies(strip.format(""))


@functools.cache
def _zeroed_in_registers_gemm() -> Impl:
    return _synth("Matmul(1x256x256x256, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512")


@pytest.mark.slow
@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_b_copied_into_l1_above_the_zero_zeroes_c_in_registers(compiler: str) -> None:
    """avx512 f32 256^3: B's 32-column strips are copied into L1 above the zero, so the
    register tiles start from zeroed registers and C is written once (no memset of C and
    reload; 0.89-0.93x of MKL before, 0.93-1.08x after). Checked against numpy."""
    impl = _zeroed_in_registers_gemm()
    kernels = _kernels(impl)
    assert "VectorZero" in kernels and "MemsetZero" not in kernels, kernels
    copies = [
        n
        for n in iter_nodes(impl)
        if isinstance(n, Alloc)
        and n.operand == 1
        and n.tensor.level is Level.L1
        and not n.cache_view
    ]
    assert copies and not copies[0].spec.accum, [n.spec for n in copies]
    _verify(impl, "avx512", compiler)


def test_storing_a_zmm_register_costs_two_fmas() -> None:
    """A 64-byte vector store is priced like 2 FMAs (`ZMM_STORE_COST`, measured); a load
    costs one unit per register plus, on AVX-512, one per load (`VRF_LOAD_COST`); 32-byte
    stores keep one unit per register."""
    from morello_build.kernels.moves import VRF_LOAD_COST, ZMM_STORE_COST

    assign = KERNELS_BY_NAME["VectorAssign"]
    fma = KERNELS_BY_NAME["BroadcastVecMultAdd"]
    t = get_target("avx512")
    store = parse_spec("Move(1x1x32, f32:VRF:row:16, f32:L1:row)")
    load = parse_spec("Move(1x1x32, f32:L1:row, f32:VRF:row:16)")
    assert assign.cost(store, t) == 2 * ZMM_STORE_COST == 8
    assert assign.cost(load, t) == 2 + VRF_LOAD_COST == 3
    four_rows = parse_spec("Move(1x4x32, f32:L1:row, f32:VRF:row:16)")
    assert assign.cost(four_rows, t) == 8 + VRF_LOAD_COST  # one load group, 8 registers
    ymm_load = parse_spec("Move(1x1x16, f32:L1:row, f32:VRF:row:8)")
    assert assign.cost(ymm_load, get_target("avx2")) == 2
    # two FMAs on two zmm registers: 2 units each and one for the broadcast
    two_fmas = parse_spec("MatmulAccum(1x1x1x32, f32:L1:row, f32:VRF:row:16, f32:VRF:row:16)")
    assert fma.cost(two_fmas, t) == 5
    ymm_store = parse_spec("Move(1x1x16, f32:VRF:row:8, f32:L1:row)")
    assert assign.cost(ymm_store, get_target("avx2")) == 2


@functools.cache
def _strip_gemm() -> Impl:
    return _synth("Matmul(1x36x128x128, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512")


@pytest.mark.slow
@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_whole_k_register_tiles_read_narrow_b_strips_from_l2(compiler: str) -> None:
    """B of 128x128 f32 fills the model's L1. The DP views it in L2 and runs whole-k 12x32
    register tiles over its 32-column strips: C zeroed in registers and stored once, no k
    split that would store and reload it (1.05x MKL at 128^3 against 0.97x for the k-split
    plan it chose before). The kernel is checked against numpy."""
    impl = _strip_gemm()
    assert any(v.operand == 1 and v.cache_view for v in _l2_views(impl)), _l2_views(impl)
    kernels = _kernels(impl)
    assert "VectorZero" in kernels and "MemsetZero" not in kernels
    for loop in iter_nodes(impl):
        if isinstance(loop, Loop) and loop.action.startswith("split("):
            assert loop.tile_shape[2] == 1, loop.action  # only the register tile's k steps
    _verify(impl, "avx512", compiler)


@functools.cache
def _l2_gemm() -> Impl:
    return _synth("Matmul(1x96x256x128, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512")


@pytest.mark.slow
@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_a_b_reused_across_row_blocks_is_read_from_l2(compiler: str) -> None:
    """B (128 KiB) is too big for L1 and is read once per block of rows: the DP keeps it
    in L2 (contiguous k-blocks of it move on into L1) instead of paying main-memory hits
    on every pass. The kernel is checked against numpy."""
    impl = _l2_gemm()
    views = _l2_views(impl)
    assert any(v.operand == 1 and v.cache_view for v in views), views
    _verify(impl, "avx512", compiler)


def test_avx512_fmas_read_a_single_use_broadcast_from_memory() -> None:
    """An AVX-512 FMA takes its broadcast scalar as a memory operand (`{1to16}`) when the
    scalar feeds one vector, so it needs no register for it; a scalar feeding two vectors
    is broadcast into a register once, and AVX2 has no embedded broadcast."""
    fma = KERNELS_BY_NAME["BroadcastVecMultAdd"]
    avx512, avx2 = get_target("avx512"), get_target("avx2")
    one = parse_spec("MatmulAccum(1x1x1x16, f32:L1:row, f32:VRF:row:16, f32:VRF:row:16)")
    two = parse_spec("MatmulAccum(1x1x1x32, f32:L1:row, f32:VRF:row:16, f32:VRF:row:16)")
    in_rf = parse_spec("MatmulAccum(1x1x1x16, f32:RF:row, f32:VRF:row:16, f32:VRF:row:16)")
    ymm = parse_spec("MatmulAccum(1x1x1x8, f32:L1:row, f32:VRF:row:8, f32:VRF:row:8)")
    assert fma.memory(one, avx512)[Level.VRF] == 0
    assert fma.memory(two, avx512)[Level.VRF] == 1
    assert fma.memory(in_rf, avx512)[Level.VRF] == 1
    assert fma.memory(ymm, avx512)[Level.VRF] == 0
    assert fma.memory(ymm, avx2)[Level.VRF] == 1


def _vrf_loads(impl: Impl) -> list[tuple[int, ...]]:
    """Shapes of the loads into vector registers (VectorAssign from memory to VRF)."""
    return [
        n.spec.operands[1].shape
        for n in iter_nodes(impl)
        if isinstance(n, Kernel)
        and n.name == "VectorAssign"
        and n.spec.operands[1].level is Level.VRF
        and n.spec.operands[0].level is not Level.VRF
    ]


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_avx512_16x16x16_keeps_all_of_b_in_registers(compiler: str) -> None:
    """16 zmm sums and all 16 rows of B fill the 32 registers (the broadcasts are FMA
    operands): B is loaded once, not a row per k step (1.05x MKL's JIT against 0.98x).
    The kernel is checked against numpy."""
    impl = _synth("Matmul(1x16x16x16, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512")
    assert _vrf_loads(impl) == [(1, 16, 16)], _vrf_loads(impl)
    _verify(impl, "avx512", compiler)


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_avx512_register_tiles_load_b_for_several_k_steps(compiler: str) -> None:
    """A 12x32 tile (24 zmm sums) has room for B's rows of two k steps beside its
    broadcast register, and loads them as one group (32^3: 1.04x MKL's JIT against 1.01x
    a row at a time); AVX2's 6x16 tile keeps loading one B row per k step. Both kernels
    are checked against numpy."""
    impl = _synth("Matmul(1x36x32x32, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512")
    assert (1, 2, 32) in _vrf_loads(impl), _vrf_loads(impl)
    _verify(impl, "avx512", compiler)
    impl2 = _synth("Matmul(1x36x32x32, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx2")
    assert set(_vrf_loads(impl2)) == {(1, 1, 16)}, _vrf_loads(impl2)
    _verify(impl2, "avx2", compiler)
