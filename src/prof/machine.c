/* machine.c - facts about this machine and process that the step metrics and the memory
 * check need: peak and current resident memory, memory available, measured peak FLOP/s. */
#include <cblas.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "strata/prof.h"

/* A "Key:   123 kB" line of a /proc file, in bytes; 0 when absent. */
static double proc_kb_field(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t kl = strlen(key);
    double v = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtod(line + kl + 1, NULL) * 1024.0;
            break;
        }
    fclose(f);
    return v;
}

double st_prof_host_peak_bytes(void) { return proc_kb_field("/proc/self/status", "VmHWM"); }
double st_prof_host_rss_bytes(void) { return proc_kb_field("/proc/self/status", "VmRSS"); }
double st_prof_host_available_bytes(void) { return proc_kb_field("/proc/meminfo", "MemAvailable"); }

double st_prof_peak_flops(void) {
    static double peak; /* a machine constant: measured once per process */
    if (peak > 0) return peak;
    /* 512^3 is big enough for OpenBLAS to reach its steady kernel speed on a few cores and
     * small (3 MiB) enough not to move the process's memory peak. The best of 16 calls: on a
     * shared machine the best is the one least disturbed. */
    const int n = 512;
    float *a = st_alloc(sizeof(float) * n * n), *b = st_alloc(sizeof(float) * n * n),
          *c = st_alloc(sizeof(float) * n * n);
    if (!a || !b || !c) {
        st_free(a), st_free(b), st_free(c);
        return 0;
    }
    for (int i = 0; i < n * n; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
    double best = 1e30;
    for (int r = 0; r < 17; r++) {
        double t0 = st_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = st_now() - t0;
        if (r > 0 && dt < best) best = dt; /* r = 0 warms the caches and the thread pool */
    }
    st_free(a), st_free(b), st_free(c);
    peak = 2.0 * n * n * (double)n / best;
    return peak;
}

int64_t st_prof_dir_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int64_t total = 0;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) total += (int64_t)sb.st_size;
    }
    closedir(d);
    return total;
}
