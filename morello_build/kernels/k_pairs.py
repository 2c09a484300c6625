"""The k-pair layout of a bf16 B and `PackBf16Pairs`, the kernel that packs B into it.

`[1,2,1p2]`: physical B'[k/2][n][2], each pair of consecutive k values of a column side by
side. The AMX tile kernel and the vdpbf16ps register tiles read B this way (a tile row or
a zmm of B is 16 columns x one k-pair).
"""

from __future__ import annotations

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import CodegenError, Loc, View
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.spec import MOVE, LogicalSpec
from morello_build.ir.tensorspec import TensorSpec
from morello_build.kernels.base import Kernel, io_cost, no_memory, rows_contiguous
from morello_build.kernels.emit_helpers import row_major_rows, strided_rows
from morello_build.machine.target import Target

BF16 = Dtype.BF16

#: The k-pair layout of B (1 x K x N): physical B'[k/2][n][2].
AMX_PAIRS_DIMS = (
    lay.PhysDim(1, lay.DYN, 0),
    lay.PhysDim(2, lay.DYN, 0),
    lay.PhysDim(1, lay.PACKED, 2),
)
_ROWS_DIMS = (lay.PhysDim(1, lay.DYN, 0), lay.PhysDim(2, lay.DYN, 0))


def amx_pairs_layout(shape: tuple[int, ...]) -> lay.Layout | None:
    """`[1,2,1p2]` for a 1 x K x N tensor (None when K is odd or the layout collapses)."""
    if len(shape) != 3 or shape[1] % 2 or shape[1] < 4 or shape[2] < 2:
        return None
    return lay.packed((0, 1, 2), 1, 2, shape)


def in_memory(t: TensorSpec) -> bool:
    return t.level.in_memory


def paired_in_memory(s: LogicalSpec) -> bool:
    """The operand layouts of the AMX and vdpbf16ps tile kernels: all three in memory, A
    and C row-major with contiguous rows, B in k-pairs with contiguous pair rows."""
    a, b, c = s.operands
    return (
        all(in_memory(o) for o in s.operands)
        and a.layout.dims == _ROWS_DIMS
        and a.layout.contig >= 1
        and b.layout.dims == AMX_PAIRS_DIMS
        and b.layout.contig >= 2
        and c.layout.dims == _ROWS_DIMS
        and c.layout.contig >= 1
    )


def k_pair_rows(ctx: Ctx, view: View, pairs: int, cols: list[int], what: str) -> tuple[Loc, int]:
    """`strided_rows` of a 1 x K x N tile in k-pairs: (k, j) at (k // 2) * stride + 2j + k % 2
    (`cols` are sampled columns j; each pair row holds 2 values per column)."""
    return strided_rows(
        ctx,
        view,
        lambda p, j: (0, 2 * p + j % 2, j // 2),
        pairs,
        sorted({2 * x + e for x in cols for e in (0, 1)}),
        lambda p, j, st: p * st + j,
        what,
    )


def check_bf16_f32(views: tuple[View, ...], what: str) -> None:
    """The tile kernels' buffers: bf16 x bf16 -> f32."""
    for view, want in zip(views, (Dtype.BF16, Dtype.BF16, Dtype.F32)):
        if view.buf.dtype != want:
            raise CodegenError(f"{what}: {view.buf.name} is {view.buf.dtype}, not {want}")


# ---- PackBf16Pairs ------------------------------------------------------------------------

#: One step (a k-pair of 32 columns): two 64-byte row loads, unpacklo/hi + 2 permutes,
#: two stores; the lines are charged by `io_cost` (docs/cost-model.md, "Packing k-pairs").
PACK_STEP_COST = 16


def _pack_applies(s: LogicalSpec, t: Target) -> bool:
    a, b = s.operands
    if not (t.isa == "amx" or t.fast_dpbf16) or len(s.shape) != 3:
        return False
    bdim, k, n = s.shape
    return (
        bdim == 1
        and a.dtype == b.dtype == BF16
        and k % 2 == 0
        and n % 16 == 0
        and in_memory(a)
        and in_memory(b)
        and rows_contiguous(a)
        and b.layout.dims == AMX_PAIRS_DIMS
        and b.layout.contig >= 2
    )


def _pack_cost(s: LogicalSpec, t: Target) -> int:
    _, k, n = s.shape
    return PACK_STEP_COST * (k // 2) * -(-n // 32) + io_cost(s, t)


def _pack_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """dst[k/2][n][2] = src[k][n]: interleave each pair of bf16 rows.

    Per 32 columns: two 64-byte loads, unpacklo/hi_epi16 (pairs in 128-bit lane order),
    two permutex2var_epi64 back into column order, two 64-byte stores; a 16-column rest
    does the same with 256-bit registers.
    """
    src, dst = views
    _, kk, n = spec.shape
    if kk % 2 or n % 16:
        raise CodegenError(f"PackBf16Pairs does not apply to {spec.text()}")
    cols = sorted({0, 1, n // 2, n - 1})
    s0, ss = row_major_rows(ctx, src, kk, cols, "pack source")
    d0, sd = k_pair_rows(ctx, dst, kk // 2, cols, "pack destination (k-pair layout)")
    ctx.includes.add("immintrin.h")
    u = ctx.fresh()
    p = f"p{u}"
    ctx.open("{")
    ctx.line(f"const uint16_t *s{u} = &{s0.ref()};")
    ctx.line(f"uint16_t *d{u} = &{d0.ref()};")
    wide = n // 32 * 32
    if wide:
        ctx.line(f"const __m512i lo{u} = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);")
        ctx.line(f"const __m512i hi{u} = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);")
    ctx.open(f"for ({ctx.index_type} {p} = 0; {p} < {kk // 2}; {p}++) {{")
    ctx.line(f"const uint16_t *r0_{u} = s{u} + {p} * {2 * ss};")
    ctx.line(f"const uint16_t *r1_{u} = r0_{u} + {ss};")
    ctx.line(f"uint16_t *o{u} = d{u} + {p} * {sd};")
    if wide:
        j = f"j{u}"
        ctx.open(f"for ({ctx.index_type} {j} = 0; {j} < {wide}; {j} += 32) {{")
        ctx.line(f"__m512i x{u} = _mm512_loadu_si512(r0_{u} + {j});")
        ctx.line(f"__m512i y{u} = _mm512_loadu_si512(r1_{u} + {j});")
        ctx.line(f"__m512i l{u} = _mm512_unpacklo_epi16(x{u}, y{u});")
        ctx.line(f"__m512i h{u} = _mm512_unpackhi_epi16(x{u}, y{u});")
        ctx.line(
            f"_mm512_storeu_si512(o{u} + 2 * {j}, _mm512_permutex2var_epi64(l{u}, lo{u}, h{u}));"
        )
        ctx.line(
            f"_mm512_storeu_si512(o{u} + 2 * {j} + 32, "
            f"_mm512_permutex2var_epi64(l{u}, hi{u}, h{u}));"
        )
        ctx.close()
    if n % 32:
        ctx.open("{")
        ctx.line(f"__m256i x{u} = _mm256_loadu_si256((const __m256i *)(r0_{u} + {wide}));")
        ctx.line(f"__m256i y{u} = _mm256_loadu_si256((const __m256i *)(r1_{u} + {wide}));")
        ctx.line(f"__m256i l{u} = _mm256_unpacklo_epi16(x{u}, y{u});")
        ctx.line(f"__m256i h{u} = _mm256_unpackhi_epi16(x{u}, y{u});")
        ctx.line(
            f"_mm256_storeu_si256((__m256i *)(o{u} + {2 * wide}), "
            f"_mm256_permute2x128_si256(l{u}, h{u}, 0x20));"
        )
        ctx.line(
            f"_mm256_storeu_si256((__m256i *)(o{u} + {2 * wide + 16}), "
            f"_mm256_permute2x128_si256(l{u}, h{u}, 0x31));"
        )
        ctx.close()
    ctx.close()
    ctx.close()


PACK_BF16_PAIRS = Kernel(
    name="PackBf16Pairs",
    kind=MOVE,
    applies=_pack_applies,
    memory=no_memory,
    cost=_pack_cost,
    emit=_pack_emit,
)
