/* Plain-C consumer of example_project's kernels: links the static kernel library that
 * morello_add_python_module builds and compares every kernel with a naive loop nest (the
 * row operations and the pipelines with libm in double). */
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

/* A row operation over [rows, n] f32 x against `ref` (per row, in double): within 1e-5
 * relative, plus 1e-6 absolute where gelu's result cancels to ~0. */
static int check_rows(const char *name, int rows, int n, void (*run)(const float *, float *),
                      void (*ref)(const float *, double *, int))
{
    float *x = malloc(sizeof(float) * (size_t)rows * (size_t)n);
    float *out = malloc(sizeof(float) * (size_t)rows * (size_t)n);
    double *want = malloc(sizeof(double) * (size_t)n);
    unsigned s = 777u;
    int i, r, bad = 0;
    double worst = 0.0;
    for (i = 0; i < rows * n; i++)
        x[i] = rnd(&s) * 12.0f;
    run(x, out);
    for (r = 0; r < rows; r++) {
        ref(x + (size_t)r * (size_t)n, want, n);
        for (i = 0; i < n; i++) {
            double got = out[(size_t)r * (size_t)n + (size_t)i];
            double err = fabs(got - want[i]) / (fabs(want[i]) + 0.1);
            if (err > worst)
                worst = err;
            if (fabs(got - want[i]) > 1e-5 * fabs(want[i]) + 1e-6)
                bad = 1;
        }
    }
    printf("%-12s %s (max rel err %.1e)\n", name, bad ? "FAIL" : "ok", worst);
    free(x);
    free(out);
    free(want);
    return bad;
}

static void softmax_ref(const float *x, double *out, int n)
{
    double m = -INFINITY, sum = 0.0;
    int i;
    for (i = 0; i < n; i++)
        m = fmax(m, x[i]);
    for (i = 0; i < n; i++)
        sum += exp(x[i] - m);
    for (i = 0; i < n; i++)
        out[i] = exp(x[i] - m) / sum;
}

static void gelu_ref(const float *x, double *out, int n)
{
    int i;
    for (i = 0; i < n; i++)
        out[i] = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
}

/* A pipeline: its inputs (sizes[i] floats each, uniform in [-1, 1)) in declared order, out
 * [rows, n] f32, against `ref` in double: within tol relative to |ref| + 1, as check(). */
#define MAX_INPUTS 8
static int check_pipeline(const char *name, int n_inputs, const int *sizes, int rows, int n,
                          double tol, void (*run)(const float *const *, float *),
                          void (*ref)(const double *const *, double *))
{
    float *in[MAX_INPUTS];
    double *in_d[MAX_INPUTS];
    float *out = malloc(sizeof(float) * (size_t)rows * (size_t)n);
    double *want = malloc(sizeof(double) * (size_t)rows * (size_t)n);
    unsigned s = 4242u;
    int i, j, bad = 0;
    double worst = 0.0;
    for (i = 0; i < n_inputs; i++) {
        in[i] = malloc(sizeof(float) * (size_t)sizes[i]);
        in_d[i] = malloc(sizeof(double) * (size_t)sizes[i]);
        for (j = 0; j < sizes[i]; j++) {
            in[i][j] = rnd(&s) * 2.0f;
            in_d[i][j] = in[i][j];
        }
    }
    run((const float *const *)in, out);
    ref((const double *const *)in_d, want);
    for (i = 0; i < rows * n; i++) {
        double err = fabs(out[i] - want[i]) / (fabs(want[i]) + 1.0);
        if (err > worst)
            worst = err;
        if (!(err <= tol))
            bad = 1;
    }
    printf("%-12s %s (max rel err %.1e)\n", name, bad ? "FAIL" : "ok", worst);
    for (i = 0; i < n_inputs; i++) {
        free(in[i]);
        free(in_d[i]);
    }
    free(out);
    free(want);
    return bad;
}

/* c[m, n] = a[m, k] @ b[k, n] in double (b_t: b is stored [n, k], i.e. a @ b.T). */
static void matmul_d(const double *a, const double *b, double *c, int m, int k, int n, int b_t)
{
    int i, j, p;
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) {
            double acc = 0.0;
            for (p = 0; p < k; p++)
                acc += a[i * k + p] * (b_t ? b[j * k + p] : b[p * n + j]);
            c[i * n + j] = acc;
        }
}

/* q_proj = x @ w * s (x, w [16, 16], s [1]) */
static void q_proj_ref(const double *const *in, double *out)
{
    int i, j;
    matmul_d(in[0], in[1], out, 16, 16, 16, 0);
    for (i = 0; i < 16; i++)
        for (j = 0; j < 16; j++)
            out[i * 16 + j] *= in[2][0];
}

/* attn_out = softmax(q @ k.T) @ v @ wo + x (all [16, 16]) */
static void attn_out_ref(const double *const *in, double *out)
{
    double s[256], p[256];
    int i, j;
    matmul_d(in[0], in[1], s, 16, 16, 16, 1);
    for (i = 0; i < 16; i++) {
        double m = -INFINITY, sum = 0.0;
        for (j = 0; j < 16; j++)
            m = fmax(m, s[i * 16 + j]);
        for (j = 0; j < 16; j++)
            sum += exp(s[i * 16 + j] - m);
        for (j = 0; j < 16; j++)
            s[i * 16 + j] = exp(s[i * 16 + j] - m) / sum;
    }
    matmul_d(s, in[2], p, 16, 16, 16, 0);
    matmul_d(p, in[3], out, 16, 16, 16, 0);
    for (i = 0; i < 256; i++)
        out[i] += in[4][i];
}

/* mlp = gelu(h @ w1 + b1) @ w2 + b2 (h [16, 16], w1 [16, 64], b1 [64], w2 [64, 16], b2 [16]) */
static void mlp_ref(const double *const *in, double *out)
{
    double u[16 * 64];
    int i, j;
    matmul_d(in[0], in[1], u, 16, 16, 64, 0);
    for (i = 0; i < 16; i++)
        for (j = 0; j < 64; j++) {
            double z = u[i * 64 + j] + in[2][j];
            u[i * 64 + j] = 0.5 * z * (1.0 + erf(z / sqrt(2.0)));
        }
    matmul_d(u, in[3], out, 16, 64, 16, 0);
    for (i = 0; i < 16; i++)
        for (j = 0; j < 16; j++)
            out[i * 16 + j] += in[4][j];
}

/* Adapters with one signature, so check() and check_pipeline() can call any kernel. */
static void run_mm64(const void *a, const void *b, float *c) { mm64(a, b, c); }
static void run_mm_odd(const void *a, const void *b, float *c) { mm_odd(a, b, c); }
static void run_matvec(const void *a, const void *b, float *c) { matvec_bf16(a, b, c); }
static void run_proj(const void *a, const void *b, float *c) { proj(a, b, c); }
static void run_q_proj(const float *const *in, float *out) { q_proj(in[0], in[1], in[2], out); }
static void run_attn_out(const float *const *in, float *out)
{
    attn_out(in[0], in[1], in[2], in[3], in[4], out);
}
static void run_mlp(const float *const *in, float *out)
{
    mlp(in[0], in[1], in[2], in[3], in[4], out);
}

int main(void)
{
    int fails = 0;
    fails += check("mm64", 64, 64, 64, 0, run_mm64);
    fails += check("matvec_bf16", 1, 2048, 4096, 1, run_matvec);
    fails += check("mm_odd", 7, 37, 30, 0, run_mm_odd);
    fails += check_rows("softmax_rows", 8, 512, softmax_rows, softmax_ref);
    fails += check_rows("gelu_rows", 16, 256, gelu_rows, gelu_ref);
    {
        /* the transformer block's kernels; tolerances as the Python tests': 1e-6 per unit
         * of each product's reduction (16 at least) */
        static const int q_proj_in[] = {16 * 16, 16 * 16, 1};
        static const int attn_in[] = {16 * 16, 16 * 16, 16 * 16, 16 * 16, 16 * 16};
        static const int mlp_in[] = {16 * 16, 16 * 64, 64, 64 * 16, 16};
        fails += check_pipeline("q_proj", 3, q_proj_in, 16, 16, 16e-6, run_q_proj, q_proj_ref);
        fails += check("proj", 16, 16, 16, 0, run_proj);
        fails += check_pipeline("attn_out", 5, attn_in, 16, 16, 48e-6, run_attn_out,
                                attn_out_ref);
        fails += check_pipeline("mlp", 5, mlp_in, 16, 16, 128e-6, run_mlp, mlp_ref);
    }
    return fails != 0;
}
