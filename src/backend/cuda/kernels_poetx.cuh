/* kernels_poetx.cuh - the CUDA backend's POET-X ops (issue 30): the Cayley-Neumann
 * polynomial of packed skew-symmetric blocks and its gradient, and the permuted
 * block-diagonal apply to rows and its gradients, in fp32. Semantics are the vtable's
 * poet_* entries (include/strata/backend.h); the CPU backend's backend_cpu_poetx.c and the
 * reference's ops_ref_poetx.c are what the emulated test compares against.
 *
 * The polynomial runs Horner's rule H_{k+1} = I, H_m = c_m I + Q H_m+1, G = H_0, one
 * launch per step over every block at once (a thread per element of the b x b products;
 * Q's elements read from the packed triangle, never unpacked). Its gradient keeps H_1 ..
 * H_k+1 and runs dQ += dH_m H_m+1^T, dH_m+1 = Q^T dH_m, then packs dq += dQ - dQ^T. Both
 * need scratch of (steps) b x b floats per block: the caller's (cuBLASLt's workspace), the
 * blocks taken in batches that fit it.
 *
 * The apply takes a block of threads per (row, block j): the b permuted inputs of the row
 * are read into shared memory first, so y may be x (and dx may be dy). The backward's dG
 * is a thread per element of G_j summing the rows in order, before dx is touched (dx may
 * be dy). Every sum runs in a fixed order: the bits never depend on timing. Plain FMA
 * loops, not tensor cores: the op exists on the device, its speed is later work. */
#ifndef STRATA_KERNELS_POETX_CUH
#define STRATA_KERNELS_POETX_CUH

#include "backend/cuda/kernels_common.cuh"

enum { CU_POET_MAXB = 1024 }; /* the largest block size the apply's shared row holds */

static inline int cu_poet_supported(int b) { return b >= 2 && b <= CU_POET_MAXB; }

/* Q_j[r][c] of the packed strict upper triangle q_j (row by row) */
__device__ __forceinline__ float cu_poet_q(const float *qj, int r, int c, int b) {
    if (r == c) return 0.0f;
    int i = r < c ? r : c, j = r < c ? c : r;
    float v = qj[(size_t)i * b - (size_t)i * (i + 1) / 2 + (j - i - 1)];
    return r < c ? v : -v;
}

/* H (nbat, b, b) = I */
__global__ void k_poet_eye(float *H, int nbat, int b) {
    size_t bb = (size_t)b * b, n = (size_t)nbat * bb;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t o = e % bb;
        H[e] = o / b == o % b ? 1.0f : 0.0f;
    }
}

/* Ho[jj] = c I + Q_{j0+jj} Hi[jj] (TRANS: c I + Q^T Hi) for jj < nbat */
template <bool TRANS>
__global__ void k_poet_qmul(float *Ho, const float *q, const float *Hi, float c, int j0, int nbat, int b) {
    size_t bb = (size_t)b * b, n = (size_t)nbat * bb, nq = (size_t)b * (b - 1) / 2;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t jj = e / bb, o = e % bb;
        int r = (int)(o / b), col = (int)(o % b);
        const float *qj = q + (size_t)(j0 + jj) * nq, *h = Hi + jj * bb;
        float s = 0;
        for (int t = 0; t < b; t++) s += (TRANS ? cu_poet_q(qj, t, r, b) : cu_poet_q(qj, r, t, b)) * h[(size_t)t * b + col];
        Ho[e] = s + (r == col ? c : 0.0f);
    }
}

/* dQ[jj] (+)= dH[jj] Hn[jj]^T */
__global__ void k_poet_dq_acc(float *dQ, const float *dH, const float *Hn, int nbat, int b, int first) {
    size_t bb = (size_t)b * b, n = (size_t)nbat * bb;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t jj = e / bb, o = e % bb;
        int r = (int)(o / b), col = (int)(o % b);
        const float *a = dH + jj * bb + (size_t)r * b, *h = Hn + jj * bb + (size_t)col * b;
        float s = 0;
        for (int t = 0; t < b; t++) s += a[t] * h[t];
        dQ[e] = first ? s : dQ[e] + s;
    }
}

/* dq_{j0+jj}[p] += dQ[jj][i][j] - dQ[jj][j][i] */
__global__ void k_poet_pack(float *dq, const float *dQ, int j0, int nbat, int b) {
    size_t bb = (size_t)b * b, nq = (size_t)b * (b - 1) / 2, n = (size_t)nbat * nq;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t jj = e / nq, p = e % nq;
        int i = 0; /* the row of p: the largest i with i b - i (i+1) / 2 <= p */
        while ((size_t)(i + 1) * b - (size_t)(i + 1) * (i + 2) / 2 <= p) i++;
        int j = (int)(p - ((size_t)i * b - (size_t)i * (i + 1) / 2)) + i + 1;
        const float *m = dQ + jj * bb;
        dq[(size_t)(j0 + jj) * nq + p] += m[(size_t)i * b + j] - m[(size_t)j * b + i];
    }
}

/* dst = src, n floats */
__global__ void k_poet_copy(float *dst, const float *src, size_t n) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        dst[e] = src[e];
}

/* One block per unit (row n, block j): u = x's permuted b values of the row (shared), then
 * out[perm[jb + r]] (+)= sum_c M[r][c] u[c], M = G_j (GT: G_j^T). ACC: += (the backward's
 * dx), else = (y). */
template <bool GT, bool ACC>
__global__ void k_poet_apply(float *out, const float *in, const float *G, const int32_t *perm, int N, int d, int b) {
    __shared__ float u[CU_POET_MAXB];
    int nb = d / b;
    size_t bb = (size_t)b * b;
    for (size_t w = blockIdx.x; w < (size_t)N * nb; w += gridDim.x) {
        size_t n = w / nb;
        int j = (int)(w % nb);
        const int32_t *cols = perm ? perm + (size_t)j * b : nullptr;
        const float *row = in + n * d;
        __syncthreads(); /* the previous unit's readers are done with u */
        for (int c = threadIdx.x; c < b; c += blockDim.x) u[c] = row[cols ? cols[c] : j * b + c];
        __syncthreads();
        const float *Gj = G + (size_t)j * bb;
        float *orow = out + n * d;
        for (int r = threadIdx.x; r < b; r += blockDim.x) {
            float s = 0;
            for (int c = 0; c < b; c++) s += (GT ? Gj[(size_t)c * b + r] : Gj[(size_t)r * b + c]) * u[c];
            float *o = orow + (cols ? cols[r] : j * b + r);
            *o = ACC ? *o + s : s;
        }
    }
}

/* dG_j[r][c] += sum over rows n (in order) of dy[n][perm[jb+r]] x[n][perm[jb+c]]
 * (TRANS: x[..r] dy[..c]) */
template <bool TRANS>
__global__ void k_poet_dG(float *dG, const float *dy, const float *x, const int32_t *perm, int N, int d, int b) {
    int nb = d / b;
    size_t bb = (size_t)b * b, n = (size_t)nb * bb;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(e / bb), r = (int)(e % bb / b), c = (int)(e % b);
        int pr = perm ? perm[(size_t)j * b + r] : j * b + r, pc = perm ? perm[(size_t)j * b + c] : j * b + c;
        const float *a = TRANS ? x : dy, *v = TRANS ? dy : x;
        float s = 0;
        for (int i = 0; i < N; i++) s += a[(size_t)i * d + pr] * v[(size_t)i * d + pc];
        dG[e] += s;
    }
}

/* ---------------------------------------------------------------- launchers (host) */

/* scratch (device, scratch_floats): the blocks run in batches of scratch_floats / (steps
 * b b); 0 (nothing queued) when not even one block's fits */
static inline int cu_poet_batch(size_t scratch_floats, int per_block_mats, int b, int nb) {
    size_t one = (size_t)per_block_mats * b * b, fit = one ? scratch_floats / one : 0;
    return fit < (size_t)nb ? (int)fit : nb;
}

/* G (nb, b, b) from q; 0 when the scratch is too small for one block */
inline int cu_poet_cayley_forward(float *G, const float *q, int nb, int b, int k, float *scratch,
                                  size_t scratch_floats, cudaStream_t s) {
    int bat = cu_poet_batch(scratch_floats, 1, b, nb);
    if (nb > 0 && bat == 0) return 0;
    size_t bb = (size_t)b * b;
    for (int j0 = 0; j0 < nb; j0 += bat) {
        int n = nb - j0 < bat ? nb - j0 : bat;
        size_t cnt = (size_t)n * bb;
        /* k + 1 steps from I, alternating between G's batch and the scratch so that the last lands in G */
        float *bufs[2] = {G + (size_t)j0 * bb, scratch};
        int cur = (k + 1) % 2 == 0 ? 0 : 1; /* where H_{k+1} = I starts */
        ST_CUDA_LAUNCH(k_poet_eye, st_cuda_grid(cnt, 256), 256, 0, s, bufs[cur], n, b);
        for (int m = k; m >= 0; m--) {
            float c = (m == 0 || m == k + 1) ? 1.0f : 2.0f;
            ST_CUDA_LAUNCH(k_poet_qmul<false>, st_cuda_grid(cnt, 256), 256, 0, s, bufs[cur ^ 1], q, bufs[cur], c, j0, n,
                           b);
            cur ^= 1;
        }
    }
    return 1;
}

/* dq += the gradient through the polynomial of dG; 0 when the scratch is too small */
inline int cu_poet_cayley_backward(float *dq, const float *dG, const float *q, int nb, int b, int k, float *scratch,
                                   size_t scratch_floats, cudaStream_t s) {
    /* per block: H_1 .. H_k+1 (k + 1), dH twice, dQ */
    int bat = cu_poet_batch(scratch_floats, k + 4, b, nb);
    if (nb > 0 && bat == 0) return 0;
    size_t bb = (size_t)b * b;
    for (int j0 = 0; j0 < nb; j0 += bat) {
        int n = nb - j0 < bat ? nb - j0 : bat;
        size_t cnt = (size_t)n * bb, mat = (size_t)bat * bb;
        float *H = scratch, *dH = scratch + (size_t)(k + 1) * mat, *dH2 = dH + mat, *dQ = dH2 + mat;
        /* H_m at H + (m - 1) mat, m = 1 .. k+1 */
        ST_CUDA_LAUNCH(k_poet_eye, st_cuda_grid(cnt, 256), 256, 0, s, H + (size_t)k * mat, n, b);
        for (int m = k; m >= 1; m--) {
            float c = m == k + 1 ? 1.0f : 2.0f;
            ST_CUDA_LAUNCH(k_poet_qmul<false>, st_cuda_grid(cnt, 256), 256, 0, s, H + (size_t)(m - 1) * mat, q,
                           H + (size_t)m * mat, c, j0, n, b);
        }
        ST_CUDA_LAUNCH(k_poet_copy, st_cuda_grid(cnt, 256), 256, 0, s, dH, dG + (size_t)j0 * bb, cnt);
        for (int m = 0; m <= k; m++) {
            ST_CUDA_LAUNCH(k_poet_dq_acc, st_cuda_grid(cnt, 256), 256, 0, s, dQ, dH, H + (size_t)m * mat, n, b, m == 0);
            if (m < k) {
                ST_CUDA_LAUNCH(k_poet_qmul<true>, st_cuda_grid(cnt, 256), 256, 0, s, dH2, q, dH, 0.0f, j0, n, b);
                float *t = dH;
                dH = dH2, dH2 = t;
            }
        }
        ST_CUDA_LAUNCH(k_poet_pack, st_cuda_grid((size_t)n * b * (b - 1) / 2, 256), 256, 0, s, dq, dQ, j0, n, b);
    }
    return 1;
}

inline void cu_poet_apply_forward(float *y, const float *x, const float *G, const int32_t *perm, int N, int d, int b,
                                  int trans, cudaStream_t s) {
    if (N <= 0 || d <= 0) return;
    size_t units = (size_t)N * (d / b);
    unsigned th = cu_row_block(b);
    if (trans) ST_CUDA_LAUNCH((k_poet_apply<true, false>), st_cuda_grid(units, 1), th, 0, s, y, x, G, perm, N, d, b);
    else ST_CUDA_LAUNCH((k_poet_apply<false, false>), st_cuda_grid(units, 1), th, 0, s, y, x, G, perm, N, d, b);
}

inline void cu_poet_apply_backward(float *dx, float *dG, const float *dy, const float *x, const float *G,
                                   const int32_t *perm, int N, int d, int b, int trans, cudaStream_t s) {
    if (N <= 0 || d <= 0) return;
    size_t bb = (size_t)b * b, nb = (size_t)(d / b);
    if (dG) { /* first: dx may be dy */
        if (trans) ST_CUDA_LAUNCH(k_poet_dG<true>, st_cuda_grid(nb * bb, 256), 256, 0, s, dG, dy, x, perm, N, d, b);
        else ST_CUDA_LAUNCH(k_poet_dG<false>, st_cuda_grid(nb * bb, 256), 256, 0, s, dG, dy, x, perm, N, d, b);
    }
    if (dx) { /* du = G^T dv (trans: G dv), added */
        unsigned th = cu_row_block(b);
        if (trans) ST_CUDA_LAUNCH((k_poet_apply<false, true>), st_cuda_grid((size_t)N * nb, 1), th, 0, s, dx, dy, G, perm, N, d, b);
        else ST_CUDA_LAUNCH((k_poet_apply<true, true>), st_cuda_grid((size_t)N * nb, 1), th, 0, s, dx, dy, G, perm, N, d, b);
    }
}

/* columns of rows through a permutation (st_backend_ops.poet_permute): one thread an element */
__global__ void k_poet_permute(float *y, int ldy, const float *x, int ldx, const int32_t *perm, int N, int d,
                               int mode) {
    size_t total = (size_t)N * (size_t)d;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (size_t)gridDim.x * blockDim.x) {
        size_t n = k / (size_t)d, i = k % (size_t)d;
        if (mode == 0) y[n * ldy + i] = x[n * ldx + perm[i]];
        else if (mode == 1) y[n * ldy + perm[i]] = x[n * ldx + i];
        else y[n * ldy + perm[i]] += x[n * ldx + i];
    }
}

inline void cu_poet_permute(float *y, int ldy, const float *x, int ldx, const int32_t *perm, int N, int d, int mode,
                            cudaStream_t s) {
    size_t n = (size_t)N * (size_t)d;
    if (!n) return;
    ST_CUDA_LAUNCH(k_poet_permute, st_cuda_grid(n, 256), 256, 0, s, y, ldy, x, ldx, perm, N, d, mode);
}

#endif
