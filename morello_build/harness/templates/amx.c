#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
${amx_helpers}void morello_bench_amx(long iters, int threads);
void morello_bench_amx(long iters, int threads) {
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        static const unsigned short zero[512] __attribute__((aligned(64)));
        mb_amx_enable();
        _tile_loadconfig(mb_amx_cfg);
        _tile_loadd(4, zero, 64); _tile_loadd(5, zero, 64);
        _tile_loadd(6, zero, 64); _tile_loadd(7, zero, 64);
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (long i = 0; i < iters; i++) {
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
        _tile_release();
    }
}
