#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Peer prototypes are declared here, not via cblas.h: OpenBLAS' and MKL's headers clash. */
${naive_prototype};
#define N_OPERANDS ${n_operands}
#define OUT_INDEX ${out_index}
#define ACCUMULATE ${accumulate}
#define MIN_SAMPLES ${min_samples}
#define WARMUP_SECONDS ${warmup_seconds}
/* Every array starts this many bytes past a 64-byte boundary (bench --offset): callers'
   arrays often do (numpy's large arrays start 16 bytes past a page). 0: aligned. */
#define ARRAY_OFFSET ${array_offset}
static const size_t nbytes[N_OPERANDS] = {${nbytes}};
void *morello_bench_buf[N_OPERANDS];
static void **const buf = morello_bench_buf;
struct impl { const char *name; void (*run)(void); const char *skip; int reference; };
${implementations}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *alloc64(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64 + 64; /* room for ARRAY_OFFSET */
    char *p = aligned_alloc(64, rounded);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    memset(p, 0, rounded);
    return p + ARRAY_OFFSET;
}

static void *load(const char *dir, const char *file, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    void *p = alloc64(bytes);
    FILE *f = fopen(path, "rb");
    if (!f || fread(p, 1, bytes, f) != bytes) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    fclose(f);
    return p;
}

static void save(const char *dir, const char *name, const void *p, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/out_%s.bin", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    fclose(f);
}

static double time_block(int i, long reps) {
    double t0 = now();
    for (long r = 0; r < reps; r++) impls[i].run();
    return now() - t0;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: harness check|time DIR THREADS [SAMPLE_S MIN_TIME NAMES...]\n"); return 2; }
    const char *dir = argv[2];
    int threads = atoi(argv[3]);
    char file[64];
    for (int i = 0; i < N_OPERANDS; i++) {
        snprintf(file, sizeof file, "in_%d.bin", i);
        buf[i] = i == OUT_INDEX ? alloc64(nbytes[i]) : load(dir, file, nbytes[i]);
    }
    void *init_out = load(dir, "init.bin", nbytes[OUT_INDEX]);
    if (threads == 1) {
        cpu_set_t set;
        CPU_ZERO(&set);
        int cpu = sched_getcpu();
        CPU_SET(cpu < 0 ? 0 : cpu, &set);
        sched_setaffinity(0, sizeof set, &set);
    }
    setup(threads);
    if (strcmp(argv[1], "check") == 0) {
        for (int i = 0; i < N_OPERANDS; i++)
            printf("offset %d %d\n", i, (int)((uintptr_t)buf[i] % 64));
        for (int i = 0; i < N_IMPLS; i++) {
            if (impls[i].skip) { printf("skip %s %s\n", impls[i].name, impls[i].skip); continue; }
            if (impls[i].reference) { impls[i].run(); printf("reference %s\n", impls[i].name); continue; }
            memcpy(buf[OUT_INDEX], init_out, nbytes[OUT_INDEX]);
            impls[i].run();
            save(dir, impls[i].name, buf[OUT_INDEX], nbytes[OUT_INDEX]);
            printf("checked %s\n", impls[i].name);
        }
        return 0;
    }
    if (argc < 6) { fprintf(stderr, "time needs SAMPLE_S MIN_TIME NAMES...\n"); return 2; }
    double sample_s = atof(argv[4]), min_time = atof(argv[5]);
    int sel[N_IMPLS + 1], nsel = 0;
    for (int a = 6; a < argc; a++)
        for (int i = 0; i < N_IMPLS; i++)
            if (strcmp(argv[a], impls[i].name) == 0 && !impls[i].skip) sel[nsel++] = i;
    /* Accumulating kernels keep adding into the output; others overwrite it. */
    if (ACCUMULATE) memcpy(buf[OUT_INDEX], init_out, nbytes[OUT_INDEX]);
    else memset(buf[OUT_INDEX], 0, nbytes[OUT_INDEX]);
    long reps[N_IMPLS + 1];
    for (int s = 0; s < nsel; s++) {
        int i = sel[s];
        /* Warm-up: caches, page mappings, lazy library init and the clock ramp. */
        double t0 = now();
        for (int w = 0; w < 2 || now() - t0 < WARMUP_SECONDS; w++) impls[i].run();
        long r = 1;
        double t = time_block(i, r);
        while (t < sample_s / 4 && r < (1L << 40)) { r *= 2; t = time_block(i, r); }
        for (int pass = 0; pass < 2; pass++) { /* rescale, then re-measure once */
            long scaled = (long)ceil((double)r * sample_s / (t > 0 ? t : 1e-9));
            r = scaled < 1 ? 1 : scaled;
            if (pass == 0) t = time_block(i, r);
        }
        reps[s] = r;
        printf("reps %s %ld\n", impls[i].name, reps[s]);
    }
    long nsamples = (long)ceil(min_time / sample_s);
    if (nsamples < MIN_SAMPLES) nsamples = MIN_SAMPLES;
    if (nsamples > 100000) nsamples = 100000;
    for (long round = 0; round < nsamples; round++)
        for (int q = 0; q < nsel; q++) {
            int s = (int)((round + q) % nsel);
            double t = time_block(sel[s], reps[s]);
            printf("sample %s %.9e\n", impls[sel[s]].name, t / (double)reps[s]);
        }
    fflush(stdout);
    return 0;
}
