/* kernels_xent.cuh - the classifier's softmax: the fused cross-entropy over full logit
 * rows (crossentropy_forward_backward) and the chunked classifier's online softmax over
 * vocabulary chunks (softmax_chunk_init, _stats, _grad), the contracts of
 * include/strata/backend.h, fp32 or bf16 storage of the logits, fp32 arithmetic.
 *
 * A block per row (the grid strides over rows, so a row's threads take the same branch
 * and every barrier is reached by all of them); the block's threads stride over the
 * row's columns. The row max is a block max (cu_block_reduce: a butterfly over the lanes,
 * then the warps in order); sum exp(logit - max) is kept in double, as the CPU backend's, and summed
 * over the block in a fixed order (each thread its columns in order, then the butterfly,
 * then the warps in order): no atomics, the same bits run after run. Rows whose target
 * is < 0 are masked: loss 0, dlogits 0, their chunk statistics untouched.
 *
 * In place: the gradient is written once per element, (exp(l - max) * (dloss / sum))
 * rounded to the storage, less dloss at the target in fp32 before that one rounding, so
 * bf16 storage rounds once. The target's logit (and a chunk's old max) is read before
 * the first barrier, and written only after the last one; the next row's reductions
 * open with a barrier before they reuse the __shared__ scratch. */
#ifndef STRATA_KERNELS_XENT_CUH
#define STRATA_KERNELS_XENT_CUH

#include <math.h>

#include "backend/cuda/kernels_common.cuh"

/* logits (N, V): losses (N) = max + log(sum) - logit[target] (0 when masked); when
 * dloss != 0, logits become (softmax - onehot(target)) * dloss (0 when masked). */
template <class T>
__global__ void __launch_bounds__(256) k_crossentropy(T *logits, float *losses, const int32_t *targets, int N, int V,
                                                     float dloss) {
    __shared__ float fs[32];
    __shared__ double ds[32];
    for (int i = blockIdx.x; i < N; i += gridDim.x) {
        T *l = logits + (size_t)i * V;
        int tgt = targets[i];
        if (tgt < 0) { /* the whole block takes this branch */
            if (threadIdx.x == 0) losses[i] = 0.0f;
            if (dloss != 0.0f)
                for (int j = threadIdx.x; j < V; j += blockDim.x) cu_store(&l[j], 0.0f);
            continue;
        }
        float lt = cu_load(&l[tgt]); /* before any thread overwrites the row */
        float mx = -INFINITY;
        for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, cu_load(&l[j]));
        mx = cu_block_reduce<float, CuMax>(mx, fs);
        double sum = 0;
        for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(cu_load(&l[j]) - mx);
        sum = cu_block_reduce<double, CuSum>(sum, ds);
        if (threadIdx.x == 0) losses[i] = (float)((double)mx + log(sum) - (double)lt);
        if (dloss != 0.0f) {
            float sc = (float)((double)dloss / sum);
            for (int j = threadIdx.x; j < V; j += blockDim.x) {
                float g = expf(cu_load(&l[j]) - mx) * sc;
                cu_store(&l[j], j == tgt ? g - dloss : g);
            }
        }
    }
}

/* rmax (N) = -inf, rsum (N) = 0, tlogit (N) = 0 (static: not a template, and the header is in
 * more than one translation unit) */
static __global__ void __launch_bounds__(256) k_softmax_chunk_init(float *rmax, double *rsum, float *tlogit, int N) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x)
        rmax[i] = -INFINITY, rsum[i] = 0.0, tlogit[i] = 0.0f;
}

/* Pass 1 over the chunk logits (N, nr) of vocabulary rows [r0, r0 + nr): the running max
 * and sum of each unmasked row (the sum rescaled when the max rises), and the target's
 * logit when the target is in the chunk. */
template <class T>
__global__ void __launch_bounds__(256) k_softmax_chunk_stats(const T *logits, const int32_t *targets, int N, int nr,
                                                            int r0, float *rmax, double *rsum, float *tlogit) {
    __shared__ float fs[32];
    __shared__ double ds[32];
    for (int i = blockIdx.x; i < N; i += gridDim.x) {
        int t = targets[i];
        if (t < 0) continue; /* the whole block */
        const T *l = logits + (size_t)i * nr;
        float mx = -INFINITY;
        for (int j = threadIdx.x; j < nr; j += blockDim.x) mx = fmaxf(mx, cu_load(&l[j]));
        mx = cu_block_reduce<float, CuMax>(mx, fs);
        float old = rmax[i], m = mx > old ? mx : old;
        double sum = 0;
        for (int j = threadIdx.x; j < nr; j += blockDim.x) sum += (double)expf(cu_load(&l[j]) - m);
        sum = cu_block_reduce<double, CuSum>(sum, ds);
        if (threadIdx.x == 0) {
            double rs = rsum[i];
            if (mx > old) rs *= exp((double)old - (double)mx); /* rescale the sum so far */
            rsum[i] = rs + sum, rmax[i] = m;
            if (t >= r0 && t < r0 + nr) tlogit[i] = cu_load(&l[t - r0]);
        }
    }
}

/* Pass 2, in place: (softmax - onehot(target)) * dloss from the final rmax and rsum, 0
 * for masked rows. Element-wise: a row's values need no reduction here. */
template <class T>
__global__ void __launch_bounds__(256) k_softmax_chunk_grad(T *logits, const int32_t *targets, int N, int nr, int r0,
                                                           const float *rmax, const double *rsum, float dloss) {
    for (int i = blockIdx.x; i < N; i += gridDim.x) {
        T *l = logits + (size_t)i * nr;
        int t = targets[i];
        if (t < 0) {
            for (int j = threadIdx.x; j < nr; j += blockDim.x) cu_store(&l[j], 0.0f);
            continue;
        }
        float m = rmax[i], sc = (float)((double)dloss / rsum[i]);
        for (int j = threadIdx.x; j < nr; j += blockDim.x) {
            float g = expf(cu_load(&l[j]) - m) * sc;
            cu_store(&l[j], j == t - r0 ? g - dloss : g);
        }
    }
}

/* ---------------------------------------------------------------- launchers */

template <class T>
void cu_crossentropy(T *logits, float *losses, const int32_t *targets, int N, int V, float dloss, cudaStream_t s) {
    if (N <= 0) return;
    ST_CUDA_LAUNCH(k_crossentropy<T>, st_cuda_grid((size_t)N, 1), cu_row_block(V), 0, s, logits, losses, targets, N, V,
                   dloss);
}
inline void cu_softmax_chunk_init(float *rmax, double *rsum, float *tlogit, int N, cudaStream_t s) {
    if (N <= 0) return;
    ST_CUDA_LAUNCH(k_softmax_chunk_init, st_cuda_grid((size_t)N, 256), 256, 0, s, rmax, rsum, tlogit, N);
}
template <class T>
void cu_softmax_chunk_stats(const T *logits, const int32_t *targets, int N, int nr, int r0, float *rmax, double *rsum,
                            float *tlogit, cudaStream_t s) {
    if (N <= 0 || nr <= 0) return;
    ST_CUDA_LAUNCH(k_softmax_chunk_stats<T>, st_cuda_grid((size_t)N, 1), cu_row_block(nr), 0, s, logits, targets, N,
                   nr, r0, rmax, rsum, tlogit);
}
template <class T>
void cu_softmax_chunk_grad(T *logits, const int32_t *targets, int N, int nr, int r0, const float *rmax,
                           const double *rsum, float dloss, cudaStream_t s) {
    if (N <= 0 || nr <= 0) return;
    ST_CUDA_LAUNCH(k_softmax_chunk_grad<T>, st_cuda_grid((size_t)N, 1), cu_row_block(nr), 0, s, logits, targets, N, nr,
                   r0, rmax, rsum, dloss);
}

#endif
