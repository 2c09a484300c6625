"""C-building steps several kernel emitters share.

Vector kernels work vector by vector: a destination vector whose lanes line up with a
whole source vector (or a contiguous run of memory) becomes one vector statement;
anything else falls back to per-lane statements, which are always correct. Tile kernels
need their operands as rows a constant stride apart, which `strided_rows` checks.
"""

from __future__ import annotations

from collections.abc import Callable

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import MEM, VRF, CodegenError, Loc, View, coords
from morello_build.ir.dtypes import Dtype

#: One vector's members: (coordinate in the view, lane).
Members = list[tuple[tuple[int, ...], int]]


def vector_groups(ctx: Ctx, view: View) -> list[tuple[int, Members]]:
    """The VRF view's elements grouped by vector: (vector number, [(coord, lane)])."""
    groups: dict[int, Members] = {}
    for p in coords(view.shape):
        loc = ctx.amap.loc(view, p)
        groups.setdefault(loc.index, []).append((p, loc.lane))
    return sorted(groups.items())


def is_full(view: View, members: Members) -> bool:
    vs = view.buf.vector_size
    return len(members) == vs and sorted(lane for _, lane in members) == list(range(vs or 0))


def is_padded_row(view: View, members: Members) -> bool:
    """The members are exactly the valid lanes of a padded row's last register."""
    buf = view.buf
    if not buf.padded or sorted(lane for _, lane in members) != list(range(buf.last_lanes())):
        return False
    axis = buf.layout.dims[-1].axis  # the padded axis: rows run along it
    start = view.offset[axis]
    p, lane = members[0]
    return start.is_const and start.const + p[axis] - lane + buf.last_lanes() == buf.padded


def lane_mask(ctx: Ctx, lanes: int, valid: int) -> tuple[str, str]:
    """(C expression of a masked load of `valid` f32 lanes, store statement template)."""
    ctx.includes.add("immintrin.h")
    if lanes == 16:
        k = f"(__mmask16){hex((1 << valid) - 1)}"
        return (
            f"_mm512_maskz_loadu_ps({k}, &{{src}})",
            f"_mm512_mask_storeu_ps(&{{dst}}, {k}, (__m512){{vec}});",
        )
    width = 256 if lanes == 8 else 128
    pre = "_mm256" if width == 256 else "_mm"
    bits = ", ".join("-1" if i < valid else "0" for i in range(lanes))
    m = f"{pre}_setr_epi32({bits})"
    cast = "__m256" if width == 256 else "__m128"
    return (
        f"{pre}_maskload_ps(&{{src}}, {m})",
        f"{pre}_maskstore_ps(&{{dst}}, {m}, ({cast}){{vec}});",
    )


def same_vector(ctx: Ctx, view: View, members: Members) -> str | None:
    """Name of the vector of VRF `view` holding exactly these coords in these lanes."""
    if view.buf.kind != VRF:
        return None
    locs = [ctx.amap.loc(view, p) for p, _ in members]
    if len({loc.index for loc in locs}) != 1:
        return None
    if any(loc.lane != lane for loc, (_, lane) in zip(locs, members)):
        return None
    return view.buf.vector_name(locs[0].index)


def contiguous_run(ctx: Ctx, view: View, members: Members) -> Loc | None:
    """Location of lane 0 if memory `view` holds these coords as one run in lane order."""
    if view.buf.kind != MEM:
        return None
    locs = [ctx.amap.loc(view, p) for p, _ in members]
    by_lane = {lane: loc for loc, (_, lane) in zip(locs, members)}
    first = by_lane.get(0)
    if first is None or first.addr is None:
        return None
    for lane, loc in by_lane.items():
        assert loc.addr is not None
        if not loc.addr.same_base(first.addr):
            return None
        if loc.addr.affine.const != first.addr.affine.const + lane:
            return None
    return first


def memory_run(ctx: Ctx, view: View) -> Loc | None:
    """Location of element 0 when the whole memory view is one contiguous run in row-major
    coordinate order (the order kernels like dot products walk it)."""
    return contiguous_run(ctx, view, [(p, i) for i, p in enumerate(coords(view.shape))])


#: f32 lanes -> (zero-extend u16 -> u32, the bf16 register's intrinsic type, shift left u32).
_WIDEN_INTRINSICS = {
    8: ("_mm256_cvtepu16_epi32", "__m128i", "_mm256_slli_epi32"),
    16: ("_mm512_cvtepu16_epi32", "__m256i", "_mm512_slli_epi32"),
}


def widen(ctx: Ctx, vec: str, lanes: int) -> str:
    """bf16 vector (uint16 lanes) -> f32 vector: zero-extend, shift into the high half.

    Written with intrinsics (one `vpmovzxwd` from memory and one shift) rather than the
    portable `(f32)(__builtin_convertvector(x, u32) << 16)`, which gcc 12 compiles into
    three shuffle-port ops per register (docs/cost-model.md, "Widening bf16").
    """
    f32 = ctx.vtype(Dtype.F32, lanes)
    if lanes in _WIDEN_INTRINSICS:
        extend, half, shift = _WIDEN_INTRINSICS[lanes]
        ctx.includes.add("immintrin.h")
        return f"({f32}){shift}({extend}(({half})({vec})), 16)"
    u32 = ctx.vtype(Dtype.U32, lanes)
    return f"({f32})(__builtin_convertvector({vec}, {u32}) << 16)"


def offset_from(ctx: Ctx, view: View, base: Loc, coord: tuple[int, ...]) -> int | None:
    """Element offset of `coord` from `base` when it is a compile-time constant."""
    loc = ctx.amap.loc(view, coord)
    if loc.addr is None or base.addr is None or not loc.addr.same_base(base.addr):
        return None
    return loc.addr.affine.const - base.addr.affine.const


def row_start(ctx: Ctx, view: View, coord: tuple[int, ...], axis: int, length: int) -> Loc | None:
    """Location of `coord` when the next `length` elements along `axis` follow it in memory."""
    if view.buf.kind != MEM:
        return None
    first = ctx.amap.loc(view, coord)
    if first.addr is None:
        return None
    for step in {1, length // 2, length - 1}:
        if step <= 0:
            continue
        p = list(coord)
        p[axis] += step
        if offset_from(ctx, view, first, tuple(p)) != step:
            return None
    return first


def strided_rows(
    ctx: Ctx,
    view: View,
    coord: Callable[[int, int], tuple[int, ...]],
    rows: int,
    cols: list[int],
    offset: Callable[[int, int, int], int],
    what: str,
) -> tuple[Loc, int]:
    """(location of row 0 col 0, row stride) when element (r, j) of `view` (at `coord(r, j)`)
    sits at `offset(r, j, stride)` from it for every row and the sampled columns. Raises
    CodegenError otherwise (the tile instructions need one stride and contiguous rows)."""
    if view.buf.kind != MEM:
        raise CodegenError(f"{what}: not in memory")
    base = ctx.amap.loc(view, coord(0, 0))
    stride = offset_from(ctx, view, base, coord(1, 0)) if rows > 1 else 0
    if stride is None or stride < 0:
        raise CodegenError(f"{what}: rows are not a constant stride apart")
    for r in range(rows):
        for j in cols:
            if offset_from(ctx, view, base, coord(r, j)) != offset(r, j, stride):
                raise CodegenError(f"{what}: element ({r}, {j}) breaks the row pattern")
    return base, stride


def row_major_rows(ctx: Ctx, view: View, rows: int, cols: list[int], what: str) -> tuple[Loc, int]:
    """`strided_rows` of a 1 x rows x cols tile stored row by row."""
    return strided_rows(
        ctx, view, lambda r, j: (0, r, j), rows, cols, lambda r, j, st: r * st + j, what
    )
