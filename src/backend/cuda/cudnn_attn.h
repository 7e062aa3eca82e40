/* cudnn_attn.h - the CUDA backend's causal attention through cuDNN's fused scaled-dot-product
 * attention (cudnn_attn.cu), for backend_cuda.cu: bf16 tensors, fp32 statistics, grouped
 * KV heads, built where CMake found cudnn.h (STRATA_HAVE_CUDNN) and loaded with dlopen at
 * the first call, so that a strata without libcudnn on the machine still starts. Every
 * entry returns 0 when cuDNN ran, else nonzero with the reason in why: the caller then
 * runs its own kernels (kernels_attn.cuh), which stay the reference. Internal to
 * src/backend/cuda; not compiled into the emulated tests. */
#ifndef STRATA_CUDNN_ATTN_H
#define STRATA_CUDNN_ATTN_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

struct CuSdpa;

/* The library's version (e.g. 91900) once cu_sdpa_open succeeded, else 0. */
int cu_sdpa_version(const CuSdpa *s);
/* libcudnn loaded, a handle made on stream st; NULL with why filled when either fails */
CuSdpa *cu_sdpa_open(cudaStream_t st, char *why, size_t why_n);
void cu_sdpa_close(CuSdpa *s);

/* The backend's attention semantics (kernels_attn.cuh, without documents): q, k, v fp32 rows
 * ld apart, head h of row (b,t) at q + (b T + t) ld + h hs, kv head h / (NH / NKV); out
 * (B,T,NH hs) fp32 written, lse (B,NH,T) written (natural-log sum of exp of the scaled
 * scores); the backward adds to dq, dk, dv. q, k, v, out, dout are rounded to bf16 for
 * cuDNN (its scores, softmax and statistics are fp32), out and the gradients come back as
 * fp32. Scratch comes from the stream's memory pool (cudaMallocAsync), outside the arena. */
int cu_sdpa_forward(CuSdpa *s, float *out, float *lse, const float *q, const float *k, const float *v, int ld, int B,
                    int T, int NH, int NKV, int hs, char *why, size_t why_n);
int cu_sdpa_backward(CuSdpa *s, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                     const float *v, const float *out, const float *lse, int ld, int B, int T, int NH, int NKV, int hs,
                     char *why, size_t why_n);

/* The forward and backward graphs' nodes (tensors and operations, every descriptor
 * finalized) for one shape, built without a handle, so without a GPU: the check that the
 * graphs are well formed for this libcudnn (test_cuda_cudnn). 0 with nodes[0], nodes[1]
 * the operations of each; -1 where libcudnn cannot be loaded; 1 where a node is refused;
 * why says which and why. */
int cu_sdpa_selfcheck(int B, int T, int NH, int NKV, int hs, int *nodes, char *why, size_t why_n);

#endif
