/* backend_cpu.c - the CPU backend: matrix products through OpenBLAS sgemm (or, under
 * matmul bf16, oneDNN over bf16 operands: matmul_bf16.c), everything else in OpenMP loops
 * the compiler vectorises.
 *
 * Determinism: every reduction over rows (parameter gradients of layernorm, bias,
 * embeddings) is parallelised over columns, so each output element is summed by one
 * thread in a fixed order; results do not depend on thread timing. That is what makes
 * resume bit-exact.
 *
 * Hot elementwise loops are compiled for AVX-512, AVX2 and baseline x86-64 with
 * target_clones; the loader picks the best for the machine.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cpu_chunk.h"
#include "backend/cpu/backend_cpu_llama.h"
#include "backend/cpu/backend_cpu_poetx.h"
#include "backend/cpu/fastmath.h"
#include "backend/cpu/matmul_bf16.h"
#include "strata/backend.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ST_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ST_CLONES
#endif

typedef struct cpu_ctx {
    int threads;
    st_matmul_mode matmul; /* ST_MATMUL_FP32 (sgemm) or ST_MATMUL_BF16 (oneDNN, bf16 below) */
    cpu_bf16 *bf16;        /* made by the first cpu_backend_set_matmul to bf16 */
    float *att_s, *att_dp; /* matmul bf16's attention: scores and their gradient (att16_*) */
    size_t att_cap;        /* floats in each */
    float *att_o;          /* O, or dQ, dK, dV, head-major, and delta (rowsum(dO o O)) */
    size_t o_cap;
    /* matmul bf16's weights already in bf16 (st_backend_bf16_weights_map): region r says
     * base[0, n) is rounded in copy[0, n); base NULL: region unused */
    struct { const float *base; const uint16_t *copy; size_t n; } w16[ST_BF16_WEIGHT_REGIONS];
} cpu_ctx;

/* ---------------------------------------------------------------- memory */

static void *cpu_alloc(st_backend *be, size_t bytes) { (void)be; return st_alloc(bytes); }
static void cpu_dealloc(st_backend *be, void *p) { (void)be; st_free(p); }
/* Large buffers (a step's gradients: 4 bytes a parameter) are cleared by every thread, a
 * slice each: one core's stores do not reach the memory's bandwidth. */
static void cpu_memset0(st_backend *be, void *p, size_t bytes) {
    (void)be;
    const size_t slice = (size_t)1 << 20;
    if (bytes < 4 * slice) {
        memset(p, 0, bytes);
        return;
    }
    long ns = (long)((bytes + slice - 1) / slice);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < ns; i++) {
        size_t o = (size_t)i * slice;
        memset((char *)p + o, 0, bytes - o < slice ? bytes - o : slice);
    }
}
static void cpu_copy(st_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
}
static void cpu_sync(st_backend *be) { (void)be; }

/* ---------------------------------------------------------------- encoder */

static void cpu_encoder_forward(st_backend *be, float *out, const int32_t *inp, const float *wte,
                                const float *wpe, int B, int T, int C) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float *te = wte + (size_t)inp[bt] * C, *pe = wpe + (size_t)(bt % T) * C;
        float *o = out + (size_t)bt * C;
        for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
    }
}

static void cpu_encoder_backward(st_backend *be, float *dwte, float *dwpe, const float *dout,
                                 const int32_t *inp, int B, int T, int C) {
    (void)be;
    /* Columns are split across threads: a token id repeated in the batch is then summed
     * by one thread in row order, with no race and no timing dependence. */
#pragma omp parallel
    {
        int nth = omp_get_num_threads(), th = omp_get_thread_num();
        int c0 = (int)((long)C * th / nth), c1 = (int)((long)C * (th + 1) / nth);
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = dout + (size_t)bt * C;
            float *te = dwte + (size_t)inp[bt] * C, *pe = dwpe + (size_t)(bt % T) * C;
            for (int c = c0; c < c1; c++) {
                te[c] += d[c];
                pe[c] += d[c];
            }
        }
    }
}

/* ---------------------------------------------------------------- layernorm */

ST_CLONES
static void cpu_layernorm_forward(st_backend *be, float *out, float *mean, float *rstd, const float *inp,
                                  const float *w, const float *b, int N, int C) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float m = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float v = 0;
        for (int c = 0; c < C; c++) { float d = x[c] - m; v += d * d; }
        v /= C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

ST_CLONES
static void cpu_layernorm_backward(st_backend *be, float *dinp, float *dw, float *db, const float *dout,
                                   const float *inp, const float *w, const float *mean, const float *rstd,
                                   int N, int C) {
    (void)be;
    /* one parallel region: the rows' input gradients, then (no barrier: the columns read
     * only dout, inp and the statistics) the parameter gradients by columns */
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * C, *x = inp + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            float dnorm_mean = 0, dnorm_norm_mean = 0;
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s, dn = w[c] * d[c];
                dnorm_mean += dn;
                dnorm_norm_mean += dn * norm;
            }
            dnorm_mean /= C;
            dnorm_norm_mean /= C;
            float *di = dinp + (size_t)i * C;
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s, dn = w[c] * d[c];
                di[c] += (dn - dnorm_mean - norm * dnorm_norm_mean) * s;
            }
        }
        /* parameter gradients: columns per thread, rows summed in order */
        int nth = omp_get_num_threads(), th = omp_get_thread_num();
        int c0 = (int)((long)C * th / nth), c1 = (int)((long)C * (th + 1) / nth);
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * C, *x = inp + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            for (int c = c0; c < c1; c++) {
                dw[c] += (x[c] - m) * s * d[c];
                db[c] += d[c];
            }
        }
    }
}

/* ---------------------------------------------------------------- matmul */

/* matmul bf16: the operands rounded to bf16 once per call, except a weight that lies wholly
 * inside a region the caller mapped to its bf16 copy (st_backend_bf16_weights_map: the
 * executor's copy, written by the optimizer's pass), read from there; products summed in
 * fp32 by oneDNN. A failure inside oneDNN (it cannot happen for a shape it made once) is
 * logged once and that call computes with sgemm, so a result is always written. */
static int bf16_failed(st_status s, const st_err *e) {
    static int told;
    if (!s) return 0;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        st_log(1, "warning: %s; this call and any other that fails compute in fp32 (sgemm)\n", e->msg);
    return 1;
}

/* The weight w (n floats) in bf16: from a mapped copy where one holds it whole, else
 * rounded into scratch slot 1 (the same bits: the copy's rounding is st_f32_to_bf16's). */
static const uint16_t *w16_operand(cpu_ctx *x, const float *w, size_t n) {
    for (int r = 0; r < ST_BF16_WEIGHT_REGIONS; r++) {
        const float *b = x->w16[r].base;
        if (b && w >= b && n <= x->w16[r].n && (size_t)(w - b) <= x->w16[r].n - n) return x->w16[r].copy + (w - b);
    }
    return cpu_bf16_operand(x->bf16, 1, w, n);
}

int cpu_backend_bf16_weights_read(const st_backend *be) {
    const cpu_ctx *x = be->ctx;
    return x->matmul == ST_MATMUL_BF16 && x->bf16;
}

void cpu_backend_bf16_weights_map(st_backend *be, int region, const float *base, const uint16_t *copy, size_t n) {
    cpu_ctx *x = be->ctx;
    if (region < 0) {
        memset(x->w16, 0, sizeof x->w16);
        return;
    }
    if (region >= ST_BF16_WEIGHT_REGIONS) return;
    x->w16[region].base = copy ? base : NULL;
    x->w16[region].copy = copy;
    x->w16[region].n = copy ? n : 0;
}

void cpu_backend_bf16_weights_round(st_backend *be, uint16_t *dst, const float *src, size_t n) {
    cpu_ctx *x = be->ctx;
    if (x->bf16) {
        cpu_bf16_round_into(x->bf16, 1, dst, src, n);
        return;
    }
    cpu_bf16_round(dst, src, n);
}

static int bf16_matmul_forward(cpu_ctx *x, float *out, const float *inp, const float *w, const float *bias, int N,
                               int C, int OC, st_wlayout layout) {
    st_err e = {0};
    st_status s = ST_ERR_NOMEM;
    cpu_bf16_lock(x->bf16);
    const uint16_t *a = cpu_bf16_operand(x->bf16, 0, inp, (size_t)N * C);
    const uint16_t *b = a ? w16_operand(x, w, (size_t)C * OC) : NULL;
    if (b) s = cpu_bf16_gemm(x->bf16, 0, layout == ST_W_OUT_IN, N, OC, C, a, b, bias, 0, out, &e);
    else st_errf(&e, s, "matmul bf16: out of memory for the bf16 operands of %d x %d x %d", N, OC, C);
    cpu_bf16_unlock(x->bf16);
    return !bf16_failed(s, &e);
}

/* Sets *dinp and *dw to NULL as each product is done, so that sgemm does only what is left. */
static void bf16_matmul_backward(cpu_ctx *x, float **dinp, float **dw, const float *dout, const float *inp,
                                 const float *w, int N, int C, int OC, st_wlayout layout, int add_dinp) {
    st_err e = {0};
    st_status s = ST_OK;
    cpu_bf16_lock(x->bf16);
    const uint16_t *d = cpu_bf16_operand(x->bf16, 0, dout, (size_t)N * OC); /* shared by both products */
    if (!d) s = st_errf(&e, ST_ERR_NOMEM, "matmul bf16: out of memory for the bf16 operands");
    if (!s && *dinp) { /* dinp (N,C) (+)= dout (N,OC) x w^T */
        const uint16_t *b = w16_operand(x, w, (size_t)C * OC);
        s = b ? cpu_bf16_gemm(x->bf16, 0, layout == ST_W_IN_OUT, N, C, OC, d, b, NULL, add_dinp, *dinp, &e)
              : st_errf(&e, ST_ERR_NOMEM, "matmul bf16: out of memory for the bf16 operands");
        if (!s) *dinp = NULL;
    }
    if (!s && *dw) { /* IN_OUT: dw (C,OC) += inp^T dout; OUT_IN: dw (OC,C) += dout^T inp */
        const uint16_t *a = cpu_bf16_operand(x->bf16, 2, inp, (size_t)N * C);
        if (!a) s = st_errf(&e, ST_ERR_NOMEM, "matmul bf16: out of memory for the bf16 operands");
        else if (layout == ST_W_IN_OUT) s = cpu_bf16_gemm(x->bf16, 1, 0, C, OC, N, a, d, NULL, 1, *dw, &e);
        else s = cpu_bf16_gemm(x->bf16, 1, 0, OC, C, N, d, a, NULL, 1, *dw, &e);
        if (!s) *dw = NULL;
    }
    cpu_bf16_unlock(x->bf16);
    bf16_failed(s, &e);
}

static void cpu_matmul_forward(st_backend *be, float *out, const float *inp, const float *w, const float *bias,
                               int N, int C, int OC, st_wlayout layout) {
    cpu_ctx *x = be->ctx;
    if (x->matmul == ST_MATMUL_BF16 && bf16_matmul_forward(x, out, inp, w, bias, N, C, OC, layout)) return;
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) memcpy(out + (size_t)i * OC, bias, sizeof(float) * OC);
        beta = 1.0f;
    }
    if (layout == ST_W_IN_OUT)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, w, OC, beta, out, OC);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

/* dinp += (add_dinp) or = (matmul_backward_write) the product; dw, dbias += */
static void matmul_backward(cpu_ctx *x, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                            const float *w, int N, int C, int OC, st_wlayout layout, int add_dinp) {
    float beta = add_dinp ? 1.0f : 0.0f;
    if (x->matmul == ST_MATMUL_BF16 && (dinp || dw))
        bf16_matmul_backward(x, &dinp, &dw, dout, inp, w, N, C, OC, layout, add_dinp);
    if (layout == ST_W_IN_OUT) {
        if (dinp) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, w, OC, beta, dinp, C);
        if (dw) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dw, OC);
    } else {
        if (dinp) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, beta, dinp, C);
        if (dw) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    }
    if (dbias) {
#pragma omp parallel
        {
            int nth = omp_get_num_threads(), th = omp_get_thread_num();
            int o0 = (int)((long)OC * th / nth), o1 = (int)((long)OC * (th + 1) / nth);
            for (int i = 0; i < N; i++) {
                const float *d = dout + (size_t)i * OC;
                for (int o = o0; o < o1; o++) dbias[o] += d[o];
            }
        }
    }
}

static void cpu_matmul_backward(st_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                                const float *inp, const float *w, int N, int C, int OC, st_wlayout layout) {
    matmul_backward(be->ctx, dinp, dw, dbias, dout, inp, w, N, C, OC, layout, 1);
}

static void cpu_matmul_backward_write(st_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                                      const float *inp, const float *w, int N, int C, int OC, st_wlayout layout) {
    matmul_backward(be->ctx, dinp, dw, dbias, dout, inp, w, N, C, OC, layout, 0);
}

/* ---------------------------------------------------------------- attention
 * Per (batch, head), queries are taken in blocks of ATT_BQ rows; a block only meets
 * the keys at or before its last row (causal), so the work is close to half of the
 * full T x T product. Scores for one block live in per-thread scratch (ATT_BQ x T)
 * and are gone when the block is done: nothing T x T survives between forward and
 * backward; backward recomputes the probabilities from q, k and the saved lse.
 * With documents (doc_start, B*T ints), a block never spans two documents: it ends where
 * doc_start changes, and meets only the keys from its document's start to its last row,
 * so the masked keys are never computed. doc_start NULL is the causal op (document start
 * 0): the same blocks and calls, so the same bits. */

#define ATT_BQ 64

ST_CLONES
static void att_softmax_block(float *S, float *lse_out, int r0, int nr, int nk, int ld, int k0) {
    for (int r = 0; r < nr; r++) {
        int t = r0 + r, valid = t + 1 - k0; /* keys k0..t */
        float *s = S + (size_t)r * ld;
        float mx = -INFINITY;
        for (int j = 0; j < valid; j++) mx = s[j] > mx ? s[j] : mx;
        float sum = 0;
        for (int j = 0; j < valid; j++) { s[j] = st_fast_expf(s[j] - mx); sum += s[j]; }
        float inv = 1.0f / sum;
        for (int j = 0; j < valid; j++) s[j] *= inv;
        for (int j = valid; j < nk; j++) s[j] = 0.0f;
        if (lse_out) lse_out[t] = mx + logf(sum);
    }
}

static void att_forward(float *out, float *lse, const float *qkv, const int32_t *doc_start, int B, int T, int C,
                        int NH) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
    {
        float *S = malloc(sizeof(float) * ATT_BQ * (size_t)T);
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            const int32_t *ds = doc_start ? doc_start + (size_t)b * T : NULL;
            float *o = out + (size_t)b * T * C + h * hs;
            float *l = lse + (size_t)bh * T;
            for (int r0 = 0, r1; r0 < T; r0 = r1) {
                int k0 = cpu_att_doc_block(ds, r0, T, ATT_BQ, &r1), nr = r1 - r0, nk = r1 - k0;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nk, hs, scale, q + (size_t)r0 * C3, C3,
                            k + (size_t)k0 * C3, C3, 0.0f, S, nk);
                att_softmax_block(S, l, r0, nr, nk, nk, k0);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, nk, 1.0f, S, nk, v + (size_t)k0 * C3,
                            C3, 0.0f, o + (size_t)r0 * C, C);
            }
        }
        free(S);
    }
}

/* ---- attention under matmul bf16 (causal, no documents): q, k, v (and dO) rounded to bf16
 * and laid out head-major, (B, NH, T, hs) dense, in one pass; for a chunk of sequences each
 * product over all heads at once is one oneDNN batched matmul (dense operands: its AMX
 * kernels; strided ones in place in (B, T, 3C) fall back to its slower jit gemm). Scores are
 * full T x T, the causal half masked in the fp32 softmax, where the scale is applied;
 * probabilities and dS rounded to bf16 for their products; lse and delta fp32; O, dQ, dK, dV
 * computed head-major in fp32 and scattered (added, for the gradients) into their rows. The
 * same quantities as the blocked fp32 path above. */

#define ATT16_SCORES_MAX ((size_t)1 << 24) /* floats in each scores buffer (64 MiB) */
enum { ATT16_QKV = 3, ATT16_DOUT = 4, ATT16_P = 5 }; /* cpu_bf16 scratch slots */

/* Sequences per chunk (0: T too long for the buffers, keep fp32); buffers grown. */
static int att16_chunk(cpu_ctx *x, int B, int T, int C, int NH) {
    size_t per = (size_t)NH * T * T;
    if (per > ATT16_SCORES_MAX) return 0;
    int nb = (int)(ATT16_SCORES_MAX / per);
    nb = nb > B ? B : nb;
    size_t need = per * (size_t)nb;
    if (need > x->att_cap) {
        st_free(x->att_s), st_free(x->att_dp);
        x->att_s = st_alloc(need * sizeof(float));
        x->att_dp = st_alloc(need * sizeof(float));
        x->att_cap = x->att_s && x->att_dp ? need : 0;
        if (!x->att_cap) return 0;
    }
    size_t o = (size_t)B * T * 3 * C + (size_t)B * NH * T; /* O or dQ, dK, dV head-major; delta */
    if (o > x->o_cap) {
        st_free(x->att_o);
        x->att_o = st_alloc(o * sizeof(float));
        x->o_cap = x->att_o ? o : 0;
        if (!x->o_cap) return 0;
    }
    return nb;
}

/* dst (parts x B x NH x T x hs, bf16) = the `parts` C-column groups of src's rows
 * (B x T rows of ld floats), rounded, head-major. */
static void att16_gather(uint16_t *dst, const float *src, int parts, int B, int T, int C, int NH, int ld) {
    int hs = C / NH;
    size_t part = (size_t)B * T * C;
#pragma omp parallel for schedule(static)
    for (long bt = 0; bt < (long)B * T; bt++) {
        int b = (int)(bt / T), t = (int)(bt % T);
        for (int p = 0; p < parts; p++)
            for (int h = 0; h < NH; h++)
                cpu_bf16_round(dst + p * part + (((size_t)b * NH + h) * T + t) * hs, src + (size_t)bt * ld + p * C + h * hs,
                               (size_t)hs);
    }
}

/* rows (B x T of ld floats) = (or += when add) the parts' head-major fp32 values */
static void att16_scatter(float *dst, const float *src, int parts, int B, int T, int C, int NH, int ld, int add) {
    int hs = C / NH;
    size_t part = (size_t)B * T * C;
#pragma omp parallel for schedule(static)
    for (long bt = 0; bt < (long)B * T; bt++) {
        int b = (int)(bt / T), t = (int)(bt % T);
        for (int p = 0; p < parts; p++)
            for (int h = 0; h < NH; h++) {
                const float *s = src + p * part + (((size_t)b * NH + h) * T + t) * hs;
                float *d = dst + (size_t)bt * ld + p * C + h * hs;
                if (add)
                    for (int k = 0; k < hs; k++) d[k] += s[k];
                else
                    memcpy(d, s, sizeof(float) * hs);
            }
    }
}

/* The batch descriptions over nb sequences x NH heads, all dense: S = Q K^T, O = P V,
 * dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q. */
typedef struct att16_shapes { cpu_bf16_batch qk, pv, dv, dp, dq, dk; } att16_shapes;
static att16_shapes att16_describe(int nb, int T, int C, int NH) {
    int hs = C / NH;
    int64_t sx = (int64_t)T * C, hx = (int64_t)T * hs, ss = (int64_t)NH * T * T, sh = (int64_t)T * T;
    att16_shapes a;
    a.qk = (cpu_bf16_batch){nb, NH, T, T, hs, 0, 1, 0, hs, hs, T, {sx, hx}, {sx, hx}, {ss, sh}};
    a.pv = (cpu_bf16_batch){nb, NH, T, hs, T, 0, 0, 0, T, hs, hs, {ss, sh}, {sx, hx}, {sx, hx}};
    a.dv = (cpu_bf16_batch){nb, NH, T, hs, T, 1, 0, 0, T, hs, hs, {ss, sh}, {sx, hx}, {sx, hx}};
    a.dp = (cpu_bf16_batch){nb, NH, T, T, hs, 0, 1, 0, hs, hs, T, {sx, hx}, {sx, hx}, {ss, sh}};
    a.dq = a.pv;
    a.dk = a.dv;
    return a;
}

/* Whether every product of the pass runs (primitives made now, once per shape). */
static int att16_ready(cpu_ctx *x, const att16_shapes *a, int backward) {
    st_err e = {0};
    st_status s = cpu_bf16_batched_ready(x->bf16, &a->qk, &e);
    if (!s) s = cpu_bf16_batched_ready(x->bf16, &a->pv, &e);
    if (!s && backward) s = cpu_bf16_batched_ready(x->bf16, &a->dv, &e);
    if (!s && backward) s = cpu_bf16_batched_ready(x->bf16, &a->dp, &e);
    return !bf16_failed(s, &e);
}

/* Rows of scores (nb x NH x T rows of T) -> scaled, bf16 probabilities in P16 (keys after the
 * row's query zero), lse per row. */
ST_CLONES
static void att16_softmax(float *S, uint16_t *P16, float *lse, long rows, int T, float scale) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        int t = (int)(r % T);
        float *s = S + (size_t)r * T;
        float mx = -INFINITY;
        for (int j = 0; j <= t; j++) {
            s[j] *= scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        float sum = 0;
        for (int j = 0; j <= t; j++) { s[j] = st_fast_expf(s[j] - mx); sum += s[j]; }
        float inv = 1.0f / sum;
        for (int j = 0; j <= t; j++) s[j] *= inv;
        for (int j = t + 1; j < T; j++) s[j] = 0.0f;
        cpu_bf16_round(P16 + (size_t)r * T, s, (size_t)T);
        lse[r] = mx + logf(sum);
    }
}

static int att16_forward(cpu_ctx *x, float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    int nb = att16_chunk(x, B, T, C, NH), hs = C / NH;
    if (!nb) return 0;
    att16_shapes a = att16_describe(nb, T, C, NH);
    int rest = B % nb;
    att16_shapes r = rest ? att16_describe(rest, T, C, NH) : a;
    st_err e = {0};
    st_status s = ST_OK;
    size_t part = (size_t)B * T * C;
    cpu_bf16_lock(x->bf16);
    uint16_t *h16 = cpu_bf16_scratch(x->bf16, ATT16_QKV, 3 * part);
    uint16_t *p16 = cpu_bf16_scratch(x->bf16, ATT16_P, (size_t)nb * NH * T * T);
    if (!h16 || !p16 || !att16_ready(x, &a, 0) || (rest && !att16_ready(x, &r, 0))) {
        cpu_bf16_unlock(x->bf16);
        return 0;
    }
    double t0 = st_now();
    att16_gather(h16, qkv, 3, B, T, C, NH, 3 * C);
    cpu_bf16_add_convert_s(x->bf16, ATT16_QKV, st_now() - t0);
    float scale = 1.0f / sqrtf((float)hs);
    for (int b0 = 0; b0 < B && !s; b0 += nb) {
        int n = B - b0 < nb ? B - b0 : nb;
        const att16_shapes *c = n == nb ? &a : &r;
        size_t o = (size_t)b0 * T * C;
        s = cpu_bf16_gemm_batched(x->bf16, &c->qk, h16 + o, h16 + part + o, x->att_s, &e);
        if (s) break;
        att16_softmax(x->att_s, p16, lse + (size_t)b0 * NH * T, (long)n * NH * T, T, scale);
        s = cpu_bf16_gemm_batched(x->bf16, &c->pv, p16, h16 + 2 * part + o, x->att_o + o, &e);
    }
    cpu_bf16_unlock(x->bf16);
    if (bf16_failed(s, &e)) return 0; /* redone in fp32: nothing was accumulated */
    att16_scatter(out, x->att_o, 1, B, T, C, NH, C, 0);
    return 1;
}

/* P = exp(S scale - lse) (fp32 in S, bf16 in P16) for rows of nb x NH x T; each row's delta,
 * rowsum(dO o O) over its head's columns (dout, out: the chunk's rows). */
ST_CLONES
static void att16_probs(float *S, uint16_t *P16, const float *lse, float *delta, const float *dout, const float *out,
                        long rows, int T, int C, int NH, float scale) {
    int hs = C / NH;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        int t = (int)(r % T), h = (int)(r / T % NH), b = (int)(r / T / NH);
        float *s = S + (size_t)r * T;
        float l = lse[r];
        for (int j = 0; j <= t; j++) s[j] = st_fast_expf(s[j] * scale - l);
        for (int j = t + 1; j < T; j++) s[j] = 0.0f;
        cpu_bf16_round(P16 + (size_t)r * T, s, (size_t)T);
        const float *o = out + ((size_t)b * T + t) * C + h * hs, *d = dout + ((size_t)b * T + t) * C + h * hs;
        float acc = 0;
        for (int k = 0; k < hs; k++) acc += o[k] * d[k];
        delta[r] = acc;
    }
}

/* dS = P (dP - delta) scale (in P's place), rounded into dS16. */
ST_CLONES
static void att16_dscores(float *P, const float *dP, const float *delta, uint16_t *dS16, long rows, int T,
                          float scale) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        int t = (int)(r % T);
        float *p = P + (size_t)r * T;
        const float *dp = dP + (size_t)r * T;
        float dl = delta[r];
        for (int j = 0; j <= t; j++) p[j] = p[j] * (dp[j] - dl) * scale;
        for (int j = t + 1; j < T; j++) p[j] = 0.0f;
        cpu_bf16_round(dS16 + (size_t)r * T, p, (size_t)T);
    }
}

static int att16_backward(cpu_ctx *x, float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, int B, int T, int C, int NH, int add) {
    int nb = att16_chunk(x, B, T, C, NH), hs = C / NH;
    if (!nb) return 0;
    att16_shapes a = att16_describe(nb, T, C, NH);
    int rest = B % nb;
    att16_shapes r = rest ? att16_describe(rest, T, C, NH) : a;
    st_err e = {0};
    st_status s = ST_OK;
    size_t part = (size_t)B * T * C;
    cpu_bf16_lock(x->bf16);
    uint16_t *h16 = cpu_bf16_scratch(x->bf16, ATT16_QKV, 3 * part);
    uint16_t *d16 = cpu_bf16_scratch(x->bf16, ATT16_DOUT, part);
    uint16_t *p16 = cpu_bf16_scratch(x->bf16, ATT16_P, (size_t)nb * NH * T * T);
    if (!h16 || !d16 || !p16 || !att16_ready(x, &a, 1) || (rest && !att16_ready(x, &r, 1))) {
        cpu_bf16_unlock(x->bf16);
        return 0;
    }
    double t0 = st_now();
    att16_gather(h16, qkv, 3, B, T, C, NH, 3 * C);
    att16_gather(d16, dout, 1, B, T, C, NH, C);
    cpu_bf16_add_convert_s(x->bf16, ATT16_QKV, st_now() - t0);
    float scale = 1.0f / sqrtf((float)hs), *dh = x->att_o, *delta = x->att_o + 3 * part;
    for (int b0 = 0; b0 < B && !s; b0 += nb) {
        int n = B - b0 < nb ? B - b0 : nb;
        const att16_shapes *c = n == nb ? &a : &r;
        size_t o = (size_t)b0 * T * C;
        const uint16_t *q = h16 + o, *k = h16 + part + o, *v = h16 + 2 * part + o, *d = d16 + o;
        long rows = (long)n * NH * T;
        s = cpu_bf16_gemm_batched(x->bf16, &c->qk, q, k, x->att_s, &e);
        if (s) break;
        att16_probs(x->att_s, p16, lse + (size_t)b0 * NH * T, delta, dout + o, out + o, rows, T, C, NH, scale);
        if ((s = cpu_bf16_gemm_batched(x->bf16, &c->dv, p16, d, dh + 2 * part + o, &e)) ||
            (s = cpu_bf16_gemm_batched(x->bf16, &c->dp, d, v, x->att_dp, &e)))
            break;
        att16_dscores(x->att_s, x->att_dp, delta, p16, rows, T, scale);
        if ((s = cpu_bf16_gemm_batched(x->bf16, &c->dq, p16, k, dh + o, &e)) ||
            (s = cpu_bf16_gemm_batched(x->bf16, &c->dk, p16, q, dh + part + o, &e)))
            break;
    }
    cpu_bf16_unlock(x->bf16);
    if (bf16_failed(s, &e)) return 0; /* redone in fp32: nothing was added to dqkv yet */
    att16_scatter(dqkv, dh, 3, B, T, C, NH, 3 * C, add);
    return 1;
}

static void cpu_attention_forward(st_backend *be, float *out, float *lse, const float *qkv, int B, int T,
                                  int C, int NH) {
    cpu_ctx *x = be->ctx;
    if (x->matmul == ST_MATMUL_BF16 && att16_forward(x, out, lse, qkv, B, T, C, NH)) return;
    att_forward(out, lse, qkv, NULL, B, T, C, NH);
}

static void cpu_attention_doc_forward(st_backend *be, float *out, float *lse, const float *qkv,
                                      const int32_t *doc_start, int B, int T, int C, int NH) {
    (void)be;
    att_forward(out, lse, qkv, doc_start, B, T, C, NH);
}

ST_CLONES
static void att_dscores_block(float *P, const float *dP, const float *delta, const float *S_lse, int r0, int nr,
                              int nk, float scale, int k0) {
    /* P holds scaled scores of keys k0.. on entry; becomes dS = P * (dP - delta) * scale */
    for (int r = 0; r < nr; r++) {
        int t = r0 + r - k0; /* the last key's column */
        float *p = P + (size_t)r * nk;
        const float *dp = dP + (size_t)r * nk;
        float l = S_lse[r0 + r], dl = delta[r];
        for (int j = 0; j <= t; j++) {
            float pj = st_fast_expf(p[j] - l);
            p[j] = pj * (dp[j] - dl) * scale;
        }
        for (int j = t + 1; j < nk; j++) p[j] = 0.0f;
    }
}

ST_CLONES
static void att_probs_block(float *S, const float *lse, int r0, int nr, int nk, int k0) {
    for (int r = 0; r < nr; r++) {
        int t = r0 + r - k0;
        float *s = S + (size_t)r * nk;
        float l = lse[r0 + r];
        for (int j = 0; j <= t; j++) s[j] = st_fast_expf(s[j] - l);
        for (int j = t + 1; j < nk; j++) s[j] = 0.0f;
    }
}

/* dqkv += (add) or = the gradient; written, each (batch, head) task first clears its own
 * columns of dqkv (in cache, where a separate clearing pass would stream all of it) */
static void att_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                         const int32_t *doc_start, int B, int T, int C, int NH, int add) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
    {
        float *S = malloc(sizeof(float) * ATT_BQ * (size_t)T);  /* scores -> probabilities */
        float *G = malloc(sizeof(float) * ATT_BQ * (size_t)T);  /* scores again -> dS */
        float *dP = malloc(sizeof(float) * ATT_BQ * (size_t)T);
        float delta[ATT_BQ];
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            size_t base = (size_t)b * T * C3 + h * hs;
            const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + base, *dk = dq + C, *dv = dq + 2 * C;
            const float *o = out + (size_t)b * T * C + h * hs, *dO = dout + (size_t)b * T * C + h * hs;
            const float *l = lse + (size_t)bh * T;
            const int32_t *ds = doc_start ? doc_start + (size_t)b * T : NULL;
            if (!add)
                for (int t = 0; t < T; t++)
                    for (int p = 0; p < 3; p++) memset(dq + (size_t)t * C3 + (size_t)p * C, 0, sizeof(float) * hs);
            for (int r0 = 0, r1; r0 < T; r0 = r1) {
                int k0 = cpu_att_doc_block(ds, r0, T, ATT_BQ, &r1), nr = r1 - r0, nk = r1 - k0;
                const float *kb = k + (size_t)k0 * C3, *vb = v + (size_t)k0 * C3;
                /* recompute scaled scores, once into S (-> P) and reuse for dS */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nk, hs, scale, q + (size_t)r0 * C3, C3, kb,
                            C3, 0.0f, S, nk);
                memcpy(G, S, sizeof(float) * (size_t)nr * nk);
                att_probs_block(S, l, r0, nr, nk, k0);
                /* dV[k0:r1] += P^T dO */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nr, 1.0f, S, nk, dO + (size_t)r0 * C, C,
                            1.0f, dv + (size_t)k0 * C3, C3);
                /* dP = dO V^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nk, hs, 1.0f, dO + (size_t)r0 * C, C, vb, C3,
                            0.0f, dP, nk);
                for (int r = 0; r < nr; r++) {
                    const float *a = dO + (size_t)(r0 + r) * C, *bb = o + (size_t)(r0 + r) * C;
                    float s = 0;
                    for (int d = 0; d < hs; d++) s += a[d] * bb[d];
                    delta[r] = s;
                }
                att_dscores_block(G, dP, delta, l, r0, nr, nk, scale, k0);
                /* dQ[r0:r1] += dS K ; dK[k0:r1] += dS^T Q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, nk, 1.0f, G, nk, kb, C3, 1.0f,
                            dq + (size_t)r0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nr, 1.0f, G, nk, q + (size_t)r0 * C3, C3,
                            1.0f, dk + (size_t)k0 * C3, C3);
            }
        }
        free(S);
        free(G);
        free(dP);
    }
}

static void cpu_attention_backward(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                                   const float *out, const float *lse, int B, int T, int C, int NH) {
    cpu_ctx *x = be->ctx;
    if (x->matmul == ST_MATMUL_BF16 && att16_backward(x, dqkv, dout, qkv, out, lse, B, T, C, NH, 1)) return;
    att_backward(dqkv, dout, qkv, out, lse, NULL, B, T, C, NH, 1);
}

static void cpu_attention_doc_backward(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                                       const float *out, const float *lse, const int32_t *doc_start, int B, int T,
                                       int C, int NH) {
    (void)be;
    att_backward(dqkv, dout, qkv, out, lse, doc_start, B, T, C, NH, 1);
}

static void cpu_attention_backward_write(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                                         const float *out, const float *lse, const int32_t *doc_start, int B, int T,
                                         int C, int NH) {
    cpu_ctx *x = be->ctx;
    if (!doc_start && x->matmul == ST_MATMUL_BF16 && att16_backward(x, dqkv, dout, qkv, out, lse, B, T, C, NH, 0))
        return;
    att_backward(dqkv, dout, qkv, out, lse, doc_start, B, T, C, NH, 0);
}

/* ---------------------------------------------------------------- gelu, residual */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = k (x + 0.044715 x^3) */
ST_CLONES
static void cpu_gelu_forward(st_backend *be, float *out, const float *inp, int n) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float x = inp[i], u = GELU_K * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + st_fast_expf(-2.0f * u));
    }
}

static inline float gelu_grad(float x) {
    float u = GELU_K * (x + 0.044715f * x * x * x);
    float e = st_fast_expf(-2.0f * u), s = 1.0f / (1.0f + e); /* s = 0.5 (1 + tanh u) */
    float one_minus_s = e * s; /* = e / (1 + e), without the cancellation of 1 - s */
    float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return s + x * 2.0f * s * one_minus_s * du;
}

ST_CLONES
static void cpu_gelu_backward(st_backend *be, float *dinp, const float *inp, const float *dout, int n) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) dinp[i] += dout[i] * gelu_grad(inp[i]);
}

ST_CLONES
static void cpu_gelu_backward_write(st_backend *be, float *dinp, const float *inp, const float *dout, int n) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) dinp[i] = dout[i] * gelu_grad(inp[i]);
}

static void cpu_residual_forward(st_backend *be, float *out, const float *a, const float *b, int n) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* y rows += alpha x rows (LoRA's low-rank term into a packed output, and back) */
static void cpu_axpy_rows(st_backend *be, float *y, int ldy, const float *x, int ldx, float alpha, int N, int W) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *yr = y + (size_t)n * ldy;
        const float *xr = x + (size_t)n * ldx;
        for (int i = 0; i < W; i++) yr[i] += alpha * xr[i];
    }
}

static void cpu_residual_backward(st_backend *be, float *da, float *db, const float *dout, int n) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

/* ---------------------------------------------------------------- softmax + cross-entropy */

/* A row's max, 16 lanes at a time (the compiler keeps the lanes in one vector register;
 * a single running max is a loop-carried dependence it does not vectorise). NaN never
 * wins a comparison, as in the plain loop. */
ST_CLONES
static float ce_row_max(const float *l, int V) {
    float m[16];
    for (int k = 0; k < 16; k++) m[k] = -INFINITY;
    int j = 0;
    for (; j + 16 <= V; j += 16)
        for (int k = 0; k < 16; k++) m[k] = l[j + k] > m[k] ? l[j + k] : m[k];
    float mx = -INFINITY;
    for (int k = 0; k < 16; k++) mx = m[k] > mx ? m[k] : mx;
    for (; j < V; j++) mx = l[j] > mx ? l[j] : mx;
    return mx;
}

/* sum over the row of e^(l - mx), written back into l when `write`: 16 float lanes over
 * blocks of CE_BLOCK elements, each block's lanes added into a double (V can be 150k:
 * the total keeps its digits; a lane sums at most CE_BLOCK/16 terms in float). */
#define CE_BLOCK 1024
ST_CLONES
static double ce_row_expsum(float *l, int V, float mx, int write) {
    double total = 0;
    for (int j0 = 0; j0 < V; j0 += CE_BLOCK) {
        int j1 = V - j0 < CE_BLOCK ? V : j0 + CE_BLOCK, j = j0;
        float s[16] = {0};
        if (write) {
            for (; j + 16 <= j1; j += 16)
                for (int k = 0; k < 16; k++) {
                    float e = st_fast_expf(l[j + k] - mx);
                    l[j + k] = e;
                    s[k] += e;
                }
        } else {
            for (; j + 16 <= j1; j += 16)
                for (int k = 0; k < 16; k++) s[k] += st_fast_expf(l[j + k] - mx);
        }
        for (; j < j1; j++) {
            float e = st_fast_expf(l[j] - mx);
            if (write) l[j] = e;
            s[0] += e;
        }
        double b = 0;
        for (int k = 0; k < 16; k++) b += s[k];
        total += b;
    }
    return total;
}

ST_CLONES
static void ce_row_scale(float *l, int V, float sc) {
    for (int j = 0; j < V; j++) l[j] *= sc;
}

static void cpu_crossentropy(st_backend *be, float *logits, float *losses, const int32_t *targets, int N, int V,
                             float dloss) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *l = logits + (size_t)i * V;
        int tgt = targets[i];
        if (tgt < 0) {
            losses[i] = 0.0f;
            if (dloss != 0.0f) memset(l, 0, sizeof(float) * V);
            continue;
        }
        float mx = ce_row_max(l, V), lt = l[tgt];
        double sum = ce_row_expsum(l, V, mx, dloss != 0.0f);
        if (dloss != 0.0f) {
            ce_row_scale(l, V, (float)(dloss / sum));
            l[tgt] -= dloss;
        }
        losses[i] = (float)(mx + log(sum) - lt);
    }
}

/* ---------------------------------------------------------------- matmul mode */

/* A CPU without bf16 units runs matmul bf16 through oneDNN's emulation: measured once
 * per process at a GPT-2-small shape against sgemm, and said, with the advice to stay in
 * fp32. The measure takes well under a second even where oneDNN falls back to plain loops. */
static void bf16_emulation_note(cpu_bf16 *b) {
    static int told;
    if (__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED)) return;
    enum { M = 256, N = 768, K = 768 };
    float *A = st_alloc(sizeof(float) * M * K), *B = st_alloc(sizeof(float) * K * N), *C = st_alloc(sizeof(float) * M * N);
    if (!A || !B || !C) goto done;
    for (int i = 0; i < M * K; i++) A[i] = (float)(((unsigned)i * 7919u) % 1000u) * 1e-3f;
    for (int i = 0; i < K * N; i++) B[i] = (float)(((unsigned)i * 104729u) % 1000u) * 1e-3f;
    double best_bf16 = 1e30, best_f32 = 1e30;
    st_err e = {0};
    for (int rep = 0; rep < 3; rep++) {
        double t0 = st_now();
        cpu_bf16_lock(b);
        const uint16_t *a = cpu_bf16_operand(b, 0, A, (size_t)M * K), *bb = cpu_bf16_operand(b, 1, B, (size_t)K * N);
        st_status s = a && bb ? cpu_bf16_gemm(b, 0, 0, M, N, K, a, bb, NULL, 0, C, &e) : ST_ERR_NOMEM;
        cpu_bf16_unlock(b);
        double t1 = st_now();
        if (s) goto done;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
        double t2 = st_now();
        best_bf16 = t1 - t0 < best_bf16 ? t1 - t0 : best_bf16;
        best_f32 = t2 - t1 < best_f32 ? t2 - t1 : best_f32;
    }
    double fl = 2.0 * M * N * K;
    st_log(1, "matmul bf16: this CPU has no bf16 matrix units (neither AMX-BF16 nor AVX512-BF16): oneDNN emulates "
              "them at %.1f GFLOP/s (%s) against sgemm's %.1f GFLOP/s at %dx%dx%d; give matmul fp32 for speed\n",
           fl / best_bf16 / 1e9, cpu_bf16_impl(b, 0, 0, M, N, K, 0, 0), fl / best_f32 / 1e9, M, N, K);
done:
    st_free(A);
    st_free(B);
    st_free(C);
}

st_status cpu_backend_set_matmul(st_backend *be, st_matmul_mode mode, st_err *err) {
    cpu_ctx *x = be->ctx;
    memset(x->w16, 0, sizeof x->w16); /* a caller maps its copy again for its next pass */
    if (mode == ST_MATMUL_FP32) {
        x->matmul = mode;
        return ST_OK;
    }
    if (mode != ST_MATMUL_BF16)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'matmul': tf32 is the tensor cores of device cuda; the CPU "
                       "computes fp32 or bf16: give matmul fp32, bf16 or auto");
    if (!x->bf16) {
        st_status s = cpu_bf16_create(&x->bf16, err);
        if (s) return s;
    }
    if (cpu_bf16_detect() == CPU_BF16_NONE) bf16_emulation_note(x->bf16);
    x->matmul = mode;
    return ST_OK;
}

st_matmul_mode cpu_backend_matmul(const st_backend *be) { return ((const cpu_ctx *)be->ctx)->matmul; }
cpu_bf16 *cpu_backend_bf16(const st_backend *be) { return ((const cpu_ctx *)be->ctx)->bf16; }

/* ---------------------------------------------------------------- vtable */

static void cpu_free(st_backend *be) {
    if (!be) return;
    cpu_ctx *x = be->ctx;
    cpu_bf16_free(x->bf16);
    st_free(x->att_s), st_free(x->att_dp), st_free(x->att_o);
    free(be->ctx);
    free(be);
}

static const st_backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .alloc = cpu_alloc,
    .dealloc = cpu_dealloc,
    .memset0 = cpu_memset0,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .synchronize = cpu_sync,
    .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .residual_forward = cpu_residual_forward,
    .residual_backward = cpu_residual_backward,
    .crossentropy_forward_backward = cpu_crossentropy,
    /* Llama family: backend_cpu_llama.c */
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .attention_gqa_forward = cpu_attention_gqa_forward,
    .attention_gqa_backward = cpu_attention_gqa_backward,
    .softmax_chunk_init = st_host_softmax_chunk_init,
    .softmax_chunk_stats = st_host_softmax_chunk_stats,
    .softmax_chunk_grad = st_host_softmax_chunk_grad,
    .to_bf16 = st_cpu_to_bf16,
    .attention_doc_forward = cpu_attention_doc_forward,
    .attention_doc_backward = cpu_attention_doc_backward,
    .attention_gqa_doc_forward = cpu_attention_gqa_doc_forward,
    .attention_gqa_doc_backward = cpu_attention_gqa_doc_backward,
    /* POET-X: backend_cpu_poetx.c */
    .poet_cayley_forward = cpu_poet_cayley_forward,
    .poet_cayley_backward = cpu_poet_cayley_backward,
    .poet_apply_forward = cpu_poet_apply_forward,
    .poet_permute = cpu_poet_permute,
    .poet_apply_backward = cpu_poet_apply_backward,
    .axpy_rows = cpu_axpy_rows,
    .from_bf16 = st_cpu_from_bf16,
    .matmul_backward_write = cpu_matmul_backward_write,
    .gelu_backward_write = cpu_gelu_backward_write,
    .attention_backward_write = cpu_attention_backward_write,
};

st_status st_backend_cpu_create(st_backend **out, int threads, st_err *err) {
    *out = NULL;
    st_backend *be = calloc(1, sizeof *be);
    cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        return st_errf(err, ST_ERR_NOMEM, "cpu backend: out of memory");
    }
    if (threads > 0) omp_set_num_threads(threads);
    ctx->threads = threads > 0 ? threads : omp_get_max_threads();
    be->ops = &cpu_ops;
    be->ctx = ctx;
    *out = be;
    return ST_OK;
}
