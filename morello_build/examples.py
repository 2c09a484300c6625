"""Hand schedules shipped as examples (and tested).

`avx2_matmul_6x16` ports the published compiler's hand schedule of an AVX2 f32 GEMM: a
6x16 output tile held in 12 ymm registers across the whole k loop, B rows loaded into
2 registers, and a broadcast-FMA microkernel; the 6-row tiling of M leaves a remainder
strip that gets its own small schedule. The packing step of the original is left to the
synthesizer ("synthesize the rest"), which is the point of mixing the two.
"""

from __future__ import annotations

from morello_build.schedule import Schedule


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
