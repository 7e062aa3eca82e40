/* backend_cpu_llama.c - CPU kernels of the Llama-family ops: embedding without positions,
 * RMSNorm (per token and per head), rotary embedding, SwiGLU, grouped-query attention.
 *
 * The same rules as backend_cpu.c: matrix products through sgemm, elementwise loops in
 * OpenMP compiled for several ISAs, and every reduction over rows (dw of RMSNorm, dwte,
 * dk/dv shared by a group of query heads) summed by one thread in a fixed order, so a
 * step does not depend on thread timing.
 */
#include "backend/cpu/backend_cpu_llama.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/fastmath.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ST_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ST_CLONES
#endif

/* ---------------------------------------------------------------- embedding */

void cpu_embedding_forward(st_backend *be, float *out, const int32_t *inp, const float *wte, int B, int T, int C) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++)
        memcpy(out + (size_t)bt * C, wte + (size_t)inp[bt] * C, sizeof(float) * (size_t)C);
}

void cpu_embedding_backward(st_backend *be, float *dwte, const float *dout, const int32_t *inp, int B, int T,
                            int C) {
    (void)be;
    /* columns per thread: a repeated token is summed by one thread in row order */
#pragma omp parallel
    {
        int nth = omp_get_num_threads(), th = omp_get_thread_num();
        int c0 = (int)((long)C * th / nth), c1 = (int)((long)C * (th + 1) / nth);
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = dout + (size_t)bt * C;
            float *te = dwte + (size_t)inp[bt] * C;
            for (int c = c0; c < c1; c++) te[c] += d[c];
        }
    }
}

/* ---------------------------------------------------------------- rmsnorm */

ST_CLONES
void cpu_rmsnorm_forward(st_backend *be, float *out, float *rstd, const float *inp, const float *w, int N, int H,
                         int hs, int ld, float eps) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            size_t o = (size_t)n * ld + (size_t)h * hs;
            const float *x = inp + o;
            float ss = 0;
            for (int i = 0; i < hs; i++) ss += x[i] * x[i];
            float r = 1.0f / sqrtf(ss / hs + eps);
            float *y = out + o;
            for (int i = 0; i < hs; i++) y[i] = x[i] * r * w[i];
            rstd[(size_t)n * H + h] = r;
        }
}

ST_CLONES
void cpu_rmsnorm_backward(st_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                          const float *w, const float *rstd, int N, int H, int hs, int ld) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            size_t o = (size_t)n * ld + (size_t)h * hs;
            const float *x = inp + o, *d = dout + o;
            float r = rstd[(size_t)n * H + h], gx = 0;
            for (int i = 0; i < hs; i++) gx += d[i] * w[i] * x[i];
            float k = r * r * r * gx / hs;
            float *dx = dinp + o;
            for (int i = 0; i < hs; i++) dx[i] += r * d[i] * w[i] - k * x[i];
        }
    /* dw: columns per thread, rows (and groups) summed in order */
#pragma omp parallel
    {
        int nth = omp_get_num_threads(), th = omp_get_thread_num();
        int c0 = (int)((long)hs * th / nth), c1 = (int)((long)hs * (th + 1) / nth);
        for (int n = 0; n < N; n++)
            for (int h = 0; h < H; h++) {
                size_t o = (size_t)n * ld + (size_t)h * hs;
                float r = rstd[(size_t)n * H + h];
                for (int c = c0; c < c1; c++) dw[c] += dout[o + c] * inp[o + c] * r;
            }
    }
}

/* ---------------------------------------------------------------- rope */

ST_CLONES
static void rope_rows(float *x, const float *cos, const float *sin, int B, int T, int H, int hs, int ld,
                      float sign) {
    int half = hs / 2;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T;
        const float *c = cos + (size_t)t * half, *s = sin + (size_t)t * half;
        for (int h = 0; h < H; h++) {
            float *p = x + (size_t)bt * ld + (size_t)h * hs;
            for (int i = 0; i < half; i++) {
                float x1 = p[i], x2 = p[i + half], si = sign * s[i];
                p[i] = x1 * c[i] - x2 * si;
                p[i + half] = x2 * c[i] + x1 * si;
            }
        }
    }
}

void cpu_rope_forward(st_backend *be, float *x, const float *cos, const float *sin, int B, int T, int H, int hs,
                      int ld) {
    (void)be;
    rope_rows(x, cos, sin, B, T, H, hs, ld, 1.0f);
}

void cpu_rope_backward(st_backend *be, float *dx, const float *cos, const float *sin, int B, int T, int H, int hs,
                       int ld) {
    (void)be;
    rope_rows(dx, cos, sin, B, T, H, hs, ld, -1.0f); /* the inverse (transposed) rotation */
}

/* ---------------------------------------------------------------- swiglu */

ST_CLONES
void cpu_swiglu_forward(st_backend *be, float *out, const float *inp, int N, int F) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F;
        float *o = out + (size_t)n * F;
        for (int i = 0; i < F; i++) o[i] = g[i] / (1.0f + st_fast_expf(-g[i])) * u[i];
    }
}

ST_CLONES
void cpu_swiglu_backward(st_backend *be, float *dinp, const float *inp, const float *dout, int N, int F) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F, *d = dout + (size_t)n * F;
        float *dg = dinp + (size_t)n * 2 * F, *du = dg + F;
        for (int i = 0; i < F; i++) {
            float e = st_fast_expf(-g[i]), s = 1.0f / (1.0f + e);
            float one_minus_s = e * s; /* e/(1+e), no cancellation in 1 - s */
            dg[i] += d[i] * u[i] * s * (1.0f + g[i] * one_minus_s);
            du[i] += d[i] * g[i] * s;
        }
    }
}

/* ---------------------------------------------------------------- grouped-query attention
 * The blocking of backend_cpu.c's attention: per (batch, query head), queries in blocks of
 * GQA_BQ rows against the keys at or before the block's last row, scores in per-thread
 * scratch (GQA_BQ x T), nothing T x T kept; backward recomputes P from q, k and lse.
 * In backward, the query heads of a group all add into one key/value head. When there are
 * enough (batch, kv head) units for the threads, one thread runs a whole group in head
 * order; otherwise each query head accumulates into its own (T, hs) scratch and a second
 * pass sums the group's scratches in head order. Either way the result does not depend
 * on which thread ran what. */

#define GQA_BQ 64

ST_CLONES
static void gqa_softmax_block(float *S, float *lse_out, int r0, int nr, int nk, int k0) {
    for (int r = 0; r < nr; r++) {
        int t = r0 + r, valid = t + 1 - k0; /* keys k0..t */
        float *s = S + (size_t)r * nk;
        float mx = -INFINITY;
        for (int j = 0; j < valid; j++) mx = s[j] > mx ? s[j] : mx;
        float sum = 0;
        for (int j = 0; j < valid; j++) { s[j] = st_fast_expf(s[j] - mx); sum += s[j]; }
        float inv = 1.0f / sum;
        for (int j = 0; j < valid; j++) s[j] *= inv;
        for (int j = valid; j < nk; j++) s[j] = 0.0f;
        lse_out[t] = mx + logf(sum);
    }
}

static void gqa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                        const int32_t *doc_start, int ld, int B, int T, int NH, int NKV, int hs) {
    int G = NH / NKV, C = NH * hs;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
    {
        float *S = malloc(sizeof(float) * GQA_BQ * (size_t)T);
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            size_t row0 = (size_t)b * T * ld;
            const float *qh = q + row0 + (size_t)h * hs, *kh = k + row0 + (size_t)(h / G) * hs;
            const float *vh = v + row0 + (size_t)(h / G) * hs;
            const int32_t *ds = doc_start ? doc_start + (size_t)b * T : NULL;
            float *o = out + (size_t)b * T * C + (size_t)h * hs, *l = lse + (size_t)bh * T;
            for (int r0 = 0, r1; r0 < T; r0 = r1) {
                int k0 = cpu_att_doc_block(ds, r0, T, GQA_BQ, &r1), nr = r1 - r0, nk = r1 - k0;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nk, hs, scale, qh + (size_t)r0 * ld, ld,
                            kh + (size_t)k0 * ld, ld, 0.0f, S, nk);
                gqa_softmax_block(S, l, r0, nr, nk, k0);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, nk, 1.0f, S, nk, vh + (size_t)k0 * ld,
                            ld, 0.0f, o + (size_t)r0 * C, C);
            }
        }
        free(S);
    }
}

void cpu_attention_gqa_forward(st_backend *be, float *out, float *lse, const float *q, const float *k,
                               const float *v, int ld, int B, int T, int NH, int NKV, int hs) {
    (void)be;
    gqa_forward(out, lse, q, k, v, NULL, ld, B, T, NH, NKV, hs);
}

void cpu_attention_gqa_doc_forward(st_backend *be, float *out, float *lse, const float *q, const float *k,
                                   const float *v, const int32_t *doc_start, int ld, int B, int T, int NH, int NKV,
                                   int hs) {
    (void)be;
    gqa_forward(out, lse, q, k, v, doc_start, ld, B, T, NH, NKV, hs);
}

ST_CLONES
static void gqa_probs_and_dscores(float *P, float *dS, const float *dP, const float *delta, const float *lse, int r0,
                                  int nr, int nk, float scale, int k0) {
    /* on entry P and dS both hold scaled scores of keys k0..; on exit P = probabilities and
     * dS = P * (dP - delta) * scale, zero above the diagonal */
    for (int r = 0; r < nr; r++) {
        int t = r0 + r - k0; /* the last key's column */
        float *p = P + (size_t)r * nk, *ds = dS + (size_t)r * nk;
        const float *dp = dP + (size_t)r * nk;
        float l = lse[r0 + r], dl = delta[r];
        for (int j = 0; j <= t; j++) {
            float pj = st_fast_expf(p[j] - l);
            p[j] = pj;
            ds[j] = pj * (dp[j] - dl) * scale;
        }
        for (int j = t + 1; j < nk; j++) p[j] = ds[j] = 0.0f;
    }
}

/* One query head's share of the backward: dq (rows ld apart) +=, and its contribution to
 * dk, dv (rows ldkv apart: the shared kv head itself, or this head's scratch). S, G2, dP
 * are GQA_BQ x T scratch. ds: the row's doc_start (T ints) or NULL. */
static void gqa_head_backward(const float *qh, const float *kh, const float *vh, int ld, const float *o,
                              const float *dO, int C, const float *l, float *dqh, float *dkh, float *dvh, int ldkv,
                              const int32_t *ds, int T, int hs, float scale, float *S, float *G2, float *dP) {
    float delta[GQA_BQ];
    for (int r0 = 0, r1; r0 < T; r0 = r1) {
        int k0 = cpu_att_doc_block(ds, r0, T, GQA_BQ, &r1), nr = r1 - r0, nk = r1 - k0;
        const float *kb = kh + (size_t)k0 * ld, *vb = vh + (size_t)k0 * ld;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nk, hs, scale, qh + (size_t)r0 * ld, ld, kb, ld, 0.0f,
                    S, nk);
        memcpy(G2, S, sizeof(float) * (size_t)nr * nk);
        /* dP = dO V^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nk, hs, 1.0f, dO + (size_t)r0 * C, C, vb, ld, 0.0f, dP,
                    nk);
        for (int r = 0; r < nr; r++) {
            const float *a = dO + (size_t)(r0 + r) * C, *bb = o + (size_t)(r0 + r) * C;
            float sum = 0;
            for (int d = 0; d < hs; d++) sum += a[d] * bb[d];
            delta[r] = sum;
        }
        gqa_probs_and_dscores(S, G2, dP, delta, l, r0, nr, nk, scale, k0);
        /* dV[k0:r1] += P^T dO; dQ[r0:r1] += dS K; dK[k0:r1] += dS^T Q */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nr, 1.0f, S, nk, dO + (size_t)r0 * C, C, 1.0f,
                    dvh + (size_t)k0 * ldkv, ldkv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, nk, 1.0f, G2, nk, kb, ld, 1.0f,
                    dqh + (size_t)r0 * ld, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nr, 1.0f, G2, nk, qh + (size_t)r0 * ld, ld, 1.0f,
                    dkh + (size_t)k0 * ldkv, ldkv);
    }
}

static void gqa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, const float *out, const float *lse, const int32_t *doc_start, int ld, int B,
                         int T, int NH, int NKV, int hs) {
    int G = NH / NKV, C = NH * hs, nth = omp_get_max_threads();
    float scale = 1.0f / sqrtf((float)hs);
    /* Work units: one per (batch, kv head) when those alone keep every thread busy (each
     * unit runs its group's query heads in order straight into dk, dv); otherwise one per
     * (batch, query head), with per-head dk, dv scratch summed afterwards in head order.
     * Either way the sums are in a fixed order for a given thread count. */
    int per_group = G == 1 || (B * NKV) % nth == 0 || B * NKV >= 4 * nth;
    float *scr = NULL;
    if (!per_group) {
        scr = calloc((size_t)2 * B * NH * T * hs, sizeof(float));
        if (!scr) {
            /* The ops return void: poison the outputs so no caller trains on a silent skip. */
            for (size_t r = 0; r < (size_t)B * T; r++)
                for (int i = 0; i < NKV * hs; i++) dk[r * ld + i] = dv[r * ld + i] = NAN;
            return;
        }
    }
    int units = per_group ? B * NKV : B * NH;
#pragma omp parallel
    {
        float *S = malloc(sizeof(float) * GQA_BQ * (size_t)T);
        float *G2 = malloc(sizeof(float) * GQA_BQ * (size_t)T);
        float *dP = malloc(sizeof(float) * GQA_BQ * (size_t)T);
#pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < units; u++) {
            int b = per_group ? u / NKV : u / NH;
            int h0 = per_group ? (u % NKV) * G : u % NH, h1 = per_group ? h0 + G : h0 + 1;
            for (int h = h0; h < h1; h++) {
                size_t row0 = (size_t)b * T * ld, qo = row0 + (size_t)h * hs, kvo = row0 + (size_t)(h / G) * hs;
                size_t bh = (size_t)b * NH + h;
                float *dkh = scr ? scr + bh * T * hs : dk + kvo;
                float *dvh = scr ? scr + ((size_t)B * NH + bh) * T * hs : dv + kvo;
                gqa_head_backward(q + qo, k + kvo, v + kvo, ld, out + (size_t)b * T * C + (size_t)h * hs,
                                  dout + (size_t)b * T * C + (size_t)h * hs, C, lse + bh * T, dq + qo, dkh, dvh,
                                  scr ? hs : ld, doc_start ? doc_start + (size_t)b * T : NULL, T, hs, scale, S,
                                  G2, dP);
            }
        }
        free(S);
        free(G2);
        free(dP);
    }
    if (scr) {
        /* sum each group's scratches into its kv head, query heads in order */
#pragma omp parallel for schedule(static)
        for (int bt = 0; bt < B * T; bt++) {
            int b = bt / T, t = bt % T;
            for (int kv = 0; kv < NKV; kv++) {
                float *dkr = dk + (size_t)bt * ld + (size_t)kv * hs, *dvr = dv + (size_t)bt * ld + (size_t)kv * hs;
                for (int g = 0; g < G; g++) {
                    size_t bh = (size_t)b * NH + (size_t)kv * G + g;
                    const float *sk = scr + (bh * T + t) * hs, *sv = scr + (((size_t)B * NH + bh) * T + t) * hs;
                    for (int d = 0; d < hs; d++) {
                        dkr[d] += sk[d];
                        dvr[d] += sv[d];
                    }
                }
            }
        }
        free(scr);
    }
}

void cpu_attention_gqa_backward(st_backend *be, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                const float *k, const float *v, const float *out, const float *lse, int ld, int B,
                                int T, int NH, int NKV, int hs) {
    (void)be;
    gqa_backward(dq, dk, dv, dout, q, k, v, out, lse, NULL, ld, B, T, NH, NKV, hs);
}

void cpu_attention_gqa_doc_backward(st_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v, const float *out,
                                    const float *lse, const int32_t *doc_start, int ld, int B, int T, int NH,
                                    int NKV, int hs) {
    (void)be;
    gqa_backward(dq, dk, dv, dout, q, k, v, out, lse, doc_start, ld, B, T, NH, NKV, hs);
}
