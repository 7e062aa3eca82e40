/* ops_diff_common.h - what the differential op tests share: the three runs (fast,
 * ref, ref from zeroed accumulators), host buffers, copies to and from a backend,
 * and the comparison with a tolerance scaled by the reference's largest value.
 * Included by one test program each (everything is static); the program defines
 * OPS_DIFF_NAME first, for its messages. */
#ifndef STRATA_OPS_DIFF_COMMON_H
#define STRATA_OPS_DIFF_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/backend.h"
#include "strata/core.h"
#include "testutil.h"

#ifndef OPS_DIFF_NAME
#define OPS_DIFF_NAME "ops_diff"
#endif

/* Runs: FAST and REF on the same prefilled gradients, REF0 = ref with zeroed ones. */
enum { FAST = 0, REF = 1, REF0 = 2, RUNS = 3 };
static st_backend *bes[2];
static st_rng rng;
static int verbose;

__attribute__((unused)) static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, OPS_DIFF_NAME ": out of host memory\n");
        exit(1); /* a test program, not library code */
    }
    return p;
}

__attribute__((unused)) static float *host_randn(size_t n, float scale, float offset) {
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = offset + scale * st_rng_normal(&rng);
    return p;
}

__attribute__((unused)) static float *host_nan(size_t n) {
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* A copy of n host floats (or int32s) in be's memory. */
__attribute__((unused)) static void *up(st_backend *be, const void *host, size_t bytes) {
    void *d = be->ops->alloc(be, bytes);
    if (!d) {
        fprintf(stderr, OPS_DIFF_NAME ": %s alloc of %zu bytes failed\n", be->ops->name, bytes);
        exit(1);
    }
    be->ops->copy_to_device(be, d, host, bytes);
    return d;
}
#define UPF(be, host, n) ((float *)up((be), (host), (n) * sizeof(float)))
#define UPI(be, host, n) ((int32_t *)up((be), (host), (n) * sizeof(int32_t)))

/* A new host copy of n floats from be's memory; frees the device buffer. */
__attribute__((unused)) static float *down(st_backend *be, float *dev, size_t n) {
    float *h = xmalloc(n * sizeof *h);
    be->ops->synchronize(be);
    be->ops->copy_to_host(be, h, dev, n * sizeof *h);
    be->ops->dealloc(be, dev);
    return h;
}

/* The comparison described atop the file; what is printed on failure names the op. */
__attribute__((unused)) static void compare(const char *what, const float *fast, const float *ref, size_t n, double atol, double rtol) {
    double maxabs = 0;
    for (size_t i = 0; i < n; i++) maxabs = fmax(maxabs, fabs((double)ref[i]));
    double atol_eff = atol * (maxabs > 0 ? maxabs : 1.0);
    if (verbose) {
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)fast[i] - ref[i]), lim = atol_eff + rtol * fabs((double)ref[i]);
            worst = fmax(worst, d != d ? INFINITY : d / lim);
        }
        fprintf(stderr, "  %-60s n=%-7zu max|ref| %-10.3g err/tol %.3g\n", what, n, maxabs, worst);
    }
    check_close_f32(what, fast, ref, n, atol_eff, rtol);
}

__attribute__((unused)) static void free_runs(float *r[RUNS]) {
    for (int k = 0; k < RUNS; k++) free(r[k]);
}

__attribute__((unused)) static st_backend *be_of(int run) { return bes[run == FAST ? FAST : REF]; }

/* ref honours +=: the run from prefill g equals g + the run from zeros, to float rounding. */
__attribute__((unused)) static void check_accum(const char *what, const float *from_g, const float *g, const float *from_0, size_t n) {
    float *sum = xmalloc(n * sizeof *sum);
    for (size_t i = 0; i < n; i++) sum[i] = g[i] + from_0[i];
    char w[192];
    snprintf(w, sizeof w, "ref accumulates: %s", what);
    compare(w, from_g, sum, n, 1e-6, 1e-6);
    free(sum);
}


#endif
