"""Measure each softmax plan form against the cost model's price for it (cost calibration).

    python benchmarks/softmax_forms.py                        # the default shapes, avx2
    python benchmarks/softmax_forms.py --shapes 1x512,32x131072 --threads 2

For every shape, each form (offline unscaled with the row's max and denominator in
registers, online, online chunked, recompute, and the RowSoftmaxChunked kernel on rows
longer than its chunk) is forced through a hand schedule, the
search fills the rest, and the C is timed: one executable per shape calls every form
round-robin (a block of calls per sample, `--samples` samples, median), so the forms meet
the same machine state. Printed side by side with the model's cost, and which form the DP
picks on its own: the constants in kernels/rows.py are right when the measured order
matches the model's (docs/softmax.md, "Cost constants").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from morello_build.actions.rows import ONLINE, UNSCALED, SoftmaxParts, ToMaxAndDenominator
from morello_build.api import row_spec_text, synthesize
from morello_build.codegen.emit import generate_c
from morello_build.harness.compile import find_compiler, kernel_flags, uses_openmp
from morello_build.impl.nodes import Impl
from morello_build.impl.printer import iter_nodes
from morello_build.ir.levels import Level
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
from morello_build.schedule import Schedule

FORMS = ("unscaled", "online", "recompute", "chunked")

_DRIVER = r"""
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
%(decls)s
typedef void (*fn_t)(const float *, float *);
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
int main(void) {
    const long n = %(n)ld;
    float *x = aligned_alloc(64, n * 4), *out = aligned_alloc(64, n * 4);
    for (long i = 0; i < n; i++) x[i] = (float)((i * 7919) %% 2000) / 250.0f - 4.0f;
    fn_t fns[] = {%(fns)s};
    const int k = sizeof fns / sizeof fns[0];
    long reps[16];
    for (int f = 0; f < k; f++) {  /* calibrate: a block lasts ~20 ms */
        reps[f] = 1;
        for (;;) {
            double t0 = now();
            for (long r = 0; r < reps[f]; r++) fns[f](x, out);
            if (now() - t0 > 0.02) break;
            reps[f] *= 2;
        }
    }
    static double s[16][64];
    for (int sample = 0; sample < %(samples)d; sample++)
        for (int j = 0; j < k; j++) {
            int f = (j + sample) %% k;
            double t0 = now();
            for (long r = 0; r < reps[f]; r++) fns[f](x, out);
            s[f][sample] = (now() - t0) / reps[f];
        }
    for (int f = 0; f < k; f++) {
        qsort(s[f], %(samples)d, sizeof(double), cmp);
        printf("%%.6e\n", s[f][%(samples)d / 2]);
    }
    return 0;
}
"""


def forced(rows: int, n: int, form: str, threads: int) -> Impl | None:
    """The softmax of `form`, rows tiled to one (the search fills the rest)."""
    spec = parse_spec(row_spec_text("softmax", rows, n, threads=threads))
    target = get_target("avx2", threads)
    sched = Schedule.for_spec(spec, target)
    if rows > 1:
        sched = sched.tile_out(1, n, parallel=threads > 1)
    level = Level.RF if threads == 1 else Level.L1
    if form == "chunked":  # one kernel per row (rows longer than a chunk only)
        sched = sched.select("RowSoftmaxChunked")
    elif form == "unscaled":
        sched = sched.apply(SoftmaxParts(level, UNSCALED))
    elif form == "online":
        sched = sched.apply(SoftmaxParts(level, ONLINE))
    else:
        sched = sched.apply(SoftmaxParts(level, ONLINE))
        path = [0, 0] if rows > 1 else [0]
        sched = sched.apply(ToMaxAndDenominator(), path)
    try:
        return sched.synthesize_rest().impl
    except Exception as exc:  # a form that does not fit this shape
        print(f"  {form}: {exc}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="1x512,1x2048,1x8192,8x8192,1x32768,1x131072,1x524288")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--samples", type=int, default=15)
    args = p.parse_args(argv)
    cc = find_compiler(None)
    print("| shape | form | model cost | us/call | GB/s (read x, write out) | chosen by DP |")
    print("|---|---|---|---|---|---|")
    for text in args.shapes.split(","):
        rows, n = (int(v) for v in text.split("x"))
        picked = synthesize(
            row_spec_text("softmax", rows, n, threads=args.threads),
            "avx2",
            threads=args.threads,
            use_cache=False,
        ).impl
        picked_form = next(
            (
                a.split("(")[1].split(",")[0]
                for a in (x.action for x in iter_nodes(picked))
                if a.startswith("softmax_parts")
            ),
            "?",
        )
        if picked_form == "online" and any(
            x.action == "to_max_and_denominator()" for x in iter_nodes(picked)
        ):
            picked_form = "recompute"
        if any(x.action == "select(RowSoftmaxChunked)" for x in iter_nodes(picked)):
            picked_form = "chunked"
        impls = {f: forced(rows, n, f, args.threads) for f in FORMS}
        impls = {f: i for f, i in impls.items() if i is not None}
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            sources, decls, fns = [], [], []
            for f, impl in impls.items():
                k = generate_c(impl, f"sm_{f}", "avx2")
                (d / f"sm_{f}.c").write_text(k.c_source)
                (d / f"sm_{f}.h").write_text(k.header)
                sources.append(str(d / f"sm_{f}.c"))
                decls.append(f'#include "sm_{f}.h"')
                fns.append(f"sm_{f}")
            (d / "main.c").write_text(
                _DRIVER
                % {
                    "decls": "\n".join(decls),
                    "n": rows * n,
                    "fns": ", ".join(f"(fn_t){x}" for x in fns),
                    "samples": args.samples,
                }
            )
            flags = kernel_flags(
                "avx2",
                openmp=args.threads > 1
                or any(uses_openmp(generate_c(i, "k", "avx2")) for i in impls.values()),
            )
            exe = d / "forms"
            subprocess.run(
                [cc.path, *flags, "-I", str(d), *sources, str(d / "main.c"), "-o", str(exe)],
                check=True,
            )
            env = {"OMP_NUM_THREADS": str(args.threads), "PATH": "/usr/bin:/bin"}
            lines = subprocess.run(
                ["taskset", "-c", "0" if args.threads == 1 else f"0-{args.threads - 1}", str(exe)],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            ).stdout.split()
        for (f, impl), secs in zip(impls.items(), map(float, lines)):
            cost = impl.cost.main if impl.cost else 0
            gbs = rows * n * 8 / secs / 1e9
            mark = "yes" if f == picked_form else ""
            print(f"| {text} | {f} | {cost} | {secs * 1e6:.2f} | {gbs:.1f} | {mark} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
