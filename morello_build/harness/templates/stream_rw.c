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
