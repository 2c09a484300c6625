"""Dot-product loops: c[1,1,1] += a[1,1,k] . b[1,k,1] with both inputs contiguous in L1.

Independent vector accumulators hide the FMA latency; one horizontal sum at the end. Three
variants: f32, bf16 widened to f32, and AVX-512's pairwise `vdpbf16ps` (whose price,
`vdpbf16ps_cost`, the vdpbf16ps register tiles share).
"""

from __future__ import annotations

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import CodegenError, View
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import Limits
from morello_build.ir.spec import MATMUL, LogicalSpec
from morello_build.kernels.base import SCALAR_LEVELS, Kernel, regs, scalar_here
from morello_build.kernels.emit_helpers import memory_run, widen
from morello_build.kernels.scalar import generic_matmul
from morello_build.machine.isa import isa_includes
from morello_build.machine.target import Target

F32, BF16 = Dtype.F32, Dtype.BF16

#: Horizontal sum of the accumulators plus the scalar read-modify-write of the output.
DOT_REDUCE_COST = 8
#: bf16 values one `vdpbf16ps zmm` consumes from each input.
VDPBF16PS_STEP = 32
#: One `vdpbf16ps zmm`, in cost units: it retires one per 2 cycles on the Xeon, half the
#: flop rate of f32 FMAs (docs/cost-model.md, "vdpbf16ps").
VDPBF16PS_COST = 8
#: The same on AMD Zen 4 and later (`Target.fast_dpbf16`): one per cycle, an FMA's price.
VDPBF16PS_COST_ZEN4 = 2


def vdpbf16ps_cost(t: Target) -> int:
    return VDPBF16PS_COST_ZEN4 if t.fast_dpbf16 else VDPBF16PS_COST


def accumulators(k: int, strip: int) -> int:
    """Independent vector accumulators a dot loop uses (hides FMA latency), up to 4."""
    steps = k // strip
    return next(c for c in (4, 3, 2, 1) if steps % c == 0)


#: `_dot_shape`'s operand levels: both vectors read from L1, the output a scalar.
DOT_LEVELS = (frozenset((Level.L1,)), frozenset((Level.L1,)), SCALAR_LEVELS)


def _dot_shape(s: LogicalSpec) -> bool:
    bdim, m, k, n = s.shape
    a, b, c = s.operands
    return (
        s.accum
        and bdim == m == n == 1
        and a.level is Level.L1
        and b.level is Level.L1
        and a.is_contiguous
        and b.is_contiguous
        and scalar_here(c)
    )


# ---- f32 ------------------------------------------------------------------------------


def _f32_lanes_applies(s: LogicalSpec, t: Target) -> bool:
    """The f32 loop and the bf16 one that widens to f32: k in whole f32 vectors (their
    dtypes are `Kernel.dtypes`)."""
    lanes = t.lanes(F32)
    return lanes > 1 and _dot_shape(s) and s.shape[2] % lanes == 0


def _f32_memory(s: LogicalSpec, t: Target) -> Limits:
    return regs(vrf=accumulators(s.shape[2], t.lanes(F32)) + 2)


def _f32_cost(s: LogicalSpec, t: Target) -> int:
    # Both operands stream from L1: two vector loads per FMA against one for broadcast-FMA
    # tiles, so a strip costs twice a broadcast-FMA vector (docs/cost-model.md, "Dot products").
    return 4 * s.shape[2] // t.lanes(F32) + DOT_REDUCE_COST + t.move_cost(s.operands[2])


# ---- bf16, widened --------------------------------------------------------------------


def _bf16_memory(s: LogicalSpec, t: Target) -> Limits:
    return regs(vrf=accumulators(s.shape[2], t.lanes(F32)) + 4)


def _bf16_cost(s: LogicalSpec, t: Target) -> int:
    # Widening both inputs costs about as much again as the FMAs.
    return 6 * s.shape[2] // t.lanes(F32) + DOT_REDUCE_COST + t.move_cost(s.operands[2])


# ---- bf16 on vdpbf16ps ----------------------------------------------------------------


def _vdpbf16_applies(s: LogicalSpec, t: Target) -> bool:
    return isa_includes(t.isa, "avx512") and _dot_shape(s) and s.shape[2] % VDPBF16PS_STEP == 0


def _vdpbf16_memory(s: LogicalSpec, t: Target) -> Limits:
    return regs(vrf=accumulators(s.shape[2], VDPBF16PS_STEP) + 2)


def _vdpbf16_cost(s: LogicalSpec, t: Target) -> int:
    k = s.shape[2]
    return (
        vdpbf16ps_cost(t) * k // VDPBF16PS_STEP
        + 4 * accumulators(k, VDPBF16PS_STEP)
        + t.move_cost(s.operands[2])
    )


# ---- C ----------------------------------------------------------------------------------


def _dot_product(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...], variant: str) -> None:
    """c += sum_k a[k] * b[k] with independent vector accumulators, then one horizontal sum.

    `variant`: "f32", "bf16" (widen, then FMA) or "vdpbf16ps" (AVX-512 pairwise dot).
    """
    a, b, c = views
    kk = spec.shape[2]
    ra = memory_run(ctx, a)
    rb = memory_run(ctx, b)
    if ra is None or rb is None or spec.shape[1] != 1 or spec.shape[3] != 1:
        generic_matmul(ctx, spec, views)  # not the contiguous shape the kernel assumes
        return
    lanes = ctx.f32_lanes
    step = VDPBF16PS_STEP if variant == "vdpbf16ps" else lanes
    if kk % step:
        raise CodegenError(f"dot product over K={kk} needs a multiple of {step}")
    nacc = accumulators(kk, step)
    out = ctx.amap.loc(c, (0, 0, 0))
    n = ctx.fresh()
    elem = "uint16_t" if variant != "f32" else "float"
    ctx.includes.add("string.h")
    ctx.open("{")
    ctx.line(f"const {elem} *pa{n} = &{ra.ref()};")
    ctx.line(f"const {elem} *pb{n} = &{rb.ref()};")
    accs = [f"acc{n}_{i}" for i in range(nacc)]
    if variant == "vdpbf16ps":
        ctx.includes.add("immintrin.h")
        ctx.line(f"__m512 {', '.join(f'{x} = _mm512_setzero_ps()' for x in accs)};")
        ctx.open(f"for ({ctx.index_type} k{n} = 0; k{n} < {kk}; k{n} += {step * nacc}) {{")
        for i, acc in enumerate(accs):
            ctx.line(f"__m512i x{i}, y{i};")
            ctx.line(f"memcpy(&x{i}, pa{n} + k{n} + {i * step}, sizeof x{i});")
            ctx.line(f"memcpy(&y{i}, pb{n} + k{n} + {i * step}, sizeof y{i});")
            ctx.line(f"{acc} = _mm512_dpbf16_ps({acc}, (__m512bh)x{i}, (__m512bh)y{i});")
        ctx.close()
        if nacc > 1:
            ctx.line(f"{accs[0]} = _mm512_add_ps({accs[0]}, {accs[1]});")
            for acc in accs[2:]:
                ctx.line(f"{accs[0]} = _mm512_add_ps({accs[0]}, {acc});")
        total = f"_mm512_reduce_add_ps({accs[0]})"
    else:
        vf = ctx.vtype(Dtype.F32, lanes)
        vin = vf if variant == "f32" else ctx.vtype(Dtype.BF16, lanes)
        ctx.line(f"{vf} {', '.join(f'{x} = {{0}}' for x in accs)};")
        ctx.open(f"for ({ctx.index_type} k{n} = 0; k{n} < {kk}; k{n} += {step * nacc}) {{")
        for i, acc in enumerate(accs):
            ctx.line(f"{vin} x{i}, y{i};")
            ctx.line(f"memcpy(&x{i}, pa{n} + k{n} + {i * step}, sizeof x{i});")
            ctx.line(f"memcpy(&y{i}, pb{n} + k{n} + {i * step}, sizeof y{i});")
            if variant == "f32":
                ctx.line(f"{acc} = {acc} + x{i} * y{i};")
            else:
                ctx.line(
                    f"{acc} = {acc} + {widen(ctx, f'x{i}', lanes)} * {widen(ctx, f'y{i}', lanes)};"
                )
        ctx.close()
        if nacc > 1:
            ctx.line(f"{accs[0]} = {' + '.join(accs)};")
        total = " + ".join(f"{accs[0]}[{lane}]" for lane in range(lanes))
    if out.buf.dtype != Dtype.F32:
        raise CodegenError("dot products accumulate into f32")
    ctx.line(f"{out.ref()} += {total};")
    ctx.close()


def _emit_f32(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    _dot_product(ctx, spec, views, "f32")


def _emit_bf16(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    _dot_product(ctx, spec, views, "bf16")


def _emit_vdpbf16ps(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    _dot_product(ctx, spec, views, "vdpbf16ps")


DOT_PRODUCT_LOOP = Kernel(
    name="DotProductLoop",
    kind=MATMUL,
    applies=_f32_lanes_applies,
    memory=_f32_memory,
    cost=_f32_cost,
    emit=_emit_f32,
    dtypes=(F32, F32, F32),
    levels=DOT_LEVELS,
)

DOT_PRODUCT_LOOP_BF16 = Kernel(
    name="DotProductLoopBf16",
    kind=MATMUL,
    applies=_f32_lanes_applies,
    memory=_bf16_memory,
    cost=_bf16_cost,
    emit=_emit_bf16,
    dtypes=(BF16, BF16, F32),
    levels=DOT_LEVELS,
)

DOT_PRODUCT_LOOP_VDPBF16PS = Kernel(
    name="DotProductLoopVdpbf16ps",
    kind=MATMUL,
    applies=_vdpbf16_applies,
    memory=_vdpbf16_memory,
    cost=_vdpbf16_cost,
    emit=_emit_vdpbf16ps,
    dtypes=(BF16, BF16, F32),
    levels=DOT_LEVELS,
)
