/* kernels_common.cuh - what the CUDA kernels share: loads and stores of fp32 or bf16
 * storage (arithmetic is always fp32), and the block and warp reductions.
 *
 * Determinism: every reduction here sums in a fixed order that depends only on the
 * block size (a butterfly over the lanes, then the warps in order), never on timing;
 * no reduction uses atomics. The launchers choose the block size from the shape alone,
 * so a kernel gives the same bits run after run (resume is bit-exact on one GPU). */
#ifndef STRATA_KERNELS_COMMON_CUH
#define STRATA_KERNELS_COMMON_CUH

#include <math.h>

#include "backend/cuda/cuda_compat.cuh"

/* fp32 arithmetic over fp32 or bf16 storage; a bf16 store rounds to nearest even once. */
__device__ __forceinline__ float cu_load(const float *p) { return *p; }
__device__ __forceinline__ float cu_load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void cu_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void cu_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* The operations of cu_warp_reduce and cu_block_reduce: apply combines two partial results
 * (in a fixed argument order, so every lane computes the same bits), identity is what a
 * lane past the block's last warp contributes. */
template <class T> struct CuSum {
    static __device__ __forceinline__ T apply(T a, T b) { return a + b; }
    static __device__ __forceinline__ T identity() { return T(0); }
};
__device__ __forceinline__ float cu_fmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double cu_fmax(double a, double b) { return fmax(a, b); }
template <class T> struct CuMax {
    static __device__ __forceinline__ T apply(T a, T b) { return cu_fmax(a, b); }
    static __device__ __forceinline__ T identity() { return (T)-INFINITY; }
};

/* Op over v of the 32 lanes, in every lane (a butterfly: lane i combines with lane i^o, so
 * all lanes combine the same pairs and hold the same bits). The whole warp must call it. */
template <class T, template <class> class Op> __device__ __forceinline__ T cu_warp_reduce(T v) {
    for (int o = 16; o > 0; o >>= 1) v = Op<T>::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Op over v of the threads of a one-dimensional block whose size is a multiple of 32, in
 * every thread: each warp reduces its lanes, lane 0 of each warp puts its result in
 * scratch (__shared__, 32 T), and every warp then reduces the warp results in warp order.
 * Every thread of the block must call it; it opens with a barrier so that scratch can be
 * reused by the call after. cu_block_reduce<float, CuMax> is a row's max,
 * cu_block_reduce<double, CuSum> a sum kept in double. */
template <class T, template <class> class Op> __device__ __forceinline__ T cu_block_reduce(T v, T *scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = cu_warp_reduce<T, Op>(v);
    __syncthreads(); /* the previous call's readers are done with scratch */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return cu_warp_reduce<T, Op>(lane < nwarps ? scratch[lane] : Op<T>::identity());
}

/* The sum of v over the 32 lanes, in every lane; the sum over the block (scratch: 32 floats). */
__device__ __forceinline__ float cu_warp_sum(float v) { return cu_warp_reduce<float, CuSum>(v); }
__device__ __forceinline__ float cu_block_sum(float v, float *scratch) { return cu_block_reduce<float, CuSum>(v, scratch); }

/* The sums of a and b over the block, as cu_block_reduce but both through one pair of
 * barriers (scratch: 64 floats). */
__device__ __forceinline__ void cu_block_sum2(float &a, float &b, float *scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    a = cu_warp_sum(a);
    b = cu_warp_sum(b);
    __syncthreads(); /* the previous call's readers are done with scratch */
    if (lane == 0) scratch[warp] = a, scratch[32 + warp] = b;
    __syncthreads();
    a = cu_warp_sum(lane < nwarps ? scratch[lane] : 0.0f);
    b = cu_warp_sum(lane < nwarps ? scratch[32 + lane] : 0.0f);
}

/* Threads for a block that reduces rows of n elements: n rounded up to a warp, at most
 * 256 (each thread then strides over the row). */
static inline unsigned cu_row_block(int n) {
    unsigned t = (unsigned)(n + 31) / 32 * 32;
    return t < 32 ? 32 : t > 256 ? 256 : t;
}

#endif
