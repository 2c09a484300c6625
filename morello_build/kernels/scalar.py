"""Element-by-element kernels: one multiply-add, copy, widening or zero of single values.

Their emitters spell out the Spec's semantics element by element, so the vector kernels
fall back on them (`generic_matmul`, `generic_zero`) for views they have no fast form for.
"""

from __future__ import annotations

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import CodegenError, View, coords
from morello_build.ir.dtypes import Dtype
from morello_build.ir.spec import MATMUL, MOVE, ZERO, LogicalSpec
from morello_build.kernels.base import SCALAR_LEVELS, Kernel, io_cost, no_memory, scalar_here
from morello_build.machine.target import Target

F32, BF16 = Dtype.F32, Dtype.BF16

#: Largest region the element-by-element emitters will spell out.
_MAX_UNROLLED = 4096


def _check_small(spec: LogicalSpec) -> None:
    if spec.volume > _MAX_UNROLLED:
        raise CodegenError(f"no vector form for {spec.text()} and too big to unroll")


def generic_matmul(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """out[b,m,n] += lhs[b,m,k] * rhs[b,k,n], one statement per product."""
    _check_small(spec)
    a, b, c = views
    for bb, m, k, n in coords(spec.shape):
        out = ctx.amap.loc(c, (bb, m, n))
        x = ctx.read_f32(ctx.amap.loc(a, (bb, m, k)))
        y = ctx.read_f32(ctx.amap.loc(b, (bb, k, n)))
        if out.buf.dtype != Dtype.F32:
            raise CodegenError(f"matmul output dtype {out.buf.dtype} is not supported")
        ctx.line(f"{out.ref()} += {x} * {y};")


def generic_move(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """dst[p] = src[p] (widened when the dtypes differ)."""
    _check_small(spec)
    src, dst = views
    for p in coords(spec.shape):
        s = ctx.amap.loc(src, p)
        d = ctx.amap.loc(dst, p)
        if s.buf.dtype == d.buf.dtype:
            value = s.ref()
        elif (s.buf.dtype, d.buf.dtype) == (Dtype.BF16, Dtype.F32):
            value = ctx.read_f32(s)
        else:
            raise CodegenError(f"no cast from {s.buf.dtype} to {d.buf.dtype}")
        ctx.line(f"{d.ref()} = {value};")


def generic_zero(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    _check_small(spec)
    for p in coords(spec.shape):
        ctx.line(f"{ctx.amap.loc(views[0], p).ref()} = 0;")


# ---- MultAdd: c += a * b on single values ---------------------------------------------


def _mult_add_applies(s: LogicalSpec, t: Target) -> bool:
    a, b, c = s.operands
    return s.accum and all(scalar_here(o) for o in s.operands) and c.dtype == F32


def _mult_add_cost(s: LogicalSpec, t: Target) -> int:
    # bf16 x bf16 -> f32 converts both inputs (a shift each): priced like CastBf16F32.
    base = 1 if s.operands[0].dtype == F32 else 4
    return base + io_cost(s, t)


MULT_ADD = Kernel(
    name="MultAdd",
    kind=MATMUL,
    applies=_mult_add_applies,
    memory=no_memory,
    cost=_mult_add_cost,
    emit=generic_matmul,
    levels=(SCALAR_LEVELS, SCALAR_LEVELS, SCALAR_LEVELS),
)


# ---- Assign, CastBf16F32: one value copied (or widened) -------------------------------


def _assign_applies(s: LogicalSpec, t: Target) -> bool:
    a, b = s.operands
    return a.dtype == b.dtype and scalar_here(a) and scalar_here(b)


def _assign_cost(s: LogicalSpec, t: Target) -> int:
    return io_cost(s, t) + 1


def _cast_applies(s: LogicalSpec, t: Target) -> bool:
    a, b = s.operands
    return (a.dtype, b.dtype) == (BF16, F32) and scalar_here(a) and scalar_here(b)


def _cast_cost(s: LogicalSpec, t: Target) -> int:
    return 4 + io_cost(s, t)


ASSIGN = Kernel(
    name="Assign",
    kind=MOVE,
    applies=_assign_applies,
    memory=no_memory,
    cost=_assign_cost,
    emit=generic_move,
)

CAST_BF16_F32 = Kernel(
    name="CastBf16F32",
    kind=MOVE,
    applies=_cast_applies,
    memory=no_memory,
    cost=_cast_cost,
    emit=generic_move,
)


# ---- ValueZero: one value set to 0 ----------------------------------------------------


def _value_zero_applies(s: LogicalSpec, t: Target) -> bool:
    return scalar_here(s.operands[0])


def _value_zero_cost(s: LogicalSpec, t: Target) -> int:
    return io_cost(s, t) + 1


VALUE_ZERO = Kernel(
    name="ValueZero",
    kind=ZERO,
    applies=_value_zero_applies,
    memory=no_memory,
    cost=_value_zero_cost,
    emit=generic_zero,
)
