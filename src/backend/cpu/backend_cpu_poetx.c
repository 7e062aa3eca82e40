/* backend_cpu_poetx.c - CPU kernels of the POET-X ops: the Cayley-Neumann polynomial of
 * packed skew-symmetric blocks and its gradient, and the permuted block-diagonal apply to
 * rows of activations and its gradients.
 *
 * The polynomial G = (I + Q)(I + Q + .. + Q^k) = sum_m c_m Q^m (c = 1, 2, .., 2, 1) is
 * evaluated split into its even and odd parts, G = E(P) + Q O(P) with P = Q^2: the powers
 * P .. P^D (D = (k+1)/2) and one product, D + 1 b x b sgemms per block (Horner's rule takes
 * k + 1: 3 against 5 at k = 4). Its gradient runs the same split backwards (see
 * cpu_poet_cayley_backward): 3D + 1 sgemms, 7 against Horner's 13 at k = 4.
 * Blocks are independent: one OpenMP thread per block, sgemm single-threaded inside.
 *
 * The apply works on units of (rows, block): a unit gathers its rows' b permuted columns
 * (rows x b), multiplies them by G_j^T (or G_j) in one sgemm and scatters the result to
 * the same positions, so units touch disjoint elements (which also makes y = x safe).
 * Without a permutation (perm NULL) the block is a strided panel that sgemm reads and
 * writes in place (unless y = x): half the time of the permuted apply at b = 64.
 * The backward's dG is summed per unit into its own slot and the slots added in unit
 * order afterwards: no atomics, and the same bits for any thread count.
 *
 * The ops return void: where scratch cannot be had, they log it and fill their outputs
 * with NaN, as the reference backend does, so no caller computes on stale data.
 */
#include "backend/cpu/backend_cpu_poetx.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ST_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ST_CLONES
#endif

static void fill_nan(float *p, size_t n) {
    if (!p) return;
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

static void no_scratch(const char *op) {
    st_log(0, "cpu backend: out of memory for scratch in %s; outputs set to NaN\n", op);
}

/* Q (b,b) from the packed strict upper triangle q (b(b-1)/2) */
static void unpack_skew(float *Q, const float *q, int b) {
    size_t p = 0;
    for (int i = 0; i < b; i++) {
        Q[(size_t)i * b + i] = 0;
        for (int j = i + 1; j < b; j++, p++) {
            Q[(size_t)i * b + j] = q[p];
            Q[(size_t)j * b + i] = -q[p];
        }
    }
}

static float coef(int m, int k) { return (m == 0 || m == k + 1) ? 1.0f : 2.0f; }

static void set_eye(float *H, int b) {
    memset(H, 0, sizeof(float) * (size_t)b * b);
    for (int i = 0; i < b; i++) H[(size_t)i * b + i] = 1.0f;
}

/* C (b,b) = A B (ta, tb: transposed) + beta C */
static void mm(float *C, const float *A, int ta, const float *B, int tb, float beta, int b) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, b, b, b, 1.0f, A, b, B,
                b, beta, C, b);
}

/* The powers of P = Q^2 a block's polynomial needs: Pw + (i-1) bb = P^i for i = 1..D
 * (D = (k+1)/2, the even part's degree), D gemms; and the odd part O = sum_i c_{2i+1} P^i
 * (a polynomial in the symmetric P: symmetric). */
static void powers_and_odd(float *Pw, float *O, const float *Q, int b, int k) {
    size_t bb = (size_t)b * b;
    int K = k + 1, D = K / 2;
    if (D >= 1) mm(Pw, Q, 0, Q, 0, 0.0f, b);
    for (int i = 2; i <= D; i++) mm(Pw + (size_t)(i - 1) * bb, Pw + (size_t)(i - 2) * bb, 0, Pw, 0, 0.0f, b);
    set_eye(O, b);
    for (size_t e = 0; e < bb; e++) O[e] *= coef(1, k);
    for (int i = 1; 2 * i + 1 <= K; i++) {
        const float *Pi = Pw + (size_t)(i - 1) * bb;
        float c = coef(2 * i + 1, k);
        for (size_t e = 0; e < bb; e++) O[e] += c * Pi[e];
    }
}

void cpu_poet_cayley_forward(st_backend *be, float *G, const float *q, int nb, int b, int k) {
    (void)be;
    size_t bb = (size_t)b * b, nq = (size_t)b * (b - 1) / 2;
    int D = (k + 1) / 2, failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        /* Q, O, the powers P^1..P^D */
        float *Q = malloc(sizeof(float) * bb), *O = malloc(sizeof(float) * bb);
        float *Pw = malloc(sizeof(float) * bb * (size_t)(D ? D : 1));
#pragma omp for schedule(dynamic, 1)
        for (int j = 0; j < nb; j++) {
            if (!Q || !O || !Pw) {
                failed = 1;
                continue;
            }
            float *Gj = G + j * bb;
            unpack_skew(Q, q + j * nq, b);
            powers_and_odd(Pw, O, Q, b, k);
            /* G = E + Q O, E = sum_i c_{2i} P^i */
            set_eye(Gj, b);
            for (int i = 1; 2 * i <= k + 1; i++) {
                const float *Pi = Pw + (size_t)(i - 1) * bb;
                float c = coef(2 * i, k);
                for (size_t e = 0; e < bb; e++) Gj[e] += c * Pi[e];
            }
            mm(Gj, Q, 0, O, 0, 1.0f, b);
        }
        free(Q), free(O), free(Pw);
    }
    if (failed) {
        no_scratch("poet_cayley_forward");
        fill_nan(G, nb * bb);
    }
}

/* G = E(P) + Q O(P), P = Q Q. From dG: dO = Q^T dG, and Q's direct term dG O^T = dG O; the
 * gradient X_i of each power P^i (c_{2i} dG + c_{2i+1} dO) runs down the chain
 * P^i = P^{i-1} P (X_{i-1} += X_i P, dP += P^{i-1} X_i, the powers symmetric), and P = Q Q
 * gives dP Q^T + Q^T dP. Only the skew part of dQ reaches the packed q: with Q^T = -Q and
 * S = dP + dP^T, Y = S Q, that term's dQ - dQ^T is Y^T - Y (one gemm, not two). Gemms:
 * D (the powers) + 2 + 2 (D - 1) + 1, 7 at k = 4 (Horner's backward: 3k + 1 = 13). */
void cpu_poet_cayley_backward(st_backend *be, float *dq, const float *dG, const float *q, int nb, int b, int k) {
    (void)be;
    size_t bb = (size_t)b * b, nq = (size_t)b * (b - 1) / 2;
    int K = k + 1, D = K / 2, failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *Q = malloc(sizeof(float) * bb), *O = malloc(sizeof(float) * bb);
        float *Pw = malloc(sizeof(float) * bb * (size_t)(D ? D : 1)), *X = malloc(sizeof(float) * bb * (size_t)(D + 1));
        float *dO = malloc(sizeof(float) * bb), *dQ = malloc(sizeof(float) * bb), *Y = malloc(sizeof(float) * bb);
#pragma omp for schedule(dynamic, 1)
        for (int j = 0; j < nb; j++) {
            if (!Q || !O || !Pw || !X || !dO || !dQ || !Y) {
                failed = 1;
                continue;
            }
            const float *g = dG + j * bb;
            unpack_skew(Q, q + j * nq, b);
            powers_and_odd(Pw, O, Q, b, k);
            mm(dO, Q, 1, g, 0, 0.0f, b); /* dO = Q^T dG */
            mm(dQ, g, 0, O, 0, 0.0f, b); /* dQ = dG O^T (O symmetric) */
            /* X_i, i = 1..D, at X + i bb */
            for (int i = 1; i <= D; i++) {
                float *Xi = X + (size_t)i * bb, ce = coef(2 * i, k), co = 2 * i + 1 <= K ? coef(2 * i + 1, k) : 0.0f;
                for (size_t e = 0; e < bb; e++) Xi[e] = ce * g[e] + co * dO[e];
            }
            float *dP = X + bb; /* X_1 accumulates dP */
            for (int i = D; i >= 2; i--) {
                float *Xi = X + (size_t)i * bb, *Xm = X + (size_t)(i - 1) * bb;
                /* dP += P^{i-1} X_i (into X_0 as scratch, then added), X_{i-1} += X_i P */
                mm(X, Pw + (size_t)(i - 2) * bb, 0, Xi, 0, 0.0f, b);
                mm(Xm, Xi, 0, Pw, 0, 1.0f, b);
                for (size_t e = 0; e < bb; e++) dP[e] += X[e];
            }
            if (D >= 1) {
                for (int r = 0; r < b; r++) /* S = dP + dP^T, into X_0 */
                    for (int c = 0; c < b; c++) X[(size_t)r * b + c] = dP[(size_t)r * b + c] + dP[(size_t)c * b + r];
                mm(Y, X, 0, Q, 0, 0.0f, b);
            }
            float *o = dq + j * nq;
            size_t p = 0;
            for (int r = 0; r < b; r++)
                for (int c = r + 1; c < b; c++, p++) {
                    float v = dQ[(size_t)r * b + c] - dQ[(size_t)c * b + r];
                    if (D >= 1) v += Y[(size_t)c * b + r] - Y[(size_t)r * b + c];
                    o[p] += v;
                }
        }
        free(Q), free(O), free(Pw), free(X), free(dO), free(dQ), free(Y);
    }
    if (failed) {
        no_scratch("poet_cayley_backward");
        fill_nan(dq, nb * nq);
    }
}

/* the positions of block j's columns in a row: perm[j*b ..] or the identity */
static const int32_t *block_cols(const int32_t *perm, int32_t *ident, int j, int b) {
    if (perm) return perm + (size_t)j * b;
    for (int c = 0; c < b; c++) ident[c] = j * b + c;
    return ident;
}

/* U (R,b) = the rows n0.. of x at the columns cols (b of them) */
ST_CLONES
static void gather(float *restrict U, const float *restrict x, const int32_t *restrict cols, int n0, int R, int d,
                   int b) {
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)(n0 + r) * d;
        float *u = U + (size_t)r * b;
        for (int c = 0; c < b; c++) u[c] = xr[cols[c]];
    }
}

/* the rows n0.. of y at the columns cols = V (R,b); accumulate: += */
ST_CLONES
static void scatter(float *restrict y, const float *restrict V, const int32_t *restrict cols, int n0, int R, int d,
                    int b, int accumulate) {
    for (int r = 0; r < R; r++) {
        float *yr = y + (size_t)(n0 + r) * d;
        const float *v = V + (size_t)r * b;
        if (accumulate)
            for (int c = 0; c < b; c++) yr[cols[c]] += v[c];
        else
            for (int c = 0; c < b; c++) yr[cols[c]] = v[c];
    }
}

void cpu_poet_apply_forward(st_backend *be, float *y, const float *x, const float *G, const int32_t *perm, int N,
                            int d, int b, int trans) {
    (void)be;
    if (N <= 0 || d <= 0) return;
    int nb = d / b, R = cpu_poet_rows_per_unit(N, d, b), nc = (N + R - 1) / R, failed = 0;
    size_t bb = (size_t)b * b;
#pragma omp parallel reduction(| : failed)
    {
        float *U = malloc(sizeof(float) * (size_t)R * b), *V = malloc(sizeof(float) * (size_t)R * b);
        int32_t *ident = malloc(sizeof(int32_t) * (size_t)b);
#pragma omp for schedule(static)
        for (long u = 0; u < (long)nc * nb; u++) {
            if (!U || !V || !ident) {
                failed = 1;
                continue;
            }
            int c = (int)(u / nb), j = (int)(u % nb), n0 = c * R, rows = N - n0 < R ? N - n0 : R;
            const int32_t *cols = block_cols(perm, ident, j, b);
            /* rows: v = G u, i.e. V = U G^T (trans: V = U G). Without a permutation the
             * block is a strided panel of x and y, read and written in place by sgemm */
            size_t off = (size_t)n0 * d + (size_t)j * b;
            int direct = !perm && y != x;
            if (direct) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, trans ? CblasNoTrans : CblasTrans, rows, b, b, 1.0f, x + off,
                            d, G + j * bb, b, 0.0f, y + off, d);
                continue;
            }
            gather(U, x, cols, n0, rows, d, b);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, trans ? CblasNoTrans : CblasTrans, rows, b, b, 1.0f, U, b,
                        G + j * bb, b, 0.0f, V, b);
            scatter(y, V, cols, n0, rows, d, b, 0);
        }
        free(U), free(V), free(ident);
    }
    if (failed) {
        no_scratch("poet_apply_forward");
        fill_nan(y, (size_t)N * d);
    }
}

void cpu_poet_apply_backward(st_backend *be, float *dx, float *dG, const float *dy, const float *x, const float *G,
                             const int32_t *perm, int N, int d, int b, int trans) {
    (void)be;
    if ((!dx && !dG) || N <= 0 || d <= 0) return; /* no rows: dG += 0 */
    int nb = d / b, R = cpu_poet_rows_per_unit(N, d, b), nc = (N + R - 1) / R, failed = 0;
    size_t bb = (size_t)b * b;
    float *part = dG ? malloc(sizeof(float) * (size_t)nc * nb * bb) : NULL; /* unit (c, j)'s dG_j */
    if (dG && !part) failed = 1;
#pragma omp parallel reduction(| : failed)
    {
        float *U = malloc(sizeof(float) * (size_t)R * b), *dV = malloc(sizeof(float) * (size_t)R * b);
        int32_t *ident = malloc(sizeof(int32_t) * (size_t)b);
#pragma omp for schedule(static)
        for (long u = 0; u < (long)nc * nb; u++) {
            if (!U || !dV || !ident || (dG && !part)) {
                failed = 1;
                continue;
            }
            int c = (int)(u / nb), j = (int)(u % nb), n0 = c * R, rows = N - n0 < R ? N - n0 : R;
            const int32_t *cols = block_cols(perm, ident, j, b);
            const float *Gj = G + j * bb;
            /* the block's panels of dy and x: gathered, or (no permutation) read in place */
            size_t off = (size_t)n0 * d + (size_t)j * b;
            const float *pdv = dV, *pu = U;
            int ld = b;
            if (perm) {
                gather(dV, dy, cols, n0, rows, d, b);
                if (dG) gather(U, x, cols, n0, rows, d, b);
            } else {
                pdv = dy + off, pu = x + off, ld = d;
            }
            if (dG) {
                /* dG_j = sum_rows dv u^T = dV^T U (trans: U^T dV) */
                float *pj = part + ((size_t)c * nb + j) * bb;
                if (trans)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b, b, rows, 1.0f, pu, ld, pdv, ld, 0.0f, pj,
                                b);
                else
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b, b, rows, 1.0f, pdv, ld, pu, ld, 0.0f, pj,
                                b);
            }
            if (dx && !perm && dx != dy) { /* du = G^T dv, i.e. dU = dV G (trans: dV G^T), added in place */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, trans ? CblasTrans : CblasNoTrans, rows, b, b, 1.0f, pdv, ld,
                            Gj, b, 1.0f, dx + off, d);
            } else if (dx) { /* the same into U (free by now), then added where it belongs */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, trans ? CblasTrans : CblasNoTrans, rows, b, b, 1.0f, pdv, ld,
                            Gj, b, 0.0f, U, b);
                scatter(dx, U, cols, n0, rows, d, b, 1);
            }
        }
        free(U), free(dV), free(ident);
    }
    if (dG && !failed) {
        /* the units' parts added in unit order, each element by one thread */
#pragma omp parallel for schedule(static)
        for (long e = 0; e < (long)nb * (long)bb; e++) {
            int j = (int)(e / (long)bb);
            size_t o = (size_t)(e % (long)bb);
            float s = 0;
            for (int c = 0; c < nc; c++) s += part[((size_t)c * nb + j) * bb + o];
            dG[e] += s;
        }
    }
    free(part);
    if (failed) {
        no_scratch("poet_apply_backward");
        fill_nan(dx, (size_t)N * d);
        fill_nan(dG, (size_t)nb * bb);
    }
}

void cpu_poet_permute(st_backend *be, float *y, int ldy, const float *x, int ldx, const int32_t *perm, int N, int d,
                      int mode) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *restrict yr = y + (size_t)n * ldy;
        const float *restrict xr = x + (size_t)n * ldx;
        if (mode == ST_PERMUTE_GATHER)
            for (int i = 0; i < d; i++) yr[i] = xr[perm[i]];
        else if (mode == ST_PERMUTE_SCATTER)
            for (int i = 0; i < d; i++) yr[perm[i]] = xr[i];
        else
            for (int i = 0; i < d; i++) yr[perm[i]] += xr[i];
    }
}
