"""C emitters for the microkernels of `morello_build.machine.kernels`, keyed by kernel name.

Each emitter gets the kernel's Spec and one view per operand. Vector kernels work vector
by vector: a destination vector whose lanes line up with a whole source vector (or a
contiguous run of memory) becomes one vector statement; anything else falls back to
per-lane statements, which are always correct. The scalar `_generic_*` emitters spell out
the Spec's semantics element by element and back up every fast path.
"""

from __future__ import annotations

from collections.abc import Callable

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import MEM, VRF, CodegenError, Loc, View, coords
from morello_build.ir.dtypes import Dtype
from morello_build.ir.spec import LogicalSpec
from morello_build.machine.isa import isa_includes
from morello_build.machine.kernels import AMX_K_STEP, AMX_TILE, STREAM_ACCUMULATORS

Emitter = Callable[[Ctx, LogicalSpec, tuple[View, ...]], None]

#: Largest region the element-by-element fallbacks will spell out.
_MAX_UNROLLED = 4096


# --------------------------------------------------------------------------- helpers


def _check_small(spec: LogicalSpec) -> None:
    if spec.volume > _MAX_UNROLLED:
        raise CodegenError(f"no vector form for {spec.text()} and too big to unroll")


def _vector_groups(ctx: Ctx, view: View) -> list[tuple[int, list[tuple[tuple[int, ...], int]]]]:
    """The VRF view's elements grouped by vector: (vector number, [(coord, lane)])."""
    groups: dict[int, list[tuple[tuple[int, ...], int]]] = {}
    for p in coords(view.shape):
        loc = ctx.amap.loc(view, p)
        groups.setdefault(loc.index, []).append((p, loc.lane))
    return sorted(groups.items())


def _is_full(view: View, members: list[tuple[tuple[int, ...], int]]) -> bool:
    vs = view.buf.vector_size
    return len(members) == vs and sorted(lane for _, lane in members) == list(range(vs or 0))


def _is_padded_row(view: View, members: list[tuple[tuple[int, ...], int]]) -> bool:
    """The members are exactly the valid lanes of a padded row's last register."""
    buf = view.buf
    if not buf.padded or sorted(lane for _, lane in members) != list(range(buf.last_lanes())):
        return False
    axis = buf.layout.dims[-1].axis  # the padded axis: rows run along it
    start = view.offset[axis]
    p, lane = members[0]
    return start.is_const and start.const + p[axis] - lane + buf.last_lanes() == buf.padded


def _lane_mask(ctx: Ctx, lanes: int, valid: int) -> tuple[str, str]:
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


def _same_vector(ctx: Ctx, view: View, members: list[tuple[tuple[int, ...], int]]) -> str | None:
    """Name of the vector of VRF `view` holding exactly these coords in these lanes."""
    if view.buf.kind != VRF:
        return None
    locs = [ctx.amap.loc(view, p) for p, _ in members]
    if len({loc.index for loc in locs}) != 1:
        return None
    if any(loc.lane != lane for loc, (_, lane) in zip(locs, members)):
        return None
    return view.buf.vector_name(locs[0].index)


def _contiguous_run(ctx: Ctx, view: View, members: list[tuple[tuple[int, ...], int]]) -> Loc | None:
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


def _memory_run(ctx: Ctx, view: View) -> Loc | None:
    """Location of element 0 when the whole memory view is one contiguous run in row-major
    coordinate order (the order kernels like dot products walk it)."""
    return _contiguous_run(ctx, view, [(p, i) for i, p in enumerate(coords(view.shape))])


#: f32 lanes -> (zero-extend u16 -> u32, the bf16 register's intrinsic type, shift left u32).
_WIDEN_INTRINSICS = {
    8: ("_mm256_cvtepu16_epi32", "__m128i", "_mm256_slli_epi32"),
    16: ("_mm512_cvtepu16_epi32", "__m256i", "_mm512_slli_epi32"),
}


def _widen(ctx: Ctx, vec: str, lanes: int) -> str:
    """bf16 vector (uint16 lanes) -> f32 vector: zero-extend, shift into the high half.

    Written with intrinsics (one `vpmovzxwd` from memory and one shift) rather than the
    portable `(f32)(__builtin_convertvector(x, u32) << 16)`: gcc 12 compiles that into two
    half-width widenings, a byte shift and an insert (3 shuffle-port ops per register;
    clang 14 emits the single `vpmovzxwd`). Measured, AVX2 bf16 matrix-vector products
    with B in L2, same harness run: 1x128x2048 27.0 -> 53.5 GF/s, 1x256x4096 24.5 -> 39.0;
    bf16 256^3 GEMMs (widening copies into L1), 3 rounds: avx512 1.58-1.60x -> 1.61-1.64x
    of MKL, avx2 1.03x -> 1.04x.
    """
    f32 = ctx.vtype(Dtype.F32, lanes)
    if lanes in _WIDEN_INTRINSICS:
        extend, half, shift = _WIDEN_INTRINSICS[lanes]
        ctx.includes.add("immintrin.h")
        return f"({f32}){shift}({extend}(({half})({vec})), 16)"
    u32 = ctx.vtype(Dtype.U32, lanes)
    return f"({f32})(__builtin_convertvector({vec}, {u32}) << 16)"


# --------------------------------------------------------------------------- generic


def _generic_matmul(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
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


def _generic_move(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
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


def _generic_zero(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    _check_small(spec)
    for p in coords(spec.shape):
        ctx.line(f"{ctx.amap.loc(views[0], p).ref()} = 0;")


# --------------------------------------------------------------------------- matmul


def _broadcast_vec_mult_add(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
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
    widen = vec_view.buf.dtype == Dtype.BF16
    for j, members in _vector_groups(ctx, c):
        out = c.buf.vector_name(j)
        # c coord (b, m, n) -> vector operand coord: row b[b, 0, n], col a[b, m, 0].
        src_members: list[tuple[tuple[int, ...], int]] = [
            ((p[0], 0, p[2]) if row else (p[0], p[1], 0), lane) for p, lane in members
        ]
        vec = _same_vector(ctx, vec_view, src_members)
        if vec is not None and (_is_full(c, members) or _is_padded_row(c, members)):
            vs = c.buf.vector_size
            assert vs
            val = _widen(ctx, vec, vs) if widen else vec
            ctx.line(f"{out} = {out} + {s} * {val};")
            continue
        for (_, lane), (q, _) in zip(members, src_members):
            x = ctx.read_f32(ctx.amap.loc(vec_view, q))
            ctx.line(f"{out}[{lane}] = {out}[{lane}] + {s} * {x};")


def _dot_product(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...], variant: str) -> None:
    """c += sum_k a[k] * b[k] with independent vector accumulators, then one horizontal sum.

    `variant`: "f32", "bf16" (widen, then FMA) or "vdpbf16ps" (AVX-512 pairwise dot).
    """
    a, b, c = views
    kk = spec.shape[2]
    ra = _memory_run(ctx, a)
    rb = _memory_run(ctx, b)
    if ra is None or rb is None or spec.shape[1] != 1 or spec.shape[3] != 1:
        _generic_matmul(ctx, spec, views)  # not the contiguous shape the kernel assumes
        return
    lanes = ctx.f32_lanes
    step = 32 if variant == "vdpbf16ps" else lanes
    if kk % step:
        raise CodegenError(f"dot product over K={kk} needs a multiple of {step}")
    steps = kk // step
    nacc = next(x for x in (4, 3, 2, 1) if steps % x == 0)
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
                    f"{acc} = {acc} + {_widen(ctx, f'x{i}', lanes)} * {_widen(ctx, f'y{i}', lanes)};"
                )
        ctx.close()
        if nacc > 1:
            ctx.line(f"{accs[0]} = {' + '.join(accs)};")
        total = " + ".join(f"{accs[0]}[{lane}]" for lane in range(lanes))
    if out.buf.dtype != Dtype.F32:
        raise CodegenError("dot products accumulate into f32")
    ctx.line(f"{out.ref()} += {total};")
    ctx.close()


def _offset_from(ctx: Ctx, view: View, base: Loc, coord: tuple[int, ...]) -> int | None:
    """Element offset of `coord` from `base` when it is a compile-time constant."""
    loc = ctx.amap.loc(view, coord)
    if loc.addr is None or base.addr is None or not loc.addr.same_base(base.addr):
        return None
    return loc.addr.affine.const - base.addr.affine.const


def _row_start(ctx: Ctx, view: View, coord: tuple[int, ...], axis: int, length: int) -> Loc | None:
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
        if _offset_from(ctx, view, first, tuple(p)) != step:
            return None
    return first


#: Software prefetch in the streaming matrix-vector loop: each step prefetches the lines of
#: every B row it will read `STREAM_PREFETCH_AHEAD` elements later (1 KiB of bf16, 2 KiB
#: of f32), when a step reads at most `STREAM_PREFETCH_MAX_STEP_BYTES` of each row and the
#: rows are at least `STREAM_PREFETCH_MIN_ROW` long. The hardware prefetchers alone keep 8
#: concurrent rows read 64-128 bytes at a time short of memory speed, but serve rows read
#: 256 bytes at a time better than the prefetches do. 1x2048x16384, 3-4 rounds per harness
#: run, 1-3 runs per row, ratio to MKL (avx2 bf16: GF/s; MKL has no AVX2 bf16), without /
#: with the prefetch:
#:   avx512 bf16 (128 bytes per row per step)  0.999-1.016 / 1.081-1.125
#:   amx bf16 (the same loop)                  1.007-1.016 / 1.056-1.078
#:   avx2 bf16 (64 bytes)                      23.9-26.5 / 28.0-28.8 GF/s
#:   avx2 f32 (128 bytes)                      1.002-1.017 / 1.023-1.093
#:   avx512 f32 (256 bytes)                    0.972-1.010 / 0.936-1.035, worse or equal in
#:                                             8 of 11 rounds (so: none)
#: Other distances (avx512 bf16): 256 bytes 1.045-1.050, 4 KiB 1.043-1.049; for f32 half
#: a KiB lost up to 20%. Into L2 only (locality 2) instead of L1 was no better; one prefetch
#: per row per step instead of one per line, worse. Short rows get none: in the last part
#: of a row the prefetches fall on lines of the next row that have been read already, and
#: such a B stays in cache between calls; avx2 f32 1x1024x1024 (4 KiB rows), two runs:
#: 1.007-1.015 without, 1.000-1.009 with (avx512: within 0.5% either way).
#: Those are Xeon (Sapphire Rapids class) figures. On AMD the prefetches lose, so the zen3 and
#: zen4 tunings (`Tuning.stream_prefetch`) emit none; 1x2048x16384, one harness run each,
#: with / without:
#:   Zen 4 avx2 f32      8.43 / 12.96 GF/s (0.771x / 1.150x of MKL)
#:   Zen 4 avx512 bf16   16.92 / 24.99 GF/s (1.238x / 1.728x of the -O3 loop nest)
#:   Zen 3 avx2 f32      0.798-0.846x / 1.001-1.089x of the best peer (3 rounds)
#:   Zen 3 avx2 bf16     1.184-1.286x / 1.401-1.454x of the loop nest (3 rounds)
#: On Zen 5 they win or tie, so its tuning (zen5) keeps them; 1x2048x16384, 3 interleaved
#: rounds of one harness run each, share of a streaming read of B, with / without:
#:   Zen 5 avx2 bf16     85-96% / 61-72% (six more runs without: 63-72%)
#:   Zen 5 avx2 f32      89-98% / 89-90%
#:   Zen 5 avx512 bf16   74-87% / 68-82% (it swings: six runs without read 73-102%)
#:   Zen 5 avx512 f32    none emitted (256 bytes per row per step)
STREAM_PREFETCH_AHEAD = 512
STREAM_PREFETCH_MAX_STEP_BYTES = 128
STREAM_PREFETCH_MIN_ROW = 4 * STREAM_PREFETCH_AHEAD


def _vec_mat_rows(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """c[0, :] += sum_kk a[kk] * B[kk, :], streaming the k rows of B side by side.

    Per step of `STREAM_ACCUMULATORS` vectors along n: prefetch every row's lines ahead
    (see `STREAM_PREFETCH_AHEAD`), load the output vectors, add every row's contribution
    (bf16 rows widened in registers), store them back.
    """
    a, b, c = views
    _, m, kk, n = spec.shape
    lanes = ctx.f32_lanes
    rows = [_row_start(ctx, b, (0, r, 0), 2, n) for r in range(kk)]
    out = _row_start(ctx, c, (0, 0, 0), 2, n)
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
            ctx.stream_prefetch
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
                val = _widen(ctx, f"x{u}", lanes) if bf16 else f"x{u}"
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


# --------------------------------------------------------------------------- AMX


def _strided_rows(
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
    stride = _offset_from(ctx, view, base, coord(1, 0)) if rows > 1 else 0
    if stride is None or stride < 0:
        raise CodegenError(f"{what}: rows are not a constant stride apart")
    for r in range(rows):
        for j in cols:
            if _offset_from(ctx, view, base, coord(r, j)) != offset(r, j, stride):
                raise CodegenError(f"{what}: element ({r}, {j}) breaks the row pattern")
    return base, stride


def _row_major_rows(ctx: Ctx, view: View, rows: int, cols: list[int], what: str) -> tuple[Loc, int]:
    """`_strided_rows` of a 1 x rows x cols tile stored row by row."""
    return _strided_rows(
        ctx, view, lambda r, j: (0, r, j), rows, cols, lambda r, j, st: r * st + j, what
    )


def _k_pair_rows(ctx: Ctx, view: View, pairs: int, cols: list[int], what: str) -> tuple[Loc, int]:
    """`_strided_rows` of a 1 x K x N tile in k-pairs: (k, j) at (k // 2) * stride + 2j + k % 2
    (`cols` are sampled columns j; each pair row holds 2 values per column)."""
    return _strided_rows(
        ctx,
        view,
        lambda p, j: (0, 2 * p + j % 2, j // 2),
        pairs,
        sorted({2 * x + e for x in cols for e in (0, 1)}),
        lambda p, j, st: p * st + j,
        what,
    )


def _check_bf16_f32(views: tuple[View, ...], what: str) -> None:
    """The tile kernels' buffers: bf16 x bf16 -> f32."""
    for view, want in zip(views, (Dtype.BF16, Dtype.BF16, Dtype.F32)):
        if view.buf.dtype != want:
            raise CodegenError(f"{what}: {view.buf.name} is {view.buf.dtype}, not {want}")


def _amx_tile_matmul(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """c (+)= a @ b on AMX tiles (`AmxTileMatmulBf16F32`; layouts in `target.kernels`).

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
    a0, sa = _row_major_rows(ctx, a, m, kcols, "AMX lhs")
    b0, sb = _k_pair_rows(ctx, b, kk // 2, ncols, "AMX rhs (k-pair layout)")
    c0, sc = _row_major_rows(ctx, c, m, ncols, "AMX out")
    _check_bf16_f32(views, "AMX tile matmul")
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


def _dpbf16_tile(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """c (+)= a @ b in zmm accumulators with vdpbf16ps (`Dpbf16TileBf16F32`; layouts in
    `target.kernels`): per k-pair, the N/16 vectors of B's pair row and one 32-bit
    broadcast of each A row's pair (read with memcpy: A rows need not be 4-byte aligned)."""
    a, b, c = views
    _, m, kk, n = spec.shape
    if kk % 2 or n % 16:
        raise CodegenError(f"Dpbf16TileBf16F32 does not apply to {spec.text()}")
    nv, pairs = n // 16, kk // 2
    kcols = sorted({0, 1, kk // 2, kk - 2, kk - 1})
    ncols = sorted({0, 1, 15, n // 2, n - 1})
    a0, sa = _row_major_rows(ctx, a, m, kcols, "vdpbf16ps lhs")
    b0, sb = _k_pair_rows(ctx, b, pairs, ncols, "vdpbf16ps rhs (k-pair layout)")
    c0, sc = _row_major_rows(ctx, c, m, ncols, "vdpbf16ps out")
    _check_bf16_f32(views, "vdpbf16ps tile")
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


# --------------------------------------------------------------------------- move


def _pack_bf16_pairs(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """dst[k/2][n][2] = src[k][n]: interleave each pair of bf16 rows (`PackBf16Pairs`).

    Per 32 columns: two 64-byte loads, unpacklo/hi_epi16 (pairs in 128-bit lane order),
    two permutex2var_epi64 back into column order, two 64-byte stores; a 16-column rest
    does the same with 256-bit registers.
    """
    src, dst = views
    _, kk, n = spec.shape
    if kk % 2 or n % 16:
        raise CodegenError(f"PackBf16Pairs does not apply to {spec.text()}")
    cols = sorted({0, 1, n // 2, n - 1})
    s0, ss = _row_major_rows(ctx, src, kk, cols, "pack source")
    d0, sd = _k_pair_rows(ctx, dst, kk // 2, cols, "pack destination (k-pair layout)")
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


def _vector_assign(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
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
    for j, members in _vector_groups(ctx, reg):
        name = reg.buf.vector_name(j)
        full = _is_full(reg, members)
        if full:
            other_vec = _same_vector(ctx, other, members)
            if other_vec is not None:
                ctx.line(f"{name} = {other_vec};" if loading else f"{other_vec} = {name};")
                continue
        run = None
        if full or _is_padded_row(reg, members):  # padded rows are f32: MASKED_DTYPES
            run = _contiguous_run(ctx, other, members)
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
            load, store = _lane_mask(ctx, vs, reg.buf.last_lanes())
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


def _vector_cast(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """Widen bf16 vectors to f32 vectors with the same lanes."""
    src, dst = views
    if dst.buf.kind != VRF:
        raise CodegenError(f"VectorCastBf16F32 needs a vector destination: {spec.text()}")
    for j, members in _vector_groups(ctx, dst):
        name = dst.buf.vector_name(j)
        vec = _same_vector(ctx, src, members)
        if vec is not None and _is_full(dst, members):
            vs = dst.buf.vector_size
            assert vs
            ctx.line(f"{name} = {_widen(ctx, vec, vs)};")
            continue
        for p, lane in members:
            ctx.line(f"{name}[{lane}] = {ctx.read_f32(ctx.amap.loc(src, p))};")


# --------------------------------------------------------------------------- zero


def _memset_zero(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """memset of the contiguous region (the whole buffer needs no address checks)."""
    (view,) = views
    buf = view.buf
    if buf.kind != MEM:
        _generic_zero(ctx, spec, views)
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
    _generic_zero(ctx, spec, views)


def _vector_zero(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """Every lane of every vector of the view set to 0."""
    (view,) = views
    if view.buf.kind != VRF:
        _generic_zero(ctx, spec, views)
        return
    vs = view.buf.vector_size
    assert vs
    vt = ctx.vtype(view.buf.dtype, vs)
    for j, members in _vector_groups(ctx, view):
        name = view.buf.vector_name(j)
        if _is_full(view, members) or _is_padded_row(view, members):
            ctx.line(f"{name} = ({vt}){{0}};")
        else:
            for _, lane in members:
                ctx.line(f"{name}[{lane}] = 0;")


EMITTERS: dict[str, Emitter] = {
    "MultAdd": _generic_matmul,
    "BroadcastVecMultAdd": _broadcast_vec_mult_add,
    "BroadcastVecMultAddBf16F32": _broadcast_vec_mult_add,
    "DotProductLoop": lambda ctx, s, v: _dot_product(ctx, s, v, "f32"),
    "DotProductLoopBf16": lambda ctx, s, v: _dot_product(ctx, s, v, "bf16"),
    "DotProductLoopVdpbf16ps": lambda ctx, s, v: _dot_product(ctx, s, v, "vdpbf16ps"),
    "VecMatRowsF32": _vec_mat_rows,
    "VecMatRowsBf16F32": _vec_mat_rows,
    "AmxTileMatmulBf16F32": _amx_tile_matmul,
    "Dpbf16TileBf16F32": _dpbf16_tile,
    "Assign": _generic_move,
    "CastBf16F32": _generic_move,
    "VectorAssign": _vector_assign,
    "VectorCastBf16F32": _vector_cast,
    "PackBf16Pairs": _pack_bf16_pairs,
    "MemsetZero": _memset_zero,
    "ValueZero": _generic_zero,
    "VectorZero": _vector_zero,
}


def emit_kernel(ctx: Ctx, name: str, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    emitter = EMITTERS.get(name)
    if emitter is None:
        raise CodegenError(f"no C emitter for kernel {name!r}")
    emitter(ctx, spec, views)
