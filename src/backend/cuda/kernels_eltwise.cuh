/* kernels_eltwise.cuh - the CUDA backend's elementwise kernels and their launchers:
 * residual add, GELU (tanh approximation), SwiGLU, fp32 -> bf16 rounding. Forward and
 * backward, over fp32 or bf16 storage (T), computed in fp32; the semantics are the CPU
 * backend's (src/backend/cpu/backend_cpu.c, backend_cpu_llama.c, include/strata/backend.h):
 * forward writes, backward accumulates (+=).
 *
 * Each kernel is a grid-stride loop (the grid is capped at ST_CUDA_GRID_CAP blocks of
 * CU_EW_BLOCK threads). Compiled by nvcc in the .cu files beside it and by g++ in the
 * emulated tests (tests/test_cuda_emu_eltwise.cpp). */
#ifndef STRATA_KERNELS_ELTWISE_CUH
#define STRATA_KERNELS_ELTWISE_CUH

#include "backend/cuda/kernels_common.cuh"

enum { CU_EW_BLOCK = 256 };

#define CU_GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

#define CU_GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* e^x with x clamped to 88 (e^88 is finite), as the CPU's st_fast_expf: the backward
 * formulas take e * s with s = 1 / (1 + e), which is inf * 0 = NaN once e overflows */
__device__ __forceinline__ float cu_exp_clamped(float x) { return expf(fminf(x, 88.0f)); }

/* ---------------------------------------------------------------- residual */

/* out (n) = a + b */
template <class T> __global__ void k_residual_forward(T *out, const T *a, const T *b, size_t n) {
    CU_GRID_STRIDE(i, n) cu_store(out + i, cu_load(a + i) + cu_load(b + i));
}
/* da, db (n) += dout */
template <class T> __global__ void k_residual_backward(T *da, T *db, const T *dout, size_t n) {
    CU_GRID_STRIDE(i, n) {
        float d = cu_load(dout + i);
        cu_store(da + i, cu_load(da + i) + d);
        cu_store(db + i, cu_load(db + i) + d);
    }
}

/* ---------------------------------------------------------------- gelu */

/* gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = k (x + 0.044715 x^3) */
template <class T> __global__ void k_gelu_forward(T *out, const T *inp, size_t n) {
    CU_GRID_STRIDE(i, n) {
        float x = cu_load(inp + i), u = CU_GELU_K * (x + 0.044715f * x * x * x);
        cu_store(out + i, x / (1.0f + cu_exp_clamped(-2.0f * u)));
    }
}
/* dinp (n) += dout * gelu'(inp) */
template <class T> __global__ void k_gelu_backward(T *dinp, const T *inp, const T *dout, size_t n) {
    CU_GRID_STRIDE(i, n) {
        float x = cu_load(inp + i), u = CU_GELU_K * (x + 0.044715f * x * x * x);
        float e = cu_exp_clamped(-2.0f * u), s = 1.0f / (1.0f + e); /* s = 0.5 (1 + tanh u) */
        float one_minus_s = e * s;                         /* e / (1 + e), no cancellation */
        float du = CU_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        cu_store(dinp + i, cu_load(dinp + i) + cu_load(dout + i) * (s + x * 2.0f * s * one_minus_s * du));
    }
}

/* ---------------------------------------------------------------- swiglu */

/* inp (N, 2F) packed [gate | up] per row; out (N, F) = silu(gate) * up */
template <class T> __global__ void k_swiglu_forward(T *out, const T *inp, int N, int F) {
    CU_GRID_STRIDE(i, (size_t)N * F) {
        size_t n = i / F, f = i - n * F;
        const T *g = inp + n * 2 * F + f;
        float gv = cu_load(g);
        cu_store(out + i, gv / (1.0f + cu_exp_clamped(-gv)) * cu_load(g + F));
    }
}
/* dinp (N, 2F) += */
template <class T> __global__ void k_swiglu_backward(T *dinp, const T *inp, const T *dout, int N, int F) {
    CU_GRID_STRIDE(i, (size_t)N * F) {
        size_t n = i / F, f = i - n * F, o = n * 2 * F + f;
        float g = cu_load(inp + o), u = cu_load(inp + o + F), d = cu_load(dout + i);
        float e = cu_exp_clamped(-g), s = 1.0f / (1.0f + e), one_minus_s = e * s;
        cu_store(dinp + o, cu_load(dinp + o) + d * u * s * (1.0f + g * one_minus_s));
        cu_store(dinp + o + F, cu_load(dinp + o + F) + d * g * s);
    }
}

/* ---------------------------------------------------------------- bf16 rounding */

/* dst (n bf16) = src (n, fp32 in the backend) rounded to nearest even (st_convert's rounding) */
template <class T> __global__ void k_to_bf16(__nv_bfloat16 *dst, const T *src, size_t n) {
    CU_GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(cu_load(src + i));
}

/* dst (n, fp32 or bf16 storage in the backend) = src (n bf16) widened: exact */
template <class T> __global__ void k_from_bf16(T *dst, const __nv_bfloat16 *src, size_t n) {
    CU_GRID_STRIDE(i, n) cu_store(dst + i, __bfloat162float(src[i]));
}

/* y[n ldy + i] += alpha x[n ldx + i] for n < N, i < W (LoRA's low-rank term into columns of a
 * packed projection's output, and its gradient back out) */
template <class T> __global__ void k_axpy_rows(T *y, int ldy, const T *x, int ldx, float alpha, int N, int W) {
    size_t total = (size_t)N * (size_t)W;
    CU_GRID_STRIDE(k, total) {
        size_t n = k / (size_t)W, i = k % (size_t)W;
        T *yp = y + n * (size_t)ldy + i;
        cu_store(yp, cu_load(yp) + alpha * cu_load(x + n * (size_t)ldx + i));
    }
}

/* ---------------------------------------------------------------- launchers (host) */

template <class T> void cu_axpy_rows(T *y, int ldy, const T *x, int ldx, float alpha, int N, int W, cudaStream_t s) {
    size_t n = (size_t)N * (size_t)W;
    if (!n) return;
    ST_CUDA_LAUNCH(k_axpy_rows<T>, st_cuda_grid(n, CU_EW_BLOCK), CU_EW_BLOCK, 0, s, y, ldy, x, ldx, alpha, N, W);
}
template <class T> void cu_residual_forward(T *out, const T *a, const T *b, size_t n, cudaStream_t s) {
    ST_CUDA_LAUNCH(k_residual_forward<T>, st_cuda_grid(n, CU_EW_BLOCK), CU_EW_BLOCK, 0, s, out, a, b, n);
}
template <class T> void cu_residual_backward(T *da, T *db, const T *dout, size_t n, cudaStream_t s) {
    ST_CUDA_LAUNCH(k_residual_backward<T>, st_cuda_grid(n, CU_EW_BLOCK), CU_EW_BLOCK, 0, s, da, db, dout, n);
}
template <class T> void cu_gelu_forward(T *out, const T *inp, size_t n, cudaStream_t s) {
    ST_CUDA_LAUNCH(k_gelu_forward<T>, st_cuda_grid(n, CU_EW_BLOCK), CU_EW_BLOCK, 0, s, out, inp, n);
}
template <class T> void cu_gelu_backward(T *dinp, const T *inp, const T *dout, size_t n, cudaStream_t s) {
    ST_CUDA_LAUNCH(k_gelu_backward<T>, st_cuda_grid(n, CU_EW_BLOCK), CU_EW_BLOCK, 0, s, dinp, inp, dout, n);
}
template <class T> void cu_swiglu_forward(T *out, const T *inp, int N, int F, cudaStream_t s) {
    ST_CUDA_LAUNCH(k_swiglu_forward<T>, st_cuda_grid((size_t)N * F, CU_EW_BLOCK), CU_EW_BLOCK, 0, s, out, inp, N,
                   F);
}
template <class T> void cu_swiglu_backward(T *dinp, const T *inp, const T *dout, int N, int F, cudaStream_t s) {
    ST_CUDA_LAUNCH(k_swiglu_backward<T>, st_cuda_grid((size_t)N * F, CU_EW_BLOCK), CU_EW_BLOCK, 0, s, dinp, inp,
                   dout, N, F);
}
template <class T> void cu_to_bf16(__nv_bfloat16 *dst, const T *src, size_t n, cudaStream_t s) {
    ST_CUDA_LAUNCH(k_to_bf16<T>, st_cuda_grid(n, CU_EW_BLOCK), CU_EW_BLOCK, 0, s, dst, src, n);
}
template <class T> void cu_from_bf16(T *dst, const __nv_bfloat16 *src, size_t n, cudaStream_t s) {
    if (!n) return;
    ST_CUDA_LAUNCH(k_from_bf16<T>, st_cuda_grid(n, CU_EW_BLOCK), CU_EW_BLOCK, 0, s, dst, src, n);
}

#endif
