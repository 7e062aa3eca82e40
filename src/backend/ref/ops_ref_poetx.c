/* ops_ref_poetx.c - double-precision reference of the POET-X ops: the Cayley-Neumann
 * polynomial of packed skew-symmetric blocks and its gradient, and the permuted
 * block-diagonal apply to rows of activations and its gradients.
 *
 * As in ops_ref.c: the formulas as written, no threads, no tricks. The polynomial is
 * summed from explicit powers Q^m with its coefficients, and its gradient from the sum
 * over the terms of every split of Q^m (not the CPU backend's Horner recurrence and its
 * reverse pass), so that the two are independent computations of the same thing.
 *
 * The polynomial: G = (I + Q) S_k(Q), S_k = I + Q + ... + Q^k, the Cayley transform
 * (I + Q)(I - Q)^-1 with the Neumann series of the inverse cut after Q^k. Expanded,
 * G = sum_{m=0}^{k+1} c_m Q^m with c_0 = 1, c_1 .. c_k = 2, c_{k+1} = 1.
 *
 * Its orthogonality error. Q is real skew-symmetric, hence normal, with eigenvalues
 * +-i s_j (s_j >= 0, the largest the spectral norm t). G = p(Q) with the real polynomial
 * p(z) = (1 + z)(1 - z^(k+1)) / (1 - z), and G^T = p(Q^T) = p(-Q) commutes with G, so
 * G^T G - I = p(-Q) p(Q) - I has the eigenvectors of Q and the eigenvalues
 *   |p(i s)|^2 - 1 = |1 + i s|^2 |1 - (i s)^(k+1)|^2 / |1 - i s|^2 - 1
 *                  = |1 - i^(k+1) s^(k+1)|^2 - 1          (|1 + i s| = |1 - i s|)
 *                  = s^(2k+2) - 2 cos((k+1) pi / 2) s^(k+1) =: e_k(s).
 * So: k even: e = s^(2k+2) (G only stretches, by s^(k+1) squared: the error is of order
 * 2k+2); k = 1, 5, 9 ..: e = s^(2k+2) + 2 s^(k+1); k = 3, 7 ..: e = s^(2k+2) - 2 s^(k+1).
 * For s <= 1 |e_k| grows with s, so ||G^T G - I||_2 = |e_k(t)| exactly. The other form in
 * print, I + 2Q + .. + 2Q^k (this G without its last term Q^(k+1)), is no longer
 * (1 + z) times a geometric sum: its error starts at +-4 s^(k+2) for even k (here
 * s^(2k+2)) and +-4 s^(k+1) for odd k (here 2 s^(k+1)), for the same k products (checked
 * numerically when this was chosen). test_poetx_fd checks e_k(s) on every eigenvector.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/ref/ops_ref.h"

/* Q (b,b) from its packed strict upper triangle. */
static void unpack_skew(double *Q, const double *q, int b) {
    for (int i = 0; i < b; i++) {
        Q[(size_t)i * b + i] = 0;
        for (int j = i + 1; j < b; j++) {
            double v = q[ref_poet_tri_index(b, i, j)];
            Q[(size_t)i * b + j] = v;
            Q[(size_t)j * b + i] = -v;
        }
    }
}

/* C (b,b) = A B */
static void mm(double *C, const double *A, const double *B, int b) {
    for (int i = 0; i < b; i++)
        for (int j = 0; j < b; j++) {
            double s = 0;
            for (int l = 0; l < b; l++) s += A[(size_t)i * b + l] * B[(size_t)l * b + j];
            C[(size_t)i * b + j] = s;
        }
}

static double coef(int m, int k) { return (m == 0 || m == k + 1) ? 1.0 : 2.0; }

/* pw[m] = Q^m for m = 0..k+1, (k+2) b*b doubles */
static void powers(double *pw, const double *Q, int b, int k) {
    size_t bb = (size_t)b * b;
    memset(pw, 0, sizeof(double) * bb);
    for (int i = 0; i < b; i++) pw[(size_t)i * b + i] = 1;
    for (int m = 1; m <= k + 1; m++) mm(pw + m * bb, pw + (m - 1) * bb, Q, b);
}

void ref_poet_cayley_forward(double *G, const double *q, int nb, int b, int k) {
    size_t bb = (size_t)b * b, nq = (size_t)b * (b - 1) / 2;
    double *Q = malloc(sizeof(double) * bb), *pw = malloc(sizeof(double) * bb * (k + 2));
    if (!Q || !pw) { /* the ref backend's wrapper sizes its own scratch; here NaN says it */
        for (size_t i = 0; i < (size_t)nb * bb; i++) G[i] = 0.0 / 0.0;
        free(Q), free(pw);
        return;
    }
    for (int j = 0; j < nb; j++) {
        unpack_skew(Q, q + j * nq, b);
        powers(pw, Q, b, k);
        double *g = G + j * bb;
        for (size_t e = 0; e < bb; e++) {
            double s = 0;
            for (int m = 0; m <= k + 1; m++) s += coef(m, k) * pw[m * bb + e];
            g[e] = s;
        }
    }
    free(Q), free(pw);
}

void ref_poet_cayley_backward(double *dq, const double *dG, const double *q, int nb, int b, int k) {
    /* d/dQ of <dG, Q^m> = sum_{a=0}^{m-1} (Q^T)^a dG (Q^T)^(m-1-a), and (Q^T)^a = (-1)^a Q^a */
    size_t bb = (size_t)b * b, nq = (size_t)b * (b - 1) / 2;
    double *Q = malloc(sizeof(double) * bb), *pw = malloc(sizeof(double) * bb * (k + 2));
    double *t1 = malloc(sizeof(double) * bb), *t2 = malloc(sizeof(double) * bb), *dQ = malloc(sizeof(double) * bb);
    if (!Q || !pw || !t1 || !t2 || !dQ) {
        for (size_t i = 0; i < (size_t)nb * nq; i++) dq[i] = 0.0 / 0.0;
        free(Q), free(pw), free(t1), free(t2), free(dQ);
        return;
    }
    for (int j = 0; j < nb; j++) {
        unpack_skew(Q, q + j * nq, b);
        powers(pw, Q, b, k);
        memset(dQ, 0, sizeof(double) * bb);
        for (int m = 1; m <= k + 1; m++)
            for (int a = 0; a < m; a++) {
                int c = m - 1 - a;
                double sign = ((a + c) & 1) ? -1.0 : 1.0;
                mm(t1, pw + a * bb, dG + j * bb, b);
                mm(t2, t1, pw + c * bb, b);
                for (size_t e = 0; e < bb; e++) dQ[e] += coef(m, k) * sign * t2[e];
            }
        for (int r = 0; r < b; r++)
            for (int c = r + 1; c < b; c++)
                dq[j * nq + ref_poet_tri_index(b, r, c)] += dQ[(size_t)r * b + c] - dQ[(size_t)c * b + r];
    }
    free(Q), free(pw), free(t1), free(t2), free(dQ);
}

static int pidx(const int32_t *perm, int i) { return perm ? perm[i] : i; }

/* the matrix of block j as applied: G_j or G_j^T */
static double gat(const double *G, int b, int j, int r, int c, int trans) {
    size_t o = (size_t)j * b * b;
    return trans ? G[o + (size_t)c * b + r] : G[o + (size_t)r * b + c];
}

void ref_poet_apply_forward(double *y, const double *x, const double *G, const int32_t *perm, int N, int d, int b,
                            int trans) {
    int nb = d / b;
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * d;
        double *yr = y + (size_t)n * d;
        for (int j = 0; j < nb; j++)
            for (int r = 0; r < b; r++) {
                double s = 0;
                for (int c = 0; c < b; c++) s += gat(G, b, j, r, c, trans) * xr[pidx(perm, j * b + c)];
                yr[pidx(perm, j * b + r)] = s;
            }
    }
}

void ref_poet_apply_backward(double *dx, double *dG, const double *dy, const double *x, const double *G,
                             const int32_t *perm, int N, int d, int b, int trans) {
    /* y_{perm[jb+r]} = sum_c M[r][c] x_{perm[jb+c]}, M = G_j or G_j^T:
     * dx_{perm[jb+c]} += sum_r M[r][c] dy_{perm[jb+r]};  dM[r][c] += dy_{perm[jb+r]} x_{perm[jb+c]} */
    int nb = d / b;
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * d, *dyr = dy + (size_t)n * d;
        for (int j = 0; j < nb; j++)
            for (int r = 0; r < b; r++) {
                double g = dyr[pidx(perm, j * b + r)];
                for (int c = 0; c < b; c++) {
                    if (dx) dx[(size_t)n * d + pidx(perm, j * b + c)] += gat(G, b, j, r, c, trans) * g;
                    if (dG) {
                        size_t o = (size_t)j * b * b + (trans ? (size_t)c * b + r : (size_t)r * b + c);
                        dG[o] += g * xr[pidx(perm, j * b + c)];
                    }
                }
            }
    }
}
