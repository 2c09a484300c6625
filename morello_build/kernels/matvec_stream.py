"""Row-streaming vector x matrix (matrix-vector products): `VecMatRows*` and `DotRows*`.

c[1, n] += sum_kk a[kk] * B[kk, n] for a few rows kk of a row-major B in main memory: the
kernel walks all k rows side by side along n (one sequential stream per row, which the
hardware prefetcher follows), keeping `STREAM_ACCUMULATORS` output vectors in registers
and reading/writing the L1-resident output once per call. B is read exactly once, in long
sequential runs, so this is the matrix-vector form that runs at memory bandwidth.

`DotRows*` is the same for a B stored the other way (``x @ w.T`` with w ``[n, k]``, as
PyTorch stores weights): c[0, j] += a . B[:, j] for a few columns j, each one contiguous
run of k values in memory, walked side by side (one stream per column, a vector
accumulator each), then one horizontal sum per output.
"""

from __future__ import annotations

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import CodegenError, View
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import Limits
from morello_build.ir.spec import MATMUL, LogicalSpec
from morello_build.kernels.base import (
    MEMORY_LEVELS,
    Kernel,
    columns_contiguous,
    regs,
    rows_contiguous,
)
from morello_build.kernels.emit_helpers import row_start, widen
from morello_build.machine.isa import isa_includes
from morello_build.machine.target import Target

F32, BF16 = Dtype.F32, Dtype.BF16

STREAM_MAX_ROWS = 8  # rows (streams) per call; 4 and 8 measured equal, 16 slower
STREAM_ACCUMULATORS = 4  # output vectors held in registers per step
#: A streamed B line with its FMAs, and each row run's start (a new stream: TLB miss and
#: prefetcher warm-up, which makes the search prefer long rows over narrow panels);
#: docs/cost-model.md, "Streaming matrix-vector rows".
STREAM_LINE_COST = 13
STREAM_RUN_COST = 64

#: Software prefetch in the loop: each step prefetches the lines of every B row it will read
#: `STREAM_PREFETCH_AHEAD` elements later, when a step reads at most
#: `STREAM_PREFETCH_MAX_STEP_BYTES` of each row and rows are at least
#: `STREAM_PREFETCH_MIN_ROW` long; tunings turn it off where it loses (docs/cost-model.md,
#: "Software prefetch").
STREAM_PREFETCH_AHEAD = 512
STREAM_PREFETCH_MAX_STEP_BYTES = 128
STREAM_PREFETCH_MIN_ROW = 4 * STREAM_PREFETCH_AHEAD


#: `_one_row_streamed`'s operand levels: A in memory, B in main memory, the output in L1.
STREAMED_LEVELS = (MEMORY_LEVELS, frozenset((Level.GL,)), frozenset((Level.L1,)))


def _one_row_streamed(s: LogicalSpec, t: Target) -> bool:
    """What both streamers need: an accumulating one-row product with vectors, its lhs in
    memory, B streamed from main memory, the output contiguous in L1."""
    a, b, c = s.operands
    return (
        s.accum
        and t.lanes(F32) > 1
        and s.shape[0] == s.shape[1] == 1
        and a.level.in_memory
        and b.level is Level.GL
        and c.level is Level.L1
        and c.is_contiguous
    )


def _applies(s: LogicalSpec, t: Target) -> bool:
    _, _, k, n = s.shape
    return (
        _one_row_streamed(s, t)
        and 1 <= k <= STREAM_MAX_ROWS
        and n % t.lanes(F32) == 0
        and rows_contiguous(s.operands[1])
    )


def _memory(s: LogicalSpec, t: Target) -> Limits:
    # One broadcast scalar per row, the accumulators, one loaded (widened) B vector.
    return regs(vrf=s.shape[2] + STREAM_ACCUMULATORS + 1)


def _cost(s: LogicalSpec, t: Target) -> int:
    a, b, c = s.operands
    _, _, k, n = s.shape
    nvec = n // t.lanes(F32)
    per_fma = 2 if b.dtype == F32 else 3  # bf16: one more op to widen each B vector
    return (
        k * nvec * per_fma
        + b.cache_lines() * STREAM_LINE_COST
        + k * STREAM_RUN_COST
        + 2 * nvec  # output vectors loaded and stored once per call
        + t.move_cost(a)
    )


def _emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """c[0, :] += sum_kk a[kk] * B[kk, :], streaming the k rows of B side by side.

    Per step of `STREAM_ACCUMULATORS` vectors along n: prefetch every row's lines ahead
    (see `STREAM_PREFETCH_AHEAD`), load the output vectors, add every row's contribution
    (bf16 rows widened in registers), store them back.
    """
    a, b, c = views
    _, m, kk, n = spec.shape
    lanes = ctx.f32_lanes
    rows = [row_start(ctx, b, (0, r, 0), 2, n) for r in range(kk)]
    out = row_start(ctx, c, (0, 0, 0), 2, n)
    if m != 1 or n % lanes or out is None or any(r is None for r in rows):
        raise CodegenError(f"VecMatRows needs contiguous rows: {spec.text()}")
    bf16 = b.buf.dtype == Dtype.BF16
    elem = "uint16_t" if bf16 else "float"
    vf = ctx.vtype(Dtype.F32, lanes)
    vin = ctx.vtype(Dtype.BF16, lanes) if bf16 else vf
    ctx.includes.add("string.h")
    u = ctx.fresh()
    ctx.open("{")
    for r, loc in enumerate(rows):
        assert loc is not None
        ctx.line(f"const {elem} *b{u}_{r} = &{loc.ref()};")
        ctx.line(f"const float s{u}_{r} = {ctx.read_f32(ctx.amap.loc(a, (0, 0, r)))};")
    ctx.line(f"float *c{u} = &{out.ref()};")

    # AVX-512 bf16: one 64-byte load holds 32 bf16; `x << 16` and `x & 0xffff0000` are
    # the even- and odd-indexed values as f32 (2 ops per 32 values instead of 2 widening
    # loads and 2 shifts). Accumulators then hold even/odd lanes, so the output pair is
    # deinterleaved after loading and re-interleaved before storing (once per call).
    pairs = bf16 and isa_includes(ctx.isa, "avx512")
    if pairs:
        ctx.includes.add("immintrin.h")
        wide = ctx.vtype(Dtype.U32, lanes)
        idx = {
            "ev": [2 * i for i in range(16)],
            "od": [2 * i + 1 for i in range(16)],
            "lo": [i // 2 + (i % 2) * 16 for i in range(16)],
            "hi": [8 + i // 2 + (i % 2) * 16 for i in range(16)],
        }
        for name, values in idx.items():
            ctx.line(f"const __m512i {name}{u} = _mm512_setr_epi32({', '.join(map(str, values))});")

    def step(var: str, base: int, count: int) -> None:
        def at(i: int) -> str:
            terms = [var] if var else []
            if base + i * lanes or not terms:
                terms.append(str(base + i * lanes))
            return " + ".join(terms)

        accs = [f"acc{u}_{i}" for i in range(count)]
        ctx.line(f"{vf} {', '.join(accs)};")
        npair = count // 2 if pairs else 0

        def shuffle_pairs(first: str, second: str, declare: str) -> None:
            """(a0, a1) <- (perm(a0, a1; first), perm(a0, a1; second)) for each pair."""
            for p in range(npair):
                a0, a1 = accs[2 * p], accs[2 * p + 1]
                t = f"t{u}_{p}"
                ctx.line(f"{declare}{t} = {a0};")
                ctx.line(
                    f"{a0} = ({vf})_mm512_permutex2var_ps((__m512){a0}, {first}, (__m512){a1});"
                )
                ctx.line(
                    f"{a1} = ({vf})_mm512_permutex2var_ps((__m512){t}, {second}, (__m512){a1});"
                )

        esize = b.buf.dtype.size
        row_bytes = count * lanes * esize  # of each row, this step
        if (
            ctx.tuning.stream_prefetch
            and var
            and row_bytes <= STREAM_PREFETCH_MAX_STEP_BYTES
            and n >= STREAM_PREFETCH_MIN_ROW
        ):
            # In the loop only; a hint, so past B's end it reads nothing.
            for r in range(kk):
                for off in range(0, row_bytes, 64):
                    ahead = STREAM_PREFETCH_AHEAD * esize + off
                    ctx.line(
                        f"__builtin_prefetch((const void *)((uintptr_t)(b{u}_{r} + {var}) "
                        f"+ {ahead}), 0, 3);"
                    )
        for i, acc in enumerate(accs):
            ctx.line(f"memcpy(&{acc}, c{u} + {at(i)}, sizeof {acc});")
        shuffle_pairs(f"ev{u}", f"od{u}", f"{vf} ")
        if npair:
            ctx.line(f"{wide} w{u};")
        if count > 2 * npair:
            ctx.line(f"{vin} x{u};")
        for r in range(kk):
            for p in range(npair):
                a0, a1 = accs[2 * p], accs[2 * p + 1]
                ctx.line(f"memcpy(&w{u}, b{u}_{r} + {at(2 * p)}, sizeof w{u});")
                ctx.line(f"{a0} = {a0} + s{u}_{r} * ({vf})(w{u} << 16);")
                ctx.line(f"{a1} = {a1} + s{u}_{r} * ({vf})(w{u} & 0xffff0000u);")
            for i in range(2 * npair, count):
                acc = accs[i]
                ctx.line(f"memcpy(&x{u}, b{u}_{r} + {at(i)}, sizeof x{u});")
                val = widen(ctx, f"x{u}", lanes) if bf16 else f"x{u}"
                ctx.line(f"{acc} = {acc} + s{u}_{r} * {val};")
        shuffle_pairs(f"lo{u}", f"hi{u}", "")
        for i, acc in enumerate(accs):
            ctx.line(f"memcpy(c{u} + {at(i)}, &{acc}, sizeof {acc});")

    nvec = n // lanes
    width = STREAM_ACCUMULATORS * lanes
    full = nvec // STREAM_ACCUMULATORS
    if full == 1:
        ctx.open("{")
        step("", 0, STREAM_ACCUMULATORS)
        ctx.close()
    elif full > 1:
        ctx.open(f"for ({ctx.index_type} j{u} = 0; j{u} < {full * width}; j{u} += {width}) {{")
        step(f"j{u}", 0, STREAM_ACCUMULATORS)
        ctx.close()
    if nvec % STREAM_ACCUMULATORS:
        ctx.open("{")
        step("", full * width, nvec % STREAM_ACCUMULATORS)
        ctx.close()
    ctx.close()


def _vec_mat_rows(name: str, dtypes: tuple[Dtype, Dtype, Dtype]) -> Kernel:
    return Kernel(
        name=name,
        kind=MATMUL,
        applies=_applies,
        memory=_memory,
        cost=_cost,
        emit=_emit,
        dtypes=dtypes,
        levels=STREAMED_LEVELS,
    )


VEC_MAT_ROWS_F32 = _vec_mat_rows("VecMatRowsF32", (F32, F32, F32))
VEC_MAT_ROWS_BF16 = _vec_mat_rows("VecMatRowsBf16F32", (BF16, BF16, F32))
#: A later product of a bf16 pipeline at one row (the running f32 value times a bf16
#: matrix: a gated FFN's or an MLP's projection back at decode) streams its bf16 rows too.
VEC_MAT_ROWS_F32_BF16 = _vec_mat_rows("VecMatRowsF32Bf16", (F32, BF16, F32))


# ---- columns of a w.T: dot products streamed side by side ----------------------------------

#: Horizontal sum of one output's accumulator and its read-modify-write (as dot.py's).
DOT_ROWS_REDUCE_COST = 8


def _dot_rows_applies(s: LogicalSpec, t: Target) -> bool:
    _, _, k, n = s.shape
    return (
        _one_row_streamed(s, t)
        and 1 <= n <= STREAM_MAX_ROWS
        and k % t.lanes(F32) == 0
        and s.operands[0].is_contiguous
        and columns_contiguous(s.operands[1])
    )


def _dot_rows_memory(s: LogicalSpec, t: Target) -> Limits:
    # One accumulator per column, the loaded (widened) a vector and one B vector.
    return regs(vrf=s.shape[3] + 2)


def _dot_rows_cost(s: LogicalSpec, t: Target) -> int:
    """As `_cost` with B's roles swapped: every B line streamed once (the same line and
    run prices, the same memory behaviour), one FMA per B vector (a widening op more for
    bf16, and for a bf16 a once per step), one horizontal sum per output."""
    a, b, c = s.operands
    _, _, k, n = s.shape
    kvec = k // t.lanes(F32)
    per_fma = 2 if b.dtype == F32 else 3
    return (
        n * kvec * per_fma
        + (kvec if a.dtype == BF16 else 0)
        + b.cache_lines() * STREAM_LINE_COST
        + n * STREAM_RUN_COST
        + n * DOT_ROWS_REDUCE_COST
        + t.move_cost(a)
    )


def _dot_rows_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """c[0, j] += a . B[:, j] for the n columns side by side: per step of one vector of k,
    load (widen) a once, then one FMA per column into its own accumulator."""
    a, b, c = views
    _, m, kk, n = spec.shape
    lanes = ctx.f32_lanes
    cols = [row_start(ctx, b, (0, 0, j), 1, kk) for j in range(n)]
    ra = row_start(ctx, a, (0, 0, 0), 2, kk)
    if m != 1 or kk % lanes or ra is None or any(col is None for col in cols):
        raise CodegenError(f"DotRows needs contiguous columns: {spec.text()}")
    a16, b16 = a.buf.dtype == Dtype.BF16, b.buf.dtype == Dtype.BF16
    vf = ctx.vtype(Dtype.F32, lanes)
    v16 = ctx.vtype(Dtype.BF16, lanes)
    ctx.includes.add("string.h")
    u = ctx.fresh()
    ctx.open("{")
    ctx.line(f"const {'uint16_t' if a16 else 'float'} *a{u} = &{ra.ref()};")
    for j, loc in enumerate(cols):
        assert loc is not None
        ctx.line(f"const {'uint16_t' if b16 else 'float'} *b{u}_{j} = &{loc.ref()};")
    accs = [f"acc{u}_{j}" for j in range(n)]
    ctx.line(f"{vf} {', '.join(f'{x} = {{0}}' for x in accs)};")
    ctx.open(f"for ({ctx.index_type} k{u} = 0; k{u} < {kk}; k{u} += {lanes}) {{")
    ctx.line(f"{v16 if a16 else vf} x{u};")
    ctx.line(f"memcpy(&x{u}, a{u} + k{u}, sizeof x{u});")
    xv = f"xw{u}"
    ctx.line(f"const {vf} {xv} = {widen(ctx, f'x{u}', lanes) if a16 else f'x{u}'};")
    ctx.line(f"{v16 if b16 else vf} y{u};")
    for j, acc in enumerate(accs):
        ctx.line(f"memcpy(&y{u}, b{u}_{j} + k{u}, sizeof y{u});")
        yv = widen(ctx, f"y{u}", lanes) if b16 else f"y{u}"
        ctx.line(f"{acc} = {acc} + {xv} * {yv};")
    ctx.close()
    for j, acc in enumerate(accs):
        out = ctx.amap.loc(c, (0, 0, j))
        total = " + ".join(f"{acc}[{lane}]" for lane in range(lanes))
        ctx.line(f"{out.ref()} += {total};")
    ctx.close()


def _dot_rows(name: str, dtypes: tuple[Dtype, Dtype, Dtype]) -> Kernel:
    return Kernel(
        name=name,
        kind=MATMUL,
        applies=_dot_rows_applies,
        memory=_dot_rows_memory,
        cost=_dot_rows_cost,
        emit=_dot_rows_emit,
        dtypes=dtypes,
        levels=STREAMED_LEVELS,
    )


DOT_ROWS_F32 = _dot_rows("DotRowsF32", (F32, F32, F32))
DOT_ROWS_BF16 = _dot_rows("DotRowsBf16F32", (BF16, BF16, F32))
DOT_ROWS_F32_BF16 = _dot_rows("DotRowsF32Bf16", (F32, BF16, F32))
