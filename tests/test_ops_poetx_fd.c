/* test_ops_poetx_fd.c - the double reference of the POET-X ops (src/backend/ref/
 * ops_ref_poetx.c): hand-computed values, the orthogonality error of the Cayley-Neumann
 * polynomial against its closed form, and every backward against central finite
 * differences through its forward.
 *
 * Orthogonality: for Q = U diag(s_j J) U^T (U a random orthogonal matrix, J the 2x2
 * rotation generator, so Q is skew-symmetric with eigenvalues +-i s_j and spectral norm
 * t = max s_j), G^T G - I must equal U diag(e_k(s_j)) U^T with
 * e_k(s) = s^(2k+2) - 2 cos((k+1) pi/2) s^(k+1) (derived in ops_ref_poetx.c): checked as
 * |(G^T G - I) u - e_k(s_j) u| <= 1e-6 |e_k(t)| + 1e-13 on every column u of U, for k = 0..7
 * and t from 0.05 to 1.5, b even (8) and odd (7: one zero eigenvalue, e = 0 there), and
 * ||G^T G - I||_2 (power iteration) = |e_k(t)| within 1e-6 relative for t <= 1.
 *
 * Finite differences: objective L = sum(out * R) for a fixed random R; gradient buffers
 * pre-filled with random values and the prefill subtracted afterwards, so += is tested
 * with the math. Tolerances as in test_ops_fd.c (double, h = 1e-6): |analytic - numeric|
 * <= 1e-6 max|numeric| + 1e-8.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ref/ops_ref.h"
#include "strata/core.h"
#include "testutil.h"

#define OPS_FD_NAME "test_ops_poetx_fd"
#include "ops_fd_common.h"

static size_t nq_of(int nb, int b) { return (size_t)nb * b * (b - 1) / 2; }

static void pack(double *q, const double *Q, int b) {
    for (int i = 0; i < b; i++)
        for (int j = i + 1; j < b; j++) q[ref_poet_tri_index(b, i, j)] = Q[(size_t)i * b + j];
}

static int32_t *random_perm(int d) { return test_random_perm(&rng, d); }

/* ---------------- hand-computed values ---------------- */

static void test_values(void) {
    /* b = 2, q = a: Q = [[0, a], [-a, 0]], Q^2 = -a^2 I.
     * k = 0: G = I + Q; k = 1: I + 2Q + Q^2; k = 2: I + 2Q + 2Q^2 + Q^3 = (1 - 2a^2) I + (2 - a^2) Q */
    double a = 0.3, G[4];
    ref_poet_cayley_forward(G, &a, 1, 2, 0);
    double w0[4] = {1, a, -a, 1};
    check_close_f64("cayley b=2 k=0", G, w0, 4, 1e-15, 1e-14);
    ref_poet_cayley_forward(G, &a, 1, 2, 1);
    double w1[4] = {1 - a * a, 2 * a, -2 * a, 1 - a * a};
    check_close_f64("cayley b=2 k=1", G, w1, 4, 1e-15, 1e-14);
    ref_poet_cayley_forward(G, &a, 1, 2, 2);
    double c = 1 - 2 * a * a, s = (2 - a * a) * a, w2[4] = {c, s, -s, c};
    check_close_f64("cayley b=2 k=2", G, w2, 4, 1e-15, 1e-14);

    /* the packed order: b = 3, q = (Q01, Q02, Q12); k = 0 gives I + Q */
    double q3[3] = {1, 2, 3}, G3[9], w3[9] = {1, 1, 2, -1, 1, 3, -2, -3, 1};
    ref_poet_cayley_forward(G3, q3, 1, 3, 0);
    check_close_f64("cayley b=3 packed order", G3, w3, 9, 0, 0);

    /* apply, d = 4, b = 2, perm (2, 0, 3, 1): block 0 acts on x[2], x[0]; block 1 on x[3], x[1].
     * y[perm[r]] = sum_c G0[r][c] x[perm[c]] */
    double Gb[8] = {1, 2, 3, 4, 5, 6, 7, 8}, x[4] = {10, 20, 30, 40}, y[4];
    int32_t perm[4] = {2, 0, 3, 1};
    ref_poet_apply_forward(y, x, Gb, perm, 1, 4, 2, 0);
    /* block 0: (x2, x0) = (30, 10) -> (1*30 + 2*10, 3*30 + 4*10) = (50, 130) to y2, y0;
     * block 1: (x3, x1) = (40, 20) -> (5*40 + 6*20, 7*40 + 8*20) = (320, 440) to y3, y1 */
    double wy[4] = {130, 440, 50, 320};
    check_close_f64("apply d=4 b=2 perm", y, wy, 4, 0, 0);
    ref_poet_apply_forward(y, x, Gb, perm, 1, 4, 2, 1);
    /* transposed: (1*30 + 3*10, 2*30 + 4*10) = (60, 100); (5*40 + 7*20, 6*40 + 8*20) = (340, 400) */
    double wt[4] = {100, 400, 60, 340};
    check_close_f64("apply d=4 b=2 perm trans", y, wt, 4, 0, 0);
}

/* ---------------- the orthogonality error ---------------- */

static double err_closed(double s, int k) { return pow(s, 2 * k + 2) - 2 * cos((k + 1) * M_PI / 2) * pow(s, k + 1); }

/* U (b,b): Gram-Schmidt of a random matrix, columns orthonormal */
static void random_orthogonal(double *U, int b) {
    for (int i = 0; i < b * b; i++) U[i] = st_rng_normal(&rng);
    for (int c = 0; c < b; c++) {
        for (int p = 0; p < c; p++) {
            double dp = 0;
            for (int r = 0; r < b; r++) dp += U[r * b + c] * U[r * b + p];
            for (int r = 0; r < b; r++) U[r * b + c] -= dp * U[r * b + p];
        }
        double nrm = 0;
        for (int r = 0; r < b; r++) nrm += U[r * b + c] * U[r * b + c];
        nrm = sqrt(nrm);
        for (int r = 0; r < b; r++) U[r * b + c] /= nrm;
    }
}

static void test_orthogonality(int b, int k, double t) {
    double *U = alloc_f64((size_t)b * b), *Q = alloc_f64((size_t)b * b), *q = alloc_f64(nq_of(1, b));
    double *G = alloc_f64((size_t)b * b), *E = alloc_f64((size_t)b * b), *s = alloc_f64((size_t)b);
    random_orthogonal(U, b);
    /* eigenvalue magnitudes per column pair (2p, 2p+1): t, then smaller; an odd b's last
     * column has s = 0 */
    static const double frac[] = {1.0, 0.8, 0.35, 0.1, 0.6, 0.2};
    for (int p = 0; 2 * p + 1 < b; p++) s[2 * p] = s[2 * p + 1] = t * frac[p % 6];
    /* Q = U D U^T, D = blockdiag(s_p [[0, 1], [-1, 0]]) */
    for (int i = 0; i < b; i++)
        for (int j = 0; j < b; j++) {
            double v = 0;
            for (int p = 0; 2 * p + 1 < b; p++)
                v += s[2 * p] * (U[i * b + 2 * p] * U[j * b + 2 * p + 1] - U[i * b + 2 * p + 1] * U[j * b + 2 * p]);
            Q[i * b + j] = v;
        }
    pack(q, Q, b);
    ref_poet_cayley_forward(G, q, 1, b, k);
    for (int i = 0; i < b; i++)
        for (int j = 0; j < b; j++) {
            double v = 0;
            for (int r = 0; r < b; r++) v += G[r * b + i] * G[r * b + j];
            E[i * b + j] = v - (i == j);
        }
    double et = err_closed(t, k), tol = 1e-6 * fabs(et) + 1e-13, worst = 0;
    for (int c = 0; c < b; c++) {
        double e = err_closed(s[c], k); /* s = 0 for an odd b's last column: e = 0 */
        for (int i = 0; i < b; i++) {
            double v = 0;
            for (int j = 0; j < b; j++) v += E[i * b + j] * U[j * b + c];
            worst = fmax(worst, fabs(v - e * U[i * b + c]));
        }
    }
    CHECK(worst <= tol, "G^T G - I for b=%d k=%d t=%g: worst |E u - e_k(s) u| %.3g > %.3g (e_k(t) = %.6g)", b, k, t,
          worst, tol, et);
    if (t <= 1) { /* the spectral norm is |e_k(t)|: power iteration on the symmetric E */
        double *v = alloc_f64((size_t)b), *w = alloc_f64((size_t)b), lam = 0;
        for (int i = 0; i < b; i++) v[i] = 1.0 + 0.1 * i;
        for (int it = 0; it < 400; it++) {
            double nrm = 0;
            for (int i = 0; i < b; i++) {
                w[i] = 0;
                for (int j = 0; j < b; j++) w[i] += E[i * b + j] * v[j];
                nrm += w[i] * w[i];
            }
            nrm = sqrt(nrm);
            if (nrm == 0) break;
            lam = nrm / sqrt(dot_f64(v, v, (size_t)b));
            for (int i = 0; i < b; i++) v[i] = w[i] / nrm;
        }
        CHECK(fabs(lam - fabs(et)) <= 1e-6 * fabs(et) + 1e-13, "||G^T G - I||_2 for b=%d k=%d t=%g: %.12g, want %.12g",
              b, k, t, lam, fabs(et));
        free(v), free(w);
    }
    free(U), free(Q), free(q), free(G), free(E), free(s);
}

/* ---------------- finite differences ---------------- */

typedef struct cay_ctx {
    const double *R;
    double *q, *G;
    int nb, b, k;
} cay_ctx;

static double cay_loss(void *p) {
    cay_ctx *c = p;
    ref_poet_cayley_forward(c->G, c->q, c->nb, c->b, c->k);
    return dot_f64(c->G, c->R, (size_t)c->nb * c->b * c->b);
}

static void test_cayley_fd(int nb, int b, int k) {
    size_t nq = nq_of(nb, b), ng = (size_t)nb * b * b;
    cay_ctx c = {randn(ng, 1, 0), randn(nq, 0.5 / sqrt(b), 0), alloc_f64(ng), nb, b, k};
    double *pre = randn(nq, 1, 0), *ana = dup(pre, nq), *num = alloc_f64(nq);
    ref_poet_cayley_backward(ana, c.R, c.q, nb, b, k);
    subtract_prefill(ana, pre, nq);
    numeric_grad(num, c.q, nq, cay_loss, &c);
    char w[96];
    snprintf(w, sizeof w, "cayley dq nb=%d b=%d k=%d", nb, b, k);
    check_grad(w, ana, num, nq);
    free((void *)c.R), free(c.q), free(c.G), free(pre), free(ana), free(num);
}

typedef struct app_ctx {
    const double *R;
    double *x, *G, *y, *q;
    const int32_t *perm;
    int N, d, b, k, trans;
} app_ctx;

static double app_loss(void *p) {
    app_ctx *c = p;
    ref_poet_apply_forward(c->y, c->x, c->G, c->perm, c->N, c->d, c->b, c->trans);
    return dot_f64(c->y, c->R, (size_t)c->N * c->d);
}

/* through the polynomial: G from q first */
static double chain_loss(void *p) {
    app_ctx *c = p;
    ref_poet_cayley_forward(c->G, c->q, c->d / c->b, c->b, c->k);
    return app_loss(p);
}

static void test_apply_fd(int N, int d, int b, int use_perm, int trans, int k) {
    size_t n = (size_t)N * d, ng = (size_t)d * b;
    int nb = d / b;
    size_t nq = nq_of(nb, b);
    int32_t *perm = use_perm ? random_perm(d) : NULL;
    app_ctx c = {randn(n, 1, 0), randn(n, 1, 0), randn(ng, 0.5, 0), alloc_f64(n), randn(nq, 0.5 / sqrt(b), 0),
                 perm, N, d, b, k, trans};
    char w[128];
    /* dx and dG of the apply */
    double *pre_x = randn(n, 1, 0), *pre_g = randn(ng, 1, 0), *dx = dup(pre_x, n), *dG = dup(pre_g, ng);
    double *num_x = alloc_f64(n), *num_g = alloc_f64(ng);
    ref_poet_apply_backward(dx, dG, c.R, c.x, c.G, perm, N, d, b, trans);
    subtract_prefill(dx, pre_x, n), subtract_prefill(dG, pre_g, ng);
    numeric_grad(num_x, c.x, n, app_loss, &c);
    numeric_grad(num_g, c.G, ng, app_loss, &c);
    snprintf(w, sizeof w, "apply dx N=%d d=%d b=%d perm=%d trans=%d", N, d, b, use_perm, trans);
    check_grad(w, dx, num_x, n);
    snprintf(w, sizeof w, "apply dG N=%d d=%d b=%d perm=%d trans=%d", N, d, b, use_perm, trans);
    check_grad(w, dG, num_g, ng);
    /* dq through the polynomial: apply_backward's dG, then cayley_backward */
    double *dGq = alloc_f64(ng), *dq = alloc_f64(nq), *num_q = alloc_f64(nq);
    ref_poet_cayley_forward(c.G, c.q, nb, b, k);
    ref_poet_apply_backward(NULL, dGq, c.R, c.x, c.G, perm, N, d, b, trans);
    ref_poet_cayley_backward(dq, dGq, c.q, nb, b, k);
    numeric_grad(num_q, c.q, nq, chain_loss, &c);
    snprintf(w, sizeof w, "apply dq through the polynomial N=%d d=%d b=%d k=%d trans=%d", N, d, b, k, trans);
    check_grad(w, dq, num_q, nq);
    free((void *)c.R), free(c.x), free(c.G), free(c.y), free(c.q), free(perm);
    free(pre_x), free(pre_g), free(dx), free(dG), free(num_x), free(num_g), free(dGq), free(dq), free(num_q);
}

int main(void) {
    st_rng_seed(&rng, 29);
    test_values();
    static const double ts[] = {0.05, 0.2, 0.5, 0.9, 1.0, 1.5};
    for (int k = 0; k <= 7; k++)
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            test_orthogonality(8, k, ts[i]);
            test_orthogonality(7, k, ts[i]);
        }
    for (int k = 0; k <= 4; k++) test_cayley_fd(2, 5, k);
    test_cayley_fd(1, 2, 3);
    test_cayley_fd(1, 8, 5);
    test_apply_fd(3, 12, 4, 1, 0, 2);
    test_apply_fd(3, 12, 4, 1, 1, 3);
    test_apply_fd(2, 10, 5, 0, 0, 1);
    return test_finish("ops_poetx_fd");
}
