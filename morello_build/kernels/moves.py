"""Whole-vector and whole-region data kernels: vector loads, stores and copies, bf16
widening in registers, and zeroing of vectors or contiguous memory.

Each emitter works vector by vector and falls back to per-lane statements (or to the
element-by-element `scalar` emitters) where no vector form fits.
"""

from __future__ import annotations

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import MEM, VRF, CodegenError, View, coords
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.spec import MOVE, ZERO, LogicalSpec
from morello_build.ir.tensorspec import TensorSpec
from morello_build.kernels.base import Kernel, in_vectors, no_memory, vectors
from morello_build.kernels.emit_helpers import (
    contiguous_run,
    is_full,
    is_padded_row,
    lane_mask,
    same_vector,
    vector_groups,
    widen,
)
from morello_build.kernels.scalar import generic_zero
from morello_build.machine.isa import isa_includes
from morello_build.machine.target import Target

F32, BF16 = Dtype.F32, Dtype.BF16

#: Storing one 64-byte vector register: the time of 2 FMAs (2 units each in the broadcast
#: FMA's cost); a register tile's zmm stores do not hide behind its FMAs, 32-byte stores
#: do and keep one unit (docs/cost-model.md, "Vector stores").
ZMM_STORE_COST = 4

#: One load into vector registers on AVX-512, on top of one unit per register: a price per
#: load *group*, so that the search prefers loading B for several k steps at once, ahead of
#: the FMAs; AVX2 keeps the plain price (docs/cost-model.md, "Vector load groups").
VRF_LOAD_COST = 1


# ---- VectorAssign -----------------------------------------------------------------------


def _vassign_applies(s: LogicalSpec, t: Target) -> bool:
    a, b = s.operands
    if a.dtype != b.dtype or not (a.is_contiguous and b.is_contiguous) or a.layout != b.layout:
        return False
    if Level.VRF not in (a.level, b.level):
        return False
    if a.level is Level.VRF and b.level is Level.VRF and a.vector_size != b.vector_size:
        return False
    return all(o.level in (Level.VRF, Level.L1) for o in (a, b))


def _vassign_cost(s: LogicalSpec, t: Target) -> int:
    a, b = s.operands
    if b.level is not Level.VRF:  # a store from the registers of `a`
        zmm = a.vector_size is not None and a.vector_size * a.dtype.size == 64
        return (ZMM_STORE_COST if zmm else 1) * a.registers + _split_cost(b, a, t)
    if a.level is not Level.VRF and isa_includes(t.isa, "avx512"):  # a load
        return b.registers + VRF_LOAD_COST + _split_cost(a, b, t)
    return b.registers + _split_cost(a, b, t)  # an AVX2 load, or between registers


def _split_cost(mem: TensorSpec, reg: TensorSpec, t: Target) -> int:
    """What the accesses of `reg`'s registers to `mem` add when `mem` may start anywhere
    in a line (a caller's array, `TensorSpec.aligned`): at numpy's 16 bytes past a line every
    64-byte vector splits two lines, and every other 32-byte one (docs/cost-model.md, "Split
    loads")."""
    if mem.aligned or not t.split_cost or not mem.level.in_memory or reg.vector_size is None:
        return 0
    return t.split_cost * reg.registers * reg.vector_size * reg.dtype.size // 64


def _vassign_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """Whole-vector copies between vector registers and memory (or registers)."""
    src, dst = views
    if src.buf.dtype != dst.buf.dtype:
        raise CodegenError(f"VectorAssign between dtypes in {spec.text()}")
    reg, other = (dst, src) if dst.buf.kind == VRF else (src, dst)
    if reg.buf.kind != VRF:
        raise CodegenError(f"VectorAssign without a vector register operand: {spec.text()}")
    loading = reg is dst
    reg_t, other_t = (spec.operands[1], spec.operands[0])
    if not loading:
        reg_t, other_t = other_t, reg_t
    # The Spec's layouts are the proof of contiguity when index expressions cannot be
    # compared term by term (e.g. a vector of a packed panel: `(16 * i + lane) / 32 % 16`):
    # a fully contiguous memory tensor laid out like the register tensor holds each
    # register's lanes as one run starting at its lane-0 element.
    same_order = (
        other.buf.kind == MEM and other_t.is_contiguous and other_t.layout.dims == reg_t.layout.dims
    )
    for j, members in vector_groups(ctx, reg):
        name = reg.buf.vector_name(j)
        full = is_full(reg, members)
        if full:
            other_vec = same_vector(ctx, other, members)
            if other_vec is not None:
                ctx.line(f"{name} = {other_vec};" if loading else f"{other_vec} = {name};")
                continue
        run = None
        if full or is_padded_row(reg, members):  # padded rows are f32: MASKED_DTYPES
            run = contiguous_run(ctx, other, members)
            if run is None and same_order:
                run = next(ctx.amap.loc(other, p) for p, lane in members if lane == 0)
        if run is not None and full:
            ctx.includes.add("string.h")
            if loading:
                ctx.line(f"memcpy(&{name}, &{run.ref()}, sizeof {name});")
            else:
                ctx.line(f"memcpy(&{run.ref()}, &{name}, sizeof {name});")
            continue
        if run is not None:
            vs = reg.buf.vector_size
            assert vs
            load, store = lane_mask(ctx, vs, reg.buf.last_lanes())
            if loading:
                ctx.line(f"{name} = ({ctx.vtype(Dtype.F32, vs)}){load.format(src=run.ref())};")
            else:
                ctx.line(store.format(dst=run.ref(), vec=name))
            continue
        for p, lane in members:
            o = ctx.amap.loc(other, p).ref()
            if loading:
                ctx.line(f"{name}[{lane}] = {o};")
            else:
                ctx.line(f"{o} = {name}[{lane}];")


VECTOR_ASSIGN = Kernel(
    name="VectorAssign",
    kind=MOVE,
    applies=_vassign_applies,
    memory=no_memory,
    cost=_vassign_cost,
    emit=_vassign_emit,
)


# ---- VectorCastBf16F32 ------------------------------------------------------------------


def _vcast_applies(s: LogicalSpec, t: Target) -> bool:
    a, b = s.operands
    return (
        (a.dtype, b.dtype) == (BF16, F32)
        and in_vectors(a)
        and in_vectors(b)
        and a.vector_size == b.vector_size
        and a.layout == b.layout
    )


def _vcast_cost(s: LogicalSpec, t: Target) -> int:
    return 2 * vectors(s.operands[0])


def _vcast_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """Widen bf16 vectors to f32 vectors with the same lanes."""
    src, dst = views
    if dst.buf.kind != VRF:
        raise CodegenError(f"VectorCastBf16F32 needs a vector destination: {spec.text()}")
    for j, members in vector_groups(ctx, dst):
        name = dst.buf.vector_name(j)
        vec = same_vector(ctx, src, members)
        if vec is not None and is_full(dst, members):
            vs = dst.buf.vector_size
            assert vs
            ctx.line(f"{name} = {widen(ctx, vec, vs)};")
            continue
        for p, lane in members:
            ctx.line(f"{name}[{lane}] = {ctx.read_f32(ctx.amap.loc(src, p))};")


VECTOR_CAST_BF16_F32 = Kernel(
    name="VectorCastBf16F32",
    kind=MOVE,
    applies=_vcast_applies,
    memory=no_memory,
    cost=_vcast_cost,
    emit=_vcast_emit,
)


# ---- MemsetZero -------------------------------------------------------------------------


def _memset_applies(s: LogicalSpec, t: Target) -> bool:
    (o,) = s.operands
    return o.level.in_memory and o.is_contiguous


def _memset_cost(s: LogicalSpec, t: Target) -> int:
    """One unit per 64-byte line, the cost of a VectorAssign store of one line (the
    reference's flat 1 made zeroing in memory and loading the zeros look free).

    A zero in a Spec that may still run threads (not `serial`) runs on one thread before
    the parallel loops while the other cores wait, so it is charged like main-memory
    stores (`Target.move_cost`), which makes the threads zero their own rows instead.
    Zeros inside a parallel loop or in one-thread kernels are serial Specs and keep one
    unit per line (docs/cost-model.md, "Zeroing memory").
    """
    (o,) = s.operands
    return o.cache_lines() if s.serial else t.move_cost(o)


def _memset_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """memset of the contiguous region (the whole buffer needs no address checks)."""
    (view,) = views
    buf = view.buf
    if buf.kind != MEM:
        generic_zero(ctx, spec, views)
        return
    ctx.includes.add("string.h")
    whole = view.shape == buf.shape and all(o.is_const and o.const == 0 for o in view.offset)
    if whole:
        ctx.line(f"memset({buf.name}, 0, {buf.physical_volume() * buf.dtype.size});")
        return
    locs = [ctx.amap.loc(view, p) for p in coords(view.shape)]
    first = min(locs, key=lambda loc: loc.addr.affine.const if loc.addr else 0)
    assert first.addr is not None
    consts = sorted(loc.addr.affine.const for loc in locs if loc.addr is not None)
    if all(loc.addr is not None and loc.addr.same_base(first.addr) for loc in locs) and (
        consts == list(range(consts[0], consts[0] + len(consts)))
    ):
        ctx.line(f"memset(&{first.ref()}, 0, {len(locs) * buf.dtype.size});")
        return
    generic_zero(ctx, spec, views)


MEMSET_ZERO = Kernel(
    name="MemsetZero",
    kind=ZERO,
    applies=_memset_applies,
    memory=no_memory,
    cost=_memset_cost,
    emit=_memset_emit,
)


# ---- VectorZero -------------------------------------------------------------------------


def _vzero_applies(s: LogicalSpec, t: Target) -> bool:
    return in_vectors(s.operands[0])


def _vzero_cost(s: LogicalSpec, t: Target) -> int:
    return vectors(s.operands[0])


def _vzero_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """Every lane of every vector of the view set to 0."""
    (view,) = views
    if view.buf.kind != VRF:
        generic_zero(ctx, spec, views)
        return
    vs = view.buf.vector_size
    assert vs
    vt = ctx.vtype(view.buf.dtype, vs)
    for j, members in vector_groups(ctx, view):
        name = view.buf.vector_name(j)
        if is_full(view, members) or is_padded_row(view, members):
            ctx.line(f"{name} = ({vt}){{0}};")
        else:
            for _, lane in members:
                ctx.line(f"{name}[{lane}] = 0;")


VECTOR_ZERO = Kernel(
    name="VectorZero",
    kind=ZERO,
    applies=_vzero_applies,
    memory=no_memory,
    cost=_vzero_cost,
    emit=_vzero_emit,
)
