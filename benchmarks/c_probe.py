"""Build and run a one-file C probe: what the microbenchmarks behind the cost model's
constants share (`par_setup.py`, `strided_copy.py`, `tile_stream.py`, `level_reads.py`,
`row_stream.py`).

A probe's table names its machine with `machine.isa.host_cpu_name`. `TIMING_C` is the probe's prelude: a
monotonic clock in ns, a median, a `sink` that keeps the compiler from dropping the timed
work, and `page_matrix` (a matrix placed past a page). `run_probe` compiles the source with the given flags (the kernels' -O3 plus the
ISA's) and returns what the probe printed, or raises `ProbeError` with a one-line reason
a script can print before exiting 1.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from morello_build.harness.compile import CompilerNotFound, find_compiler

TIMING_C = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return v[n / 2];
}
volatile float sink;
/* rows x cols floats, `offset` bytes past a page, filled with small values (B of the probes
   that read a matrix) */
__attribute__((unused)) static float *page_matrix(int rows, int cols, int offset) {
    char *raw = aligned_alloc(4096, (size_t)rows * cols * 4 + 4096);
    float *m = (float *)(raw + offset);
    for (long i = 0; i < (long)rows * cols; i++) m[i] = (float)(i % 97) * 0.01f;
    return m;
}
"""


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers, at least one (the probes' size lists)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


class ProbeError(Exception):
    """The probe could not be built or run (the message says why, in one line)."""


def probe_compiler(cc: str | None) -> str:
    """The C compiler's path: `cc`, else $CC, else gcc (`ProbeError` if there is none)."""
    try:
        return find_compiler(cc).path
    except CompilerNotFound as e:
        raise ProbeError(str(e)) from e


def run_probe(
    cc: str,
    source: str,
    flags: Sequence[str],
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
) -> str:
    """Compile `TIMING_C + source` with `cc -O3 flags`, run it with `args`; its stdout."""
    with tempfile.TemporaryDirectory(prefix="morello-probe-") as tmp:
        src, exe = Path(tmp, "probe.c"), Path(tmp, "probe")
        src.write_text(TIMING_C + source)
        try:
            subprocess.run(
                [cc, "-O3", *flags, str(src), "-o", str(exe)],
                check=True,
                capture_output=True,
                text=True,
            )
        except (OSError, subprocess.CalledProcessError) as e:
            err = getattr(e, "stderr", "") or str(e)
            raise ProbeError(f"cannot build the probe with {cc}: {err}") from e
        try:
            done = subprocess.run(
                [str(exe), *args], check=True, capture_output=True, text=True, env=env
            )
        except (OSError, subprocess.CalledProcessError) as e:
            err = getattr(e, "stderr", "") or str(e)
            raise ProbeError(f"the probe failed: {err}") from e
        return done.stdout
