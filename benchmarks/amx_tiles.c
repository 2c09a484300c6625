/* AMX microbenchmark behind the tile-kernel cost constants in morello_build/kernels/amx.py:
 * tdpbf16ps / tileloadd / tilestored throughput, tile config cost and a 256^3 bf16 GEMM with
 * 2x2 tiles, checked against a scalar reference.
 *   gcc -O3 -mavx512f -mavx512bf16 -mamx-tile -mamx-bf16 benchmarks/amx_tiles.c -o /tmp/amx && /tmp/amx
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

#define N 256
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct __attribute__((packed, aligned(64))) {
  uint8_t palette; uint8_t start_row; uint8_t res[14];
  uint16_t colsb[16]; uint8_t rows[16];
} tilecfg;

static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
static float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

static void config(void) {
  tilecfg cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int i = 0; i < 4; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }  /* C 16x16 f32 */
  for (int i = 4; i < 8; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }  /* A 16x32 bf16, B 16 pairs x 16 cols */
  /* gcc 12's _tile_loadconfig asm declares an 8-byte memory input only: force the stores */
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

/* pack B (K x N row-major bf16) into Bp[k/2][n][2] */
static void packB(const uint16_t *restrict b, uint16_t *restrict bp) {
  for (int k = 0; k < N; k += 2) {
    const uint16_t *r0 = b + k * N, *r1 = b + (k + 1) * N;
    uint16_t *o = bp + (k / 2) * N * 2;
    for (int n = 0; n < N; n += 32) {
      __m512i x0 = _mm512_loadu_si512(r0 + n), x1 = _mm512_loadu_si512(r1 + n);
      __m512i lo = _mm512_unpacklo_epi16(x0, x1), hi = _mm512_unpackhi_epi16(x0, x1);
      /* lo has 128-bit lanes: [n0-3 | n8-11 | n16-19 | n24-27], hi [n4-7|n12-15|...] */
      __m512i i0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
      __m512i i1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
      _mm512_storeu_si512(o + 2 * n, _mm512_permutex2var_epi64(lo, i0, hi));
      _mm512_storeu_si512(o + 2 * n + 32, _mm512_permutex2var_epi64(lo, i1, hi));
    }
  }
}

static void gemm(const uint16_t *restrict a, const uint16_t *restrict bp, float *restrict c) {
  for (int i = 0; i < N; i += 32)
    for (int j = 0; j < N; j += 32) {
      float *c00 = c + i * N + j;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int k = 0; k < N; k += 32) {
        _tile_loadd(4, a + i * N + k, N * 2);
        _tile_loadd(5, a + (i + 16) * N + k, N * 2);
        _tile_loadd(6, bp + (k / 2) * N * 2 + j * 2, N * 4);
        _tile_loadd(7, bp + (k / 2) * N * 2 + (j + 16) * 2, N * 4);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c00, N * 4); _tile_stored(1, c00 + 16, N * 4);
      _tile_stored(2, c00 + 16 * N, N * 4); _tile_stored(3, c00 + 16 * N + 16, N * 4);
    }
}

static int cmpd(const void *x, const void *y) { double a = *(const double *)x, b = *(const double *)y; return (a > b) - (a < b); }
#define REPS 2001
static double ts[REPS];
static double median(void) { qsort(ts, REPS, sizeof(double), cmpd); return ts[REPS / 2]; }

/* micro: throughput of tdpbf16ps alone and tileloadd alone */
static void micro(void) {
  static uint16_t buf[64 * 1024] __attribute__((aligned(64)));
  const int IT = 100000;
  double t0 = now();
  for (int it = 0; it < IT; it++) {
    _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
  }
  double t1 = now();
  printf("tdpbf16ps independent: %.2f ns each\n", (t1 - t0) / (4.0 * IT) * 1e9);
  t0 = now();
  for (int it = 0; it < IT; it++) {
    _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(0, 5, 7); _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(0, 5, 7);
  }
  t1 = now();
  printf("tdpbf16ps dependent chain: %.2f ns each\n", (t1 - t0) / (4.0 * IT) * 1e9);
  t0 = now();
  for (int it = 0; it < IT; it++) {
    _tile_loadd(4, buf, 64); _tile_loadd(5, buf + 512, 64); _tile_loadd(6, buf + 1024, 64); _tile_loadd(7, buf + 1536, 64);
  }
  t1 = now();
  printf("tileloadd (L1, 1KB): %.2f ns each\n", (t1 - t0) / (4.0 * IT) * 1e9);
  t0 = now();
  for (int it = 0; it < IT; it++) {
    _tile_stored(0, buf, 64); _tile_stored(1, buf + 512, 64); _tile_stored(2, buf + 1024, 64); _tile_stored(3, buf + 1536, 64);
  }
  t1 = now();
  printf("tilestored (L1, 1KB): %.2f ns each\n", (t1 - t0) / (4.0 * IT) * 1e9);
  /* ghz estimate via dependent add chain */
  volatile uint64_t dummy = 0; uint64_t x = 1;
  t0 = now();
  for (long i = 0; i < 200000000L; i++) { __asm__ volatile("add $1, %0" : "+r"(x)); }
  t1 = now(); dummy = x; (void)dummy;
  printf("approx GHz (1 add/cycle chain): %.2f\n", 0.2 / (t1 - t0));
}

int main(void) { setvbuf(stdout, NULL, _IONBF, 0);
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) { perror("arch_prctl"); return 1; }
  uint16_t *a = aligned_alloc(64, N * N * 2), *b = aligned_alloc(64, N * N * 2), *bp = aligned_alloc(64, N * N * 2);
  float *c = aligned_alloc(64, N * N * 4), *ref = malloc(N * N * 4);
  srand(1);
  for (int i = 0; i < N * N; i++) { a[i] = f2bf((float)rand() / RAND_MAX - 0.5f); b[i] = f2bf((float)rand() / RAND_MAX - 0.5f); }
  for (int i = 0; i < N; i++) for (int j = 0; j < N; j++) { double s = 0; for (int k = 0; k < N; k++) s += (double)bf2f(a[i * N + k]) * bf2f(b[k * N + j]); ref[i * N + j] = (float)s; }
  config();
  packB(b, bp);
  gemm(a, bp, c);
  double maxerr = 0;
  for (int i = 0; i < N * N; i++) { double e = c[i] - ref[i]; if (e < 0) e = -e; if (e > maxerr) maxerr = e; }
  printf("max abs err %.3g\n", maxerr);
  double fl = 2.0 * N * N * N;
  for (int r = 0; r < REPS; r++) { double t0 = now(); gemm(a, bp, c); ts[r] = now() - t0; }
  double m = median(); printf("gemm prepacked:        %.2f us  %.1f GF/s\n", m * 1e6, fl / m * 1e-9);
  for (int r = 0; r < REPS; r++) { double t0 = now(); packB(b, bp); gemm(a, bp, c); ts[r] = now() - t0; }
  m = median(); printf("pack+gemm:             %.2f us  %.1f GF/s\n", m * 1e6, fl / m * 1e-9);
  for (int r = 0; r < REPS; r++) { double t0 = now(); packB(b, bp); ts[r] = now() - t0; }
  m = median(); printf("pack only:             %.2f us\n", m * 1e6);
  for (int r = 0; r < REPS; r++) { double t0 = now(); config(); packB(b, bp); gemm(a, bp, c); _tile_release(); ts[r] = now() - t0; }
  m = median(); printf("cfg+pack+gemm+release: %.2f us  %.1f GF/s\n", m * 1e6, fl / m * 1e-9);
  for (int r = 0; r < REPS; r++) { double t0 = now(); for (int q = 0; q < 100; q++) { config(); _tile_release(); } ts[r] = (now() - t0) / 100; }
  m = median(); printf("loadconfig+release:    %.1f ns\n", m * 1e9);
  config();
  for (int r = 0; r < REPS; r++) { double t0 = now(); for (int q = 0; q < 100; q++) { config(); _tile_zero(0); _tile_release(); } ts[r] = (now() - t0) / 100; }
  m = median(); printf("loadconfig+zero+release: %.1f ns\n", m * 1e9);
  config();
  micro();
  _tile_release();
  return maxerr < 1e-2 ? 0 : 2;
}
