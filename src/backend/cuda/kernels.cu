/* kernels.cu - every kernel of kernels_*.cuh compiled by nvcc, in fp32 and bf16 storage:
 * the launchers' explicit instantiations (the backend, backend_cuda.cu, calls the fp32
 * ones; the bf16 ones wait for the executor's bf16 activations). The same headers are
 * compiled by g++ in the emulated tests (tests/test_cuda_emu_*.cpp). */
#include "backend/cuda/kernels_attn.cuh"
#include "backend/cuda/kernels_eltwise.cuh"
#include "backend/cuda/kernels_embed.cuh"
#include "backend/cuda/kernels_norm.cuh"
#include "backend/cuda/kernels_rope.cuh"
#include "backend/cuda/kernels_xent.cuh"

#define CU_INSTANTIATE(T)                                                                                        \
    template void cu_residual_forward<T>(T *, const T *, const T *, size_t, cudaStream_t);                       \
    template void cu_axpy_rows<T>(T *, int, const T *, int, float, int, int, cudaStream_t);                      \
    template void cu_residual_backward<T>(T *, T *, const T *, size_t, cudaStream_t);                            \
    template void cu_gelu_forward<T>(T *, const T *, size_t, cudaStream_t);                                      \
    template void cu_gelu_backward<T>(T *, const T *, const T *, size_t, cudaStream_t);                          \
    template void cu_swiglu_forward<T>(T *, const T *, int, int, cudaStream_t);                                  \
    template void cu_swiglu_backward<T>(T *, const T *, const T *, int, int, cudaStream_t);                      \
    template void cu_to_bf16<T>(__nv_bfloat16 *, const T *, size_t, cudaStream_t);                               \
    template void cu_from_bf16<T>(T *, const __nv_bfloat16 *, size_t, cudaStream_t);                             \
    template void cu_layernorm_forward<T>(T *, float *, float *, const T *, const T *, const T *, int, int,      \
                                          cudaStream_t);                                                         \
    template void cu_layernorm_backward<T>(T *, float *, float *, const T *, const T *, const T *, const float *, \
                                           const float *, int, int, cudaStream_t, float *, size_t);              \
    template void cu_rmsnorm_forward<T>(T *, float *, const T *, const T *, int, int, int, int, float,            \
                                        cudaStream_t);                                                           \
    template void cu_rmsnorm_backward<T>(T *, float *, const T *, const T *, const T *, const float *, int, int,  \
                                         int, int, cudaStream_t, float *, size_t);                               \
    template void cu_rope_forward<T>(T *, const float *, const float *, int, int, int, int, int, cudaStream_t);   \
    template void cu_rope_backward<T>(T *, const float *, const float *, int, int, int, int, int, cudaStream_t);   \
    template void cu_embed_forward<T>(T *, const int32_t *, const T *, const T *, int, int, int, cudaStream_t);   \
    template void cu_embed_backward<T>(float *, float *, const T *, const int32_t *, int, int, int, cudaStream_t); \
    template void cu_attn_forward<T>(T *, float *, const T *, const T *, const T *, const int32_t *, int, int, int, \
                                     int, int, int, cudaStream_t);                                               \
    template void cu_attn_backward<T>(T *, T *, T *, const T *, const T *, const T *, const T *, const T *,        \
                                      const float *, const int32_t *, int, int, int, int, int, int, cudaStream_t,  \
                                      float *, size_t);                                                          \
    template void cu_crossentropy<T>(T *, float *, const int32_t *, int, int, float, cudaStream_t);              \
    template void cu_softmax_chunk_stats<T>(const T *, const int32_t *, int, int, int, float *, double *, float *, \
                                            cudaStream_t);                                                       \
    template void cu_softmax_chunk_grad<T>(T *, const int32_t *, int, int, int, const float *, const double *,    \
                                           float, cudaStream_t);

CU_INSTANTIATE(float)
CU_INSTANTIATE(__nv_bfloat16)
