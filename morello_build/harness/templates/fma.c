void morello_bench_fma(long iters, int threads);
void morello_bench_fma(long iters, int threads) {
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        long left = iters;
        __asm__ volatile(
${asm}
            : "+r"(left) : : ${clobbers}, "cc");
    }
}
