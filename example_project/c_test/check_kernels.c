/* Plain-C consumer of example_project's kernels: links the static kernel library that
 * morello_add_python_module builds and compares every kernel with a naive loop nest. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "morello_kernels.h"

static float bf16_to_f32(uint16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float rnd(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

static int check(const char *name, int m, int k, int n, int bf16,
                 void (*run)(const void *, const void *, float *))
{
    float *a = malloc(sizeof(float) * (size_t)m * (size_t)k);
    float *b = malloc(sizeof(float) * (size_t)k * (size_t)n);
    uint16_t *ah = malloc(sizeof(uint16_t) * (size_t)m * (size_t)k);
    uint16_t *bh = malloc(sizeof(uint16_t) * (size_t)k * (size_t)n);
    float *c = malloc(sizeof(float) * (size_t)m * (size_t)n);
    unsigned s = 12345u;
    int i, j, p, bad = 0;
    double worst = 0.0;
    for (i = 0; i < m * k; i++) {
        a[i] = rnd(&s);
        ah[i] = (uint16_t)(0x3f00u + (s >> 24)); /* bf16 values in [0.5, 1) */
    }
    for (i = 0; i < k * n; i++) {
        b[i] = rnd(&s);
        bh[i] = (uint16_t)(0xbf00u + (s >> 24));
    }
    if (bf16)
        run(ah, bh, c);
    else
        run(a, b, c);
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) {
            double ref = 0.0, err;
            for (p = 0; p < k; p++)
                ref += bf16 ? (double)bf16_to_f32(ah[i * k + p]) * bf16_to_f32(bh[p * n + j])
                            : (double)a[i * k + p] * b[p * n + j];
            err = fabs(c[i * n + j] - ref) / (fabs(ref) + 1.0);
            if (err > worst)
                worst = err;
            if (err > 1e-6 * k)
                bad = 1;
        }
    printf("%-12s %s (max rel err %.1e)\n", name, bad ? "FAIL" : "ok", worst);
    free(a);
    free(b);
    free(ah);
    free(bh);
    free(c);
    return bad;
}

/* Adapters with one signature, so check() can call any kernel. */
static void run_mm64(const void *a, const void *b, float *c) { mm64(a, b, c); }
static void run_mm_odd(const void *a, const void *b, float *c) { mm_odd(a, b, c); }
static void run_matvec(const void *a, const void *b, float *c) { matvec_bf16(a, b, c); }

int main(void)
{
    int fails = 0;
    fails += check("mm64", 64, 64, 64, 0, run_mm64);
    fails += check("matvec_bf16", 1, 2048, 4096, 1, run_matvec);
    fails += check("mm_odd", 7, 37, 30, 0, run_mm_odd);
    return fails != 0;
}
