"""Measure what a register tile pays to read column strips of an L2-resident block of B in
place, by the width of B's rows, against the same tile reading packed panels.

    python benchmarks/l2_strips.py
    python benchmarks/l2_strips.py --pitches 512,3072,4096 --offset 16

A plan may keep a block of whole rows of B in L2 (an L2 view: `Level.L2`) and feed a
register tile of C from one column strip of it at a time, in place, one row of the strip per
k step. Whether that strip streams from L2 as cheaply as a packed (contiguous) panel depends
on how far apart its rows are: the hardware prefetchers follow some strides and not others,
and rows a page apart map to few L2 sets. `tensorspec.L2_STRIP_MAX_ROW_BYTES` (512, from the
Xeon) and a tuning's `l2_strip_row_bytes` bound the rows the search may read so.

This probe, built with the kernels' AVX-512 flags, times a 12x32 broadcast-FMA tile (24 zmm
accumulators, the kernels' AVX-512 microkernel), two passes per strip (two register tiles of
C's rows, as a 16-row C takes 12 + 4), over every 32-column strip of one block of B of
`--block` KiB (L2-resident after the first sweep), for each row pitch:
- in place: the strips read straight from the block, rows `pitch` bytes apart;
- packed: the same bytes laid out as contiguous 32-column panels, read the same way;
- compute: the tile over one panel that stays in L1 (the FMAs' own time).
Figures are ns per 64-byte line of B per pass. Results and what the model does with them:
docs/cost-model.md, "Strips of an L2 view with wide rows".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from c_probe import ProbeError, int_list, probe_compiler, run_probe

from morello_build.harness.compile import ISA_FLAGS
from morello_build.machine.isa import host_cpu_name

_C = r"""
#include <immintrin.h>

/* C[12][32] += A[12][rows] B[rows][32]: one strip, its rows `pitch` floats apart */
__attribute__((noinline)) static void tile(const float *restrict a, long rows,
                                           const float *restrict b, long pitch,
                                           float *restrict c) {
    __m512 acc[12][2];
    for (int i = 0; i < 12; i++)
        for (int j = 0; j < 2; j++) acc[i][j] = _mm512_loadu_ps(c + 32 * i + 16 * j);
    for (long r = 0; r < rows; r++) {
        const __m512 b0 = _mm512_loadu_ps(b + r * pitch), b1 = _mm512_loadu_ps(b + r * pitch + 16);
        for (int i = 0; i < 12; i++) {
            const __m512 x = _mm512_set1_ps(a[i * rows + r]);
            acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
        }
    }
    for (int i = 0; i < 12; i++)
        for (int j = 0; j < 2; j++) _mm512_storeu_ps(c + 32 * i + 16 * j, acc[i][j]);
}

int main(int argc, char **argv) {
    const long bytes = atol(argv[1]) * 1024, pitch_bytes = atol(argv[2]);
    const long samples = atol(argv[3]), offset = atol(argv[4]);
    const long pitch = pitch_bytes / 4, rows = bytes / pitch_bytes, strips = pitch / 32;
    const long lines = bytes / 64;
    /* the block starts `offset` bytes past a page (numpy puts a large array 16 past one) */
    char *raw = aligned_alloc(4096, bytes + 4096), *raw_p = aligned_alloc(4096, bytes + 4096);
    float *b = (float *)(raw + offset), *p = (float *)(raw_p + offset);
    float *a = aligned_alloc(64, 12 * rows * 4), c[12 * 32] = {0};
    for (long i = 0; i < bytes / 4; i++) b[i] = (float)(i % 7) * 1e-3f;
    for (long s = 0; s < strips; s++) /* panel s: the strip's rows one after another */
        for (long r = 0; r < rows; r++)
            for (int j = 0; j < 32; j++) p[(s * rows + r) * 32 + j] = b[r * pitch + 32 * s + j];
    for (long i = 0; i < 12 * rows; i++) a[i] = 1e-3f;
    /* every kind reads at least 16 MiB of B per sample */
    const long reps = (16l << 20) / (2 * bytes) > 1 ? (16l << 20) / (2 * bytes) : 1;
    double v[1000], t[3];
    for (int kind = 0; kind < 3; kind++) {
        for (long s = 0; s < samples + 1; s++) {
            const double t0 = now();
            for (long q = 0; q < reps; q++)
                for (long j = 0; j < strips; j++)
                    for (int pass = 0; pass < 2; pass++) {
                        if (kind == 0) tile(a, rows, b + 32 * j, pitch, c);
                        else if (kind == 1) tile(a, rows, p + 32 * rows * j, 32, c);
                        else tile(a, rows, p, 32, c);
                    }
            const double dt = now() - t0;
            sink += c[0];
            if (s) v[s - 1] = dt / reps / (2 * lines); /* the first pass warms the caches */
        }
        t[kind] = median(v, samples);
    }
    printf("%.4f %.4f %.4f\n", t[0], t[1], t[2]);
    return 0;
}
"""

_AVX512 = list(ISA_FLAGS["avx512"])  # the kernels' own AVX-512 flags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pitches",
        type=int_list,
        default=[256, 512, 1024, 2048, 3072, 4096, 6144, 8192],
        help="bytes between B's rows, multiples of 128 (default 256,512,...,8192)",
    )
    parser.add_argument(
        "--block",
        type=int,
        default=384,
        help="KiB of B's block, held in L2 (default 384: 128 rows of 3 KiB)",
    )
    parser.add_argument("--samples", type=int, default=21, help="passes timed (default 21)")
    parser.add_argument(
        "--offset",
        type=int,
        default=0,
        help="place B this many bytes past a page, 0-60 in steps of 4 [default 0]",
    )
    parser.add_argument("--cc", default=None, help="C compiler (default $CC, else gcc)")
    args = parser.parse_args(argv)
    if not 1 <= args.samples <= 999:
        parser.error("--samples must be 1..999")
    if not 0 <= args.offset < 64 or args.offset % 4:
        parser.error(f"--offset must be 0-60 in steps of 4 (a float's size), got {args.offset}")
    if args.block < 16:
        parser.error("--block must be at least 16 KiB")
    for pitch in args.pitches:
        if pitch < 128 or pitch % 128 or (args.block * 1024) % pitch:
            parser.error(
                f"--pitches: {pitch} must be a multiple of 128 that divides the block "
                f"({args.block} KiB)"
            )
    try:
        cc = probe_compiler(args.cc)
        rows = []
        for pitch in args.pitches:
            out = run_probe(
                cc, _C, _AVX512, [str(args.block), str(pitch), str(args.samples), str(args.offset)]
            )
            rows.append((pitch, [float(x) for x in out.split()]))
    except ProbeError as e:
        print(f"l2_strips.py: {e}", file=sys.stderr)
        return 1
    print(
        f"{host_cpu_name()}; {Path(cc).name}; medians of {args.samples} passes; B's block "
        f"{args.block} KiB, {args.offset} bytes past a page; ns per 64-byte line of B per pass"
    )
    print("| row pitch bytes | rows | in place | packed | compute | in place / packed |")
    print("|---:|---:|---:|---:|---:|---:|")
    for pitch, (in_place, packed, compute) in rows:
        print(
            f"| {pitch} | {args.block * 1024 // pitch} | {in_place:.3f} | {packed:.3f} "
            f"| {compute:.3f} | {in_place / packed:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
