/* backend_cpu_poetx.c - CPU kernels of the POET-X ops: the Cayley-Neumann polynomial of
 * packed skew-symmetric blocks and its gradient, and the permuted block-diagonal apply to
 * rows of activations and its gradients.
 *
 * The polynomial G = (I + Q)(I + Q + .. + Q^k) = sum_m c_m Q^m (c = 1, 2, .., 2, 1) is
 * evaluated by Horner's rule, H_{k+1} = I, H_m = c_m I + Q H_{m+1}, G = H_0: k + 1 b x b
 * sgemms per block. Its gradient runs the recurrence backwards: with dH_0 = dG,
 * dQ += dH_m H_{m+1}^T and dH_{m+1} = Q^T dH_m (the H_m kept from a forward pass).
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

/* H (b,b) = c I + Q Hn */
static void horner_step(float *H, const float *Q, const float *Hn, float c, int b) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, b, b, 1.0f, Q, b, Hn, b, 0.0f, H, b);
    for (int i = 0; i < b; i++) H[(size_t)i * b + i] += c;
}

static void set_eye(float *H, int b) {
    memset(H, 0, sizeof(float) * (size_t)b * b);
    for (int i = 0; i < b; i++) H[(size_t)i * b + i] = 1.0f;
}

void cpu_poet_cayley_forward(st_backend *be, float *G, const float *q, int nb, int b, int k) {
    (void)be;
    size_t bb = (size_t)b * b, nq = (size_t)b * (b - 1) / 2;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *Q = malloc(sizeof(float) * bb), *A = malloc(sizeof(float) * bb), *B = malloc(sizeof(float) * bb);
#pragma omp for schedule(dynamic, 1)
        for (int j = 0; j < nb; j++) {
            if (!Q || !A || !B) {
                failed = 1;
                continue;
            }
            unpack_skew(Q, q + j * nq, b);
            set_eye(A, b); /* H_{k+1} */
            for (int m = k; m >= 0; m--) {
                horner_step(B, Q, A, coef(m, k), b);
                float *t = A;
                A = B, B = t;
            }
            memcpy(G + j * bb, A, sizeof(float) * bb);
        }
        free(Q), free(A), free(B);
    }
    if (failed) {
        no_scratch("poet_cayley_forward");
        fill_nan(G, nb * bb);
    }
}

void cpu_poet_cayley_backward(st_backend *be, float *dq, const float *dG, const float *q, int nb, int b, int k) {
    (void)be;
    size_t bb = (size_t)b * b, nq = (size_t)b * (b - 1) / 2;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        /* H[m] for m = 1..k+1 at H + (m-1) bb; Q, dQ, dH and a spare */
        float *H = malloc(sizeof(float) * bb * (size_t)(k + 1)), *Q = malloc(sizeof(float) * bb);
        float *dQ = malloc(sizeof(float) * bb), *dH = malloc(sizeof(float) * bb), *t = malloc(sizeof(float) * bb);
#pragma omp for schedule(dynamic, 1)
        for (int j = 0; j < nb; j++) {
            if (!H || !Q || !dQ || !dH || !t) {
                failed = 1;
                continue;
            }
            unpack_skew(Q, q + j * nq, b);
            set_eye(H + (size_t)k * bb, b);
            for (int m = k; m >= 1; m--) horner_step(H + (size_t)(m - 1) * bb, Q, H + (size_t)m * bb, coef(m, k), b);
            memcpy(dH, dG + j * bb, sizeof(float) * bb);
            memset(dQ, 0, sizeof(float) * bb);
            for (int m = 0; m <= k; m++) {
                /* dQ += dH_m H_{m+1}^T; dH_{m+1} = Q^T dH_m */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, b, b, 1.0f, dH, b, H + (size_t)m * bb, b, 1.0f,
                            dQ, b);
                if (m < k) {
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b, b, b, 1.0f, Q, b, dH, b, 0.0f, t, b);
                    float *s = dH;
                    dH = t, t = s;
                }
            }
            float *o = dq + j * nq;
            size_t p = 0;
            for (int r = 0; r < b; r++)
                for (int c = r + 1; c < b; c++, p++) o[p] += dQ[(size_t)r * b + c] - dQ[(size_t)c * b + r];
        }
        free(H), free(Q), free(dQ), free(dH), free(t);
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
