"""Measure what copying a strip of a row-major matrix costs, per line the model counts.

    python benchmarks/strided_copy.py                  # B = 768 x 3072 f32, 16 bytes past a line
    python benchmarks/strided_copy.py --rows 3072 --cols 768 --offset 0

A copy of operand B into a packed buffer (a `Move` that is not a cache view) is priced by
its prologue, which reads the source a contiguous run at a time (`Target.run_lines_cost`:
each run in main memory pays its lines plus one, docs/cost-model.md, "Unaligned rows").
Whether a strided source (a strip of columns, rows a matrix pitch apart) costs more per
counted line than a contiguous one is what decides if `move_const` should add a
surcharge for it (docs/cost-model.md, "Copies between levels"). This script times, in one
C program built with the kernels' AVX2 flags:
- strips: every `rows x W` column strip of the matrix copied, strip after strip, into one
  packed buffer (how a kernel packs B strip by strip), for W in 16, 32, 64, 128, 256 floats;
- contiguous: the same bytes read as consecutive `rows x W`-float blocks of the flat array;
- streamed: each strip read in place into registers, no copy (what a plan that streams B
  from memory for each block of rows of C does, e.g. at M = 16).
Each figure is the median ns per pass over the whole matrix divided by the lines the model
counts for that pass, so equal numbers mean the model's line count alone prices them.
The matrix (9 MiB by default) is read from whatever cache holds it after the first pass,
as in a kernel called in a loop.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from c_probe import ProbeError, probe_compiler, run_probe

_C = r"""
#include <immintrin.h>
#include <string.h>

/* copy rows x w floats, rows `pitch` floats apart, into dst (w a multiple of 8) */
static void pack(float *restrict dst, const float *restrict src, int rows, int w, long pitch) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < w; c += 8)
            _mm256_storeu_ps(dst + (long)r * w + c, _mm256_loadu_ps(src + r * pitch + c));
}
static __m256 stream(const float *src, int rows, int w, long pitch, __m256 acc) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < w; c += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(src + r * pitch + c));
    return acc;
}

int main(int argc, char **argv) {
    const int rows = atoi(argv[1]), cols = atoi(argv[2]), offset = atoi(argv[3]);
    const int samples = atoi(argv[4]);
    float *m = page_matrix(rows, cols, offset);
    float *buf = aligned_alloc(64, (size_t)rows * 256 * 4);
    const int widths[] = {16, 32, 64, 128, 256};
    double v[1000];
    for (int wi = 0; wi < 5; wi++) {
        const int w = widths[wi];
        if (cols % w) continue;
        double t[3];
        for (int kind = 0; kind < 3; kind++) {
            for (int s = 0; s < samples + 1; s++) {
                __m256 acc = _mm256_setzero_ps();
                const double t0 = now();
                for (int j = 0; j < cols; j += w) {
                    if (kind == 0) pack(buf, m + j, rows, w, cols);
                    else if (kind == 1) pack(buf, m + (long)j * rows, rows, w, w);
                    else acc = stream(m + j, rows, w, cols, acc);
                }
                const double dt = now() - t0;
                sink = buf[w] + acc[0];
                if (s) v[s - 1] = dt; /* the first pass warms the caches */
            }
            t[kind] = median(v, samples);
        }
        printf("%d %.1f %.1f %.1f\n", w, t[0], t[1], t[2]);
    }
    return 0;
}
"""


def _lines(run_bytes: int, runs: int, offset: int) -> int:
    """Lines the model counts for `runs` runs of `run_bytes` in main memory: each run's lines
    plus one (`Target.run_lines_cost`)."""
    del offset  # the model does not know the offset: it always counts the extra line
    return runs * (-(-run_bytes // 64) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=768, help="rows of B (default 768)")
    parser.add_argument("--cols", type=int, default=3072, help="columns of B (default 3072)")
    parser.add_argument(
        "--offset", type=int, default=16, help="bytes past a page where B starts (default 16)"
    )
    parser.add_argument("--samples", type=int, default=41, help="passes timed (default 41)")
    parser.add_argument("--cc", default=None, help="C compiler (default $CC, else gcc)")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.cols < 16 or args.cols % 16:
        parser.error("--rows must be >= 1 and --cols a multiple of 16")
    if not 0 <= args.offset < 4096 or args.offset % 4:
        parser.error("--offset must be a multiple of 4 below 4096")
    if not 1 <= args.samples <= 999:
        parser.error("--samples must be 1..999")
    argv_c = [str(args.rows), str(args.cols), str(args.offset), str(args.samples)]
    try:
        cc = probe_compiler(args.cc)
        out = run_probe(cc, _C, ["-mavx2", "-mfma"], argv_c)
    except ProbeError as e:
        print(f"strided_copy.py: {e}", file=sys.stderr)
        return 1
    r, c = args.rows, args.cols
    mib = r * c * 4 / 2**20
    print(
        f"{Path(cc).name}; B {r}x{c} f32 ({mib:.1f} MiB), {args.offset} bytes past a page; "
        f"medians of {args.samples} passes; ns per line the model counts"
    )
    print(
        "| strip width (floats) | strips ns/line | contiguous ns/line | strips / contiguous "
        "| streamed ns/line |"
    )
    print("|---:|---:|---:|---:|---:|")
    for line in out.splitlines():
        w_text, strip_ns, contig_ns, stream_ns = line.split()
        w = int(w_text)
        strips = c // w
        strip_lines = strips * _lines(w * 4, r, args.offset)
        contig_lines = strips * _lines(r * w * 4, 1, args.offset)
        s_per, c_per = float(strip_ns) / strip_lines, float(contig_ns) / contig_lines
        t_per = float(stream_ns) / strip_lines
        print(f"| {w} | {s_per:.3f} | {c_per:.3f} | {s_per / c_per:.2f}x | {t_per:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
