
#include <string.h>
#if defined(__AVX512F__)
typedef float mb_v __attribute__((vector_size(64)));
#else
typedef float mb_v __attribute__((vector_size(32)));
#endif
float morello_bench_stream(const void *buf, long bytes);
float morello_bench_stream(const void *buf, long bytes) {
    const char *p = buf;
    mb_v s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    long i = 0;
    for (; i + 4 * (long)sizeof(mb_v) <= bytes; i += 4 * (long)sizeof(mb_v)) {
        mb_v x0, x1, x2, x3;
        memcpy(&x0, p + i, sizeof x0);
        memcpy(&x1, p + i + sizeof(mb_v), sizeof x1);
        memcpy(&x2, p + i + 2 * sizeof(mb_v), sizeof x2);
        memcpy(&x3, p + i + 3 * sizeof(mb_v), sizeof x3);
        s0 += x0; s1 += x1; s2 += x2; s3 += x3;
    }
    s0 += s1 + s2 + s3;
    float t = 0;
    for (unsigned j = 0; j < sizeof(mb_v) / sizeof(float); j++) t += s0[j];
    for (; i < bytes; i++) t += (float)p[i];
    return t;
}
