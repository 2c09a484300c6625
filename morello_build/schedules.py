"""Hand schedules the README recommends (and tests).

`avx2_matmul_6x16` ports the published compiler's hand schedule of an AVX2 f32 GEMM: a
6x16 output tile held in 12 ymm registers across the whole k loop, B rows loaded into
2 registers, and a broadcast-FMA microkernel; the 6-row tiling of M leaves a remainder
strip that gets its own small schedule. The packing step of the original is left to the
synthesizer ("synthesize the rest"), which is the point of mixing the two.

`avx2_matmul_packed_b` is a plan the cost model ranks below its own choice but that
measured faster at 512^3 on Zen 3, Zen 4 and the Xeon (docs/performance.md): B packed once,
whole, into 16-column panels, then 64-row blocks of C, each computed panel by panel over
the whole k in 6x16 register tiles that start from zero in registers (C is written once
and never read). The search fills in everything below the panel.
"""

from __future__ import annotations

from morello_build.ir.levels import Level
from morello_build.schedule import Schedule, ScheduleError


def _vector_rows(s: Schedule) -> Schedule:
    return s.tile_out(1, 16).select("VectorAssign")


def avx2_matmul_6x16(s: Schedule) -> Schedule:
    """Schedule `MatmulAccum(1xMxKxN, f32 GL row-major x3)` with M % 6 != 0, N % 16 == 0."""
    s = (
        s.tile_out(6, 16)
        .move(0, "L1")
        .move(1, "L1")
        .move(2, "L1")
        .move(2, "VRF", vector_size=8)
        .split(1)
        .move(1, "VRF", vector_size=8)
        .tile_out(1, 16)
        .select("BroadcastVecMultAdd")
    )
    # Paths count only nodes with several children: the M loop [main, remainder], the
    # C-in-VRF Alloc [load, k loop, store] and the B-row Alloc [load, row loop].
    s = s.at((0, 0), _vector_rows)  # load of the C tile
    s = s.at((0, 2), _vector_rows)  # store of the C tile
    s = s.at((0, 1, 0), lambda b: b.select("VectorAssign"))  # B row load
    return s


def _threads(s: Schedule) -> int:
    """The threads the Spec's program may use (1 for a serial Spec)."""
    return 1 if s.holes()[0].serial else s.target.processors


def _split_columns_between_threads(
    s: Schedule, who: str, panel: int = 16
) -> tuple[Schedule, int, int]:
    """Check that the Spec is a 1xMxKxN Matmul and, built for T > 1 threads, split C's
    columns between the threads (a multiple of `panel` each). Returns the schedule, M and
    the columns of one thread's part."""
    spec = s.holes()[0]
    if len(spec.shape) != 4 or spec.shape[0] != 1:
        raise ScheduleError(f"{who} schedules a 1xMxKxN Matmul, not {spec.text()}")
    _, m, _, n = spec.shape
    threads = _threads(s)
    if n % (panel * threads):
        why = f"{panel}-column panels" + (f" for each of {threads} threads" if threads > 1 else "")
        raise ScheduleError(f"{who} needs N % {panel * threads} == 0 ({why}), got N={n}")
    if threads == 1:
        return s, m, n
    return s.tile_out(1, m, n // threads, parallel=True), m, n // threads


def avx2_matmul_packed_b(s: Schedule) -> Schedule:
    """Schedule `Matmul(1xMxKxN, f32 GL row-major x3)` (out = lhs @ rhs) with N % 16 == 0:
    B packed whole into 16-column panels, 64-row blocks, one panel at a time. Built for
    T > 1 threads, the threads first split the columns of C (N % (16 T) == 0), and each
    packs only its own columns of B.

    The model prices this plan higher than its own (k blocks of 128, C read and written
    once per block): it reads 6-row strips of a 64-row block of A once per panel, from L2
    in fact, but the AVX2 model has no L2 and prices them as main memory. On 2 threads the
    model charges a column split for C's rows shared by two cores
    (`actions.tile.PAR_SHARED_ROWS_COST`); here each core writes its half of every row
    once. Measurements (Zen 3, Zen 4, the Xeon): docs/performance.md.
    """
    s, m, n = _split_columns_between_threads(s, "avx2_matmul_packed_b")
    if n > 16:  # (a 16-column B is one panel already)
        s = s.move(1, "GL", layout="[2,1,2p16]")
    if m > 64:
        s = s.tile_out(1, 64, n)
    return s.tile_out(1, min(64, m), 16) if n > 16 else s


def matmul_threads_split_columns(s: Schedule) -> Schedule:
    """Schedule `Matmul(1xMxKxN, ...)` built for T > 1 threads: the threads split C's columns
    (N / T each, a multiple of 16), and the search plans each thread's part. For one thread
    it leaves the whole Spec to the search.

    The search splits the rows: the model charges a column split for C's rows that two
    cores share (`actions.tile.PAR_SHARED_ROWS_COST`, measured on plans that read C back
    once per k block). The AVX-512 plan the search then picks for each half writes every
    line of C once, and each thread packs only its own columns of B. Not for avx2, whose
    half plan reads C back per k block; `avx2_matmul_packed_b` splits the columns with a
    whole-k plan instead. Measurements (the Xeon): docs/performance.md.
    """
    if _threads(s) == 1:
        return s
    return _split_columns_between_threads(s, "matmul_threads_split_columns")[0]


def avx512_matmul_l2_panels(s: Schedule) -> Schedule:
    """Schedule `Matmul(1xMxKxN, f32 GL row-major x3)` on AVX-512 with N % 64 == 0: each
    64-column panel of B (K x 64) is copied into L2 and swept whole under 6x64 register
    tiles (24 zmm accumulators) that start from zero, so C is written once. Built for T > 1
    threads, the threads first split C's columns (N % (64 T) == 0).

    For tall products with a narrow B, such as attention's `P @ v` at head dim 128
    (2048x2048x128): the generic model prices this plan above its own, because it charges
    A's reads from memory once per panel where the tiles' streaming reads of whole rows cost
    almost nothing; on Zen 5 it ran 259 GF/s against that plan's 191 (docs/cost-model.md,
    "Lines read from L2"). The zen5 tuning prices those reads as measured and finds a plan
    like it by itself ("Rows streamed under a tile"). A panel (K x 256 bytes) must fit the
    target's L2.
    """
    who = "avx512_matmul_l2_panels"
    s, m, n = _split_columns_between_threads(s, who, panel=64)
    l2_lines = s.target.max_limits[Level.L2]
    if not l2_lines:
        raise ScheduleError(
            f"{who} needs a target with an L2 level (avx512, amx), not {s.target.isa}"
        )
    k = s.holes()[0].shape[2]
    if k * 64 * 4 > l2_lines * 64:
        raise ScheduleError(
            f"{who}: a {k}x64 panel of B ({k * 256 // 1024} KiB) does not fit the "
            f"{s.target.isa} target's L2 ({l2_lines * 64 // 1024} KiB); K <= {l2_lines // 4}"
        )
    if n > 64:
        s = s.tile_out(1, m, 64)
    s = s.move(1, "L2", layout="row")
    return s.tile_out(1, 6, 64) if m > 6 else s
