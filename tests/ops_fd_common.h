/* ops_fd_common.h - what the finite-difference op tests share: the step and tolerance,
 * random double buffers, the central-difference gradient of a scalar loss, and the
 * comparison (|analytic - numeric| <= FD_RTOL * max|numeric| + FD_ATOL). Included by one
 * test program each (everything is static); the program defines OPS_FD_NAME first. */
#ifndef STRATA_OPS_FD_COMMON_H
#define STRATA_OPS_FD_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/core.h"
#include "testutil.h"

#ifndef OPS_FD_NAME
#define OPS_FD_NAME "ops_fd"
#endif

#define FD_H 1e-6
#define FD_RTOL 1e-6
#define FD_ATOL 1e-8

static st_rng rng;

__attribute__((unused)) static double *alloc_f64(size_t n) {
    double *p = calloc(n ? n : 1, sizeof *p);
    if (!p) {
        fprintf(stderr, OPS_FD_NAME ": out of memory\n");
        exit(1); /* a test program, not library code */
    }
    return p;
}

__attribute__((unused)) static double *randn(size_t n, double scale, double offset) {
    double *p = alloc_f64(n);
    for (size_t i = 0; i < n; i++) p[i] = offset + scale * st_rng_normal(&rng);
    return p;
}

__attribute__((unused)) static double *dup(const double *src, size_t n) {
    double *p = alloc_f64(n);
    memcpy(p, src, n * sizeof *p);
    return p;
}

__attribute__((unused)) static double dot_f64(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* How far the worst element lies beyond the tolerance (> 0: the comparison fails).
 * Does not count as a check, so the mutation test can call it for a failure it expects. */
__attribute__((unused)) static double grad_excess(const double *ana, const double *num, size_t n, size_t *worst_i) {
    double maxabs = 0, worst = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (fabs(num[i]) > maxabs) maxabs = fabs(num[i]);
    double tol = FD_RTOL * maxabs + FD_ATOL;
    *worst_i = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(ana[i] - num[i]);
        double ex = (d != d) ? INFINITY : d - tol;
        if (ex > worst) {
            worst = ex;
            *worst_i = i;
        }
    }
    return worst;
}

__attribute__((unused)) static void check_grad(const char *what, const double *ana, const double *num, size_t n) {
    size_t wi;
    double ex = grad_excess(ana, num, n, &wi);
    CHECK(ex <= 0, "%s: %zu elements, worst [%zu] analytic %.12g numeric %.12g (excess %.3g)", what, n, wi,
          ana[wi], num[wi], ex);
}

/* Numeric gradient of loss() with respect to x[0..n), x perturbed in place and restored. */
typedef double (*loss_fn)(void *ctx);
__attribute__((unused)) static void numeric_grad(double *num, double *x, size_t n, loss_fn loss, void *ctx) {
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + FD_H;
        double lp = loss(ctx);
        x[i] = x0 - FD_H;
        double lm = loss(ctx);
        x[i] = x0;
        num[i] = (lp - lm) / (2 * FD_H);
    }
}

__attribute__((unused)) static void subtract_prefill(double *g, const double *prefill, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] -= prefill[i];
}

#endif
