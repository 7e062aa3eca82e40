/* kernels_norm.cuh - the CUDA backend's LayerNorm and RMSNorm, forward and backward, and
 * their launchers, over fp32 or bf16 storage (T: inputs, outputs, weights, input
 * gradients), computed in fp32, with mean and rstd and the weight gradients dw, db in
 * fp32. Semantics are the CPU backend's (include/strata/backend.h: layernorm_*,
 * rmsnorm_* with H groups of hs elements per row, rows ld floats apart).
 *
 * A row (or group) is reduced by one block: each thread strides over its columns, then
 * cu_block_sum (warp shuffles, then the warp sums through shared memory) gives the sum
 * to every thread. The weight gradients are a second kernel that owns 32 columns per
 * block and sums the rows in a fixed order (8 row phases, then the phases in order):
 * no atomics, so the bits never depend on timing. Blocks loop over rows (columns)
 * when there are more than ST_CUDA_GRID_CAP. */
#ifndef STRATA_KERNELS_NORM_CUH
#define STRATA_KERNELS_NORM_CUH

#include "backend/cuda/kernels_common.cuh"

#define CU_LN_EPS 1e-5f /* GPT-2's LayerNorm epsilon, as the CPU backend */
enum { CU_COL_X = 32, CU_COL_Y = 8 }; /* the weight-gradient kernels' block: columns x row phases */

/* ---------------------------------------------------------------- layernorm */

/* out (N,C), mean and rstd (N) kept for backward */
template <class T>
__global__ void k_layernorm_forward(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b, int N,
                                    int C) {
    __shared__ float scratch[32];
    for (int row = blockIdx.x; row < N; row += gridDim.x) {
        const T *x = inp + (size_t)row * C;
        float s = 0;
        for (int c = threadIdx.x; c < C; c += blockDim.x) s += cu_load(x + c);
        float m = cu_block_sum(s, scratch) / C;
        float v = 0;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float d = cu_load(x + c) - m;
            v += d * d;
        }
        float r = 1.0f / sqrtf(cu_block_sum(v, scratch) / C + CU_LN_EPS);
        T *o = out + (size_t)row * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            cu_store(o + c, (cu_load(x + c) - m) * r * cu_load(w + c) + cu_load(b + c));
        if (threadIdx.x == 0) mean[row] = m, rstd[row] = r;
    }
}

/* dinp (N,C) += */
template <class T>
__global__ void k_layernorm_backward_dinp(T *dinp, const T *dout, const T *inp, const T *w, const float *mean,
                                          const float *rstd, int N, int C) {
    __shared__ float scratch[64];
    for (int row = blockIdx.x; row < N; row += gridDim.x) {
        const T *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
        float m = mean[row], s = rstd[row], dmean = 0, dnorm_mean = 0;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float norm = (cu_load(x + c) - m) * s, dn = cu_load(w + c) * cu_load(d + c);
            dmean += dn;
            dnorm_mean += dn * norm;
        }
        cu_block_sum2(dmean, dnorm_mean, scratch);
        dmean /= C;
        dnorm_mean /= C;
        T *di = dinp + (size_t)row * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float norm = (cu_load(x + c) - m) * s, dn = cu_load(w + c) * cu_load(d + c);
            cu_store(di + c, cu_load(di + c) + (dn - dmean - norm * dnorm_mean) * s);
        }
    }
}

/* dw, db (C) += sums over the N rows; block (CU_COL_X, CU_COL_Y). With part (R > 1 row
 * groups): block row blockIdx.y takes groups r, and group r's rows i = r CU_COL_Y + ty,
 * stepping R CU_COL_Y, summed into part[r C + c] (dw) and part[(R + r) C + c] (db), which
 * k_cols_sum then adds in order: a grid of C/32 x R blocks, not C/32, in a fixed order. */
template <class T>
__global__ void k_layernorm_backward_params(float *dw, float *db, const T *dout, const T *inp, const float *mean,
                                            const float *rstd, int N, int C, float *part, int R) {
    __shared__ float pw[CU_COL_Y][CU_COL_X + 1], pb[CU_COL_Y][CU_COL_X + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    for (int c0 = blockIdx.x * CU_COL_X; c0 < C; c0 += gridDim.x * CU_COL_X)
        for (int r = blockIdx.y; r < R; r += gridDim.y) {
            int c = c0 + tx;
            float sw = 0, sb = 0;
            if (c < C)
                for (int i = r * CU_COL_Y + ty; i < N; i += R * CU_COL_Y) {
                    size_t o = (size_t)i * C + c;
                    float d = cu_load(dout + o);
                    sw += (cu_load(inp + o) - mean[i]) * rstd[i] * d;
                    sb += d;
                }
            pw[ty][tx] = sw, pb[ty][tx] = sb;
            __syncthreads();
            if (ty == 0 && c < C) {
                float a = 0, b = 0;
                for (int y = 0; y < CU_COL_Y; y++) a += pw[y][tx], b += pb[y][tx];
                if (part) part[(size_t)r * C + c] = a, part[(size_t)(R + r) * C + c] = b;
                else dw[c] += a, db[c] += b;
            }
            __syncthreads(); /* pw, pb are read before the next columns overwrite them */
        }
}
/* dst (C) += the R partial sums part[r C + c], in order of r */
static __global__ void k_cols_sum(float *dst, const float *part, int C, int R) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float t = 0;
        for (int r = 0; r < R; r++) t += part[(size_t)r * C + c];
        dst[c] += t;
    }
}
/* the row groups for `rows` rows of `cols` columns and `vecs` partial vectors in a scratch
 * of `floats` floats: at most 64, at least 2 (else 1: no scratch used) */
static inline int cu_row_groups(size_t rows, size_t cols, int vecs, size_t floats) {
    size_t r = (rows + CU_COL_Y - 1) / CU_COL_Y, cap = floats / (cols * (size_t)vecs);
    if (r > 64) r = 64;
    if (r > cap) r = cap;
    return r < 2 ? 1 : (int)r;
}

/* ---------------------------------------------------------------- rmsnorm */

/* group g < N*H of row n = g/H is hs elements at inp + n*ld + (g%H)*hs;
 * out at the same offsets, rstd (N,H) */
template <class T>
__global__ void k_rmsnorm_forward(T *out, float *rstd, const T *inp, const T *w, int N, int H, int hs, int ld,
                                  float eps) {
    __shared__ float scratch[32];
    for (int g = blockIdx.x; g < N * H; g += gridDim.x) {
        size_t o = (size_t)(g / H) * ld + (size_t)(g % H) * hs;
        const T *x = inp + o;
        float ss = 0;
        for (int i = threadIdx.x; i < hs; i += blockDim.x) {
            float v = cu_load(x + i);
            ss += v * v;
        }
        float r = 1.0f / sqrtf(cu_block_sum(ss, scratch) / hs + eps);
        for (int i = threadIdx.x; i < hs; i += blockDim.x) cu_store(out + o + i, cu_load(x + i) * r * cu_load(w + i));
        if (threadIdx.x == 0) rstd[g] = r;
    }
}

/* dinp (same layout as inp) += */
template <class T>
__global__ void k_rmsnorm_backward_dinp(T *dinp, const T *dout, const T *inp, const T *w, const float *rstd, int N,
                                        int H, int hs, int ld) {
    __shared__ float scratch[32];
    for (int g = blockIdx.x; g < N * H; g += gridDim.x) {
        size_t o = (size_t)(g / H) * ld + (size_t)(g % H) * hs;
        float r = rstd[g], gx = 0;
        for (int i = threadIdx.x; i < hs; i += blockDim.x)
            gx += cu_load(dout + o + i) * cu_load(w + i) * cu_load(inp + o + i);
        float k = r * r * r * cu_block_sum(gx, scratch) / hs;
        for (int i = threadIdx.x; i < hs; i += blockDim.x) {
            float d = cu_load(dout + o + i), x = cu_load(inp + o + i);
            cu_store(dinp + o + i, cu_load(dinp + o + i) + r * d * cu_load(w + i) - k * x);
        }
    }
}

/* dw (hs) += the sum over the N*H groups of dout * inp * rstd; block (CU_COL_X, CU_COL_Y);
 * with part, R row groups as k_layernorm_backward_params (part[r hs + c]) */
template <class T>
__global__ void k_rmsnorm_backward_params(float *dw, const T *dout, const T *inp, const float *rstd, int N, int H,
                                          int hs, int ld, float *part, int R) {
    __shared__ float pw[CU_COL_Y][CU_COL_X + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    for (int c0 = blockIdx.x * CU_COL_X; c0 < hs; c0 += gridDim.x * CU_COL_X)
        for (int r = blockIdx.y; r < R; r += gridDim.y) {
            int c = c0 + tx;
            float sw = 0;
            if (c < hs)
                for (int g = r * CU_COL_Y + ty; g < N * H; g += R * CU_COL_Y) {
                    size_t o = (size_t)(g / H) * ld + (size_t)(g % H) * hs + c;
                    sw += cu_load(dout + o) * cu_load(inp + o) * rstd[g];
                }
            pw[ty][tx] = sw;
            __syncthreads();
            if (ty == 0 && c < hs) {
                float a = 0;
                for (int y = 0; y < CU_COL_Y; y++) a += pw[y][tx];
                if (part) part[(size_t)r * hs + c] = a;
                else dw[c] += a;
            }
            __syncthreads();
        }
}

/* ---------------------------------------------------------------- launchers (host) */

template <class T>
void cu_layernorm_forward(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b, int N, int C,
                          cudaStream_t s) {
    ST_CUDA_LAUNCH(k_layernorm_forward<T>, st_cuda_grid(N, 1), cu_row_block(C), 0, s, out, mean, rstd, inp, w, b, N,
                   C);
}
/* scratch (device, scratch_floats floats, free on stream s): where the weight gradients'
 * partial sums over row groups go, so that the grid spreads over rows too; without it
 * (the kernel tests) C/32 blocks each sum every row in order, the CPU's bits */
template <class T>
void cu_layernorm_backward(T *dinp, float *dw, float *db, const T *dout, const T *inp, const T *w, const float *mean,
                           const float *rstd, int N, int C, cudaStream_t s, float *scratch = nullptr,
                           size_t scratch_floats = 0) {
    ST_CUDA_LAUNCH(k_layernorm_backward_dinp<T>, st_cuda_grid(N, 1), cu_row_block(C), 0, s, dinp, dout, inp, w, mean,
                   rstd, N, C);
    int R = scratch ? cu_row_groups((size_t)N, (size_t)C, 2, scratch_floats) : 1;
    float *part = R > 1 ? scratch : nullptr;
    ST_CUDA_LAUNCH(k_layernorm_backward_params<T>, dim3(st_cuda_grid(C, CU_COL_X), st_cuda_grid((size_t)R, 1)),
                   dim3(CU_COL_X, CU_COL_Y), 0, s, dw, db, dout, inp, mean, rstd, N, C, part, R);
    if (part) {
        ST_CUDA_LAUNCH(k_cols_sum, st_cuda_grid(C, 256), 256, 0, s, dw, (const float *)part, C, R);
        ST_CUDA_LAUNCH(k_cols_sum, st_cuda_grid(C, 256), 256, 0, s, db, (const float *)(part + (size_t)R * C), C, R);
    }
}
template <class T>
void cu_rmsnorm_forward(T *out, float *rstd, const T *inp, const T *w, int N, int H, int hs, int ld, float eps,
                        cudaStream_t s) {
    ST_CUDA_LAUNCH(k_rmsnorm_forward<T>, st_cuda_grid((size_t)N * H, 1), cu_row_block(hs), 0, s, out, rstd, inp, w, N,
                   H, hs, ld, eps);
}
template <class T>
void cu_rmsnorm_backward(T *dinp, float *dw, const T *dout, const T *inp, const T *w, const float *rstd, int N, int H,
                         int hs, int ld, cudaStream_t s, float *scratch = nullptr, size_t scratch_floats = 0) {
    ST_CUDA_LAUNCH(k_rmsnorm_backward_dinp<T>, st_cuda_grid((size_t)N * H, 1), cu_row_block(hs), 0, s, dinp, dout,
                   inp, w, rstd, N, H, hs, ld);
    int R = scratch ? cu_row_groups((size_t)N * H, (size_t)hs, 1, scratch_floats) : 1;
    float *part = R > 1 ? scratch : nullptr;
    ST_CUDA_LAUNCH(k_rmsnorm_backward_params<T>, dim3(st_cuda_grid(hs, CU_COL_X), st_cuda_grid((size_t)R, 1)),
                   dim3(CU_COL_X, CU_COL_Y), 0, s, dw, dout, inp, rstd, N, H, hs, ld, part, R);
    if (part) ST_CUDA_LAUNCH(k_cols_sum, st_cuda_grid(hs, 256), 256, 0, s, dw, (const float *)part, hs, R);
}

#endif
