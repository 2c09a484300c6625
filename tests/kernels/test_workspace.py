"""Heap workspaces are kept between calls and never shared by calls running at once.

A kernel whose scratch is too big for the stack takes a buffer from a static slot and parks
it there when it returns (codegen/context.py, the `workspace` helper). These tests link the
generated C into a small C program that counts `posix_memalign` calls (`--wrap`), calls the
kernel over and over, and checks every output against a plain C matmul: one after another
it allocates once, and from several threads at once every result stays right.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from morello_build.codegen.emit import generate_c
from morello_build.harness.compile import kernel_flags
from morello_build.ir.text import parse_spec
from morello_build.machine.isa import host_supports
from morello_build.machine.target import get_target
from morello_build.schedule import Schedule
from tests.support.compilers import COMPILERS, have_compiler

M, K, N = 16, 256, 64

DRIVER = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "k.h"

#define M @M@
#define K @K@
#define N @N@
#define THREADS 4
#define CALLS 200

static int allocations;
int __real_posix_memalign(void **p, size_t align, size_t n);
int __wrap_posix_memalign(void **p, size_t align, size_t n) {
    __atomic_add_fetch(&allocations, 1, __ATOMIC_RELAXED);
    return __real_posix_memalign(p, align, n);
}

static float a[THREADS][M * K], b[THREADS][K * N], want[THREADS][M * N];

static int check(int t, const float *c) {
    for (int i = 0; i < M * N; i++) {
        float d = c[i] - want[t][i];
        if (d > 1e-3f || d < -1e-3f)
            return 1;
    }
    return 0;
}

static void *worker(void *arg) {
    int t = (int)(long)arg, bad = 0;
    float c[M * N];
    for (int r = 0; r < CALLS; r++) {
        k(a[t], b[t], c);
        bad += check(t, c);
    }
    return (void *)(long)bad;
}

int main(void) {
    for (int t = 0; t < THREADS; t++) {
        for (int i = 0; i < M * K; i++)
            a[t][i] = (float)((i * 7 + t * 3) % 11) - 5.0f;
        for (int i = 0; i < K * N; i++)
            b[t][i] = (float)((i * 5 + t) % 13) * 0.25f - 1.5f;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float s = 0;
                for (int p = 0; p < K; p++)
                    s += a[t][i * K + p] * b[t][p * N + j];
                want[t][i * N + j] = s;
            }
    }
    int bad = (int)(long)worker((void *)0L);
    printf("sequential %d calls: %d allocations, %d wrong\n", CALLS, allocations, bad);
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++)
        pthread_create(&th[t], 0, worker, (void *)t);
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        bad += (int)(long)r;
    }
    printf("concurrent: %d allocations in all, %d wrong\n", allocations, bad);
    return bad != 0;
}
"""


@pytest.mark.parametrize("cc", COMPILERS)
def test_workspace_is_reused_and_private_to_a_call(cc: str, tmp_path: Path) -> None:
    if not have_compiler(cc):
        pytest.skip(f"{cc} is not installed")
    if not host_supports("avx2"):
        pytest.skip("this host cannot run avx2 code")
    spec = parse_spec(f"Matmul(1x{M}x{K}x{N}, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    s = Schedule.for_spec(spec, get_target("avx2"))
    s = s.to_accum().at(1, lambda h: h.split(128).move(1, "GL", layout="[2,1,2p16]"))
    g = generate_c(s.synthesize_rest().impl, "k", "avx2")
    assert g.abi.workspace_bytes > 16 * 1024 and "mb_ws_take(" in g.c_source
    (tmp_path / "k.c").write_text(g.c_source)
    (tmp_path / "k.h").write_text(g.header)
    driver = DRIVER.replace("@M@", str(M)).replace("@K@", str(K)).replace("@N@", str(N))
    (tmp_path / "main.c").write_text(driver)
    flags = kernel_flags("avx2", strict=True, openmp=False)
    cmd = [cc, *flags, "-pthread", "-Wl,--wrap=posix_memalign", "k.c", "main.c", "-o", "main"]
    subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, text=True)
    run = subprocess.run(["./main"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    seq, conc = run.stdout.splitlines()
    # One after another: the first call allocates, the next 199 reuse its buffer.
    assert seq == "sequential 200 calls: 1 allocations, 0 wrong", run.stdout
    # At once: a call that finds the slot empty allocates its own buffer; a shared one
    # would mix two calls' packed blocks and give wrong results.
    assert conc.startswith("concurrent: ") and conc.endswith(" 0 wrong"), run.stdout
