"""AMX tiles (target "amx"): c[M, N] (+)= a[M, K] @ b[K, N] with `tdpbf16ps`.

C is held in 1-4 tile registers (16x16 f32 each, M and N in {16, 32}); per 32-step of K
the kernel loads M/16 A tiles (16 rows x 32 bf16, rows contiguous along k, one row stride)
and N/16 B tiles from the k-pair layout (`k_pairs`: a tile row is the pairs of 16 columns,
64 bytes) and issues (M/16)(N/16) tdpbf16ps. C tiles are loaded at entry (zeroed in the
tiles when the Matmul does not accumulate) and stored at exit.
"""

from __future__ import annotations

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import CodegenError, View
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.spec import MATMUL, LogicalSpec
from morello_build.kernels.base import MEMORY_LEVELS, Kernel, no_memory
from morello_build.kernels.emit_helpers import row_major_rows
from morello_build.kernels.k_pairs import check_bf16_f32, k_pair_rows, paired_in_memory
from morello_build.machine.target import Target

F32, BF16 = Dtype.F32, Dtype.BF16

#: Cost units (4 per cycle) of a tdpbf16ps, a tile load and a tile store; charging the
#: loads although they overlap the multiplier is what makes 2x2 tiles cheaper than 1x1, as
#: measured (docs/cost-model.md, "AMX tiles").
AMX_TDP_COST = 64
AMX_TILELOAD_COST = 36
AMX_TILESTORE_COST = 68
#: `tilezero` writes no memory (the non-accumulating form starts from zero tiles instead of
#: a memset C loaded back).
AMX_TILEZERO_COST = 4
AMX_K_STEP = 32  # bf16 values along k per tdpbf16ps (a 64-byte tile row)
AMX_TILE = 16  # rows (and f32 columns) of one tile


def _applies(s: LogicalSpec, t: Target) -> bool:
    bdim, m, k, n = s.shape
    return (
        t.isa == "amx"
        and bdim == 1
        and m in (16, 32)
        and n in (16, 32)
        and k % AMX_K_STEP == 0
        and paired_in_memory(s)
    )


def _cost(s: LogicalSpec, t: Target) -> int:
    _, m, k, n = s.shape
    mt, nt, ks = m // AMX_TILE, n // AMX_TILE, k // AMX_K_STEP
    gl = sum(t.move_cost(o) for o in s.operands if o.level in (Level.L2, Level.GL))
    c_in = AMX_TILELOAD_COST if s.accum else AMX_TILEZERO_COST
    return (
        ks * (mt * nt * AMX_TDP_COST + (mt + nt) * AMX_TILELOAD_COST)
        + mt * nt * (c_in + AMX_TILESTORE_COST)
        + gl
    )


def _emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """c (+)= a @ b on AMX tiles.

    C tiles 0-3 (tile (i, j) is register i * N/16 + j), A tiles 4-5, B tiles 6-7, all
    16 rows x 64 bytes as `mb_amx_cfg` configures them (the function prologue, or each
    thread's parallel-loop body, sets that up). gcc 12's `_tile_loadd` is an asm with no
    memory input, so a compiler barrier naming the three pointers first makes every
    earlier store (packing B, zeroing C) visible to the tile loads.
    """
    a, b, c = views
    _, m, kk, n = spec.shape
    t = AMX_TILE
    if m % t or n % t or kk % AMX_K_STEP or (m // t) * (n // t) > 4 or m > 2 * t or n > 2 * t:
        raise CodegenError(f"AmxTileMatmulBf16F32 does not apply to {spec.text()}")
    mt, nt, ks = m // t, n // t, kk // AMX_K_STEP
    kcols = sorted({0, 1, AMX_K_STEP - 1, kk // 2, kk - AMX_K_STEP, kk - 1})
    ncols = sorted({0, 1, t - 1, t, n - 1} & set(range(n)))
    a0, sa = row_major_rows(ctx, a, m, kcols, "AMX lhs")
    b0, sb = k_pair_rows(ctx, b, kk // 2, ncols, "AMX rhs (k-pair layout)")
    c0, sc = row_major_rows(ctx, c, m, ncols, "AMX out")
    check_bf16_f32(views, "AMX tile matmul")
    ctx.require_setup("amx")
    u = ctx.fresh()
    pa, pb, pc = f"pa{u}", f"pb{u}", f"pc{u}"
    ctx.open("{")
    ctx.line(f"const uint16_t *{pa} = &{a0.ref()};")
    ctx.line(f"const uint16_t *{pb} = &{b0.ref()};")
    ctx.line(f"float *{pc} = &{c0.ref()};")
    ctx.line(f'__asm__ __volatile__("" : : "r"({pa}), "r"({pb}), "r"({pc}) : "memory");')

    def plus(ptr: str, off: str | int) -> str:
        return ptr if off in (0, "0") else f"{ptr} + {off}"

    ctiles = [(i, j, i * nt + j) for i in range(mt) for j in range(nt)]
    for i, j, reg in ctiles:
        if spec.accum:
            ctx.line(f"_tile_loadd({reg}, {plus(pc, i * t * sc + j * t)}, {4 * sc});")
        else:  # c = a @ b: start from zero tiles, C is only written
            ctx.line(f"_tile_zero({reg});")
    k = f"k{u}"
    if ks > 1:
        ctx.open(f"for ({ctx.index_type} {k} = 0; {k} < {ks}; {k}++) {{")
        a_k, b_k = f"{k} * {AMX_K_STEP}", f"{k} * {(AMX_K_STEP // 2) * sb}"
    else:
        a_k = b_k = ""
    for i in range(mt):
        off = " + ".join(x for x in (a_k, str(i * t * sa) if i else "") if x) or 0
        ctx.line(f"_tile_loadd({4 + i}, {plus(pa, off)}, {2 * sa});")
    for j in range(nt):
        off = " + ".join(x for x in (b_k, str(2 * t * j) if j else "") if x) or 0
        ctx.line(f"_tile_loadd({6 + j}, {plus(pb, off)}, {2 * sb});")
    for i, j, reg in ctiles:
        ctx.line(f"_tile_dpbf16ps({reg}, {4 + i}, {6 + j});")
    if ks > 1:
        ctx.close()
    for i, j, reg in ctiles:
        ctx.line(f"_tile_stored({reg}, {plus(pc, i * t * sc + j * t)}, {4 * sc});")
    ctx.close()


AMX_TILE_MATMUL = Kernel(
    name="AmxTileMatmulBf16F32",
    kind=MATMUL,
    applies=_applies,
    memory=no_memory,
    cost=_cost,
    emit=_emit,
    dtypes=(BF16, BF16, F32),
    levels=(MEMORY_LEVELS, MEMORY_LEVELS, MEMORY_LEVELS),  # `paired_in_memory`
)
