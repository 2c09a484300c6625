"""Hand schedules shipped as examples (and tested).

`avx2_matmul_6x16` ports the published compiler's hand schedule of an AVX2 f32 GEMM: a
6x16 output tile held in 12 ymm registers across the whole k loop, B rows loaded into
2 registers, and a broadcast-FMA microkernel; the 6-row tiling of M leaves a remainder
strip that gets its own small schedule. The packing step of the original is left to the
synthesizer ("synthesize the rest"), which is the point of mixing the two.

`avx2_matmul_packed_b` is a plan the cost model ranks below its own choice but that
measured faster on AMD Zen 3 and on the Xeon at 512^3 (see the README's Zen 3 and Xeon
sections): B packed once, whole, into 16-column panels, then 64-row blocks of C, each
computed panel by panel over the whole k in 6x16 register tiles that start from zero in
registers (C is written once and never read). The search fills in everything below the
panel.
"""

from __future__ import annotations

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


def _split_columns_between_threads(s: Schedule, who: str) -> tuple[Schedule, int, int]:
    """Check that the Spec is a 1xMxKxN Matmul and, built for T > 1 threads, split C's
    columns between the threads (a multiple of 16 each). Returns the schedule, M and the
    columns of one thread's part."""
    spec = s.holes()[0]
    if len(spec.shape) != 4 or spec.shape[0] != 1:
        raise ScheduleError(f"{who} schedules a 1xMxKxN Matmul, not {spec.text()}")
    _, m, _, n = spec.shape
    threads = _threads(s)
    if n % (16 * threads):
        why = "16-column panels" + (f" for each of {threads} threads" if threads > 1 else "")
        raise ScheduleError(f"{who} needs N % {16 * threads} == 0 ({why}), got N={n}")
    if threads == 1:
        return s, m, n
    return s.tile_out(1, m, n // threads, parallel=True), m, n // threads


def avx2_matmul_packed_b(s: Schedule) -> Schedule:
    """Schedule `Matmul(1xMxKxN, f32 GL row-major x3)` (out = lhs @ rhs) with N % 16 == 0:
    B packed whole into 16-column panels, 64-row blocks, one panel at a time. Built for
    T > 1 threads, the threads first split the columns of C (N % (16 T) == 0), and each
    packs only its own columns of B.

    Measured on Zen 3, f32 512^3, one core, 3 rounds of one harness run each (ratio to the
    best of OpenBLAS and MKL): 1.022-1.035x, then 1.007-1.021x and 1.014-1.031x, against
    0.977-0.984x, 0.974-1.023x and 0.978-1.038x for the search's own plan (k blocks of 128,
    C zeroed in memory and then read and written once per block). On the Xeon, 3
    interleaved rounds: 124.5-125.3 GF/s (1.039-1.046x) against 120.1-121.0 (1.005-1.009x).
    On Zen 4, 3 interleaved rounds: 1.003-1.060x of OpenBLAS against 0.990-0.995x, and on
    2 threads 1.010-1.115x against 1.013-1.033x.

    The model prices this plan 15% higher. It reads 6-row strips of a 64-row block of A
    (128 KiB) once per panel, from L2 in fact, but the AVX2 model has no L2 and prices them
    as main memory. Measured on Zen 4 (README), the search's plan does not lose on its A
    block in L1 (copied to a dense buffer, or of 32 or 16 rows instead of 64, it ran no
    faster) nor on its passes over C (fewer k blocks with fewer rows each ran slower); an
    AVX2 L2 of 512 KiB-1 MiB made the search stream all of A from L2 instead (0.87-0.91x),
    one of 128 KiB picked another k-blocked plan, no faster.

    2 threads, Xeon, 3 interleaved rounds: 244.7-251.4 GF/s (1.021-1.028x of MKL) against
    242.2-243.1 (0.988-0.994x) for the search's plan, which splits the rows (each thread
    then packs all of B). Split by rows, this plan ran 242.7-245.2 GF/s (1.001-1.002x).
    The model charges a column split for C's rows shared by two cores
    (`actions.tile.PAR_SHARED_ROWS_COST`, measured on a plan that reads C back 4 times);
    here each core writes its half of every row once.
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
    line of C once, and each thread packs only its own columns of B. Xeon, avx512, f32
    512^3, 2 threads, 3 interleaved rounds: 436.4-442.6 GF/s (1.036-1.049x of MKL) against
    422.3-434.7 (1.006-1.040x) for the search's row split. Not for avx2: the search's AVX2
    half plan reads C back per k block, and split so it ran 0.898-0.908x against
    0.988-0.994x; `avx2_matmul_packed_b` splits the columns with a whole-k plan instead.
    """
    if _threads(s) == 1:
        return s
    return _split_columns_between_threads(s, "matmul_threads_split_columns")[0]
