/* test_ops_poetx_diff.c - the CPU backend's POET-X ops against the double reference
 * backend ("ref"): the Cayley-Neumann polynomial of packed skew blocks and its backward,
 * the permuted block-diagonal apply and its backward, the columns' permutation (exact), on the
 * same random float inputs,
 * through the vtable (as test_ops_diff.c: written outputs pre-filled with NaN, += outputs
 * with the same random values, a third run on ref from zeros checks ref's +=).
 * Then properties of the fast op alone: y = x in place gives the bits of y apart, the
 * backward's bits do not depend on the thread count, and NULL outputs are skipped.
 *
 * Tolerances, per element |cpu - ref| <= atol * max|ref| + rtol * |ref| (ops_diff_common.h):
 *   polynomial (k + 1 products of b x b, K = b <= 64, |Q| ~ 0.4): atol 1e-5, rtol 1e-4
 *   its backward (2k + 1 products):                               atol 3e-5, rtol 1e-4
 *   apply and dx (sums of K = b terms):                            atol 1e-5, rtol 1e-4
 *   dG (sums over N <= 600 rows):                                  atol 3e-5, rtol 1e-4
 * STRATA_TEST_VERBOSE=1 prints each comparison's margin.
 *
 * With --bench b d N k: times the CPU ops for one block-diagonal transform of an (N,d)
 * activation (a random permutation, or none with "identity"), and the dense (N,d) x (d,d)
 * matmul beside it for scale, and poet_permute's gather and scatter-add of the activation, all
 * seven in turn in
 * each of 7 rounds; prints each op's median and the apply's ratios to the matmul.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/backend.h"
#include "strata/core.h"
#include "testutil.h"

#define OPS_DIFF_NAME "test_ops_poetx_diff"
#include "ops_diff_common.h"

#define TOL_G_ATOL 1e-5
#define TOL_G_RTOL 1e-4
#define TOL_GB_ATOL 3e-5
#define TOL_GB_RTOL 1e-4
#define TOL_AP_ATOL 1e-5
#define TOL_AP_RTOL 1e-4
#define TOL_DG_ATOL 3e-5
#define TOL_DG_RTOL 1e-4

static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

/* q entries of scale 0.2/sqrt(b): the skew block's spectral norm is about 0.4 */
static float *random_q(int nb, int b) { return host_randn((size_t)nb * b * (b - 1) / 2, 0.2f / sqrtf((float)b), 0); }

static int32_t *random_perm(int d) { return test_random_perm(&rng, d); }

static void test_cayley(int nb, int b, int k) {
    size_t nq = (size_t)nb * b * (b - 1) / 2, ng = (size_t)nb * b * b;
    float *q = random_q(nb, b), *dG = host_randn(ng, 1, 0), *g_q = host_randn(nq, 1, 0), *nan_g = host_nan(ng);
    float *z = zeros(nq);
    float *G[RUNS], *dq[RUNS];
    for (int r = 0; r < RUNS; r++) {
        st_backend *be = be_of(r);
        float *d_q = UPF(be, q, nq), *d_G = UPF(be, nan_g, ng), *d_dG = UPF(be, dG, ng);
        float *d_dq = UPF(be, r == REF0 ? z : g_q, nq);
        be->ops->poet_cayley_forward(be, d_G, d_q, nb, b, k);
        be->ops->poet_cayley_backward(be, d_dq, d_dG, d_q, nb, b, k);
        G[r] = down(be, d_G, ng);
        dq[r] = down(be, d_dq, nq);
        be->ops->dealloc(be, d_q), be->ops->dealloc(be, d_dG);
    }
    char w[160];
    snprintf(w, sizeof w, "poet_cayley_forward nb=%d b=%d k=%d", nb, b, k);
    compare(w, G[FAST], G[REF], ng, TOL_G_ATOL, TOL_G_RTOL);
    snprintf(w, sizeof w, "poet_cayley_backward dq (+=) nb=%d b=%d k=%d", nb, b, k);
    compare(w, dq[FAST], dq[REF], nq, TOL_GB_ATOL, TOL_GB_RTOL);
    check_accum(w, dq[REF], g_q, dq[REF0], nq);
    free_runs(G), free_runs(dq);
    free(q), free(dG), free(g_q), free(nan_g), free(z);
}

static void test_apply(int N, int d, int b, int use_perm, int trans) {
    size_t n = (size_t)N * d, ng = (size_t)d * b;
    int nb = d / b;
    float *x = host_randn(n, 1, 0), *dy = host_randn(n, 1, 0), *g_x = host_randn(n, 1, 0);
    float *g_G = host_randn(ng, 1, 0), *nan_y = host_nan(n), *zx = zeros(n), *zg = zeros(ng);
    /* G: a real polynomial of a random skew block (k = 2), as the layer uses */
    float *q = random_q(nb, b), *G = xmalloc(sizeof(float) * ng);
    {
        st_backend *be = bes[REF];
        float *d_q = UPF(be, q, (size_t)nb * b * (b - 1) / 2), *d_G = UPF(be, G, ng);
        be->ops->poet_cayley_forward(be, d_G, d_q, nb, b, 2);
        be->ops->copy_to_host(be, G, d_G, sizeof(float) * ng);
        be->ops->dealloc(be, d_q), be->ops->dealloc(be, d_G);
    }
    int32_t *perm = use_perm ? random_perm(d) : NULL;
    float *y[RUNS], *dx[RUNS], *dG[RUNS];
    for (int r = 0; r < RUNS; r++) {
        st_backend *be = be_of(r);
        int32_t *d_perm = perm ? UPI(be, perm, d) : NULL;
        float *d_x = UPF(be, x, n), *d_y = UPF(be, nan_y, n), *d_G = UPF(be, G, ng), *d_dy = UPF(be, dy, n);
        float *d_dx = UPF(be, r == REF0 ? zx : g_x, n), *d_dG = UPF(be, r == REF0 ? zg : g_G, ng);
        be->ops->poet_apply_forward(be, d_y, d_x, d_G, d_perm, N, d, b, trans);
        be->ops->poet_apply_backward(be, d_dx, d_dG, d_dy, d_x, d_G, d_perm, N, d, b, trans);
        y[r] = down(be, d_y, n);
        dx[r] = down(be, d_dx, n);
        dG[r] = down(be, d_dG, ng);
        be->ops->dealloc(be, d_x), be->ops->dealloc(be, d_G), be->ops->dealloc(be, d_dy);
        if (d_perm) be->ops->dealloc(be, d_perm);
    }
    char w[160];
    snprintf(w, sizeof w, "poet_apply_forward N=%d d=%d b=%d perm=%d trans=%d", N, d, b, use_perm, trans);
    compare(w, y[FAST], y[REF], n, TOL_AP_ATOL, TOL_AP_RTOL);
    snprintf(w, sizeof w, "poet_apply_backward dx (+=) N=%d d=%d b=%d perm=%d trans=%d", N, d, b, use_perm, trans);
    compare(w, dx[FAST], dx[REF], n, TOL_AP_ATOL, TOL_AP_RTOL);
    check_accum(w, dx[REF], g_x, dx[REF0], n);
    snprintf(w, sizeof w, "poet_apply_backward dG (+=) N=%d d=%d b=%d perm=%d trans=%d", N, d, b, use_perm, trans);
    compare(w, dG[FAST], dG[REF], ng, TOL_DG_ATOL, TOL_DG_RTOL);
    check_accum(w, dG[REF], g_G, dG[REF0], ng);

    /* the fast op alone: in place, NULL outputs */
    st_backend *cpu = bes[FAST];
    float *ip = xmalloc(sizeof(float) * n);
    memcpy(ip, x, sizeof(float) * n);
    cpu->ops->poet_apply_forward(cpu, ip, ip, G, perm, N, d, b, trans);
    CHECK(memcmp(ip, y[FAST], sizeof(float) * n) == 0, "%s: y = x in place differs from y apart", w);
    float *dx2 = xmalloc(sizeof(float) * n), *dG2 = xmalloc(sizeof(float) * ng);
    memcpy(dx2, g_x, sizeof(float) * n), memcpy(dG2, g_G, sizeof(float) * ng);
    cpu->ops->poet_apply_backward(cpu, dx2, NULL, dy, x, G, perm, N, d, b, trans);
    cpu->ops->poet_apply_backward(cpu, NULL, dG2, dy, x, G, perm, N, d, b, trans);
    CHECK(memcmp(dx2, dx[FAST], sizeof(float) * n) == 0 && memcmp(dG2, dG[FAST], sizeof(float) * ng) == 0,
          "%s: dx alone (dG NULL) and dG alone (dx NULL) differ from both at once", w);
    free(ip), free(dx2), free(dG2);
    free_runs(y), free_runs(dx), free_runs(dG);
    free(x), free(dy), free(g_x), free(g_G), free(nan_y), free(zx), free(zg), free(q), free(G), free(perm);
}

/* The backward's dG and the polynomial's dq carry the same bits on 1 and 2 threads. */
static void test_threads(int N, int d, int b, int k) {
    size_t n = (size_t)N * d, ng = (size_t)d * b, nq = (size_t)(d / b) * b * (b - 1) / 2;
    float *x = host_randn(n, 1, 0), *dy = host_randn(n, 1, 0), *G = host_randn(ng, 0.2f, 0);
    float *q = random_q(d / b, b);
    int32_t *perm = random_perm(d);
    float *dG[2], *dq[2];
    st_err err = {0};
    for (int t = 0; t < 2; t++) {
        st_backend *cpu = NULL;
        if (st_backend_cpu_create(&cpu, t + 1, &err) != ST_OK) {
            CHECK(0, "cpu backend with %d threads: %s", t + 1, err.msg);
            return;
        }
        dG[t] = zeros(ng), dq[t] = zeros(nq);
        cpu->ops->poet_apply_backward(cpu, NULL, dG[t], dy, x, G, perm, N, d, b, 0);
        cpu->ops->poet_cayley_backward(cpu, dq[t], dG[t], q, d / b, b, k);
        st_backend_free(cpu);
    }
    CHECK(memcmp(dG[0], dG[1], sizeof(float) * ng) == 0 && memcmp(dq[0], dq[1], sizeof(float) * nq) == 0,
          "poet backward N=%d d=%d b=%d: 1 and 2 threads give different bits", N, d, b);
    /* bes[FAST] was made with 2 threads: the last one created leaves OpenMP at 2 */
    free(dG[0]), free(dG[1]), free(dq[0]), free(dq[1]);
    free(x), free(dy), free(G), free(q), free(perm);
}

/* poet_permute, each mode with row strides wider than the width (y's other columns untouched):
 * both backends equal, bit for bit, the plain loop here (copies, one add each). */
static void test_permute(int N, int d, int ldx, int ldy) {
    int32_t *perm = random_perm(d);
    float *x = host_randn((size_t)N * ldx, 1, 0), *y0 = host_randn((size_t)N * ldy, 1, 0);
    float *want = malloc(sizeof(float) * (size_t)N * ldy);
    for (int mode = 0; mode < 3; mode++) {
        memcpy(want, y0, sizeof(float) * (size_t)N * ldy);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < d; i++) {
                float *yr = want + (size_t)n * ldy;
                const float *xr = x + (size_t)n * ldx;
                if (mode == ST_PERMUTE_GATHER) yr[i] = xr[perm[i]];
                else if (mode == ST_PERMUTE_SCATTER) yr[perm[i]] = xr[i];
                else yr[perm[i]] += xr[i];
            }
        for (int r = 0; r < 2; r++) {
            st_backend *be = bes[r];
            float *d_x = UPF(be, x, (size_t)N * ldx), *d_y = UPF(be, y0, (size_t)N * ldy);
            int32_t *d_p = UPI(be, perm, d);
            be->ops->poet_permute(be, d_y, ldy, d_x, ldx, d_p, N, d, mode);
            float *got = down(be, d_y, (size_t)N * ldy);
            char w[128];
            snprintf(w, sizeof w, "%s poet_permute mode %d N=%d d=%d ldx=%d ldy=%d", be->ops->name, mode, N, d, ldx, ldy);
            compare(w, got, want, (size_t)N * ldy, 0, 0);
            free(got);
            be->ops->dealloc(be, d_x), be->ops->dealloc(be, d_p);
        }
    }
    free(perm), free(x), free(y0), free(want);
}

/* No rows: the apply writes nothing and its backward adds nothing (no NaN for a failed
 * zero-size scratch) on either backend. */
static void test_empty(void) {
    for (int r = 0; r < 2; r++) {
        st_backend *be = bes[r];
        float G[64], dG[64], y = 7;
        for (int i = 0; i < 64; i++) G[i] = dG[i] = 1;
        float *d_G = UPF(be, G, 64), *d_dG = UPF(be, dG, 64), *d_y = UPF(be, &y, 1);
        be->ops->poet_apply_forward(be, d_y, d_y, d_G, NULL, 0, 8, 8, 0);
        be->ops->poet_apply_backward(be, d_y, d_dG, d_y, d_y, d_G, NULL, 0, 8, 8, 0);
        float *h = down(be, d_dG, 64), *hy = down(be, d_y, 1);
        int same = hy[0] == 7;
        for (int i = 0; i < 64; i++) same &= h[i] == 1;
        CHECK(same, "%s: N = 0 changed y or dG", be->ops->name);
        free(h), free(hy);
        be->ops->dealloc(be, d_G);
    }
}

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return v[n / 2];
}

static int bench(st_backend *cpu, int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: test_ops_poetx_diff --bench b d N k [identity]\n");
        return 2;
    }
    int b = atoi(argv[2]), d = atoi(argv[3]), N = atoi(argv[4]), k = atoi(argv[5]);
    int identity = argc > 6 && !strcmp(argv[6], "identity"); /* perm NULL: no gather, no scatter */
    if (b < 2 || d < b || d % b || N < 1 || k < 0) {
        fprintf(stderr, "test_ops_poetx_diff --bench: need b >= 2 dividing d, N >= 1, k >= 0\n");
        return 2;
    }
    int nb = d / b;
    size_t n = (size_t)N * d, ng = (size_t)d * b, nq = (size_t)nb * b * (b - 1) / 2;
    float *x = host_randn(n, 1, 0), *dy = host_randn(n, 1, 0), *y = zeros(n), *dx = zeros(n);
    float *q = random_q(nb, b), *G = zeros(ng), *dG = zeros(ng), *dq = zeros(nq);
    float *W = host_randn((size_t)d * d, 0.02f, 0);
    int32_t *perm = identity ? NULL : random_perm(d), *pp = random_perm(d);
    enum { REPS = 7, OPS = 7 };
    double t[OPS][REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = st_now();
        cpu->ops->poet_cayley_forward(cpu, G, q, nb, b, k);
        double t1 = st_now();
        cpu->ops->poet_apply_forward(cpu, y, x, G, perm, N, d, b, 0);
        double t2 = st_now();
        cpu->ops->poet_apply_backward(cpu, dx, dG, dy, x, G, perm, N, d, b, 0);
        double t3 = st_now();
        cpu->ops->poet_cayley_backward(cpu, dq, dG, q, nb, b, k);
        double t4 = st_now();
        cpu->ops->matmul_forward(cpu, y, x, W, NULL, N, d, d, ST_W_OUT_IN);
        double t5 = st_now();
        cpu->ops->poet_permute(cpu, y, d, x, d, pp, N, d, ST_PERMUTE_GATHER);
        double t6 = st_now();
        cpu->ops->poet_permute(cpu, dx, d, dy, d, pp, N, d, ST_PERMUTE_SCATTER_ADD);
        double t7 = st_now();
        t[0][r] = t1 - t0, t[1][r] = t2 - t1, t[2][r] = t3 - t2, t[3][r] = t4 - t3, t[4][r] = t5 - t4;
        t[5][r] = t6 - t5, t[6][r] = t7 - t6;
    }
    double m[OPS];
    for (int o = 0; o < OPS; o++) m[o] = median(t[o], REPS) * 1e3;
    double fl_ap = 2.0 * N * d * b, fl_mm = 2.0 * N * d * d;
    printf("poetx ops b=%d d=%d N=%d k=%d%s, median of %d (ms): cayley_forward %.3f | apply_forward %.3f (%.1f GFLOP/s) | "
           "apply_backward dx+dG %.3f (%.1f GFLOP/s) | cayley_backward %.3f | dense matmul_forward N x d x d %.3f "
           "(%.1f GFLOP/s) | apply_forward / matmul_forward %.3f, apply_backward / matmul_forward %.3f | poet_permute "
           "gather %.3f, scatter-add %.3f\n",
           b, d, N, k, identity ? " identity permutation" : "", REPS, m[0], m[1], fl_ap / m[1] * 1e-6, m[2],
           2 * fl_ap / m[2] * 1e-6, m[3], m[4],
           fl_mm / m[4] * 1e-6, m[1] / m[4], m[2] / m[4], m[5], m[6]);
    free(x), free(dy), free(y), free(dx), free(q), free(G), free(dG), free(dq), free(W), free(perm), free(pp);
    return 0;
}

int main(int argc, char **argv) {
    verbose = getenv("STRATA_TEST_VERBOSE") != NULL;
    st_err err = {0};
    st_rng_seed(&rng, 2029);
    if (st_backend_cpu_create(&bes[FAST], 2, &err) != ST_OK) {
        fprintf(stderr, "ops_poetx_diff: cpu backend: %s\n", err.msg);
        return 1;
    }
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        st_backend_free(bes[FAST]);
        if (st_backend_cpu_create(&bes[FAST], 0, &err) != ST_OK) return 1; /* all threads */
        int rc = bench(bes[FAST], argc, argv);
        st_backend_free(bes[FAST]);
        return rc;
    }
    if (st_backend_ref_create(&bes[REF], &err) != ST_OK) {
        fprintf(stderr, "ops_poetx_diff: ref backend: %s\n", err.msg);
        return 1;
    }
    for (int k = 0; k <= 5; k++) test_cayley(3, 8, k);
    test_cayley(2, 5, 3);  /* odd b: a zero eigenvalue */
    test_cayley(1, 2, 1);  /* one packed entry */
    test_cayley(2, 64, 4); /* the recipe's block size class */

    test_apply(70, 24, 8, 1, 0);
    test_apply(70, 24, 8, 1, 1);
    test_apply(33, 20, 5, 0, 0);    /* identity permutation (NULL), odd b */
    test_apply(600, 128, 64, 1, 0); /* three units of 256 rows, the last partial */
    test_apply(600, 128, 64, 1, 1);
    test_apply(600, 128, 64, 0, 1); /* no permutation: the panels read in place */
    test_apply(1, 8, 8, 1, 0);      /* one row, one block */
    test_threads(600, 128, 32, 3);
    test_empty();
    test_permute(37, 24, 24, 24);
    test_permute(70, 48, 64, 96); /* a projection's columns of a packed output */

    st_backend_free(bes[FAST]);
    st_backend_free(bes[REF]);
    return test_finish("ops_poetx_diff");
}
