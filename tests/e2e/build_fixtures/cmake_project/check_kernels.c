/* Links against the generated kernels and checks them against a plain loop nest. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mm_multi.h"
#include "mm_small.h"
#include "mm_spec.h"
#include "mv_bf16.h"

static float bf16_to_f32(uint16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int check(const char *name, const float *got, const float *want, int n, int k)
{
    int i;
    for (i = 0; i < n; i++) {
        float tol = 1e-5f * (float)k * (fabsf(want[i]) + 1.0f);
        if (fabsf(got[i] - want[i]) > tol) {
            printf("%s: FAIL at %d: %g != %g\n", name, i, got[i], want[i]);
            return 1;
        }
    }
    printf("%s: ok\n", name);
    return 0;
}

#define REF(M, K, N, A, B, C, LOAD)                                  \
    do {                                                             \
        int i_, j_, k_;                                              \
        for (i_ = 0; i_ < (M); i_++)                                 \
            for (j_ = 0; j_ < (N); j_++) {                           \
                float s_ = 0.0f;                                     \
                for (k_ = 0; k_ < (K); k_++)                         \
                    s_ += LOAD((A)[i_ * (K) + k_]) * LOAD((B)[k_ * (N) + j_]); \
                (C)[i_ * (N) + j_] = s_;                             \
            }                                                        \
    } while (0)

#define ID(x) (x)

int main(void)
{
    static float a[64 * 64], b[64 * 64], c[64 * 64], r[64 * 64];
    static uint16_t ah[64 * 64], bh[64 * 64];
    int i, fails = 0;
    for (i = 0; i < 64 * 64; i++) {
        a[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
        b[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
        ah[i] = (uint16_t)(0x3f80u + (unsigned)(i % 7)); /* ~1.0 .. 1.05 */
        bh[i] = (uint16_t)(0xbf00u + (unsigned)(i % 5)); /* ~-0.5 */
    }
    mm_spec(a, b, c);
    REF(8, 16, 4, a, b, r, ID);
    fails += check("mm_spec", c, r, 8 * 4, 16);
    mm_small(a, b, c);
    REF(16, 8, 12, a, b, r, ID);
    fails += check("mm_small", c, r, 16 * 12, 8);
    mm_multi(a, b, c);
    REF(5, 7, 3, a, b, r, ID);
    fails += check("mm_multi", c, r, 5 * 3, 7);
    mv_bf16(ah, bh, c);
    REF(1, 32, 24, ah, bh, r, bf16_to_f32);
    fails += check("mv_bf16", c, r, 24, 32);
    return fails != 0;
}
