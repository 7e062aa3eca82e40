/* test_frozen_store.c - the frozen weight store (src/model/frozen_store.c) against independent
 * fp64 references:
 *   - int8: each group's zero is its smallest value and its scale (max - min) / 255 (min and max
 *     found here in fp64), and every dequantised value is within scale / 2 of the original (the
 *     nearest code; plus one fp32 rounding of the result); a constant group is exact; the last,
 *     partial group too;
 *   - bf16: every value within 2^-8 of the original, relatively;
 *   - the panel matmuls (forward out = x W^T and backward dx += dout W) with panels of a few
 *     output rows (several panels and a short last one) against an fp64 product over the
 *     weight dequantised whole, in both layouts (GPT-2's (in, out), the Llama family's (out, in));
 *     fp32 against the same product over the original weight;
 *   - frozen_release gives whole pages back: the process's resident set drops by about the
 *     range's size, the partial pages at its edges keep their values.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/frozen_store.h"
#include "strata/backend.h"
#include "strata/core.h"
#include "testutil.h"

static void fill(float *x, size_t n, st_rng *r) {
    for (size_t i = 0; i < n; i++) {
        /* groups of very different ranges: the scale is per group */
        double g = (double)(i / ST_FROZEN_GROUP % 5 + 1);
        x[i] = (float)(st_rng_normal(r) * 0.02 * g * g);
    }
}

static void check_int8(int rows, int cols, st_rng *r) {
    size_t n = (size_t)rows * cols;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    fill(x, n, r);
    for (size_t i = 0; i < ST_FROZEN_GROUP && i < n; i++) x[i] = 0.375f; /* a constant group */
    frozen_weight w;
    CHECK(!frozen_weight_alloc(&w, ST_FROZEN_INT8, rows, cols, ST_W_OUT_IN), "alloc");
    frozen_weight_set(&w, x);
    frozen_weight_get(&w, 0, n, y);
    size_t bad = 0, badg = 0;
    double worst = 0;
    for (size_t g = 0; g < st_frozen_groups(n); g++) {
        size_t e0 = g * ST_FROZEN_GROUP, e1 = e0 + ST_FROZEN_GROUP < n ? e0 + ST_FROZEN_GROUP : n;
        double lo = x[e0], hi = x[e0];
        for (size_t i = e0; i < e1; i++) {
            lo = x[i] < lo ? x[i] : lo;
            hi = x[i] > hi ? x[i] : hi;
        }
        double s = (hi - lo) / 255.0;
        if (w.zero[g] != (float)lo || fabs(w.scale[g] - s) > 1e-6 * s) badg++;
        for (size_t i = e0; i < e1; i++) {
            double e = fabs((double)y[i] - (double)x[i]);
            double bound = s / 2 * (1 + 1e-6) + ldexp(fabs((double)y[i]), -24);
            if (e > bound) bad++;
            if (s > 0 && e / s > worst) worst = e / s;
        }
    }
    CHECK(badg == 0, "int8 %dx%d: %zu groups whose zero is not their min or scale not (max-min)/255", rows, cols, badg);
    CHECK(bad == 0, "int8 %dx%d: %zu of %zu values further than scale/2 from the original (worst %.4f scale)", rows,
          cols, bad, n, worst);
    for (size_t i = 0; i < ST_FROZEN_GROUP && i < n; i++)
        if (y[i] != 0.375f) {
            CHECK(0, "int8: a constant group comes back as %g, not 0.375", y[i]);
            break;
        }
    CHECK(st_frozen_bytes(ST_FROZEN_INT8, n) == n + 8 * st_frozen_groups(n), "int8 bytes");
    frozen_weight_free(&w);
    free(x);
    free(y);
}

static void check_bf16(int rows, int cols, st_rng *r) {
    size_t n = (size_t)rows * cols, bad = 0;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    fill(x, n, r);
    frozen_weight w;
    CHECK(!frozen_weight_alloc(&w, ST_FROZEN_BF16, rows, cols, ST_W_IN_OUT), "alloc");
    frozen_weight_set(&w, x);
    frozen_weight_get(&w, 0, n, y);
    for (size_t i = 0; i < n; i++)
        if (fabs((double)y[i] - (double)x[i]) > ldexp(fabs((double)x[i]), -8)) bad++;
    CHECK(bad == 0, "bf16 %dx%d: %zu of %zu values further than 2^-8 relative", rows, cols, bad, n);
    frozen_weight_free(&w);
    free(x);
    free(y);
}

/* out (N, out) = x W^T and dx0 + dout W with W the dequantised weight (whole), in fp64 */
static void reference(const float *Wd, st_wlayout lay, int in, int out, const float *x, const float *dout,
                      const float *dx0, int N, double *ref_out, double *ref_dx) {
    for (int i = 0; i < N; i++) {
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int k = 0; k < in; k++)
                s += (double)x[(size_t)i * in + k] * Wd[lay == ST_W_IN_OUT ? (size_t)k * out + o : (size_t)o * in + k];
            ref_out[(size_t)i * out + o] = s;
        }
        for (int k = 0; k < in; k++) {
            double s = dx0[(size_t)i * in + k];
            for (int o = 0; o < out; o++)
                s += (double)dout[(size_t)i * out + o] *
                     Wd[lay == ST_W_IN_OUT ? (size_t)k * out + o : (size_t)o * in + k];
            ref_dx[(size_t)i * in + k] = s;
        }
    }
}

static void check_matmul(st_backend *be, st_frozen_dtype d, st_wlayout lay, int in, int out, int N, st_rng *r) {
    size_t n = (size_t)in * out;
    int rows = lay == ST_W_IN_OUT ? in : out, cols = lay == ST_W_IN_OUT ? out : in;
    float *W = malloc(n * sizeof(float)), *Wd = malloc(n * sizeof(float));
    float *x = malloc((size_t)N * in * sizeof(float)), *dout = malloc((size_t)N * out * sizeof(float));
    float *dx = malloc((size_t)N * in * sizeof(float)), *dx0 = malloc((size_t)N * in * sizeof(float));
    float *y = malloc((size_t)N * out * sizeof(float)), *tmp = malloc((size_t)N * out * sizeof(float));
    double *ry = malloc((size_t)N * out * sizeof(double)), *rdx = malloc((size_t)N * in * sizeof(double));
    fill(W, n, r);
    for (size_t i = 0; i < (size_t)N * in; i++) x[i] = (float)st_rng_normal(r), dx0[i] = (float)st_rng_normal(r);
    for (size_t i = 0; i < (size_t)N * out; i++) dout[i] = (float)st_rng_normal(r);
    frozen_weight w;
    CHECK(!frozen_weight_alloc(&w, d, rows, cols, lay), "alloc");
    w.f32 = W;
    frozen_weight_set(&w, W);
    frozen_weight_get(&w, 0, n, Wd);
    reference(Wd, lay, in, out, x, dout, dx0, N, ry, rdx);
    /* panels of 3 output rows: out / 3 of them and a short last one when 3 does not divide out */
    size_t pf = (size_t)in * 3;
    float *panel = malloc(pf * sizeof(float));
    CHECK(d == ST_FROZEN_F32 || frozen_panel_rows(&w, pf) == 3, "panel rows %d, want 3", frozen_panel_rows(&w, pf));
    frozen_matmul_forward(be, &w, y, x, N, panel, pf, tmp);
    memcpy(dx, dx0, (size_t)N * in * sizeof(float));
    frozen_matmul_backward_dx(be, &w, dx, dout, N, panel, pf, tmp);
    double ey = 0, edx = 0;
    for (size_t i = 0; i < (size_t)N * out; i++) ey = fmax(ey, fabs(y[i] - ry[i]) / (1 + fabs(ry[i])));
    for (size_t i = 0; i < (size_t)N * in; i++) edx = fmax(edx, fabs(dx[i] - rdx[i]) / (1 + fabs(rdx[i])));
    CHECK(ey < 1e-5 && edx < 1e-5, "%s %s in %d out %d N %d: forward off the fp64 product by %.3g, backward %.3g",
          st_frozen_dtype_name(d), lay == ST_W_IN_OUT ? "(in, out)" : "(out, in)", in, out, N, ey, edx);
    frozen_weight_free(&w);
    free(W), free(Wd), free(x), free(dout), free(dx), free(dx0), free(y), free(tmp), free(ry), free(rdx), free(panel);
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
    fclose(f);
    return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

static void check_release(void) {
    size_t n = (size_t)16 << 20; /* 64 MiB of floats */
    float *p = st_alloc(n * sizeof(float));
    if (!p) return;
    for (size_t i = 0; i < n; i++) p[i] = 1.0f;
    long before = rss_kb();
    size_t a = 1001, b = n - 999; /* not on page boundaries */
    frozen_release(p + a, (b - a) * sizeof(float));
    long after = rss_kb();
    if (before > 0 && after > 0)
        CHECK(before - after > 60 * 1024, "frozen_release of 64 MiB: resident %ld kB -> %ld kB, want 60 MiB less",
              before, after);
    CHECK(p[a] == 1.0f && p[b - 1] == 1.0f && p[a - 1] == 1.0f && p[b] == 1.0f,
          "the partial pages at the range's edges keep their values");
    CHECK(p[n / 2] == 0.0f, "a page inside the range reads 0 after its release (got %g)", p[n / 2]);
    st_free(p);
}

int main(void) {
    st_backend *be = NULL;
    st_err err = {0};
    if (st_backend_cpu_create(&be, 2, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    st_rng r;
    st_rng_seed(&r, 29);
    check_int8(48, 100, &r); /* 4800 values: 18 whole groups and one of 192 */
    check_int8(1, 7, &r);
    check_bf16(48, 100, &r);
    const st_frozen_dtype ds[3] = {ST_FROZEN_F32, ST_FROZEN_BF16, ST_FROZEN_INT8};
    for (int i = 0; i < 3; i++) {
        check_matmul(be, ds[i], ST_W_IN_OUT, 40, 64, 5, &r); /* 21 panels of 3 and one of 1 */
        check_matmul(be, ds[i], ST_W_OUT_IN, 64, 40, 7, &r); /* 13 of 3 and one of 1 */
        check_matmul(be, ds[i], ST_W_OUT_IN, 24, 3, 4, &r);  /* one panel: the whole weight */
    }
    check_release();
    st_backend_free(be);
    return test_finish("frozen_store");
}
