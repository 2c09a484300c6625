"""Broadcast FMA: a vector row (or column) of C += one scalar * a vector of the other input.

The register-tile kernel: the search tiles C into vector registers and walks k around it.
'row': c[1,1,n] += a[1,1,1] * b[1,1,n]; 'col': c[1,m,1] += a[1,m,1] * b[1,1,1]. The bf16
variant widens each B vector in registers on every call.
"""

from __future__ import annotations

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import VRF, CodegenError, View
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import Limits
from morello_build.ir.spec import MATMUL, LogicalSpec
from morello_build.kernels.base import (
    SCALAR_LEVELS,
    VECTOR_LEVELS,
    Kernel,
    in_vectors,
    regs,
    scalar_here,
    vectors,
)
from morello_build.kernels.emit_helpers import (
    Members,
    is_full,
    is_padded_row,
    same_vector,
    vector_groups,
    widen,
)
from morello_build.machine.isa import isa_includes
from morello_build.machine.target import Target

F32, BF16 = Dtype.F32, Dtype.BF16


def _orientation(s: LogicalSpec) -> str | None:
    """'row': c[1,1,n] += a[1,1,1] * b[1,1,n]; 'col': c[1,m,1] += a[1,m,1] * b[1,1,1]."""
    bdim, m, k, n = s.shape
    if bdim != 1 or k != 1:
        return None
    if m == 1:
        return "row"
    if n == 1:
        return "col"
    return None


def _f32_applies(s: LogicalSpec, t: Target) -> bool:
    a, b, c = s.operands
    if not s.accum or not in_vectors(c):
        return False
    o = _orientation(s)
    if o == "row":
        return scalar_here(a) and in_vectors(b) and b.vector_size == c.vector_size
    if o == "col":
        return scalar_here(b) and in_vectors(a) and a.vector_size == c.vector_size and a.volume > 1
    return False


def _f32_cost(s: LogicalSpec, t: Target) -> int:
    return 2 * vectors(s.operands[2]) + 1


def _f32_memory(s: LogicalSpec, t: Target) -> Limits:
    """One vector register for the broadcast scalar, except where AVX-512 folds it into the
    FMA: an EVEX FMA reads a scalar from memory as an embedded broadcast (`{1to16}`), and
    gcc and clang emit that form when the scalar feeds a single FMA (a C row of one
    vector). So a 16x16 C tile and all 16 rows of B fit the 32 zmm registers, which is how
    the DP's 16^3 kernel keeps B in registers (see `moves.VRF_LOAD_COST`). AVX2 has no
    embedded broadcast, and a scalar feeding several FMAs is broadcast into a register once."""
    a, b, c = s.operands
    scalar = a if _orientation(s) == "row" else b
    if isa_includes(t.isa, "avx512") and vectors(c) == 1 and scalar.level is not Level.RF:
        return regs()
    return regs(vrf=1)


def _bf16_applies(s: LogicalSpec, t: Target) -> bool:
    a, b, c = s.operands
    return (
        s.accum
        and _orientation(s) == "row"
        and scalar_here(a)
        and in_vectors(b)
        and in_vectors(c)
        and b.vector_size == c.vector_size
    )


def _bf16_cost(s: LogicalSpec, t: Target) -> int:
    """The f32 broadcast-FMA plus the widening it does on every call: each bf16 B vector
    (zero-extend + shift, two ops on the FMA ports) and the bf16 scalar (load, shift,
    broadcast). Priced like the FMAs alone, the search never paid for a widened copy of B
    that the f32 kernel could reuse (docs/cost-model.md, "Broadcast FMA on bf16")."""
    return _f32_cost(s, t) + 2 * vectors(s.operands[1]) + 2


def _bf16_memory(s: LogicalSpec, t: Target) -> Limits:
    # One broadcast register plus the widened copy of each B vector.
    return regs(vrf=1 + vectors(s.operands[1]))


def _emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """c_v += broadcast(scalar) * vec_v for each vector of c ('row': a scalar; 'col': b)."""
    a, b, c = views
    _, m, k, n = spec.shape
    if k != 1 or (m != 1 and n != 1) or c.buf.kind != VRF:
        raise CodegenError(f"BroadcastVecMultAdd does not apply to {spec.text()}")
    row = m == 1
    scalar_view, vec_view = (a, b) if row else (b, a)
    scalar = ctx.amap.loc(scalar_view, (0, 0, 0))
    s = f"t{ctx.fresh()}"
    ctx.line(f"const float {s} = {ctx.read_f32(scalar)};")
    to_f32 = vec_view.buf.dtype == Dtype.BF16
    for j, members in vector_groups(ctx, c):
        out = c.buf.vector_name(j)
        # c coord (b, m, n) -> vector operand coord: row b[b, 0, n], col a[b, m, 0].
        src_members: Members = [
            ((p[0], 0, p[2]) if row else (p[0], p[1], 0), lane) for p, lane in members
        ]
        vec = same_vector(ctx, vec_view, src_members)
        if vec is not None and (is_full(c, members) or is_padded_row(c, members)):
            vs = c.buf.vector_size
            assert vs
            val = widen(ctx, vec, vs) if to_f32 else vec
            ctx.line(f"{out} = {out} + {s} * {val};")
            continue
        for (_, lane), (q, _) in zip(members, src_members):
            x = ctx.read_f32(ctx.amap.loc(vec_view, q))
            ctx.line(f"{out}[{lane}] = {out}[{lane}] + {s} * {x};")


BROADCAST_VEC_MULT_ADD = Kernel(
    name="BroadcastVecMultAdd",
    kind=MATMUL,
    applies=_f32_applies,
    memory=_f32_memory,
    cost=_f32_cost,
    emit=_emit,
    dtypes=(F32, F32, F32),
    # The broadcast scalar is A ("row") or B ("col"), the other one in vectors.
    levels=(SCALAR_LEVELS | VECTOR_LEVELS, SCALAR_LEVELS | VECTOR_LEVELS, VECTOR_LEVELS),
)

BROADCAST_VEC_MULT_ADD_BF16 = Kernel(
    name="BroadcastVecMultAddBf16F32",
    kind=MATMUL,
    applies=_bf16_applies,
    memory=_bf16_memory,
    cost=_bf16_cost,
    emit=_emit,
    dtypes=(BF16, BF16, F32),
    levels=(SCALAR_LEVELS, VECTOR_LEVELS, VECTOR_LEVELS),
)
