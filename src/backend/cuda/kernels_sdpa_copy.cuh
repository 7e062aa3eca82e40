/* kernels_sdpa_copy.cuh - the copies around cuDNN's fused attention (cudnn_attn.cu): the
 * backend's fp32 q, k, v, out, dout (heads inside rows ld floats apart) packed into the
 * bf16 token-major (B T rows, H heads, hs) tensors cuDNN reads, and cuDNN's bf16 out, dq,
 * dk, dv back into the backend's rows (written, or added for the gradients). Separate
 * from cudnn_attn.cu so that the emulated tests check the index arithmetic
 * (test_cuda_emu_sdpa_copy) on a machine without cuDNN or a GPU. */
#ifndef STRATA_KERNELS_SDPA_COPY_CUH
#define STRATA_KERNELS_SDPA_COPY_CUH

#include "backend/cuda/kernels_common.cuh"

/* dst (rows, H, hs) bf16 packed = src: row r's H hs floats at src + r ld, rounded once */
template <class Dummy = void>
__global__ void k_sdpa_pack(__nv_bfloat16 *dst, const float *src, size_t rows, int H, int hs, int ld) {
    size_t w = (size_t)H * hs, n = rows * w;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i / w * ld + i % w]);
}
/* row r's H hs floats at dst + r ld = (add: +=) the packed bf16 src */
template <class Dummy = void>
__global__ void k_sdpa_unpack(float *dst, const __nv_bfloat16 *src, size_t rows, int H, int hs, int ld, int add) {
    size_t w = (size_t)H * hs, n = rows * w;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = __bfloat162float(src[i]);
        float *o = dst + i / w * ld + i % w;
        *o = add ? *o + v : v;
    }
}

inline void cu_sdpa_pack(__nv_bfloat16 *dst, const float *src, size_t rows, int H, int hs, int ld, cudaStream_t s) {
    ST_CUDA_LAUNCH(k_sdpa_pack<>, st_cuda_grid(rows * H * hs, 256), 256, 0, s, dst, src, rows, H, hs, ld);
}
inline void cu_sdpa_unpack(float *dst, const __nv_bfloat16 *src, size_t rows, int H, int hs, int ld, int add,
                           cudaStream_t s) {
    ST_CUDA_LAUNCH(k_sdpa_unpack<>, st_cuda_grid(rows * H * hs, 256), 256, 0, s, dst, src, rows, H, hs, ld, add);
}

#endif
