"""Measure what a register tile pays to read a strip of B in place, against packing it first.

    python benchmarks/tile_stream.py                    # B 768 x N for N = 3072, 2048, 1024, 768, 256
    python benchmarks/tile_stream.py --rows 3072 --cols 768,3072 --offset 0

A plan may feed a register tile of C straight from B in main memory, one row of a 16-column
strip per k step, or copy the strip into a contiguous buffer first and feed the tile from
there. The model prices the first by B's lines alone and the second by those lines plus the
copy, so it prefers reading in place; but when B's rows are pages apart (its pitch a whole
number of 4 KiB pages, `TensorSpec.page_pitch`) every row of the strip is a miss in a
different page, which the hardware prefetchers do not follow, and the tile's FMAs behind each
load leave the out-of-order window too few loads in flight to hide it. This probe times, in
one C program built with the kernels' AVX2 flags, a 6x16 broadcast-FMA tile (12 ymm
accumulators, the AVX2 kernel's) over every 16-column strip of B:
- in place: the tile reads each strip from B directly, row after row;
- packed 16 cols, packed 64 cols: each 16- (or 64-) column block copied into contiguous
  16-column panels, then the tile reads the panels (the copy is timed with it);
- compute: the tile over an already packed strip (what the FMAs alone cost).
Each figure (the table's middle columns) is ns per line of the strips (a 16-float row is one line); B is read from
whatever cache holds it after the first pass, as in a kernel called in a loop. Results and
what the model does with them: docs/cost-model.md, "Streaming B in place".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from c_probe import ProbeError, int_list, probe_compiler, run_probe

_C = r"""
#include <immintrin.h>

#define TILE_ROWS 6
/* a 6x16 tile of C += x[6 x rows] * strip[rows x 16], the strip's rows `pitch` floats apart */
static void tile(float *restrict c, const float *restrict x, const float *restrict b,
                 int rows, long pitch) {
    __m256 acc[2 * TILE_ROWS];
    for (int i = 0; i < 2 * TILE_ROWS; i++) acc[i] = _mm256_setzero_ps();
    for (int r = 0; r < rows; r++) {
        const __m256 b0 = _mm256_loadu_ps(b + r * pitch), b1 = _mm256_loadu_ps(b + r * pitch + 8);
        for (int i = 0; i < TILE_ROWS; i++) {
            const __m256 a = _mm256_broadcast_ss(x + (long)i * rows + r);
            acc[2 * i] = _mm256_fmadd_ps(a, b0, acc[2 * i]);
            acc[2 * i + 1] = _mm256_fmadd_ps(a, b1, acc[2 * i + 1]);
        }
    }
    for (int i = 0; i < TILE_ROWS; i++) {
        _mm256_storeu_ps(c + 16 * i, _mm256_add_ps(_mm256_loadu_ps(c + 16 * i), acc[2 * i]));
        _mm256_storeu_ps(c + 16 * i + 8,
                         _mm256_add_ps(_mm256_loadu_ps(c + 16 * i + 8), acc[2 * i + 1]));
    }
}
/* copy a rows x (16 * panels) block into `panels` contiguous rows x 16 panels */
static void pack(float *restrict dst, const float *restrict src, int rows, long pitch,
                 int panels) {
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < panels; p++) {
            float *d = dst + ((long)p * rows + r) * 16;
            _mm256_storeu_ps(d, _mm256_loadu_ps(src + r * pitch + 16 * p));
            _mm256_storeu_ps(d + 8, _mm256_loadu_ps(src + r * pitch + 16 * p + 8));
        }
}

int main(int argc, char **argv) {
    const int rows = atoi(argv[1]), cols = atoi(argv[2]), offset = atoi(argv[3]);
    const int samples = atoi(argv[4]);
    float *m = page_matrix(rows, cols, offset);
    float *x = aligned_alloc(64, (size_t)rows * TILE_ROWS * 4);
    for (long i = 0; i < (long)rows * TILE_ROWS; i++) x[i] = (float)(i % 13) * 0.1f;
    float *buf = aligned_alloc(64, (size_t)rows * 64 * 4);
    float c[16 * TILE_ROWS] = {0};
    double v[1000], t[4];
    pack(buf, m, rows, cols, 4);
    for (int kind = 0; kind < 4; kind++) {
        const int width = kind == 2 ? 64 : 16; /* columns packed at a time */
        for (int s = 0; s < samples + 1; s++) {
            const double t0 = now();
            for (int j = 0; j < cols; j += width) {
                if (kind == 0) tile(c, x, m + j, rows, cols);
                else if (kind == 3) tile(c, x, buf, rows, 16);
                else {
                    pack(buf, m + j, rows, cols, width / 16);
                    for (int p = 0; p < width / 16; p++) tile(c, x, buf + (long)p * rows * 16, rows, 16);
                }
            }
            const double dt = now() - t0;
            sink = c[0] + buf[1];
            if (s) v[s - 1] = dt; /* the first pass warms the caches */
        }
        t[kind] = median(v, samples);
    }
    printf("%.1f %.1f %.1f %.1f\n", t[0], t[1], t[2], t[3]);
    return 0;
}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=768, help="rows of B, k (default 768)")
    parser.add_argument(
        "--cols",
        type=int_list,
        default=[3072, 2048, 1024, 768, 256],
        help="columns of B, comma-separated (its row pitch; default 3072,2048,1024,768,256)",
    )
    parser.add_argument(
        "--offset", type=int, default=16, help="bytes past a page where B starts (default 16)"
    )
    parser.add_argument("--samples", type=int, default=21, help="passes timed (default 21)")
    parser.add_argument("--cc", default=None, help="C compiler (default $CC, else gcc)")
    args = parser.parse_args(argv)
    if args.rows < 1 or any(c < 64 or c % 64 for c in args.cols):
        parser.error("--rows must be >= 1 and every --cols a multiple of 64")
    if not 0 <= args.offset < 4096 or args.offset % 4:
        parser.error("--offset must be a multiple of 4 below 4096")
    if not 1 <= args.samples <= 999:
        parser.error("--samples must be 1..999")
    try:
        cc = probe_compiler(args.cc)
        rows_out = []
        for cols in args.cols:
            argv_c = [str(args.rows), str(cols), str(args.offset), str(args.samples)]
            rows_out.append((cols, run_probe(cc, _C, ["-mavx2", "-mfma"], argv_c).split()))
    except ProbeError as e:
        print(f"tile_stream.py: {e}", file=sys.stderr)
        return 1
    print(
        f"{Path(cc).name}; B {args.rows} x N f32, {args.offset} bytes past a page; 6x16 ymm "
        f"tile; medians of {args.samples} passes; ns per line of the 16-column strips"
    )
    print(
        "| N | row pitch | pages apart | in place | packed 16 cols | packed 64 cols | compute "
        "| in place / packed 64 |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for cols, out in rows_out:
        lines = args.rows * (cols // 16)
        pitch = cols * 4
        pages = "yes" if pitch % 4096 == 0 else "no"
        i, p16, p64, c = (float(v) / lines for v in out)
        print(
            f"| {cols} | {pitch} B | {pages} | {i:.3f} | {p16:.3f} | {p64:.3f} | {c:.3f} "
            f"| {i / p64:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
