/* ops_ref.h - plain double-precision reference of every backend op (the test oracle).
 *
 * Each function mirrors one entry of st_backend_ops (include/strata/backend.h) with the
 * same argument order and the same write vs accumulate (+=) semantics, but in double
 * and in the simplest loops that could be right. The finite-difference test checks the
 * backward functions against the forward ones; the differential test checks the fast
 * backends against these. Names: B batch, T time, C channels, OC output channels,
 * V vocabulary, NH heads, hs = C/NH, N = B*T rows.
 */
#ifndef STRATA_OPS_REF_H
#define STRATA_OPS_REF_H

#include <stdint.h>

#include "strata/backend.h"

#define REF_LAYERNORM_EPS 1e-5

/* out (B,T,C) = wte[inp] + wpe[t]; inp (B,T) token ids in [0, V). writes out. */
void ref_encoder_forward(double *out, const int32_t *inp, const double *wte, const double *wpe, int B,
                         int T, int C);
/* dwte (V,C) +=, dwpe (T,C) += */
void ref_encoder_backward(double *dwte, double *dwpe, const double *dout, const int32_t *inp, int B,
                          int T, int C);

/* out (N,C), mean (N), rstd (N): all written. */
void ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp, const double *w,
                           const double *b, int N, int C);
/* dinp (N,C) +=, dw (C) +=, db (C) += */
void ref_layernorm_backward(double *dinp, double *dw, double *db, const double *dout, const double *inp,
                            const double *w, const double *mean, const double *rstd, int N, int C);

/* out (N,OC) = inp (N,C) x w [+ bias (OC), may be NULL]; w is (C,OC) for ST_W_IN_OUT,
 * (OC,C) for ST_W_OUT_IN. writes out. */
void ref_matmul_forward(double *out, const double *inp, const double *w, const double *bias, int N, int C,
                        int OC, st_wlayout layout);
/* dinp (N,C) +=, dw (layout of w) +=, dbias (OC) +=; any of them may be NULL. */
void ref_matmul_backward(double *dinp, double *dw, double *dbias, const double *dout, const double *inp,
                         const double *w, int N, int C, int OC, st_wlayout layout);

/* qkv (B,T,3C) packed [q | k | v] per token, head h at [h*hs, (h+1)*hs) of each part.
 * writes out (B,T,C) and lse (B,NH,T). Causal, scale 1/sqrt(hs). */
void ref_attention_forward(double *out, double *lse, const double *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) +=. Uses only qkv, out, lse, dout, as the fast backends must. */
void ref_attention_backward(double *dqkv, const double *dout, const double *qkv, const double *out,
                            const double *lse, int B, int T, int C, int NH);

/* The same restricted to documents: doc_start (B,T) as in st_backend_ops, NULL = all 0. */
void ref_attention_doc_forward(double *out, double *lse, const double *qkv, const int32_t *doc_start, int B, int T,
                               int C, int NH);
void ref_attention_doc_backward(double *dqkv, const double *dout, const double *qkv, const double *out,
                                const double *lse, const int32_t *doc_start, int B, int T, int C, int NH);

/* out (n) = gelu_tanh(inp), writes. dinp (n) += gelu'(inp) * dout. */
void ref_gelu_forward(double *out, const double *inp, int n);
void ref_gelu_backward(double *dinp, const double *inp, const double *dout, int n);

/* out (n) = a + b, writes. da += dout, db += dout. */
void ref_residual_forward(double *out, const double *a, const double *b, int n);
void ref_residual_backward(double *da, double *db, const double *dout, int n);

/* logits (N,V), losses (N) written, targets (N) in [0,V) or < 0 for masked rows (loss 0).
 * If dloss != 0, logits are overwritten with (softmax - onehot(target)) * dloss, and
 * with 0 on masked rows. */
void ref_crossentropy_forward_backward(double *logits, double *losses, const int32_t *targets, int N, int V,
                                       double dloss);

/* ---- Llama family (ops_ref_llama.c). NKV key/value heads, hs head size, F MLP (feed-forward) width,
 * ld the row stride of a packed buffer. Same semantics as the vtable entries. */

/* out (B,T,C) = wte[inp], writes. dwte (V,C) +=. */
void ref_embedding_forward(double *out, const int32_t *inp, const double *wte, int B, int T, int C);
void ref_embedding_backward(double *dwte, const double *dout, const int32_t *inp, int B, int T, int C);

/* Groups of hs at inp + n*ld + h*hs (n < N, h < H): out = x / sqrt(mean(x^2) + eps) * w.
 * writes out (those elements only) and rstd (N,H). dinp (inp's layout) +=, dw (hs) +=. */
void ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *w, int N, int H, int hs,
                         int ld, double eps);
void ref_rmsnorm_backward(double *dinp, double *dw, const double *dout, const double *inp, const double *w,
                          const double *rstd, int N, int H, int hs, int ld);

/* Rotary embedding in place on H heads of hs per row (rows (B,T), stride ld), rotate_half
 * convention, cos/sin (>=T, hs/2). Backward rotates dx in place by the inverse angle. */
void ref_rope_forward(double *x, const double *cos, const double *sin, int B, int T, int H, int hs, int ld);
void ref_rope_backward(double *dx, const double *cos, const double *sin, int B, int T, int H, int hs, int ld);

/* The rotary tables for positions 0..T-1: cos, sin (T, hs/2) of t * inv_freq[i], with
 * inv_freq[i] = theta^(-2i/hs), optionally rescaled as Llama 3 does (llama3 != 0:
 * factor, low_freq_factor, high_freq_factor, original_max_position_embeddings). */
void ref_rope_tables(double *cos, double *sin, int T, int hs, double theta, int llama3, double factor,
                     double low_freq_factor, double high_freq_factor, double original_max_pos);

/* inp (N,2F) = [gate | up]; out (N,F) = silu(gate) * up, writes. dinp (N,2F) +=. */
void ref_swiglu_forward(double *out, const double *inp, int N, int F);
void ref_swiglu_backward(double *dinp, const double *inp, const double *dout, int N, int F);

/* Causal GQA: q (B,T,NH heads), k, v (B,T,NKV heads), rows ld apart; head h uses kv head
 * h / (NH/NKV). writes out (B,T,NH*hs), lse (B,NH,T). Backward: dq, dk, dv +=. */
void ref_attention_gqa_forward(double *out, double *lse, const double *q, const double *k, const double *v,
                               int ld, int B, int T, int NH, int NKV, int hs);
void ref_attention_gqa_backward(double *dq, double *dk, double *dv, const double *dout, const double *q,
                                const double *k, const double *v, const double *out, const double *lse,
                                int ld, int B, int T, int NH, int NKV, int hs);
/* The same restricted to documents: doc_start (B,T) as in st_backend_ops, NULL = all 0. */
void ref_attention_gqa_doc_forward(double *out, double *lse, const double *q, const double *k, const double *v,
                                   const int32_t *doc_start, int ld, int B, int T, int NH, int NKV, int hs);
void ref_attention_gqa_doc_backward(double *dq, double *dk, double *dv, const double *dout, const double *q,
                                    const double *k, const double *v, const double *out, const double *lse,
                                    const int32_t *doc_start, int ld, int B, int T, int NH, int NKV, int hs);

/* ---- POET-X orthogonal block transforms (ops_ref_poetx.c). b block size, nb blocks, k
 * Neumann terms, d = nb*b, N rows; q (nb, b(b-1)/2) packed strict upper triangles, as in
 * st_backend_ops. */

/* G (nb,b,b) = (I + Q)(I + Q + ... + Q^k), from explicit powers of Q. writes. */
void ref_poet_cayley_forward(double *G, const double *q, int nb, int b, int k);
/* dq += packed(dQ), dQ = sum_m c_m sum_{a<m} (Q^T)^a dG (Q^T)^(m-1-a) over the polynomial's
 * coefficients c_m (1, 2, .., 2, 1). */
void ref_poet_cayley_backward(double *dq, const double *dG, const double *q, int nb, int b, int k);
/* y[perm[j*b+r]] = sum_c G_j[r][c] x[perm[j*b+c]] per row (G_j^T for trans); perm NULL is
 * the identity. writes y (N,d); y must not be x. */
void ref_poet_apply_forward(double *y, const double *x, const double *G, const int32_t *perm, int N, int d, int b,
                            int trans);
/* dx (N,d) +=, dG (nb,b,b) +=; either may be NULL. */
void ref_poet_apply_backward(double *dx, double *dG, const double *dy, const double *x, const double *G,
                             const int32_t *perm, int N, int d, int b, int trans);
/* The strict upper triangle's index of (i, j), i < j < b, in the packed layout. */
static inline long ref_poet_tri_index(int b, int i, int j) { return (long)i * (2L * b - i - 1) / 2 + (j - i - 1); }

#endif
