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

void cpu_attention_gqa_doc_forward(st_backend *be, float *out, float *lse, const float *q, const float *k,
                                   const float *v, const int32_t *doc_start, int ld, int B, int T, int NH, int NKV,
                                   int hs);
void cpu_attention_gqa_doc_backward(st_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v, const float *out,
                                    const float *lse, const int32_t *doc_start, int ld, int B, int T, int NH,
                                    int NKV, int hs);

/* The attention kernels' query blocks (both files): the block that starts at row r0 of a
 * T-row sequence ends at *r1, after at most bq rows and before doc_start changes, and
 * meets the keys from the returned k0 (its document's start) to r1 - 1. ds: the row's
 * doc_start (T ints), or NULL for plain causal attention (k0 = 0, fixed-size blocks). */
static inline int cpu_att_doc_block(const int32_t *ds, int r0, int T, int bq, int *r1) {
    int end = T - r0 < bq ? T : r0 + bq;
    if (!ds) {
        *r1 = end;
        return 0;
    }
    int k0 = ds[r0], r = r0 + 1;
    while (r < end && ds[r] == k0) r++;
    *r1 = r;
    return k0;
}

#endif
