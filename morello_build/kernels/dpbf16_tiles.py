"""vdpbf16ps register tiles: a bf16 GEMM where `vdpbf16ps` is fast (`Target.fast_dpbf16`).

c[M, N] (+)= a[M, K] @ b[K, N], all three in memory: C is held in M x N/16 zmm accumulators
for the whole K; per k-pair the kernel loads the N/16 vectors of one B pair row (the
k-pair layout of `k_pairs`, 16 columns x 2 k per zmm), broadcasts each A row's pair (two
adjacent bf16 of a row-major A, one 32-bit broadcast) and issues M x N/16 `vdpbf16ps`. C
is loaded at entry (zeroed in registers when the Matmul does not accumulate) and stored
at exit. Only enumerated with `fast_dpbf16`: on the generic tuning (the Xeon) vdpbf16ps
has half the f32 FMA flop rate and widening wins.
"""

from __future__ import annotations

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import CodegenError, View
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import Limits
from morello_build.ir.spec import MATMUL, LogicalSpec
from morello_build.kernels.base import MEMORY_LEVELS, Kernel, regs
from morello_build.kernels.dot import vdpbf16ps_cost
from morello_build.kernels.emit_helpers import row_major_rows
from morello_build.kernels.k_pairs import check_bf16_f32, k_pair_rows, paired_in_memory
from morello_build.kernels.moves import ZMM_STORE_COST
from morello_build.machine.target import Target

F32, BF16 = Dtype.F32, Dtype.BF16

DPBF16_COLS = 16  # f32 columns per zmm accumulator (and per B vector of 16 pairs)
DPBF16_MIN_K = 4  # a 2-row B tile is no longer in the k-pair layout (`amx_pairs_layout`)
DPBF16_TILE_MAX_COLS = 64  # four zmm accumulators per row
DPBF16_LOAD_COST = 1  # a B vector load or an A pair broadcast, per k-pair


def _tile_registers(m: int, n: int) -> int:
    """Accumulators, the B vectors of one pair row, and one broadcast."""
    return m * (n // DPBF16_COLS) + n // DPBF16_COLS + 1


def _applies(s: LogicalSpec, t: Target) -> bool:
    bdim, m, k, n = s.shape
    return (
        t.fast_dpbf16
        and bdim == 1
        and k % 2 == 0
        and k >= DPBF16_MIN_K
        and n % DPBF16_COLS == 0
        and n <= DPBF16_TILE_MAX_COLS
        and _tile_registers(m, n) <= t.max_limits[Level.VRF]
        and paired_in_memory(s)
    )


def _memory(s: LogicalSpec, t: Target) -> Limits:
    _, m, _, n = s.shape
    return regs(vrf=_tile_registers(m, n))


def _cost(s: LogicalSpec, t: Target) -> int:
    _, m, k, n = s.shape
    nv = n // DPBF16_COLS
    per_pair = m * nv * vdpbf16ps_cost(t) + (m + nv) * DPBF16_LOAD_COST
    c_io = m * nv * (ZMM_STORE_COST + (1 if s.accum else 0))
    far = sum(t.move_cost(o) for o in s.operands if o.level in (Level.L2, Level.GL))
    return (k // 2) * per_pair + c_io + far


def _emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """c (+)= a @ b in zmm accumulators with vdpbf16ps: per k-pair, the N/16 vectors of B's
    pair row and one 32-bit broadcast of each A row's pair (read with memcpy: A rows need
    not be 4-byte aligned)."""
    a, b, c = views
    _, m, kk, n = spec.shape
    if kk % 2 or n % 16:
        raise CodegenError(f"Dpbf16TileBf16F32 does not apply to {spec.text()}")
    nv, pairs = n // 16, kk // 2
    kcols = sorted({0, 1, kk // 2, kk - 2, kk - 1})
    ncols = sorted({0, 1, 15, n // 2, n - 1})
    a0, sa = row_major_rows(ctx, a, m, kcols, "vdpbf16ps lhs")
    b0, sb = k_pair_rows(ctx, b, pairs, ncols, "vdpbf16ps rhs (k-pair layout)")
    c0, sc = row_major_rows(ctx, c, m, ncols, "vdpbf16ps out")
    check_bf16_f32(views, "vdpbf16ps tile")
    ctx.includes.update(("immintrin.h", "string.h"))
    u = ctx.fresh()
    pa, pb, pc, p = f"pa{u}", f"pb{u}", f"pc{u}", f"p{u}"
    acc = [[f"c{u}_{i}_{j}" for j in range(nv)] for i in range(m)]
    ctx.open("{")
    ctx.line(f"const uint16_t *{pa} = &{a0.ref()};")
    ctx.line(f"const uint16_t *{pb} = &{b0.ref()};")
    ctx.line(f"float *{pc} = &{c0.ref()};")
    for i in range(m):
        for j in range(nv):
            init = (
                f"_mm512_loadu_ps({pc} + {i * sc + 16 * j})"
                if spec.accum
                else "_mm512_setzero_ps()"
            )
            ctx.line(f"__m512 {acc[i][j]} = {init};")
    ctx.open(f"for ({ctx.index_type} {p} = 0; {p} < {pairs}; {p}++) {{")
    for j in range(nv):
        ctx.line(
            f"const __m512bh b{u}_{j} = (__m512bh)_mm512_loadu_si512({pb} + {p} * {sb} + {32 * j});"
        )
    for i in range(m):
        ctx.open("{")
        ctx.line("int w;")
        ctx.line(f"memcpy(&w, {pa} + {i * sa} + 2 * {p}, sizeof w);")
        ctx.line(f"const __m512bh a{u} = (__m512bh)_mm512_set1_epi32(w);")
        for j in range(nv):
            ctx.line(f"{acc[i][j]} = _mm512_dpbf16_ps({acc[i][j]}, a{u}, b{u}_{j});")
        ctx.close()
    ctx.close()
    for i in range(m):
        for j in range(nv):
            ctx.line(f"_mm512_storeu_ps({pc} + {i * sc + 16 * j}, {acc[i][j]});")
    ctx.close()


DPBF16_TILE = Kernel(
    name="Dpbf16TileBf16F32",
    kind=MATMUL,
    applies=_applies,
    memory=_memory,
    cost=_cost,
    emit=_emit,
    dtypes=(BF16, BF16, F32),
    levels=(MEMORY_LEVELS, MEMORY_LEVELS, MEMORY_LEVELS),  # `paired_in_memory`
)
