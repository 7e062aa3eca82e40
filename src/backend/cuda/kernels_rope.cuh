/* kernels_rope.cuh - the CUDA backend's rotary embedding, forward and backward, in place
 * over fp32 or bf16 storage (T) with fp32 tables and arithmetic. Semantics are the CPU
 * backend's rope_forward/_backward (include/strata/backend.h): Hugging Face's rotate_half,
 * head h of token (b,t) at x + (b*T+t)*ld + h*hs, table row t (cos, sin: >= T rows of
 * hs/2). The tables come from the host (st_llama_rope_tables: theta and Llama-3 scaling);
 * packed documents pass tables gathered at each token's position with B = 1, T = B*T,
 * as llama_arch.c does, so the kernel needs no positions of its own.
 *
 * One thread per rotated pair (x[i], x[i+hs/2]): it reads both and writes both, so the
 * in-place update has no race; the backward is the transposed rotation (sin negated). */
#ifndef STRATA_KERNELS_ROPE_CUH
#define STRATA_KERNELS_ROPE_CUH

#include "backend/cuda/kernels_common.cuh"

/* x (B,T rows ld apart, H heads of hs) rotated in place; sign +1 forward, -1 backward */
template <class T>
__global__ void k_rope(T *x, const float *cos, const float *sin, int B, int T_, int H, int hs, int ld, float sign) {
    int half = hs / 2;
    size_t n = (size_t)B * T_ * H * half;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % half);
        size_t bth = e / half; /* (b*T + t)*H + h */
        int h = (int)(bth % H);
        size_t bt = bth / H;
        int t = (int)(bt % T_);
        T *p = x + bt * ld + (size_t)h * hs;
        float c = cos[(size_t)t * half + i], s = sign * sin[(size_t)t * half + i];
        float x1 = cu_load(p + i), x2 = cu_load(p + i + half);
        cu_store(p + i, x1 * c - x2 * s);
        cu_store(p + i + half, x2 * c + x1 * s);
    }
}

/* ---------------------------------------------------------------- launchers (host) */

template <class T>
void cu_rope_forward(T *x, const float *cos, const float *sin, int B, int T_, int H, int hs, int ld, cudaStream_t s) {
    ST_CUDA_LAUNCH(k_rope<T>, st_cuda_grid((size_t)B * T_ * H * (hs / 2), 256), 256, 0, s, x, cos, sin, B, T_, H, hs,
                   ld, 1.0f);
}
template <class T>
void cu_rope_backward(T *dx, const float *cos, const float *sin, int B, int T_, int H, int hs, int ld,
                      cudaStream_t s) {
    ST_CUDA_LAUNCH(k_rope<T>, st_cuda_grid((size_t)B * T_ * H * (hs / 2), 256), 256, 0, s, dx, cos, sin, B, T_, H,
                   hs, ld, -1.0f);
}

#endif
