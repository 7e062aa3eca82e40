/* bench_util.c - what the benchmarks share: medians, a deterministic fill, /proc/self/status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

float bench_hash_unit(uint64_t i) {
    i ^= i >> 33;
    i *= 0xff51afd7ed558ccdULL;
    i ^= i >> 33;
    i *= 0xc4ceb9fe1a85ec53ULL;
    i ^= i >> 33;
    return (float)(i >> 40) / (float)(1 << 24) - 0.5f;
}

double bench_proc_status_bytes(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    double v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n)) v = atof(line + n + 1) * 1024.0; /* kB */
    fclose(f);
    return v;
}
