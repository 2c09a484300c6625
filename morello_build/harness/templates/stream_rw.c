/* A row operation's memory bound: read its input and write its output once, with plain
   vector loads and stores (no non-temporal stores: a kernel's output stays cached too),
   split over the kernel's threads as static chunks. */
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#define MB_LANES 16
#else
#define MB_LANES 8
#endif
typedef float mb_v __attribute__((vector_size(4 * MB_LANES)));
typedef uint32_t mb_u __attribute__((vector_size(4 * MB_LANES)));
typedef uint16_t mb_h __attribute__((vector_size(2 * MB_LANES)));

void morello_bench_stream_rw(const void *src, void *dst, long n, int threads);
void morello_bench_stream_rw(const void *src, void *dst, long n, int threads) {
    const float *s = src;
    float *d = dst;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (long i = 0; i < n / MB_LANES; i++) {
        mb_v v;
        memcpy(&v, s + i * MB_LANES, sizeof v);
        memcpy(d + i * MB_LANES, &v, sizeof v);
    }
    for (long i = n - n % MB_LANES; i < n; i++) d[i] = s[i];
}

void morello_bench_stream_rw_bf16(const void *src, void *dst, long n, int threads);
void morello_bench_stream_rw_bf16(const void *src, void *dst, long n, int threads) {
    const uint16_t *s = src;
    float *d = dst;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (long i = 0; i < n / MB_LANES; i++) {
        mb_h h;
        memcpy(&h, s + i * MB_LANES, sizeof h);
        mb_u w = __builtin_convertvector(h, mb_u) << 16;
        memcpy(d + i * MB_LANES, &w, sizeof w);
    }
    for (long i = n - n % MB_LANES; i < n; i++) {
        uint32_t w = (uint32_t)s[i] << 16;
        memcpy(d + i, &w, sizeof w);
    }
}

/* A reduction's memory bound: its input read once (its output, one value per row, is
   negligible), as 4 independent vector sums per thread so that no add latency limits it. */
float morello_bench_stream_r(const void *src, long nbytes, int threads);
float morello_bench_stream_r(const void *src, long nbytes, int threads) {
    const char *s = src;
    const long step = (long)sizeof(mb_v) * 4, blocks = nbytes / step;
    float total = 0.0f;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
#endif
    {
        mb_v a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (long i = 0; i < blocks; i++) {
            mb_v v0, v1, v2, v3;
            memcpy(&v0, s + i * step, sizeof v0);
            memcpy(&v1, s + i * step + sizeof v0, sizeof v1);
            memcpy(&v2, s + i * step + 2 * sizeof v0, sizeof v2);
            memcpy(&v3, s + i * step + 3 * sizeof v0, sizeof v3);
            a0 += v0, a1 += v1, a2 += v2, a3 += v3;
        }
        a0 += a1 + a2 + a3;
        for (int l = 0; l < MB_LANES; l++) total += a0[l];
    }
    return total;
}
