"""Transposing copies: a square block read along one axis and written along the other, as
f32 (a bf16 source widened as it is loaded), or bf16 packed into the k-pairs AMX reads.

`q @ k.T` and `x @ w.T` multiply by a matrix stored column-major; the search packs it into
row-major panels in L1 first. Element by element (scalar `Assign`) that copy reads one
value per cache line and cost ~1.9 cycles per value on the Xeon, a fifth of the attention
core at seq 128. This kernel loads one vector per source run, transposes the lanes in
registers (AVX-512 16 x 16 in 64 shuffles, AVX2 8 x 8 in 24) and stores one vector per
destination run: 0.24 cycles per value there (docs/cost-model.md, "Transposing copies").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import MEM, CodegenError, Loc, View
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.limits import Limits
from morello_build.ir.spec import MOVE, LogicalSpec
from morello_build.ir.tensorspec import TensorSpec
from morello_build.kernels.base import Kernel, io_cost, regs
from morello_build.kernels.emit_helpers import offset_from
from morello_build.kernels.scalar import generic_move
from morello_build.machine.target import Target

F32, BF16 = Dtype.F32, Dtype.BF16

#: Shuffle-port instructions of one block transpose, by f32 lanes per vector: the block's
#: bound (they issue on one port), 4 units each (one unit is half an FMA, two FMAs issue
#: per cycle).
SHUFFLES = {16: 64, 8: 24}
SHUFFLE_COST = 4


def _run_axis(t: TensorSpec, lanes: int) -> int | None:
    """The logical axis along which `t`'s elements are one unit-stride run of at least
    `lanes` (its innermost physical dim, whole or in packed blocks of a multiple of
    `lanes`), or None."""
    dims = t.layout.dims
    if not dims or t.layout.contig < 1 or not t.level.in_memory:
        return None
    inner = dims[-1]
    if inner.kind == lay.DYN or (inner.kind == lay.PACKED and inner.size % lanes == 0):
        return inner.axis
    return None


def _block_axes(s: LogicalSpec, lanes: int) -> tuple[int, int] | None:
    """(source run axis, destination run axis) of a lanes x lanes block Move whose source
    and destination run along different axes, or None."""
    big = [d for d, n in enumerate(s.shape) if n != 1]
    if lanes not in SHUFFLES or len(big) != 2 or any(s.shape[d] != lanes for d in big):
        return None
    src, dst = s.operands
    sa, da = _run_axis(src, lanes), _run_axis(dst, lanes)
    if sa is None or da is None or sa == da:
        return None
    return sa, da


def _applies(s: LogicalSpec, t: Target) -> bool:
    return _block_axes(s, t.lanes(F32)) is not None


def _memory(s: LogicalSpec, t: Target) -> Limits:
    return regs(vrf=t.lanes(F32))


def _cost(s: LogicalSpec, t: Target) -> int:
    """The shuffles, plus each operand's lines touched once; a bf16 source's widening is
    one unit per vector (as `WIDEN_VECTOR_COST` of the row kernels)."""
    lanes = t.lanes(F32)
    widen = lanes if s.operands[0].dtype == BF16 else 0
    return SHUFFLE_COST * SHUFFLES[lanes] + widen + io_cost(s, t)


#: One source run as f32 lanes, by (source dtype, lanes): a load, and for bf16 a
#: zero-extension and a shift into the high half (as `emit_helpers.widen`).
_LOADS = {
    (F32, 16): "_mm512_loadu_ps(s + {k} * ss)",
    (F32, 8): "_mm256_loadu_ps(s + {k} * ss)",
    (BF16, 16): "_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32("
    "_mm256_loadu_si256((const __m256i *)(s + {k} * ss))), 16))",
    (BF16, 8): "_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32("
    "_mm_loadu_si128((const __m128i *)(s + {k} * ss))), 16))",
}


def helper_name(dtype: Dtype, lanes: int) -> str:
    return f"mb_transpose_{dtype.value}_f32_{lanes}"


def _helper_source(dtype: Dtype, lanes: int, index: str) -> str:
    """C of `mb_transpose_<dtype>_f32_<lanes>(s, ss, d, ds)`: row r of the block at
    s + r * ss (widened to f32 when bf16), written as column r at d + c * ds."""
    ctype = "float" if dtype == F32 else "uint16_t"
    head = (
        f"static inline void {helper_name(dtype, lanes)}(const {ctype} *restrict s, "
        f"{index} ss, float *restrict d, {index} ds) {{\n"
    )
    load = _LOADS[dtype, lanes]
    body: list[str] = []
    if lanes == 16:
        body += [f"    const __m512 r{k} = {load.format(k=k)};" for k in range(16)]
        for k in range(0, 16, 2):  # pairs of rows interleaved by 32-bit lanes
            body.append(
                f"    const __m512 a{k} = _mm512_unpacklo_ps(r{k}, r{k + 1}), "
                f"a{k + 1} = _mm512_unpackhi_ps(r{k}, r{k + 1});"
            )
        for g in range(0, 16, 4):  # then by 64-bit lanes
            for x, (p, q, half) in enumerate(
                ((g, g + 2, "lo"), (g, g + 2, "hi"), (g + 1, g + 3, "lo"), (g + 1, g + 3, "hi"))
            ):
                body.append(
                    f"    const __m512 b{g + x} = _mm512_castpd_ps(_mm512_unpack{half}_pd("
                    f"_mm512_castps_pd(a{p}), _mm512_castps_pd(a{q})));"
                )
        for g in (0, 8):  # then by 128-bit lanes, twice
            for x in range(4):
                c, d = g + x, g + x + 4
                body.append(
                    f"    const __m512 c{c} = _mm512_shuffle_f32x4(b{c}, b{d}, 0x88), "
                    f"c{d} = _mm512_shuffle_f32x4(b{c}, b{d}, 0xdd);"
                )
        for x in range(8):
            body.append(
                f"    _mm512_storeu_ps(d + {x} * ds, _mm512_shuffle_f32x4(c{x}, c{x + 8}, 0x88));"
            )
            body.append(
                f"    _mm512_storeu_ps(d + {x + 8} * ds, _mm512_shuffle_f32x4(c{x}, c{x + 8}, 0xdd));"
            )
    else:
        body += [f"    const __m256 r{k} = {load.format(k=k)};" for k in range(8)]
        for k in range(0, 8, 2):
            body.append(
                f"    const __m256 a{k} = _mm256_unpacklo_ps(r{k}, r{k + 1}), "
                f"a{k + 1} = _mm256_unpackhi_ps(r{k}, r{k + 1});"
            )
        for g in (0, 4):
            for x, (p, q) in enumerate(((g, g + 2), (g + 1, g + 3))):
                body.append(
                    f"    const __m256 b{g + 2 * x} = _mm256_shuffle_ps(a{p}, a{q}, 0x44), "
                    f"b{g + 2 * x + 1} = _mm256_shuffle_ps(a{p}, a{q}, 0xee);"
                )
        for x in range(4):
            body.append(
                f"    _mm256_storeu_ps(d + {x} * ds, _mm256_permute2f128_ps(b{x}, b{x + 4}, 0x20));"
            )
            body.append(
                f"    _mm256_storeu_ps(d + {x + 4} * ds, _mm256_permute2f128_ps(b{x}, b{x + 4}, 0x31));"
            )
    return head + "\n".join(body) + "\n}\n"


def _use_helper(ctx: Ctx, dtype: Dtype, lanes: int) -> None:
    """Declare the block transpose for this file, its strides in the kernel's index type
    (`int` unless some offset of the kernel exceeds it)."""
    key = f"tr_{dtype.value}_{lanes}_{ctx.index_type}"
    if key not in ctx.helpers:
        ctx.use_helper(key, _helper_source(dtype, lanes, ctx.index_type))
    ctx.includes.add("immintrin.h")


def _aligned(view: View, axis: int, step: int) -> bool:
    """The view starts on a multiple of `step` along `axis` (in every loop iteration)."""
    start = view.offset[axis]
    return start.const % step == 0 and all(c % step == 0 for _, c in start.terms)


def _run(
    ctx: Ctx, view: View, at: Callable[[int, int], tuple[int, ...]], r: int, lanes: int, axis: int
) -> Loc | None:
    """Location of `at(r, 0)` when `at(r, 0) .. at(r, lanes - 1)`, a step along `axis`
    each, are one unit-stride run of memory `view`: proven by constant offsets, or, where
    the buffer packs `axis` into blocks (whose index math is opaque C), promised by the
    layout when the view starts on a multiple of `lanes` along `axis` and the blocks are a
    multiple of `lanes`."""
    if view.buf.kind != MEM:
        return None
    base = ctx.amap.loc(view, at(r, 0))
    if base.addr is None:
        return None
    if all(offset_from(ctx, view, base, at(r, j)) == j for j in range(lanes)):
        return base
    inner = view.buf.layout.dims[-1]
    packed = inner.axis == axis and inner.kind == lay.PACKED and inner.size % lanes == 0
    return base if packed and _aligned(view, axis, lanes) else None


def _runs(
    ctx: Ctx, view: View, at: Callable[[int, int], tuple[int, ...]], lanes: int, axis: int
) -> tuple[Loc, int] | None:
    """(start of run 0, the constant stride between runs) when run r (`at(r, j)` for j in
    0..lanes-1, along `axis`) is a unit-stride run for every r, or None."""
    starts = [_run(ctx, view, at, r, lanes, axis) for r in range(lanes)]
    first = starts[0]
    if first is None or any(loc is None for loc in starts):
        return None
    steps = [offset_from(ctx, view, first, at(r, 0)) for r in range(lanes)]
    stride = steps[1]
    if stride is None or any(st != r * stride for r, st in enumerate(steps)):
        return None
    return first, stride


def _plane_point(rank: int, a_axis: int, b_axis: int) -> Callable[[int, int], tuple[int, ...]]:
    """`at(a, b)`: the rank-`rank` point at `a` along `a_axis` and `b` along `b_axis`, 0 on
    every other axis (a block transpose moves values within that plane)."""

    def at(a: int, b: int) -> tuple[int, ...]:
        p = [0] * rank
        p[a_axis], p[b_axis] = a, b
        return tuple(p)

    return at


def _emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """One helper call per block: the source's runs a constant stride apart, the
    destination's too. Element by element where the views do not have that shape (the
    Spec's layouts promise it; a view outside the promise still gets correct code)."""
    lanes = max(spec.shape)
    axes = _block_axes(spec, lanes)
    if axes is None:
        raise CodegenError(f"no block transpose applies to {spec.text()}")
    sa, da = axes
    at = _plane_point(len(spec.shape), sa, da)  # (along the source axis, along the destination's)
    src, dst = views
    # source run r: the values at dst-axis index r, along the source axis; destination run r:
    # the values at source-axis index r, along the destination axis
    s_runs = _runs(ctx, src, lambda r, j: at(j, r), lanes, sa)
    d_runs = _runs(ctx, dst, lambda r, j: at(r, j), lanes, da)
    if s_runs is None or d_runs is None:
        generic_move(ctx, spec, views)
        return
    (s0, ss), (d0, ds) = s_runs, d_runs
    dtype = spec.operands[0].dtype
    _use_helper(ctx, dtype, lanes)
    ctx.line(f"{helper_name(dtype, lanes)}(&{s0.ref()}, {ss}, &{d0.ref()}, {ds});")


TRANSPOSE_F32 = Kernel(
    name="TransposeF32",
    kind=MOVE,
    applies=_applies,
    memory=_memory,
    cost=_cost,
    emit=_emit,
    dtypes=(F32, F32),
)
#: The same with a bf16 source widened as it is loaded (`k.T` of bf16 attention inputs).
TRANSPOSE_BF16_F32 = replace(TRANSPOSE_F32, name="TransposeBf16F32", dtypes=(BF16, F32))


# ---- bf16 into k-pairs --------------------------------------------------------------------
#
# AMX (and vdpbf16ps) read B as k-pairs: `[..., 2, 1p2]`, values (k, n) and (k + 1, n)
# side by side. Packing a column-major bf16 B (`k.T` of bf16 attention inputs) into that
# layout is a transpose of 32-bit units: a source run of 2 * lanes bf16 along k is lanes
# pairs, and destination row k / 2 holds lanes pairs along n. So the f32 block transpose
# moves a (2 * lanes) x lanes bf16 block, its pointers and strides taken in 32-bit units.


def _pairs_axes(s: LogicalSpec, lanes: int) -> tuple[int, int] | None:
    """(k axis, n axis) of a bf16 Move of 2 * lanes along k and lanes along n from runs along
    k into k-pairs whose rows run along n, or None."""
    if lanes not in SHUFFLES:
        return None
    src, dst = s.operands
    ka = _run_axis(src, 2 * lanes)
    dims = dst.layout.dims
    if ka is None or len(dims) < 2 or dst.layout.contig < 2 or not dst.level.in_memory:
        return None
    if dims[-1] != lay.PhysDim(ka, lay.PACKED, 2):
        return None
    outer = dims[-2]
    na = outer.axis
    if na == ka or not (
        outer.kind == lay.DYN or (outer.kind == lay.PACKED and outer.size % lanes == 0)
    ):
        return None
    big = {d: n for d, n in enumerate(s.shape) if n != 1}
    return (ka, na) if big == {ka: 2 * lanes, na: lanes} else None


def _pairs_applies(s: LogicalSpec, t: Target) -> bool:
    return _pairs_axes(s, t.lanes(F32)) is not None


def _pair_rows(
    ctx: Ctx, view: View, at: Callable[[int, int], tuple[int, ...]], lanes: int
) -> int | None:
    """The stride (in bf16 values) between destination pair-rows when element `at(k, n)` of
    an aligned block sits at `stride * (k // 2) + 2 * n + k % 2` from element `at(0, 0)`.
    The block's index math is opaque C (divisions by the pair), so the offsets are those of
    the same block at the buffer's origin, which an aligned block shares."""
    origin = View.whole(view.buf)
    base = ctx.amap.loc(origin, at(0, 0))
    stride = offset_from(ctx, origin, base, at(2, 0))
    if stride is None:
        return None
    for k in range(2 * lanes):
        for n in range(lanes):
            if offset_from(ctx, origin, base, at(k, n)) != stride * (k // 2) + 2 * n + k % 2:
                return None
    return stride


def _pairs_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """One f32 block transpose over the bf16 pairs, or the element copy where the views do
    not have the shape the layouts promise."""
    lanes = max(spec.shape) // 2
    axes = _pairs_axes(spec, lanes)
    if axes is None:
        raise CodegenError(f"no k-pair transpose applies to {spec.text()}")
    ka, na = axes
    at = _plane_point(len(spec.shape), ka, na)  # (k, n)
    src, dst = views
    s_runs = _runs(ctx, src, lambda r, j: at(j, r), 2 * lanes, ka)
    aligned = dst.buf.kind == MEM and _aligned(dst, ka, 2 * lanes) and _aligned(dst, na, lanes)
    ds = _pair_rows(ctx, dst, at, lanes) if aligned else None
    if s_runs is None or s_runs[1] % 2 or ds is None or ds % 2:
        generic_move(ctx, spec, views)
        return
    s0, ss = s_runs
    d0 = ctx.amap.loc(dst, at(0, 0))
    _use_helper(ctx, F32, lanes)
    fn = helper_name(F32, lanes)
    ctx.line(
        f"{fn}((const float *)&{s0.ref()}, {ss // 2}, (float *)&{d0.ref()}, {ds // 2});"
        "  /* bf16 pairs as 32-bit lanes */"
    )


def _pairs_cost(s: LogicalSpec, t: Target) -> int:
    return SHUFFLE_COST * SHUFFLES[t.lanes(F32)] + io_cost(s, t)


TRANSPOSE_BF16_PAIRS = Kernel(
    name="TransposeBf16Pairs",
    kind=MOVE,
    applies=_pairs_applies,
    memory=_memory,
    cost=_pairs_cost,
    emit=_pairs_emit,
    dtypes=(BF16, BF16),
)
