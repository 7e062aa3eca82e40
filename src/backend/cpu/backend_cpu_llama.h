/* backend_cpu_llama.h - the CPU backend's Llama-family ops (backend_cpu_llama.c), which
 * backend_cpu.c puts into its vtable. Semantics and shapes: include/strata/backend.h. */
#ifndef STRATA_BACKEND_CPU_LLAMA_H
#define STRATA_BACKEND_CPU_LLAMA_H

#include "strata/backend.h"

void cpu_embedding_forward(st_backend *be, float *out, const int32_t *inp, const float *wte, int B, int T, int C);
void cpu_embedding_backward(st_backend *be, float *dwte, const float *dout, const int32_t *inp, int B, int T, int C);
void cpu_rmsnorm_forward(st_backend *be, float *out, float *rstd, const float *inp, const float *w, int N, int H,
                         int hs, int ld, float eps);
void cpu_rmsnorm_backward(st_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                          const float *w, const float *rstd, int N, int H, int hs, int ld);
void cpu_rope_forward(st_backend *be, float *x, const float *cos, const float *sin, int B, int T, int H, int hs,
                      int ld);
void cpu_rope_backward(st_backend *be, float *dx, const float *cos, const float *sin, int B, int T, int H, int hs,
                       int ld);
void cpu_swiglu_forward(st_backend *be, float *out, const float *inp, int N, int F);
void cpu_swiglu_backward(st_backend *be, float *dinp, const float *inp, const float *dout, int N, int F);
void cpu_attention_gqa_forward(st_backend *be, float *out, float *lse, const float *q, const float *k,
                               const float *v, int ld, int B, int T, int NH, int NKV, int hs);
void cpu_attention_gqa_backward(st_backend *be, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                const float *k, const float *v, const float *out, const float *lse, int ld, int B,
                                int T, int NH, int NKV, int hs);

#endif
